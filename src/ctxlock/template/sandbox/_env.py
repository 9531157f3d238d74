# size: the environment and the code generator that writes calls to its hooks by name (the `+` chains, inline
# attribute reads): 700 lines before the chained `+`; apart, each would have to know the other's private names.
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

This module is the environment itself (its code generation, attribute and operator hooks, the pieces transformers
adds, compiling and rendering); the bounds and the per-render budget are in `_limits.py` beside it, and the filters and
operators that build strings under them in `_filters.py`. Their public names are importable from
`ctxlock.template.sandbox`.
"""

from __future__ import annotations

import hashlib
import json
import marshal
from collections.abc import Callable
from contextlib import suppress
from types import CodeType
from typing import Any, cast

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils

from ctxlock.caches import LRU
from ctxlock.settings import cache_root
from ctxlock.template import _taint as taint
from ctxlock.template._taint import Tainted
from ctxlock.template.sandbox._filters import (
    LIMITED_FILTERS,
    BoundedFormatter,
    check_method,
    lipsum,
    percent,
    wrap_filter,
)
from ctxlock.template.sandbox._limits import (
    DEFAULT_LIMITS,
    MAX_INT_BITS,
    STATE,
    DeadlineExpired,
    Limit,
    Nondeterministic,
    RenderLimits,
    RenderState,
    check_printable,
    current_state,
    deep_size,
    fixed_order,
    input_chars,
    running_line,
    settle_deadlines,
    time_limit,
    where,
)

# ---------------------------------------------------------------------------------------------------------------
# Environment pieces transformers has


class _GenerationTag(jinja2.ext.Extension):
    # transformers' AssistantTracker: `{% generation %}...{% endgeneration %}` renders its body unchanged.
    # A frozenset: the class attribute cannot be changed by accident.
    tags = frozenset({"generation"})  # type: ignore[assignment]  # jinja2 annotates set[str]; it only iterates tags

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        body = caller()
        state = STATE.get()
        if state is not None:  # where the block's text lies in the output (`Rendered.generation_spans`)
            state.generation.append((state.emitted, state.emitted + len(body)))
        return body


class _TemplateDict:
    # transformers exposes `dict` without attribute access to the real type.
    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
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


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
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
    state = current_state()
    size = deep_size(x, state.max_single) * (6 if ensure_ascii else 1)
    if isinstance(indent, int):
        state.width(indent, "tojson indent")
        size += deep_size(x, state.max_single) * indent // 4
    if size > state.max_single:
        raise Limit(f"tojson would build about {size:,} characters (limit {state.max_single:,})")
    out = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    return cast(str, taint.derived(out, (x,), "tojson"))  # a str in, a str (or its Tainted subclass) out


class Raised(jinja2.exceptions.TemplateError):
    """raise_exception() from inside a template; carries the template's own message."""


def _raise_exception(message: Any) -> None:
    raise Raised(message)


class _UnsafeUndefined(jinja2.Undefined):
    """What an unsafe attribute gives: using it in any way raises SecurityError (jinja prints it as "")."""

    __slots__ = ()

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        self._fail_with_undefined_error()

    __str__ = __format__ = __iter__ = __len__ = __bool__ = _fail


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

    def _name(self) -> int:
        k: int = getattr(self, "_ctx_names", 0) + 1
        self._ctx_names = k
        return k

    def visit_Add(self, node: jinja2.nodes.BinExpr, frame: Any) -> None:  # called for Add nodes only
        # A chain `a + b + c + ...` whose operands after the first are pure reads (`_pure`: constants, names, and
        # constant attributes and items of those) is written as one call when every operand is a string
        # (`add_strings`, which adds them exactly as the binary form below would, one `+` at a time in effect, with
        # one Python call instead of one per `+`); else the binary form runs, with the first operand as already
        # evaluated (the pure ones are read again: reading them has no effect and gives the same values).
        rights: list[jinja2.nodes.Expr] = []
        first: jinja2.nodes.Expr = node
        while isinstance(first, jinja2.nodes.Add) and _pure(first.right):
            rights.append(first.right)
            first = first.left
        if len(rights) < 2 or self.environment.is_async:
            self._binary_add(node, frame, None, None, spine=False)
            return
        rights.reverse()
        k = self._name()
        names = [f"t_ctx_c{k}_{i}" for i in range(len(rights) + 1)]
        # A string constant is written as it is (it is a string); every other operand is tested as it is evaluated.
        operands = [first, *rights]
        items = [
            repr(op.value) if _string_constant(op) else name  # type: ignore[attr-defined]
            for name, op in zip(names, operands, strict=True)
        ]
        self.write(f"(environment.add_strings(context, ({', '.join(items)},)) if ")
        tests = 0
        for name, item, operand in zip(names, items, operands, strict=True):
            if item != name:
                continue
            self.write(f"{' and ' if tests else ''}isinstance({name} := ")
            self.visit(operand, frame)
            self.write(", str)")
            tests += 1
        self.write(" else " if tests else "True else ")
        # the first operand, when it is not a constant, is not evaluated again (it need not be pure)
        self._binary_add(node, frame, None if items[0] != names[0] else first, names[0], spine=True)
        self.write(")")

    def _binary_add(
        self, node: jinja2.nodes.Expr, frame: Any, evaluated: jinja2.nodes.Expr | None, name: str | None, *, spine: bool
    ) -> None:
        # Templates join turns with `+` on short strings: that case is written inline (a request string's own `+`
        # keeps its provenance), and everything else (long strings, lists, numbers) goes through `call_binop`, as the
        # sandbox would send it. The operands are evaluated once, left first, as in `a + b`. `evaluated` (a node of
        # the chain, written as the variable `name`) has been evaluated already; with `spine`, the `+` on the left are
        # written in this binary form too (the fallback of a chain), else each is visited (and may be a chain).
        if node is evaluated:
            self.write(str(name))
            return
        assert isinstance(node, jinja2.nodes.BinExpr)
        k = self._name()
        left, right = f"t_ctx_l{k}", f"t_ctx_r{k}"
        self.write(f"({left} + {right} if (({left} := ")
        if node.left is evaluated or (spine and isinstance(node.left, jinja2.nodes.Add)):
            self._binary_add(node.left, frame, evaluated, name, spine=spine)
        else:
            self.visit(node.left, frame)
        self.write(f"), ({right} := ")
        self.visit(node.right, frame)
        self.write(
            f")) and isinstance({left}, str) and isinstance({right}, str) "
            f"and len({left}) + len({right}) < {_INLINE_ADD} "
            f"else environment.call_binop(context, '+', {left}, {right}))"
        )

    def visit_Getattr(self, node: jinja2.nodes.Getattr, frame: Any) -> None:
        # `message.role`: a dict's key, read inline when it is there (what `LimitedEnvironment.getattr` returns for
        # a dict and a name that is not a dict attribute); anything else through `environment.getattr`.
        attr = node.attr
        if self.environment.is_async or attr.startswith("_") or attr in _DICT_ATTRIBUTES:
            super().visit_Getattr(node, frame)
            return
        k = self._name()
        obj = f"t_ctx_o{k}"
        self.write(f"({obj}[{attr!r}] if type({obj} := ")
        self.visit(node.node, frame)
        self.write(f") is dict and {attr!r} in {obj} else environment.getattr({obj}, {attr!r}))")

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Any) -> None:
        self.write("environment.ctx_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def _pure(node: jinja2.nodes.Node) -> bool:
    """True for an expression whose evaluation changes nothing and gives the same value each time: a constant,
    a variable, or a constant attribute or item (not a slice) of one of these."""
    while isinstance(node, (jinja2.nodes.Getattr, jinja2.nodes.Getitem)):
        if isinstance(node, jinja2.nodes.Getitem) and not isinstance(node.arg, jinja2.nodes.Const):
            return False
        node = node.node
    return isinstance(node, (jinja2.nodes.Const, jinja2.nodes.TemplateData)) or (
        isinstance(node, jinja2.nodes.Name) and node.ctx == "load"
    )


def _string_constant(node: jinja2.nodes.Node) -> bool:
    return isinstance(node, jinja2.nodes.Const) and type(node.value) is str


_INLINE_ADD = 4096  # `+` on two strings shorter than this together runs inline (uncharged)
_STR_ATTRIBUTES = frozenset(a for a in dir(str) if not a.startswith("_"))
# The str methods jinja's sandbox returns as they are (format and format_map it wraps: they go its own way).
_PLAIN_STR_ATTRIBUTES = _STR_ATTRIBUTES - {"format", "format_map"}
_DICT_ATTRIBUTES = frozenset(dir(dict))
_LOOP_ATTRIBUTES = frozenset(
    {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0", "previtem", "nextitem"}
)


class LimitedEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The HF sandbox, with the provenance hooks and the size bounds described in the module docstring."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.filters = {name: wrap_filter(name, f) for name, f in self.filters.items()}
        self.filters.update(LIMITED_FILTERS)  # join, attr, random
        self.filters["tojson"] = wrap_filter("tojson", _tojson)
        self.globals["lipsum"] = lipsum

    # -- strings built by the template
    def concat(self, parts: Any) -> str:
        parts = list(parts)
        current_state().charge(sum(map(len, parts)), "a block")
        return taint.concat(parts)

    def ctx_str(self, value: Any) -> str:
        t = type(value)
        if t is str or t is Tainted:
            return cast(str, value)  # its type is str or Tainted (a str)
        if isinstance(value, str):
            return value
        if isinstance(value, (list, tuple, dict, set, frozenset)):
            state = current_state()
            state.charge(deep_size(value, state.max_single), "printing a container")
        check_printable(value, "printing a value")
        return cast(str, taint.derived(str(value), (value,), "str()"))  # a str in, a str (or its Tainted subclass) out

    def ctx_concat(self, parts: tuple[Any, ...]) -> str:
        strs = [self.ctx_str(p) for p in parts]
        current_state().charge(sum(map(len, strs)), "'~'")
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
        if (type(obj) is str or type(obj) is Tainted) and attribute in _PLAIN_STR_ATTRIBUTES:
            # `content.strip`, `role.startswith`: what the sandbox's own path returns for a str's public method (it
            # is neither internal nor a known mutable's), without its checks on every call.
            return getattr(obj, attribute)
        if type(obj) is jinja2.runtime.LoopContext and attribute in _LOOP_ATTRIBUTES:
            # Public read-only properties of jinja's own loop object: the sandbox would allow each of them.
            return getattr(obj, attribute)
        if isinstance(attribute, str) and attribute.startswith("_"):
            # jinja answers a missing underscore attribute with a plain Undefined (printed as ""); a probe for one
            # is refused like an existing one, when it is used.
            return self.unsafe_undefined(obj, attribute)
        if type(obj) is _TemplateNamespace:
            # `ns.current_role`: the sandbox's own path without its per-call type checks (a namespace is neither
            # internal nor a known mutable; underscore names were refused above); a stored str.format still wrapped.
            # A third of a render of mistral-nemo's template went to those checks.
            try:
                value = getattr(obj, attribute)
            except AttributeError:
                return self.undefined(obj=obj, name=attribute)
            wrapped = self.wrap_str_format(value)
            return value if wrapped is None else wrapped
        if type(obj) is Tainted and attribute not in _STR_ATTRIBUTES:
            # A request string has exactly the attributes of a str (not the provenance this module keeps).
            return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if (type(obj) is dict or type(obj) is list) and type(argument) is not slice:
            # `message['content']`, `messages[0]`: what the sandbox's own getitem returns when the item is there (it
            # tries `obj[argument]` first), and nothing below applies to a dict's or a list's item.
            try:
                return obj[argument]
            except (TypeError, LookupError):
                pass
        out = super().getitem(obj, argument)
        if (
            type(out) is jinja2.Undefined
            and isinstance(argument, str)
            and argument.startswith("_")
            and not isinstance(obj, (dict, list, tuple))
        ):
            return self.unsafe_undefined(obj, argument)
        if isinstance(argument, slice) and isinstance(out, (str, list, tuple)):
            current_state().charge(len(out), "a slice")
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
        formatter = BoundedFormatter(self)

        def format_(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs, args = args[0], ()
            out = formatter.vformat(fmt, args, kwargs)
            current_state().charge(len(out), "format()")
            return out

        return format_

    # -- calls and operators
    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        receiver = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        state = current_state()
        if isinstance(receiver, str):
            if name == "join" and len(args) == 1 and not kwargs and type(receiver) is str:
                parts = list(args[0])
                if all(isinstance(p, str) for p in parts):
                    state.charge(sum(map(len, parts)) + len(receiver) * max(0, len(parts) - 1), "join()")
                    return taint.join(receiver, parts)
                args = (parts,)
            check_method(receiver, name, args, state)
        out = fixed_order(super().call(__context, __obj, *args, **kwargs))
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

    def add_strings(self, context: Any, parts: tuple[str, ...]) -> Any:
        """`parts[0] + parts[1] + ...` (strings), as the binary form of `_CodeGenerator` adds them one at a time:
        inline while the two sides are under `_INLINE_ADD` characters together, else through `call_binop`."""
        total = 0
        found: Any = None  # the one request string among them (`several` when there are more)
        at = 0
        several = False
        for p in parts:
            t = type(p)
            if t is Tainted:
                if found is None:
                    found, at = p, total
                else:
                    several = True
            elif t is not str:
                break
            total += len(p)
        else:
            if total < _INLINE_ADD:  # every partial sum is under it too: `+` would run inline each time
                if found is None:
                    return "".join(parts)
                # `+` shifts the spans of one request string, and merges those of several as `concat` does
                return taint.concat(parts) if several else taint.shifted("".join(parts), found.spans, at)
        out: Any = parts[0]
        for p in parts[1:]:
            if isinstance(out, str) and isinstance(p, str) and len(out) + len(p) < _INLINE_ADD:
                out = out + p
            else:
                out = self.call_binop(context, "+", out, p)
        return out

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        state = current_state()
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
                and left.bit_length() + right.bit_length() > MAX_INT_BITS
            ):
                raise Limit("'*' on integers this large is over the limit")
        elif operator == "**":
            big = isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0
            if big and left.bit_length() * right > MAX_INT_BITS:
                raise Limit(f"'**' with exponent {right:,} is over the limit")
        elif operator == "+":
            if isinstance(left, str) and isinstance(right, str):
                state.charge(len(left) + len(right), "'+'")
            elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
                state.items(len(left) + len(right), "'+'")
        elif operator == "%" and isinstance(left, str):
            return percent(left, right, state)
        return fixed_order(super().call_binop(context, operator, left, right))


# ---------------------------------------------------------------------------------------------------------------
# Compiling: bounded source size and time, no compile-time evaluation, and a bytecode cache on disk.

# Bump when the environment changes (options, extensions, filters, code generation): the bytecode cache is keyed by
# the template source only, so a new environment needs a new directory.
_BYTECODE_VERSION = 9  # 9: `+` chains and dict attributes written inline
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
    try:
        return compile(generated, "<template>", "exec")
    except SyntaxError as exc:
        # jinja's code generator emits code Python refuses for some templates jinja's parser accepts: a `{% break %}`
        # or `{% continue %}` inside a macro, a call block or a `{% generation %}` block within a loop (each is a
        # function of its own in the generated module, where the loop's break does not reach).
        why = exc.msg
        if "outside loop" in why or "not properly in loop" in why:
            why += ": a macro, call block or {% generation %} block is a function of its own, and its loop control "
            why += "does not reach the loop around it"
        raise jinja2.TemplateSyntaxError(why, _template_line(generated, exc.lineno)) from None


def _template_line(generated: str, python_line: int | None) -> int:
    """The template line of a line of jinja's generated module, from the module's `debug_info` ('tpl=py&...');
    line 1 when it does not say."""
    info = generated.rsplit("debug_info = '", 1)[-1].split("'", 1)[0] if "debug_info = '" in generated else ""
    best = 1
    for pair in filter(None, info.split("&")):
        tpl, _, py = pair.partition("=")
        if tpl.isdigit() and py.isdigit() and python_line is not None and int(py) <= python_line:
            best = int(tpl)
    return best


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
    draws: list[dict[str, Any]] | None = None,
    generation: list[tuple[int, int]] | None = None,
    template_globals: dict[str, Any] | None = None,
    printed: list[tuple[int, int]] | None = None,
) -> tuple[str, list[taint.SpanT]]:
    """Render within the limits, scaled to the size of `context` (`RenderLimits.scaled`); return the text and the
    spans of its request-derived characters.

    `seed` seeds the render's one random generator (the `random` filter, `lipsum`); each draw is appended to
    `draws` (a dict: what, template line, and the choice made). The `{% generation %}` blocks' [start, end) are
    appended to `generation` (transformers' `return_assistant_tokens_mask` spans). `template_globals`: the
    template's globals as a dict (`template_globals(compiled)`), when the caller keeps them. `printed` receives
    (output offset, template line) for each piece of output, the line of the template code that printed it."""
    # Chunks are joined every _JOIN_EVERY into one string: a template that prints a long input a character at a time
    # would otherwise hold one object per character (hundreds of bytes each) until the end of the render.
    chunks: list[str] = []
    pending: list[str] = []
    spans: list[taint.SpanT] = []
    size = 0
    limits = limits.scaled(input_chars(context))
    limit = limits.max_output_chars
    append = pending.append
    state = RenderState(limits, compiled, seed, draws)
    if generation is not None:
        state.generation = generation
    state_token = STATE.set(state)
    checker_token = taint.CHECKER.set(checker)
    try:
        # The clock is the timer's or the tracer's job (both see every template frame); here only the size counts.
        with time_limit(limits.max_seconds, tracer=tracer):
            pieces = _generate(compiled, context, template_globals)
            for chunk in pieces:
                if printed is not None:
                    printed.append((size, _printing_line(pieces, compiled)))
                if type(chunk) is Tainted:
                    own = chunk.spans
                    if len(own) == 1:  # a request string printed as it is: its one span, shifted
                        s, e, p, n = own[0]
                        spans.append((s + size, e + size, p, n))
                    else:
                        spans.extend(taint.shift(own, size))
                size += len(chunk)
                state.emitted = size
                if size > limit:
                    raise Limit(f"output exceeded {limit:,} characters")
                append(chunk)
                if len(pending) >= _JOIN_EVERY:
                    chunks.append("".join(pending))
                    pending.clear()
    except DeadlineExpired:  # raised at the block's exit, which never ran: its watchdog slot is still armed
        settle_deadlines()
        raise
    finally:
        taint.CHECKER.reset(checker_token)
        STATE.reset(state_token)
    chunks.append("".join(pending))
    return "".join(chunks), spans


def _printing_line(pieces: Any, compiled: jinja2.Template) -> int:
    """The template line where the innermost template generator under `pieces` is suspended: the code that printed
    the piece just received (0 when there is none)."""
    line = 0
    gen = pieces
    while gen is not None:
        frame = getattr(gen, "gi_frame", None)
        if frame is not None and frame.f_code.co_filename == "<template>":
            line = compiled.get_corresponding_lineno(frame.f_lineno)
        gen = getattr(gen, "gi_yieldfrom", None)
    return line


def template_globals(compiled: jinja2.Template) -> dict[str, Any]:
    """The names a compiled template sees besides its context (jinja's `Template.globals`, a ChainMap over the
    environment's), as one dict: what each render's context starts from."""
    return dict(compiled.globals)


def _generate(compiled: jinja2.Template, context: dict[str, Any], globals_: dict[str, Any] | None) -> Any:
    """`compiled.generate(**context)`, with the template's globals given as a dict (jinja copies its ChainMap into
    every render's context, key by key, in Python): the same context (the globals, then the variables over them),
    the same root function, and every failure through the environment's `handle_exception`, as jinja does."""
    if globals_ is None or compiled.environment.is_async:
        yield from compiled.generate(**context)
        return
    env = compiled.environment
    ctx = env.context_class(env, dict(globals_, **context), compiled.name, compiled.blocks, globals=globals_)
    try:
        yield from compiled.root_render_func(ctx)
    except Exception:
        yield env.handle_exception()


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
    "template_globals",
    "template_line",
    "time_limit",
    "where",
]
