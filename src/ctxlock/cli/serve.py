"""`ctxlock serve`: the pipeline as an HTTP service (see `ctxlock.server` and the README section "Serving")."""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path
from typing import Annotated

import typer

from ctxlock.errors import ServeConfigError


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="ctxlock.toml: the models by name, the record store, the limits, the bearer tokens and where each "
            "record goes as an OpenTelemetry span (server.otel_endpoint, docs/telemetry.md). "
            "Without it: the embedded default model, no store, tokens only from $CTXLOCK_SERVE_TOKENS.",
        ),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind. The default is loopback only; another needs tokens.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8000,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="Worker processes, each loading the models with its own pool and its own listening socket on the "
            "address (SO_REUSEPORT: the kernel spreads connections over them); above 1, this process supervises.",
        ),
    ] = 1,
) -> None:
    """Serve tokenize, detokenize, apply-template, count and render over HTTP, in vLLM's, llama.cpp's,
    Anthropic's and OpenAI's shapes and ctxlock's own, until SIGTERM or Ctrl-C (in-flight requests finish first).
    Binding a non-loopback address without a bearer token configured is refused."""
    # Imported here: starlette and uvicorn are only for this command (and the [serve] extra).
    from ctxlock.server import config as server_config  # serve-only: starlette and uvicorn load for this command only

    cfg = server_config.load_config(config)
    if not _loopback(host) and not cfg.tokens:
        raise ServeConfigError(
            f"--host {host} is not a loopback address and no bearer token is configured",
            path="--host",
            hint="set server.tokens in the config or $CTXLOCK_SERVE_TOKENS, or bind 127.0.0.1",
        )
    if workers < 1:
        raise ServeConfigError("--workers is at least 1", path="--workers")
    try:
        import uvicorn  # noqa: F401  serve-only: is the [serve] extra installed?
    except ImportError:
        raise ServeConfigError(
            "uvicorn is not installed", path="ctxlock serve", hint="pip install 'ctxlock[serve]'"
        ) from None
    grace = cfg.limits.render_deadline_seconds + 5.0
    names = ", ".join(m.name for m in cfg.models)

    def announce(bound: int) -> None:
        print(f"ctxlock serve: {names} on http://{host}:{bound}", file=sys.stderr)

    if workers == 1:
        from ctxlock.server import create_app  # serve-only: starlette and uvicorn load for this command only
        from ctxlock.server.workers import listening_socket, serve_socket  # serve-only (as above)

        # Bound before anything is announced or loaded: a busy port is one ServeConfigError line, exit 1.
        sock = listening_socket(host, port, reuse_port=False)
        app = create_app(cfg)
        announce(int(sock.getsockname()[1]))
        serve_socket(app, sock, cfg.limits, grace)
        return
    # Each worker process has its own socket on the address (SO_REUSEPORT) and builds the app from the config file.
    from ctxlock.server.workers import serve_workers  # serve-only: starlette and uvicorn load for this command only

    serve_workers(config, host, port, workers, grace, announce)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
