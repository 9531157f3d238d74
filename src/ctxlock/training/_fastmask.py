"""The provenance mask of tokens laid end to end, from the trained regions' ends alone
(a fast path of `ctxlock.training`).

`region_mask(bounds, regions)`: token t covers bytes [bounds[t], bounds[t + 1]) of the rendered text (the lay
`tokenlay.whole_lay` gives); `regions` are the trained byte ranges. The reference (`masks`, and `CTXLOCK_FAST=0`)
writes an owner per byte (1 inside a region) and calls `tokenlay.assign_owners`: a token takes the owner of most
of its bytes, ties to the owner met first, and a token with no bytes the owner of the byte it sits at (the last
byte's past the end). With two owners that is: trained when its region bytes are more than half its bytes, or
exactly half and its first byte is in a region. Here the regions are merged, the tokens wholly inside one are
found by searching the token boundaries for its ends (`np.searchsorted`, all regions in one call, no Python list
of the boundaries), and only the tokens a region's end falls strictly inside, and the tokens with no bytes, are
decided one by one (a few per row): no per-byte array. tests/training/test_masks_batch.py
checks it against `assign_owners` (hypothesis).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np


def region_mask(bounds: np.ndarray, regions: Sequence[tuple[int, int]]) -> np.ndarray:
    """0/1 (int64) per token: see the module docstring."""
    cum = np.asarray(bounds, dtype=np.int64)
    n, size = len(cum) - 1, int(cum[-1])
    out = np.zeros(max(n, 0), dtype=np.int64)
    merged = _merged(regions, size)
    if n <= 0 or size == 0 or not merged:
        return out
    # One search for both ends (the boundaries are integers: the last boundary <= b is the first one >= b + 1,
    # less one), through numpy's method: its function wrappers cost more than the work on a row's few hundred tokens.
    found = cum.searchsorted([x for a, b in merged for x in (a, b + 1)]).tolist()
    for i, j in zip(found[0::2], [k - 1 for k in found[1::2]], strict=True):
        out[i:j] = 1  # the tokens wholly inside the region
        for t in (i - 1, j):  # the tokens a region's start or end falls strictly inside
            if 0 <= t < n:
                lo, hi = cum[t : t + 2].tolist()
                if lo < hi:
                    out[t] = _owner(lo, hi, merged)
    empty = (cum[1:] == cum[:-1]).nonzero()[0]
    for t in empty.tolist():  # a token with no bytes: the owner of the byte it sits at
        at = min(int(cum[t]), size - 1)
        out[t] = _owner(at, at + 1, merged)
    return out


def region_masks(bounds: Sequence[np.ndarray], regions: Sequence[Sequence[tuple[int, int]]]) -> list[np.ndarray]:
    """`[region_mask(b, r) for b, r in zip(bounds, regions)]` for rows whose boundaries run from 0 up (as
    `tokenlay.whole_lay` lays them), made with the rows laid end to end: one search for every region's ends, one
    array of 0/1. No token crosses a row's end (a row's last boundary is the next row's first), and a straddling or
    empty token is decided on its own row's regions, in its row's bytes, as `region_mask` decides it; a row with no
    bytes, no token or no region is all 0, as there. Rows that do not start at 0 or go down: each on its own."""
    rows = len(bounds)
    cums = [np.asarray(b, dtype=np.int64) for b in bounds]
    if rows < 2 or any(len(c) == 0 for c in cums):
        return [region_mask(c, r) for c, r in zip(cums, regions, strict=True)]
    flat = np.concatenate(cums)
    lens = [len(c) for c in cums]
    heads = np.zeros(rows, dtype=np.int64)  # where each row's bounds start in `flat`
    np.add.accumulate(lens[:-1], out=heads[1:])
    sizes = flat[heads + np.asarray(lens, dtype=np.int64) - 1].tolist()
    down = flat[1:] < flat[:-1]
    down[heads[1:] - 1] = False  # a row's end to the next row's 0
    if flat[heads].any() or down.any():
        return [region_mask(c, r) for c, r in zip(cums, regions, strict=True)]
    bases = [0] * rows
    for k in range(1, rows):
        bases[k] = bases[k - 1] + sizes[k - 1]
    flat += np.repeat(np.asarray(bases, dtype=np.int64), lens)
    cum = np.delete(flat, (heads[1:] - 1))  # a row's last boundary is the next row's first
    starts = [0] * (rows + 1)  # each row's first token in `cum`
    for k in range(rows):
        starts[k + 1] = starts[k] + lens[k] - 1
    n = len(cum) - 1
    merged = [_merged(r, size) for r, size in zip(regions, sizes, strict=True)]
    ends = [x + base for m, base in zip(merged, bases, strict=True) for a, b in m for x in (a, b + 1)]
    found = iter(cum.searchsorted(ends).tolist())
    inside: list[int] = []  # [i, j) of each region's wholly inside tokens, end to end
    edges: list[tuple[int, int]] = []  # (token, row) a region's start or end may fall strictly inside
    for k, m in enumerate(merged):  # a row with no bytes has no region: all 0
        first, stop = starts[k], starts[k + 1]
        for _ in m:
            # The row's own first boundary at or past the start and last one at or before the end: a row's edge
            # value is shared with the empty tokens and rows next to it, which the search may land in.
            i, j = max(next(found), first), min(next(found) - 1, stop)
            if i < j:
                inside += (i, j)
            if first < i:  # first <= i - 1 < stop
                edges.append((i - 1, k))
            if j < stop:  # first <= j
                edges.append((j, k))
    # The regions' tokens by one running sum (the ranges are disjoint); then the edge tokens, then the empty ones.
    step = np.zeros(n + 1, dtype=np.int64)
    step[inside[0::2]] = 1
    step[inside[1::2]] -= 1
    out = np.add.accumulate(step[:-1])
    if edges:
        at = [t for t, _ in edges]
        for (t, k), lo, hi in zip(edges, cum[at].tolist(), cum[[t + 1 for t in at]].tolist(), strict=True):
            if lo < hi:
                out[t] = _owner(lo - bases[k], hi - bases[k], merged[k])
    empty = (cum[1:] == cum[:-1]).nonzero()[0].tolist()
    if empty:
        for t, k in zip(empty, np.searchsorted(starts, empty, side="right").tolist(), strict=True):
            m = merged[k - 1]
            if m:  # a token with no bytes: the owner of the byte it sits at, in its row
                at = min(int(cum[t]) - bases[k - 1], sizes[k - 1] - 1)
                out[t] = _owner(at, at + 1, m)
    return [out[a:b].copy() for a, b in itertools.pairwise(starts)]


def _merged(regions: Sequence[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """The regions within [0, size), sorted, overlapping and touching ones joined, empty ones dropped."""
    merged: list[list[int]] = []
    for a, b in sorted((max(a, 0), min(b, size)) for a, b in regions):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _owner(lo: int, hi: int, merged: list[tuple[int, int]]) -> int:
    """1 when most of the bytes [lo, hi) are in the regions, or exactly half and byte lo is. `merged` is sorted and
    disjoint (`_merged`): the regions past hi are not looked at."""
    count = 0
    first = False
    for a, b in merged:
        if a >= hi:
            break
        if b > lo:
            count += min(hi, b) - max(lo, a)
            first = first or a <= lo
    return 1 if 2 * count > hi - lo or (2 * count == hi - lo and first) else 0


__all__ = ["region_mask", "region_masks"]
