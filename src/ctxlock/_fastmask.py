"""The provenance mask of tokens laid end to end, from the trained regions' ends alone (a fast path of `ctxlock.masks`).

`region_mask(bounds, regions)`: token t covers bytes [bounds[t], bounds[t + 1]) of the rendered text (the lay
`tokenlay.whole_lay` gives); `regions` are the trained byte ranges. The reference (`masks`, and `CTXLOCK_FAST=0`)
writes an owner per byte (1 inside a region) and calls `tokenlay.assign_owners`: a token takes the owner of most
of its bytes, ties to the owner met first, and a token with no bytes the owner of the byte it sits at (the last
byte's past the end). With two owners that is: trained when its region bytes are more than half its bytes, or
exactly half and its first byte is in a region. Here the region bytes before any offset x are counted from the
merged regions' ends (`searchsorted` over them and their running lengths), so a token's count is two lookups, with
no per-byte array. tests/test_masks_batch.py checks it against `assign_owners` (hypothesis).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def region_mask(bounds: np.ndarray, regions: Sequence[tuple[int, int]]) -> np.ndarray:
    """0/1 (int64) per token: see the module docstring."""
    cum = np.asarray(bounds, dtype=np.int64)
    n, size = len(cum) - 1, int(cum[-1])
    merged: list[list[int]] = []
    for a, b in sorted((max(a, 0), min(b, size)) for a, b in regions):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    if n <= 0 or size == 0 or not merged:
        return np.zeros(max(n, 0), dtype=np.int64)
    starts = np.array([m[0] for m in merged], dtype=np.int64)
    ends = np.array([m[1] for m in merged], dtype=np.int64)
    before = np.concatenate(([0], np.cumsum(ends - starts)))

    def inside(x: np.ndarray) -> np.ndarray:  # region bytes before offset x
        j = np.searchsorted(ends, x, side="right")  # the regions wholly before x
        k = np.minimum(j, len(starts) - 1)
        return before[j] + np.where(j < len(starts), np.maximum(x - starts[k], 0), 0)

    lo, hi = cum[:-1], cum[1:]
    count = inside(hi) - inside(lo)
    at = np.clip(lo, 0, size - 1)
    first = (inside(at + 1) - inside(at)) == 1
    length = hi - lo
    trained = np.where(length > 0, (2 * count > length) | ((2 * count == length) & first), first)
    return trained.astype(np.int64)


__all__ = ["region_mask"]
