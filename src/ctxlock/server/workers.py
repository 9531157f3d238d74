"""`ctxlock serve --workers N` (N > 1): N worker processes, each listening on its own socket bound to the same
address with `SO_REUSEPORT`, so that the kernel spreads new connections over them by the connection's addresses.

Why not uvicorn's own `--workers`: its processes share one listening socket, and whichever process wakes first
accepts. A client that opens its keep-alive connections at once (a gateway, a load balancer's pool, `wrk -c 8`)
then often lands every connection on one process, and the others stay idle for as long as those connections live
(measured: 8 connections, all on one of 2 workers in 2 runs of 3). With a socket per process, the kernel hashes
each connection to a socket: every process gets its share from the first connection on.

The supervisor (this module's `serve_workers`, in the `ctxlock serve` process) listens on nothing itself:
- it first checks that the address is free (a plain bind, no `SO_REUSEPORT`), so that a port another server
  holds is refused with one line instead of being silently shared with it;
- it starts the workers with `spawn` (never `fork` after threads); each builds the app from the same config file,
  binds, and runs uvicorn on its socket, dying with the supervisor (`PR_SET_PDEATHSIG` on Linux);
- on SIGTERM or SIGINT it passes SIGTERM to every worker, which drains its in-flight requests (and commits their
  records) as a single-process server does, then waits for them;
- each worker reports "ready" once it listens and its models are loaded; one that fails before that (a model that
  does not load, the bind) sends its error as one line, and the whole server stops with it rather than restart in
  a loop; a worker that dies after it was ready is started again.

`SO_REUSEPORT` lets only processes of the same user join the group (Linux), and only while they listen.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import uvicorn

from ctxlock.core._forking import die_with_parent
from ctxlock.errors import ServeConfigError
from ctxlock.server.app import create_app
from ctxlock.server.config import Limits, load_config
from ctxlock.server.connection import uvicorn_options

_BACKLOG = 2048  # uvicorn's default


def _address(host: str, port: int) -> tuple[int, tuple[Any, ...]]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServeConfigError(
            f"cannot resolve --host {host}: {exc}", path="--host", hint="give an IP address"
        ) from None
    family, _, _, _, address = infos[0]
    return family, address


def check_free(host: str, port: int) -> int:
    """Refuse an address something already listens on (a plain bind: a `SO_REUSEPORT` bind would join that server's
    group and share its connections). Returns the port (`--port 0`: the free one the kernel chose, which every
    worker then binds, instead of each its own)."""
    family, address = _address(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            hint = "stop the other server or choose another --port"
            if exc.errno != errno.EADDRINUSE:
                hint = "choose another --host or --port"
            raise ServeConfigError(f"cannot bind {host}:{port}: {exc.strerror}", path="--port", hint=hint) from None
        return int(probe.getsockname()[1])


def listening_socket(host: str, port: int, *, reuse_port: bool = True) -> socket.socket:
    """A socket bound to host:port, listening: with `SO_REUSEPORT`, one worker's own; without, the one socket of a
    single-process server (bound before anything is announced, so that a busy port is one `ServeConfigError`)."""
    family, address = _address(host, port)
    # IPPROTO_TCP named, as uvicorn does: asyncio sets TCP_NODELAY on accepted connections only for a socket whose
    # proto says TCP (with proto 0, Nagle and delayed ACKs cost a keep-alive client ~40 ms per request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        if reuse_port:
            raise
        hint = "stop the other server or choose another --port"
        if exc.errno != errno.EADDRINUSE:
            hint = "choose another --host or --port"
        raise ServeConfigError(f"cannot bind {host}:{port}: {exc.strerror}", path="--port", hint=hint) from None
    sock.set_inheritable(False)
    return sock


def serve_socket(app: Any, sock: socket.socket, limits: Limits, grace: float) -> None:
    """uvicorn on `sock`, with the connection limits of `limits` (server/connection.py), until SIGTERM or SIGINT."""
    config = uvicorn.Config(app, timeout_graceful_shutdown=grace, **uvicorn_options(limits))
    uvicorn.Server(config).run(sockets=[sock])


def worker_main(config: str | None, host: str, port: int, grace: float, parent: int, report: Any) -> None:
    """One worker process: the app from the config file (the models loaded), its own socket, then "ready" on
    `report` (a pipe to the supervisor) and uvicorn until SIGTERM (which drains). A start-up failure is sent on
    `report` as one line instead (the supervisor says it), and the process exits 1 without a traceback."""
    die_with_parent(parent)
    try:
        # The models first, then the socket: the kernel hands connections only to listening sockets, so none waits
        # in the backlog of a worker still loading (a restarted one included).
        cfg = load_config(Path(config) if config else None)
        app = create_app(cfg)
        sock = listening_socket(host, port)
    except Exception as exc:  # every start-up failure becomes the supervisor's one line
        report.send(f"{type(exc).__name__}: {exc}".replace("\n", " "))
        report.close()
        sys.exit(1)
    report.send("ready")
    report.close()
    serve_socket(app, sock, cfg.limits, grace)


class _Worker:
    """A worker process as the supervisor sees it: the process, its report pipe, and whether it said "ready"."""

    def __init__(self, context: Any, k: int, args: tuple[Any, ...]) -> None:
        self.k = k
        receive, send = context.Pipe(duplex=False)
        self.proc = context.Process(target=worker_main, args=(*args, send), name=f"ctxlock-serve-{k}")
        self.proc.start()
        send.close()
        self.report = receive
        self.ready = False
        self.failure = ""

    def read(self) -> None:
        """Take what the worker reported ("ready", or its start-up failure), if anything."""
        with contextlib.suppress(EOFError, OSError):
            while not self.ready and self.report.poll():
                message = self.report.recv()
                if message == "ready":
                    self.ready = True
                else:
                    self.failure = str(message)


def serve_workers(
    config: Path | None, host: str, port: int, workers: int, grace: float, announce: Callable[[int], None] | None = None
) -> None:
    """Run `workers` worker processes on host:port until SIGTERM or SIGINT (module docstring); `announce(port)` is
    called once the address is known to be free."""
    chosen = check_free(host, port)
    if chosen != port:
        print(f"ctxlock serve: --port 0: the workers listen on port {chosen}", file=sys.stderr)
        port = chosen
    if announce is not None:
        announce(port)
    context = multiprocessing.get_context("spawn")
    args = (None if config is None else str(config.resolve()), host, port, grace, os.getpid())
    stopping = False

    def stop(_signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for w in pool:
            if w.proc.is_alive() and w.proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.proc.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    pool = [_Worker(context, k, args) for k in range(workers)]
    try:
        while not stopping:
            wait([w.proc.sentinel for w in pool] + [w.report for w in pool if not w.ready], timeout=0.5)
            for k, w in enumerate(pool):
                w.read()
                if stopping or w.proc.is_alive():
                    continue
                w.read()  # what it sent just before it exited
                if not w.ready:
                    stop(signal.SIGTERM, None)
                    why = w.failure or f"it exited with code {w.proc.exitcode}"
                    raise ServeConfigError(
                        f"worker process {k} could not start: {why}",
                        path="--workers",
                        hint="fix what the worker names (the config, a model that does not load, the port); "
                        "`--workers 1` starts the same app in this process",
                    )
                print(
                    f"ctxlock serve: worker {k} exited with code {w.proc.exitcode}; starting it again", file=sys.stderr
                )
                pool[k] = _Worker(context, k, args)
    finally:
        deadline = time.monotonic() + grace + 10.0
        for w in pool:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
        for s, handler in previous.items():
            signal.signal(s, handler)


__all__ = ["check_free", "listening_socket", "serve_socket", "serve_workers", "worker_main"]
