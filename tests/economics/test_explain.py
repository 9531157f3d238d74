"""`ctxlock explain` (issue 18, acceptance 4 and 6): each of seed 001's five causes has a constructed case where it is
the answer and the other four are "no", and the evidence names the decision, the compaction plan, the finish reason
or the position. Real tokenizer and template (Qwen2's vocabulary, Qwen2.5's template), real records in a store;
positions are checked against the tokenizer's own encoding of the rendered text's prefix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from cli_runner import invoke, run_cli, run_main
from ctxlock.accounting._layout import layout
from ctxlock.cli.budget import register as register_fit
from ctxlock.cli.compaction import register as register_compaction
from ctxlock.cli.explain import register as register_explain
from ctxlock.cli.render import register as register_render
from ctxlock.economics._explain import MAX_FIND_CHARS, MIDDLE_MIN_TOKENS, OVERFLOW_MESSAGES, Window, explain
from ctxlock.errors import ExplainError
from ctxlock.template._render import ChatTemplate
from hypothesis_profiles import examples

QWEN_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"
NEEDLE = "MAGIC-TOKEN-4242"
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega"]
CAUSE_NAMES = ("too large", "output truncated", "dropped", "never read", "in the middle")


def filler(n: int, seed: int) -> str:
    return " ".join(WORDS[(i * 7 + seed) % len(WORDS)] for i in range(n))


@pytest.fixture(scope="module")
def qwen() -> tuple[ctxlock.Model, ChatTemplate, Path, Path]:
    model_dir = fetched.hf_tokenizer_dir("qwen2")
    template_path = fetched.templates_dir() / QWEN_TEMPLATE
    template = ChatTemplate(template_path.read_text("utf-8"), id=QWEN_TEMPLATE)
    return ctxlock.load(str(model_dir)), template, model_dir, template_path


def tool_chat(needle_at: int, turns: int, words: int = 60) -> dict[str, Any]:
    """A coding session: turns of (user, assistant tool call, tool result); the needle in one tool result."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding assistant."}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"step {t}: {filler(words // 3, t)}"})
        call = {"id": f"c{t}", "type": "function", "function": {"name": "read", "arguments": {"path": f"f{t}.ts"}}}
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        body = filler(words, t + 1)
        if t == needle_at:
            body = f"{body} // {NEEDLE} // {filler(5, t)}"
        msgs.append({"role": "tool", "tool_call_id": f"c{t}", "content": body})
    msgs.append({"role": "user", "content": "Where is the magic token?"})
    return {"messages": msgs}


STOP = {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]}


def write(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value) if not isinstance(value, str) else value, "utf-8")
    return path


def explain_json(*args: str) -> dict[str, Any]:
    result = invoke(register_explain, "explain", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def verdicts(out: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in out["causes"]}


def only(cause: str, out: dict[str, Any]) -> None:
    got = verdicts(out)
    assert got == {name: ("yes" if name == cause else "no") for name in CAUSE_NAMES}, json.dumps(out, indent=1)
    assert out["answer"] == [cause]


def evidence(out: dict[str, Any], cause: str) -> str:
    return " | ".join(next(c["evidence"] for c in out["causes"] if c["name"] == cause))


def request_args(qwen: Any, request: Path) -> list[str]:
    _, _, model_dir, template_path = qwen
    return ["--request", str(request), "--model", str(model_dir), "--template", str(template_path)]


# ------------------------------------------------------------------------------------------- the five cases


def test_too_large_by_the_window(qwen: Any, tmp_path: Path) -> None:
    req = write(tmp_path / "r.json", tool_chat(needle_at=2, turns=3))
    stop = write(tmp_path / "e.json", STOP)
    args = request_args(qwen, req)
    tokens = explain_json("--find", NEEDLE, *args, "--context-window", "100000", "--events", str(stop))["input_tokens"]
    out = explain_json("--find", NEEDLE, *args, "--context-window", str(tokens - 1), "--events", str(stop))
    only("too large", out)
    assert f"{tokens:,} input tokens (exact, by ctxlock): over the {tokens - 1:,}-token window" in evidence(
        out, "too large"
    )


@pytest.mark.parametrize(("provider", "message"), OVERFLOW_MESSAGES)
def test_too_large_by_a_provider_error(qwen: Any, tmp_path: Path, provider: str, message: str) -> None:
    req = write(tmp_path / "r.json", tool_chat(needle_at=2, turns=3))
    error = {"error": {"message": f"Error: {message} (the request was refused)", "type": "invalid_request_error"}}
    events = write(tmp_path / "e.jsonl", json.dumps(STOP) + "\n" + json.dumps(error) + "\n")
    out = explain_json(
        "--find", NEEDLE, *request_args(qwen, req), "--context-window", "100000", "--events", str(events)
    )
    only("too large", out)
    assert message in evidence(out, "too large") and ":2" in evidence(out, "too large"), provider


@pytest.mark.parametrize(
    "response",
    [
        {  # OpenAI Chat Completions: finish_reason length, a tool call cut short
            "choices": [
                {
                    "finish_reason": "length",
                    "message": {
                        "role": "assistant",
                        "tool_calls": [{"id": "x", "type": "function", "function": {"name": "bash", "arguments": "{"}}],
                    },
                }
            ]
        },
        {  # Anthropic Messages: stop_reason max_tokens, a tool_use block
            "type": "message",
            "stop_reason": "max_tokens",
            "content": [{"type": "tool_use", "id": "t", "name": "bash", "input": {}}],
        },
        {  # Gemini: finishReason MAX_TOKENS with a function call
            "candidates": [{"finishReason": "MAX_TOKENS", "content": {"parts": [{"functionCall": {"name": "bash"}}]}}]
        },
        {  # Pi --mode json: the assistant message stopped at the limit
            "type": "message_end",
            "message": {"role": "assistant", "stopReason": "length", "content": [{"type": "toolCall", "name": "bash"}]},
        },
    ],
    ids=["openai", "anthropic", "gemini", "pi"],
)
def test_output_truncated(qwen: Any, tmp_path: Path, response: dict[str, Any]) -> None:
    req = write(tmp_path / "r.json", tool_chat(needle_at=2, turns=3))
    events = write(tmp_path / "e.json", response)
    out = explain_json(
        "--find", NEEDLE, *request_args(qwen, req), "--context-window", "100000", "--events", str(events)
    )
    only("output truncated", out)
    text = evidence(out, "output truncated")
    assert "finish reason" in text and "bash" in text and "not executed" in text


def test_output_truncated_by_pis_refusal(qwen: Any, tmp_path: Path) -> None:
    req = write(tmp_path / "r.json", tool_chat(needle_at=2, turns=3))
    refusal = (
        'Tool call "bash" was not executed: the response hit the output token limit, so its arguments may be '
        "truncated. Re-issue the tool call with complete arguments."
    )
    events = write(tmp_path / "e.jsonl", json.dumps(STOP) + "\n" + json.dumps({"type": "tool_result", "text": refusal}))
    out = explain_json(
        "--find", NEEDLE, *request_args(qwen, req), "--context-window", "100000", "--events", str(events)
    )
    only("output truncated", out)
    assert "tool call 'bash' was not executed" in evidence(out, "output truncated")


def test_dropped_by_a_compaction(qwen: Any, tmp_path: Path) -> None:
    _, _, model_dir, template_path = qwen
    chat = tool_chat(needle_at=0, turns=8)
    for k, m in enumerate(chat["messages"]):
        m["id"] = f"entry-{k}"
    req = write(tmp_path / "r.json", chat)
    summary = write(tmp_path / "summary.txt", "The user asked for files; they were read.")
    store = tmp_path / "store"
    planned = invoke(
        register_compaction,
        "compact-plan",
        "-m",
        str(model_dir),
        "-t",
        str(template_path),
        "--context-window",
        "1200",
        "--reserve-tokens",
        "200",
        "--keep-recent-tokens",
        "400",
        "--summary-tokens",
        "20",
        "--summary",
        str(summary),
        "--record",
        "--store",
        str(store),
        "--json",
        str(req),
    )
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.output)
    assert 3 in plan["messages_to_summarize"]  # the needle's tool result is summarized
    stop = write(tmp_path / "e.json", STOP)
    out = explain_json(
        "--find", NEEDLE, plan["record_id"], "--store", str(store), "--context-window", "1200", "--events", str(stop)
    )
    only("dropped", out)
    text = evidence(out, "dropped")
    cut = plan["first_kept_index"]
    assert "compaction plan (threshold)" in text and f"record {plan['record_id'][:12]}" in text
    assert "removed messages[3]" in text and f"firstKeptEntryId 'entry-{cut}'" in text


def test_dropped_by_a_fit_decision(qwen: Any, tmp_path: Path) -> None:
    _, _, model_dir, template_path = qwen
    req = write(tmp_path / "r.json", tool_chat(needle_at=0, turns=4))
    store = tmp_path / "store"
    fitted = invoke(
        register_fit,
        "fit",
        "-m",
        str(model_dir),
        "-t",
        str(template_path),
        "--max-input-tokens",
        "250",
        "--record",
        "--store",
        str(store),
        "--json",
        str(req),
    )
    assert fitted.exit_code == 0, fitted.output
    rid = json.loads(fitted.output)["record_id"]
    stop = write(tmp_path / "e.json", STOP)
    out = explain_json("--find", NEEDLE, rid, "--store", str(store), "--context-window", "250", "--events", str(stop))
    only("dropped", out)
    text = evidence(out, "dropped")
    assert "fit decision history[1:4]" in text and "removed messages[3]" in text and "budget 250, policy sha256" in text


def test_never_read_in_no_request_string(qwen: Any, tmp_path: Path) -> None:
    _, _, model_dir, template_path = qwen
    req = write(tmp_path / "r.json", tool_chat(needle_at=-1, turns=3))
    store = tmp_path / "store"
    rendered = invoke(
        register_render, "render", "-m", str(model_dir), "-t", str(template_path), "--record", "--store", str(store),
        "--json", str(req),
    )  # fmt: skip
    assert rendered.exit_code == 0, rendered.output
    rid = json.loads(rendered.output)["record_id"]
    stop = write(tmp_path / "e.json", STOP)
    out = explain_json(
        "--find", NEEDLE, rid, "--store", str(store), "--context-window", "100000", "--events", str(stop)
    )
    only("never read", out)
    assert "in no request string" in evidence(out, "never read")


def test_never_read_only_pasted_by_the_user(qwen: Any, tmp_path: Path) -> None:
    chat = tool_chat(needle_at=-1, turns=2)
    chat["messages"][1]["content"] += f" Here is src/greet.ts: {NEEDLE}"
    req = write(tmp_path / "r.json", chat)
    stop = write(tmp_path / "e.json", STOP)
    out = explain_json("--find", NEEDLE, *request_args(qwen, req), "--context-window", "100000", "--events", str(stop))
    only("never read", out)
    assert "only in user-pasted content (messages[1].content (user))" in evidence(out, "never read")


def test_never_read_in_a_part_the_template_ignores(qwen: Any, tmp_path: Path) -> None:
    _, _, model_dir, template_path = qwen
    chat = tool_chat(needle_at=-1, turns=2) | {"documents": [{"title": "greet.ts", "text": f"export {NEEDLE}"}]}
    req = write(tmp_path / "r.json", chat)
    store = tmp_path / "store"
    rendered = invoke(
        register_render, "render", "-m", str(model_dir), "-t", str(template_path), "--record", "--store", str(store),
        "--json", str(req),
    )  # fmt: skip
    rid = json.loads(rendered.output)["record_id"]
    stop = write(tmp_path / "e.json", STOP)
    out = explain_json(
        "--find", NEEDLE, rid, "--store", str(store), "--context-window", "100000", "--events", str(stop)
    )
    only("never read", out)
    assert "documents[0].text holds it, but the template wrote no byte of it" in evidence(out, "never read")


def test_in_the_middle(qwen: Any, tmp_path: Path) -> None:
    model, template, _, _ = qwen
    chat = tool_chat(needle_at=10, turns=20, words=120)
    req = write(tmp_path / "r.json", chat)
    stop = write(tmp_path / "e.json", STOP)
    out = explain_json("--find", NEEDLE, *request_args(qwen, req), "--context-window", "100000", "--events", str(stop))
    only("in the middle", out)
    assert out["input_tokens"] >= MIDDLE_MIN_TOKENS
    # The position is exact: `token` is the index, in the real ids, of the token holding the needle's first
    # character (here " MAGIC": the space before it merges in). Checked by the reference decoder on those ids.
    lay = layout(model, chat, chat_template=template)
    first = out["occurrences"][0]
    text = lay.rendered.text
    assert text[first["char"] :].startswith(NEEDLE)
    ids = [int(i) for i in lay.ids]
    before = model.tokenizer.decode(ids[: first["token"]])
    through = model.tokenizer.decode(ids[: first["token"] + 1])
    assert text.startswith(before) and len(before) <= first["char"] < len(through)
    assert f"first occurrence at token {first['token']:,} of {out['input_tokens']:,}" in evidence(out, "in the middle")
    assert "Liu et al., TACL 2024" in evidence(out, "in the middle")
    # The same needle near the end is not in the middle.
    late = write(tmp_path / "late.json", tool_chat(needle_at=19, turns=20, words=120))
    out = explain_json("--find", NEEDLE, *request_args(qwen, late), "--context-window", "100000", "--events", str(stop))
    assert verdicts(out)["in the middle"] == "no" and out["answer"] == []


def test_unknown_without_window_or_events(qwen: Any, tmp_path: Path) -> None:
    req = write(tmp_path / "r.json", tool_chat(needle_at=-1, turns=1))
    out = explain_json("--find", NEEDLE, *request_args(qwen, req))
    got = verdicts(out)
    assert got["too large"] == got["output truncated"] == got["dropped"] == "unknown"
    assert "pass --context-window" in evidence(out, "too large")


def test_the_models_own_window_without_the_flag(qwen: Any, tmp_path: Path) -> None:
    # A model directory whose config.json states the window: cause 1 uses it, and names its source.
    _, _, model_dir, template_path = qwen
    small = tmp_path / "model"
    shutil.copytree(model_dir, small)
    write(small / "config.json", {"model_type": "qwen2", "max_position_embeddings": 64})
    req = write(tmp_path / "r.json", tool_chat(needle_at=0, turns=1))
    stop = write(tmp_path / "e.json", STOP)
    args = ["--request", str(req), "--model", str(small), "--template", str(template_path), "--events", str(stop)]
    out = explain_json("--find", NEEDLE, *args)
    assert verdicts(out)["too large"] == "yes"
    assert "the model's capacity (config.json" in evidence(out, "too large")
    # The flag still wins.
    assert verdicts(explain_json("--find", NEEDLE, *args, "--context-window", "100000"))["too large"] == "no"


def test_window_is_a_value_with_its_source(qwen: Any) -> None:
    model, template, _, _ = qwen
    lay = layout(model, tool_chat(needle_at=0, turns=1), chat_template=template)
    out = explain(NEEDLE, lay, label="x", window=Window(10, "config.json max_position_embeddings"))
    assert out.causes[0].verdict == "yes" and "config.json max_position_embeddings" in out.causes[0].evidence[0]


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, 5), needle=st.text(alphabet="xyzé中🙂 ", min_size=1, max_size=6).map(lambda s: f"Q{s}Q"))
def test_position_is_the_tokens_before_it(qwen: Any, at: int, needle: str) -> None:
    model, template, _, _ = qwen
    chat = tool_chat(needle_at=-1, turns=6, words=20)
    chat["messages"][3 * at + 3]["content"] += f" {needle} tail"
    lay = layout(model, chat, chat_template=template)
    out = explain(needle, lay, label="x")
    first = out.occurrences[0]
    start = first["char"]
    assert lay.rendered.text.find(needle) == start
    # the token holding the needle's first character: every token before it ends at or before that character
    byte = int(lay.offsets[start])
    assert int(lay.ends[first["token"] - 1]) <= byte < int(lay.ends[first["token"]])


# ------------------------------------------------------------------------------------------- hostile inputs


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "holds no event"),
        ("{not json\n", "invalid JSON"),
        ('{"a": 1}\n[1, 2\n', ":2 column"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper than 128"),
        ('{"a": 1}\n' + "[" * 200 + "]" * 200 + "\n", "nested deeper than 128"),
        ('{"a": 1}\n{"n": ' + "9" * 5_000 + "}\n", "4300 digits"),
        ('{"a": 1}\n{"usage": {"input_tokens": NaN}}\n', "not a finite JSON number"),
        ('[{"a": "\\udc00"}]', "lone surrogate"),
        ('{"a": 1, "a": 2}', 'duplicate key "a"'),
        ("\xff\xfe", "not UTF-8"),
    ],
    ids=[
        "empty",
        "garbage",
        "truncated-line",
        "deep",
        "deep-line",
        "digits",
        "nan",
        "surrogate",
        "duplicate",
        "not-utf8",
    ],
)
def test_bad_events_file_is_one_line(qwen: Any, tmp_path: Path, content: str, needle: str) -> None:
    req = write(tmp_path / "r.json", tool_chat(needle_at=0, turns=1))
    events = tmp_path / "e.json"
    if content == "\xff\xfe":
        events.write_bytes(b"\xff\xfe{}")
    else:
        events.write_text(content, "utf-8")
    # In this process (a traceback would fail the test): ten model loads in child processes cost a minute; the
    # commands of test_bad_record_id_and_huge_find run in child processes, as a user runs them.
    code, _, err = run_main(["explain", "--find", NEEDLE, *request_args(qwen, req), "--events", str(events)])
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0] and str(events) in lines[0]


def test_bad_record_id_and_huge_find(tmp_path: Path) -> None:
    store = tmp_path / "store"
    for rid, needle in (("abcdef012345", "RecordNotFoundError"), ("zz", "not a record id"), ("abc", "too short")):
        proc = run_cli("explain", "--find", NEEDLE, rid, "--store", str(store))
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr
    huge = "x" * (MAX_FIND_CHARS + 1)
    proc = run_cli("explain", "--find", huge, "abcdef012345", "--store", str(store))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "ExplainError: --find" in proc.stderr
    proc = run_cli("explain", "--find", "", "abcdef012345", "--store", str(store))
    assert proc.returncode == 1 and "the text to find is empty" in proc.stderr
    proc = run_cli("explain", "--find", NEEDLE, "--store", str(store))
    assert proc.returncode == 1 and "give a RECORD or --request FILE" in proc.stderr
    with pytest.raises(ExplainError):
        explain("x" * (MAX_FIND_CHARS + 1), None, label="x")  # type: ignore[arg-type]


def test_json_error_is_an_object(tmp_path: Path) -> None:
    result = invoke(register_explain, "explain", "--find", NEEDLE, "abcdef012345", "--store", str(tmp_path), "--json")
    assert result.exit_code == 1
    assert json.loads(result.output)["error"]["type"] == "RecordNotFoundError"


def test_history_records_explain_a_request(qwen: Any, tmp_path: Path) -> None:
    # The request as sent after `fit` (--emit-request), explained with the fit's record as --history.
    _, _, model_dir, template_path = qwen
    req = write(tmp_path / "r.json", tool_chat(needle_at=0, turns=4))
    store, sent = tmp_path / "store", tmp_path / "sent.json"
    fitted = invoke(
        register_fit, "fit", "-m", str(model_dir), "-t", str(template_path), "--max-input-tokens", "250", "--record",
        "--store", str(store), "--emit-request", str(sent), "--json", str(req),
    )  # fmt: skip
    rid = json.loads(fitted.output)["record_id"]
    stop = write(tmp_path / "e.json", STOP)
    args = [*request_args(qwen, sent), "--context-window", "250", "--events", str(stop)]
    out = explain_json("--find", NEEDLE, *args, "--history", rid[:12], "--store", str(store))
    only("dropped", out)
    assert f"fit decision history[1:4] in record {rid[:12]}" in evidence(out, "dropped")
    # Without the record, a compaction_end in the events makes cause 3 unknown, never a guess.
    pi = {"type": "compaction_end", "reason": "threshold", "result": {"firstKeptEntryId": "abc123"}}
    events = write(tmp_path / "pi.jsonl", json.dumps(pi) + "\n" + json.dumps(STOP) + "\n")
    out = explain_json("--find", NEEDLE, *request_args(qwen, sent), "--context-window", "250", "--events", str(events))
    assert verdicts(out)["dropped"] == verdicts(out)["never read"] == "unknown"
    assert "firstKeptEntryId 'abc123'" in evidence(out, "dropped")
