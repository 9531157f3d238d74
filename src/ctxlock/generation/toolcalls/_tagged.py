"""The `<tool_call>` ... `</tool_call>` framing that `hermes` and `qwen3_coder` share: text, then a tagged
body, repeated. Each format subclasses `TaggedParser` and parses the body its own way."""

from __future__ import annotations

from typing import Any

from ctxlock.generation.toolcalls._jsontext import split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink

# Raw text: <tool_call> ... </tool_call> (hermes, qwen3_coder)

_TEXT, _BODY = 0, 1
_TOOL_CALL_OPEN = "<tool_call>"
_TOOL_CALL_CLOSE = "</tool_call>"


class TaggedParser:
    """Text, then `<tool_call>` body `</tool_call>`, repeated. Subclasses parse the body."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _TEXT
        self.pending = ""  # a possible marker prefix, not yet classified
        self.index = -1
        self.parts: list[str] = []

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, self.sink.format.value)
        self.pending = ""
        i = 0
        n = len(t)
        while i <= n:
            if self.state == _TEXT:
                j = t.find(_TOOL_CALL_OPEN, i)
                if j < 0:
                    safe, self.pending = split_marker_prefix(t[i:], _TOOL_CALL_OPEN)
                    self.sink.emit_text(safe)
                    return
                self.sink.emit_text(t[i:j])
                i = j + len(_TOOL_CALL_OPEN)
                self.state = _BODY
                self.index = self.sink.new_index()
                self.parts = []
                self._start_body()
            else:
                j = t.find(_TOOL_CALL_CLOSE, i)
                if j < 0:
                    body, self.pending = split_marker_prefix(t[i:], _TOOL_CALL_CLOSE)
                    self._body(body)
                    return
                self._body(t[i:j])
                i = j + len(_TOOL_CALL_CLOSE)
                if self._closes_here():
                    self.state = _TEXT
                    self._close("".join(self.parts))
                else:
                    self._body(_TOOL_CALL_CLOSE)

    def open_indexes(self) -> list[int]:
        return [self.index] if self.state == _BODY else []

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
        if self.state == _TEXT:
            self.sink.emit_text(self.pending)
            self.pending = ""
        else:
            self.sink.unfinished([self.index], finish_reason, f"before {_TOOL_CALL_CLOSE}")
        return finish_reason
