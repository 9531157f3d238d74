"""Frozen JSON values: request data that cannot change after validation.

`freeze` turns parsed JSON into hashable, immutable values that keep key order (tool schemas are rendered in
the order the client sent them, so order is data). `thaw` gives back fresh plain dicts and lists, which is what
chat templates expect to see.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, overload


class FrozenDict(Mapping[str, Any]):
    """An immutable, order-preserving, hashable mapping."""

    __slots__ = ("_hash", "_index", "_items", "_key")

    def __init__(self, items: Mapping[str, Any] | tuple[tuple[str, Any], ...] = ()) -> None:
        if type(items) is tuple:  # what `freeze` passes (tuple() of a tuple is the tuple): before the abc check
            pairs = items
        elif isinstance(items, Mapping):
            pairs = tuple(items.items())
        else:
            pairs = tuple(items)
        self._items = pairs
        self._index = {k: v for k, v in pairs}
        self._hash: int | None = None
        self._key: str | None = None

    def __getitem__(self, key: str) -> Any:
        return self._index[key]

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    # `Mapping`'s own `get` and `__contains__` go through `__getitem__` and catch its KeyError (an exception per miss,
    # and most lookups of origins and options miss): the index answers them directly, with the same results.
    def get(self, key: Any, default: Any = None) -> Any:
        return self._index.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def _typed_key(self) -> str:
        # Python's == says True == 1 == 1.0, but a template renders them differently, so equality and hashing
        # go through the order-preserving JSON text, where they differ.
        if self._key is None:
            self._key = json.dumps(thaw(self), ensure_ascii=False, separators=(",", ":"))
        return self._key

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._typed_key())
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return self._typed_key() == other._typed_key()
        if isinstance(other, Mapping):
            return self._typed_key() == json.dumps(thaw(other), ensure_ascii=False, separators=(",", ":"))
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenDict({dict(self._items)!r})"


# The scalar types JSON parses to, told apart by identity before the abc check against `Mapping` (about a microsecond
# a value): `freeze` and `thaw` pass them through either way.
_SCALARS = frozenset({str, int, float, bool, type(None)})


@overload
def freeze(value: Mapping[Any, Any]) -> FrozenDict: ...
@overload
def freeze(value: Any) -> Any: ...
def freeze(value: Any) -> Any:
    """Deep-freeze parsed JSON: dict -> FrozenDict, list -> tuple. Scalars pass through."""
    if type(value) in _SCALARS:
        return value
    if type(value) is dict or isinstance(value, Mapping):  # a dict (what JSON parses to) before the abc check
        return FrozenDict(tuple((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Inverse of `freeze`: fresh plain dicts and lists that the caller may mutate."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


# What `json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)` builds on every
# call (its options are not the defaults); an encoder keeps no state between calls, so one serves every call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """The one canonical JSON text of a value: sorted keys, no spaces, UTF-8 characters kept, no NaN."""
    return _CANONICAL.encode(thaw(value))
