"""The connection limits `ctxlock serve` enforces on the wire, before a request reaches the app (docs/serve-limits.md).

uvicorn's httptools protocol keeps every header byte it is sent (llhttp has no header limit of its own, and
httptools accumulates a header's name and value until it ends), gives a fresh connection no timeout at all, and
answers what it refuses itself (an invalid request, a malformed Content-Length, its concurrency limit, a crashed
app) as plain text. `limited_protocol(limits)` is uvicorn's own `HttpToolsProtocol`
(uvicorn/protocols/http/httptools_impl.py), with only what it lacks added:

- the request line and headers are fed to the parser at most `max_header_bytes` at a time: one byte more, and the
  request is answered 431 without the parser ever holding it; more than `max_header_count` fields is 431 too;
- a timer from a request's first byte (or the connection's start) to the end of its headers
  (`header_timeout_seconds`), and one on the body: `body_timeout_seconds`, extended by one second per
  `min_body_rate` bytes received (the model of Apache's mod_reqtimeout,
  https://httpd.apache.org/docs/2.4/mod/mod_reqtimeout.html); either is 408;
- per-process caps on open connections, in total and per client address: the connection over a cap is answered 503
  at once;
- uvicorn's own options are used where they fit: `timeout_keep_alive` is `limits.keep_alive_seconds`. Its
  `limit_concurrency` is not: it answers a plain-text 503 after reading the request and counts tasks, not client
  addresses; `h11_max_incomplete_event_size` bounds only the h11 parser, which this protocol does not use;
- every answer the protocol gives itself is the JSON error body of `edge.error_body`, with `Connection: close`;
  then the write side is shut and what the client still sends is read and discarded for a moment (at most
  `_LINGER_SECONDS` and `_LINGER_BYTES`, as nginx's lingering close), so that a client still sending its request
  reads the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ctxlock.errors import (
    CtxlockError,
    HeadersTooLargeError,
    InternalServeError,
    OverloadedError,
    RequestError,
    RequestTimeoutError,
)
from ctxlock.server.config import Limits
from ctxlock.server.edge import REFUSED, error_body

log = logging.getLogger("ctxlock.server")

_LINGER_SECONDS = 1.0
_LINGER_BYTES = 1 << 20


class _Refused(Exception):
    """Raised inside a parser callback to stop the parser; the refusal itself is on the protocol."""


def error_response(exc: CtxlockError) -> bytes:
    """A whole HTTP/1.1 response for `exc`: its status, the JSON error body, `Connection: close`."""
    status, body, headers = error_body(exc)
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    head = [STATUS_LINE[status], b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(data)]
    head += [name + b": " + value + b"\r\n" for name, value in headers]
    return b"".join([*head, b"connection: close\r\n\r\n", data])


def json_500(cycle: Any) -> Callable[[], Awaitable[None]]:
    """What uvicorn's cycle answers as a plain-text 500 (an app that raised past the edge, or returned without an
    answer), as the JSON error shape and status the edge gives an unexpected error instead."""

    async def send() -> None:
        err = InternalServeError(
            "the request ended without an answer", path="server", hint="this is a ctxlock bug: please report it"
        )
        status, body, _ = error_body(err)
        data = json.dumps(body).encode("utf-8")
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        start = {"type": "http.response.start", "status": status, "headers": [*headers, (b"connection", b"close")]}
        await cycle.send(start)
        await cycle.send({"type": "http.response.body", "body": data, "more_body": False})

    return send


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of the module docstring; `limits` is set by `limited_protocol`."""

    limits: Limits = Limits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_body = False  # the current message's headers have ended and its body has not
        self._head_bytes = 0  # bytes fed to the parser since the current message's head began
        self._head_count = 0
        self._begun = False  # a byte of the current message's head has arrived
        self._refusal: CtxlockError | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._body_start = 0.0
        self._body_bytes = 0
        self._closing = False
        self._lingered = 0

    # -- connections ---------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        over = self._over_cap()
        if over is not None:
            self._refuse(over)
            return
        self._arm(self.limits.header_timeout_seconds)

    def _over_cap(self) -> CtxlockError | None:
        lim = self.limits
        if len(self.connections) > lim.max_connections:
            return OverloadedError(
                f"over the {lim.max_connections} open connections this server process takes",
                path="limits.max_connections",
                hint="retry after the Retry-After seconds, or raise limits.max_connections",
            )
        ip = self.client[0] if self.client else None
        if ip is not None:
            same = sum(1 for c in self.connections if (getattr(c, "client", None) or ("",))[0] == ip)
            if same > lim.max_connections_per_ip:
                return OverloadedError(
                    f"over the {lim.max_connections_per_ip} open connections this server process takes from one "
                    "client address",
                    path="limits.max_connections_per_ip",
                    hint="close idle connections or reuse them (keep-alive), or raise limits.max_connections_per_ip",
                )
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # -- reading ---------------------------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._closing:
            self._linger(len(data))
            return
        self._unset_keepalive_if_required()
        if not self._in_body:
            self._begun = True
            if self._timer is None:
                self._arm(self.limits.header_timeout_seconds)
        while data and not self._closing:
            if self._in_body:
                piece, data = data, b""
            else:
                # At most the head's remaining allowance reaches the parser: httptools never holds more.
                room = self.limits.max_header_bytes - self._head_bytes
                if room <= 0:
                    self._refuse(
                        self._too_large(
                            f"the request line and headers are over {self.limits.max_header_bytes} bytes",
                            "limits.max_header_bytes",
                        )
                    )
                    return
                piece, data = data[:room], data[room:]
                self._head_bytes += len(piece)
            self._feed(piece)

    def _feed(self, piece: bytes) -> None:
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError as exc:
            # A callback's own exception (uvicorn's, e.g. a path that is not ASCII) is the reason worth naming.
            reason = str(exc) if exc.__context__ is None else f"{exc}: {exc.__context__}"
            self._refuse(self._refusal or self._invalid(reason))

    def _unsupported_upgrade_warning(self) -> None:
        """An Upgrade request is answered as a plain request (no route speaks WebSocket): nothing to warn about."""

    @staticmethod
    def _too_large(message: str, path: str) -> HeadersTooLargeError:
        return HeadersTooLargeError(message, path=path, hint="send fewer or shorter headers, or raise " + path)

    @staticmethod
    def _invalid(reason: str) -> RequestError:
        return RequestError(
            f"not a valid HTTP/1.1 request: {reason}", path="HTTP", hint="check the request line and headers"
        )

    def send_400_response(self, msg: str) -> None:
        self._refuse(self._invalid(msg))

    # -- the parser's callbacks --------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_count = 0
        self._begun = True
        if self._timer is None:
            self._arm(self.limits.header_timeout_seconds)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_count += 1
        if self._head_count > self.limits.max_header_count:
            self._refusal = self._too_large(
                f"more than {self.limits.max_header_count} header fields", "limits.max_header_count"
            )
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_body = True
        self._body_start, self._body_bytes = time.monotonic(), 0
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.send_500_response = json_500(self.cycle)  # type: ignore[method-assign]
        self._arm(self.limits.body_timeout_seconds)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_body, self._head_bytes, self._begun = False, 0, False
        super().on_message_complete()

    # -- timers ----------------------------------------------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self._closing or self.transport.is_closing():
            return
        lim = self.limits
        if not self._in_body:
            if not self._begun:  # a connection that never sent a byte: closed, as an idle keep-alive one
                self.transport.close()
                return
            self._refuse(
                RequestTimeoutError(
                    f"the request's headers did not end within {lim.header_timeout_seconds:g} s",
                    path="limits.header_timeout_seconds",
                    hint="send the whole request line and headers at once",
                )
            )
            return
        now = time.monotonic()
        if self.flow.read_paused:  # the server, not the client, is holding the body back: a fresh allowance
            self._body_start, self._body_bytes = now, 0
            self._arm(lim.body_timeout_seconds)
            return
        allowed = lim.body_timeout_seconds + self._body_bytes / lim.min_body_rate
        if now - self._body_start < allowed:
            self._arm(allowed - (now - self._body_start))
            return
        self._refuse(
            RequestTimeoutError(
                f"the body came slower than {lim.min_body_rate} bytes/s after its first "
                f"{lim.body_timeout_seconds:g} s ({self._body_bytes} bytes in {now - self._body_start:.1f} s)",
                path="limits.min_body_rate",
                hint="send the body at once, or raise limits.body_timeout_seconds / lower limits.min_body_rate",
            )
        )

    # -- refusing ------------------------------------------------------------------------------------------------

    def _refuse(self, exc: CtxlockError) -> None:
        """Answer `exc` as JSON (unless a response of the current request has started), shut the write side, and
        linger: what the client still sends is discarded, until it closes or the linger bounds are reached."""
        if self._closing:
            return
        self._closing = True
        self._disarm()
        who = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        status = error_body(exc)[0]
        log.warning("ctxlock serve: %s: %d %s: %s", who, status, type(exc).__name__, exc.message)
        cycle = self.cycle
        # The cycle is the connection's last request: one whose answer is complete is an earlier request of this
        # keep-alive connection, and the request refused now (its head, say) is answered as on a fresh connection.
        answered = cycle is not None and cycle.response_started and not cycle.response_complete
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() sees a disconnect; its answer is dropped
            cycle.scope[REFUSED] = True  # logged here: the edge does not log the disconnect again
            cycle.message_event.set()
        if self.transport.is_closing():
            return
        if not answered:
            self.transport.write(error_response(exc))
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._timer = self.loop.call_later(_LINGER_SECONDS, self.transport.close)

    def _linger(self, size: int) -> None:
        self._lingered += size
        if self._lingered > _LINGER_BYTES:
            self._disarm()
            self.transport.close()

    def eof_received(self) -> bool | None:
        if self._closing:
            self._disarm()
            self.transport.close()
        return None


def limited_protocol(limits: Limits) -> type[LimitedHttpToolsProtocol]:
    """The protocol class uvicorn takes as `http=`, for these limits."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})


def uvicorn_options(limits: Limits) -> dict[str, Any]:
    """The uvicorn.Config options for these limits (both `ctxlock serve` modes use these)."""
    return {
        "http": limited_protocol(limits),
        "timeout_keep_alive": limits.keep_alive_seconds,
        "ws": "none",  # no route speaks WebSocket: an Upgrade is never taken
        "log_level": "warning",
    }


__all__ = ["LimitedHttpToolsProtocol", "error_response", "limited_protocol", "uvicorn_options"]
