"""`ctxlock serve --workers 2` (ctxlock.server.workers): a socket per worker process (SO_REUSEPORT), so that
connections opened at once spread over the workers; SIGTERM drains every worker; a dead worker is started again; a
busy port is refused in one line; no worker outlives the supervisor; SIGKILL of every process during a recording
load loses no answered record. Real processes, real HTTP on loopback."""

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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from ctxlock.records._store import Store
from serve_server import SRC, assert_answered_records_stored, client, free_port, recording_load, terminate, write_config

PID = re.compile(r'^ctxlock_worker\{pid="(\d+)"\} 1$', re.M)


@contextmanager
def supervisor(cfg: Path, port: int, log: Path) -> Iterator[subprocess.Popen]:
    """`ctxlock serve --workers 2` in its own session (so that a test can kill the whole group), ready."""
    out = open(log, "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxlock", "serve", "--config", str(cfg), "--port", str(port), "--workers", "2"],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, log)
        yield proc
    finally:
        terminate(proc, group=True, timeout=60)
        out.close()


def wait_ready(url: str, proc: subprocess.Popen, log: Path, *, pids: int = 2) -> None:
    """Until `pids` distinct workers answer /metrics (each loads the models before it listens)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text('utf-8', 'replace')[-2000:]}")
        try:
            if len(worker_pids(url, 24)) >= pids:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the workers did not start within 240 s")


def worker_pids(url: str, connections: int) -> set[int]:
    """The workers that answer `connections` new connections opened at once (each its own client)."""

    def one(_: int) -> int:
        with client(url) as c:
            r = c.get("/metrics")
            r.raise_for_status()
            m = PID.search(r.text)
            assert m is not None, r.text[:400]
            return int(m.group(1))

    with ThreadPoolExecutor(connections) as pool:
        return set(pool.map(one, range(connections)))


def children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(x) for x in (task / "children").read_text().split()}
    return out


def test_connections_opened_at_once_reach_both_workers_and_sigterm_drains_both(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cfg = write_config(tmp_path, store=store, pool_size=8)  # room for every request on either worker: none queues
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with supervisor(cfg, port, tmp_path / "server.log") as proc:
        # 24 connections opened together: with one shared socket they could all land on one process; with a socket
        # per worker the kernel hashes each connection to one (all 24 on one worker: 2 ** -23).
        pids = worker_pids(url, 24)
        assert len(pids) == 2 and pids <= children(proc.pid)
        answers: list[Any] = []

        def send(k: int) -> None:
            model = "bomb" if k % 2 == 0 else "nemo"
            request = json.dumps({"messages": [{"role": "user", "content": f"hi {k}"}]})
            with client(url) as c:
                r = c.post(f"/v1/render?model={model}&record=1", content=request)
                answers.append((model, r.status_code, r.json()))

        # The bombs render to their 2 s deadline: in flight on both workers when SIGTERM reaches the supervisor.
        threads = [threading.Thread(target=send, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        time.sleep(0.8)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        assert proc.wait(timeout=60) == 0
    assert len(answers) == 6
    for model, status, body in answers:
        assert (status, body.get("type")) == ((422, "TemplateLimitError") if model == "bomb" else (200, None))
    with Store(store) as s:
        ids = {r["id"] for r in s.list_records(limit=100)}
    assert {b["record_id"] for m, _, b in answers if m == "nemo"} <= ids and len(ids) == 6
    for pid in pids:  # both workers exited
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_a_killed_worker_is_started_again(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, store=tmp_path / "store")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with supervisor(cfg, port, tmp_path / "server.log") as proc:
        before = worker_pids(url, 24)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        wait_ready(url, proc, tmp_path / "server.log")
        after = worker_pids(url, 24)
        assert len(after) == 2 and victim not in after and (after - before)
        assert "worker" in (tmp_path / "server.log").read_text("utf-8") and proc.poll() is None


def test_a_busy_port_is_refused_in_one_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, store=tmp_path / "store")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "ctxlock", "serve", "--config", str(cfg), "--port", str(port), "--workers", "2"],
            env={**os.environ, "PYTHONPATH": SRC},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 1
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and f"cannot bind 127.0.0.1:{port}" in lines[0] and "Traceback" not in r.stderr


def test_no_worker_outlives_a_killed_supervisor(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, store=tmp_path / "store")
    port = free_port()
    with supervisor(cfg, port, tmp_path / "server.log") as proc:
        workers = children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in workers):
            time.sleep(0.2)
        assert not any(Path(f"/proc/{p}").exists() for p in workers)
        with socket.socket() as probe:  # and the port is free again
            probe.bind(("127.0.0.1", port))


def test_sigkill_of_every_process_during_a_recording_load_loses_no_answered_record(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cfg = write_config(tmp_path, store=store, pool_size=2, queue_depth=16)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    received: list[str] = []
    stop = threading.Event()
    with supervisor(cfg, port, tmp_path / "server.log") as proc:
        threads = [threading.Thread(target=recording_load, args=(url, k, stop, received)) for k in range(8)]
        for t in threads:
            t.start()
        time.sleep(4.0)
        os.killpg(proc.pid, signal.SIGKILL)  # the supervisor and both workers at once
        proc.wait(timeout=30)
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert_answered_records_stored(store, received)


def test_port_0_gives_every_worker_the_same_free_port(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, store=tmp_path / "store")
    log = tmp_path / "server.log"
    out = open(log, "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxlock", "serve", "--config", str(cfg), "--port", "0", "--workers", "2"],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline:
            m = re.search(r"listen on port (\d+)", log.read_text("utf-8", "replace"))
            port = int(m.group(1)) if m else None
            time.sleep(0.2)
        assert port is not None
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, log)
        assert len(worker_pids(url, 24)) == 2
    finally:
        terminate(proc, group=True, timeout=60)
        out.close()


def test_a_model_that_does_not_load_in_the_workers_is_one_line(tmp_path: Path) -> None:
    """The supervisor loads no model itself: a worker's start-up failure reaches it as one line, and it stops."""
    cfg = tmp_path / "ctxlock.toml"
    cfg.write_text(f'[models.x]\nspec = "{tmp_path / "no-such-model"}"\n', "utf-8")
    r = subprocess.run(
        [sys.executable, "-m", "ctxlock", "serve", "--config", str(cfg), "--port", str(free_port()), "--workers", "2"],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "could not start: ArtifactNotFoundError" in lines[0] and "no-such-model" in lines[0]
