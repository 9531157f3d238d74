"""Tool-call formats `deepseek_v4` (DeepSeek-V4's DSML `<｜DSML｜tool_calls>` block) and `minimax` (MiniMax-M1's
`<tool_calls>` block of JSON lines), checked against the cases of vLLM's tool-parser tests and the models' templates.

The vLLM cases (the model outputs and the calls and content vLLM's tests expect) come from vllm-project/vllm
tests/tool_parsers/test_deepseekv4_tool_parser.py and test_minimax_tool_parser.py. Each case is fed whole, split
at every character index into two chunks, and one character at a time, in both release modes (`check_case`), and
must give vLLM's calls and content. Where ctxlock deliberately differs (DIFFERENCES), the case asserts ctxlock's
answer; docs/tool-call-formats.md lists each difference with its reason.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_toolcalls import SEARCH, SEARCH_ARGS, WEATHER, ZURICH
from test_toolcalls_glm_qwen3xml_seed import _message, _render, tool

from ctxlock.errors import ToolCallTruncatedError
from ctxlock.generation.toolcalls import ToolCallAssembler, ToolCallReady

Call = tuple[str, dict[str, Any]]
Case = tuple[str, str, list[Call], str | None]  # (id, model output, vLLM's expected calls, vLLM's expected content)
S = {"type": "string"}


def _outcome(fmt: str, tools: list[dict[str, Any]], chunks: list[str], release: str) -> Any:
    asm = ToolCallAssembler(tools, fmt, release=release)
    for chunk in chunks:
        asm.feed(chunk)
    result = asm.finish("stop")
    calls = [(c.name, json.dumps(c.arguments, sort_keys=True)) for c in result.calls]
    return calls, result.text, [(type(e).__name__, e.path) for e in result.errors]


def check_case(fmt: str, tools: list[dict[str, Any]], case: Case, errors: list[tuple[str, str]] | None = None) -> None:
    """The case whole, split at every index, and one character at a time, in both release modes: the case's calls
    and content (None: no text), and `errors` (type, path)."""
    want = ([(n, json.dumps(a, sort_keys=True)) for n, a in case[2]], case[3] or "", errors or [])
    output = case[1]
    chunkings = [[output], list(output), *([output[:k], output[k:]] for k in range(1, len(output)))]
    for release in ("finish", "early"):
        for chunks in chunkings:
            assert _outcome(fmt, tools, chunks, release) == want, (release, chunks)


# ---------------------------------------------------------------------------------------------------------------
# deepseek_v4: vLLM tests/tool_parsers/test_deepseekv4_tool_parser.py (its calls are built as `build_tool_call`
# does there: every parameter string="true", one a line)

DSML = "｜DSML｜"


def _v4(name: str, params: dict[str, str], block: str = "tool_calls") -> str:
    lines = "".join(f'<{DSML}parameter name="{k}" string="true">{v}</{DSML}parameter>\n' for k, v in params.items())
    return f'<{DSML}{block}>\n<{DSML}invoke name="{name}">\n{lines}</{DSML}invoke>\n</{DSML}{block}>'


V4_TOOLS = [tool("get_weather"), tool("search")]
V4_CASES: list[Case] = [
    (
        "v4_extract_tool_calls",
        "Let me check. " + _v4("get_weather", {"location": "Beijing", "unit": "celsius"}),
        [("get_weather", {"location": "Beijing", "unit": "celsius"})],
        "Let me check. ",
    ),
    (
        "v4_function_calls_block_is_not_accepted",
        _v4("search", {"query": "vllm"}, block="function_calls"),
        [],
        _v4("search", {"query": "vllm"}, block="function_calls"),
    ),
    (
        "v4_streaming_extracts_complete_invokes",
        _v4("search", {"query": "deepseek v4"}),
        [("search", {"query": "deepseek v4"})],
        None,
    ),
]


@pytest.mark.parametrize("case", V4_CASES, ids=[c[0] for c in V4_CASES])
def test_deepseek_v4_vllm_cases(case: Case) -> None:
    check_case("deepseek_v4", V4_TOOLS, case)


# ---------------------------------------------------------------------------------------------------------------
# minimax: vLLM tests/tool_parsers/test_minimax_tool_parser.py. Its streaming tests feed stages; a case here is
# the last stage's whole text, with the calls and content the stages expect.


def _m1(*calls: str, close: bool = True) -> str:
    return "<tool_calls>\n" + "".join(c + "\n" for c in calls) + ("</tool_calls>" if close else "")


def _w(city: str, state: str, unit: str | None = None) -> str:
    args = {"city": city, "state": state, **({"unit": unit} if unit else {})}
    return json.dumps({"name": "get_current_weather", "arguments": args})


def _wc(city: str, state: str, unit: str | None = None) -> Call:
    return ("get_current_weather", {"city": city, "state": state, **({"unit": unit} if unit else {})})


AREA = '{"name": "calculate_area", "arguments": {"shape": "rectangle", "dimensions": {"width": 10, "height": 5}}}'
AREA_CALL: Call = ("calculate_area", {"shape": "rectangle", "dimensions": {"width": 10, "height": 5}})
THINK_FAKE = '<think>Let me think about this. <tool_calls>\n{"name": "fake_tool", "arguments": {"param": "value"}}\n'
THINK_FAKE += "</tool_calls> This should be removed.</think>\n\nI'll help you with that. "
THINK_IGNORED = '<think>I should use a tool. <tool_calls>\n{"name": "ignored_tool", "arguments": {"should": "ignore"}}'
THINK_IGNORED += "\n</tool_calls></think>\n\nLet me help you with the weather. "
THINK_REAL = '<think><tool_calls>{"name": "ignored", "arguments": {}}</tool_calls></think>'
THINK_USE = '<think>I need to use a tool. <tool_calls>\n{"name": "ignored_tool", "arguments": {"param": "value"}}\n'
THINK_USE += "</tool_calls></think>\n"
COMPLEX = "Let me help you with this task.<think>I need to analyze this situation first.<tool_calls>\n"
COMPLEX += '{"name": "internal_analysis", "arguments": {"query": "analyze situation"}}\n</tool_calls></think>\n'
COMPLEX += "Now I need to get weather information and calculate area."
CHARS = "I'll help you with the weather analysis. <think>Let me think about this. <tool_calls>\n"
CHARS += '{"name": "internal_analysis", "arguments": {"type": "thinking"}}\n</tool_calls>This tool should be ignored.'
CHARS += "</think>\n\nNow I'll get the weather information for you. "
MULTILINE = '{\n  "name": "get_current_weather",\n  "arguments": {\n    "city": "New York",\n    "state": "NY",\n'
MULTILINE += '    "unit": "celsius"\n  }\n}'
SEATTLE_WA = '{"name": "get_current_weather", "arguments": {"city": "Seattle", "state": "WA", "unit": "celsius"}}'

M1_TOOLS = [
    tool("get_current_weather", {"city": S, "state": S, "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]}}),
    tool("calculate_area", {"shape": S, "dimensions": {"type": "object"}, "precision": {"type": "integer"}}),
    *(tool(n) for n in ("get_weather", "valid_tool", "another_valid_tool", "real_tool", "test_tool", "test")),
]
M1_CASES: list[Case] = [
    ("m1_no_tools", "This is a test", [], "This is a test"),
    ("m1_single_tool_call", _m1(_w("Dallas", "TX", "fahrenheit")), [_wc("Dallas", "TX", "fahrenheit")], None),
    (
        "m1_multiple_tool_calls",
        _m1(_w("Dallas", "TX", "fahrenheit"), _w("Orlando", "FL", "fahrenheit")),
        [_wc("Dallas", "TX", "fahrenheit"), _wc("Orlando", "FL", "fahrenheit")],
        None,
    ),
    (
        "m1_tool_call_with_content_before",
        "I'll help you check the weather. " + _m1(_w("Seattle", "WA", "celsius")),
        [_wc("Seattle", "WA", "celsius")],
        "I'll help you check the weather.",
    ),
    ("m1_single_line_json", _m1(_w("New York", "NY", "celsius")), [_wc("New York", "NY", "celsius")], None),
    ("m1_incomplete_tag", _m1(_w("Boston", "MA"), close=False).rstrip("\n"), [_wc("Boston", "MA")], None),
    (
        "m1_preprocess_thinking_tags",
        THINK_FAKE + _m1(_w("Seattle", "WA")),
        [_wc("Seattle", "WA")],
        THINK_FAKE.rstrip(" "),
    ),
    (
        "m1_thinking_tags",
        THINK_IGNORED + _m1(_w("Miami", "FL", "fahrenheit")),
        [_wc("Miami", "FL", "fahrenheit")],
        THINK_IGNORED.rstrip(" "),
    ),
    (
        "m1_invalid_json",
        _m1(
            '{"name": "valid_tool", "arguments": {"city": "Seattle"}}',
            "{invalid json here}",
            '{"name": "another_valid_tool", "arguments": {"param": "value"}}',
        ),
        [("valid_tool", {"city": "Seattle"}), ("another_valid_tool", {"param": "value"})],
        None,
    ),
    (
        "m1_missing_name_or_arguments",
        _m1(
            '{"name": "valid_tool", "arguments": {"city": "Seattle"}}',
            '{"name": "missing_args"}',
            '{"arguments": {"city": "Portland"}}',
            '{"name": "another_valid_tool", "arguments": {"param": "value"}}',
        ),
        [("valid_tool", {"city": "Seattle"}), ("another_valid_tool", {"param": "value"})],
        None,
    ),
    (
        "m1_streaming_basic",
        _m1('{"name": "get_current_weather", "arguments": {"city": "Seattle"}}'),
        [("get_current_weather", {"city": "Seattle"})],
        None,
    ),
    (
        "m1_streaming_content_before_tool_calls",
        "I'll help you with that. <tool_calls>",
        [],
        "I'll help you with that. ",
    ),
    (
        "m1_streaming_no_tool_calls",
        "This is just regular text without any tool calls.",
        [],
        "This is just regular text without any tool calls.",
    ),
    (
        "m1_streaming_thinking_tags",
        THINK_REAL + '<tool_calls>{"name": "real_tool", "arguments": {"param": "value"}}</tool_calls>',
        [("real_tool", {"param": "value"})],
        THINK_REAL,
    ),
    ("m1_multiline_json_not_supported", _m1(MULTILINE), [], None),
    ("m1_streaming_arguments_incremental", _m1(SEATTLE_WA), [_wc("Seattle", "WA", "celsius")], None),
    (
        "m1_streaming_arguments_delta_only",
        '<tool_calls>\n{"name": "test_tool", "arguments": {"param1": "value1", "param2": "value2"}}',
        [("test_tool", {"param1": "value1", "param2": "value2"})],
        None,
    ),
    ("m1_openai_compatibility_plain", "Hello world", [], "Hello world"),
    ("m1_openai_compatibility_stray_close", "Text content</tool_calls>", [], "Text content"),
    ("m1_thinking_tag_buffering", THINK_USE + "<tool_calls>", [], THINK_USE),
    (
        "m1_complex_scenario_with_multiple_tools",
        COMPLEX + "<tool_calls>\n" + SEATTLE_WA + "\n" + AREA + "</tool_calls>",
        [_wc("Seattle", "WA", "celsius"), AREA_CALL],
        COMPLEX,
    ),
    (
        "m1_character_by_character_output",
        CHARS + _m1(SEATTLE_WA, AREA) + "Here are the results.",
        [_wc("Seattle", "WA", "celsius"), AREA_CALL],
        CHARS + "Here are the results.",
    ),
    (
        "m1_character_by_character_simple",
        'Let me check the weather. <tool_calls>\n{"name": "get_weather", "arguments": {"city": "NYC"}}\n</tool_calls>',
        [("get_weather", {"city": "NYC"})],
        "Let me check the weather. ",
    ),
    (
        "m1_character_by_character_with_buffering",
        'Hello world<tool_calls>\n{"name": "test"}\n</tool_calls>done',
        [],
        "Hello worlddone",
    ),
]

# Where ctxlock deliberately differs: (ctxlock's calls or None for vLLM's, ctxlock's text or None for vLLM's,
# ctxlock's errors as (type, path), why). docs/tool-call-formats.md lists each.
Ours = tuple[list[Call] | None, str | None, list[tuple[str, str]], str]
KEPT_TEXT = "ctxlock passes every character outside the calls through as text (vLLM strips the content)"
OPEN_AT_END = "a block still open when the stream ends is unfinished, never released (vLLM releases its objects)"
DIFFERENCES: dict[str, Ours] = {
    "m1_tool_call_with_content_before": (None, "I'll help you check the weather. ", [], KEPT_TEXT),
    "m1_preprocess_thinking_tags": (None, THINK_FAKE, [], KEPT_TEXT),
    "m1_thinking_tags": (None, THINK_IGNORED, [], KEPT_TEXT),
    "m1_incomplete_tag": ([], None, [("ToolCallError", "tool_calls[0]")], OPEN_AT_END),
    "m1_streaming_arguments_delta_only": ([], None, [("ToolCallError", "tool_calls[0]")], OPEN_AT_END),
    "m1_streaming_content_before_tool_calls": (None, None, [("ToolCallError", "tool_calls[0]")], OPEN_AT_END),
    "m1_thinking_tag_buffering": (None, None, [("ToolCallError", "tool_calls[0]")], OPEN_AT_END),
    "m1_invalid_json": (
        None,
        None,
        [("ToolCallError", "tool_calls[1]")],
        "an object that is not valid JSON is refused with an error (vLLM skips it)",
    ),
    "m1_missing_name_or_arguments": (
        None,
        None,
        [("ToolCallError", "tool_calls[1].arguments"), ("ToolCallError", "tool_calls[2].name")],
        "an object without arguments or without a name is refused with an error (vLLM skips it)",
    ),
    "m1_character_by_character_with_buffering": (
        None,
        None,
        [("ToolCallError", "tool_calls[0].arguments")],
        "an object without arguments is refused with an error (vLLM skips it)",
    ),
    "m1_multiline_json_not_supported": (
        [("get_current_weather", {"city": "New York", "state": "NY", "unit": "celsius"})],
        None,
        [],
        "a call object written over several lines is still one call (vLLM's line regex misses it and drops the text)",
    ),
    "m1_openai_compatibility_stray_close": (
        None,
        "Text content</tool_calls>",
        [],
        "a </tool_calls> with no block open is text (vLLM drops the tag)",
    ),
}


def _m1_case(case: Case) -> Case:
    ours = DIFFERENCES.get(case[0])
    if ours is None:
        return case
    calls, text, _, _ = ours
    return (case[0], case[1], case[2] if calls is None else calls, case[3] if text is None else text)


@pytest.mark.parametrize("case", M1_CASES, ids=[c[0] for c in M1_CASES])
def test_minimax_vllm_cases(case: Case) -> None:
    ours = DIFFERENCES.get(case[0])
    check_case("minimax", M1_TOOLS, _m1_case(case), errors=ours[2] if ours else [])


# ---------------------------------------------------------------------------------------------------------------
# Never half a call: a multi-call output cut anywhere under a length stop releases nothing

V4_TWO = "Checking. " + _v4("get_weather", {"location": "Beijing"}).replace(
    f"</{DSML}tool_calls>",
    f'<{DSML}invoke name="search">\n<{DSML}parameter name="query" string="false">"v4"'
    f"</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}tool_calls>",
)
M1_TWO = "Checking. " + _m1(SEATTLE_WA, AREA) + " Done."
MULTI_CALL = {  # (format, text, tools, what opens a call, what closes it)
    "deepseek_v4": (V4_TWO, V4_TOOLS, f"<{DSML}invoke", f"</{DSML}invoke>"),
    "minimax": (M1_TWO, M1_TOOLS, "<tool_calls>", "</tool_calls>"),
}


def _open_spans(text: str, begin: str, end: str) -> list[tuple[int, int]]:
    """The cuts [a, b) at which a call is open: its begin marker whole, its end marker not."""
    spans, i = [], text.find(begin)
    while i >= 0:
        j = text.index(end, i) + len(end)
        spans.append((i + len(begin), j))
        i = text.find(begin, j)
    return spans


@pytest.mark.parametrize("fmt", sorted(MULTI_CALL))
def test_a_length_stop_anywhere_releases_no_call(fmt: str) -> None:
    text, tools, begin, end = MULTI_CALL[fmt]
    spans = _open_spans(text, begin, end)
    assert len(spans) == (2 if fmt == "deepseek_v4" else 1)
    for cut in range(len(text) + 1):
        for release in ("finish", "early"):
            asm = ToolCallAssembler(tools, fmt, release=release)
            fed = asm.feed(text[:cut])
            result = asm.finish("length")
            if release == "finish":
                assert not any(isinstance(e, ToolCallReady) for e in [*fed, *result.events]), cut
                assert result.calls == () and result.finish_reason == "length"
                for err in result.errors:
                    assert type(err) is ToolCallTruncatedError and "nothing was executed" in err.hint, (cut, err)
                # a call open at the cut is truncated; a complete one held for the normal end is refused too
                assert bool(result.errors) == (cut >= spans[0][0]), cut
            else:
                assert all(type(err) is ToolCallTruncatedError for err in result.errors), cut
    asm = ToolCallAssembler(tools, fmt)
    asm.feed(text)
    result = asm.finish("stop")
    assert len(result.calls) == 2 and result.errors == ()


# ---------------------------------------------------------------------------------------------------------------
# Template round trip: what the model's own template writes for two calls parses back to the same calls

TEMPLATE_TOOLS = [WEATHER, SEARCH]
NESTED = {**SEARCH_ARGS, "query": "rain </tool_calls> gear, 天气 🌧\n  indented"}
V4_TEXT = "Checking.\n\n"
# (format, template, calls, the end-of-turn token, the text outside the calls as ctxlock reads it back)
ROUND_TRIPS = [
    ("deepseek_v4", "deepseek-ai-DeepSeek-V4.jinja", [("get_weather", ZURICH), ("search_docs", SEARCH_ARGS)], V4_TEXT),
    (
        "deepseek_v4",
        "deepseek-ai-DeepSeek-V4-Flash-0731.jinja",
        [("get_weather", ZURICH), ("search_docs", SEARCH_ARGS)],
        V4_TEXT,
    ),
    # MiniMax-M1.jinja writes no content beside tool_calls: the message's "Checking." is dropped.
    ("minimax", "MiniMax-M1.jinja", [("get_weather", ZURICH), ("search_docs", NESTED)], ""),
]
EOT = {"deepseek_v4": "<｜end▁of▁sentence｜>", "minimax": "<end_of_sentence>\n"}


@pytest.mark.parametrize("fmt, template, calls, text", ROUND_TRIPS, ids=[r[1] for r in ROUND_TRIPS])
def test_template_round_trip(fmt: str, template: str, calls: list[Call], text: str) -> None:
    prompt, full = _render(template, _message("Checking.", calls))
    assert full.startswith(prompt) and full.endswith(EOT[fmt])
    generated = full[len(prompt) : len(full) - len(EOT[fmt])]
    for chunks in ([generated], list(generated)):
        asm = ToolCallAssembler(TEMPLATE_TOOLS, fmt)
        for chunk in chunks:
            asm.feed(chunk)
        result = asm.finish("stop")
        assert result.errors == ()
        assert [(c.name, c.arguments) for c in result.calls] == calls
        assert result.text == text


# ---------------------------------------------------------------------------------------------------------------
# Bounds


@pytest.mark.parametrize("fmt", sorted(MULTI_CALL))
def test_a_call_longer_than_max_event_size_is_refused_not_buffered(fmt: str) -> None:
    """A call body past max_event_size is refused at once (not buffered); the call after it still counts."""
    if fmt == "minimax":
        big = _m1('{"name": "test", "arguments": {"q": "' + "B" * 200 + '"}}')
        small = _m1('{"name": "test", "arguments": {"q": "b"}}')
    else:
        big, small = _v4("search", {"query": "B" * 200}), _v4("search", {"query": "b"})
    text = "a" + big + "b" + small
    for release in ("finish", "early"):
        asm = ToolCallAssembler(M1_TOOLS + V4_TOOLS[1:], fmt, max_event_size=120, release=release)
        for ch in text:
            asm.feed(ch)
        result = asm.finish("stop")
        assert [(type(e).__name__, e.path) for e in result.errors] == [("ToolCallError", "tool_calls[0]")]
        assert "max_event_size=120" in result.errors[0].message
        assert [c.index for c in result.calls] == [1] and result.text == "ab"


def test_minimax_text_between_objects_is_refused_with_its_path() -> None:
    asm = ToolCallAssembler(M1_TOOLS, "minimax")
    asm.feed(_m1('{"name": "test", "arguments": {}}', "and then", '{"name": "test", "arguments": {}}'))
    result = asm.finish("stop")
    (err,) = result.errors
    assert err.path == "tool_calls[1]" and "'and then" in err.message and err.hint
    assert [c.index for c in result.calls] == [0]
