"""`ctxlock serve` on a hostile network (docs/serve-limits.md): the real server on loopback, one process and
`--workers 2`, each started once for the module, with short timeouts and small connection caps in its config.

A gigabyte of header bytes on one connection is cut off with the server's memory flat; slow-drip heads and bodies
are closed at the configured timeouts; a generated set of hostile heads and Content-Length values gets only JSON
answers (never plain text, never a 500); the connection caps answer 503 JSON; a client that leaves mid-body is
one log line; the record viewer builds one page of tokens at a time. All traffic goes to 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
from ctxlock.records import _viewer as viewer
from hypothesis_profiles import examples
from serve_server import SRC, TOKEN, client, free_port, terminate

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
PER_IP = 8
TOTAL = 12
PAGE = 1000
AUTH = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"


@dataclass
class Server:
    url: str
    port: int
    proc: subprocess.Popen
    log: Path
    workers: int

    def pids(self) -> list[int]:
        """The processes that serve: the server itself, or with --workers the supervisor's children."""
        if self.workers == 1:
            return [self.proc.pid]
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        # multiprocessing's resource tracker is a child too: the workers are the spawned ones.
        return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]

    def rss_mb(self) -> float:
        total = 0
        for pid in self.pids():
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        return total / 1024


def write_config(root: Path) -> Path:
    cfg = root / "ctxlock.toml"
    cfg.write_text(
        f"""
[server]
store = "{root / "store"}"
tokens = ["{TOKEN}"]

[limits]
max_body_bytes = 4194304
render_deadline_seconds = 30.0
header_timeout_seconds = {HEADER_TIMEOUT}
body_timeout_seconds = {BODY_TIMEOUT}
min_body_rate = 1000
keep_alive_seconds = 30
max_connections = {TOTAL}
max_connections_per_ip = {PER_IP}
view_page_tokens = {PAGE}

[models.nemo]
spec = "mistral-nemo"
""",
        "utf-8",
    )
    return cfg


def start(root: Path, workers: int) -> Server:
    port = free_port()
    log = root / f"server-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ctxlock", "serve", "--config", str(write_config(root)), "--port", str(port)]
            + (["--workers", str(workers)] if workers > 1 else []),
            env={**os.environ, "PYTHONPATH": SRC},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with httpx.Client(timeout=2) as c:  # a fresh connection each time: both workers must be up
                up = all(c.get(url + "/healthz").status_code == 200 for _ in range(4))
                if up and (workers == 1 or len(Server(url, port, proc, log, workers).pids()) == workers):
                    return Server(url, port, proc, log, workers)
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    terminate(proc)
    raise RuntimeError(f"the server did not start: {log.read_text()}")


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "workers-2"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start(tmp_path_factory.mktemp(f"net{request.param}"), request.param)
    try:
        yield s
    finally:
        terminate(s.proc)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start(tmp_path_factory.mktemp("net-single"), 1)
    try:
        yield s
    finally:
        terminate(s.proc)


def connect(server: Server, source: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=(source, 0))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The final response from `s` (an interim 1xx such as 100 Continue is passed over): status, headers (lower-case
    names), body (by Content-Length, else to EOF)."""
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before a response: {data!r}")
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        if not 100 <= status < 200 or status == 101:
            break
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    want = int(headers.get("content-length", "-1"))
    while want < 0 or len(data) < want:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return status, headers, data


def assert_json_error(status: int, headers: dict[str, str], body: bytes, expected: int | None = None) -> dict:
    assert status != 500 and (expected is None or status == expected), (status, body)
    assert headers.get("content-type") == "application/json", (status, headers, body)
    err = json.loads(body)
    if status >= 400:
        assert set(err) == {"type", "message", "path", "hint"}, err
    return err


def closed(s: socket.socket, within: float) -> bool:
    """Whether the peer closes `s` within `within` seconds (whatever it answers first is read and dropped)."""
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_a_gigabyte_of_header_bytes_is_cut_off_with_memory_flat(server: Server) -> None:
    before = peak = server.rss_mb()
    sent = 0
    chunk = b"a" * (1 << 20)
    with connect(server) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Flood: ")
        with pytest.raises(OSError):  # the server closes the connection long before the gigabyte
            while sent < 1 << 30:
                s.sendall(chunk)
                sent += len(chunk)
                if sent % (16 << 20) == 0:
                    peak = max(peak, server.rss_mb())
    peak = max(peak, server.rss_mb())
    assert sent < 1 << 30
    assert peak - before < 64, (before, peak)
    # What it answers a client that sends an oversized head and then reads: 431, JSON, and the connection closed.
    with connect(server) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 40000 + b"\r\n\r\n")
        err = assert_json_error(*read_response(s), 431)
        assert err["type"] == "HeadersTooLargeError" and err["path"] == "limits.max_header_bytes"
        assert closed(s, 10)
    with connect(server) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 101 + b"\r\n")
        assert assert_json_error(*read_response(s), 431)["path"] == "limits.max_header_count"


def test_slow_drip_heads_and_bodies_are_closed_at_the_timeout(server: Server) -> None:
    # A head dripping one byte every 0.1 s: 408 once the header timeout has passed, long before the drip ends.
    head = b"POST /v1/count HTTP/1.1\r\nHost: x\r\n" + AUTH + b"X-Slow: " + b"z" * 200
    with connect(server) as s:
        start = time.monotonic()
        with pytest.raises(OSError):
            for byte in head:
                s.sendall(bytes([byte]))
                time.sleep(0.1)
            pytest.fail("the dripping head was never cut off")
        assert time.monotonic() - start < HEADER_TIMEOUT + 10
    with connect(server) as s:
        s.sendall(head[:40])
        err = assert_json_error(*read_response(s), 408)
        assert err["type"] == "RequestTimeoutError" and err["path"] == "limits.header_timeout_seconds"
        assert closed(s, 10)
    # A body dripping below min_body_rate: 408 after the body's allowance.
    with connect(server) as s:
        s.sendall(b"POST /v1/count HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: 5000\r\n\r\n{")
        with pytest.raises(OSError):
            for _ in range(200):
                time.sleep(0.1)
                s.sendall(b" ")
            pytest.fail("the dripping body was never cut off")
    with connect(server) as s:
        s.sendall(b"POST /v1/count HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: 5000\r\n\r\n{")
        err = assert_json_error(*read_response(s), 408)
        assert err["path"] == "limits.min_body_rate"
    # A connection that never sends a byte is closed (without an answer) at the header timeout.
    with connect(server) as s:
        assert closed(s, HEADER_TIMEOUT + 10)


# Hostile heads: each is the whole request a fresh connection sends (the Host and Authorization lines are added
# where the head has a "{auth}" slot). Sources: RFC 9112 (message framing), the request-smuggling cases of llhttp's
# own tests (test/request/*.md: duplicate and conflicting Content-Length, Transfer-Encoding with Content-Length,
# obs-fold, bare LF).
CATALOGUE = [
    b"POST /v1/count HTTP/1.1\r\n{auth}Content-Length: 1x\r\n\r\n",
    b"POST /v1/count HTTP/1.1\r\n{auth}Content-Length: -1\r\n\r\n",
    b"POST /v1/count HTTP/1.1\r\n{auth}Content-Length: +5\r\n\r\nhello",
    b"POST /v1/count HTTP/1.1\r\n{auth}Content-Length: 0x10\r\n\r\n",
    b"POST /v1/count HTTP/1.1\r\n{auth}Content-Length: 5, 5\r\n\r\nhello",
    b"POST /v1/count HTTP/1.1\r\n{auth}Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"POST /v1/count HTTP/1.1\r\n{auth}Content-Length: 99999999999999999999999\r\n\r\n",
    b"POST /v1/count HTTP/1.1\r\n{auth}Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /v1/count HTTP/1.1\r\n{auth}Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /v1/count HTTP/1.1\r\n{auth}Transfer-Encoding: gzip, chunked, identity\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n{auth}X-Folded: a\r\n b\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n{auth}X-Nul: a\x00b\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n{auth}No colon here\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n{auth}X-Space : a\r\n\r\n",
    b"GET /healthz HTTP/1.1\n{auth}\n",
    b"GET /he\xffalthz HTTP/1.1\r\n{auth}\r\n",
    b"GET /%zz HTTP/1.1\r\n{auth}\r\n",
    b"GET http://127.0.0.1/healthz HTTP/1.1\r\n{auth}\r\n",
    b"GET /healthz HTTP/9.9\r\n{auth}\r\n",
    b"GET /healthz\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    b"G" * 300 + b" / HTTP/1.1\r\n{auth}\r\n",
    b"BREW /healthz HTTP/1.1\r\n{auth}\r\n",
    b"POST /v1/count HTTP/1.1\r\n{auth}Expect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
]

header_names = st.one_of(
    st.sampled_from([b"Content-Length", b"Transfer-Encoding", b"Host", b"Expect", b"Connection", b"X-A", b"Upgrade"]),
    st.binary(min_size=0, max_size=12),
)
header_values = st.one_of(
    st.sampled_from([b"chunked", b"close", b"100-continue", b"websocket", b"0", b"1e3", b"-0", b"\xff\xfe", b""]),
    st.integers(min_value=-(10**30), max_value=10**30).map(lambda n: str(n).encode()),
    st.binary(min_size=0, max_size=20),
)


def exchange(server: Server, raw: bytes) -> int:
    """Send `raw` on a fresh connection and check the answer is JSON, never a 500 (a 100 Continue passed over);
    returns its status, or 0 when the server closed without one (a connection it was right to drop). A request
    whose body does not come is answered 408 at the body timeout, so no read waits long."""
    with connect(server) as s:
        s.settimeout(BODY_TIMEOUT + HEADER_TIMEOUT + 10)
        with contextlib.suppress(OSError):  # refused mid-send: the answer, if it got through, is read below
            s.sendall(raw)
        try:
            status, headers, body = read_response(s)
        except OSError:  # ConnectionError included
            return 0
        assert status != 101, f"an upgrade was accepted: {raw!r}"
        assert_json_error(status, headers, body)
        return status


@pytest.mark.parametrize("raw", CATALOGUE, ids=range(len(CATALOGUE)))
def test_the_hostile_head_catalogue_gets_only_json(server: Server, raw: bytes) -> None:
    exchange(server, raw.replace(b"{auth}", b"Host: x\r\n" + AUTH))


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    headers=st.lists(st.tuples(header_names, header_values), max_size=6),
    body=st.binary(max_size=40),
    path=st.sampled_from([b"/v1/count", b"/tokenize", b"/healthz", b"/nope", b"/v1/records"]),
)
def test_generated_heads_and_content_lengths_get_only_json(
    single: Server, headers: list[tuple[bytes, bytes]], body: bytes, path: bytes
) -> None:
    lines = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    # A small valid Content-Length gets a body of its length (so that the answer is the app's, not a 408 after the
    # body timeout); every other value is sent as generated.
    declared = next((v for n, v in headers if n.lower() == b"content-length"), None)
    if declared is not None and declared.isdigit() and int(declared) <= 4096:
        body = body.ljust(int(declared), b" ")[: int(declared)]
    exchange(single, b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + AUTH + lines + b"\r\n" + body)


def _hold(server: Server, source: str) -> socket.socket:
    """A keep-alive connection that has made one request (so it is neither idle-new nor mid-request)."""
    s = connect(server, source)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, _ = read_response(s)
    assert status == 200
    return s


def test_a_huge_content_length_gets_413_before_the_body(server: Server) -> None:
    with connect(server) as s:
        s.sendall(
            b"POST /tokenize HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Type: application/json\r\n"
            b"Content-Length: 2147483648\r\n\r\n{"
        )
        start = time.monotonic()
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    assert time.monotonic() - start < 5  # answered on the header: the 2 GiB body was never awaited
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(payload)["type"] == "BodyTooLargeError"


def test_a_refusal_after_an_answered_request_on_the_same_connection_is_answered(single: Server) -> None:
    """A keep-alive connection's second request refused at its head (too large, too many fields, not HTTP) gets its
    JSON answer as on a fresh connection: the first request's finished answer does not count as this one's."""
    refusals = [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 16) + b"\r\n\r\n", 431),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(200)) + b"\r\n", 431),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
    ]
    for raw, expected in refusals:
        with contextlib.closing(_hold(single, "127.0.0.1")) as s:
            s.settimeout(HEADER_TIMEOUT + 10)
            with contextlib.suppress(OSError):
                s.sendall(raw)
            status, headers, body = read_response(s)
            assert_json_error(status, headers, body, expected)


def test_connection_caps_per_address_and_in_total_answer_503_json(single: Server) -> None:
    held = [_hold(single, "127.0.0.1") for _ in range(PER_IP)]
    try:
        with connect(single) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = read_response(extra)
            err = assert_json_error(status, headers, body, 503)
            assert err["path"] == "limits.max_connections_per_ip" and headers["retry-after"] == "1"
        held += [_hold(single, "127.0.0.2") for _ in range(TOTAL - PER_IP)]
        with connect(single, "127.0.0.3") as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            err = assert_json_error(*read_response(extra), 503)
            assert err["path"] == "limits.max_connections"
    finally:
        for s in held:
            s.close()
    # Once they are closed, a connection is served again.
    for _ in range(100):
        try:
            s = _hold(single, "127.0.0.1")
            s.close()
            return
        except AssertionError:
            time.sleep(0.1)
    pytest.fail("no connection was served after the held ones closed")


def test_a_client_that_leaves_mid_body_is_one_log_line(single: Server) -> None:
    with connect(single) as s:
        s.sendall(b"POST /v1/count HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: 1000\r\n\r\n" + b" " * 10)
        port = s.getsockname()[1]
        time.sleep(0.2)
    for _ in range(100):
        lines = [x for x in single.log.read_text("utf-8").splitlines() if f":{port}" in x]
        if lines:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # anything else it would write about that client
    lines = [x for x in single.log.read_text("utf-8").splitlines() if f":{port}" in x]
    assert lines == [
        f"ctxlock serve: 127.0.0.1:{port}: the client disconnected after 10 of 1000 body bytes (POST /v1/count)"
    ]
    assert "Traceback" not in single.log.read_text("utf-8")


def _chip_ids(page: str) -> list[int]:
    return [int(x) for x in re.findall(r'<span class="chip[^"]*" data-id="(\d+)"', page)]


def test_the_viewer_builds_one_page_of_tokens_at_a_time(single: Server) -> None:
    words = " ".join(f"w{k % 997}x{k}" for k in range(3000))
    with client(single.url) as c:
        a = c.post("/v1/render?model=nemo&record=1", json={"messages": [{"role": "user", "content": words}]}).json()
        changed = words[: len(words) - 2000] + " changed " + words[len(words) - 2000 :]
        b = c.post("/v1/render?model=nemo&record=1", json={"messages": [{"role": "user", "content": changed}]})
        b = b.json()
        ids, total = a["input_ids"], len(a["input_ids"])
        pages = -(-total // PAGE)
        assert total > 20 * PAGE
        first = c.get(f"/records/{a['record_id']}/view")
        assert first.status_code == 200
        assert _chip_ids(first.text) == ids[:PAGE]
        assert f"{total} tokens" in first.text and f'data-pages="{pages}"' in first.text
        assert len(first.content) < 400 * PAGE  # one page's chips, not the record's
        # The tokens per part count the whole record (the user's message is most of it).
        parts = dict(re.findall(r"<tr><td>([^<]*)</td><td>(\d+)</td></tr>", first.text))
        assert sum(int(v) for v in parts.values()) == total
        last = c.get(f"/records/{a['record_id']}/view?page={pages}")
        assert _chip_ids(last.text) == ids[(pages - 1) * PAGE :]
        for bad in (str(pages + 1), "0", "x", "²"):
            r = c.get(f"/records/{a['record_id']}/view?page={bad}")
            assert r.status_code == 400 and r.json()["path"] == "?page"
        # The diff view opens on the page holding the first differing token, outlined there.
        d = c.get(f"/diff/{a['record_id']}/{b['record_id']}/view")
        assert d.status_code == 200
        where = next(k for k, (x, y) in enumerate(zip(ids, b["input_ids"], strict=False)) if x != y)
        assert (
            f'data-page="{where // PAGE + 1}"' in d.text and len(re.findall(r'class="chip[^"]* diverge"', d.text)) == 2
        )
        assert len(d.content) < 800 * PAGE


def test_json_answers_carry_every_field(single: Server) -> None:
    # The fuzz's checker itself: a plain-text answer would fail it.
    with pytest.raises(AssertionError):
        assert_json_error(400, {"content-type": "text/plain; charset=utf-8"}, b"Invalid HTTP request received.")
    with pytest.raises(AssertionError):
        assert_json_error(500, {"content-type": "application/json"}, b"{}")
    assert_json_error(*_answer(single, b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: z\r\n\r\n"), 400)


def _answer(server: Server, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    with connect(server) as s:
        s.sendall(raw)
        return read_response(s)


def test_a_page_of_a_two_million_token_record_costs_one_page() -> None:
    """The viewer itself (what the route calls) on a record of 2M ids: the page is one page's chips, where one chip
    per token made a 224 MB page; and what it allocates (tracemalloc's peak, on shorter records to keep the test
    short) does not grow with the record but for its text's UTF-8."""
    tokenizer = ctxlock.load("mistral-nemo").tokenizer
    tid = next(i for i, p in enumerate(tokenizer.token_bytes().pieces) if p == b"ab")

    def record(n: int) -> dict:
        return {
            "rendered": {"text": "ab" * n, "request_spans": [[0, 2 * n, "messages[0].content"]]},
            "input_ids": [tid] * n,
            "request": {"canonical": {"messages": [{"role": "user", "content": "ab" * n}]}},
        }

    n = 2_000_000
    page = viewer.record_page("f" * 64, record(n), tokenizer, page=7, page_tokens=PAGE)
    assert _chip_ids(page) == [tid] * PAGE
    assert "tokens 6001–7000 of 2000000" in page and f"<td>messages[0].content</td><td>{n}</td>" in page
    assert len(page) < 400 * PAGE
    peaks = []
    for size in (50_000, 200_000):
        data = record(size)
        tracemalloc.start()
        try:
            viewer.record_page("f" * 64, data, tokenizer, page=3, page_tokens=PAGE)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    # The same page of a record 4 times longer: the same cost, but for the longer text's UTF-8 (300 KB more); one
    # chip per token costs tens of MB more here. (What remains, about 7 MB, is the vocabulary's byte pieces.)
    assert peaks[1] - peaks[0] < 1 << 20 and peaks[1] < 16 << 20, peaks
