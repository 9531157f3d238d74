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
from test_toolcalls_template_survey import USER as USER_MSG

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


def unique(cases: list[Case]) -> list[Any]:
    """The cases as pytest params, one per distinct (output, calls, content): vLLM often tests one output both
    streamed and whole; the ids say which of its tests each param stands for."""
    merged: dict[str, tuple[list[str], Case]] = {}
    for case in cases:
        key = repr(case[1:])
        merged.setdefault(key, ([], case))[0].append(case[0])
    return [pytest.param(*case[1:], id="+".join(ids)) for ids, case in merged.values()]


def chunkings(text: str) -> list[list[str]]:
    """Whole, split in two at every index, and one character at a time."""
    return [[text], *([text[:k], text[k:]] for k in range(1, len(text))), list(text)]


def check_case(
    fmt: str,
    tools: list[dict[str, Any]],
    output: str,
    calls: list[tuple[str, Any]],
    content: str,
    *,
    splits: bool = True,
) -> None:
    """The calls and text of `output` in every chunking (`splits=False`: whole and one character at a time only, for
    the long template renders, whose every cut is checked by `check_length_anywhere`)."""
    names = {name for name, _ in calls}
    tools = [t for t in tools if t["function"]["name"] in names]  # only the tools called: compiling them costs
    for chunks in chunkings(output) if splits else [[output], list(output)]:
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


@pytest.mark.parametrize(("output", "calls", "content"), unique(MINIMAX_M2_CASES))
def test_minimax_m2_vllm_cases(output: str, calls: list[tuple[str, Any]], content: str) -> None:
    check_case("minimax_m2", MINIMAX_M2_TOOLS, output, calls, content)


def test_minimax_m2_template_round_trip_and_length_anywhere() -> None:
    text = round_trip("MiniMax-M2.jinja")
    assert text.endswith("</minimax:tool_call>[e~[\n")
    output = text.removesuffix("[e~[\n")  # [e~[ ends the turn: the stop token, never streamed as text
    check_case("minimax_m2", TOOLS, output, EXPECTED_CALLS, "Looking it up.\n", splits=False)
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


# ---------------------------------------------------------------------------------------------------------------
# gemma4: vllm-project/vllm tests/tool_parsers/test_gemma4_tool_parser.py

Q = '<|"|>'  # Gemma 4's string delimiter


def _g(name: str, args: str) -> str:
    return f"<|tool_call>call:{name}{{{args}}}<tool_call|>"


# The argument-syntax unit tests (_parse_gemma4_args, _parse_gemma4_array) as whole calls to `f`.
GEMMA4_ARGS_CASES: list[Case] = [
    ("args_empty_string", _g("f", ""), [("f", {})], ""),
    ("args_whitespace_only", _g("f", "   "), [("f", {})], ""),
    ("args_single_string_value", _g("f", f"location:{Q}Paris{Q}"), [("f", {"location": "Paris"})], ""),
    (
        "args_string_value_with_comma",
        _g("f", f"location:{Q}Paris, France{Q}"),
        [("f", {"location": "Paris, France"})],
        "",
    ),
    (
        "args_multiple_string_values",
        _g("f", f"location:{Q}San Francisco{Q},unit:{Q}celsius{Q}"),
        [("f", {"location": "San Francisco", "unit": "celsius"})],
        "",
    ),
    ("args_integer_value", _g("f", "count:42"), [("f", {"count": 42})], ""),
    ("args_float_value", _g("f", "score:3.14"), [("f", {"score": 3.14})], ""),
    ("args_boolean_true", _g("f", "flag:true"), [("f", {"flag": True})], ""),
    ("args_boolean_false", _g("f", "flag:false"), [("f", {"flag": False})], ""),
    ("args_null_value", _g("f", "param:null"), [("f", {"param": None})], ""),
    (
        "args_mixed_types",
        _g("f", f"name:{Q}test{Q},count:42,active:true,score:3.14"),
        [("f", {"name": "test", "count": 42, "active": True, "score": 3.14})],
        "",
    ),
    ("args_nested_object", _g("f", f"nested:{{inner:{Q}value{Q}}}"), [("f", {"nested": {"inner": "value"}})], ""),
    (
        "args_string_delimited_dict_key",
        _g("f", f"record_map:{{{Q}3{Q}:{Q}new text{Q}}}"),
        [("f", {"record_map": {"3": "new text"}})],
        "",
    ),
    (
        "args_nested_string_delimited_dict_key",
        _g("f", f"outer:{{inner:{{{Q}3{Q}:{Q}new text{Q}}}}}"),
        [("f", {"outer": {"inner": {"3": "new text"}}})],
        "",
    ),
    ("args_array_of_strings", _g("f", f"items:[{Q}a{Q},{Q}b{Q}]"), [("f", {"items": ["a", "b"]})], ""),
    # The non-partial half of test_trailing_dot_float_partial_withheld.
    ("args_trailing_dot_float", _g("f", "left:108.,right:22.8"), [("f", {"left": 108.0, "right": 22.8})], ""),
    ("array_string_array", _g("f", f"items:[{Q}a{Q},{Q}b{Q}]"), [("f", {"items": ["a", "b"]})], ""),
    ("array_empty_array", _g("f", "items:[]"), [("f", {"items": []})], ""),
    ("array_bare_values", _g("f", "items:[42,true,3.14]"), [("f", {"items": [42, True, 3.14]})], ""),
    (
        "array_string_element_with_closing_bracket",
        _g("f", f"items:[[{Q}a]b{Q},{Q}c{Q}],{Q}tail{Q}]"),
        [("f", {"items": [["a]b", "c"], "tail"]})],
        "",
    ),
]
# The extraction and streaming tests: whole model outputs.
GEMMA4_OUTPUT_CASES: list[Case] = [
    ("no_tool_calls", "Hello, how can I help you today?", [], "Hello, how can I help you today?"),
    ("single_tool_call", _g("get_weather", f"location:{Q}London{Q}"), [("get_weather", {"location": "London"})], ""),
    (
        "multiple_arguments",
        _g("get_weather", f"location:{Q}San Francisco{Q},unit:{Q}celsius{Q}"),
        [("get_weather", {"location": "San Francisco", "unit": "celsius"})],
        "",
    ),
    (
        "multiple_tool_calls",
        _g("get_weather", f"location:{Q}London{Q}") + _g("get_time", f"location:{Q}London{Q}"),
        [("get_weather", {"location": "London"}), ("get_time", {"location": "London"})],
        "",
    ),
    (
        "nested_arguments",
        _g("complex_function", f"nested:{{inner:{Q}value{Q}}},list:[{Q}a{Q},{Q}b{Q}]"),
        [("complex_function", {"nested": {"inner": "value"}, "list": ["a", "b"]})],
        "",
    ),
    (
        "tool_call_with_number_and_boolean",
        _g("set_status", "is_active:true,count:42,score:3.14"),
        [("set_status", {"is_active": True, "count": 42, "score": 3.14})],
        "",
    ),
    (
        "hyphenated_function_name",
        _g("get-weather", f"location:{Q}London{Q}"),
        [("get-weather", {"location": "London"})],
        "",
    ),
    (
        "dotted_function_name",
        _g("weather.get", f"location:{Q}London{Q}"),
        [("weather.get", {"location": "London"})],
        "",
    ),
    ("no_arguments", _g("get_status", ""), [("get_status", {})], ""),
    (
        "streaming_basic_single_tool",
        _g("get_weather", f"location:{Q}Paris, France{Q}"),
        [("get_weather", {"location": "Paris, France"})],
        "",
    ),
    (
        "streaming_multi_arg",
        _g("get_weather", f"location:{Q}Tokyo{Q},unit:{Q}celsius{Q}"),
        [("get_weather", {"location": "Tokyo", "unit": "celsius"})],
        "",
    ),
    (
        "streaming_no_extra_brace",
        _g("get_weather", f"location:{Q}London{Q}"),
        [("get_weather", {"location": "London"})],
        "",
    ),
    (
        "streaming_no_unquoted_keys",
        _g("get_weather", f"location:{Q}Paris{Q}"),
        [("get_weather", {"location": "Paris"})],
        "",
    ),
    (
        "streaming_name_no_call_prefix",
        _g("get_weather", f"location:{Q}Paris{Q}"),
        [("get_weather", {"location": "Paris"})],
        "",
    ),
    (
        "streaming_text_before_tool_call",
        "Let me check the weather. " + _g("get_weather", f"location:{Q}London{Q}"),
        [("get_weather", {"location": "London"})],
        "Let me check the weather. ",
    ),
    (
        "streaming_numeric_args",
        _g("set_config", "count:42,active:true"),
        [("set_config", {"count": 42, "active": True})],
        "",
    ),
    (
        "streaming_boolean_split_across_chunks",
        _g("search", "input:{all:true}"),
        [("search", {"input": {"all": True}})],
        "",
    ),
    ("streaming_false_split_across_chunks", _g("set", "flag:false"), [("set", {"flag": False})], ""),
    ("streaming_number_split_across_chunks", _g("set", "count:42"), [("set", {"count": 42})], ""),
    ("streaming_empty_args", _g("get_status", ""), [("get_status", {})], ""),
    (
        "streaming_split_delimiter_no_invalid_json",
        _g("todowrite", f"content:{Q}Buy milk{Q}"),
        [("todowrite", {"content": "Buy milk"})],
        "",
    ),
    (
        "streaming_does_not_duplicate_plain_text_after_tool_call",
        _g("get_weather", f"location:{Q}Paris{Q}") + "<div>",
        [("get_weather", {"location": "Paris"})],
        "<div>",
    ),
    (
        "streaming_html_argument_does_not_duplicate_tag_prefixes",
        _g(
            "write_file",
            f'path:{Q}index.html{Q},content:{Q}<!DOCTYPE html>\n<html lang="zh-CN">\n<head>\n'
            f'    <meta charset="UTF-8">\n    <meta name="viewport" content="width=device-width">\n{Q}',
        ),
        [
            (
                "write_file",
                {
                    "path": "index.html",
                    "content": '<!DOCTYPE html>\n<html lang="zh-CN">\n<head>\n    <meta charset="UTF-8">\n'
                    '    <meta name="viewport" content="width=device-width">\n',
                },
            )
        ],
        "",
    ),
    (
        "streaming_trailing_bare_bool_not_duplicated",
        _g("Edit", f"file_path:{Q}src/env.py{Q},old_string:{Q}old_val{Q},new_string:{Q}new_val{Q},replace_all:false"),
        [("Edit", {"file_path": "src/env.py", "old_string": "old_val", "new_string": "new_val", "replace_all": False})],
        "",
    ),
]
GEMMA4_CASES = GEMMA4_ARGS_CASES + GEMMA4_OUTPUT_CASES
GEMMA4_TOOLS = loose(*sorted({name for case in GEMMA4_CASES for name, _ in case[2]}))


@pytest.mark.parametrize(("output", "calls", "content"), unique(GEMMA4_CASES))
def test_gemma4_vllm_cases(output: str, calls: list[tuple[str, Any]], content: str) -> None:
    check_case("gemma4", GEMMA4_TOOLS, output, calls, content)


# Where ctxlock deliberately differs from vLLM (docs/tool-call-formats.md, gemma4): (id, output, vLLM's calls and
# content, ctxlock's content, the needle of ctxlock's error).
GEMMA4_DIFFERENCES = [
    # vLLM strips the content before a call (non-streaming only); ctxlock passes text through unchanged.
    (
        "text_before_tool_call",
        "Let me check the weather for you. " + _g("get_weather", f"location:{Q}Paris{Q}"),
        "Let me check the weather for you.",
        "Let me check the weather for you. ",
        None,
    ),
    # No <tool_call|>: vLLM gives the output back as content; ctxlock reports an unterminated call, never text.
    ("incomplete_tool_call", f"<|tool_call>call:get_weather{{location:{Q}London", "(the output)", "", "<tool_call|>"),
    # vLLM takes the rest of an unterminated string; here the string swallows }<tool_call|>: the call never ends.
    ("args_unterminated_string", _g("f", f"key:{Q}unterminated"), "{'key': 'unterminated'}", "", "<tool_call|>"),
    # vLLM makes a missing value ""; ctxlock refuses the call.
    ("args_empty_value", _g("f", "key:"), "{'key': ''}", "", "a value is missing"),
    ("args_malformed_partial_array", _g("f", ":[t:[]"), "some dict", "", "expected key:value"),
    # vLLM stops the array at a stray ]; ctxlock refuses the text after it.
    ("array_stray_closing_bracket", _g("f", "items:[42,]trailing]"), "{'items': [42]}", "", "expected , or }"),
]


@pytest.mark.parametrize(("case_id", "output", "vllm", "content", "needle"), GEMMA4_DIFFERENCES)
def test_gemma4_deliberate_differences(case_id: str, output: str, vllm: str, content: str, needle: str | None) -> None:
    for chunks in chunkings(output):
        _, result = run("gemma4", loose("f", "get_weather"), chunks, "stop")
        assert result.text == content
        if needle is None:
            assert [c.name for c in result.calls] == ["get_weather"] and result.ok
        else:
            (err,) = result.errors
            assert result.calls == () and needle in err.message + err.hint, err


def _gemma4_round_trip(template: str) -> str:
    """The model's part: past the generation prompt's `<|turn>model\\n` (the prompt adds an empty thought channel
    that the history turn omits), minus the end of the turn."""
    from test_toolcalls_template_survey import _render

    from ctxlock.artifacts import load_template_file

    path = fetched.templates_dir() / template
    full = _render(path, load_template_file(path), [USER_MSG, ASSISTANT], prompt=False)
    return full[full.rindex("<|turn>model\n") + len("<|turn>model\n") :]


@pytest.mark.parametrize(
    ("template", "end"),
    [("google-gemma-4-31B-it.jinja", "<|tool_response>"), ("google-gemma-4-31B-it-interleaved.jinja", "<turn|>\n")],
)
def test_gemma4_template_round_trip_and_length_anywhere(template: str, end: str) -> None:
    text = _gemma4_round_trip(template)
    assert text.endswith(end)
    output = text.removesuffix(end)  # the end of the turn: a stop token, never streamed as text
    check_case("gemma4", TOOLS, output, EXPECTED_CALLS, "Looking it up.", splits=False)
    check_length_anywhere("gemma4", TOOLS, output, 2)


def test_gemma4_none_is_null_and_close_marker_inside_a_string_is_text() -> None:
    out = _g("f", f"a:None,b:{Q}x<tool_call|>y{Q},c:1e3,d:-2") + "after"
    _, result = run("gemma4", loose("f"), [out], "stop")
    assert [c.arguments for c in result.calls] == [{"a": None, "b": "x<tool_call|>y", "c": 1000.0, "d": -2}]
    assert result.text == "after"


@pytest.mark.parametrize(
    ("output", "path", "needle"),
    [
        ("<|tool_call>get_weather{}<tool_call|>", "tool_calls[0].name", "call:NAME"),
        (_g("f", "a:1,a:2"), "tool_calls[0].arguments", "twice"),
        (_g("f", f"a:{Q}x{Q} b:2"), "tool_calls[0].arguments", "expected , or }"),
        ("<|tool_call>call:f{a:1}junk<tool_call|>", "tool_calls[0].arguments", "junk"),
        (_g("f", "a:" + "[" * 300 + "]" * 300), "tool_calls[0].arguments", "nested deeper"),
        (_g("nope", ""), "tool_calls[0].name", "nope"),
    ],
)
def test_gemma4_malformed_calls_are_refused_with_a_path(output: str, path: str, needle: str) -> None:
    _, result = run("gemma4", loose("f"), [output], "stop")
    assert result.calls == ()
    (err,) = result.errors
    assert path in err.path and needle in err.message + err.path and err.hint


def test_gemma4_a_call_longer_than_max_event_size_is_refused_not_buffered() -> None:
    big = _g("f", f"k:{Q}{'x' * 500}{Q}") + _g("f", "k:1")
    asm = ToolCallAssembler(loose("f"), "gemma4", max_event_size=100)
    for ch in big:
        asm.feed(ch)
    result = asm.finish("stop")
    assert [c.arguments for c in result.calls] == [{"k": 1}]
    (err,) = result.errors
    assert "max_event_size" in err.message and err.path == "tool_calls[0]"


# ---------------------------------------------------------------------------------------------------------------
# apertus: vllm-project/vllm tests/tool_parsers/test_apertus_tool_parser.py


def _ap(calls: str, suffix: bool = True) -> str:
    return f"<|tools_prefix|>[{calls}]" + ("<|tools_suffix|>" if suffix else "")


APERTUS_CASES: list[Case] = [
    ("no_tool_calls", "Hello, how can I help you today?", [], "Hello, how can I help you today?"),
    ("single_tool_call", _ap('{"get_weather": {"location": "London"}}'), [("get_weather", {"location": "London"})], ""),
    (
        "multiple_arguments",
        _ap('{"get_weather": {"location": "San Francisco", "unit": "celsius"}}'),
        [("get_weather", {"location": "San Francisco", "unit": "celsius"})],
        "",
    ),
    (
        "multiple_tool_calls",
        _ap('{"get_weather": {"location": "London"}}, {"get_time": {"location": "London"}}'),
        [("get_weather", {"location": "London"}), ("get_time", {"location": "London"})],
        "",
    ),
    (
        "nested_arguments",
        _ap('{"complex_function": {"nested": {"inner": "value"}, "list": ["a", "b"]}}'),
        [("complex_function", {"nested": {"inner": "value"}, "list": ["a", "b"]})],
        "",
    ),
    (
        "missing_tool_suffix",
        _ap('{"get_weather": {"location": "San Francisco", "unit": "celsius"}}', suffix=False),
        [("get_weather", {"location": "San Francisco", "unit": "celsius"})],
        "",
    ),
    (
        "streaming_basic_single_tool",
        _ap('{"get_weather": {"location": "Paris, France"}}'),
        [("get_weather", {"location": "Paris, France"})],
        "",
    ),
    (
        "streaming_missing_tool_suffix",
        _ap('{"get_weather": {"location": "Paris, France"}}', suffix=False),
        [("get_weather", {"location": "Paris, France"})],
        "",
    ),
    (
        "streaming_partial_tag_buffering_missing_tool_suffix",
        "Content" + _ap('{"f": {"a": 1}}', suffix=False),
        [("f", {"a": 1})],
        "Content",
    ),
    (
        "streaming_multi_tool",
        _ap('{"get_weather": {"location": "Tokyo"}}, {"get_time": {"location": "Tokyo"}}'),
        [("get_weather", {"location": "Tokyo"}), ("get_time", {"location": "Tokyo"})],
        "",
    ),
    (
        "streaming_text_before_tool_call",
        "Let me check the weather. " + _ap('{"get_weather": {"location": "London"}}'),
        [("get_weather", {"location": "London"})],
        "Let me check the weather. ",
    ),
    ("streaming_partial_tag_buffering", "Content" + _ap('{"f": {"a": 1}}'), [("f", {"a": 1})], "Content"),
    (
        "mtp_streaming_massive_chunk",
        "Sure! " + _ap('{"get_weather": {"location": "London"}}'),
        [("get_weather", {"location": "London"})],
        "Sure! ",
    ),
    (
        "mtp_streaming_multiple_tools_burst",
        _ap('{"get_weather": {"location": "London"}}, {"get_time": {"location": "Paris"}}'),
        [("get_weather", {"location": "London"}), ("get_time", {"location": "Paris"})],
        "",
    ),
    (
        "mtp_streaming_skip_and_catch_up",
        _ap('{"t1": {"a": 1}}, {"t2": {"b": 2}}, {"t3": {"c": 3}}'),
        [("t1", {"a": 1}), ("t2", {"b": 2}), ("t3", {"c": 3})],
        "",
    ),
    (
        "vllm_streaming_character_by_character",
        "Hi " + _ap('{"get_weather": {"location": "London"}}') + " ",
        [("get_weather", {"location": "London"})],
        "Hi  ",
    ),
    (
        "vllm_streaming_empty_deltas",
        "Wait" + _ap('{"get_weather": {"location": "London"}}'),
        [("get_weather", {"location": "London"})],
        "Wait",
    ),
]
APERTUS_TOOLS = loose(*sorted({name for case in APERTUS_CASES for name, _ in case[2]}))


@pytest.mark.parametrize(("output", "calls", "content"), unique(APERTUS_CASES))
def test_apertus_vllm_cases(output: str, calls: list[tuple[str, Any]], content: str) -> None:
    check_case("apertus", APERTUS_TOOLS, output, calls, content)


def test_apertus_vllm_empty_deltas_are_fed_as_they_come() -> None:
    chunks = [
        "Wait",
        "",
        "<|tools_prefix|>",
        "",
        '[{"get_weather": ',
        "",
        '{"location": "London"}}]',
        "<|tools_suffix|>",
    ]
    _, result = run("apertus", APERTUS_TOOLS, chunks, "stop")
    assert result.text == "Wait" and [c.arguments for c in result.calls] == [{"location": "London"}]


def test_apertus_deliberate_differences() -> None:
    # test_text_before_tool_call: vLLM's non-streaming reader strips the text ("Let me check the weather for you.");
    # ctxlock passes it through unchanged.
    out = "Let me check the weather for you. " + _ap('{"get_weather": {"location": "Paris"}}')
    for chunks in chunkings(out):
        _, result = run("apertus", APERTUS_TOOLS, chunks, "stop")
        assert result.text == "Let me check the weather for you. " and [c.name for c in result.calls] == ["get_weather"]
    # test_incomplete_tool_call: vLLM completes the cut-off JSON and releases {"location": "London"}; ctxlock reports
    # the array as unterminated and releases nothing.
    out = '<|tools_prefix|>[{"get_weather": {"location": "London"}'
    for chunks in chunkings(out):
        _, result = run("apertus", APERTUS_TOOLS, chunks, "stop")
        (err,) = result.errors
        assert result.calls == () and result.text == "" and "before the array of calls closed" in err.message


def test_apertus_template_round_trip_and_length_anywhere() -> None:
    output = round_trip("Apertus-8B-Instruct.jinja")
    assert output.endswith("<|tools_suffix|>")  # the template ends the turn there; the model stops after it
    check_case("apertus", TOOLS, output, EXPECTED_CALLS, "Looking it up.", splits=False)
    check_length_anywhere("apertus", TOOLS, output, 2)


@pytest.mark.parametrize(
    ("output", "path", "needle"),
    [
        ("<|tools_prefix|>{}", "tool_calls[0]", "expected ["),
        (_ap(""), "tool_calls[0]", "empty list"),
        (_ap('{"f": {}, "g": {}}'), "tool_calls[0]", "2 keys"),
        (_ap('{"f": "x"}'), "tool_calls[0].arguments", "string"),
        (_ap('{"f": {"a": NaN}}'), "tool_calls[0]", "JSON"),
        (_ap('{"f": {}}, {"nope": {}}'), "tool_calls[1].name", "nope"),
    ],
)
def test_apertus_malformed_calls_are_refused_with_a_path(output: str, path: str, needle: str) -> None:
    _, result = run("apertus", loose("f"), [output], "stop")
    err = result.errors[-1]
    assert path in err.path and needle in err.message + err.path and err.hint


def test_apertus_calls_longer_than_max_event_size_are_refused_not_buffered() -> None:
    big = _ap('{"f": {"k": "' + "x" * 500 + '"}}') + "then " + _ap('{"f": {"k": "y"}}')
    asm = ToolCallAssembler(loose("f"), "apertus", max_event_size=100)
    for ch in big:
        asm.feed(ch)
    result = asm.finish("stop")
    assert [c.arguments for c in result.calls] == [{"k": "y"}] and result.text == "then "
    (err,) = result.errors
    assert "max_event_size" in err.message and err.path == "tool_calls[0]"


# ---------------------------------------------------------------------------------------------------------------
# lfm2: vllm-project/vllm tests/tool_parsers/test_lfm2_tool_parser.py

LFM2_START, LFM2_END = "<|tool_call_start|>", "<|tool_call_end|>"
SIMPLE = "get_candidate_status(candidate_id='12345')"
SIMPLE_CALL = ("get_candidate_status", {"candidate_id": "12345"})
MORE_TYPES = (
    "register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, role=None, "
    "passed_test=True, aliases=['John', 'Johnny'])"
)
MORE_TYPES_CALL = (
    "register_user",
    {
        "name": "John Doe",
        "age": 37,
        "address": {"city": "San Francisco", "state": "CA"},
        "role": None,
        "passed_test": True,
        "aliases": ["John", "Johnny"],
    },
)
DOTTED = (
    "grocery.orderIngredients(ingredientList=[{'name': 'Lasagna noodles', 'amount': 250, 'unit': 'g'}], "
    "deliveryAddress='845 Willow Lane, Springfield, IL 62704')"
)
DOTTED_CALL = (
    "grocery.orderIngredients",
    {
        "ingredientList": [{"name": "Lasagna noodles", "amount": 250, "unit": "g"}],
        "deliveryAddress": "845 Willow Lane, Springfield, IL 62704",
    },
)


def _lf(calls: str, after: str = "") -> str:
    return f"{LFM2_START}[{calls}]{LFM2_END}" + (f"\n{after}" if after else "")


LFM2_CASES: list[Case] = [
    ("no_tool_call", "How can I help you today?", [], "How can I help you today?"),
    ("simple", _lf(SIMPLE), [SIMPLE_CALL], ""),
    ("more_types", _lf(MORE_TYPES), [MORE_TYPES_CALL], ""),
    ("parameterless", _lf("get_weather()"), [("get_weather", {})], ""),
    ("empty_dict", _lf("do_something_cool(additional_data={})"), [("do_something_cool", {"additional_data": {}})], ""),
    ("empty_list", _lf("do_something_cool(steps=[])"), [("do_something_cool", {"steps": []})], ""),
    (
        "escaped_string",
        _lf(r"""get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')"""),
        [("get_weather", {"city": "Martha's Vineyard", "metric": '"cool units"'})],
        "",
    ),
    ("parallel_calls", _lf(f"{SIMPLE}, {MORE_TYPES}"), [SIMPLE_CALL, MORE_TYPES_CALL], ""),
    ("dotted_name", _lf(DOTTED), [DOTTED_CALL], ""),
    (
        "bracket_in_string",
        _lf("""exec(command='grep -F "]" log.txt')"""),
        [("exec", {"command": 'grep -F "]" log.txt'})],
        "",
    ),
    (
        "multiline_string_arg",
        _lf("exec(command='cat > f.py << EOF\nimport csv\nprint(1)\nEOF')"),
        [("exec", {"command": "cat > f.py << EOF\nimport csv\nprint(1)\nEOF"})],
        "",
    ),
    ("set_arg", _lf("label(tags={'urgent', 'bug'})"), [("label", {"tags": ["urgent", "bug"]})], ""),
    ("nul_byte_string_arg", _lf("exec(command='printf a\x00b')"), [("exec", {"command": "printf a\x00b"})], ""),
    ("empty_tool_call_block", _lf(""), [], ""),
    ("empty_tool_call_block_space", _lf(" "), [], ""),
    ("whitespace_after_start_token", f"{LFM2_START} [{SIMPLE}]{LFM2_END}", [SIMPLE_CALL], ""),
    (
        "streaming_tool_call_with_large_steps",
        _lf(f"{SIMPLE}, get_weather(), do_something_cool(steps=[])"),
        [SIMPLE_CALL, ("get_weather", {}), ("do_something_cool", {"steps": []})],
        "",
    ),
    ("streaming_full_block_and_trailing_in_single_delta", _lf(SIMPLE, "Done."), [SIMPLE_CALL], "\nDone."),
    ("streaming_leading_content_and_full_block", "Let me check. " + _lf(SIMPLE), [SIMPLE_CALL], "Let me check. "),
    (
        "streaming_leading_block_and_trailing",
        "Let me check. " + _lf(SIMPLE, "Done."),
        [SIMPLE_CALL],
        "Let me check. \nDone.",
    ),
    (
        "streaming_char_by_char_multi_dict_list",
        _lf(
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
    ("streaming_dotted_name_in_single_delta", _lf(DOTTED), [DOTTED_CALL], ""),
]
LFM2_TOOLS = loose(*sorted({name for case in LFM2_CASES for name, _ in case[2]}), "bad", "bash", "set_date")


@pytest.mark.parametrize(("output", "calls", "content"), unique(LFM2_CASES))
def test_lfm2_vllm_cases(output: str, calls: list[tuple[str, Any]], content: str) -> None:
    check_case("lfm2", LFM2_TOOLS, output, calls, content)


def test_lfm2_bad_sibling_call_does_not_drop_good_calls() -> None:
    """vLLM's case: the good call is released; ctxlock also reports the bad one (bytes are no JSON value)."""
    for chunks in chunkings(_lf(f"{SIMPLE}, bad(x=b'z')")):
        _, result = run("lfm2", LFM2_TOOLS, chunks, "stop")
        assert [(c.name, c.arguments) for c in result.calls] == [SIMPLE_CALL]
        (err,) = result.errors
        assert err.path == "tool_calls[1].arguments.x" and "bytes" in err.message


ECHOED = (
    "[grocery.orderIngredients(ingredientList=[{'name': 'apple', 'quantity': '2'}], deliveryAddress='123 Main St')]"
)
# Where ctxlock deliberately differs (docs/tool-call-formats.md, lfm2): (id, output, vLLM's answer, ctxlock's text,
# the needle of ctxlock's error or None).
LFM2_DIFFERENCES = [
    # vLLM's non-streaming reader strips the text after the block; ctxlock passes it through unchanged.
    (
        "content_after_tool_call",
        _lf(SIMPLE, "Checking the current status of candidate ID 12345."),
        "content 'Checking the current status of candidate ID 12345.'",
        "\nChecking the current status of candidate ID 12345.",
        None,
    ),
    # A quote of the string's own kind inside it: vLLM guesses where the string ends; ctxlock refuses.
    (
        "nested_quote",
        _lf("bash(command='sed -n '360,450p' /testbed/sympy/matrices/common.py')"),
        "{'command': \"sed -n '360,450p' /testbed/sympy/matrices/common.py\"}",
        "",
        "not a Python list",
    ),
    (
        "nested_python_c",
        _lf(
            "bash(command='cd /testbed && python3 -c \"from sympy import latex\nprint(latex(3*x, mul_symbol='\\,'))\"')"
        ),
        "the command with its inner quotes",
        "",
        "not a Python list",
    ),
    # 07 is not a Python 3 number: vLLM reads 7; ctxlock refuses.
    ("leading_zero_int", _lf("set_date(month=07, day=05)"), "{'month': 7, 'day': 5}", "", "not a Python list"),
    # The body echoed after the block with a second end token: vLLM drops it; ctxlock passes it through as text
    # (there is no start token, so it is no call).
    (
        "echoed_tool_call_body",
        f"{LFM2_START}{ECHOED}{LFM2_END}{ECHOED}{LFM2_END}",
        "content ''",
        f"{ECHOED}{LFM2_END}",
        None,
    ),
]


@pytest.mark.parametrize(("case_id", "output", "vllm", "content", "needle"), LFM2_DIFFERENCES)
def test_lfm2_deliberate_differences(case_id: str, output: str, vllm: str, content: str, needle: str | None) -> None:
    for chunks in chunkings(output):
        _, result = run("lfm2", LFM2_TOOLS, chunks, "stop")
        assert result.text == content
        if needle is None:
            assert len(result.calls) == 1 and result.ok
        else:
            (err,) = result.errors
            assert result.calls == () and needle in err.message, err


def test_lfm2_template_round_trip_and_length_anywhere() -> None:
    text = round_trip("LFM2.5-8B-A1B.jinja")
    assert text.endswith(f"{LFM2_END}<|im_end|>\n")
    output = text.removesuffix("<|im_end|>\n")  # <|im_end|> is the stop token, never streamed as text
    # The template writes strings between quotes unescaped: the raw newline of the query is read back as one.
    assert "query='line one\nline two" in output
    check_case("lfm2", TOOLS, output, EXPECTED_CALLS, "Looking it up.", splits=False)
    check_length_anywhere("lfm2", TOOLS, output, 2)


@pytest.mark.parametrize(
    ("output", "path", "needle"),
    [
        (_lf("get_weather('Paris')"), "tool_calls[0].arguments", "by keyword"),
        (_lf("get_weather(**x)"), "tool_calls[0].arguments", "unpacking"),
        (_lf("get_weather(city=open('f'))"), "tool_calls[0].arguments.city", "Call is not a literal"),
        (_lf("get_weather(city={1: 'a'})"), "tool_calls[0].arguments.city", "keys must be strings"),
        (_lf("get_weather(city=-'a')"), "tool_calls[0].arguments.city", "number only"),
        (_lf("'text'"), "tool_calls[0]", "each item must be a call"),
        (f"{LFM2_START}get_weather(){LFM2_END}", "tool_calls[0]", "must be a list"),
        (_lf("get_weather(x=" + "[" * 300 + "]" * 300 + ")"), "tool_calls[0]", "nest"),
        (_lf("nope()"), "tool_calls[0].name", "nope"),
    ],
)
def test_lfm2_malformed_calls_are_refused_with_a_path(output: str, path: str, needle: str) -> None:
    _, result = run("lfm2", loose("get_weather"), [output], "stop")
    assert result.calls == ()
    (err,) = result.errors
    assert path in err.path and needle in err.message + err.path and err.hint


def test_lfm2_a_block_longer_than_max_event_size_is_refused_not_buffered() -> None:
    big = _lf("get_weather(city='" + "x" * 500 + "')") + "then " + _lf("get_weather(city='y')")
    asm = ToolCallAssembler(loose("get_weather"), "lfm2", max_event_size=100)
    for ch in big:
        asm.feed(ch)
    result = asm.finish("stop")
    assert [c.arguments for c in result.calls] == [{"city": "y"}] and result.text == "then "
    (err,) = result.errors
    assert "max_event_size" in err.message and err.path == "tool_calls[0]"


# ---------------------------------------------------------------------------------------------------------------
# gigachat3: vllm-project/vllm tests/tool_parsers/test_gigachat3_tool_parser.py

GC3_HEADER = "<|message_sep|>\n\nfunction call<|role_sep|>\n"
GC31_HEADER = "<|function_call|>"
GC_SIMPLE = {"action": "create", "id": "preferences"}
GC_COMPLEX = {
    "action": "create",
    "id": "preferences",
    "content": {"short_answers": True, "hate_emojis": True, "english_ui": False, "russian_math_explanations": True},
}
GC_CONTENT = "I'll check that for you."


def _gc(args: dict[str, Any]) -> str:
    return json.dumps({"name": "manage_user_memory", "arguments": args}, ensure_ascii=False)


GIGACHAT3_CASES: list[Case] = [("no_tool_call", "How can I help you today?", [], "How can I help you today?")]
for _tag, _header in (("gigachat3", GC3_HEADER), ("gigachat31", GC31_HEADER)):
    GIGACHAT3_CASES += [
        (f"simple_{_tag}", _header + _gc(GC_SIMPLE), [("manage_user_memory", GC_SIMPLE)], ""),
        (f"parameterless_{_tag}", _header + _gc({}), [("manage_user_memory", {})], ""),
        (f"complex_{_tag}", _header + _gc(GC_COMPLEX), [("manage_user_memory", GC_COMPLEX)], ""),
        (
            f"mixed_content_{_tag}",
            GC_CONTENT + _header + _gc(GC_SIMPLE),
            [("manage_user_memory", GC_SIMPLE)],
            GC_CONTENT,
        ),
        (
            f"mixed_content_with_eos_{_tag}",
            GC_CONTENT + _header + _gc(GC_SIMPLE) + "</s>",
            [("manage_user_memory", GC_SIMPLE)],
            GC_CONTENT,
        ),
        (
            f"streaming_tool_call_with_large_steps_{_tag}",
            GC_CONTENT + _header + _gc(GC_COMPLEX),
            [("manage_user_memory", GC_COMPLEX)],
            GC_CONTENT,
        ),
    ]


@pytest.mark.parametrize(("output", "calls", "content"), unique(GIGACHAT3_CASES))
def test_gigachat3_vllm_cases(output: str, calls: list[tuple[str, Any]], content: str) -> None:
    check_case("gigachat3", loose("manage_user_memory"), output, calls, content)


@pytest.mark.parametrize("template", ["GigaChat3-10B-A1.8B.jinja", "GigaChat3.1-10B-A1.8B.jinja"])
def test_gigachat3_template_round_trip_and_length_anywhere(template: str) -> None:
    """The templates write the first call of a turn only: the second call of the message is lost in the render."""
    text = round_trip(template)
    assert text.endswith("}<|message_sep|>\n\n") and "search_docs" not in text
    output = text.removesuffix("<|message_sep|>\n\n")  # the end of the message: the model stops there
    check_case("gigachat3", TOOLS, output, EXPECTED_CALLS[:1], "Looking it up.", splits=False)
    check_length_anywhere("gigachat3", TOOLS, output, 1)
    # Two calls one after another (as a model may write them) are read as two.
    two = output + GC31_HEADER + json.dumps({"name": "search_docs", "arguments": EXPECTED_CALLS[1][1]})
    check_case("gigachat3", TOOLS, two, EXPECTED_CALLS, "Looking it up.", splits=False)
    check_length_anywhere("gigachat3", TOOLS, two, 2)


@pytest.mark.parametrize(
    ("output", "path", "needle"),
    [
        (GC31_HEADER + "[1]", "tool_calls[0]", "expected a JSON object"),
        (GC31_HEADER + '{"name": "f", "arguments": {"a": NaN}}', "tool_calls[0]", "JSON"),
        (GC31_HEADER + '{"name": "f"}', "tool_calls[0].arguments", 'no "arguments"'),
        (GC3_HEADER + '{"name": "nope", "arguments": {}}', "tool_calls[0].name", "nope"),
    ],
)
def test_gigachat3_malformed_calls_are_refused_with_a_path(output: str, path: str, needle: str) -> None:
    _, result = run("gigachat3", loose("f"), [output], "stop")
    assert result.calls == ()
    err = result.errors[0]
    assert path in err.path and needle in err.message + err.path and err.hint


def test_gigachat3_a_call_longer_than_max_event_size_is_refused_not_buffered() -> None:
    big = GC31_HEADER + _gc({"k": "x" * 500}) + "then " + GC31_HEADER + _gc({"k": "y"})
    asm = ToolCallAssembler(loose("manage_user_memory"), "gigachat3", max_event_size=100)
    for ch in big:
        asm.feed(ch)
    result = asm.finish("stop")
    assert [c.arguments for c in result.calls] == [{"k": "y"}] and result.text == "then "
    (err,) = result.errors
    assert "max_event_size" in err.message and err.path == "tool_calls[0]"


# ---------------------------------------------------------------------------------------------------------------
# nemotron_json: vllm-project/vllm tests/tool_parsers/test_nemotron_json_tool_parser.py


def _tc(body: str) -> str:
    return f"<TOOLCALL>{body}</TOOLCALL>"


NJ_WEATHER = '{"name": "get_weather", "arguments": {"city": "Tokyo"}}'
NJ_TIMEZONE = '{"name": "lookup_timezone", "arguments": {"city": "Tokyo"}}'
NJ_THINK = "<think>\nI need the weather for Tokyo.\n</think>\n"
NEMOTRON_JSON_CASES: list[Case] = [
    ("returns_content_without_tool_call", "No tool call here.", [], "No tool call here."),
    (
        "from_nemotron_array",
        "Let me check that." + _tc('[{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "celsius"}}]'),
        [("get_weather", {"city": "Tokyo", "unit": "celsius"})],
        "Let me check that.",
    ),
    (
        "wraps_single_object",
        _tc('{"name": "lookup", "arguments": {"query": "vllm"}}'),
        [("lookup", {"query": "vllm"})],
        "",
    ),
    (
        "supports_string_arguments",
        _tc('[{"name": "run_query", "arguments": "{\\"sql\\": \\"select 1\\"}"}]'),
        [("run_query", {"sql": "select 1"})],
        "",
    ),
    (
        "streaming_reconstructs_tool_call",
        "Let me check." + _tc('[{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "celsius"}}]'),
        [("get_weather", {"city": "Tokyo", "unit": "celsius"})],
        "Let me check.",
    ),
    (
        "streaming_handles_nested_json_arguments",
        _tc(
            '[{"name": "search", "arguments": {"filters": {"city": "Tokyo"}, '
            '"items": [{"name": "rain", "value": true}]}}]'
        ),
        [("search", {"filters": {"city": "Tokyo"}, "items": [{"name": "rain", "value": True}]})],
        "",
    ),
    ("keeps_think_block_as_content", NJ_THINK + _tc(f"[{NJ_WEATHER}]"), [("get_weather", {"city": "Tokyo"})], NJ_THINK),
    (
        "streaming_handles_multiple_tool_calls",
        _tc(f"[{NJ_WEATHER}, {NJ_TIMEZONE}]"),
        [("get_weather", {"city": "Tokyo"}), ("lookup_timezone", {"city": "Tokyo"})],
        "",
    ),
    (
        "streaming_single_delta_handles_content_and_tool_call",
        "Let me check." + _tc(f"[{NJ_WEATHER}]"),
        [("get_weather", {"city": "Tokyo"})],
        "Let me check.",
    ),
]
NEMOTRON_JSON_TOOLS = loose("get_weather", "lookup", "run_query", "search", "lookup_timezone", "broken")


@pytest.mark.parametrize(("output", "calls", "content"), unique(NEMOTRON_JSON_CASES))
def test_nemotron_json_vllm_cases(output: str, calls: list[tuple[str, Any]], content: str) -> None:
    check_case("nemotron_json", NEMOTRON_JSON_TOOLS, output, calls, content)


def test_nemotron_json_deliberate_difference_malformed_block() -> None:
    """test_extract_tool_calls_returns_original_for_malformed: vLLM gives the block back as content; ctxlock refuses
    the call (a started call never becomes text)."""
    for chunks in chunkings(_tc('[{"name": "broken", "arguments": {}')):
        _, result = run("nemotron_json", NEMOTRON_JSON_TOOLS, chunks, "stop")
        (err,) = result.errors
        assert result.calls == () and result.text == "" and "not a JSON array" in err.message


def test_nemotron_json_close_marker_inside_a_string_is_argument_text() -> None:
    out = _tc('[{"name": "search", "arguments": {"q": "a </TOOLCALL> b"}}]') + "done"
    _, result = run("nemotron_json", NEMOTRON_JSON_TOOLS, [out], "stop")
    assert [c.arguments for c in result.calls] == [{"q": "a </TOOLCALL> b"}] and result.text == "done"


def test_nemotron_json_template_round_trip_and_length_anywhere() -> None:
    """The template writes a final assistant message as a continuation of the prompt, so the turn is rendered as
    history (a tool result after it): `<SPECIAL_11>Assistant\\n` text `\\n<TOOLCALL>...</TOOLCALL>\\n<SPECIAL_12>`."""
    from test_toolcalls_template_survey import _render

    from ctxlock.artifacts import load_template_file

    path = fetched.templates_dir() / "NVIDIA-Nemotron-Nano-v2.jinja"
    tool = {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "sunny"}
    full = _render(path, load_template_file(path), [USER_MSG, ASSISTANT, tool], prompt=False)
    start = full.index("<SPECIAL_11>Assistant\n") + len("<SPECIAL_11>Assistant\n")
    output = full[start : full.index("\n<SPECIAL_12>", start)]
    check_case("nemotron_json", TOOLS, output, EXPECTED_CALLS, "Looking it up.\n", splits=False)
    check_length_anywhere("nemotron_json", TOOLS, output, 2)


@pytest.mark.parametrize(
    ("output", "path", "needle"),
    [
        (_tc('"text"'), "tool_calls[0]", "got a string"),
        (_tc('[{"name": "search"}]'), "tool_calls[0].arguments", 'no "arguments"'),
        (_tc('[{"name": "search", "arguments": {}}, 7]'), "tool_calls[1]", "number"),
        (_tc('[{"name": "nope", "arguments": {}}]'), "tool_calls[0].name", "nope"),
    ],
)
def test_nemotron_json_malformed_calls_are_refused_with_a_path(output: str, path: str, needle: str) -> None:
    _, result = run("nemotron_json", NEMOTRON_JSON_TOOLS, [output], "stop")
    err = result.errors[-1]
    assert path in err.path and needle in err.message + err.path and err.hint


def test_nemotron_json_a_block_longer_than_max_event_size_is_refused_not_buffered() -> None:
    big = _tc('[{"name": "search", "arguments": {"k": "' + "x" * 500 + '"}}]') + "then " + _tc(NJ_WEATHER)
    asm = ToolCallAssembler(NEMOTRON_JSON_TOOLS, "nemotron_json", max_event_size=100)
    for ch in big:
        asm.feed(ch)
    result = asm.finish("stop")
    assert [c.arguments for c in result.calls] == [{"city": "Tokyo"}] and result.text == "then "
    (err,) = result.errors
    assert "max_event_size" in err.message and err.path == "tool_calls[0]"


# ---------------------------------------------------------------------------------------------------------------
# hy_v3: vllm-project/vllm tests/tool_parsers/test_hy_v3_tool_parser.py (bare tags, as the tokenizer there decodes)

HY_DATE = "<tool_calls>\n<tool_call>get_current_date<tool_sep>\n</tool_call>\n</tool_calls>"
HY_BEIJING = (
    "<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
    "<arg_key>date</arg_key>\n<arg_value>2026-03-30</arg_value>\n</tool_call>"
)
HY_HANGZHOU = HY_BEIJING.replace("Beijing", "Hangzhou")
HY_B = ("get_weather", {"city": "Beijing", "date": "2026-03-30"})
HY_V3_CASES: list[Case] = [
    ("no_tool_call", "This is a plain response.", [], "This is a plain response."),
    (
        "zero_arg_inline",
        "<tool_calls><tool_call>get_current_date<tool_sep></tool_call></tool_calls>",
        [("get_current_date", {})],
        "",
    ),
    ("zero_arg_newline", HY_DATE, [("get_current_date", {})], ""),
    (
        "args_same_line",
        "<tool_calls><tool_call>get_weather<tool_sep><arg_key>city</arg_key><arg_value>Beijing</arg_value>"
        "<arg_key>date</arg_key><arg_value>2026-03-30</arg_value></tool_call></tool_calls>",
        [HY_B],
        "",
    ),
    ("args_with_newlines", f"<tool_calls>\n{HY_BEIJING}\n</tool_calls>", [HY_B], ""),
    ("content_before", "Checking." + HY_DATE, [("get_current_date", {})], "Checking."),
    (
        "multiple",
        f"<tool_calls>\n{HY_BEIJING}\n{HY_HANGZHOU}\n</tool_calls>",
        [HY_B, ("get_weather", {"city": "Hangzhou", "date": "2026-03-30"})],
        "",
    ),
    ("empty_content_none", HY_DATE, [("get_current_date", {})], ""),
]
HY_V3_TOOLS = [
    {"type": "function", "function": {"name": "get_current_date", "parameters": {}}},
    typed("get_weather", city={"type": "string"}, date={"type": "string"}),
]


@pytest.mark.parametrize(("output", "calls", "content"), unique(HY_V3_CASES))
def test_hy_v3_vllm_cases(output: str, calls: list[tuple[str, Any]], content: str) -> None:
    check_case("hy_v3", HY_V3_TOOLS, output, calls, content)


def test_hy_v3_template_round_trip_and_length_anywhere() -> None:
    text = round_trip("tencent-Hy3.jinja")
    assert text.endswith("</tool_calls:opensource><｜hy_eos:opensource｜>")
    output = text.removesuffix("<｜hy_eos:opensource｜>")  # the end-of-turn token: a stop, never streamed as text
    check_case("hy_v3", TOOLS, output, EXPECTED_CALLS, "Looking it up.", splits=False)
    check_length_anywhere("hy_v3", TOOLS, output, 2)


@pytest.mark.parametrize(
    ("output", "path", "needle"),
    [
        ("<tool_calls><tool_call>get_weather</tool_call>", "tool_calls[0].name", "expected name<tool_sep>"),
        (
            "<tool_calls><tool_call>get_weather<tool_sep>junk<arg_key>city</arg_key><arg_value>x</arg_value></tool_call>",
            "tool_calls[0].arguments",
            "junk",
        ),
        (
            "<tool_calls><tool_call>get_weather<tool_sep><arg_key>city</arg_key><arg_value>x</arg_value>"
            "<arg_key>city</arg_key><arg_value>y</arg_value></tool_call>",
            "tool_calls[0].arguments.city",
            "twice",
        ),
        ("<tool_calls><tool_call>nope<tool_sep></tool_call>", "tool_calls[0].name", "nope"),
    ],
)
def test_hy_v3_malformed_calls_are_refused_with_a_path(output: str, path: str, needle: str) -> None:
    _, result = run("hy_v3", HY_V3_TOOLS, [output], "stop")
    assert result.calls == ()
    (err,) = result.errors
    assert path in err.path and needle in err.message + err.path and err.hint


def test_hy_v3_a_call_longer_than_max_event_size_is_refused_not_buffered() -> None:
    big = (
        "<tool_calls><tool_call>get_weather<tool_sep><arg_key>city</arg_key><arg_value>"
        + "x" * 500
        + "</arg_value></tool_call><tool_call>get_current_date<tool_sep></tool_call></tool_calls>after"
    )
    asm = ToolCallAssembler(HY_V3_TOOLS, "hy_v3", max_event_size=100)
    for ch in big:
        asm.feed(ch)
    result = asm.finish("stop")
    assert [c.name for c in result.calls] == ["get_current_date"] and result.text == "after"
    (err,) = result.errors
    assert "max_event_size" in err.message and err.path == "tool_calls[0]"


# ---------------------------------------------------------------------------------------------------------------
# minimax_m3: vllm-project/vllm tests/tool_parsers/test_minimax_m3_tool_parser.py

NS = "]<]minimax[>["
M3_ORDER = (
    f"{NS}<tool_call>\n"
    f'{NS}<invoke name="create_order">'
    f"{NS}<user_id>42{NS}</user_id>{NS}<urgent>true{NS}</urgent>{NS}<note>Please leave at front desk.{NS}</note>"
    f"{NS}<shipping>{NS}<city>Singapore{NS}</city>{NS}<zip>018956{NS}</zip>{NS}</shipping>"
    f"{NS}<items>{NS}<item>{NS}<sku>book-001{NS}</sku>{NS}<qty>2{NS}</qty>{NS}</item>"
    f"{NS}<item>{NS}<sku>pen-007{NS}</sku>{NS}<qty>5{NS}</qty>{NS}</item>{NS}</items>"
    f"{NS}<metadata>{NS}<source>mobile{NS}</source>{NS}<campaign>may-launch{NS}</campaign>{NS}</metadata>"
    f"{NS}<duplicate_demo>{NS}<tag>a{NS}</tag>{NS}<tag>b{NS}</tag>{NS}</duplicate_demo>"
    f"{NS}</invoke>\n{NS}</tool_call>"
)
M3_ORDER_ARGS = {
    "user_id": 42,
    "urgent": True,
    "note": "Please leave at front desk.",
    "shipping": {"city": "Singapore", "zip": 18956},
    "items": [{"sku": "book-001", "qty": 2}, {"sku": "pen-007", "qty": 5}],
    "metadata": {"source": "mobile", "campaign": "may-launch"},
    "duplicate_demo": {"tag": ["a", "b"]},
}


def _m3_invocation(user_id: int) -> str:
    return f'{NS}<invoke name="create_order">{NS}<user_id>{user_id}{NS}</user_id>{NS}</invoke>'


MINIMAX_M3_TOOLS = [
    typed(
        "create_order",
        user_id={"type": "integer"},
        urgent={"type": "boolean"},
        note={"type": "string"},
        shipping={"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}},
        items={
            "type": "array",
            "items": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}},
        },
        metadata={"type": "object", "additionalProperties": {"type": "string"}},
        duplicate_demo={"type": "object"},
    )
]
MINIMAX_M3_CASES: list[Case] = [
    (
        "non_streaming_nested_tool_call",
        "I will create it.\n" + M3_ORDER,
        [("create_order", M3_ORDER_ARGS)],
        "I will create it.\n",
    ),
    ("non_streaming_without_tool_call_keeps_content", "plain response", [], "plain response"),
    (
        "non_streaming_multiple_tool_calls",
        f"{NS}<tool_call>\n{_m3_invocation(1)}\n{_m3_invocation(2)}\n{NS}</tool_call>",
        [("create_order", {"user_id": 1}), ("create_order", {"user_id": 2})],
        "",
    ),
    # A cut-off start marker is text once the stream ends (also test_delegating_parser_flushes_partial_tool_start).
    ("streaming_flushes_partial_tool_start_as_text", f"plain {NS}<tool_ca", [], f"plain {NS}<tool_ca"),
    (
        "streaming_nested_tool_call",
        "I will create it.\n" + M3_ORDER,
        [("create_order", M3_ORDER_ARGS)],
        "I will create it.\n",
    ),
]


@pytest.mark.parametrize(("output", "calls", "content"), unique(MINIMAX_M3_CASES))
def test_minimax_m3_vllm_cases(output: str, calls: list[tuple[str, Any]], content: str) -> None:
    check_case("minimax_m3", MINIMAX_M3_TOOLS, output, calls, content)


def test_minimax_m3_deliberate_differences() -> None:
    # test_streaming_error_recovery_keeps_committed_tool_call_structured: the second invoke is cut off. vLLM releases
    # the first call and hands the cut-off invoke back as content; ctxlock releases the first call too and reports
    # the second as unterminated, never as text.
    text = f'plain {NS}<tool_call>\n{_m3_invocation(1)}\n{NS}<invoke name="create_order">{NS}<user_id>2'
    for chunks in chunkings(text):
        _, result = run("minimax_m3", MINIMAX_M3_TOOLS, chunks, "stop")
        assert result.text == "plain " and [c.arguments for c in result.calls] == [{"user_id": 1}]
        (err,) = result.errors
        assert err.path.startswith("tool_calls[1]") and "</invoke>" in err.message + err.hint
    # test_streaming_parse_error_emits_buffer_and_later_deltas: a stray close tag inside the block. vLLM gives the
    # rest of the output back as content; ctxlock drops the block's stray text (noted) and the text after it.
    _, result = run("minimax_m3", MINIMAX_M3_TOOLS, [f"{NS}<tool_call>\n{NS}</user_id>", " after error"], "stop")
    assert result.text == "" and result.calls == () and result.ok and result.notes


def test_minimax_m3_template_round_trip_and_length_anywhere() -> None:
    text = round_trip("MiniMax-M3.jinja")
    assert text.startswith("</mm:think>") and text.endswith(f"{NS}</tool_call>[e~[\n")
    # The generation prompt opens the model's thinking; the answer starts after </mm:think> and [e~[ ends the turn.
    output = text.removeprefix("</mm:think>").removesuffix("[e~[\n")
    check_case("minimax_m3", TOOLS, output, EXPECTED_CALLS, "Looking it up.", splits=False)
    check_length_anywhere("minimax_m3", TOOLS, output, 2)


@pytest.mark.parametrize(
    ("body", "path", "needle"),
    [
        ("<invoke>", "tool_calls[0].name", "name="),
        (f'<invoke name="create_order">junk{NS}<note>x{NS}</note>', "tool_calls[0].arguments", "junk"),
        (f'<invoke name="create_order">{NS}<note>x{NS}</user_id>', "tool_calls[0].arguments", "closes no open"),
        (f'<invoke name="create_order">{NS}<shipping>{NS}<city>x{NS}</city>', "tool_calls[0].arguments", "not closed"),
        (f'<invoke name="create_order">{NS}<note>x{NS}</note>y', "tool_calls[0].arguments", "unexpected text"),
        (f'<invoke name="create_order">{NS}<user_id>many{NS}</user_id>', "tool_calls[0].arguments.user_id", "integer"),
        (f'<invoke name="nope">{NS}<a>1{NS}</a>', "tool_calls[0].name", "nope"),
    ],
)
def test_minimax_m3_malformed_calls_are_refused_with_a_path(body: str, path: str, needle: str) -> None:
    _, result = run("minimax_m3", MINIMAX_M3_TOOLS, [f"{NS}<tool_call>{NS}{body}{NS}</invoke>"], "stop")
    assert result.calls == ()
    (err,) = result.errors
    assert path in err.path and needle in err.message + err.path and err.hint


def test_minimax_m3_a_call_longer_than_max_event_size_is_refused_not_buffered() -> None:
    big = f"{NS}<tool_call>" + _m3_invocation(1).replace(f">1{NS}", ">" + "1" * 500 + NS) + _m3_invocation(2)
    asm = ToolCallAssembler(MINIMAX_M3_TOOLS, "minimax_m3", max_event_size=100)
    for ch in big:
        asm.feed(ch)
    result = asm.finish("stop")
    assert [c.arguments for c in result.calls] == [{"user_id": 2}]
    (err,) = result.errors
    assert "max_event_size" in err.message and err.path == "tool_calls[0]"


# ---------------------------------------------------------------------------------------------------------------
# kimi_k3: vllm-project/vllm tests/tool_parsers/test_kimi_k3_tool_parser.py (content cases only) and the example of
# vllm/tool_parsers/kimi_k3_tool_parser.py's docstring (the call syntax)

K3_CLOSE_MESSAGE = "<|close|>message<|sep|>"


def _k3_call(name: str, *args: tuple[str, str, str]) -> str:
    body = "".join(f'<|open|>argument key="{k}" type="{t}"<|sep|>{v}<|close|>argument<|sep|>' for k, t, v in args)
    return f'<|open|>call tool="{name}" index="1"<|sep|>{body}<|close|>call<|sep|>'


KIMI_K3_CASES: list[Case] = [
    # test_streaming_content_stops_at_message_close and test_streaming_content_holds_split_message_close
    ("streaming_content_stops_at_message_close", f"Hello{K3_CLOSE_MESSAGE}", [], "Hello"),
    (
        "parser_docstring_example",
        "<|open|>tools<|sep|>"
        + _k3_call("python", ("code", "string", "print(1)"), ("opts", "object", '{"a":1}'))
        + "<|close|>tools<|sep|>",
        [("python", {"code": "print(1)", "opts": {"a": 1}})],
        "",
    ),
]


@pytest.mark.parametrize(("output", "calls", "content"), unique(KIMI_K3_CASES))
def test_kimi_k3_vllm_cases(output: str, calls: list[tuple[str, Any]], content: str) -> None:
    check_case("kimi_k3", loose("python"), output, calls, content)


def test_kimi_k3_channels_attributes_and_types() -> None:
    out = (
        "<|open|>think<|sep|>hmm<|close|>think<|sep|><|open|>response<|sep|>Sure.<|close|>response<|sep|>"
        "<|open|>tools<|sep|>"
        + _k3_call("f", ("q", "string", ' a "b" \n'), ("n", "number", "2.5"), ("z", "null", "null"))
        + _k3_call("f", ("esc", "string", "x")).replace('tool="f"', 'tool="f" note="&quot;&amp;"')
        + "<|close|>tools<|sep|>"
        + K3_CLOSE_MESSAGE
    )
    for chunks in chunkings(out):
        _, result = run("kimi_k3", loose("f"), chunks, "stop")
        assert result.text == "Sure." and result.thinking == "hmm" and result.ok
        assert [c.arguments for c in result.calls] == [{"q": ' a "b" \n', "n": 2.5, "z": None}, {"esc": "x"}]


def test_kimi_k3_template_round_trip_and_length_anywhere() -> None:
    text = round_trip("Kimi-K3.jinja")
    # The generation prompt opens the thinking; <|end_of_msg|> ends the turn (the stop token).
    assert text.startswith("<|close|>think<|sep|>") and text.endswith(f"{K3_CLOSE_MESSAGE}<|end_of_msg|>")
    output = text.removesuffix("<|end_of_msg|>")
    check_case("kimi_k3", TOOLS, output, EXPECTED_CALLS, "Looking it up.", splits=False)
    check_length_anywhere("kimi_k3", TOOLS, output, 2)


@pytest.mark.parametrize(
    ("output", "path", "needle"),
    [
        ('<|open|>call index="1"<|sep|><|close|>call<|sep|>', "tool_calls[0]", 'tool="..."'),
        (_k3_call("f", ("n", "number", "two")), "tool_calls[0].arguments.n", "not valid JSON"),
        (_k3_call("f", ("n", "string", "1"), ("n", "string", "2")), "tool_calls[0].arguments.n", "twice"),
        (_k3_call("f", ("", "string", "1")), "tool_calls[0].arguments", "without key"),
        (_k3_call("f").replace("<|close|>call", "junk<|close|>call"), "tool_calls[0].arguments", "junk"),
        (_k3_call("nope"), "tool_calls[0].name", "nope"),
    ],
)
def test_kimi_k3_malformed_calls_are_refused_with_a_path(output: str, path: str, needle: str) -> None:
    _, result = run("kimi_k3", loose("f"), [output], "stop")
    assert result.calls == ()
    (err,) = result.errors
    assert path in err.path and needle in err.message + err.path and err.hint


def test_kimi_k3_unknown_tags_are_text_and_open_calls_are_unfinished() -> None:
    _, result = run("kimi_k3", loose("f"), ["a<|open|>foo<|sep|>b<|close|>foo<|sep|>c"], "stop")
    assert result.text == "a<|open|>foo<|sep|>b<|close|>foo<|sep|>c" and result.ok
    _, result = run(
        "kimi_k3",
        loose("f"),
        ['Hi<|open|>call tool="f"<|sep|><|open|>argument key="k" type="string"<|sep|>x'],
        "length",
    )
    (err,) = result.errors
    assert result.text == "Hi" and result.calls == () and type(err).__name__ == "ToolCallTruncatedError"


def test_kimi_k3_a_call_longer_than_max_event_size_is_refused_not_buffered() -> None:
    big = _k3_call("f", ("k", "string", "x" * 500)) + _k3_call("f", ("k", "string", "y")) + "after"
    asm = ToolCallAssembler(loose("f"), "kimi_k3", max_event_size=100)
    for ch in big:
        asm.feed(ch)
    result = asm.finish("stop")
    assert [c.arguments for c in result.calls] == [{"k": "y"}] and result.text == "after"
    (err,) = result.errors
    assert "max_event_size" in err.message and err.path == "tool_calls[0]"
