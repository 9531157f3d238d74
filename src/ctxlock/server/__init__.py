"""`ctxlock serve`: the pipeline as an HTTP service (Starlette on uvicorn). An edge layer beside `ctxlock.cli`: the
core never imports it. `create_app(config)` builds the ASGI application; `load_config(path)` reads ctxlock.toml."""

from __future__ import annotations

from ctxlock.server.app import create_app, factory
from ctxlock.server.config import ServeConfig, load_config

__all__ = ["ServeConfig", "create_app", "factory", "load_config"]
