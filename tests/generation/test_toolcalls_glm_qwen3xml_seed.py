"""Tool-call formats `glm45` (GLM-4.5/4.6/4.7), `qwen3_xml` (Qwen3-Coder, read as `qwen3_coder`) and `seed_oss`
(ByteDance Seed-OSS), checked against the cases of vLLM's tool-parser tests and their models' chat templates.

The vLLM cases (the model outputs and the calls and content vLLM's tests expect) come from vllm-project/vllm
tests/tool_parsers/: test_glm4_moe_tool_parser.py, test_glm47_moe_tool_parser.py, ... (named above each list).
Each case is fed whole, split at every character index into two chunks, and one character at a time, in both
release modes, and must give vLLM's calls (name and arguments, types included) and content. Where ctxlock
deliberately differs (DIFFERENCES: text between calls is kept, a malformed or unterminated call is refused), the
case asserts ctxlock's answer; docs/tool-call-formats.md lists each with its reason.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_toolcalls import SEARCH, SEARCH_ARGS, WEATHER, ZURICH

import fetched
from ctxlock.errors import ToolCallError, ToolCallTruncatedError
from ctxlock.generation.toolcalls import PARSERS, ToolCallAssembler, ToolCallFormat, ToolCallReady
from ctxlock.request import parse_request

Call = tuple[str, dict[str, Any]]
Case = tuple[str, str, list[Call], str | None]  # (id, model output, vLLM's expected calls, vLLM's expected content)


def tool(name: str, properties: dict[str, Any] | None = None) -> dict[str, Any]:
    """A declared tool: with `properties` as vLLM's test declares them, else a loose object schema."""
    parameters: dict[str, Any] = {"type": "object"}
    if properties is not None:
        parameters["properties"] = properties
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


S = {"type": "string"}

# ---------------------------------------------------------------------------------------------------------------
# glm45: vLLM tests/tool_parsers/test_glm4_moe_tool_parser.py and test_glm47_moe_tool_parser.py

GLM_TOOLS = [
    tool("get_weather", {"city": S, "date": S}),
    *(tool(n) for n in ("get_current_weather", "send_message", "calculate", "get_current_time", "get_time")),
    tool("get_current_date", {}),
]
GLM_CASE_TOOLS = {
    "glm4_long_content": [tool("write_to_file", {"file_path": S, "content": S})],
    "glm4_whitespace_preserved": [tool("apply_diff", {"s": S})],
    "glm4_typed_number_args": [tool("calculate", {"operation": S, "a": {"type": "number"}, "b": {"type": "number"}})],
    "glm4_function_tool": [tool("get_weather", {"city": S, "unit": S})],
    "glm4_function_tool_mixed_types": [
        tool("calculate", {"operation": S, "a": {"type": "number"}, "b": {"type": "number"}})
    ],
    "glm4_anyof_string": [tool("configure", {"api_key": {"anyOf": [S, {"type": "null"}]}})],
    "glm4_list_type_string": [tool("log", {"message": {"type": ["string", "null"]}})],
    "glm4_boolean_value": [tool("configure", {"enabled": {"type": "boolean"}})],
}


def _glm(name: str, *pairs: tuple[str, str], nl: str = "\n", indent: str = "") -> str:
    """A GLM call as vLLM's tests write it: a newline (GLM-4.5/4.6) or nothing (GLM-4.7) after each part."""
    body = "".join(f"{indent}<arg_key>{k}</arg_key>{nl}{indent}<arg_value>{v}</arg_value>{nl}" for k, v in pairs)
    return f"<tool_call>{name}{nl}{body}{indent}</tool_call>"


DALLAS = _glm("get_current_weather", ("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit"), indent="    ")
ORLANDO = _glm("get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit"), indent="    ")
BEIJING_0801 = _glm("get_weather", ("city", "Beijing"), ("date", "2025-08-01"))
BEIJING = "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>"
SHANGHAI = "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Shanghai</arg_value></tool_call>"
BUBBLE_SORT = '''#!/usr/bin/env python3
# -*- coding: utf-8 -*-
"""
Bubble Sort Implementation
"""

def bubble_sort(arr):
    n = len(arr)
    for i in range(n):
        swapped = False
        for j in range(0, n - i - 1):
            if arr[j] > arr[j + 1]:
                arr[j], arr[j + 1] = arr[j + 1], arr[j]
                swapped = True
        if not swapped:
            break
    return arr

if __name__ == "__main__":
    test_arr = [64, 34, 25, 12, 22, 11, 90]
    print(f"Original: {test_arr}")
    sorted_arr = bubble_sort(test_arr.copy())
    print(f"Sorted: {sorted_arr}")'''


def _weather(city: str, state: str, unit: str) -> Call:
    return ("get_current_weather", {"city": city, "state": state, "unit": unit})


GLM_CASES: list[Case] = [
    ("glm4_no_tools", "This is a test", [], "This is a test"),
    ("glm4_single_tool_call", DALLAS, [_weather("Dallas", "TX", "fahrenheit")], None),
    (
        "glm4_multiple_tool_calls",
        DALLAS + "\n    " + ORLANDO,
        [_weather("Dallas", "TX", "fahrenheit"), _weather("Orlando", "FL", "fahrenheit")],
        None,
    ),
    (
        "glm4_tool_call_with_content_before",
        "I'll help you check the weather. "
        + _glm("get_current_weather", ("city", "Seattle"), ("state", "WA"), ("unit", "celsius"), indent="    "),
        [_weather("Seattle", "WA", "celsius")],
        "I'll help you check the weather. ",
    ),
    (
        "glm4_tool_call_with_mixed_args",
        _glm("get_current_weather", ("city", "New York"), ("state", "NY"), ("unit", "celsius"), indent="    "),
        [_weather("New York", "NY", "celsius")],
        None,
    ),
    (
        "glm4_tool_call_with_chinese_content",
        "I will help you get the weather."
        + _glm("get_weather", ("city", "Beijing"), ("date", "2025-08-01"), indent="    "),
        [("get_weather", {"city": "Beijing", "date": "2025-08-01"})],
        "I will help you get the weather.",
    ),
    (
        "glm4_thinking_tags",
        "<think>I want to get the weather.</think>\n\nI will help you get the weather.\n" + BEIJING_0801,
        [("get_weather", {"city": "Beijing", "date": "2025-08-01"})],
        "<think>I want to get the weather.</think>\n\nI will help you get the weather.\n",
    ),
    (
        "glm4_malformed_xml",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seattle</arg_value>\n"
        "<arg_key>incomplete_arg\n<arg_value>value</arg_value>\n</tool_call>",
        [("get_weather", {"city": "Seattle"})],  # what vLLM's parser gives; its test accepts any outcome
        None,
    ),
    ("glm4_empty_arguments", "<tool_call>get_current_time\n</tool_call>", [("get_current_time", {})], None),
    (
        "glm4_mixed_content",
        "I will help you get the weather info.\n\n"
        + BEIJING_0801
        + "\n\nmeaningwhile, I will also check the weather in Shanghai.\n\n"
        + _glm("get_weather", ("city", "Shanghai"), ("date", "2025-08-01")),
        [
            ("get_weather", {"city": "Beijing", "date": "2025-08-01"}),
            ("get_weather", {"city": "Shanghai", "date": "2025-08-01"}),
        ],
        "I will help you get the weather info.\n\n",
    ),
    (
        "glm4_streaming_basic",
        BEIJING_0801.replace("<arg_key>date</arg_key>\n<arg_value>2025-08-01</arg_value>\n", ""),
        [("get_weather", {"city": "Beijing"})],
        None,
    ),
    (
        "glm4_streaming_no_tool_calls",
        "This is just regular text without any tool calls.",
        [],
        "This is just regular text without any tool calls.",
    ),
    (
        "glm4_streaming_content_before_open_call",
        "I will help you get the weather.<tool_call>",
        [],
        "I will help you get the weather.",
    ),
    ("glm4_streaming_incremental_value", BEIJING, [("get_weather", {"city": "Beijing"})], None),
    ("glm4_streaming_empty_tool_call", "<tool_call></tool_call>", [], None),
    (
        "glm4_streaming_two_calls",
        BEIJING + SHANGHAI,
        [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})],
        None,
    ),
    (
        "glm4_streaming_json_escape",
        '<tool_call>send_message\n<arg_key>message</arg_key><arg_value>Hello "world"\nNew line</arg_value></tool_call>',
        [("send_message", {"message": 'Hello "world"\nNew line'})],
        None,
    ),
    (
        "glm4_long_content",
        "<tool_call>write_to_file\n<arg_key>file_path</arg_key><arg_value>/tmp/bubble_sort.py</arg_value>"
        f"<arg_key>content</arg_key><arg_value>{BUBBLE_SORT}\n</arg_value></tool_call>",
        [("write_to_file", {"file_path": "/tmp/bubble_sort.py", "content": BUBBLE_SORT + "\n"})],
        None,
    ),
    (
        "glm4_numeric_deserialization",
        _glm("calculate", ("operation", "add"), ("a", "42"), ("b", "3.14"), ("enabled", "true")),
        [("calculate", {"operation": "add", "a": 42, "b": 3.14, "enabled": True})],
        None,
    ),
    (
        "glm4_whitespace_preserved",
        "<tool_call>apply_diff\n<arg_key>s</arg_key>\n<arg_value>    indented code    </arg_value>\n</tool_call>",
        [("apply_diff", {"s": "    indented code    "})],
        None,
    ),
    ("glm4_zero_argument", "<tool_call>get_time\n</tool_call>", [("get_time", {})], None),
    ("glm4_unterminated_no_regex_match", "<tool_call>   ", [], "<tool_call>   "),
    (
        "glm4_unicode_preserved",
        _glm("send_message", ("greeting", "你好世界"), ("emoji", "🎉")),
        [("send_message", {"greeting": "你好世界", "emoji": "🎉"})],
        None,
    ),
    (
        "glm4_streaming_content_between_calls",
        "I will check.\n" + BEIJING + "\nAlso Shanghai.\n" + SHANGHAI,
        [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})],
        "I will check.\n\nAlso Shanghai.\n",  # vLLM's streaming path keeps the text between calls
    ),
    (
        "glm4_typed_number_args",
        "<tool_call>calculate\n<arg_key>operation</arg_key><arg_value>add</arg_value><arg_key>a</arg_key>"
        "<arg_value>42</arg_value><arg_key>b</arg_key><arg_value>3.14</arg_value></tool_call>",
        [("calculate", {"operation": "add", "a": 42, "b": 3.14})],
        None,
    ),
    (
        "glm4_interval_content_then_call",
        "I will check the weather for you.\n" + BEIJING,
        [("get_weather", {"city": "Beijing"})],
        "I will check the weather for you.\n",
    ),
    (
        "glm4_interval_single_chunk",
        "Here is the weather.\n" + BEIJING,
        [("get_weather", {"city": "Beijing"})],
        "Here is the weather.\n",
    ),
    (
        "glm4_interval_content_between_calls",
        "Checking Beijing.\n" + BEIJING + "\nAlso Shanghai.\n" + SHANGHAI,
        [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})],
        "Checking Beijing.\n\nAlso Shanghai.\n",
    ),
    (
        "glm4_function_tool",
        _glm("get_weather", ("city", "Dallas"), ("unit", "fahrenheit")),
        [("get_weather", {"city": "Dallas", "unit": "fahrenheit"})],
        None,
    ),
    (
        "glm4_function_tool_mixed_types",
        _glm("calculate", ("operation", "add"), ("a", "42"), ("b", "3.14")),
        [("calculate", {"operation": "add", "a": 42, "b": 3.14})],
        None,
    ),
    (
        "glm4_no_newline_after_name",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Seattle</arg_value></tool_call>",
        [("get_weather", {"city": "Seattle"})],
        None,
    ),
    (
        "glm4_anyof_string",
        "<tool_call>configure<arg_key>api_key</arg_key><arg_value>sk-12345678</arg_value></tool_call>",
        [("configure", {"api_key": "sk-12345678"})],
        None,
    ),
    (
        "glm4_list_type_string",
        "<tool_call>log<arg_key>message</arg_key><arg_value>test message</arg_value></tool_call>",
        [("log", {"message": "test message"})],
        None,
    ),
    (
        "glm4_boolean_value",
        "<tool_call>configure<arg_key>enabled</arg_key><arg_value>true</arg_value></tool_call>",
        [("configure", {"enabled": True})],
        None,
    ),
    ("glm47_no_tool_call", "This is a plain response.", [], "This is a plain response."),
    ("glm47_zero_arg_inline", "<tool_call>get_current_date</tool_call>", [("get_current_date", {})], None),
    ("glm47_zero_arg_newline", "<tool_call>get_current_date\n</tool_call>", [("get_current_date", {})], None),
    (
        "glm47_args_same_line",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>",
        [("get_weather", {"city": "Beijing"})],
        None,
    ),
    (
        "glm47_args_with_newlines",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n</tool_call>",
        [("get_weather", {"city": "Beijing"})],
        None,
    ),
    (
        "glm47_content_before",
        "Checking.<tool_call>get_current_date</tool_call>",
        [("get_current_date", {})],
        "Checking.",
    ),
    (
        "glm47_multiple",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Shanghai</arg_value></tool_call>",
        [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})],
        None,
    ),
    (
        "glm47_whitespace_content_none",
        "  \n  <tool_call>get_current_date</tool_call>",
        [("get_current_date", {})],
        None,
    ),
    ("glm47_streaming_no_args", "<tool_call>get_current_date</tool_call>", [("get_current_date", {})], None),
    (
        "glm47_streaming_name_then_args",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>",
        [("get_weather", {"city": "Beijing"})],
        None,
    ),
]

# Where ctxlock deliberately differs from a vLLM case: (ctxlock's calls, ctxlock's text, ctxlock's errors as
# (type, path), why). Text outside calls is passed through whole (vLLM's non-streaming content is the text before
# the first call, None when blank); a call that is malformed, nameless or unterminated is refused, never guessed.
Ours = tuple[list[Call] | None, str | None, list[tuple[str, str]], str]
KEPT_TEXT = "ctxlock passes every character outside the calls through as text"
DIFFERENCES: dict[str, Ours] = {
    "glm4_multiple_tool_calls": (None, "\n    ", [], KEPT_TEXT),
    "glm4_mixed_content": (
        None,
        "I will help you get the weather info.\n\n\n\nmeaningwhile, I will also check the weather in Shanghai.\n\n",
        [],
        KEPT_TEXT,
    ),
    "glm47_whitespace_content_none": (None, "  \n  ", [], KEPT_TEXT),
    "glm4_malformed_xml": (
        [],
        "",
        [("ToolCallError", "tool_calls[0].arguments")],
        "an <arg_key> without </arg_key> is refused; vLLM drops that argument and releases the rest",
    ),
    "glm4_streaming_empty_tool_call": (
        [],
        "",
        [("ToolCallError", "tool_calls[0].name")],
        "a call without a function name is refused (vLLM's test only checks that the parser does not hang)",
    ),
    "glm4_streaming_content_before_open_call": (
        [],
        None,
        [("ToolCallError", "tool_calls[0]")],
        "a call still open when the stream ends is an error, never text",
    ),
    "glm4_unterminated_no_regex_match": (
        [],
        "",
        [("ToolCallError", "tool_calls[0]")],
        "a call still open when the stream ends is an error; vLLM gives the output back as content",
    ),
    "qwen3_fallback_no_tool_call_tags": (
        [],
        "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n"
        "</parameter>\n</function>",
        [],
        "without <tool_call> there is no call: the text is text (vLLM falls back to reading <function=...> alone)",
    ),
    "qwen3_malformed_no_gt": (
        [],
        None,
        [("ToolCallError", "tool_calls[0].name")],
        "<function=NAME without > is refused (vLLM's test only checks that its parser does not crash)",
    ),
    "qwen3_none_tool_calls_filtered": (
        None,
        "\n",
        [("ToolCallError", "tool_calls[0].name")],
        "the malformed first call is refused with an error rather than dropped silently; text kept",
    ),
    "qwen3_double_encoded_object": (
        [],
        "\n",
        [("ToolCallValidationError", "tool_calls[0].arguments.data")],
        "a JSON string holding a Python repr is not an object: refused, not decoded twice",
    ),
    "qwen3_two_calls_one_chunk": (None, "\n", [], KEPT_TEXT),
    "qwen3_xml_tags_in_value": (None, "\n", [], KEPT_TEXT),
    "qwen3_param_like_lines_in_value": (None, "\n", [], KEPT_TEXT),
    "qwen3_out_of_schema_nested_literal": (None, "\n\n", [], KEPT_TEXT),
    "qwen3_jinja_phantom_call": (
        None,
        "\n\n",
        [("ToolCallError", "tool_calls[0].name")],
        "the call to the undeclared `{{ tc.name }}` is refused with an error (vLLM drops it); text kept",
    ),
    "qwen3_inline_empty_tool_call": (
        None,
        None,
        [("ToolCallError", "tool_calls[0].name")],
        "<tool_call>example</tool_call> is a call without <function=...>: refused with an error (vLLM drops it)",
    ),
}


def _expected(case: Case) -> tuple[list[Call], str, list[tuple[str, str]]]:
    cid, _, calls, content = case
    ours = DIFFERENCES.get(cid)
    if ours is None:
        return calls, content or "", []
    our_calls, our_text, errors, _ = ours
    return (calls if our_calls is None else our_calls), (content or "" if our_text is None else our_text), errors


def _outcome(fmt: str, tools: list[dict[str, Any]], chunks: list[str], release: str) -> Any:
    asm = ToolCallAssembler(tools, fmt, release=release)
    for chunk in chunks:
        asm.feed(chunk)
    result = asm.finish("stop")
    calls = [(c.name, json.dumps(c.arguments, sort_keys=True)) for c in result.calls]
    return calls, result.text, [(type(e).__name__, e.path) for e in result.errors]


def check_case(fmt: str, tools: list[dict[str, Any]], case: Case, *, whole_only: bool = False) -> None:
    """The case whole, split at every index, and one character at a time, in both release modes."""
    calls, text, errors = _expected(case)
    want = ([(n, json.dumps(a, sort_keys=True)) for n, a in calls], text, errors)
    output = case[1]
    chunkings = [[output], list(output), *([output[:k], output[k:]] for k in range(1, len(output)))]
    if whole_only:
        chunkings = chunkings[:1]
    for release in ("finish", "early"):
        for chunks in chunkings:
            assert _outcome(fmt, tools, chunks, release) == want, (release, chunks)


@pytest.mark.parametrize("case", GLM_CASES, ids=[c[0] for c in GLM_CASES])
def test_glm45_vllm_cases(case: Case) -> None:
    check_case("glm45", GLM_CASE_TOOLS.get(case[0], GLM_TOOLS), case)


# ---------------------------------------------------------------------------------------------------------------
# qwen3_xml (and qwen3_coder: the same parser): vLLM tests/tool_parsers/test_qwen3_xml_coder_shared.py, the cases
# both of vLLM's parsers (Qwen3XMLToolParser, Qwen3CoderToolParser) must pass

QWEN_WEATHER = {"city": S, "state": S, "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]}}
QWEN_TOOLS = [
    tool("get_current_weather", QWEN_WEATHER),
    tool("calculate_area", {"shape": S, "dimensions": {"type": "object"}, "precision": {"type": "integer"}}),
    tool("test"),
]
WRITE_FILE = [tool("write_file", {"path": S, "content": S})]
QWEN_CASE_TOOLS = {
    # vLLM's test declares "float", which is not a JSON Schema type: ctxlock refuses that declaration
    # (test_qwen3_a_float_type_is_refused_at_declaration), so the case runs with "number".
    "qwen3_type_conversion": [
        tool(
            "test_types",
            {
                "int_param": {"type": "integer"},
                "float_param": {"type": "number"},
                "bool_param": {"type": "boolean"},
                "str_param": S,
                "obj_param": {"type": "object"},
            },
        )
    ],
    "qwen3_object_as_python_repr": [tool("test_types", {"obj_param": {"type": "object"}})],
    "qwen3_no_double_serialization": [tool("greet", {"message": S})],
    "qwen3_string_null_preserved": [tool("search", {"query": S})],
    "qwen3_anyof_string_null_keeps_string": [tool("set_code", {"code": {"anyOf": [S, {"type": "null"}]}})],
    "qwen3_anyof_integer_null_parses_int": [
        tool("set_count", {"count": {"anyOf": [{"type": "integer"}, {"type": "null"}]}})
    ],
    "qwen3_python_none_for_nullable_int": [
        tool("set_count", {"count": {"anyOf": [{"type": "integer"}, {"type": "null"}]}})
    ],
    "qwen3_anyof_object_not_double_encoded": [
        tool("update_record", {"data": {"anyOf": [{"type": "object"}, {"type": "null"}]}})
    ],
    "qwen3_double_encoded_object": [tool("process", {"name": S, "data": {"type": "object"}})],
    "qwen3_xml_tags_in_value": WRITE_FILE,
    "qwen3_param_like_lines_in_value": WRITE_FILE,
    "qwen3_real_param_name_literal_in_value": WRITE_FILE,
    "qwen3_full_nested_call_in_value": WRITE_FILE,
    "qwen3_out_of_schema_nested_literal": [*WRITE_FILE, tool("foo")],
    "qwen3_array_with_json_bool": [tool("pick", {"items": {"type": "array"}})],
    "qwen3_two_calls_one_chunk": [tool("get_weather", {"city": S})],
    "qwen3_two_calls_trailing_text": [tool("get_weather", {"city": S})],
    "qwen3_trailing_text_after_close": [tool("get_weather", {"city": S})],
    "qwen3_jinja_phantom_call": WRITE_FILE,
    "qwen3_inline_empty_tool_call": [tool("log", {"msg": S})],
    "qwen3_anyof_string_null_literal_null": [tool("set_value", {"optional": {"anyOf": [S, {"type": "null"}]}})],
    "qwen3_anyof_string_null_literal_none": [tool("set_value", {"optional": {"anyOf": [S, {"type": "null"}]}})],
}


def _qwen(name: str, *params: tuple[str, str], nl: str = "\n") -> str:
    """A Qwen3-Coder call: the template's newline around each parameter value (nl="" for the tight spelling)."""
    body = "".join(f"<parameter={k}>{nl}{v}{nl}</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


Q_DALLAS = _qwen("get_current_weather", ("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit"))
Q_ORLANDO = _qwen("get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit"))
DALLAS_CALL: Call = ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})
XML_TAGS_IN_CONTENT = (
    'char_deltas = [\n    "<tool_call>\\n",\n    "<parameter=query>\\n",\n    "\\n</parameter>\\n",\n'
    '    "</function>\\n",\n]\n'
)
PARAM_LIKE_LINES = (
    'TOOL_CALL_TEMPLATE = """\n</parameter>\n<parameter=new_string>\n#!/usr/bin/env python3\n</parameter>\n"""\n'
)
REAL_PARAM_NAME_LITERAL = 'doc = """\n<parameter=path>\nliteral/value\n</parameter>\n"""\n'
FULL_NESTED_CALL = (
    'doc = """\n<tool_call>\n<function=write_file>\n<parameter=path>\nliteral/value.txt\n</parameter>\n'
    '<parameter=content>\nhello\n</parameter>\n</function>\n</tool_call>\n"""\n'
)
OUT_OF_SCHEMA_NESTED = (
    'template = """\n<tool_call>\n<function=foo>\n<parameter=bar>baz</parameter>\n</function>\n</tool_call>\n"""\n'
)
Q_PARIS = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
Q_LONDON = "<tool_call>\n<function=get_weather>\n<parameter=city>\nLondon\n</parameter>\n</function>\n</tool_call>"


def _write_file(path: str, content: str) -> str:
    return (
        f"<tool_call>\n<function=write_file>\n<parameter=path>\n{path}\n</parameter>\n"
        f"<parameter=content>\n{content}</parameter>\n</function>\n</tool_call>"
    )


def _tight(name: str, param: str, value: str) -> str:
    return f"<tool_call>\n<function={name}>\n<parameter={param}>{value}</parameter>\n</function>\n</tool_call>"


QWEN_CASES: list[Case] = [
    (
        "qwen3_no_tools",
        "This is a test response without any tool calls",
        [],
        "This is a test response without any tool calls",
    ),
    ("qwen3_single_tool", Q_DALLAS, [DALLAS_CALL], None),
    (
        "qwen3_single_tool_with_content",
        "Sure! Let me check the weather for you." + Q_DALLAS,
        [DALLAS_CALL],
        "Sure! Let me check the weather for you.",
    ),
    (
        "qwen3_single_tool_multiline_param",
        _qwen(
            "calculate_area",
            ("shape", "rectangle"),
            ("dimensions", '{"width": 10,\n "height": 20}'),
            ("precision", "2"),
        ),
        [("calculate_area", {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2})],
        None,
    ),
    (
        "qwen3_parallel_tools",
        Q_DALLAS + "\n" + Q_ORLANDO,
        [DALLAS_CALL, ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"})],
        "\n",
    ),
    (
        "qwen3_tool_with_typed_params",
        "Let me calculate that area for you."
        + _qwen("calculate_area", ("shape", "circle"), ("dimensions", '{"radius": 15.5}'), ("precision", "3")),
        [("calculate_area", {"shape": "circle", "dimensions": {"radius": 15.5}, "precision": 3})],
        "Let me calculate that area for you.",
    ),
    ("qwen3_streaming_no_tools", "This is a test without tools", [], "This is a test without tools"),
    (
        "qwen3_fallback_no_tool_call_tags",
        "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n"
        "</parameter>\n</function>",
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        None,
    ),
    (
        "qwen3_type_conversion",
        _qwen(
            "test_types",
            ("int_param", "42"),
            ("float_param", "3.14"),
            ("bool_param", "true"),
            ("str_param", "hello world"),
            ("obj_param", '{"key": "value"}'),
        ),
        [
            (
                "test_types",
                {
                    "int_param": 42,
                    "float_param": 3.14,
                    "bool_param": True,
                    "str_param": "hello world",
                    "obj_param": {"key": "value"},
                },
            )
        ],
        None,
    ),
    (
        "qwen3_object_as_python_repr",
        _qwen("test_types", ("obj_param", "{'key': 'value'}")),
        [("test_types", {"obj_param": {"key": "value"}})],
        None,
    ),
    (
        "qwen3_missing_closing_parameter_tag",
        "Let me check the weather for you:\n<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n"
        "<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>",
        [DALLAS_CALL],
        "Let me check the weather for you:\n",
    ),
    (
        "qwen3_streaming_incremental",
        "I'll check the weather." + _qwen("get_current_weather", ("city", "Dallas"), ("state", "TX")),
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        "I'll check the weather.",
    ),
    (
        "qwen3_malformed_no_gt",
        "<tool_call>\n<function=get_current_weather\n<parameter=city>Dallas</parameter>\n</function>\n</tool_call>",
        [],  # vLLM's test asks only that its parser does not crash
        None,
    ),
    (
        "qwen3_none_tool_calls_filtered",
        "<tool_call>\n<function=bad_func_no_gt\n</function>\n</tool_call>\n"
        + _tight("get_current_weather", "city", "Dallas").replace(
            "</parameter>\n", "</parameter>\n<parameter=state>TX</parameter>\n"
        ),
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        None,
    ),
    (
        "qwen3_multi_param_single_chunk",
        "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n"
        "</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>",
        [DALLAS_CALL],
        None,
    ),
    (
        "qwen3_no_double_serialization",
        _tight("greet", "message", "hello world"),
        [("greet", {"message": "hello world"})],
        None,
    ),
    (
        "qwen3_speculative_decode_loss",
        "<tool_call>\n<function=test>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        [("test", {"city": "Paris"})],
        None,
    ),
    ("qwen3_string_null_preserved", _tight("search", "query", "null"), [("search", {"query": "null"})], None),
    ("qwen3_anyof_string_null_keeps_string", _tight("set_code", "code", "42"), [("set_code", {"code": "42"})], None),
    ("qwen3_anyof_integer_null_parses_int", _tight("set_count", "count", "42"), [("set_count", {"count": 42})], None),
    (
        "qwen3_anyof_object_not_double_encoded",
        _tight("update_record", "data", '{"key": "value", "count": 42}'),
        [("update_record", {"data": {"key": "value", "count": 42}})],
        None,
    ),
    (
        "qwen3_double_encoded_object",
        _qwen("process", ("name", "hello"), ("data", "\"{'key': 'value', 'n': 1}\"")) + "\n",
        [("process", {"name": "hello", "data": {"key": "value", "n": 1}})],
        None,
    ),
    (
        "qwen3_xml_tags_in_value",
        _write_file("test.py", XML_TAGS_IN_CONTENT) + "\n",
        [("write_file", {"path": "test.py", "content": XML_TAGS_IN_CONTENT.rstrip("\n")})],
        None,
    ),
    (
        "qwen3_param_like_lines_in_value",
        _write_file("test_template.py", PARAM_LIKE_LINES) + "\n",
        [("write_file", {"path": "test_template.py", "content": PARAM_LIKE_LINES.rstrip("\n")})],
        None,
    ),
    (
        "qwen3_real_param_name_literal_in_value",
        _write_file("fixture.py", REAL_PARAM_NAME_LITERAL),
        [("write_file", {"path": "fixture.py", "content": REAL_PARAM_NAME_LITERAL.rstrip("\n")})],
        None,
    ),
    (
        "qwen3_full_nested_call_in_value",
        _write_file("fixture.py", FULL_NESTED_CALL),
        [("write_file", {"path": "fixture.py", "content": FULL_NESTED_CALL.rstrip("\n")})],
        None,
    ),
    (
        "qwen3_out_of_schema_nested_literal",
        "<tool_call>\n<function=foo>\n<parameter=bar>baz</parameter>\n</function>\n</tool_call>\n\n"
        + _write_file("fixture.py", OUT_OF_SCHEMA_NESTED),
        [("foo", {"bar": "baz"}), ("write_file", {"path": "fixture.py", "content": OUT_OF_SCHEMA_NESTED.rstrip("\n")})],
        None,
    ),
    (
        "qwen3_array_with_json_bool",
        _qwen("pick", ("items", '["a", "b", 1, true]')),
        [("pick", {"items": ["a", "b", 1, True]})],
        None,
    ),
    (
        "qwen3_two_calls_one_chunk",
        Q_PARIS + "\n" + Q_LONDON,
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "London"})],
        None,
    ),
    (
        "qwen3_two_calls_trailing_text",
        Q_PARIS + "\n" + Q_LONDON + "\nAll done!",
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "London"})],
        "\n\nAll done!",
    ),
    (
        "qwen3_trailing_text_after_close",
        _tight("get_weather", "city", "Paris") + "\nI hope this helps!",
        [("get_weather", {"city": "Paris"})],
        "\nI hope this helps!",
    ),
    (
        "qwen3_jinja_phantom_call",
        "<tool_call>\n<function={{ tc.name }}>\n<parameter={{ k }}>\n{{ v }}\n</parameter>\n</function>\n</tool_call>"
        "\n\n<tool_call>\n<function=write_file>\n<parameter=path>\nout.txt\n</parameter>\n<parameter=content>\nhello\n"
        "</parameter>\n</function>\n</tool_call>",
        [("write_file", {"path": "out.txt", "content": "hello"})],
        None,
    ),
    (
        "qwen3_inline_empty_tool_call",
        "I'll show: <tool_call>example</tool_call>. Now real:\n"
        "<tool_call>\n<function=log>\n<parameter=msg>\nhi\n</parameter>\n</function>\n</tool_call>",
        [("log", {"msg": "hi"})],
        "I'll show: . Now real:\n",  # vLLM's test asks that both pieces of narrative are kept
    ),
    (
        "qwen3_anyof_string_null_literal_null",
        _tight("set_value", "optional", "null"),
        [("set_value", {"optional": None})],
        None,
    ),
    (
        "qwen3_anyof_string_null_literal_none",
        _tight("set_value", "optional", "None"),
        [("set_value", {"optional": None})],
        None,
    ),
]

# vLLM tests/tool_parsers/test_qwen3coder_tool_parser.py: the cases not already in the shared file
Q_ORLANDO_C = Q_ORLANDO.replace("fahrenheit", "celsius")
QWEN_CODER_CASES: list[Case] = [
    (
        "qwen3coder_parallel_tools",
        Q_DALLAS + "\n" + Q_ORLANDO,
        [DALLAS_CALL, ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"})],
        None,
    ),
    (
        "qwen3coder_streaming_parallel_tools",
        Q_DALLAS + "\n" + Q_ORLANDO_C,
        [DALLAS_CALL, ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "celsius"})],
        None,
    ),
    (
        "qwen3coder_anyof_type_conversion",
        _qwen(
            "test_anyof",
            ("anyof_int", "5"),
            ("anyof_str", "hello"),
            ("anyof_array", '["a", "b", "c"]'),
            ("anyof_obj", '{"key": "value"}'),
            ("type_as_array", "42"),
            ("multi_non_null", "some text"),
        ),
        [
            (
                "test_anyof",
                {
                    "anyof_int": 5,
                    "anyof_str": "hello",
                    "anyof_array": ["a", "b", "c"],
                    "anyof_obj": {"key": "value"},
                    "type_as_array": 42,
                    "multi_non_null": "some text",
                },
            )
        ],
        None,
    ),
    (
        "qwen3coder_anyof_streaming",
        _qwen("search_web", ("query", "vllm tool parser"), ("count", "10"), ("verbose", "true")),
        [("search_web", {"query": "vllm tool parser", "count": 10, "verbose": True})],
        None,
    ),
    (
        "qwen3coder_missing_opening_tag",
        "I'll check the weather for you.\n\n" + Q_DALLAS.removeprefix("<tool_call>\n"),
        [DALLAS_CALL],
        "I'll check the weather for you.\n\n",
    ),
]
NULLABLE = [{"type": "null"}]
QWEN_CASE_TOOLS["qwen3coder_anyof_type_conversion"] = [
    tool(
        "test_anyof",
        {
            "anyof_int": {"anyOf": [{"type": "integer"}, *NULLABLE], "default": 5},
            "anyof_str": {"anyOf": [S, *NULLABLE]},
            "anyof_array": {"anyOf": [{"type": "array", "items": S}, *NULLABLE]},
            "anyof_obj": {"anyOf": [{"type": "object"}, *NULLABLE]},
            "type_as_array": {"type": ["integer", "null"]},
            "multi_non_null": {"anyOf": [S, {"type": "integer"}, *NULLABLE]},
        },
    )
]
QWEN_CASE_TOOLS["qwen3coder_anyof_streaming"] = [
    tool(
        "search_web",
        {
            "query": {"anyOf": [S, *NULLABLE]},
            "count": {"anyOf": [{"type": "integer"}, *NULLABLE], "default": 5},
            "verbose": {"anyOf": [{"type": "boolean"}, *NULLABLE]},
        },
    )
]

# vLLM tests/tool_parsers/test_qwen3xml_tool_parser.py (through its common_tests.py, with no tool declared: here the
# tools are declared, typed where the case is about types)
QWEN_XML_CASES: list[Case] = [
    (
        "qwen3xml_no_tool_calls",
        "This is a regular response without any tool calls.",
        [],
        "This is a regular response without any tool calls.",
    ),
    ("qwen3xml_single_tool_call", _tight("get_weather", "city", "Tokyo"), [("get_weather", {"city": "Tokyo"})], None),
    (
        "qwen3xml_parallel_tool_calls",
        _tight("get_weather", "city", "Tokyo") + _tight("get_time", "timezone", "Asia/Tokyo"),
        [("get_weather", {"city": "Tokyo"}), ("get_time", {"timezone": "Asia/Tokyo"})],
        None,
    ),
    (
        "qwen3xml_various_data_types",
        "<tool_call>\n<function=test_function>\n<parameter=string_field>hello</parameter>\n"
        "<parameter=int_field>42</parameter>\n<parameter=float_field>3.14</parameter>\n"
        "<parameter=bool_field>true</parameter>\n<parameter=null_field>null</parameter>\n"
        '<parameter=array_field>["a", "b", "c"]</parameter>\n<parameter=object_field>{"nested": "value"}</parameter>\n'
        "</function>\n</tool_call>",
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
                },
            )
        ],
        None,
    ),
    ("qwen3xml_empty_arguments", "<tool_call>\n<function=refresh>\n</function>\n</tool_call>", [("refresh", {})], None),
    (
        "qwen3xml_surrounding_text",
        "Let me check the weather for you.\n\n"
        + _tight("get_weather", "city", "Tokyo")
        + "\n\nI will get that information.",
        [("get_weather", {"city": "Tokyo"})],
        "Let me check the weather for you.\n\n\n\nI will get that information.",  # vLLM asks only for the call
    ),
    (
        "qwen3xml_escaped_strings",
        '<tool_call>\n<function=test_function>\n<parameter=quoted>He said "hello"</parameter>\n'
        "<parameter=path>C:\\Users\\file.txt</parameter>\n<parameter=newline>line1\nline2</parameter>\n"
        "</function>\n</tool_call>",
        [("test_function", {"quoted": 'He said "hello"', "path": "C:\\Users\\file.txt", "newline": "line1\nline2"})],
        None,
    ),
    ("qwen3xml_malformed_unterminated", "<tool_call><function=func>", [], None),
    ("qwen3xml_malformed_no_name", "<tool_call><function=></function></tool_call>", [], None),
]
TYPED_FIELDS = {
    "string_field": S,
    "int_field": {"type": "integer"},
    "float_field": {"type": "number"},
    "bool_field": {"type": "boolean"},
    "null_field": {"type": "null"},
    "array_field": {"type": "array"},
    "object_field": {"type": "object"},
}
QWEN_TOOLS += [tool("get_weather", {"city": S}), tool("get_time"), tool("refresh"), tool("func")]
QWEN_CASE_TOOLS["qwen3xml_various_data_types"] = [tool("test_function", TYPED_FIELDS)]
QWEN_CASE_TOOLS["qwen3xml_escaped_strings"] = [tool("test_function", {"quoted": S, "path": S, "newline": S})]
DIFFERENCES.update(
    {
        "qwen3coder_parallel_tools": (None, "\n", [], KEPT_TEXT),
        "qwen3coder_streaming_parallel_tools": (None, "\n", [], KEPT_TEXT),
        "qwen3coder_missing_opening_tag": (
            [],
            "I'll check the weather for you.\n\n" + Q_DALLAS.removeprefix("<tool_call>\n"),
            [],
            "without <tool_call> there is no call: the text is text (vLLM's engine parser reads <function=...> alone)",
        ),
        "qwen3xml_malformed_unterminated": (
            [],
            None,
            [("ToolCallError", "tool_calls[0]")],
            "a call still open at the end is an error (vLLM's test only checks that its parser does not raise)",
        ),
        "qwen3xml_malformed_no_name": (
            [],
            None,
            [("ToolCallError", "tool_calls[0].name")],
            "a call without a name is refused (vLLM's test only checks that its parser does not raise)",
        ),
    }
)
QWEN_CASES += QWEN_CODER_CASES + QWEN_XML_CASES


@pytest.mark.parametrize("case", QWEN_CASES, ids=[c[0] for c in QWEN_CASES])
def test_qwen3_xml_and_coder_vllm_cases(case: Case) -> None:
    """Every chunking under `qwen3_xml`; `qwen3_coder` is the same parser (checked here), so whole only."""
    assert PARSERS[ToolCallFormat.QWEN3_XML] is PARSERS[ToolCallFormat.QWEN3_CODER]
    tools = QWEN_CASE_TOOLS.get(case[0], QWEN_TOOLS)
    check_case("qwen3_xml", tools, case)
    check_case("qwen3_coder", tools, case, whole_only=True)


def test_qwen3_a_float_type_is_refused_at_declaration() -> None:
    with pytest.raises(ToolCallError) as info:
        ToolCallAssembler([tool("test_types", {"float_param": {"type": "float"}})], "qwen3_xml")
    assert info.value.path == "tools[0].function.parameters.properties.float_param.type"


# ---------------------------------------------------------------------------------------------------------------
# seed_oss: vLLM tests/tool_parsers/test_seed_oss_tool_parser.py. Its cases expect the <seed:think> reasoning (and a
# <seed:tool_call> the model writes inside it while thinking) back as content, which is what ctxlock gives.

SEED_TOOLS = [tool("get_weather", {"location": S, "unit": S})]
SEED_CALL = (
    "<seed:tool_call>\n<function=get_weather>\n<parameter=location>Barcelona, Spain</parameter>\n</function>\n"
    "</seed:tool_call>"
)
SEED_CALL_UNIT = SEED_CALL.replace("</parameter>\n", "</parameter>\n<parameter=unit>celsius</parameter>\n")
BARCELONA: Call = ("get_weather", {"location": "Barcelona, Spain"})
SEED_THINK_512 = (
    "<seed:think>The user's current thinking budget is 512.</seed:cot_budget_reflect>\nLet me analyze the "
    "question. The user wants to know the weather in Barcelona, Spain. Looking at the functions available, "
    "there's a get_weather function that can retrieve the current temperature for a given location. \n\nFirst, "
    "check the parameters required by get_weather: location is mandatory (needs city and country), and unit is "
    'optional. The user provided "Barcelona Spain" as the location, which fits the required format (city, '
    "country). \n<seed:cot_budget_reflect>I have used 131 tokens, and there are 381 tokens remaining for use."
    "</seed:cot_budget_reflect>\n Since the unit isn't specified, the function will default to Celsius, which "
    "is fine. \n\nThere's no need to ask for more information because the location is clear. So I should call "
    'the get_weather function with location set to "Barcelona, Spain" (adding a comma for clarity, though the '
    "user's input has a space, but the function might accept either; to be safe, using the standard format "
    "with a comma).\n<seed:cot_budget_reflect>I have used 257 tokens, and there are 255 tokens remaining for "
    "use.</seed:cot_budget_reflect>\n The unit parameter can be omitted since it's optional.</seed:think>\n"
)
SEED_THINK_UNLIMITED = (
    "<seed:think>\nGot it, let's see. The user asked for the weather in Barcelona, Spain. "
    "First, I need to remember the function I can use: get_weather. The function requires a "
    'location (city and country) which is "Barcelona, Spain" here, and unit is optional. Since '
    "the user didn't specify the unit, the default in the function is Celsius, right? Wait, "
    "let me check the function docstring again. Oh, the function says unit is optional, and "
    'returns temperature in Celsius. So I should call get_weather with location "Barcelona, '
    'Spain" and maybe omit unit or set to Celsius. Let me format the function call correctly. '
    "The format is <seed:tool_call>\n<function=get_weather>\n<parameter=location>Barcelona, "
    "Spain</parameter>\n<parameter=unit>celsius</parameter>\n</function>\n</seed:tool_call>. "
    'Wait, but does the unit parameter accept "celsius"? The docstring says unit is the unit '
    "of temperature, but the return is in Celsius anyway. Maybe even if I don't pass unit, "
    'it\'s okay, but to be explicit, maybe pass "celsius". Let me go with that. So the function '
    "call should be as above. Then wait for the result to come back and tell the user the "
    "temperature in Celsius.</seed:think>"
)
SEED_THINK_0 = (
    "<seed:think>\n</seed:cot_budget_reflect>\n</seed:cot_budget_reflect>\n"
    "The current thinking budget is 0, so I will directly start answering the question.\n</seed:think>\n"
)
SEED_CASES: list[Case] = [
    (
        "seed_no_tools",
        "This is a test response without any tool calls",
        [],
        "This is a test response without any tool calls",
    ),
    ("seed_tool_call_0_thinking_budget", SEED_CALL, [BARCELONA], None),
    ("seed_tool_call_512_thinking_budget", SEED_THINK_512 + SEED_CALL, [BARCELONA], SEED_THINK_512),
    (
        "seed_tool_call_unlimited_thinking_budget",
        SEED_THINK_UNLIMITED + SEED_CALL_UNIT,
        [("get_weather", {"location": "Barcelona, Spain", "unit": "celsius"})],
        SEED_THINK_UNLIMITED,
    ),
    (
        "seed_streaming_no_tools",
        "This is a test response without any tool calls.",
        [],
        "This is a test response without any tool calls.",
    ),
    ("seed_streaming_0_thinking_budget", SEED_THINK_0 + SEED_CALL, [BARCELONA], SEED_THINK_0),
]


@pytest.mark.parametrize("case", SEED_CASES, ids=[c[0] for c in SEED_CASES])
def test_seed_oss_vllm_cases(case: Case) -> None:
    check_case("seed_oss", SEED_TOOLS, case)


# ---------------------------------------------------------------------------------------------------------------
# Never half a call: a multi-call output cut anywhere under a length stop releases nothing

MULTI_CALL = {
    "glm45": ("Let me look.\n" + BEIJING_0801 + "\n" + SHANGHAI, GLM_TOOLS, "<tool_call>"),
    "qwen3_xml": ("Let me look.\n" + Q_DALLAS + "\n" + Q_ORLANDO, QWEN_TOOLS, "<tool_call>"),
    "seed_oss": (SEED_THINK_0 + SEED_CALL + "\n" + SEED_CALL_UNIT, SEED_TOOLS, "<seed:tool_call>"),
}


@pytest.mark.parametrize("fmt", sorted(MULTI_CALL))
def test_a_length_stop_anywhere_releases_no_call(fmt: str) -> None:
    text, tools, marker = MULTI_CALL[fmt]
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
                assert bool(result.errors) == (text[:cut].count(marker) > 0), cut
            else:
                assert all(type(err) is ToolCallTruncatedError for err in result.errors), cut
    asm = ToolCallAssembler(tools, fmt)
    asm.feed(text)
    result = asm.finish("stop")
    assert len(result.calls) == text.count(marker) and result.errors == ()


# ---------------------------------------------------------------------------------------------------------------
# Template round trip: what the model's own template writes for two calls parses back to the same calls

TEMPLATE_TOOLS = [WEATHER, SEARCH]
NESTED = {**SEARCH_ARGS, "query": "rain </tool_call> gear, 天气 🌧\n  indented"}


def _render(template_name: str, message: dict[str, Any]) -> tuple[str, str]:
    from ctxlock.artifacts import load_template_file
    from ctxlock.template import render

    template = load_template_file(fetched.templates_dir() / template_name)
    user = {"role": "user", "content": "Weather in Zürich, and search the docs?"}

    def text(messages: list[dict[str, Any]], prompt: bool) -> str:
        request = parse_request(json.dumps({"messages": messages, "tools": TEMPLATE_TOOLS}).encode())
        return render(request, template, add_generation_prompt=prompt).text

    return text([user], True), text([user, message], False)


def _message(content: str, calls: list[Call]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for k, (n, a) in enumerate(calls)
        ],
    }


# (format, template, calls, content, the generated text's start that the prompt does not hold, the end-of-turn
# token the model stops with, the text outside the calls as ctxlock reads it back)
PLAIN_CALLS: list[Call] = [("get_weather", ZURICH), ("search_docs", SEARCH_ARGS)]
ROUND_TRIPS = [
    (
        "glm45",
        "GLM-4.6.jinja",
        [("get_weather", ZURICH), ("search_docs", NESTED)],
        "Checking.",
        "",
        "",
        "\n<think></think>\nChecking.\n\n",
    ),
    # GLM-4.7's generation prompt ends with <think>; the history writes </think> for an empty thought, which is
    # what the model writes after the prompt's <think>: the tool-call reader passes it on as text.
    (
        "glm45",
        "GLM-4.7-Flash.jinja",
        [("get_weather", ZURICH), ("search_docs", NESTED)],
        "Checking.",
        "<think>",
        "",
        "</think>Checking.",
    ),
    ("qwen3_xml", "Qwen3-Coder.jinja", PLAIN_CALLS, "Checking.", "", "<|im_end|>\n", "Checking.\n\n\n"),
    # Qwen3.5's generation prompt opens <think>; the reader passes the thought's close on as text.
    ("qwen3_xml", "Qwen3.5-4B.jinja", PLAIN_CALLS, "Checking.", "", "<|im_end|>\n", "\n</think>\n\nChecking.\n\n\n"),
    # Seed-OSS writes values with `| string` (Python's True, None, {'lang': 'de'}): converted back by the schema.
    ("seed_oss", "ByteDance-Seed-OSS.jinja", PLAIN_CALLS, "Checking.", "", "<seed:eos>", "Checking.\n\n\n"),
]


@pytest.mark.parametrize(
    "fmt, template, calls, content, opened, eot, text", ROUND_TRIPS, ids=[r[1] for r in ROUND_TRIPS]
)
def test_template_round_trip(
    fmt: str, template: str, calls: list[Call], content: str, opened: str, eot: str, text: str
) -> None:
    prompt, full = _render(template, _message(content, calls))
    assert prompt.endswith(opened)
    prompt = prompt.removesuffix(opened)
    assert full.startswith(prompt) and full.endswith(eot)
    generated = full[len(prompt) : len(full) - len(eot)]
    for chunks in ([generated], list(generated)):
        asm = ToolCallAssembler(TEMPLATE_TOOLS, fmt)
        for chunk in chunks:
            asm.feed(chunk)
        result = asm.finish("stop")
        assert result.errors == ()
        assert [(c.name, c.arguments) for c in result.calls] == calls
        assert result.text == text


# ---------------------------------------------------------------------------------------------------------------
# Bounds and malformed calls


@pytest.mark.parametrize("fmt", ["glm45", "hermes", "qwen3_coder"])
def test_a_call_longer_than_max_event_size_is_refused_not_buffered(fmt: str) -> None:
    body = {"glm45": BEIJING, "hermes": '<tool_call>{"name": "get_weather", "arguments": {"city": "Beijing"}}'}
    call = body.get(fmt, "<tool_call><function=get_weather><parameter=city>Beijing</parameter></function>")
    call = call.removesuffix("</tool_call>") + "</tool_call>"
    text = "a" + call.replace("Beijing", "B" * 200) + "b" + call
    for release in ("finish", "early"):
        asm = ToolCallAssembler(GLM_TOOLS, fmt, max_event_size=120, release=release)
        for ch in text:
            asm.feed(ch)
        result = asm.finish("stop")
        assert [(type(e).__name__, e.path) for e in result.errors] == [("ToolCallError", "tool_calls[0]")]
        assert "max_event_size=120" in result.errors[0].message
        assert [c.index for c in result.calls] == [1] and result.text == "ab"


def test_glm45_refuses_a_repeated_argument_with_its_path() -> None:
    out = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>A</arg_value>"
    out += "<arg_key>city</arg_key><arg_value>B</arg_value></tool_call>"
    asm = ToolCallAssembler(GLM_TOOLS, "glm45")
    asm.feed(out)
    (err,) = asm.finish("stop").errors
    assert err.path == "tool_calls[0].arguments.city" and "twice" in err.message and err.hint


def test_qwen3_a_literal_call_left_open_in_a_value_keeps_the_call_open() -> None:
    """A value that opens a literal call (a line `<tool_call>`, then `<function=`) and never closes it: the real
    `</tool_call>` closes the literal one, so the call is unterminated at the end, never released cut short."""
    out = _write_file("a.md", "see:\n<tool_call>\n<function=x>\n")
    for fmt in ("qwen3_xml", "seed_oss"):
        text = out if fmt == "qwen3_xml" else out.replace("tool_call>", "seed:tool_call>")
        asm = ToolCallAssembler(WRITE_FILE, fmt)
        asm.feed(text)
        result = asm.finish("length")
        assert result.calls == () and [type(e) for e in result.errors] == [ToolCallTruncatedError]


def test_qwen3_a_parameter_given_twice_is_refused_when_the_tool_declares_none() -> None:
    out = "<tool_call>\n<function=test>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>\n"
    asm = ToolCallAssembler(QWEN_TOOLS, "qwen3_xml")
    asm.feed(out + "</tool_call>")
    (err,) = asm.finish("stop").errors
    assert err.path == "tool_calls[0].arguments.a" and "twice" in err.message
