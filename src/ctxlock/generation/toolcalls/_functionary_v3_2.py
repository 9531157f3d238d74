"""Wire format `functionary_v3_2` (MeetKai functionary-medium-v3.2; template meetkai-functionary-medium-v3.2.jinja):
the answer is a list of messages, each a recipient line and its content, separated by `>>>`:

    all
    Let me look.>>>get_weather
    {"city": "Paris"}>>>search
    {"query": "rain"}

The generation prompt ends with `>>>`, so the model's output starts with the first recipient. The recipient `all`
is text; any other is a call whose content is its JSON arguments (`python`, llama.cpp's built-in code tool, may
also write raw code: it becomes `{"code": ...}`, as llama.cpp's common/chat.cpp reads it). A call is complete when
the next `>>>` is seen outside a JSON string, or when the stream ends normally inside it (the end of the turn is
the `<|eot_id|>` stop token, which servers do not stream); a call still open at any other end is unfinished.
A first line that is not a recipient (not a bare name, or empty) is text. A call longer than `sink.max_event_size`
characters is refused and skipped up to the next `>>>`."""

from __future__ import annotations

import re
from typing import Any

from ctxlock.generation.toolcalls._events import NORMAL_STOPS
from ctxlock.generation.toolcalls._jsontext import JsonSpan, loads_object, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink

_SEP = ">>>"
_RECIPIENT, _TEXT, _CALL, _SKIP = range(4)
_NAME_CHARS = re.compile(r"[\w.\-]*")
_MAX_NAME = 256  # a longer first line is text (tool names are short; OpenAI allows 64 characters)
_HINT = 'write >>>name, a newline, then the arguments as one JSON object: >>>get_weather\\n{"city": "Paris"}'


class FunctionaryV32Parser:
    """Recipient lines and their contents, separated by `>>>` (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _RECIPIENT
        self.pending = ""  # a possible `>>>` prefix (text), or the recipient read so far
        self.index = -1
        self.name = ""
        self.parts: list[str] = []
        self.size = 0
        self.span: JsonSpan | None = None  # the call's content is JSON (tracked to see `>>>` inside a string)
        self.lead = ""  # the first non-blank character of the call's content

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, self.sink.format.value)
        self.pending = ""
        i: int | None = 0
        while i is not None:
            if self.state == _RECIPIENT:
                i = self._recipient(t, i)
            elif self.state == _TEXT:
                i = self._text(t, i)
            else:
                i = self._call(t, i)

    def _recipient(self, t: str, i: int) -> int | None:
        j = t.find("\n", i)
        name = t[i:] if j < 0 else t[i:j]
        if _NAME_CHARS.fullmatch(name) is None or len(name) > _MAX_NAME or j == i:
            self.state = _TEXT  # not a recipient line (an empty line neither): the output is text
            return i
        if j < 0:
            self.pending = name
            return None
        if name == "all":
            self.state = _TEXT
        else:
            self.state = _CALL
            self.index = self.sink.new_index()
            self.name = name
            self.parts, self.size, self.span, self.lead = [], 0, None, ""
        return j + 1

    def _text(self, t: str, i: int) -> int | None:
        j = t.find(_SEP, i)
        if j < 0:
            safe, self.pending = split_marker_prefix(t[i:], _SEP)
            self.sink.emit_text(safe)
            return None
        self.sink.emit_text(t[i:j])
        self.state = _RECIPIENT
        return j + len(_SEP)

    def _call(self, t: str, i: int) -> int | None:
        """Inside a call's content (or skipping the rest of one that was too long), up to `>>>`."""
        while True:
            j = t.find(_SEP, i)
            if j < 0:
                body, self.pending = split_marker_prefix(t[i:], _SEP)
                self._take(body)
                return None
            self._take(t[i:j])
            i = j + len(_SEP)
            if self.span is not None and self.span.in_string:  # `>>>` inside a JSON string is content
                self._take(_SEP)
                continue
            if self.state == _CALL:
                self._close("".join(self.parts))
            self.state = _RECIPIENT
            return i

    def _take(self, text: str) -> None:
        if self.state == _SKIP or not text:
            return
        self.size += len(text)
        if self.size > self.sink.max_event_size:
            self.state = _SKIP
            self.parts, self.span = [], None  # skipped up to the next >>>, wherever it is
            self.sink.fail(
                self.index,
                None,
                self.name,
                f"the call is longer than max_event_size={self.sink.max_event_size} characters",
                path=f"tool_calls[{self.index}]",
                hint="the call is not released; raise max_event_size if such a call is real",
            )
            return
        self.parts.append(text)
        if self.span is None and not self.lead:
            stripped = text.lstrip()
            if stripped:
                self.lead = stripped[0]
                if self.lead in "{[":
                    self.span = JsonSpan()
                    self.span.feed(stripped)
            return
        if self.span is not None:
            self.span.feed(text)

    def _close(self, body: str) -> None:
        index = self.index
        path = f"tool_calls[{index}]"
        args, problem = loads_object(body.strip())
        if problem is not None and self.name == "python" and self.span is None:
            args, problem = {"code": body}, None  # llama.cpp: python's content may be the code itself
        if problem is not None:
            self.sink.fail(
                index, None, self.name, f"arguments are not valid JSON: {problem}", path=f"{path}.arguments", hint=_HINT
            )
            return
        self.sink.complete(index, None, self.name, args, body.strip(), f"{path}.name")

    def open_indexes(self) -> list[int]:
        return [self.index] if self.state == _CALL else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state in (_RECIPIENT, _TEXT):  # a recipient line without its newline is text
            self.sink.emit_text(self.pending)
        elif self.state == _CALL:
            if finish_reason in NORMAL_STOPS:  # <|eot_id|> was the stop token, not streamed
                self._take(self.pending)
                if self.state == _CALL:
                    self._close("".join(self.parts))
            else:
                self.sink.unfinished([self.index], finish_reason, "before >>> or the end of the turn", name=self.name)
        self.pending = ""
        self.state = _RECIPIENT
        return finish_reason
