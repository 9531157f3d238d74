"""Tool-call formats `llama3_json`, `pythonic` and `granite`: vLLM's parser-test cases, never half a call, and the
round trip through each model's own chat template (docs/tool-call-formats.md).

The cases are the model outputs and expected calls of vLLM's tests (vllm-project/vllm,
tests/tool_parsers/test_llama3_json_tool_parser.py, test_pythonic_tool_parser.py,
test_llama4_pythonic_tool_parser.py, test_granite_tool_parser.py), kept as data. Each is fed whole, split at
every character into two chunks, and one character at a time, in both release modes. A case where ctxlock
deliberately answers otherwise carries the reason (`differs`) and asserts ctxlock's answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

import fetched
from ctxlock.errors import ToolCallTruncatedError
from ctxlock.generation.toolcalls import ToolCallAssembler, ToolCallReady
from ctxlock.request import parse_request


@dataclass(frozen=True)
class Case:
    id: str
    output: str
    calls: list[tuple[str, dict[str, Any]]]  # (name, arguments), as vLLM expects them
    content: str  # the text outside calls (vLLM's None is "")
    errors: int = 0  # calls ctxlock refuses (rejected, or unterminated at the end)
    differs: str = ""  # why ctxlock's answer is not vLLM's (empty: the same as vLLM)


def _tools(*names: str) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]


def _feed(fmt: str, tools: Any, chunks: list[str], finish: str | None, release: str) -> tuple[list[Any], Any]:
    asm = ToolCallAssembler(tools, fmt, release=release)
    events: list[Any] = []
    for c in chunks:
        events += asm.feed(c)
    result = asm.finish(finish)
    return events + list(result.events), result


def _check(fmt: str, tools: Any, case: Case, chunks: list[str]) -> None:
    for release in ("finish", "early"):
        events, result = _feed(fmt, tools, chunks, "stop", release)
        got = [(c.name, c.arguments) for c in result.calls]
        assert got == case.calls, (release, chunks)
        assert result.text == case.content, (release, chunks)
        assert len(result.errors) == case.errors, (release, chunks, result.errors)
        for err in result.errors:
            assert err.path.startswith("tool_calls[") and err.hint, err
        if release == "finish":
            assert not any(isinstance(e, ToolCallReady) for e in events[: len(events) - len(result.events)])


def _every_split(fmt: str, tools: Any, case: Case) -> None:
    text = case.output
    _check(fmt, tools, case, [text])
    _check(fmt, tools, case, list(text))
    for k in range(1, len(text)):
        _check(fmt, tools, case, [text[:k], text[k:]])


def _never_half_a_call(fmt: str, tools: Any, text: str, n_calls: int) -> None:
    """Cut anywhere with a length stop: no call, every error truncated (release="early" may have handed out only
    whole calls before the cut); the whole text with a normal end: every call."""
    _, full = _feed(fmt, tools, [text], "stop", "finish")
    assert len(full.calls) == n_calls and full.errors == ()
    whole = [(c.name, c.arguments) for c in full.calls]
    for k in range(len(text)):
        events, result = _feed(fmt, tools, [text[:k]], "length", "finish")
        assert result.calls == () and result.finish_reason == "length", k
        assert not any(isinstance(e, ToolCallReady) for e in events), k
        for err in result.errors:
            assert type(err) is ToolCallTruncatedError and "nothing was executed" in err.hint, (k, err)
        events, result = _feed(fmt, tools, [text[:k]], "length", "early")
        early = [(e.name, e.arguments) for e in events if isinstance(e, ToolCallReady)]
        assert early == whole[: len(early)], k


def _generated(template_name: str, messages: list[dict[str, Any]], tools: Any, end: str) -> str:
    """What the model wrote: the render with the assistant message minus the prompt's render, minus `end`."""
    from ctxlock.artifacts import load_template_file
    from ctxlock.template._render import render

    template = load_template_file(fetched.templates_dir() / template_name)
    full = render(
        parse_request(json.dumps({"messages": messages, "tools": tools}).encode()),
        template,
        add_generation_prompt=False,
    ).text
    prompt = render(parse_request(json.dumps({"messages": messages[:-1], "tools": tools}).encode()), template).text
    assert full.startswith(prompt)
    out = full[len(prompt) :]
    assert out.rstrip().endswith(end), out[-40:]
    return out[: out.rstrip().rindex(end)]


def _assistant(calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
            for k, (n, a) in enumerate(calls)
        ],
    }


USER = {"role": "user", "content": "Weather in Zürich, and search the docs?"}
ROUND_TRIP_CALLS = [
    ("get_weather", {"city": 'Zürich "HB" \\ 天气 🌧', "days": 3, "opts": {"units": ["C", "F"], "raw": None}}),
    ("search_docs", {"query": "tool calls", "filters": {"tags": ["a", "b"], "since": {"year": 2024}}}),
]

# ---------------------------------------------------------------------------------------------------------------
# llama3_json: vLLM tests/tool_parsers/test_llama3_json_tool_parser.py

LLAMA_TOOLS = _tools(
    "getOpenIncidentsTool", "searchTool", "complexTool", "simpleTool", "parserTool", "invalidTool", "toolWithoutParams"
)
_KEEPS_TEXT = "ctxlock keeps the text outside calls; vLLM drops all content once it finds a call"
_Q1 = '{"name": "searchTool", "parameters": {"query": "test1"}}'
_OPEN = '{"name": "getOpenIncidentsTool", "parameters": {}}'
_Q2 = '{"name": "searchTool", "parameters": {"query": "test2"}}'
LLAMA_CASES = [
    Case(
        "simple",
        'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} Would you like to know more?',
        [("getOpenIncidentsTool", {})],
        "Here is the result: Would you like to know more?",
        differs=_KEEPS_TEXT,
    ),
    Case(
        "with_arguments",
        '{"name": "searchTool", "parameters": {"query": "test query", "limit": 10}}',
        [("searchTool", {"query": "test query", "limit": 10})],
        "",
    ),
    Case(
        "no_json", "This is just some text without any tool calls", [], "This is just some text without any tool calls"
    ),
    Case(
        "invalid_json",
        '{"name": "invalidTool", "parameters": {invalid json}',
        [],
        "",
        errors=1,
        differs="the object never closes: an unterminated call (an error), never text; vLLM returns it as content",
    ),
    Case(
        "with_arguments_key",
        '{"name": "searchTool", "arguments": {"query": "test"}}',
        [("searchTool", {"query": "test"})],
        "",
    ),
    Case(
        "multiple_json",
        f"{_Q1}; {_OPEN}; {_Q2}",
        [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}), ("searchTool", {"query": "test2"})],
        "",
    ),
    Case(
        "multiple_json_with_whitespace",
        f"{_Q1} ; {_OPEN} ; {_Q2}",
        [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}), ("searchTool", {"query": "test2"})],
        "",
    ),
    Case(
        "multiple_json_with_surrounding_text",
        f"Here are the results: {_Q1}; {_OPEN}; {_Q2} Would you like to know more?",
        [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}), ("searchTool", {"query": "test2"})],
        "Here are the results: Would you like to know more?",
        differs=_KEEPS_TEXT,
    ),
    Case(
        "deeply_nested_json",
        '{"name": "complexTool", "parameters": {"level1": {"level2": {"level3": {"level4": {"value": "deep"}}}}}}',
        [("complexTool", {"level1": {"level2": {"level3": {"level4": {"value": "deep"}}}}})],
        "",
    ),
    Case(
        "multiple_with_deep_nesting",
        '{"name": "simpleTool", "parameters": {"value": "test"}}; '
        '{"name": "complexTool", "parameters": {"config": {"database": {"connection": {"pool": {"size": 10}}}}}}',
        [
            ("simpleTool", {"value": "test"}),
            ("complexTool", {"config": {"database": {"connection": {"pool": {"size": 10}}}}}),
        ],
        "",
    ),
    Case(
        "quotes_and_brackets_in_string",
        '{"name": "searchTool", "parameters": {"query": "test {value} [complex]",'
        '"nested": {"inner": "more {brackets}"}}}',
        [("searchTool", {"query": "test {value} [complex]", "nested": {"inner": "more {brackets}"}})],
        "",
    ),
    Case(
        "escaped_quotes_in_nested_json",
        '{"name": "parserTool", "parameters": {"text": "He said \\"Hello {world}\\""}}',
        [("parserTool", {"text": 'He said "Hello {world}"'})],
        "",
    ),
    Case("missing_name_key", '{"parameters": {}}', [], '{"parameters": {}}'),
    Case("missing_parameters_and_arguments_key", '{"name": "toolWithoutParams"}', [], '{"name": "toolWithoutParams"}'),
    Case(
        "brace_in_trailing_text",
        '{"name": "searchTool", "parameters": {"query": "test"}} I used {searchTool} for this.',
        [("searchTool", {"query": "test"})],
        "I used {searchTool} for this.",
        differs=_KEEPS_TEXT,
    ),
    Case(
        "json_fragment_in_trailing_text",
        '{"name": "searchTool", "parameters": {"query": "test"}} The arguments I passed were {"query": "test"}',
        [("searchTool", {"query": "test"})],
        'The arguments I passed were {"query": "test"}',
        differs=_KEEPS_TEXT,
    ),
    *[
        Case(
            f"streaming_parallel_separator_{k}",
            _Q1 + sep + _OPEN,
            [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {})],
            "",
        )
        for k, sep in enumerate(["; ", ";", ";\n", "\n"])
    ],
    # vLLM's test_regex_timeout_handling (a mocked regex timeout) has no counterpart: ctxlock's scan is linear.
    # Its input is text here, as there.
    Case("regex_timeout_input", "{hello world[A(A=" + "\t)A(A=,\t" * 2, [], "{hello world[A(A=" + "\t)A(A=,\t" * 2),
    # The <|python_tag|> prefix (the parser's bot token; vLLM's streaming path reads it).
    Case("python_tag", "<|python_tag|>" + _Q1, [("searchTool", {"query": "test1"})], ""),
]


@pytest.mark.parametrize("case", LLAMA_CASES, ids=[c.id for c in LLAMA_CASES])
def test_llama3_json_vllm_cases(case: Case) -> None:
    _every_split("llama3_json", LLAMA_TOOLS, case)


def test_llama3_json_malformed_and_bounded() -> None:
    _, result = _feed("llama3_json", LLAMA_TOOLS, ['{"name": "searchTool", "parameters": {"q": 1,}}'], "stop", "finish")
    assert result.calls == () and "not valid JSON" in result.errors[0].message
    assert result.errors[0].path == "tool_calls[0]"
    _, result = _feed("llama3_json", LLAMA_TOOLS, ["<|python_tag|>brave_search.call(query='x')"], "stop", "finish")
    assert result.calls == () and result.errors[0].path == "tool_calls[0]" and result.text == ""
    big = '{"name": "searchTool", "parameters": {"q": "' + "x" * 200 + '"}} then text'
    asm = ToolCallAssembler(LLAMA_TOOLS, "llama3_json", max_event_size=100)
    for ch in big:
        asm.feed(ch)
    result = asm.finish("stop")
    assert result.calls == () and "max_event_size" in result.errors[0].message and result.text == "then text"


def test_llama3_json_never_half_a_call() -> None:
    _never_half_a_call("llama3_json", LLAMA_TOOLS, f"Sure. <|python_tag|>{_Q1}; {_OPEN}", 2)


@pytest.mark.parametrize(
    "template",
    [
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "meta-llama-Llama-3.3-70B-Instruct.jinja",
    ],
)
def test_llama3_json_template_round_trip(template: str) -> None:
    tools = _tools("get_weather", "search_docs")
    # The Llama 3.x templates write one call per message and raise for more ("only supports single tool-calls").
    with pytest.raises(Exception, match="single tool-call"):
        _generated(template, [USER, _assistant(ROUND_TRIP_CALLS)], tools, "<|eot_id|>")
    for call in ROUND_TRIP_CALLS:
        text = _generated(template, [USER, _assistant([call])], tools, "<|eot_id|>")
        case = Case("round_trip", text, [call], "")
        _check("llama3_json", tools, case, [text])
        _check("llama3_json", tools, case, list(text))


# ---------------------------------------------------------------------------------------------------------------
# pythonic: vLLM tests/tool_parsers/test_pythonic_tool_parser.py and test_llama4_pythonic_tool_parser.py

PY_TOOLS = _tools("get_weather", "register_user", "do_something_cool", "bad", "calc", "f", "g", "foo")
_SF = ("get_weather", {"city": "San Francisco", "metric": "celsius"})
_LA = ("get_weather", {"city": "LA", "metric": "C"})
_MORE = "name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, role=None, passed_test=True, "
_MORE_ARGS = {
    "name": "John Doe",
    "age": 37,
    "address": {"city": "San Francisco", "state": "CA"},
    "role": None,
    "passed_test": True,
    "aliases": ["John", "Johnny"],
}
_MORE_LA = "name='Doe', age=9, address={'city': 'LA', 'state': 'CA'}, role=None, passed_test=True, "
_MORE_LA_ARGS = {**_MORE_ARGS, "name": "Doe", "age": 9, "address": {"city": "LA", "state": "CA"}}
_ESCAPED = r"get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')"
_ESCAPED_ARGS = ("get_weather", {"city": "Martha's Vineyard", "metric": '"cool units"'})
_DOE = ("register_user", {"name": "Doe", "age": 9})
_REFUSED = "the bad call is refused with an error the model can read; vLLM drops it silently"
PY_CASES = [
    Case("no_tool_call", "How can I help you today?", [], "How can I help you today?"),
    Case("simple", "[get_weather(city='San Francisco', metric='celsius')]", [_SF], ""),
    Case("more_types", f"[register_user({_MORE}aliases=['John', 'Johnny'])]", [("register_user", _MORE_ARGS)], ""),
    Case("parameterless", "[get_weather()]", [("get_weather", {})], ""),
    Case("empty_dict", "[do_something_cool(additional_data={})]", [("do_something_cool", {"additional_data": {}})], ""),
    Case("empty_list", "[do_something_cool(steps=[])]", [("do_something_cool", {"steps": []})], ""),
    Case("escaped_string", f"[{_ESCAPED}]", [_ESCAPED_ARGS], ""),
    Case(
        "parallel_calls",
        f"[get_weather(city='San Francisco', metric='celsius'), register_user({_MORE}aliases=['John', 'Johnny'])]",
        [_SF, ("register_user", _MORE_ARGS)],
        "",
    ),
    Case(
        "streaming_large_steps",
        "[get_weather(city='San Francisco', metric='celsius'), get_weather(), do_something_cool(steps=[])]",
        [_SF, ("get_weather", {}), ("do_something_cool", {"steps": []})],
        "",
    ),
    Case("regex_timeout_input", "hello world[A(A=" + "\t)A(A=,\t" * 2, [], "hello world[A(A=" + "\t)A(A=,\t" * 2),
    Case(
        "bad_sibling_call",
        "[bad(x=b'z'), get_weather(city='San Francisco', metric='celsius')]",
        [_SF],
        "",
        errors=1,
        differs=_REFUSED,
    ),
    Case(
        "non_finite_argument",
        "[calc(x=1e999), get_weather(city='San Francisco', metric='celsius')]",
        [_SF],
        "",
        errors=1,
        differs=_REFUSED,
    ),
    Case(
        "good_call_survives_unparsable_sibling",
        "[get_weather(city='San Francisco', metric='celsius'), f(a='x 'y', b='z')]",
        [],
        "",
        errors=1,
        differs="the quotes never balance, so the list never closes: unterminated, no call; vLLM salvages the first",
    ),
    Case(
        "unrecoverable_block",
        "[f(a='x 'y' 'z), g(b='p 'q' 'r)]",
        [],
        "",
        errors=1,
        differs="a closed list that is not valid Python is a refused call; vLLM returns it as content",
    ),
    Case("mismatched_brackets", "[foo(x=1])]", [], "", errors=1, differs=_REFUSED),
    # Llama 4 (llama4_pythonic)
    Case("llama4_simple", "[get_weather(city='LA', metric='C')]", [_LA], ""),
    Case(
        "llama4_more_types",
        f"[register_user({_MORE_LA}aliases=['John', 'Johnny'])]",
        [("register_user", _MORE_LA_ARGS)],
        "",
    ),
    Case("llama4_parallel", "[get_weather(city='LA',metric='C'),register_user(name='Doe',age=9)]", [_LA, _DOE], ""),
    Case("llama4_python_tag", "<|python_start|>[get_weather(city='LA', metric='C')]<|python_end|>", [_LA], ""),
    Case(
        "llama4_python_start_parallel",
        "<|python_start|>[get_weather(city='LA', metric='C'),register_user(name='Doe', age=9)]",
        [_LA, _DOE],
        "",
    ),
    Case(
        "llama4_large_steps",
        "<|python_start|>[get_weather(city='LA', metric='C'), get_weather(), do_something_cool(steps=[])]"
        "<|python_end|>",
        [_LA, ("get_weather", {}), ("do_something_cool", {"steps": []})],
        "",
    ),
    Case(
        "llama4_bad_sibling",
        "<|python_start|>[bad(x=b'z'), get_weather(city='LA', metric='C')]<|python_end|>",
        [_LA],
        "",
        errors=1,
        differs=_REFUSED,
    ),
    Case(
        "llama4_non_finite",
        "<|python_start|>[calc(x=1e999), get_weather(city='LA', metric='C')]<|python_end|>",
        [_LA],
        "",
        errors=1,
        differs=_REFUSED,
    ),
    Case("llama4_mismatched_brackets", "<|python_start|>[foo(x=1])]<|python_end|>", [], "", errors=1, differs=_REFUSED),
]


@pytest.mark.parametrize("case", PY_CASES, ids=[c.id for c in PY_CASES])
def test_pythonic_vllm_cases(case: Case) -> None:
    _every_split("pythonic", PY_TOOLS, case)


@pytest.mark.parametrize(
    ("text", "path", "needle"),
    [
        ("[get_weather('Paris')]", "tool_calls[0].arguments", "positional"),
        ("[get_weather(city=open('x'))]", "tool_calls[0].arguments.city", "not a Python literal"),
        ("[get_weather(city={1: 'a'})]", "tool_calls[0].arguments.city", "not a string"),
        ("[get_weather(city=1j)]", "tool_calls[0].arguments.city", "complex"),
        ("[f(a=" + "-" * 100_000 + "1)]", "tool_calls[0]", "nested too deeply"),
        ("[f(a=" + "[" * 300 + "]" * 300 + ")]", "tool_calls[0]", "too many nested"),
        ("[get_weather(**{'city': 'x'})]", "tool_calls[0].arguments", "**arguments"),
        ("<|python_start|>[get_weather()(city='x')]", "tool_calls[0]", "dotted name"),
        ("<|python_start|>get_weather()", "tool_calls[0]", "expected a list"),
    ],
)
def test_pythonic_malformed_calls_are_refused(text: str, path: str, needle: str) -> None:
    _, result = _feed("pythonic", PY_TOOLS, [text], "stop", "finish")
    assert result.calls == () and result.errors[0].path == path and needle in result.errors[0].message


def test_pythonic_bounded() -> None:
    asm = ToolCallAssembler(PY_TOOLS, "pythonic", max_event_size=100)
    for ch in "[get_weather(city='" + "x" * 200 + "')] after":
        asm.feed(ch)
    result = asm.finish("stop")
    assert result.calls == () and "max_event_size" in result.errors[0].message and result.text == " after"


def test_pythonic_never_half_a_call() -> None:
    text = "<|python_start|>[get_weather(city='LA', metric='C'), register_user(name='Doe', age=9)]<|python_end|>"
    _never_half_a_call("pythonic", PY_TOOLS, text, 2)
    _never_half_a_call("pythonic", PY_TOOLS, "[get_weather(city='LA'), get_weather()]", 2)


def test_pythonic_template_round_trip_lfm2() -> None:
    """LFM2.5's template writes <|tool_call_start|>[f(k='v', ...)]<|tool_call_end|>: strings between single quotes
    (not escaped), mappings as JSON, other values as Python's str()."""
    tools = _tools("get_weather", "search_docs")
    calls = [
        ("get_weather", {"city": "Zürich 天气 🌧", "days": 3, "opts": {"units": ["C", "F"], "raw": None}}),
        ("search_docs", {"query": "tool calls", "tags": ["a", "b"], "exact": True}),
    ]
    text = _generated("LFM2.5-8B-A1B.jinja", [USER, _assistant(calls, "Checking.")], tools, "<|im_end|>")
    assert "<|tool_call_start|>[" in text
    case = Case("round_trip", text, calls, "Checking.")
    _check("pythonic", tools, case, [text])
    _check("pythonic", tools, case, list(text))
    # A quote inside a string is written unescaped: the list no longer parses (or never closes), so no call.
    quoted = [("get_weather", {"city": "Martha's Vineyard"})]
    text = _generated("LFM2.5-8B-A1B.jinja", [USER, _assistant(quoted)], tools, "<|im_end|>")
    _, result = _feed("pythonic", tools, [text], "stop", "finish")
    assert result.calls == () and len(result.errors) == 1


# ---------------------------------------------------------------------------------------------------------------
# granite: vLLM tests/tool_parsers/test_granite_tool_parser.py (with the common cases of common_tests.py)

GRANITE_TOOLS = _tools("get_weather", "get_time", "test_function", "refresh", "func", "b")
_TOKYO = ("get_weather", {"city": "Tokyo"})
_TYPES = {
    "string_field": "hello",
    "int_field": 42,
    "float_field": 3.14,
    "bool_field": True,
    "null_field": None,
    "array_field": ["a", "b", "c"],
    "object_field": {"nested": "value"},
    "empty_array": [],
    "empty_object": {},
}
_ESCAPES = {
    "quoted": 'He said "hello"',
    "path": "C:\\Users\\file.txt",
    "newline": "line1\nline2",
    "unicode": "emoji: 🎉",
}
GRANITE_CASES = [
    Case(
        "no_tool_calls",
        "This is a regular response without any tool calls.",
        [],
        "This is a regular response without any tool calls.",
    ),
    Case("single_tool_call", '<|tool_call|> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]', [_TOKYO], ""),
    Case(
        "parallel_tool_calls",
        '<|tool_call|> [\n  {"name": "get_weather", "arguments": {"city": "Tokyo"}},\n'
        '  {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}\n]',
        [_TOKYO, ("get_time", {"timezone": "Asia/Tokyo"})],
        "",
    ),
    Case(
        "various_data_types",
        "<tool_call> [{\n" + '  "name": "test_function",\n  "arguments": ' + json.dumps(_TYPES, indent=2) + "\n}]",
        [("test_function", _TYPES)],
        "",
    ),
    Case("empty_arguments", '<|tool_call|> [{"name": "refresh", "arguments": {}}]', [("refresh", {})], ""),
    Case(
        "surrounding_text",
        'Let me check the weather for you.\n<|tool_call|> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]\n'
        "I'll get that information.",
        [_TOKYO],
        "Let me check the weather for you.\n\nI'll get that information.",
        differs="vLLM's test expects the call but marks itself xfail (its parser returns none); ctxlock gives the"
        " call and keeps the text",
    ),
    Case(
        "escaped_strings",
        "<tool_call> [{\n"
        + '  "name": "test_function",\n  "arguments": '
        + json.dumps(_ESCAPES, indent=2, ensure_ascii=False)
        + "\n}]",
        [("test_function", _ESCAPES)],
        "",
    ),
    # common_tests.py asserts nothing for its malformed inputs but that nothing raises; these are ctxlock's answers.
    Case("malformed_unclosed", '<|tool_call|> [{"name": "func", "arguments": {', [], "", errors=1),
    Case(
        "malformed_not_a_list",
        '<|tool_call|> {"name": "func", "arguments": {}}',
        [("func", {})],
        "",
        differs="one object after the marker is read as one call (Granite 4's form); vLLM returns it as content",
    ),
    Case(
        "malformed_arguments_not_a_dict",
        '[{"name": "func", "arguments": "not a dict"}]',
        [],
        "",
        errors=1,
        differs='arguments must be a JSON object: refused; vLLM passes "not a dict" on as the arguments',
    ),
    Case("malformed_not_a_call", 'Some text [{"name": "func"}]', [], 'Some text [{"name": "func"}]'),
    Case("token_prefix", '<|tool_call|> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]', [_TOKYO], ""),
    Case("string_prefix", '<tool_call> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]', [_TOKYO], ""),
    Case(
        "parallel_arguments_before_name",
        '<|tool_call|> [{"arguments": {"city": "Tokyo"}, "name": "get_weather"}, '
        '{"arguments": {"timezone": "Asia/Tokyo"}, "name": "get_time"}]',
        [_TOKYO, ("get_time", {"timezone": "Asia/Tokyo"})],
        "",
    ),
    Case(
        "parallel_single_delta",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"x": 42}}, {"name": "b", "arguments": {"y": 7}}]',
        [("get_weather", {"x": 42}), ("b", {"y": 7})],
        "",
    ),
]


@pytest.mark.parametrize("case", GRANITE_CASES, ids=[c.id for c in GRANITE_CASES])
def test_granite_vllm_cases(case: Case) -> None:
    _every_split("granite", GRANITE_TOOLS, case)


# Granite 4 (vLLM tests/tool_parsers/test_granite4_tool_parser.py): `<tool_call> {...} </tool_call>` per call, the
# arguments of find_bbox as a JSON string: the hermes form.
_BBOX = {"coordinates": [[23.54, 43.1], [-12.2, 54.3], [4, 5]], "coordinate_type": "latlong"}
_STOCK = {"symbol": "AAPL", "start_date": "2021-01-01", "end_date": "2021-12-31"}
_G4_TEXTS = [
    "Here goes the bbox call: \n",
    " Now the stock price call: \n ",
    " Now another bbox call: \n ",
    " See? I'm a helpful assistant.",
]


def _g4(name: str, args: Any) -> str:
    return "<tool_call> " + json.dumps({"name": name, "arguments": args}) + " </tool_call>"


GRANITE4_TOOLS = _tools("find_bbox", "get_stock_price")
GRANITE4_CASES = [
    Case(
        "complex",
        _G4_TEXTS[0]
        + _g4("find_bbox", json.dumps(_BBOX))
        + _G4_TEXTS[1]
        + _g4("get_stock_price", _STOCK)
        + _G4_TEXTS[2]
        + _g4("find_bbox", json.dumps(_BBOX))
        + _G4_TEXTS[3],
        [("find_bbox", _BBOX), ("get_stock_price", _STOCK), ("find_bbox", _BBOX)],
        "".join(_G4_TEXTS),
    ),
    Case(
        "content_between_complete_calls",
        _g4("find_bbox", {}) + "some explanation " + _g4("get_stock_price", {}),
        [("find_bbox", {}), ("get_stock_price", {})],
        "some explanation ",
    ),
]


@pytest.mark.parametrize("case", GRANITE4_CASES, ids=[c.id for c in GRANITE4_CASES])
def test_granite4_vllm_cases_read_as_hermes(case: Case) -> None:
    _every_split("hermes", GRANITE4_TOOLS, case)


def test_granite_malformed_and_bounded() -> None:
    _, result = _feed("granite", GRANITE_TOOLS, ["<|tool_call|> hello"], "stop", "finish")
    assert result.calls == () and result.errors[0].path == "tool_calls[0]" and result.text == ""
    _, result = _feed("granite", GRANITE_TOOLS, ["<|tool_call|>[]"], "stop", "finish")
    assert result.calls == () and "empty list" in result.errors[0].message
    asm = ToolCallAssembler(GRANITE_TOOLS, "granite", max_event_size=100)
    for ch in '<|tool_call|>[{"name": "func", "arguments": {"q": "' + "x" * 200 + '"}}] after':
        asm.feed(ch)
    result = asm.finish("stop")
    assert result.calls == () and "max_event_size" in result.errors[0].message and result.text == " after"


def test_granite_never_half_a_call() -> None:
    text = (
        'Checking.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Tokyo"}}, '
        '{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}]'
    )
    _never_half_a_call("granite", GRANITE_TOOLS, text, 2)


def test_granite_template_round_trip() -> None:
    tools = _tools("get_weather", "search_docs")
    # Granite 3.3's template writes an assistant message's content only: its tool_calls are dropped.
    text = _generated(
        "ibm-granite-granite-3.3-2B-Instruct.jinja",
        [USER, _assistant(ROUND_TRIP_CALLS, "Checking.")],
        tools,
        "<|end_of_text|>",
    )
    assert text == "Checking."
    # Granite 4.0 and 4.1 write <tool_call>\n{...}\n</tool_call> per call: the hermes form, which `granite` also reads.
    for template in ("ibm-granite-granite-4.0.jinja", "ibm-granite-granite-4.1.jinja"):
        text = _generated(template, [USER, _assistant(ROUND_TRIP_CALLS, "Checking.")], tools, "<|end_of_text|>")
        # The newlines the template writes before each call are text, as hermes reads them.
        case = Case("round_trip", text, ROUND_TRIP_CALLS, "Checking.\n\n")
        for fmt in ("hermes", "granite"):
            _check(fmt, tools, case, [text])
            _check(fmt, tools, case, list(text))


# pythonic inside LFM2.5's markers: vLLM tests/tool_parsers/test_lfm2_tool_parser.py


def _lfm2(body: str, after: str = "") -> str:
    return f"<|tool_call_start|>[{body}]<|tool_call_end|>" + (f"\n{after}" if after else "")


LFM2_TOOLS = _tools(
    "get_candidate_status",
    "register_user",
    "get_weather",
    "do_something_cool",
    "label",
    "set_date",
    "bash",
    "exec",
    "grocery.orderIngredients",
    "bad",
)
_CAND = "get_candidate_status(candidate_id='12345')"
_CAND_CALL = ("get_candidate_status", {"candidate_id": "12345"})
_DOTTED = (
    "grocery.orderIngredients(ingredientList=[{'name': 'Lasagna noodles', 'amount': 250, 'unit': 'g'}], "
    "deliveryAddress='845 Willow Lane, Springfield, IL 62704')"
)
_DOTTED_CALL = (
    "grocery.orderIngredients",
    {
        "ingredientList": [{"name": "Lasagna noodles", "amount": 250, "unit": "g"}],
        "deliveryAddress": "845 Willow Lane, Springfield, IL 62704",
    },
)
_ECHO = "[grocery.orderIngredients(ingredientList=[{'name': 'apple', 'quantity': '2'}], deliveryAddress='123 Main St')]"
_NOT_PYTHON = "not valid Python: refused; vLLM's lfm2 parser repairs it"
LFM2_CASES = [
    Case("simple", _lfm2(_CAND), [_CAND_CALL], ""),
    Case("more_types", _lfm2(f"register_user({_MORE}aliases=['John', 'Johnny'])"), [("register_user", _MORE_ARGS)], ""),
    Case("parameterless", _lfm2("get_weather()"), [("get_weather", {})], ""),
    Case(
        "empty_dict",
        _lfm2("do_something_cool(additional_data={})"),
        [("do_something_cool", {"additional_data": {}})],
        "",
    ),
    Case("empty_list", _lfm2("do_something_cool(steps=[])"), [("do_something_cool", {"steps": []})], ""),
    Case("escaped_string", _lfm2(_ESCAPED), [_ESCAPED_ARGS], ""),
    Case(
        "parallel_calls",
        _lfm2(f"{_CAND}, register_user({_MORE}aliases=['John', 'Johnny'])"),
        [_CAND_CALL, ("register_user", _MORE_ARGS)],
        "",
    ),
    Case(
        "content_after_tool_call",
        _lfm2(_CAND, "Checking the current status of candidate ID 12345."),
        [_CAND_CALL],
        "\nChecking the current status of candidate ID 12345.",
        differs="ctxlock keeps the newline after <|tool_call_end|> as text; vLLM strips it",
    ),
    Case("dotted_name", _lfm2(_DOTTED), [_DOTTED_CALL], ""),
    Case(
        "bracket_in_string",
        _lfm2("exec(command='grep -F \"]\" log.txt')"),
        [("exec", {"command": 'grep -F "]" log.txt'})],
        "",
    ),
    Case(
        "multiline_string_arg",
        _lfm2("exec(command='cat > f.py << EOF\nimport csv\nprint(1)\nEOF')"),
        [("exec", {"command": "cat > f.py << EOF\nimport csv\nprint(1)\nEOF"})],
        "",
    ),
    Case("set_arg", _lfm2("label(tags={'urgent', 'bug'})"), [("label", {"tags": ["urgent", "bug"]})], ""),
    Case(
        "nested_quote",
        _lfm2("bash(command='sed -n '360,450p' /testbed/sympy/matrices/common.py')"),
        [],
        "",
        errors=1,
        differs=_NOT_PYTHON,
    ),
    Case(
        "nested_python_c",
        _lfm2(
            "bash(command='cd /testbed && python3 -c \"from sympy import latex\nprint(latex(3*x, mul_symbol='\\,'))\"')"
        ),
        [],
        "",
        errors=1,
        differs=_NOT_PYTHON,
    ),
    Case("leading_zero_int", _lfm2("set_date(month=07, day=05)"), [], "", errors=1, differs=_NOT_PYTHON),
    Case("nul_byte_string_arg", _lfm2("exec(command='printf a\x00b')"), [("exec", {"command": "printf a\x00b"})], ""),
    Case("empty_block", _lfm2(""), [], ""),
    Case("empty_block_space", _lfm2(" "), [], ""),
    Case("bad_sibling", _lfm2(f"{_CAND}, bad(x=b'z')"), [_CAND_CALL], "", errors=1, differs=_REFUSED),
    Case("whitespace_after_start_token", f"<|tool_call_start|> [{_CAND}]<|tool_call_end|>", [_CAND_CALL], ""),
    Case(
        "large_steps",
        _lfm2(f"{_CAND}, get_weather(), do_something_cool(steps=[])"),
        [_CAND_CALL, ("get_weather", {}), ("do_something_cool", {"steps": []})],
        "",
    ),
    Case("full_block_and_trailing", _lfm2(_CAND) + "\nDone.", [_CAND_CALL], "\nDone."),
    Case("leading_content_and_block", "Let me check. " + _lfm2(_CAND), [_CAND_CALL], "Let me check. "),
    Case("leading_block_trailing", "Let me check. " + _lfm2(_CAND) + "\nDone.", [_CAND_CALL], "Let me check. \nDone."),
    Case(
        "echoed_tool_call_body",
        f"<|tool_call_start|>{_ECHO}<|tool_call_end|>{_ECHO}<|tool_call_end|>",
        [
            (
                "grocery.orderIngredients",
                {"ingredientList": [{"name": "apple", "quantity": "2"}], "deliveryAddress": "123 Main St"},
            )
        ],
        f"{_ECHO}<|tool_call_end|>",
        differs="the echo after the block is text (one call either way); vLLM drops it as a repeat",
    ),
    Case(
        "char_by_char_multi_dict_list",
        _lfm2(
            'grocery.orderIngredients(ingredientList=[{"name": "apple", "quantity": "2"}, '
            '{"name": "bread", "quantity": "1"}])'
        ),
        [
            (
                "grocery.orderIngredients",
                {"ingredientList": [{"name": "apple", "quantity": "2"}, {"name": "bread", "quantity": "1"}]},
            )
        ],
        "",
    ),
    Case(
        "regex_timeout_input",
        "<|tool_call_start|>[A(A=" + "\t)A(A=,\t" * 2 + "]<|tool_call_end|>",
        [],
        "",
        errors=1,
        differs="vLLM's mocked regex timeout returns it as content; ctxlock reads it as a list that is not valid "
        "Python, and refuses it",
    ),
]


@pytest.mark.parametrize("case", LFM2_CASES, ids=[c.id for c in LFM2_CASES])
def test_pythonic_lfm2_vllm_cases(case: Case) -> None:
    _every_split("pythonic", LFM2_TOOLS, case)
