"""Wire format `gigachat3` (GigaChat 3 and 3.1; templates GigaChat3-10B-A1.8B.jinja, GigaChat3.1-10B-A1.8B.jinja):
text, then a header and one JSON object `{"name": ..., "arguments": {...}}`:

    GigaChat 3:    text<|message_sep|>\\n\\nfunction call<|role_sep|>\\n{"name": "f", "arguments": {...}}
    GigaChat 3.1:  text<|function_call|>{"name": "f", "arguments": {...}}

There is no closing marker: as in vLLM's vllm/tool_parsers/gigachat3_tool_parser.py, the call is complete when its
JSON object closes; an end-of-sequence `</s>` written right after it is dropped. The templates write one call per
assistant turn; another header after a call starts another call. An object longer than `sink.max_event_size`
characters is refused.
"""

from __future__ import annotations

from typing import Any

from ctxlock.generation.toolcalls._jsontext import JsonSpan, loads_object, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink, complete_named_object

_HEADERS = ("<|message_sep|>\n\nfunction call<|role_sep|>", "<|function_call|>")
_EOS = "</s>"
_TEXT, _START, _OBJECT, _AFTER = range(4)
_HINT = '<|function_call|>{"name": ..., "arguments": {...}}'


class GigaChat3Parser:
    """Text, then a GigaChat 3 or 3.1 function-call header and one JSON object (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _TEXT
        self.pending = ""
        self.index = -1
        self.parts: list[str] = []
        self.size = 0
        self.span = JsonSpan()

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, self.sink.format.value)
        self.pending = ""
        i: int | None = 0
        while i is not None:
            if self.state == _TEXT:
                i = self._text(t, i)
            elif self.state == _START:
                i = self._start(t, i)
            elif self.state == _OBJECT:
                i = self._object(t, i)
            else:
                i = self._after(t, i)

    def _text(self, t: str, i: int) -> int | None:
        found = [(j, h) for h in _HEADERS if (j := t.find(h, i)) >= 0]
        if not found:
            rest = t[i:]
            self.pending = max((split_marker_prefix(rest, h)[1] for h in _HEADERS), key=len)
            self.sink.emit_text(rest[: len(rest) - len(self.pending)])
            return None
        j, header = min(found)
        self.sink.emit_text(t[i:j])
        self.state = _START
        self.index = self.sink.new_index()
        self.parts, self.size, self.span = [], 0, JsonSpan()
        return j + len(header)

    def _start(self, t: str, i: int) -> int | None:
        while i < len(t) and t[i].isspace():
            i += 1
        if i == len(t):
            return None
        if t[i] != "{":
            self.sink.fail(
                self.index,
                None,
                None,
                f"expected a JSON object after the function-call header, got {t[i : i + 12]!r}",
                path=f"tool_calls[{self.index}]",
                hint=f"write {_HINT}",
            )
            self.state = _TEXT
            return i
        self.state = _OBJECT
        return i

    def _object(self, t: str, i: int) -> int | None:
        end = self.span.feed(t, i)
        piece = t[i:] if end < 0 else t[i:end]
        self.size += len(piece)
        if self.size <= self.sink.max_event_size:
            self.parts.append(piece)
        else:
            self.parts = []
        if end < 0:
            return None
        self.state = _AFTER
        self._close()
        return end

    def _after(self, t: str, i: int) -> int | None:
        """Right after the object: an end-of-sequence `</s>` is dropped."""
        rest = t[i:]
        if rest.startswith(_EOS):
            self.state = _TEXT
            return i + len(_EOS)
        if _EOS.startswith(rest):
            self.pending = rest
            return None
        self.state = _TEXT
        return i

    def _close(self) -> None:
        index = self.index
        path = f"tool_calls[{index}]"
        if self.size > self.sink.max_event_size:
            self.sink.fail(
                index,
                None,
                None,
                f"the call is longer than max_event_size={self.sink.max_event_size} characters",
                path=path,
                hint="the call is not released; raise max_event_size if such a call is real",
            )
            return
        obj, problem = loads_object("".join(self.parts))
        if problem is not None:
            self.sink.fail(
                index, None, None, f"the tool call is not valid JSON: {problem}", path=path, hint=f"write {_HINT}"
            )
            return
        complete_named_object(self.sink, index, obj, path)

    def open_indexes(self) -> list[int]:
        return [self.index] if self.state in (_START, _OBJECT) else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state in (_START, _OBJECT):
            self.sink.unfinished([self.index], finish_reason, "before its JSON object closed")
        elif self.state == _TEXT:
            self.sink.emit_text(self.pending)
        self.pending = ""
        return finish_reason
