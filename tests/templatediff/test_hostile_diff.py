"""Red-team cases for `ctxlock diff-template`: hostile templates on either side, each held to the promise that every
failure is one typed line (exit 2) and every render is bounded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run_main

PLAIN = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("diff-hostile")
    (root / "a.jinja").write_text(PLAIN, "utf-8")
    return root


def test_a_loop_control_python_refuses_is_one_error_line(root: Path) -> None:
    # `{% break %}` inside `{% generation %}` in a loop parses, and jinja's generated code does not compile: before the
    # fix a SyntaxError traceback.
    b = root / "break.jinja"
    b.write_text(
        "{% for m in messages %}\n<|{{ m.role }}|>\n{% generation %}{% if loop.last %}{% break %}{% endif %}"
        "{{ m.content }}{% endgeneration %}\n{% endfor %}",
        "utf-8",
    )
    code, out, err = run_main(["diff-template", str(root / "a.jinja"), str(b)])
    assert (code, out) == (2, "")
    assert err.startswith(f"error: TemplateSyntaxError: B {b} line 3: 'break' outside loop: a macro, call block")
    assert len(err.strip().splitlines()) == 1


def test_a_template_writing_megabytes_is_a_limit_error_on_its_side(root: Path) -> None:
    # Before the fix each probe's 3 MB render was tokenized (about 1.5 s a probe) and kept.
    b = root / "megabytes.jinja"
    b.write_text(PLAIN + "{{ 'x' * 3000000 }}", "utf-8")
    code, out, err = run_main(["diff-template", str(root / "a.jinja"), str(b), "--json"])
    assert (code, err) == (1, "")
    results = json.loads(out)["results"]
    assert len(results) == 21 and all(r["a"]["ok"] for r in results)
    errors = {r["b"]["error"]["type"] for r in results if not r["b"]["ok"]}
    assert errors == {"TemplateLimitError"}
