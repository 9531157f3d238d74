"""Character provenance for the template stage: which characters of a string came from the request.

A request string reaches a chat template as a `Tainted` string: a `str` subclass, equal, hashed, sorted, measured
and serialized exactly as the plain string (so a template behaves as it would under transformers, for every input),
that also carries *spans*: the ranges of its characters that came from the request, each with the JSON path it
came from. Every operation a template can apply to a string keeps the spans: concatenation, slicing, iteration,
`strip`/`split`/`replace`/case changes and the like exactly (per character); anything else through the sandbox's
hooks (`ctxlock.template.sandbox`), which mark the whole result as derived from the request.

A span is `(start, end, path, note)`. `note` is "" when the characters are request text (a control-token match
that touches them is forged); otherwise it names an operation that mixed request text with template text that
itself holds a control token, so which characters of the result are whose is not known: a control-token match
there can be proven neither forged nor trusted, and the template stage refuses it (fails closed).

This module is pure: no I/O, no jinja. The sandbox sets `CHECKER` for the duration of one render.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any, SupportsIndex

SpanT = tuple[int, int, str, str]  # (start, end, path, note)


class Checker:
    """What the generic rule needs from the render in progress: whether a trusted string holds a whole control token
    (then an operation mixing it with request text has unknown provenance), and where in the template we are."""

    def __init__(self, has_token: Callable[[str], bool], where: Callable[[], str], key: object = None) -> None:
        self.has_token = has_token
        self.where = where
        self.key = key  # what `has_token` depends on (the control-token set): results may be memoized by it


CHECKER: ContextVar[Checker | None] = ContextVar("ctxlock_taint_checker", default=None)


class Tainted(str):
    """A string some of whose characters came from the request (see the module docstring)."""

    spans: tuple[SpanT, ...]

    def __new__(cls, value: object = "", spans: tuple[SpanT, ...] | None = None) -> Tainted:
        self = str.__new__(cls, value)
        # `Tainted(x)` without spans (jinja's `type(s)(...)` idiom): every character is request-derived.
        self.spans = ((0, len(self), "", ""),) if spans is None else spans
        return self

    # -- conversions that must not drop the spans
    def __str__(self) -> str:
        return self

    def __format__(self, spec: str) -> str:
        return self if spec == "" else derived(str.__format__(self, spec), (self,), "format")

    def __getitem__(self, key: SupportsIndex | slice) -> str:
        text = str.__getitem__(self, key)
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                return make(text, cut(self.spans, start, stop))
            return make(text, pick(self.spans, range(start, stop, step)))
        i = key.__index__()
        if i < 0:
            i += len(self)
        return make(text, cut(self.spans, i, i + 1))

    def __iter__(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self[i]

    def __add__(self, other: object) -> Any:
        if not isinstance(other, str):
            return str.__add__(self, other)  # type: ignore[operator]  # str's own TypeError, word for word
        text = str.__add__(self, other)
        if type(other) is not Tainted:
            return _tainted(text, self.spans)
        n = len(self)
        return make(text, (*self.spans, *[(s + n, e + n, p, k) for s, e, p, k in other.spans]))

    def __radd__(self, other: object) -> Any:
        if not isinstance(other, str):
            raise TypeError(f"unsupported operand type(s) for +: '{type(other).__name__}' and 'str'")
        # `other` is not Tainted (else its __add__ ran): a plain prefix shifts the spans.
        n = len(other)
        spans = self.spans
        if len(spans) == 1:  # a request string as it came (one path): its one span, shifted
            s, e, p, k = spans[0]
            return _tainted(str.__add__(other, self), ((s + n, e + n, p, k),))
        return _tainted(str.__add__(other, self), tuple([(s + n, e + n, p, k) for s, e, p, k in spans]))

    def __mul__(self, n: SupportsIndex) -> Any:
        if not hasattr(n, "__index__"):
            return str.__mul__(self, n)  # str's own TypeError
        k = max(0, n.__index__())
        return concat((self,) * k) if k <= 64 else derived(str.__mul__(self, k), (self,), "*")

    __rmul__ = __mul__

    # -- the methods templates use on message text, per character
    def strip(self, chars: str | None = None) -> str:
        left = str.lstrip(self, chars)
        return self[len(self) - len(left) : len(self) - len(left) + len(str.rstrip(left, chars))]

    def lstrip(self, chars: str | None = None) -> str:
        return self[len(self) - len(str.lstrip(self, chars)) :]

    def rstrip(self, chars: str | None = None) -> str:
        return self[: len(str.rstrip(self, chars))]

    def removeprefix(self, prefix: str) -> str:
        return self[len(prefix) :] if str.startswith(self, prefix) else self

    def removesuffix(self, suffix: str) -> str:
        return self[: len(self) - len(suffix)] if suffix and str.endswith(self, suffix) else self

    def split(self, sep: str | None = None, maxsplit: SupportsIndex = -1) -> list[str]:
        return self._pieces(str.split(self, sep, maxsplit), sep)

    def rsplit(self, sep: str | None = None, maxsplit: SupportsIndex = -1) -> list[str]:
        return self._pieces(str.rsplit(self, sep, maxsplit), sep)

    def splitlines(self, keepends: bool = False) -> list[str]:
        return self._pieces(str.splitlines(self, keepends), None)

    def _pieces(self, parts: list[str], sep: str | None) -> list[str]:
        # The parts appear in order: with an explicit separator exactly one separator lies between two parts;
        # otherwise (whitespace, line breaks) the first occurrence at or after the previous part's end is the part.
        out: list[str] = []
        pos = 0
        for part in parts:
            start = pos if sep is not None else str.find(self, part, pos)
            out.append(self[start : start + len(part)])
            pos = start + len(part) + (len(sep) if sep is not None else 0)
        return out

    def partition(self, sep: str) -> tuple[str, str, str]:
        i = str.find(self, sep)
        return (self, "", "") if i < 0 else (self[:i], self[i : i + len(sep)], self[i + len(sep) :])

    def rpartition(self, sep: str) -> tuple[str, str, str]:
        i = str.rfind(self, sep)
        return ("", "", self) if i < 0 else (self[:i], self[i : i + len(sep)], self[i + len(sep) :])

    def replace(self, old: str, new: str, count: SupportsIndex = -1) -> str:
        if not isinstance(old, str) or not isinstance(new, str) or not old:
            out: str = derived(str.replace(self, old, new, count), (self, old, new), "replace")
            return out
        n = count.__index__()
        parts: list[str] = []
        pos = 0
        while n != 0:
            i = str.find(self, old, pos)
            if i < 0:
                break
            parts += (self[pos:i], new)
            pos = i + len(old)
            n -= 1
        if not parts:
            return self
        parts.append(self[pos:])
        return concat(parts)

    def join(self, parts: Iterable[str]) -> str:
        return join(self, list(parts))

    def upper(self) -> str:
        return self._per_char(str.upper(self), str.upper)

    def lower(self) -> str:
        return self._per_char(str.lower(self), str.lower)

    def casefold(self) -> str:
        return self._per_char(str.casefold(self), str.casefold)

    def swapcase(self) -> str:
        return self._per_char(str.swapcase(self), str.swapcase)

    def title(self) -> str:
        return self._per_char(str.title(self), None)

    def capitalize(self) -> str:
        return self._per_char(str.capitalize(self), None)

    def _per_char(self, text: str, each: Callable[[str], str] | None) -> str:
        if len(text) == len(self):
            return make(text, self.spans)
        if each is not None:
            # A character may map to several ("ß" -> "SS"): map each span through the per-character lengths.
            ends = [0]
            for ch in str.__iter__(self):
                ends.append(ends[-1] + len(each(ch)))
            if ends[-1] == len(text):
                return make(text, tuple((ends[s], ends[e], p, n) for s, e, p, n in self.spans if ends[e] > ends[s]))
        changed: str = derived(text, (self,), "case change")
        return changed


# ---------------------------------------------------------------------------------------------------------------
# Span algebra


def make(text: str, spans: Iterable[SpanT]) -> str:
    """`text` with these spans (merged where adjacent and alike); a plain str when there are none."""
    merged: list[SpanT] = []
    for sp in spans:
        if sp[1] <= sp[0]:
            continue
        if merged and merged[-1][1] == sp[0] and merged[-1][2:] == sp[2:]:
            merged[-1] = (merged[-1][0], sp[1], sp[2], sp[3])
        else:
            merged.append(sp)
    if not merged:
        return str.__str__(text) if type(text) is not str else text
    return Tainted(text, tuple(merged))


def shift(spans: Iterable[SpanT], offset: int) -> list[SpanT]:
    return [(s + offset, e + offset, p, n) for s, e, p, n in spans]


def _tainted(text: str, spans: tuple[SpanT, ...]) -> Tainted:
    """`Tainted(text, spans)` without the class call's dispatch to `__new__`: what a template's `+` builds."""
    out = str.__new__(Tainted, text)
    out.spans = spans
    return out


def cut(spans: tuple[SpanT, ...], start: int, stop: int) -> list[SpanT]:
    """The spans within [start, stop), relative to start."""
    return [(max(s, start) - start, min(e, stop) - start, p, n) for s, e, p, n in spans if s < stop and e > start]


def pick(spans: tuple[SpanT, ...], indices: Iterable[int]) -> list[SpanT]:
    """The spans of the characters at `indices`, in that order (a stepped or reversed slice)."""
    out: list[SpanT] = []
    for j, i in enumerate(indices):
        for s, e, p, n in spans:
            if s <= i < e:
                out.append((j, j + 1, p, n))
                break
    return out


def concat(parts: Iterable[str]) -> str:
    """`"".join(parts)` with every part's spans kept (parts are strings)."""
    if not isinstance(parts, (list, tuple)):
        parts = tuple(parts)
    text = "".join(parts)
    spans: list[SpanT] | None = None
    pos = 0
    for p in parts:
        if type(p) is Tainted:
            if spans is None:
                spans = []
            if pos:
                spans.extend([(s + pos, e + pos, a, n) for s, e, a, n in p.spans])
            else:
                spans.extend(p.spans)
        pos += len(p)
    return text if spans is None else make(text, spans)


def shifted(text: str, spans: tuple[SpanT, ...], at: int) -> Tainted:
    """`text` holding the characters of one request string at offset `at`, with its spans: what `+` builds from
    that string and plain strings around it (the spans shifted, not merged)."""
    if at:
        if len(spans) == 1:
            s, e, p, n = spans[0]
            spans = ((s + at, e + at, p, n),)
        else:
            spans = tuple([(s + at, e + at, p, n) for s, e, p, n in spans])
    return _tainted(text, spans)


def join(sep: str, parts: list[str]) -> str:
    """`sep.join(parts)` with the spans of the separator and of every part kept."""
    if not parts:
        return ""
    if type(sep) is not Tainted and not any(type(p) is Tainted for p in parts):
        return str.join(sep, parts)
    seq: list[str] = [parts[0]]
    for p in parts[1:]:
        seq += (sep, p)
    return concat(seq)


def first_path(value: Any, budget: int = 10_000) -> str | None:
    """The path of the first request-derived string inside `value` (strings, lists, tuples, dicts: keys and values),
    or None if there is none. A structure too large to walk within `budget` nodes counts as tainted."""
    stack = [value]
    seen = 0
    while stack:
        v = stack.pop()
        seen += 1
        if seen > budget:
            return ""
        t = type(v)
        if t is Tainted:
            path: str = v.spans[0][2]
            return path
        if t is TaintedBytes:
            bpath: str = v.path
            return bpath
        if t is str or t is int or t is float or t is bool or v is None:
            continue
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
    return None


def trusted_strings(value: Any, budget: int = 10_000) -> Iterator[str]:
    """The text inside `value` that is not request-derived: plain strings, and the gaps between a tainted string's
    spans."""
    stack = [value]
    seen = 0
    while stack and seen < budget:
        v = stack.pop()
        seen += 1
        t = type(v)
        if t is str:
            yield v
        elif t is Tainted:
            pos = 0
            for s, e, _, _ in v.spans:
                if s > pos:
                    yield str.__getitem__(v, slice(pos, s))
                pos = e
            if pos < len(v):
                yield str.__getitem__(v, slice(pos, None))
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)


# Error messages name a value's type ("'str object' has no attribute ...", "unsupported operand type(s)"): under
# these names a template, and whoever reads its errors, sees exactly what it would see under transformers.
Tainted.__module__ = "builtins"
Tainted.__name__ = Tainted.__qualname__ = "str"


class TaintedBytes(bytes):
    """Bytes made from request text (`content.encode()`): printing them prints request text."""

    path: str = ""


def derived(result: Any, inputs: tuple[Any, ...], op: str) -> Any:
    """The generic rule, for an operation whose output cannot be mapped to its inputs character by character: when an
    input holds request text, every character of a string result counts as request-derived; unless a trusted input
    holds a whole control token (then the template may have put its own token through the operation, and the
    result's provenance is unknown: a note names the operation and where the template applied it)."""
    if not isinstance(result, (str, bytes)) or isinstance(result, (Tainted, TaintedBytes)) or not result:
        return result
    path = first_path(inputs)
    if path is None:
        return result
    if isinstance(result, bytes):
        out = TaintedBytes(result)
        out.path = path
        return out
    checker = CHECKER.get()
    note = ""
    if checker is not None and any(checker.has_token(s) for s in trusted_strings(inputs)):
        note = f"{op} {checker.where()}".strip()
    return Tainted(result, ((0, len(result), path, note),))


def leaf(s: str, path: str) -> str:
    """A request string as templates see it."""
    return Tainted(s, ((0, len(s), path, ""),)) if s else s


__all__ = [
    "CHECKER",
    "Checker",
    "SpanT",
    "Tainted",
    "TaintedBytes",
    "concat",
    "cut",
    "derived",
    "first_path",
    "join",
    "leaf",
    "make",
    "shifted",
    "trusted_strings",
]
