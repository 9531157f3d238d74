"""Wire format `nemotron_json` (NVIDIA Nemotron Nano v2 and the Llama-Nemotron JSON convention; template
NVIDIA-Nemotron-Nano-v2.jinja): text, then

    <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]</TOOLCALL>

a JSON array of `{"name", "arguments"}` objects (a single object is taken as a list of one, and the arguments may be
a JSON string, as in vLLM's vllm/tool_parsers/nemotron_json_tool_parser.py). The calls are complete when
`</TOOLCALL>` is seen outside a JSON string; each is then released or refused on its own. A block longer than
`sink.max_event_size` characters is refused whole.
"""

from __future__ import annotations

from typing import Any

from ctxlock.generation.toolcalls._jsontext import JsonSpan, loads_object, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink, complete_named_object
from ctxlock.request import json_type_name

_OPEN = "<TOOLCALL>"
_CLOSE = "</TOOLCALL>"
_TEXT, _BODY, _SKIP = range(3)
_HINT = 'write <TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL>'


class NemotronJsonParser:
    """Text, then `<TOOLCALL>` JSON `</TOOLCALL>` blocks (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _TEXT
        self.pending = ""
        self.parts: list[str] = []
        self.size = 0
        self.span = JsonSpan()

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, self.sink.format.value)
        self.pending = ""
        i: int | None = 0
        while i is not None:
            i = self._text(t, i) if self.state == _TEXT else self._body(t, i)

    def _text(self, t: str, i: int) -> int | None:
        j = t.find(_OPEN, i)
        if j < 0:
            safe, self.pending = split_marker_prefix(t[i:], _OPEN)
            self.sink.emit_text(safe)
            return None
        self.sink.emit_text(t[i:j])
        self.state = _BODY
        self.parts, self.size, self.span = [], 0, JsonSpan()
        return j + len(_OPEN)

    def _body(self, t: str, i: int) -> int | None:
        """Up to `</TOOLCALL>` outside a JSON string (inside one it is text of the arguments)."""
        j = t.find(_CLOSE, i)
        if j < 0:
            body, self.pending = split_marker_prefix(t[i:], _CLOSE)
            self._add(body)
            return None
        self._add(t[i:j])
        if self.state == _BODY and self.span.in_string:
            self._add(_CLOSE)
            return j + len(_CLOSE)
        if self.state == _BODY:
            self._close("".join(self.parts))
        self.state = _TEXT
        self.parts, self.size = [], 0
        return j + len(_CLOSE)

    def _add(self, text: str) -> None:
        if self.state == _SKIP or not text:
            return
        self.span.feed(text)
        self.size += len(text)
        if self.size > self.sink.max_event_size:
            self.state = _SKIP
            self.parts = []
            index = self.sink.new_index()
            self.sink.fail(
                index,
                None,
                None,
                f"the tool calls are longer than max_event_size={self.sink.max_event_size} characters",
                path=f"tool_calls[{index}]",
                hint="the calls are not released; raise max_event_size if such calls are real",
            )
            return
        self.parts.append(text)

    def _close(self, body: str) -> None:
        """Each call gets its index here, in the order written."""
        value, problem = loads_object(body)
        if isinstance(value, dict):
            value = [value]
        if problem is not None or not isinstance(value, list):
            index = self.sink.new_index()
            why = problem or f"got {json_type_name(value)}"
            self.sink.fail(
                index,
                None,
                None,
                f"the tool calls are not a JSON array: {why}",
                path=f"tool_calls[{index}]",
                hint=_HINT,
            )
            return
        for obj in value:
            index = self.sink.new_index()
            complete_named_object(self.sink, index, obj, f"tool_calls[{index}]")

    def open_indexes(self) -> list[int]:
        return []  # a block's calls get their indexes when it closes

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _TEXT:
            self.sink.emit_text(self.pending)
        elif self.state == _BODY:
            self.sink.unfinished([self.sink.new_index()], finish_reason, f"before {_CLOSE}")
        self.pending = ""
        return finish_reason
