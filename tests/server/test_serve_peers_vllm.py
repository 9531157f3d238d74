"""vLLM's own tokenization and render tests (vllm-project/vllm tests/entrypoints/serve/tokenize/test_tokenization.py
and tests/entrypoints/serve/render/test_render.py, formerly tests/entrypoints/openai/), run against `ctxlock serve`,
with transformers as the reference exactly as the peer's test uses it: the expected ids are
`tokenizer.encode(tokenizer.apply_chat_template(..., tokenize=False), add_special_tokens=...)`. The render routes
answer vLLM's `GenerateRequest` (`{request_id, token_ids, sampling_params, ...}`) and vLLM's error shape
(`{"error": {message, type, param, code}}`); where the peer's render test only checks that there are ids, these
check that they are the reference's.

Two HF tokenizers stand in for the peer's model: Qwen 2.5 (its tokenizer adds no special tokens, so the chat form's
`add_special_tokens` changes nothing) and phi-3 (it adds a BOS, and its template writes one too: the peer's answer has
two, and ctxlock's says so in `double_bos`). The model is named by the peer's own kind of name, a hub id. The
/tokenizer_info cases are not followed (docs/serve-compat.md says why)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

import fetched
from serve_server import QWEN_TEMPLATE, TOKEN, in_process

MODELS = {"Qwen/Qwen2.5-7B-Instruct": "qwen2", "microsoft/Phi-3-mini-4k-instruct": "phi-3"}
TEMPLATE = {"qwen2": QWEN_TEMPLATE.read_text("utf-8"), "phi-3": None}  # None: the directory's own
MAX_MODEL_LEN = 8192


def write_config(root: Path) -> Path:
    cfg = root / "ctxlock.toml"
    cfg.write_text(
        f"""
[server]
tokens = ["{TOKEN}"]

[models."Qwen/Qwen2.5-7B-Instruct"]
spec = "{fetched.hf_tokenizer_dir("qwen2")}"
template = "{QWEN_TEMPLATE}"
max_model_len = {MAX_MODEL_LEN}

[models."microsoft/Phi-3-mini-4k-instruct"]
spec = "{fetched.hf_tokenizer_dir("phi-3")}"
max_model_len = {MAX_MODEL_LEN}
""",
        "utf-8",
    )
    return cfg


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    root = tmp_path_factory.mktemp("peers-vllm")
    with in_process(write_config(root)) as c:
        yield c


@functools.cache
def reference(model: str) -> Any:
    return AutoTokenizer.from_pretrained(str(fetched.hf_tokenizer_dir(MODELS[model])))


def expected_chat(model: str, conversation: list, tools: list | None, agp: bool, cont: bool, special: bool) -> list:
    tok = reference(model)
    prompt = tok.apply_chat_template(
        conversation,
        tools=tools,
        add_generation_prompt=agp,
        continue_final_message=cont,
        tokenize=False,
        chat_template=TEMPLATE[MODELS[model]],
    )
    return tok.encode(prompt, add_special_tokens=special)


def tokenize(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("add_special", [False, True])
def test_tokenize_completions(http: httpx.Client, model: str, add_special: bool) -> None:
    prompt = "vllm1 This is a test prompt."
    tokens = reference(model).encode(prompt, add_special_tokens=add_special)
    result = tokenize(http, {"add_special_tokens": add_special, "model": model, "prompt": prompt})
    assert result["tokens"] == tokens and result["count"] == len(tokens)
    assert result["max_model_len"] == MAX_MODEL_LEN and result["token_strs"] is None


CHAT = [
    {"role": "user", "content": "Hi there!"},
    {"role": "assistant", "content": "Nice to meet you!"},
    {"role": "user", "content": "Can I ask a question? vllm1"},
]
TOOL_CHAT = [{"role": "user", "content": "What's the weather like in Paris today?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
        },
    }
]
# The peer's loops: add_generation_prompt x add_special_tokens x continue_final_message (not with a generation
# prompt); continuing appends an assistant "Sure," to the conversation.
LOOPS = [(agp, special, cont) for agp in (False, True) for special in (False, True) for cont in (False, True)]
CHAT_CASES = [
    (conversation, tools, agp, special, cont)
    for conversation, tools in ((CHAT, None), (TOOL_CHAT, TOOLS))
    for agp, special, cont in LOOPS
    if not (agp and cont)
]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("conversation", "tools", "agp", "special", "cont"), CHAT_CASES)
def test_tokenize_and_render_chat(
    http: httpx.Client, model: str, conversation: list, tools: list | None, agp: bool, special: bool, cont: bool
) -> None:
    if cont:
        conversation = [*conversation, {"role": "assistant", "content": "Sure,"}]
    tokens = expected_chat(model, conversation, tools, agp, cont, special)
    body: dict[str, Any] = {
        "add_generation_prompt": agp,
        "continue_final_message": cont,
        "add_special_tokens": special,
        "messages": conversation,
        "model": model,
    }
    if tools is not None:
        body["tools"] = tools
    result = tokenize(http, body)
    assert result["tokens"] == tokens and result["count"] == len(tokens)
    assert result["max_model_len"] == MAX_MODEL_LEN and result["token_strs"] is None
    bos = reference(model).bos_token_id
    if special:  # ctxlock's one addition to the peer's answer: whether add_special_tokens gave a second BOS
        assert result["double_bos"] is (tokens[:2] == [bos, bos])
        assert result["double_bos"] is (model.startswith("microsoft/"))
    else:
        assert "double_bos" not in result
    # The same body on the chat render route: the same ids, as vLLM's render and /tokenize share its renderer.
    r = http.post("/v1/chat/completions/render", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["token_ids"] == tokens


@pytest.mark.parametrize("model", MODELS)
def test_tokenize_with_return_token_strs(http: httpx.Client, model: str) -> None:
    prompt = "This is a token_strs test prompt! vllm1"
    result = tokenize(http, {"prompt": prompt, "model": model, "return_token_strs": True})
    tokens = reference(model).encode(prompt, add_special_tokens=True)
    assert result["tokens"] == tokens and result["count"] == len(tokens)
    assert result["max_model_len"] == MAX_MODEL_LEN
    assert result["token_strs"] == reference(model).convert_ids_to_tokens(tokens)


@pytest.mark.parametrize("model", MODELS)
def test_detokenize(http: httpx.Client, model: str) -> None:
    prompt = "This is a test prompt. vllm1"
    tokens = reference(model).encode(prompt, add_special_tokens=False)
    r = http.post("/detokenize", json={"model": model, "tokens": tokens})
    assert r.status_code == 200 and r.json() == {"prompt": prompt}


@pytest.mark.parametrize("model", MODELS)
def test_an_unknown_model_name_is_404_as_in_vllm(http: httpx.Client, model: str) -> None:
    # No fallback_model in this config: vLLM refuses a name it does not serve, and so does ctxlock.
    r = http.post("/tokenize", json={"model": model + "-nope", "prompt": "hi"})
    assert r.status_code == 404 and r.json()["type"] == "RouteNotFoundError"


# --- /tokenizer_info (vLLM serves it with --enable-tokenizer-info-endpoint) ---------------------------------------

INFO_TYPES = {
    "add_bos_token": bool,
    "add_prefix_space": bool,
    "clean_up_tokenization_spaces": bool,
    "split_special_tokens": bool,
    "bos_token": str,
    "eos_token": str,
    "pad_token": str,
    "unk_token": str,
    "chat_template": str,
    "errors": str,
    "model_max_length": int,
    "additional_special_tokens": list,
    "added_tokens_decoder": dict,
}


@pytest.mark.parametrize("query", ["", "?model=microsoft/Phi-3-mini-4k-instruct"])
def test_tokenizer_info(http: httpx.Client, query: str) -> None:
    r = http.get("/tokenizer_info" + query)
    assert r.status_code == 200, r.text
    info = r.json()
    # test_tokenizer_info_basic
    assert isinstance(info["tokenizer_class"], str) and info["tokenizer_class"]
    # test_tokenizer_info_schema
    for field, kind in INFO_TYPES.items():
        if info.get(field) is not None:
            assert isinstance(info[field], kind), field
    # test_tokenizer_info_added_tokens_structure (in the older copy of the file)
    for token_id, token in info["added_tokens_decoder"].items():
        assert isinstance(token_id, str) and isinstance(token["content"], str) and isinstance(token["special"], bool)
    # test_tokenizer_info_consistency_with_tokenize
    model = query.removeprefix("?model=") or next(iter(MODELS))
    assert info["model_max_length"] >= tokenize(http, {"model": model, "prompt": "Hello world!"})["max_model_len"]
    # test_tokenizer_info_chat_template
    assert isinstance(info["chat_template"], str) and info["chat_template"].strip()
    # and the facts against the reference: what add_special_tokens adds, the added tokens
    ref = reference(model)
    assert info["add_bos_token"] is (ref.encode("a")[0] == ref.bos_token_id and ref.bos_token_id is not None)
    assert {int(k): v["content"] for k, v in info["added_tokens_decoder"].items()} == {
        k: v.content for k, v in ref.added_tokens_decoder.items()
    }
    # the named tokens are the tokenizer's (eos_token even where encoding adds no EOS), as transformers reads them
    assert info["eos_token"] == ref.eos_token
    assert all(info.get(k) == getattr(ref, k) for k in ("bos_token", "pad_token", "unk_token") if k in info)


def test_tokenizer_info_takes_one_model(http: httpx.Client) -> None:
    a, b = list(MODELS)[:2]
    r = http.get(f"/tokenizer_info?model={a}&model={b}")
    assert r.status_code == 400 and r.json()["path"] == "?model", r.text


# --- /v1/chat/completions/render and /v1/completions/render (vLLM's render endpoints) ------------------------------

RENDER_CHAT = [{"role": "user", "content": "Returning an empty string for the prompt may be confusing."}]
MULTI_TURN = [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there!"},
    {"role": "user", "content": "How are you?"},
]


def render(http: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("conversation", [RENDER_CHAT, MULTI_TURN], ids=["basic", "multi-turn"])
def test_chat_completion_render(http: httpx.Client, model: str, conversation: list) -> None:
    data = render(http, "/v1/chat/completions/render", {"model": model, "messages": conversation})
    # test_chat_completion_render_basic / _multi_turn: one GenerateRequest, its ids the rendered prompt's
    assert isinstance(data, dict) and data["request_id"].startswith("chatcmpl-")
    assert data["token_ids"] == expected_chat(model, conversation, None, True, False, False)
    assert (data["model"], data["features"], data["sampling_params"]) == (model, None, {})
    assert (data["stream"], data["stream_options"], data["priority"]) == (False, None, 0)
    if model.startswith("microsoft/"):  # the peer checks "BOS token (usually 1 for LLaMA models)": phi-3 writes it
        assert data["token_ids"][0] == 1
    assert "ignored" not in data


def test_chat_completion_render_with_stream_and_sampling_params(http: httpx.Client) -> None:
    # test_chat_completion_render_with_stream_true and _with_sampling_params: the stream fields and the sampling
    # settings are carried over into the GenerateRequest; a generation setting that does not change the ids is named.
    body = {
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "messages": [{"role": "user", "content": "Test sampling params"}],
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "temperature": 0.123,
        "top_p": 0.456,
        "frequency_penalty": 1.1,
        "max_completion_tokens": 7,
        "logprobs": True,
        "top_logprobs": 3,
        "tool_choice": "auto",
    }
    data = render(http, "/v1/chat/completions/render", body)
    assert data["stream"] is True and data["stream_options"] == body["stream_options"]
    assert data["sampling_params"] == {
        "temperature": 0.123, "top_p": 0.456, "frequency_penalty": 1.1, "max_tokens": 7, "logprobs": 3,
    }  # fmt: skip
    assert "_all_stop_token_ids" not in data["sampling_params"]
    assert [i["path"] for i in data["ignored"]] == ["tool_choice"]


@pytest.mark.parametrize("model", MODELS)
def test_completion_render(http: httpx.Client, model: str) -> None:
    # test_completion_render_basic and _multiple_prompts: a list of GenerateRequests, one per prompt, with the
    # tokenizer's special tokens added (the completions default); ids are taken as sent
    prompts = ["When should a chat-completions handler return an empty string?", "Hello world", "Goodbye world"]
    data = render(http, "/v1/completions/render", {"model": model, "prompt": prompts})
    assert [d["token_ids"] for d in data] == [reference(model).encode(p) for p in prompts]
    assert all(d["request_id"].startswith("cmpl-") and d["model"] == model for d in data)
    assert all("sampling_params" in d for d in data)
    (one,) = render(http, "/v1/completions/render", {"model": model, "prompt": prompts[0], "add_special_tokens": False})
    assert one["token_ids"] == reference(model).encode(prompts[0], add_special_tokens=False)
    (ids,) = render(http, "/v1/completions/render", {"model": model, "prompt": one["token_ids"]})
    assert ids["token_ids"] == one["token_ids"]


@pytest.mark.parametrize("path", ["/v1/chat/completions/render", "/v1/completions/render"])
def test_render_errors_are_vllms_shape(http: httpx.Client, path: str) -> None:
    chat = path.startswith("/v1/chat")
    ok: dict[str, Any] = {"messages": [{"role": "user", "content": "Hello"}]} if chat else {"prompt": "Hello"}
    # test_*_render_error_invalid_model: 404 with {"error": ...}, as vLLM's model check answers it
    r = http.post(path, json={**ok, "model": "invalid-model-name"})
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("NotFoundError", 404, "$.model")
    # a field the route does not take, a wrong type, beam search (vLLM's render refuses it)
    for body, param in [
        ({**ok, "bogus": 1}, "$.bogus"),
        ({**ok, "temperature": "hot"}, "$.temperature"),
        ({**ok, "use_beam_search": True}, "$.use_beam_search"),
    ]:
        r = http.post(path, json={**body, "model": "Qwen/Qwen2.5-7B-Instruct"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("BadRequestError", 400, param), r.text
        assert isinstance(error["message"], str) and isinstance(error["hint"], str)
    if chat:  # a template's own failure: 422 on ctxlock's routes, 400 here, as vLLM answers a jinja2 error
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
        body = {"model": "microsoft/Phi-3-mini-4k-instruct", "messages": messages}
        assert http.post("/tokenize", json=body).status_code == 422
        r = http.post(path, json=body)
        assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError", r.text
        assert r.json()["error"]["param"].endswith("chat_template.jinja line 4")


def test_render_refuses_a_prompt_over_max_model_len_as_vllm_does(http: httpx.Client) -> None:
    model = "Qwen/Qwen2.5-7B-Instruct"
    long = "hello " * MAX_MODEL_LEN
    r = http.post("/v1/chat/completions/render", json={"model": model, "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_tokens", r.text
    r = http.post("/v1/completions/render", json={"model": model, "prompt": "hi", "max_tokens": MAX_MODEL_LEN + 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "$.max_tokens", r.text
    # the completion's default max_tokens is 16 (vLLM's): a prompt of max_model_len - 16 tokens fits, one more not
    ids = reference(model).encode("hello " * (MAX_MODEL_LEN - 16))[: MAX_MODEL_LEN - 16]
    assert render(http, "/v1/completions/render", {"model": model, "prompt": ids})[0]["token_ids"] == ids
    r = http.post("/v1/completions/render", json={"model": model, "prompt": [*ids, ids[0]]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_tokens", r.text
