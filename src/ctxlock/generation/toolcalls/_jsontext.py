"""The text scanners every wire format shares: strict RFC 8259 JSON (`loads_object`, `dumps_arguments`), where a
streamed JSON container ends (`JsonSpan`), and how much of a text delta may be a call marker still arriving."""

from __future__ import annotations

import ast
import json
import re
import threading
import warnings
from typing import Any

from ctxlock.errors import ToolCallError

# CPython 3.11 keeps ast.parse's recursion-depth count in per-interpreter state: two threads parsing at once (the
# server's worker threads) can each reset the other's count, and one of them fails with "SystemError: AST constructor
# recursion depth mismatch" (https://github.com/python/cpython/issues/106905). ctxlock's own parses take turns.
_AST_LOCK = threading.Lock()


def parse_python_expression(source: str) -> ast.Expression:
    """`ast.parse(source, mode="eval")` (never evaluated), one thread at a time, invalid escapes kept as written
    without a warning; a SystemError from another library's parse racing this one is retried once, then a
    ValueError. SyntaxError, ValueError, RecursionError and MemoryError pass through, as from `ast.parse`."""
    try:
        return _parse_expression(source)
    except SystemError:
        try:
            return _parse_expression(source)
        except SystemError as exc:
            raise ValueError(f"Python's parser failed: {exc}") from None


def _parse_expression(source: str) -> ast.Expression:
    with _AST_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an invalid escape such as "\\ " is kept as written, with a warning
        return ast.parse(source, mode="eval")


def text_delta(text: Any, fmt: str) -> str:
    """A raw-text format's delta, or the error that says what to feed instead."""
    if not isinstance(text, str):
        raise ToolCallError(
            f"{fmt} streams are fed text deltas (str), got {type(text).__name__}",
            path="stream",
            hint="decode the tokens to text first (with special tokens kept)",
        )
    return text


def split_marker_prefix(text: str, marker: str) -> tuple[str, str]:
    """Split off the longest suffix of `text` that is a proper prefix of `marker` (it may yet become the marker)."""
    n = len(text)
    first = marker[0]
    start = max(0, n - len(marker) + 1)
    j = text.find(first, start)
    while j != -1:
        if marker.startswith(text[j:]):
            return text[:j], text[j:]
        j = text.find(first, j + 1)
    return text, ""


_IN_STRING = re.compile(r'["\\]')
_OUTSIDE_STRING = re.compile(r'["{}\[\]]')


class JsonSpan:
    """Where a streamed JSON container ends, without parsing it: string, escape and bracket depth only.

    Each character is looked at once (regex jumps between the few that matter), so feeding a stream in any
    chunking costs O(length). Whether the span is valid JSON is json.loads' business once it has closed.
    """

    __slots__ = ("depth", "escaped", "in_string")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def feed(self, text: str, start: int = 0) -> int:
        """Consume text[start:]; return the index just past the bracket that closes the outermost container, or -1."""
        i = start
        n = len(text)
        while i < n:
            if self.escaped:
                self.escaped = False
                i += 1
            elif self.in_string:
                m = _IN_STRING.search(text, i)
                if m is None:
                    return -1
                i = m.end()
                if m.group() == '"':
                    self.in_string = False
                else:
                    self.escaped = True
            else:
                m = _OUTSIDE_STRING.search(text, i)
                if m is None:
                    return -1
                i = m.end()
                c = m.group()
                if c == '"':
                    self.in_string = True
                elif c in "{[":
                    self.depth += 1
                else:
                    self.depth -= 1
                    if self.depth <= 0:
                        return i
        return -1

    @property
    def incomplete(self) -> bool:
        """True when what was fed is an open container or string: JSON cut off part way."""
        return self.depth > 0 or self.in_string


def looks_cut_off(raw: str) -> bool:
    if not raw.strip():
        return True
    span = JsonSpan()
    return span.feed(raw) == -1 and span.incomplete


# ---------------------------------------------------------------------------------------------------------------
# Strict RFC 8259 JSON


class _NotJSON(ValueError):
    """Raised inside json.loads by the strict hooks: text json.loads accepts that RFC 8259 does not."""


def _refuse_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _NotJSON(f"duplicate object key {key!r}")
        out[key] = value
    return out


_CONSTANT_AT = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')
_SURROGATE = re.compile("[\ud800-\udfff]")


def _constant_offset(text: str) -> int | None:
    for m in _CONSTANT_AT.finditer(text):
        if m.group(1):
            return m.start(1)
    return None


def _lone_surrogate(value: Any) -> str | None:
    """The JSON path of the first string (or key) holding a lone surrogate, or of a non-finite float; iterative,
    so a value json.loads managed to build is walked without recursion."""
    stack: list[tuple[str, Any]] = [("$", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return f"a lone surrogate in the string at {path}"
        elif isinstance(node, float):
            if node != node or node in (float("inf"), float("-inf")):
                return f"a non-finite number ({node!r}) at {path}"
        elif isinstance(node, dict):
            for key, item in reversed(list(node.items())):
                if isinstance(key, str) and _SURROGATE.search(key):
                    return f"a lone surrogate in an object key at {path}"
                stack.append((f"{path}[{json.dumps(key)}]", item))
        elif isinstance(node, list | tuple):
            for k in range(len(node) - 1, -1, -1):
                stack.append((f"{path}[{k}]", node[k]))
    return None


def loads_object(text: str, *, unicode: bool = True) -> tuple[Any, str | None]:
    """Strict RFC 8259 json.loads, with the error as a message (naming the offset, key or path) instead of an
    exception: no NaN/Infinity, no duplicate object keys, no lone surrogate (escaped or not), no integer longer
    than Python converts (4,300 digits), no nesting deeper than the parser's recursion limit. Never raises.
    `unicode=False` (a whole stream event, whose text deltas are passed through) skips the surrogate check."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        return None, f"{exc.msg} at char {exc.pos}"
    except _NotJSON as exc:
        at = _constant_offset(text) if "JSON number" in str(exc) else None
        return None, f"{exc}" + (f" at char {at}" if at is not None else "") + " (RFC 8259 does not allow it)"
    except RecursionError:
        return None, "nested too deeply to parse"
    except ValueError as exc:  # int_max_str_digits: "Exceeds the limit (4300 digits) for integer string conversion"
        return None, f"a number too long to convert ({str(exc).split(';')[0]})"
    except MemoryError:
        return None, "too large to parse"
    problem = _lone_surrogate(value) if unicode else None
    if problem is not None:
        return None, f"{problem} (RFC 8259 text must be valid Unicode)"
    return value, None


def dumps_arguments(value: Any) -> tuple[str, str | None]:
    """Canonical JSON of already-parsed arguments, or the problem that keeps them from being JSON."""
    problem = _lone_surrogate(value)
    if problem is not None:
        return "", problem
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False), None
    except (TypeError, ValueError, RecursionError) as exc:
        return "", f"not JSON-serialisable: {exc}"
