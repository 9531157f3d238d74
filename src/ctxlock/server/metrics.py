"""`GET /metrics`: the Prometheus text format (version 0.0.4), written by hand: requests by route and status,
latency histograms by route, tokens processed, the pool's load, and for each registered cache (`ctxlock.caches`) its
size, its hits and misses since start-up (counters) and its hit ratio (a gauge), with the ratio over every counting
cache as `cache="all"`. A cache that counts nothing has a size only; a ratio is given only once a cache was looked up.
The counts are per worker process (`--workers N`: each process answers /metrics for itself)."""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Mapping

from ctxlock.caches import CacheInfo
from ctxlock.telemetry import StreamStats

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    def __init__(self) -> None:
        self._started = time.time()
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self._buckets: dict[str, list[int]] = defaultdict(lambda: [0] * (len(BUCKETS) + 1))
        self._sum: dict[str, float] = defaultdict(float)
        self._tokens: dict[str, int] = defaultdict(int)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        with self._lock:
            self._requests[(route, method, status)] += 1
            self._buckets[route][bisect_left(BUCKETS, seconds)] += 1
            self._sum[route] += seconds

    def tokens(self, model: str, n: int) -> None:
        with self._lock:
            self._tokens[model] += n

    def render(self, cache_infos: Mapping[str, CacheInfo], *, in_flight: int) -> str:
        out = [
            "# HELP ctxlock_requests_total HTTP requests answered, by route, method and status.",
            "# TYPE ctxlock_requests_total counter",
        ]
        with self._lock:
            for (route, method, status), n in sorted(self._requests.items()):
                out.append(f'ctxlock_requests_total{{route="{_label(route)}",method="{method}",status="{status}"}} {n}')
            out += [
                "# HELP ctxlock_request_seconds Request latency, from the first byte read to the response.",
                "# TYPE ctxlock_request_seconds histogram",
            ]
            for route, counts in sorted(self._buckets.items()):
                r = _label(route)
                running = 0
                for le, c in zip((*map(str, BUCKETS), "+Inf"), counts, strict=True):
                    running += c
                    out.append(f'ctxlock_request_seconds_bucket{{route="{r}",le="{le}"}} {running}')
                out.append(f'ctxlock_request_seconds_sum{{route="{r}"}} {self._sum[route]:.6f}')
                out.append(f'ctxlock_request_seconds_count{{route="{r}"}} {running}')
            out += [
                "# HELP ctxlock_tokens_total Tokens produced by tokenize, count and render requests, by model.",
                "# TYPE ctxlock_tokens_total counter",
            ]
            out += [f'ctxlock_tokens_total{{model="{_label(m)}"}} {n}' for m, n in sorted(self._tokens.items())]
        out += [
            "# HELP ctxlock_worker The worker process that answered (with --workers N, each answers for itself).",
            "# TYPE ctxlock_worker gauge",
            f'ctxlock_worker{{pid="{os.getpid()}"}} 1',
            "# HELP process_start_time_seconds Start time of the process since the Unix epoch, in seconds.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self._started:.3f}",
            "# HELP ctxlock_pool_admitted Requests running or queued on the worker pool.",
            "# TYPE ctxlock_pool_admitted gauge",
            f"ctxlock_pool_admitted {in_flight}",
            "# HELP ctxlock_cache_entries Entries held by each of ctxlock's registered in-process caches.",
            "# TYPE ctxlock_cache_entries gauge",
        ]
        out += [f'ctxlock_cache_entries{{cache="{_label(n)}"}} {i.size}' for n, i in sorted(cache_infos.items())]
        return "\n".join(out + cache_counts(cache_infos)) + "\n"


def cache_counts(infos: Mapping[str, CacheInfo]) -> list[str]:
    counting = {n: i for n, i in sorted(infos.items()) if i.hits is not None and i.misses is not None}
    out = [
        "# HELP ctxlock_cache_hits_total Lookups answered from each cache since start-up.",
        "# TYPE ctxlock_cache_hits_total counter",
    ]
    out += [f'ctxlock_cache_hits_total{{cache="{_label(n)}"}} {i.hits}' for n, i in counting.items()]
    out += [
        "# HELP ctxlock_cache_misses_total Lookups each cache could not answer since start-up.",
        "# TYPE ctxlock_cache_misses_total counter",
    ]
    out += [f'ctxlock_cache_misses_total{{cache="{_label(n)}"}} {i.misses}' for n, i in counting.items()]
    out += [
        "# HELP ctxlock_cache_hit_ratio Hits over lookups since start-up, per cache and over all counting caches.",
        "# TYPE ctxlock_cache_hit_ratio gauge",
    ]
    hits = misses = 0
    for n, i in counting.items():
        assert i.hits is not None and i.misses is not None
        hits, misses = hits + i.hits, misses + i.misses
        if i.hits + i.misses:
            out.append(f'ctxlock_cache_hit_ratio{{cache="{_label(n)}"}} {i.hits / (i.hits + i.misses):.6f}')
    if hits + misses:
        out.append(f'ctxlock_cache_hit_ratio{{cache="all"}} {hits / (hits + misses):.6f}')
    return out


def otel_lines(stats: StreamStats) -> list[str]:
    """`server.otel_endpoint`'s spans: exported, dropped by reason (each reason listed, 0 included), and pending."""
    out = [
        "# HELP ctxlock_otel_spans_exported_total Record spans the OTLP endpoint took.",
        "# TYPE ctxlock_otel_spans_exported_total counter",
        f"ctxlock_otel_spans_exported_total {stats.exported}",
        "# HELP ctxlock_otel_spans_dropped_total Record spans not sent, by reason (queue_full, build_failed, "
        "export_failed, shutdown).",
        "# TYPE ctxlock_otel_spans_dropped_total counter",
    ]
    out += [f'ctxlock_otel_spans_dropped_total{{reason="{r}"}} {n}' for r, n in sorted(stats.dropped.items())]
    out += [
        "# HELP ctxlock_otel_spans_pending Record spans queued, being built or being sent.",
        "# TYPE ctxlock_otel_spans_pending gauge",
        f"ctxlock_otel_spans_pending {stats.pending}",
    ]
    return out
