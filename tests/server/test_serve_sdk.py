"""The providers' own SDKs against a real `ctxlock serve` over loopback (docs/anthropic-and-responses.md).

`anthropic.Anthropic(...).messages.count_tokens` and `openai.OpenAI(...).responses.input_tokens.count` are pointed
at one server for the module (the Anthropic SDK authenticates with `x-api-key`, the OpenAI SDK with a bearer
token); the SDKs parse the answers into their own types, and every number equals `Model.count` of the same request
on the served model (Qwen 2.5's tokenizer and template). The shapes are the ones these SDKs' users send: system
blocks, tools, tool_use / tool_result history, thinking and redacted_thinking; documents and images are refused by
this template and text-only model with a typed 4xx the SDK raises; function_call items and tool_choice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

import ctxlock
import fetched
from ctxlock.artifacts import load_template_file
from ctxlock.server.shapes import ANTHROPIC_SETTINGS
from serve_server import QWEN_TEMPLATE, TOKEN, running, write_config


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("sdk")
    with running(write_config(root, store=root / "store")) as url:
        yield url


@pytest.fixture(scope="module")
def claude(server: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(api_key=TOKEN, base_url=server, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def http_qwen(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def gpt(server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(api_key=TOKEN, base_url=server + "/v1", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def qwen() -> tuple[ctxlock.Model, Any]:
    return ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2"))), load_template_file(str(QWEN_TEMPLATE))


def count(qwen: tuple[ctxlock.Model, Any], request: dict[str, Any], dialect: str) -> int:
    model, template = qwen
    return model.count(request, chat_template=template, dialect=dialect).total


WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a location",
    "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
}
USE = {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"location": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "18 C, sunny"}]}
THINK = {"type": "thinking", "thinking": "The user wants the weather.", "signature": "c2ln"}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
IGNORED_REASON = "encrypted reasoning only Anthropic's API can read; not model input"
DOC = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "The meeting is Tuesday."}}

# Anthropic requests as its SDK's users write them: (name, keyword arguments of messages.count_tokens)
ANTHROPIC_SHAPES: list[tuple[str, dict[str, Any]]] = [
    ("plain", {"messages": [{"role": "user", "content": "Hello, world"}]}),
    ("system string", {"system": "You are terse.", "messages": [{"role": "user", "content": "Hi"}]}),
    (
        "system blocks with cache_control",
        {
            "system": [
                {"type": "text", "text": "You are Claude Code."},
                {"type": "text", "text": " Be terse.", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        },
    ),
    ("tools", {"tools": [WEATHER], "messages": [{"role": "user", "content": "Weather in Paris?"}]}),
    (
        "tool_use and tool_result history",
        {
            "tools": [WEATHER],
            "tool_choice": {"type": "auto"},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [USE]},
                {"role": "user", "content": [RESULT, {"type": "text", "text": "And tomorrow?"}]},
            ],
        },
    ),
    (
        "thinking and redacted_thinking history",
        {
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "tools": [WEATHER],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [THINK, REDACTED, USE]},
                {"role": "user", "content": [RESULT]},
            ],
        },
    ),
    (
        "inline system message",
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    ),
]


@pytest.mark.parametrize(("name", "kwargs"), ANTHROPIC_SHAPES, ids=[n for n, _ in ANTHROPIC_SHAPES])
def test_anthropic_sdk_count_tokens(claude: anthropic.Anthropic, qwen: Any, name: str, kwargs: dict[str, Any]) -> None:
    answer = claude.messages.count_tokens(model="qwen", **kwargs)
    assert isinstance(answer, anthropic.types.MessageTokensCount)
    assert answer.input_tokens == count(qwen, kwargs, "anthropic"), name
    # The redacted_thinking block is named in the answer, and the SDK keeps the field.
    redacted = [b for m in kwargs["messages"] if isinstance(m["content"], list) for b in m["content"] if b is REDACTED]
    ignored = (answer.model_extra or {}).get("ignored", [])
    assert [i for i in ignored if i["type"] == "redacted_thinking"] == [
        {"path": "messages[1].content[1]", "type": "redacted_thinking", "reason": IGNORED_REASON}
    ] * len(redacted)
    # The Messages API settings the SDK sent (tool_choice, thinking) are named too: the template is not given them.
    assert [i["path"] for i in ignored if i["type"] == "setting"] == [k for k in kwargs if k in ANTHROPIC_SETTINGS]


def test_anthropic_count_tokens_names_what_the_model_does_not_see(http_qwen: httpx.Client, qwen: Any) -> None:
    """A thinking block the template drops is named in `unseen`; a field the route does not know is refused."""
    body = {
        "model": "qwen",
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                              {"type": "text", "text": "Hello."}]},
            {"role": "user", "content": "Bye"},
        ],
    }  # fmt: skip
    answer = http_qwen.post("/v1/messages/count_tokens", json=body).json()
    assert answer["input_tokens"] == count(qwen, body, "anthropic")
    assert answer["unseen"] == ["messages[1].content[0].thinking"]
    assert answer["ignored"] == [{"path": "max_tokens", "type": "setting", "reason": answer["ignored"][0]["reason"]}]
    for extra in ({"documents": []}, {"add_generation_prompt": False}, {"chat_template": "{{ 1 }}"}, {"foo": {}}):
        refused = http_qwen.post("/v1/messages/count_tokens", json=body | extra)
        assert refused.status_code == 400 and refused.json()["path"] == f"$.{next(iter(extra))}", refused.text


def test_anthropic_sdk_raises_the_typed_refusals(claude: anthropic.Anthropic) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.APIStatusError) as info:  # a text-only model: the image cannot be counted
        claude.messages.count_tokens(model="qwen", messages=[{"role": "user", "content": [image]}])
    assert info.value.status_code in (400, 422) and info.value.body["path"] == "messages[0].content[0]"
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="no-such-model", messages=[{"role": "user", "content": "Hi"}])
    # A document on a template that renders no documents: refused, never dropped.
    with pytest.raises(anthropic.UnprocessableEntityError) as info:
        claude.messages.count_tokens(model="qwen", messages=[{"role": "user", "content": [DOC]}])
    assert info.value.body["type"] == "DocumentError" and info.value.body["path"] == "messages[0].content[0]"
    other = anthropic.Anthropic(api_key="wrong", base_url=claude.base_url, max_retries=0)
    with other, pytest.raises(anthropic.AuthenticationError):
        other.messages.count_tokens(model="qwen", messages=[{"role": "user", "content": "Hi"}])


CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"location": "Paris"}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"}
FUNCTION = {"type": "function", "name": "get_weather", "description": WEATHER["description"], "strict": True,
            "parameters": WEATHER["input_schema"]}  # fmt: skip

# (name, keyword arguments of responses.input_tokens.count, the chat request it stands for)
OPENAI_SHAPES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("string input", {"input": "Hello, world"}, {"messages": [{"role": "user", "content": "Hello, world"}]}),
    (
        "instructions and message items",
        {
            "instructions": "You are terse.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
                {"role": "user", "content": "Bye"},
            ],
        },
        {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
                {"role": "user", "content": "Bye"},
            ]
        },
    ),
    (
        "tools, tool_choice, function_call and its output",
        {
            "tools": [FUNCTION],
            "tool_choice": "required",
            "input": [{"role": "user", "content": "Weather in Paris?"}, CALL, OUTPUT],
        },
        {
            "tools": [
                {"type": "function", "function": {k: FUNCTION[k] for k in ("name", "description", "parameters")}}
            ],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
            ],
        },
    ),
]


@pytest.mark.parametrize(("name", "kwargs", "chat"), OPENAI_SHAPES, ids=[n for n, _, _ in OPENAI_SHAPES])
def test_openai_sdk_input_tokens(
    gpt: openai.OpenAI, qwen: Any, name: str, kwargs: dict[str, Any], chat: dict[str, Any]
) -> None:
    answer = gpt.responses.input_tokens.count(model="qwen", **kwargs)
    assert answer.object == "response.input_tokens"
    assert answer.input_tokens == count(qwen, chat, "openai"), name


def test_openai_sdk_generation_settings_are_accepted_and_named(gpt: openai.OpenAI, qwen: Any) -> None:
    """The SDK's settings that do not change the rendered input are taken, and the answer names each one."""
    settings = {
        "parallel_tool_calls": False,
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "text"}},
        "truncation": "auto",
    }
    answer = gpt.responses.input_tokens.count(model="qwen", input="Hello, world", **settings)
    chat = {"messages": [{"role": "user", "content": "Hello, world"}]}
    assert answer.input_tokens == count(qwen, chat, "openai")
    assert [i["path"] for i in answer.model_extra["ignored"]] == list(settings)
    with pytest.raises(openai.BadRequestError) as info:
        gpt.responses.input_tokens.count(model="qwen", input="Hi", truncation="sometimes")  # type: ignore[arg-type]
    assert info.value.body["path"] == "$.truncation"


def test_openai_sdk_raises_the_typed_refusals(gpt: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:  # other item types are refused at their path
        gpt.responses.input_tokens.count(model="qwen", input=[{"type": "reasoning", "id": "r", "summary": []}])
    assert info.value.body["path"] == "input[0].type"
    with pytest.raises(openai.BadRequestError) as info:  # fields that change the input elsewhere are refused
        gpt.responses.input_tokens.count(model="qwen", input="Hi", previous_response_id="resp_1")
    assert "previous_response_id" in info.value.body["path"]
