"""The HTTP edge, as one ASGI middleware around the routes: bearer tokens, the per-token rate limit (429), the body
byte limit (413 before a byte is parsed), per-route metrics, and the last word on errors (typed JSON, never a 500
page or a traceback)."""

from __future__ import annotations

import hmac
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from http import HTTPStatus
from typing import Any

from ctxlock.errors import (
    AuthError,
    BodyTooLargeError,
    CtxlockError,
    DeadlineError,
    HeadersTooLargeError,
    InternalServeError,
    OverloadedError,
    RateLimitedError,
    RecordNotFoundError,
    RequestError,
    RequestTimeoutError,
    RouteNotFoundError,
    ServeConfigError,
    TemplateNotFoundError,
)
from ctxlock.server.metrics import Metrics

log = logging.getLogger("ctxlock.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_ROUTES = frozenset({"/healthz"})
# Set in a request's scope by the connection protocol (connection.py) when it refused the request on the wire.
REFUSED = "ctxlock.refused"

# The HTTP status of each error type, most specific first (the first isinstance match wins).
STATUS: tuple[tuple[type[CtxlockError], int], ...] = (
    (AuthError, 401),
    (BodyTooLargeError, 413),
    (HeadersTooLargeError, 431),
    (RequestTimeoutError, 408),
    (RateLimitedError, 429),
    (OverloadedError, 503),
    (DeadlineError, 503),
    (RecordNotFoundError, 404),
    (TemplateNotFoundError, 404),
    (RequestError, 400),
    (ServeConfigError, 400),
    (TypeError, 400),  # OptionError is a TypeError too: an option the API does not take
)


def status_of(exc: CtxlockError) -> int:
    if isinstance(exc, RouteNotFoundError):
        return exc.status
    for kind, status in STATUS:
        if isinstance(exc, kind):
            return status
    return 422  # the request was well-formed but the pipeline could not process it (template, tokenizer, budget)


# The routes that answer errors in vLLM's shape (vLLM's own routes, whose clients read `error.message`).
VLLM_ERROR_ROUTES = frozenset({"/v1/chat/completions/render", "/v1/completions/render"})


def error_body(exc: CtxlockError, path: str | None = None) -> tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]:
    """The status, JSON body and headers of an error: ctxlock's `{type, message, path, hint}`, or vLLM's shape on
    the routes of `VLLM_ERROR_ROUTES` (`path` is the request's URL path)."""
    headers = []
    if isinstance(exc, OverloadedError):
        headers.append((b"retry-after", str(exc.retry_after).encode()))
    body = exc.to_dict()
    if isinstance(body.get("hint"), str):
        body["hint"] = server_hint(body["hint"])
    if path in VLLM_ERROR_ROUTES:
        return (*vllm_error(status_of(exc), body), headers)
    return status_of(exc), body, headers


def vllm_error(status: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """vLLM's error shape, `{"error": {message, type, param, code}}` (its ErrorResponse: the type a name such as
    `BadRequestError` or `NotFoundError`, the code the HTTP status), with ctxlock's `hint` kept in the object. A
    request the pipeline could not process (ctxlock's 422: a template's own failure) is 400, as vLLM answers a
    template error (vllm/entrypoints/serve/utils/error_response.py)."""
    if status == 422:
        status = 400
    name = "".join(HTTPStatus(status).phrase.split())
    kind = name if name.endswith("Error") else name + "Error"
    return status, {
        "error": {"message": body["message"], "type": kind, "param": body["path"], "code": status, "hint": body["hint"]}
    }


# Hints the library writes for Python callers that name a choice an HTTP client does not have (the server parses
# every body as strict UTF-8): the clause is dropped, the rest of the hint kept.
_PYTHON_ONLY = (", or parse with utf8='replace' to substitute U+FFFD", ", or parse with utf8='replace'")


def server_hint(hint: str) -> str:
    for clause in _PYTHON_ONLY:
        hint = hint.replace(clause, "")
    return hint


def as_ctxlock_error(exc: BaseException) -> CtxlockError:
    if isinstance(exc, CtxlockError):
        return exc
    log.exception("unexpected error while serving a request", exc_info=exc)
    return InternalServeError(
        f"unexpected {type(exc).__name__} while serving the request",
        path="server",
        hint="this is a ctxlock bug: the server log has the traceback; please report it with the request",
    )


async def send_json(send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def bearer_index(scope: Scope, tokens: tuple[bytes, ...]) -> int | None:
    """Which configured token the request holds (its index), or None: `Authorization: Bearer TOKEN` (OpenAI's SDK,
    vLLM, llama.cpp) or, when there is no Authorization header, `x-api-key: TOKEN` (Anthropic's SDK sends its key
    there: https://docs.anthropic.com/en/api/overview). The given token is compared in constant time against every
    configured one."""
    auth = api_key = None
    for name, value in scope.get("headers", ()):
        if name == b"authorization" and auth is None:
            auth = value
        elif name == b"x-api-key" and api_key is None:
            api_key = value
    if auth is not None:
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() != b"bearer":
            return None
    else:
        token = api_key or b""
    token = token.strip()
    if not token:
        return None
    found = None
    for k, t in enumerate(tokens):
        if hmac.compare_digest(token, t) and found is None:
            found = k
    return found


class RateLimiter:
    """A token bucket per key (a bearer token's index, or a client address when no tokens are configured): `rate`
    requests per second, up to `burst` at once. It runs on the event loop only (no lock). Each worker process keeps
    its own buckets, so with `--workers N` a token may send up to N times the rate. At most `max_keys` buckets are
    kept: past that, the buckets that have refilled are dropped (a full bucket is the same as none)."""

    def __init__(self, rate: float, burst: int, *, max_keys: int = 4096) -> None:
        self.rate = rate
        self.capacity = float(burst or max(1, math.ceil(rate)))
        self.max_keys = max_keys
        self.buckets: dict[Any, tuple[float, float]] = {}

    def wait(self, key: Any, now: float) -> float:
        """Take one request from `key`'s bucket: 0.0 when it may go now, else the seconds until it may."""
        level, at = self.buckets.get(key, (self.capacity, now))
        level = min(self.capacity, level + (now - at) * self.rate)
        if level >= 1.0:
            self.buckets[key] = (level - 1.0, now)
            if len(self.buckets) > self.max_keys:
                self._prune(now)
            return 0.0
        self.buckets[key] = (level, now)
        return (1.0 - level) / self.rate

    def _prune(self, now: float) -> None:
        full = [k for k, (lv, at) in self.buckets.items() if lv + (now - at) * self.rate >= self.capacity]
        for k in full:
            del self.buckets[k]
        while len(self.buckets) > self.max_keys:  # every bucket in use: the oldest go (their clients get a full one)
            del self.buckets[next(iter(self.buckets))]


def content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return None


class Edge:
    """Auth, the body limit, metrics and the error backstop, in front of `app`. `route_of(scope)` names the route
    (its path template) for the metrics labels."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: tuple[str, ...],
        max_body: int,
        metrics: Metrics,
        route_of: Callable,
        rate: float = 0.0,
        burst: int = 0,
    ) -> None:
        self.app, self.max_body, self.metrics, self.route_of = app, max_body, metrics, route_of
        self.tokens = tuple(t.encode("utf-8") for t in tokens)
        self.limiter = RateLimiter(rate, burst) if rate > 0 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [0]
        started = [False]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                started[0] = True
            await send(message)

        try:
            await self._guarded(scope, receive, sending)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                raise
            if started[0]:
                log.exception("error after the response started", exc_info=exc)
            else:
                code, body, headers = error_body(as_ctxlock_error(exc), scope.get("path"))
                await send_json(sending, code, body, headers)
        finally:
            self.metrics.observe(self.route_of(scope), scope.get("method", ""), status[0], time.perf_counter() - start)

    def _admit(self, scope: Scope) -> None:
        """The bearer token (when tokens are configured), then its rate (when a rate is configured)."""
        key: Any = None
        if self.tokens:
            key = bearer_index(scope, self.tokens)
            if key is None:
                raise AuthError(
                    "this route needs a bearer token",
                    path="Authorization",
                    hint="send 'Authorization: Bearer TOKEN' (or 'x-api-key: TOKEN', as Anthropic's SDK does)",
                )
        if self.limiter is not None:
            if key is None:
                key = ("client", (scope.get("client") or ("", 0))[0])
            wait = self.limiter.wait(key, time.monotonic())
            if wait > 0:
                raise RateLimitedError(
                    f"over the rate of {self.limiter.rate:g} request(s)/s for this "
                    + ("token" if self.tokens else "client address"),
                    path="limits.requests_per_second",
                    hint="retry after the Retry-After seconds, or raise limits.requests_per_second / limits.burst",
                    retry_after=max(1, math.ceil(wait)),
                )

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("path") not in OPEN_ROUTES:
            self._admit(scope)
        declared = content_length(scope)
        if declared is not None and (declared < 0 or declared > self.max_body):
            # Refused on the header alone: not one byte of the body is read.
            raise BodyTooLargeError(
                f"Content-Length {declared} is over the {self.max_body}-byte limit"
                if declared >= 0
                else "Content-Length is not a number",
                path="Content-Length",
                hint="send a smaller body, or raise limits.max_body_bytes in ctxlock.toml",
            )
        seen = [0]
        complete = [False]

        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not complete[0] and not scope.get(REFUSED):
                complete[0] = True  # one line, however often the app asks again
                client = scope.get("client") or ("a client", 0)
                log.warning(
                    "ctxlock serve: %s:%s: the client disconnected after %d of %s body bytes (%s %s)",
                    *client,
                    seen[0],
                    declared if declared is not None else "its",
                    scope.get("method", ""),
                    scope.get("path", ""),
                )
            if message["type"] == "http.request":
                complete[0] = not message.get("more_body", False)
                seen[0] += len(message.get("body", b""))
                if seen[0] > self.max_body:  # a chunked body, counted as it arrives
                    raise BodyTooLargeError(
                        f"the body is over the {self.max_body}-byte limit",
                        path="body",
                        hint="send a smaller body, or raise limits.max_body_bytes in ctxlock.toml",
                    )
            return message

        await self.app(scope, counted, send)
