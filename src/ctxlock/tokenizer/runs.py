"""The token-run cache: ids of the plain-text runs between trusted control tokens, shared across requests.

Runs between control tokens are tokenized independently (HF extracts added tokens before it normalizes;
mistral-common, tiktoken and SentencePiece backends encode the text between special tokens on its own), so a run's
ids depend only on the tokenizer, the run's text and whether it starts the text (a SentencePiece dummy prefix, or
Metaspace's `prepend_scheme: first`). A multi-turn chat then tokenizes only the text it has not seen before.

The cache is a process-wide LRU bounded by an estimate of the bytes it holds (the run's str object, the tuple of
ids, the key), `CTXLOCK_RUN_CACHE_MB` (default 256). The key carries the tokenizer's digest and its encoding
engine, so two tokenizers never share entries. `CTXLOCK_FAST=0` turns every fast path off, this cache included.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from ..settings import fast_enabled

_KEY_OVERHEAD = 200  # the key tuple, the dict slot, the ids tuple header: a flat estimate per entry


class RunCache:
    """A byte-bounded LRU of run ids. Thread-safe; lookups of hot runs cost one dict access and a move."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._data: OrderedDict[tuple[str, str, str, bool], tuple[tuple[int, ...], int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str, bool]) -> tuple[int, ...] | None:
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: tuple[str, str, str, bool], ids: tuple[int, ...]) -> None:
        size = sys.getsizeof(key[2]) + 8 * len(ids) + _KEY_OVERHEAD
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._data[key] = (ids, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, evicted) = self._data.popitem(last=False)
                self.bytes -= evicted

    def __contains__(self, key: tuple[str, str, str, bool]) -> bool:
        return key in self._data

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.bytes = 0
            self.hits = self.misses = 0

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self._data),
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "hits": self.hits,
            "misses": self.misses,
        }


RUNS = RunCache(int(float(os.environ.get("CTXLOCK_RUN_CACHE_MB", "256")) * 1024 * 1024))


def _identity(tokenizer: Any) -> tuple[str, str]:
    return str(getattr(tokenizer, "sha256", "") or f"object:{id(tokenizer)}"), str(getattr(tokenizer, "engine", ""))


def run_encoder(tokenizer: Any) -> Callable[[str, bool], tuple[int, ...] | list[int]]:
    """`encode(text, at_start)` for many runs of one text: the fast-path switch and the cache key are read once."""
    if not fast_enabled():
        return lambda text, at_start: tokenizer.encode_text(text, at_start=at_start)
    digest, engine = _identity(tokenizer)
    get, put = RUNS.get, RUNS.put

    def encode(text: str, at_start: bool) -> tuple[int, ...]:
        key = (digest, engine, text, at_start)
        hit = get(key)
        if hit is None:
            hit = tuple(tokenizer.encode_text(text, at_start=at_start))
            put(key, hit)
        return hit

    return encode


def encode_run(tokenizer: Any, text: str, *, at_start: bool) -> tuple[int, ...]:
    """`tokenizer.encode_text(text, at_start=at_start)`, through the run cache when fast paths are on."""
    return tuple(run_encoder(tokenizer)(text, at_start)) if text else ()


def prefetch_runs(tokenizer: Any, runs: Iterable[tuple[str, bool]]) -> int:
    """Encode the runs the cache does not hold yet in one batch call, so an engine that releases the GIL
    (tiktoken, `tokenizers`) spreads them over the cores; returns how many were encoded. Results are the same as
    encoding each run on its own: the batch call is the same encoder, run by run."""
    batch = getattr(tokenizer, "encode_text_batch", None)
    if batch is None or not fast_enabled():
        return 0
    digest, engine = _identity(tokenizer)
    missing = sorted({(t, a) for t, a in runs if t and (digest, engine, t, a) not in RUNS})
    if len(missing) < 2:
        return 0
    encoded = batch([t for t, _ in missing], [a for _, a in missing])
    for (t, a), ids in zip(missing, encoded, strict=True):
        RUNS.put((digest, engine, t, a), tuple(ids))
    return len(missing)


__all__ = ["RUNS", "RunCache", "encode_run", "prefetch_runs", "run_encoder"]
