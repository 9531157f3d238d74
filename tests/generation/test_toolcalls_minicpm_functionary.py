"""Tool-call formats `minicpm5` (MiniCPM5), `functionary_v3_1` and `functionary_v3_2` (MeetKai functionary), checked
against the reference cases and the models' chat templates.

The minicpm5 cases (model outputs and the calls and content vLLM's tests expect) come from vllm-project/vllm
tests/tool_parsers/test_minicpm5xml_tool_parser.py; vLLM has no parser for functionary, so those cases come from
llama.cpp's tests (ggml-org/llama.cpp tests/test-chat.cpp, the functionary v3.1 and v3.2 blocks: the model output and
the message common_chat_parse must give). Each case is fed whole, split at every character index into two chunks,
and one character at a time, in both release modes. Where ctxlock deliberately differs (DIFFERENCES: text outside
calls is kept, what vLLM repairs or guesses is refused with an error the model can read), the case asserts
ctxlock's answer; docs/tool-call-formats.md lists each with its reason.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_toolcalls import SEARCH, SEARCH_ARGS, WEATHER, ZURICH

import fetched
from ctxlock.errors import ToolCallTruncatedError
from ctxlock.generation.toolcalls import ToolCallAssembler, ToolCallReady
from ctxlock.request import ToolArguments, parse_request

Call = tuple[str, dict[str, Any]]
Case = tuple[str, str, list[Call], str | None]  # (id, model output, the reference's calls, the reference's content)


def tool(name: str, properties: dict[str, Any] | None = None, required: list[str] | None = None) -> dict[str, Any]:
    """A declared tool: with `properties` (and `required`) as the reference's test declares them, else loose."""
    parameters: dict[str, Any] = {"type": "object"}
    if properties is not None:
        parameters["properties"] = properties
    if required is not None:
        parameters["required"] = required
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


S = {"type": "string"}

# ---------------------------------------------------------------------------------------------------------------
# minicpm5: vLLM tests/tool_parsers/test_minicpm5xml_tool_parser.py

MINICPM_TOOLS = [
    tool("get_weather", {"city": S, "date": S}, ["city"]),
    tool("sum_values", {"nums": {"type": "array"}, "exact": {"type": "boolean"}}, ["nums"]),
    tool("noop", {"note": S}, []),
    tool("get_current_weather", {"city": S, "state": S, "unit": S}, ["city", "state", "unit"]),
    tool("get_customer_by_phone", {"phone_number": S}, ["phone_number"]),
    tool("get_details_by_id", {"id": S}, ["id"]),
    tool("toggle_roaming", {"line_id": S, "enabled": {"type": "boolean"}}, ["line_id", "enabled"]),
]
G = "\u0120"  # the byte-level BPE tokenizer's space, which vLLM's parser turns back into a space
SH_PARAMS = '<param name="city">上海</param><param name="date">2024-06-27</param>'
SHANGHAI = '<function name="get_weather">' + SH_PARAMS + "</function>"
SHANGHAI_CALL: Call = ("get_weather", {"city": "上海", "date": "2024-06-27"})
COLLAPSED = '<paramname="city">上海</param><paramname="date">2024-06-27</param></function>\n'
DALLAS_PARAMS = '<param name="city">Dallas</param><param name="state">TX</param><param name="unit">fahrenheit</param>'
TWO_CALLS = (
    'Head\n<function name="get_weather"><param name="city">北京</param></function>\nTXT\n'
    '<function name="sum_values"><param name="nums">[7,8,9]</param><param name="exact">false</param></function>\n'
    "Tail\n"
)
TWO_CALLS_RESULT: list[Call] = [("get_weather", {"city": "北京"}), ("sum_values", {"nums": [7, 8, 9], "exact": False})]
XXE = '<!DOCTYPE test [ <!ENTITY xxe SYSTEM "file:///etc/passwd"> ]>'

MINICPM_CASES: list[Case] = [
    ("no_tool_call", "How can I help you?", [], "How can I help you?"),
    ("single_call_with_surrounding_text", "Intro before.\n" + SHANGHAI + "\nOutro after.\n", [SHANGHAI_CALL], None),
    (
        "cdata_multiline",
        '<function name="get_weather"><param name="city"><![CDATA[北\n京]]></param>'
        '<param name="date">2024-06-27</param></function>\n',
        [("get_weather", {"city": "北\n京", "date": "2024-06-27"})],
        "\n",  # vLLM's test does not check the content
    ),
    ("tokenizer_space_marker", SHANGHAI.replace(" name", G + "name") + "\n", [SHANGHAI_CALL], None),
    ("collapsed_function_and_param_tags", '<functionname="get_weather">' + COLLAPSED, [SHANGHAI_CALL], None),
    (
        "collapsed_param_tags_tokenizer_space_function",
        f'<function{G}name="get_weather">' + COLLAPSED,
        [SHANGHAI_CALL],
        None,
    ),
    ("streaming_partial_chunks", SHANGHAI + "\n", [SHANGHAI_CALL], "\n"),
    ("streaming_tokenizer_space_marker", SHANGHAI.replace(" name", G + "name") + "\n", [SHANGHAI_CALL], None),
    ("streaming_collapsed_tags_weather", '<functionname="get_weather">' + COLLAPSED, [SHANGHAI_CALL], None),
    (
        "collapsed_tags_current_weather",
        '<functionname="get_current_weather">' + DALLAS_PARAMS.replace("param name", "paramname") + "</function>",
        [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})],
        None,
    ),
    (
        "streaming_incremental_arguments",
        '<function name="get_current_weather">' + DALLAS_PARAMS + "</function>",
        [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})],
        None,
    ),
    (
        "unknown_tool_block_preserved",
        '<function name="unknown"><param name="x">1</param></function>\n',
        [],
        '<function name="unknown"><param name="x">1</param></function>\n',
    ),
    (
        "non_string_types",
        '<function name="sum_values"><param name="nums">[1, 2, 3]</param><param name="exact">true</param></function>\n',
        [("sum_values", {"nums": [1, 2, 3], "exact": True})],
        "\n",  # vLLM's test does not check the content
    ),
    ("multiple_calls_interleaved_text", TWO_CALLS, TWO_CALLS_RESULT, None),
    (
        "incomplete_missing_function_end",
        '<function name="get_weather"><param name="city">北京</param>',
        [],
        '<function name="get_weather"><param name="city">北京</param>',
    ),
    (
        "param_missing_name_invalid",
        '<function name="get_weather"><param>北京</param><param name="date">2024-06-27</param></function>\n',
        [],
        '<function name="get_weather"><param>北京</param><param name="date">2024-06-27</param></function>\n',
    ),
    (
        "duplicate_param_names_invalid",
        '<function name="get_weather"><param name="city">北京</param><param name="city">上海</param></function>\n',
        [],
        "\n",  # vLLM's test checks only that no call is made
    ),
    (
        "case_sensitive_param_name_invalid",
        '<function name="get_weather"><param name="City">北京</param></function>\n',
        [],
        "\n",  # vLLM's test checks only that no call is made
    ),
    ("no_required_and_zero_param_valid", '<function name="noop"></function>\n', [("noop", {})], "\n"),
    (
        "thinking_only_sentencepiece_normalized",
        "\u010aFirst,\u0120I\u0120need\u0120to\u0120check\u0120the\u0120weather.",
        [],
        "\nFirst, I need to check the weather.",
    ),
    (
        "properties_wrapped_arguments",
        '<function name="get_customer_by_phone">'
        "<param name=\"properties\">{'phone_number': '555-123-2002'}</param></function>",
        [("get_customer_by_phone", {"phone_number": "555-123-2002"})],
        None,
    ),
    (
        "arguments_wrapped_arguments",
        '<function name="get_weather">'
        '<param name="arguments">{"city": "上海", "date": "2024-06-27"}</param></function>',
        [SHANGHAI_CALL],
        None,
    ),
    (
        "wrapped_arguments_still_validate_schema",
        '<function name="get_weather"><param name="properties">{"unknown": "x"}</param></function>',
        [],
        None,  # vLLM's test checks only that no call is made
    ),
    (
        "extra_arguments_ignored_when_required_present",
        '<function name="get_weather"><param name="city">上海</param><param name="unknown">ignored</param></function>',
        [("get_weather", {"city": "上海"})],
        None,
    ),
    (
        "extra_arguments_do_not_satisfy_required",
        '<function name="get_weather"><param name="unknown">ignored</param></function>',
        [],
        None,  # vLLM's test checks only that no call is made
    ),
    (
        "zero_arg_tool_ignores_extra_arguments",
        '<function name="noop"><param name="note">ignored</param><param name="extra">ignored</param></function>',
        [("noop", {"note": "ignored"})],
        None,
    ),
    (
        "alias_get_details_by_phone",
        '<function name="get_details_by_phone"><param name="phone_number">555-123-2002</param></function>',
        [("get_customer_by_phone", {"phone_number": "555-123-2002"})],
        None,
    ),
    (
        "alias_get_line_details",
        '<function name="get_line_details"><param name="customer_id">C1001</param>'
        '<param name="line_id">L1001</param></function>',
        [("get_details_by_id", {"id": "L1001"})],
        None,
    ),
    (
        "alias_enable_roaming",
        '<function name="enable_roaming"><param name="line_id">L1001</param></function>',
        [("toggle_roaming", {"line_id": "L1001", "enabled": True})],
        None,
    ),
    # vLLM's streaming tests keep the text around the calls (its non-streaming content is None when a call is made)
    (
        "streaming_single",
        "Intro before.\n" + SHANGHAI + "\nOutro after.\n",
        [SHANGHAI_CALL],
        "Intro before.\n\nOutro after.\n",
    ),
    ("streaming_multiple", TWO_CALLS, TWO_CALLS_RESULT, "Head\n\nTXT\n\nTail\n"),
    # vLLM's test checks that the entity is not resolved (the value is "&xxe;") and not the content: the text before
    # the call is kept as text.
    (
        "xml_external_entity_prevention",
        XXE + SHANGHAI.replace("上海", "&xxe;") + "\n",
        [("get_weather", {"city": "&xxe;", "date": "2024-06-27"})],
        XXE + "\n",
    ),
]

# ---------------------------------------------------------------------------------------------------------------
# functionary_v3_1 and functionary_v3_2: llama.cpp tests/test-chat.cpp (the meetkai-functionary-medium-v3.1 and
# v3.2 blocks; llama.cpp's special_function tool and its built-in python tool)

FUNCTIONARY_TOOLS = [tool("special_function", {"arg1": {"type": "integer"}}, ["arg1"]), tool("python", {"code": S})]
SPECIAL: Call = ("special_function", {"arg1": 1})
PYTHON_LINES: Call = ("python", {"code": "# This is a program:\nprint('hey')"})

FUNCTIONARY_V31_CASES: list[Case] = [
    ("v31_call", '<function=special_function>{"arg1": 1}</function>', [SPECIAL], ""),
    ("v31_call_partial_close", '<function=special_function>{"arg1": 1}<', [SPECIAL], ""),
    ("v31_content", "Hello, world!\nWhat's up?", [], "Hello, world!\nWhat's up?"),
]
FUNCTIONARY_V32_CASES: list[Case] = [
    (
        "v32_content_then_call",
        'all\nHello, world!\nnono\nWhat\'s up?>>>special_function\n{"arg1": 1}\n',
        [SPECIAL],
        "Hello, world!\nnono\nWhat's up?",
    ),
    ("v32_python_lines", "python\n# This is a program:\nprint('hey')", [PYTHON_LINES], ""),
    ("v32_call_trailing_space", 'special_function\n{"arg1": 1} \n                    ', [SPECIAL], ""),
    ("v32_content", "all\nHello, world!\nWhat's up?", [], "Hello, world!\nWhat's up?"),
    ("v32_template_call", 'special_function\n{"arg1": 1}', [SPECIAL], ""),
]

# ---------------------------------------------------------------------------------------------------------------
# Where ctxlock deliberately differs from a reference case: (ctxlock's calls, ctxlock's text, ctxlock's errors as
# (type, path), why). None keeps the reference's calls or content.
Ours = tuple[list[Call] | None, str | None, list[tuple[str, str]], str]
KEPT_TEXT = "ctxlock passes every character outside the calls through as text"
MANGLED = "a tag the tokenizer mangled is refused with an error (vLLM repairs it)"
NAME_ERROR = [("ToolCallError", "tool_calls[0].name")]
UNDECLARED = "a call to an undeclared name is refused with an error; vLLM maps it to a declared tool (a guessed alias)"
UNWRAPPED = "arguments wrapped in one `properties` or `arguments` parameter are not unwrapped: refused, by the schema"
NOT_DROPPED = "an argument the schema allows is not dropped: the call is released as the model wrote it"
DIFFERENCES: dict[str, Ours] = {
    "single_call_with_surrounding_text": (None, "Intro before.\n\nOutro after.\n", [], KEPT_TEXT),
    "multiple_calls_interleaved_text": (None, "Head\n\nTXT\n\nTail\n", [], KEPT_TEXT),
    "tokenizer_space_marker": ([], "\n", NAME_ERROR, MANGLED),
    "collapsed_function_and_param_tags": ([], "\n", NAME_ERROR, MANGLED),
    "collapsed_param_tags_tokenizer_space_function": ([], "\n", NAME_ERROR, MANGLED),
    "streaming_tokenizer_space_marker": ([], "\n", NAME_ERROR, MANGLED),
    "streaming_collapsed_tags_weather": ([], "\n", NAME_ERROR, MANGLED),
    "collapsed_tags_current_weather": ([], "", NAME_ERROR, MANGLED),
    "unknown_tool_block_preserved": (
        [],
        "\n",
        NAME_ERROR,
        "a call to an undeclared tool is refused with an error, not given back as text",
    ),
    "incomplete_missing_function_end": (
        [],
        "",
        [("ToolCallError", "tool_calls[0]")],
        "a call still open when the stream ends is an error, never text",
    ),
    "param_missing_name_invalid": (
        [],
        "\n",
        [("ToolCallError", "tool_calls[0].arguments")],
        "a <param> without a name is refused with an error (no call, as in vLLM), not given back as text",
    ),
    "thinking_only_sentencepiece_normalized": (
        None,
        "\u010aFirst,\u0120I\u0120need\u0120to\u0120check\u0120the\u0120weather.",
        [],
        "the text is passed through as the server detokenized it: Ġ and Ċ are a detokenizer fault, not rewritten",
    ),
    "properties_wrapped_arguments": (
        [],
        "",
        [("ToolCallValidationError", "tool_calls[0].arguments.phone_number")],
        UNWRAPPED,
    ),
    "arguments_wrapped_arguments": ([], "", [("ToolCallValidationError", "tool_calls[0].arguments.city")], UNWRAPPED),
    "extra_arguments_ignored_when_required_present": (
        [("get_weather", {"city": "上海", "unknown": "ignored"})],
        "",
        [],
        NOT_DROPPED,
    ),
    "zero_arg_tool_ignores_extra_arguments": ([("noop", {"note": "ignored", "extra": "ignored"})], "", [], NOT_DROPPED),
    "alias_get_details_by_phone": ([], "", NAME_ERROR, UNDECLARED),
    "alias_get_line_details": ([], "", NAME_ERROR, UNDECLARED),
    "alias_enable_roaming": ([], "", NAME_ERROR, UNDECLARED),
    "v31_call_partial_close": (
        [],
        "",
        [("ToolCallError", "tool_calls[0]")],
        "llama.cpp reads a partial output as the call; ctxlock releases a call only once its </function> is seen",
    ),
}
# No call, as in vLLM (whose test checks nothing else): ctxlock also says why, with an error the model can read.
REFUSED_AS_REFERENCE: dict[str, list[tuple[str, str]]] = {
    "duplicate_param_names_invalid": [("ToolCallError", "tool_calls[0].arguments.city")],
    "case_sensitive_param_name_invalid": [("ToolCallValidationError", "tool_calls[0].arguments.city")],
    "wrapped_arguments_still_validate_schema": [("ToolCallValidationError", "tool_calls[0].arguments.city")],
    "extra_arguments_do_not_satisfy_required": [("ToolCallValidationError", "tool_calls[0].arguments.city")],
}


def _expected(case: Case) -> tuple[list[Call], str, list[tuple[str, str]]]:
    cid, _, calls, content = case
    ours = DIFFERENCES.get(cid)
    if ours is None:
        return calls, content or "", REFUSED_AS_REFERENCE.get(cid, [])
    our_calls, our_text, errors, _ = ours
    return (calls if our_calls is None else our_calls), (content or "" if our_text is None else our_text), errors


def _outcome(fmt: str, tools: list[dict[str, Any]], chunks: list[str], release: str) -> Any:
    asm = ToolCallAssembler(tools, fmt, release=release)
    for chunk in chunks:
        asm.feed(chunk)
    result = asm.finish("stop")
    calls = [(c.name, json.dumps(c.arguments, sort_keys=True)) for c in result.calls]
    return calls, result.text, [(type(e).__name__, e.path) for e in result.errors]


def check_case(fmt: str, tools: list[dict[str, Any]], case: Case) -> None:
    """The case whole, split at every index, and one character at a time, in both release modes."""
    calls, text, errors = _expected(case)
    want = ([(n, json.dumps(a, sort_keys=True)) for n, a in calls], text, errors)
    output = case[1]
    chunkings = [[output], list(output), *([output[:k], output[k:]] for k in range(1, len(output)))]
    for release in ("finish", "early"):
        for chunks in chunkings:
            assert _outcome(fmt, tools, chunks, release) == want, (release, chunks)


@pytest.mark.parametrize("case", MINICPM_CASES, ids=[c[0] for c in MINICPM_CASES])
def test_minicpm5_vllm_cases(case: Case) -> None:
    check_case("minicpm5", MINICPM_TOOLS, case)


@pytest.mark.parametrize("case", FUNCTIONARY_V31_CASES, ids=[c[0] for c in FUNCTIONARY_V31_CASES])
def test_functionary_v3_1_llama_cpp_cases(case: Case) -> None:
    check_case("functionary_v3_1", FUNCTIONARY_TOOLS, case)


@pytest.mark.parametrize("case", FUNCTIONARY_V32_CASES, ids=[c[0] for c in FUNCTIONARY_V32_CASES])
def test_functionary_v3_2_llama_cpp_cases(case: Case) -> None:
    check_case("functionary_v3_2", FUNCTIONARY_TOOLS, case)


# ---------------------------------------------------------------------------------------------------------------
# Never half a call: a multi-call output cut anywhere under a length stop releases nothing

MULTI_CALL = {
    "minicpm5": ("Let me look.\n" + SHANGHAI + "\n" + TWO_CALLS, MINICPM_TOOLS, 3),
    "functionary_v3_1": (
        'Let me look.<function=special_function>{"arg1": 1}</function><function=python>{"code": "a >>> b"}</function>',
        FUNCTIONARY_TOOLS,
        2,
    ),
    "functionary_v3_2": (
        'all\nLet me look.>>>special_function\n{"arg1": 1}>>>python\n{"code": "</function> >>> b"}\n',
        FUNCTIONARY_TOOLS,
        2,
    ),
}


@pytest.mark.parametrize("fmt", sorted(MULTI_CALL))
def test_a_length_stop_anywhere_releases_no_call(fmt: str) -> None:
    text, tools, count = MULTI_CALL[fmt]
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
            else:
                assert all(type(err) is ToolCallTruncatedError for err in result.errors), cut
    asm = ToolCallAssembler(tools, fmt)
    asm.feed(text)
    result = asm.finish("stop")
    assert len(result.calls) == count and result.errors == ()


# ---------------------------------------------------------------------------------------------------------------
# Template round trip: what the model's own template writes for two calls parses back to the same calls

TEMPLATE_TOOLS = [WEATHER, SEARCH]
NESTED = {**SEARCH_ARGS, "query": "rain </function> >>> gear, 天气 🌧\n  indented & <b>"}
CALLS: list[Call] = [("get_weather", ZURICH), ("search_docs", NESTED)]
# llama.cpp hands every template bos and eos (common/chat.cpp); functionary v3.2 concatenates the arguments as a
# string, so it renders only with the arguments as sent (tests/generation/test_toolcalls_template_survey.py AS_SENT).
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def _render(template_name: str, arguments: ToolArguments, calls: list[Call]) -> tuple[str, str]:
    from ctxlock.artifacts import load_template_file
    from ctxlock.template import render

    template = load_template_file(fetched.templates_dir() / template_name)
    user = {"role": "user", "content": "Weather in Zürich, and search the docs?"}
    message = {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
            for k, (n, a) in enumerate(calls)
        ],
    }

    def text(messages: list[dict[str, Any]], prompt: bool) -> str:
        body = json.dumps({"messages": messages, "tools": TEMPLATE_TOOLS}).encode()
        request = parse_request(body, tool_arguments=arguments)
        return render(request, template, add_generation_prompt=prompt, special_tokens=SPECIAL_TOKENS).text

    return text([user], True), text([user, message], False)


# (format, template, how the arguments reach the template, the end-of-turn token, the text ctxlock reads back)
ROUND_TRIPS = [
    ("minicpm5", "openbmb-MiniCPM5-1B.jinja", ToolArguments.PARSED, "<|im_end|>\n", "Checking.\n\n"),
    ("functionary_v3_1", "meetkai-functionary-medium-v3.1.jinja", ToolArguments.PARSED, "<|eom_id|>", "Checking."),
    ("functionary_v3_2", "meetkai-functionary-medium-v3.2.jinja", ToolArguments.AS_SENT, "<|eot_id|>", "Checking."),
]


@pytest.mark.parametrize("fmt, template, arguments, eot, text", ROUND_TRIPS, ids=[r[1] for r in ROUND_TRIPS])
def test_template_round_trip(fmt: str, template: str, arguments: ToolArguments, eot: str, text: str) -> None:
    prompt, full = _render(template, arguments, CALLS)
    assert full.startswith(prompt) and full.endswith(eot)
    generated = full[len(prompt) : len(full) - len(eot)]
    for chunks in ([generated], list(generated)):
        asm = ToolCallAssembler(TEMPLATE_TOOLS, fmt)
        for chunk in chunks:
            asm.feed(chunk)
        result = asm.finish("stop")
        assert result.errors == ()
        assert [(c.name, c.arguments) for c in result.calls] == CALLS
        assert result.text == text


# ---------------------------------------------------------------------------------------------------------------
# Bounds and malformed calls

BOUNDED = {
    "minicpm5": ('<function name="get_weather"><param name="city">Beijing</param></function>', MINICPM_TOOLS),
    "functionary_v3_1": ('<function=special_function>{"arg1": 1, "pad": "Beijing"}</function>', FUNCTIONARY_TOOLS),
    "functionary_v3_2": ('>>>special_function\n{"arg1": 1, "pad": "Beijing"}', FUNCTIONARY_TOOLS),
}


@pytest.mark.parametrize("fmt", sorted(BOUNDED))
def test_a_call_longer_than_max_event_size_is_refused_not_buffered(fmt: str) -> None:
    call, tools = BOUNDED[fmt]
    v32 = fmt == "functionary_v3_2"  # text there is the recipient `all`'s content
    text = ("all\na" if v32 else "a") + call.replace("Beijing", "B" * 200) + (">>>all\nb" if v32 else "b") + call
    for release in ("finish", "early"):
        asm = ToolCallAssembler(tools, fmt, max_event_size=120, release=release)
        for ch in text:
            asm.feed(ch)
        result = asm.finish("stop")
        assert [(type(e).__name__, e.path) for e in result.errors] == [("ToolCallError", "tool_calls[0]")]
        assert "max_event_size=120" in result.errors[0].message
        assert [c.index for c in result.calls] == [1] and result.text == "ab"


def test_minicpm5_refuses_a_repeated_parameter_with_its_path_and_a_hint() -> None:
    out = '<function name="get_weather"><param name="city">A</param><param name="city">B</param></function>'
    asm = ToolCallAssembler(MINICPM_TOOLS, "minicpm5")
    asm.feed(out)
    (err,) = asm.finish("stop").errors
    assert err.path == "tool_calls[0].arguments.city" and "twice" in err.message and err.hint


def test_functionary_v3_2_a_first_line_that_is_no_recipient_is_text() -> None:
    asm = ToolCallAssembler(FUNCTIONARY_TOOLS, "functionary_v3_2")
    asm.feed("Sure, here it is.\n>>>special_function\n")
    asm.feed('{"arg1": 2}')
    result = asm.finish("stop")
    assert result.text == "Sure, here it is.\n" and [(c.name, c.arguments) for c in result.calls] == [
        ("special_function", {"arg1": 2})
    ]


def test_functionary_v3_2_an_empty_first_line_is_text_not_a_nameless_call() -> None:
    asm = ToolCallAssembler(FUNCTIONARY_TOOLS, "functionary_v3_2")
    for ch in "\nHello.":
        asm.feed(ch)
    result = asm.finish("stop")
    assert result.text == "\nHello." and result.calls == () and result.errors == ()
