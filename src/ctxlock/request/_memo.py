"""The request memo: a fast path for Mapping requests in the OpenAI dialect, behind one function.

`parse_request` calls `lookup_or_parse(data, forced, policy)` when the fast paths are on (`CTXLOCK_FAST` is not
0 and the caller is not inside `reference_path()`) and the tool arguments are parsed. It returns the Request the
reference path would build, field for field, or None: then the reference path takes the request (and reports
its errors, with their message, path and order).

A chat server parses one request per turn, and every request repeats the whole history plus a message or two.
For a Mapping in the OpenAI dialect, `lookup_or_parse` does the reference path's work only for what it has not
seen before: new messages, new top-level values. Two small LRUs in the cache registry (`ctxlock.caches`, scope
"request") hold what it saw: the messages of recent requests (`_Entry`, "request.memo.messages") and the rest of
recent requests (`_Frame`, "request.memo.frames"). `clear_request_memo()` or `ctxlock.caches.clear_caches()`
empties them.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import math
import operator
from collections.abc import Mapping
from typing import Any

from ctxlock import caches
from ctxlock.outside import MAX_JSON_DEPTH, Utf8Policy
from ctxlock.request import _openai as openai
from ctxlock.request._build import build_request, detect
from ctxlock.request._values import Dialect, Message, Request

_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


def _compact_json(value: Any) -> str:
    """json.dumps(value, ensure_ascii=False, separators=(",", ":")) of an `_owned` value: the same text (the cycle
    check is off because an `_owned` value, a tree of fresh containers, has no cycle), without json.dumps' per-call
    encoder construction."""
    return _COMPACT.encode(value)


class _GiveUp(Exception):
    """The incremental path cannot vouch for this input: the full path takes it."""


class _Node:
    """One message of a memoized request, never changed after it is made.

    `plain` is the owned copy of the message (`_owned`), `message` the Message `openai.parse_message` built from
    it, `sha` the SHA-256 state after every byte of the request up to and including this message's serialization
    (copied before it is updated).
    """

    __slots__ = ("message", "plain", "sha")

    def __init__(self, plain: dict[str, Any], message: Message, sha: Any) -> None:
        self.plain = plain
        self.message = message
        self.sha = sha


_PLAIN = operator.attrgetter("plain")
_MESSAGE = operator.attrgetter("message")


class _Entry:
    """A memoized request's messages: their nodes, the Messages (the tuple a Request holds), and the tool-call ids
    `openai.parse_messages` has seen after the last one."""

    __slots__ = ("ids", "messages", "nodes")

    def __init__(self, nodes: tuple[_Node, ...], messages: tuple[Message, ...], ids: frozenset[str]) -> None:
        self.nodes = nodes
        self.messages = messages
        self.ids = ids


class _Frame:
    """A request without its messages: the request bytes before the first message and after the last, and a
    Request `build_request` made with no messages, whose other fields every request of this frame shares."""

    __slots__ = ("head", "tail", "template")

    def __init__(self, head: bytes, tail: bytes, template: Request) -> None:
        self.head = head
        self.tail = tail
        self.template = template


# (policy is REPLACE, request bytes before the first message, message count, keys of the first and last) -> _Entry
_REQUESTS: caches.LRU[tuple[Any, ...], _Entry] = caches.LRU("request.memo.messages", max_items=64, scope="request")
# (forced dialect, policy is REPLACE, then per top-level key in order: the key and the marshal of its value, or
# None where the messages are) -> _Frame: everything of a request but its messages (tools, documents, model, ...)
_FRAMES: caches.LRU[tuple[Any, ...], _Frame] = caches.LRU("request.memo.frames", max_items=32, scope="request")


def clear_request_memo() -> None:
    """Forget every memoized request and frame (benchmarks and tests use it to start cold);
    `ctxlock.caches.clear_caches()` does it too."""
    for lru in (_REQUESTS, _FRAMES):
        lru.clear()


def _owned(value: Any, depth: int) -> Any:
    """A private copy of a caller's value at nesting `depth` of the request, equal to what the full path makes of
    it; raises _GiveUp for anything the full path might treat otherwise.

    Only exact JSON types pass: dict with str keys, list or tuple, str, int, bool, finite float, None (subclasses,
    other Mappings and NaN are the full path's). For these, `to_plain` only turns tuples into lists, and json.loads
    of the compact json.dumps rebuilds the value exactly: strings unescape to themselves, ints and floats print and
    parse back to the same number (float repr round-trips), key order is kept; and every `_Builder` check passes: a
    dict has no duplicate key, there is no NaN or infinity, and the depth is checked here by the same rule. (A lone
    surrogate is caught when the serialization is encoded to UTF-8.) Containers are new objects; str and numbers
    are immutable and shared with the caller, which makes comparing a later request's identical strings O(1).
    """
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        if depth >= MAX_JSON_DEPTH:
            raise _GiveUp
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _GiveUp
            out[key] = item if type(item) is str else _owned(item, depth + 1)
        return out
    if kind is list or kind is tuple:
        if depth >= MAX_JSON_DEPTH:
            raise _GiveUp
        return [item if type(item) is str else _owned(item, depth + 1) for item in value]
    if kind is float and math.isfinite(value):
        return value
    raise _GiveUp


def _same(value: Any, owned: Any) -> bool:
    """True if the caller's `value` is exactly `owned` (an `_owned` copy) as JSON: same types, keys in the same
    order, same values.

    Plain `==` is not enough: it ignores key order and says 1 == 1.0 == True and 0.0 == -0.0, which serialize
    differently, and an object of a foreign type may claim to be equal. So types are compared exactly first (a
    tuple may stand for a list: `_owned` turns both into a list), and only then values with `==`, the builtin
    comparison for exact str, int and float. `owned` is less than MAX_JSON_DEPTH deep, which bounds the recursion.
    Strings, by far the most common values, are compared inline, and identity comes first: `_owned` shares the
    caller's immutable scalars and copies every container, so `item is owned_item` means the same scalar object.
    """
    kind = type(value)
    if kind is dict:
        if type(owned) is not dict or len(value) != len(owned):
            return False
        owned_items = iter(owned.items())  # the same length: next() cannot run out (and is faster than a zip)
        for key, item in value.items():
            owned_key, owned_item = next(owned_items)
            if item is owned_item and key is owned_key:
                continue  # the very objects `_owned` shared: an immutable str, number, bool or None
            if type(key) is not str or key != owned_key:
                return False
            if type(item) is str:
                if type(owned_item) is not str or item != owned_item:
                    return False
            elif not _same(item, owned_item):
                return False
        return True
    if kind is list or kind is tuple:
        if type(owned) is not list or len(value) != len(owned):
            return False
        for item, owned_item in zip(value, owned):  # noqa: B905 (same length; zip(strict=...) is much slower)
            if item is owned_item:
                continue
            if type(item) is str:
                if type(owned_item) is not str or item != owned_item:
                    return False
            elif not _same(item, owned_item):
                return False
        return True
    if kind is str:
        return type(owned) is str and value == owned
    if value is None or kind is bool:
        return value is owned
    if kind is int:
        return type(owned) is int and value == owned
    if kind is float:
        return type(owned) is float and value == owned and math.copysign(1.0, value) == math.copysign(1.0, owned)
    return False


def _message_key(message: Any) -> tuple[Any, ...] | None:
    """A cheap summary of a caller's message, only to find memo entries: every hit is verified with `_same`, so a
    collision costs time, never exactness."""
    if type(message) is not dict:
        return None
    role, content = message.get("role"), message.get("content")
    return (role if type(role) is str else None, content if type(content) is str else None, len(message))


def _frame(key: tuple[Any, ...], data: dict[str, Any], forced: Dialect | None, policy: Utf8Policy) -> _Frame:
    """The frame of a request: everything but its messages, made once per distinct `key` (see `_parse_incremental`).

    The key holds the marshal serialization (version 2: no references, no interning flags) of every top-level value
    but the messages. Marshal writes only exact builtin types (a subclass raises ValueError), dict items in order and
    floats bit for bit, so two values with the same marshal bytes have the same types, key order and values, and
    serialize to the same JSON. Every stored key comes from values `_owned` accepted.
    """
    found: _Frame | None = _FRAMES.get(key)
    if found is not None:
        return found
    # The top-level object the full path would load, in the same key order (the messages are not looked at), and
    # the serialization around the messages.
    obj: dict[str, Any] = {}
    before: list[bytes] = []
    after: list[bytes] = []
    for name, value in data.items():
        if name == "messages":
            obj[name] = None
            continue
        obj[name] = plain = _owned(value, 1)
        pair = _compact_json(name) + ":" + _compact_json(plain)
        # Strict UTF-8: a lone surrogate raises (the full path reports it as invalid UTF-8, or replaces it).
        (after if "messages" in obj else before).append(pair.encode("utf-8"))
    # The dialect detect would choose, from everything but the messages: a message that would make it say
    # Anthropic (a tool_use, tool_result, thinking, redacted_thinking or image-with-source block) fails OpenAI
    # validation, and the full path then takes the request anyway.
    if (forced or detect({k: obj[k] for k in ("system", "tools") if k in obj})) is not Dialect.OPENAI:
        raise _GiveUp
    template = build_request(obj, Dialect.OPENAI, "", policy, [], openai_messages=lambda *_: ())
    head = b"{" + b"".join(pair + b"," for pair in before) + b'"messages":['
    tail = b"]" + b"".join(b"," + pair for pair in after) + b"}"
    found = _Frame(head, tail, template)
    _FRAMES.put(key, found)
    return found


def lookup_or_parse(data: Mapping[str, Any], forced: Dialect | None, policy: Utf8Policy) -> Request | None:
    """Parse an OpenAI-dialect Mapping incrementally; None means "take the full path" (which then produces the
    canonical Request or error).

    Why the result is exactly the full path's. The full path parses b = json.dumps(to_plain(data)) as UTF-8.
    Compact json.dumps of a dict is "{" + ",".join(dumps(key) + ":" + dumps(value)) + "}" and of a list
    "[" + ",".join(dumps(item)) + "]", context-free, so b is the concatenation of the serializations of each
    top-level value and each message, and json.loads of b gives for each what `_owned` gives (see there). Without
    a lone surrogate b is valid UTF-8, so both policies decode it unchanged, with no BOM and no replaced byte. A
    message `_same` as a memoized one serializes to the same bytes, has the same owned copy and, at the same index
    with the same tool-call ids seen before it, `openai.parse_message` makes the same Message of it: it depends on
    nothing else. Memoized messages are reused only as a verified prefix, so the index and the ids seen match, and
    the SHA-256 state memoized after message i covers exactly the bytes of b up to there. Everything but the
    messages comes from `build_request` run on the same values (`_frame`). Any exception, every invalid request
    included, makes this path give up, so errors always come from the full path with its message, path and order.
    """
    if type(data) is not dict or forced is Dialect.ANTHROPIC:
        return None
    try:
        return _parse_incremental(data, forced, policy)
    except Exception:  # any failure, an invalid request included, is the full path's to report
        return None


def _parse_incremental(data: dict[Any, Any], forced: Dialect | None, policy: Utf8Policy) -> Request:
    replace = policy is Utf8Policy.REPLACE  # in the memo keys (cheaper to hash than the enum)
    shape: list[Any] = [forced and forced.value, replace]  # the frame's key
    raw_messages: list[Any] | tuple[Any, ...] | None = None
    for name, value in data.items():
        if type(name) is not str:
            raise _GiveUp
        if name == "messages":
            if (type(value) is not list and type(value) is not tuple) or not value:
                raise _GiveUp
            raw_messages = value
            shape.append(None)
        else:
            shape += (name, marshal.dumps(value, 2))
    if raw_messages is None:
        raise _GiveUp
    frame = _frame(tuple(shape), data, forced, policy)

    # The longest memoized request this one extends: usually the previous turn, a message or two shorter.
    count = len(raw_messages)
    first, last = _message_key(raw_messages[0]), _message_key(raw_messages[-1])
    entry: _Entry | None = None
    for length in range(count, 0, -1):
        key = (replace, frame.head, length, first, last if length == count else _message_key(raw_messages[length - 1]))
        entry = _REQUESTS.get(key)
        if entry is not None:
            break

    # The reused prefix: its nodes, its Messages, the tool-call ids `openai.parse_messages` would have seen after it.
    nodes: tuple[_Node, ...] = ()
    messages: tuple[Message, ...] = ()
    seen_ids: set[str] = set()
    if entry is not None:
        if all(map(_same, raw_messages, map(_PLAIN, entry.nodes))):  # the usual case, without a Python-level loop
            nodes, messages, seen_ids = entry.nodes, entry.messages, set(entry.ids)
        else:
            reused = 0
            while _same(raw_messages[reused], entry.nodes[reused].plain):
                reused += 1
            nodes, messages = entry.nodes[:reused], entry.messages[:reused]
            seen_ids = {tc.id for m in messages if m.tool_calls for tc in m.tool_calls if tc.id is not None}

    if len(nodes) < count:
        sha = nodes[-1].sha if nodes else None
        new: list[_Node] = []
        for i in range(len(nodes), count):
            plain = _owned(raw_messages[i], 2)
            piece = _compact_json(plain).encode("utf-8")  # strict: a lone surrogate raises
            message = openai.parse_message(plain, f"messages[{i}]", seen_ids, policy)
            if sha is None:
                sha = hashlib.sha256(frame.head)
            else:
                sha = sha.copy()
                sha.update(b",")
            sha.update(piece)
            new.append(_Node(plain, message, sha))
        nodes += tuple(new)
        messages += tuple(map(_MESSAGE, new))
        _REQUESTS.put((replace, frame.head, count, first, last), _Entry(nodes, messages, frozenset(seen_ids)))

    digest = nodes[-1].sha.copy()
    digest.update(frame.tail)
    template = frame.template
    return Request(
        dialect=Dialect.OPENAI,
        messages=messages,
        tools=template.tools,
        documents=template.documents,
        chat_template_kwargs=template.chat_template_kwargs,
        extra=template.extra,
        source_sha256=digest.hexdigest(),
        utf8_policy=policy,
        replaced_bytes=(),
    )
