"""Whole-text encoding with prefix reuse: a rendered chat's ids in one tiktoken call, and a new turn of a chat
encoded from where it stops sharing bytes with a chat seen before.

**One call per text.** `tokenizers` encodes a text by first extracting every added token (leftmost-longest),
then encoding each run between them on its own. tiktoken's `encode(text, allowed_special)` does the same in one
native call that releases the GIL: it finds the leftmost special token, encodes the run before it on its own, emits
the token, and goes on after it. Its special-token search is an alternation, so at one start it takes the first
alternative that matches, not the longest; the two agree when no added token is a prefix of another (then at most
one can match at any start). So `WholeText.encode(text)` equals `tokenizers`' ids for `text` (the reference ids of
`tokenize` when no request text reaches a control token) when:

- `encode_text` already uses the tiktoken engine (`fastbpe.check` proved the runs' BPE equal),
- no normalizer (runs are passed to tiktoken as they are),
- every added token is matched on raw text as it is (no `normalized`, `lstrip`, `rstrip`, `single_word`), the
  contents are distinct and non-empty, and none is a prefix of another.

`HFTokenizer.whole_text_reason` names the condition that fails when one does.

**Which library makes the call.** tiktoken, until fastokens (the same pipeline from the same `tokenizer.json`, about
ten times faster on chat text) has been built for the vocabulary and has given the same ids on probe texts holding
every token of it (`accel.Accelerator`); from then on fastokens, and tiktoken again for any text it fails on. The
ids are the same either way; `WholeText.engine` says which makes the calls now.

**Prefix reuse.** Let an earlier text A and a new text B share their first `l` bytes, and let an added token end
at byte e of A with e + L <= l, where L is the longest added token in bytes. Whether a token starts at a byte q
depends only on bytes q..q+L, which for every q < e lie in the shared part; so A and B have the same added-token
matches before e, the one ending at e included, and the same runs before it. Runs are encoded on their own, so B's
ids are A's ids up to that token, then the ids of B's bytes after e encoded as a text of their own. The cut is the
last such e (found with a binary search over the byte offsets of A's added tokens), and only B's new bytes reach
the encoder: a chat server re-sent the whole history every turn encodes each turn once.

Entries are kept in a byte-bounded LRU per encoder (`CTXLOCK_PREFIX_CACHE_MB`, default 128), bucketed by their first
bytes so a lookup compares against a handful of recent texts; each encoder's cache is registered in `ctxlock.caches`
as "tokenizer.prefix". `CTXLOCK_FAST=0` bypasses all of it.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ctxlock import caches
from ctxlock.core import longest_first
from ctxlock.tokenizer._accel import Accelerator

_HEAD = 64  # bytes of a text that pick its bucket: texts sharing less than this are never compared
_PER_BUCKET = 8  # recent texts kept per bucket, compared with a new text
_CHUNK = 4096  # bytes compared per step when measuring a common prefix


def common_prefix(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of two byte strings, by C-level slice comparisons."""
    n = min(len(a), len(b))
    pos = 0
    while pos < n:
        end = min(n, pos + _CHUNK)
        if a[pos:end] == b[pos:end]:
            pos = end
            continue
        lo, hi = pos, end  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        return lo
    return n


class _Entry:
    """A text seen before: its UTF-8 bytes, its ids, and where its added tokens end (computed on first use)."""

    __slots__ = ("data", "ids", "known_cuts", "size")

    def __init__(self, data: bytes, ids: np.ndarray, cuts: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.data = data
        self.ids = ids  # int64, read-only
        # (indices in ids of the added tokens, byte offset just after each); None: every id's byte length adds up
        # to the text (no run was normalized), so they follow from the ids when first needed.
        self.known_cuts = cuts
        self.size = len(data) + 2 * ids.nbytes + 200

    def cuts(self, whole: WholeText) -> tuple[np.ndarray, np.ndarray]:
        if self.known_cuts is None:
            self.known_cuts = whole.cuts_of(self.ids, 0)
        return self.known_cuts


class WholeText:
    """tiktoken over a whole rendered text, with every added token honoured, and the prefix-reuse cache."""

    def __init__(
        self,
        core: Any,
        added: dict[str, int],
        byte_lengths: np.ndarray,
        *,
        max_bytes: int,
        inert: Callable[[str], bool] | None = None,
        fallback: Callable[[str], tuple[list[int], list[int], list[int]]] | None = None,
    ) -> None:
        """`core`: a tiktoken Encoding whose special tokens are exactly `added` (content -> id); `byte_lengths`: the
        UTF-8 length of every id's bytes (added tokens included), indexed by id. With a normalizer, `inert(text)`
        says whether it leaves `text` unchanged (then tiktoken may see the text as it is), a test that holds of a
        text when it holds of each of its characters (`encode_many` tests texts joined); other text goes to
        `fallback(text)`, the run-by-run encoding that normalizes each run (`split_runs`; None: the caller's
        reference path). The owner may set `accelerator` afterwards: fastokens over the same vocabulary, checked
        against `reference_ids` (`accel.Accelerator`), which makes the native call once admitted."""
        self._core = core
        self.accelerator: Accelerator | None = None
        self._inert = inert
        self._fallback = fallback
        self._allowed = set(added)
        self._lengths = byte_lengths
        self._is_added = np.zeros(len(byte_lengths), dtype=bool)
        self._is_added[list(added.values())] = True
        self.longest = max((len(t.encode("utf-8")) for t in added), default=0)
        # Where no two occurrences of added tokens can overlap, every occurrence is a match, and a text cut right
        # after one encodes as its two halves: `encode_prepared` then splits a long text in two for two threads.
        self._halves = bool(added) and _overlap_free(added) and (os.cpu_count() or 1) > 1
        self._token_re = longest_first(added) or re.compile("(?!)")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.encoded_bytes = 0  # bytes that reached tiktoken: what the prefix reuse did not save
        self._buckets: OrderedDict[bytes, list[_Entry]] = OrderedDict()
        self._lock = threading.Lock()
        _ALL.add(self)
        caches.register_instance("tokenizer.prefix", self)

    @property
    def byte_lengths(self) -> np.ndarray:
        """The UTF-8 length of every id's bytes (added tokens included, 0 for an id the vocabulary lacks), indexed
        by id, built with the encoder from its ranks: a caller lays ids over the text without the vocabulary's
        bytes. Not to be written to."""
        return self._lengths

    # -- encoding
    def _native(self, text: str) -> np.ndarray:
        if self._halves and len(text) >= _SPLIT_CHARS and not self.accelerated and helper_thread_allowed():
            m = self._token_re.search(text, len(text) // 2)
            if m is not None and m.end() < len(text):
                second = _HELPER.submit(self.native, text[m.end() :])
                first = self.native(text[: m.end()])
                joined: np.ndarray = np.concatenate((first, second.result())).astype(np.int64)
                return joined
        return self.native(text).astype(np.int64)

    @property
    def accelerated(self) -> bool:
        """Whether fastokens makes the native calls now (it is not worth a second thread: it is about ten times
        faster than tiktoken, and a thread coming back from it would wait for the GIL)."""
        return self.accelerator is not None and self.accelerator.ready

    @property
    def engine(self) -> str:
        """Which library makes the native call now: "fastokens" or "tiktoken"."""
        return "fastokens" if self.accelerated else "tiktoken"

    def encode(self, text: str, *, cache: bool = True) -> np.ndarray | None:
        """The ids of `text` as a read-only int64 array, or None when the text is not UTF-8 (a lone surrogate) or
        needs normalizing with no fallback; the caller then takes the reference path."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            return None
        return self.encode_prepared(text, *self.plan(data), cache=cache)

    def plan(self, data: bytes) -> tuple[bytes, _Entry | None, int, int]:
        """Where to cut `data`: (data, entry, ids kept from the entry, bytes they cover). With no usable entry the
        whole text is encoded (entry None)."""
        best: _Entry | None = None
        best_len = 0
        with self._lock:
            bucket = self._buckets.get(data[:_HEAD])
            candidates = list(bucket) if bucket else []
        for entry in candidates:  # newest first: usually the previous turn of the same chat
            n = common_prefix(data, entry.data)
            if n > best_len:
                best, best_len = entry, n
                if n == len(entry.data):
                    break  # a whole earlier text is a prefix (the usual previous turn): take it; exact either way
        if best is None:
            return data, None, 0, 0
        cut_ids, cut_bytes = best.cuts(self)
        j = int(np.searchsorted(cut_bytes, best_len - self.longest, side="right")) - 1
        if j < 0:
            return data, None, 0, 0
        return data, best, int(cut_ids[j]) + 1, int(cut_bytes[j])

    def suffix(self, text: str, data: bytes, start: int) -> tuple[str, bool]:
        """The text to encode after byte `start`, and whether one native call may take it as it is."""
        suffix = text if start == 0 else data[start:].decode("utf-8")  # `start` ends an added token: a boundary
        return suffix, self._inert is None or self._inert(suffix)

    def native(self, suffix: str) -> np.ndarray:
        """The one native call (GIL released): the uint32 ids, for `encode_prepared(..., native=)`. fastokens makes
        it once admitted, tiktoken otherwise (and for any text fastokens fails on): the same ids."""
        if self.accelerator is not None:
            ids = self.accelerator.encode(suffix)
            if ids is not None:
                return ids
        return self._tiktoken(suffix)

    def _tiktoken(self, text: str) -> np.ndarray:
        ids: np.ndarray = self._core.encode_to_numpy(text, allowed_special=self._allowed, disallowed_special=())
        return ids

    def reference_ids(self, text: str) -> np.ndarray | None:
        """`text`'s ids without the accelerator (tiktoken, or the run-by-run fallback for text that needs
        normalizing) and without the cache: what fastokens is checked against. None: not encodable here."""
        if self._inert is not None and not self._inert(text):
            return None if self._fallback is None else np.array(self._fallback(text)[0], dtype=np.uint32)
        return self._tiktoken(text)

    def encode_prepared(
        self,
        text: str,
        data: bytes,
        entry: _Entry | None,
        keep: int,
        start: int,
        *,
        cache: bool = True,
        native: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """Encode `text` (whose UTF-8 is `data`) from byte `start` on, after the `keep` ids of `entry` (see `plan`).
        Releases the GIL for the native call, so several threads can run it at once. `native`: the result of
        `native(suffix)` when another thread already made the call."""
        suffix, inert = self.suffix(text, data, start) if native is None else ("", True)
        cuts: tuple[np.ndarray, np.ndarray] | None = None
        if native is not None:
            new = native.astype(np.int64)
        elif inert:
            new = self._native(suffix)
        elif self._fallback is not None:
            ids_list, cut_at, cut_end = self._fallback(suffix)
            new = np.array(ids_list, dtype=np.int64)
            # The normalizer changed some run: ids' byte lengths no longer add up to the text's, so the cut points
            # come from the split itself (byte offsets in the text as given).
            cuts = np.array(cut_at, dtype=np.int64), start + np.array(cut_end, dtype=np.int64)
        else:
            return None
        ids = new if entry is None else np.concatenate((entry.ids[:keep], new))
        ids.flags.writeable = False
        if cache:
            self._remember(data, ids, entry, keep, start, new, cuts)
        return ids

    def encode_many(self, texts: Sequence[str], datas: Sequence[bytes]) -> list[np.ndarray | None]:
        """`[encode_prepared(t, d, None, 0, 0, cache=False) for t, d in zip(texts, datas)]` (`datas`: the texts'
        UTF-8), with the native calls of the texts one call takes as they are made in one fastokens call once it is
        admitted (`Accelerator.encode_many`: each text's ids are its own call's; a text it fails on goes to
        tiktoken, as `native` sends it). The same ids: `encode_prepared` takes them as `native`."""
        if not self.accelerated or len(texts) < 2:
            return [self.encode_prepared(t, d, None, 0, 0, cache=False) for t, d in zip(texts, datas, strict=True)]
        # `inert` is a test of each character (`FastEncoder.inert`: no normalizer, ASCII, or NFC-inert code points
        # only), so the texts joined pass it only when each text does: one call for a chunk that is all inert.
        if self._inert is None or self._inert("".join(texts)):
            inert = [True] * len(texts)
        else:
            inert = [self._inert(t) for t in texts]
        natives = iter(self.accelerator.encode_many([t for t, ok in zip(texts, inert, strict=True) if ok]))  # type: ignore[union-attr]
        out: list[np.ndarray | None] = []
        for t, d, ok in zip(texts, datas, inert, strict=True):
            if ok:
                ids = next(natives)
                native = self._tiktoken(t) if ids is None else ids
                out.append(self.encode_prepared(t, d, None, 0, 0, cache=False, native=native))
            else:
                out.append(self.encode_prepared(t, d, None, 0, 0, cache=False))
        return out

    # -- the cache
    def cuts_of(self, ids: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """The added tokens among `ids` (encoded from byte `start`, no run normalized): index, byte end."""
        added_at = np.flatnonzero(self._is_added[ids])
        return added_at, start + np.cumsum(self._lengths[ids])[added_at]

    def _remember(
        self,
        data: bytes,
        ids: np.ndarray,
        entry: _Entry | None,
        keep: int,
        start: int,
        new: np.ndarray,
        cuts: tuple[np.ndarray, np.ndarray] | None,
    ) -> None:
        if entry is not None and keep and (cuts is not None or entry.known_cuts is not None):
            # Part of this text's cut points are not plain byte-length sums: splice them now.
            old_ids, old_bytes = entry.cuts(self)
            new_ids, new_bytes = cuts if cuts is not None else self.cuts_of(new, start)
            j = int(np.searchsorted(old_ids, keep - 1, side="right"))
            cuts = np.concatenate((old_ids[:j], keep + new_ids)), np.concatenate((old_bytes[:j], new_bytes))
        item = _Entry(data, ids, cuts)
        if item.size > self.max_bytes:
            return
        head = data[:_HEAD]
        with self._lock:
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
            self.encoded_bytes += len(data) - start
            kept = []
            for e in self._buckets.pop(head, None) or []:
                if e.data == data:
                    self.bytes -= e.size  # the same text again: the new entry replaces it
                else:
                    kept.append(e)
            kept.insert(0, item)
            self.bytes += item.size
            for dropped in kept[_PER_BUCKET:]:
                self.bytes -= dropped.size
            self._buckets[head] = kept[:_PER_BUCKET]
            while self.bytes > self.max_bytes and self._buckets:
                _, evicted = self._buckets.popitem(last=False)
                self.bytes -= sum(e.size for e in evicted)

    def __len__(self) -> int:
        """The texts held."""
        return sum(len(b) for b in list(self._buckets.values()))

    def clear(self) -> None:
        with self._lock:
            self._buckets.clear()
            self.bytes = self.hits = self.misses = self.encoded_bytes = 0

    def stats(self) -> dict[str, int]:
        return {
            "texts": sum(len(b) for b in self._buckets.values()),
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "hits": self.hits,
            "misses": self.misses,
            "encoded_bytes": self.encoded_bytes,
        }


def _overlap_free(tokens: Iterable[str]) -> bool:
    """No token is inside another, and no proper suffix of one is a proper prefix of one (itself included): then
    occurrences of the tokens in any text never overlap."""
    tokens = set(tokens)
    prefixes = {t[:i] for t in tokens for i in range(1, len(t))}
    suffixes = {t[i:] for t in tokens for i in range(1, len(t))}
    infixes = {t[i:j] for t in tokens for i in range(1, len(t)) for j in range(i + 1, len(t))}
    return not (prefixes & suffixes) and not (tokens & (prefixes | suffixes | infixes))


_SPLIT_CHARS = 3000  # shorter texts are encoded in one call: a second thread costs more than it saves
ENCODE_THREADS = "CTXLOCK_ENCODE_THREADS"


def helper_thread_allowed() -> bool:
    """Whether a long text may be encoded as two halves on two threads: not when `CTXLOCK_ENCODE_THREADS=1`,
    which a process that is one of several workers sets (`ctxlock batch --workers N`: parallelism is across
    processes there, and a second thread per process would only contend for the same cores)."""
    return os.environ.get(ENCODE_THREADS) != "1"


class _Helper:
    """One daemon thread that runs native encodes for `WholeText._native`'s second halves."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[str], Any], arg: str) -> Future[Any]:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="ctxlock-half")
        return self._pool.submit(fn, arg)


_HELPER = _Helper()


def whole_text_refusal(added: Sequence[Any]) -> str:
    """Why a vocabulary's added tokens (`AddedToken`s) rule out one tiktoken call per text, or "" when they do not:
    tiktoken matches them on the raw text, leftmost, taking the first alternative; `tokenizers` matches them
    leftmost-longest (normalized ones after normalizing, in a second pass), and honours lstrip/rstrip/single_word."""
    for t in added:
        flags = {"normalized": t.normalized, "lstrip": t.lstrip, "rstrip": t.rstrip, "single_word": t.single_word}
        for flag, on in flags.items():
            if on:
                return f"added token {t.content!r} is {flag}: tiktoken matches added tokens on raw text as they are"
        if not t.content:
            return f"added token {t.id} is empty"
    contents = sorted(t.content for t in added)
    for a, b in itertools.pairwise(contents):
        if a == b:
            return f"two added tokens spell {a!r}"
        if b.startswith(a):
            return f"added token {a!r} is a prefix of {b!r}: tiktoken would not always take the longest"
    return ""


def split_runs(
    text: str, matches: Sequence[Any], encode_run: Callable[[str], Sequence[int]]
) -> tuple[list[int], list[int], list[int]]:
    """Run-by-run encoding of `text` around its control-token `matches` (`ControlMatch`es), as `encode_between`
    does, with the cut points `WholeText` keeps: the index of each control id and the byte offset after it."""
    ids: list[int] = []
    cut_at: list[int] = []
    cut_end: list[int] = []
    pos = nbytes = 0
    for m in matches:
        if m.start > pos:
            ids += encode_run(text[pos : m.start])
        nbytes += len(text[pos : m.end].encode("utf-8"))
        ids.append(m.id)
        cut_at.append(len(ids) - 1)
        cut_end.append(nbytes)
        pos = m.end
    if pos < len(text):
        ids += encode_run(text[pos:])
    return ids, cut_at, cut_end


_ALL: weakref.WeakSet[WholeText] = weakref.WeakSet()


def clear_prefix_caches() -> None:
    """Empty the prefix cache of every whole-text encoder in the process."""
    for whole in list(_ALL):
        whole.clear()


def prefix_cache_bytes() -> int:
    return int(float(os.environ.get("CTXLOCK_PREFIX_CACHE_MB", "128")) * 1024 * 1024)


__all__ = [
    "WholeText",
    "clear_prefix_caches",
    "common_prefix",
    "prefix_cache_bytes",
    "split_runs",
    "whole_text_refusal",
]
