"""`ctxlock diff-template` as a user runs it: the human view, `--json`, the exit statuses (0 same, 1 different, 2 an
error; `--exit-zero`), `--probes`, `--only`, `--var`, and hostile probe files (one line naming the JSON path).

The commands run `ctxlock.cli.main` in this process (`run_main`: the entry point the `ctxlock` script calls, so an
exception escaping it is the traceback a user would see); one runs in a child process, as a shell runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fetched
from cli_runner import run_cli, run_main
from ctxlock.probes import load_corpus
from ctxlock.templatediff import diff_templates, load_sides

QWEN = "Qwen-Qwen2.5-7B-Instruct.jinja"
GGUF = str(fetched.gguf_path("qwen2"))
NEWLINE = ("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n\\n' }}")
RAISES = (
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}",
    "        {{- raise_exception('System messages are not supported') }}",
)
TOP_KEYS = ["identical", "differences", "capabilities_changed", "ids_comparable", "a", "b", "probes", "results"]
TOP_KEYS.append("capabilities")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("diff-template")
    source = next(p for p in fetched.template_paths() if p.name == QWEN).read_text("utf-8")
    out = {"a": root / "a.jinja", "newline": root / "newline.jinja", "raises": root / "raises.jinja"}
    out["a"].write_text(source, "utf-8")
    out["newline"].write_text(source.replace(*NEWLINE), "utf-8")
    out["raises"].write_text(source.replace(*RAISES), "utf-8")
    return {k: str(v) for k, v in out.items()}


def test_the_human_view_names_each_differing_probe_and_its_token(files: dict[str, str]) -> None:
    code, out, err = run_main(["diff-template", files["a"], files["newline"], "-m", GGUF])
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[0] == "A  template file: a.jinja (sha256 cd8e9439f057)"
    assert lines[1].startswith("B  template file: newline.jinja (sha256 ")
    assert lines[2] == (
        f"tokenizer  ggml-vocab-qwen2.gguf (sha256 44c2f46b715f) for both; A and B (template files) render with "
        f"--model {GGUF}: ids compared token for token"
    )
    assert lines[3] == "probes     21 (ctxlock's corpus)"
    diff = diff_templates(*load_sides(files["a"], files["newline"], model=GGUF), load_corpus())
    shown = [line for line in lines if line.startswith("differs  ")]
    assert len(shown) == len(diff.differing) == 17
    for line, p in zip(shown, diff.differing, strict=True):
        assert p.divergence is not None
        assert line.startswith(f'differs  {p.probe.name:<24} {p.divergence.describe()}  A "…')
    assert shown[0] == (
        "differs  user                     token 35: 'Ċ' (id 198) vs 'ĊĊ' (id 271)  "
        'A "…start|>assistant\\n"  B "…start|>assistant\\n\\n"'
    )
    assert "same     4 probe(s): user-no-generation-prompt, multi-turn-system, reasoning-last, continue-final" in lines
    assert "capabilities that changed (A → B)" in lines
    assert any(
        line.startswith("  mask                   provenance: agree → provenance: disagree  B: ") for line in lines
    )
    assert lines[-1] == "17 of 21 probes render differently; 1 capability changed"


def test_an_error_against_a_render(files: dict[str, str]) -> None:
    code, out, _ = run_main(["diff-template", files["a"], files["raises"], "-m", GGUF, "--only", "system"])
    assert code == 1
    line = next(x for x in Path(files["raises"]).read_text("utf-8").split("\n") if "raise_exception" in x)
    n = Path(files["raises"]).read_text("utf-8").split("\n").index(line) + 1
    assert (
        f"differs  system                   A renders (26 tokens); B refuses: TemplateRaisedError at line {n}: "
        "System messages are not supported"
    ) in out.splitlines()
    assert f"  system                 rendered → refused  B: System messages are not supported (line {n})" in out


def test_json_keys_and_exit_statuses(files: dict[str, str]) -> None:
    code, out, _ = run_main(["diff-template", files["a"], files["newline"], "-m", GGUF, "--json"])
    assert code == 1
    doc = json.loads(out)
    assert list(doc) == TOP_KEYS
    assert (doc["identical"], doc["differences"], doc["capabilities_changed"], doc["ids_comparable"]) == (
        False,
        17,
        1,
        True,
    )
    assert list(doc["a"]) == ["spec", "kind", "model", "tokenizer", "templates"]
    assert list(doc["a"]["tokenizer"]) == ["id", "sha256", "from"]
    assert list(doc["probes"]) == ["count", "sources", "variables"]
    user = doc["results"][0]
    assert list(user) == ["probe", "status", "kind", "a", "b", "divergence", "text"]
    assert (user["probe"], user["status"], user["kind"]) == ("user", "differs", "ids")
    assert user["divergence"]["index"] == 35 and user["divergence"]["a"]["id"] == 198
    assert len(user["a"]["ids"]) == user["a"]["tokens"]
    same = doc["results"][1]
    assert (same["status"], same["kind"], same["divergence"], same["text"]) == ("same", "same", None, None)
    assert "ids" not in same["a"]  # ids only where the sides differ
    assert doc["capabilities"]["mask"]["changed"] is True
    assert doc["capabilities"]["system"] == {
        "changed": False,
        "a": {"verdict": "rendered", "probe": "system"},
        "b": {"verdict": "rendered", "probe": "system"},
    }
    code, out, _ = run_main(["diff-template", files["a"], files["newline"], "-m", GGUF, "--json", "--exit-zero"])
    assert code == 0 and json.loads(out)["identical"] is False
    code, out, _ = run_main(["diff-template", files["a"], files["a"], "-m", GGUF])
    assert code == 0
    assert out.splitlines()[-1] == "no behavioural difference: 21 probes render the same ids, no capability changed"


def test_a_run_in_a_shell(files: dict[str, str]) -> None:
    proc = run_cli("diff-template", files["a"], GGUF, "--only", "user")
    assert proc.returncode == 1 and proc.stderr == ""  # the GGUF's own template is a ChatML without Qwen's system
    assert "B's model" in proc.stdout and "differs  user " in proc.stdout
    proc = run_cli("diff-template", files["a"], "missing.jinja")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "error: ArtifactNotFoundError: B missing.jinja: no such file (check the path)\n"


HOSTILE = [
    ("bad-json", '{"probes": [{"name": "x", "request": {"messages": [}]}', "column 52: invalid JSON"),
    ("unknown-key", '{"probes": [{"name": "x", "colour": 1, "request": {}}]}', "$.probes[0].colour: unknown key"),
    (
        "invalid-request",
        '{"probes": [{"name": "x", "request": {"messages": [{"role": "wizard", "content": "hi"}]}}]}',
        '$.probes[0].request.messages[0].role: unknown role "wizard"',
    ),
    ("not-a-list", '{"probes": {"name": "x"}}', "$.probes: a probe file holds a list of probes"),
    ("bad-name", '[{"name": "a b", "request": {"messages": []}}]', "$[0].name: name must be 1-64 letters"),
    ("duplicate-key", '{"probes": [], "probes": []}', '$: duplicate key "probes"'),
    ("deep", "[" * 5000 + "]" * 5000, "$: JSON nested deeper than 128 levels"),
]


@pytest.mark.parametrize(("text", "needle"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_a_hostile_probe_file_is_one_line_naming_the_json_path(
    text: str, needle: str, files: dict[str, str], tmp_path: Path
) -> None:
    probes = tmp_path / "probes.json"
    probes.write_text(text, "utf-8")
    for extra in ([], ["--json"]):
        code, out, err = run_main(
            ["diff-template", files["a"], files["a"], "-m", GGUF, "--probes", str(probes), *extra]
        )
        assert code == 2
        (line,) = err.splitlines()
        assert line.startswith(f"error: InputError: {probes}") and needle in line, line
        if extra:
            assert json.loads(out)["error"]["type"] == "InputError"
        else:
            assert out == ""


def test_user_probes_extend_the_corpus_and_only_restricts_it(files: dict[str, str], tmp_path: Path) -> None:
    probes = tmp_path / "mine.json"
    mine = {"name": "french", "request": {"messages": [{"role": "user", "content": "Bonjour"}]}}
    probes.write_text(json.dumps({"probes": [mine]}), "utf-8")
    argv = ["diff-template", files["a"], files["newline"], "-m", GGUF, "--probes", str(probes), "--json"]
    code, out, _ = run_main([*argv, "--only", "french", "--only", "user-no-generation-prompt"])
    doc = json.loads(out)
    assert code == 1 and doc["probes"]["count"] == 2 and doc["probes"]["sources"] == ["ctxlock", str(probes)]
    assert [(r["probe"], r["status"]) for r in doc["results"]] == [
        ("user-no-generation-prompt", "same"),
        ("french", "differs"),
    ]
    code, _, err = run_main([*argv, "--only", "nope"])
    assert code == 2 and err.startswith("error: InputError: --only: no probe named 'nope'")


def test_usage_errors_exit_2(files: dict[str, str]) -> None:
    for argv in (["diff-template", files["a"]], ["diff-template", files["a"], files["a"], "--var", "x=nope"]):
        code, _, err = run_main(argv)
        assert code == 2
        (line,) = err.splitlines()
        assert line.startswith("error: usage: ") and line.endswith("(see `ctxlock diff-template --help`)")
    code, _, err = run_main(["diff-template", "book", GGUF, "-m", GGUF])
    assert code == 2 and err.startswith("error: InputError: --model: --model gives a template file its tokenizer")


def test_help_states_the_exit_statuses() -> None:
    code, out, _ = run_main(["diff-template", "--help"])
    assert code == 0
    text = " ".join(out.split())
    assert "0 when nothing differs, 1 when a probe renders differently or a capability changed" in text
    assert "2 for an error" in text and "--exit-zero" in text
