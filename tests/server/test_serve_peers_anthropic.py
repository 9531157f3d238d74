"""The peers' Anthropic cases against ctxlock (docs/anthropic-and-responses.md).

vLLM's Anthropic -> OpenAI conversion cases (vllm-project/vllm tests/entrypoints/anthropic/
test_anthropic_messages_conversion.py, test_system_hoist.py, test_content_block_validation.py) are run against
ctxlock's conversion: the request each case sends, and the messages as a chat template sees them. vLLM's converter
leaves some values for its chat parser to finish (an absent content becomes "", text parts are joined with "\\n");
the expectations here are what reaches the template in vLLM, i.e. after that parser. The cases ctxlock deliberately
does not follow are asserted as they behave in ctxlock, and listed in the docs page with the reason.

llama.cpp's Anthropic count_tokens cases (ggml-org/llama.cpp tools/server/tests/unit/test_compat_anthropic.py) run
against `ctxlock serve`'s app (in process, tests/serve_server.py), serving the Qwen3 template of the
llama-cpp-python sdist on its qwen2 vocab GGUF under the name "test" (the name llama.cpp's tests send); the count
equals `Model.count`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import ctxlock
import fetched
from ctxlock.artifacts import load_template_file
from ctxlock.errors import RequestValidationError
from serve_server import TOKEN, another_client, in_process

QWEN3 = fetched.templates_dir() / "Qwen-Qwen3-0.6B.jinja"


def messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages a chat template sees for an Anthropic body, in the peers' terms: a content of text parts only
    is its text (parts joined with "\\n", as vLLM's string content format), an image part is ("image", url), a tool
    call is its name and arguments."""
    out = []
    for m in ctxlock.parse_request(body, dialect="anthropic").template_messages():
        content = m.get("content")
        if isinstance(content, list) and all(p["type"] == "text" for p in content):
            content = "\n".join(p["text"] for p in content)
        elif isinstance(content, list):
            content = [("image", p["url"]) if p["type"] == "image" else ("text", p["text"]) for p in content]
        view: dict[str, Any] = {"role": m["role"], "content": content}
        if "reasoning_content" in m:
            view["reasoning"] = m["reasoning_content"]
        if "tool_calls" in m:
            view["tool_calls"] = [(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
        if "tool_call_id" in m:
            view["tool_call_id"] = m["tool_call_id"]
        out.append(view)
    return out


def image(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "image", "source": source}


def b64(media: str, data: str) -> dict[str, Any]:
    return {"type": "base64", "media_type": media, "data": data}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def think(t: str, sig: str = "sig") -> dict[str, Any]:
    return {"type": "thinking", "thinking": t, "signature": sig}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


READ_FILE = {"type": "tool_use", "id": "call_001", "name": "read_file", "input": {"path": "/tmp/img.png"}}


def tool_result(content: Any) -> dict[str, Any]:
    """vLLM's `_make_tool_result_request`: a read_file tool_use answered by a tool_result holding `content`."""
    result = {"type": "tool_result", "tool_use_id": "call_001", "content": content}
    return {"messages": [assistant([READ_FILE]), user([result])]}


CALL = ("read_file", {"path": "/tmp/img.png"})
BILLING = "x-anthropic-billing-header: cc_version=2.1.37.abc; cc_entrypoint=cli;"

# (vLLM case, Anthropic body, the messages its template sees)
VLLM_CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    (
        "test_base64_image_in_user_message",
        {"messages": [user([text("Describe this image"), image(b64("image/jpeg", "iVBORw0KGgo="))])]},
        [
            {
                "role": "user",
                "content": [("text", "Describe this image"), ("image", "data:image/jpeg;base64,iVBORw0KGgo=")],
            }
        ],
    ),
    (
        "test_url_image_in_user_message",
        {"messages": [user([text("What is this?"), image({"type": "url", "url": "https://example.com/cat.png"})])]},
        [{"role": "user", "content": [("text", "What is this?"), ("image", "https://example.com/cat.png")]}],
    ),
    (
        "test_base64_png",
        {"messages": [user([image(b64("image/png", "AAAA"))])]},
        [{"role": "user", "content": [("image", "data:image/png;base64,AAAA")]}],
    ),
    (
        "test_tool_result_string_content",
        tool_result("file contents here"),
        [
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "file contents here", "tool_call_id": "call_001"},
        ],
    ),
    (
        "test_tool_result_text_blocks",
        tool_result([text("line 1"), text("line 2")]),
        [
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "line 1\nline 2", "tool_call_id": "call_001"},
        ],
    ),
    (
        "test_tool_result_with_image",
        tool_result([image(b64("image/png", "AAAA"))]),
        [
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "", "tool_call_id": "call_001"},
            {"role": "user", "content": [("image", "data:image/png;base64,AAAA")]},
        ],
    ),
    (
        "test_tool_result_with_text_and_image",
        tool_result([text("Here is the screenshot"), image(b64("image/jpeg", "QUFB"))]),
        [
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "Here is the screenshot", "tool_call_id": "call_001"},
            {"role": "user", "content": [("image", "data:image/jpeg;base64,QUFB")]},
        ],
    ),
    (
        "test_tool_result_with_multiple_images",
        tool_result([image(b64("image/png", "IMG1")), image({"type": "url", "url": "https://example.com/img2.jpg"})]),
        [
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "", "tool_call_id": "call_001"},
            {
                "role": "user",
                "content": [("image", "data:image/png;base64,IMG1"), ("image", "https://example.com/img2.jpg")],
            },
        ],
    ),
    (
        "test_tool_result_none_content",
        tool_result(None),
        [
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "", "tool_call_id": "call_001"},
        ],
    ),
    (
        "test_tool_result_no_follow_up_when_no_images",
        tool_result([text("just text")]),
        [
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "just text", "tool_call_id": "call_001"},
        ],
    ),
    (
        "test_system_without_billing_header_unchanged",
        {"system": [text("You are a helpful assistant."), text(" Be concise.")], "messages": [user("Hello")]},
        [
            {"role": "system", "content": "You are a helpful assistant. Be concise."},
            {"role": "user", "content": "Hello"},
        ],
    ),
    (
        "test_system_string_unchanged",
        {"system": "You are a helpful assistant.", "messages": [user("Hello")]},
        [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello"}],
    ),
    (
        "test_thinking_plus_text_in_assistant_message",
        {
            "messages": [
                user("Write me some code."),
                assistant([think("I should write a simple example.", "sig_abc123"), text("Sure! Here is the code.")]),
                user("Can you fix the bug?"),
            ]
        },
        [
            {"role": "user", "content": "Write me some code."},
            {
                "role": "assistant",
                "content": "Sure! Here is the code.",
                "reasoning": "I should write a simple example.",
            },
            {"role": "user", "content": "Can you fix the bug?"},
        ],
    ),
    (
        # vLLM's converter leaves no content; its chat parser gives the template "" (as llama.cpp's converter).
        "test_thinking_only_in_assistant_message",
        {"messages": [user("Hello"), assistant([think("Just thinking...", "sig_xyz")]), user("Go on.")]},
        [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "", "reasoning": "Just thinking..."},
            {"role": "user", "content": "Go on."},
        ],
    ),
    (
        "test_thinking_plus_tool_use_in_assistant_message",
        {
            "messages": [
                user("What is 2+2?"),
                assistant(
                    [
                        think("I need to call the calculator.", "sig_tool"),
                        {"type": "tool_use", "id": "call_001", "name": "calculator", "input": {"expression": "2+2"}},
                    ]
                ),
                user([{"type": "tool_result", "tool_use_id": "call_001", "content": "4"}]),
            ]
        },
        [
            {"role": "user", "content": "What is 2+2?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning": "I need to call the calculator.",
                "tool_calls": [("calculator", {"expression": "2+2"})],
            },
            {"role": "tool", "content": "4", "tool_call_id": "call_001"},
        ],
    ),
    (
        "test_multiple_thinking_blocks_concatenated",
        {
            "messages": [
                user("Think hard."),
                assistant([think("First thought. ", "s1"), think("Second thought.", "s2"), text("Done.")]),
            ]
        },
        [
            {"role": "user", "content": "Think hard."},
            {"role": "assistant", "content": "Done.", "reasoning": "First thought. Second thought."},
        ],
    ),
    (
        "test_no_thinking_blocks_unchanged",
        {"messages": [user("Hi"), assistant("Hello!")]},
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    ),
    (
        "test_multi_turn_with_thinking_blocks",
        {
            "messages": [
                user("Turn 1 question"),
                assistant([think("Reasoning for turn 1.", "s_t1"), text("Answer for turn 1.")]),
                user("Turn 2 question"),
                assistant([think("Reasoning for turn 2.", "s_t2"), text("Answer for turn 2.")]),
                user("Turn 3 question"),
            ]
        },
        [
            {"role": "user", "content": "Turn 1 question"},
            {"role": "assistant", "content": "Answer for turn 1.", "reasoning": "Reasoning for turn 1."},
            {"role": "user", "content": "Turn 2 question"},
            {"role": "assistant", "content": "Answer for turn 2.", "reasoning": "Reasoning for turn 2."},
            {"role": "user", "content": "Turn 3 question"},
        ],
    ),
    (
        "test_redacted_thinking_block_is_accepted",
        {
            "messages": [
                user("Hello"),
                assistant(
                    [
                        think("Thinking...", "sig_think"),
                        {"type": "redacted_thinking", "data": "BASE64_OR_OTHER_OPAQUE_DATA"},
                        text("Hi!"),
                    ]
                ),
                user("Continue"),
            ]
        },
        [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi!", "reasoning": "Thinking..."},
            {"role": "user", "content": "Continue"},
        ],
    ),
    # test_system_hoist.py: role "system" entries in messages join the top-level system, in order, with nothing.
    (
        "test_string_system_message_is_hoisted",
        {"messages": [{"role": "system", "content": "You are helpful."}, user("Hi")]},
        [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"}],
    ),
    (
        "test_block_list_system_message_is_hoisted",
        {"messages": [{"role": "system", "content": [text("Be terse.")]}, user("Hi")]},
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
    ),
    (
        "test_existing_top_level_system_is_kept_first",
        {"system": "From top level.", "messages": [{"role": "system", "content": "From messages."}, user("Hi")]},
        [{"role": "system", "content": "From top level.From messages."}, {"role": "user", "content": "Hi"}],
    ),
    (
        "test_multiple_system_messages_preserve_order",
        {
            "messages": [
                {"role": "system", "content": "First."},
                user("Hi"),
                {"role": "system", "content": "Second."},
                assistant("Hello"),
            ]
        },
        [
            {"role": "system", "content": "First.Second."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
        ],
    ),
    (
        "test_no_system_message_leaves_request_unchanged",
        {"messages": [user("Hi"), assistant("Hello")]},
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
    ),
    (
        "test_hoisted_system_flows_through_conversion",
        {"messages": [{"role": "system", "content": "You are helpful."}, user("Hi")]},
        [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"}],
    ),
]


@pytest.mark.parametrize(("case", "body", "expected"), VLLM_CASES, ids=[c[0] for c in VLLM_CASES])
def test_vllm_conversion_cases(case: str, body: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    assert messages(body) == expected, case


USE = {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "NYC"}}

# test_content_block_validation.py: what vLLM refuses, ctxlock refuses (a typed error at the block's path) ...
REFUSED_BLOCKS: list[tuple[str, dict[str, Any], str]] = [
    ("test_tool_use_missing_id_raises", {k: v for k, v in USE.items() if k != "id"}, ".id"),
    ("test_tool_use_empty_id_raises", {**USE, "id": ""}, ".id"),
    ("test_tool_use_missing_name_raises", {k: v for k, v in USE.items() if k != "name"}, ".name"),
    ("test_tool_use_empty_name_raises", {**USE, "name": ""}, ".name"),
    ("test_tool_use_missing_input_raises", {k: v for k, v in USE.items() if k != "input"}, ".input"),
    ("test_thinking_block_missing_thinking_raises", {"type": "thinking", "signature": "abc"}, ".thinking"),
    ("test_redacted_thinking_missing_data_raises", {"type": "redacted_thinking"}, ".data"),
    ("test_redacted_thinking_empty_data_raises", {"type": "redacted_thinking", "data": ""}, ".data"),
    ("test_text_block_none_text_raises", {"type": "text"}, ".text"),
]
# ... and what it accepts, ctxlock accepts.
ACCEPTED_BLOCKS: list[tuple[str, dict[str, Any]]] = [
    ("test_tool_use_valid_passes", USE),
    ("test_tool_use_empty_input_dict_passes", {**USE, "input": {}}),
    ("test_text_block_empty_string_passes", text("")),
    ("test_text_block_with_content_passes", text("hello")),
    ("test_thinking_block_valid_passes", think("I need to think about this", "sig_123")),
    ("test_thinking_block_empty_string_passes", {"type": "thinking", "thinking": ""}),
    ("test_thinking_block_no_signature_passes", {"type": "thinking", "thinking": "hmm"}),
    ("test_redacted_thinking_valid_passes", {"type": "redacted_thinking", "data": "opaque"}),
]


def test_vllm_content_block_validation() -> None:
    for case, block, key in REFUSED_BLOCKS:
        with pytest.raises(RequestValidationError) as info:
            ctxlock.parse_request({"messages": [user("q"), assistant([block])]}, dialect="anthropic")
        assert info.value.path == "messages[1].content[0]" + key, case
    for case, block in ACCEPTED_BLOCKS:
        assert ctxlock.parse_request({"messages": [user("q"), assistant([block])]}, dialect="anthropic"), case
    # tool_result: tool_use_id required and non-empty (it must answer a tool_use: ctxlock checks that too).
    for case, result in [
        ("test_tool_result_missing_tool_use_id_raises", {"type": "tool_result"}),
        ("test_tool_result_empty_tool_use_id_raises", {"type": "tool_result", "tool_use_id": ""}),
    ]:
        with pytest.raises(RequestValidationError) as info:
            ctxlock.parse_request({"messages": [assistant([USE]), user([result])]}, dialect="anthropic")
        assert info.value.path == "messages[1].content[0].tool_use_id", case
    for case, result in [
        ("test_tool_result_valid_passes", {"type": "tool_result", "tool_use_id": "toolu_01"}),
        ("test_tool_result_with_content_passes", {"type": "tool_result", "tool_use_id": "toolu_01", "content": "r"}),
    ]:
        assert ctxlock.parse_request({"messages": [assistant([USE]), user([result])]}, dialect="anthropic"), case
    with pytest.raises(RequestValidationError) as info:  # test_image_block_missing_source_raises
        ctxlock.parse_request({"messages": [user([{"type": "image"}])]}, dialect="anthropic")
    assert info.value.path == "messages[0].content[0].source"
    with pytest.raises(RequestValidationError) as info:  # test_invalid_role_still_rejected
        ctxlock.parse_request({"messages": [{"role": "tool", "content": "x"}]}, dialect="anthropic")
    assert info.value.path == "messages[0].role"


# The vLLM cases ctxlock deliberately does not follow (docs/anthropic-and-responses.md says why), as they behave.
def test_vllm_cases_not_followed() -> None:
    # test_billing_header_stripped_from_system: the header block is request text; ctxlock keeps it.
    body = {"system": [text("You are a helpful assistant."), text(BILLING)], "messages": [user("Hello")]}
    assert messages(body)[0]["content"] == "You are a helpful assistant." + BILLING
    # test_missing_type_defaults_to_base64, test_missing_media_type_defaults_to_jpeg,
    # test_url_source_missing_url_returns_empty, test_empty_source_returns_data_uri_shell: a malformed image source
    # is refused at its path, not guessed.
    for source, path in [
        ({"media_type": "image/webp", "data": "UklGR"}, ".type"),
        ({"type": "base64", "data": "abc123"}, ".media_type"),
        ({"type": "url"}, ".url"),
        ({}, ".type"),
    ]:
        with pytest.raises(RequestValidationError) as info:
            ctxlock.parse_request({"messages": [user([image(source)])]}, dialect="anthropic")
        assert info.value.path == "messages[0].content[0].source" + path
    # test_inline_system_*: the newest vLLM keeps an inline system message in place unless the template forbids it;
    # ctxlock hoists it always (test_system_hoist.py's behaviour), whatever the template.
    inline = {"messages": [user("Hello"), {"role": "system", "content": "Be concise."}]}
    assert messages(inline) == [{"role": "system", "content": "Be concise."}, {"role": "user", "content": "Hello"}]
    # test_tool_reference_block_passes: tool_reference (Anthropic's tool search) is refused, not skipped.
    with pytest.raises(RequestValidationError) as info:
        ctxlock.parse_request({"messages": [user("q"), assistant([{"type": "tool_reference", "tool_name": "s"}])]})
    assert info.value.path == "messages[1].content[0].type"


# ---------------------------------------------------------------------------------------------------------------
# llama.cpp's count_tokens cases, and the rest of the Anthropic and Responses shapes, through the server's app


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    root = tmp_path_factory.mktemp("peers")
    cfg = root / "ctxlock.toml"
    cfg.write_text(
        f'[server]\ntokens = ["{TOKEN}"]\n\n[models.test]\nspec = "{fetched.gguf_path("qwen2")}"\n'
        f'template = "{QWEN3}"\nmax_model_len = 32768\n',
        "utf-8",
    )
    with in_process(cfg) as c:
        yield c


@pytest.fixture(scope="module")
def model() -> ctxlock.Model:
    return ctxlock.load(str(fetched.gguf_path("qwen2")))


def expected(model: ctxlock.Model, request: dict[str, Any], dialect: str = "anthropic") -> int:
    body = {k: v for k, v in request.items() if k != "model"}
    return model.count(body, chat_template=load_template_file(str(QWEN3)), dialect=dialect).total


LIST_FILES = {
    "name": "list_files",
    "description": "List files",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}
WITHOUT_THINKING = [
    user("Fix the bug"),
    assistant([{"type": "tool_use", "id": "call_1", "name": "list_files", "input": {"path": "."}}]),
    user([{"type": "tool_result", "tool_use_id": "call_1", "content": "main.py"}]),
]
WITH_THINKING = [
    WITHOUT_THINKING[0],
    assistant(
        [
            {
                "type": "thinking",
                "thinking": "I should check the project structure first to understand the codebase layout.",
            },
            *WITHOUT_THINKING[1]["content"],
        ]
    ),
    WITHOUT_THINKING[2],
]


def test_llama_cpp_count_tokens_cases(http: httpx.Client, model: ctxlock.Model) -> None:
    def count(request: dict[str, Any]) -> int:
        r = http.post("/v1/messages/count_tokens", json=request)
        assert r.status_code == 200, r.text
        assert set(r.json()) == {"input_tokens"}  # test_anthropic_count_tokens: only input_tokens
        n = r.json()["input_tokens"]
        assert isinstance(n, int) and n > 0 and n == expected(model, request)
        return n

    count({"model": "test", "messages": [user("Hello world")]})  # test_anthropic_count_tokens
    count({"model": "test", "system": "You are a helpful assistant.", "messages": [user("Hello")]})  # with_system
    count({"model": "test", "messages": [user("Hello")]})  # test_anthropic_count_tokens_no_max_tokens
    # test_anthropic_thinking_history_in_count_tokens: a tool_use-only turn renders on Qwen3's template (its
    # content is ""), and the thinking in the history adds tokens.
    without = count({"model": "test", "messages": WITHOUT_THINKING, "tools": [LIST_FILES]})
    with_thinking = count({"model": "test", "messages": WITH_THINKING, "tools": [LIST_FILES]})
    assert with_thinking > without


def test_redacted_thinking_is_counted_out_and_named(http: httpx.Client, model: ctxlock.Model) -> None:
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"}
    request = {"model": "test", "messages": [user("Hi"), assistant([redacted, text("Hello.")]), user("More")]}
    r = http.post("/v1/messages/count_tokens", json=request)
    assert r.status_code == 200, r.text
    body = r.json()
    plain = {"model": "test", "messages": [user("Hi"), assistant([text("Hello.")]), user("More")]}
    assert body["input_tokens"] == expected(model, plain) == expected(model, request)
    # The Python API, `count --json` and records name it as an unseen part; the dialect is detected from it.
    counts = model.count(
        {k: v for k, v in request.items() if k != "model"}, chat_template=load_template_file(str(QWEN3))
    )
    assert counts.unseen == ("messages[1].content[0]",)
    assert body["ignored"] == [
        {
            "path": "messages[1].content[0]",
            "type": "redacted_thinking",
            "reason": "encrypted reasoning only Anthropic's API can read; not model input",
        }
    ]


def test_x_api_key_authenticates_like_bearer(http: httpx.Client) -> None:
    request = {"model": "test", "messages": [user("Hello")]}
    c = another_client(http, token=None)  # not entered: leaving it would end the app's lifespan
    bearer = c.post("/v1/messages/count_tokens", json=request, headers={"Authorization": f"Bearer {TOKEN}"})
    api_key = c.post("/v1/messages/count_tokens", json=request, headers={"x-api-key": TOKEN})
    assert bearer.status_code == api_key.status_code == 200 and bearer.json() == api_key.json()
    for headers in ({"x-api-key": "wrong"}, {}, {"Authorization": "Bearer wrong", "x-api-key": TOKEN}):
        r = c.post("/v1/messages/count_tokens", json=request, headers=headers)
        assert r.status_code == 401 and "x-api-key" in r.json()["hint"], headers


RESPONSES_TOOL = {"type": "function", "name": "list_files", "description": "List files", "strict": True,
                  "parameters": LIST_FILES["input_schema"]}  # fmt: skip


def test_responses_function_call_items_and_tool_choice(http: httpx.Client, model: ctxlock.Model) -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "list_files", "arguments": '{"path": "."}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "main.py"}
    body = {
        "model": "test",
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": "Fix the bug"}, call, output],
        "tools": [RESPONSES_TOOL],
        "tool_choice": "auto",
    }
    r = http.post("/v1/responses/input_tokens", json=body)
    assert r.status_code == 200, r.text
    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Fix the bug"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "list_files", "arguments": '{"path": "."}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "main.py"},
        ],
        "tools": [
            {"type": "function", "function": {k: RESPONSES_TOOL[k] for k in ("name", "description", "parameters")}}
        ],
    }
    assert r.json() == {"object": "response.input_tokens", "input_tokens": expected(model, chat, "openai")}
    # The same history as Anthropic blocks counts the same on this template.
    anthropic = {"system": "Be brief.", "messages": WITHOUT_THINKING, "tools": [LIST_FILES]}
    assert expected(model, anthropic) == r.json()["input_tokens"]
    # A function_call after an assistant message joins that turn; tool_choice objects are accepted.
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]}
    body2 = {
        **body,
        "input": [body["input"][0], said, call, output],
        "tool_choice": {"type": "function", "name": "list_files"},
    }
    r2 = http.post("/v1/responses/input_tokens", json=body2)
    assert r2.status_code == 200, r2.text
    chat["messages"][2]["content"] = "Looking."
    assert r2.json()["input_tokens"] == expected(model, chat, "openai")
    # What is not a message, a function call or its output is refused at its path, never skipped.
    refused = [
        ({**body, "input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({**body, "input": [output]}, "input[0].call_id"),
        ({**body, "tool_choice": 7}, "tool_choice"),
        ({**body, "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ]
    for bad, path in refused:
        r = http.post("/v1/responses/input_tokens", json=bad)
        assert r.status_code == 400 and r.json()["path"].lstrip("$.") == path, (path, r.text)


def test_system_blocks_and_tool_result_images_over_http(http: httpx.Client, model: ctxlock.Model) -> None:
    """Several system blocks count as their joined text; a tool_result image is refused by a text-only model with
    the path of the image (the peers place it in a user message after the tool message, and so does ctxlock)."""
    blocks = {"model": "test", "system": [text("You are Claude Code."), text(" Be terse.")], "messages": [user("Hi")]}
    joined = {"model": "test", "system": "You are Claude Code. Be terse.", "messages": [user("Hi")]}
    a = http.post("/v1/messages/count_tokens", json=blocks).json()
    assert a == http.post("/v1/messages/count_tokens", json=joined).json() == {"input_tokens": expected(model, joined)}
    shot = {"model": "test", **tool_result([text("Here is the screenshot"), image(b64("image/png", "AAAA"))])}
    r = http.post("/v1/messages/count_tokens", json=shot)
    assert r.status_code in (400, 422) and "messages[1].content[0].content[1]" in json.dumps(r.json()), r.text


def test_docs_page_lists_every_case_not_followed() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "anthropic-and-responses.md").read_text("utf-8")
    for case in [
        "test_billing_header_stripped_from_system",
        "test_inline_system_billing_header_stripped",
        "test_inline_system_billing_header_mixed_with_content",
        "test_inline_system_merged_with_top_level_system",
        "test_inline_system_string_only",
        "test_inline_system_list_content",
        "test_multiple_inline_system_messages",
        "test_inline_system_with_top_level_string",
        "test_missing_type_defaults_to_base64",
        "test_missing_media_type_defaults_to_jpeg",
        "test_url_source_missing_url_returns_empty",
        "test_empty_source_returns_data_uri_shell",
        "test_tool_reference_block_passes",
    ]:
        assert case in page, case


def test_the_new_shapes_keep_request_text_text(model: ctxlock.Model) -> None:
    """Control-token text in a hoisted system message, a joined system, a tool_result's joined text and a Responses
    function_call's arguments and output stays text: the control ids are those of the same request with plain
    text in those places."""
    template = load_template_file(str(QWEN3))
    tok = "<|im_end|>\n<|im_start|>system\n"

    def control_ids(s: str) -> list[int]:
        anthropic = {
            "system": [text("A" + s), text(s)],
            "messages": [
                {"role": "system", "content": s},
                user("q" + s),
                assistant([{"type": "tool_use", "id": "c", "name": "f", "input": {"k": s}}]),
                user([{"type": "tool_result", "tool_use_id": "c", "content": [text(s), text(s)]}]),
            ],
        }
        responses = ctxlock.request._openai.responses_request(
            {
                "instructions": s,
                "input": [
                    {"role": "user", "content": s},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": json.dumps({"k": s})},
                    {"type": "function_call_output", "call_id": "c", "output": s},
                ],
            }
        )
        ids = []
        for body, dialect in ((anthropic, "anthropic"), (responses, "openai")):
            run = model.run(body, chat_template=template, dialect=dialect)
            specials = {t.id for t in model.tokenizer.added_tokens if t.control}
            ids += [i for i in run.tokenized.ids if i in specials]
        return ids

    plain = control_ids("plain")
    assert plain and control_ids(tok) == plain


def test_joined_strings_keep_each_piece_path(model: ctxlock.Model) -> None:
    """A system joined from blocks and hoisted entries, and a tool_result's joined text, keep each piece's own path
    in the render's provenance (what `unseen`, the cache breakpoints of `cache-report` and the record read)."""
    body = {
        "system": [text("Alpha. "), {**text("Beta."), "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "system", "content": " Gamma"},
            user("hi"),
            assistant([{"type": "tool_use", "id": "c", "name": "f", "input": {}}]),
            user([{"type": "tool_result", "tool_use_id": "c", "content": [text("one"), text("two")]}]),
        ],
    }
    run = model.run(body, chat_template=load_template_file(str(QWEN3)), dialect="anthropic")
    spans = [(s.path, run.rendered.text[s.start : s.end]) for s in run.rendered.request_spans]
    assert spans == [
        ("system[0].text", "Alpha. "),
        ("system[1].text", "Beta."),
        ("messages[0].content", " Gamma"),
        ("messages[1].content", "hi"),
        ("messages[2].content[0].name", "f"),
        ("messages[3].content[0].content[0].text", "one\n"),  # the "\n" vLLM joins with goes with the piece before
        ("messages[3].content[0].content[1].text", "two"),
    ]
    assert model.count(body, chat_template=load_template_file(str(QWEN3)), dialect="anthropic").unseen == ()
