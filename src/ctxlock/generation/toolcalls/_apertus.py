"""Wire format `apertus` (Apertus, swiss-ai; template Apertus-8B-Instruct.jinja): text, then

    <|tools_prefix|>[{"get_weather": {"city": "Paris"}}, {"search": {"query": "x"}}]<|tools_suffix|>

a JSON array of one-key objects, the key the tool's name and the value its arguments. As in vLLM's
vllm/tool_parsers/apertus_tool_parser.py, `<|tools_suffix|>` is optional (it may be a special token the server
strips): the calls are complete when the array's closing `]` is seen; a suffix right after it is dropped. An array
longer than `sink.max_event_size` characters is refused whole.
"""

from __future__ import annotations

from typing import Any

from ctxlock.generation.toolcalls._jsontext import (
    JsonSpan,
    dumps_arguments,
    loads_object,
    split_marker_prefix,
    text_delta,
)
from ctxlock.generation.toolcalls._sink import ToolCallSink
from ctxlock.request import json_type_name

_PREFIX = "<|tools_prefix|>"
_SUFFIX = "<|tools_suffix|>"
_TEXT, _START, _ARRAY, _AFTER = range(4)
_HINT = 'write <|tools_prefix|>[{"name": {"arg": ...}}, ...]<|tools_suffix|>'


class ApertusParser:
    """Text, then `<|tools_prefix|>` and a JSON array of `{"name": {arguments}}` (see the module docstring)."""

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
            elif self.state == _ARRAY:
                i = self._array(t, i)
            else:
                i = self._after(t, i)

    def _text(self, t: str, i: int) -> int | None:
        j = t.find(_PREFIX, i)
        if j < 0:
            safe, self.pending = split_marker_prefix(t[i:], _PREFIX)
            self.sink.emit_text(safe)
            return None
        self.sink.emit_text(t[i:j])
        self.state = _START
        self.index = self.sink.new_index()
        self.parts, self.size, self.span = [], 0, JsonSpan()
        return j + len(_PREFIX)

    def _start(self, t: str, i: int) -> int | None:
        """After the prefix: whitespace, then the array's `[`."""
        while i < len(t) and t[i].isspace():
            i += 1
        if i == len(t):
            return None
        if t[i] != "[":
            self.sink.fail(
                self.index,
                None,
                None,
                f"expected [ after {_PREFIX}, got {t[i : i + 12]!r}",
                path=self._path(),
                hint=_HINT,
            )
            self.state = _TEXT
            return i
        self.state = _ARRAY
        return i

    def _array(self, t: str, i: int) -> int | None:
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
        """Right after the array: its `<|tools_suffix|>` (optional) is dropped."""
        rest = t[i:]
        if rest.startswith(_SUFFIX):
            self.state = _TEXT
            return i + len(_SUFFIX)
        if _SUFFIX.startswith(rest):
            self.pending = rest
            return None
        self.state = _TEXT
        return i

    def _path(self) -> str:
        return f"tool_calls[{self.index}]"

    def _close(self) -> None:
        first = self.index
        if self.size > self.sink.max_event_size:
            self.sink.fail(
                first,
                None,
                None,
                f"the tool calls are longer than max_event_size={self.sink.max_event_size} characters",
                path=self._path(),
                hint="the calls are not released; raise max_event_size if such calls are real",
            )
            return
        value, problem = loads_object("".join(self.parts))
        if problem is not None or not isinstance(value, list) or not value:
            why = problem or ("an empty list" if value == [] else f"got {json_type_name(value)}")
            self.sink.fail(
                first, None, None, f"the tool calls are not a JSON array of calls: {why}", path=self._path(), hint=_HINT
            )
            return
        for k, obj in enumerate(value):
            self._call(first if k == 0 else self.sink.new_index(), obj)

    def _call(self, index: int, obj: Any) -> None:
        path = f"tool_calls[{index}]"
        if not isinstance(obj, dict) or len(obj) != 1:
            what = f"an object with {len(obj)} keys" if isinstance(obj, dict) else json_type_name(obj)
            self.sink.fail(
                index, None, None, f"a call must be an object with one key, its name; got {what}", path=path, hint=_HINT
            )
            return
        ((name, args),) = obj.items()
        if not isinstance(args, dict):
            self.sink.fail(
                index,
                None,
                name,
                f"the arguments must be a JSON object, got {json_type_name(args)}",
                path=f"{path}.arguments",
                hint=_HINT,
            )
            return
        raw, problem = dumps_arguments(args)
        if problem is not None:
            self.sink.fail(
                index, None, name, f"arguments are not valid JSON: {problem}", path=f"{path}.arguments", hint=_HINT
            )
            return
        self.sink.complete(index, None, name, args, raw, f"{path}.name")

    def open_indexes(self) -> list[int]:
        return [self.index] if self.state in (_START, _ARRAY) else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state in (_START, _ARRAY):
            self.sink.unfinished([self.index], finish_reason, "before the array of calls closed")
        elif self.state == _TEXT:
            self.sink.emit_text(self.pending)
        self.pending = ""
        return finish_reason
