"""Wire format `harmony` (gpt-oss): Harmony messages as text, special tokens kept, after the prompt's
`<|start|>assistant`:

    <|channel|>analysis<|message|>reasoning<|end|>
    <|start|>assistant<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

(openai-harmony's format: https://cookbook.openai.com/articles/openai-harmony). Each message is a header (role,
`<|channel|>`, `to=` recipient, content type) up to `<|message|>`, then its content up to `<|end|>`, `<|call|>` or
`<|return|>`. A message with a recipient is a tool call: `functions.NAME` calls the declared function NAME; any
other recipient (gpt-oss's built-in `browser.search`, `python`) is kept as the name, so it is refused unless such a
tool is declared. The `analysis` channel is reasoning (`Result.thinking`), `final` and commentary preambles (no
recipient) are text.

A call is complete at its `<|call|>`, or when the stream ends normally inside its content: `<|call|>` is a stop
token, and servers often do not stream it. A response cut off inside a call (a length stop) gives no call.
"""

from __future__ import annotations

import re
from typing import Any

from ctxlock.errors import ToolCallError
from ctxlock.generation.toolcalls._events import NORMAL_STOPS
from ctxlock.generation.toolcalls._jsontext import loads_object, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink

_START, _MESSAGE = "<|start|>", "<|message|>"
_STOPS = ("<|end|>", "<|call|>", "<|return|>")
_MARKERS = (_START, _MESSAGE, *_STOPS)
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=\s|<\||$)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\S+?)(?=\s|<\||$)")

_HEADER, _CONTENT, _BETWEEN = 0, 1, 2


def _held(text: str) -> tuple[str, str]:
    """Split off a suffix of `text` that may still become a marker (they all start with "<|")."""
    j = text.rfind("<|")
    if j >= 0 and any(m.startswith(text[j:]) for m in _MARKERS) and "|>" not in text[j + 2 :]:
        return text[:j], text[j:]
    if text.endswith("<"):
        return text[:-1], "<"
    return text, ""


class HarmonyParser:
    """Harmony messages as text: calls from commentary messages with a recipient, reasoning, text."""

    ended: str | None = None

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _HEADER  # the completion starts inside the first message's header, after <|start|>assistant
        self.pending = ""  # a possible marker prefix
        self.header_parts: list[str] = []
        self.header_size = 0
        self.parts: list[str] = []
        self.size = 0
        self.channel: str | None = None
        self.recipient: str | None = None
        self.index = -1

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, self.sink.format.value)
        self.pending = ""
        i = 0
        while i < len(t):
            if self.state == _BETWEEN:
                i = self._between(t, i)
            elif self.state == _HEADER:
                i = self._in_header(t, i)
            else:
                i = self._in_content(t, i)

    def _between(self, t: str, i: int) -> int:
        j = t.find(_START, i)
        if j < 0:
            stray, self.pending = _held(t[i:])
            self._stray(stray)
            return len(t)
        self._stray(t[i:j])
        self.state, self.header_parts, self.header_size = _HEADER, [], 0
        return j + len(_START)

    def _stray(self, text: str) -> None:
        if text.strip():
            self.sink.note(f"text between Harmony messages kept as text: {text[:60]!r}")
            self.sink.emit_text(text)

    def _in_header(self, t: str, i: int) -> int:
        j = t.find(_MESSAGE, i)
        if j < 0:
            body, self.pending = _held(t[i:])
            self._grow_header(body)
            return len(t)
        self._grow_header(t[i:j])
        self._open_message()
        return j + len(_MESSAGE)

    @property
    def header(self) -> str:
        return "".join(self.header_parts)

    def _grow_header(self, text: str) -> None:
        self.header_parts.append(text)
        self.header_size += len(text)
        if self.header_size > self.sink.max_event_size:
            raise self._too_big("message header")

    def _too_big(self, what: str) -> ToolCallError:
        return ToolCallError(
            f"a Harmony {what} is longer than max_event_size ({self.sink.max_event_size} characters)",
            path="stream",
            hint="this is not gpt-oss output, or raise max_event_size",
        )

    def _open_message(self) -> None:
        header = self.header
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        self.channel = channel.group(1) if channel else None
        self.recipient = recipient.group(1) if recipient else None
        self.state, self.parts, self.size = _CONTENT, [], 0
        if self.recipient is not None:
            self.index = self.sink.new_index()

    def _in_content(self, t: str, i: int) -> int:
        hits = [(t.find(s, i), s) for s in _STOPS]
        found = [(j, s) for j, s in hits if j >= 0]
        if not found:
            body, self.pending = _held(t[i:])
            self._content(body)
            return len(t)
        j, stop = min(found)
        self._content(t[i:j])
        self._close_message(stop)
        self.state = _BETWEEN
        return j + len(stop)

    def _content(self, text: str) -> None:
        if not text:
            return
        if self.recipient is not None:
            self.parts.append(text)
            self.size += len(text)
            if self.size > self.sink.max_event_size:
                raise self._too_big("tool call")
        elif self.channel == "analysis":
            self.sink.emit_thinking(text)
        else:
            self.sink.emit_text(text)

    def _close_message(self, stop: str) -> None:
        if self.recipient is None:
            return
        index, name = self.index, self.recipient.removeprefix("functions.")
        self.recipient = None
        raw = "".join(self.parts).strip()
        args, problem = loads_object(raw)
        if problem is not None:
            self.sink.fail(
                index,
                None,
                name,
                f"the arguments of the call to {name!r} are not a JSON object: {problem}",
                path=f"tool_calls[{index}].arguments",
                hint="gpt-oss writes the arguments as JSON after <|constrain|>json<|message|>",
            )
            return
        if stop != "<|call|>":
            self.sink.note(f"tool_calls[{index}] ended with {stop} rather than <|call|>")
        self.sink.complete(index, None, name, args, raw, f"tool_calls[{index}].name")

    def open_indexes(self) -> list[int]:
        return [self.index] if self.state == _CONTENT and self.recipient is not None else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _CONTENT and self.recipient is not None:
            if finish_reason in NORMAL_STOPS:  # <|call|> was the stop token, not streamed
                self._content(self.pending)
                self.pending = ""
                self._close_message("<|call|>")
            else:
                self.sink.unfinished([self.index], finish_reason, "before <|call|>", name=self.recipient)
            return finish_reason
        if self.state == _CONTENT:
            self._content(self.pending)
        elif self.state == _HEADER and (recipient := _RECIPIENT.search(self.header)) is not None:
            # A call had begun: its header names the recipient, and the stream ended before its arguments.
            name = recipient.group(1).removeprefix("functions.")
            self.sink.unfinished([self.sink.new_index()], finish_reason, "in its header, before <|message|>", name=name)
        self.pending = ""
        return finish_reason
