"""Hostile streams (red-team findings F5, F9, F10): every failure is a typed CtxlockError, nothing bad is released."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxlock.errors import CtxlockError, ToolCallError
from ctxlock.generation.toolcalls import DEFAULT_MAX_EVENT_SIZE, Result, ToolCallAssembler
from hypothesis_profiles import examples

TOOLS = [
    {"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {"a": {}}}}},
    {
        "type": "function",
        "function": {"name": "num", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}},
    },
]
# The formats whose arguments are JSON the model wrote, each with how it frames one call of tool `get` (the newer
# formats' framings: docs/tool-call-formats.md).
FRAMES = {
    "harmony": "<|channel|>commentary to=functions.get <|constrain|>json<|message|>{}<|call|>",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n{}\n```"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{}"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get:0<|tool_call_argument_begin|>{}"
    "<|tool_call_end|><|tool_calls_section_end|>",
    "llama3_json": '<|python_tag|>{{"name": "get", "parameters": {}}}',
    "granite": '<|tool_call|>[{{"name": "get", "arguments": {}}}]',
    "nemotron_json": '<TOOLCALL>[{{"name": "get", "arguments": {}}}]</TOOLCALL>',
    "functionary_v3_1": "<function=get>{}</function>",
    "functionary_v3_2": "get\n{}",
    "minimax": '<tool_calls>\n{{"name": "get", "arguments": {}}}\n</tool_calls>',
}
FORMATS = ["anthropic", "openai", "hermes", "mistral", "qwen3_coder", *FRAMES]
SETTINGS = settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sse(events: list[dict[str, Any]]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


START = {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": []}}


def anthropic_events(
    calls: list[tuple[str, str]], reasons: tuple[str, ...] = ("tool_use",), *, start: bool = True
) -> list[dict[str, Any]]:
    evs: list[dict[str, Any]] = [START] if start else []
    for k, (cid, raw) in enumerate(calls):
        evs += [
            {
                "type": "content_block_start",
                "index": k,
                "content_block": {"type": "tool_use", "id": cid, "name": "get"},
            },
            {"type": "content_block_delta", "index": k, "delta": {"type": "input_json_delta", "partial_json": raw}},
            {"type": "content_block_stop", "index": k},
        ]
    evs += [{"type": "message_delta", "delta": {"stop_reason": r}} for r in reasons]
    return [*evs, {"type": "message_stop"}]


def run(fmt: str, raw_args: str, *, release: str = "finish") -> Result:
    """One call of tool `get` whose arguments are `raw_args` as the model wrote them, in format `fmt`."""
    asm = ToolCallAssembler(TOOLS, fmt, release=release)
    if fmt == "anthropic":
        asm.feed(sse(anthropic_events([("t1", raw_args)])))
        return asm.finish()
    if fmt == "openai":
        fn = {"name": "get", "arguments": raw_args}
        asm.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": fn}]}}]})
        asm.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        return asm.finish()
    if fmt == "hermes":
        asm.feed('<tool_call>\n{"name": "get", "arguments": ' + raw_args + "}\n</tool_call>")
    elif fmt == "mistral":
        asm.feed("[TOOL_CALLS]get[ARGS]" + raw_args)
    elif fmt in FRAMES:
        frame = FRAMES[fmt]
        asm.feed(frame.format(raw_args) if "{{" in frame else frame.replace("{}", raw_args, 1))
    else:  # qwen3_coder: parameter `a` is untyped, so the text is its (string) value
        asm.feed(f"<tool_call>\n<function=get>\n<parameter=a>\n{raw_args}\n</parameter>\n</function>\n</tool_call>")
    return asm.finish("stop")


def refused(result: Result, *needles: str) -> ToolCallError:
    assert not result.calls, result.calls
    assert len(result.errors) >= 1
    err = result.errors[0]
    assert isinstance(err, CtxlockError) and err.path.startswith("tool_calls[0]"), err
    for needle in needles:
        assert needle in err.message, err.message
    return err


# -- 1. big integers and deep nesting are typed errors, in every format --------------------------------------------


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "qwen3_coder"])
@SETTINGS
@given(digits=st.integers(4301, 9000))
def test_an_integer_longer_than_python_converts_is_an_invalid_call(fmt: str, digits: int) -> None:
    refused(run(fmt, '{"a": ' + "9" * digits + "}"), "too long")


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "qwen3_coder"])
@SETTINGS
@given(depth=st.integers(20_000, 60_000), kind=st.sampled_from(["[]", "{}"]))
def test_deep_nesting_is_an_invalid_call(fmt: str, depth: int, kind: str) -> None:
    inner = "[" * depth + "]" * depth if kind == "[]" else '{"a":' * depth + "1" + "}" * depth
    refused(run(fmt, '{"a": ' + inner + "}"), "nested too deeply")


def test_qwen3_coder_parameters_that_json_cannot_convert_are_not_released() -> None:
    asm = ToolCallAssembler(TOOLS, "qwen3_coder")
    big = "9" * 5000
    asm.feed(f"<tool_call>\n<function=num>\n<parameter=n>\n{big}\n</parameter>\n</function>\n</tool_call>")
    result = asm.finish("stop")
    assert not result.calls and isinstance(result.errors[0], ToolCallError)


@pytest.mark.parametrize(
    "data",
    [
        '{"type": "ping", "n": ' + "9" * 5000 + "}",
        "[" * 100_000 + "]" * 100_000,
        '{"type": "ping", "x": NaN}',
        '{"type": "ping", "type": "message_stop"}',
    ],
)
def test_an_event_that_is_not_json_is_a_typed_stream_error(data: str) -> None:
    asm = ToolCallAssembler(TOOLS, "anthropic")
    with pytest.raises(ToolCallError) as info:
        asm.feed(f"event: ping\ndata: {data}\n\n")
    assert info.value.path == "events[0].data"


# -- 2. arguments that are not RFC 8259 JSON -------------------------------------------------------------------------


JSON_FORMATS = [f for f in FORMATS if f != "qwen3_coder"]  # qwen3_coder writes an untyped value as plain text


@pytest.mark.parametrize("fmt", JSON_FORMATS)
@SETTINGS
@given(constant=st.sampled_from(["NaN", "Infinity", "-Infinity"]), nest=st.booleans())
def test_nan_and_infinity_are_not_json(fmt: str, constant: str, nest: bool) -> None:
    value = f'{{"b": [{constant}]}}' if nest else constant
    raw = '{"a": ' + value + "}"
    err = refused(run(fmt, raw))
    assert constant in err.message and "at char" in err.message


def test_nan_in_qwen3_coder_numbers_is_not_a_number() -> None:
    asm = ToolCallAssembler(TOOLS, "qwen3_coder")
    asm.feed("<tool_call>\n<function=num>\n<parameter=n>\nNaN\n</parameter>\n</function>\n</tool_call>")
    result = asm.finish("stop")
    assert not result.calls and result.errors


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "qwen3_coder"])
@SETTINGS
@given(key=st.text(st.characters(codec="utf-8"), max_size=8), depth=st.integers(0, 3))
def test_duplicate_keys_are_not_json(fmt: str, key: str, depth: int) -> None:
    k = json.dumps(key)
    inner = "{" + k + ": 1, " + k + ": 2}"
    for _ in range(depth):
        inner = '{"x": ' + inner + "}"
    refused(run(fmt, '{"a": ' + inner + "}"), "duplicate object key", repr(key))


@pytest.mark.parametrize("fmt", JSON_FORMATS)
@SETTINGS
@given(code=st.integers(0xD800, 0xDFFF), in_key=st.booleans())
def test_lone_surrogates_are_not_json(fmt: str, code: int, in_key: bool) -> None:
    escape = f'"\\u{code:04x}"'
    raw = "{" + escape + ": 1}" if in_key else '{"a": ' + escape + "}"
    refused(run(fmt, raw), "lone surrogate")


@pytest.mark.parametrize("fmt", JSON_FORMATS)
def test_a_surrogate_pair_and_nan_inside_a_string_are_fine(fmt: str) -> None:
    result = run(fmt, '{"a": "\\ud83d\\ude00 NaN"}')
    assert result.ok and result.calls[0].arguments == {"a": "\U0001f600 NaN"}


@pytest.mark.parametrize("fmt", FORMATS)
@SETTINGS
@given(code=st.integers(0xD800, 0xDFFF))
def test_a_raw_lone_surrogate_character_is_refused(fmt: str, code: int) -> None:
    refused(run(fmt, '{"a": "' + chr(code) + '"}'), "lone surrogate")


def test_parsed_anthropic_events_with_a_non_json_start_input_are_refused() -> None:
    asm = ToolCallAssembler(TOOLS, "anthropic")
    block = {"type": "tool_use", "id": "t1", "name": "get", "input": {"a": float("nan")}}
    for ev in [
        START,
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
        {"type": "message_stop"},
    ]:
        asm.feed(ev)
    refused(asm.finish(), "non-finite")


# -- 3. two calls with one id ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("release", ["finish", "early"])
def test_anthropic_calls_with_the_same_id_are_refused(release: str) -> None:
    asm = ToolCallAssembler(TOOLS, "anthropic", release=release)
    events = asm.feed(sse(anthropic_events([("t1", '{"a": 1}'), ("t1", '{"a": 2}')])))
    result = asm.finish()
    if release == "finish":
        assert not result.calls and [e.path for e in result.errors] == ["tool_calls[0].id", "tool_calls[1].id"]
    else:  # the first was already out when the second arrived; the second is refused
        assert [c.index for c in result.calls] == [0] and [e.path for e in result.errors] == ["tool_calls[1].id"]
        assert [getattr(e, "index", None) for e in events if not hasattr(e, "text")] == [0, 1]
    assert all(isinstance(e, ToolCallError) and "'t1'" in e.message for e in result.errors)


@SETTINGS
@given(cid=st.text(min_size=1, max_size=10), n=st.integers(2, 4))
def test_openai_calls_with_the_same_id_are_refused(cid: str, n: int) -> None:
    asm = ToolCallAssembler(TOOLS, "openai")
    for k in range(n):
        fn = {"name": "get", "arguments": f'{{"a": {k}}}'}
        asm.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": k, "id": cid, "function": fn}]}}]})
    asm.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    result = asm.finish()
    assert result.errors and len({c.id for c in result.calls}) == len(result.calls) <= 1


def test_a_make_id_that_repeats_itself_releases_nothing_twice() -> None:
    asm = ToolCallAssembler(TOOLS, "hermes", make_id=lambda _: "same")
    asm.feed(
        '<tool_call>{"name": "get", "arguments": {}}</tool_call><tool_call>{"name": "get", "arguments": {}}</tool_call>'
    )
    result = asm.finish("stop")
    assert not result.calls and len(result.errors) == 2


# -- 4. anthropic event order ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reasons",
    [("max_tokens", "tool_use"), ("tool_use", "max_tokens"), ("end_turn", "tool_use"), ("refusal", "end_turn")],
)
def test_message_deltas_that_disagree_on_stop_reason_refuse_the_stream(reasons: tuple[str, str]) -> None:
    asm = ToolCallAssembler(TOOLS, "anthropic")
    with pytest.raises(ToolCallError) as info:
        asm.feed(sse(anthropic_events([("t1", '{"a": 1}')], reasons)))
    assert info.value.path == "events[5].delta.stop_reason" and repr(reasons[0]) in info.value.message
    result = asm.finish()  # finishing anyway releases nothing
    assert not result.calls and result.errors
    non_normal = [r for r in reasons if r not in ("tool_use", "end_turn")]
    if "max_tokens" in non_normal:
        assert result.finish_reason == "length"


def test_repeated_message_deltas_with_one_stop_reason_are_fine() -> None:
    asm = ToolCallAssembler(TOOLS, "anthropic")
    asm.feed(sse(anthropic_events([("t1", '{"a": 1}')], ("tool_use", "tool_use"))))
    assert asm.finish().ok


@pytest.mark.parametrize("release", ["finish", "early"])
@pytest.mark.parametrize("ping", [True, False])
def test_a_stream_without_message_start_releases_nothing(ping: bool, release: str) -> None:
    evs = anthropic_events([("t1", '{"a": 1}'), ("t2", '{"a": 2}')], start=False)
    asm = ToolCallAssembler(TOOLS, "anthropic", release=release)
    asm.feed(sse([{"type": "ping"}] * ping + evs))
    result = asm.finish()
    assert not result.calls and result.errors
    assert all(isinstance(e, ToolCallError) and "without message_start" in e.message for e in result.errors)


# -- 5. memory: one SSE line / event / tool input is capped ----------------------------------------------------------


def test_the_default_cap_is_64_mib() -> None:
    assert DEFAULT_MAX_EVENT_SIZE == 64 << 20
    with pytest.raises(ToolCallError):
        ToolCallAssembler(TOOLS, "anthropic", max_event_size=0)


@SETTINGS
@given(cap=st.integers(16, 4096), piece=st.integers(1, 700), as_bytes=st.booleans())
def test_a_line_without_a_newline_is_capped(cap: int, piece: int, as_bytes: bool) -> None:
    asm = ToolCallAssembler(TOOLS, "anthropic", max_event_size=cap)
    chunk: str | bytes = "x" * piece
    chunk = chunk.encode() if as_bytes else chunk
    asm.feed(b"data: " if as_bytes else "data: ")
    with pytest.raises(ToolCallError) as info:
        for _ in range(cap // piece + 2):
            asm.feed(chunk)
    assert "max_event_size" in info.value.message and info.value.path.startswith("events[0]")


def test_one_event_of_many_data_lines_is_capped() -> None:
    asm = ToolCallAssembler(TOOLS, "anthropic", max_event_size=1000)
    with pytest.raises(ToolCallError, match="max_event_size"):
        for _ in range(200):
            asm.feed("data: 0123456789\n")


def test_an_endless_tool_input_is_capped_and_not_released() -> None:
    asm = ToolCallAssembler(TOOLS, "anthropic", max_event_size=1000)
    asm.feed(START)
    asm.feed(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t", "name": "get"}}
    )
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "input_json_delta", "partial_json": " " * 100},
    }
    with pytest.raises(ToolCallError, match="max_event_size"):
        for _ in range(20):
            asm.feed(delta)
    result = asm.finish("tool_use")
    assert not result.calls and result.errors


# -- the CLI: one error line or a report, exit 1, never a traceback ------------------------------------------------


def ctxlock(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ctxlock", "toolcalls", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("fmt", "body", "stream_error"),
    [
        ("anthropic", sse(anthropic_events([("t1", '{"a": ' + "9" * 5000 + "}")])), False),
        ("anthropic", sse(anthropic_events([("t1", "[" * 50_000 + "]" * 50_000)])), False),
        ("anthropic", "event: ping\ndata: " + "[" * 100_000 + "\n\n", True),
        ("anthropic", sse(anthropic_events([("t1", '{"a": NaN}')])), False),
        ("anthropic", sse(anthropic_events([("t1", '{"a": 1}'), ("t1", '{"a": 2}')])), False),
        ("anthropic", sse(anthropic_events([("t1", '{"a": 1}')], ("max_tokens", "tool_use"))), True),
        ("anthropic", sse(anthropic_events([("t1", '{"a": 1}')], start=False)), False),
        ("openai", '{"choices": [], "x": ' + "9" * 5000 + "}", True),
        ("openai", "[" * 100_000 + "]" * 100_000, True),
    ],
    ids=[
        "bigint",
        "deep",
        "deep-event",
        "nan",
        "dup-id",
        "two-reasons",
        "no-message-start",
        "openai-bigint",
        "openai-deep",
    ],
)
def test_the_cli_never_prints_a_traceback(tmp_path: Path, fmt: str, body: str, stream_error: bool) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS), encoding="utf-8")
    stream = tmp_path / "stream"
    stream.write_text(body, encoding="utf-8")
    proc = ctxlock("-f", fmt, "--tools", str(tools), str(stream))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    if stream_error:
        assert proc.stderr.startswith("error: ToolCallError: ") and len(proc.stderr.strip().splitlines()) == 1
    else:
        report = json.loads(proc.stdout)
        assert report["calls"] == [] and report["errors"]


# Threads parsing pythonic calls while the garbage collector runs finalizers mid-parse: on CPython 3.11, two
# `ast.parse` calls at once can make one fail with "SystemError: AST constructor recursion depth mismatch"
# (https://github.com/python/cpython/issues/106905), which a server's worker threads would turn into a 500.
_RACE = """
import ast, gc, json, sys, threading, time
from ctxlock.generation.toolcalls import ToolCallAssembler
from ctxlock.generation.toolcalls._jsontext import parse_python_expression
sys.setswitchinterval(1e-6)
gc.set_threshold(50, 1, 1)
SOURCE = "[" + ", ".join(f"get_weather(city='c{i}', days=[1, [2, [3, {{'k': {i}}}]]])" for i in range(200)) + "]"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]

class Finalized:
    def __del__(self):
        sum(range(200))

def run(parse, seconds, stop_at_first):
    errors, calls = [], []
    end = time.monotonic() + seconds
    def worker():
        while time.monotonic() < end and not (stop_at_first and errors):
            for _ in range(50):
                a, b = Finalized(), Finalized()
                a.other, b.other = b, a  # cyclic garbage: the collector runs the finalizers during a parse
            try:
                calls.append(parse())
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    return errors, calls

def assembled():
    assembler = ToolCallAssembler(TOOLS, "pythonic")
    assembler.feed(SOURCE)
    result = assembler.finish("tool_calls")
    return [len(result.calls), [e.message for e in result.errors]]

raw, _ = run(lambda: ast.parse(SOURCE, mode="eval"), 20, True)
ours, _ = run(lambda: parse_python_expression(SOURCE), 3, False)  # what the pythonic and lfm2 parsers call
calls = [assembled() for _ in range(2)]
print(json.dumps([len(raw), raw[:1], len(ours), ours[:1], len(calls), sorted(set(map(json.dumps, calls)))[:2]]))
"""


def test_pythonic_calls_parsed_on_many_threads_never_hit_the_parsers_race() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _RACE], capture_output=True, text=True, timeout=120, env=os.environ.copy()
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    raw, raw_first, ours, ours_first, n, outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    if sys.version_info < (3, 12):  # the race is there to provoke: the attack must bite bare ast.parse
        assert raw >= 1 and "recursion depth mismatch" in raw_first[0], (raw, raw_first)
    assert ours == 0, ours_first
    assert n > 0 and outcomes == ["[200, []]"], outcomes  # every parse gave all 200 calls, none refused
