"""The filters and operators of the sandbox (`ctxlock.template.sandbox`) that build strings and lists: each keeps the
provenance of what it builds (`ctxlock.template`) and refuses, before it runs, a result over the render's limits
(`ctxlock.template.sandbox`).

- `wrap_filter`: every jinja filter, marked `pass_context` (never evaluated at compile time), checked before it runs
  (`_BUILDING_FILTERS`: widths, growth per input character) and charged after.
- `LIMITED_FILTERS`: jinja filters replaced outright: `join` (size known before it is built), `attr` (refuses
  underscore names like attribute syntax does) and `random` (drawn from the render's seeded generator, logged).
  `lipsum` is the global of the same kind.
- `BoundedFormatter` (`str.format`), `percent` (`%`) and `check_method` (str methods such as `replace`,
  `expandtabs`, `center`): bounded widths and sizes, provenance per field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jinja2
import jinja2.constants
import jinja2.filters
import jinja2.sandbox
import jinja2.utils

from ctxlock.template import _taint as taint
from ctxlock.template._taint import Tainted
from ctxlock.template.sandbox._limits import RenderState, check_printable, current_state, deep_size, running_line


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """jinja's `lipsum` (n paragraphs of min..max lorem-ipsum words, as HTML paragraphs or plain text), drawn from
    the render's seeded generator instead of the process-wide `random` module, and logged."""
    state = current_state()
    state.width(n * max if isinstance(n, int) and isinstance(max, int) else 0, "lipsum size")
    rng = state.rng
    words = jinja2.constants.LOREM_IPSUM_WORDS.split()
    paragraphs = []
    for _ in range(n):
        picked: list[str] = []
        previous = ""
        since_comma = since_period = 0
        for i in range(rng.randint(min, max)):
            word = rng.choice(words)
            while word == previous:  # no word twice in a row
                word = rng.choice(words)
            previous = word
            since_comma += 1
            since_period += 1
            if i and since_comma > rng.randint(3, 8):  # a comma every few words
                picked[-1] += ","
                since_comma = 0
            if i and since_period > rng.randint(10, 20):  # a period, and a capital after it
                picked[-1] += "."
                since_comma = since_period = 0
                word = word.capitalize()
            picked.append(word)
        text = " ".join(picked)
        text = text[:1].upper() + text[1:]
        if text.endswith(","):
            text = text[:-1] + "."
        elif not text.endswith("."):
            text += "."
        paragraphs.append(text)
    state.draws.append({"what": "lipsum", "line": running_line(), "paragraphs": n})
    if not html:
        return "\n\n".join(paragraphs)
    return jinja2.utils.markupsafe.Markup("\n".join(f"<p>{jinja2.utils.markupsafe.escape(p)}</p>" for p in paragraphs))


@jinja2.pass_context
def _random_filter(context: Any, seq: Any) -> Any:
    """jinja's `random` filter (one item of a sequence), drawn from the render's seeded generator and logged with
    the template line, the sequence length and the index drawn."""
    state = current_state()
    n = len(seq)  # a sequence without a length is a TypeError, as random.choice gives
    if not n:
        return context.environment.undefined("No random item, sequence was empty.")
    index = state.rng.randrange(n)
    state.draws.append({"what": "random", "line": running_line(), "choices": n, "index": index})
    return seq[index]


# Filters that build a new string (or list) from their input: what they build is charged to the render's budget.
_BUILDING_FILTERS = frozenset(
    {
        "capitalize",
        "center",
        "e",
        "escape",
        "forceescape",
        "format",
        "indent",
        "join",
        "list",
        "lower",
        "pprint",
        "replace",
        "reverse",
        "safe",
        "string",
        "striptags",
        "title",
        "tojson",
        "trim",
        "truncate",
        "upper",
        "urlencode",
        "urlize",
        "wordwrap",
        "xmlattr",
    }
)
# Filters that turn their input (and arguments) into text with str() or repr(): a value whose text is a memory
# address is refused there. Filters that only iterate their input (min, first, join of its items, ...) are not in
# it: what they return is checked where it is printed.
_STRINGIFYING = (_BUILDING_FILTERS - {"join", "list", "reverse", "tojson"}) | {"wordcount"}
# How many output characters a filter can make per input character, where it is more than one.
_GROWTH = {"urlencode": 12, "escape": 6, "e": 6, "forceescape": 6, "xmlattr": 6, "urlize": 12, "upper": 3}
_PCT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")
_DIGITS = re.compile(r"\d+")
_METHOD_WIDTH = frozenset({"ljust", "rjust", "center", "zfill"})


class BoundedFormatter(jinja2.sandbox.SandboxedFormatter):
    """The sandbox's `str.format` with bounded widths, keeping the provenance of every field."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        state = current_state()
        for d in _DIGITS.findall(format_spec):
            state.width(int(d), "a format width or precision")
        check_printable(value, "format()")
        out = format(value, format_spec)
        return taint.derived(out, (value,), "format") if type(out) is not Tainted else out

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
        used: set[Any] = set()
        out: str
        out, _ = self._parts(format_string, args, kwargs, used, 2, 0)
        self.check_unused_args(used, args, kwargs)
        return out

    def _parts(self, fmt: str, args: Any, kwargs: Any, used: set[Any], depth: int, auto: int | bool) -> Any:
        # string.Formatter._vformat, joining with provenance.
        if depth < 0:
            raise ValueError("Max string recursion exceeded")
        pieces: list[str] = []
        for literal, field, spec, conversion in self.parse(fmt):
            if literal:
                pieces.append(literal)
            if field is None:
                continue
            if field == "":
                if auto is False:
                    raise ValueError("cannot switch from manual field specification to automatic field numbering")
                field = str(auto)
                auto += 1
            elif field.isdigit():
                if auto:
                    raise ValueError("cannot switch from manual field specification to automatic field numbering")
                auto = False
            obj, arg_used = self.get_field(field, args, kwargs)
            used.add(arg_used)
            converted = self.convert_field(obj, conversion)
            if conversion is not None and type(converted) is not Tainted:
                converted = taint.derived(converted, (obj,), "format")
            spec, auto = self._parts(spec or "", args, kwargs, used, depth - 1, auto)
            pieces.append(self.format_field(converted, spec))
        out = taint.concat(pieces)
        if type(fmt) is Tainted:
            out = taint.derived(str.__str__(out), (fmt, out, args, kwargs), "format")
        return out, auto


def check_method(receiver: str, name: str, args: tuple[Any, ...], state: RenderState) -> None:
    """Refuse, before it runs, a str method call whose result would be over the limits."""
    if name in _METHOD_WIDTH and args:
        state.width(args[0], f"{name}() width")
    elif name == "expandtabs":
        size = (args[0] if args and isinstance(args[0], int) else 8) * str.count(receiver, "\t") + len(receiver)
        state.charge(size, "expandtabs()")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        old, new = args[0], args[1]
        hits = len(receiver) + 1 if not old else str.count(receiver, old)
        state.charge(len(receiver) + hits * max(0, len(new) - len(old)), "replace()")


def percent(fmt: str, args: Any, state: RenderState) -> Any:
    """`fmt % args` with bounded widths; a plain format of `%s` fields keeps each argument's provenance."""
    plain_s = True
    for m in _PCT.finditer(fmt):
        width, precision = m.group(1), m.group(2)
        for w in (width, precision):
            if w and w != "*":
                state.width(int(w), "a '%' width or precision")
        if "*" in (width, precision):
            for a in args if isinstance(args, tuple) else (args,):
                state.width(a, "a '%' width")
        if m.group(0) not in ("%s", "%%"):
            plain_s = False
    check_printable(args, "'%'")
    out = fmt % args
    state.charge(len(out), "'%'")
    if type(fmt) is str and plain_s and not isinstance(args, dict):
        values = args if isinstance(args, tuple) else (args,)
        pieces: list[str] = []
        k = 0
        pos = 0
        for m in _PCT.finditer(fmt):
            pieces.append(fmt[pos : m.start()])
            if m.group(0) == "%%":
                pieces.append("%")
            else:
                v = values[k]
                k += 1
                pieces.append(v if isinstance(v, str) else taint.derived(str(v), (v,), "'%'"))
            pos = m.end()
        pieces.append(fmt[pos:])
        rebuilt = taint.concat(pieces)
        if rebuilt == out:
            return rebuilt
    return taint.derived(out, (fmt, args), "'%'")


def _mark(decorator: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Any:
    """The mark (`jinja_pass_arg`) one of jinja's public decorators puts on a function."""
    return decorator(lambda: None).jinja_pass_arg  # type: ignore[attr-defined]


_PASS_CONTEXT = _mark(jinja2.pass_context)
_PASS_EVAL_CONTEXT = _mark(jinja2.pass_eval_context)
_PASS_ENVIRONMENT = _mark(jinja2.pass_environment)


def wrap_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that keeps provenance and respects the limits. Marked `pass_context`, so that jinja never calls it
    at compile time (a constant filter expression is evaluated at render time, under the limits)."""
    pass_arg = getattr(f, "jinja_pass_arg", None)  # what jinja passes it first, as jinja reads it
    builds = name in _BUILDING_FILTERS
    prints = name in _STRINGIFYING
    growth = _GROWTH.get(name, 1)

    def filt(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        state = current_state()
        if builds:
            _check_filter(name, value, args, kwargs, growth, state)
        if pass_arg is _PASS_CONTEXT:
            out = f(context, value, *args, **kwargs)
        elif pass_arg is _PASS_EVAL_CONTEXT:
            out = f(context.eval_ctx, value, *args, **kwargs)
        elif pass_arg is _PASS_ENVIRONMENT:
            out = f(context.environment, value, *args, **kwargs)
        else:
            out = f(value, *args, **kwargs)
        if prints and isinstance(out, (str, bytes)):
            if type(value) is not str and type(value) is not Tainted:
                check_printable(value, f"|{name}")
            if args or kwargs:
                check_printable((args, kwargs), f"|{name}")
        if isinstance(out, (str, bytes)):
            if type(out) is not Tainted:
                out = taint.derived(out, (value, args, kwargs), f"|{name}")
            if builds and out is not value:
                state.charge(len(out), f"|{name}")
        elif builds and isinstance(out, list):
            state.items(len(out), f"|{name}")
        return out

    jinja2.pass_context(filt)
    filt.__name__ = getattr(f, "__name__", name)
    return filt


def _check_filter(
    name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any], growth: int, state: RenderState
) -> None:
    if name == "center":
        state.width(args[0] if args else kwargs.get("width", 80), "center width")
    elif name == "indent":
        width = args[0] if args else kwargs.get("width", 4)
        if isinstance(width, int):
            state.width(width, "indent width")
        pad = width if isinstance(width, int) else len(str(width))
        if isinstance(value, str):
            state.charge(len(value) + (str.count(value, "\n") + 1) * pad, "|indent")
    elif name == "format":
        if isinstance(value, str):
            for m in _PCT.finditer(value):
                for w in (m.group(1), m.group(2)):
                    if w and w != "*":
                        state.width(int(w), "a '%' width or precision")
            for a in args:
                state.width(a, "a '%' width")
    elif name == "list" and isinstance(value, str):
        state.items(len(value) * 8, "|list of a string")
    elif name in ("string", "pprint") and not isinstance(value, str):
        state.charge(deep_size(value, state.max_single), f"|{name}")
    elif growth > 1 and isinstance(value, str):
        state.charge(len(value) * growth, f"|{name}")


@jinja2.pass_environment
def _attr_filter(environment: Any, obj: Any, name: Any) -> Any:
    """jinja's `attr`, refusing underscore names like attribute syntax does (jinja gives a missing one as "")."""
    out = jinja2.filters.do_attr(environment, obj, name)
    if type(out) is jinja2.Undefined and isinstance(name, str) and name.startswith("_"):
        return environment.unsafe_undefined(obj, name)
    return out


@jinja2.pass_context
def _join_filter(context: Any, value: Any, d: str = "", attribute: Any = None) -> str:
    """jinja's `join` (no autoescape), keeping provenance, with its size known before it is built."""
    env = context.environment
    if attribute is not None:
        value = map(jinja2.filters.make_attrgetter(env, attribute), value)
    parts = [env.ctx_str(v) for v in value]
    sep = env.ctx_str(d)
    state = current_state()
    state.charge(sum(map(len, parts)) + len(sep) * max(0, len(parts) - 1), "|join")
    return taint.join(sep, parts)


# jinja's filters that the sandbox replaces outright (every other filter goes through `wrap_filter`), and the
# `lipsum` global. The functions keep their underscore names: Python's messages for a bad call quote them.
LIMITED_FILTERS: dict[str, Callable[..., Any]] = {
    "join": _join_filter,
    "attr": wrap_filter("attr", _attr_filter),
    "random": wrap_filter("random", _random_filter),
}
lipsum = _lipsum

__all__ = ["LIMITED_FILTERS", "BoundedFormatter", "check_method", "lipsum", "percent", "wrap_filter"]
