"""Execution records as OpenTelemetry GenAI spans, and traces back as sessions (docs/telemetry.md).

`record_span` turns one record into a `SpanSpec` (semantic conventions 1.44.0: `chat {model}`, gen_ai.request.model,
gen_ai.usage.*, and with `content` the opt-in message attributes; plus ctxlock's digests, per-part counts,
neutralized control strings and cache buster). `sdk_spans` makes them real OpenTelemetry SDK spans, `send` posts
them to an OTLP/HTTP endpoint and `otlp_json` prints them as OTLP JSON (the SDK is the `otel` extra).
`read_traces` reads OTLP JSON or a Langfuse observation export back as the turns of a session."""

from ctxlock.telemetry._conventions import GEN_AI_NAMES, SCHEMA_URL, SEMCONV_PACKAGE, SEMCONV_VERSION
from ctxlock.telemetry._export import otlp_json, sdk_spans, send
from ctxlock.telemetry._import import MAX_SPANS, Imported, Turn, read_traces
from ctxlock.telemetry._spans import CacheFigures, SpanSpec, content_attributes, ids_sha256, record_span, trace_id_for

__all__ = [
    "GEN_AI_NAMES",
    "MAX_SPANS",
    "SCHEMA_URL",
    "SEMCONV_PACKAGE",
    "SEMCONV_VERSION",
    "CacheFigures",
    "Imported",
    "SpanSpec",
    "Turn",
    "content_attributes",
    "ids_sha256",
    "otlp_json",
    "read_traces",
    "record_span",
    "sdk_spans",
    "send",
    "trace_id_for",
]
