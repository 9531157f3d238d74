"""`ctxlock serve`'s start and stop: SIGTERM drains the in-flight requests and their records are committed; the
defaults (no config: the embedded model, loopback); a non-loopback bind without a token is refused."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from ctxlock.records._store import Store
from serve_server import (
    QWEN_TEMPLATE,
    SRC,
    assert_answered_records_stored,
    client,
    free_port,
    recording_load,
    running,
    write_config,
)


def test_sigterm_drains_in_flight_requests_and_commits_their_records(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cfg = write_config(tmp_path, store=store)
    port = free_port()
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxlock", "serve", "--config", str(cfg), "--port", str(port)],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        request = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
        answers: list[Any] = []

        def send(model: str) -> None:
            with client(url) as c:
                r = c.post(f"/v1/render?model={model}&record=1", content=request)
                answers.append((model, r.status_code, r.json()))

        # The bomb's render runs to its 2 s deadline: it is in flight when SIGTERM arrives.
        threads = [threading.Thread(target=send, args=(m,)) for m in ("bomb", "nemo")]
        for t in threads:
            t.start()
        time.sleep(0.8)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        # uvicorn re-raises the SIGTERM it caught once it has shut down: the exit status is the signal's.
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    by_model = {m: (status, body) for m, status, body in answers}
    assert by_model["bomb"][0] == 422 and by_model["bomb"][1]["type"] == "TemplateLimitError"
    assert by_model["nemo"][0] == 200
    with Store(store) as s:
        ids = [r["id"] for r in s.list_records(limit=10)]
    # Both in-flight requests were recorded (the failed render too), the answered id among them.
    assert len(ids) == 2 and by_model["nemo"][1]["record_id"] in ids


def serve_exits(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ctxlock serve ARGS` run to its exit (a refusal at start-up)."""
    env = dict(os.environ) if env is None else env
    return subprocess.run(
        [sys.executable, "-m", "ctxlock", "serve", *args],
        env={**env, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_public_bind_without_a_token_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CTXLOCK_SERVE_TOKENS"}
    out = serve_exits("--host", "0.0.0.0", "--port", str(free_port()), env=env)
    assert out.returncode == 1
    assert out.stderr.startswith("error: ServeConfigError: --host: --host 0.0.0.0 is not a loopback address")
    assert "Traceback" not in out.stderr


def test_a_bad_config_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "ctxlock.toml"
    cfg.write_text('[models.x]\nspec = "mistral-nemo"\ncolour = "red"\n', "utf-8")
    out = serve_exits("--config", str(cfg))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "error: ServeConfigError: models.x.colour: unknown key 'colour' "
        "(known keys: budget, max_model_len, spec, template, templates)"
    ]


def test_a_full_queue_is_503_with_retry_after(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, store=tmp_path / "store", pool_size=1, queue_depth=0)
    with running(cfg) as url, client(url) as c:
        busy = threading.Thread(
            target=lambda: c.post("/tokenize", json={"model": "bomb", "messages": [{"role": "user", "content": "x"}]})
        )
        busy.start()
        time.sleep(0.5)  # the bomb holds the one worker for its 2 s deadline
        with client(url) as other:
            r = other.post("/tokenize", json={"model": "nemo", "prompt": "hi"})
        busy.join()
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["type"] == "OverloadedError"
        # The worker is free again once the bomb has ended.
        assert c.post("/tokenize", json={"model": "nemo", "prompt": "hi"}).json()["tokens"] == [1, 8101]


def test_named_templates_when_the_config_allows_them(tmp_path: Path) -> None:
    cfg = tmp_path / "ctxlock.toml"
    cfg.write_text(
        "[server]\nallow_named_templates = true\n\n"
        f'[models.nemo]\nspec = "mistral-nemo"\ntemplates = {{ chatml = "{QWEN_TEMPLATE}" }}\n',
        "utf-8",
    )
    hi = {"messages": [{"role": "user", "content": "hi"}]}
    with running(cfg) as url, client(url, token=None) as c:
        named = c.post("/apply-template", json={**hi, "chat_template": "chatml"}).json()
        assert named["prompt"].startswith("<|im_start|>system\nYou are Qwen")
        assert c.post("/apply-template", json=hi).json() == {"prompt": "[INST]hi[/INST]"}  # BOS text cut, as llama.cpp
        for bad in ("{{ messages }}", "default", str(QWEN_TEMPLATE), "../chatml"):
            r = c.post("/tokenize", json={**hi, "chat_template": bad})
            assert r.status_code == 400 and r.json()["path"] == "$.chat_template"
        r = c.post("/tokenize", json={**hi, "chat_template_kwargs": {"chat_template": "chatml"}})
        assert r.status_code == 400


def test_sigkill_during_a_recording_load_loses_no_answered_record(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cfg = write_config(tmp_path, store=store, pool_size=2, queue_depth=16)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxlock", "serve", "--config", str(cfg), "--port", str(port)],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    received: list[str] = []
    stop = threading.Event()
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)

        threads = [threading.Thread(target=recording_load, args=(url, k, stop, received)) for k in range(6)]
        for t in threads:
            t.start()
        time.sleep(4.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        stop.set()
        for t in threads:
            t.join(timeout=60)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_answered_records_stored(store, received)


def test_without_a_config_it_serves_the_embedded_default_on_loopback(tmp_path: Path) -> None:
    empty = tmp_path / "ctxlock.toml"  # an empty config is the defaults, as no config is
    empty.write_text("", "utf-8")
    env = {"CTXLOCK_SERVE_TOKENS": ""}
    with running(empty, env=env) as url, client(url, token=None) as c:
        assert url.startswith("http://127.0.0.1:")
        models = c.get("/v1/models").json()["data"]
        assert [(m["id"], m["model"], m["default"]) for m in models] == [("default", "mistral-nemo", True)]
        r = c.get("/v1/records")
        assert r.status_code == 404 and r.json()["path"] == "server.store"


def test_over_the_token_rate_is_429_with_retry_after_per_token(tmp_path: Path) -> None:
    cfg = tmp_path / "ctxlock.toml"
    cfg.write_text(
        '[server]\ntokens = ["alpha", "beta"]\n\n[limits]\nrequests_per_second = 0.2\nburst = 3\n\n'
        '[models.nemo]\nspec = "mistral-nemo"\n',
        "utf-8",
    )
    hi = {"prompt": "hi"}
    with running(cfg, env={"CTXLOCK_SERVE_TOKENS": ""}) as url, client(url, token="alpha") as a:
        assert [a.post("/tokenize", json=hi).status_code for _ in range(3)] == [200, 200, 200]  # the burst
        r = a.post("/tokenize", json=hi)
        assert r.status_code == 429 and r.json()["type"] == "RateLimitedError"
        assert set(r.json()) == {"type", "message", "path", "hint"} and r.json()["path"] == "limits.requests_per_second"
        assert 1 <= int(r.headers["retry-after"]) <= 5  # one request refills in 1 / 0.2 = 5 s
        assert a.get("/v1/models").status_code == 429  # every protected route counts against the token
        with client(url, token="beta") as b:  # another token has its own bucket
            assert b.post("/tokenize", json=hi).status_code == 200
        with client(url, token="wrong") as bad:  # a bad token is 401, not counted against anyone
            assert bad.post("/tokenize", json=hi).status_code == 401
        assert a.get("/healthz").status_code == 200  # /healthz is open: never limited
        metrics = a.get("/metrics")
        assert metrics.status_code == 429


def test_a_burst_of_concurrent_clients_past_the_queue_gets_503_at_once(tmp_path: Path) -> None:
    # One worker and two queue places: of 12 clients released together, 3 are admitted (bombs: they hold the worker
    # for the 2 s deadline each) and the other 9 are refused at once with 503 and Retry-After, on their own sockets.
    cfg = write_config(tmp_path, store=tmp_path / "store", pool_size=1, queue_depth=2)
    bomb = {"model": "bomb", "messages": [{"role": "user", "content": "x"}]}
    with running(cfg) as url:
        gate = threading.Barrier(12)
        results: list[tuple[int, str, str | None, float]] = []

        def one() -> None:
            with client(url) as c:
                c.get("/v1/models")  # the connection is open before the burst
                gate.wait()
                start = time.monotonic()
                r = c.post("/tokenize", json=bomb)
                took = time.monotonic() - start
                results.append((r.status_code, r.json()["type"], r.headers.get("retry-after"), took))

        threads = [threading.Thread(target=one) for _ in range(12)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        with client(url) as c:  # meanwhile the event loop answers: /healthz and /metrics do not queue
            assert c.get("/healthz").status_code == 200
            admitted_now = re.search(r"^ctxlock_pool_admitted (\d+)$", c.get("/metrics").text, re.M)
            assert admitted_now is not None and 1 <= int(admitted_now.group(1)) <= 3  # never past size + depth
        for t in threads:
            t.join(timeout=60)
    refused = [r for r in results if r[0] == 503 and r[1] == "OverloadedError"]
    assert len(results) == 12 and len(refused) == 9
    assert all(r[2] == "1" and r[3] < 1.5 for r in refused)  # Retry-After, answered without waiting for a worker
    # The admitted three ran or waited for the worker: the bomb ends at its deadline (422), the ones queued behind
    # it end at theirs (503 DeadlineError, waiting counts against the deadline) or run their own bomb to it.
    admitted = [r for r in results if r not in refused]
    assert all((r[0], r[1]) in {(503, "DeadlineError"), (422, "TemplateLimitError")} for r in admitted), admitted
    assert any(r[1] == "TemplateLimitError" for r in results)


def test_a_busy_port_with_one_process_is_one_line_before_anything_is_announced(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = serve_exits("--port", str(port))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: ServeConfigError: --port: cannot bind 127.0.0.1:{port}: Address already in use "
        "(stop the other server or choose another --port)"
    ]
