"""Wire format `pythonic`: a Python list of calls with keyword arguments, `[get_weather(city='Paris', days=3), g()]`.

Three framings (vLLM's pythonic and llama4_pythonic parsers, vllm/tool_parsers/pythonic_tool_parser.py and
llama4_pythonic_tool_parser.py; LFM2.5's chat template, LFM2.5-8B-A1B.jinja):
- the bare list, as the whole response (Llama 3.2's pythonic prompt): a response that starts, after whitespace,
  with `[name(` is a call list;
- Llama 4: `<|python_start|>[...]<|python_end|>`, anywhere in the text;
- LFM2 / LFM2.5: `<|tool_call_start|>[...]<|tool_call_end|>`, anywhere in the text.

The calls are complete when the list's closing `]` is seen (strings, escapes and bracket nesting tracked; the
closing marker after it is optional and dropped). The list is parsed with `ast.parse` (never evaluated): each
element must be `name(key=literal, ...)` (a dotted name too, as LFM2 writes), each value goes through
`ast.literal_eval` and must be JSON data. JSON's `true`, `false` and `null` are read as Python's (LFM2.5's template
writes mappings with `tojson`), a set as a list in the order written, and a raw newline, carriage return or NUL
inside a quoted string as its escape (vLLM's lfm2 parser reads these too: tests/tool_parsers/test_lfm2_tool_parser.py).
"""

from __future__ import annotations

import ast
from typing import Any

from ctxlock.generation.toolcalls._jsontext import (
    dumps_arguments,
    loads_object,
    parse_python_expression,
    split_marker_prefix,
    text_delta,
)
from ctxlock.generation.toolcalls._sink import ToolCallSink

_OPENERS = {"<|python_start|>": "<|python_end|>", "<|tool_call_start|>": "<|tool_call_end|>"}
_START, _TEXT, _PREFIX, _BLOCK, _OVERFLOW, _AFTER, _SKIP = range(7)
_MAX_HEAD = 256  # how much of a response's start is held back while it may still become `[name(`
_HINT = "write [name(key=value, ...), ...] with Python literals as values"
_PAIRS = {")": "(", "]": "[", "}": "{"}
_JSON_NAMES = {"true": True, "false": False, "null": None}


class PySpan:
    """Where a streamed Python list ends: string quotes, escapes and bracket pairs only (no parsing)."""

    __slots__ = ("calls", "escaped", "quote", "stack")

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.quote = ""
        self.escaped = False
        self.calls = 0  # `(` opened directly inside the list: calls started

    def feed(self, text: str, start: int = 0) -> int:
        """Consume text[start:]; the index just past the bracket that closes the list, -1 (not yet) or -2 (a
        closing bracket that does not match its opener: the list can never close well)."""
        for i in range(start, len(text)):
            c = text[i]
            if self.quote:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == self.quote:
                    self.quote = ""
            elif c in "'\"":
                self.quote = c
            elif c in "([{":
                self.calls += c == "(" and len(self.stack) == 1
                self.stack.append(c)
            elif c in ")]}":
                if not self.stack or self.stack.pop() != _PAIRS[c]:
                    return -2
                if not self.stack:
                    return i + 1
        return -1


class PythonicParser:
    """Text and pythonic call lists (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _START
        self.pending = ""
        self.taken = 0  # indexes taken from the sink: the next call's index (this parser is the only taker)
        self.closer = ""  # the marker that may follow the open list
        self.parts: list[str] = []
        self.size = 0
        self.span = PySpan()

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, "pythonic")
        self.pending = ""
        i: int | None = 0
        while i is not None and i < len(t):
            state = self.state
            if state == _START:
                i = self._start(t, i)
            elif state == _TEXT:
                i = self._text(t, i)
            elif state == _PREFIX:
                i = self._prefix(t, i)
            elif state in (_BLOCK, _OVERFLOW):
                i = self._block(t, i)
            elif state == _AFTER:
                i = self._after(t, i)
            else:  # _SKIP: after a list whose brackets do not match, nothing more is read
                i = None

    def _start(self, t: str, i: int) -> int | None:
        """The response's first characters: `[name(` opens a bare call list, anything else is text."""
        head = _bare_head(t[i:])
        if head is None:
            self.state = _TEXT
            return i
        if head < 0:
            if len(t) - i > _MAX_HEAD:
                self.state = _TEXT
                return i
            self.pending = t[i:]
            return None
        self.sink.emit_text(t[i : i + head])
        self._open("")
        return i + head

    def _text(self, t: str, i: int) -> int | None:
        found = [(j, m) for m in _OPENERS if (j := t.find(m, i)) >= 0]
        if not found:
            safe = t[i:]
            held = ""
            for marker in _OPENERS:
                s, h = split_marker_prefix(t[i:], marker)
                if len(h) > len(held):
                    safe, held = s, h
            self.sink.emit_text(safe)
            self.pending = held
            return None
        j, marker = min(found)
        self.sink.emit_text(t[i:j])
        self.state = _PREFIX
        self.closer = _OPENERS[marker]
        return j + len(marker)

    def _prefix(self, t: str, i: int) -> int | None:
        """After an opening marker: whitespace, then the `[` of the list."""
        n = len(t)
        while i < n and t[i].isspace():
            i += 1
        if i == n:
            return None
        if t[i] == "[":
            self._open(self.closer)
            return i
        self._fail(self._take(), f"expected a list of calls after the marker, got {t[i : i + 12]!r}")
        self.state = _SKIP
        return None

    def _open(self, closer: str) -> None:
        self.state = _BLOCK
        self.closer = closer
        self.parts = []
        self.size = 0
        self.span = PySpan()

    def _take(self) -> int:
        self.taken += 1
        return self.sink.new_index()

    def _fail(self, index: int, message: str, path: str = "", name: str | None = None) -> None:
        self.sink.fail(
            index,
            self.sink.make_id(index),
            name,
            message,
            path=path or f"tool_calls[{index}]",
            hint=_HINT,
        )

    def _block(self, t: str, i: int) -> int | None:
        end = self.span.feed(t, i)
        piece = t[i:] if end < 0 else t[i:end]
        if self.state == _BLOCK:
            self.size += len(piece)
            if self.size > self.sink.max_event_size:
                index = self._take()
                self.sink.fail(
                    index,
                    None,
                    None,
                    f"the list of tool calls is longer than max_event_size={self.sink.max_event_size} characters",
                    path=f"tool_calls[{index}]",
                    hint="the calls are not released; raise max_event_size if such calls are real",
                )
                self.state = _OVERFLOW
                self.parts = []
            else:
                self.parts.append(piece)
        if end == -1:
            return None
        if end == -2:
            if self.state == _BLOCK:
                self._fail(self._take(), "the brackets of the list of calls do not match")
            self.state = _SKIP
            return None
        if self.state == _BLOCK:
            self._close("".join(self.parts))
        self.parts = []
        self.state = _AFTER if self.closer else _TEXT
        return end

    def _after(self, t: str, i: int) -> int | None:
        """The closing marker, if it follows the list, is dropped."""
        rest = t[i:]
        if rest.startswith(self.closer):
            self.state = _TEXT
            return i + len(self.closer)
        if self.closer.startswith(rest):
            self.pending = rest
            return None
        self.state = _TEXT
        return i

    def _close(self, source: str) -> None:
        calls, problem = parse_call_list(source)
        if problem is not None:
            self._fail(self._take(), problem)
            return
        for name, args, call_problem in calls:
            index = self._take()
            if call_problem is not None:
                self._fail(index, call_problem[0], f"tool_calls[{index}]{call_problem[1]}", name)
                continue
            raw, _ = dumps_arguments(args)
            self.sink.complete(index, None, name, args, raw, f"tool_calls[{index}].name")

    def open_indexes(self) -> list[int]:
        if self.state == _PREFIX:
            return [self.taken]
        if self.state == _BLOCK:
            return list(range(self.taken, self.taken + max(1, self.span.calls)))
        return []

    def finish(self, finish_reason: str | None) -> str | None:
        opened = self.open_indexes()
        if opened:
            for _ in opened:
                self._take()
            where = "before its list closed" if self.state != _PREFIX else "right after its opening marker"
            self.sink.unfinished(opened, finish_reason, where)
        elif self.state in (_START, _TEXT, _AFTER):
            self.sink.emit_text(self.pending)
        self.pending = ""
        self.state = _SKIP
        return finish_reason


def _bare_head(t: str) -> int | None:
    """Where `[name(` starts in a response's first characters (-1: not known yet), or None when it cannot."""
    n = len(t)
    i = 0
    while i < n and t[i].isspace():
        i += 1
    head = i
    if i == n:
        return -1
    if t[i] != "[":
        return None
    i += 1
    while i < n and t[i].isspace():
        i += 1
    j = i
    while i < n and (t[i].isalnum() or t[i] in "_."):
        i += 1
    if i == n:
        return -1
    if i == j or not (t[j].isalpha() or t[j] == "_"):
        return None
    while i < n and t[i].isspace():
        i += 1
    if i == n:
        return -1
    return head if t[i] == "(" else None


# A call's problem: (message, the path below tool_calls[i]).
_Parsed = tuple[str | None, dict[str, Any], tuple[str, str] | None]


def parse_call_list(source: str) -> tuple[list[_Parsed], str | None]:
    """The calls of a pythonic list: [(name, arguments, problem or None)], or the problem of the whole list."""
    try:
        tree = parse_python_expression(_escape_raw_controls(source.strip()))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        why = getattr(exc, "msg", None) or str(exc) or "nested too deeply to parse"
        return [], f"the list of calls is not valid Python: {why}"
    if not isinstance(tree.body, ast.List):
        return [], "expected a list of calls"
    return [_call(node) for node in tree.body.elts], None


def _call(node: ast.expr) -> _Parsed:
    name = _dotted_name(node.func) if isinstance(node, ast.Call) else None
    if not isinstance(node, ast.Call) or name is None:
        return None, {}, ("each element must be a call to a name or dotted name, name(key=value)", "")
    if node.args:
        return name, {}, ("positional arguments: write each one as key=value", ".arguments")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return name, {}, ("**arguments: write each one as key=value", ".arguments")
        path = f".arguments.{kw.arg}"
        try:
            value = ast.literal_eval(_JsonNames().visit(kw.value))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return name, {}, (f"the value of {kw.arg!r} is not a Python literal", path)
        problem = _not_json(value)
        if problem is None:
            raw, problem = dumps_arguments(value)
        if problem is not None:
            return name, {}, (f"the value of {kw.arg!r} is not JSON data: {problem}", path)
        args[kw.arg], _ = loads_object(raw)  # tuples become lists
    return name, args, None


def _dotted_name(node: ast.expr) -> str | None:
    """`f` or `grocery.order` (LFM2 writes class-method names, vLLM tests/tool_parsers/test_lfm2_tool_parser.py)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


class _JsonNames(ast.NodeTransformer):
    """`true`, `false` and `null` (JSON, as LFM2.5's template writes mappings) read as Python's constants; a set
    literal read as a list in the order written (JSON has no set; vLLM's lfm2 parser does the same)."""

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in _JSON_NAMES:
            return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
        return node

    def visit_Set(self, node: ast.Set) -> ast.expr:
        self.generic_visit(node)
        return ast.copy_location(ast.List(elts=node.elts, ctx=ast.Load()), node)


_RAW_CONTROLS = {"\n": "\\n", "\r": "\\r", "\x00": "\\x00"}


def _escape_raw_controls(source: str) -> str:
    """A raw newline, carriage return or NUL inside a quoted string, escaped (models write multi-line shell
    commands that way; Python's parser refuses them). Outside strings the text is unchanged."""
    if not any(c in source for c in _RAW_CONTROLS):
        return source
    out: list[str] = []
    quote = ""
    escaped = False
    for c in source:
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
            elif c in _RAW_CONTROLS:
                out.append(_RAW_CONTROLS[c])
                continue
        elif c in "'\"":
            quote = c
        out.append(c)
    return "".join(out)


def _not_json(value: Any) -> str | None:
    """What keeps a literal from being JSON data (bytes, a set, a complex number, a non-string key), or None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if any(not isinstance(k, str) for k in v):
                return "an object key that is not a string"
            stack += v.values()
        elif isinstance(v, list | tuple):
            stack += v
        elif not (v is None or isinstance(v, str | int | float)):
            return f"a {type(v).__name__}"
    return None
