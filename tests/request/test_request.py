"""Tests for the request stage: bytes -> canonical frozen Request."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlock.core._frozen import FrozenDict
from ctxlock.errors import RequestEncodingError, RequestError, RequestJSONError, RequestValidationError
from ctxlock.request import (
    RESERVED_TEMPLATE_KWARGS,
    Dialect,
    Message,
    Request,
    ToolCall,
    Utf8Policy,
    parse_request,
)
from hypothesis_profiles import examples

DATA = Path(__file__).parents[1] / "data" / "requests"


def user(text: Any = "hi") -> dict[str, Any]:
    return {"role": "user", "content": text}


def call(id_: str = "call_1", name: str = "get_weather", arguments: Any = '{"city": "Paris"}') -> dict[str, Any]:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def raises(exc: type[RequestError], data: Any, **kwargs: Any) -> RequestError:
    with pytest.raises(exc) as info:
        parse_request(data, **kwargs)
    assert info.value.path, "every request error names a location"
    assert info.value.hint, "every request error says what to do"
    return info.value


# ---------------------------------------------------------------------------------------------------------------
# Bytes


def test_strict_utf8_names_first_bad_byte() -> None:
    data = b'{"messages":[{"role":"user","content":"ab\xff"}]}'
    err = raises(RequestEncodingError, data)
    assert err.path == "byte " + str(data.index(0xFF)) == "byte 41"
    assert "ff" in err.message


def test_strict_utf8_truncated_sequence_names_its_start() -> None:
    data = b'{"messages":[{"role":"user","content":"\xe4\xb8x"}]}'
    err = raises(RequestEncodingError, data)
    assert err.path == "byte " + str(data.index(0xE4))
    assert "e4 b8" in err.message


def test_replace_policy_records_every_replaced_offset() -> None:
    data = b'{"messages":[{"role":"user","content":"a\xffb\xe4\xb8c"}]}'
    req = parse_request(data, utf8="replace")
    start = data.index(b"\xff")
    assert req.replaced_bytes == (start, start + 2, start + 3)
    assert req.utf8_policy is Utf8Policy.REPLACE
    # Same text as Python's own "replace" handler: one U+FFFD per maximal invalid subsequence.
    assert req.messages[0].content == "a\ufffdb\ufffdc"
    assert req.messages[0].content == json.loads(data.decode("utf-8", "replace"))["messages"][0]["content"]
    assert req.source_sha256 == hashlib.sha256(data).hexdigest()


def test_strict_policy_replaces_nothing() -> None:
    req = parse_request(b'{"messages":[{"role":"user","content":"\xc3\xa9"}]}')
    assert req.replaced_bytes == ()
    assert req.messages[0].content == "é"


def test_leading_bom_is_stripped_and_offsets_count_it() -> None:
    body = b'{"messages":[{"role":"user","content":"hi"}]}'
    req = parse_request(b"\xef\xbb\xbf" + body)
    assert req.messages[0].content == "hi"
    assert req.source_sha256 == hashlib.sha256(b"\xef\xbb\xbf" + body).hexdigest()  # the BOM is still hashed
    err = raises(RequestEncodingError, b"\xef\xbb\xbf" + body.replace(b"hi", b"h\xff"))
    assert err.path == f"byte {3 + body.index(b'hi') + 1}"


def test_str_and_mapping_inputs() -> None:
    text = '{"messages":[{"role":"user","content":"héllo"}]}'
    req = parse_request(text)
    assert req.source_sha256 == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert req == parse_request(json.loads(text)) == parse_request(text.encode())
    # A lone surrogate in a Python str is not UTF-8: reported like a bad byte.
    with pytest.raises(RequestEncodingError):
        parse_request('{"messages":[{"role":"user","content":"\ud800"}]}')


def test_mapping_input_rejects_non_json_values_with_path() -> None:
    err = raises(RequestValidationError, {"messages": [{"role": "user", "content": {1, 2}}]})
    assert err.path == "messages[0].content"
    err = raises(RequestJSONError, {"messages": [user(float("nan"))]})
    assert err.path == "messages[0].content"


@pytest.mark.parametrize("bad", ["dialect", "utf8"])
def test_unknown_option_values(bad: str) -> None:
    err = raises(RequestValidationError, {"messages": [user()]}, **{bad: "klingon"})
    assert err.path == bad


# ---------------------------------------------------------------------------------------------------------------
# JSON


@pytest.mark.parametrize(
    ("data", "path", "key"),
    [
        (b'{"messages":[{"role":"user","content":"a"},{"role":"user","role":"x"}]}', "messages[1]", "role"),
        (b'{"messages":[],"messages":[]}', "$", "messages"),
        (
            b'{"messages":[{"role":"user","content":"a"}],"tools":[{"function":{"a":1,"a":2}}]}',
            "tools[0].function",
            "a",
        ),
        (b'{"messages":[{"role":"user","content":"a"}],"x":{"odd key":{"k":1,"k":1}}}', 'x["odd key"]', "k"),
    ],
)
def test_duplicate_keys_name_the_object_and_key(data: bytes, path: str, key: str) -> None:
    err = raises(RequestJSONError, data)
    assert err.path == path
    assert err.message == f'duplicate key "{key}"'


def test_duplicate_key_inside_argument_string() -> None:
    args = '{"city": "Paris", "opts": {"u": 1, "u": 2}}'
    err = raises(RequestJSONError, {"messages": [user(), assistant_calls(call(arguments=args))]})
    assert err.path == "messages[1].tool_calls[0].function.arguments.opts"
    assert err.message == 'duplicate key "u"'


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_rejected(literal: str) -> None:
    data = '{"messages":[{"role":"user","content":"a"}],"temperature":' + literal + "}"
    err = raises(RequestJSONError, data)
    assert err.path == "temperature"
    assert literal in err.message


def test_nan_in_argument_string_rejected() -> None:
    err = raises(RequestJSONError, {"messages": [user(), assistant_calls(call(arguments='{"x": NaN}'))]})
    assert err.path == "messages[1].tool_calls[0].function.arguments.x"


def test_malformed_json_names_line_column_and_byte() -> None:
    data = '{"messages": [\n  {"role": "user", "content": "é"},\n]}'.encode()
    err = raises(RequestJSONError, data)
    byte = data.index(b"]")
    assert err.path == f"line 3 column 1 (byte {byte})"
    assert "invalid JSON" in err.message


def test_malformed_json_byte_offset_under_replace_counts_replaced_bytes() -> None:
    data = b'{"messages":[{"role":"user","content":"\xe4\xb8\xff"}],}'
    err = raises(RequestJSONError, data, utf8="replace")
    assert err.path.endswith(f"(byte {data.rindex(b'}')})")


@pytest.mark.parametrize("data", [b"[]", b'"hi"', b"3", b"null"])
def test_top_level_must_be_an_object(data: bytes) -> None:
    assert raises(RequestValidationError, data).path == "$"


def test_lone_surrogate_escape() -> None:
    data = b'{"messages":[{"role":"user","content":"a\\ud800b"}]}'
    err = raises(RequestEncodingError, data)
    assert err.path == "messages[0].content"
    assert parse_request(data, utf8="replace").messages[0].content == "a\ufffdb"
    # A proper surrogate pair is one character.
    assert parse_request(b'{"messages":[{"role":"user","content":"\\ud83d\\ude00"}]}').messages[0].content == "😀"


def test_excessive_nesting_is_an_error_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    head = '{"messages":[{"role":"user","content":"a"}],"x":'
    raises(RequestJSONError, head + deep + "}")
    err = raises(RequestJSONError, head + "[" * 200 + "]" * 200 + "}")
    assert err.path.startswith("x[0][0]")


# ---------------------------------------------------------------------------------------------------------------
# OpenAI validation


def test_messages_required_and_non_empty() -> None:
    assert raises(RequestValidationError, {"model": "m"}).path == "messages"
    assert raises(RequestValidationError, {"messages": []}).path == "messages"
    assert raises(RequestValidationError, {"messages": "hi"}).path == "messages"


def test_unknown_role_lists_allowed_roles() -> None:
    err = raises(RequestValidationError, {"messages": [user(), {"role": "function", "content": "x"}]})
    assert err.path == "messages[1].role"
    assert "function" in err.message
    for role in ("system", "developer", "user", "assistant", "tool"):
        assert role in err.hint


def test_content_required_except_assistant_with_tool_calls() -> None:
    assert raises(RequestValidationError, {"messages": [{"role": "user"}]}).path == "messages[0].content"
    assert raises(RequestValidationError, {"messages": [{"role": "system", "content": None}]}).path == (
        "messages[0].content"
    )
    err = raises(RequestValidationError, {"messages": [user(), {"role": "assistant", "tool_calls": []}]})
    assert err.path == "messages[1].content"
    req = parse_request({"messages": [user(), {"role": "assistant", "tool_calls": [call()]}]})
    assert req.messages[1].content is None


def test_tool_message_without_matching_call() -> None:
    err = raises(RequestValidationError, {"messages": [user(), {"role": "tool", "tool_call_id": "x", "content": "1"}]})
    assert err.path == "messages[1].tool_call_id"
    assert 'no earlier assistant tool call has id "x"' in err.message
    # The call must come EARLIER: a result before its call is an orphan.
    later = {"messages": [user(), {"role": "tool", "tool_call_id": "call_1", "content": "1"}, assistant_calls(call())]}
    assert raises(RequestValidationError, later).path == "messages[1].tool_call_id"
    missing = {"messages": [user(), assistant_calls(call()), {"role": "tool", "content": "1"}]}
    assert raises(RequestValidationError, missing).path == "messages[2].tool_call_id"


def test_tool_message_content_may_be_text_parts() -> None:
    tool = {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18C"}]}
    req = parse_request({"messages": [user(), assistant_calls(call()), tool]})
    assert req.messages[2].content == (FrozenDict({"type": "text", "text": "18C"}),)
    image = {"type": "image_url", "image_url": {"url": "https://x/y.png"}}
    err = raises(RequestValidationError, {"messages": [user(), assistant_calls(call()), {**tool, "content": [image]}]})
    assert err.path == "messages[2].content[0].type"


def test_invalid_argument_string_is_an_error_with_position() -> None:
    err = raises(RequestValidationError, {"messages": [user(), assistant_calls(call(), call("c2", arguments="{'a'"))]})
    assert err.path == "messages[1].tool_calls[1].function.arguments"
    assert "not valid JSON" in err.message
    assert "line 1 column 2 (char 1)" in err.message


def test_empty_argument_string_is_not_silently_empty() -> None:
    err = raises(RequestValidationError, {"messages": [user(), assistant_calls(call(arguments=""))]})
    assert err.path == "messages[1].tool_calls[0].function.arguments"


@pytest.mark.parametrize("arguments", ["[1, 2]", '"Paris"', "3", "null", [1, 2], "true"])
def test_arguments_must_decode_to_an_object(arguments: Any) -> None:
    err = raises(RequestValidationError, {"messages": [user(), assistant_calls(call(arguments=arguments))]})
    assert err.path == "messages[1].tool_calls[0].function.arguments"
    assert "object" in err.message


def test_arguments_string_and_object_forms_are_the_same() -> None:
    as_string = parse_request({"messages": [user(), assistant_calls(call(arguments='{"city": "Paris", "n": [1]}'))]})
    as_object = parse_request({"messages": [user(), assistant_calls(call(arguments={"city": "Paris", "n": [1]}))]})
    assert as_string == as_object
    tc = as_string.messages[1].tool_calls[0]
    assert tc == ToolCall(name="get_weather", arguments=FrozenDict({"city": "Paris", "n": (1,)}), id="call_1")
    assert tc.source == "messages[1].tool_calls[0]"


def test_tool_call_shape() -> None:
    bad_type = {**call(), "type": "code"}
    assert raises(RequestValidationError, {"messages": [user(), assistant_calls(bad_type)]}).path == (
        "messages[1].tool_calls[0].type"
    )
    no_name = {"id": "a", "type": "function", "function": {"arguments": "{}"}}
    assert raises(RequestValidationError, {"messages": [user(), assistant_calls(no_name)]}).path == (
        "messages[1].tool_calls[0].function.name"
    )


def test_unknown_message_keys_are_rejected() -> None:
    err = raises(RequestValidationError, {"messages": [{"role": "user", "content": "x", "cache": True}]})
    assert err.path == "messages[0].cache"
    err = raises(RequestValidationError, {"messages": [{"role": "user", "content": "x", "tool_call_id": "a"}]})
    assert err.path == "messages[0].tool_call_id"
    assert "not allowed in a user message" in err.message


def test_null_sdk_fields_are_dropped_but_values_are_not() -> None:
    echoed = {
        "role": "assistant",
        "content": "hello",
        "refusal": None,
        "audio": None,
        "annotations": None,
        "function_call": None,
        "tool_calls": None,
    }
    req = parse_request({"messages": [user(), echoed]})
    assert req.messages[1] == Message(role="assistant", content="hello")
    for key in ("refusal", "audio", "annotations"):
        err = raises(RequestValidationError, {"messages": [user(), {**echoed, key: "x"}]})
        assert err.path == f"messages[1].{key}"
        assert "does not support" in err.message
    err = raises(RequestValidationError, {"messages": [user(), {**echoed, "function_call": {"name": "f"}}]})
    assert err.path == "messages[1].function_call"
    assert "tool_calls" in err.hint


def test_unknown_content_part_type() -> None:
    err = raises(RequestValidationError, {"messages": [user([{"type": "text", "text": "a"}, {"type": "input_audio"}])]})
    assert err.path == "messages[0].content[1].type"


def test_openai_image_parts() -> None:
    parts = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
        {"type": "image_url", "image_url": "https://x/b.png"},
    ]
    req = parse_request({"messages": [user(parts)]})
    # Kept as sent (templates read image_url parts themselves, as they do under transformers).
    assert req.messages[0].content == (
        FrozenDict({"type": "text", "text": "what is this?"}),
        FrozenDict({"type": "image_url", "image_url": FrozenDict({"url": "https://x/a.png", "detail": "low"})}),
        FrozenDict({"type": "image_url", "image_url": "https://x/b.png"}),
    )
    assert req.template_messages()[0]["content"] == parts
    bad = [{"type": "image_url", "image_url": {"url": "u", "detail": "ultra"}}]
    assert raises(RequestValidationError, {"messages": [user(bad)]}).path == "messages[0].content[0].image_url.detail"


def test_reasoning_alias() -> None:
    a = parse_request({"messages": [user(), {"role": "assistant", "content": "4", "reasoning": "2+2"}]})
    b = parse_request({"messages": [user(), {"role": "assistant", "content": "4", "reasoning_content": "2+2"}]})
    assert a == b
    assert a.messages[1].reasoning_content == "2+2"
    both = {"role": "assistant", "content": "4", "reasoning": "x", "reasoning_content": "y"}
    assert raises(RequestValidationError, {"messages": [user(), both]}).path == "messages[1].reasoning"
    on_user = {"role": "user", "content": "4", "reasoning_content": "y"}
    assert raises(RequestValidationError, {"messages": [on_user]}).path == "messages[0].reasoning_content"


def test_openai_tools_validated_and_kept_verbatim() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}]
    req = parse_request({"messages": [user()], "tools": tools})
    assert req.template_tools() == tools
    bad = [{"type": "function", "function": {"name": "f", "parameters": "not a schema"}}]
    assert raises(RequestValidationError, {"messages": [user()], "tools": bad}).path == "tools[0].function.parameters"
    flat = [{"type": "function", "name": "f"}]
    assert raises(RequestValidationError, {"messages": [user()], "tools": flat}).path == "tools[0].name"
    err = raises(RequestValidationError, {"messages": [user()], "functions": [{"name": "f"}]})
    assert err.path == "functions"


@pytest.mark.parametrize("name", sorted(RESERVED_TEMPLATE_KWARGS))
def test_reserved_template_kwargs_rejected(name: str) -> None:
    if not name.isidentifier():
        pytest.skip("not an identifier")
    err = raises(RequestValidationError, {"messages": [user()], "chat_template_kwargs": {name: "x"}})
    assert err.path == f"chat_template_kwargs.{name}"
    assert "reserved" in err.message


def test_reserved_names_cover_what_the_template_stage_injects() -> None:
    injected = {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "bos_token"}
    injected |= {"eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}
    injected |= {"additional_special_tokens", "raise_exception", "strftime_now", "namespace", "dict"}
    assert injected <= RESERVED_TEMPLATE_KWARGS


def test_template_kwargs_kept_and_keys_must_be_identifiers() -> None:
    req = parse_request({"messages": [user()], "chat_template_kwargs": {"enable_thinking": False, "x": [1]}})
    assert req.chat_template_kwargs == FrozenDict({"enable_thinking": False, "x": (1,)})
    err = raises(RequestValidationError, {"messages": [user()], "chat_template_kwargs": {"not-valid": 1}})
    assert err.path == 'chat_template_kwargs["not-valid"]'


def test_documents_and_extra() -> None:
    docs = [{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}]
    req = parse_request({"model": "m", "messages": [user()], "documents": docs, "max_tokens": 9, "stream": True})
    assert req.template_documents() == docs
    assert dict(req.extra) == {"model": "m", "max_tokens": 9, "stream": True}
    assert list(req.extra) == ["model", "max_tokens", "stream"]
    assert raises(RequestValidationError, {"messages": [user()], "documents": ["text"]}).path == "documents[0]"


# ---------------------------------------------------------------------------------------------------------------
# Anthropic and equivalence


def test_data_files_are_the_same_request_in_two_dialects() -> None:
    openai = parse_request((DATA / "openai_tools.json").read_bytes())
    anthropic = parse_request((DATA / "anthropic_tools.json").read_bytes())
    assert openai.dialect is Dialect.OPENAI
    assert anthropic.dialect is Dialect.ANTHROPIC
    assert openai == anthropic
    assert hash(openai) == hash(anthropic)
    assert openai.to_json() == anthropic.to_json()
    assert openai.extra != anthropic.extra  # model names differ, but extra does not take part in ==


def test_anthropic_and_openai_equivalents_are_equal() -> None:
    anthropic = {
        "model": "claude",
        "max_tokens": 100,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Need the tool.", "signature": "sig"},
                    {"type": "tool_use", "id": "tu_1", "name": "weather", "input": {"city": "Oslo"}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "-3C"}]},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [{"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    }
    openai = {
        "model": "gpt",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": "",  # a turn of thinking and tool_use only reaches the template with "" (llama.cpp, vLLM)
                "reasoning_content": "Need the tool.",
                "tool_calls": [
                    {"id": "tu_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "tu_1", "content": "-3C"},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ],
    }
    a, o = parse_request(anthropic), parse_request(openai)
    assert (a.dialect, o.dialect) == (Dialect.ANTHROPIC, Dialect.OPENAI)
    assert a == o
    assert a.template_messages() == o.template_messages()


def test_anthropic_tool_result_comes_before_remaining_user_content() -> None:
    req = parse_request((DATA / "anthropic_tools.json").read_text())
    roles = [m.role for m in req.messages]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert req.messages[3].tool_call_id == "call_1"
    assert req.messages[3].source == "messages[2].content[0]"
    assert req.messages[4].content == (FrozenDict({"type": "text", "text": "Thanks! And tomorrow?"}),)


def test_anthropic_system_blocks_and_images() -> None:
    req = parse_request(
        {
            "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B", "cache_control": {"type": "x"}}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
                        {"type": "image", "source": {"type": "url", "url": "https://x/y.jpg"}},
                        {"type": "text", "text": "describe"},
                    ],
                }
            ],
        }
    )
    # Several system blocks are one string, joined with nothing (vLLM and llama.cpp).
    assert req.messages[0] == Message(role="system", content="AB")
    assert req.messages[1].content == (
        FrozenDict({"type": "image", "url": "data:image/png;base64,iVBO"}),
        FrozenDict({"type": "image", "url": "https://x/y.jpg"}),
        FrozenDict({"type": "text", "text": "describe"}),
    )


def test_anthropic_assistant_content_forms() -> None:
    def assistant(content: Any) -> Message:
        return parse_request({"system": "s", "messages": [user(), {"role": "assistant", "content": content}]}).messages[
            2
        ]

    assert assistant("plain").content == "plain"
    assert assistant([{"type": "text", "text": "one"}]).content == (FrozenDict({"type": "text", "text": "one"}),)
    only_tools = assistant([{"type": "tool_use", "id": "t", "name": "f", "input": {}}])
    assert only_tools.content == ""  # as llama.cpp sets and vLLM's chat parser makes of no content
    assert only_tools.tool_calls == (ToolCall(name="f", arguments=FrozenDict(), id="t"),)
    thinking = assistant([{"type": "thinking", "thinking": "a"}, {"type": "thinking", "thinking": "b"}])
    assert thinking.reasoning_content == "ab"


def test_anthropic_errors() -> None:
    orphan = {
        "system": "s",
        "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}],
    }
    err = raises(RequestValidationError, orphan)
    assert err.path == "messages[0].content[0].tool_use_id"
    # A role: "system" entry is hoisted into the system message (vLLM); any other unknown role is refused.
    system_role = {"system": "s", "messages": [{"role": "system", "content": "x"}, user()]}
    assert parse_request(system_role).messages[0] == Message(role="system", content="sx")
    tool_role = {"system": "s", "messages": [{"role": "tool", "content": "x"}]}
    assert raises(RequestValidationError, tool_role).path == "messages[0].role"
    tool_use_in_user = {"system": "s", "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a"}]}]}
    assert raises(RequestValidationError, tool_use_in_user).path == "messages[0].content[0].type"
    server_tool = {"system": "s", "messages": [user()], "tools": [{"type": "web_search_20250305", "name": "web"}]}
    assert raises(RequestValidationError, server_tool).path == "tools[0].type"


def test_anthropic_tools_become_openai_function_tools() -> None:
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    req = parse_request({"messages": [user()], "tools": [{"name": "f", "input_schema": schema}]})
    assert req.dialect is Dialect.ANTHROPIC
    assert req.template_tools() == [{"type": "function", "function": {"name": "f", "parameters": schema}}]


@pytest.mark.parametrize(
    ("body", "dialect"),
    [
        ({"messages": [user()]}, Dialect.OPENAI),
        ({"system": "s", "messages": [user()]}, Dialect.ANTHROPIC),
        ({"messages": [user()], "tools": [{"name": "f", "input_schema": {}}]}, Dialect.ANTHROPIC),
        ({"messages": [user([{"type": "image", "source": {"type": "url", "url": "u"}}])]}, Dialect.ANTHROPIC),
        (
            {"messages": [user(), {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}]},
            Dialect.ANTHROPIC,
        ),
        ({"messages": [user([{"type": "text", "text": "t"}])]}, Dialect.OPENAI),
    ],
)
def test_dialect_detection(body: dict[str, Any], dialect: Dialect) -> None:
    assert parse_request(body).dialect is dialect


def test_explicit_dialect_wins() -> None:
    body = {"system": "s", "messages": [user()]}
    assert parse_request(body, dialect="anthropic").dialect is Dialect.ANTHROPIC
    # As OpenAI, "system" is just another top-level key.
    req = parse_request(body, dialect=Dialect.OPENAI)
    assert req.dialect is Dialect.OPENAI
    assert dict(req.extra) == {"system": "s"}
    assert len(req.messages) == 1


# ---------------------------------------------------------------------------------------------------------------
# Frozen values and template form


def test_request_is_deeply_frozen() -> None:
    req = parse_request((DATA / "openai_tools.json").read_bytes())
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.messages = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.messages[0].content = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.messages[2].tool_calls[0].name = "x"  # type: ignore[index, misc]
    with pytest.raises(TypeError):
        req.messages[2].tool_calls[0].arguments["city"] = "Rome"  # type: ignore[index]
    with pytest.raises(TypeError):
        req.tools[0]["function"]["name"] = "x"  # type: ignore[index]
    assert isinstance(req.messages, tuple)
    assert isinstance(req.tools, tuple)


def test_request_is_hashable_and_usable_as_key() -> None:
    a = parse_request((DATA / "openai_tools.json").read_bytes())
    b = parse_request((DATA / "openai_tools.json").read_text())
    assert a == b
    assert {a: 1}[b] == 1
    c = parse_request({"messages": [user("other")]})
    assert a != c
    assert len({a, b, c}) == 2


def test_to_template_omits_none_and_is_fresh() -> None:
    req = parse_request({"messages": [user(), assistant_calls(call())]})
    assert req.template_messages()[0] == {"role": "user", "content": "hi"}
    tm = req.template_messages()[1]
    assert tm == {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    }
    assert "content" not in tm
    tm["tool_calls"][0]["function"]["arguments"]["city"] = "Rome"  # mutate the copy...
    assert req.messages[1].tool_calls[0].arguments["city"] == "Paris"  # ...the request is unchanged
    assert list(Message(role="tool", content="x", tool_call_id="1", name="n").to_template()) == [
        "role",
        "content",
        "name",
        "tool_call_id",
    ]
    no_id = ToolCall(name="f", arguments=FrozenDict({"a": 1}))
    assert Message(role="assistant", content=None, tool_calls=(no_id,)).to_template() == {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
    }


def test_tool_schema_key_order_preserved() -> None:
    data = (DATA / "openai_tools.json").read_bytes()
    for req in (parse_request(data), parse_request((DATA / "anthropic_tools.json").read_bytes())):
        fn = req.template_tools()[0]["function"]
        assert list(fn) == ["name", "description", "parameters"]
        assert list(fn["parameters"]) == ["type", "properties", "required"]
        assert list(fn["parameters"]["properties"]) == ["unit", "city"]  # not sorted: order is data
    args = parse_request(data).template_messages()[2]["tool_calls"][0]["function"]["arguments"]
    assert list(args) == ["city", "unit"]


def test_to_json_is_canonical() -> None:
    req = parse_request((DATA / "openai_tools.json").read_bytes())
    text = req.to_json()
    assert text == parse_request((DATA / "anthropic_tools.json").read_bytes()).to_json()
    obj = json.loads(text)
    assert list(obj) == sorted(obj)
    assert obj["messages"][0] == {"content": "You are a weather assistant.", "role": "system"}
    assert text == json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------------------------------------------------------
# strings()


def test_strings_paths_openai() -> None:
    req = parse_request(
        {
            "messages": [
                {"role": "user", "content": "hi", "name": "ann"},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "think",
                    "tool_calls": [call(arguments='{"city": "Paris", "opts": {"days": ["mon"]}}')],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18C"}]},
                user([{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]),
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d"}}],
            "documents": [{"title": "T", "text": "body"}],
            "chat_template_kwargs": {"persona": {"tone": "dry"}},
        }
    )
    got = list(req.strings())
    assert got == [
        ("messages[0].content", "hi"),
        ("messages[0].name", "ann"),
        ("messages[1].tool_calls[0].id", "call_1"),
        ("messages[1].tool_calls[0].function.name", "get_weather"),
        ("messages[1].tool_calls[0].function.arguments.city", "city"),
        ("messages[1].tool_calls[0].function.arguments.city", "Paris"),
        ("messages[1].tool_calls[0].function.arguments.opts", "opts"),
        ("messages[1].tool_calls[0].function.arguments.opts.days", "days"),
        ("messages[1].tool_calls[0].function.arguments.opts.days[0]", "mon"),
        ("messages[1].reasoning_content", "think"),
        ("messages[2].content[0].text", "18C"),
        ("messages[2].tool_call_id", "call_1"),
        ("messages[3].content[0].image_url.url", "https://x/a.png"),
        ("tools[0].function.name", "get_weather"),
        ("tools[0].function.description", "d"),
        ("documents[0].title", "title"),
        ("documents[0].title", "T"),
        ("documents[0].text", "text"),
        ("documents[0].text", "body"),
        ("chat_template_kwargs.persona.tone", "tone"),
        ("chat_template_kwargs.persona.tone", "dry"),
    ]
    assert not any(s in {"user", "assistant", "tool"} and p.endswith(".role") for p, s in got)


def test_strings_paths_anthropic_point_at_the_original_blocks() -> None:
    req = parse_request((DATA / "anthropic_tools.json").read_bytes())
    paths = dict((p, s) for p, s in req.strings() if not p.startswith("tools"))
    assert paths == {
        "system": "You are a weather assistant.",
        "messages[0].content": "What is the weather in Paris?",
        "messages[1].content[0].text": "Let me check.",
        "messages[1].content[1].id": "call_1",
        "messages[1].content[1].name": "get_weather",
        "messages[1].content[1].input.city": "Paris",
        "messages[1].content[1].input.unit": "celsius",
        "messages[2].content[0].content": "18 degrees, sunny",
        "messages[2].content[0].tool_use_id": "call_1",
        "messages[2].content[1].text": "Thanks! And tomorrow?",
    }
    assert ("tools[0].input_schema.properties.city.description", "City name") in list(req.strings())


def test_strings_cover_every_template_string() -> None:
    """Every string a template can see (outside structural roles and constants) is yielded by strings()."""
    for name in ("openai_tools.json", "anthropic_tools.json"):
        req = parse_request((DATA / name).read_bytes())
        seen = {s for _, s in req.strings()}
        structural = {"system", "user", "assistant", "tool", "function", "text", "type", "role", "content"}
        structural |= {"tool_calls", "tool_call_id", "id", "name", "arguments", "description", "parameters"}

        def walk(v: Any) -> Any:
            if isinstance(v, str):
                yield v
            elif isinstance(v, dict):
                for k, x in v.items():
                    yield k
                    yield from walk(x)
            elif isinstance(v, list):
                for x in v:
                    yield from walk(x)

        rendered = set(walk(req.template_messages())) | set(walk(req.template_tools()))
        assert rendered - structural <= seen


# ---------------------------------------------------------------------------------------------------------------
# Properties


def _request_bytes(text: str, ensure_ascii: bool) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0.5}
    return json.dumps(body, ensure_ascii=ensure_ascii).encode("utf-8")


@settings(max_examples=examples(200), deadline=None)
@given(st.text(), st.booleans())
def test_text_round_trips_exactly(text: str, ensure_ascii: bool) -> None:
    data = _request_bytes(text, ensure_ascii)
    req = parse_request(data)
    assert req.messages[0].content == text
    assert (
        req.to_json()
        == parse_request(data).to_json()
        == parse_request(_request_bytes(text, not ensure_ascii)).to_json()
    )
    assert json.loads(req.to_json())["messages"][0]["content"] == text
    assert ("messages[0].content", text) in list(req.strings())


_NEVER_VALID = [*range(0x80, 0xC0), 0xC0, 0xC1, *range(0xF5, 0x100)]  # invalid wherever they start a character


@settings(max_examples=examples(200), deadline=None)
@given(st.text(), st.data())
def test_inserted_invalid_byte_is_reported_at_its_offset(text: str, data: st.DataObject) -> None:
    encoded = _request_bytes(text, ensure_ascii=False)
    decoded = encoded.decode("utf-8")
    boundaries = [0]
    for ch in decoded:
        boundaries.append(boundaries[-1] + len(ch.encode("utf-8")))
    positions = sorted(data.draw(st.lists(st.sampled_from(boundaries), min_size=1, max_size=4), label="positions"))
    bad = data.draw(st.lists(st.sampled_from(_NEVER_VALID), min_size=len(positions), max_size=len(positions)))
    out = bytearray(encoded)
    inserted_at = []
    for shift, (pos, byte) in enumerate(zip(positions, bad, strict=True)):
        out.insert(pos + shift, byte)
        inserted_at.append(pos + shift)
    with pytest.raises(RequestEncodingError) as info:
        parse_request(bytes(out))
    assert info.value.path == f"byte {inserted_at[0]}"
    assert f"{out[inserted_at[0]]:02x}" in info.value.message


@settings(max_examples=examples(100), deadline=None)
@given(st.text(), st.data())
def test_replace_records_inserted_offsets(text: str, data: st.DataObject) -> None:
    prefix = b'{"messages":[{"role":"user","content":"'
    # Insert only between the JSON encodings of whole characters, never inside an escape such as \u001f.
    pieces = [json.dumps(ch, ensure_ascii=False)[1:-1].encode("utf-8") for ch in text]
    body = b"".join(pieces)
    boundaries = [0]
    for piece in pieces:
        boundaries.append(boundaries[-1] + len(piece))
    positions = sorted(data.draw(st.lists(st.sampled_from(boundaries), min_size=1, max_size=4), label="positions"))
    content = bytearray(body)
    expected = []
    for shift, pos in enumerate(positions):
        content.insert(pos + shift, 0xFF)
        expected.append(len(prefix) + pos + shift)
    raw = prefix + bytes(content) + b'"}]}'
    req = parse_request(raw, utf8=Utf8Policy.REPLACE)
    assert req.replaced_bytes == tuple(expected)
    assert req.messages[0].content == json.loads(raw.decode("utf-8", "replace"))["messages"][0]["content"]


def test_request_constructible_by_hand() -> None:
    req = Request(dialect=Dialect.OPENAI, messages=(Message(role="user", content="hi"),))
    assert req == parse_request({"messages": [user()]})
    assert req.tools is None and req.documents is None and req.chat_template_kwargs == {}
