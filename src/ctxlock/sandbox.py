"""The jinja2 environment chat templates run in: transformers' sandbox, bounded, and provenance-keeping.

The environment mirrors `transformers.apply_chat_template`: jinja2's ImmutableSandboxedEnvironment with
`trim_blocks`, `lstrip_blocks` and `loopcontrols`, a `tojson` that does not HTML-escape, `raise_exception`,
`strftime_now`, a `dict` without attribute tricks, a `namespace` that refuses underscore names, and the
`{% generation %}` tag. What a template computes, and so the text it renders, is the same for every input.

What ctxlock adds, because a template from a GGUF file or the Hub is untrusted code:
- **Provenance.** Request strings arrive as `taint.Tainted` strings; every way a template can build a new string
  (concatenation, `~`, output, macros and blocks, filters, method calls, `%` and `format`, slicing) goes through a
  hook here that keeps, per character, whether it came from the request. The rendered text comes back with those
  spans, so the tokenizer stage can tell the template's own control tokens from text that spells one.
- **Bounds.** Nothing is evaluated at compile time (jinja's optimizer folds constant expressions, so a dead branch
  `{% if false %}{{ 'x'|center(10**9) }}{% endif %}` would cost gigabytes at load); the source size and compile
  time are capped; every operation that makes a string, a list or a number whose size it can know beforehand is
  refused before it runs when the result would be over the limit (padding and format widths, `*`, `**`, `+`, `~`,
  `join`, `replace`, ...), because work done in C cannot be interrupted; everything the render creates is counted
  against a budget; and the wall time is bounded (an interval timer, or a tracer off the main thread).
- **Determinism.** The same inputs render the same text in every process: jinja's `random` filter and `lipsum`
  draw from a generator seeded per render (`render_limited(seed=)`, every draw logged), and a value whose text is a
  memory address (a function, a method, a generator, an object without a repr of its own) is never printed
  (`check_printable`, `Nondeterministic`), where jinja would print Python's repr.
- **No silent sandbox answers.** An unsafe attribute (`''.__class__`, `'{0.__class__}'.format(1)`) raises
  `SecurityError` when used, where jinja renders it as an empty string.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

import jinja2
import jinja2.compiler
import jinja2.constants
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils
from jinja2.utils import _PassArg

from . import taint
from .caches import LRU
from .settings import cache_root
from .taint import Tainted


@dataclass(frozen=True)
class RenderLimits:
    """Bounds on one render: what a template may add beyond the size of its input. Real templates need milliseconds
    and kilobytes over their input; the defaults leave wide room.

    Each bound is a fixed allowance plus a share proportional to the render's input (`input_chars`: the characters of
    the strings in the messages, tools, documents and variables the template receives), so a 10 MB conversation
    renders with the standard templates while a template still cannot turn a short request into gigabytes or minutes:
    - output: `max_output_chars + output_per_input_char * input_chars` characters, which also bounds any one string
      or list a template builds;
    - everything a render builds (characters of new strings plus items of new lists), which is what bounds memory:
      `max_created` (default 4 x the output bound) plus the same multiple of the output's input share;
    - wall time: `max_seconds + seconds_per_input_mchar * input_chars / 1e6`.
    Source size and compile time are fixed (they do not depend on the input). `scaled(input_chars)` gives the bounds
    of one render as plain numbers."""

    max_seconds: float = 5.0
    max_output_chars: int = 8_000_000
    max_source_chars: int = 256_000  # the largest real chat templates are under 20 kB
    max_width: int = 65_536  # padding, format width and precision
    max_created: int | None = None  # default: 4 x max_output_chars
    output_per_input_char: float = 4.0  # a template that prints each message twice, and its tools as JSON, fits
    seconds_per_input_mchar: float = 5.0  # the standard templates take well under a second per million characters

    @property
    def created_budget(self) -> int:
        return self.max_created if self.max_created is not None else 4 * self.max_output_chars

    def scaled(self, input_chars: int) -> RenderLimits:
        """The bounds of one render whose input holds `input_chars` characters (the allowances added, the per-input
        shares zeroed so that scaling twice changes nothing)."""
        if input_chars <= 0:
            return self
        extra_output = int(self.output_per_input_char * input_chars)
        return RenderLimits(
            max_seconds=self.max_seconds + self.seconds_per_input_mchar * input_chars / 1e6,
            max_output_chars=self.max_output_chars + extra_output,
            max_source_chars=self.max_source_chars,
            max_width=self.max_width,
            max_created=self.created_budget + 4 * extra_output,
            output_per_input_char=0.0,
            seconds_per_input_mchar=0.0,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_seconds": self.max_seconds,
            "max_output_chars": self.max_output_chars,
            "max_source_chars": self.max_source_chars,
            "max_width": self.max_width,
            "max_created": self.max_created,
            "output_per_input_char": self.output_per_input_char,
            "seconds_per_input_mchar": self.seconds_per_input_mchar,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RenderLimits:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if data.get(k) is not None})


def input_chars(value: Any) -> int:
    """The characters of every string in `value` (mappings, sequences and sets walked; keys counted): the size of
    what a render receives, which its limits grow with. Other values count nothing."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, Mapping):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
    return total


DEFAULT_LIMITS = RenderLimits()
_MAX_INT_BITS = 1 << 20  # `*` and `**` on integers: a million bits (315,000 digits) is far past any real template


class Raised(jinja2.exceptions.TemplateError):
    """raise_exception() from inside a template; carries the template's own message."""


class Limit(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ---------------------------------------------------------------------------------------------------------------
# Per-render state: the budget, the limits, and what the provenance rule asks of the render.


class _State:
    __slots__ = ("_rng", "created", "draws", "limits", "max_items", "max_single", "seed", "template")

    def __init__(
        self, limits: RenderLimits, template: jinja2.Template | None, seed: int = 0, draws: list | None = None
    ) -> None:
        self.limits = limits
        self.max_single = limits.max_output_chars
        self.max_items = max(1024, limits.max_output_chars // 8)
        self.created = 0
        self.template = template
        # The one source of randomness a template has (the `random` filter, `lipsum`): seeded per render, so the
        # same inputs and seed give the same text in every process; every draw is logged in `draws`. Built at the
        # first draw (seeding a Mersenne Twister costs more than a short render).
        self.seed = seed
        self._rng: random.Random | None = None
        self.draws = draws if draws is not None else []

    @property
    def rng(self) -> random.Random:
        if self._rng is None:
            self._rng = random.Random(self.seed)
        return self._rng

    def charge(self, n: int, what: str) -> None:
        """A new string of n characters."""
        if n > self.max_single:
            raise Limit(f"{what} would build {n:,} characters (limit {self.max_single:,})")
        self._count(n)

    def items(self, n: int, what: str) -> None:
        """A new list of n items."""
        if n > self.max_items:
            raise Limit(f"{what} would build a list of {n:,} items (limit {self.max_items:,})")
        self._count(n)

    def _count(self, n: int) -> None:
        self.created += n
        if self.created > self.limits.created_budget:
            raise Limit(f"the render built more than {self.limits.created_budget:,} characters and items")

    def width(self, n: Any, what: str) -> None:
        if isinstance(n, int) and n > self.limits.max_width:
            raise Limit(f"{what} of {n:,} is over the limit of {self.limits.max_width:,}")


_STATE: ContextVar[_State | None] = ContextVar("ctxlock_render_state", default=None)
_UNBOUNDED = _State(RenderLimits(max_created=1 << 62), None)


def _state() -> _State:
    return _STATE.get() or _UNBOUNDED


def where() -> str:
    """`line N` of the template frame that is running (for messages), or ""."""
    line = running_line()
    return f"at template line {line}" if line is not None else ""


def running_line() -> int | None:
    """The template line that is running (the innermost template frame), or None outside a render."""
    state = _STATE.get()
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == "<template>":
            line = frame.f_lineno
            if state is not None and state.template is not None:
                with suppress(Exception):
                    line = state.template.get_corresponding_lineno(line)
            return line
        frame = frame.f_back
    return None


class Nondeterministic(Exception):
    """The render would print a memory address (different in every process): refused, with the template line."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_VALUE_TYPES = (str, int, float, type(None), jinja2.Undefined)


def _set_key(x: Any) -> tuple[str, str]:
    return (type(x).__name__, repr(x))


class FixedOrderSet(set):
    """A set a template built (`d.keys() - [...]`, `a.items() - b.items()`, a set method) that iterates and prints in
    one fixed order, sorted by (type name, repr). A plain set of strings iterates in an order that changes with
    PYTHONHASHSEED, so `{{ d.keys() - [] }}` or `|join` over it would give another text in every process; this is
    one of the orders transformers could print, the same in every run (README: Differences from the references)."""

    __slots__ = ()

    def __iter__(self) -> Any:
        return iter(sorted(set.__iter__(self), key=_set_key))

    def __repr__(self) -> str:
        return "{" + ", ".join(repr(x) for x in self) + "}" if self else "set()"

    __str__ = __repr__


def _fixed(value: Any) -> Any:
    return FixedOrderSet(value) if isinstance(value, (set, frozenset)) and type(value) is not FixedOrderSet else value


def check_printable(value: Any, what: str) -> None:
    """Refuse to turn into text a value whose text is a memory address (`<function f at 0x7f...>`, a method, a
    generator from `map`/`select`, a cycler or joiner object): jinja prints it as Python's repr, which differs in
    every process, so the render would not be reproducible. Containers are walked; values are never printed."""
    t = type(value)
    if t is str or t is Tainted or t is int or t is bool or value is None:
        return
    stack = [value]
    seen = 0
    while stack and seen < 100_000:
        v = stack.pop()
        seen += 1
        if isinstance(v, _VALUE_TYPES):
            continue
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
        elif isinstance(v, jinja2.utils.Namespace):
            stack.extend(getattr(v, "_Namespace__attrs", {}).values())
        elif not isinstance(v, (type, jinja2.runtime.Macro)):
            # A class prints as its name and a macro as `<Macro 'name'>`; a function, a method (in transformers,
            # `<built-in method upper of str object at 0x...>`) or an object without a repr of its own prints
            # its address.
            shown = repr(v)
            if _ADDRESS.search(shown) or callable(v):
                kind = type(v).__name__
                shown = _ADDRESS.sub(" at 0x…", shown).replace("Tainted.", "str.")
                raise Nondeterministic(
                    f"{what} would print a {kind} as {shown[:80]!r}, which is not a value: its text is a memory "
                    "address that differs in every run",
                    running_line(),
                )


def _deep_size(value: Any, limit: int) -> int:
    """About the length of `str(value)` or `json.dumps(value)`: string lengths plus a few characters per item, counted
    until `limit` is passed."""
    total = 0
    stack = [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 4
        elif isinstance(v, dict):
            total += 2 * len(v) + 2
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 * len(v) + 2
            stack.extend(v)
        else:
            total += 24
    return total


# ---------------------------------------------------------------------------------------------------------------
# Environment pieces transformers has


class _GenerationTag(jinja2.ext.Extension):
    # transformers' AssistantTracker: `{% generation %}...{% endgeneration %}` renders its body unchanged.
    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _TemplateDict:
    # transformers exposes `dict` without attribute access to the real type.
    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    # Same rule as transformers: no underscore-prefixed attributes on a namespace.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for key in attrs:
            _TemplateNamespace._check(key)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )


# A chat's tools are the same (memoized, immutable) dicts every turn: their JSON is kept by identity (an entry holds
# the object, so its id cannot be reused) and by the control-token set that decided its provenance.
_TOJSON_MEMO: LRU[tuple[Any, ...], tuple[Any, str]] = LRU("sandbox.tojson", max_items=4096)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False):
    # Matches transformers' tojson: no HTML escaping, and the json.dumps options exposed.
    checker = taint.CHECKER.get()
    key = None
    if isinstance(x, (dict, list)) and isinstance(indent, (int, type(None))) and checker is not None:
        key = (id(x), ensure_ascii, indent, None if separators is None else tuple(separators), sort_keys, checker.key)
        hit = _TOJSON_MEMO.get(key)
        if hit is not None and hit[0] is x:
            return hit[1]
    out = _tojson_uncached(x, ensure_ascii, indent, separators, sort_keys)
    if key is not None:
        _TOJSON_MEMO.put(key, (x, out))
    return out


def _tojson_uncached(x: Any, ensure_ascii: bool, indent: Any, separators: Any, sort_keys: bool) -> str:
    state = _state()
    size = _deep_size(x, state.max_single) * (6 if ensure_ascii else 1)
    if isinstance(indent, int):
        state.width(indent, "tojson indent")
        size += _deep_size(x, state.max_single) * indent // 4
    if size > state.max_single:
        raise Limit(f"tojson would build about {size:,} characters (limit {state.max_single:,})")
    out = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    return taint.derived(out, (x,), "tojson")


def _raise_exception(message: Any) -> None:
    raise Raised(message)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """jinja's `lipsum` (n paragraphs of min..max lorem-ipsum words, as HTML paragraphs or plain text), drawn from
    the render's seeded generator instead of the process-wide `random` module, and logged."""
    state = _state()
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
    state = _state()
    n = len(seq)  # a sequence without a length is a TypeError, as random.choice gives
    if not n:
        return context.environment.undefined("No random item, sequence was empty.")
    index = state.rng.randrange(n)
    state.draws.append({"what": "random", "line": running_line(), "choices": n, "index": index})
    return seq[index]


class _UnsafeUndefined(jinja2.Undefined):
    """What an unsafe attribute gives: using it in any way raises SecurityError (jinja prints it as "")."""

    __slots__ = ()

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        self._fail_with_undefined_error()

    __str__ = __format__ = __iter__ = __len__ = __bool__ = _fail  # type: ignore[assignment]


# ---------------------------------------------------------------------------------------------------------------
# Code generation: no compile-time evaluation, and every string built goes through the environment's hooks.


class _CodeGenerator(jinja2.compiler.CodeGenerator):
    def _output_child_to_const(self, node: jinja2.nodes.Expr, frame: Any, finalize: Any) -> str:
        # Only literal template text and literal constants are output as they are; anything else (a filter or an
        # operator over constants: `{{ 'x'|center(10**9) }}`) is evaluated at render time, under the limits.
        if isinstance(node, jinja2.nodes.TemplateData) or (
            isinstance(node, jinja2.nodes.Const) and isinstance(node.value, (str, int, float, bool, type(None)))
        ):
            return super()._output_child_to_const(node, frame, finalize)
        raise jinja2.nodes.Impossible()

    def _output_child_pre(self, node: jinja2.nodes.Expr, frame: Any, finalize: Any) -> None:
        self.write("environment.ctx_str(")
        if finalize.src is not None:
            self.write(finalize.src)

    def visit_Getitem(self, node: jinja2.nodes.Getitem, frame: Any) -> None:
        # jinja writes a slice as Python's own `x[a:b]`; through the environment it is charged to the budget.
        if not isinstance(node.arg, jinja2.nodes.Slice):
            super().visit_Getitem(node, frame)
            return
        self.write("environment.getitem(")
        self.visit(node.node, frame)
        self.write(", slice(")
        for k, part in enumerate((node.arg.start, node.arg.stop, node.arg.step)):
            if k:
                self.write(", ")
            if part is None:
                self.write("None")
            else:
                self.visit(part, frame)
        self.write("))")

    def visit_Add(self, node: jinja2.nodes.Add, frame: Any) -> None:
        # Templates join turns with `+` on short strings: that case is written inline (a request string's own `+`
        # keeps its provenance), and everything else (long strings, lists, numbers) goes through `call_binop`, as the
        # sandbox would send it. The operands are evaluated once, left first, as in `a + b`.
        k = self._ctx_names = getattr(self, "_ctx_names", 0) + 1
        left, right = f"t_ctx_l{k}", f"t_ctx_r{k}"
        self.write(f"({left} + {right} if (({left} := ")
        self.visit(node.left, frame)
        self.write(f"), ({right} := ")
        self.visit(node.right, frame)
        self.write(
            f")) and isinstance({left}, str) and isinstance({right}, str) "
            f"and len({left}) + len({right}) < {_INLINE_ADD} "
            f"else environment.call_binop(context, '+', {left}, {right}))"
        )

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Any) -> None:
        self.write("environment.ctx_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


_INLINE_ADD = 4096  # `+` on two strings shorter than this together runs inline (uncharged)
_STR_ATTRIBUTES = frozenset(a for a in dir(str) if not a.startswith("_"))
_DICT_ATTRIBUTES = frozenset(dir(dict))
_LOOP_ATTRIBUTES = frozenset(
    {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0", "previtem", "nextitem"}
)
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


class _Formatter(jinja2.sandbox.SandboxedFormatter):
    """The sandbox's `str.format` with bounded widths, keeping the provenance of every field."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        state = _state()
        for d in _DIGITS.findall(format_spec):
            state.width(int(d), "a format width or precision")
        check_printable(value, "format()")
        out = format(value, format_spec)
        return taint.derived(out, (value,), "format") if type(out) is not Tainted else out

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:  # type: ignore[override]
        used: set[Any] = set()
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


class LimitedEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The HF sandbox, with the provenance hooks and the size bounds described in the module docstring."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.filters = {name: _wrap_filter(name, f) for name, f in self.filters.items()}
        self.filters["join"] = _join_filter
        self.filters["attr"] = _wrap_filter("attr", _attr_filter)
        self.filters["tojson"] = _wrap_filter("tojson", _tojson)
        self.filters["random"] = _wrap_filter("random", _random_filter)
        self.globals["lipsum"] = _lipsum

    # -- strings built by the template
    def concat(self, parts: Any) -> str:  # type: ignore[override]
        parts = list(parts)
        _state().charge(sum(map(len, parts)), "a block")
        return taint.concat(parts)

    def ctx_str(self, value: Any) -> str:
        t = type(value)
        if t is str or t is Tainted:
            return value
        if isinstance(value, str):
            return value
        if isinstance(value, (list, tuple, dict, set, frozenset)):
            state = _state()
            state.charge(_deep_size(value, state.max_single), "printing a container")
        check_printable(value, "printing a value")
        return taint.derived(str(value), (value,), "str()")

    def ctx_concat(self, parts: tuple[Any, ...]) -> str:
        strs = [self.ctx_str(p) for p in parts]
        _state().charge(sum(map(len, strs)), "'~'")
        return taint.concat(strs)

    # -- attribute and item access
    def getattr(self, obj: Any, attribute: str) -> Any:
        # `message.role` on a plain dict: the sandbox's own path (getattr fails, then obj[attribute]) gives the same
        # value or the same Undefined; dict methods (`items`, `update`, ...) still go through the sandbox checks.
        if type(obj) is dict and type(attribute) is str and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        if type(obj) is jinja2.runtime.LoopContext and attribute in _LOOP_ATTRIBUTES:
            # Public read-only properties of jinja's own loop object: the sandbox would allow each of them.
            return getattr(obj, attribute)
        if isinstance(attribute, str) and attribute.startswith("_"):
            # jinja answers a missing underscore attribute with a plain Undefined (printed as ""); a probe for one
            # is refused like an existing one, when it is used.
            return self.unsafe_undefined(obj, attribute)
        if type(obj) is Tainted and attribute not in _STR_ATTRIBUTES:
            # A request string has exactly the attributes of a str (not the provenance this module keeps).
            return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        out = super().getitem(obj, argument)
        if (
            type(out) is jinja2.Undefined
            and isinstance(argument, str)
            and argument.startswith("_")
            and not isinstance(obj, (dict, list, tuple))
        ):
            return self.unsafe_undefined(obj, argument)
        if isinstance(argument, slice) and isinstance(out, (str, list, tuple)):
            _state().charge(len(out), "a slice")
        return out

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        return _UnsafeUndefined(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe.",
            name=attribute,
            obj=obj,
            exc=jinja2.exceptions.SecurityError,
        )

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None or isinstance(value.__self__, jinja2.utils.markupsafe.Markup):
            return wrapped
        fmt: str = value.__self__
        is_map = value.__name__ == "format_map"
        formatter = _Formatter(self)

        def format_(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs, args = args[0], ()
            out = formatter.vformat(fmt, args, kwargs)
            _state().charge(len(out), "format()")
            return out

        return format_

    # -- calls and operators
    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        receiver = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        state = _state()
        if isinstance(receiver, str):
            if name == "join" and len(args) == 1 and not kwargs and type(receiver) is str:
                parts = list(args[0])
                if all(isinstance(p, str) for p in parts):
                    state.charge(sum(map(len, parts)) + len(receiver) * max(0, len(parts) - 1), "join()")
                    return taint.join(receiver, parts)
                args = (parts,)
            _check_method(receiver, name, args, state)
        out = _fixed(super().call(__context, __obj, *args, **kwargs))
        if not isinstance(receiver, (str, bytes)):
            # Functions, macros, dict and loop methods return what they were given or build it through the hooks
            # here; the globals that build strings from their arguments (strftime_now) keep provenance themselves.
            return out
        if isinstance(out, (str, bytes)):
            state.charge(len(out), f"{name}()")
            if type(out) is not Tainted:
                out = taint.derived(out, (receiver, args, kwargs), f"{name}()")
        elif isinstance(out, list):
            state.items(len(out), f"{name}()")
            if any(type(x) is str for x in out) and taint.first_path((receiver, args, kwargs)) is not None:
                out = [taint.derived(x, (receiver, args, kwargs), f"{name}()") for x in out]
        return out

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        state = _state()
        if operator == "+" and isinstance(left, str) and isinstance(right, str):
            # The common case, without the sandbox's operator table: templates join turns with `+`.
            state.charge(len(left) + len(right), "'+'")
            return left + right
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and not isinstance(n, bool) and isinstance(seq, (str, list, tuple)):
                    if isinstance(seq, str):
                        state.charge(len(seq) * max(n, 0), "'*'")
                    else:
                        state.items(len(seq) * max(n, 0), "'*'")
            if (
                isinstance(left, int)
                and isinstance(right, int)
                and left.bit_length() + right.bit_length() > _MAX_INT_BITS
            ):
                raise Limit("'*' on integers this large is over the limit")
        elif operator == "**":
            big = isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0
            if big and left.bit_length() * right > _MAX_INT_BITS:
                raise Limit(f"'**' with exponent {right:,} is over the limit")
        elif operator == "+":
            if isinstance(left, str) and isinstance(right, str):
                state.charge(len(left) + len(right), "'+'")
            elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
                state.items(len(left) + len(right), "'+'")
        elif operator == "%" and isinstance(left, str):
            return _percent(left, right, state)
        return _fixed(super().call_binop(context, operator, left, right))


def _check_method(receiver: str, name: str, args: tuple[Any, ...], state: _State) -> None:
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


def _percent(fmt: str, args: Any, state: _State) -> Any:
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


def _wrap_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that keeps provenance and respects the limits. Marked `pass_context`, so that jinja never calls it
    at compile time (a constant filter expression is evaluated at render time, under the limits)."""
    pass_arg = _PassArg.from_obj(f)
    builds = name in _BUILDING_FILTERS
    prints = name in _STRINGIFYING
    growth = _GROWTH.get(name, 1)

    def filt(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        state = _state()
        if builds:
            _check_filter(name, value, args, kwargs, growth, state)
        if pass_arg is _PassArg.context:
            out = f(context, value, *args, **kwargs)
        elif pass_arg is _PassArg.eval_context:
            out = f(context.eval_ctx, value, *args, **kwargs)
        elif pass_arg is _PassArg.environment:
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

    filt.jinja_pass_arg = _PassArg.context  # type: ignore[attr-defined]
    filt.__name__ = getattr(f, "__name__", name)
    return filt


def _check_filter(
    name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any], growth: int, state: _State
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
        state.charge(_deep_size(value, state.max_single), f"|{name}")
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
    state = _state()
    state.charge(sum(map(len, parts)) + len(sep) * max(0, len(parts) - 1), "|join")
    return taint.join(sep, parts)


# ---------------------------------------------------------------------------------------------------------------
# Compiling: bounded source size and time, no compile-time evaluation, and a bytecode cache on disk.

# Bump when the environment changes (options, extensions, filters, code generation): the bytecode cache is keyed by
# the template source only, so a new environment needs a new directory.
_BYTECODE_VERSION = 7
_MAX_CACHED_CODE = 1 << 20  # bytes of marshalled code: a larger compiled template is not kept on disk
_MAX_GENERATED = 600_000  # characters of generated Python: real templates (under 20 kB) generate under 150 kB


def new_environment() -> LimitedEnvironment:
    env = LimitedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        optimized=False,
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def compile_source(source: str, limits: RenderLimits) -> jinja2.Template:
    """Compile a template source within the limits (size first, then time); TemplateSyntaxError and Limit as jinja
    and this module raise them."""
    if len(source) > limits.max_source_chars:
        raise Limit(f"the template source has {len(source):,} characters (limit {limits.max_source_chars:,})")
    env = new_environment()
    with time_limit(limits.max_seconds, every_frame=True):
        return _from_bytecode_cache(env, source)


def _from_bytecode_cache(env: jinja2.Environment, source: str) -> jinja2.Template:
    """`env.from_string(source)`, with the compiled module kept on disk (jinja2's FileSystemBytecodeCache, under
    the ctxlock cache, one directory per jinja2 version and environment version): a large template (mistral-common's
    generated one) then loads in milliseconds instead of a tenth of a second. The code object is the one
    `from_string` would compile (same source, same `<template>` file name); an unreadable cache compiles anew, and
    compiled code over 1 MiB is never written."""

    try:
        directory = cache_root() / "jinja" / f"{jinja2.__version__}-{_BYTECODE_VERSION}"
        directory.mkdir(parents=True, exist_ok=True)
        cache = jinja2.FileSystemBytecodeCache(str(directory))
        # Keyed by the source's digest (jinja2 keys a bucket by name and file name only): one file per template, so
        # two models used in turn do not overwrite each other's entry. jinja2 checks the source's checksum as well.
        key = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
        bucket = cache.get_bucket(env, "<template>", key, source)
    except OSError:
        return env.template_class.from_code(env, _compile_bounded(env, source), env.make_globals(None), None)
    code = bucket.code
    if code is None:
        code = _compile_bounded(env, source)
        if len(marshal.dumps(code)) <= _MAX_CACHED_CODE:
            bucket.code = code
            with suppress(OSError):  # a read-only cache: compile every time
                cache.set_bucket(bucket)
    return env.template_class.from_code(env, code, env.make_globals(None), None)


def _compile_bounded(env: jinja2.Environment, source: str) -> CodeType:
    """`env.compile(source)` in its two steps: jinja's parser and code generator (Python, so the time limit stops
    them), then Python's `compile` of the generated module, which runs in C and cannot be interrupted: refused
    beforehand when the module is over `_MAX_GENERATED` characters (about half a second and 60 MB to compile)."""
    generated = env.compile(source, raw=True)
    if len(generated) > _MAX_GENERATED:
        raise Limit(f"the template compiles to {len(generated):,} characters of code (limit {_MAX_GENERATED:,})")
    return compile(generated, "<template>", "exec")


# ---------------------------------------------------------------------------------------------------------------
# Wall time: an interval timer (SIGALRM) on the main thread, or a line tracer elsewhere.


class _Deadline:
    def __init__(self, seconds: float, every_frame: bool) -> None:
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.ticks = 0
        self.armed = True
        self.every_frame = every_frame

    def expired(self) -> Limit:
        return Limit(f"the template took longer than {self.seconds:g} s")

    def local(self, frame: FrameType, event: str, arg: Any) -> Callable | None:
        self.ticks += 1
        if self.ticks & 0xFF == 0 and time.monotonic() > self.deadline:
            raise self.expired()
        return self.local

    def global_(self, frame: FrameType, event: str, arg: Any) -> Callable | None:
        # Rendering: only the compiled template's code is traced, jinja's runtime and our filters run at full speed.
        # Compiling: jinja's lexer, parser and code generator are the work, so every frame is.
        code: CodeType = frame.f_code
        if self.every_frame or code.co_filename == "<template>":
            return self.local
        return None

    def on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            raise self.expired()


def _alarm_free() -> bool:
    """SIGALRM is ours to use: main thread, no handler installed by the host, no interval timer running."""
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN)
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )


@contextmanager
def time_limit(seconds: float, *, tracer: bool | None = None, every_frame: bool = False) -> Iterator[_Deadline]:
    """Stop work that runs past `seconds`. On the main thread an interval timer raises from the signal handler,
    which costs nothing per template line; the timer keeps firing every 50 ms after the deadline, so an exception
    swallowed by a broad `except` inside jinja is raised again. Elsewhere (worker threads, or a host that owns
    SIGALRM) a line tracer checks the clock every 256 lines."""
    deadline = _Deadline(seconds, every_frame)
    if tracer is None:
        tracer = not _alarm_free()
    if tracer:
        previous_trace = sys.gettrace()
        sys.settrace(deadline.global_)
        try:
            yield deadline
        finally:
            sys.settrace(previous_trace)
        return
    previous = signal.signal(signal.SIGALRM, deadline.on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    try:
        yield deadline
    finally:
        deadline.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------------------------------------------------------
# Rendering


_JOIN_EVERY = 4096


def render_limited(
    compiled: jinja2.Template,
    context: dict[str, Any],
    limits: RenderLimits,
    checker: taint.Checker,
    *,
    tracer: bool | None = None,
    seed: int = 0,
    draws: list | None = None,
) -> tuple[str, list[taint.SpanT]]:
    """Render within the limits, scaled to the size of `context` (`RenderLimits.scaled`); return the text and the
    spans of its request-derived characters.

    `seed` seeds the render's one random generator (the `random` filter, `lipsum`); each draw is appended to
    `draws` (a dict: what, template line, and the choice made)."""
    # Chunks are joined every _JOIN_EVERY into one string: a template that prints a long input a character at a time
    # would otherwise hold one object per character (hundreds of bytes each) until the end of the render.
    chunks: list[str] = []
    pending: list[str] = []
    spans: list[taint.SpanT] = []
    size = 0
    limits = limits.scaled(input_chars(context))
    limit = limits.max_output_chars
    append = pending.append
    state_token = _STATE.set(_State(limits, compiled, seed, draws))
    checker_token = taint.CHECKER.set(checker)
    try:
        # The clock is the timer's or the tracer's job (both see every template frame); here only the size counts.
        with time_limit(limits.max_seconds, tracer=tracer):
            for chunk in compiled.generate(**context):
                if type(chunk) is Tainted:
                    spans.extend(taint.shift(chunk.spans, size))
                size += len(chunk)
                if size > limit:
                    raise Limit(f"output exceeded {limit:,} characters")
                append(chunk)
                if len(pending) >= _JOIN_EVERY:
                    chunks.append("".join(pending))
                    pending.clear()
    finally:
        taint.CHECKER.reset(checker_token)
        _STATE.reset(state_token)
    chunks.append("".join(pending))
    return "".join(chunks), spans


def template_line(tb: Any) -> int | None:
    # jinja rewrites the traceback on the way out of generate(): template frames already carry template lines.
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


__all__ = [
    "DEFAULT_LIMITS",
    "Limit",
    "LimitedEnvironment",
    "Nondeterministic",
    "Raised",
    "RenderLimits",
    "check_printable",
    "compile_source",
    "input_chars",
    "new_environment",
    "render_limited",
    "running_line",
    "template_line",
    "time_limit",
    "where",
]
