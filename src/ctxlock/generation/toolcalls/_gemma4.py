"""Wire format `gemma4` (Gemma 4; templates google-gemma-4-31B-it.jinja and its -interleaved variant): text and calls

    <|tool_call>call:get_weather{city:<|"|>Zürich<|"|>,days:3,opts:{metric:true},tags:[<|"|>a<|"|>]}<tool_call|>

one after another, with no separator. The arguments are not JSON: keys are bare (or `<|"|>`-delimited), strings are
delimited by `<|"|>` and hold any text raw (no escapes), other values are bare: `true`, `false`, numbers, and
`null` or `None` (the template writes a null with Jinja's `{{ value }}`, which prints `None`). A call is complete
when `<tool_call|>` is seen outside a `<|"|>` string. The reading follows vLLM's
vllm/tool_parsers/gemma4_tool_parser.py, but strictly: a call that does not parse is refused with the offset,
where vLLM keeps what it can (a missing value becomes "", an unterminated string takes the rest).
"""

from __future__ import annotations

import re
from typing import Any

from ctxlock.generation.toolcalls._jsontext import dumps_arguments, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink, add_to_call

_OPEN = "<|tool_call>"
_CLOSE = "<tool_call|>"
_QUOTE = '<|"|>'
_TEXT, _CALL, _SKIP = range(3)
_HEAD = re.compile(r"\s*call:([^\s{]+)\s*(?=\{)")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_BARE_END = re.compile(r"[,}\]]|<\|\"\|>")
_KEY_END = re.compile(r"[:,{}\[\]]|<\|\"\|>")
_MAX_DEPTH = 200
_HINT = 'write <|tool_call>call:name{key:<|"|>text<|"|>,n:1}<tool_call|>'


class _Malformed(ValueError):
    def __init__(self, message: str, at: int) -> None:
        super().__init__(message)
        self.message = f"{message} at char {at} of the call"


class Gemma4Parser:
    """Text, then `<|tool_call>call:NAME{...}<tool_call|>`, repeated (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _TEXT
        self.in_string = False
        self.pending = ""  # a possible marker prefix, not yet classified
        self.index = -1
        self.parts: list[str] = []
        self.size = 0

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, self.sink.format.value)
        self.pending = ""
        i: int | None = 0
        while i is not None:
            i = self._text(t, i) if self.state == _TEXT else self._call(t, i)

    def _text(self, t: str, i: int) -> int | None:
        j = t.find(_OPEN, i)
        if j < 0:
            safe, self.pending = split_marker_prefix(t[i:], _OPEN)
            self.sink.emit_text(safe)
            return None
        self.sink.emit_text(t[i:j])
        self.state = _CALL
        self.in_string = False
        self.index = self.sink.new_index()
        self.parts, self.size = [], 0
        return j + len(_OPEN)

    def _call(self, t: str, i: int) -> int | None:
        """Inside a call: `<|"|>` opens and closes strings; `<tool_call|>` outside a string ends the call."""
        q = t.find(_QUOTE, i)
        c = -1 if self.in_string else t.find(_CLOSE, i)
        if q < 0 and c < 0:
            rest = t[i:]
            held = split_marker_prefix(rest, _QUOTE)[1]
            if not self.in_string:
                held = max(held, split_marker_prefix(rest, _CLOSE)[1], key=len)
            self.pending = held
            self._body(rest[: len(rest) - len(held)])
            return None
        if q >= 0 and (c < 0 or q < c):
            self._body(t[i : q + len(_QUOTE)])
            self.in_string = not self.in_string
            return q + len(_QUOTE)
        self._body(t[i:c])
        if self.state == _CALL:
            self._close("".join(self.parts))
        self.state = _TEXT
        self.parts, self.size = [], 0
        return c + len(_CLOSE)

    def _body(self, text: str) -> None:
        add_to_call(self, text, _SKIP)

    def _close(self, body: str) -> None:
        index = self.index
        path = f"tool_calls[{index}]"
        m = _HEAD.match(body)
        if m is None:
            self.sink.fail(
                index, None, None, "expected call:NAME{...} after <|tool_call>", path=f"{path}.name", hint=_HINT
            )
            return
        name = m.group(1)
        try:
            args, end = _object(body, m.end() + 1, 1)
            if body[end:].strip():
                raise _Malformed(f"unexpected text after the arguments: {body[end:].strip()[:40]!r}", end)
        except _Malformed as exc:
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
        return [self.index] if self.state == _CALL else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _TEXT:
            self.sink.emit_text(self.pending)
        elif self.state == _CALL:
            self.sink.unfinished([self.index], finish_reason, f"before {_CLOSE}")
        self.pending = ""
        return finish_reason


# ---------------------------------------------------------------------------------------------------------------
# The argument syntax: value := <|"|>text<|"|> | {key:value,...} | [value,...] | bare


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i].isspace():
        i += 1
    return i


def _string(s: str, i: int) -> tuple[str, int]:
    """The text of the `<|"|>` string starting at i (the framing guarantees it is closed)."""
    j = s.find(_QUOTE, i + len(_QUOTE))
    if j < 0:
        raise _Malformed('unterminated <|"|> string', i)
    return s[i + len(_QUOTE) : j], j + len(_QUOTE)


def _object(s: str, i: int, depth: int) -> tuple[dict[str, Any], int]:
    """The members of an object whose `{` is just before i; returns the object and the index past its `}`."""
    out: dict[str, Any] = {}
    while True:
        i = _skip(s, i)
        if i >= len(s):
            raise _Malformed("the arguments' { is not closed", i)
        if s[i] == "}":
            return out, i + 1
        if s.startswith(_QUOTE, i):
            key, i = _string(s, i)
        else:
            m = _KEY_END.search(s, i)
            end = m.start() if m else len(s)
            key, i = s[i:end].strip(), end
        if not key or not s.startswith(":", i):
            raise _Malformed("expected key:value", i)
        if key in out:
            raise _Malformed(f"key {key!r} is given twice", i)
        out[key], i = _value(s, i + 1, depth)
        i = _skip(s, i)
        if s.startswith(",", i):
            i += 1
        elif not s.startswith("}", i):
            raise _Malformed(f"expected , or }} after the value of {key!r}", i)


def _array(s: str, i: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    while True:
        i = _skip(s, i)
        if i >= len(s):
            raise _Malformed("a [ is not closed", i)
        if s[i] == "]":
            return out, i + 1
        item, i = _value(s, i, depth)
        out.append(item)
        i = _skip(s, i)
        if s.startswith(",", i):
            i += 1
        elif not s.startswith("]", i):
            raise _Malformed("expected , or ] after an item", i)


def _value(s: str, i: int, depth: int) -> tuple[Any, int]:
    i = _skip(s, i)
    if s.startswith(_QUOTE, i):
        return _string(s, i)
    if i < len(s) and s[i] in "{[":
        if depth >= _MAX_DEPTH:
            raise _Malformed(f"nested deeper than {_MAX_DEPTH}", i)
        return (_object if s[i] == "{" else _array)(s, i + 1, depth + 1)
    m = _BARE_END.search(s, i)
    end = m.start() if m else len(s)
    bare = s[i:end].strip()
    if not bare:
        raise _Malformed("a value is missing", i)
    return _bare(bare, i), end


def _bare(text: str, at: int) -> Any:
    """A value written without delimiters: true, false, null/None, a number; anything else stays text (vLLM)."""
    if text in ("true", "false"):
        return text == "true"
    if text in ("null", "None"):
        return None
    if _NUMBER.fullmatch(text):
        try:
            return float(text) if any(c in text for c in ".eE") else int(text)
        except ValueError as exc:  # int_max_str_digits
            raise _Malformed(f"a number too long to convert ({str(exc).split(';')[0]})", at) from None
    return text
