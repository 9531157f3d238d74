"""`ctxlock lint` on the command line (tests/cli_runner.py): the text view, the --json shape, --sarif FILE and -,
--fail-on and the exit statuses (0 below the level, 1 at it, 2 for an error or a usage error), several targets,
--rule, --probes, --var, a model target (a GGUF with its embedded templates), and bad inputs, each one error line
without a traceback.

Most runs are in-process (`run_main`: an exception escaping main fails the test with its traceback); a few run the
real `python -m ctxlock` to check the statuses and the stderr a user sees.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import fetched
from cli_runner import run_cli, run_main
from ctxlock.lint import RULES

QWEN3 = "Qwen-Qwen3-0.6B.jinja"
QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
LLAMA31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
BROKEN = "{% for m in messages %}\n{{ m['content'] }\n{% endfor %}\n"  # line 2 does not close its {{


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture templates under short names, a template that does not compile, vocab paths as text."""
    root = tmp_path_factory.mktemp("lint")
    for name in (QWEN3, QWEN25, LLAMA31):
        shutil.copy(fetched.templates_dir() / name, root / name)
    (root / "broken.jinja").write_text(BROKEN, "utf-8")
    return root


def qwen2() -> str:
    return str(fetched.gguf_path("qwen2"))


def llama() -> str:
    return str(fetched.gguf_path("llama-bpe"))


def _lint(*args: str) -> tuple[int, str, str]:
    return run_main(["lint", *args])


def _json(*args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = _lint(*args, "--json")
    assert "Traceback" not in err
    return code, json.loads(out)


@pytest.fixture(scope="module")
def qwen3_json(work: Path) -> dict[str, Any]:
    code, data = _json(str(work / QWEN3), "-m", qwen2(), "--var", "thinking_mode=true")
    assert code == 1
    return data


# ------------------------------------------------------------------------------------------------ views and shapes


def test_the_text_view(work: Path, qwen3_json: dict[str, Any]) -> None:
    code, out, err = _lint(str(work / QWEN3), "-m", qwen2(), "--var", "thinking_mode=true")
    assert (code, err) == (1, "")
    [report] = qwen3_json["reports"]
    lines = out.splitlines()
    counts = report["counts"]
    summary = ", ".join(f"{n} {label}{'' if n == 1 else 's'}" for label, n in counts.items())
    assert lines[0] == f"{work / QWEN3} · {report['template']['sha256'][:12]} · model ggml-vocab-qwen2.gguf · {summary}"
    assert "  error   template  unread-argument  the template never reads 'thinking_mode'" in out
    assert "did you mean enable_thinking?" in out
    # every finding is one line, with its severity, its line (or "template") and its rule
    for finding in report["findings"]:
        where = f"line {finding['line']}" if finding["line"] is not None else "template"
        assert f"  {finding['severity']:<7} {where:<9} {finding['rule']}  " in out
    assert lines[-1] == "  the template takes: enable_thinking (line 82)"


def test_the_json_shape(work: Path, qwen3_json: dict[str, Any]) -> None:
    assert list(qwen3_json) == ["reports"]
    [report] = qwen3_json["reports"]
    assert list(report) == ["template", "model", "counts", "findings", "skipped", "notes"]
    source = (work / QWEN3).read_text("utf-8")
    assert report["template"] == {
        "id": QWEN3,
        "sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
        "origin": str(work / QWEN3),
    }
    assert report["model"] == "ggml-vocab-qwen2.gguf"
    assert list(report["counts"]) == ["error", "warning", "note"]
    for finding in report["findings"]:
        assert set(finding) - {"data"} == {"rule", "severity", "message", "line", "probe", "hint"}
        assert finding["rule"] in RULES and finding["severity"] in report["counts"]
        assert finding["line"] is None or finding["line"] >= 1
    for label, n in report["counts"].items():
        assert n == sum(f["severity"] == label for f in report["findings"])
    assert report["skipped"] == [] and report["notes"] == ["the template takes: enable_thinking (line 82)"]


def test_sarif_to_a_file_and_to_stdout(work: Path, tmp_path: Path) -> None:
    target = str(work / "broken.jinja")
    code, out, err = _lint(target, "--sarif", str(tmp_path / "out.sarif"))
    assert (code, err) == (1, "")
    log = json.loads((tmp_path / "out.sarif").read_text("utf-8"))
    assert out.splitlines()[1].startswith("  error   line 2    syntax  ")  # the text view too
    code, out, err = _lint(target, "--sarif", "-")
    assert (code, err) == (1, "") and json.loads(out) == log  # stdout holds the log alone
    [result] = log["runs"][0]["results"]
    assert (result["ruleId"], result["level"]) == ("syntax", "error")


# ------------------------------------------------------------------------------------------ --fail-on and statuses


@pytest.mark.parametrize(
    ("target", "model", "statuses"),
    [
        # worst: error (the template does not compile)
        ("broken.jinja", None, {"error": 1, "warning": 1, "note": 1, "never": 0}),
        # worst: warning (Llama 3.1 with its vocabulary: a double BOS, a raise a probe reaches)
        (LLAMA31, "llama-bpe", {"error": 0, "warning": 1, "note": 1, "never": 0}),
        # worst: note (Qwen2.5 with its vocabulary)
        (QWEN25, "qwen2", {"error": 0, "warning": 0, "note": 1, "never": 0}),
    ],
)
def test_fail_on(work: Path, target: str, model: str | None, statuses: dict[str, int]) -> None:
    args = [str(work / target)] + (["-m", str(fetched.gguf_path(model))] if model else [])
    got = {level: _lint(*args, "--fail-on", level)[0] for level in statuses}
    assert got == statuses
    assert _lint(*args)[0] == statuses["error"]  # the default is --fail-on error


def test_exit_statuses_of_the_real_command(work: Path) -> None:
    ok = run_cli("lint", str(work / QWEN25), "-m", qwen2())
    assert ok.returncode == 0 and ok.stderr == "" and "0 errors, 0 warnings, 5 notes" in ok.stdout
    failed = run_cli("lint", str(work / "broken.jinja"))
    assert failed.returncode == 1 and failed.stderr == ""  # a finding: the template does not compile
    usage = run_cli("lint", str(work / QWEN25), "--fail-on", "sometimes")
    assert usage.returncode == 2 and usage.stdout == ""
    assert usage.stderr.startswith("error: usage: ") and len(usage.stderr.splitlines()) == 1
    broken_run = run_cli("lint", str(work / "absent.jinja"))  # an error: 2, never a finding's 1
    assert broken_run.returncode == 2 and broken_run.stdout == ""
    assert broken_run.stderr.startswith("error: ArtifactNotFoundError: ") and len(broken_run.stderr.splitlines()) == 1


# ------------------------------------------------------------------------------------ targets, rules, probes, vars


def test_several_targets(work: Path) -> None:
    code, data = _json(str(work / QWEN25), str(work / LLAMA31), str(work / "broken.jinja"), "-m", llama())
    assert code == 1  # the worst of them
    assert [r["template"]["id"] for r in data["reports"]] == [QWEN25, LLAMA31, "broken.jinja"]
    assert {r["model"] for r in data["reports"]} == {"ggml-vocab-llama-bpe.gguf"}  # one --model for all files
    assert [r["counts"]["error"] for r in data["reports"]] == [0, 0, 1]


def test_a_model_target_lints_its_embedded_templates() -> None:
    gguf = fetched.gguf_path("command-r")
    code, data = _json(str(gguf), "--fail-on", "never")
    assert code == 0
    reports = data["reports"]
    assert [r["template"]["id"] for r in reports] == [f"{gguf.name}/{n}" for n in ("default", "tool_use", "rag")]
    assert [r["template"]["origin"] for r in reports] == [
        f"{gguf}:tokenizer.chat_template",
        f"{gguf}:tokenizer.chat_template.tool_use",
        f"{gguf}:tokenizer.chat_template.rag",
    ]
    assert {r["model"] for r in reports} == {gguf.name}


def test_rule_restricts_the_findings(work: Path) -> None:
    code, data = _json(str(work / LLAMA31), "-m", llama(), "--rule", "double-bos", "--rule", "nondeterminism")
    [report] = data["reports"]
    assert code == 0 and [f["rule"] for f in report["findings"]] == ["double-bos"]


def test_probes_add_a_request_shape(work: Path, tmp_path: Path) -> None:
    """Llama 3.1's raise for tools without a user message: no shipped probe reaches it, a user's probe does."""
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
    probe = {"name": "tools-no-user", "request": {"messages": [{"role": "system", "content": "S"}], "tools": tools}}
    (tmp_path / "probes.json").write_text(json.dumps({"probes": [probe]}), "utf-8")
    args = [str(work / LLAMA31), "-m", llama(), "--rule", "reachable-raise"]
    _, before = _json(*args)
    _, after = _json(*args, "--probes", str(tmp_path / "probes.json"))
    raised = 'raise_exception("Cannot put tools in the first user message when there\'s no first user message!")'
    line = next(i for i, text in enumerate((work / LLAMA31).read_text("utf-8").splitlines(), 1) if raised in text)
    assert any("no probe reaches" in f["message"] and f["line"] == line for f in before["reports"][0]["findings"])
    [reached] = [f for f in after["reports"][0]["findings"] if f["line"] == line]
    assert (reached["severity"], reached["probe"]) == ("warning", "tools-no-user")


# ------------------------------------------------------------------------------------------------------ bad input


def _one_error_line(code: int, out: str, err: str, status: int, *needles: str) -> None:
    assert code == status, (out, err)
    assert "Traceback" not in out + err
    [line] = err.splitlines()
    assert line.startswith("error: "), line
    for needle in needles:
        assert needle in line, line


# Every bad input exits 2 (the run could not be made), usage errors included: 1 is a finding's alone.
BAD = [
    ("missing file", ["{work}/absent.jinja"], 2, ["ArtifactNotFoundError", "TARGET {work}/absent.jinja: no such file"]),
    ("a directory", ["{work}"], 2, ["{work}"]),
    ("unknown rule", ["{work}/broken.jinja", "--rule", "no-such-rule"], 2, ["--rule", "no rule 'no-such-rule'"]),
    ("sarif - and json", ["{work}/broken.jinja", "--sarif", "-", "--json"], 2, ["--sarif - and --json"]),
    ("unwritable sarif", ["{work}/broken.jinja", "--sarif", "{work}"], 2, ["--sarif {work}: cannot write"]),
    ("unwritable fix", ["{work}/" + QWEN25, "--rule", "double-bos", "--fix", "{work}"], 2, ["--fix {work}: cannot"]),
    ("missing probes", ["{work}/broken.jinja", "--probes", "{work}/absent.json"], 2, ["{work}/absent.json"]),
    ("bad probes", ["{work}/broken.jinja", "--probes", "{work}/broken.jinja"], 2, ["invalid JSON"]),
    ("bad var", ["{work}/broken.jinja", "--var", "thinking_mode"], 2, ["--var", "NAME=JSON"]),
    ("missing model", ["{work}/broken.jinja", "-m", "{work}/absent.gguf"], 2, ["{work}/absent.gguf"]),
    ("no target", [], 2, ["Missing argument"]),
]


@pytest.mark.parametrize(("case", "args", "status", "needles"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line(work: Path, case: str, args: list[str], status: int, needles: list[str]) -> None:
    filled = [a.format(work=work) for a in args]
    code, out, err = _lint(*filled)
    _one_error_line(code, out, err, status, *(n.format(work=work) for n in needles))
    if "--json" not in filled:
        assert out == ""


def test_bad_input_with_json_is_an_error_object(work: Path) -> None:
    code, out, err = _lint(str(work / "absent.jinja"), "--json")
    _one_error_line(code, out, err, 2, "absent.jinja")
    assert json.loads(out)["error"]["type"] == "ArtifactNotFoundError"


def test_a_bad_input_from_the_real_command(work: Path) -> None:
    proc = run_cli("lint", str(work))
    _one_error_line(proc.returncode, proc.stdout, proc.stderr, 2, str(work))
