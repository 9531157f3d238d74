"""One bounded HTTP client for a live server, on the standard library's `http.client`.

Every call is bounded: the connection and the whole answer within `timeout` seconds (the socket's timeout is the
time left before each read), the answer's body at most `max_bytes` (a larger `Content-Length` is refused before
reading, a longer body at the first byte past the cap), and the body read as strict JSON (`ctxlock.outside`).
Redirects: a `307`/`308` (and for a GET a `301`/`302`/`303`) to the same scheme, host and port is followed, at most
three times; a redirect to anywhere else is refused and named, so a bearer token never leaves the host it was given
for. Every failure is one typed error (`ctxlock.errors.LiveServerError`) naming the URL and the route."""

from __future__ import annotations

import http.client
import io
import json
import re
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from ctxlock.errors import CtxlockError, InputError, ServerAnswerError, ServerRefusedError, ServerUnreachableError
from ctxlock.outside import loads_outside

DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_HOPS = 3
_CHUNK = 1 << 16
_SHOWN = 300  # characters of a server's own message kept in an error line
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


@dataclass(frozen=True)
class HttpLimits:
    """How long one call may take (connect and the whole answer, seconds) and how many bytes its answer may have."""

    timeout: float = DEFAULT_TIMEOUT
    max_bytes: int = DEFAULT_MAX_BYTES


class _DeadlineReader(io.RawIOBase):
    """A socket's receiving side that stops at the call's deadline: each receive may wait only the time left, so a
    server dripping its status line or headers a byte at a time (which `http.client` reads before any body) cannot
    hold a call past `--timeout`."""

    def __init__(self, owner: _DeadlineSocket) -> None:
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._owner.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self._owner.sock.settimeout(left)
        return self._owner.sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._owner.reader_closed()
        super().close()


class _DeadlineSocket:
    """A connected socket whose `makefile` (what `http.client.HTTPResponse` reads from) is a `_DeadlineReader`;
    closed, as a socket with open files is, only once its readers are (`http.client` closes the connection of a
    `Connection: close` answer before its body is read)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline
        self._readers = 0
        self._closing = False

    def makefile(self, mode: str = "r", *args: Any, **kwargs: Any) -> io.BufferedReader:
        self._readers += 1
        return io.BufferedReader(_DeadlineReader(self))

    def reader_closed(self) -> None:
        self._readers -= 1
        if self._closing and self._readers == 0:
            self.sock.close()

    def close(self) -> None:
        self._closing = True
        if self._readers == 0:
            self.sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _HTTPConnection(http.client.HTTPConnection):
    deadline = 0.0

    def connect(self) -> None:
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self.deadline)


class _HTTPSConnection(http.client.HTTPSConnection):
    deadline = 0.0

    def connect(self) -> None:
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self.deadline)


@dataclass(frozen=True)
class Answer:
    """A server's answer to one call: the status, the JSON body (None when the body is empty or, for an error status,
    not JSON) and the server's own message for an error status."""

    status: int
    body: Any
    message: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True)
class _Origin:
    scheme: str
    host: str
    port: int
    prefix: str  # the URL's path, without a trailing slash: routes are appended to it


def _origin(url: str) -> _Origin:
    where = f"URL {url}"
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed IPv6 bracket, ...
        raise InputError(
            f"not a URL: {exc}", path=where, hint="e.g. http://127.0.0.1:8000 or http://[::1]:8000"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError("not an http(s) URL", path=where, hint="e.g. http://127.0.0.1:8000")
    if parts.username is not None or parts.password is not None:
        raise InputError(
            "the URL holds credentials", path=where, hint="give the server's API key with --token, not in the URL"
        )
    if parts.query or parts.fragment:
        raise InputError("the URL has a query or fragment", path=where, hint="give the server's base URL only")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InputError("the URL's port is not a port number", path=where, hint="e.g. :8000") from None
    return _Origin(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def one_line(text: str, limit: int = _SHOWN) -> str:
    """A server's text as one line of at most `limit` characters (control characters and newlines collapsed)."""
    flat = _CONTROLS.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def server_message(body: Any, raw: bytes) -> str:
    """The server's own words in an error answer: OpenAI's and llama.cpp's `{"error": {"message"}}`, vLLM's older
    `{"message"}`, ctxlock's `{"message", "hint"}`, FastAPI's `{"detail"}`; else the body's text."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return one_line(err["message"])
        for key in ("error", "message", "detail"):
            if isinstance(body.get(key), str):
                hint = body.get("hint")
                return one_line(body[key] + (f" ({hint})" if isinstance(hint, str) and hint else ""))
        if isinstance(body.get("detail"), list | dict):
            return one_line(json.dumps(body["detail"], ensure_ascii=False))
    return one_line(raw.decode("utf-8", "replace")) or "(no body)"


class ServerClient:
    """Calls to one server (its base URL), each bounded by `limits`, with `Authorization: Bearer <token>` when a
    token is given."""

    def __init__(self, url: str, *, token: str | None = None, limits: HttpLimits | None = None) -> None:
        self.url = url.rstrip("/")
        self._origin = _origin(url)
        self._token = token
        self.limits = limits or HttpLimits()
        self.calls = 0

    def where(self, route: str) -> str:
        return f"{self.url}{route}"

    def get(self, route: str) -> Answer:
        return self._call("GET", route, None)

    def post(self, route: str, body: Mapping[str, Any]) -> Answer:
        return self._call("POST", route, json.dumps(body, ensure_ascii=False).encode("utf-8"))

    def expect(self, answer: Answer, route: str, *, hint: str | None = None) -> Any:
        """The body of a 2xx answer; any other status is a ServerRefusedError with the server's message."""
        if answer.ok:
            return answer.body
        if hint is None and answer.status in (401, 403):
            hint = "the server wants an API key: pass --token (or set CTXLOCK_PROBE_TOKEN)"
        raise ServerRefusedError(
            f"HTTP {answer.status}: {answer.message}",
            path=self.where(route),
            hint=hint or "the server's own message; see docs/live-probe.md for the routes each server kind takes",
            status=answer.status,
        )

    def _call(self, method: str, route: str, data: bytes | None) -> Answer:
        deadline = time.monotonic() + self.limits.timeout
        target = self._origin.prefix + route
        for _ in range(_MAX_HOPS + 1):
            status, headers, raw = self._exchange(method, target, data, deadline, route)
            if status not in _REDIRECTS:
                return self._answer(status, headers, raw, route)
            target = self._redirect(method, status, target, headers.get("location"), route)
        raise ServerAnswerError(
            f"more than {_MAX_HOPS} redirects",
            path=self.where(route),
            hint="give the URL the server finally answers at",
        )

    def _redirect(self, method: str, status: int, target: str, location: str | None, route: str) -> str:
        o = self._origin
        base = f"{o.scheme}://{o.host}:{o.port}{target}"
        to = urljoin(base, location or "")
        parts = urlsplit(to)
        same = parts.scheme == o.scheme and parts.hostname == o.host and (parts.port or o.port) == o.port
        if not location or not same:
            raise ServerAnswerError(
                f"HTTP {status}: a redirect to {one_line(location or '(no Location)', 120)}, not followed",
                path=self.where(route),
                hint="only a redirect to the same scheme, host and port is followed; probe the URL it names",
            )
        if method == "POST" and status not in (307, 308):
            raise ServerAnswerError(
                f"HTTP {status}: a POST redirected to {one_line(to, 120)} as a GET, not followed",
                path=self.where(route),
                hint="probe the URL it names",
            )
        return parts.path + (f"?{parts.query}" if parts.query else "")

    def _connection(self, deadline: float) -> http.client.HTTPConnection:
        o = self._origin
        left = max(deadline - time.monotonic(), 0.001)
        conn: _HTTPConnection | _HTTPSConnection
        if o.scheme == "https":
            conn = _HTTPSConnection(o.host, o.port, timeout=left, context=ssl.create_default_context())
        else:
            conn = _HTTPConnection(o.host, o.port, timeout=left)
        conn.deadline = deadline
        return conn

    def _exchange(
        self, method: str, target: str, data: bytes | None, deadline: float, route: str
    ) -> tuple[int, dict[str, str], bytes]:
        headers = {"Accept": "application/json", "User-Agent": "ctxlock-probe"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        conn = self._connection(deadline)
        self.calls += 1
        resp: http.client.HTTPResponse | None = None
        try:
            conn.request(method, target, body=data, headers=headers)
            resp = conn.getresponse()
            got = {k.lower(): v for k, v in resp.getheaders()}
            return resp.status, got, self._read(resp, got, deadline, route)
        except CtxlockError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, TimeoutError) or time.monotonic() >= deadline:
                why = f"no full answer within {self.limits.timeout:g} s"
                hint = "is the server busy? --timeout sets the seconds one call may take"
            elif isinstance(exc, http.client.HTTPException) and not isinstance(exc, OSError):
                # a status line, header or chunk http.client cannot read (RemoteDisconnected, an OSError too, is a
                # dropped connection)
                raise ServerAnswerError(
                    f"the answer is not well-formed HTTP: {type(exc).__name__}: {one_line(str(exc) or repr(exc), 120)}",
                    path=self.where(route),
                    hint="is an HTTP server answering at this URL? The port may be another service's",
                ) from None
            else:
                why, hint = one_line(str(exc) or repr(exc)), "is the server running at this URL?"
            raise ServerUnreachableError(why, path=self.where(route), hint=hint) from None
        finally:
            if resp is not None:
                resp.close()
            conn.close()

    def _read(
        self,
        resp: http.client.HTTPResponse,
        headers: Mapping[str, str],
        deadline: float,
        route: str,
    ) -> bytes:
        cap = self.limits.max_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise self._too_big(route, f"Content-Length {declared}")
        chunks: list[bytes] = []
        size = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            chunk = resp.read1(min(_CHUNK, cap + 1 - size))  # one receive at most, within the time left
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > cap:
                raise self._too_big(route, "the body")
            chunks.append(chunk)

    def _too_big(self, route: str, what: str) -> ServerAnswerError:
        return ServerAnswerError(
            f"{what} is over {self.limits.max_bytes} bytes; not read further",
            path=self.where(route),
            hint="raise --max-response-bytes if the server's answers are really this large",
        )

    def _answer(self, status: int, headers: Mapping[str, str], raw: bytes, route: str) -> Answer:
        ok = 200 <= status < 300
        if not raw.strip():
            return Answer(status, None, "" if ok else f"(no body; {headers.get('content-type', 'no content type')})")
        try:
            body = loads_outside(raw, f"{self.where(route)} answer $", error=ServerAnswerError)
        except ServerAnswerError as exc:
            if ok:
                raise ServerAnswerError(
                    f"the answer is not JSON: {exc.message}",
                    path=exc.path,
                    hint="is this the server's base URL? (the route may be answered by something else)",
                ) from None
            return Answer(status, None, server_message(None, raw))
        return Answer(status, body, "" if ok else server_message(body, raw))
