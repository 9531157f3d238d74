"""The docs site covers what ctxlock has: every command, every public name, every environment variable.

The site itself is built by `make docs` (mkdocs --strict: a broken link or anchor fails), and its examples run as
tests (tests/docs_examples.py); this file checks coverage, which neither of those can see.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import typer

import ctxlock
import docs_examples
from ctxlock.cli import build_app

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GUIDES = "\n".join(p.read_text("utf-8") for p in sorted(DOCS.glob("*.md"))) + (ROOT / "README.md").read_text("utf-8")

_spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "_hooks.py")
assert _spec is not None and _spec.loader is not None
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)


def commands() -> list[str]:
    root = typer.main.get_command(build_app())
    return [name.removeprefix("ctxlock ") for name, _ in hooks.all_commands(root, "ctxlock")]


def test_the_cli_reference_names_every_command_and_every_guide_uses_them() -> None:
    page = hooks.cli_page()
    names = commands()
    assert len(names) >= 20
    missing_reference = [n for n in names if f"## `ctxlock {n}`" not in page]
    assert missing_reference == []
    unused = [n for n in names if not re.search(rf"ctxlock {re.escape(n)}\b", GUIDES)]
    assert unused == [], f"commands no guide page or example shows: {unused}"


def test_the_api_reference_holds_every_public_name_and_the_guides_teach_them() -> None:
    grouped = [name for names in hooks.API_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(ctxlock.__all__)
    assert len(grouped) == len(set(grouped))
    untaught = [n for n in ctxlock.__all__ if n != "__version__" and not re.search(rf"\b{re.escape(n)}\b", GUIDES)]
    assert untaught == [], f"public names no guide page mentions: {untaught}"


def test_the_errors_reference_holds_every_exception() -> None:
    import ctxlock.errors as errors

    page = hooks.errors_page()
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.CtxlockError)]
    assert len(classes) > 40
    assert [c.__name__ for c in classes if f"## `{c.__name__}`" not in page] == []


def test_every_environment_variable_the_code_reads_is_listed() -> None:
    read = set()
    for path in (ROOT / "src" / "ctxlock").rglob("*.py"):
        read |= set(re.findall(r"\bCTXLOCK_[A-Z_]+\b", path.read_text("utf-8")))
    page = (DOCS / "reference" / "environment.md").read_text("utf-8")
    listed = set(re.findall(r"^\| `(CTXLOCK_[A-Z_]+)` \|", page, flags=re.M))
    assert read - listed == set(), "read by the code, not on the page"
    assert listed - read == set(), "on the page, read by no code"


def test_every_not_run_block_gives_its_reason() -> None:
    found = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = page.read_text("utf-8")
        for m in re.finditer(r"^\s*<!--\s*not-run:([^>]*)-->", text, flags=re.M):
            found.append((page.name, m.group(1).strip()))
    assert found and all(len(reason) > 20 for _, reason in found), found
    assert len(found) <= 24, f"{len(found)} examples are not run: keep them rare"


def test_the_console_parser_reads_commands_output_and_status() -> None:
    block = "$ echo a \\\n  b\na b\n$ python - <<'EOF'\nprint(1)\nEOF\n1\n$ false\n[exit 1]\n"
    cmds = docs_examples.parse_console(block)
    assert [c.text for c in cmds] == ["echo a \\\n  b", "python - <<'EOF'\nprint(1)\nEOF", "false"]
    assert [c.expected for c in cmds] == [("a b",), ("1",), ()]
    assert [c.status for c in cmds] == [0, 0, 1]


def test_elisions_match_what_they_elide_and_nothing_else() -> None:
    m = docs_examples.output_matches
    assert m(["a", "...", "z"], "a\nb\nc\nz\n")
    assert m(["a", "...", "z"], "a\nz")
    assert not m(["a", "...", "z"], "a\nb\n")
    assert m(["sha256 ...  (tekken)"], "sha256 1948e2d4  (tekken)   \n")
    assert not m(["sha256 ...  (tekken)"], "sha256 1948e2d4  (tiktoken)\n")
    assert not m(["one"], "one\ntwo\n")
    assert m([], "")
    assert not m([], "unexpected\n")
