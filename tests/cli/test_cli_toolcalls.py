"""`ctxlock toolcalls` (issue 15 items 10-12 on the command line): a recorded stream in, the calls that may run out."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import anthropic_streams as A
from cli_runner import run_main

STREAMS = Path(__file__).parents[1] / "data" / "streams"


@pytest.fixture(autouse=True)
def _terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")


def ctxlock(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`ctxlock toolcalls ARGS` in this process (cli_runner.run_main: an exception escaping main fails the test, as
    the traceback a user would see): these tests read what the command prints and its exit status, not its process."""
    code, out, err = run_main(["toolcalls", *args], stdin=(stdin or "").encode("utf-8"))
    return subprocess.CompletedProcess(["toolcalls", *args], code, out, err)


def tools_file(tmp_path: Path) -> str:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(A.TOOLS), encoding="utf-8")
    return str(path)


def test_anthropic_stream_at_max_tokens_releases_nothing(tmp_path: Path) -> None:
    proc = ctxlock(
        "-f", "anthropic", "--tools", tools_file(tmp_path), str(STREAMS / "anthropic_max_tokens_mid_input.sse")
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    out = json.loads(proc.stdout)
    assert out["calls"] == [] and out["finish_reason"] == "length" and out["stream_finish_reason"] == "max_tokens"
    assert [(e["type"], e["call_id"]) for e in out["errors"]] == [
        ("ToolCallTruncatedError", A.CALLS[0]["id"]),
        ("ToolCallTruncatedError", A.CALLS[1]["id"]),
    ]
    early = json.loads(
        ctxlock(
            "-f",
            "anthropic",
            "--release",
            "early",
            "--tools",
            tools_file(tmp_path),
            str(STREAMS / "anthropic_max_tokens_mid_input.sse"),
        ).stdout
    )
    assert [c["id"] for c in early["calls"]] == [A.CALLS[0]["id"]] and "may have run" in early["errors"][0]["hint"]


def test_anthropic_stream_that_ended_normally(tmp_path: Path) -> None:
    body = (STREAMS / "anthropic_thinking_text_two_tools.sse").read_text(encoding="utf-8")
    proc = ctxlock("-f", "anthropic", "--tools", tools_file(tmp_path), "-", stdin=body)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [(c["id"], json.loads(c["function"]["arguments"])) for c in out["calls"]] == [
        (c["id"], c["arguments"]) for c in A.CALLS
    ]
    assert out["text"] == A.TEXT and out["thinking"] == A.THINKING and out["finish_reason"] == "tool_calls"


def test_openai_sse_body_with_an_in_band_error(tmp_path: Path) -> None:
    body = (
        'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
        'data: {"error":{"message":"The server had an error","type":"server_error"}}\n\n'
    )
    proc = ctxlock("-f", "openai", "--tools", tools_file(tmp_path), "-", stdin=body)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ProviderStreamError: chunks[1]:") and "The server had an error" in proc.stderr
    assert json.loads(proc.stdout)["error"]["provider"]["type"] == "server_error"


def test_text_formats_need_a_finish_reason(tmp_path: Path) -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    unknown = ctxlock("-f", "hermes", "--tools", tools_file(tmp_path), "-", stdin=text)
    assert unknown.returncode == 1 and json.loads(unknown.stdout)["calls"] == []
    assert "finish_reason=None" in json.loads(unknown.stdout)["errors"][0]["message"]
    stop = ctxlock("-f", "hermes", "--finish-reason", "stop", "--tools", tools_file(tmp_path), "-", stdin=text)
    assert stop.returncode == 0 and json.loads(stop.stdout)["calls"][0]["function"]["name"] == "get_weather"


def test_bad_tools_file_is_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "tools.json"
    bad.write_text('{"type": "function"}', encoding="utf-8")
    proc = ctxlock("-f", "hermes", "--tools", str(bad), "-", stdin="hi")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ToolCallError: --tools") and "expected a tool list" in proc.stderr


def test_anthropic_tools_and_a_whole_request(tmp_path: Path) -> None:
    anthropic_tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in A.TOOLS]
    request = {
        "model": "m",
        "max_tokens": 100,
        "tools": anthropic_tools,
        "messages": [{"role": "user", "content": "hi"}],
    }
    body = str(STREAMS / "anthropic_thinking_text_two_tools.sse")
    for k, spec in enumerate([anthropic_tools, request]):
        path = tmp_path / f"tools{k}.json"
        path.write_text(json.dumps(spec), encoding="utf-8")
        proc = ctxlock("-f", "anthropic", "--tools", str(path), body)
        assert proc.returncode == 0, proc.stderr
        assert [c["function"]["name"] for c in json.loads(proc.stdout)["calls"]] == ["get_weather", "search_docs"]
