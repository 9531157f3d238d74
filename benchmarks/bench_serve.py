"""`ctxlock serve` under load: the real server (a subprocess, uvicorn on a loopback port) driven by a real HTTP
client at 1, 8 and 32 concurrent keep-alive connections, each run bounded by a request count and a time limit. The
client: `wrk` (`--client wrk`, the default; Debian's package, `make bench-tools` installs it), one thread in C with a
Lua script that stops at the request count: it takes a few percent of a core, so that on a 2-core machine the
second server process has a core to use; or `--client python` (the standard library's `http.client`, one thread per
connection: it takes most of a core itself at these rates). Reports requests/s, p50 and p99 latency and errors,
beside the in-process `Model.encode` median of the same request (the work without HTTP) and the fixed HTTP cost (a `GET
/healthz` round trip at 1 connection: the same client, server and loop, no work), for 1 and 2 worker processes.

    PYTHONPATH=src python benchmarks/bench_serve.py [--requests 400] [--seconds 20] [--workers 1 2] [--client wrk]
    PYTHONPATH=src python benchmarks/bench_serve.py --breakdown     # where one request's time goes, in-process
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

import ctxlock

SRC = str(Path(ctxlock.__file__).resolve().parents[1])
REQUEST = {
    "model": "nemo",
    "messages": [
        {"role": "system", "content": "You are a concise science assistant."},
        {"role": "user", "content": "Why is the sky blue? Answer in one sentence, and ignore [INST] in this text."},
    ],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(workers: int, root: Path, pool: int = 2) -> tuple[subprocess.Popen, str]:
    cfg = root / "ctxlock.toml"
    cfg.write_text(f'[limits]\npool_size = {pool}\nqueue_depth = 64\n\n[models.nemo]\nspec = "mistral-nemo"\n', "utf-8")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ctxlock",
            "serve",
            "--config",
            str(cfg),
            "--port",
            str(port),
            "--workers",
            f"{workers}",
        ],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                # Every worker process loads the model: wait until requests are answered quickly.
                # (a new connection each: the kernel spreads them over the worker processes)
                for _ in range(8 * workers):
                    httpx.post(url + "/tokenize", json=REQUEST, timeout=30)
                return proc, url
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the server did not start")


_WRK_SCRIPT = """
local ffi = require("ffi")
ffi.cdef[[ typedef struct { long tv_sec; long tv_nsec; } ctxlock_ts; int clock_gettime(int, ctxlock_ts *); ]]
local ts = ffi.new("ctxlock_ts")
local function now() ffi.C.clock_gettime(1, ts); return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9 end
wrk.method = "%(method)s"
wrk.headers["Content-Type"] = "application/json"
%(body)s
local threads = {}
setup = function(thread) table.insert(threads, thread) end
init = function(args) started = now(); left = %(total)d; elapsed = 0 end
response = function(status, headers, body)
  left = left - 1
  elapsed = now() - started
  if left <= 0 then wrk.thread:stop() end
end
done = function(summary, latency, requests)
  local e = summary.errors
  local fmt = '{"requests": %%d, "seconds": %%.6f, "p50_us": %%d, "p99_us": %%d, "errors": %%d}'
  io.write(string.format('\\nRESULT ' .. fmt .. '\\n', summary.requests, threads[1]:get("elapsed"),
    latency:percentile(50), latency:percentile(99), e.connect + e.read + e.write + e.timeout + e.status))
end
"""


def load_wrk(url: str, connections: int, total: int, seconds: float, *, path: str = "/tokenize") -> dict[str, float]:
    """One run of `wrk` (one thread, `connections` keep-alive connections), stopped at `total` answers or `seconds`
    (requests/s: answers over the time from the thread's start to its last answer, taken in the script); errors:
    connect, read, write and timeout errors and answers other than 2xx/3xx."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed: `make bench-tools` (Debian's wrk), or run with --client python")
    method = "GET" if path == "/healthz" else "POST"
    body = "" if method == "GET" else "wrk.body = " + json.dumps(json.dumps(REQUEST))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(_WRK_SCRIPT % {"method": method, "body": body, "total": total})
    try:
        out = subprocess.run(
            [wrk, "-t1", f"-c{connections}", f"-d{max(1, int(seconds))}s", "-s", fh.name, url + path],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
    finally:
        os.unlink(fh.name)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"wrk gave no result: {out.stdout[-400:]} {out.stderr[-400:]}")
    r = json.loads(line.removeprefix("RESULT "))
    return {
        "requests": r["requests"],
        "rps": r["requests"] / r["seconds"],  # from the first request to the last answer (wrk's own clock: to -d)
        "p50_ms": r["p50_us"] / 1000,
        "p99_ms": r["p99_us"] / 1000,
        "errors": r["errors"],
    }


def load(url: str, connections: int, total: int, seconds: float, *, path: str = "/tokenize") -> dict[str, float]:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    left = [total]
    stop_at = time.monotonic() + seconds
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(REQUEST).encode()
    method = "GET" if path == "/healthz" else "POST"
    headers = {"Content-Type": "application/json"}

    def client() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            while time.monotonic() < stop_at:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                t = time.perf_counter()
                try:
                    conn.request(method, path, body=body if method == "POST" else None, headers=headers)
                    r = conn.getresponse()
                    r.read()
                    bad = r.status != 200
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = http.client.HTTPConnection(host, int(port), timeout=30)
                    bad = True
                dt = time.perf_counter() - t
                with lock:
                    latencies.append(dt)
                    errors[0] += bad
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(connections)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    latencies.sort()
    return {
        "requests": len(latencies),
        "rps": len(latencies) / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "errors": errors[0],
    }


def in_process_median(rounds: int = 200) -> float:
    m = ctxlock.load("mistral-nemo")
    m.warm_up()
    request = {k: v for k, v in REQUEST.items() if k != "model"}
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        m.encode(request)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def breakdown(rounds: int = 300) -> dict[str, float]:
    """Where one `POST /tokenize` goes, in this process (no sockets): the body parse, the work on this (main) thread,
    the same work through the server's pool (the hop to a worker thread, where the render's deadline is a line
    tracer instead of the main thread's SIGALRM timer), the JSON answer, and the whole ASGI app for /tokenize and
    for /healthz. Each round times every step once (interleaved); medians in ms."""
    import asyncio  # the breakdown only: the load runs above do not need these

    from starlette.responses import JSONResponse

    from ctxlock.server import shapes
    from ctxlock.server.app import create_app, object_body
    from ctxlock.server.config import parse_config

    edge = create_app(parse_config({"models": {"nemo": {"spec": "mistral-nemo"}}}, base=Path("."), source="bench"))
    svc = edge.service  # type: ignore[attr-defined]
    sm = svc.models.get("nemo")
    body = json.dumps(REQUEST).encode()
    work = lambda: shapes.vllm_tokenize(sm, REQUEST, allow_named=False)  # noqa: E731
    answer = work()

    def scope(path: str, method: str) -> dict:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        return {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
                "headers": headers, "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 1),
                "client": ("127.0.0.1", 2), "root_path": ""}  # fmt: skip

    async def asgi(path: str, method: str) -> None:
        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(_message: dict) -> None:
            return None

        await edge(scope(path, method), receive, send)

    async def sync(fn: Any) -> Any:
        return fn()

    # The event loop runs on the main thread, as uvicorn's does; "the main thread" is the loop's own thread here.
    steps = {
        "parse the body": lambda: sync(lambda: object_body(body)),
        "work on the main thread": lambda: sync(work),
        "work through the pool": lambda: svc.pool.run(work),
        "JSON answer": lambda: sync(lambda: JSONResponse(answer).body),
        "ASGI app, POST /tokenize": lambda: asgi("/tokenize", "POST"),
        "ASGI app, GET /healthz": lambda: asgi("/healthz", "GET"),
    }
    times: dict[str, list[float]] = {k: [] for k in steps}

    async def measure() -> None:
        for _ in range(rounds):
            for name, fn in steps.items():
                t = time.perf_counter()
                await fn()
                times[name].append(time.perf_counter() - t)

    asyncio.run(measure())
    return {k: 1000 * statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400, help="requests per run (each run also stops at --seconds)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--connections", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--pool", type=int, default=2, help="limits.pool_size of each worker process")
    ap.add_argument("--breakdown", action="store_true", help="only the in-process breakdown of one request")
    ap.add_argument("--client", choices=["wrk", "python"], default="wrk", help="the load client (module docstring)")
    args = ap.parse_args()
    if args.breakdown:
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for name, ms in breakdown().items():
            print(f"{name:<28} {ms:8.3f} ms")
        return
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    encode_ms = in_process_median()
    print(f"in-process Model.encode median: {encode_ms:.3f} ms (same request, warm)")
    run = load_wrk if args.client == "wrk" else load
    print(f"client: {args.client}")
    results = []
    fixed: dict[int, float] = {}
    for workers in args.workers:
        with tempfile.TemporaryDirectory() as tmp:
            proc, url = start(workers, Path(tmp), args.pool)
            try:
                h = run(url, 1, args.requests, args.seconds, path="/healthz")
                fixed[workers] = h["p50_ms"]
                print(f"workers {workers}  GET /healthz at 1 connection (fixed HTTP cost): p50 {h['p50_ms']:.3f} ms")
                for n in args.connections:
                    r = run(url, n, args.requests, args.seconds)
                    results.append({"workers": workers, "connections": n, **r})
                    print(
                        f"workers {workers}  connections {n:>2}  {r['requests']:>5} requests  {r['rps']:8.1f} req/s  "
                        f"p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  errors {r['errors']}"
                    )
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    by = {(r["workers"], r["connections"]): r for r in results}
    for w, cost in fixed.items():
        one = by.get((w, 1))
        if one is not None:
            bound = 2 * encode_ms + cost
            verdict = "met" if one["p50_ms"] <= bound else "NOT met"
            print(
                f"goal, workers {w}: p50 at 1 connection {one['p50_ms']:.3f} ms <= 2 x {encode_ms:.3f} + {cost:.3f} "
                f"= {bound:.3f} ms: {verdict}"
            )
    for n in args.connections:
        if (1, n) in by and (2, n) in by:
            ratio = by[(2, n)]["rps"] / by[(1, n)]["rps"]
            verdict = "met" if ratio >= 1.6 else "NOT met"
            print(f"goal, {n} connections: 2 workers / 1 worker = {ratio:.2f}x (>= 1.6x: {verdict})")
    print(json.dumps({"encode_ms": encode_ms, "fixed_ms": fixed, "runs": results}))


if __name__ == "__main__":
    main()
