"""Wire format `granite` (IBM Granite 3.x): `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`.

As vLLM's granite parser reads it (vllm/tool_parsers/granite_tool_parser.py): the marker is the `<|tool_call|>` token
(Granite 3.0, 3.2, 3.3) or the string `<tool_call>` (Granite 3.1), followed by a JSON list of calls; a response that
starts with the list itself (`[{`) is read the same way. There is no closing marker: the calls are complete when
the list's `]` closes. A single object after the marker (`<tool_call>{...}`, Granite 4's form) is read as one call,
complete when the object closes; an optional `</tool_call>` after it is dropped. Granite 4.0 / 4.1 write
`<tool_call>\\n{...}\\n</tool_call>` per call, which the `hermes` format reads.
"""

from __future__ import annotations

from typing import Any

from ctxlock.generation.toolcalls._jsontext import JsonSpan, loads_object, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink, complete_named_object
from ctxlock.request import json_type_name

_MARKERS = ("<|tool_call|>", "<tool_call>")
_CLOSE = "</tool_call>"
_START, _TEXT, _PREFIX, _JSON, _OVERFLOW, _AFTER, _SKIP = range(7)
_HINT = 'write <|tool_call|>[{"name": ..., "arguments": {...}}, ...]'
_MAX_HEAD = 64  # whitespace held back at the start of a response while `[{` may still follow


class GraniteParser:
    """Text and `<|tool_call|>[...]` call lists (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _START
        self.pending = ""
        self.taken = 0  # indexes taken from the sink: the next call's index (this parser is the only taker)
        self.parts: list[str] = []
        self.size = 0
        self.span = JsonSpan()

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, "granite")
        self.pending = ""
        i: int | None = 0
        while i is not None and i < len(t):
            state = self.state
            if state == _START:
                i = self._start(t, i)
            elif state in (_TEXT, _SKIP):
                i = self._text(t, i)
            elif state == _PREFIX:
                i = self._prefix(t, i)
            elif state in (_JSON, _OVERFLOW):
                i = self._json(t, i)
            else:
                i = self._after(t, i)

    def _start(self, t: str, i: int) -> int | None:
        """A response that starts with `[` then `{` is a list of calls without the marker."""
        j = i
        while j < len(t) and t[j].isspace():
            j += 1
        k = j + 1
        while k < len(t) and t[k].isspace():
            k += 1
        if (j < len(t) and t[j] != "[") or (k < len(t) and t[k] != "{"):
            self.state = _TEXT
            return i
        if k >= len(t):
            if len(t) - i > _MAX_HEAD:
                self.state = _TEXT
                return i
            self.pending = t[i:]
            return None
        self.sink.emit_text(t[i:j])
        self._open()
        return j

    def _text(self, t: str, i: int) -> int | None:
        """Text (or, after a malformed call, skipped text) up to the next marker."""
        emit = self.state == _TEXT
        found = [(j, m) for m in _MARKERS if (j := t.find(m, i)) >= 0]
        if not found:
            safe, held = t[i:], ""
            for marker in _MARKERS:
                s, h = split_marker_prefix(t[i:], marker)
                if len(h) > len(held):
                    safe, held = s, h
            if emit:
                self.sink.emit_text(safe)
            self.pending = held
            return None
        j, marker = min(found)
        if emit:
            self.sink.emit_text(t[i:j])
        self.state = _PREFIX
        return j + len(marker)

    def _prefix(self, t: str, i: int) -> int | None:
        n = len(t)
        while i < n and t[i].isspace():
            i += 1
        if i == n:
            return None
        if t[i] in "[{":
            self._open()
            return i
        index = self._take()
        self.sink.fail(
            index,
            self.sink.make_id(index),
            None,
            f"expected a JSON list of calls after the marker, got {t[i : i + 12]!r}",
            path=f"tool_calls[{index}]",
            hint=_HINT,
        )
        self.state = _SKIP
        return i

    def _open(self) -> None:
        self.state = _JSON
        self.parts = []
        self.size = 0
        self.span = JsonSpan()

    def _take(self) -> int:
        self.taken += 1
        return self.sink.new_index()

    def _json(self, t: str, i: int) -> int | None:
        end = self.span.feed(t, i)
        piece = t[i:] if end < 0 else t[i:end]
        if self.state == _JSON:
            self.size += len(piece)
            if self.size > self.sink.max_event_size:
                index = self._take()
                self.sink.fail(
                    index,
                    None,
                    None,
                    f"the tool calls are longer than max_event_size={self.sink.max_event_size} characters",
                    path=f"tool_calls[{index}]",
                    hint="the calls are not released; raise max_event_size if such calls are real",
                )
                self.state = _OVERFLOW
                self.parts = []
            else:
                self.parts.append(piece)
        if end < 0:
            return None
        if self.state == _JSON:
            self._close("".join(self.parts))
        self.parts = []
        self.state = _AFTER
        return end

    def _after(self, t: str, i: int) -> int | None:
        """After the JSON: an optional `</tool_call>` (whitespace before it included) is dropped."""
        j = i
        while j < len(t) and t[j].isspace():
            j += 1
        rest = t[j:]
        if rest.startswith(_CLOSE):
            self.state = _TEXT
            return j + len(_CLOSE)
        if _CLOSE.startswith(rest) and j - i <= _MAX_HEAD:
            self.pending = t[i:]
            return None
        self.state = _TEXT
        return i

    def _close(self, raw: str) -> None:
        value, problem = loads_object(raw)
        if problem is None and isinstance(value, dict):
            index = self._take()
            complete_named_object(self.sink, index, value, f"tool_calls[{index}]")
            return
        if problem is not None or not isinstance(value, list) or not value:
            index = self._take()
            what = problem or ("an empty list" if value == [] else "got " + json_type_name(value))
            self.sink.fail(
                index,
                None,
                None,
                f"the tool calls are not a JSON list of calls: {what}",
                path=f"tool_calls[{index}]",
                hint=_HINT,
            )
            return
        for obj in value:
            index = self._take()
            complete_named_object(self.sink, index, obj, f"tool_calls[{index}]")

    def open_indexes(self) -> list[int]:
        return [self.taken] if self.state in (_PREFIX, _JSON) else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state in (_PREFIX, _JSON):
            where = "before its JSON closed" if self.state == _JSON else "right after its marker"
            self.sink.unfinished([self._take()], finish_reason, where)
        elif self.state in (_START, _TEXT, _AFTER):
            self.sink.emit_text(self.pending)
        self.pending = ""
        self.state = _SKIP
        return finish_reason
