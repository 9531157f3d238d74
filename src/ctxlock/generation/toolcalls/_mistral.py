"""Wire format `mistral`: `[TOOL_CALLS]` then either a JSON array of calls (tokenizers before v11) or
`name[CALL_ID]id[ARGS]{...}` / `name[ARGS]{...}` per call (v11 / v13+). Neither form has a closing marker: the
closing bracket of the JSON is the end of the call."""

from __future__ import annotations

import re
from typing import Any

from ctxlock.generation.toolcalls._jsontext import JsonSpan, loads_object, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink, complete_named_object
from ctxlock.request import json_type_name

_TOOL_CALLS = "[TOOL_CALLS]"
_ARGS = "[ARGS]"
_CALL_ID = "[CALL_ID]"
_M_TEXT, _M_HEAD, _M_NAME, _M_CALL_ID, _M_ARGS_START, _M_ARGS, _M_ARRAY, _M_SKIP = range(8)
_NAME_END = re.compile(r"[{\[]")


class MistralParser:
    """`[TOOL_CALLS]` then either a JSON array of {"name", "arguments", "id"?} objects (tokenizers before v11,
    e.g. mistral-nemo's Tekken v3) or `name[CALL_ID]id[ARGS]{...}` / `name[ARGS]{...}` per call (v11 / v13+).

    `[ARGS]` is optional: servers that decode without special tokens produce `name{...}`. Neither form has a
    closing marker, so the closing bracket of the JSON is the end of the call.
    """

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _M_TEXT
        self.pending = ""
        self.index = -1
        self.name_parts: list[str] = []
        self.id_parts: list[str] = []
        self.raw_parts: list[str] = []
        self.span = JsonSpan()

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, "mistral")
        self.pending = ""
        i: int | None = 0
        n = len(t)
        # Each step consumes from t[i:] in the current state and returns where it stopped, or None when it needs
        # more text (what it holds back is in `pending` or in the call's parts).
        while i is not None and (i < n or self.state == _M_TEXT):
            state = self.state
            if state in (_M_TEXT, _M_SKIP):
                i = self._text(t, i)
            elif state == _M_HEAD:
                i = self._head(t, i)
            elif state in (_M_NAME, _M_CALL_ID):
                i = self._name(t, i)
            elif state == _M_ARGS_START:
                i = self._args_start(t, i)
            else:  # _M_ARGS or _M_ARRAY
                i = self._json(t, i)

    def _text(self, t: str, i: int) -> int | None:
        """Text (or, after a malformed call, skipped text) up to the next `[TOOL_CALLS]`."""
        emit = self.state == _M_TEXT
        j = t.find(_TOOL_CALLS, i)
        if j < 0:
            safe, self.pending = split_marker_prefix(t[i:], _TOOL_CALLS)
            if emit:
                self.sink.emit_text(safe)
            return None
        if emit:
            self.sink.emit_text(t[i:j])
        self.state = _M_HEAD
        self.index = self.sink.new_index()
        self.name_parts, self.id_parts, self.raw_parts = [], [], []
        return j + len(_TOOL_CALLS)

    def _head(self, t: str, i: int) -> int | None:
        """After `[TOOL_CALLS]`: a name (v11+), or `[` opening the array (before v11)."""
        n = len(t)
        while i < n and t[i].isspace():
            i += 1
        if i == n:
            return None
        self.span = JsonSpan()
        if t[i] != "[":
            self.state = _M_NAME
            return i
        rest = t[i:]
        if rest.startswith(_ARGS) or rest.startswith(_CALL_ID):
            self.state = _M_NAME  # a header without a name: reported when the call closes
        elif _ARGS.startswith(rest) or _CALL_ID.startswith(rest):
            self.pending = rest  # "[" opens the array or [ARGS]; wait for the next character
            return None
        else:
            self.state = _M_ARRAY
        return i

    def _name(self, t: str, i: int) -> int | None:
        """The call's name (or its `[CALL_ID]` id), up to `[ARGS]`, `[CALL_ID]` or the `{` of the arguments."""
        state = self.state
        parts = self.name_parts if state == _M_NAME else self.id_parts
        m = _NAME_END.search(t, i)
        if m is None:
            parts.append(t[i:])
            return None
        j = m.start()
        parts.append(t[i:j])
        if t[j] == "{":
            self.state = _M_ARGS
            return j
        rest = t[j:]
        if rest.startswith(_ARGS):
            self.state = _M_ARGS_START
            return j + len(_ARGS)
        if state == _M_NAME and rest.startswith(_CALL_ID):
            self.state = _M_CALL_ID
            return j + len(_CALL_ID)
        if _ARGS.startswith(rest) or (state == _M_NAME and _CALL_ID.startswith(rest)):
            self.pending = rest
            return None
        self._malformed(f"unexpected {rest[:12]!r} in the tool call's header")
        return j

    def _args_start(self, t: str, i: int) -> int | None:
        """After `[ARGS]`: whitespace, then the `{` of the arguments."""
        n = len(t)
        while i < n and t[i].isspace():
            i += 1
        if i == n:
            return None
        if t[i] == "{":
            self.state = _M_ARGS
        else:
            self._malformed(f"expected a JSON object after [ARGS], got {t[i : i + 12]!r}")
        return i

    def _json(self, t: str, i: int) -> int | None:
        """The arguments object (v11+) or the array of calls, up to the bracket that closes it: the call ends there."""
        state = self.state
        end = self.span.feed(t, i)
        if end < 0:
            self.raw_parts.append(t[i:])
            return None
        self.raw_parts.append(t[i:end])
        self.state = _M_TEXT
        if state == _M_ARGS:
            self._close_v11()
        else:
            self._close_array()
        return end

    def _malformed(self, message: str) -> None:
        name = "".join(self.name_parts).strip() or None
        self.sink.fail(
            self.index,
            None,
            name,
            message,
            path=f"tool_calls[{self.index}]",
            hint="write [TOOL_CALLS]name[ARGS]{...} or [TOOL_CALLS][{...}]",
        )
        self.state = _M_SKIP

    def _close_v11(self) -> None:
        index = self.index
        raw = "".join(self.raw_parts)
        call_id = "".join(self.id_parts).strip() or None
        name = "".join(self.name_parts).strip()
        value, problem = loads_object(raw)
        if problem is not None:
            self.sink.fail(
                index,
                call_id,
                name or None,
                f"arguments are not valid JSON: {problem}",
                path=f"tool_calls[{index}].arguments",
                hint="send the arguments as one JSON object",
            )
            return
        self.sink.complete(index, call_id, name, value, raw, f"tool_calls[{index}].name")

    def _close_array(self) -> None:
        first = self.index
        raw = "".join(self.raw_parts)
        value, problem = loads_object(raw)
        if problem is not None or not isinstance(value, list):
            self.sink.fail(
                first,
                None,
                None,
                f"the tool calls are not a valid JSON array: {problem or 'got ' + json_type_name(value)}",
                path=f"tool_calls[{first}]",
                hint='write [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]',
            )
            return
        if not value:
            self.sink.fail(
                first,
                None,
                None,
                "an empty list of tool calls",
                path=f"tool_calls[{first}]",
                hint="ask the model again",
            )
            return
        for k, obj in enumerate(value):
            index = first if k == 0 else self.sink.new_index()
            complete_named_object(self.sink, index, obj, f"tool_calls[{index}]", ids=True)

    def open_indexes(self) -> list[int]:
        if self.state in (_M_TEXT, _M_SKIP):
            return []
        if self.state == _M_ARRAY:
            return list(range(self.index, self.index + max(1, _array_items_opened("".join(self.raw_parts)))))
        return [self.index]

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _M_TEXT:
            self.sink.emit_text(self.pending)
        elif self.state != _M_SKIP:
            # In the array form, each object opened at depth 1 is one call.
            self.sink.unfinished(self.open_indexes(), finish_reason, "before its JSON closed")
        self.pending = ""
        return finish_reason


def _array_items_opened(raw: str) -> int:
    """How many objects a cut-off array had opened at depth 1 (once, at finish)."""
    depth = count = 0
    in_string = escaped = False
    for c in raw:
        if escaped:
            escaped = False
        elif in_string:
            if c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            count += c == "{" and depth == 1
            depth += 1
        elif c in "}]":
            depth -= 1
    return count
