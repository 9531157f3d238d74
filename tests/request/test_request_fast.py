"""The request memo (the incremental Mapping path of parse_request): the same Request, field for field, as the
full path.

Every test compares against the full path run inside `reference_path()`, which never reads or writes the memo,
through public functions only: `parse_request`, `clear_request_memo`, and the memo's entries in the cache
registry (`ctxlock.caches.cache_info()`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock.request._openai
from ctxlock import caches
from ctxlock.core._frozen import FrozenDict
from ctxlock.errors import RequestEncodingError, RequestError, RequestJSONError, RequestValidationError
from ctxlock.request import (
    MAX_JSON_DEPTH,
    RESERVED_TEMPLATE_KWARGS,
    Dialect,
    Message,
    Request,
    ToolCall,
    Utf8Policy,
    clear_request_memo,
    parse_request,
)
from ctxlock.settings import reference_path
from hypothesis_profiles import examples

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import corpus


@pytest.fixture(autouse=True)
def cold_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with an empty memo, and with the fast paths on even in a `CTXLOCK_FAST=0` run of the
    suite: these tests are about the memo, each compared with the reference path."""
    monkeypatch.setenv("CTXLOCK_FAST", "1")
    clear_request_memo()


def memoized_requests() -> int:
    """How many requests' messages the memo holds (its entry in the cache registry)."""
    return caches.cache_info()["request.memo.messages"].size


def memoized_frames() -> int:
    return caches.cache_info()["request.memo.frames"].size


def reference(data: Any, **kwargs: Any) -> Request:
    with reference_path():
        return parse_request(data, **kwargs)


def assert_identical(fast: Any, ref: Any, where: str = "request") -> None:
    """Equal in every field, the ones `==` skips included, with the same types all the way down."""
    assert type(fast) is type(ref), f"{where}: {type(fast).__name__} != {type(ref).__name__}"
    if dataclasses.is_dataclass(fast):
        for f in dataclasses.fields(fast):
            assert_identical(getattr(fast, f.name), getattr(ref, f.name), f"{where}.{f.name}")
    elif isinstance(fast, tuple):
        assert len(fast) == len(ref), where
        for i, (a, b) in enumerate(zip(fast, ref, strict=True)):
            assert_identical(a, b, f"{where}[{i}]")
    elif isinstance(fast, FrozenDict):
        assert list(fast) == list(ref), where
        for key in fast:
            assert_identical(fast[key], ref[key], f"{where}[{key!r}]")
    elif isinstance(fast, float):
        assert repr(fast) == repr(ref), where
    else:
        assert fast == ref, where


def check(data: Any, *, served: bool = False, **kwargs: Any) -> Request:
    """Parse on the fast path and on the reference path; assert identical results. Returns the fast one.

    `served`: also assert that the incremental path produced the result itself, without giving up (a give-up
    falls back to the full path and would hide a fast path that is correct only because it is never used). Only
    the memo stores what it parsed, and only it gives back the very Message objects of an earlier parse (the full
    path builds new ones every time), so parsing the same request again must return the same objects.
    """
    fast = parse_request(data, **kwargs)
    if served:
        again = parse_request(data, **kwargs)
        assert all(a is b for a, b in zip(fast.messages, again.messages, strict=True)), "the memo gave up"
    assert_identical(fast, reference(data, **kwargs))
    assert fast == reference(data, **kwargs)
    return fast


def same_error(data: Any, **kwargs: Any) -> RequestError:
    """Both paths raise: the same type, message, path and hint."""
    with pytest.raises(RequestError) as fast:
        parse_request(data, **kwargs)
    with pytest.raises(RequestError) as ref, reference_path():
        parse_request(data, **kwargs)
    assert type(fast.value) is type(ref.value)
    assert str(fast.value) == str(ref.value)
    assert fast.value.path == ref.value.path
    assert fast.value.hint == ref.value.hint
    return fast.value


def call(id_: str, name: str = "search", arguments: Any = None) -> dict[str, Any]:
    args = {"q": "weather"} if arguments is None else arguments
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def assistant_call(arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [call("c9", arguments=arguments)]}


HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse. 简洁 🚀"},
    {"role": "user", "content": "What is the weather in Paris?", "name": "ann"},
    {"role": "assistant", "content": None, "tool_calls": [call("c1"), call("c2", arguments='{"q": "rain"}')]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "no rain"}]},
    {"role": "assistant", "content": "Sunny, no rain.", "reasoning_content": "both tools agree"},
]


def warm(tools: bool = True) -> dict[str, Any]:
    """Memoize a valid history; return the request."""
    req: dict[str, Any] = {"model": "m", "messages": copy.deepcopy(HISTORY)}
    if tools:
        req["tools"] = copy.deepcopy(corpus.TOOLS)
    check(req, served=True)
    assert memoized_requests(), "the valid history was memoized"
    return req


def extended(req: dict[str, Any], *messages: Any) -> dict[str, Any]:
    return {**req, "messages": [*req["messages"], *messages]}


# ---------------------------------------------------------------------------------------------------------------
# Differential


def test_benchmark_corpus_is_identical_to_the_reference_path() -> None:
    reqs = [r for c in range(20) for r in corpus.conversation(20, seed=100 + c, scale=0.25)]
    previous = None
    for req in reqs:
        fast = check(req, served=True)
        if previous is not None and fast.messages[0] == previous.messages[0]:  # the same conversation
            assert fast.messages[0] is previous.messages[0]
        previous = fast
    assert memoized_requests() <= 64  # the memo's bound


def test_single_shot_corpus_and_fresh_objects_per_request() -> None:
    # A server parses fresh objects every time: nothing is shared with the memo but equal values.
    for req in corpus.single_shot(60, seed=5, scale=0.1):
        check(json.loads(json.dumps(req)), served=True)
    for req in corpus.conversation(12, seed=7, scale=0.1):
        check(json.loads(json.dumps(req)), served=True)


_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(blacklist_categories=("Cs",)),  # no lone surrogates: tested on their own below
        st.sampled_from('天空为什么是蓝色😀🚀👩‍👩‍👧‍👦🇯🇵\n\t"\\/'),
    ),
    max_size=12,
)
_JSON_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=False, allow_infinity=False), _TEXT
)
_JSON = st.recursive(
    _JSON_SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)),
    max_leaves=8,
)
_IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True).filter(lambda k: k not in RESERVED_TEMPLATE_KWARGS)


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[int]]:
    """A multi-turn OpenAI request replayed turn by turn: (requests, cut points)."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": draw(st.sampled_from(["system", "developer"])), "content": draw(_TEXT)})
    cuts: list[int] = []
    ids = 0
    for _ in range(draw(st.integers(1, 4))):
        content: Any = draw(_TEXT)
        if draw(st.integers(0, 3)) == 0:
            content = [{"type": "text", "text": draw(_TEXT)}]
            if draw(st.booleans()):
                content.append({"type": "image_url", "image_url": {"url": "https://x/" + draw(_TEXT), "detail": "low"}})
        user: dict[str, Any] = {"role": "user", "content": content}
        if draw(st.booleans()):
            user["name"] = draw(_TEXT)
        messages.append(user)
        cuts.append(len(messages))
        if draw(st.booleans()):
            calls = []
            for _ in range(draw(st.integers(1, 2))):
                ids += 1
                args = draw(st.dictionaries(_TEXT, _JSON, max_size=3))
                calls.append(call(f"call_{ids}", draw(_IDENT), json.dumps(args) if draw(st.booleans()) else args))
            assistant: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | _TEXT), "tool_calls": calls}
            if draw(st.booleans()):
                assistant["reasoning_content"] = draw(_TEXT)
            messages.append(assistant)
            for c in calls:
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": draw(_TEXT)})
        reply: dict[str, Any] = {"role": "assistant", "content": draw(_TEXT)}
        if draw(st.booleans()):
            reply["reasoning"] = draw(_TEXT)
        messages.append(reply)
    return messages, cuts


@st.composite
def top_levels(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """Top-level values to put before and after the messages."""
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    if draw(st.booleans()):
        before["model"] = draw(_TEXT)
    if draw(st.booleans()):
        after["tools"] = [
            {"type": "function", "function": {"name": draw(_IDENT), "parameters": {"type": "object"}}}
            for _ in range(draw(st.integers(1, 2)))
        ]
    if draw(st.booleans()):
        after["documents"] = [{"title": draw(_TEXT), "text": draw(_TEXT)}]
    if draw(st.booleans()):
        after["chat_template_kwargs"] = draw(st.dictionaries(_IDENT, _JSON, max_size=2))
    for key in draw(st.lists(st.sampled_from(["temperature", "stream", "metadata", "n"]), unique=True, max_size=3)):
        (before if draw(st.booleans()) else after)[key] = draw(_JSON)
    return before, after


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    conversations(),
    top_levels(),
    st.sampled_from(["shared", "fresh", "tuples"]),
    st.sampled_from(["strict", "replace"]),
)
def test_generated_conversations_are_identical_to_the_reference_path(
    conv: tuple[list[dict[str, Any]], list[int]], top: tuple[dict[str, Any], dict[str, Any]], objects: str, utf8: str
) -> None:
    clear_request_memo()
    messages, cuts = conv
    before, after = top
    for cut in cuts:
        req = {**before, "messages": messages[:cut], **after}
        if objects == "fresh":  # what a server sees: new objects with equal values every request
            req = copy.deepcopy(req)
        elif objects == "tuples":  # tuples stand for arrays, as in the full path's _to_plain
            req["messages"] = tuple(req["messages"])
        fast = check(req, utf8=utf8, served=True)
        assert fast.dialect is Dialect.OPENAI


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_JSON)
def test_the_memos_serialization_is_json_dumps(value: Any) -> None:
    # The memo serializes each top-level value and each message itself; source_sha256 is the digest of
    # json.dumps of the whole request, so an identical digest (checked by `check`) means identical bytes.
    clear_request_memo()
    check({"messages": [{"role": "user", "content": "x"}], "metadata": value}, served=True)
    args = {"v": value}
    check({"messages": [{"role": "user", "content": "x"}, assistant_call(args)]}, served=True)


# ---------------------------------------------------------------------------------------------------------------
# The memo is used, and only where it may be


def test_later_turns_build_only_the_new_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    req = warm()
    first = parse_request(req)
    built: list[str] = []
    real = ctxlock.request._openai.parse_message

    def counting(raw: Any, path: str, *args: Any) -> Message:
        built.append(path)
        return real(raw, path, *args)

    monkeypatch.setattr(ctxlock.request._openai, "parse_message", counting)
    nxt = extended(req, {"role": "user", "content": "And tomorrow?"})
    second = parse_request(nxt)
    n = len(req["messages"])
    assert built == [f"messages[{n}]"]
    monkeypatch.undo()
    assert_identical(second, reference(nxt))
    assert all(a is b for a, b in zip(second.messages[:n], first.messages, strict=True))
    assert second.tools is first.tools  # tools parsed once
    assert reference(nxt).messages[0] is not first.messages[0]  # the reference path builds its own


def test_a_tool_message_after_the_reused_prefix_sees_earlier_call_ids() -> None:
    req = warm()
    nxt = extended(
        req,
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "", "tool_calls": [call("c3")]},
        {"role": "tool", "tool_call_id": "c3", "content": "ok"},
        {"role": "tool", "tool_call_id": "c1", "content": "answers a call in the reused prefix"},
    )
    first = check(nxt, served=True)
    second = check(extended(nxt, {"role": "tool", "tool_call_id": "c2", "content": "and another"}), served=True)
    assert second.messages[-2] is first.messages[-1]


def test_a_changed_earlier_message_reuses_only_the_messages_before_it() -> None:
    req = warm()
    first = parse_request(req)
    changed = copy.deepcopy(req)
    changed["messages"][3]["content"] = "cloudy"  # a tool result answering a call of messages[2]
    changed["messages"].append({"role": "user", "content": "so?"})
    second = check(changed, served=True)
    assert second.messages[3].content == "cloudy"
    assert all(a is b for a, b in zip(second.messages[:3], first.messages, strict=False))
    assert second.messages[4] is not first.messages[4]  # rebuilt after the change, though equal


def test_regenerated_and_shortened_histories() -> None:
    req = warm()
    one = check(extended(req, {"role": "user", "content": "one"}), served=True)
    two = check(extended(req, {"role": "user", "content": "two"}), served=True)  # the last message edited
    assert two.messages[-2] is one.messages[-2]
    check({**req, "messages": req["messages"][:2]}, served=True)
    check({**req, "messages": req["messages"][:1]}, served=True)
    check({**req, "messages": [*req["messages"][:1], {"role": "user", "content": "new branch"}]}, served=True)


def test_fast_path_off_and_reference_path_leave_the_memo_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    req = {"messages": copy.deepcopy(HISTORY)}
    with reference_path():
        parse_request(req)
    assert not memoized_requests()
    monkeypatch.setenv("CTXLOCK_FAST", "0")
    a = parse_request(req)
    assert not memoized_requests()
    monkeypatch.setenv("CTXLOCK_FAST", "1")
    assert_identical(parse_request(req), a)
    assert memoized_requests()


def test_inputs_left_to_the_full_path_are_not_memoized() -> None:
    anthropic = {"system": "s", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert check(anthropic).dialect is Dialect.ANTHROPIC
    tool_use = {
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        ]
    }
    assert check(tool_use).dialect is Dialect.ANTHROPIC  # detected from a message
    check({"messages": [{"role": "user", "content": "x"}]}, dialect="anthropic")
    check(OrderedDict(messages=[{"role": "user", "content": "x"}]))  # a Mapping that is not a dict
    check(json.dumps({"messages": [{"role": "user", "content": "x"}]}))  # str and bytes
    check(json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode())
    assert not memoized_requests()


def test_an_explicit_openai_dialect_keeps_system_in_extra() -> None:
    fast = check({"system": "not anthropic here", "messages": [{"role": "user", "content": "x"}]}, dialect="openai")
    assert fast.extra == {"system": "not anthropic here"}


def test_the_memo_is_bounded() -> None:
    sizes = []
    for k in range(120):
        check({"messages": [{"role": "user", "content": f"conversation {k}"}], "n": k})
        sizes.append((memoized_requests(), memoized_frames()))
    requests, frames = zip(*sizes, strict=True)
    assert requests[-1] == max(requests) == requests[-30] < 120  # full, and evicting the oldest
    assert frames[-1] == max(frames) == frames[-30] < 120
    assert requests[-1] == 64 and frames[-1] == 32  # the memo's bounds


def test_clear_caches_empties_the_memo() -> None:
    warm()
    assert memoized_requests() and memoized_frames()
    caches.clear_caches("request")
    assert memoized_requests() == memoized_frames() == 0
    warm()
    caches.clear_caches()
    assert memoized_requests() == memoized_frames() == 0


def test_parallel_parses_are_identical_to_the_reference_path() -> None:
    reqs = [r for c in range(4) for r in corpus.conversation(8, seed=300 + c, scale=0.05)]
    expected = [reference(r) for r in reqs]
    failures: list[BaseException] = []

    def worker(offset: int) -> None:
        try:
            for _ in range(3):
                for k in range(len(reqs)):
                    i = (k + offset) % len(reqs)
                    assert_identical(parse_request(reqs[i]), expected[i])
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(7 * t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]


# ---------------------------------------------------------------------------------------------------------------
# Errors in a new message, after a valid history was memoized


@pytest.mark.parametrize(
    ("message", "exc"),
    [
        ({"role": "robot", "content": "x"}, RequestValidationError),
        ({"role": "tool", "tool_call_id": "nope", "content": "x"}, RequestValidationError),
        ({"role": "user", "content": "x", "extra_key": 1}, RequestValidationError),
        ({"role": "user", "content": "x", 1: "non-str key"}, RequestValidationError),
        ({"role": "user", "content": {1, 2}}, RequestValidationError),  # not a JSON value
        ({"role": "user", "content": "lone \ud800 surrogate"}, RequestEncodingError),
        (
            {"role": "assistant", "content": None, "tool_calls": [call("c9", arguments={"x": float("nan")})]},
            RequestJSONError,
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": [call("c9", arguments={"x": float("-inf")})]},
            RequestJSONError,
        ),
        ({"role": "assistant", "content": None, "tool_calls": [call("c9", arguments='{"x": NaN}')]}, RequestJSONError),
        (
            {"role": "assistant", "content": None, "tool_calls": [call("c9", arguments='{"a": 1, "a": 2}')]},
            RequestJSONError,
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": [call("c9", arguments='"\\ud800"')]},
            RequestEncodingError,
        ),
        ({"role": "assistant", "content": None, "tool_calls": [call("c9", arguments="[1]")]}, RequestValidationError),
    ],
)
def test_an_invalid_new_message_raises_what_the_full_path_raises(message: dict[Any, Any], exc: type) -> None:
    req = warm()
    err = same_error(extended(req, message))
    assert type(err) is exc
    assert err.path.startswith(f"messages[{len(req['messages'])}]") or err.path.startswith("byte ")
    check(extended(req, {"role": "user", "content": "fine again"}))  # the memo survives the error


def test_too_deep_new_message() -> None:
    req = warm()
    deep: Any = "x"
    for _ in range(MAX_JSON_DEPTH):
        deep = [deep]
    err = same_error(
        extended(req, {"role": "assistant", "content": None, "tool_calls": [call("c9", arguments={"d": deep})]})
    )
    assert type(err) is RequestJSONError
    # One level less fits: the depth limit is the full path's, counted from the request's root.
    fits: Any = "x"
    for _ in range(MAX_JSON_DEPTH - 7):  # root, messages, message, tool_calls, call, function, arguments: 7 levels
        fits = [fits]
    check(extended(req, {"role": "assistant", "content": None, "tool_calls": [call("c9", arguments={"d": fits})]}))
    fits = [fits]
    same_error(extended(req, {"role": "assistant", "content": None, "tool_calls": [call("c9", arguments={"d": fits})]}))
    # The same with objects.
    nested: Any = {}
    for _ in range(MAX_JSON_DEPTH - 7):
        nested = {"k": nested}
    check(extended(req, {"role": "assistant", "content": None, "tool_calls": [call("c9", arguments=nested)]}))
    nested = {"k": nested}
    same_error(extended(req, {"role": "assistant", "content": None, "tool_calls": [call("c9", arguments=nested)]}))


def test_lone_surrogates_under_replace_are_the_full_paths() -> None:
    req = warm()
    fast = check(extended(req, {"role": "user", "content": "lone \ud800 surrogate"}), utf8="replace")
    assert fast.replaced_bytes and "\ufffd" in fast.messages[-1].content
    escaped = extended(
        req, {"role": "assistant", "content": None, "tool_calls": [call("c9", arguments='{"x": "\\udc00"}')]}
    )
    fast = check(escaped, utf8="replace", served=True)
    assert fast.messages[-1].tool_calls[0].arguments == {"x": "\ufffd"}
    # Memoized under replace, the same messages are still an error under strict.
    same_error(extended(escaped, {"role": "user", "content": "next"}), utf8="strict")
    check(extended(escaped, {"role": "user", "content": "next"}), utf8="replace", served=True)
    same_error(extended(req, {"role": "user", "content": "lone \ud800 surrogate"}), utf8="strict")


def test_errors_outside_the_messages() -> None:
    req = warm()
    same_error({**req, "tools": [{"type": "function", "function": {}}]})
    same_error({**req, "functions": [{"name": "f"}]})
    same_error({**req, "chat_template_kwargs": {"bos_token": "x"}})
    same_error({**req, "documents": ["not an object"]})
    same_error({**req, "messages": []})
    same_error({**req, "messages": None})
    same_error({"model": "m"})
    same_error({**req, "temperature": float("nan")})
    same_error({**req, 7: "non-str top-level key"})


def test_an_invalid_message_in_the_reused_prefix_is_still_reported() -> None:
    req = warm()
    bad = copy.deepcopy(req)
    bad["messages"][1]["role"] = "robot"
    same_error(bad)


# ---------------------------------------------------------------------------------------------------------------
# Mutation safety and exactness of the comparison


def test_mutating_the_callers_dicts_after_a_parse() -> None:
    req = warm()
    first = parse_request(req)
    req["messages"][1]["content"] = "changed in place"
    second = check(req)
    assert second.messages[1].content == "changed in place"
    assert second.messages[0] is first.messages[0]
    req["messages"][2]["tool_calls"][0]["function"]["arguments"]["q"] = "nested change"
    third = check(req)
    assert third.messages[2].tool_calls[0].arguments == {"q": "nested change"}
    # The same value objects under another key.
    args = req["messages"][2]["tool_calls"][0]["function"]["arguments"]
    args["p"] = args.pop("q")
    assert check(req).messages[2].tool_calls[0].arguments == {"p": "nested change"}
    req["messages"][1]["name"] = req["messages"][1].pop("content")
    same_error(req)  # content is required
    req["messages"][1]["content"] = req["messages"][1].pop("name")
    check(req)
    req["tools"][0]["function"]["description"] = "changed tools"
    assert check(req).tools[0]["function"]["description"] == "changed tools"
    req["messages"].append({"role": "user", "content": "appended"})
    check(req)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.update(content=m.pop("content")),  # key order: equal as dicts, different bytes
        lambda m: m["tool_calls"][0]["function"]["arguments"].update(n=1.0),  # 1 == 1.0 == True
        lambda m: m["tool_calls"][0]["function"]["arguments"].update(n=True),
        lambda m: m["tool_calls"][0]["function"]["arguments"].update(n=-0.0),  # 0.0 == -0.0
        lambda m: m["tool_calls"][0]["function"]["arguments"].update(n=0.0),
        lambda m: m["tool_calls"][0]["function"]["arguments"].update(n=(1, 2)),  # a tuple is an array
        lambda m: m["tool_calls"][0]["function"].update(arguments=OrderedDict(q="weather", n=1)),
    ],
)
def test_changes_that_compare_equal_but_serialize_differently(change: Any) -> None:
    base = copy.deepcopy(HISTORY)
    base[2]["tool_calls"][0]["function"]["arguments"] = {"q": "weather", "n": 1}
    req = {"messages": base, "tools": copy.deepcopy(corpus.TOOLS)}
    first = check(req)
    changed = copy.deepcopy(req)
    change(changed["messages"][2])
    second = check(changed)
    if changed["messages"][2] == req["messages"][2] and json.dumps(changed) != json.dumps(req):
        assert second.source_sha256 != first.source_sha256


def test_a_sequence_of_equal_but_different_values_in_a_message() -> None:
    values = [1, 1.0, True, 1, 0.0, -0.0, 0, False, -0.0, None, [1], (1,), [1.0], {"a": 1}, {"a": True}, "1", 1]
    for value in values:
        messages = copy.deepcopy(HISTORY)
        messages[2]["tool_calls"][0]["function"]["arguments"] = {"q": "weather", "n": value}
        messages.append({"role": "user", "content": "x"})
        check({"messages": messages}, served=True)


@pytest.mark.parametrize(
    "value",
    [{"a": 1}, {"a": 1.0}, {"a": True}, {"a": -0.0}, {"a": 0.0}, {"b": 1, "a": 1}, {"a": 1, "b": 1}, [1, 2], (1, 2)],
)
def test_top_level_values_that_compare_equal_but_serialize_differently(value: Any) -> None:
    req = {"messages": [{"role": "user", "content": "x"}]}
    for v in ({"a": 1}, {"a": 1.0}, {"a": True}, {"a": -0.0}, {"a": 0.0}, {"a": 1, "b": 1}, [1, 2]):
        check({**req, "metadata": v})
    check({**req, "metadata": value})
    check({**req, "chat_template_kwargs": {"x": value}})


class _LyingStr(str):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


def test_subclasses_and_foreign_objects_are_left_to_the_full_path() -> None:
    req = warm()
    for odd in (_LyingStr("a lie"), OrderedDict(role="user", content="x")):
        changed = copy.deepcopy(req)
        changed["messages"][1] = {"role": "user", "content": odd} if isinstance(odd, str) else odd
        check(changed)
    lying_key = copy.deepcopy(req)
    lying_key["messages"][1] = {_LyingStr("role"): "user", "content": "What is the weather in Paris?", "name": "ann"}
    check(lying_key)


def test_the_bytes_before_the_messages_are_part_of_the_digest() -> None:
    messages = copy.deepcopy(HISTORY)
    for model in ("a", "b", "a"):
        check({"model": model, "messages": messages}, served=True)
        check({"model": model, "messages": [*messages, {"role": "user", "content": "x"}]}, served=True)
        check({"messages": [*messages, {"role": "user", "content": "x"}], "model": model}, served=True)


def test_conversations_sharing_a_prefix_do_not_mix() -> None:
    # Two conversations with the same system prompt and length do not mix.
    a = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}]}
    b = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "b"}]}
    assert check(a).messages[1].content == "a"
    assert check(b).messages[1].content == "b"
    assert check(extended(a, {"role": "assistant", "content": "ra"})).messages[1].content == "a"
    assert check(extended(b, {"role": "assistant", "content": "rb"})).messages[1].content == "b"


def test_tool_call_sources_and_request_provenance() -> None:
    req = warm()
    fast = check(extended(req, {"role": "user", "content": "x"}))
    assert fast.messages[2].tool_calls[1].source == "messages[2].tool_calls[1]"
    assert isinstance(fast.messages[2].tool_calls[0], ToolCall)
    assert fast.utf8_policy is Utf8Policy.STRICT and fast.replaced_bytes == ()
    assert fast.extra == {"model": "m"}
