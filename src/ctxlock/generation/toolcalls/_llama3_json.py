"""Wire format `llama3_json` (Llama 3.1 / 3.2 / 3.3, JSON tool calls): `{"name": ..., "parameters": {...}}`,
optionally after `<|python_tag|>`, several separated by `; ` (or `;`, a newline).

The form has no closing marker: a call is complete when its JSON object closes. A call starts at `<|python_tag|>`
or at a `{` followed by `"name"` (whitespace allowed between them), anywhere in the text, as vLLM's llama3_json
parser reads a whole response (vllm/tool_parsers/llama_tool_parser.py). A closed object is a call when it has
`"name"` and `"parameters"` (or `"arguments"`); valid JSON without them is text (the model quoting data), broken
JSON is a malformed call. After a call, separators (whitespace and `;`) are dropped.
"""

from __future__ import annotations

import re
from typing import Any

from ctxlock.generation.toolcalls._jsontext import JsonSpan, loads_object, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink, complete_named_object

_PYTHON_TAG = "<|python_tag|>"
# A call's first characters: `{` then `"name"` (a bounded run of whitespace between them, so what is held back
# while it may still become one stays short).
_CALL_START = re.compile(r'<\|python_tag\|>|\{\s{0,64}"name"')
_BRACE_PREFIX = re.compile(r'\{\s{0,64}(?:"(?:n(?:a(?:m(?:e)?)?)?)?)?\Z')
_TEXT, _TAG, _CALL, _OVERFLOW, _AFTER, _SKIP = range(6)
_SEPARATORS = frozenset(" \t\r\n;")
_HINT = 'write {"name": ..., "parameters": {...}}, several separated by "; "'


class Llama3JsonParser:
    """Text with `{"name": ..., "parameters": {...}}` calls (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _TEXT
        self.pending = ""  # a possible start of a call, not yet classified
        self.taken = 0  # indexes taken from the sink so far: the next call's index (this parser is the only taker)
        self.tagged = False  # the open object follows <|python_tag|>: it is a call whatever its keys
        self.parts: list[str] = []
        self.size = 0
        self.span = JsonSpan()

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, "llama3_json")
        self.pending = ""
        i: int | None = 0
        n = len(t)
        while i is not None and i < n:
            state = self.state
            if state == _TEXT:
                i = self._text(t, i)
            elif state == _TAG:
                i = self._tag(t, i)
            elif state in (_CALL, _OVERFLOW):
                i = self._json(t, i)
            elif state == _AFTER:
                while i < n and t[i] in _SEPARATORS:
                    i += 1
                if i < n:
                    self.state = _TEXT
            else:  # _SKIP: after a malformed <|python_tag|> call, nothing more is text
                i = None

    def _text(self, t: str, i: int) -> int | None:
        m = _CALL_START.search(t, i)
        if m is None:
            safe, held = split_marker_prefix(t[i:], _PYTHON_TAG)
            j = safe.rfind("{")
            if j >= 0 and _BRACE_PREFIX.match(safe, j):
                safe, held = safe[:j], safe[j:] + held
            self.sink.emit_text(safe)
            self.pending = held
            return None
        self.sink.emit_text(t[i : m.start()])
        if m.group() == _PYTHON_TAG:
            self.state = _TAG
            self.tagged = True
            return m.end()
        self._open(tagged=False)
        return m.start()

    def _open(self, *, tagged: bool) -> None:
        self.state = _CALL
        self.tagged = tagged
        self.parts = []
        self.size = 0
        self.span = JsonSpan()

    def _tag(self, t: str, i: int) -> int | None:
        """After `<|python_tag|>`: whitespace, then the `{` of the call."""
        n = len(t)
        while i < n and t[i].isspace():
            i += 1
        if i == n:
            return None
        if t[i] == "{":
            self._open(tagged=True)
            return i
        index = self._take()
        self.sink.fail(
            index,
            None,
            None,
            f"expected a JSON object after <|python_tag|>, got {t[i : i + 12]!r}",
            path=f"tool_calls[{index}]",
            hint=_HINT + " (built-in tools' Python calls are not read by this format)",
        )
        self.state = _SKIP
        return None

    def _take(self) -> int:
        self.taken += 1
        return self.sink.new_index()

    def _json(self, t: str, i: int) -> int | None:
        end = self.span.feed(t, i)
        piece = t[i:] if end < 0 else t[i:end]
        if self.state == _CALL:
            self.size += len(piece)
            if self.size > self.sink.max_event_size:
                index = self._take()
                self.sink.fail(
                    index,
                    None,
                    None,
                    f"the tool call is longer than max_event_size={self.sink.max_event_size} characters",
                    path=f"tool_calls[{index}]",
                    hint="the call is not released; raise max_event_size if such calls are real",
                )
                self.state = _OVERFLOW
                self.parts = []
            else:
                self.parts.append(piece)
        if end < 0:
            return None
        if self.state == _CALL:
            self._close("".join(self.parts))
        self.parts = []
        self.state = _AFTER
        return end

    def _close(self, raw: str) -> None:
        obj, problem = loads_object(raw)
        if problem is None and not self.tagged and not _call_shaped(obj):
            self.sink.emit_text(raw)  # JSON, but not a call: text, as in vLLM
            return
        index = self._take()
        path = f"tool_calls[{index}]"
        if problem is not None:
            self.sink.fail(index, None, None, f"the tool call is not valid JSON: {problem}", path=path, hint=_HINT)
            return
        if isinstance(obj, dict) and "parameters" in obj:
            if "arguments" in obj:
                self.sink.fail(
                    index,
                    self.sink.make_id(index),
                    obj.get("name") if isinstance(obj.get("name"), str) else None,
                    'the tool call has both "parameters" and "arguments"',
                    path=f"{path}.parameters",
                    hint="give the arguments once, as parameters",
                )
                return
            obj = {**obj, "arguments": obj["parameters"]}
        complete_named_object(self.sink, index, obj, path)

    def open_indexes(self) -> list[int]:
        return [self.taken] if self.state in (_TAG, _CALL) else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state in (_TAG, _CALL):
            where = "before its JSON object closed" if self.state == _CALL else "right after <|python_tag|>"
            self.sink.unfinished([self._take()], finish_reason, where)
        elif self.state in (_TEXT, _AFTER):
            self.sink.emit_text(self.pending)
        self.pending = ""
        self.state = _SKIP
        return finish_reason


def _call_shaped(obj: Any) -> bool:
    return isinstance(obj, dict) and "name" in obj and ("parameters" in obj or "arguments" in obj)
