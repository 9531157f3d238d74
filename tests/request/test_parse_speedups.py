"""The fast paths of a `ctxlock batch` row's parse and digest, each against its reference path (`CTXLOCK_FAST=0`).

- `jsonread.loads_strict`'s one-pass reader (`_loads_fast`): the stdlib's C scanner with hooks that refuse a duplicate
  key, NaN/Infinity or an overflowing number as they meet it (the reference walk then reports it with its path),
  and a depth proof from the bracket count. Values (types, key order) and errors (type, message, path, hint) equal
  the reference's on generated texts, hostile ones included (duplicates, deep nesting, brackets in strings,
  surrogate escapes, a BOM, broken syntax, huge numbers).
- `openai._text_messages` and `values.text_message`: a `{"role", "content": str}` message built without
  `parse_message`'s checks or the dataclass `__init__` (and the Request without it, `values.request_of`): the Request
  is the reference's in every field and pickles to the same bytes.
- `Request.to_json()` and `Request.json_sha256()` (the batch row's digest) from the UTF-8 text written piece by piece
  (`_canonical.request_json_bytes`): the same text on generated Requests of every shape, parsed or built directly
  (odd field types, NaN, non-JSON values, lone surrogates: the same error), and the same escaping as the encoder on
  every code point.
- `frozen.canonical_json` with one encoder: the text of `json.dumps` with its options.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pickle
import sys
from enum import StrEnum
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxlock.batch._fast import _digest
from ctxlock.core._frozen import FrozenDict, canonical_json, freeze, thaw
from ctxlock.errors import CtxlockError
from ctxlock.outside._json import _loads_fast, _Refused, loads_strict
from ctxlock.request import MAX_JSON_DEPTH, Dialect, Message, Request, ToolCall, Utf8Policy, parse_request
from ctxlock.request._canonical import _controls_escaped, _quoted, request_json_bytes
from ctxlock.request._values import request_of, text_message
from ctxlock.settings import fast_path, reference_path
from hypothesis_profiles import examples

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_batch  # the rows `ctxlock batch` is benchmarked on
import corpus

# -- helpers ----------------------------------------------------------------------------------------------------------


def typed(value: Any) -> Any:
    """A value with every type spelled out (1, 1.0 and True differ; key order kept)."""
    if isinstance(value, dict):
        return (type(value).__name__, [(k, typed(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value).__name__, [typed(v) for v in value])
    return (type(value).__name__, repr(value))


def outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """What a call gives: its typed value, or its exception's type, text, path and hint."""
    try:
        return ("value", typed(fn(*args, **kwargs)))
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc), getattr(exc, "path", None), getattr(exc, "hint", None))


def both(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    with fast_path():
        fast = outcome(fn, *args, **kwargs)
    with reference_path():
        reference = outcome(fn, *args, **kwargs)
    return fast, reference


def parsed_both(data: Any, **kwargs: Any) -> tuple[Any, Any]:
    """`parse_request` on both paths: the Request's pickle (every field, the uncompared ones too, with their types,
    order and shared objects) and its to_json, or the error."""

    def run() -> Any:
        try:
            request = parse_request(data, **kwargs)
        except CtxlockError as exc:
            return ("error", type(exc).__name__, str(exc), exc.path, exc.hint)
        return ("value", pickle.dumps(request), request.to_json(), _digest(request))

    with fast_path():
        fast = run()
    with reference_path():
        reference = run()
    return fast, reference


# -- the strict JSON reader -------------------------------------------------------------------------------------------

_KEYS = ["a", "b", "role", "content", "k\\u00e9", "\\ud83d\\ude00", "x\\ud800", "\\uDC00", "[{", "dup"]
_LEAVES = [
    "1",
    "-0",
    "2.5",
    "-0.0",
    "1e5",
    "1E-3",
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    "-Infinity",
    "null",
    "true",
    "false",
    '"text"',
    '"h\\u00e9llo \\"q\\" \\\\ \\n"',
    '"\\ud83d\\ude42"',
    '"lone \\udbff"',
    '"日本語 🙂 текст"',
    '"{[{[{[ brackets in a string ]}]}]"',
    "1" * 5000,  # more digits than int() takes by default
]


def _containers(children: Any) -> Any:
    arrays = st.lists(children, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]")
    objects = st.lists(st.tuples(st.sampled_from(_KEYS), children), max_size=4).map(
        lambda kv: "{" + ", ".join(f'"{k}": {v}' for k, v in kv) + "}"
    )
    return st.one_of(arrays, objects)


json_texts = st.recursive(st.sampled_from(_LEAVES), _containers, max_leaves=16)


def _mutate(text: str, where: int, how: int) -> str:
    at = where % (len(text) + 1)
    return [
        text,
        text[:at],  # truncated
        text[:at] + "," + text[at:],
        text[:at] + "\ud800" + text[at:],  # a lone surrogate character (not an escape)
        "\ufeff" + text,
        " \n\t" + text + " \r\n",
        text + " x",  # extra data
    ][how % 7]


@pytest.mark.parametrize("policy", [Utf8Policy.STRICT, Utf8Policy.REPLACE])
@settings(max_examples=examples(400), deadline=None)
@given(text=json_texts, where=st.integers(0, 10_000), how=st.integers(0, 20))
def test_loads_strict_one_pass_equals_the_reference(policy: Utf8Policy, text: str, where: int, how: int) -> None:
    text = _mutate(text, where, how)
    fast, reference = both(loads_strict, text, "$", policy)
    assert fast == reference
    if "\ud800" not in text:  # `source`: the bytes the text came from (it holds no lone surrogate character)
        assert both(loads_strict, text, "$", policy, source=text.encode())[0] == reference


def _nested(depth: int, padding: int = 0) -> str:
    return '{"pad": "' + "{[" * padding + '", "x": ' + "[" * depth + "1" + "]" * depth + "}"


@pytest.mark.parametrize(
    ("depth", "padding"),
    [
        *((MAX_JSON_DEPTH + d, 0) for d in (-2, -1, 0, 1, 3000)),
        *((depth, 200) for depth in (5, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 7)),
    ],
)
def test_depth_is_refused_at_the_same_container(depth: int, padding: int) -> None:
    """The bracket count proves shallow texts; brackets inside strings only send the text to the depth walk."""
    text = _nested(depth, padding)
    fast, reference = both(loads_strict, text, "$", Utf8Policy.STRICT)
    assert fast == reference
    shallow = depth < MAX_JSON_DEPTH  # the root object is at depth 0, the innermost list at `depth`
    assert (
        _loads_fast(text, text.encode()) is _Refused
    ) is not shallow  # the one-pass reader serves every shallow text


def test_the_one_pass_reader_refuses_what_the_walk_reports() -> None:
    for text in ['{"a": 1, "a": 2}', "[NaN]", '{"x": -Infinity}', "[1e400]", '["\\ud800"]', "\ufeff{}", "[1,]"]:
        assert _loads_fast(text, text.encode()) is _Refused, text
        fast, reference = both(loads_strict, text, "$", Utf8Policy.STRICT)
        assert fast == reference and fast[0] == "error", text
    # ... and serves a valid text, surrogate pairs spelled raw, as the reference builds it
    text = '{"m": [{"role": "user", "content": "🙂 \\n \\"x\\""}], "t": 0.5, "n": -0, "b": [true, null]}'
    assert typed(_loads_fast(text, text.encode())) == both(loads_strict, text, "$", Utf8Policy.STRICT)[1][1]


# -- parse_request ----------------------------------------------------------------------------------------------------

_ROLES = ["system", "developer", "user", "assistant", "tool", "admin", ""]
_STRINGS = st.sampled_from(["", "hi", "日本語 🙂", 'q"uote\\', "\n\t\x00\x1f\x7f", "\u2028", "c1", "c2"])


def _message() -> Any:
    base = st.fixed_dictionaries(
        {"role": st.one_of(st.sampled_from(_ROLES), st.none(), st.integers())},
        optional={
            "content": st.one_of(
                _STRINGS,
                st.none(),
                st.integers(),
                st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _STRINGS}), max_size=2),
            ),
            "name": st.one_of(_STRINGS, st.none()),
            "tool_call_id": st.one_of(_STRINGS, st.none()),
            "reasoning": st.one_of(_STRINGS, st.none()),
            "reasoning_content": _STRINGS,
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": st.sampled_from(["c1", "c2"]),
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries(
                            {"name": st.just("f"), "arguments": st.sampled_from(["{}", '{"a": 1}', {"b": [1.5]}])}
                        ),
                    }
                ),
                max_size=2,
            ),
            "refusal": st.none(),
            "extra": st.just(1),
        },
    )
    plain = st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]), "content": _STRINGS}
    )
    return st.one_of(plain, plain, base)


requests = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(_message(), max_size=5), st.none(), st.just("x"))},
    optional={
        "model": st.just("m"),
        "temperature": st.sampled_from([0.5, 1, 0]),
        "tools": st.just(corpus.TOOLS),
        "documents": st.just([{"title": "t", "text": "body"}]),
        "chat_template_kwargs": st.sampled_from([{}, {"enable_thinking": False}, {"x": [1, 2.5, None]}]),
        "system": st.just("anthropic"),
    },
)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    request=requests,
    ascii_=st.booleans(),
    indent=st.sampled_from([None, 1]),
    key_order=st.booleans(),
    duplicate=st.booleans(),
    how=st.integers(0, 30),
    where=st.integers(0, 10_000),
)
def test_parse_request_equals_the_reference(
    request: dict[str, Any], ascii_: bool, indent: Any, key_order: bool, duplicate: bool, how: int, where: int
) -> None:
    text = json.dumps(request, ensure_ascii=ascii_, indent=indent, sort_keys=key_order)
    if duplicate and text.endswith("}"):
        text = text[:-1] + ', "model": "again"}'
    text = _mutate(text, where, how) if how < 7 else text
    for data in (text, text.encode("utf-8", "surrogatepass")):
        fast, reference = parsed_both(data)
        assert fast == reference
    fast, reference = parsed_both(text, tool_arguments="as-sent", utf8="replace")
    assert fast == reference


_BAD_BYTES = [b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f\x99", b"\x80\x80", b"\xef\xbb\xbf", b"\\u"]


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=requests, bad=st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(_BAD_BYTES)), max_size=3))
def test_parse_request_of_broken_bytes_equals_the_reference(request: dict[str, Any], bad: list[Any]) -> None:
    """Invalid UTF-8 (rejected, or replaced and recorded), a BOM, a stray escape, anywhere in the bytes."""
    data = json.dumps(request, ensure_ascii=False).encode()
    for where, piece in bad:
        at = where % (len(data) + 1)
        data = data[:at] + piece + data[at:]
    for utf8 in ("strict", "replace"):
        fast, reference = parsed_both(data, utf8=utf8)
        assert fast == reference


def test_plain_messages_take_the_fast_path_and_pickle_the_same() -> None:
    text = json.dumps({"messages": [{"content": "a", "role": "user"}, {"role": "assistant", "content": "b"}]})
    fast, reference = parsed_both(text)
    assert fast == reference and fast[0] == "value"
    for role in ("system", "developer", "user", "assistant"):
        made = text_message(role, "x\n🙂", "messages[3]")
        built = Message(role=role, content="x\n🙂", source="messages[3]")
        assert list(made.__dict__.items()) == list(built.__dict__.items())
        assert [f.name for f in dataclasses.fields(Message)] == list(made.__dict__)  # a new field fails here
        assert pickle.dumps(made) == pickle.dumps(built)
        assert repr(made) == repr(built) and hash(made) == hash(built) and made == built
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.role = "user"  # type: ignore[misc]


def test_request_of_is_the_dataclass_init() -> None:
    fields = {
        "dialect": Dialect.ANTHROPIC,
        "messages": (Message(role="user", content="x"),),
        "tools": (FrozenDict({"type": "function"}),),
        "documents": None,
        "chat_template_kwargs": FrozenDict({"a": 1}),
        "extra": FrozenDict({"model": "m"}),
        "source_sha256": "ab",
        "utf8_policy": Utf8Policy.REPLACE,
        "replaced_bytes": (3, 4),
        "cache_control": (FrozenDict({"path": "system[0]"}),),
    }
    made, built = request_of(**fields), Request(**fields)
    assert [f.name for f in dataclasses.fields(Request)] == list(made.__dict__)  # a new field fails here
    assert list(made.__dict__.items()) == list(built.__dict__.items())
    assert pickle.dumps(made) == pickle.dumps(built)
    assert repr(made) == repr(built) and hash(made) == hash(built) and made == built
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.tools = None  # type: ignore[misc]


def test_benchmark_rows_parse_and_digest_as_the_reference() -> None:
    rows = bench_batch._rows(300, seed=7)
    for row in rows:
        fast, reference = parsed_both(row.encode())
        assert fast == reference
        if fast[0] == "value":  # and the fast paths served it (none of them gave up)
            assert _loads_fast(row, row.encode()) is not _Refused
            with reference_path():
                request = parse_request(row)
            assert request_json_bytes(request, Message) == request.to_json().encode()


# -- Request.to_json --------------------------------------------------------------------------------------------------


class _Role(StrEnum):
    USER = "user"


class _Str(str):
    __slots__ = ()


_ANY_TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["\x00\x08\x0b\x0c\x0e\x1f", '"\\/', "\ud800", "\u2028"]))
_ODD = st.one_of(_ANY_TEXT, st.none(), st.integers(), st.just(_Str("s")), st.just(_Role.USER), st.just(math.nan))
_JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), _ANY_TEXT),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(_ANY_TEXT, c, max_size=3)),
    max_leaves=8,
)


@st.composite
def _messages(draw: Any) -> Message:
    """Mostly what `_canonical` writes itself (str fields, no tool calls), the rest anything a caller may build."""
    odd = draw(st.integers(0, 3)) == 0
    if not odd:
        role = draw(st.sampled_from(["user", "assistant", "tool"]))
        fields: dict[str, Any] = {"role": role, "content": draw(_ANY_TEXT)}
        for key in ("name", "tool_call_id", "reasoning_content"):
            fields[key] = draw(st.one_of(st.none(), _ANY_TEXT))
        return Message(**fields)
    content = draw(
        st.one_of(
            _ODD,
            st.lists(st.dictionaries(st.sampled_from(["type", "text", "url"]), _JSONISH, max_size=3), max_size=2).map(
                lambda parts: tuple(freeze(p) for p in parts)
            ),
        )
    )
    calls = draw(
        st.one_of(
            st.none(),
            st.lists(st.builds(ToolCall, name=_ANY_TEXT, arguments=_JSONISH.map(freeze), id=_ODD), max_size=2).map(
                tuple
            ),
        )
    )
    fields = {"role": draw(st.one_of(st.sampled_from(["user", "assistant"]), _ODD)), "content": content}
    fields["tool_calls"] = calls
    for key in ("name", "tool_call_id", "reasoning_content"):
        fields[key] = draw(st.one_of(st.none(), _ANY_TEXT, _ODD))
    return Message(**fields)


built_requests = st.builds(
    Request,
    dialect=st.sampled_from(list(Dialect)),
    messages=st.lists(_messages(), max_size=4).map(tuple),
    tools=st.one_of(st.none(), st.lists(_JSONISH.map(freeze), max_size=2).map(tuple)),
    documents=st.one_of(st.none(), st.lists(_JSONISH.map(freeze), max_size=2).map(tuple)),
    chat_template_kwargs=st.one_of(st.just(FrozenDict()), st.dictionaries(_ANY_TEXT, _JSONISH, max_size=3).map(freeze)),
)


def _to_json(request: Request) -> str:
    return request.to_json()


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=built_requests)
def test_to_json_piece_by_piece_equals_the_reference(request: Request) -> None:
    fast, reference = both(_to_json, request)
    assert fast == reference
    fast_digest, reference_digest = both(_digest, request)  # Request.json_sha256
    assert fast_digest == reference_digest
    if fast[0] == "error" or reference_digest[0] == "error":
        assert request_json_bytes(request, Message) is None  # refused: the reference raised its own error


def _escaped(s: str) -> bytes:
    return _controls_escaped(_quoted(s))


def test_string_escapes_every_code_point_as_the_encoder() -> None:
    scalars = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    for start in range(0, len(scalars), 4096):  # runs of neighbours, each escaped on its own and next to others
        chunk = scalars[start : start + 4096]
        assert _escaped(chunk) == encode_basestring(chunk).encode("utf-8")
    for c in range(0x80):
        for s in (chr(c), "a" + chr(c) * 3 + "é", chr(c) + "🙂", "\\" + chr(c) + '"'):
            assert _escaped(s) == encode_basestring(s).encode("utf-8")
    with pytest.raises(UnicodeEncodeError):
        _quoted("x\ud800")


def test_to_json_of_a_subclass_takes_the_reference_path() -> None:
    @dataclasses.dataclass(frozen=True)
    class Mine(Request):
        def template_messages(self) -> list[dict[str, Any]]:
            return [{"role": "mine"}]

    request = Mine(dialect=Dialect.OPENAI, messages=(Message(role="user", content="x"),))
    fast, reference = both(_to_json, request)
    assert fast == reference and '"mine"' in fast[1][1]


def test_the_digest_is_the_sha256_of_the_reference_text() -> None:
    request = parse_request(b'{"messages": [{"role": "user", "content": "h\\u00e9 \\"q\\" \\n \xf0\x9f\x99\x82"}]}')
    with reference_path():
        text = request.to_json()
    message = '{"content":"hé \\"q\\" \\n 🙂","role":"user"}'
    assert text == '{"chat_template_kwargs":{},"documents":null,"messages":[' + message + '],"tools":null}'
    with fast_path():
        assert _digest(request) == hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- canonical_json ---------------------------------------------------------------------------------------------------


@settings(max_examples=examples(300), deadline=None)
@given(value=_JSONISH)
def test_canonical_json_is_json_dumps(value: Any) -> None:
    def dumps(v: Any) -> str:
        return json.dumps(thaw(v), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    assert outcome(canonical_json, freeze(value)) == outcome(dumps, freeze(value))
