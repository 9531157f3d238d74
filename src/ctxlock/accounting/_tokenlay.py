"""Where each token of a rendered text lies in its bytes: the lay `ctxlock.accounting` attributes tokens with.

A token covers the bytes of its piece (`token_bytes`): laid end to end over the text, each control token over its
own match, they spell the text exactly for byte-level BPE, tiktoken and Tekken vocabularies. `token_ranges` does
that in one pass when it can (`_walk`, which needs only each id's byte length, kept on disk by the tokenizer's
digest), and otherwise replays the tokenizer run by run (the reference path, which `CTXLOCK_FAST=0` always takes),
laying a SentencePiece dummy-prefix space or a Unicode normalization back onto the text. `assign_owners` gives each
token the owner of most of its bytes.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import tempfile
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctxlock.caches import LRU
from ctxlock.errors import CtxlockError
from ctxlock.settings import cache_root, fast_enabled
from ctxlock.template import Rendered
from ctxlock.tokenizer import ControlMatch, run_encoder, token_bytes, whole_text_encoder

# -- token byte ranges -----------------------------------------------------------------------------------------

_PIECES: LRU[str, Any] = LRU("accounting.token_bytes", max_items=8, scope="artifact")


class _Pieces:
    """A vocabulary's bytes per id, built on first use, and their lengths as an array (one lookup per id, in
    numpy). The lengths are all the one-pass lay needs, so they are kept on disk by the tokenizer's digest
    (`<cache>/token-lengths/`): a later process lays tokens without building the vocabulary's bytes (about 4 s
    for a 150k-token `tokenizer.json`). A missing, unreadable or mismatched file counts as absent."""

    __slots__ = ("_pieces", "lengths", "tokenizer")

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._pieces: tuple[bytes, ...] | None = None
        path = _lengths_path(tokenizer.sha256)
        lengths = None
        with contextlib.suppress(OSError, ValueError):
            lengths = np.load(path, allow_pickle=False)
        if lengths is None or lengths.dtype != np.int64 or lengths.shape != (tokenizer.vocab_size,):
            lengths = np.fromiter((len(b) for b in self.pieces), dtype=np.int64, count=len(self.pieces))
            _store_lengths(path, lengths)
        self.lengths = lengths

    @property
    def pieces(self) -> tuple[bytes, ...]:
        if self._pieces is None:
            self._pieces = token_bytes(self.tokenizer).pieces
        return self._pieces

    def __getitem__(self, i: int) -> bytes:
        return self.pieces[i]


_LENGTHS_VERSION = "1"


def _lengths_path(sha256: str) -> Path:
    return cache_root() / "token-lengths" / f"{sha256}-{_LENGTHS_VERSION}.npy"


def _store_lengths(path: Path, lengths: np.ndarray) -> None:
    """Write atomically; a cache that cannot be written is not an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npy", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, lengths, allow_pickle=False)
        os.replace(tmp, path)
    except OSError:
        return


def _pieces(tok: Any) -> Any:
    hit = _PIECES.get(tok.sha256)
    if hit is None:
        try:
            hit = _Pieces(tok)
        except CtxlockError:
            hit = False  # no per-token bytes (WordPiece): spread in proportion
        _PIECES.put(tok.sha256, hit)
    return hit


class _Controls:
    """What `whole_lay` needs of a vocabulary whose whole-text encoder applies: the encoder's per-id byte lengths,
    which ids are control tokens, each one's UTF-8 content, and the contents in groups by their first two bytes,
    with each group's common leading bytes (one `bytes.count` tells a group absent or its occurrences all checked)."""

    __slots__ = ("content", "group_of", "groups", "table")

    def __init__(self, lengths: np.ndarray, controls: dict[int, bytes]) -> None:
        # One small table, one lookup per id: the byte length, negated for a control id (a 150k vocabulary's int16
        # table is 300 kB, which stays in the CPU's cache better than int64 lengths and a flag array).
        self.table = lengths.astype(np.int16)
        self.table[list(controls)] *= -1
        self.content = controls
        by_head: dict[bytes, list[int]] = {}
        for i, c in controls.items():
            by_head.setdefault(c[:2], []).append(i)
        self.group_of = np.zeros(len(lengths), dtype=np.int64)
        self.groups: list[tuple[bytes, tuple[bytes, ...]]] = []
        for g, members in enumerate(by_head.values()):
            self.group_of[members] = g
            contents = tuple(controls[i] for i in members)
            self.groups.append((_common_prefix(contents), contents))


def _common_prefix(contents: Sequence[bytes]) -> bytes:
    first, last = min(contents), max(contents)
    k = 0
    while k < min(len(first), len(last)) and first[k] == last[k]:
        k += 1
    return first[:k]


_CONTROLS: LRU[str, Any] = LRU("accounting.whole_lay_controls", max_items=8, scope="artifact")


def _overlap_free(contents: Sequence[bytes]) -> bool:
    """No content is inside another, and no proper suffix of one is a proper prefix of one (itself included): then
    the occurrences of the contents in a text never overlap, and each is where a leftmost-longest scan matches."""
    prefixes = {c[:k] for c in contents for k in range(1, len(c))}
    inside = {c[i:j] for c in contents for i in range(len(c)) for j in range(i + 1, len(c) + (i > 0))}
    return not any(c in inside or any(c[k:] in prefixes for k in range(1, len(c))) for c in contents)


def _controls(tokenizer: Any, whole: Any) -> Any:
    hit = _CONTROLS.get(tokenizer.sha256)
    if hit is None:
        hit = False
        lengths = whole.byte_lengths
        controls = [t for t in tokenizer.added_tokens if t.control]
        content = {t.id: t.content.encode("utf-8", "surrogatepass") for t in controls}
        if (
            tokenizer.split_controls("") is not None  # the reference splits the text at every control's occurrence
            and not any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in controls)
            and len(set(content.values())) == len(content) == len(controls)
            and all(0 <= i < len(lengths) and lengths[i] == len(c) > 0 for i, c in content.items())
            and int(lengths.max(initial=0)) < 2**15
            and int(lengths.min(initial=0)) >= 0
            and _overlap_free(tuple(content.values()))
        ):
            hit = _Controls(lengths, content)
        _CONTROLS.put(tokenizer.sha256, hit)
    return hit


def whole_lay(tokenizer: Any, rendered: Rendered, ids_in: np.ndarray, data: bytes) -> np.ndarray | None:
    """The tokens' boundaries in the rendered text's bytes (token t is [cum[t], cum[t + 1])), from the ids alone:
    the fast path of `token_ranges` for texts the whole-text encoder takes (no control-token matches needed);
    `data` is the text's UTF-8 (lone surrogates as three bytes, as the reference measures runs). None when it does
    not apply; the caller then finds the matches and calls `token_ranges`.

    Why it equals the reference (`_replay_runs`). Let L be the encoder's byte length per id, cum their running sum
    over the ids, and Q the positions of control ids. The checks: cum ends at the text's byte length; each control
    id's content is in the text at cum[Q_k]; and the text holds exactly |Q| occurrences of control contents. The
    contents cannot overlap (`_overlap_free`) and the reference splits the text at every occurrence (the whole-text
    encoder applies: no request string reached a control position, or the policy keeps them), with no
    lstrip/rstrip (a match is its content). So the |Q| increasing positions cum[Q_k] are all of the reference's
    match starts, in order, with the same ids; the bytes between two matches are exactly the lengths of the ids
    between them, so the reference lays each run from its start by the same lengths: the same ranges."""
    if not fast_enabled():
        return None
    whole = whole_text_encoder(rendered, tokenizer)
    if whole is None:
        return None
    plan = _controls(tokenizer, whole)
    if plan is False:
        return None
    try:
        ids = np.asarray(ids_in, dtype=np.int64)
        signed = plan.table[ids]
    except IndexError:
        return None
    n = len(ids)
    cum = np.zeros(n + 1, dtype=np.int64)
    # The ufunc and the array's method, not np.cumsum and np.flatnonzero: on a row's few hundred ids their Python
    # wrappers cost more than the work (the sums are int64: `out`'s type).
    np.add.accumulate(np.abs(signed), out=cum[1:])
    if cum[n] != len(data):
        return None
    q = (signed < 0).nonzero()[0]
    if q.size:
        content = plan.content
        found = list(map(data.startswith, [content[i] for i in ids[q].tolist()], cum[q].tolist()))
        if not all(found):
            return None
    if not _occurrences_are(data, plan, ids[q]):
        return None
    return cum


def whole_lays(
    tokenizer: Any, rendered: Sequence[Rendered], ids: Sequence[np.ndarray], datas: Sequence[bytes]
) -> list[np.ndarray | None]:
    """`[whole_lay(tokenizer, r, i, d) for r, i, d in zip(rendered, ids, datas)]`, made for all the texts at once
    when one whole-text encoder takes them all: their ids end to end are laid over their bytes end to end.

    Why it equals the per-text lay. Each text's checks hold over the joined bytes exactly when they hold over the
    text: (1) every text's lengths sum to its byte length (checked at every text's end), so a token's position in
    the joined bytes is its position in its text plus the text's start; (2) a control id's content, when the
    first check holds, lies inside its own text, so `startswith` at the joined position is `startswith` in the
    text; (3) `_occurrences_are`: a group's leading bytes (or each of its contents) occur in each text at least
    once per control id of the group (of that content) in it, at their distinct, non-overlapping positions, and
    `bytes.count` (leftmost, non-overlapping: the most there can be) counts at least as many in the joined bytes
    as in the texts together; so a joined count equal to all the texts' control ids means every text's count is
    its own. When (1), (2) or (3) fails, each text is laid on its own (`whole_lay`)."""
    n = len(rendered)
    if n < 2 or not fast_enabled():
        return [whole_lay(tokenizer, r, i, d) for r, i, d in zip(rendered, ids, datas, strict=True)]
    whole = whole_text_encoder(rendered[0], tokenizer)
    plan = None if whole is None else _controls(tokenizer, whole)
    if not plan or any(whole_text_encoder(r, tokenizer) is not whole for r in rendered):
        return [whole_lay(tokenizer, r, i, d) for r, i, d in zip(rendered, ids, datas, strict=True)]
    try:
        flat = np.concatenate(ids).astype(np.int64, copy=False)
        signed = plan.table[flat]
    except (IndexError, ValueError):
        return [whole_lay(tokenizer, r, i, d) for r, i, d in zip(rendered, ids, datas, strict=True)]
    cum = np.zeros(len(flat) + 1, dtype=np.int64)
    np.add.accumulate(np.abs(signed), out=cum[1:])
    token_ends = np.zeros(n + 1, dtype=np.int64)
    np.add.accumulate([len(i) for i in ids], out=token_ends[1:])
    byte_ends = np.zeros(n + 1, dtype=np.int64)
    np.add.accumulate([len(d) for d in datas], out=byte_ends[1:])
    joined = b"".join(datas)
    q = (signed < 0).nonzero()[0]
    content = plan.content
    found = flat[q]
    if (
        (cum[token_ends] != byte_ends).any()
        or not all(map(joined.startswith, [content[i] for i in found.tolist()], cum[q].tolist()))
        or not _occurrences_are(joined, plan, found)
    ):
        return [whole_lay(tokenizer, r, i, d) for r, i, d in zip(rendered, ids, datas, strict=True)]
    bounds = token_ends.tolist()
    return [cum[a : b + 1] - cum[a] for a, b in itertools.pairwise(bounds)]


def _occurrences_are(data: bytes, plan: _Controls, found: np.ndarray) -> bool:
    """Whether `data` holds exactly the control contents `found` (their ids) checked at their positions, and no
    other occurrence (they cannot overlap). Per group: when its common leading bytes occur as often as its checked
    contents, there is no other (every occurrence starts with them); else its contents are counted one by one."""
    expected = np.bincount(plan.group_of[found], minlength=len(plan.groups)).tolist()
    for (common, contents), want in zip(plan.groups, expected, strict=True):
        if data.count(common) != want and sum(map(data.count, contents)) != want:
            return False
    return True


def token_ranges(
    tokenizer: Any, text: str, ids: np.ndarray, control: Sequence[ControlMatch], offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Each token's [start, end) in the rendered text's bytes, and whether every run was laid exactly: in one pass
    over the ids when their bytes spell the text between the control tokens (byte-level BPE, tiktoken, Tekken),
    else run by run (`_replay_runs`, the reference path: `CTXLOCK_FAST=0` takes it always)."""
    pieces = _pieces(tokenizer)
    if pieces is not False and fast_enabled():
        laid = _walk(ids, control, offsets, pieces)
        if laid is not None:
            return laid[0], laid[1], True
    return _replay_runs(tokenizer, text, ids, control, offsets, pieces)


def _walk(
    ids_in: np.ndarray, control: Sequence[ControlMatch], offsets: np.ndarray, pieces: Any
) -> tuple[np.ndarray, np.ndarray] | None:
    """Lay every token's bytes end to end, each control token over its own match (which may be longer than its
    content: lstrip/rstrip take whitespace), without encoding anything again. None when the bytes do not line up
    with the text (a normalizer, a dummy prefix): the run-by-run replay then takes over.

    The k-th control token's match starts at byte s_k of the text; laid end to end, the tokens before it cover
    s_k - shift_k bytes, where shift_k sums (match length - content length) over the control tokens before it. So
    its position is where the cumulative lengths reach s_k - shift_k, and its id must be there."""
    ids = np.asarray(ids_in, dtype=np.int64)
    n = len(ids)
    lengths = pieces.lengths[ids]
    cum = np.concatenate(([0], np.cumsum(lengths)))
    if control:
        starts = offsets[[m.start for m in control]]
        ends = offsets[[m.end for m in control]]
        control_ids = np.fromiter((m.id for m in control), dtype=np.int64, count=len(control))
        extra = (ends - starts) - pieces.lengths[control_ids]
        shifts = np.concatenate(([0], np.cumsum(extra)))
        pos = np.searchsorted(cum, starts - shifts[:-1], side="left")
        if pos.max() >= n or not (ids[pos] == control_ids).all() or (np.diff(pos) <= 0).any():
            return None  # an empty token before a control token, or bytes that do not line up
        if not (cum[pos] == starts - shifts[:-1]).all():
            return None
        # the shift in force at each position: control k's extra applies from the token after it
        delta = np.zeros(n + 1, dtype=np.int64)
        np.add.at(delta, pos + 1, extra)
        delta = np.cumsum(delta)
        total_shift = int(shifts[-1])
    else:
        delta = np.zeros(n + 1, dtype=np.int64)
        total_shift = 0
    if cum[n] + total_shift != offsets[-1]:
        return None
    # a token ends where the next begins: a control token's end is its match's end
    return cum[:-1] + delta[:-1], cum[1:] + delta[1:]


def _replay_runs(
    tokenizer: Any, text: str, ids: np.ndarray, control: Sequence[ControlMatch], offsets: np.ndarray, pieces: Any
) -> tuple[np.ndarray, np.ndarray, bool]:
    encode = run_encoder(tokenizer)
    starts = np.zeros(len(ids), dtype=np.int64)
    ends = np.zeros(len(ids), dtype=np.int64)
    k, pos, exact = 0, 0, True
    for m in [*control, None]:
        stop = len(text) if m is None else m.start
        if stop > pos:
            run_ids = encode(text[pos:stop], pos == 0)
            n = len(run_ids)
            if tuple(ids[k : k + n].tolist()) != tuple(run_ids):
                raise Unaligned
            lay = _lay(run_ids, pieces, text[pos:stop])
            exact &= lay[1]
            base = offsets[pos]
            starts[k : k + n] = base + lay[0][:-1]
            ends[k : k + n] = base + lay[0][1:]
            k += n
        if m is not None:
            starts[k], ends[k] = offsets[m.start], offsets[m.end]
            k += 1
            pos = m.end
    if k != len(ids):
        raise Unaligned
    return starts, ends, exact


class Unaligned(Exception):
    """The run-by-run replay does not give the tokenized ids: fall back to spreading the whole text."""


def _lay(run_ids: Sequence[int], pieces: Any, run_text: str) -> tuple[np.ndarray, bool]:
    """Cumulative byte offsets of a run's tokens within the run (n + 1 values), and whether they are exact.

    The tokens' bytes are laid over the run as they are; or over the run without SentencePiece's dummy-prefix space;
    or over the run's Unicode normalization (NFC, NFKC, NFD, NFKD: what normalizers such as Qwen2's NFC do), mapped
    back to the run's own bytes one normalization chunk at a time (a starter and the marks that follow it)."""
    size = len(run_text.encode("utf-8", "surrogatepass"))
    if pieces is False:
        return spread(np.ones(len(run_ids), dtype=np.int64), size), False
    lengths = pieces.lengths[np.asarray(run_ids, dtype=np.int64)]
    laid = _lay_over(lengths, run_ids, pieces, run_text, size)
    if laid is not None:
        return laid, True
    for form in ("NFC", "NFKC", "NFD", "NFKD"):
        chunks = _chunks(run_text, form)
        if chunks is None:
            continue
        normalized = sum(n for _, n in chunks)
        laid = _lay_over(lengths.copy(), run_ids, pieces, None, normalized)
        if laid is not None:
            return _map_back(laid, chunks), True
    return spread(lengths, size), False


def _lay_over(
    lengths: np.ndarray, run_ids: Sequence[int], pieces: Any, run_text: str | None, size: int
) -> np.ndarray | None:
    total = int(lengths.sum())
    if total == size:
        return np.concatenate(([0], np.cumsum(lengths)))
    extra = total - size
    # SentencePiece's dummy prefix: one space the text does not have, in front of the run's first token.
    starts_with_space = run_text is not None and run_text.startswith(" ")
    if (
        len(run_ids)
        and 0 < extra <= lengths[0]
        and pieces[run_ids[0]][:extra] == b" " * extra
        and not starts_with_space
    ):
        lengths[0] -= extra
        return np.concatenate(([0], np.cumsum(lengths)))
    return None


def _chunks(text: str, form: str) -> list[tuple[int, int]] | None:
    """(bytes in the text, bytes once normalized) per normalization chunk, or None when the form changes nothing or
    the chunks do not normalize independently."""
    whole = unicodedata.normalize(form, text)
    if whole == text:
        return None
    chunks: list[tuple[int, int]] = []
    pieces: list[str] = []
    start = 0
    for i in range(1, len(text) + 1):
        if i == len(text) or unicodedata.combining(text[i]) == 0:
            chunk = text[start:i]
            norm = unicodedata.normalize(form, chunk)
            pieces.append(norm)
            chunks.append((len(chunk.encode("utf-8", "surrogatepass")), len(norm.encode("utf-8", "surrogatepass"))))
            start = i
    return chunks if "".join(pieces) == whole else None


def _map_back(laid: np.ndarray, chunks: list[tuple[int, int]]) -> np.ndarray:
    """Offsets in the normalized bytes -> offsets in the original bytes: a boundary inside a chunk's normalized
    bytes moves to the end of that chunk's original bytes (a chunk is one character and its marks)."""
    orig = np.concatenate(([0], np.cumsum([c[0] for c in chunks])))
    norm = np.concatenate(([0], np.cumsum([c[1] for c in chunks])))
    k = np.searchsorted(norm, laid, side="left")
    return orig[np.minimum(k, len(orig) - 1)]


def spread(lengths: np.ndarray, size: int) -> np.ndarray:
    weights = np.maximum(lengths, 1).astype(np.float64)
    cum = np.concatenate(([0.0], np.cumsum(weights)))
    return np.floor(cum / cum[-1] * size + 0.5).astype(np.int64)


def assign_owners(owner: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The owner of most of each token's bytes; ties to the owner met first. A token with no bytes (a control
    token that consumed nothing, an empty piece) takes the owner of the byte it sits at."""
    n = len(starts)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    size = len(owner)
    at = np.clip(starts, 0, max(size - 1, 0))
    result = owner[at] if size else np.zeros(n, dtype=np.int32)
    if size == 0:
        return result
    change = np.flatnonzero(np.diff(owner)) + 1  # byte offsets where the owner changes
    if len(change) == 0:  # one owner for every byte
        return result
    # a token is mixed when a change point falls strictly inside it
    first_after = np.searchsorted(change, starts, side="right")
    mixed = np.flatnonzero((first_after < len(change)) & (change[np.minimum(first_after, len(change) - 1)] < ends))
    for t in mixed.tolist():
        tally: dict[int, int] = {}  # insertion order is the order met
        for v in owner[starts[t] : ends[t]].tolist():
            tally[v] = tally.get(v, 0) + 1
        result[t] = max(tally, key=tally.__getitem__)  # max keeps the first of equal counts
    return result


def tally_segments(points: Sequence[int], seg_owner: Sequence[int], cum: np.ndarray, owners: int) -> list[int]:
    """`bincount(assign_owners(...))` for tokens laid end to end (token t is [cum[t], cum[t + 1])) and owners given
    as segments (the bytes [points[j], points[j + 1]) all belong to seg_owner[j]; points[0] = 0, points[-1] =
    cum[-1], the text's size; no segment empty), without a per-token owner.

    The same counts: a token within one segment takes its owner (one with no bytes, the owner of the byte it sits at,
    the last byte's past the end). With idx[j] the first boundary at or after points[j], the tokens starting in
    segment j are [idx[j], idx[j + 1]), so each segment's owner first gets all of those; a breakpoint strictly
    inside a token (cum[idx[j]] past it) makes token idx[j] - 1 mixed, and it then moves to the owner of most of its
    bytes, summed over its segments, ties to the owner met first."""
    tally = [0] * owners
    n = len(cum) - 1
    size = int(cum[-1])
    if n <= 0:
        return tally
    if size == 0:
        tally[0] = n
        return tally
    idx = cum.searchsorted(points)
    at = cum[idx].tolist()
    idx = idx.tolist()
    idx[0], idx[-1] = 0, n
    mixed: list[int] = []
    for j, o in enumerate(seg_owner):
        tally[o] += idx[j + 1] - idx[j]
        if j > 0 and at[j] != points[j] and (not mixed or mixed[-1] != idx[j] - 1):
            mixed.append(idx[j] - 1)
    for t in mixed:
        a, b = int(cum[t]), int(cum[t + 1])
        j = bisect.bisect_right(points, a) - 1
        first = seg_owner[j]
        share: dict[int, int] = {}  # insertion order is the order met
        while j < len(seg_owner) and points[j] < b:
            share[seg_owner[j]] = share.get(seg_owner[j], 0) + min(b, points[j + 1]) - max(a, points[j])
            j += 1
        tally[first] -= 1
        tally[max(share, key=share.__getitem__)] += 1  # max keeps the first of equal counts
    return tally


__all__ = ["Unaligned", "assign_owners", "spread", "tally_segments", "token_ranges", "whole_lay", "whole_lays"]
