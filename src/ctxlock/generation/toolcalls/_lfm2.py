"""Wire format `lfm2` (Liquid AI's LFM2 / LFM2.5; template LFM2.5-8B-A1B.jinja): text, then a Python list of calls
between two special tokens:

    <|tool_call_start|>[get_weather(city='Paris', days=3), search(query="x", tags=['a'])]<|tool_call_end|>

A block is complete when `<|tool_call_end|>` is seen; each call of the list is then reported on its own (a bad
call is refused, its siblings are not). Arguments are keyword arguments whose values are Python literals (strings,
numbers, True/False/None, lists, tuples, sets, dicts with string keys), read with `ast` (never evaluated). The
template writes strings as `'` + text + `'` without escaping, so a raw newline (or NUL) inside a one-line string is
taken as that character (as vLLM's vllm/tool_parsers/lfm2_tool_parser.py recovers it); other invalid Python (a quote
of the same kind inside the string, `07`) is refused, where vLLM guesses.
"""

from __future__ import annotations

import ast
from typing import Any

from ctxlock.generation.toolcalls._jsontext import (
    dumps_arguments,
    parse_python_expression,
    split_marker_prefix,
    text_delta,
)
from ctxlock.generation.toolcalls._schemas import arguments_path
from ctxlock.generation.toolcalls._sink import ToolCallSink

_START = "<|tool_call_start|>"
_END = "<|tool_call_end|>"
_TEXT, _BODY, _SKIP = range(3)
_HINT = "write <|tool_call_start|>[name(arg='text', n=1)]<|tool_call_end|>"
_MAX_DEPTH = 200
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\x00": "\\x00"}


class _Bad(ValueError):
    def __init__(self, message: str, keys: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.keys = keys or []


class Lfm2Parser:
    """Text, then `<|tool_call_start|>[call(...), ...]<|tool_call_end|>` (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _TEXT
        self.pending = ""
        self.parts: list[str] = []
        self.size = 0

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, self.sink.format.value)
        self.pending = ""
        i: int | None = 0
        while i is not None:
            i = self._text(t, i) if self.state == _TEXT else self._body(t, i)

    def _text(self, t: str, i: int) -> int | None:
        j = t.find(_START, i)
        if j < 0:
            safe, self.pending = split_marker_prefix(t[i:], _START)
            self.sink.emit_text(safe)
            return None
        self.sink.emit_text(t[i:j])
        self.state = _BODY
        self.parts, self.size = [], 0
        return j + len(_START)

    def _body(self, t: str, i: int) -> int | None:
        j = t.find(_END, i)
        if j < 0:
            body, self.pending = split_marker_prefix(t[i:], _END)
            self._add(body)
            return None
        self._add(t[i:j])
        if self.state == _BODY:
            self._close("".join(self.parts))
        self.state = _TEXT
        self.parts, self.size = [], 0
        return j + len(_END)

    def _add(self, text: str) -> None:
        if self.state == _SKIP or not text:
            return
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
        """Parse the list; each call gets its index here (an empty list is no call)."""
        try:
            tree = parse_python_expression(_escape_raw_controls(body.strip()))
        except SyntaxError as exc:
            self._fail_block(f"the tool calls are not a Python list: {exc.msg} at char {exc.offset or 0}")
            return
        except (ValueError, RecursionError, MemoryError) as exc:
            self._fail_block(f"the tool calls are not a Python list: {type(exc).__name__}")
            return
        if not isinstance(tree.body, ast.List):
            self._fail_block(f"the tool calls must be a list [...], got {type(tree.body).__name__}")
            return
        for node in tree.body.elts:
            self._call(self.sink.new_index(), node)

    def _fail_block(self, message: str) -> None:
        index = self.sink.new_index()
        self.sink.fail(index, None, None, message, path=f"tool_calls[{index}]", hint=_HINT)

    def _call(self, index: int, node: ast.expr) -> None:
        path = f"tool_calls[{index}]"
        name = _dotted(node.func) if isinstance(node, ast.Call) else None
        if not isinstance(node, ast.Call) or name is None:
            self.sink.fail(index, None, None, "each item must be a call name(arg=value, ...)", path=path, hint=_HINT)
            return
        try:
            if node.args:
                raise _Bad("arguments must be given by keyword (name=value)")
            args: dict[str, Any] = {}
            for kw in node.keywords:
                if kw.arg is None:
                    raise _Bad("**-unpacking is not a value")
                if kw.arg in args:
                    raise _Bad(f"argument {kw.arg!r} is given twice", [kw.arg])
                try:
                    args[kw.arg] = _literal(kw.value, 0)
                except _Bad as exc:
                    raise _Bad(exc.message, [kw.arg]) from None
        except _Bad as exc:
            self.sink.fail(index, None, name, exc.message, path=arguments_path(index, exc.keys), hint=_HINT)
            return
        raw, problem = dumps_arguments(args)
        if problem is not None:
            self.sink.fail(
                index, None, name, f"arguments are not valid JSON: {problem}", path=f"{path}.arguments", hint=_HINT
            )
            return
        self.sink.complete(index, None, name, args, raw, f"{path}.name")

    def open_indexes(self) -> list[int]:
        return []  # a block's calls get their indexes when it closes

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _TEXT:
            self.sink.emit_text(self.pending)
        elif self.state == _BODY:
            self.sink.unfinished([self.sink.new_index()], finish_reason, f"before {_END}")
        self.pending = ""
        return finish_reason


def _dotted(node: ast.expr) -> str | None:
    """`f` or `a.b.f` (LFM2 writes namespaced tools as attribute calls)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _literal(node: ast.expr, depth: int) -> Any:
    """A Python literal as JSON: tuples and sets become lists (a set in the order written)."""
    if depth > _MAX_DEPTH:
        raise _Bad(f"nested deeper than {_MAX_DEPTH}")
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, str | bool | int | float):
            return value
        raise _Bad(f"{type(value).__name__} is not a JSON value")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _literal(node.operand, depth + 1)
        if isinstance(operand, bool) or not isinstance(operand, int | float):
            raise _Bad("a sign applies to a number only")
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [_literal(item, depth + 1) for item in node.elts]
    if isinstance(node, ast.Dict):
        out: dict[str, Any] = {}
        for key, item in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise _Bad("dict keys must be strings")
            if key.value in out:
                raise _Bad(f"dict key {key.value!r} is given twice")
            out[key.value] = _literal(item, depth + 1)
        return out
    raise _Bad(f"{type(node).__name__} is not a literal value")


def _escape_raw_controls(text: str) -> str:
    """Escape a raw newline, carriage return or NUL inside a string literal (invalid Python in a one-line string,
    and NUL anywhere): the template writes string values between quotes without escaping them."""
    out: list[str] = []
    quote = ""  # the delimiter of the string we are in ("'", '"', "'''" or '"""'), else ""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if not quote:
            if c in "'\"":
                quote = c * 3 if text.startswith(c * 3, i) else c
                out.append(quote)
                i += len(quote)
                continue
            out.append(c)
        elif c == "\\" and i + 1 < n:
            # A backslash before a raw control character is the text's own backslash.
            out.append(text[i : i + 2] if text[i + 1] not in _ESCAPES else "\\\\" + _ESCAPES[text[i + 1]])
            i += 2
            continue
        elif text.startswith(quote, i):
            out.append(quote)
            i += len(quote)
            quote = ""
            continue
        elif c in _ESCAPES and (len(quote) == 1 or c == "\x00"):
            out.append(_ESCAPES[c])
        else:
            out.append(c)
        i += 1
    return "".join(out)
