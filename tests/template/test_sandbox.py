"""The sandbox's own modules through their public names (`ctxlock.template.sandbox`, which re-exports its
`_limits` and `_filters` modules): the bounds of a render, the budget, the printable check, and a render end to end.
The template stage's behaviour (HF semantics, provenance, escapes, the time limit) is tests/template/test_template.py
and tests/security/test_sec_sandbox.py."""

from __future__ import annotations

import jinja2
import jinja2.sandbox
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlock.template import _taint as taint
from ctxlock.template.sandbox._env import (
    DEFAULT_LIMITS,
    Limit,
    Nondeterministic,
    RenderLimits,
    check_printable,
    compile_source,
    input_chars,
    new_environment,
    render_limited,
)
from ctxlock.template.sandbox._limits import FixedOrderSet, RenderState
from hypothesis_profiles import examples

CHECKER = taint.Checker(lambda s: False, lambda: "")


def _render(source: str, limits: RenderLimits = DEFAULT_LIMITS, **context: object) -> str:
    text, _spans = render_limited(compile_source(source, limits), dict(context), limits, CHECKER)
    return text


def test_limits_grow_with_the_input_once() -> None:
    base = RenderLimits()
    assert base.scaled(0) is base
    scaled = base.scaled(1_000)
    assert scaled.max_output_chars == base.max_output_chars + 4_000
    assert scaled.max_seconds == pytest.approx(base.max_seconds + 0.005)
    assert scaled.created_budget == base.created_budget + 16_000
    assert scaled.scaled(1_000) == scaled  # the per-input shares are spent: scaling again changes nothing
    assert RenderLimits.from_dict(scaled.to_dict()) == scaled


def test_input_chars_counts_every_string_keys_included() -> None:
    # messages + role + user + content + hello + n
    assert input_chars({"messages": [{"role": "user", "content": "hello"}], "n": 3}) == 8 + 4 + 4 + 7 + 5 + 1
    assert input_chars(["ab", ("c", {"d"})]) == 4
    assert input_chars(42) == 0


def test_the_budget_refuses_a_string_over_the_limit_and_counts_what_was_built() -> None:
    state = RenderState(RenderLimits(max_output_chars=100, max_created=150), None)
    state.charge(100, "x")
    with pytest.raises(Limit, match="would build 101 characters"):
        state.charge(101, "x")
    with pytest.raises(Limit, match="more than 150 characters and items"):
        state.charge(60, "y")
    with pytest.raises(Limit, match="of 70,000 is over the limit"):
        RenderState(DEFAULT_LIMITS, None).width(70_000, "a width")


def test_sets_print_in_one_order_and_addresses_are_refused() -> None:
    s = FixedOrderSet({"b", "a", 2, 1})
    assert list(s) == [1, 2, "a", "b"]
    assert repr(s) == "{1, 2, 'a', 'b'}" and repr(FixedOrderSet()) == "set()"
    check_printable({"a": [1, "x", None, 2.5]}, "printing")
    with pytest.raises(Nondeterministic, match="memory address"):
        check_printable([len], "printing")


def test_a_render_is_bounded_before_the_work_is_done() -> None:
    assert _render("{{ 'x' ~ y }}", y="z") == "xz"
    small = RenderLimits(max_output_chars=1_000)
    with pytest.raises(Limit, match="center width"):
        _render("{{ 'x'|center(10**9) }}", small)
    with pytest.raises(Limit, match="'\\*'"):
        _render("{{ 'ab' * 10**9 }}", small)
    with pytest.raises(Limit, match="template source"):
        compile_source("x" * 300_000, DEFAULT_LIMITS)


def test_random_draws_are_seeded_and_logged() -> None:
    source = "{{ [1, 2, 3, 4, 5, 6, 7, 8]|random }}{{ [1, 2, 3, 4, 5, 6, 7, 8]|random }}"
    compiled = compile_source(source, DEFAULT_LIMITS)
    runs = []
    for _ in range(2):
        draws: list = []
        text, _ = render_limited(compiled, {}, DEFAULT_LIMITS, CHECKER, seed=7, draws=draws)
        runs.append((text, draws))
    assert runs[0] == runs[1]
    assert [d["what"] for d in runs[0][1]] == ["random", "random"] and runs[0][1][0]["choices"] == 8


_PUBLIC_STR = sorted(a for a in dir(str) if not a.startswith("_"))


@settings(max_examples=examples(300), deadline=None)
@given(
    attribute=st.one_of(st.sampled_from([*_PUBLIC_STR, "role", "missing", "items", "x"]), st.text(max_size=12)),
    stored=st.sampled_from(["text", 3, None, "{0.__class__}".format, "abc".strip, [1, 2]]),
)
def test_the_fast_attribute_paths_answer_as_the_sandbox_does(attribute: str, stored: object) -> None:
    """`LimitedEnvironment.getattr`'s shortcuts for a str's (or a request string's) public methods and for a
    template namespace give what jinja's own sandbox path gives: the same value, the same wrapped `format`, the same
    Undefined (and underscore names stay refused)."""
    env = new_environment()
    namespace = env.globals["namespace"](role=stored, other="y")
    for obj in ("plain text", taint.Tainted("user text"), namespace):
        ours = env.getattr(obj, attribute)
        if type(obj) is taint.Tainted and attribute not in dir(str):  # provenance is not an attribute (by design)
            assert isinstance(ours, jinja2.Undefined)
            continue
        theirs = jinja2.sandbox.ImmutableSandboxedEnvironment.getattr(env, obj, attribute)
        if isinstance(theirs, jinja2.Undefined):
            assert isinstance(ours, jinja2.Undefined)
            assert (type(ours) is type(theirs)) or attribute.startswith("_")
        elif getattr(theirs, "__name__", "") == "format_":  # the sandbox's bounded str.format wrapper
            assert getattr(ours, "__name__", "") == "format_"
        else:
            assert ours == theirs
