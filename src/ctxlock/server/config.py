"""`ctxlock.toml`: the models a server offers (by name), its record store, its limits and its bearer tokens.

    [server]
    store = "/var/lib/ctxlock"        # record store for ?record=1 and /v1/records (default: none, records off)
    tokens = ["s3cret"]               # bearer tokens; CTXLOCK_SERVE_TOKENS (comma-separated) adds more
    allow_named_templates = false     # a request's `chat_template` may name one of the model's templates
    prices = "prices.json"            # a price table (LiteLLM's format) for /v1/cache-report's costs
    fallback_model = "nemo"           # off unless set: a peer route's body naming an unknown model gets this one
    otel_endpoint = "http://127.0.0.1:4318/v1/traces"  # off unless set (needs store): each record as a GenAI span
    otel_content = false              # true: the spans carry the messages, the request and the record
    otel_provider = "vllm"            # optional: the cache attributes under this provider's rule
    otel_timeout_seconds = 10.0       # one export's allowance, the exporter's retries included
    otel_queue_size = 2048            # spans waiting to be built or sent; one more is dropped (and counted)

    [limits]
    max_body_bytes = 1048576
    render_deadline_seconds = 10.0
    pool_size = 2
    queue_depth = 32
    max_render_chars = 4000000
    requests_per_second = 0           # per bearer token (per client address without tokens); 0: no rate limit
    burst = 0                         # requests a token may send at once above the rate (0: the rate, at least 1)
    max_header_bytes = 16384          # request line + headers of one request; over it: 431 and the connection closed
    max_header_count = 100            # header fields of one request; over it: 431
    header_timeout_seconds = 10.0     # from a request's first byte (or the connection's start) to its headers' end: 408
    body_timeout_seconds = 10.0       # a body's allowance, extended 1 s per min_body_rate bytes received: else 408
    min_body_rate = 1024              # bytes per second
    keep_alive_seconds = 5.0          # an idle keep-alive connection is closed after this
    max_connections = 256             # open connections per process; one more gets 503 (JSON) and is closed
    max_connections_per_ip = 64       # open connections per client address per process; one more gets 503
    view_page_tokens = 2000           # token chips one viewer page builds (?page=N for the others)

    [models.nemo]                     # the name requests use; the first model is the default
    spec = "mistral-nemo"             # a built-in name, a model directory, a .gguf file or org/name@revision
    template = "chat.jinja"           # optional: replaces the model's own template
    templates = { tools = "t.jinja" } # optional: named templates (only with allow_named_templates)
    max_model_len = 131072            # optional: what /tokenize reports as max_model_len
    budget = { max_input_tokens = 8000 }  # optional: the BudgetPolicy /v1/fit uses

A request names a model by its configured name only: never a path, a template body or a Python object.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxlock.economics._promptcache import PROVIDERS as CACHE_PROVIDERS
from ctxlock.errors import ServeConfigError

TOKENS_ENV = "CTXLOCK_SERVE_TOKENS"
DEFAULT_NAME = "default"

_LIMIT_KEYS = {
    "max_body_bytes": (int, 1 << 20),
    "render_deadline_seconds": (float, 10.0),
    "pool_size": (int, 2),
    "queue_depth": (int, 32),
    "max_render_chars": (int, 4_000_000),
    "requests_per_second": (float, 0.0),
    "burst": (int, 0),
    "max_header_bytes": (int, 16384),
    "max_header_count": (int, 100),
    "header_timeout_seconds": (float, 10.0),
    "body_timeout_seconds": (float, 10.0),
    "min_body_rate": (int, 1024),
    "keep_alive_seconds": (float, 5.0),
    "max_connections": (int, 256),
    "max_connections_per_ip": (int, 64),
    "view_page_tokens": (int, 2000),
}
_MODEL_KEYS = {"spec", "template", "templates", "max_model_len", "budget"}
_OTEL_KEYS = {"otel_endpoint", "otel_content", "otel_provider", "otel_timeout_seconds", "otel_queue_size"}
_SERVER_KEYS = {"store", "tokens", "allow_named_templates", "prices", "fallback_model", *_OTEL_KEYS}
_MAX_QUEUE = 1 << 20


@dataclass(frozen=True)
class OtelConfig:
    """`server.otel_*`: where each new record goes as an OpenTelemetry GenAI span (docs/telemetry.md)."""

    endpoint: str
    content: bool = False
    provider: str | None = None
    timeout_seconds: float = 10.0
    queue_size: int = 2048


@dataclass(frozen=True)
class ModelConfig:
    name: str
    spec: str | None  # None: the embedded default model
    template: str | None = None
    templates: tuple[tuple[str, str], ...] = ()
    max_model_len: int | None = None
    budget: tuple[tuple[str, Any], ...] | None = None


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20
    render_deadline_seconds: float = 10.0
    pool_size: int = 2
    queue_depth: int = 32
    max_render_chars: int = 4_000_000
    requests_per_second: float = 0.0  # per token; 0: no rate limit
    burst: int = 0  # 0: the rate (at least 1)
    # The wire (server/wire.py and docs/serve-limits.md): enforced per connection before the app sees a request.
    max_header_bytes: int = 16384
    max_header_count: int = 100
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 10.0
    min_body_rate: int = 1024  # bytes/s
    keep_alive_seconds: float = 5.0
    max_connections: int = 256  # per process
    max_connections_per_ip: int = 64  # per process
    view_page_tokens: int = 2000  # the record viewer's page


@dataclass(frozen=True)
class ServeConfig:
    models: tuple[ModelConfig, ...] = (ModelConfig(DEFAULT_NAME, None),)
    limits: Limits = field(default_factory=Limits)
    store: str | None = None
    tokens: tuple[str, ...] = ()
    allow_named_templates: bool = False
    prices: str | None = None  # a price table file (LiteLLM's format) for /v1/cache-report
    fallback_model: str | None = None  # the served name answering a peer route's unknown `model` (None: 404)
    otel: OtelConfig | None = None  # None: no spans
    source: str = "(defaults)"

    @property
    def default_model(self) -> str:
        return self.models[0].name


def _unknown(table: dict[str, Any], known: set[str], where: str) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise ServeConfigError(
            f"unknown key {extra[0]!r}", path=f"{where}.{extra[0]}", hint=f"known keys: {', '.join(sorted(known))}"
        )


def _typed(value: Any, kind: type, where: str) -> Any:
    ok = isinstance(value, kind) and not isinstance(value, bool) if kind is not bool else isinstance(value, bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ServeConfigError(f"expected {kind.__name__}, got {type(value).__name__}", path=where)
    return value


def _limits(table: Any) -> Limits:
    if not isinstance(table, dict):
        raise ServeConfigError("[limits] is a table", path="limits")
    _unknown(table, set(_LIMIT_KEYS), "limits")
    values = {}
    for key, (kind, _default) in _LIMIT_KEYS.items():
        if key in table:
            v = _typed(table[key], kind, f"limits.{key}")
            if (v <= 0 and key not in ("queue_depth", "requests_per_second", "burst")) or v < 0 or v != v:
                raise ServeConfigError(f"{key} must be positive", path=f"limits.{key}")
            if v == float("inf"):
                raise ServeConfigError(f"{key} must be finite", path=f"limits.{key}")
            values[key] = v
    return Limits(**values)


def _model(name: str, table: Any, base: Path) -> ModelConfig:
    where = f"models.{name}"
    if not isinstance(table, dict):
        raise ServeConfigError("a model is a table", path=where)
    _unknown(table, _MODEL_KEYS, where)
    if "spec" not in table:
        raise ServeConfigError("a model needs a spec", path=f"{where}.spec", hint='e.g. spec = "mistral-nemo"')
    spec = _typed(table["spec"], str, f"{where}.spec")
    template = table.get("template")
    if template is not None:
        template = str(base / _typed(template, str, f"{where}.template"))
    named = table.get("templates", {})
    if not isinstance(named, dict):
        raise ServeConfigError("templates is a table of name = file", path=f"{where}.templates")
    templates = tuple((k, str(base / _typed(v, str, f"{where}.templates.{k}"))) for k, v in sorted(named.items()))
    mml = table.get("max_model_len")
    if mml is not None:
        mml = _typed(mml, int, f"{where}.max_model_len")
    budget = table.get("budget")
    if budget is not None and not isinstance(budget, dict):
        raise ServeConfigError("budget is a table (a BudgetPolicy)", path=f"{where}.budget")
    # A spec that names a file is taken relative to the config file; a built-in name or org/name stays as written.
    if (base / spec).exists():
        spec = str(base / spec)
    return ModelConfig(name, spec, template, templates, mml, tuple(sorted(budget.items())) if budget else None)


def _otel(server: dict[str, Any], store: str | None) -> OtelConfig | None:
    """`server.otel_*`, each key checked by name; the other keys need `otel_endpoint`, and it needs `store`."""
    given = sorted(_OTEL_KEYS & set(server))
    if "otel_endpoint" not in server:
        if given:
            raise ServeConfigError(
                f"{given[0]} has no effect without server.otel_endpoint",
                path=f"server.{given[0]}",
                hint='set otel_endpoint = "http://HOST:4318/v1/traces", or remove the key',
            )
        return None
    endpoint = _typed(server["otel_endpoint"], str, "server.otel_endpoint")
    scheme, sep, rest = endpoint.partition("://")
    host = rest.split("/", 1)[0]
    if not sep or scheme not in ("http", "https") or not host or any(ch.isspace() for ch in endpoint):
        raise ServeConfigError(
            f"otel_endpoint {endpoint!r} is not an http(s) URL",
            path="server.otel_endpoint",
            hint="an OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces",
        )
    if store is None:
        raise ServeConfigError(
            "otel_endpoint needs a record store: the server exports the records it keeps",
            path="server.otel_endpoint",
            hint="set server.store",
        )
    provider = server.get("otel_provider")
    if provider is not None and _typed(provider, str, "server.otel_provider") not in CACHE_PROVIDERS:
        raise ServeConfigError(
            f"unknown provider {provider!r}", path="server.otel_provider", hint=" or ".join(CACHE_PROVIDERS)
        )
    timeout = _typed(server.get("otel_timeout_seconds", 10.0), float, "server.otel_timeout_seconds")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ServeConfigError("otel_timeout_seconds must be positive and finite", path="server.otel_timeout_seconds")
    size = _typed(server.get("otel_queue_size", 2048), int, "server.otel_queue_size")
    if not 1 <= size <= _MAX_QUEUE:
        raise ServeConfigError(f"otel_queue_size is 1..{_MAX_QUEUE}", path="server.otel_queue_size")
    content = _typed(server.get("otel_content", False), bool, "server.otel_content")
    return OtelConfig(endpoint, content, provider, timeout, size)


def env_tokens() -> tuple[str, ...]:
    raw = os.environ.get(TOKENS_ENV, "")
    return tuple(t.strip() for t in raw.split(",") if t.strip())


def parse_config(data: dict[str, Any], *, base: Path, source: str) -> ServeConfig:
    """A ServeConfig from a parsed ctxlock.toml (relative paths are taken from `base`), with the env tokens added."""
    _unknown(data, {"server", "limits", "models"}, "$")
    server = data.get("server", {})
    if not isinstance(server, dict):
        raise ServeConfigError("[server] is a table", path="server")
    _unknown(server, _SERVER_KEYS, "server")
    tokens = server.get("tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
        raise ServeConfigError("tokens is a list of non-empty strings", path="server.tokens")
    store = server.get("store")
    if store is not None:
        store = str(base / _typed(store, str, "server.store"))
    prices = server.get("prices")
    if prices is not None:
        prices = str(base / _typed(prices, str, "server.prices"))
    models_table = data.get("models", {})
    if not isinstance(models_table, dict):
        raise ServeConfigError("[models] is a table of name = model", path="models")
    models = tuple(_model(n, t, base) for n, t in models_table.items()) or ServeConfig().models
    fallback = server.get("fallback_model")
    if fallback is not None and _typed(fallback, str, "server.fallback_model") not in {m.name for m in models}:
        raise ServeConfigError(
            f"fallback_model {fallback!r} is not a configured model",
            path="server.fallback_model",
            hint=f"name one of: {', '.join(m.name for m in models)}",
        )
    return ServeConfig(
        models=models,
        limits=_limits(data.get("limits", {})),
        store=store,
        tokens=tuple(tokens) + env_tokens(),
        allow_named_templates=_typed(server.get("allow_named_templates", False), bool, "server.allow_named_templates"),
        prices=prices,
        fallback_model=fallback,
        otel=_otel(server, store),
        source=source,
    )


def load_config(path: str | Path | None) -> ServeConfig:
    """The config at `path` (None: the defaults: the embedded default model, no store, the env tokens only)."""
    if path is None:
        return parse_config({}, base=Path.cwd(), source="(defaults)")
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text("utf-8"))
    except OSError as exc:
        raise ServeConfigError(f"cannot read the config: {exc.strerror}", path=str(p)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ServeConfigError(f"not valid TOML: {exc}", path=str(p)) from None
    return parse_config(data, base=p.resolve().parent, source=str(p))
