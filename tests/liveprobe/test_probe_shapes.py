"""Server detection and the answer shapes no server in the suite gives, over loopback with a scripted server: vLLM's
`/v1/chat/completions/render` in its first shape (vLLM's tests/entrypoints/openai/test_render.py before
vllm-project/vllm#35684: `[conversation, [{prompt, prompt_token_ids}]]`) and absent (501, as vLLM answers without a
renderer), vLLM's and llama.cpp's `/v1/models` rows, and what the report says when a server refuses a probe or adds
a BOS. The route's current shape, a `GenerateRequest`, is `ctxlock serve`'s own, probed in test_probe_serve.py. The
ids the scripted server answers are ctxlock's own (its exact render of the same model), so what is tested is the
reading of each shape, the verdicts and the causes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from stub_server import Reply, Seen, stub

import fetched
from ctxlock.artifacts import load_template_file
from ctxlock.errors import InputError, ServerAnswerError
from ctxlock.liveprobe import Verdict, probe_server, read_manifest
from ctxlock.model import Model, load
from ctxlock.probes import load_corpus
from ctxlock.template import ChatTemplate

QWEN = fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"
BASE = "Qwen/Qwen2.5-7B-Instruct"
VLLM_MODELS = {
    "object": "list",
    "data": [
        {"id": BASE, "object": "model", "owned_by": "vllm", "root": BASE, "parent": None, "max_model_len": 32768},
        {"id": "my-lora", "object": "model", "owned_by": "vllm", "root": "/loras/my", "parent": BASE},
    ],
}


@pytest.fixture(scope="module")
def model() -> Model:
    return load(str(fetched.gguf_path("qwen2")))


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return load_template_file(QWEN)


def encoder(model: Model, template: ChatTemplate) -> Callable[[dict[str, Any]], tuple[str, list[int]]]:
    """What a server with this model and template renders for a chat body: (text, ids)."""

    def encode(body: dict[str, Any]) -> tuple[str, list[int]]:
        request = {k: body[k] for k in ("messages", "tools", "documents") if body.get(k) is not None}
        cont = bool(body.get("continue_final_message"))
        options = {
            "add_generation_prompt": body.get("add_generation_prompt", True) and not cont,
            "continue_final_message": cont,
            "chat_template": template,
            "chat_template_kwargs": body.get("chat_template_kwargs"),
        }
        run = model.run(request, **options)
        return run.rendered.text, run.model_input.input_ids[0].tolist()

    return encode


def vllm_routes(model: Model, template: ChatTemplate, render: Callable[[Seen], Reply] | None) -> dict[str, Any]:
    encode = encoder(model, template)
    routes: dict[str, Any] = {
        "GET /v1/models": Reply(200, VLLM_MODELS),
        "GET /version": Reply(200, {"version": "0.16.0"}),
        "POST /tokenize": lambda r: Reply(200, {"count": 0, "max_model_len": 32768, "tokens": encode(r.body)[1]}),
        "POST /detokenize": lambda r: Reply(200, {"prompt": model.tokenizer.decode(r.body["tokens"])}),
    }
    if render is not None:
        routes["POST /v1/chat/completions/render"] = render
    return routes


@pytest.fixture
def vllm(model: Model, template: ChatTemplate) -> Iterator[Callable[..., Any]]:
    def serve(render: Callable[[Seen], Reply] | None) -> Any:
        return stub(vllm_routes(model, template, render))

    yield serve


def test_vllm_render_route_in_its_first_shape_and_a_bos_it_adds(
    vllm: Callable[..., Any], model: Model, template: ChatTemplate
) -> None:
    encode = encoder(model, template)

    def render(r: Seen) -> Reply:
        text, ids = encode(r.body)
        return Reply(200, [r.body["messages"], [{"prompt": text, "prompt_token_ids": [151643, *ids]}]])

    with vllm(render) as (url, _):
        report = probe_server(url, model, template=template, corpus=load_corpus(only=["user", "system"]))
    diverged = report.divergences
    assert [r.route for r in diverged] == [report.routes[1].name] * 2
    for r in diverged:
        assert r.divergence is not None and r.divergence.index == 0 and r.divergence.b_id == 151643
        assert r.cause is not None and r.cause.kind == "special tokens"
        assert "the server's ids have one more token at the start" in r.cause.detail


def test_vllm_detected_and_a_render_route_it_lacks_named_absent(vllm: Callable[..., Any], model: Model) -> None:
    refuse = Reply(501, {"error": {"message": "The model does not support Chat Completions Render API"}})
    with vllm(lambda _r: refuse) as (url, seen):
        corpus = load_corpus(only=["user", "documents"])
        report = probe_server(url, model, template=load_template_file(QWEN), corpus=corpus)
    s = report.server
    assert (s.kind, s.model, s.version) == ("vllm", BASE, "0.16.0")  # the base model, not the LoRA adapter
    assert s.detected == "GET /v1/models: owned_by 'vllm'"
    render = report.routes[1]
    assert [r.used for r in report.routes] == [True, False]
    assert render.why.startswith("the server does not have it (HTTP 501: The model does not support Chat")
    assert "--enable-scale-out" in render.why
    assert [x.path for x in seen].count("/v1/chat/completions/render") == 1  # asked once, then not again
    assert [(r.probe, str(r.verdict)) for r in report.results] == [("user", "agree"), ("documents", "not sent")]
    tokenize = [x for x in seen if x.path == "/tokenize"]
    assert [x.body["model"] for x in tokenize] == [BASE] and tokenize[0].body["add_special_tokens"] is False


def test_a_probe_the_server_refuses(model: Model, template: ChatTemplate) -> None:
    routes = vllm_routes(model, template, None)
    plain = routes["POST /tokenize"]

    def tokenize(r: Seen) -> Reply:
        if r.body.get("tools"):
            return Reply(400, {"object": "error", "message": "tools are not supported", "code": 400})
        return plain(r)

    routes["POST /tokenize"] = tokenize
    with stub(routes) as (url, _):
        report = probe_server(url, model, template=template, kind="vllm", corpus=load_corpus(only=["user", "tools"]))
    got = {r.probe: r for r in report.results if r.route.startswith("POST /tokenize")}
    assert got["user"].verdict is Verdict.AGREE
    tools = got["tools"]
    assert tools.verdict is Verdict.DIVERGE and tools.cause is not None and tools.cause.kind == "server refused"
    assert "HTTP 400: tools are not supported" in tools.cause.detail


LLAMA_MODELS = {
    "object": "list",
    "data": [{"id": "qwen.gguf", "object": "model", "owned_by": "llamacpp", "meta": {"n_vocab": 151936}}],
}


def test_llama_server_rows_props_and_a_manifest(model: Model, template: ChatTemplate, tmp_path: Any) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(f'{{"template_sha256": "{template.sha256}", "tokenizer_sha256": "{model.tokenizer.sha256}"}}')
    props = {"build_info": "b9999-deadbeef", "chat_template": template.source, "bos_token": "", "eos_token": ""}
    with stub({"GET /v1/models": Reply(200, LLAMA_MODELS), "GET /props": Reply(200, props)}) as (url, _):
        report = probe_server(url, None, manifest=read_manifest(manifest))
    assert (report.server.kind, report.server.version) == ("llamacpp", "b9999-deadbeef")
    assert report.manifest is not None
    template_check, tokenizer_check = report.manifest.checks
    assert (template_check.status, template_check.detail) == ("same", "GET /props chat_template")
    assert tokenizer_check.status == "not checked"
    assert tokenizer_check.detail == "llamacpp answers no tokenizer digest (its /v1/models gives n_vocab 151936)"
    assert report.ok


def test_several_models_need_a_name_and_an_unknown_server_needs_a_kind() -> None:
    two = {"data": [dict(LLAMA_MODELS["data"][0], id=n) for n in ("a.gguf", "b.gguf")]}
    with stub({"GET /v1/models": Reply(200, two)}) as (url, _), pytest.raises(InputError) as exc:
        probe_server(url, None, manifest=None)
    assert exc.value.path == "--served-model" and "a.gguf, b.gguf" in (exc.value.hint or "")
    with stub({}) as (url, seen), pytest.raises(ServerAnswerError) as unknown:
        probe_server(url, None)
    assert "pass --kind" in (unknown.value.hint or "")
    assert [x.path for x in seen] == ["/v1/models", "/props", "/version"]
