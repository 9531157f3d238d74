"""The HTTP edge, as one ASGI middleware around the routes: bearer tokens, the body byte limit (413 before a byte
is parsed), per-route metrics, and the last word on errors (typed JSON, never a 500 page or a traceback)."""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..errors import (
    AuthError,
    BodyTooLargeError,
    CtxlockError,
    DeadlineError,
    InternalServeError,
    OverloadedError,
    RecordNotFoundError,
    RequestError,
    RouteNotFoundError,
    ServeConfigError,
    TemplateNotFoundError,
)
from .metrics import Metrics

log = logging.getLogger("ctxlock.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_ROUTES = frozenset({"/healthz"})

# The HTTP status of each error type, most specific first (the first isinstance match wins).
STATUS: tuple[tuple[type[CtxlockError], int], ...] = (
    (AuthError, 401),
    (BodyTooLargeError, 413),
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


def error_body(exc: CtxlockError) -> tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]:
    headers = []
    if isinstance(exc, OverloadedError):
        headers.append((b"retry-after", str(exc.retry_after).encode()))
    return status_of(exc), exc.to_dict(), headers


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


def bearer_ok(scope: Scope, tokens: tuple[bytes, ...]) -> bool:
    """A configured token in `Authorization: Bearer ...`, compared in constant time against every token."""
    given = b""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            given = value
            break
    scheme, _, token = given.partition(b" ")
    if scheme.lower() != b"bearer" or not token:
        return False
    ok = False
    for t in tokens:
        ok |= hmac.compare_digest(token.strip(), t)
    return ok


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
        self, app: ASGIApp, *, tokens: tuple[str, ...], max_body: int, metrics: Metrics, route_of: Callable
    ) -> None:
        self.app, self.max_body, self.metrics, self.route_of = app, max_body, metrics, route_of
        self.tokens = tuple(t.encode("utf-8") for t in tokens)

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
                code, body, headers = error_body(as_ctxlock_error(exc))
                await send_json(sending, code, body, headers)
        finally:
            self.metrics.observe(self.route_of(scope), scope.get("method", ""), status[0], time.perf_counter() - start)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.tokens and scope.get("path") not in OPEN_ROUTES and not bearer_ok(scope, self.tokens):
            raise AuthError(
                "this route needs a bearer token", path="Authorization", hint="send 'Authorization: Bearer TOKEN'"
            )
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

        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > self.max_body:  # a chunked body, counted as it arrives
                    raise BodyTooLargeError(
                        f"the body is over the {self.max_body}-byte limit",
                        path="body",
                        hint="send a smaller body, or raise limits.max_body_bytes in ctxlock.toml",
                    )
            return message

        await self.app(scope, counted, send)
