"""Span descriptions -> real OpenTelemetry SDK spans, sent to an OTLP/HTTP endpoint (the SDK's own exporter) or
written as OTLP JSON (the SDK's protobuf encoding, printed in the OTLP JSON mapping: hex trace and span ids,
integer enums, 64-bit integers as strings: https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding).
The SDK is the `otel` extra; it is imported here, on first use."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from typing import Any

from ctxlock.errors import TelemetryError
from ctxlock.telemetry import _conventions as c
from ctxlock.telemetry._spans import SpanSpec

_MISSING = "pip install 'ctxlock[otel]'"


def _sdk() -> Any:
    try:
        from opentelemetry.sdk import trace
    except ImportError:
        raise TelemetryError("the OpenTelemetry SDK is not installed", path="--otel", hint=_MISSING) from None
    return trace


def sdk_spans(specs: Sequence[SpanSpec], *, version: str) -> list[Any]:
    """The spans as the SDK's ReadableSpans: resource `service.name=ctxlock` with the conventions' version and
    schema URL, scope `ctxlock`, kind CLIENT, the descriptions' ids and times. Nothing is read from the OTEL_*
    environment (no resource detectors, no attribute limits): the spans are the records' and nothing else."""
    trace = _sdk()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.trace import SpanKind

    ids: list[tuple[int, int]] = [(s.trace_id, s.span_id) for s in specs]
    cursor: Iterator[tuple[int, int]] = iter(ids)
    current: list[tuple[int, int]] = []

    class _Ids(IdGenerator):
        def generate_trace_id(self) -> int:
            current[:] = [next(cursor)]
            return current[0][0]

        def generate_span_id(self) -> int:
            return current[0][1]

    resource = Resource(
        {"service.name": "ctxlock", "service.version": version, c.SEMCONV_ATTR: c.SEMCONV_VERSION},
        schema_url=c.SCHEMA_URL,
    )
    unset = trace.SpanLimits.UNSET
    limits = trace.SpanLimits(
        max_attributes=unset, max_span_attributes=unset, max_attribute_length=unset, max_span_attribute_length=unset
    )
    provider = trace.TracerProvider(resource=resource, id_generator=_Ids(), span_limits=limits)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(c.SCOPE, version, schema_url=c.SCHEMA_URL)
    for spec in specs:
        span = tracer.start_span(spec.name, kind=SpanKind.CLIENT, attributes=spec.attributes, start_time=spec.start_ns)
        span.end(end_time=spec.end_ns)
    provider.shutdown()
    return list(memory.get_finished_spans())


def send(spans: Sequence[Any], endpoint: str, *, timeout: float = 10.0) -> None:
    """POST the spans to an OTLP/HTTP traces endpoint (`http://host:4318/v1/traces`) with the SDK's exporter."""
    _sdk()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise TelemetryError("the OTLP/HTTP exporter is not installed", path="--endpoint", hint=_MISSING) from None
    from opentelemetry.sdk.trace.export import SpanExportResult

    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout)
    try:
        result = exporter.export(list(spans))
    finally:
        exporter.shutdown()
    if result is not SpanExportResult.SUCCESS:
        raise TelemetryError(
            "the endpoint did not take the spans", path=f"--endpoint {endpoint}", hint="is an OTLP/HTTP receiver there?"
        )


def otlp_json(spans: Sequence[Any]) -> dict[str, Any]:
    """The spans as one ExportTraceServiceRequest in the OTLP JSON mapping."""
    try:
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    except ImportError:
        raise TelemetryError("the OTLP encoder is not installed", path="--out", hint=_MISSING) from None
    doc: dict[str, Any] = MessageToDict(encode_spans(list(spans)), use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:  # protobuf's JSON mapping writes bytes as base64; OTLP JSON wants hex
                        span[key] = base64.b64decode(span[key]).hex()
    return doc
