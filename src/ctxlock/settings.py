"""Process settings every layer may read: whether the fast paths are on, and where the on-disk cache lives.

This module is at the bottom of the layer order (with `errors`, `frozen` and `caches`): it imports nothing from
ctxlock, so any stage module can ask it without creating a cycle.

- `CTXLOCK_FAST=0` (or `false`/`off`/`no`) turns every fast path off; `reference_path()` does the same for the
  enclosed code in this thread or task. Each fast path checks `fast_enabled()` and falls back to its reference path.
- `call_fast(fn, *args)` runs one call inside `fast_path()` cheaply, for a caller that already found them on.
- `cache_root()` is `$CTXLOCK_CACHE_DIR`, else `$XDG_CACHE_HOME/ctxlock`, else `~/.cache/ctxlock`; `CACHE_KINDS`
  names each subdirectory ctxlock keeps there (`ctxlock cache` lists and clears them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_REFERENCE: ContextVar[bool] = ContextVar("ctxlock_reference_path", default=False)
_FAST: ContextVar[bool] = ContextVar("ctxlock_fast_path", default=False)


def fast_enabled() -> bool:
    """False when `CTXLOCK_FAST=0` (or `false`/`off`/`no`), or inside `reference_path()`: every fast path falls back
    to the reference path. Inside `fast_path()` (and not inside a `reference_path()` within it), True whatever the
    environment says."""
    if _REFERENCE.get():
        return False
    if _FAST.get():
        return True
    return os.environ.get("CTXLOCK_FAST", "1").strip().lower() not in ("0", "false", "off", "no")


@contextmanager
def reference_path() -> Iterator[None]:
    """Run the enclosed code on the reference path only (as with `CTXLOCK_FAST=0`), in this thread or task: what
    oracles (fit_context's naive algorithm) and equivalence tests use."""
    token = _REFERENCE.set(True)
    try:
        yield
    finally:
        _REFERENCE.reset(token)


@contextmanager
def fast_path() -> Iterator[None]:
    """Run the enclosed code with the fast paths on, even under `CTXLOCK_FAST=0`: what the tests of the fast paths
    themselves use, so that the whole suite can also run on the reference path. A `reference_path()` inside wins."""
    token = _FAST.set(True)
    try:
        yield
    finally:
        _FAST.reset(token)


def call_fast(fn: Callable[..., T], /, *args: Any) -> T:
    """`fn(*args)` inside `fast_path()`, without the context manager's cost: for a caller that has just found
    `fast_enabled()` True and makes one short call that asks it many times (a `ctxlock batch` row asks five times;
    reading the environment is most of a check). A `reference_path()` inside still wins."""
    token = _FAST.set(True)
    try:
        return fn(*args)
    finally:
        _FAST.reset(token)


def cache_root() -> Path:
    """The directory of ctxlock's on-disk caches (converted tokenizers, compiled templates, probe verdicts)."""
    if os.environ.get("CTXLOCK_CACHE_DIR"):
        return Path(os.environ["CTXLOCK_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "ctxlock"


# Every subdirectory of `cache_root()` ctxlock writes, with what it holds: all of it is built again when missing, so
# `ctxlock cache --clear` removes these and nothing else under the root (which a user may point anywhere).
# tests/project/test_caches.py checks that every directory the source joins to `cache_root()` is one of them.
CACHE_KINDS: dict[str, str] = {
    "converted": "tokenizers converted from other formats (GGUF, Tekken, slow BPE files) and HF pipelines",
    "jinja": "compiled chat templates (jinja2 bytecode)",
    "fastbpe": "the fast BPE engine's verdict and rank table per vocabulary, and the NFC-inert code points",
    "fastokens": "fastokens' verdict per tokenizer.json",
    "tokenizer-json-head": "tokenizer.json without its vocabulary and merges",
    "tokenizers-loaded": "the mark of a tokenizer.json that tokenizers has loaded",
    "token-lengths": "each token's byte length per vocabulary, for accounting",
}
