"""`ctxlock serve`: the pipeline as an HTTP service (see `ctxlock.server` and the README section "Serving")."""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..errors import ServeConfigError


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
            help="ctxlock.toml: the models by name, the record store, the limits and the bearer tokens. "
            "Without it: the embedded default model, no store, tokens only from $CTXLOCK_SERVE_TOKENS.",
        ),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind. The default is loopback only; another needs tokens.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8000,
    workers: Annotated[
        int, typer.Option("--workers", help="Worker processes (each loads the models and has its own pool).")
    ] = 1,
) -> None:
    """Serve tokenize, detokenize, apply-template, count and render over HTTP, in vLLM's, llama.cpp's,
    Anthropic's and OpenAI's shapes and ctxlock's own, until SIGTERM or Ctrl-C (in-flight requests finish first).
    Binding a non-loopback address without a bearer token configured is refused."""
    # Imported here: starlette and uvicorn are only for this command (and the [serve] extra).
    from ..server import config as server_config  # serve-only: starlette and uvicorn load for this command only

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
        import uvicorn  # serve-only: starlette and uvicorn load for this command only
    except ImportError:
        raise ServeConfigError(
            "uvicorn is not installed", path="ctxlock serve", hint="pip install 'ctxlock[serve]'"
        ) from None
    grace = cfg.limits.render_deadline_seconds + 5.0
    print(f"ctxlock serve: {', '.join(m.name for m in cfg.models)} on http://{host}:{port}", file=sys.stderr)
    if workers == 1:
        from ..server import create_app  # serve-only: starlette and uvicorn load for this command only

        app = create_app(cfg)
        uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=grace)
        return
    # Each worker process has its own socket on the address (SO_REUSEPORT) and builds the app from the config file.
    from ..server.workers import serve_workers  # serve-only: starlette and uvicorn load for this command only

    serve_workers(config, host, port, workers, grace)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
