"""gpt-oss's completions back into Harmony messages: openai-harmony's `StreamableParser`
(https://github.com/openai/harmony, src/encoding.rs), over a ctxlock tokenizer with Harmony's control tokens.

`HarmonyParser` takes ids one at a time (`process`) and the end of the stream (`process_eos`), and keeps the
messages parsed so far and the one in progress (`current_*`), as openai-harmony's parser does, with the same
results: the header grammar (`<role>[ to=<recipient>]<|channel|><channel>[ <content type>]<|message|>`, a
`<|constrain|>` marker next to the content type, an unknown role with a recipient read as a tool), the stop tokens
(`<|end|>`, `<|call|>`, `<|return|>`), the decoding of message text (invalid UTF-8 becomes U+FFFD, an incomplete
character waits for the next token), and, with `strict=False`, a message whose `<|message|>` never came.
`parse_harmony` is `parse_messages_from_completion_tokens`. A malformed stream is a `HarmonyParseError` naming the
token index; an id the vocabulary does not have is one too (openai-harmony keeps it undecoded).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ctxlock import caches
from ctxlock.errors import HarmonyParseError
from ctxlock.tokenizer import Tokenizer

ROLES = ("user", "assistant", "system", "developer", "tool")
STOP_TOKENS = ("<|end|>", "<|call|>", "<|return|>")
_REPLACEMENT = "\ufffd"
# Rust's char::is_whitespace and str::trim: the Unicode White_Space property.
_WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + ("\u2028\u2029\u202f\u205f\u3000")
)
_ASCII_WHITESPACE = re.compile(r"[\t\n\x0c\r ]+")  # str::split_ascii_whitespace


@dataclass(frozen=True)
class HarmonyMessage:
    """One parsed message: its author (role, and for a tool its name), recipient, channel, content type and text."""

    role: str
    text: str
    name: str | None = None
    recipient: str | None = None
    channel: str | None = None
    content_type: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role}
        for key in ("name", "recipient", "channel", "content_type"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out["text"] = self.text
        return out


@dataclass(frozen=True)
class _Header:
    role: str
    name: str | None
    recipient: str | None
    channel: str | None
    content_type: str | None


class HarmonyParser:
    """openai-harmony's `StreamableParser(encoding, role)`: `role` is the author of the first message when the
    stream starts inside its header (a completion after `<|start|>assistant`), None when it starts with
    `<|start|>`."""

    def __init__(self, tokenizer: Tokenizer, *, role: str | None = "assistant", strict: bool = True) -> None:
        if role is not None and role not in ROLES:
            raise HarmonyParseError(f"unknown role {role!r}", hint=f"one of {', '.join(ROLES)}, or None")
        self._pieces, self._start, self._message, self._stops = _vocabulary(tokenizer)
        self.strict = strict
        self._next_role = role
        self._state = "header" if role is not None else "expect_start"
        self._header: list[int] = []
        self._current: _Header | None = None
        self._content = ""  # the decoded text of the message in progress
        self._undecoded = b""  # bytes of an incomplete (or not yet replaced) UTF-8 sequence
        self.messages: list[HarmonyMessage] = []
        self.tokens: list[int] = []
        self.last_content_delta: str | None = None

    # ------------------------------------------------------------------------------------------- the state

    @property
    def state(self) -> str:
        """Where the parser is: `expect_start`, `header` or `content`."""
        return self._state

    @property
    def current_role(self) -> str | None:
        return self._current.role if self._current is not None else self._next_role

    @property
    def current_channel(self) -> str | None:
        return self._current.channel if self._current is not None else None

    @property
    def current_recipient(self) -> str | None:
        return self._current.recipient if self._current is not None else None

    @property
    def current_content_type(self) -> str | None:
        return self._current.content_type if self._current is not None else None

    @property
    def current_content(self) -> str:
        return self._content if self._current is not None else ""

    # -------------------------------------------------------------------------------------------- feeding

    def process(self, token: int) -> None:
        """Take the next id."""
        self.tokens.append(token)
        self._step(token)

    def process_eos(self) -> None:
        """The stream ended: a message in progress is finished as it stands."""
        self._step(None)

    def _fail(self, message: str, hint: str) -> HarmonyParseError:
        return HarmonyParseError(message, path=f"ids[{max(len(self.tokens) - 1, 0)}]", hint=hint)

    def _step(self, token: int | None) -> None:
        if token is not None and not 0 <= token < len(self._pieces):
            raise self._fail(f"id {token} is not in the vocabulary", "the ids are not gpt-oss's")
        if self._state == "expect_start":
            if token is None:
                return  # the end right after a stop token
            if token != self._start:
                raise self._fail(
                    f"unexpected token {token} while expecting the start token {self._start}",
                    "a message starts with <|start|>",
                )
            self._state, self._header = "header", []
        elif self._state == "header":
            self._header_step(token)
        else:
            self._content_step(token)

    def _header_step(self, token: int | None) -> None:
        if token == self._message:
            header = self._parse_header(self._header, self._next_role)
            self._next_role, self._current, self._state = None, header, "content"
            self._content, self._undecoded, self.last_content_delta = "", b"", None
        elif token is not None and not self.strict and token in self._stops:
            # No <|message|> before a stop token: with a known role, the header's words are the text.
            if self._next_role is not None and self._header:
                header, rest = self._parse_header_text(self._decode_header(self._header), self._next_role, False)
                self.messages.append(_message(header, rest or ""))
            self._state, self._next_role = "expect_start", None
        elif token is not None:
            self._header.append(token)
        else:
            raise self._fail(
                "the stream ended inside a message header", "the completion was cut off before <|message|>"
            )

    def _content_step(self, token: int | None) -> None:
        assert self._current is not None
        if token is not None and token not in self._stops:
            self._undecoded += self._pieces[token]
            try:
                delta = self._undecoded.decode("utf-8")
                self._undecoded = b""
            except UnicodeDecodeError as exc:
                delta = self._undecoded[: exc.start].decode("utf-8")
                if exc.reason == "unexpected end of data" and exc.end == len(self._undecoded):
                    self._undecoded = self._undecoded[exc.start :]  # an incomplete character: wait
                else:  # one invalid sequence replaced; what follows waits for the next token, as openai-harmony does
                    delta += _REPLACEMENT
                    self._undecoded = self._undecoded[exc.end :]
            self._content += delta
            self.last_content_delta = delta or None
            return
        text = self._content + self._undecoded.decode("utf-8", "replace")
        self.messages.append(_message(self._current, text))
        self._state, self._current, self.last_content_delta = "expect_start", None, None
        self._content, self._undecoded = "", b""

    # ------------------------------------------------------------------------------------------ the header

    def _decode_header(self, ids: list[int]) -> str:
        try:
            return b"".join(self._pieces[i] for i in ids).decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail("could not decode the message header", "the header is not valid UTF-8") from None

    def _parse_header(self, ids: list[int], role: str | None) -> _Header:
        header, rest = self._parse_header_text(self._decode_header(ids), role, True)
        if rest is not None:
            raise self._fail(
                f"unexpected tokens remaining in message header: {rest!r}",
                "a header is the role, an optional to=RECIPIENT, <|channel|>CHANNEL and an optional content type",
            )
        return header

    def _parse_header_text(self, text: str, role: str | None, typed: bool) -> tuple[_Header, str | None]:
        channel = None
        at = text.find("<|channel|>")
        if at >= 0:
            after = text[at + len("<|channel|>") :]
            end = next((k for k, c in enumerate(after) if c in _WHITE_SPACE or c == "<"), len(after))
            if end == 0:
                raise self._fail("channel marker present but no channel value found in header", "name the channel")
            channel = after[:end]
            text = text[:at] + after[end:]
        text = text.strip(_WHITE_SPACE)
        if "<|constrain|>" in text:
            text = text.replace("<|constrain|>", " <|constrain|>").strip(_WHITE_SPACE)
        parts = [p for p in _ASCII_WHITESPACE.split(text) if p]
        name = None
        if role is None:
            if not parts:
                raise self._fail("message header did not contain a role", "a header starts with its role")
            name = parts[0]
            if parts[0] in ROLES:
                role = parts[0]
            elif len(parts) > 1 or parts[0].startswith("to="):
                parts.pop(0)  # an unknown author with a recipient: a tool
                role = "tool"
            else:
                raise self._fail(f"Unknown role: {parts[0]}", f"one of {', '.join(ROLES)}")
        if parts and parts[0] == role:
            parts.pop(0)
        recipient = content_type = None
        if typed and parts:
            count, last = len(parts), parts.pop()
            if last.startswith("to="):
                recipient = last[3:]
            elif count == 1:
                recipient = last
            else:
                content_type = last
                if parts:
                    raw = parts.pop()
                    recipient = raw[3:] if raw.startswith("to=") else raw
        rest = " ".join(parts) if parts else None
        return _Header(role, name if role == "tool" else None, recipient, channel, content_type), rest


_Vocabulary = tuple[tuple[bytes, ...], int, int, frozenset[int]]
# Each id's bytes and the Harmony control ids, per tokenizer (by its digest): building the byte table of a
# 201,088-entry vocabulary takes about 70 ms, and a server makes a parser per response.
_vocabularies: caches.LRU[str, _Vocabulary] = caches.LRU("harmony.vocabularies", max_items=4, scope="artifact")


def _vocabulary(tokenizer: Tokenizer) -> _Vocabulary:
    found = _vocabularies.get(tokenizer.sha256)
    if found is not None:
        return found
    pieces = tokenizer.token_bytes()

    def control(text: str) -> int:
        found = tokenizer.token_to_id(text)
        if found is None or found not in pieces.special:
            raise HarmonyParseError(
                f"the vocabulary has no control token {text}",
                path=tokenizer.id,
                hint="parse Harmony with gpt-oss's vocabulary (ctxlock.load('gpt-oss'))",
            )
        return found

    made = (pieces.pieces, control("<|start|>"), control("<|message|>"), frozenset(control(t) for t in STOP_TOKENS))
    _vocabularies.put(tokenizer.sha256, made)
    return made


def _message(header: _Header, text: str) -> HarmonyMessage:
    return HarmonyMessage(
        role=header.role,
        text=text,
        name=header.name,
        recipient=header.recipient,
        channel=header.channel,
        content_type=header.content_type,
    )


def parse_harmony(
    tokenizer: Tokenizer, ids: Iterable[int], *, role: str | None = "assistant", strict: bool = True
) -> list[HarmonyMessage]:
    """openai-harmony's `parse_messages_from_completion_tokens(ids, role)`: every id, then the end of the stream."""
    parser = HarmonyParser(tokenizer, role=role, strict=strict)
    for token in ids:
        parser.process(token)
    parser.process_eos()
    return parser.messages


__all__ = ["HarmonyMessage", "HarmonyParser", "parse_harmony"]
