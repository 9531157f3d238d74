"""Every in-process cache of ctxlock, in one registry: what exists, how big it is now, and how to empty it.

Results never depend on a cache (each fast path has a reference path, `CTXLOCK_FAST=0`), so emptying one only
costs time. Three kinds of cache exist, and each is registered here under a dotted name:

- `memoize(name, maxsize)`: a pure function's results, on `functools.lru_cache` (its C implementation: hot paths
  such as per-message template conversion pay one dict lookup).
- `LRU(name, ...)`: a bounded, thread-safe least-recently-used map, bounded by entries or by an estimate of bytes.
- `register(name, size=..., clear=...)`: a cache with its own structure (prefix reuse buckets its entries by their
  first bytes); `register_instance` for caches that exist once per object (one per tokenizer), which are summed.

Each entry has a scope: "request" caches hold values derived from requests (runs, prefixes, converted messages,
memoized parses); "artifact" caches hold values derived from loaded artifacts (compiled templates, vocabularies).
`clear_caches()` empties both; `clear_caches("request")` keeps compiled artifacts, which is what the benchmarks'
cold rounds want.

Each entry also reports its hits and misses, counted since the process started (emptying a `memoize` or `LRU` cache
does not reset them, so they are counters, what `GET /metrics` exports): `memoize` reads `lru_cache`'s own counts
(kept in C, no lock), `LRU` counts under the lock it already takes, a per-instance cache sums its objects' `hits` and
`misses` attributes (the prefix cache resets its own when cleared), and `register` takes an optional `counts()`. A
cache that counts nothing reports None. `tests/project/test_caches.py` fails when a module keeps a cache outside this
registry.

This module is at the bottom of the layer order: it imports nothing from ctxlock.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

Scope = Literal["request", "artifact"]
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class CacheInfo:
    """One registry entry as `cache_info()` reports it."""

    name: str
    scope: Scope
    size: int  # entries now held (summed over instances for per-instance caches)
    hits: int | None = None  # lookups answered from the cache since start-up (None: this cache does not count)
    misses: int | None = None


@dataclass(frozen=True, slots=True)
class _Entry:
    scope: Scope
    size: Callable[[], int]
    clear: Callable[[], None]
    counts: Callable[[], tuple[int, int]] | None = None  # (hits, misses) since start-up


_REGISTRY: dict[str, _Entry] = {}
_INSTANCES: dict[str, weakref.WeakSet[Any]] = {}
_LOCK = threading.Lock()


def register(
    name: str,
    *,
    size: Callable[[], int],
    clear: Callable[[], None],
    scope: Scope = "request",
    counts: Callable[[], tuple[int, int]] | None = None,
) -> None:
    """Register a process-wide cache under a unique dotted name (`module.what`); `counts()` gives its (hits, misses)
    since start-up, when it counts them."""
    with _LOCK:
        if name in _REGISTRY:
            raise ValueError(f"cache {name!r} is registered twice")
        _REGISTRY[name] = _Entry(scope, size, clear, counts)


def register_instance(name: str, obj: Any, *, scope: Scope = "request") -> None:
    """Register one object's cache (the object has `__len__` and `clear()`): all objects registered under a name
    form one entry whose size is their sum. The registry holds them weakly."""
    with _LOCK:
        group = _INSTANCES.get(name)
        if group is None:
            if name in _REGISTRY:
                raise ValueError(f"cache {name!r} is registered twice")
            group = _INSTANCES[name] = weakref.WeakSet()
            live = group

            def size() -> int:
                return sum(len(o) for o in list(live))

            def clear() -> None:
                for o in list(live):
                    o.clear()

            def counts() -> tuple[int, int]:
                objs = list(live)
                return sum(getattr(o, "hits", 0) for o in objs), sum(getattr(o, "misses", 0) for o in objs)

            _REGISTRY[name] = _Entry(scope, size, clear, counts if hasattr(obj, "hits") else None)
        group.add(obj)


def memoize(name: str, maxsize: int, *, scope: Scope = "request") -> Callable[[F], F]:
    """`functools.lru_cache(maxsize)`, registered under `name`. The arguments must be hashable."""

    def decorate(fn: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        emptied = [0, 0]  # lru_cache resets its counts when cleared: the counts of earlier generations

        def clear() -> None:
            info = cached.cache_info()
            emptied[0] += info.hits
            emptied[1] += info.misses
            cached.cache_clear()

        def counts() -> tuple[int, int]:
            info = cached.cache_info()
            return emptied[0] + info.hits, emptied[1] + info.misses

        register(name, size=lambda: cached.cache_info().currsize, clear=clear, scope=scope, counts=counts)
        return cached  # type: ignore[return-value]

    return decorate


class LRU(Generic[K, V]):
    """A thread-safe least-recently-used map bounded by `max_items` entries, or by `max_bytes` as estimated by
    `sizeof(key, value)` (an entry larger than the bound is not kept). Registered under `name` at construction:
    process-wide when `per_instance` is False (one object per name), else summed over the live objects."""

    def __init__(
        self,
        name: str,
        *,
        max_items: int | None = None,
        max_bytes: int | None = None,
        sizeof: Callable[[K, V], int] | None = None,
        scope: Scope = "request",
        per_instance: bool = False,
    ) -> None:
        if (max_items is None) == (max_bytes is None):
            raise ValueError("give exactly one of max_items and max_bytes")
        self.name = name
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._sizeof = sizeof or _default_sizeof
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        if per_instance:
            register_instance(name, self, scope=scope)
        else:
            register(name, size=self.__len__, clear=self.clear, scope=scope, counts=self.counts)

    def get(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                self.misses += 1
                return default
            self._data.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: K, value: V) -> None:
        size = self._sizeof(key, value) if self.max_bytes is not None else 0
        if self.max_bytes is not None and size > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._data[key] = (value, size)
            self.bytes += size
            if self.max_items is not None:
                while len(self._data) > self.max_items:
                    self._data.popitem(last=False)
            else:
                assert self.max_bytes is not None
                while self.bytes > self.max_bytes:
                    _, (_, dropped) = self._data.popitem(last=False)
                    self.bytes -= dropped

    def counts(self) -> tuple[int, int]:
        """(hits, misses) of `get` since this cache was made (not reset by `clear`)."""
        return self.hits, self.misses

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[K]:
        with self._lock:
            return iter(list(self._data))

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.bytes = 0


def _default_sizeof(key: Any, value: Any) -> int:
    return sys.getsizeof(key) + sys.getsizeof(value)


def cache_info() -> Mapping[str, CacheInfo]:
    """Every registered cache, by name, with its scope, current size and (when it counts them) hits and misses."""
    with _LOCK:
        entries = dict(_REGISTRY)
    out = {}
    for name, e in sorted(entries.items()):
        hits, misses = e.counts() if e.counts is not None else (None, None)
        out[name] = CacheInfo(name, e.scope, e.size(), hits, misses)
    return out


def clear_caches(scope: Scope | None = None) -> None:
    """Empty every registered cache, or only those of one scope ("request": keep compiled templates and loaded
    vocabularies, as the benchmarks' cold rounds do). Results never depend on these caches."""
    with _LOCK:
        entries = list(_REGISTRY.values())
    for e in entries:
        if scope is None or e.scope == scope:
            e.clear()


__all__ = ["LRU", "CacheInfo", "Scope", "cache_info", "clear_caches", "memoize", "register", "register_instance"]
