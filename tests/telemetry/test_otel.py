"""`ctxlock export --otel` and `import --otel` (docs/telemetry.md): the real OpenTelemetry SDK and OTLP/HTTP exporter
sending to a loopback receiver that decodes with opentelemetry-proto, the attribute names checked against the pinned
semantic-conventions package, the round trip export -> import -> cache-report, Langfuse observations, and hostile
trace files."""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.semconv.schemas import Schemas
from opentelemetry.semconv.version import __version__ as semconv_package_version

from cli_runner import run_main
from ctxlock.economics import parse_usage
from ctxlock.errors import TelemetryError
from ctxlock.telemetry import GEN_AI_NAMES, SCHEMA_URL, SEMCONV_PACKAGE, SEMCONV_VERSION, read_traces
from hypothesis_profiles import examples

TURNS = [
    [{"role": "system", "content": "You are terse. <bos>"}, {"role": "user", "content": "Why is the sky blue?"}],
    [
        {"role": "system", "content": "You are terse. <bos>"},
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "Rayleigh scattering."},
        {"role": "user", "content": "And sunsets?"},
    ],
]


def ok(argv: list[str]) -> tuple[str, str]:
    code, out, err = run_main(argv)
    assert code == 0, err
    return out, err


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """A store with two book records, a minute apart, and their ids in turn order."""
    tmp = tmp_path_factory.mktemp("otel")
    store = tmp / "store"
    for n, messages in enumerate(TURNS):
        (tmp / f"t{n}.json").write_text(json.dumps({"messages": messages}), "utf-8")
        ok(["render", str(tmp / f"t{n}.json"), "--model", "book", "--record", "--store", str(store), "--now",
            f"2026-01-01T10:0{n}:00Z"])  # fmt: skip
    listed = json.loads(ok(["records", "list", "--json", "--store", str(store)])[0])
    return tmp, store, [r["id"] for r in sorted(listed, key=lambda r: r["input_tokens"])]  # the second turn is longer


def test_attribute_names_are_the_pinned_conventions() -> None:
    names = {v for k, v in vars(gen_ai_attributes).items() if k.startswith("GEN_AI_") and isinstance(v, str)}
    assert set(GEN_AI_NAMES) <= names, set(GEN_AI_NAMES) - names
    assert semconv_package_version == "0.66b2" and SEMCONV_PACKAGE.endswith("0.66b2")
    assert Schemas(SCHEMA_URL).value.endswith(f"/{SEMCONV_VERSION}")
    assert gen_ai_attributes.GenAiOperationNameValues.CHAT.value == "chat"


class _Receiver(BaseHTTPRequestHandler):
    bodies: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _attrs(pairs: Any) -> dict[str, Any]:
    out = {}
    for kv in pairs:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = (
            [getattr(x, x.WhichOneof("value")) for x in v.array_value.values]
            if kind == "array_value"
            else (getattr(v, kind))
        )
    return out


def test_endpoint_gets_genai_spans_without_content(session: tuple[Path, Path, list[str]]) -> None:
    _, store, ids = session
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1/traces"
        ok(["export", "--otel", *ids, "--store", str(store), "--provider", "vllm", "--model", "book",
            "--endpoint", url])  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    ((path, ctype, body),) = _Receiver.bodies
    assert (path, ctype) == ("/v1/traces", "application/x-protobuf")
    assert b"sky" not in body and b"terse" not in body  # no message text leaves without --content
    request = ExportTraceServiceRequest.FromString(body)
    (rs,) = request.resource_spans
    assert _attrs(rs.resource.attributes)["ctxlock.semconv.version"] == SEMCONV_VERSION
    (ss,) = rs.scope_spans
    assert ss.scope.name == "ctxlock" and ss.schema_url == SCHEMA_URL
    spans = list(ss.spans)
    assert [s.name for s in spans] == ["chat book", "chat book"]
    assert {s.kind for s in spans} == {3}  # SPAN_KIND_CLIENT
    assert len({s.trace_id for s in spans}) == 1
    first, second = (_attrs(s.attributes) for s in spans)
    g = gen_ai_attributes
    assert first[g.GEN_AI_OPERATION_NAME] == "chat" and first[g.GEN_AI_PROVIDER_NAME] == "vllm"
    assert first[g.GEN_AI_REQUEST_MODEL] == "book"
    records = [json.loads(ok(["records", "show", i, "--store", str(store)])[0]) for i in ids]
    assert [first[g.GEN_AI_USAGE_INPUT_TOKENS], second[g.GEN_AI_USAGE_INPUT_TOKENS]] == [
        len(r["input_ids"]) for r in records
    ]
    # cache-report's figures for the same records (vLLM blocks of 16): the second turn reads the shared prefix
    report = json.loads(ok(["cache-report", "--records", *ids, "--store", str(store), "--provider", "vllm",
                            "--model", "book", "--json"])[0])  # fmt: skip
    assert [a[g.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] for a in (first, second)] == [
        t["cache_read"] for t in report["turns"]
    ]
    assert second[g.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] > 0
    assert first["ctxlock.template.sha256"] == records[0]["template"]["sha256"]
    assert sum(first["ctxlock.count.tokens"]) == len(records[0]["input_ids"])
    assert "messages[1]" in first["ctxlock.count.parts"]
    assert "<bos>" in first["ctxlock.neutralized.tokens"]
    for name in (g.GEN_AI_INPUT_MESSAGES, g.GEN_AI_SYSTEM_INSTRUCTIONS, "ctxlock.request", "ctxlock.record"):
        assert name not in first


def test_round_trip_gives_the_same_cache_report(session: tuple[Path, Path, list[str]]) -> None:
    tmp, store, ids = session
    spans, session_file = tmp / "spans.json", tmp / "session.jsonl"
    ok(["export", "--otel", *ids, "--store", str(store), "--content", "--out", str(spans)])
    _, err = ok(["import", "--otel", str(spans), "--out", str(session_file), "--store", str(tmp / "elsewhere")])
    assert "2 exact request(s)" in err and "2 record(s) stored" in err
    common = ["--provider", "vllm", "--model", "book", "--json"]
    imported = ok(["cache-report", str(session_file), *common])[0]
    direct = ok(["cache-report", "--records", *ids, "--store", str(store), *common])[0]
    assert imported == direct
    # The records the spans carried are the same records (same ids) in the other store.
    listed = json.loads(ok(["records", "list", "--json", "--store", str(tmp / "elsewhere")])[0])
    assert sorted(r["id"] for r in listed) == sorted(ids)
    # Without ctxlock.request, the conventions' messages alone rebuild the same OpenAI requests.
    doc = json.loads(spans.read_text("utf-8"))
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        span["attributes"] = [a for a in span["attributes"] if a["key"] not in ("ctxlock.request", "ctxlock.record")]
    rebuilt = read_traces(json.dumps(doc).encode(), "spans.json")
    assert [t.request for t in rebuilt.turns] == [{"messages": m} for m in TURNS]
    assert {t.source for t in rebuilt.turns} == {"gen_ai.input.messages"} and all(t.whole for t in rebuilt.turns)


def _span(attrs: dict[str, Any], start: int = 1_767_261_600_000_000_000) -> dict[str, Any]:
    def value(v: Any) -> dict[str, Any]:
        return {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}

    return {
        "traceId": "ab" * 16,
        "spanId": "cd" * 8,
        "name": "chat gpt-4o",
        "startTimeUnixNano": str(start),
        "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()],
    }


def _doc(*spans: dict[str, Any]) -> bytes:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}).encode()


def test_a_providers_usage_and_messages_from_another_instrumentation() -> None:
    messages = [{"role": "user", "parts": [{"type": "text", "content": "hi"}, {"type": "blob", "content": "AA=="}]}]
    span = _span({
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "claude",
        "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be kind."}]),
        "gen_ai.input.messages": json.dumps(messages),
        "gen_ai.usage.input_tokens": 1200,
        "gen_ai.usage.cache_read.input_tokens": 1000,
        "gen_ai.usage.cache_creation.input_tokens": 100,
        "gen_ai.usage.output_tokens": 7,
    })  # fmt: skip
    embedding = _span({"gen_ai.operation.name": "embeddings"})
    got = read_traces(_doc(span, embedding), "t.json")
    (turn,) = got.turns
    assert turn.request == {"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]}
    assert not turn.whole and "blob" in turn.notes[0]
    usage = parse_usage(turn.usage)
    assert (usage.input, usage.cache_read, usage.cache_write, usage.output) == (100, 1000, 100, 7)
    assert turn.timestamp == "2026-01-01T10:00:00+00:00"
    assert "not a chat span" in got.skipped[0]


def test_langfuse_observations() -> None:
    obs = {
        "id": "o1",
        "traceId": "t1",
        "type": "GENERATION",
        "startTime": "2026-01-01T10:00:00.000Z",
        "model": "gpt-4o",
        "input": [{"role": "user", "content": "hi"}],
    }
    later = {**obs, "id": "o2", "startTime": "2026-01-01T10:05:00.000Z", "input": {"messages": [], "tools": []}}
    api = json.dumps({"data": [later, obs, {**obs, "id": "s", "type": "SPAN"}], "meta": {}}).encode()
    got = read_traces(api, "api.json")
    assert got.format == "langfuse" and [t.request for t in got.turns] == [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [], "tools": []},
    ]
    # The blob-storage export: JSON lines, snake_case, `input` as JSON text, UTC times without a zone.
    row = {"id": "o1", "trace_id": "t1", "type": "GENERATION", "start_time": "2026-01-01 10:00:00.000000",
           "input": json.dumps([{"role": "user", "content": "hi"}])}  # fmt: skip
    text = (json.dumps(row) + "\n" + json.dumps({**row, "id": "o2", "input": "plain words"}) + "\n").encode()
    got = read_traces(text, "obs.jsonl")
    assert [t.timestamp for t in got.turns] == ["2026-01-01T10:00:00+00:00"]
    assert got.skipped == ["obs.jsonl:2 $.input: plain text, not messages"]


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        (b"{", "bad.json column 2", "JSON"),
        (b'{"resourceSpans": {}}', "bad.json $.resourceSpans", "must be an array"),
        (_doc({**_span({"gen_ai.operation.name": "chat"}), "traceId": 7}), "spans[0].traceId", "hex string"),
        (
            _doc(_span({"gen_ai.operation.name": "chat", "gen_ai.input.messages": "[{"})),
            "gen_ai.input.messages]",
            "JSON",
        ),
        (
            _doc(
                _span(
                    {"gen_ai.operation.name": "chat", "gen_ai.input.messages": "[]", "gen_ai.usage.input_tokens": "x"}
                )
            ),
            "gen_ai.usage.input_tokens]",
            "count",
        ),
        (_doc(_span({"gen_ai.operation.name": "chat"}, start=-5)), "startTimeUnixNano", "out of range"),
        (b"[" * 5000 + b"]" * 5000, "bad.json", "deep"),
        (_doc(), "bad.json", "no chat span"),
    ],
)
def test_hostile_files_name_where(raw: bytes, path: str, message: str) -> None:
    with pytest.raises(TelemetryError) as info:
        read_traces(raw, "bad.json")
    assert path in str(info.value.path) and message.lower() in str(info.value).lower()


def test_several_traces_need_one_chosen() -> None:
    a = _span({"gen_ai.operation.name": "chat", "gen_ai.input.messages": "[]"})
    b = {**a, "traceId": "ef" * 16}
    with pytest.raises(TelemetryError, match="2 traces"):
        read_traces(_doc(a, b), "two.json")
    assert len(read_traces(_doc(a, b), "two.json", trace="ef" * 16).turns) == 1


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)
_SEED = json.loads(_doc(_span({"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(
    [{"role": "user", "parts": [{"type": "text", "content": "x"}]}])})))  # fmt: skip


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for k, v in items:
        out += _paths(v, (*at, k))
    return out


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_value_anywhere_is_a_session_or_a_telemetry_error(data: st.DataObject) -> None:
    doc = copy.deepcopy(_SEED)
    where = data.draw(st.sampled_from(_paths(doc)[1:]))
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = data.draw(_JSON)
    try:
        got = read_traces(json.dumps(doc).encode(), "fuzz.json")
    except TelemetryError as exc:
        assert exc.path and exc.path.startswith("fuzz.json")
    else:
        assert all(isinstance(t.request, dict) for t in got.turns)
