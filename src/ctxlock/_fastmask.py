"""The provenance mask of tokens laid end to end, from the trained regions' ends alone (a fast path of `ctxlock.masks`).

`region_mask(bounds, regions)`: token t covers bytes [bounds[t], bounds[t + 1]) of the rendered text (the lay
`tokenlay.whole_lay` gives); `regions` are the trained byte ranges. The reference (`masks`, and `CTXLOCK_FAST=0`)
writes an owner per byte (1 inside a region) and calls `tokenlay.assign_owners`: a token takes the owner of most
of its bytes, ties to the owner met first, and a token with no bytes the owner of the byte it sits at (the last
byte's past the end). With two owners that is: trained when its region bytes are more than half its bytes, or
exactly half and its first byte is in a region. Here the regions are merged, the tokens wholly inside one are
found by searching the token boundaries for its ends (`np.searchsorted`, all regions in one call, no Python list
of the boundaries), and only the tokens a region's end falls strictly inside, and the tokens with no bytes, are
decided one by one (a few per row): no per-byte array. tests/test_masks_batch.py
checks it against `assign_owners` (hypothesis).
"""

from __future__ import annotations

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


__all__ = ["region_mask"]
