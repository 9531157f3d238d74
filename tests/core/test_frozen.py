from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxlock.core._frozen import FrozenDict, canonical_json, freeze, thaw

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_freeze_thaw_round_trip(value) -> None:
    assert thaw(freeze(value)) == value
    assert canonical_json(freeze(value)) == canonical_json(value)


def test_true_one_and_one_point_zero_are_different_values() -> None:
    a, b, c = freeze({"v": True}), freeze({"v": 1}), freeze({"v": 1.0})
    assert a != b and b != c and a != c
    assert len({a, b, c}) == 3


def test_key_order_is_part_of_the_value() -> None:
    assert freeze({"a": 1, "b": 2}) != freeze({"b": 2, "a": 1})
    assert list(freeze({"b": 2, "a": 1})) == ["b", "a"]


def test_immutable() -> None:
    d = freeze({"a": [1, 2]})
    assert isinstance(d, FrozenDict) and d["a"] == (1, 2)
    with pytest.raises(TypeError):
        d["a"] = 3  # type: ignore[index]
