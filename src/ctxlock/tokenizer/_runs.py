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
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ctxlock import caches
from ctxlock.settings import fast_enabled

if TYPE_CHECKING:
    from ctxlock.tokenizer._base import Tokenizer

_KEY_OVERHEAD = 200  # the key tuple, the dict slot, the ids tuple header: a flat estimate per entry


RunKey = tuple[str, str, str, bool]  # (tokenizer digest, engine, run text, at_start)


def _run_size(key: RunKey, ids: tuple[int, ...]) -> int:
    return sys.getsizeof(key[2]) + 8 * len(ids) + _KEY_OVERHEAD


class RunCache(caches.LRU[RunKey, tuple[int, ...]]):
    """A byte-bounded LRU of run ids (`caches.LRU`, registered as "tokenizer.runs"). Thread-safe; lookups of hot
    runs cost one dict access and a move."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__("tokenizer.runs", max_bytes=max_bytes, sizeof=_run_size, per_instance=True)

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self),
            "bytes": self.bytes,
            "max_bytes": self.max_bytes or 0,
            "hits": self.hits,
            "misses": self.misses,
        }


RUNS = RunCache(int(float(os.environ.get("CTXLOCK_RUN_CACHE_MB", "256")) * 1024 * 1024))


def _identity(tokenizer: Tokenizer) -> tuple[str, str]:
    return str(tokenizer.sha256 or f"object:{id(tokenizer)}"), str(tokenizer.engine)


def run_encoder(tokenizer: Tokenizer) -> Callable[[str, bool], tuple[int, ...] | list[int]]:
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


def encode_run(tokenizer: Tokenizer, text: str, *, at_start: bool) -> tuple[int, ...]:
    """`tokenizer.encode_text(text, at_start=at_start)`, through the run cache when fast paths are on."""
    return tuple(run_encoder(tokenizer)(text, at_start)) if text else ()


def prefetch_runs(tokenizer: Tokenizer, runs: Iterable[tuple[str, bool]]) -> int:
    """Encode the runs the cache does not hold yet in one batch call, so an engine that releases the GIL
    (tiktoken, `tokenizers`) spreads them over the cores; returns how many were encoded. Results are the same as
    encoding each run on its own: the batch call is the same encoder, run by run."""
    if not fast_enabled():
        return 0
    digest, engine = _identity(tokenizer)
    missing = sorted({(t, a) for t, a in runs if t and (digest, engine, t, a) not in RUNS})
    if len(missing) < 2:
        return 0
    encoded = tokenizer.encode_text_batch([t for t, _ in missing], [a for _, a in missing])
    for (t, a), ids in zip(missing, encoded, strict=True):
        RUNS.put((digest, engine, t, a), tuple(ids))
    return len(missing)


__all__ = ["RUNS", "RunCache", "encode_run", "prefetch_runs", "run_encoder"]
