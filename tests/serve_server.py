"""`ctxlock serve` for the tests, two ways, with a config that serves the embedded default model, a Qwen 2.5 HF
directory with its Jinja template, and a model whose configured template is a render bomb; bearer tokens on, a record
store, a 2 s deadline.

- `in_process(config)`: the server's ASGI app (`create_app`, the same one uvicorn runs: routes, the edge's tokens,
  body limit and rate, the render pool) called in this process through Starlette's `TestClient`. What the routes
  answer is proved here, without a process to start.
- `running(config)`: the real thing, uvicorn in a subprocess on a free loopback port, for what only a socket shows:
  the lifecycle, `--workers`, the connection and header limits, the browser."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from starlette.testclient import TestClient

import ctxlock
import fetched
from ctxlock.records._store import Store
from ctxlock.server.app import create_app
from ctxlock.server.config import load_config

TOKEN = "test-token-abc"
SRC = str(Path(ctxlock.__file__).resolve().parents[1])
TESTS = str(Path(__file__).resolve().parent)
QWEN_TEMPLATE = next(p for p in fetched.template_paths() if p.name == "Qwen-Qwen2.5-7B-Instruct.jinja")
BOMB = (
    "{%- for a in range(100000) %}{%- for b in range(100000) %}{%- set x = a * b %}{%- endfor %}{%- endfor %}"
    "{{ messages[0]['content'] }}\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(root: Path, *, store: Path, pool_size: int = 2, queue_depth: int = 8) -> Path:
    (root / "bomb.jinja").write_text(BOMB, "utf-8")
    cfg = root / "ctxlock.toml"
    cfg.write_text(
        f"""
[server]
store = "{store}"
tokens = ["{TOKEN}"]
allow_named_templates = false

[limits]
max_body_bytes = 262144
render_deadline_seconds = 2.0
pool_size = {pool_size}
queue_depth = {queue_depth}

[models.nemo]
spec = "mistral-nemo"
max_model_len = 131072
budget = {{ max_input_tokens = 64 }}

[models.qwen]
spec = "{fetched.hf_tokenizer_dir("qwen2")}"
template = "{QWEN_TEMPLATE}"
max_model_len = 32768

[models.bomb]
spec = "mistral-nemo"
template = "bomb.jinja"
""",
        "utf-8",
    )
    return cfg


@contextmanager
def running(config: Path, *, workers: int = 1, env: dict[str, str] | None = None) -> Iterator[str]:
    """A server on a free port: yields its base URL; SIGTERM at the end (and SIGKILL if it does not exit)."""
    port = free_port()
    log = open(config.parent / f"server-{port}.log", "wb")  # noqa: SIM115 (closed with the server)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxlock", "serve", "--config", str(config), "--port", str(port)]
        + (["--workers", str(workers)] if workers != 1 else []),
        env={**os.environ, "PYTHONPATH": SRC, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited: {log.name}")
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start within 180 s")
            time.sleep(0.3)
        yield url
    finally:
        terminate(proc)
        log.close()


def terminate(proc: subprocess.Popen, *, group: bool = False, timeout: float = 30) -> None:
    """SIGTERM a server still running, and SIGKILL it (its whole process group with `group`) if it does not exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait()


def recording_load(url: str, k: int, stop: threading.Event, received: list[str]) -> None:
    """One client of a recording load: distinct renders with ?record=1 until `stop` or until the server is gone;
    the id of every record the server answered with goes to `received`."""
    with client(url) as c:
        i = 0
        while not stop.is_set():
            body = json.dumps({"messages": [{"role": "user", "content": f"load {k} {i}"}]})
            i += 1
            try:
                r = c.post("/v1/render?model=nemo&record=1", content=body)
            except httpx.HTTPError:
                return  # the server is gone
            if r.status_code == 200:
                received.append(r.json()["record_id"])


def client(url: str, *, token: str | None = TOKEN) -> httpx.Client:
    return httpx.Client(base_url=url, headers=bearer(token), timeout=30)


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@contextmanager
def in_process(config: Path, *, token: str | None = TOKEN) -> Iterator[TestClient]:
    """The app `ctxlock serve --config CONFIG` runs, in this process (its lifespan entered and left, so the render
    pool is shut down at the end); a 500 comes back as a response, as it would over a socket."""
    app = create_app(load_config(config))
    with TestClient(app, headers=bearer(token), raise_server_exceptions=False) as c:
        yield c


def another_client(c: TestClient, *, token: str | None) -> TestClient:
    """A second in-process client of the same app with another bearer token (or none)."""
    return TestClient(c.app, headers=bearer(token), raise_server_exceptions=False)


def assert_answered_records_stored(store: Path, received: list[str]) -> None:
    """After a kill: every record id a client received is in the store, and the store passes integrity_check."""
    assert len(received) >= 5
    with Store(store) as s:
        stored = {r["id"] for r in s.list_records(limit=100000)}
    assert set(received) <= stored
    db = sqlite3.connect(store / "records.db")
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        db.close()
