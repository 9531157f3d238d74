"""`ctxlock serve`'s routes: the server's app, called in process through Starlette's TestClient (tests/serve_server.py;
what needs a socket, such as a Content-Length refused before the body, is in test_serve_network.py).

Shapes field for field against the anchors' documented lists (held here as JSON), exactness against Model.encode
on the conformance conversations, injection through every field, template refusals, 413 on a huge Content-Length
without reading it, 401 without a token, a render bomb that ends at the deadline while other requests are answered,
and no 500 on generated hostile bodies."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from conformance import conversations
from ctxlock import caches
from ctxlock.artifacts import load_template_file
from ctxlock.errors import ServeConfigError
from ctxlock.server.config import parse_config
from ctxlock.server.edge import RateLimiter
from hypothesis_profiles import examples
from serve_server import QWEN_TEMPLATE, SRC, TOKEN, another_client, in_process, write_config

# The anchors' documented response fields (vLLM TokenizeResponse / DetokenizeResponse, llama.cpp server README,
# Anthropic count_tokens, OpenAI responses.input_tokens).
VLLM_TOKENIZE_FIELDS = {"count", "max_model_len", "tokens", "token_strs"}
VLLM_DETOKENIZE_FIELDS = {"prompt"}
LLAMA_TOKENIZE_FIELDS = {"tokens"}
LLAMA_PIECE_FIELDS = {"id", "piece"}
LLAMA_APPLY_TEMPLATE_FIELDS = {"prompt"}
ANTHROPIC_COUNT_FIELDS = {"input_tokens"}
OPENAI_INPUT_TOKENS_FIELDS = {"object", "input_tokens"}
ERROR_FIELDS = {"type", "message", "path", "hint"}

HI = {"model": "nemo", "messages": [{"role": "user", "content": "hi [INST]"}]}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve") / "store"


@pytest.fixture(scope="module")
def http(store: Path) -> Iterator[httpx.Client]:
    with in_process(write_config(store.parent, store=store)) as c:
        yield c


@pytest.fixture(scope="module")
def nemo() -> ctxlock.Model:
    return ctxlock.load("mistral-nemo")


@pytest.fixture(scope="module")
def qwen() -> ctxlock.Model:
    return ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))


def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


def refused(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == ERROR_FIELDS
    return body


# --- shapes -------------------------------------------------------------------------------------------------------


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NEMO_CALL = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]'


def test_parse_route_reads_a_completion_back_into_the_message(http: httpx.Client, nemo: ctxlock.Model) -> None:
    body = ok(http.post("/v1/parse", json={"model": "nemo", "output": NEMO_CALL, "tools": [WEATHER_TOOL]}))
    call = {
        "id": "abcdefghi",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    assert body["message"] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert body["finish_reason"] == "tool_calls" and body["formats"] == {"tool_calls": "mistral", "reasoning": None}
    assert any("no finish_reason" in n for n in body["notes"])
    # The same completion as ids, ended by the output limit, in Anthropic's shape: no call, and the error says why.
    ids = nemo.tokenizer.encode(NEMO_CALL, parse_special=True)
    cut = {"model": "nemo", "output": ids, "tools": [WEATHER_TOOL], "finish_reason": "length", "shape": "anthropic"}
    body = ok(http.post("/v1/parse", json=cut))
    assert body["message"] == {"role": "assistant", "content": [], "stop_reason": "max_tokens"}
    assert [e["type"] for e in body["errors"]] == ["ToolCallTruncatedError"]
    assert refused(http.post("/v1/parse", json={"model": "nemo", "output": 3}), 400)["path"] == "$.output"
    assert refused(http.post("/v1/parse", json={"model": "nemo", "output": "", "x": 1}), 400)["path"] == "$.x"
    bad = {"model": "nemo", "output": "", "tool_format": "nope"}
    assert refused(http.post("/v1/parse", json=bad), 422)["type"] == "ToolCallError"


def test_vllm_tokenize_chat_form(http: httpx.Client) -> None:
    body = ok(http.post("/tokenize", json={**HI, "return_token_strs": True}))
    assert body == {
        "count": 8,
        "max_model_len": 131072,
        "tokens": [1, 3, 8101, 1766, 3174, 3074, 1093, 4],
        "token_strs": ["<s>", "[INST]", "hi", " [", "IN", "ST", "]", "[/INST]"],
    }


def test_vllm_tokenize_completion_form(http: httpx.Client) -> None:
    body = ok(http.post("/tokenize", json={"model": "nemo", "prompt": "hi [INST]"}))
    assert set(body) == VLLM_TOKENIZE_FIELDS
    assert body == {
        "count": 6,
        "max_model_len": 131072,
        "tokens": [1, 8101, 1766, 3174, 3074, 1093],
        "token_strs": None,
    }
    body = ok(http.post("/tokenize", json={"model": "nemo", "prompt": "hi", "add_special_tokens": False}))
    assert body["tokens"] == [8101]


def test_vllm_detokenize(http: httpx.Client) -> None:
    body = ok(http.post("/detokenize", json={"model": "nemo", "tokens": [1, 22177]}))
    assert set(body) == VLLM_DETOKENIZE_FIELDS
    assert body == {"prompt": "<s>Hello"}


def test_llama_cpp_tokenize_with_pieces(http: httpx.Client) -> None:
    body = ok(http.post("/tokenize", json={"model": "nemo", "content": "hi é"}))
    assert body == {"tokens": [8101, 1782]}
    body = ok(http.post("/tokenize", json={"model": "nemo", "content": "hi é", "with_pieces": True}))
    assert set(body) == LLAMA_TOKENIZE_FIELDS
    assert body == {"tokens": [{"id": 8101, "piece": "hi"}, {"id": 1782, "piece": " é"}]}
    assert all(set(t) == LLAMA_PIECE_FIELDS for t in body["tokens"])


def test_llama_cpp_apply_template(http: httpx.Client) -> None:
    # llama.cpp cuts the template's BOS text when the tokenizer adds a BOS itself (Nemo's does): common/chat.cpp.
    body = ok(http.post("/apply-template", json={"model": "nemo", "messages": [{"role": "user", "content": "hi"}]}))
    assert set(body) == LLAMA_APPLY_TEMPLATE_FIELDS
    assert body == {"prompt": "[INST]hi[/INST]"}
    body = ok(http.post("/apply-template", json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}))
    assert body["prompt"].startswith("<|im_start|>system\n")  # Qwen's tokenizer adds no BOS: nothing is cut


def test_anthropic_count_tokens(http: httpx.Client, nemo: ctxlock.Model) -> None:
    request = {"model": "nemo", "system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    body = ok(http.post("/v1/messages/count_tokens", json=request))
    assert set(body) == ANTHROPIC_COUNT_FIELDS
    expected = len(nemo.encode({k: v for k, v in request.items() if k != "model"}, dialect="anthropic")["input_ids"][0])
    assert body == {"input_tokens": expected}


def test_openai_input_tokens(http: httpx.Client, nemo: ctxlock.Model) -> None:
    request = {"model": "nemo", "instructions": "be brief", "input": "hi"}
    body = ok(http.post("/v1/responses/input_tokens", json=request))
    assert set(body) == OPENAI_INPUT_TOKENS_FIELDS
    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    assert body == {"object": "response.input_tokens", "input_tokens": len(nemo.encode(chat)["input_ids"][0])}


def test_own_render_count_and_models(http: httpx.Client, nemo: ctxlock.Model) -> None:
    request = {"messages": [{"role": "user", "content": "hi"}]}
    body = ok(http.post("/v1/render?model=nemo", content=json.dumps(request)))
    assert body["input_ids"] == [1, 3, 8101, 4] and body["text"] == "<s>[INST]hi[/INST]"
    assert body["request"]["sha256"] == nemo.parse(json.dumps(request).encode()).source_sha256
    counts = ok(http.post("/v1/count?model=nemo", content=json.dumps(request)))
    assert counts["total"] == 4 and sum(p["tokens"] for p in counts["parts"]) == 4
    models = ok(http.get("/v1/models"))
    assert [m["id"] for m in models["data"]] == ["nemo", "qwen", "bomb"]
    assert models["data"][0]["default"] is True


def test_fit_under_the_configured_budget(http: httpx.Client) -> None:
    request = {
        "messages": [
            {"role": "user", "content": "old question " * 20},
            {"role": "assistant", "content": "old answer " * 20},
            {"role": "user", "content": "new question"},
        ]
    }
    body = ok(http.post("/v1/fit?model=nemo", content=json.dumps(request)))
    assert len(body["input_ids"]) <= 64
    assert body["request"]["messages"] == [{"role": "user", "content": "new question"}]


def test_records_render_list_show_replay_diff(http: httpx.Client) -> None:
    rids = []
    for text in ("first", "second"):
        request = json.dumps({"messages": [{"role": "user", "content": text}]})
        rids.append(ok(http.post("/v1/render?model=nemo&record=1", content=request))["record_id"])
    listed = [r["id"] for r in ok(http.get("/v1/records"))]
    assert set(rids) <= set(listed)
    shown = ok(http.get(f"/v1/records/{rids[0]}"))
    assert shown["request"]["sha256"]
    replayed = ok(http.post(f"/v1/records/{rids[0]}/replay"))
    assert replayed["identical"] is True
    diffed = ok(http.post("/v1/diff", json={"a": rids[0], "b": rids[1]}))
    assert diffed["identical"] is False
    refused(http.get("/v1/records/" + "0" * 64), 404)
    refused(http.get("/v1/records/..%2F..%2Fetc%2Fpasswd"), 404)  # not a route: {id} holds no slash
    assert refused(http.get("/v1/records/..etc"), 400)["path"] == "{id}"  # an id is hex digits, never a path


def test_metrics_are_prometheus_text(http: httpx.Client) -> None:
    ok(http.post("/tokenize", json={**HI}))
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'ctxlock_requests_total{route="/tokenize",method="POST",status="200"}' in text
    assert 'ctxlock_request_seconds_bucket{route="/tokenize",le="+Inf"}' in text
    assert 'ctxlock_tokens_total{model="nemo"}' in text
    for line in text.splitlines():
        assert line.startswith("#") or len(line.rsplit(" ", 1)) == 2


def _samples(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(name + r'\{cache="([^"]+)"\} (\S+)', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def test_metrics_cache_hits_misses_and_ratio(http: httpx.Client) -> None:
    # A request never seen before misses the run cache; the same request again is answered from the caches.
    novel = {"model": "nemo", "messages": [{"role": "user", "content": f"metrics probe {time.time_ns()}"}]}
    ok(http.post("/tokenize", json=novel))
    before = http.get("/metrics").text
    ok(http.post("/tokenize", json=novel))
    after = http.get("/metrics").text
    assert "# TYPE ctxlock_cache_hits_total counter" in after and "# TYPE ctxlock_cache_hit_ratio gauge" in after
    h0, h1 = _samples(before, "ctxlock_cache_hits_total"), _samples(after, "ctxlock_cache_hits_total")
    m0, m1 = _samples(before, "ctxlock_cache_misses_total"), _samples(after, "ctxlock_cache_misses_total")
    ratio = _samples(after, "ctxlock_cache_hit_ratio")
    assert "tokenizer.runs" in h1 and "request.memo.messages" in h1
    assert h1["request.memo.messages"] > h0.get("request.memo.messages", 0)  # the repeat hit the memo
    assert all(h1[c] >= h0.get(c, 0) and m1[c] >= m0.get(c, 0) for c in h1)  # counters never go down
    for cache, r in ratio.items():
        if cache != "all":
            assert r == pytest.approx(h1[cache] / (h1[cache] + m1[cache]), abs=1e-6)
    assert ratio["all"] == pytest.approx(sum(h1.values()) / (sum(h1.values()) + sum(m1.values())), abs=1e-6)
    # Every registered cache has a size line; those that count nothing have no counters (never a made-up 0).
    sizes = _samples(after, "ctxlock_cache_entries")
    assert set(h1) <= set(sizes) and set(h1) == set(m1)


def test_the_cache_registry_counts_hits_and_misses() -> None:
    lru: caches.LRU[str, int] = caches.LRU(f"test.serve.lru.{time.time_ns()}", max_items=2)
    lru.put("a", 1)
    assert lru.get("a") == 1 and lru.get("b") is None and lru.get("a") == 1
    lru.clear()  # emptying a cache keeps its counts: they are counters
    info = caches.cache_info()[lru.name]
    assert (info.hits, info.misses, info.size) == (2, 1, 0)

    @caches.memoize(f"test.serve.memo.{time.time_ns()}", 4)
    def double(x: int) -> int:
        return 2 * x

    name = next(n for n in caches.cache_info() if n.startswith("test.serve.memo."))
    for x in (1, 1, 2, 1):
        double(x)
    caches.clear_caches("request")
    double(1)
    info = caches.cache_info()[name]
    assert (info.hits, info.misses, info.size) == (2, 3, 1)


# --- exactness ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "request_", "options"), conversations(), ids=[c[0] for c in conversations()])
def test_tokenize_chat_form_equals_model_encode(
    http: httpx.Client, qwen: ctxlock.Model, name: str, request_: dict[str, Any], options: dict[str, bool]
) -> None:
    template = load_template_file(QWEN_TEMPLATE)
    body = {"model": "qwen", **request_, **options}
    try:
        expected = qwen.encode(request_, chat_template=template, **options)["input_ids"][0].tolist()
    except ctxlock.CtxlockError as exc:
        assert http.post("/tokenize", json=body).json()["type"] == type(exc).__name__
        return
    got = ok(http.post("/tokenize", json=body))
    assert got["tokens"] == expected and got["count"] == len(expected)
    back = ok(http.post("/detokenize", json={"model": "qwen", "tokens": got["tokens"]}))
    assert back["prompt"] == qwen.tokenizer.decode(expected)
    # Round trip: the rendered text, as Qwen 2's tokenizer normalizes it (NFC: decomposed marks come back composed).
    assert back["prompt"] == unicodedata.normalize("NFC", qwen.render(request_, chat_template=template, **options).text)


# --- injection ----------------------------------------------------------------------------------------------------


def control_ids(model: ctxlock.Model, ids: list[int]) -> list[int]:
    special = model.tokenizer.token_bytes().special
    return [i for i in ids if i in special]


INJECTIONS = ["[INST]", "<s>", "</s>", "[/INST][INST]", "<|im_start|>system\n", "<|im_end|>", "<|endoftext|>"]


def _variants(payload: str) -> list[tuple[str, dict[str, Any]]]:
    tool = {"type": "function", "function": {"name": "f", "description": payload, "parameters": {"type": "object"}}}
    call = {"id": "abcdefghi", "type": "function", "function": {"name": "f", "arguments": {"q": payload}}}
    return [
        ("/tokenize", {"messages": [{"role": "user", "content": payload}]}),
        ("/tokenize", {"messages": [{"role": "system", "content": payload}, {"role": "user", "content": "x"}]}),
        ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "tools": [tool]}),
        (
            "/tokenize",
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "abcdefghi", "content": payload},
                ]
            },
        ),
        ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"extra": payload}}),
        ("/tokenize", {"prompt": payload}),
        ("/tokenize", {"content": payload}),
    ]


@pytest.mark.parametrize("model_name", ["nemo", "qwen"])
@pytest.mark.parametrize("payload", INJECTIONS)
def test_injection_gives_the_control_ids_of_its_neutral_twin(
    http: httpx.Client, nemo: ctxlock.Model, qwen: ctxlock.Model, model_name: str, payload: str
) -> None:
    model = nemo if model_name == "nemo" else qwen
    twin = "x" * len(payload)
    for (route, attack), (_, neutral) in zip(_variants(payload), _variants(twin), strict=True):
        a = ok(http.post(route, json={"model": model_name, **attack}))["tokens"]
        b = ok(http.post(route, json={"model": model_name, **neutral}))["tokens"]
        assert control_ids(model, a) == control_ids(model, b), (route, attack)


def test_provider_counts_of_injections_are_the_injection_safe_encode(http: httpx.Client, nemo: ctxlock.Model) -> None:
    # The counts are len(input_ids) of the same exact encode whose control ids the test above checks.
    for payload in INJECTIONS:
        request = {"system": payload, "messages": [{"role": "user", "content": payload}]}
        expected = len(nemo.encode(request, dialect="anthropic")["input_ids"][0])
        got = ok(http.post("/v1/messages/count_tokens", json={"model": "nemo", **request}))
        assert got == {"input_tokens": expected}
        chat = {"messages": [{"role": "system", "content": payload}, {"role": "user", "content": payload}]}
        body = {"model": "nemo", "instructions": payload, "input": [{"role": "user", "content": payload}]}
        got = ok(http.post("/v1/responses/input_tokens", json=body))
        assert got["input_tokens"] == len(nemo.encode(chat)["input_ids"][0])


# --- refusals -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {**HI, "chat_template": "{{ 'x' * 999999999 }}"},
        {**HI, "chat_template": "default"},
        {**HI, "chat_template": "/etc/passwd"},
        {**HI, "chat_template_kwargs": {"chat_template": "{% for x in range(99999999) %}{% endfor %}"}},
        {**HI, "chat_template_kwargs": {"bos_token": "[INST]"}},
        {**HI, "chat_template_kwargs": {"messages": []}},
        {**HI, "chat_template_kwargs": {"tokenize": True}},
        {**HI, "chat_template_kwargs": {"not a name": 1}},
        {**HI, "mm_processor_kwargs": {}},
        {**HI, "model": "/root/.cache/ctxlock-test"},
        {**HI, "model": "mistral-nemo"},
        {"content": "x", "parse_special": "yes"},
    ],
)
def test_request_templates_paths_and_smuggling_are_refused(http: httpx.Client, body: dict[str, Any]) -> None:
    r = http.post("/tokenize", json=body)
    assert r.status_code in (400, 404), r.text
    assert set(r.json()) == ERROR_FIELDS


def test_apply_template_refuses_a_request_template(http: httpx.Client) -> None:
    r = http.post("/apply-template", json={**HI, "chat_template": "{{ messages }}"})
    assert refused(r, 400)["path"] == "$.chat_template"


CHAT_ROUTES = [
    ("/tokenize", lambda body: body),
    ("/apply-template", lambda body: body),
    ("/v1/messages/count_tokens", lambda body: body),
    ("/v1/render?model=nemo", lambda body: {k: v for k, v in body.items() if k != "model"}),
    ("/v1/count?model=nemo", lambda body: {k: v for k, v in body.items() if k != "model"}),
]


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({"template": "{{ 7 * 7 }}"}, 200),  # an ordinary template variable: no peer reads a template from it
        ({"chat_template": "{{ 7 * 7 }}"}, 400),
        ({"bos_token": "[INST]"}, 400),
        ({"tokenize": True}, 400),
    ],
)
def test_chat_template_kwargs_follow_one_rule_on_every_route(
    http: httpx.Client, kwargs: dict[str, Any], status: int
) -> None:
    for route, shape in CHAT_ROUTES:
        r = http.post(route, json=shape({**HI, "chat_template_kwargs": kwargs}))
        assert r.status_code == status, (route, r.text)
        if status == 400:
            assert r.json()["path"].endswith(next(iter(kwargs))), route


def test_a_chunked_body_over_the_limit_is_413(http: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * 16384

    r = http.post("/tokenize", content=chunks())
    assert refused(r, 413)["type"] == "BodyTooLargeError"


def test_without_a_token_every_protected_route_is_401(http: httpx.Client) -> None:
    protected = [
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/apply-template"),
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/v1/responses/input_tokens"),
        ("POST", "/v1/render"),
        ("POST", "/v1/count"),
        ("POST", "/v1/fit"),
        ("GET", "/v1/records"),
        ("GET", "/v1/records/abcd"),
        ("POST", "/v1/records/abcd/replay"),
        ("POST", "/v1/diff"),
        ("POST", "/v1/parse"),
        ("GET", "/v1/models"),
        ("GET", "/tokenizer_info"),
        ("GET", "/metrics"),
        ("GET", "/records/abcd/view"),
        ("GET", "/diff/abcd/abcd/view"),
    ]
    for token in (None, "wrong", TOKEN + "x", TOKEN[:-1]):
        c = another_client(http, token=token)  # not entered: leaving it would end the app's lifespan
        for method, path in protected:
            r = c.request(method, path, content=b"{}")
            assert refused(r, 401)["type"] == "AuthError", (token, path)
        for path in ("/v1/chat/completions/render", "/v1/completions/render"):  # vLLM's routes: vLLM's error shape
            r = c.post(path, content=b"{}")
            assert r.status_code == 401 and r.json()["error"]["type"] == "UnauthorizedError", (token, path)
        assert c.get("/healthz").status_code == 200


def test_render_bomb_ends_at_the_deadline_while_others_are_answered(http: httpx.Client) -> None:
    outcome: dict[str, Any] = {}

    def bomb() -> None:
        start = time.monotonic()
        r = http.post("/tokenize", json={"model": "bomb", "messages": [{"role": "user", "content": "hi"}]})
        outcome["status"], outcome["body"], outcome["seconds"] = r.status_code, r.json(), time.monotonic() - start

    t = threading.Thread(target=bomb)
    t.start()
    time.sleep(0.3)
    answered = 0
    while t.is_alive():
        assert ok(http.post("/tokenize", json=HI))["count"] == 8
        answered += 1
    t.join()
    assert answered >= 1
    assert outcome["status"] == 422 and outcome["body"]["type"] == "TemplateLimitError"
    assert outcome["seconds"] < 2.0 + 3.0


# --- hostile bodies -----------------------------------------------------------------------------------------------

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=30),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    [
        "model",
        "prompt",
        "messages",
        "tools",
        "content",
        "tokens",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "with_pieces",
        "input",
        "system",
        "a",
        "b",
        "output",
        "tool_format",
        "reasoning",
    ]
)
ROUTES = [
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/v1/messages/count_tokens",
    "/v1/responses/input_tokens",
    "/v1/render",
    "/v1/count",
    "/v1/fit",
    "/v1/diff",
    "/v1/parse",
]


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    route=st.sampled_from(ROUTES),
    body=st.dictionaries(FIELDS, JSONISH, max_size=5) | JSONISH,
    raw=st.binary(max_size=64),
    use_raw=st.booleans(),
)
def test_no_hostile_body_gets_a_500(http: httpx.Client, route: str, body: Any, raw: bytes, use_raw: bool) -> None:
    content = raw if use_raw else json.dumps(body, allow_nan=True).encode()
    r = http.post(route, content=content)
    assert r.status_code < 500 or r.status_code == 503, r.text
    if r.status_code != 200:
        assert set(r.json()) == ERROR_FIELDS


def test_unknown_route_and_method_are_json(http: httpx.Client) -> None:
    assert refused(http.get("/nope"), 404)["type"] == "RouteNotFoundError"
    assert refused(http.get("/tokenize"), 405)["type"] == "RouteNotFoundError"


def test_readme_config_example_parses(tmp_path: Path) -> None:
    from ctxlock.server.config import load_config

    cfg = write_config(tmp_path, store=tmp_path / "store")
    loaded = load_config(cfg)
    assert [m.name for m in loaded.models] == ["nemo", "qwen", "bomb"] and loaded.tokens == (TOKEN,)


CACHE_REPORT_FLAGS = ["--provider", "openai", "--fix", "--model", "mistral-nemo", "--json"]


def test_cache_report_is_the_cli_json(http: httpx.Client, tmp_path: Path) -> None:
    system = "You are a careful assistant. " * 60
    turns = [
        {"messages": [{"role": "system", "content": system}, {"role": "user", "content": f"q{i}"}]} for i in range(3)
    ]
    session = "".join(json.dumps(t) + "\n" for t in turns)
    (tmp_path / "s.jsonl").write_text(session, "utf-8")
    got = ok(http.post("/v1/cache-report?model=nemo&provider=openai&fix=1", content=session.encode()))
    cli = subprocess.run(
        [sys.executable, "-m", "ctxlock", "cache-report", str(tmp_path / "s.jsonl"), *CACHE_REPORT_FLAGS],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert cli.returncode == 0, cli.stderr
    assert got == json.loads(cli.stdout)
    assert len(got["turns"]) == 3
    refused(http.post("/v1/cache-report?model=nemo&provider=nobody", content=session.encode()), 422)


SEED = Path(__file__).resolve().parents[2] / "examples" / "seed-sky-injection.json"


def test_record_view_is_one_self_contained_page(http: httpx.Client, store: Path, tmp_path: Path) -> None:
    rendered = ok(http.post("/v1/render?model=nemo&record=1", content=SEED.read_bytes()))
    rid = rendered["record_id"]
    r = http.get(f"/records/{rid}/view")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == "default-src 'none'; style-src 'unsafe-inline'"
    page = r.text
    chips = re.findall(r'<span class="chip k-(\w+)( neutralized)?" data-id="(\d+)"', page)
    assert [int(c[2]) for c in chips] == rendered["input_ids"]  # one chip per token, in order
    neutralized = [c for c in chips if c[1]]
    assert neutralized and all(c[0] == "user" for c in neutralized)
    assert sum(c[0] == "control" for c in chips) == len(rendered["control_tokens"])
    assert not re.search(r"(?i)https?://|<script|<link|<img|src=", page)  # nothing loads from anywhere
    out = tmp_path / "page.html"
    cli = subprocess.run(
        [sys.executable, "-m", "ctxlock", "view", rid, "--store", str(store), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert cli.returncode == 0, cli.stderr
    assert out.read_text("utf-8") == page


@settings(max_examples=examples(60), deadline=None)
@given(
    rate=st.floats(0.1, 100.0),
    burst=st.integers(0, 20),
    gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=200),
)
def test_the_rate_limiter_never_lets_through_more_than_burst_plus_rate_times_time(
    rate: float, burst: int, gaps: list[float]
) -> None:
    limiter = RateLimiter(rate, burst)
    now, allowed = 0.0, 0
    for gap in gaps:
        now += gap
        wait = limiter.wait("token", now)
        if wait == 0.0:
            allowed += 1
        else:
            assert wait > 0 and limiter.wait("token", now + wait + 1e-9) == 0.0  # Retry-After is honest
            allowed += 1
            now += wait + 1e-9
    assert allowed <= limiter.capacity + rate * now + 1e-6


def test_the_rate_limiter_keeps_a_bounded_number_of_buckets_under_many_addresses() -> None:
    limiter = RateLimiter(1.0, 1, max_keys=64)
    for k in range(10_000):  # a flood from distinct client addresses
        limiter.wait(("client", f"10.0.{k // 256}.{k % 256}"), 0.0)
        assert len(limiter.buckets) <= 64
    assert limiter.wait(("client", "10.0.39.15"), 0.0) > 0  # the newest addresses are still limited


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ({"fallback_model": "nemo"}, None),
        ({"fallback_model": "gpt-4"}, "server.fallback_model"),  # must name a configured model
        ({"fallback_model": 3}, "server.fallback_model"),
        ({}, None),  # off unless set
    ],
)
def test_fallback_model_names_a_configured_model(table: dict[str, Any], error: str | None) -> None:
    data = {"server": table, "models": {"nemo": {"spec": "mistral-nemo"}}}
    if error is None:
        assert parse_config(data, base=Path.cwd(), source="t").fallback_model == table.get("fallback_model")
    else:
        with pytest.raises(ServeConfigError) as info:
            parse_config(data, base=Path.cwd(), source="t")
        assert info.value.path == error


def test_error_hints_name_no_python_keyword(http: httpx.Client) -> None:
    """A lone surrogate escape in a body: the hint is the HTTP client's (no `utf8='replace'`, which only Python
    callers can pass)."""
    body = b'{"messages": [{"role": "user", "content": "\\ud800"}]}'
    r = http.post("/v1/render?model=nemo", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()
    assert "surrogate" in error["message"] and "utf8=" not in error["hint"], error
