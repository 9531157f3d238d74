"""The section formats: `deepseek_v3` (DeepSeek-V3, R1), `deepseek_v31` (DeepSeek-V3.1) and `kimi_k2` (Kimi-K2).

Each format is held to vLLM's own test cases (tests/tool_parsers/test_deepseekv3_tool_parser.py,
test_deepseekv31_tool_parser.py and test_kimi_k2_tool_parser.py in vllm-project/vllm): the model outputs and what
vLLM expects are data here, fed whole, split at every index into two chunks and one character at a time, in both
release modes. Where ctxlock answers otherwise on purpose, the case says what ctxlock gives and why
(docs/tool-call-formats.md lists the same differences). Then: no call from a response cut anywhere by a length
stop, and the calls the model's own chat template writes parse back to the calls it was given.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import pytest
from test_toolcalls import PARIS, SEARCH_ARGS, ZURICH, _call
from test_toolcalls import TOOLS as TEMPLATE_TOOLS

import fetched
from ctxlock.errors import ToolCallError, ToolCallTruncatedError
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

CASES: dict[str, list[Case]] = {"deepseek_v3": DEEPSEEK_V3, "deepseek_v31": DEEPSEEK_V31}

NAMES = [
    *("get_weather", "search_hotels", "test_function", "get_current_time", "send_message", "foo", "bar"),
]
# Loose schemas: vLLM's cases are about the format, not the arguments.
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in NAMES]

ALL_CASES = [pytest.param(fmt, case, id=f"{fmt}-{case.id}") for fmt, cases in CASES.items() for case in cases]


def _run(fmt: str, chunks: list[str], release: str) -> Any:
    asm = ToolCallAssembler(TOOLS, fmt, release=release)
    fed = [e for c in chunks for e in asm.feed(c)]
    result = asm.finish("stop")
    return fed, result


def _check(fmt: str, case: Case, chunks: list[str]) -> None:
    calls, content = (case.ours[0], case.ours[1]) if case.ours else (case.calls, case.content)
    for release in ("finish", "early"):
        fed, result = _run(fmt, chunks, release)
        assert [(c.name, c.arguments) for c in result.calls] == calls, (release, chunks)
        assert result.text == content, (release, chunks)
        assert len(result.errors) == case.errors, (release, chunks, result.errors)
        if release == "finish":
            assert not any(isinstance(e, ToolCallReady) for e in fed)
        for err in result.errors:
            assert err.path.startswith("tool_calls[") and err.hint


@pytest.mark.parametrize(("fmt", "case"), ALL_CASES)
def test_vllm_cases_in_every_chunking(fmt: str, case: Case) -> None:
    text = case.output
    _check(fmt, case, [text])
    _check(fmt, case, list(text))
    for cut in range(1, len(text)):
        _check(fmt, case, [text[:cut], text[cut:]])


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


def test_malformed_calls_name_their_path_and_say_how_to_write_them() -> None:
    cases = [
        ("deepseek_v3", f"{CALL_BEGIN}tool{SEP}get_weather\n```json\n{{}}\n```{CALL_END}", "tool_calls[0].type"),
        ("deepseek_v3", f"{CALL_BEGIN}function get_weather {{}}{CALL_END}", "tool_calls[0]"),
        ("deepseek_v3", f"{CALL_BEGIN}function{SEP}get_weather\n```json\n{{}}{CALL_END}", "tool_calls[0].arguments"),
        ("deepseek_v31", f"{CALL_BEGIN}get_weather {{}}{CALL_END}", "tool_calls[0]"),
        ("deepseek_v31", f"{CALL_BEGIN}nope{SEP}{{}}{CALL_END}", "tool_calls[0].name"),
        ("deepseek_v31", f"{CALL_BEGIN}get_weather{SEP}[1]{CALL_END}", "tool_calls[0].arguments"),
    ]
    for fmt, text, path in cases:
        result = assemble(TOOLS, fmt, [text], "stop")
        (err,) = result.errors
        assert result.calls == () and err.path == path and err.hint, (fmt, text, err)


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
        assert result.text == (spec.content or "")


def test_r1_distill_llama_writes_no_tool_calls() -> None:
    """DeepSeek-R1-Distill-Llama-8B's template writes the calls only when the content is none, and a message's
    none-valued keys never reach a template (transformers drops them; so does ctxlock): the calls are dropped."""
    message = {"role": "assistant", "content": "", "tool_calls": [_call("a", "get_weather", PARIS)]}
    spec = Template(
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "deepseek_v3", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", ""
    )
    assert generated_part(spec, message) == ""
