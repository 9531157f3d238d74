"""Request stage: bytes -> canonical frozen `Request`.

A pure stage (no I/O). The input is decoded under a UTF-8 policy, parsed with the stdlib JSON parser (duplicate
keys, NaN and Infinity rejected), validated in one of two dialects (OpenAI Chat Completions or Anthropic
Messages) and normalized to one canonical form, so the same conversation gives `==` Requests whatever dialect
it came in. Every error is a `RequestError` subclass whose `path` names the location: `byte N` for encoding,
`line L column C (byte B)` for JSON syntax, or a JSON path such as `messages[3].tool_calls[0].function.arguments`.

A Mapping in the OpenAI dialect is parsed incrementally across calls (`_parse_mapping_fast`): in a multi-turn chat
only the new messages are serialized and validated, and the Request is the full path's in every field, errors
included. `CTXLOCK_FAST=0` and `reference_path()` turn this off; `clear_request_memo()` forgets what was memoized.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import marshal
import math
import operator
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ctxlock.errors import RequestEncodingError, RequestJSONError, RequestValidationError
from ctxlock.frozen import FrozenDict, canonical_json, freeze, thaw
from ctxlock.settings import fast_enabled

__all__ = [
    "MAX_JSON_DEPTH",
    "RESERVED_TEMPLATE_KWARGS",
    "Dialect",
    "Message",
    "Request",
    "ToolArguments",
    "ToolCall",
    "Utf8Policy",
    "parse_request",
]


class Utf8Policy(StrEnum):
    """What to do with bytes that are not valid UTF-8."""

    STRICT = "strict"  # reject, naming the offset of the first bad byte
    REPLACE = "replace"  # substitute U+FFFD and record every replaced byte offset


class ToolArguments(StrEnum):
    """What a tool call's `arguments` sent as a JSON string (the OpenAI wire form) becomes."""

    PARSED = "parsed"  # default: the parsed object, as vLLM passes it to templates
    AS_SENT = "as-sent"  # the string byte for byte, as transformers passes it (checked to hold a JSON object)


class Dialect(StrEnum):
    """The wire format a request was written in."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


# Names the template stage injects into the Jinja context (transformers' apply_chat_template, its Jinja globals,
# and Jinja's own builtins). A request may not shadow them through chat_template_kwargs: a request that could set
# `bos_token` or `raise_exception` could rewrite the template's control tokens or its behaviour.
RESERVED_TEMPLATE_KWARGS: frozenset[str] = frozenset(
    {
        # the conversation itself
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        # special tokens (transformers passes tokenizer.special_tokens_map)
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "sep_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
        # transformers' template globals
        "raise_exception",
        "strftime_now",
        # Jinja builtin globals and names Jinja binds itself
        "namespace",
        "dict",
        "range",
        "lipsum",
        "cycler",
        "joiner",
        "loop",
        "self",
        "super",
        "caller",
        "varargs",
        "kwargs",
        "true",
        "false",
        "none",
        "True",
        "False",
        "None",
        # apply_chat_template arguments that are not template variables but would change what is produced
        "chat_template",
        "tokenize",
        "tokenizer",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)

# Deeper nesting than this is rejected before any recursive walk (building, freezing, rendering) can hit Python's
# recursion limit; real requests, including JSON schemas, stay far below it.
MAX_JSON_DEPTH = 128

_UTF8_BOM = b"\xef\xbb\xbf"
_EMPTY = FrozenDict()  # immutable, so one shared instance is a safe dataclass default


# ---------------------------------------------------------------------------------------------------------------
# Canonical values


@dataclass(frozen=True)
class ToolCall:
    """One function call made by an assistant.

    `arguments` is a parsed JSON object, or, parsed with `tool_arguments="as-sent"`, the JSON string the client sent
    (validated to hold an object, kept as is)."""

    name: str
    arguments: FrozenDict | str
    id: str | None = None
    type: str | None = "function"  # None: the client sent no "type" (templates then see none, as in transformers)
    source: str = field(default="", compare=False)  # JSON path of the originating object

    def to_template(self) -> dict[str, Any]:
        """The OpenAI form templates expect: arguments as a plain dict (as vLLM passes them), or the string as sent."""
        out: dict[str, Any] = {}
        if self.id is not None:
            out["id"] = self.id
        if self.type is not None:
            out["type"] = self.type
        args = self.arguments if isinstance(self.arguments, str) else thaw(self.arguments)
        out["function"] = {"name": self.name, "arguments": args}
        return out


@dataclass(frozen=True)
class Message:
    """One canonical chat message."""

    role: str  # "system" | "developer" | "user" | "assistant" | "tool"
    content: str | tuple[FrozenDict, ...] | None
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    source: str = field(default="", compare=False)  # JSON path of the originating object
    # Canonical suffix (".content[0].text", ".tool_call_id", ...) -> JSON path in the source request, for the
    # strings whose origin is not `source + suffix` (Anthropic blocks are reshaped into canonical fields).
    origins: FrozenDict = field(default=_EMPTY, compare=False, repr=False)

    def __hash__(self) -> int:
        # Computed once: long chats are hashed again and again as cache keys (templates, budget candidates).
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(
                (self.role, self.content, self.name, self.tool_calls, self.tool_call_id, self.reasoning_content)
            )
            object.__setattr__(self, "_hash", cached)
        return cached

    def to_template(self) -> dict[str, Any]:
        """A fresh plain dict for a chat template.

        Matches transformers' chat-message normalization: None-valued keys are dropped (templates test
        `is defined`), so a key is present exactly when it has a value.
        """
        out: dict[str, Any] = {"role": self.role}
        if self.content is not None:
            out["content"] = self.content if isinstance(self.content, str) else [thaw(p) for p in self.content]
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls is not None:
            out["tool_calls"] = [tc.to_template() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        return out

    def path_of(self, suffix: str) -> str:
        """The JSON path in the request of this message's field `suffix` (".content", ".tool_call_id", ...)."""
        return self.origins.get(suffix) or f"{self.source}{suffix}"

    _path = path_of


@dataclass(frozen=True)
class Request:
    """A validated, canonical, immutable chat request.

    Equality and hashing cover only what reaches the template (messages, tools, documents, chat_template_kwargs);
    the dialect, the other top-level keys and the provenance of the bytes are kept but not compared.
    """

    dialect: Dialect = field(compare=False)
    messages: tuple[Message, ...]
    tools: tuple[FrozenDict, ...] | None = None
    documents: tuple[FrozenDict, ...] | None = None
    chat_template_kwargs: FrozenDict = _EMPTY
    extra: FrozenDict = field(default=_EMPTY, compare=False)
    source_sha256: str = field(default="", compare=False)
    utf8_policy: Utf8Policy = field(default=Utf8Policy.STRICT, compare=False)
    replaced_bytes: tuple[int, ...] = field(default=(), compare=False)

    def template_messages(self) -> list[dict[str, Any]]:
        """Fresh plain message dicts, as a chat template sees them."""
        return [m.to_template() for m in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        """Fresh plain tool dicts in OpenAI function-tool form, or None."""
        return None if self.tools is None else [thaw(t) for t in self.tools]

    def template_documents(self) -> list[dict[str, Any]] | None:
        """Fresh plain document dicts, or None."""
        return None if self.documents is None else [thaw(d) for d in self.documents]

    def strings(self) -> Iterator[tuple[str, str]]:
        """Yield (JSON path, string) for every request-supplied string that can reach the template, in request order.

        Roles are not yielded: they are validated structural values. Keys inside free-form JSON (tool arguments,
        tool schemas, documents, kwargs values) are yielded with the path of their value, since templates that
        `tojson` those objects render the keys as text too.
        """
        for m in self.messages:
            yield from _message_strings(m)
        for k, tool in enumerate(self.tools or ()):
            fn = tool["function"]
            for key, value in fn.items():
                yield from _walk_strings(value, self._tool_path(k, key))
        for k, doc in enumerate(self.documents or ()):
            yield from _walk_strings(doc, f"documents[{k}]")
        for key, value in self.chat_template_kwargs.items():
            yield from _walk_strings(value, join_path("chat_template_kwargs", key))

    def to_json(self) -> str:
        """Canonical JSON of exactly the compared fields, so `a == b` iff `a.to_json() == b.to_json()`.

        `extra`, the dialect and the byte provenance are not part of it (a record stores them next to it).
        """
        return canonical_json(
            {
                "messages": self.template_messages(),
                "tools": self.template_tools(),
                "documents": self.template_documents(),
                "chat_template_kwargs": thaw(self.chat_template_kwargs),
            }
        )

    def _tool_path(self, k: int, key: str) -> str:
        if self.dialect is Dialect.ANTHROPIC:
            # Anthropic tools are {name, description, input_schema}; name the key the client actually sent.
            return join_path(f"tools[{k}]", "input_schema" if key == "parameters" else key)
        return join_path(f"tools[{k}].function", key)


def _message_strings(m: Message) -> Iterator[tuple[str, str]]:
    if isinstance(m.content, str):
        yield m._path(".content"), m.content
    elif m.content is not None:
        for j, part in enumerate(m.content):
            for key in ("text", "url", "detail"):
                if key in part:
                    yield m._path(f".content[{j}].{key}"), part[key]
            image = part.get("image_url")  # an OpenAI image part, kept as sent: a URL string or {url, detail}
            if isinstance(image, str):
                yield m._path(f".content[{j}].image_url"), image
            elif image is not None:
                for key in ("url", "detail"):
                    if key in image:
                        yield m._path(f".content[{j}].image_url.{key}"), image[key]
    if m.name is not None:
        yield m._path(".name"), m.name
    for k, tc in enumerate(m.tool_calls or ()):
        if tc.id is not None:
            yield m._path(f".tool_calls[{k}].id"), tc.id
        yield m._path(f".tool_calls[{k}].function.name"), tc.name
        yield from _walk_strings(tc.arguments, m._path(f".tool_calls[{k}].function.arguments"))
    if m.tool_call_id is not None:
        yield m._path(".tool_call_id"), m.tool_call_id
    if m.reasoning_content is not None:
        yield m._path(".reasoning_content"), m.reasoning_content


def _walk_strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            sub = join_path(path, key)
            yield sub, key
            yield from _walk_strings(item, sub)
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            yield from _walk_strings(item, f"{path}[{i}]")


# ---------------------------------------------------------------------------------------------------------------
# JSON paths


def join_path(path: str, key: str | int) -> str:
    """Append a key or index to a JSON path: `a.b`, `a[3]`, `a["not an identifier"]`; the root is `$`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if key.isidentifier() or (key[:1] == "$" and key[1:].isidentifier()):  # `$defs`, `$ref` read as names
        return key if path == "$" else f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


# A path under construction while building parsed JSON: a base string, or (parent, key). Rendered only on error,
# so building costs O(1) per node instead of one string per node.
_LinkedPath = str | tuple[Any, str | int]


def _render(path: _LinkedPath) -> str:
    keys: list[str | int] = []
    while isinstance(path, tuple):
        path, key = path
        keys.append(key)
    out = path
    for key in reversed(keys):
        out = join_path(out, key)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Bytes -> text


# Offsets replaced by the `ctxlock.replace` codec error handler during the current decode. A ContextVar keeps
# concurrent parses (threads, asyncio tasks) apart; the handler is the only global, and it is named for ctxlock.
_REPLACED_RUNS: ContextVar[list[tuple[int, int]] | None] = ContextVar("ctxlock_replaced_runs", default=None)


def _replace_and_record(exc: UnicodeError) -> tuple[str, int]:
    runs = _REPLACED_RUNS.get()
    if not isinstance(exc, UnicodeDecodeError) or runs is None:
        raise exc
    # Called with the same (start, end) ranges as the builtin "replace" handler, so the text is identical to
    # bytes.decode("utf-8", "replace") and the recorded offsets are exactly the bytes behind each U+FFFD.
    runs.append((exc.start, exc.end))
    return "\ufffd", exc.end


codecs.register_error("ctxlock.replace", _replace_and_record)


def _decode(data: bytes, policy: Utf8Policy) -> tuple[str, list[tuple[int, int]]]:
    """Decode UTF-8 under the policy; return the text and the replaced byte ranges."""
    if policy is Utf8Policy.STRICT:
        try:
            return data.decode("utf-8"), []
        except UnicodeDecodeError as exc:
            bad = data[exc.start : exc.end]
            raise RequestEncodingError(
                f"invalid UTF-8: byte{'s' if len(bad) > 1 else ''} {bad.hex(' ')} ({exc.reason})",
                path=f"byte {exc.start}",
                hint="send the request encoded as UTF-8, or parse with utf8='replace' to substitute U+FFFD",
            ) from None
    runs: list[tuple[int, int]] = []
    token = _REPLACED_RUNS.set(runs)
    try:
        text = data.decode("utf-8", "ctxlock.replace")
    finally:
        _REPLACED_RUNS.reset(token)
    return text, runs


def _byte_offset(data: bytes, runs: list[tuple[int, int]], text: str, pos: int) -> int:
    """The byte offset in `data` of character `pos` of `text` (its decoding, with replaced runs)."""
    char = byte = 0
    for start, end in runs:
        # Between replaced runs the bytes decoded strictly, one U+FFFD stands for each run.
        seg_chars = len(data[byte:start].decode("utf-8"))
        if pos < char + seg_chars:
            break
        char += seg_chars
        if pos == char:
            return start
        char, byte = char + 1, end
    return byte + len(text[char:pos].encode("utf-8"))


# ---------------------------------------------------------------------------------------------------------------
# Text -> JSON


class _Pairs(list[tuple[str, Any]]):
    """What object_pairs_hook returns: an object's pairs, before the top-down pass checks duplicates.

    The hook runs bottom-up and cannot know where it is; `_build` walks down afterwards and knows the path.
    """

    __slots__ = ()


class _BadNumber:
    """A parsed NaN, Infinity, or a number that overflows to infinity, reported by `_build` with its path."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _parse_float(literal: str) -> float | _BadNumber:
    value = float(literal)
    return value if math.isfinite(value) else _BadNumber(literal)


_SURROGATE = re.compile("[\ud800-\udfff]")


class _Builder:
    """Top-down pass over parsed JSON: duplicate keys, non-finite numbers, lone surrogates, depth, with paths."""

    def __init__(self, policy: Utf8Policy) -> None:
        self.policy = policy

    def build(self, value: Any, path: _LinkedPath, depth: int = 0) -> Any:
        if isinstance(value, _Pairs):
            self._check_depth(path, depth)
            out: dict[str, Any] = {}
            for key, item in value:
                key = self._string(key, path)
                if key in out:
                    raise RequestJSONError(
                        f"duplicate key {json.dumps(key, ensure_ascii=False)}",
                        path=_render(path),
                        hint="each key may appear once per object; JSON parsers disagree on which duplicate wins",
                    )
                out[key] = self.build(item, (path, key), depth + 1)
            return out
        if isinstance(value, list):
            self._check_depth(path, depth)
            return [self.build(item, (path, i), depth + 1) for i, item in enumerate(value)]
        if isinstance(value, str):
            return self._string(value, path)
        if isinstance(value, _BadNumber):
            raise RequestJSONError(
                f"{value.literal} is not a finite JSON number",
                path=_render(path),
                hint="JSON has no NaN or Infinity; send a finite number, a string or null",
            )
        return value

    def _string(self, value: str, path: _LinkedPath) -> str:
        # JSON escapes can spell a lone surrogate (\ud800) that is not a Unicode scalar value and cannot be encoded
        # as UTF-8 later; it is an encoding error like a bad byte, and REPLACE substitutes U+FFFD for it likewise.
        match = _SURROGATE.search(value)
        if match is None:
            return value
        if self.policy is Utf8Policy.REPLACE:
            return _SURROGATE.sub("\ufffd", value)
        raise RequestEncodingError(
            f"string holds a lone surrogate \\u{ord(match.group()):04x} at character {match.start()}",
            path=_render(path),
            hint="escape characters outside the BMP as a surrogate pair, or parse with utf8='replace'",
        )

    @staticmethod
    def _check_depth(path: _LinkedPath, depth: int) -> None:
        if depth >= MAX_JSON_DEPTH:
            raise RequestJSONError(
                f"JSON nested deeper than {MAX_JSON_DEPTH} levels",
                path=_render(path),
                hint="flatten the structure",
            )


def _loads(text: str, path: str, policy: Utf8Policy) -> Any:
    """json.loads with duplicate keys, NaN/Infinity and lone surrogates rejected. Raises JSONDecodeError as is."""
    try:
        raw = json.loads(text, object_pairs_hook=_Pairs, parse_constant=_BadNumber, parse_float=_parse_float)
    except RecursionError:
        raise RequestJSONError(
            f"JSON nested deeper than {MAX_JSON_DEPTH} levels", path=path, hint="flatten the structure"
        ) from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # e.g. an integer longer than sys.get_int_max_str_digits()
        raise RequestJSONError(f"invalid JSON value: {exc}", path=path, hint="send numbers that fit") from None
    return _Builder(policy).build(raw, path)


# ---------------------------------------------------------------------------------------------------------------
# Validation helpers


def _fail(path: str, message: str, hint: str) -> RequestValidationError:
    return RequestValidationError(message, path=path, hint=hint)


def json_type_name(value: Any) -> str:
    """How an error message names the JSON type of a parsed value: "null", "a string", "an object", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _obj(value: Any, path: str, what: str = "an object") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, f"expected {what}, got {json_type_name(value)}", f"send {what} here")
    return value


def _list(value: Any, path: str, what: str = "an array") -> list[Any]:
    if not isinstance(value, list):
        raise _fail(path, f"expected {what}, got {json_type_name(value)}", f"send {what} here")
    return value


def _str(value: Any, path: str, *, nonempty: bool = False) -> str:
    if not isinstance(value, str):
        raise _fail(path, f"expected a string, got {json_type_name(value)}", "send a JSON string here")
    if nonempty and not value:
        raise _fail(path, "must not be empty", "send a non-empty string")
    return value


def _opt_str(obj: dict[str, Any], key: str, path: str) -> str | None:
    value = obj.get(key)
    return None if value is None else _str(value, join_path(path, key))


def _required(obj: dict[str, Any], key: str, path: str, what: str) -> Any:
    if obj.get(key) is None:
        raise _fail(join_path(path, key), f"{key} is required", f"send {what}")
    return obj[key]


def _only_keys(obj: dict[str, Any], allowed: tuple[str, ...], path: str, what: str) -> None:
    """Reject unknown keys (like pydantic extra="forbid"): a key ctxlock ignores would be silently lost."""
    for key in obj:
        if key not in allowed:
            raise _fail(
                join_path(path, key),
                f"unknown key {json.dumps(key, ensure_ascii=False)} in {what}",
                f"allowed keys: {', '.join(allowed)}",
            )


def _part_type(block: dict[str, Any], path: str) -> str:
    return _str(_required(block, "type", path, 'a "type"'), join_path(path, "type"))


def _text_part(text: str) -> FrozenDict:
    return FrozenDict((("type", "text"), ("text", text)))


def _image_part(url: str, detail: str | None = None) -> FrozenDict:
    pairs: tuple[tuple[str, str], ...] = (("type", "image"), ("url", url))
    return FrozenDict((*pairs, ("detail", detail)) if detail is not None else pairs)


def _no_tool_call(tool_call_id: str, seen: set[str], path: str, noun: str) -> RequestValidationError:
    return _fail(
        path,
        f"no earlier assistant tool call has id {json.dumps(tool_call_id, ensure_ascii=False)}",
        f"a {noun} must answer a tool call made in an earlier assistant message"
        + (f" (known ids: {', '.join(sorted(seen)[:10])})" if seen else ""),
    )


# ---------------------------------------------------------------------------------------------------------------
# OpenAI Chat Completions


_OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool")
# Per role, the keys that may carry a value. Every key of the union may be null in any message (SDKs dump their
# models with every field, e.g. an assistant reply echoed back with "function_call": null).
_OPENAI_KEYS: dict[str, tuple[str, ...]] = {
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "name", "tool_calls", "reasoning_content", "reasoning"),
    "tool": ("role", "content", "name", "tool_call_id"),
}
_OPENAI_NULL_ONLY = ("refusal", "audio", "annotations", "function_call")
_OPENAI_ALL_KEYS = (*dict.fromkeys(k for keys in _OPENAI_KEYS.values() for k in keys), *_OPENAI_NULL_ONLY)
_IMAGE_DETAILS = ("auto", "low", "high")
_ONE_OF_ROLES = "one of: " + ", ".join(_OPENAI_ROLES)


def _openai_messages(raw: Any, policy: Utf8Policy, as_sent: bool = False) -> tuple[Message, ...]:
    messages = _list(raw, "messages", "a non-empty array of messages")
    if not messages:
        raise _fail("messages", "messages is empty", "send at least one message")
    seen_ids: set[str] = set()
    return tuple(_openai_message(m, f"messages[{i}]", seen_ids, policy, as_sent) for i, m in enumerate(messages))


def _openai_message(raw: Any, path: str, seen_ids: set[str], policy: Utf8Policy, as_sent: bool = False) -> Message:
    m = _obj(raw, path, "a message object")
    role = _str(_required(m, "role", path, _ONE_OF_ROLES), join_path(path, "role"))
    if role not in _OPENAI_ROLES:
        raise _fail(
            join_path(path, "role"),
            f"unknown role {json.dumps(role, ensure_ascii=False)}",
            f"allowed roles: {', '.join(_OPENAI_ROLES)}",
        )
    allowed = _OPENAI_KEYS[role]
    for key, value in m.items():
        if key in allowed:
            continue
        kpath = join_path(path, key)
        if key not in _OPENAI_ALL_KEYS:
            raise _fail(
                kpath,
                f"unknown key {json.dumps(key, ensure_ascii=False)} in a {role} message",
                f"allowed keys: {', '.join(allowed)}",
            )
        if value is None:
            continue  # harmless: null is what "absent" looks like when an SDK dumps every field
        if key == "function_call":
            raise _fail(kpath, "function_call is deprecated and not supported", 'send "tool_calls" instead')
        if key in _OPENAI_NULL_ONLY:
            raise _fail(kpath, f"ctxlock does not support {key}", f"drop {key} or set it to null")
        raise _fail(kpath, f"{key} is not allowed in a {role} message", f"allowed keys: {', '.join(allowed)}")

    tool_calls: tuple[ToolCall, ...] | None = None
    if m.get("tool_calls") is not None:
        calls = _list(m["tool_calls"], join_path(path, "tool_calls"), "an array of tool calls")
        tool_calls = tuple(
            _openai_tool_call(c, f"{path}.tool_calls[{j}]", policy, as_sent) for j, c in enumerate(calls)
        )

    reasoning = _opt_str(m, "reasoning_content", path)
    if m.get("reasoning") is not None:
        if reasoning is not None:
            raise _fail(
                join_path(path, "reasoning"),
                "both reasoning and reasoning_content are set",
                "send one of them; reasoning is an alias of reasoning_content",
            )
        reasoning = _str(m["reasoning"], join_path(path, "reasoning"))

    tool_call_id: str | None = None
    if role == "tool":
        tool_call_id = _str(
            _required(m, "tool_call_id", path, "the id of the tool call this answers"), join_path(path, "tool_call_id")
        )
        if tool_call_id not in seen_ids:
            raise _no_tool_call(tool_call_id, seen_ids, join_path(path, "tool_call_id"), "tool message")

    content = _openai_content(m.get("content"), join_path(path, "content"), role)
    if content is None and not (role == "assistant" and tool_calls):
        raise _fail(
            join_path(path, "content"),
            f"content is required in a {role} message",
            "only an assistant message with tool_calls may omit content",
        )

    # Ids become visible only after the whole message: a tool message answers an EARLIER assistant message.
    if tool_calls:
        seen_ids.update(tc.id for tc in tool_calls if tc.id is not None)
    return Message(
        role=role,
        content=content,
        name=_opt_str(m, "name", path),
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        reasoning_content=reasoning,
        source=path,
    )


def _openai_content(raw: Any, path: str, role: str) -> str | tuple[FrozenDict, ...] | None:
    if raw is None or isinstance(raw, str):
        return raw
    parts = _list(raw, path, "a string or an array of content parts")
    return tuple(_openai_part(p, f"{path}[{j}]", role) for j, p in enumerate(parts))


def _openai_part(raw: Any, path: str, role: str) -> FrozenDict:
    part = _obj(raw, path, "a content part object")
    kind = _part_type(part, path)
    if kind == "text":
        _only_keys(part, ("type", "text"), path, "a text part")
        return _text_part(_str(_required(part, "text", path, "the text"), join_path(path, "text")))
    if kind == "image_url":
        if role != "user":
            raise _fail(join_path(path, "type"), f"a {role} message cannot hold images", "send images in user messages")
        _only_keys(part, ("type", "image_url"), path, "an image_url part")
        image = _required(part, "image_url", path, 'an "image_url" object with a "url"')
        ipath = join_path(path, "image_url")
        # Kept as sent, after the checks: templates read `image_url` parts themselves, as under transformers.
        if isinstance(image, str):  # accepted by vLLM and several clients
            return freeze(part)
        image = _obj(image, ipath, 'an object {"url": ...} or a URL string')
        _only_keys(image, ("url", "detail"), ipath, "image_url")
        _str(_required(image, "url", ipath, "the image URL"), join_path(ipath, "url"))
        detail = _opt_str(image, "detail", ipath)
        if detail is not None and detail not in _IMAGE_DETAILS:
            raise _fail(
                join_path(ipath, "detail"),
                f"unknown detail {json.dumps(detail, ensure_ascii=False)}",
                f"allowed: {', '.join(_IMAGE_DETAILS)}",
            )
        return freeze(part)
    allowed = "text, image_url" if role == "user" else "text"
    raise _fail(
        join_path(path, "type"),
        f"unknown content part type {json.dumps(kind, ensure_ascii=False)}",
        f"allowed: {allowed}",
    )


def _openai_tool_call(raw: Any, path: str, policy: Utf8Policy, as_sent: bool = False) -> ToolCall:
    call = _obj(raw, path, "a tool call object")
    _only_keys(call, ("id", "type", "function"), path, "a tool call")
    kind = call.get("type")
    if kind is not None and kind != "function":
        raise _fail(join_path(path, "type"), f"unsupported tool call type {json.dumps(kind)}", 'use "function"')
    fpath = join_path(path, "function")
    fn = _obj(_required(call, "function", path, 'a "function" object with name and arguments'), fpath)
    _only_keys(fn, ("name", "arguments"), fpath, "a tool call function")
    name = _str(_required(fn, "name", fpath, "the function name"), join_path(fpath, "name"), nonempty=True)
    apath = join_path(fpath, "arguments")
    args = _required(fn, "arguments", fpath, 'the arguments as a JSON object or a JSON string, e.g. "{}"')
    sent = args
    if isinstance(args, str):
        args = _parse_arguments(args, apath, policy)
    if not isinstance(args, dict):
        raise _fail(
            apath,
            f"arguments must decode to a JSON object, got {json_type_name(args)}",
            'wrap the arguments in an object, e.g. {"value": ...}',
        )
    # as-sent keeps the string: it passed the request's own string checks, and it holds a JSON object.
    kept = sent if as_sent and isinstance(sent, str) else freeze(args)
    return ToolCall(name=name, arguments=kept, id=_opt_str(call, "id", path), type=kind, source=path)


def _parse_arguments(text: str, path: str, policy: Utf8Policy) -> Any:
    """Parse an OpenAI JSON-string `arguments` (as vLLM does); invalid JSON is an error, never a silent {}.

    The same strict parser as the request: duplicate keys, NaN and lone surrogates are errors, with their path.
    """
    try:
        return _loads(text, path, policy)
    except json.JSONDecodeError as exc:
        raise _fail(
            path,
            f"arguments is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})",
            'send the arguments as a JSON object encoded in a string, e.g. "{\\"city\\": \\"Paris\\"}" or "{}"',
        ) from None


def _openai_tools(raw: Any) -> tuple[FrozenDict, ...]:
    tools = _list(raw, "tools", "an array of tools")
    out = []
    for k, tool in enumerate(tools):
        path = f"tools[{k}]"
        tool = _obj(tool, path, 'a tool object {"type": "function", "function": {...}}')
        _only_keys(tool, ("type", "function"), path, "a tool")
        kind = _required(tool, "type", path, '"type": "function"')
        if kind != "function":
            raise _fail(join_path(path, "type"), f"unsupported tool type {json.dumps(kind)}", 'use "function"')
        fpath = join_path(path, "function")
        fn = _obj(_required(tool, "function", path, 'a "function" object with a name'), fpath)
        _only_keys(fn, ("name", "description", "parameters", "strict"), fpath, "a tool function")
        _check_tool_function(fn, fpath)
        out.append(freeze(tool))  # kept verbatim: key order of schemas is data, templates render it
    return tuple(out)


def _check_tool_function(fn: dict[str, Any], path: str, *, schema_key: str = "parameters") -> None:
    _str(_required(fn, "name", path, "the tool name"), join_path(path, "name"), nonempty=True)
    _opt_str(fn, "description", path)
    if fn.get(schema_key) is not None:
        _obj(fn[schema_key], join_path(path, schema_key), "a JSON schema object")
    if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
        raise _fail(join_path(path, "strict"), "strict must be a boolean", "send true or false")


# ---------------------------------------------------------------------------------------------------------------
# Anthropic Messages


_ANTHROPIC_ROLES = ("user", "assistant")
# `cache_control` is a prompt-caching hint to Anthropic's servers and never reaches the model's input: accepted
# on every block and dropped.
_CC = "cache_control"


def _anthropic_system(raw: Any) -> Message:
    if isinstance(raw, str):
        return Message(role="system", content=raw, source="system", origins=FrozenDict({".content": "system"}))
    blocks = _list(raw, "system", "a string or an array of text blocks")
    parts, origins = [], {}
    for j, block in enumerate(blocks):
        path = f"system[{j}]"
        parts.append(_anthropic_text(block, path))
        origins[f".content[{j}].text"] = f"{path}.text"
    return Message(role="system", content=tuple(parts), source="system", origins=FrozenDict(origins))


def _anthropic_text(raw: Any, path: str) -> FrozenDict:
    block = _obj(raw, path, 'a text block {"type": "text", "text": ...}')
    kind = _part_type(block, path)
    if kind != "text":
        raise _fail(join_path(path, "type"), f"expected a text block, got {json.dumps(kind)}", 'use "type": "text"')
    _only_keys(block, ("type", "text", _CC), path, "a text block")
    return _text_part(_str(_required(block, "text", path, "the text"), join_path(path, "text")))


def _anthropic_messages(raw: Any) -> list[Message]:
    messages = _list(raw, "messages", "a non-empty array of messages")
    if not messages:
        raise _fail("messages", "messages is empty", "send at least one message")
    seen_ids: set[str] = set()
    out: list[Message] = []
    for i, m in enumerate(messages):
        path = f"messages[{i}]"
        m = _obj(m, path, "a message object")
        _only_keys(m, ("role", "content"), path, "an Anthropic message")
        role = _str(_required(m, "role", path, "user or assistant"), join_path(path, "role"))
        if role not in _ANTHROPIC_ROLES:
            raise _fail(
                join_path(path, "role"),
                f"unknown role {json.dumps(role, ensure_ascii=False)}",
                'allowed roles: user, assistant (the system prompt goes in the top-level "system")',
            )
        content = _required(m, "content", path, "a string or an array of content blocks")
        if isinstance(content, str):
            out.append(Message(role=role, content=content, source=path))
            continue
        blocks = _list(content, join_path(path, "content"), "a string or an array of content blocks")
        if role == "assistant":
            out.append(_anthropic_assistant(blocks, path, seen_ids))
        else:
            out.extend(_anthropic_user(blocks, path, seen_ids))
    return out


def _anthropic_assistant(blocks: list[Any], path: str, seen_ids: set[str]) -> Message:
    parts: list[FrozenDict] = []
    calls: list[ToolCall] = []
    thinking: list[str] = []
    origins: dict[str, str] = {}
    for j, raw in enumerate(blocks):
        bpath = f"{path}.content[{j}]"
        block = _obj(raw, bpath, "a content block object")
        kind = _part_type(block, bpath)
        if kind == "text":
            origins[f".content[{len(parts)}].text"] = f"{bpath}.text"
            parts.append(_anthropic_text(block, bpath))
        elif kind == "tool_use":
            _only_keys(block, ("type", "id", "name", "input", _CC), bpath, "a tool_use block")
            call_id = _str(_required(block, "id", bpath, "the tool_use id"), f"{bpath}.id", nonempty=True)
            name = _str(_required(block, "name", bpath, "the tool name"), f"{bpath}.name", nonempty=True)
            args = _obj(_required(block, "input", bpath, "the input object"), f"{bpath}.input", "a JSON object")
            k = len(calls)
            origins.update(
                {
                    f".tool_calls[{k}].id": f"{bpath}.id",
                    f".tool_calls[{k}].function.name": f"{bpath}.name",
                    f".tool_calls[{k}].function.arguments": f"{bpath}.input",
                }
            )
            calls.append(ToolCall(name=name, arguments=freeze(args), id=call_id, source=bpath))
        elif kind == "thinking":
            _only_keys(block, ("type", "thinking", "signature"), bpath, "a thinking block")
            # The signature authenticates the thinking to Anthropic's API; it is not model input.
            thinking.append(_str(_required(block, "thinking", bpath, "the thinking text"), f"{bpath}.thinking"))
            origins.setdefault(".reasoning_content", f"{bpath}.thinking")
        elif kind == "redacted_thinking":
            raise _fail(
                f"{bpath}.type",
                "redacted_thinking holds encrypted reasoning ctxlock cannot render",
                "drop the block, or send the thinking text in a thinking block",
            )
        else:
            raise _fail(
                f"{bpath}.type",
                f"unsupported assistant content block type {json.dumps(kind)}",
                "allowed: text, tool_use, thinking",
            )
    if len(thinking) > 1:
        # Several thinking blocks are concatenated as is (no separator is added): the path names the whole list.
        origins[".reasoning_content"] = f"{path}.content"
    seen_ids.update(c.id for c in calls if c.id is not None)
    return Message(
        role="assistant",
        content=tuple(parts) if parts else None,
        tool_calls=tuple(calls) if calls else None,
        reasoning_content="".join(thinking) if thinking else None,
        source=path,
        origins=FrozenDict(origins),
    )


def _anthropic_user(blocks: list[Any], path: str, seen_ids: set[str]) -> list[Message]:
    """A user turn: each tool_result becomes a canonical tool message, emitted before the turn's text/images."""
    results: list[Message] = []
    parts: list[FrozenDict] = []
    origins: dict[str, str] = {}
    for j, raw in enumerate(blocks):
        bpath = f"{path}.content[{j}]"
        block = _obj(raw, bpath, "a content block object")
        kind = _part_type(block, bpath)
        if kind == "text":
            origins[f".content[{len(parts)}].text"] = f"{bpath}.text"
            parts.append(_anthropic_text(block, bpath))
        elif kind == "image":
            origins[f".content[{len(parts)}].url"] = f"{bpath}.source"
            parts.append(_anthropic_image(block, bpath))
        elif kind == "tool_result":
            results.append(_anthropic_tool_result(block, bpath, seen_ids))
        else:
            raise _fail(
                f"{bpath}.type",
                f"unsupported user content block type {json.dumps(kind)}",
                "allowed: text, image, tool_result",
            )
    if results and not parts:
        return results
    return [*results, Message(role="user", content=tuple(parts), source=path, origins=FrozenDict(origins))]


def _anthropic_image(block: dict[str, Any], path: str) -> FrozenDict:
    _only_keys(block, ("type", "source", _CC), path, "an image block")
    spath = join_path(path, "source")
    source = _obj(_required(block, "source", path, "an image source"), spath)
    kind = _part_type(source, spath)
    if kind == "base64":
        _only_keys(source, ("type", "media_type", "data"), spath, "a base64 image source")
        media = _str(_required(source, "media_type", spath, "the media type, e.g. image/png"), f"{spath}.media_type")
        data = _str(_required(source, "data", spath, "the base64 data"), f"{spath}.data")
        return _image_part(f"data:{media};base64,{data}")
    if kind == "url":
        _only_keys(source, ("type", "url"), spath, "a url image source")
        return _image_part(_str(_required(source, "url", spath, "the image URL"), f"{spath}.url"))
    raise _fail(f"{spath}.type", f"unsupported image source type {json.dumps(kind)}", "allowed: base64, url")


def _anthropic_tool_result(block: dict[str, Any], path: str, seen_ids: set[str]) -> Message:
    # is_error has no place in the canonical (OpenAI) tool message, and chat templates never read it; it is
    # validated and dropped, as vLLM's Anthropic endpoint does. Put the error in the content if the model needs it.
    _only_keys(block, ("type", "tool_use_id", "content", "is_error", _CC), path, "a tool_result block")
    id_path = f"{path}.tool_use_id"
    call_id = _str(_required(block, "tool_use_id", path, "the id of the tool_use this answers"), id_path)
    if call_id not in seen_ids:
        raise _no_tool_call(call_id, seen_ids, id_path, "tool_result")
    if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
        raise _fail(f"{path}.is_error", "is_error must be a boolean", "send true or false")
    raw = block.get("content")
    origins = {".tool_call_id": id_path}
    content: str | tuple[FrozenDict, ...]
    if raw is None:
        content = ""  # Anthropic allows a result with no content; the canonical tool message needs one
    elif isinstance(raw, str):
        content = raw
    else:
        items = _list(raw, f"{path}.content", "a string or an array of text blocks")
        content = tuple(_anthropic_text(b, f"{path}.content[{j}]") for j, b in enumerate(items))
    return Message(role="tool", content=content, tool_call_id=call_id, source=path, origins=FrozenDict(origins))


def _anthropic_tools(raw: Any) -> tuple[FrozenDict, ...]:
    tools = _list(raw, "tools", "an array of tools")
    out = []
    for k, tool in enumerate(tools):
        path = f"tools[{k}]"
        tool = _obj(tool, path, 'a tool object {"name", "description", "input_schema"}')
        _only_keys(tool, ("type", "name", "description", "input_schema", _CC), path, "a tool")
        if tool.get("type") not in (None, "custom"):
            raise _fail(
                f"{path}.type",
                f"unsupported tool type {json.dumps(tool['type'])} (server tools run on Anthropic's side)",
                'send client tools: omit "type" or use "custom"',
            )
        _required(tool, "input_schema", path, "the input JSON schema")
        _check_tool_function(tool, path, schema_key="input_schema")
        fn: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        fn["parameters"] = tool["input_schema"]
        out.append(freeze({"type": "function", "function": fn}))
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------------
# Both dialects


def _detect(obj: dict[str, Any]) -> Dialect:
    """Anthropic if anything only Anthropic has is present; otherwise OpenAI."""
    if "system" in obj:
        return Dialect.ANTHROPIC
    tools = obj.get("tools")
    if isinstance(tools, list) and any(isinstance(t, dict) and "input_schema" in t for t in tools):
        return Dialect.ANTHROPIC
    messages = obj.get("messages")
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind in ("tool_use", "tool_result", "thinking") or (kind == "image" and "source" in block):
                return Dialect.ANTHROPIC
    return Dialect.OPENAI


def _template_kwargs(raw: Any) -> FrozenDict:
    if raw is None:
        return FrozenDict()
    kwargs = _obj(raw, "chat_template_kwargs")
    for key in kwargs:
        path = join_path("chat_template_kwargs", key)
        if not key.isidentifier():
            raise _fail(
                path,
                f"{json.dumps(key, ensure_ascii=False)} is not a template variable name",
                "use an identifier: letters, digits and underscores, not starting with a digit",
            )
        if key in RESERVED_TEMPLATE_KWARGS:
            raise _fail(
                path,
                f"{key} is reserved: the template stage sets it",
                "rename the variable; the conversation, tools and special tokens cannot be overridden",
            )
    return freeze(kwargs)


def _documents(raw: Any) -> tuple[FrozenDict, ...]:
    docs = _list(raw, "documents", "an array of document objects")
    for k, doc in enumerate(docs):
        _obj(doc, f"documents[{k}]", 'a document object, e.g. {"title": ..., "text": ...}')
    return tuple(freeze(d) for d in docs)


def _coerce(enum: type[Dialect] | type[Utf8Policy] | type[ToolArguments], value: Any, arg: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(repr(e.value) for e in enum)
        raise RequestValidationError(f"unknown {arg} {value!r}", path=arg, hint=f"use one of {allowed}") from None


def _to_plain(value: Any, path: _LinkedPath, depth: int = 0, open_: set[int] | None = None) -> Any:
    """A Mapping given by a caller -> plain JSON values, rejecting what JSON cannot hold (with its path).

    Nesting is checked by the rule bytes are (`_Builder`): a container at depth MAX_JSON_DEPTH is refused with the
    same error, before Python's recursion limit is near. A container inside itself (`d["x"] = d`) is refused as a
    cycle, naming the path where it comes round; `open_` holds the ids of the containers being converted."""
    if isinstance(value, Mapping | list | tuple):
        open_ = set() if open_ is None else open_
        if id(value) in open_:
            raise RequestValidationError(
                "this value contains itself (a reference cycle)",
                path=_render(path),
                hint="JSON is a tree: pass a copy instead of a reference to an enclosing object or list",
            )
        _Builder._check_depth(path, depth)
        open_.add(id(value))  # an error ends the whole conversion, so only success needs to take it out again
        out: Any
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise RequestValidationError(
                        f"key {key!r} is not a string", path=_render(path), hint="JSON object keys are strings"
                    )
                out[key] = _to_plain(item, (path, key), depth + 1, open_)
        else:
            out = [_to_plain(item, (path, i), depth + 1, open_) for i, item in enumerate(value)]
        open_.discard(id(value))
        return out
    if value is None or isinstance(value, str | int | float):  # bool is an int
        return value
    raise RequestValidationError(
        f"{type(value).__name__} is not a JSON value", path=_render(path), hint="send JSON types only"
    )


def parse_request(
    data: bytes | str | Mapping[str, Any],
    *,
    dialect: Dialect | str | None = None,
    utf8: Utf8Policy | str = Utf8Policy.STRICT,
    tool_arguments: ToolArguments | str = ToolArguments.PARSED,
) -> Request:
    """Decode, parse and validate a chat request into its canonical frozen form.

    `dialect=None` detects the dialect (Anthropic if anything only Anthropic has is present, else OpenAI); an
    explicit dialect wins. `tool_arguments` says what an OpenAI tool call's string `arguments` becomes: the parsed
    object (`"parsed"`, the default, as vLLM renders it) or the string as sent (`"as-sent"`, as transformers renders
    it); either way it must hold a JSON object. A str is encoded as UTF-8 first, and a Mapping serialized to compact
    JSON first, so every input goes through the same checks and `source_sha256` is always the digest of the bytes
    parsed.
    """
    policy: Utf8Policy = _coerce(Utf8Policy, utf8, "utf8")
    forced: Dialect | None = None if dialect is None else _coerce(Dialect, dialect, "dialect")
    as_sent = _coerce(ToolArguments, tool_arguments, "tool_arguments") is ToolArguments.AS_SENT

    if isinstance(data, Mapping):
        if _fast_enabled() and not as_sent:  # the incremental path memoizes parsed arguments only
            fast = _parse_mapping_fast(data, forced, policy)
            if fast is not None:
                return fast
        # NaN stays NaN here (allow_nan) so the parser reports it with its JSON path.
        data = json.dumps(_to_plain(data, "$"), ensure_ascii=False, separators=(",", ":"))
    if isinstance(data, str):
        # surrogatepass: a lone surrogate in the str becomes invalid UTF-8 and is reported like a bad byte.
        data = data.encode("utf-8", "surrogatepass")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise RequestValidationError(
            f"cannot parse a {type(data).__name__}", path="$", hint="pass bytes, a str or a mapping"
        )
    data = bytes(data)
    sha = hashlib.sha256(data).hexdigest()

    text, runs = _decode(data, policy)
    # A leading UTF-8 BOM is stripped, not rejected: RFC 8259 section 8.1 lets parsers ignore it, and it carries
    # no content. It is still part of the hashed bytes (source_sha256), so a record keeps it, and byte offsets in
    # errors and replaced_bytes count from the very first byte of the input, BOM included.
    bom_chars = 1 if data.startswith(_UTF8_BOM) else 0

    try:
        obj = _loads(text[bom_chars:], "$", policy)
    except json.JSONDecodeError as exc:
        byte = _byte_offset(data, runs, text, exc.pos + bom_chars)
        raise RequestJSONError(
            f"invalid JSON: {exc.msg}",
            path=f"line {exc.lineno} column {exc.colno} (byte {byte})",
            hint="fix the JSON syntax at that position",
        ) from None
    if not isinstance(obj, dict):
        raise _fail(
            "$",
            f"the request must be a JSON object, got {json_type_name(obj)}",
            'send an object such as {"messages": [...]}',
        )
    return _build_request(obj, forced or _detect(obj), sha, policy, runs, as_sent=as_sent)


def _build_request(
    obj: dict[str, Any],
    dialect: Dialect,
    sha: str,
    policy: Utf8Policy,
    runs: list[tuple[int, int]],
    *,
    openai_messages: Callable[..., tuple[Message, ...]] = _openai_messages,
    as_sent: bool = False,
) -> Request:
    # `openai_messages` is replaced only by the incremental Mapping path (`_frame`), which validates the messages
    # itself and uses only the other fields of this Request.
    if "messages" not in obj:
        raise _fail("messages", "messages is required", "send a non-empty array of messages")
    handled = {"messages", "tools", "documents", "chat_template_kwargs"}
    tools: tuple[FrozenDict, ...] | None = None
    if dialect is Dialect.OPENAI:
        if obj.get("functions") is not None:
            # Silently keeping these in `extra` would drop tool definitions the client meant the model to see.
            raise _fail("functions", "functions is deprecated and not supported", 'send "tools" instead')
        messages = openai_messages(obj["messages"], policy, as_sent)
        if obj.get("tools") is not None:
            tools = _openai_tools(obj["tools"])
    else:
        handled.add("system")
        system = [] if obj.get("system") is None else [_anthropic_system(obj["system"])]
        messages = (*system, *_anthropic_messages(obj["messages"]))
        if obj.get("tools") is not None:
            tools = _anthropic_tools(obj["tools"])
    documents = None if obj.get("documents") is None else _documents(obj["documents"])
    return Request(
        dialect=dialect,
        messages=tuple(messages),
        tools=tools,
        documents=documents,
        chat_template_kwargs=_template_kwargs(obj.get("chat_template_kwargs")),
        extra=freeze({k: v for k, v in obj.items() if k not in handled}),
        source_sha256=sha,
        utf8_policy=policy,
        replaced_bytes=tuple(b for start, end in runs for b in range(start, end)),
    )


# ---------------------------------------------------------------------------------------------------------------
# Incremental parsing of Mapping requests
#
# A chat server parses one request per turn, and every request repeats the whole history plus a message or two.
# For a Mapping in the OpenAI dialect, `_parse_mapping_fast` does the full path's work only for what it has not
# seen before: new messages, new top-level values. Two small LRUs, each behind its own lock, hold what it saw: the
# messages of recent requests (`_Entry`) and the rest of recent requests (`_Frame`).

_MEMO_REQUESTS = 64  # message lists of recent requests
_MEMO_FRAMES = 32  # everything of a request but its messages: tools, documents, model, ...

_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _c_compact() -> Callable[[Any, int], list[str]] | None:
    """What json.dumps(..., ensure_ascii=False, separators=(",", ":")) builds on every call, made once: the stdlib's
    C encoder with the same options, but without a cycle check and a `default` hook, which only matter for cyclic
    values and non-JSON types (`_owned` values have neither). None if this Python's C encoder is not the expected
    one."""
    try:
        encoder = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
            None, None, json.encoder.encode_basestring, None, ":", ",", False, False, True
        )
        sample = {"a": [1, 2.5, -0.0, None, True, '\u00e9\n"\U0001f600'], "b": {}}
        if "".join(encoder(sample, 0)) == _COMPACT.encode(sample):
            return encoder  # type: ignore[no-any-return]
    except Exception:  # no C encoder (None is not callable), or another signature: the Python one is right too
        pass
    return None


_C_COMPACT = _c_compact()


def _compact_json(value: Any) -> str:
    """json.dumps(value, ensure_ascii=False, separators=(",", ":")) of an `_owned` value."""
    return _COMPACT.encode(value) if _C_COMPACT is None else "".join(_C_COMPACT(value, 0))


_fast_enabled = fast_enabled


class _GiveUp(Exception):
    """The incremental path cannot vouch for this input: the full path takes it."""


class _Lru:
    """A small thread-safe LRU map."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.data: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any) -> Any:
        with self.lock:
            value = self.data.get(key)
            if value is not None:
                self.data.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self.lock:
            self.data[key] = value
            self.data.move_to_end(key)
            while len(self.data) > self.size:
                self.data.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.data.clear()


class _Node:
    """One message of a memoized request, never changed after it is made.

    `plain` is the owned copy of the message (`_owned`), `message` the Message `_openai_message` built from it, `sha`
    the SHA-256 state after every byte of the request up to and including this message's serialization (copied
    before it is updated).
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
    `_openai_messages` has seen after the last one."""

    __slots__ = ("ids", "messages", "nodes")

    def __init__(self, nodes: tuple[_Node, ...], messages: tuple[Message, ...], ids: frozenset[str]) -> None:
        self.nodes = nodes
        self.messages = messages
        self.ids = ids


class _Frame:
    """A request without its messages: the request bytes before the first message and after the last, and a
    Request `_build_request` made with no messages, whose other fields every request of this frame shares."""

    __slots__ = ("head", "tail", "template")

    def __init__(self, head: bytes, tail: bytes, template: Request) -> None:
        self.head = head
        self.tail = tail
        self.template = template


# (policy is REPLACE, request bytes before the first message, message count, keys of the first and last) -> _Entry
_REQUESTS = _Lru(_MEMO_REQUESTS)
# (forced dialect, policy is REPLACE, then per top-level key in order: the key and the marshal of its value, or
# None where the messages are) -> _Frame
_FRAMES = _Lru(_MEMO_FRAMES)


def clear_request_memo() -> None:
    """Forget every memoized request and frame (benchmarks and tests use it to start cold)."""
    for lru in (_REQUESTS, _FRAMES):
        lru.clear()


def _owned(value: Any, depth: int) -> Any:
    """A private copy of a caller's value at nesting `depth` of the request, equal to what the full path makes of
    it; raises _GiveUp for anything the full path might treat otherwise.

    Only exact JSON types pass: dict with str keys, list or tuple, str, int, bool, finite float, None (subclasses,
    other Mappings and NaN are the full path's). For these, `_to_plain` only turns tuples into lists, and json.loads
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
    # The dialect _detect would choose, from everything but the messages: a message that would make it say
    # Anthropic (a tool_use, tool_result, thinking or image-with-source block) fails OpenAI validation, and the
    # full path then takes the request anyway.
    if (forced or _detect({k: obj[k] for k in ("system", "tools") if k in obj})) is not Dialect.OPENAI:
        raise _GiveUp
    template = _build_request(obj, Dialect.OPENAI, "", policy, [], openai_messages=lambda *_: ())
    head = b"{" + b"".join(pair + b"," for pair in before) + b'"messages":['
    tail = b"]" + b"".join(b"," + pair for pair in after) + b"}"
    found = _Frame(head, tail, template)
    _FRAMES.put(key, found)
    return found


def _parse_mapping_fast(data: Mapping[str, Any], forced: Dialect | None, policy: Utf8Policy) -> Request | None:
    """Parse an OpenAI-dialect Mapping incrementally; None means "take the full path" (which then produces the
    canonical Request or error).

    Why the result is exactly the full path's. The full path parses b = json.dumps(_to_plain(data)) as UTF-8.
    Compact json.dumps of a dict is "{" + ",".join(dumps(key) + ":" + dumps(value)) + "}" and of a list
    "[" + ",".join(dumps(item)) + "]", context-free, so b is the concatenation of the serializations of each
    top-level value and each message, and json.loads of b gives for each what `_owned` gives (see there). Without
    a lone surrogate b is valid UTF-8, so both policies decode it unchanged, with no BOM and no replaced byte. A
    message `_same` as a memoized one serializes to the same bytes, has the same owned copy and, at the same index
    with the same tool-call ids seen before it, `_openai_message` makes the same Message of it: it depends on
    nothing else. Memoized messages are reused only as a verified prefix, so the index and the ids seen match, and
    the SHA-256 state memoized after message i covers exactly the bytes of b up to there. Everything but the
    messages comes from `_build_request` run on the same values (`_frame`). Any exception, every invalid request
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

    # The reused prefix: its nodes, its Messages, the tool-call ids `_openai_messages` would have seen after it.
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
            message = _openai_message(plain, f"messages[{i}]", seen_ids, policy)
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
