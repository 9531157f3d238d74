"""Wire format `minimax_m2` (MiniMax-M2, MiniMax-M2.1; template MiniMax-M2.jinja): text, then a block

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    <invoke name="...">...</invoke>
    </minimax:tool_call>

Each `<invoke>` is one call, complete when its `</invoke>` is seen (vLLM's vllm/tool_parsers/minimax_m2_tool_parser.py
emits a call there too, and `</minimax:tool_call>` may be a special token the server strips). Parameter values are
text: trimmed of surrounding whitespace as vLLM does, then turned into the type the tool's schema declares
(`coerce_parameter`, shared with `qwen3_coder`). Text inside the block but between invokes is dropped (noted).
An invoke longer than `sink.max_event_size` characters is refused and skipped up to its `</invoke>`.
"""

from __future__ import annotations

import re
from typing import Any

from ctxlock.generation.toolcalls._coerce import coerce_parameter
from ctxlock.generation.toolcalls._jsontext import dumps_arguments, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._schemas import arguments_path
from ctxlock.generation.toolcalls._sink import ToolCallSink, add_to_call

_BLOCK_OPEN = "<minimax:tool_call>"
_BLOCK_CLOSE = "</minimax:tool_call>"
_INVOKE_OPEN = "<invoke"
_INVOKE_CLOSE = "</invoke>"
_TEXT, _BLOCK, _INVOKE, _SKIP = range(4)
# name="x", name='x' or a bare name (vLLM strips either quote).
_NAME = r"""name=(?:"([^"]*)"|'([^']*)'|([^\s>"']+))\s*>"""
_INVOKE_HEAD = re.compile(r"\s+" + _NAME)
_PARAMETER = re.compile(r"<parameter\s+" + _NAME + r"(.*?)</parameter>", re.DOTALL)
_HINT = '<invoke name="f"><parameter name="p">value</parameter></invoke>'


def _name(m: re.Match[str]) -> str:
    return next(g for g in m.groups()[:3] if g is not None).strip()


class MinimaxM2Parser:
    """Text, then `<minimax:tool_call>` blocks of `<invoke name=...>` calls (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _TEXT
        self.pending = ""  # a possible marker prefix, not yet classified
        self.index = -1
        self.parts: list[str] = []
        self.size = 0
        self.dropped = False

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
                i = self._invoke(t, i)

    def _text(self, t: str, i: int) -> int | None:
        j = t.find(_BLOCK_OPEN, i)
        if j < 0:
            safe, self.pending = split_marker_prefix(t[i:], _BLOCK_OPEN)
            self.sink.emit_text(safe)
            return None
        self.sink.emit_text(t[i:j])
        self.state = _BLOCK
        return j + len(_BLOCK_OPEN)

    def _block(self, t: str, i: int) -> int | None:
        """Between invokes: the next `<invoke` or `</minimax:tool_call>`; anything else is dropped."""
        k = t.find(_INVOKE_OPEN, i)
        c = t.find(_BLOCK_CLOSE, i)
        if k < 0 and c < 0:
            rest = t[i:]
            kept_invoke = split_marker_prefix(rest, _INVOKE_OPEN)[1]
            kept_close = split_marker_prefix(rest, _BLOCK_CLOSE)[1]
            self.pending = max(kept_invoke, kept_close, key=len)
            self._drop(rest[: len(rest) - len(self.pending)])
            return None
        if k >= 0 and (c < 0 or k < c):
            self._drop(t[i:k])
            self.state = _INVOKE
            self.index = self.sink.new_index()
            self.parts, self.size = [], 0
            return k + len(_INVOKE_OPEN)
        self._drop(t[i:c])
        self.state = _TEXT
        return c + len(_BLOCK_CLOSE)

    def _drop(self, text: str) -> None:
        if text.strip() and not self.dropped:
            self.dropped = True
            self.sink.note(f"text inside <minimax:tool_call> outside any <invoke> was dropped: {text.strip()[:80]!r}")

    def _invoke(self, t: str, i: int) -> int | None:
        """Inside `<invoke` ... `</invoke>` (or skipping the rest of one that was too long)."""
        j = t.find(_INVOKE_CLOSE, i)
        if j < 0:
            body, self.pending = split_marker_prefix(t[i:], _INVOKE_CLOSE)
            self._body(body)
            return None
        self._body(t[i:j])
        if self.state == _INVOKE:
            self._close("".join(self.parts))
        self.state = _BLOCK
        self.parts, self.size = [], 0
        return j + len(_INVOKE_CLOSE)

    def _body(self, text: str) -> None:
        add_to_call(self, text, _SKIP)

    def _close(self, body: str) -> None:
        index = self.index
        path = f"tool_calls[{index}]"
        m = _INVOKE_HEAD.match(body)
        if m is None:
            self.sink.fail(index, None, None, "expected name=... after <invoke", path=f"{path}.name", hint=_HINT)
            return
        name = _name(m)
        args = self._parameters(index, name, body[m.end() :])
        if args is None:
            return
        raw, problem = dumps_arguments(args)
        if problem is not None:
            self.sink.fail(
                index,
                None,
                name,
                f"arguments are not valid JSON: {problem}",
                path=f"{path}.arguments",
                hint="write each parameter value as valid Unicode text",
            )
            return
        self.sink.complete(index, None, name, args, raw, f"{path}.name")

    def _parameters(self, index: int, name: str, rest: str) -> dict[str, Any] | None:
        """The `<parameter name=...>` values, converted by the tool's schema; None once a problem is reported."""
        schema = self.sink.tool_schema(name)
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(properties, dict):
            properties = {}
        args: dict[str, Any] = {}
        pos = 0
        for p in _PARAMETER.finditer(rest):
            if rest[pos : p.start()].strip():
                self._fail(index, name, [], f"unexpected text {rest[pos : p.start()].strip()[:40]!r}")
                return None
            pos = p.end()
            pname = _name(p)
            if pname in args:
                self._fail(index, name, [pname], f"parameter {pname!r} is given twice")
                return None
            args[pname] = coerce_parameter(p.group(4).strip(), properties.get(pname))
        if rest[pos:].strip():
            self._fail(index, name, [], f"unexpected text {rest[pos:].strip()[:40]!r}")
            return None
        return args

    def _fail(self, index: int, name: str, keys: list[str], message: str) -> None:
        self.sink.fail(index, None, name, message, path=arguments_path(index, keys), hint=f"write {_HINT}")

    def open_indexes(self) -> list[int]:
        return [self.index] if self.state == _INVOKE else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _TEXT:
            self.sink.emit_text(self.pending)
        elif self.state == _INVOKE:
            self.sink.unfinished([self.index], finish_reason, f"before {_INVOKE_CLOSE}")
        self.pending = ""
        return finish_reason
