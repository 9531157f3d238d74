"""The per-row speed-ups of the parse and render path (issue 21, `ctxlock batch` speed) give what the plain code gives.

- `sandbox_limits.input_chars` tells the context's exact types apart by identity before its general checks: the
  count must equal the plain walk (every str subclass, Mapping, sequence and set) on generated values of every kind.
- `frozen.freeze` and `thaw` pass JSON's scalar types through by identity before their abc checks: the same values
  (and types) as the plain recursion, on generated values.
- `FrozenDict.get` and `in` answer from the index, as `Mapping`'s own methods do through `__getitem__`.
- `jsonread.loads_strict` searches the whole text once for what could spell a lone surrogate and skips the search of
  each string when nothing could: values and errors must equal the reference path's (`CTXLOCK_FAST=0`), which
  searches every string, on generated JSON texts full of escapes.
- A chain `a + b + c` in a template is one call when its operands are strings, and `x.attr` on a dict is read inline:
  the text, the provenance spans and the failures must be those of adding one operand at a time, on generated chains
  of request strings, plain strings, long ones, numbers, lists, methods and undefined names.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlock.core._frozen import FrozenDict, freeze, thaw
from ctxlock.errors import CtxlockError
from ctxlock.outside._json import loads_strict
from ctxlock.request import Utf8Policy
from ctxlock.settings import fast_path, reference_path
from ctxlock.template._taint import Checker, Tainted
from ctxlock.template.sandbox._env import DEFAULT_LIMITS, new_environment, render_limited
from ctxlock.template.sandbox._limits import input_chars
from hypothesis_profiles import examples


def plain_input_chars(value: Any) -> int:
    """The walk as it was written before the speed-up: the oracle."""
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


class Word(str):
    pass


class Seq(list):
    pass


class Plain:
    def __len__(self) -> int:  # not a container ctxlock walks: counts nothing either way
        return 7


texts = st.text(max_size=12)
leaves = st.one_of(
    texts,
    texts.map(lambda s: Tainted(s, ((0, len(s), "$.x", ""),)) if s else Tainted(s)),
    texts.map(Word),
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.just(Plain()),
    st.just(len),
    st.binary(max_size=5),
)


def containers(children: Any) -> Any:
    keys = st.one_of(texts, st.integers(), texts.map(Word))
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.lists(children, max_size=4).map(Seq),
        st.dictionaries(keys, children, max_size=4),
        st.dictionaries(keys, children, max_size=4).map(OrderedDict),
        st.dictionaries(texts, children, max_size=4).map(lambda d: FrozenDict(tuple(d.items()))),
        st.frozensets(texts, max_size=4),
        st.sets(st.integers(), max_size=4),
    )


@settings(max_examples=examples(400), deadline=None)
@given(st.recursive(leaves, containers, max_leaves=30))
def test_input_chars_equals_the_plain_walk(value: Any) -> None:
    assert input_chars(value) == plain_input_chars(value)


def test_input_chars_counts_a_render_context() -> None:
    context = {
        "bos_token": "<s>",
        "messages": [{"role": "user", "content": Tainted("héllo", ((0, 5, "$.messages[0].content", ""),))}],
        "tools": None,
        "add_generation_prompt": False,
        "strftime_now": len,
    }
    assert input_chars(context) == plain_input_chars(context) == sum(map(len, context)) + 3 + 4 + 4 + 7 + 5


def plain_freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return FrozenDict(tuple((k, plain_freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(plain_freeze(v) for v in value)
    return value


def plain_thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: plain_thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain_thaw(v) for v in value]
    return value


def _typed(value: Any) -> Any:
    """The value with every node's type beside it (== alone says True == 1 and FrozenDict == dict)."""
    if isinstance(value, Mapping):
        return (type(value).__name__, [(k, _typed(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple, set, frozenset)):
        return (type(value).__name__, [_typed(v) for v in value])
    return (type(value).__name__, repr(value))


@settings(max_examples=examples(300), deadline=None)
@given(st.recursive(leaves, containers, max_leaves=30))
def test_freeze_and_thaw_equal_the_plain_recursion(value: Any) -> None:
    assert _typed(freeze(value)) == _typed(plain_freeze(value))
    assert _typed(thaw(value)) == _typed(plain_thaw(value))
    assert _typed(thaw(freeze(value))) == _typed(plain_thaw(plain_freeze(value)))


# -- loads_strict ---------------------------------------------------------------------------------------------------

_PIECES = [
    "a",
    "é",
    "日本",
    "🙂",
    '\\"',
    "\\\\",
    "\\n",
    "\\u0041",
    "\\ud800",
    "\\uDFFF",
    "\\udbff",
    "\\uD83D\\uDE00",
    "\\ud83d\\ude00",
    "\\\\ud800",
    "\\u00e9",
    "\\uD7FF",
    "\\uE000",
    "\ud800",
    "\udc00",
]
json_strings = st.lists(st.sampled_from(_PIECES), max_size=6).map(lambda parts: '"' + "".join(parts) + '"')


def _json_values(children: Any) -> Any:
    arrays = st.lists(children, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]")
    objects = st.lists(st.tuples(json_strings, children), max_size=3).map(
        lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}"
    )
    return st.one_of(arrays, objects)


json_texts = st.recursive(
    st.one_of(json_strings, st.sampled_from(["1", "2.5", "null", "true", "NaN", "1e999"])), _json_values, max_leaves=12
)


def _outcome(text: str, policy: Utf8Policy) -> Any:
    try:
        return ("value", json.dumps(loads_strict(text, "$", policy), ensure_ascii=True))
    except (CtxlockError, json.JSONDecodeError) as exc:
        return ("error", type(exc).__name__, str(exc), getattr(exc, "path", None), getattr(exc, "hint", None))


@pytest.mark.parametrize("policy", [Utf8Policy.STRICT, Utf8Policy.REPLACE])
@settings(max_examples=examples(300), deadline=None)
@given(text=json_texts)
def test_loads_strict_equals_the_reference_path(policy: Utf8Policy, text: str) -> None:
    with fast_path():
        fast = _outcome(text, policy)
    with reference_path():
        reference = _outcome(text, policy)
    assert fast == reference


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"a": "x\\ud800"}', "lone surrogate \\ud800"),
        ('{"a\\uDC00": 1}', "lone surrogate \\udc00"),
        ('["ok", "\udfff"]', "lone surrogate \\udfff"),
    ],
)
def test_lone_surrogates_are_still_found_on_the_fast_path(text: str, error: str) -> None:
    with fast_path(), pytest.raises(CtxlockError, match=error.replace("\\", "\\\\")):
        loads_strict(text, "$", Utf8Policy.STRICT)


def test_a_text_with_no_surrogate_parses_unchanged_on_the_fast_path() -> None:
    text = '{"messages": [{"role": "user", "content": "h\\u00e9llo \\\\ud800 🙂"}]}'
    with fast_path():
        assert loads_strict(text, "$", Utf8Policy.STRICT) == json.loads(text)


# -- FrozenDict.get and `in` ------------------------------------------------------------------------------------------


@settings(max_examples=examples(200), deadline=None)
@given(
    st.dictionaries(st.one_of(texts, st.integers()), st.one_of(st.none(), st.integers(), texts), max_size=6),
    st.lists(st.one_of(texts, st.integers(), st.none(), st.booleans(), st.floats(allow_nan=False)), max_size=6),
)
def test_frozen_dict_get_and_in_equal_mappings_own(data: dict[Any, Any], probes: list[Any]) -> None:
    fd = FrozenDict(tuple(data.items()))
    for key in [*data, *probes]:
        sentinel = object()
        assert fd.get(key) is Mapping.get(fd, key)
        assert fd.get(key, sentinel) is Mapping.get(fd, key, sentinel)
        assert (key in fd) is Mapping.__contains__(fd, key)
    for unhashable in ([], {}):
        with pytest.raises(TypeError):
            fd.get(unhashable)
        with pytest.raises(TypeError):
            Mapping.get(fd, unhashable)
        with pytest.raises(TypeError):
            _ = unhashable in fd


# ---------------------------------------------------------------------------------------------------------------
# `a + b + c + ...` written as one call (`LimitedEnvironment.add_strings`) and `x.attr` read inline from a dict: the
# same text, the same provenance spans (per character) and the same failures as adding one operand at a time.

_CHAIN_VALUES: dict[str, Any] = {
    "p": "plain",
    "e": "",
    "t": Tainted("req", ((0, 3, "$.t", ""),)),
    "u": Tainted("two", ((0, 1, "$.u", ""), (1, 3, "$.v", ""))),
    "long": "L" * 2500,
    "tlong": Tainted("T" * 2500, ((0, 2500, "$.tlong", ""),)),
    "n": 7,
    "items": [1, 2],
    "m": {"role": Tainted("user", ((0, 4, "$.m.role", ""),)), "items": "key, not method"},
    "w": Word("word"),
}
_OPERANDS = [*_CHAIN_VALUES, "m.role", "m['role']", "m.items", "m.missing", "missing", "'<|s|>'", "'\\n'", "1"]


def _sequential(operands: list[Any]) -> Any:
    """The oracle: Python's `+`, one operand at a time (Tainted keeps its spans through its own `__add__`)."""
    out = operands[0]
    for x in operands[1:]:
        out = out + x
    return out


def _value(expr: str) -> Any:
    if expr.startswith("'"):
        return json.loads('"' + expr[1:-1] + '"')
    if expr == "1":
        return 1
    if expr == "m.items":  # a dict method, as jinja's sandbox gives it (not the key)
        return _CHAIN_VALUES["m"].items
    if expr.startswith("m"):
        key = expr.removeprefix("m.").removeprefix("m['").removesuffix("']")
        return _CHAIN_VALUES["m"][key] if key in _CHAIN_VALUES["m"] else Undefined(name=key)
    return _CHAIN_VALUES[expr] if expr in _CHAIN_VALUES else Undefined(name=expr)


class Undefined:  # a marker: the oracle fails where jinja's Undefined would
    def __init__(self, name: str) -> None:
        self.name = name

    def __add__(self, other: Any) -> Any:
        raise TypeError("undefined")

    __radd__ = __add__


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.sampled_from(_OPERANDS), min_size=2, max_size=7), st.integers(0, 6), st.integers(0, 6))
def test_a_chain_of_additions_equals_adding_one_at_a_time(operands: list[str], open_at: int, close_at: int) -> None:
    # An optional parenthesized group inside the chain (a chain of its own, or the chain's non-pure first operand).
    terms = list(operands)
    lo, hi = sorted((open_at % len(terms), close_at % len(terms)))
    if hi > lo:
        terms[lo] = "(" + terms[lo]
        terms[hi] = terms[hi] + ")"
    source = "{{ " + " + ".join(terms) + " }}"
    values = [_value(x) for x in operands]
    try:
        expected = _sequential(values[lo : hi + 1]) if hi > lo else None
        grouped = [*values[:lo], expected, *values[hi + 1 :]] if hi > lo else values
        want: Any = _sequential(grouped)
    except TypeError:
        want = TypeError
    checker = Checker(lambda s: False, lambda: "")
    env = new_environment()
    try:
        text, spans = render_limited(env.from_string(source), dict(_CHAIN_VALUES), DEFAULT_LIMITS, checker)
    except Exception as exc:  # UndefinedError, TypeError: jinja's own failures of `+`
        assert want is TypeError, (source, exc)
        return
    assert want is not TypeError, source
    assert text == str(want)
    if isinstance(want, str):
        assert spans == list(want.spans if type(want) is Tainted else ()), source
