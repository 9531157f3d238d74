"""`ctxlock serve` with `server.otel_endpoint` (docs/telemetry.md): a real server on loopback sends each record it
keeps as a GenAI span to a loopback OTLP/HTTP receiver, without content unless asked; with the receiver gone it
keeps answering and counts the dropped spans in /metrics and its log; a bad key is one typed error naming it, and a
server without the `otel` extra refuses to start."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as g

from ctxlock.errors import ServeConfigError
from ctxlock.server.config import parse_config
from otlp_receiver import attrs, receiver
from serve_server import in_process, running

QUESTIONS = ["Why is the sky blue?", "And sunsets?"]


def _config(root: Path, endpoint: str, extra: str = "") -> Path:
    cfg = root / "ctxlock.toml"
    cfg.write_text(
        f'[server]\nstore = "store"\notel_endpoint = "{endpoint}"\notel_provider = "vllm"\n'
        f'otel_timeout_seconds = 1.0\n{extra}\n[models.book]\nspec = "book"\n',
        "utf-8",
    )
    return cfg


def _until(check: object, what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _dropped(url: str) -> dict[str, int]:
    text = httpx.get(url + "/metrics").text
    return {m[1]: int(m[2]) for m in re.finditer(r'ctxlock_otel_spans_dropped_total\{reason="(\w+)"\} (\d+)', text)}


def test_records_become_spans_and_a_down_endpoint_drops_them_counted(tmp_path: Path) -> None:
    env = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # the SDK's batch delay (5 s by default), short for the test
    with receiver() as got:
        cfg = _config(tmp_path, got.url)
        server = running(cfg, env=env)
        url = server.__enter__()
        try:
            ids = []
            for q in QUESTIONS:
                r = httpx.post(url + "/v1/render?record=1", json={"messages": [{"role": "user", "content": q}]})
                assert r.status_code == 200, r.text
                ids.append(r.json()["record_id"])
            _until(lambda: len(got.spans()) == 2, "two spans")
        except BaseException:
            server.__exit__(*sys.exc_info())
            raise
    try:
        spans = got.spans()
        assert {p for p, _, _ in got.bodies} == {"/v1/traces"}
        assert not any(b"sky" in body or b"sunsets" in body for _, _, body in got.bodies)  # no content unless asked
        by_id = {attrs(s.attributes)["ctxlock.record.id"]: (s, attrs(s.attributes)) for s in spans}
        assert set(by_id) == set(ids)
        for rid in ids:
            span, a = by_id[rid]
            record = httpx.get(f"{url}/v1/records/{rid}").json()
            assert span.name == "chat book" and span.kind == 3  # SPAN_KIND_CLIENT
            assert a[g.GEN_AI_OPERATION_NAME] == "chat" and a[g.GEN_AI_PROVIDER_NAME] == "vllm"
            assert a[g.GEN_AI_USAGE_INPUT_TOKENS] == len(record["input_ids"])
            assert a["ctxlock.template.sha256"] == record["template"]["sha256"]
            assert (
                sum(a["ctxlock.count.tokens"]) == len(record["input_ids"]) and "messages[0]" in a["ctxlock.count.parts"]
            )
            assert a[g.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 0  # each record is a first turn: its own trace
            assert g.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS in a and a["ctxlock.cache.provider"] == "vllm"
            for name in (g.GEN_AI_INPUT_MESSAGES, "ctxlock.request", "ctxlock.record"):
                assert name not in a
        assert len({s.trace_id for s in spans}) == 2
        # The receiver is gone: the server keeps answering, and the spans it cannot send are dropped and counted.
        for q in QUESTIONS:
            r = httpx.post(url + "/v1/render?record=1", json={"messages": [{"role": "user", "content": q + "!"}]})
            assert r.status_code == 200, r.text
        _until(lambda: _dropped(url).get("export_failed") == 2, "two spans dropped")
        assert "ctxlock_otel_spans_exported_total 2" in httpx.get(url + "/metrics").text
    finally:
        server.__exit__(None, None, None)
    log = next(tmp_path.glob("server-*.log")).read_text("utf-8")
    assert "span(s) dropped (export failed)" in log
    assert f"2 span(s) exported to {got.url}, 2 dropped (2 export failed)" in log


def test_content_only_when_asked(tmp_path: Path) -> None:
    with receiver() as got:
        with in_process(_config(tmp_path, got.url, "otel_content = true"), token=None) as c:
            r = c.post("/v1/render?record=1", json={"messages": [{"role": "user", "content": QUESTIONS[0]}]})
            assert r.status_code == 200, r.text
        (span,) = got.spans()  # leaving the app flushed it
    a = attrs(span.attributes)
    assert json.loads(a[g.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": QUESTIONS[0]}]}
    ]
    assert json.loads(a["ctxlock.request"]) == {"messages": [{"role": "user", "content": QUESTIONS[0]}]}
    assert json.loads(a["ctxlock.record"])["input_ids"]


@pytest.mark.parametrize(
    ("server", "path", "message"),
    [
        ({"otel_content": True}, "server.otel_content", "without server.otel_endpoint"),
        ({"otel_endpoint": "localhost:4318"}, "server.otel_endpoint", "not an http(s) URL"),
        ({"otel_endpoint": "http://h:4318/v1/traces", "store": None}, "server.otel_endpoint", "record store"),
        ({"otel_endpoint": "http://h/v1/traces", "otel_provider": "acme"}, "server.otel_provider", "unknown"),
        ({"otel_endpoint": "http://h/v1/traces", "otel_content": "yes"}, "server.otel_content", "expected bool"),
        ({"otel_endpoint": "http://h/v1/traces", "otel_timeout_seconds": 0}, "server.otel_timeout_seconds", "positive"),
        ({"otel_endpoint": "http://h/v1/traces", "otel_queue_size": 0}, "server.otel_queue_size", "1.."),
    ],
)
def test_bad_values_name_the_key(server: dict[str, object], path: str, message: str) -> None:
    table = {k: v for k, v in {"store": "s", **server}.items() if v is not None}
    with pytest.raises(ServeConfigError) as info:
        parse_config({"server": table}, base=Path("."), source="t.toml")
    assert info.value.path == path and message in str(info.value)


def test_without_the_otel_extra_the_server_refuses_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ServeConfigError) as info, in_process(_config(tmp_path, "http://127.0.0.1:9/v1/traces")):
        pass
    assert info.value.path == "server.otel_endpoint" and "ctxlock[otel]" in str(info.value.hint)
