"""gpt-oss tool calls (format `harmony`): Harmony commentary messages with a recipient, read from the completion's
text (special tokens kept).

The cases are vLLM's (tests/tool_parsers/test_openai_tool_parser.py in vllm-project/vllm: its `openai` tool parser
is the Harmony one). As there, each completion is rendered by openai-harmony itself (tests/harmony_reference.py),
then decoded with the gpt-oss vocabulary and fed as the text a server streams: whole, token by token, and split in
two at every character. The round trip renders calls with ctxlock's gpt-oss template and reads them back."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

import ctxlock
from ctxlock.errors import ToolCallTruncatedError
from ctxlock.generation import IncrementalDecoder
from ctxlock.generation.toolcalls import ToolCallAssembler, ToolCallReady, assemble
from ctxlock.request import parse_request
from harmony_reference import encoding

pytestmark = pytest.mark.reference

LOOSE = {"type": "object"}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "state": {"type": "string"}, "location": {"type": "string"}},
}
NAMES = ["get_current_weather", "get_user_location", "no_content_type", "not_json_no_content_type", "empty_args"]
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": WEATHER if n == NAMES[0] else LOOSE}} for n in NAMES
] + [{"type": "function", "function": {"name": "no_args", "parameters": LOOSE}}]

ANALYSIS = 'User asks: "What is the weather in Tokyo?" We need to use get_current_weather tool.'


def _msg(content: str, channel: str, recipient: str | None = None, ctype: str | None = None) -> Any:
    from openai_harmony import Message, Role

    m = Message.from_role_and_content(Role.ASSISTANT, content).with_channel(channel)
    if recipient is not None:
        m = m.with_recipient(recipient)
    if ctype is not None:
        m = m.with_content_type(ctype)
    return m


@cache
def _tok() -> Any:
    return ctxlock.load("gpt-oss").tokenizer


def completion(messages: list[Any]) -> tuple[str, list[int]]:
    """The assistant messages as a completion: what follows the prompt's `<|start|>assistant`, with special tokens
    kept, as openai-harmony renders them."""
    ids = [i for m in messages for i in encoding().render(m)]
    start = encoding().encode("<|start|>assistant", allowed_special="all")
    assert ids[: len(start)] == start
    ids = ids[len(start) :]
    return _tok().decode(ids), ids


# (id, messages, expected calls as (name, arguments), expected text, deliberately different from vLLM: why)
CASES: list[tuple[str, list[Any], list[tuple[str, Any]], str, str | None]] = [
    ("no_tools", [_msg("This is a test", "final")], [], "This is a test", None),
    *[
        (
            f"single_tool_{k}",
            [_msg(ANALYSIS, "analysis"), _msg(args, "commentary", "functions.get_current_weather", "json")],
            [("get_current_weather", {"location": "Tokyo"})],
            "",
            None,
        )
        for k, args in enumerate(['{"location": "Tokyo"}', '{\n"location": "Tokyo"\n}'])
    ],
    (
        "multiple_tools",
        [
            _msg(ANALYSIS, "analysis"),
            _msg('{"location": "Tokyo"}', "commentary", "functions.get_current_weather", "json"),
            _msg('{"location": "Tokyo"}', "commentary", "functions.get_user_location", "json"),
            _msg('{"location": "Tokyo"}', "commentary", "functions.no_content_type"),
            _msg("foo", "commentary", "functions.not_json_no_content_type"),
            _msg("{}", "commentary", "functions.empty_args", "json"),
            _msg("", "commentary", "functions.no_args", "json"),
        ],
        [
            ("get_current_weather", {"location": "Tokyo"}),
            ("get_user_location", {"location": "Tokyo"}),
            ("no_content_type", {"location": "Tokyo"}),
            ("empty_args", {}),
        ],
        "",
        # vLLM hands out not_json_no_content_type with arguments "foo" and no_args with "": neither is a JSON
        # object, so ctxlock refuses both (ToolCallRejected, with the path and a hint) and releases the rest.
        "refuses the two calls whose arguments are not a JSON object",
    ),
    (
        "with_content",
        [
            _msg(ANALYSIS, "analysis"),
            _msg('{"location": "Tokyo"}', "commentary", "functions.get_current_weather", "json"),
            _msg("This tool call will get the weather.", "final"),
        ],
        [("get_current_weather", {"location": "Tokyo"})],
        "This tool call will get the weather.",
        None,
    ),
]


def _check(result: Any, calls: list[tuple[str, Any]], text: str, differs: str | None) -> None:
    assert [(c.name, c.arguments) for c in result.calls] == calls
    assert result.text == text
    if differs is None:
        assert result.errors == ()
    else:
        assert [e.tool_name for e in result.errors] == ["not_json_no_content_type", "no_args"]
        assert all("not a JSON object" in e.message for e in result.errors)


@pytest.mark.parametrize(("name", "messages", "calls", "text", "differs"), CASES, ids=[c[0] for c in CASES])
def test_vllm_cases_whole_token_by_token_and_at_every_split(
    name: str, messages: list[Any], calls: list, text: str, differs: str | None
) -> None:
    full, ids = completion(messages)
    ends_in_call = messages[-1].recipient is not None
    reason = "tool_calls" if ends_in_call else "stop"
    if ends_in_call:
        assert full.endswith("<|call|>")
    _check(assemble(TOOLS, "harmony", [full], reason), calls, text, differs)
    # Servers usually do not stream the stop token (<|call|>, <|return|>): the normal end completes the call.
    stripped = full.removesuffix("<|call|>").removesuffix("<|return|>").removesuffix("<|end|>")
    _check(assemble(TOOLS, "harmony", [stripped], reason), calls, text, differs)
    decoder = IncrementalDecoder(_tok())
    pieces = [decoder.push(i) for i in ids] + [decoder.finish()]
    _check(assemble(TOOLS, "harmony", pieces, reason), calls, text, differs)
    if name == "multiple_tools":
        return  # 600 characters; the two-chunk splits of the other cases cover the same markers
    for k in range(len(full) + 1):
        _check(assemble(TOOLS, "harmony", [full[:k], full[k:]], reason), calls, text, differs)


def test_analysis_is_thinking_and_preambles_are_text() -> None:
    full, _ = completion(
        [
            _msg("thinking about it", "analysis"),
            _msg("Let me check.", "commentary"),
            _msg('{"location": "Tokyo"}', "commentary", "functions.get_current_weather", "json"),
        ]
    )
    r = assemble(TOOLS, "harmony", [full], "tool_calls")
    assert (r.thinking, r.text, [c.name for c in r.calls]) == (
        "thinking about it",
        "Let me check.",
        ["get_current_weather"],
    )


def test_a_cut_off_response_gives_no_call_at_any_point() -> None:
    full, _ = completion(
        [
            _msg(ANALYSIS, "analysis"),
            _msg('{"location": "Tokyo"}', "commentary", "functions.get_current_weather", "json"),
            _msg('{"location": "Osaka"}', "commentary", "functions.get_user_location", "json"),
        ]
    )
    first_call = full.index("to=functions.get_current_weather")
    for cut in range(len(full) + 1):
        asm = ToolCallAssembler(TOOLS, "harmony")
        fed = asm.feed(full[:cut])
        result = asm.finish("length")
        assert not any(isinstance(e, ToolCallReady) for e in [*fed, *result.events]), cut
        assert result.calls == () and result.finish_reason == "length"
        assert all(type(e) is ToolCallTruncatedError and "nothing was executed" in e.hint for e in result.errors)
        assert bool(result.errors) == (cut > first_call + len("to=")), cut  # a recipient named: the cut is reported
    whole = assemble(TOOLS, "harmony", [full], "tool_calls")
    assert [c.arguments for c in whole.calls] == [{"location": "Tokyo"}, {"location": "Osaka"}]


def test_calls_round_trip_through_the_gpt_oss_template() -> None:
    """ctxlock's gpt-oss template renders an assistant turn with two calls; the generated part reads back."""
    model = ctxlock.load("gpt-oss")
    args0 = {"location": 'Zürich "HB" 天气', "nested": {"a": [1, 2.5, None, True]}}
    args1 = {"location": "Tokyo"}
    user = {"role": "user", "content": "Weather?"}
    calls = [
        {"id": f"c{k}", "type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
        for k, (n, a) in enumerate([("get_current_weather", args0), ("get_user_location", args1)])
    ]
    tools = [{"type": "function", "function": {"name": n, "parameters": LOOSE}} for n in NAMES[:2]]
    body = {"messages": [user, {"role": "assistant", "content": None, "tool_calls": calls}], "tools": tools}
    full = model.render(parse_request(json.dumps(body).encode()), add_generation_prompt=False).text
    prompt = model.render(parse_request(json.dumps({"messages": [user], "tools": tools}).encode())).text
    assert full.startswith(prompt)
    r = assemble(tools, "harmony", [full[len(prompt) :]], "tool_calls")
    assert [(c.name, c.arguments) for c in r.calls] == [("get_current_weather", args0), ("get_user_location", args1)]
    assert r.errors == ()


def test_every_buffer_is_bounded() -> None:
    from ctxlock.errors import ToolCallError

    for text in [
        "<|channel|>commentary to=functions.x " + "a" * 200,
        '<|channel|>commentary to=functions.x<|message|>{"a": "' + "b" * 200,
    ]:
        asm = ToolCallAssembler(TOOLS, "harmony", max_event_size=100)
        with pytest.raises(ToolCallError, match="longer than max_event_size"):
            for k in range(0, len(text), 7):
                asm.feed(text[k : k + 7])
