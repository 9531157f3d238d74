"""Spans sent as records are made (`ctxlock serve` with `server.otel_endpoint`, docs/telemetry.md): a bounded queue
of span builders, one thread that builds each span and hands it to the SDK's BatchSpanProcessor, which sends
batches with the SDK's OTLP/HTTP exporter.

Nothing here waits on the network in the caller's thread: `submit` puts a builder on the queue or, when the queue is
full, counts the span as dropped and returns. Every span is accounted for, exactly once, as exported or dropped
with a reason: `queue_full` (submitted while the queue was full), `build_failed` (its builder raised),
`export_failed` (the endpoint did not take its batch, after the exporter's own retries within its timeout) or
`shutdown` (still unsent when `close` ran out of time). The builder thread hands the processor no more spans than
its queue holds, so the processor never drops one uncounted (its queue drops silently when full:
https://opentelemetry.io/docs/specs/otel/trace/sdk/#batching-processor)."""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxlock.errors import TelemetryError
from ctxlock.telemetry._export import sdk_spans
from ctxlock.telemetry._spans import SpanSpec

log = logging.getLogger("ctxlock.telemetry")
REASONS = ("queue_full", "build_failed", "export_failed", "shutdown")
_QUIET_SECONDS = 10.0  # one log line per reason at most this often (the counts are exact in `stats`)


@dataclass(frozen=True)
class StreamStats:
    """What became of the spans submitted so far: exported, dropped by reason, and still queued or in flight."""

    endpoint: str
    exported: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    pending: int = 0

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


class SpanStream:
    """One span per `submit`, built on this stream's thread and sent in batches to `endpoint` (OTLP/HTTP)."""

    def __init__(self, endpoint: str, *, version: str, timeout: float = 10.0, queue_size: int = 2048) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
        except ImportError:
            raise TelemetryError(
                "the OpenTelemetry SDK and its OTLP/HTTP exporter are not installed",
                path="server.otel_endpoint",
                hint="pip install 'ctxlock[otel]'",
            ) from None
        self.endpoint = endpoint
        self._version = version
        self._queue_size = queue_size
        self._lock = threading.Condition()
        self._exported = 0
        self._dropped = dict.fromkeys(REASONS, 0)
        self._handed = 0  # spans given to the processor
        self._settled = 0  # of those, exported or failed
        self._submitted = 0
        self._last_log: dict[str, float] = {}
        self._builders: queue.Queue[Callable[[], SpanSpec] | None] = queue.Queue(maxsize=queue_size)
        self._closing = False
        self._deadline = math.inf  # `close`'s: past it, the thread stops waiting for room
        self._closed = False  # after close: the thread, if still running, counts nothing more
        stream = self

        class _Counted(SpanExporter):
            """The SDK's OTLP/HTTP exporter, its results counted."""

            def __init__(self) -> None:
                self.inner = OTLPSpanExporter(endpoint=endpoint, timeout=timeout)
                self.stopped = False

            def export(self, spans: Sequence[Any]) -> Any:
                try:
                    result = self.inner.export(spans)
                except Exception:  # the exporter's own failure: its batch is dropped, and counted
                    result = SpanExportResult.FAILURE
                stream._settle(len(spans), ok=result is SpanExportResult.SUCCESS)
                return result

            def shutdown(self) -> None:
                if not self.stopped:  # ends its retries: a batch still being sent fails (counted)
                    self.stopped = True
                    self.inner.shutdown()

            def force_flush(self, timeout_millis: int = 30000) -> bool:
                return True

        self._exporter = _Counted()
        self._processor = BatchSpanProcessor(
            self._exporter, max_queue_size=queue_size, max_export_batch_size=min(queue_size, 512)
        )
        self._thread = threading.Thread(target=self._run, name="ctxlock-otel", daemon=True)
        self._thread.start()

    # -- the caller's side: never waits

    def submit(self, build: Callable[[], SpanSpec]) -> bool:
        """Queue one span's builder; False (and the span counted as dropped) when the queue is full or closed."""
        with self._lock:
            self._submitted += 1
            if not self._closing:
                try:
                    self._builders.put_nowait(build)
                    return True
                except queue.Full:
                    pass
            self._drop("queue_full" if not self._closing else "shutdown", 1)
            return False

    def stats(self) -> StreamStats:
        with self._lock:
            accounted = self._exported + sum(self._dropped.values())
            return StreamStats(self.endpoint, self._exported, dict(self._dropped), self._submitted - accounted)

    def close(self, timeout: float = 10.0) -> StreamStats:
        """Build what is queued and send everything (the processor's flush), within about `timeout` seconds; what is
        still unsent then is dropped as `shutdown`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closing = True
            self._deadline = deadline
            self._lock.notify_all()
        with contextlib.suppress(queue.Full):  # the thread is draining the queue: a slot frees soon
            self._builders.put(None, timeout=max(0.0, deadline - time.monotonic()))
        self._thread.join(max(0.0, deadline - time.monotonic()))
        # The processor's shutdown sends what it holds (its flush); past the deadline the exporter is stopped, which
        # ends its retries, and what is left fails at once.
        closer = threading.Thread(target=self._processor.shutdown, name="ctxlock-otel-close", daemon=True)
        closer.start()
        closer.join(max(0.0, deadline - time.monotonic()))
        if closer.is_alive():
            self._exporter.shutdown()
            closer.join(1.0)
        with self._lock:
            self._closed = True
            left = self._submitted - self._exported - sum(self._dropped.values())
            if left > 0:
                self._drop("shutdown", left)
        return self.stats()

    # -- the builder thread

    def _run(self) -> None:
        while True:
            build = self._builders.get()
            if build is None:
                return
            with self._lock:  # room in the processor's queue, or `close` out of time
                while self._handed - self._settled >= self._queue_size and time.monotonic() < self._deadline:
                    self._lock.wait(0.5)
                if self._handed - self._settled >= self._queue_size:
                    continue  # closed, the processor still full: counted as `shutdown` by close
            try:
                (span,) = sdk_spans([build()], version=self._version)
            except Exception:  # a record that cannot be a span: counted and logged, the server unaffected
                log.exception("OpenTelemetry: a span could not be built; it is dropped")
                with self._lock:
                    if not self._closed:
                        self._drop("build_failed", 1, quiet=True)
                continue
            with self._lock:
                if self._closed:
                    return
                self._handed += 1
            self._processor.on_end(span)

    def _settle(self, n: int, *, ok: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._settled += n
            if ok:
                self._exported += n
            else:
                self._drop("export_failed", n)
            self._lock.notify_all()

    def _drop(self, reason: str, n: int, *, quiet: bool = False) -> None:
        """Count `n` dropped spans (the lock held) and say so in the log, at most once per reason in a while."""
        self._dropped[reason] += n
        now = time.monotonic()
        if quiet or now - self._last_log.get(reason, -_QUIET_SECONDS) < _QUIET_SECONDS:
            return
        self._last_log[reason] = now
        log.warning(
            "OpenTelemetry: %d span(s) dropped (%s) for %s; %d dropped since start",
            n,
            reason.replace("_", " "),
            self.endpoint,
            sum(self._dropped.values()),
        )
