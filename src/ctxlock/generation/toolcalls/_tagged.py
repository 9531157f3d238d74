"""The `<tool_call>` ... `</tool_call>` framing that `hermes`, `qwen3_coder`, `glm45` and `seed_oss` share: text,
then a tagged body, repeated. Each format subclasses `TaggedParser` and parses the body its own way (`seed_oss`
with its own markers, `<seed:tool_call>` ... `</seed:tool_call>`)."""

from __future__ import annotations

from typing import Any

from ctxlock.generation.toolcalls._jsontext import split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink

# Raw text: <tool_call> ... </tool_call> (hermes, qwen3_coder, glm45)

_TEXT, _BODY, _QUOTED = 0, 1, 2
_TOOL_CALL_OPEN = "<tool_call>"
_TOOL_CALL_CLOSE = "</tool_call>"


class TaggedParser:
    """Text, then `open_marker` body `close_marker`, repeated. Subclasses parse the body.

    A body longer than `sink.max_event_size` characters is refused at once (not buffered): the rest of it, up to
    its closing marker, is skipped."""

    ended: str | None = None  # the finish reason says how the stream ended
    open_marker = _TOOL_CALL_OPEN
    close_marker = _TOOL_CALL_CLOSE
    # A region of text in which `open_marker` is text, not a call (seed_oss: its <seed:think> reasoning), or None.
    quote_open: str | None = None
    quote_close = ""

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _TEXT
        self.pending = ""  # a possible marker prefix, not yet classified
        self.index = -1
        self.parts: list[str] = []
        self.size = 0  # characters of the current body
        self.oversized = False  # the current body was refused for its size; skipped up to its closing marker

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, self.sink.format.value)
        self.pending = ""
        i = 0
        n = len(t)
        opening, closing = self.open_marker, self.close_marker
        while i <= n:
            if self.state == _QUOTED:
                i = self._quoted(t, i)
                if i < 0:
                    return
            elif self.state == _TEXT:
                j = t.find(opening, i)
                k = t.find(self.quote_open, i, j if j >= 0 else n) if self.quote_open else -1
                if k >= 0:  # the quoted region starts first: its text is text up to its close
                    self.sink.emit_text(t[i:k])
                    i = k
                    self.state = _QUOTED
                    continue
                if j < 0:
                    self._text_tail(t[i:])
                    return
                self.sink.emit_text(t[i:j])
                i = j + len(opening)
                self.state = _BODY
                self.index = self.sink.new_index()
                self.parts = []
                self.size = 0
                self.oversized = False
                self._start_body()
            else:
                j = t.find(closing, i)
                if j < 0:
                    body, self.pending = split_marker_prefix(t[i:], closing)
                    self._take(body)
                    return
                self._take(t[i:j])
                i = j + len(closing)
                if self.oversized or self._closes_here():
                    self.state = _TEXT
                    if not self.oversized:
                        self._close("".join(self.parts))
                else:
                    self._take(closing)

    def _text_tail(self, text: str) -> None:
        """Text with no marker in it: all of it but a possible start of a marker."""
        safe, self.pending = split_marker_prefix(text, self.open_marker)
        if self.quote_open:
            quoted_safe, quoted_pending = split_marker_prefix(text, self.quote_open)
            if len(quoted_pending) > len(self.pending):
                safe, self.pending = quoted_safe, quoted_pending
        self.sink.emit_text(safe)

    def _quoted(self, t: str, i: int) -> int:
        """Inside a quoted region (its opening tag at or before `i`): its text is text. The index past its close,
        or -1 once `t` is used up."""
        j = t.find(self.quote_close, i)
        if j < 0:
            safe, self.pending = split_marker_prefix(t[i:], self.quote_close)
            self.sink.emit_text(safe)
            return -1
        end = j + len(self.quote_close)
        self.sink.emit_text(t[i:end])
        self.state = _TEXT
        return end

    def _take(self, text: str) -> None:
        """Body text, within the size bound."""
        if self.oversized:
            return
        self.size += len(text)
        if self.size > self.sink.max_event_size:
            self.oversized = True
            self.parts = []
            self.sink.fail(
                self.index,
                None,
                None,
                f"the tool call is longer than max_event_size={self.sink.max_event_size} characters",
                path=f"tool_calls[{self.index}]",
                hint="the call is not released; raise max_event_size if such calls are real",
            )
            return
        self._body(text)

    def open_indexes(self) -> list[int]:
        return [self.index] if self.state == _BODY and not self.oversized else []

    def _start_body(self) -> None:
        pass

    def _body(self, text: str) -> None:
        if text:
            self.parts.append(text)

    def _closes_here(self) -> bool:
        return True

    def _close(self, body: str) -> None:
        raise NotImplementedError

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state != _BODY:
            self.sink.emit_text(self.pending)
            self.pending = ""
        elif not self.oversized:  # an oversized call was refused already
            self.sink.unfinished([self.index], finish_reason, f"before {self.close_marker}")
        return finish_reason
