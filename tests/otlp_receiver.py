"""A loopback OTLP/HTTP receiver for the telemetry tests: it keeps every POST (path, content type, body) and answers
200, as a Collector's OTLP/HTTP receiver does; `attrs` decodes an OTLP attribute list (opentelemetry-proto)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass
class Received:
    url: str
    bodies: list[tuple[str, str, bytes]] = field(default_factory=list)

    def spans(self) -> list[Any]:
        """Every span received so far, in arrival order."""
        out = []
        for _, _, body in list(self.bodies):
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
                for ss in rs.scope_spans:
                    out.extend(ss.spans)
        return out


@contextmanager
def receiver() -> Iterator[Received]:
    """A receiver on a free loopback port, until the block ends (then its port refuses connections)."""
    got = Received("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.bodies.append((self.path, self.headers["Content-Type"], body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    got.url = f"http://127.0.0.1:{server.server_port}/v1/traces"
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()


def attrs(pairs: Any) -> dict[str, Any]:
    """An OTLP KeyValue list as a dict (arrays as lists)."""
    out = {}
    for kv in pairs:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = (
            [getattr(x, x.WhichOneof("value")) for x in v.array_value.values]
            if kind == "array_value"
            else (getattr(v, kind))
        )
    return out
