"""Red-team cases for the probe's HTTP client: servers that misbehave below the body (the status line and headers),
where the stub server of the other tests cannot reach, over a raw loopback socket."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from stub_server import Reply, stub

import fetched
from ctxlock.errors import InputError, ServerAnswerError, ServerUnreachableError
from ctxlock.liveprobe import HttpLimits, probe_server
from ctxlock.liveprobe._http import ServerClient
from ctxlock.model import Model, load
from ctxlock.probes import load_corpus


@contextmanager
def raw_server(chunks: list[bytes], pause: float, sent: list[int]) -> Iterator[str]:
    """A server that reads one request and sends `chunks`, `pause` seconds apart, then closes: its base URL; `sent`
    gets how many chunks it sent before the client hung up."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            for i, chunk in enumerate(chunks):
                try:
                    conn.sendall(chunk)
                except OSError:
                    sent.append(i)  # the client gave up
                    return
                time.sleep(pause)
            sent.append(len(chunks))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        srv.close()
        thread.join(timeout=10)


def test_headers_dripped_a_byte_at_a_time_stop_at_the_timeout() -> None:
    # A header line sent a byte each 0.1 s for 4 s: each receive waits less than the socket's timeout, so only a
    # deadline over the whole call (the status line and headers too, read before any body) stops it. Before the fix
    # the client read the whole drip (any number of bytes, endless for a server that never ends its headers).
    head = [b"HTTP/1.1 200 OK\r\nX-Slow: "] + [b"a"] * 40
    sent: list[int] = []
    with raw_server(head, 0.1, sent) as url, pytest.raises(ServerUnreachableError) as exc:
        ServerClient(url, limits=HttpLimits(timeout=0.3)).get("/props")
    assert "no full answer within 0.3 s" in exc.value.message
    assert sent and sent[0] < len(head)  # the server was cut off (it joined at the block's end)


@pytest.fixture(scope="module")
def qwen2() -> Model:
    return load(str(fetched.gguf_path("qwen2")))


def test_an_id_past_the_vocabulary_is_named_so_not_shown_as_an_empty_token(qwen2: Model) -> None:
    routes: dict[str, Any] = {
        "POST /tokenize": Reply(200, {"tokens": [2**32 - 1]}),
        "POST /v1/chat/completions/render": Reply(501, b""),
        "POST /detokenize": Reply(400, {"error": {"message": "bad id"}}),
    }
    with stub(routes) as (url, _):
        report = probe_server(url, qwen2, corpus=load_corpus(only=["user"]), kind="vllm")
    (line,) = [x for x in report.lines() if "first diverging token" in x]
    # Before the fix: `server "" (id 4294967295)`, as if the server had answered an empty token.
    assert line.endswith(f"server id {2**32 - 1}, not in ctxlock's vocabulary")


def test_a_ctxlock_render_whose_text_is_not_a_string_is_a_wrong_answer(qwen2: Model) -> None:
    # Before the fix the text was dropped and the report blamed the route for giving "ids only".
    routes: dict[str, Any] = {"POST /v1/render": Reply(200, {"text": ["x"], "input_ids": [1]})}
    with stub(routes) as (url, _), pytest.raises(ServerAnswerError) as exc:
        probe_server(url, qwen2, corpus=load_corpus(only=["user"]), kind="ctxlock")
    assert exc.value.message == "the answer's text is not a string: \"['x']\""
    assert exc.value.path == f"{url}/v1/render"


@pytest.mark.parametrize("url", ["http://[::1:8000", "http://[zz]:80"])
def test_a_malformed_bracketed_host_is_an_input_error(url: str) -> None:
    # Before the fix urlsplit's ValueError ("Invalid IPv6 URL") came out of `ctxlock probe` as a traceback.
    with pytest.raises(InputError) as exc:
        ServerClient(url)
    assert exc.value.path == f"URL {url}" and exc.value.message.startswith("not a URL: ")


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"{}", "BadStatusLine: {}"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "IncompleteRead"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 200 + b"\r\n{}", "got more than 100 headers"),
    ],
    ids=["no-status-line", "bad-chunk", "headers"],
)
def test_an_answer_that_is_not_http_is_a_wrong_answer_not_an_unreachable_server(answer: bytes, said: str) -> None:
    # Before the fix: ServerUnreachableError "{} (is the server running at this URL?)".
    sent: list[int] = []
    with raw_server([answer], 0.0, sent) as url, pytest.raises(ServerAnswerError) as exc:
        ServerClient(url, limits=HttpLimits(timeout=5)).get("/props")
    assert exc.value.message.startswith("the answer is not well-formed HTTP: ") and said in exc.value.message
