"""The request package, module by module: each dialect module parses its own shape into what `parse_request`
builds, the strict JSON reader refuses what it must with its path, the memo is a registered cache that gives the
reference path's Request, and every module keeps the size rule.

The memo is reached only through public functions (`parse_request`, `clear_request_memo`, `ctxlock.caches`),
compared against `reference_path()`.
"""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock.request
from ctxlock import caches
from ctxlock.errors import RequestEncodingError, RequestJSONError, RequestValidationError
from ctxlock.outside import _json as jsonread
from ctxlock.request import Dialect, Request, Utf8Policy, clear_request_memo, decode_bytes, parse_request
from ctxlock.request import _anthropic as anthropic
from ctxlock.request import _build as build
from ctxlock.request import _openai as openai
from ctxlock.settings import reference_path
from hypothesis_profiles import examples

PACKAGE = Path(ctxlock.request.__file__).parent

OPENAI = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {
            "role": "assistant",
            "content": "",  # what a tool_use-only Anthropic turn becomes (llama.cpp, vLLM)
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"q": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ],
    "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
}

ANTHROPIC = {
    "system": "be brief",
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "w", "input": {"q": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "sunny"}]},
    ],
    "tools": [{"name": "w", "input_schema": {"type": "object"}}],
}


@pytest.fixture(autouse=True)
def cold_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty memo, and the fast paths on even in a `CTXLOCK_FAST=0` run (the memo is compared with
    `reference_path()`)."""
    monkeypatch.setenv("CTXLOCK_FAST", "1")
    clear_request_memo()


def reference(data: Any, **kwargs: Any) -> Request:
    with reference_path():
        return parse_request(data, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# One module per dialect


def test_openai_module_parses_the_openai_shape() -> None:
    req = reference(OPENAI)
    assert req.dialect is Dialect.OPENAI
    assert openai.parse_messages(copy.deepcopy(OPENAI["messages"]), Utf8Policy.STRICT) == req.messages
    assert openai.parse_tools(copy.deepcopy(OPENAI["tools"])) == req.tools
    seen: set[str] = set()
    first = openai.parse_message(OPENAI["messages"][2], "messages[2]", seen, Utf8Policy.STRICT)
    assert first == req.messages[2] and seen == {"c1"}


def test_anthropic_module_parses_the_anthropic_shape() -> None:
    req = reference(ANTHROPIC)
    assert req.dialect is Dialect.ANTHROPIC
    system = anthropic.parse_system(ANTHROPIC["system"])
    assert (system, *anthropic.parse_messages(copy.deepcopy(ANTHROPIC["messages"]))) == req.messages
    assert anthropic.parse_tools(copy.deepcopy(ANTHROPIC["tools"])) == req.tools
    # The same conversation in both dialects is the same canonical Request.
    assert req == reference({k: v for k, v in OPENAI.items() if k != "model"})


def test_each_dialect_module_refuses_the_other_shape() -> None:
    with pytest.raises(RequestValidationError) as exc:
        openai.parse_messages(ANTHROPIC["messages"], Utf8Policy.STRICT)
    assert exc.value.path == "messages[1].content[0].type"  # a tool_use block is not an OpenAI content part
    with pytest.raises(RequestValidationError):
        anthropic.parse_messages(OPENAI["messages"])  # no system role in Anthropic messages
    with pytest.raises(RequestValidationError):
        anthropic.parse_tools(OPENAI["tools"])


def test_detect_and_build() -> None:
    assert build.detect(json.loads(json.dumps(OPENAI))) is Dialect.OPENAI
    assert build.detect(json.loads(json.dumps(ANTHROPIC))) is Dialect.ANTHROPIC
    obj = json.loads(json.dumps(OPENAI))
    built = build.build_request(obj, Dialect.OPENAI, "sha", Utf8Policy.STRICT, [])
    assert built == reference(OPENAI) and built.source_sha256 == "sha" and built.extra == {"model": "m"}


# ---------------------------------------------------------------------------------------------------------------
# The strict JSON reader


def test_reader_refuses_with_paths() -> None:
    with pytest.raises(RequestJSONError) as exc:
        jsonread.loads_strict('{"a": {"b": 1, "b": 2}}', "$", Utf8Policy.STRICT)
    assert exc.value.path == "a"
    with pytest.raises(RequestJSONError) as exc:
        jsonread.loads_strict('{"a": [1, NaN]}', "$", Utf8Policy.STRICT)
    assert exc.value.path == "a[1]"
    with pytest.raises(RequestEncodingError):
        jsonread.loads_strict('{"a": "\\ud800"}', "$", Utf8Policy.STRICT)
    assert jsonread.loads_strict('{"a": "\\ud800"}', "$", Utf8Policy.REPLACE) == {"a": "\ufffd"}
    with pytest.raises(json.JSONDecodeError):
        jsonread.loads_strict("{", "$", Utf8Policy.STRICT)


def test_reader_decodes_bytes_under_the_policy() -> None:
    data = b'{"a": "x\xffy"}'
    with pytest.raises(RequestEncodingError) as exc:
        decode_bytes(data, Utf8Policy.STRICT)
    assert exc.value.path == "byte 8"
    text, runs = decode_bytes(data, Utf8Policy.REPLACE)
    assert text == data.decode("utf-8", "replace") and runs == [(8, 9)]
    assert jsonread.byte_offset(data, runs, text, text.index("y")) == 9


def test_to_plain_refuses_cycles_and_foreign_types() -> None:
    cyclic: dict[str, Any] = {"a": []}
    cyclic["a"].append(cyclic)
    with pytest.raises(RequestValidationError) as exc:
        jsonread.to_plain(cyclic, "$")
    assert exc.value.path == "a[0]"
    with pytest.raises(RequestValidationError):
        jsonread.to_plain({"a": {1, 2}}, "$")
    assert jsonread.to_plain({"a": (1, 2.5, None, "x")}, "$") == {"a": [1, 2.5, None, "x"]}


# ---------------------------------------------------------------------------------------------------------------
# The memo: a registered cache, the reference path's values


def test_the_memo_is_in_the_cache_registry() -> None:
    info = caches.cache_info()
    for name in ("request.memo.messages", "request.memo.frames"):
        assert info[name].scope == "request" and info[name].size == 0
    parse_request(copy.deepcopy(OPENAI))
    info = caches.cache_info()
    assert info["request.memo.messages"].size == info["request.memo.frames"].size == 1
    caches.clear_caches()
    info = caches.cache_info()
    assert info["request.memo.messages"].size == info["request.memo.frames"].size == 0


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
)
_MESSAGE = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, _TEXT),
    st.builds(lambda t: {"role": "assistant", "content": t}, _TEXT),
    st.builds(lambda t: {"role": "user", "content": [{"type": "text", "text": t}]}, _TEXT),
    # invalid messages: the memo must leave them to the reference path, with its error
    st.builds(lambda t: {"role": "robot", "content": t}, _TEXT),
    st.builds(lambda t: {"role": "tool", "tool_call_id": t, "content": "x"}, _TEXT),
)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_MESSAGE, min_size=1, max_size=5), st.dictionaries(st.sampled_from(["model", "n", "x"]), _VALUE))
def test_the_memo_gives_the_reference_paths_result(messages: list[dict[str, Any]], top: dict[str, Any]) -> None:
    for cut in range(1, len(messages) + 1):  # turn by turn, as a chat server sees them
        req = {**top, "messages": copy.deepcopy(messages[:cut])}
        try:
            ref = reference(req)
        except RequestValidationError as exc:
            with pytest.raises(RequestValidationError) as fast:
                parse_request(req)
            assert (str(fast.value), fast.value.path, fast.value.hint) == (str(exc), exc.path, exc.hint)
            continue
        fast = parse_request(req)
        assert fast == ref
        assert (fast.source_sha256, fast.extra, fast.dialect) == (ref.source_sha256, ref.extra, ref.dialect)
        assert [m.source for m in fast.messages] == [m.source for m in ref.messages]


# ---------------------------------------------------------------------------------------------------------------
# The size rule and the public names


def test_modules_and_functions_keep_the_size_rule() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        text = path.read_text("utf-8")
        assert text.count("\n") <= 700, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno - node.lineno + 1 <= 80, f"{path.name}: {node.name}"


def test_the_names_other_modules_import_are_exported() -> None:
    for name in ctxlock.request.__all__:
        assert hasattr(ctxlock.request, name), name
    assert {"Request", "Message", "ToolCall", "parse_request", "join_path", "json_type_name"} <= set(
        ctxlock.request.__all__
    )
