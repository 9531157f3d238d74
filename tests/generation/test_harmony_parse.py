"""gpt-oss completions parsed back into Harmony messages: ctxlock's `HarmonyParser` against openai-harmony 0.0.8's
`StreamableParser` (offline, tests/harmony_reference.py), token by token: after every id the parsed messages and
the message in progress (role, channel, recipient, content type, text, last delta) are equal, and so are the
messages of every prefix ended there (a response cut off at any point), or both refuse it. The streams are
openai-harmony's own test cases (tests/test_harmony.py and test-data/) and generated ones."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
from ctxlock.errors import HarmonyParseError
from ctxlock.generation import HarmonyMessage, HarmonyParser, parse_harmony
from harmony_reference import encoding
from hypothesis_profiles import examples

pytestmark = pytest.mark.reference


@cache
def _tokenizer() -> Any:
    return ctxlock.load("gpt-oss").tokenizer


def _theirs(message: Any) -> HarmonyMessage:
    assert len(message.content) == 1
    return HarmonyMessage(
        role=message.author.role.value,
        text=message.content[0].text,
        name=message.author.name,
        recipient=message.recipient,
        channel=message.channel,
        content_type=message.content_type,
    )


def _state(parser: Any, ours: bool) -> tuple[Any, ...]:
    if ours:
        return (
            [m for m in parser.messages],
            parser.current_role,
            parser.current_channel,
            parser.current_recipient,
            parser.current_content_type,
            parser.current_content,
            parser.last_content_delta,
        )
    role = parser.current_role
    return (
        [_theirs(m) for m in parser.messages],
        None if role is None else role.value,
        parser.current_channel,
        parser.current_recipient,
        parser.current_content_type,
        parser.current_content,
        parser.last_content_delta,
    )


def _compare(ids: list[int], role: str | None, strict: bool = True) -> None:
    """Token by token, the two parsers' states; then, at every cut, the messages of the prefix."""
    from openai_harmony import HarmonyError, Role, StreamableParser

    ref_role = None if role is None else Role(role)
    ours = HarmonyParser(_tokenizer(), role=role, strict=strict)
    theirs = StreamableParser(encoding(), ref_role, strict=strict)
    for k, token in enumerate(ids):
        failed = None
        try:
            theirs.process(token)
        except HarmonyError as exc:
            failed = exc
        if failed is not None:
            with pytest.raises(HarmonyParseError) as refused:
                ours.process(token)
            assert refused.value.path == f"ids[{k}]"
            return
        ours.process(token)
        assert _state(ours, True) == _state(theirs, False), (k, encoding().decode_utf8(ids[: k + 1]))
    for cut in range(len(ids) + 1):
        try:
            expected = [
                _theirs(m) for m in encoding().parse_messages_from_completion_tokens(ids[:cut], ref_role, strict=strict)
            ]
        except HarmonyError:
            with pytest.raises(HarmonyParseError):
                parse_harmony(_tokenizer(), ids[:cut], role=role, strict=strict)
            continue
        assert parse_harmony(_tokenizer(), ids[:cut], role=role, strict=strict) == expected, cut


def _ids(text: str) -> list[int]:
    return list(encoding().encode(text, allowed_special="all"))


# openai-harmony's test streams (tests/test_harmony.py), as text with their control tokens.
CASES: dict[str, tuple[str, str | None, bool]] = {
    "simple_reasoning_response": (
        '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.<|end|>'
        "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
        "assistant",
        True,
    ),
    "simple_tool_call": (
        '<|channel|>analysis<|message|>User asks: "What is the weather in Tokyo?" We need to use lookup_weather '
        'tool.<|end|><|start|>assistant<|channel|>analysis to=lookup_weather code<|message|>{"location": "Tokyo"}'
        "<|call|>",
        "assistant",
        True,
    ),
    "constrain_with_space": (
        "<|start|>assistant to=functions.get_weather<|channel|>commentary"
        ' <|constrain|>json<|message|>{"location": "Tokyo"}<|call|>',
        None,
        True,
    ),
    "constrain_adjacent": (
        "<|start|>assistant to=functions.get_weather<|channel|>commentary"
        '<|constrain|>json<|message|>{"location": "Tokyo"}<|call|>',
        None,
        True,
    ),
    "channel_before_recipient": (
        "<|start|>assistant<|channel|>commentary to=functions.get_weather"
        '<|constrain|>json<|message|>{"latitude":48.8566,"longitude":2.3522}<|call|>',
        None,
        True,
    ),
    "tool_response": (
        '<|start|>browser.search to=assistant<|channel|>commentary<|message|>{"result": "https://openai.com/"}',
        None,
        True,
    ),
    "missing_message_token_strict": (
        "I must refuse<|end|><|start|>assistant<|channel|>analysis<|message|>We must refuse<|end|>"
        "<|start|>assistant<|channel|>final<|message|>I'm sorry, but I can't help with that.<|return|>",
        "assistant",
        True,
    ),
    "missing_message_token_lenient": (
        "I must refuse<|end|><|start|>assistant<|channel|>analysis<|message|>We must refuse<|end|>"
        "<|start|>assistant<|channel|>final<|message|>I'm sorry, but I can't help with that.<|return|>",
        "assistant",
        False,
    ),
    "missing_message_token_with_channel": (
        "<|channel|>final I must refuse<|end|><|start|>assistant<|channel|>final<|message|>No.<|return|>",
        "assistant",
        False,
    ),
    "missing_message_token_tool_call": (
        "to=functions.get_weather<|channel|>commentary json {}<|call|>",
        "assistant",
        False,
    ),
    "unknown_role_without_recipient": ("<|start|>robot<|message|>hi<|end|>", None, True),
    "empty_channel": ("<|start|>assistant<|channel|><|message|>hi<|end|>", None, True),
    "no_start": ("hello<|end|>", None, True),
    "streamable_parser": (
        "<|start|>assistant<|channel|>analysis<|message|>Thinking…<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>One moment.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done: 天空 😀<|return|>",
        None,
        True,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_openai_harmony_test_streams_parse_alike_at_every_token(name: str) -> None:
    text, role, strict = CASES[name]
    _compare(_ids(text), role, strict)


def test_invalid_and_split_utf8_in_message_text() -> None:
    """openai-harmony's UTF-8 tests: a character split across tokens waits; an invalid byte becomes U+FFFD, one
    invalid sequence per token, as its parser replaces them (and the end of the stream decodes what is left)."""
    head = _ids("<|start|>assistant<|channel|>final<|message|>")
    pieces = _tokenizer().token_bytes().pieces
    single = {b: i for i, b in enumerate(pieces) if len(b) == 1}
    two = [i for i, b in enumerate(pieces) if len(b) == 2 and b[0] >= 0x80 and b[1] >= 0x80][:30]
    bodies = [
        [single[b"\xe4"], single[b"\xbd"], single[b"\xa0"]],  # 你, one byte per token
        [single[b"\xe4"], single[b"\xbd"]],  # cut off inside the character
        [single[b"\xff"], single[b"a"]],
        [single[b"\xe4"], single[b"a"], single[b"\x80"], single[b"\x80"]],
        two,
        [single[b"\xf0"], single[b"\x9f"], single[b"\x98"], *_ids("x"), single[b"\x80"]],
    ]
    for body in bodies:
        _compare(head + body + _ids("<|end|>"), None)
        _compare(head + body, None)


def test_a_vocabulary_without_harmony_tokens_is_refused() -> None:
    with pytest.raises(HarmonyParseError, match="no control token <\\|start\\|>"):
        HarmonyParser(ctxlock.load("book").tokenizer)
    with pytest.raises(HarmonyParseError, match="not in the vocabulary") as exc:
        parse_harmony(_tokenizer(), [*_ids("<|start|>assistant<|message|>"), 10**7])
    assert exc.value.path == "ids[3]"


# ----------------------------------------------------------------------------------------------- generated

_PIECES = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
    "assistant",
    "user",
    "tool",
    "functions.lookup",
    " to=functions.lookup",
    " to=assistant",
    "analysis",
    "final",
    "commentary",
    " json",
    " ",
    "\n",
    "hello world",
    "天空",
    '{"a": 1}',
]


@st.composite
def _streams(draw: Any) -> tuple[list[int], str | None, bool]:
    """Mostly well-formed messages with the occasional wrong piece, as text; some raw bytes mixed in."""
    parts: list[int] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 3)) == 0:
            text = "".join(draw(st.lists(st.sampled_from(_PIECES), max_size=8)))
        else:
            role = draw(st.sampled_from(["assistant", "assistant", "user", "functions.lookup"]))
            recipient = draw(st.sampled_from(["", " to=functions.lookup", " to=assistant"]))
            channel = draw(st.sampled_from(["analysis", "commentary", "final"]))
            ctype = draw(st.sampled_from(["", " json", " <|constrain|>json", "<|constrain|>json"]))
            body = draw(st.text(max_size=12) | st.sampled_from(_PIECES))
            end = draw(st.sampled_from(["<|end|>", "<|call|>", "<|return|>", ""]))
            text = f"<|start|>{role}{recipient}<|channel|>{channel}{ctype}<|message|>{body}{end}"
        parts.extend(_ids(text))
        if draw(st.integers(0, 5)) == 0:
            parts.append(draw(st.integers(0, 255)))  # a single-byte token: maybe half a character
    role = draw(st.sampled_from([None, "assistant"]))
    if role == "assistant" and parts[:1] == _ids("<|start|>"):
        parts = parts[1:]
        if parts[:1] == _ids("assistant"):
            parts = parts[1:]
    return parts, role, draw(st.booleans())


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_streams())
def test_generated_streams_parse_alike_at_every_token(stream: tuple[list[int], str | None, bool]) -> None:
    ids, role, strict = stream
    _compare(ids, role, strict)
