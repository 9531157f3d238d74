"""`server.otel_endpoint`: each record the server keeps (`POST /v1/render?record=1`) also goes to an OTLP/HTTP
endpoint as an OpenTelemetry GenAI span, the span `ctxlock export --otel` writes for it (docs/telemetry.md).

The request only queues the span's builder (`ctxlock.telemetry.SpanStream`): the counts, the cache figures and the
sending happen on the stream's thread, and a full queue or an endpoint that is down drops spans, counted in
`/metrics` and said in the log, never failing or delaying a request. The server knows no sessions: each record is a
trace of its own (turn 0), so its cache figures under `otel_provider` are a first turn's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctxlock import __version__
from ctxlock.economics._session import cache_report
from ctxlock.errors import CtxlockError, ServeConfigError, TelemetryError
from ctxlock.outside._json import Utf8Policy, decode_bytes, loads_strict
from ctxlock.records import ExecutionRecord
from ctxlock.records._replay import record_values, recorded_request
from ctxlock.server.config import OtelConfig
from ctxlock.server.models import ServedModel
from ctxlock.telemetry import (
    SEMCONV_VERSION,
    SpanSpec,
    SpanStream,
    StreamStats,
    cache_figures,
    part_counts,
    record_span,
    trace_id_for,
)


def otel_stream(config: OtelConfig | None) -> SpanStream | None:
    """The span stream of `server.otel_*`, or None; without the `otel` extra, a ServeConfigError naming it."""
    if config is None:
        return None
    try:
        return SpanStream(
            config.endpoint, version=__version__, timeout=config.timeout_seconds, queue_size=config.queue_size
        )
    except TelemetryError as exc:
        raise ServeConfigError(exc.message, path="server.otel_endpoint", hint=exc.hint) from None


def span_builder(
    sm: ServedModel, rid: str, record: ExecutionRecord, template: Any, config: OtelConfig | None
) -> Callable[[], SpanSpec]:
    """What builds the record's span on the stream's thread: `ctxlock export --otel`'s span for it, its per-part
    counts on the served model (the model and template it ran with), its cache figures as a first turn's."""
    assert config is not None

    def build() -> SpanSpec:
        with record_values(record):
            data = record.data
            raw, _ = recorded_request(record)
            try:  # a request that was not JSON was recorded too (with its error): its span has no counts
                text, _ = decode_bytes(raw, Utf8Policy.REPLACE)
                request: Any = loads_strict(text, f"record {rid[:12]} request", Utf8Policy.REPLACE, source=raw)
            except (ValueError, CtxlockError) as exc:
                request, counts = {}, None
                note: str | None = f"per-part counts not given: the request is not JSON ({exc})"
            else:
                counts, note = part_counts(record, request, sm.model, template)
            cache = None
            if config.provider is not None and isinstance(request, dict):
                run = cache_report(sm.model, [(request, None, None)], config.provider, options=sm.option_kwargs())
                (cache,) = cache_figures(run, config.provider)
            return record_span(
                rid,
                data,
                request if isinstance(request, dict) else {},
                turn=0,
                trace_id=trace_id_for([rid]),
                provider=config.provider or "ctxlock",
                counts=counts,
                count_note=note,
                cache=cache,
                content=config.content,
                record_text=record.body.decode("utf-8") if config.content else None,
            )

    return build


def otel_summary(stats: StreamStats) -> str:
    """The line the server prints when it stops: what was sent and what was dropped, by reason."""
    dropped = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in stats.dropped.items() if n)
    return (
        f"OpenTelemetry (semantic conventions {SEMCONV_VERSION}): {stats.exported} span(s) exported to "
        f"{stats.endpoint}, {stats.dropped_total} dropped" + (f" ({dropped})" if dropped else "")
    )
