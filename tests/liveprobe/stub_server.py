"""A scripted HTTP server on loopback for the probe's client tests: each route answers what the test says (a status,
headers and body, or a function of the request), in a thread of this process. It stands in where no real server
can be made to misbehave on purpose (a redirect elsewhere, a body over the cap, a slow drip, a non-JSON answer) and
for the answer shapes of vLLM routes that no server in the suite gives (the first shape of
`/v1/chat/completions/render`, and its absence)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: bytes | Any = b""  # bytes as sent; anything else is sent as JSON
    headers: dict[str, str] = field(default_factory=dict)
    drip: float = 0.0  # seconds between the body's bytes (a slow server); the body is then sent without a length


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


Handler = Callable[[Seen], Reply]


@contextmanager
def stub(routes: dict[str, Reply | Handler]) -> Iterator[tuple[str, list[Seen]]]:
    """A server answering `routes` ("METHOD /path" -> a Reply, or a function of the request; anything else 404):
    yields its base URL and the list of requests it received."""
    seen: list[Seen] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _serve(self, method: str) -> None:
            n = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(n) if n else b""
            req = Seen(
                method, self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw) if raw else None
            )
            seen.append(req)
            route = routes.get(f"{method} {self.path.split('?')[0]}")
            reply = (
                Reply(404, {"detail": "Not Found"})
                if route is None
                else route
                if isinstance(route, Reply)
                else route(req)
            )
            body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            for k, v in reply.headers.items():
                self.send_header(k, v)
            if reply.drip:
                self.send_header("Connection", "close")
                self.end_headers()
                for i in range(len(body)):
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    time.sleep(reply.drip)
                return
            if "content-length" not in {k.lower() for k in reply.headers}:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that gave up (the slow-drip test) breaks the pipe: expected, not printed

    server = Server(("127.0.0.1", 0), H)
    server.daemon_threads = True
    server.block_on_close = False  # a dripping answer the client gave up on is not waited for
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
