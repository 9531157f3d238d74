"""Timing shared by the benchmarks: medians, because these machines are noisy."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], rounds: int, *, warmup: bool = False) -> float:
    """The median wall time of `rounds` calls of fn, after one untimed call when `warmup`."""
    if warmup:
        fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)
