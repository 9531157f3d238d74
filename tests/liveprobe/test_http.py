"""The probe's HTTP client treats every server as hostile: every call bounded (a timeout for the whole answer, a
size cap read no further), no redirect to another host (so the bearer token stays where it was given), strict JSON,
and each failure one typed line naming the URL and the route, with the server's own words for a 4xx or 5xx."""

from __future__ import annotations

import json
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stub_server import Reply, stub

from ctxlock.errors import InputError, ServerAnswerError, ServerRefusedError, ServerUnreachableError
from ctxlock.liveprobe import HttpLimits
from ctxlock.liveprobe._http import ServerClient, server_message
from hypothesis_profiles import examples


def test_the_token_is_sent_and_json_is_read() -> None:
    with stub({"POST /tokenize": Reply(200, {"tokens": [1, 2]})}) as (url, seen):
        answer = ServerClient(url, token="s3cret").post("/tokenize", {"content": "hi"})
    assert answer.ok and answer.body == {"tokens": [1, 2]}
    assert seen[0].headers["authorization"] == "Bearer s3cret" and seen[0].body == {"content": "hi"}


def test_a_redirect_to_another_host_is_not_followed_and_the_token_stays() -> None:
    with stub({"GET /v1/models": Reply(200, {"data": []})}) as (elsewhere, other_seen):
        to = f"{elsewhere}/v1/models"  # another port of the same address is another origin
        with (
            stub({"GET /v1/models": Reply(302, b"", {"Location": to})}) as (url, _),
            pytest.raises(ServerAnswerError) as exc,
        ):
            ServerClient(url, token="s3cret").get("/v1/models")
    assert "a redirect to http://127.0.0.1:" in exc.value.message and "not followed" in exc.value.message
    assert exc.value.path == f"{url}/v1/models"
    assert other_seen == []


def test_a_redirect_on_the_same_host_is_followed_and_a_post_only_when_it_stays_a_post() -> None:
    routes = {
        "GET /old": Reply(301, b"", {"Location": "/new"}),
        "GET /new": Reply(200, {"ok": True}),
        "POST /keep": Reply(307, b"", {"Location": "/new-post"}),
        "POST /new-post": Reply(200, {"posted": True}),
        "POST /to-get": Reply(303, b"", {"Location": "/new"}),
    }
    with stub(routes) as (url, seen):
        client = ServerClient(url, token="t")
        assert client.get("/old").body == {"ok": True}
        assert client.post("/keep", {"a": 1}).body == {"posted": True}
        with pytest.raises(ServerAnswerError, match="as a GET, not followed"):
            client.post("/to-get", {"a": 1})
    assert [s.body for s in seen if s.path == "/new-post"] == [{"a": 1}]


def test_a_declared_length_over_the_cap_is_refused_before_reading() -> None:
    with (
        stub({"GET /props": Reply(200, b"x" * 2048)}) as (url, _),
        pytest.raises(ServerAnswerError, match="Content-Length 2048 is over 1024 bytes; not read further"),
    ):
        ServerClient(url, limits=HttpLimits(max_bytes=1024)).get("/props")


def test_a_body_without_a_length_is_cut_at_the_cap() -> None:
    with (
        stub({"GET /props": Reply(200, b"[" + b"1," * 50, drip=0.0001)}) as (url, _),
        pytest.raises(ServerAnswerError, match="the body is over 64 bytes"),
    ):
        ServerClient(url, limits=HttpLimits(max_bytes=64)).get("/props")


def test_a_slow_answer_is_a_timeout_for_the_whole_answer() -> None:
    # Each byte comes well within the timeout; the whole answer does not.
    with (
        stub({"GET /props": Reply(200, json.dumps({"a": "x" * 40}).encode(), drip=0.05)}) as (url, _),
        pytest.raises(ServerUnreachableError, match=r"no full answer within 0\.3 s"),
    ):
        ServerClient(url, limits=HttpLimits(timeout=0.3)).get("/props")


def test_nobody_listening() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: the connection is refused
        with pytest.raises(ServerUnreachableError) as exc:
            ServerClient(f"http://127.0.0.1:{port}").get("/v1/models")
    assert exc.value.path == f"http://127.0.0.1:{port}/v1/models" and "is the server running" in (exc.value.hint or "")


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply(500, {"error": {"message": "boom\nsecond line", "code": 500}}), "HTTP 500: boom second line"),
        (Reply(400, {"object": "error", "message": "bad tools", "type": "BadRequestError"}), "HTTP 400: bad tools"),
        (Reply(422, {"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}), "HTTP 422: [{"),
        (Reply(502, b"<html>Bad Gateway</html>"), "HTTP 502: <html>Bad Gateway</html>"),
    ],
)
def test_an_error_status_carries_the_servers_own_words(reply: Reply, message: str) -> None:
    with stub({"POST /tokenize": reply}) as (url, _):
        client = ServerClient(url)
        answer = client.post("/tokenize", {})
        with pytest.raises(ServerRefusedError) as exc:
            client.expect(answer, "/tokenize")
    assert exc.value.message.startswith(message) and exc.value.status == reply.status
    assert "\n" not in str(exc.value)


def test_401_says_to_pass_a_token() -> None:
    with stub(
        {"GET /v1/models": Reply(401, {"error": {"message": "Invalid API Key", "type": "authentication_error"}})}
    ) as (
        url,
        _,
    ):
        client = ServerClient(url)
        with pytest.raises(ServerRefusedError) as exc:
            client.expect(client.get("/v1/models"), "/v1/models")
    assert exc.value.status == 401 and "--token" in (exc.value.hint or "")


@pytest.mark.parametrize("body", [b'{"tokens": [1], "tokens": [2]}', b'{"a": NaN}', b"\xff\xfe", b"<html></html>"])
def test_a_2xx_answer_must_be_strict_json(body: bytes) -> None:
    with (
        stub({"GET /props": Reply(200, body)}) as (url, _),
        pytest.raises(ServerAnswerError, match="the answer is not JSON"),
    ):
        ServerClient(url).get("/props")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://host/", r"not an http\(s\) URL"),
        ("http://user:pw@host:8000", "the URL holds credentials"),
        ("http://host:8000/?model=x", "query or fragment"),
        ("http://host:99999", "not a port number"),
    ],
)
def test_a_url_it_will_not_call(url: str, why: str) -> None:
    with pytest.raises(InputError, match=why):
        ServerClient(url)


@settings(max_examples=examples(100), deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=8,
    )
)
def test_a_servers_message_is_one_bounded_line(body: object) -> None:
    raw = json.dumps(body).encode()
    for value in (
        body,
        {"error": body},
        {"error": {"message": body}},
        {"message": body, "hint": body},
        {"detail": body},
    ):
        text = server_message(value, raw)
        assert len(text) <= 300 and not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in text)
