"""Tokenizer stage: Rendered -> ids, splitting only at *trusted* control tokens.

Every backend implements the `Tokenizer` protocol (`base`: backends subclass `TokenizerBase`, which declares the
optional capabilities). `tokenize()` is the stage function:
1. the backend encodes the way the reference does and reports where control tokens matched (`encode_matched`);
2. a match that overlaps a range the template stage marked untrusted came from a request string;
3. with no such match the whole text is encoded the reference way, so benign requests give the reference ids;
   with one, policy `raise` rejects it and policy `text` encodes the runs between trusted matches as plain text.

`encode_ids()` is the same stage for callers that need only the ids (`Model.encode`): where it is proved equal
(`prefix`), one native call per text, and a chat's new turn is encoded from where it stops sharing bytes with a
text seen before.
"""

from __future__ import annotations

import bisect
import queue
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctxlock.caches import memoize
from ctxlock.core import longest_first  # the control-token regex of every backend (leftmost-longest, as a trie)
from ctxlock.errors import ControlTokenError
from ctxlock.settings import cache_root, fast_enabled
from ctxlock.template import InjectionPolicy, Rendered, Span
from ctxlock.tokenizer._accel import setting as accel_setting
from ctxlock.tokenizer._accel import start_after as accel_start_after
from ctxlock.tokenizer._base import (
    AddedToken,
    ControlMatch,
    ManifestFiles,
    Piece,
    PieceView,
    TokenBytes,
    Tokenizer,
    TokenizerBase,
)
from ctxlock.tokenizer._prefix import ENCODE_THREADS
from ctxlock.tokenizer._runs import encode_run, prefetch_runs, run_encoder
from ctxlock.tokenizer._token_bytes import byte_level_decoder_table, token_bytes


@dataclass(frozen=True)
class Tokenized:
    """The ids, with the control tokens that were honoured and the ones that were encoded as text."""

    ids: tuple[int, ...]
    control: tuple[ControlMatch, ...]  # trusted control tokens, with their ranges in the rendered text
    neutralized: tuple[ControlMatch, ...]  # control-token strings from the request, encoded as plain text


def encode_between(text: str, matches: Sequence[ControlMatch], tokenizer: Tokenizer) -> list[int]:
    """The control ids at their matches, and the text between them encoded on its own (through the run cache): how
    mistral-common builds a chat, and how tiktoken and SentencePiece backends honour special tokens."""
    encode = run_encoder(tokenizer)
    ids: list[int] = []
    pos = 0
    for m in matches:
        if m.start > pos:
            ids += encode(text[pos : m.start], pos == 0)
        ids.append(m.id)
        pos = m.end
    if pos < len(text):
        ids += encode(text[pos:], pos == 0)
    return ids


class _Spans:
    """Untrusted spans, searchable: which span (if any) a control match overlaps, in O(log n) per match."""

    def __init__(self, spans: Sequence[Span]) -> None:
        self.spans = sorted(spans, key=lambda s: (s.start, s.end))
        self.starts = [s.start for s in self.spans]
        self.max_end: list[int] = []
        top = -1
        for s in self.spans:
            top = max(top, s.end)
            self.max_end.append(top)

    def overlap(self, m: ControlMatch) -> Span | None:
        """The first span (by start) that overlaps m's own characters (its core): a zero-width span strictly inside
        them, or a shared character. Whitespace an lstrip/rstrip token consumed is not the token: request text
        there is what the reference sees on benign input (Phi-3's `<|user|>` takes the newline and the spaces a
        message starts with)."""
        start, end = m.core_start, m.core_end
        k = bisect.bisect_left(self.starts, end)  # spans starting before the core ends; the rest cannot overlap
        first = None
        while k > 0 and self.max_end[k - 1] >= start:
            k -= 1
            s = self.spans[k]
            hit = (start < s.start < end) if s.start == s.end else (s.start < end and start < s.end)
            if hit:
                first = s
        return first


def _split(tokenizer: Tokenizer, text: str) -> list[ControlMatch] | None:
    """The control-token matches, when the backend can say that the runs between them are encoded independently
    (`split_controls`; None from it means it cannot for this tokenizer). The reference ids are then the control ids
    and the runs' ids, and every run goes through the run cache."""
    if not fast_enabled():
        return None
    return tokenizer.split_controls(text)


def tokenize_batch(rendered: Sequence[Rendered], tokenizer: Tokenizer) -> list[Tokenized]:
    """`tokenize` over several texts, with the runs none of them has seen encoded in one batch call first (both
    cores, where the engine releases the GIL). Results equal `[tokenize(r, tokenizer) for r in rendered]`."""
    runs: list[tuple[str, bool]] = []
    for r in rendered:
        matches = _split(tokenizer, r.text)
        if matches is None:
            continue
        pos = 0
        for m in [*matches, None]:
            end = len(r.text) if m is None else m.start
            runs.append((r.text[pos:end], pos == 0))
            if m is not None:
                pos = m.end
    prefetch_runs(tokenizer, runs)
    return [tokenize(r, tokenizer) for r in rendered]


def whole_text_encoder(rendered: Rendered, tokenizer: Tokenizer) -> Any:
    """The tokenizer's whole-text encoder (`prefix.WholeText`) when it gives `tokenize(rendered).ids` for this
    rendered text: fast paths on, a proved encoder, and the reference ids are the answer (no request text reached
    a control-token position, or the policy keeps control tokens as they are)."""
    if rendered.untrusted and rendered.policy is not InjectionPolicy.KEEP:
        return None
    return tokenizer.whole_text


def encode_ids(rendered: Rendered, tokenizer: Tokenizer) -> np.ndarray:
    """`tokenize(rendered, tokenizer).ids` as a read-only int64 array, for callers that need only the ids.

    When `whole_text_encoder` applies, the text is encoded in one native call, reusing the ids of the longest prefix
    it shares with a text encoded before (see `prefix`); otherwise this is `tokenize`."""
    whole = whole_text_encoder(rendered, tokenizer)
    if whole is not None:
        whole_ids: np.ndarray | None = whole.encode(rendered.text)
        if whole_ids is not None:
            return whole_ids
    out = np.array(tokenize(rendered, tokenizer).ids, dtype=np.int64)
    out.flags.writeable = False
    return out


_SWITCH_LOCK = threading.Lock()
_SWITCH_USERS = 0
_SWITCH_SAVED = 0.005
_SWITCH_INTERVAL = 0.00005  # seconds: how soon a thread back from tiktoken gets the GIL from the rendering thread


@contextmanager
def _short_switch_interval() -> Iterator[None]:
    """While it runs, a worker returning from a native call waits about 50 µs for the GIL instead of the default
    5 ms (the rendering thread holds it almost all the time). Restored when the last concurrent user leaves."""
    global _SWITCH_USERS, _SWITCH_SAVED
    with _SWITCH_LOCK:
        if _SWITCH_USERS == 0:
            _SWITCH_SAVED = sys.getswitchinterval()
            sys.setswitchinterval(min(_SWITCH_SAVED, _SWITCH_INTERVAL))
        _SWITCH_USERS += 1
    try:
        yield
    finally:
        with _SWITCH_LOCK:
            _SWITCH_USERS -= 1
            if _SWITCH_USERS == 0:
                sys.setswitchinterval(_SWITCH_SAVED)


def encode_ids_batch(rendered: Iterable[Rendered], tokenizer: Tokenizer) -> list[Any]:
    """`[encode_ids(r, tokenizer) for r in rendered]`, for texts rendered one after another (`rendered` may be a
    generator that renders them). With a whole-text encoder whose native calls are tiktoken's, each text's native
    encoding is handed to a worker thread as soon as it is rendered: tiktoken releases the GIL, so the next request
    renders on one core while the last one is encoded on the other, and when rendering is done this thread takes
    the remaining texts too. With fastokens making the calls, they are made here, one by one. Without a whole-text
    encoder, the texts go through `tokenize_batch`.

    Same ids: the same `WholeText.plan` and `encode_prepared` as `encode_ids`; the worker only makes the native
    call on the text `encode_prepared` would have passed to it, and whatever the whole-text call cannot take goes
    through `encode_ids` itself."""
    whole_text = tokenizer.whole_text
    if whole_text is None:
        return [t.ids for t in tokenize_batch(list(rendered), tokenizer)]
    if whole_text.accelerated:
        # fastokens takes a request's text in about a tenth of its render time: a worker thread would only make it
        # wait for the GIL on its way back.
        return [encode_ids(r, tokenizer) for r in rendered]
    jobs: list[tuple[Rendered, Any, tuple[Any, ...] | None]] = []  # (rendered, whole, plan)
    suffixes: list[str] = []
    native: list[Any] = []
    todo: queue.SimpleQueue[int | None] = queue.SimpleQueue()

    claim_lock = threading.Lock()
    claimed: set[int] = set()

    def claim(i: int) -> bool:
        with claim_lock:
            if i in claimed:
                return False
            claimed.add(i)
            return True

    def worker() -> None:
        while (i := todo.get()) is not None:
            if claim(i):
                native[i] = jobs[i][1].native(suffixes[i])

    thread = threading.Thread(target=worker, name="ctxlock-encode", daemon=True)
    with _short_switch_interval():
        thread.start()
        try:
            for r in rendered:
                whole = whole_text_encoder(r, tokenizer)
                plan = None
                if whole is not None:
                    try:
                        plan = whole.plan(r.text.encode("utf-8"))
                    except UnicodeEncodeError:
                        plan = None
                i = len(jobs)
                suffix, inert = whole.suffix(r.text, plan[0], plan[3]) if plan is not None else ("", False)
                jobs.append((r, whole, plan if inert else None))
                suffixes.append(suffix)
                native.append(None)
                if plan is not None and inert:
                    todo.put(i)
            # Rendering is done: take queued texts here too, newest first, while the worker takes oldest first.
            for i in range(len(jobs) - 1, -1, -1):
                if jobs[i][2] is not None and claim(i):
                    native[i] = jobs[i][1].native(suffixes[i])
        finally:
            todo.put(None)
            thread.join()
    rows = []
    for (r, whole, plan), buf in zip(jobs, native, strict=True):
        ids = None if plan is None else whole.encode_prepared(r.text, *plan, native=buf)
        rows.append(encode_ids(r, tokenizer) if ids is None else ids)
    return rows


def control_matches(rendered: Rendered, tokenizer: Tokenizer) -> tuple[ControlMatch, ...]:
    """`tokenize(rendered, tokenizer).control` without encoding the text between the matches: the template's own
    control tokens, in text order (for callers that have the ids from `encode_ids` and need their positions)."""
    text = rendered.text
    matches = _split(tokenizer, text)
    if matches is None:
        return tuple(tokenize(rendered, tokenizer).control)
    if rendered.policy is InjectionPolicy.KEEP or not rendered.untrusted:
        return tuple(matches)
    spans = _Spans(rendered.untrusted)
    return tuple(m for m in matches if spans.overlap(m) is None)


@memoize("tokenizer.control_strings", 16, scope="artifact")
def control_strings(tokenizer: Tokenizer) -> dict[int, str]:
    """Each control id's string (added tokens that are not whitespace), built once per tokenizer: Tekken has a
    thousand, and building the map on every request with a neutralized control token cost a quarter of it."""
    return {t.id: t.content for t in tokenizer.added_tokens if t.control}


def tokenize(rendered: Rendered, tokenizer: Tokenizer) -> Tokenized:
    """Encode a rendered chat so that only the template's own control tokens become control ids."""
    text = rendered.text
    matches = _split(tokenizer, text)
    if matches is not None:
        reference_ids = encode_between(text, matches, tokenizer)
    else:
        reference_ids, matches = tokenizer.encode_matched(text)
    if rendered.policy is InjectionPolicy.KEEP:
        return Tokenized(tuple(reference_ids), tuple(matches), ())
    trusted: list[ControlMatch] = []
    forged: list[ControlMatch] = []
    if not rendered.untrusted:
        return Tokenized(tuple(reference_ids), tuple(matches), ())
    spans = _Spans(rendered.untrusted)
    for m in matches:
        span = spans.overlap(m)
        if span is None:
            trusted.append(m)
            continue
        if rendered.policy is InjectionPolicy.RAISE:
            at = m.core_start
            source = span.path or next((s.path for s in rendered.request_spans if s.start <= at < s.end), "")
            raise ControlTokenError(
                f"the control token {text[at : m.core_end]!r} at rendered offset {at} would come from request text",
                path=source or f"rendered text offset {at}",
                hint="remove it, or render with injection='text' to encode it as plain text",
            )
        forged.append(m)
    if not forged:
        # No request string reached a control token: this is the reference encoding, id for id.
        return Tokenized(tuple(reference_ids), tuple(trusted), ())
    ids: list[int] = []
    control = control_strings(tokenizer)
    pos = 0
    for cm in [*trusted, None]:
        end = len(text) if cm is None else cm.start
        if end > pos:
            piece = text[pos:end]
            run = encode_run(tokenizer, piece, at_start=pos == 0)
            # A control id in a plain-text run is a leak when its string is in the run (an <unk> for an unknown
            # character is not: the text never spelled "<unk>").
            leaked = {i for i in run if i in control and control[i] in piece}
            if leaked:
                raise ControlTokenError(
                    f"the vocabulary turns plain text into control id {min(leaked)} at rendered offset {pos}",
                    path=f"rendered text offset {pos}",
                    hint="this tokenizer cannot encode that text safely; remove the token string from the request",
                )
            ids.extend(run)
        if cm is not None:
            ids.append(cm.id)
            pos = cm.end
    return Tokenized(tuple(ids), tuple(trusted), tuple(forged))


# What a vocabulary leaves under the cache directory (`ctxlock.settings.cache_root()`) for later processes: the fast
# engine's verdict and rank table (`fastbpe/`), tokenizer.json heads (`tokenizer-json-head/`), the marks of files
# `tokenizers` has built (`tokenizers-loaded/`) and fastokens' verdicts (`fastokens/`). Every entry is checked when
# read (a digest, its own key, the type of every field); one that fails counts as absent and is built again.
TOKENIZER_CACHE_DIRS = ("fastbpe", "tokenizer-json-head", "tokenizers-loaded", "fastokens")


def clear_disk_cache() -> list[str]:
    """Delete the tokenizer caches under the cache directory (`TOKENIZER_CACHE_DIRS`); the next load of each
    vocabulary builds them again (a few seconds for a 150k vocabulary). Returns the directories removed."""
    import shutil

    removed = []
    for name in TOKENIZER_CACHE_DIRS:
        path = cache_root() / name
        if path.is_dir():
            shutil.rmtree(path)
            removed.append(str(path))
    return removed


__all__ = [
    "ENCODE_THREADS",
    "TOKENIZER_CACHE_DIRS",
    "AddedToken",
    "ControlMatch",
    "ManifestFiles",
    "Piece",
    "PieceView",
    "TokenBytes",
    "Tokenized",
    "Tokenizer",
    "TokenizerBase",
    "accel_setting",
    "accel_start_after",
    "byte_level_decoder_table",
    "clear_disk_cache",
    "control_matches",
    "encode_between",
    "encode_ids",
    "encode_ids_batch",
    "longest_first",
    "run_encoder",
    "token_bytes",
    "tokenize",
    "tokenize_batch",
]
