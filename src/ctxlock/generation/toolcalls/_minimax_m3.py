"""Wire format `minimax_m3` (MiniMax-M3; template MiniMax-M3.jinja): text, then a block of calls whose every tag is
preceded by the special token `]<]minimax[>[` (written NS here):

    NS<tool_call>
    NS<invoke name="create_order">NS<user_id>42NS</user_id>NS<shipping>NS<city>SingaporeNS</city>NS</shipping>
    NS<items>NS<item>NS<sku>book-001NS</sku>NS</item>NS</items>NS</invoke>
    NS</tool_call>

Arguments are nested elements: a leaf's text is a value, converted to the type the tool's schema gives it (an
integer may have leading zeros: `018956` is 18956, as in vLLM's vllm/tool_parsers/minimax_m3_tool_parser.py); an
element with children is an object (a tag given twice becomes a list) or, where the schema says array, the list of
its children. Each `<invoke>` is one call, complete when its `NS</invoke>` is seen (the block's close is not
needed). Text inside the block between invokes is dropped (noted); an invoke longer than `sink.max_event_size`
characters is refused and skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ctxlock.generation.toolcalls._jsontext import dumps_arguments, loads_object, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink, add_to_call

NS = "]<]minimax[>["
_BLOCK_OPEN = NS + "<tool_call>"
_BLOCK_CLOSE = NS + "</tool_call>"
_INVOKE_OPEN = NS + "<invoke"
_INVOKE_CLOSE = NS + "</invoke>"
_TEXT, _BLOCK, _INVOKE, _SKIP = range(4)
_HEAD = re.compile(r"""\s+name=(?:"([^"]*)"|'([^']*)')\s*>""")
_TAG = re.compile(r"<(/?)([^<>/\s]+)>")
_INTEGER = re.compile(r"[+-]?\d+")
_MAX_DEPTH = 100
_HINT = f'write {NS}<invoke name="f">{NS}<arg>value{NS}</arg>{NS}</invoke>'


class _Bad(ValueError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class _Node:
    tag: str
    text: str
    children: list[_Node] = field(default_factory=list)


class MinimaxM3Parser:
    """Text, then `NS<tool_call>` blocks of `NS<invoke name=...>` calls (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _TEXT
        self.pending = ""
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
        k, c = t.find(_INVOKE_OPEN, i), t.find(_BLOCK_CLOSE, i)
        if k < 0 and c < 0:
            rest = t[i:]
            self.pending = max(
                split_marker_prefix(rest, _INVOKE_OPEN)[1], split_marker_prefix(rest, _BLOCK_CLOSE)[1], key=len
            )
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
            self.sink.note(f"text inside the tool-call block outside any <invoke> was dropped: {text.strip()[:80]!r}")

    def _invoke(self, t: str, i: int) -> int | None:
        j = t.find(_INVOKE_CLOSE, i)
        if j < 0:
            body, self.pending = split_marker_prefix(t[i:], _INVOKE_CLOSE)
            self._add(body)
            return None
        self._add(t[i:j])
        if self.state == _INVOKE:
            self._close("".join(self.parts))
        self.state = _BLOCK
        self.parts, self.size = [], 0
        return j + len(_INVOKE_CLOSE)

    def _add(self, text: str) -> None:
        add_to_call(self, text, _SKIP)

    def _close(self, body: str) -> None:
        index = self.index
        path = f"tool_calls[{index}]"
        m = _HEAD.match(body)
        if m is None:
            self.sink.fail(index, None, None, 'expected name="..." after <invoke', path=f"{path}.name", hint=_HINT)
            return
        name = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
        try:
            args = _convert(
                _Node("invoke", "", _children(body[m.end() :])), self.sink.tool_schema(name) or {"type": "object"}
            )
        except _Bad as exc:
            self.sink.fail(index, None, name, exc.message, path=f"{path}.arguments", hint=_HINT)
            return
        raw, problem = dumps_arguments(args)
        if problem is not None:
            self.sink.fail(
                index, None, name, f"arguments are not valid JSON: {problem}", path=f"{path}.arguments", hint=_HINT
            )
            return
        self.sink.complete(index, None, name, args, raw, f"{path}.name")

    def open_indexes(self) -> list[int]:
        return [self.index] if self.state == _INVOKE else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _TEXT:
            self.sink.emit_text(self.pending)
        elif self.state == _INVOKE:
            self.sink.unfinished([self.index], finish_reason, f"before {_INVOKE_CLOSE}")
        self.pending = ""
        return finish_reason


def _children(text: str) -> list[_Node]:
    """The element tree of an invoke's body: each piece after NS starts with a tag."""
    pieces = text.split(NS)
    if pieces[0].strip():
        raise _Bad(f"unexpected text {pieces[0].strip()[:40]!r} before the first argument")
    root = _Node("invoke", "")
    stack = [root]
    for piece in pieces[1:]:
        m = _TAG.match(piece)
        if m is None:
            raise _Bad(f"expected a tag after the separator, got {piece[:20]!r}")
        rest = piece[m.end() :]
        if not m.group(1):
            if len(stack) > _MAX_DEPTH:
                raise _Bad(f"nested deeper than {_MAX_DEPTH}")
            node = _Node(m.group(2), rest)
            stack[-1].children.append(node)
            stack.append(node)
            continue
        if len(stack) == 1 or stack[-1].tag != m.group(2):
            raise _Bad(f"</{m.group(2)}> closes no open <{m.group(2)}>")
        stack.pop()
        if rest.strip():
            raise _Bad(f"unexpected text {rest.strip()[:40]!r} after </{m.group(2)}>")
    if len(stack) > 1:
        raise _Bad(f"<{stack[-1].tag}> is not closed")
    return root.children


def _types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    out = (
        {kind}
        if isinstance(kind, str)
        else {k for k in kind if isinstance(k, str)}
        if isinstance(kind, list)
        else set()
    )
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or []:
            out |= _types(branch)
    return out


def _convert(node: _Node, schema: Any) -> Any:
    types = _types(schema)
    if not node.children:
        return _leaf(node.text, types)
    if node.text.strip():
        raise _Bad(f"<{node.tag}> holds both text and elements")
    if "array" in types and "object" not in types:
        items = schema.get("items") if isinstance(schema, dict) else None
        return [_convert(child, items) for child in node.children]
    properties = schema.get("properties") if isinstance(schema, dict) else None
    extra = schema.get("additionalProperties") if isinstance(schema, dict) else None
    out: dict[str, Any] = {}
    groups: set[str] = set()  # tags given more than once: their values are collected in a list
    for child in node.children:
        sub = properties.get(child.tag) if isinstance(properties, dict) and child.tag in properties else extra
        value = _convert(child, sub)
        if child.tag not in out:
            out[child.tag] = value
        elif child.tag in groups:
            out[child.tag].append(value)
        else:
            out[child.tag] = [out[child.tag], value]
            groups.add(child.tag)
    return out


def _leaf(text: str, types: set[str]) -> Any:
    """A leaf's text by the schema's types; text that fits none stays a string (validation then names it)."""
    plain = text.strip()
    if not types or types == {"string"}:
        return text
    if "null" in types and plain == "null":
        return None
    if "boolean" in types and plain in ("true", "false"):
        return plain == "true"
    if types & {"integer", "number"} and _INTEGER.fullmatch(plain):
        try:
            return int(plain)  # leading zeros allowed, as vLLM reads them
        except ValueError:  # int_max_str_digits
            return text
    if "number" in types:
        number, problem = loads_object(plain)
        if problem is None and isinstance(number, int | float) and not isinstance(number, bool):
            return number
    if types & {"object", "array"} and plain[:1] in ("{", "["):
        value, problem = loads_object(plain)
        if problem is None:
            return value
    if not plain and "array" in types:
        return []
    if not plain and "object" in types:
        return {}
    return text
