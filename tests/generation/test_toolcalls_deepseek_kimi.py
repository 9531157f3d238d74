"""The section formats: `deepseek_v3` (DeepSeek-V3, R1), `deepseek_v31` (DeepSeek-V3.1), `deepseek_v32`
(DeepSeek-V3.2's DSML) and `kimi_k2` (Kimi-K2).

Each format is held to vLLM's own test cases (tests/tool_parsers/test_deepseekv3_tool_parser.py,
test_deepseekv31_tool_parser.py, test_deepseekv32_tool_parser.py and test_kimi_k2_tool_parser.py in
vllm-project/vllm): the model outputs and what vLLM expects are data here, fed whole, split at every index into two
chunks and one character at a time, in both release modes. Where ctxlock answers otherwise on purpose, the case
says what ctxlock gives and why (docs/tool-call-formats.md lists the same differences). Then: no call from a
response cut anywhere by a length stop, and the calls the model's own chat template writes parse back to the calls
it was given.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import pytest
from test_toolcalls import PARIS, SEARCH_ARGS, ZURICH, _call
from test_toolcalls import TOOLS as TEMPLATE_TOOLS
from test_toolcalls_formats import drive

import fetched
from ctxlock.errors import TemplateSecurityError, ToolCallError, ToolCallTruncatedError
from ctxlock.generation.toolcalls import ToolCallAssembler, ToolCallReady, assemble
from ctxlock.request import parse_request

# The deepseek markers: fullwidth bars (U+FF5C) and U+2581 in place of spaces.
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


class Case(NamedTuple):
    """A vLLM test case: the model output, the calls (name, arguments) and the content vLLM expects. `ours` is
    ctxlock's answer where it differs on purpose: (calls, content, reason); `errors` is how many calls ctxlock
    refuses (vLLM has no such notion: it drops or releases them)."""

    id: str
    output: str
    calls: list[tuple[str, Any]]
    content: str
    errors: int = 0
    ours: tuple[list[tuple[str, dict[str, Any]]], str, str] | None = None
    tools: list[dict[str, Any]] | None = None  # the tools the case's test declares (default: TOOLS below)


def _v3(name: str, args: str) -> str:
    return f"{CALL_BEGIN}function{SEP}{name}\n```json\n{args}\n```{CALL_END}"


# tests/tool_parsers/test_deepseekv3_tool_parser.py (ToolParserTestConfig of the common tests). Where the common
# test does not check the content, `content` is what vLLM's parser returns (the text before the calls).
DEEPSEEK_V3 = [
    Case(
        "no_tool_calls",
        "How can I help you today? I can check weather for you.",
        [],
        "How can I help you today? I can check weather for you.",
    ),
    Case(
        "single_tool_call",
        CALLS_BEGIN + _v3("get_weather", '{"city": "Tokyo", "unit": "celsius"}') + CALLS_END,
        [("get_weather", {"city": "Tokyo", "unit": "celsius"})],
        "",
    ),
    Case(
        "parallel_tool_calls",
        CALLS_BEGIN
        + _v3("get_weather", '{"city": "Tokyo", "unit": "celsius"}')
        + _v3("search_hotels", '{"location": "Tokyo", "check_in": "2025-01-15"}')
        + CALLS_END,
        [
            ("get_weather", {"city": "Tokyo", "unit": "celsius"}),
            ("search_hotels", {"location": "Tokyo", "check_in": "2025-01-15"}),
        ],
        "",
    ),
    Case(
        "various_data_types",
        CALLS_BEGIN
        + _v3(
            "test_function",
            '{"string_field": "hello", "int_field": 42, "float_field": 3.14, "bool_field": true, "null_field": null, '
            '"array_field": ["a", "b", "c"], "object_field": {"nested": "value"}, "empty_array": [], '
            '"empty_object": {}}',
        )
        + CALLS_END,
        [
            (
                "test_function",
                {
                    "string_field": "hello",
                    "int_field": 42,
                    "float_field": 3.14,
                    "bool_field": True,
                    "null_field": None,
                    "array_field": ["a", "b", "c"],
                    "object_field": {"nested": "value"},
                    "empty_array": [],
                    "empty_object": {},
                },
            )
        ],
        "",
    ),
    Case("empty_arguments", CALLS_BEGIN + _v3("get_current_time", "{}") + CALLS_END, [("get_current_time", {})], ""),
    Case(
        "surrounding_text",
        "Let me check the weather for you." + CALLS_BEGIN + _v3("get_weather", '{"city": "Paris"}') + CALLS_END,
        [("get_weather", {"city": "Paris"})],
        "Let me check the weather for you.",
    ),
    Case(
        "escaped_strings",
        CALLS_BEGIN
        + _v3("send_message", r'{"text": "He said \"hello\"", "path": "C:\\Users\\file", "newline": "line1\nline2"}')
        + CALLS_END,
        [("send_message", {"text": 'He said "hello"', "path": "C:\\Users\\file", "newline": "line1\nline2"})],
        "",
    ),
    # The common test only asks that a malformed input raises nothing. vLLM's regex still returns this call, with
    # arguments that are not JSON; ctxlock refuses it.
    Case(
        "malformed_unclosed_json",
        CALLS_BEGIN + _v3("get_weather", '{"city": "Tokyo"') + CALLS_END,
        [("get_weather", '{"city": "Tokyo"')],  # vLLM's arguments string, not JSON
        "",
        errors=1,
        ours=([], "", "arguments that are not JSON are refused, never released"),
    ),
    # No call begin token: vLLM finds no call. ctxlock neither, and says why (a refused call).
    Case(
        "malformed_no_call_begin",
        f'{CALLS_BEGIN}function{SEP}get_weather\n```json\n{{"city": "Tokyo"}}\n```{CALLS_END}',
        [],
        "",
        errors=1,
    ),
]

# tests/tool_parsers/test_deepseekv31_tool_parser.py
DEEPSEEK_V31 = [
    Case(
        "with_tool",
        f'normal text{CALLS_BEGIN}{CALL_BEGIN}foo{SEP}{{"x":1}}{CALL_END}{CALLS_END}',
        [("foo", {"x": 1})],
        "normal text",
    ),
    Case(
        "with_multiple_tools",
        f'some prefix text{CALLS_BEGIN}{CALL_BEGIN}foo{SEP}{{"x":1}}{CALL_END}{CALL_BEGIN}bar{SEP}{{"y":2}}{CALL_END}'
        f"{CALLS_END} some suffix text",
        [("foo", {"x": 1}), ("bar", {"y": 2})],
        "some prefix text",
        ours=(
            [("foo", {"x": 1}), ("bar", {"y": 2})],
            "some prefix text some suffix text",
            "text after the section is text, as vLLM's streaming path gives it; its non-streaming path drops it",
        ),
    ),
    # "Generation was cut off part way through the block": vLLM returns the whole output, markers included, as
    # content. ctxlock never passes a marker on as text; the unfinished call is an error.
    Case(
        "unparsable_block_cut_off",
        f"Let me look that up.{CALLS_BEGIN}get_weather",
        [],
        f"Let me look that up.{CALLS_BEGIN}get_weather",
        errors=1,
        ours=([], "Let me look that up.", "a marker is never text; the unfinished call is an error"),
    ),
    Case(
        "unparsable_block_no_call_markers",
        f'{CALLS_BEGIN}foo{SEP}{{"x":1}}{CALLS_END}',
        [],
        f'{CALLS_BEGIN}foo{SEP}{{"x":1}}{CALLS_END}',
        errors=1,
        ours=([], "", "a marker is never text; the call without its begin token is refused"),
    ),
]

# tests/tool_parsers/test_kimi_k2_tool_parser.py. The streaming tests' deltas are joined into one output; their
# content is what vLLM's streaming path returns over all the deltas.
SB, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KB, KA, KE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_HELP = "I'll help you check the weather. "
_LA = (
    "I'll get the weather and news for LA today. First, let me get the weather using Los Angeles coordinates, and "
    "then get the latest news. "
)
KIMI_K2 = [
    Case("no_tools", "This is a test", [], "This is a test"),
    Case(
        "tool_call_with_content_before",
        f'{_HELP}{SB} {KB}\nfunctions.get_weather:0 {KA} {{"city": "Beijing"}} {KE} {SE}',
        [("get_weather", {"city": "Beijing"})],
        _HELP,
    ),
    Case(
        "multi_tool_call_with_content_before",
        f'{_HELP}{SB} {KB}\nfunctions.get_weather:0 {KA} {{"city": "Beijing"}} {KE} {KB}\n'
        f'functions.get_weather:1 {KA} {{"city": "Shanghai"}} {KE} {SE}',
        [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})],
        _HELP,
    ),
    Case(
        "concatenated_tool_calls_bug_fix",
        f'{_LA}{SB}{KB}functions.get_weather:0{KA}{{"latitude": 34.0522, "longitude": -118.2437}}{KE}'
        f'{KB}functions.get_news:1{KA}{{"content": "Los Angeles today"}}{KE}{SE}',
        [
            ("get_weather", {"latitude": 34.0522, "longitude": -118.2437}),
            ("get_news", {"content": "Los Angeles today"}),
        ],
        _LA,
    ),
    Case(
        "three_concatenated_tool_calls",
        f'I\'ll help you with multiple tasks. {SB}{KB}functions.get_weather:0{KA}{{"city": "New York"}}{KE}'
        f'{KB}functions.get_news:1{KA}{{"topic": "technology"}}{KE}'
        f'{KB}functions.send_email:2{KA}{{"to": "user@example.com", "subject": "Daily Update"}}{KE}{SE}',
        [
            ("get_weather", {"city": "New York"}),
            ("get_news", {"topic": "technology"}),
            ("send_email", {"to": "user@example.com", "subject": "Daily Update"}),
        ],
        "I'll help you with multiple tasks. ",
    ),
    Case(
        "mixed_spacing_tool_calls",
        f"Mixed spacing test. {SB} {KB} functions.test:0 {KA} {{}} {KE}{KB}functions.test2:1{KA}{{}}{KE} {SE}",
        [("test", {}), ("test2", {})],
        "Mixed spacing test. ",
    ),
    Case(
        "angle_brackets_in_json",
        f"I need to process HTML content. {SB}{KB}functions.process_html:0{KA}"
        f'{{"html": "<div>content</div>", "text": "normal text"}}{KE}{SE}',
        [("process_html", {"html": "<div>content</div>", "text": "normal text"})],
        "I need to process HTML content. ",
    ),
    Case(
        "newlines_in_json",
        f"I need to process formatted JSON. {SB}{KB}functions.process_data:0{KA}"
        '{\n  "name": "test",\n  "value": 123,\n  "nested": {\n    "key": "value"\n  }\n}' + f"{KE}{SE}",
        [("process_data", {"name": "test", "value": 123, "nested": {"key": "value"}})],
        "I need to process formatted JSON. ",
    ),
    # vLLM returns both calls, the first with arguments that are not JSON; ctxlock refuses that one.
    Case(
        "invalid_json",
        f'{_HELP}{SB} {KB}\nfunctions.invalid_get_weather:0 {KA} {{"city": "Beijing" {KE} {KB}\n'
        f'functions.valid_get_weather:1 {KA} {{"city": "Shanghai"}} {KE} {SE}',
        [("invalid_get_weather", '{"city": "Beijing"'), ("valid_get_weather", {"city": "Shanghai"})],
        _HELP,
        errors=1,
        ours=([("valid_get_weather", {"city": "Shanghai"})], _HELP, "arguments that are not JSON are refused"),
    ),
    # An id without ":IDX": vLLM skips the call; ctxlock refuses it (an error the model can read).
    Case(
        "invalid_funcall",
        f'{_HELP}{SB} {KB}\nfunctions.invalid_get_weather.0 {KA} {{"city": "Beijing"}} {KE} {KB}\n'
        f'functions.valid_get_weather:1 {KA} {{"city": "Shanghai"}} {KE} {SE}',
        [("valid_get_weather", {"city": "Shanghai"})],
        _HELP,
        errors=1,
    ),
    Case(
        "streaming_basic_functionality",
        f' check the weather. {SB} {KB}\nfunctions.get_weather:0 {KA} {{"city": "Beijing"}} {KE} {SE}',
        [("get_weather", {"city": "Beijing"})],
        " check the weather. ",
    ),
    Case(
        "streaming_no_tool_calls",
        "This is just regular text without any tool calls.",
        [],
        "This is just regular text without any tool calls.",
    ),
    # Text between the section begin and a call begin: vLLM suppresses it, ctxlock refuses it (and the call the
    # output ends in is unfinished).
    Case(
        "token_leak_between_section_and_tool_begin",
        f"I'll help you with that. {SB} spurious text {KB}",
        [],
        "I'll help you with that. ",
        errors=2,
    ),
    Case("split_markers_across_deltas", f"{SB} ", [], ""),
    Case("marker_variants", "Reasoning <|tool_call_section_begin|>", [], "Reasoning "),
    Case("reentry_after_tool_section", f"{SB}{SE} More reasoning", [], " More reasoning"),
    Case("empty_tool_section", f"Reasoning {SB}{SE}", [], "Reasoning "),
    # vLLM leaves a section after 8,192 characters without a call and returns them as content; ctxlock never turns
    # section text back into text: the call that never began is an error.
    Case(
        "malformed_tool_section_recovery",
        SB + "x" * 10000,
        [],
        "x" * 10000,
        errors=1,
        ours=([], "", "section text is never content; the call that never began is an error"),
    ),
    Case(
        "section_begin_noise_tool_begin_same_chunk",
        f"Reasoning {SB} noise text {KB}",
        [],
        "Reasoning ",
        errors=2,
    ),
    Case("stream_ends_without_section_end_marker", f"{SB} partial content", [], "", errors=1),
    Case(
        "same_chunk_begin_and_end_markers",
        f"Some reasoning {SB}{SE} More reasoning",
        [],
        "Some reasoning  More reasoning",
    ),
    Case("same_chunk_begin_content_end_markers", f"Reasoning {SB}   {SE} Done", [], "Reasoning  Done"),
    Case(
        "tool_call_end_and_section_end_same_chunk",
        f'Let me help. {SB}{KB}get_weather:0 {KA} {{"city": "Paris"}} {KE}{SE} Done',
        [("get_weather", {"city": "Paris"})],
        "Let me help.  Done",
    ),
    Case(
        "streaming_tool_call_markers_not_leaked",
        f'I\'ll check the weather. {SB}{KB} functions.get_weather:0 {KA} {{"city": "Tokyo"}} {KE}{SE}'
        " Here's the result.",
        [("get_weather", {"city": "Tokyo"})],
        "I'll check the weather.  Here's the result.",
    ),
    Case(
        "streaming_multiple_tool_calls_not_leaked",
        f'I\'ll compare the weather. {SB}{KB} get_weather:0 {KA} {{"city": "Tokyo"}} {KE} {KB} get_weather:1 '
        f'{KA} {{"city": "New York"}} {KE}{SE} Here\'s the comparison.',
        [("get_weather", {"city": "Tokyo"}), ("get_weather", {"city": "New York"})],
        "I'll compare the weather.  Here's the comparison.",
    ),
]
# The ids vLLM's extract_tool_calls cases expect: the `functions.NAME:IDX` the model wrote.
KIMI_IDS = {
    "tool_call_with_content_before": ["functions.get_weather:0"],
    "multi_tool_call_with_content_before": ["functions.get_weather:0", "functions.get_weather:1"],
    "concatenated_tool_calls_bug_fix": ["functions.get_weather:0", "functions.get_news:1"],
    "three_concatenated_tool_calls": ["functions.get_weather:0", "functions.get_news:1", "functions.send_email:2"],
    "mixed_spacing_tool_calls": ["functions.test:0", "functions.test2:1"],
    "angle_brackets_in_json": ["functions.process_html:0"],
    "newlines_in_json": ["functions.process_data:0"],
    "streaming_multiple_tool_calls_not_leaked": ["get_weather:0", "get_weather:1"],
}

# tests/tool_parsers/test_deepseekv32_tool_parser.py (DSML). Many of its tests stream the same output: each output
# is one case here, named after the first test that uses it. Every case declares the tools (and schemas) its
# test gives vLLM's parser; `ANY` is the loose schema of a test that gives none.
FC, FC_END_ = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"
INV, INV_END_ = '<｜DSML｜invoke name="', "</｜DSML｜invoke>"
PAR, PAR_END = '<｜DSML｜parameter name="', "</｜DSML｜parameter>"


def _dsml(*calls: tuple[str, list[tuple[str, str, str]]]) -> str:
    """<function_calls> with one invoke per (name, [(parameter, string attribute, value)])."""
    out = f"{FC}\n"
    for name, params in calls:
        out += f'{INV}{name}">\n' + "".join(f'{PAR}{k}" string="{s}">{v}{PAR_END}\n' for k, s, v in params)
        out += f"{INV_END_}\n"
    return out + FC_END_


def _build(name: str, params: dict[str, str]) -> str:
    """vLLM's build_tool_call: string="true" parameters, an empty line before the invoke's end."""
    inner = "".join(f'{PAR}{k}" string="true">{v}{PAR_END}' for k, v in params.items())
    return f'{FC}\n{INV}{name}">\n{inner}\n{INV_END_}\n{FC_END_}'


def _tool(name: str, properties: dict[str, Any] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    if properties is not None:
        schema["properties"] = properties
    return {"type": "function", "function": {"name": name, "parameters": schema}}


ANY = [_tool(n) for n in ("get_time", "get_weather", "my_func", "fn", "func_a", "func_b", "fn_a", "fn_b", "search")]
_TOGGLE = [_tool("toggle", {"enabled": {"type": "boolean"}, "count": {"type": "integer"}})]
_SCORE = [_tool("score", {"value": {"type": "integer"}})]
_WAIT = {
    "anyOf": [
        {"type": "object", "properties": {"type": {"const": "until"}, "date": {"type": "string"}}},
        {"type": "object", "properties": {"type": {"const": "for"}, "minutes": {"type": "number"}}},
    ]
}
_PATCHES = {"oneOf": [{"type": "array", "items": {"type": "object"}}, {"type": "null"}]}
_TIMER = [_tool("set_timer", {"wait": _WAIT, "patches": _PATCHES})]
_TIMER_NULLABLE = [_tool("set_timer", {"wait": {"anyOf": [{"type": "object"}, {"type": "null"}]}, "patches": _PATCHES})]
_WEATHER = [_tool("get_weather", {"location": {"type": "string"}})]
_UPDATE = [_tool("update", {"tags": {"type": "array"}, "meta": {"type": "object"}})]
_MEASURE = [_tool("measure", {"ratio": {"type": "number"}, "whole": {"type": "number"}})]
_SET_VAL = [_tool("set_val", {"count": {"type": ["integer", "null"]}, "label": {"type": ["string", "null"]}})]
_CLEAR = [_tool("clear", {"value": {"type": ["integer", "null"]}})]
_COERCE = [
    _tool(
        "coerce",
        {
            "union_value": {"type": ["null", "string"]},
            "bad_int": {"type": "integer"},
            "nullable_string": {"type": ["null", "string"]},
            "null_string": {"type": "string"},
            "whole_number": {"type": "number"},
        },
    )
]
_TIMER_ARGS = {
    "wait": {"type": "for", "minutes": 2880},
    "patches": [{"op": "replace", "path": "/schedule", "value": "quiet"}],
}
_TIMER_OUTPUT = _dsml(
    (
        "set_timer",
        [
            ("wait", "false", '{"type":"for","minutes":2880}'),
            ("patches", "false", '[{"op":"replace","path":"/schedule","value":"quiet"}]'),
        ],
    )
)
_COERCE_OUTPUT = _dsml(
    (
        "coerce",
        [
            ("union_value", "false", "hello"),
            ("bad_int", "false", "abc"),
            ("nullable_string", "false", "null"),
            ("null_string", "false", "null"),
            ("whole_number", "false", "3.0"),
        ],
    )
)
_LONG = "A" * 4096
DEEPSEEK_V32 = [
    Case("no_tool_call", "just some text", [], "just some text", tools=ANY),
    Case("single_tool_no_params", f'{FC}\n{INV}get_time">\n{INV_END_}\n{FC_END_}', [("get_time", {})], "", tools=ANY),
    Case(
        "single_tool_with_params",
        _build("get_weather", {"location": "SF", "date": "2024-01-16"}),
        [("get_weather", {"location": "SF", "date": "2024-01-16"})],
        "",
        tools=ANY,
    ),
    Case(
        "content_before_tool_call",
        "Sure, let me check! " + _build("get_weather", {"location": "NYC"}),
        [("get_weather", {"location": "NYC"})],
        "Sure, let me check! ",
        tools=ANY,
    ),
    Case(
        "multiple_tools",
        _dsml(("get_weather", [("location", "true", "SF")]), ("get_weather", [("location", "true", "NYC")])),
        [("get_weather", {"location": "SF"}), ("get_weather", {"location": "NYC"})],
        "",
        tools=ANY,
    ),
    Case(
        "type_conversion_in_non_streaming",  # also test_responses_function_tool_schema_in_streaming
        _dsml(("toggle", [("enabled", "false", "true"), ("count", "false", "42")])),
        [("toggle", {"enabled": True, "count": 42})],
        "",
        tools=_TOGGLE,
    ),
    Case(
        "string_attr_true_coerced_by_schema",  # also its streaming twin
        _dsml(("score", [("value", "true", "42")])),
        [("score", {"value": 42})],
        "",
        tools=_SCORE,
    ),
    Case(
        "string_attr_false_allows_schema_conversion",
        _dsml(("score", [("value", "false", "42")])),
        [("score", {"value": 42})],
        "",
        tools=_SCORE,
    ),
    Case(
        "composed_schema_converts_object_and_array_params",
        _TIMER_OUTPUT,
        [("set_timer", _TIMER_ARGS)],
        "",
        tools=_TIMER,
    ),
    Case(
        "composed_schema_conversion_in_streaming",
        _TIMER_OUTPUT,
        [("set_timer", _TIMER_ARGS)],
        "",
        tools=_TIMER_NULLABLE,
    ),
    Case(
        "string_attr_true_coerced_by_composed_schema",
        _dsml(("set_timer", [("wait", "true", '{"type":"for","minutes":2880}')])),
        [("set_timer", {"wait": {"type": "for", "minutes": 2880}})],
        "",
        tools=_TIMER_NULLABLE,
    ),
    # vLLM unwraps a lone "arguments" / "input" parameter the schema does not declare; ctxlock releases what the
    # model wrote (the schema allows the extra property), never a rewritten call.
    Case(
        "arguments_wrapper_repaired",
        _dsml(("get_weather", [("arguments", "false", '{"location":"Beijing"}')])),
        [("get_weather", {"location": "Beijing"})],
        "",
        tools=_WEATHER,
        ours=([("get_weather", {"arguments": {"location": "Beijing"}})], "", "the call is released as written"),
    ),
    Case(
        "input_wrapper_repaired",
        _dsml(("get_weather", [("input", "true", '{"location":"Beijing"}')])),
        [("get_weather", {"location": "Beijing"})],
        "",
        tools=_WEATHER,
        ours=([("get_weather", {"input": '{"location":"Beijing"}'})], "", "the call is released as written"),
    ),
    Case(
        "object_and_array_params",  # also its streaming twin
        _dsml(("update", [("tags", "false", '["a", "b"]'), ("meta", "false", '{"k": 1}')])),
        [("update", {"tags": ["a", "b"], "meta": {"k": 1}})],
        "",
        tools=_UPDATE,
    ),
    Case(
        "number_param",  # also test_number_param_streaming (ratio only)
        _dsml(("measure", [("ratio", "false", "3.14"), ("whole", "false", "5.0")])),
        [("measure", {"ratio": 3.14, "whole": 5})],
        "",
        tools=_MEASURE,
    ),
    Case(
        "multi_typed_schema",  # also test_multi_typed_schema_streaming (count only)
        _dsml(("set_val", [("count", "false", "42"), ("label", "false", "hello")])),
        [("set_val", {"count": 42, "label": "hello"})],
        "",
        tools=_SET_VAL,
    ),
    Case(
        "multi_typed_null_value",  # also its streaming twin
        _dsml(("clear", [("value", "false", "null")])),
        [("clear", {"value": None})],
        "",
        tools=_CLEAR,
    ),
    Case(
        "null_coerced_back_to_string_by_schema",
        _dsml(("echo", [("text", "false", "null")])),
        [("echo", {"text": "null"})],
        "",
        tools=[_tool("echo", {"text": {"type": "string"}})],
    ),
    Case(
        "no_schema_parses_json",
        _dsml(("unknown_fn", [("count", "false", "42"), ("flag", "false", "true")])),
        [("unknown_fn", {"count": 42, "flag": True})],
        "",
        tools=[_tool("unknown_fn")],
    ),
    Case("plain_content_no_tool", "Hello, world!", [], "Hello, world!", tools=ANY),
    Case(
        "no_content_prefix_returns_none",
        _build("get_weather", {"location": "NYC"}),
        [("get_weather", {"location": "NYC"})],
        "",
        tools=ANY,
    ),
    Case(
        "single_tool_streaming",  # also test_single_tool_chunked_stream_interval
        _build("get_weather", {"location": "SF"}),
        [("get_weather", {"location": "SF"})],
        "",
        tools=ANY,
    ),
    Case(
        "multi_typed_schema_streaming",
        _dsml(("set_val", [("count", "false", "42")])),
        [("set_val", {"count": 42})],
        "",
        tools=_SET_VAL,
    ),
    Case(
        "number_param_streaming",
        _dsml(("measure", [("ratio", "false", "3.14")])),
        [("measure", {"ratio": 3.14})],
        "",
        tools=_MEASURE,
    ),
    Case("tool_name_emitted", _build("my_func", {"x": "1"}), [("my_func", {"x": "1"})], "", tools=ANY),
    Case(
        "content_before_tool_call_streaming",  # also test_content_before_tool_chunked
        "Thinking... " + _build("fn", {"a": "b"}),
        [("fn", {"a": "b"})],
        "Thinking... ",
        tools=ANY,
    ),
    Case(
        "type_conversion_in_streaming",
        _dsml(("add", [("x", "false", "3"), ("y", "false", "4")])),
        [("add", {"x": 3, "y": 4})],
        "",
        tools=[_tool("add", {"x": {"type": "integer"}, "y": {"type": "integer"}})],
    ),
    # "abc" for an integer: vLLM releases it as the string; ctxlock's schema validation refuses the call.
    Case(
        "streaming_matches_non_streaming_conversion_fallbacks",
        _COERCE_OUTPUT,
        [
            (
                "coerce",
                {
                    "union_value": "hello",
                    "bad_int": "abc",
                    "nullable_string": None,
                    "null_string": "null",
                    "whole_number": 3,
                },
            )
        ],
        "",
        errors=1,
        tools=_COERCE,
        ours=([], "", "arguments that do not match the schema are refused"),
    ),
    Case(
        "multiple_tools_streaming",  # also test_multiple_tools_chunked
        _dsml(("func_a", [("p", "true", "v1")]), ("func_b", [("q", "true", "v2")])),
        [("func_a", {"p": "v1"}), ("func_b", {"q": "v2"})],
        "",
        tools=ANY,
    ),
    Case(
        "state_reset_on_new_stream",  # also the no_marker_leak tests (chunked, char by char, every split point)
        _build("fn", {"k": "v"}),
        [("fn", {"k": "v"})],
        "",
        tools=ANY,
    ),
    Case(
        "unique_tool_call_ids",
        _dsml(("fn_a", [("x", "true", "1")]), ("fn_b", [("y", "true", "2")])),
        [("fn_a", {"x": "1"}), ("fn_b", {"y": "2"})],
        "",
        tools=ANY,
    ),
    # vLLM streams the arguments of an invoke that has not closed; ctxlock never releases half a call.
    Case(
        "emits_arguments_before_invoke_completes",
        f'{FC}\n{INV}fn">\n{PAR}k" string="true">val{PAR_END}\n',
        [("fn", '{"k": "val" (a prefix, streamed)')],
        "",
        errors=1,
        tools=ANY,
        ours=([], "", "a call is released only once its end token is seen"),
    ),
    Case(
        "long_string_argument_streams_before_close",
        f'{FC}\n{INV}emit">\n{PAR}text" string="true">{_LONG}{PAR_END}\n{INV_END_}\n{FC_END_}',
        [("emit", {"text": _LONG})],
        "",
        tools=[_tool("emit", {"text": {"type": "string"}})],
    ),
    Case(
        "no_marker_leak_with_prefix_chunked",
        "Hello!" + _build("fn", {"a": "b"}),
        [("fn", {"a": "b"})],
        "Hello!",
        tools=ANY,
    ),
    Case("false_partial_marker_emitted", "<｜DSM some regular text", [], "<｜DSM some regular text", tools=ANY),
    Case(
        "delimiter_preserved_fast_detokenization",
        _dsml(("get_weather", [("location", "true", "Tokyo")])),
        [("get_weather", {"location": "Tokyo"})],
        "",
        tools=ANY,
    ),
    Case(
        "delimiter_preserved_with_content_prefix",
        "Here is the weather: " + _dsml(("get_weather", [("location", "true", "Tokyo")])),
        [("get_weather", {"location": "Tokyo"})],
        "Here is the weather: ",
        tools=ANY,
    ),
    Case(
        "tool_detection_skip_special_tokens_false",
        _build("search", {"query": "vllm documentation"}),
        [("search", {"query": "vllm documentation"})],
        "",
        tools=ANY,
    ),
]

CASES: dict[str, list[Case]] = {
    "deepseek_v3": DEEPSEEK_V3,
    "deepseek_v31": DEEPSEEK_V31,
    "deepseek_v32": DEEPSEEK_V32,
    "kimi_k2": KIMI_K2,
}

NAMES = [
    *("get_weather", "search_hotels", "test_function", "get_current_time", "send_message", "foo", "bar"),
    *("get_news", "send_email", "test", "test2", "process_html", "process_data"),
    *("invalid_get_weather", "valid_get_weather"),
]
# Loose schemas: vLLM's cases are about the format, not the arguments.
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in NAMES]

ALL_CASES = [pytest.param(fmt, case, id=f"{fmt}-{case.id}") for fmt, cases in CASES.items() for case in cases]


def _run(fmt: str, chunks: list[str], release: str, tools: list[dict[str, Any]] | None = None) -> Any:
    asm = ToolCallAssembler(tools or TOOLS, fmt, release=release)
    fed = [e for c in chunks for e in asm.feed(c)]
    result = asm.finish("stop")
    return fed, result


def _named(case: Case) -> list[dict[str, Any]]:
    """The case's tools that its output names (compiling unused schemas for every chunking would cost the most)."""
    tools = case.tools or TOOLS
    return [t for t in tools if t["function"]["name"] in case.output] or tools[:1]


def _check(fmt: str, case: Case, chunks: list[str], tools: list[dict[str, Any]] | None = None) -> None:
    calls, content = (case.ours[0], case.ours[1]) if case.ours else (case.calls, case.content)
    for release in ("finish", "early"):
        fed, result = _run(fmt, chunks, release, tools or case.tools)
        assert [(c.name, c.arguments) for c in result.calls] == calls, (release, chunks)
        assert result.text == content, (release, chunks)
        assert len(result.errors) == case.errors, (release, chunks, result.errors)
        if release == "finish":
            assert not any(isinstance(e, ToolCallReady) for e in fed)
        for err in result.errors:
            assert err.path.startswith("tool_calls[") and err.hint


def _cuts(n: int) -> range | list[int]:
    """Every split point; for the one long case (10,000 characters), every one near its ends and a stride between."""
    if n <= 1000:
        return range(1, n)
    return sorted({*range(1, 300), *range(300, n - 300, 97), *range(n - 300, n)})


@pytest.mark.parametrize(("fmt", "case"), ALL_CASES)
def test_vllm_cases_in_every_chunking(fmt: str, case: Case) -> None:
    text = case.output
    tools = _named(case)
    _check(fmt, case, [text], tools)
    _check(fmt, case, list(text), tools)
    for cut in _cuts(len(text)):
        _check(fmt, case, [text[:cut], text[cut:]], tools)


def test_kimi_k2_call_ids_are_the_ids_the_model_wrote() -> None:
    for case in KIMI_K2:
        if case.id in KIMI_IDS:
            result = assemble(TOOLS, "kimi_k2", [case.output], "stop")
            assert [c.id for c in result.calls] == KIMI_IDS[case.id], case.id


def test_kimi_k2_refuses_a_reused_call_id() -> None:
    call = f'{KB}functions.get_weather:0{KA}{{"city": "Paris"}}{KE}'
    result = assemble(TOOLS, "kimi_k2", [SB + call + call + SE], "stop")
    assert result.calls == () and [e.path for e in result.errors] == ["tool_calls[0].id", "tool_calls[1].id"]


def test_the_listed_differences_are_differences() -> None:
    """Every case marked as a deliberate difference does differ from what vLLM expects, and has a reason."""
    for cases in CASES.values():
        for case in cases:
            if case.ours is not None:
                assert (case.ours[0], case.ours[1]) != (case.calls, case.content) and case.ours[2], case.id


def test_no_marker_prefix_reaches_the_text() -> None:
    text = f"Look: <｜tool▁ and {CALLS_BEGIN[:-1]}."
    asm = ToolCallAssembler(TOOLS, "deepseek_v3")
    events = [e for ch in text for e in asm.feed(ch)]
    released = "".join(e.text for e in events)
    assert not released.endswith("<｜tool▁calls▁begin") and released == text[: len(released)]
    assert asm.finish("stop").text == text  # never a marker: the held-back text is text after all


# ---------------------------------------------------------------------------------------------------------------
# Never half a call: a length stop anywhere releases nothing

MULTI = {
    "deepseek_v3": DEEPSEEK_V3[2].output,
    "deepseek_v31": DEEPSEEK_V31[1].output,
    "kimi_k2": KIMI_K2[2].output,
    "deepseek_v32": next(c for c in DEEPSEEK_V32 if c.id == "multiple_tools").output,
}


@pytest.mark.parametrize("fmt", sorted(MULTI))
def test_a_length_stop_anywhere_releases_no_call(fmt: str) -> None:
    text = MULTI[fmt]
    for release in ("finish", "early"):
        _, result = _run(fmt, [text], release)
        assert len(result.calls) == 2 and result.ok
    for cut in range(len(text) + 1):
        asm = ToolCallAssembler(TOOLS, fmt)
        fed = asm.feed(text[:cut])
        result = asm.finish("length")
        assert not any(isinstance(e, ToolCallReady) for e in [*fed, *result.events]), cut
        assert result.calls == () and result.finish_reason == "length"
        for err in result.errors:
            assert type(err) is ToolCallTruncatedError and "nothing was executed" in err.hint, (cut, err)


END_TOKENS = {"deepseek_v3": CALL_END, "deepseek_v31": CALL_END, "kimi_k2": "<|tool_call_end|>"}
END_TOKENS["deepseek_v32"] = "</｜DSML｜invoke>"


@pytest.mark.parametrize("fmt", sorted(MULTI))
def test_each_call_reaches_the_sink_at_the_character_that_ends_it(fmt: str) -> None:
    """Through the public ToolCallSink protocol, fed one character at a time: `complete` comes exactly when the
    call's end token has been fed, and the text never holds a marker."""
    text = MULTI[fmt]
    ends = [k + len(END_TOKENS[fmt]) for k in range(len(text)) if text.startswith(END_TOKENS[fmt], k)]
    sink, result = drive(fmt, TOOLS if fmt != "deepseek_v32" else ANY, list(text), "stop")
    assert [fed for fed, _ in sink.calls("complete")] == ends
    assert sink.calls("fail") == [] and sink.calls("unfinished") == [] and len(result.calls) == len(ends)
    assert all("<" not in args[0] for _, args in sink.calls("emit_text"))


def test_malformed_calls_name_their_path_and_say_how_to_write_them() -> None:
    cases = [
        ("deepseek_v3", f"{CALL_BEGIN}tool{SEP}get_weather\n```json\n{{}}\n```{CALL_END}", "tool_calls[0].type"),
        ("deepseek_v3", f"{CALL_BEGIN}function get_weather {{}}{CALL_END}", "tool_calls[0]"),
        ("deepseek_v3", f"{CALL_BEGIN}function{SEP}get_weather\n```json\n{{}}{CALL_END}", "tool_calls[0].arguments"),
        ("deepseek_v31", f"{CALL_BEGIN}get_weather {{}}{CALL_END}", "tool_calls[0]"),
        ("deepseek_v31", f"{CALL_BEGIN}nope{SEP}{{}}{CALL_END}", "tool_calls[0].name"),
        ("deepseek_v31", f"{CALL_BEGIN}get_weather{SEP}[1]{CALL_END}", "tool_calls[0].arguments"),
        ("kimi_k2", f"{KB}functions.get_weather{KA}{{}}{KE}", "tool_calls[0].id"),
        ("kimi_k2", f"{KB}functions.get_weather:0 {{}}{KE}", "tool_calls[0].id"),
        ("kimi_k2", f"{KB}functions.get_weather:0{KA}{{{KE}", "tool_calls[0].arguments"),
        ("kimi_k2", f"{SB}functions.get_weather:0{KA}{{}}{SE}", "tool_calls[0]"),
        ("deepseek_v32", f"{FC}{INV[:-7]}>{INV_END_}{FC_END_}", "tool_calls[0].name"),
        ("deepseek_v32", f'{INV}get_weather">{PAR}city" string="true">Paris{INV_END_}', "tool_calls[0].arguments.city"),
        ("deepseek_v32", f'{INV}get_weather">city=Paris{INV_END_}', "tool_calls[0]"),
        (
            "deepseek_v32",
            f'{INV}get_weather">{PAR}a">1{PAR_END}{PAR}a">2{PAR_END}{INV_END_}',
            "tool_calls[0].arguments.a",
        ),
    ]
    for fmt, text, path in cases:
        result = assemble(TOOLS, fmt, [text], "stop")
        (err,) = result.errors
        assert result.calls == () and err.path == path and err.hint, (fmt, text, err)


def test_a_call_without_its_section_is_a_call_and_the_text_after_it_is_text() -> None:
    text = f'Sure. {CALL_BEGIN}foo{SEP}{{"x": 1}}{CALL_END} Done.'
    for chunks in ([text], list(text)):
        result = assemble(TOOLS, "deepseek_v31", chunks, "stop")
        assert [(c.name, c.arguments) for c in result.calls] == [("foo", {"x": 1})]
        assert result.text == "Sure.  Done." and result.ok


def test_a_call_longer_than_max_event_size_fails_and_is_not_buffered() -> None:
    body = json.dumps({"city": "x" * 500})
    text = f"{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}{body}{CALL_END}{CALL_BEGIN}foo{SEP}{{}}{CALL_END}{CALLS_END}"
    asm = ToolCallAssembler(TOOLS, "deepseek_v31", max_event_size=200)
    for k in range(0, len(text), 7):
        asm.feed(text[k : k + 7])
    result = asm.finish("stop")
    assert [c.name for c in result.calls] == ["foo"]
    (err,) = result.errors
    assert type(err) is ToolCallError and "max_event_size=200" in err.message and err.path == "tool_calls[0]"


# ---------------------------------------------------------------------------------------------------------------
# Template round trip: what the model's own template writes parses back to the calls it was given

ROUND_TRIP_CALLS = [_call("a", "get_weather", ZURICH), _call("b", "search_docs", SEARCH_ARGS)]


class Template(NamedTuple):
    file: str
    fmt: str
    header: str  # what opens the assistant turn (the generation prompt's role marker)
    eot: str  # the end-of-turn token: the stop token, never streamed as text
    content: str | None  # the assistant content the template can carry with its calls
    prompt_tools: bool = True
    framing: str = ""  # what the template writes between the content and the calls (text, to the parser)


TEMPLATES = [
    Template(
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseek_v3", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", ""
    ),
    # Its tools preamble maps the tools with `map(attribute=...) | tojson`, which only llama.cpp's own engine can
    # serialise; the assistant turn does not depend on the tools.
    Template(
        "llama-cpp-deepseek-r1.jinja", "deepseek_v3", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "", prompt_tools=False
    ),
    Template(
        "deepseek-ai-DeepSeek-V3.1.jinja",
        "deepseek_v31",
        "<｜Assistant｜><think></think>",
        "<｜end▁of▁sentence｜>",
        "Let me check both.",
    ),
    # Its history form of an assistant turn opens with </think> (the generation prompt writes <think></think>).
    Template(
        "deepseek-ai-DeepSeek-V3.2.jinja",
        "deepseek_v32",
        "<｜Assistant｜></think>",
        "<｜end▁of▁sentence｜>",
        "Let me check.",
        framing="\n\n",
    ),
    Template(
        "moonshotai-Kimi-K2.jinja", "kimi_k2", "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>", "Let me check."
    ),
]


def _render(template_file: str, messages: list[dict[str, Any]], tools: list[Any], generation: bool) -> str:
    from ctxlock.artifacts import load_template_file
    from ctxlock.template import render

    template = load_template_file(fetched.templates_dir() / template_file)
    request = parse_request(json.dumps({"messages": messages, "tools": tools}).encode())
    return render(request, template, add_generation_prompt=generation).text


def generated_part(spec: Template, message: dict[str, Any]) -> str:
    """The assistant turn as the model writes it: the render with the message, minus the render without it, minus
    the turn's header (the generation prompt's role marker) and its end-of-turn token."""
    user = {"role": "user", "content": "Weather in Zürich, and search the docs?"}
    tools = TEMPLATE_TOOLS if spec.prompt_tools else []
    before = _render(spec.file, [user], tools, False)
    full = _render(spec.file, [user, message], tools, False)
    assert full.startswith(before + spec.header)
    turn = full[len(before) + len(spec.header) :]
    return turn[: turn.index(spec.eot)]


@pytest.mark.parametrize("spec", TEMPLATES, ids=[t.file for t in TEMPLATES])
def test_template_round_trip(spec: Template) -> None:
    message = {"role": "assistant", "content": spec.content, "tool_calls": ROUND_TRIP_CALLS}
    text = generated_part(spec, message)
    for chunks in ([text], list(text)):
        result = assemble(TEMPLATE_TOOLS, spec.fmt, chunks, "stop")
        assert result.errors == ()
        assert [(c.name, c.arguments) for c in result.calls] == [("get_weather", ZURICH), ("search_docs", SEARCH_ARGS)]
        assert result.text == (spec.content or "") + spec.framing
        if spec.fmt == "kimi_k2":  # the template numbers the calls: functions.NAME:IDX is their id
            assert [c.id for c in result.calls] == ["functions.get_weather:0", "functions.search_docs:1"]


@pytest.mark.parametrize("file", ["Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja"])
def test_kimi_k2_templates_that_the_sandbox_refuses(file: str) -> None:
    """These two templates queue the call ids with `list.append`, which the immutable sandbox refuses (as
    transformers' does): an assistant message with tool calls does not render, so there is nothing to round-trip."""
    message = {"role": "assistant", "content": "Let me check.", "tool_calls": ROUND_TRIP_CALLS}
    user = {"role": "user", "content": "Weather?"}
    with pytest.raises(TemplateSecurityError, match="append"):
        _render(file, [user, message], TEMPLATE_TOOLS, False)


def test_r1_distill_llama_writes_no_tool_calls() -> None:
    """DeepSeek-R1-Distill-Llama-8B's template writes the calls only when the content is none, and a message's
    none-valued keys never reach a template (transformers drops them; so does ctxlock): the calls are dropped."""
    message = {"role": "assistant", "content": "", "tool_calls": [_call("a", "get_weather", PARIS)]}
    spec = Template(
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "deepseek_v3", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", ""
    )
    assert generated_part(spec, message) == ""
