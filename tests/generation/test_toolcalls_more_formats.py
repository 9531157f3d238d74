"""The fixture templates' other tool-call formats (docs/tool-call-formats.md): `minimax_m2`.

For each format: vLLM's test cases for its parser (model output, expected calls, expected content: the facts of
tests/tool_parsers/test_<model>_tool_parser.py in vllm-project/vllm; the test code here is ctxlock's own) fed whole,
split at every index into two chunks and one character at a time, in both release modes; a length stop anywhere
in a multi-call output releases nothing; and the model's own fixture template round-trips.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_toolcalls_template_survey import ASSISTANT, TOOLS, generated_part

import fetched
from ctxlock.errors import ToolCallError, ToolCallTruncatedError
from ctxlock.generation.toolcalls import Result, ToolCallAssembler, ToolCallReady

Case = tuple[str, str, list[tuple[str, dict[str, Any]]], str]


def loose(*names: str) -> list[dict[str, Any]]:
    """Tools that take any object (vLLM's cases mostly declare none: every parameter is then a string)."""
    return [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]


def typed(name: str, **properties: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}


def run(fmt: str, tools: list[dict[str, Any]], chunks: list[str], finish: str | None, **kw: Any) -> tuple[list, Result]:
    """Feed `chunks`; return the events feed() released and the Result."""
    asm = ToolCallAssembler(tools, fmt, **kw)
    fed = [e for c in chunks for e in asm.feed(c)]
    return fed, asm.finish(finish)


def chunkings(text: str) -> list[list[str]]:
    """Whole, split in two at every index, and one character at a time."""
    return [[text], *([text[:k], text[k:]] for k in range(1, len(text))), list(text)]


def check_case(fmt: str, tools: list[dict[str, Any]], output: str, calls: list[tuple[str, Any]], content: str) -> None:
    for chunks in chunkings(output):
        for release in ("finish", "early"):
            fed, result = run(fmt, tools, chunks, "stop", release=release)
            assert [(c.name, c.arguments) for c in result.calls] == calls, (release, chunks)
            assert result.text == content, (release, chunks)
            assert result.errors == (), result.errors
            if release == "finish":
                assert not any(isinstance(e, ToolCallReady) for e in fed)


def check_length_anywhere(fmt: str, tools: list[dict[str, Any]], output: str, n_calls: int) -> None:
    """Cut at every character with a length stop: no call anywhere, every error truncated with nothing executed;
    the whole output with a normal end releases every call."""
    for cut in range(len(output) + 1):
        fed, result = run(fmt, tools, [output[:cut]], "length")
        assert not any(isinstance(e, ToolCallReady) for e in fed + list(result.events)), cut
        assert result.calls == () and result.finish_reason == "length"
        for err in result.errors:
            assert type(err) is ToolCallTruncatedError and "nothing was executed" in err.hint, (cut, err)
    _, result = run(fmt, tools, [output], "stop")
    assert len(result.calls) == n_calls and result.ok and result.finish_reason == "tool_calls"


def round_trip(template: str) -> str:
    """The assistant turn the template writes for `ASSISTANT` (two calls, unicode and nested arguments), minus the
    end-of-turn token that stops generation."""
    return generated_part(fetched.templates_dir() / template, ASSISTANT["tool_calls"])


EXPECTED_CALLS = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in ASSISTANT["tool_calls"]]


# ---------------------------------------------------------------------------------------------------------------
# minimax_m2: vllm-project/vllm tests/tool_parsers/test_minimax_m2_tool_parser.py


def _mm(*invokes: str, close: bool = True) -> str:
    return "<minimax:tool_call>" + "".join(invokes) + ("</minimax:tool_call>" if close else "")


def _inv(name: str, **params: str) -> str:
    body = "".join(f'<parameter name="{k}">{v}</parameter>' for k, v in params.items())
    return f'<invoke name="{name}">{body}</invoke>'


MINIMAX_M2_CASES: list[Case] = [
    ("plain_content", "Hello world", [], "Hello world"),
    (
        "content_before_tool_call",
        "Let me check. " + _mm(_inv("get_weather", city="Seattle")),
        [("get_weather", {"city": "Seattle"})],
        "Let me check. ",
    ),
    ("empty_delta_no_crash", "", [], ""),
    ("incremental_chunks", _mm(_inv("get_weather", city="Seattle")), [("get_weather", {"city": "Seattle"})], ""),
    ("single_chunk_complete", _mm(_inv("get_weather", city="Seattle")), [("get_weather", {"city": "Seattle"})], ""),
    (
        "multiple_params",
        _mm(_inv("get_weather", city="Seattle", days="5")),
        [("get_weather", {"city": "Seattle", "days": "5"})],
        "",
    ),
    (
        "two_invokes_incremental",
        _mm(_inv("search_web", query="OpenAI"), _inv("search_web", query="Gemini")),
        [("search_web", {"query": "OpenAI"}), ("search_web", {"query": "Gemini"})],
        "",
    ),
    (
        "two_invokes_in_single_delta",
        _mm(_inv("fn_a", x="1"), _inv("fn_b", y="2")),
        [("fn_a", {"x": "1"}), ("fn_b", {"y": "2"})],
        "",
    ),
    (
        "different_functions",
        _mm(_inv("get_weather", city="NYC"), _inv("get_stock", ticker="AAPL")),
        [("get_weather", {"city": "NYC"}), ("get_stock", {"ticker": "AAPL"})],
        "",
    ),
    ("prev_tool_call_arr_single", _mm(_inv("fn", a="1")), [("fn", {"a": "1"})], ""),
    (
        "prev_tool_call_arr_multiple",
        _mm(_inv("search", q="hello"), _inv("search", q="world")),
        [("search", {"q": "hello"}), ("search", {"q": "world"})],
        "",
    ),
    ("tool_call_fields", _mm(_inv("fn", k="v")), [("fn", {"k": "v"})], ""),
    ("multi_invoke_indices", _mm(_inv("a", x="1"), _inv("b", x="2")), [("a", {"x": "1"}), ("b", {"x": "2"})], ""),
    ("eos_after_tool_calls", _mm(_inv("fn", k="v")), [("fn", {"k": "v"})], ""),
    # </minimax:tool_call> arrived as a special token the text does not hold: the call is complete at </invoke>.
    ("end_token_ignored", _mm(_inv("fn", k="v"), close=False), [("fn", {"k": "v"})], ""),
    (
        "header_and_params_in_separate_chunks",
        _mm(_inv("get_weather", city="Seattle", days="5")),
        [("get_weather", {"city": "Seattle", "days": "5"})],
        "",
    ),
    (
        "anyof_nullable_param_non_null_value",
        _mm(_inv("update_profile", nickname="Alice")),
        [("update_profile", {"nickname": "Alice"})],
        "",
    ),
    (
        "anyof_nullable_param_null_value",
        _mm(_inv("update_profile", nickname="null")),
        [("update_profile", {"nickname": None})],
        "",
    ),
    (
        "anyof_nullable_param_object_value",
        _mm(_inv("update_settings", config='{"theme": "dark", "fontSize": 14}')),
        [("update_settings", {"config": {"theme": "dark", "fontSize": 14}})],
        "",
    ),
]
MINIMAX_M2_TOOLS = [
    *loose("get_weather", "search_web", "fn_a", "fn_b", "get_stock", "fn", "search", "a", "b"),
    typed("update_profile", nickname={"anyOf": [{"type": "string"}, {"type": "null"}]}),
    typed("update_settings", config={"anyOf": [{"type": "object"}, {"type": "null"}]}),
]


@pytest.mark.parametrize(
    ("output", "calls", "content"), [c[1:] for c in MINIMAX_M2_CASES], ids=[c[0] for c in MINIMAX_M2_CASES]
)
def test_minimax_m2_vllm_cases(output: str, calls: list[tuple[str, Any]], content: str) -> None:
    check_case("minimax_m2", MINIMAX_M2_TOOLS, output, calls, content)


def test_minimax_m2_template_round_trip_and_length_anywhere() -> None:
    text = round_trip("MiniMax-M2.jinja")
    assert text.endswith("</minimax:tool_call>[e~[\n")
    output = text.removesuffix("[e~[\n")  # [e~[ ends the turn: the stop token, never streamed as text
    check_case("minimax_m2", TOOLS, output, EXPECTED_CALLS, "Looking it up.\n")
    check_length_anywhere("minimax_m2", TOOLS, output, 2)


def test_minimax_m2_types_follow_the_schema() -> None:
    tools = [typed("f", n={"type": "integer"}, ok={"type": "boolean"}, xs={"type": "array"}, s={"type": "string"})]
    out = _mm(_inv("f", n=" 7 ", ok="true", xs='["a", 1]', s=" null "))
    _, result = run("minimax_m2", tools, [out], "stop")
    assert [c.arguments for c in result.calls] == [{"n": 7, "ok": True, "xs": ["a", 1], "s": "null"}]


@pytest.mark.parametrize(
    ("output", "path", "needle"),
    [
        (_mm("<invoke>x</invoke>"), "tool_calls[0].name", "expected name="),
        (_mm('<invoke name="fn">junk<parameter name="k">v</parameter></invoke>'), "tool_calls[0].arguments", "junk"),
        (_mm(_inv("fn", k="v").replace("</invoke>", '<parameter name="k">w</parameter></invoke>')), "k", "twice"),
        (_mm('<invoke name="nope"></invoke>'), "tool_calls[0].name", "nope"),
    ],
)
def test_minimax_m2_malformed_calls_are_refused_with_a_path(output: str, path: str, needle: str) -> None:
    _, result = run("minimax_m2", loose("fn"), [output], "stop")
    assert result.calls == ()
    (err,) = result.errors
    assert path in err.path and needle in err.message + err.path and err.hint


def test_minimax_m2_markers_never_leak_and_open_calls_are_unfinished() -> None:
    _, result = run("minimax_m2", loose("fn"), ["Hi <minimax:tool", "_call><invoke name="], "stop")
    assert result.text == "Hi " and result.calls == ()
    (err,) = result.errors
    assert "</invoke>" in err.message + err.path + err.hint or "unterminated" in err.message.lower()
    _, result = run("minimax_m2", loose("fn"), ["Hi <minimax:too"], "stop")
    assert result.text == "Hi <minimax:too" and result.ok


def test_minimax_m2_a_call_longer_than_max_event_size_is_refused_not_buffered() -> None:
    big = _mm(_inv("fn", k="x" * 500), _inv("fn", k="y"))
    asm = ToolCallAssembler(loose("fn"), "minimax_m2", max_event_size=100)
    for ch in big:
        asm.feed(ch)
    result = asm.finish("stop")
    assert [c.arguments for c in result.calls] == [{"k": "y"}]
    (err,) = result.errors
    assert isinstance(err, ToolCallError) and "max_event_size" in err.message and err.path == "tool_calls[0]"
