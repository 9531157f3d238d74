"""Wire format `hy_v3` (Tencent Hy3; template tencent-Hy3.jinja): text, then a block of calls

    <tool_calls>
    <tool_call>get_weather<tool_sep>
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    </tool_call>
    </tool_calls>

The fixture template spells every tag with an `:opensource` suffix (`<tool_calls:opensource>`, `<arg_key:opensource>`,
...); vLLM's tests (tests/tool_parsers/test_hy_v3_tool_parser.py) use the bare tags. Both are read; a block uses
the spelling its opening tag has. Each `<tool_call>` is one call, complete when its `</tool_call>` is seen (the
block's close is not needed). Values are text, turned into the type the tool's schema declares
(`coerce_parameter`, shared with `qwen3_coder`; the template writes non-strings as JSON). A call longer than
`sink.max_event_size` characters is refused and skipped up to its close.
"""

from __future__ import annotations

import re
from typing import Any

from ctxlock.generation.toolcalls._coerce import coerce_parameter
from ctxlock.generation.toolcalls._jsontext import dumps_arguments, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._schemas import arguments_path
from ctxlock.generation.toolcalls._sink import ToolCallSink, add_to_call

_SUFFIXES = (":opensource", "")
_TEXT, _BLOCK, _CALL, _SKIP = range(4)
_HINT = "write <tool_call>name<tool_sep><arg_key>k</arg_key><arg_value>v</arg_value></tool_call>"


class HyV3Parser:
    """Text, then `<tool_calls>` blocks of `<tool_call>name<tool_sep>...` calls (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _TEXT
        self.pending = ""
        self.suffix = ""
        self.index = -1
        self.parts: list[str] = []
        self.size = 0
        self.dropped = False

    def _tag(self, name: str) -> str:
        return f"<{name}{self.suffix}>"

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, self.sink.format.value)
        self.pending = ""
        i: int | None = 0
        while i is not None:
            if self.state == _TEXT:
                i = self._text(t, i)
            elif self.state == _BLOCK:
                i = self._block(t, i)
            else:
                i = self._call(t, i)

    def _text(self, t: str, i: int) -> int | None:
        opens = [f"<tool_calls{s}>" for s in _SUFFIXES]
        found = [(j, k) for k, tag in enumerate(opens) if (j := t.find(tag, i)) >= 0]
        if not found:
            rest = t[i:]
            self.pending = max((split_marker_prefix(rest, tag)[1] for tag in opens), key=len)
            self.sink.emit_text(rest[: len(rest) - len(self.pending)])
            return None
        j, k = min(found)
        self.sink.emit_text(t[i:j])
        self.suffix = _SUFFIXES[k]
        self.state = _BLOCK
        return j + len(opens[k])

    def _block(self, t: str, i: int) -> int | None:
        """Between calls: the next `<tool_call>` or `</tool_calls>`; other text is dropped (noted)."""
        call, close = self._tag("tool_call"), self._tag("/tool_calls")
        k, c = t.find(call, i), t.find(close, i)
        if k < 0 and c < 0:
            rest = t[i:]
            self.pending = max(split_marker_prefix(rest, call)[1], split_marker_prefix(rest, close)[1], key=len)
            self._drop(rest[: len(rest) - len(self.pending)])
            return None
        if k >= 0 and (c < 0 or k < c):
            self._drop(t[i:k])
            self.state = _CALL
            self.index = self.sink.new_index()
            self.parts, self.size = [], 0
            return k + len(call)
        self._drop(t[i:c])
        self.state = _TEXT
        return c + len(close)

    def _drop(self, text: str) -> None:
        if text.strip() and not self.dropped:
            self.dropped = True
            self.sink.note(f"text inside <tool_calls> outside any <tool_call> was dropped: {text.strip()[:80]!r}")

    def _call(self, t: str, i: int) -> int | None:
        close = self._tag("/tool_call")
        j = t.find(close, i)
        if j < 0:
            body, self.pending = split_marker_prefix(t[i:], close)
            self._add(body)
            return None
        self._add(t[i:j])
        if self.state == _CALL:
            self._close("".join(self.parts))
        self.state = _BLOCK
        self.parts, self.size = [], 0
        return j + len(close)

    def _add(self, text: str) -> None:
        add_to_call(self, text, _SKIP)

    def _close(self, body: str) -> None:
        index = self.index
        sep = self._tag("tool_sep")
        name, found, rest = body.partition(sep)
        name = name.strip()
        if not found or not name or "<" in name:
            self.sink.fail(
                index, None, None, f"expected name{sep} after <tool_call>", path=f"tool_calls[{index}].name", hint=_HINT
            )
            return
        args = self._arguments(index, name, rest)
        if args is None:
            return
        raw, problem = dumps_arguments(args)
        if problem is not None:
            self.sink.fail(
                index,
                None,
                name,
                f"arguments are not valid JSON: {problem}",
                path=f"tool_calls[{index}].arguments",
                hint=_HINT,
            )
            return
        self.sink.complete(index, None, name, args, raw, f"tool_calls[{index}].name")

    def _arguments(self, index: int, name: str, rest: str) -> dict[str, Any] | None:
        """The `<arg_key>`/`<arg_value>` pairs, converted by the tool's schema; None once a problem is reported."""
        s = re.escape(self.suffix)
        pair = re.compile(rf"<arg_key{s}>(.*?)</arg_key{s}>\s*<arg_value{s}>(.*?)</arg_value{s}>", re.DOTALL)
        schema = self.sink.tool_schema(name)
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(properties, dict):
            properties = {}
        args: dict[str, Any] = {}
        pos = 0
        for m in pair.finditer(rest):
            key = m.group(1).strip()
            if rest[pos : m.start()].strip():
                self._fail(index, name, [], f"unexpected text {rest[pos : m.start()].strip()[:40]!r}")
                return None
            if key in args:
                self._fail(index, name, [key], f"argument {key!r} is given twice")
                return None
            args[key] = coerce_parameter(m.group(2), properties.get(key))
            pos = m.end()
        if rest[pos:].strip():
            self._fail(index, name, [], f"unexpected text {rest[pos:].strip()[:40]!r}")
            return None
        return args

    def _fail(self, index: int, name: str, keys: list[str], message: str) -> None:
        self.sink.fail(index, None, name, message, path=arguments_path(index, keys), hint=_HINT)

    def open_indexes(self) -> list[int]:
        return [self.index] if self.state == _CALL else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _TEXT:
            self.sink.emit_text(self.pending)
        elif self.state == _CALL:
            self.sink.unfinished([self.index], finish_reason, f"before {self._tag('/tool_call')}")
        self.pending = ""
        return finish_reason
