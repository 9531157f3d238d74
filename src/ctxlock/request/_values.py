"""The canonical request values: `Request`, `Message`, `ToolCall` (frozen dataclasses of frozen JSON), and the
enums and limits a request is parsed under (`ToolArguments`, `Dialect`, `RESERVED_TEMPLATE_KWARGS`; `Utf8Policy` and
`MAX_JSON_DEPTH` are the strict JSON reader's, `ctxlock.outside`).

Nothing here parses: the dialect modules build these values, and every later stage reads them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ctxlock.core import FrozenDict, canonical_json, thaw
from ctxlock.outside import (
    Utf8Policy as Utf8Policy,  # the strict reader's, named here with the request values
)
from ctxlock.outside import (
    join_path,
)
from ctxlock.request._canonical import request_json_bytes
from ctxlock.settings import fast_enabled


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

_EMPTY = FrozenDict()  # immutable, so one shared instance is a safe dataclass default
# The origins of a message whose strings are all at `source + suffix` (the default: one shared instance, so
# `message.origins is NO_ORIGINS` tells a plain message without hashing or sizing the map).
NO_ORIGINS = _EMPTY


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


_new = object.__new__
_set = object.__setattr__


def text_message(role: str, content: str, source: str) -> Message:
    """`Message(role=role, content=content, source=source)` made without the frozen dataclass's `__init__` (which sets
    the eight fields one `object.__setattr__` at a time, about twice the cost): the same instance dict, field for field
    and in field order, so the Message is equal, hashes, prints and pickles the same. The request parser's fast path
    makes one per plain text message (`openai._text_messages`); tests/request/test_parse_speedups.py holds it to the
    dataclass's own `__init__`, fields included."""
    message = _new(Message)
    _set(
        message,
        "__dict__",
        {
            "role": role,
            "content": content,
            "name": None,
            "tool_calls": None,
            "tool_call_id": None,
            "reasoning_content": None,
            "source": source,
            "origins": _EMPTY,
        },
    )
    return message


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
    # Anthropic prompt-caching breakpoints, in request order: {"path": "system[0]", "type": "ephemeral", "ttl":
    # "5m" | "1h"}. They never reach the model's input (so they are not compared), but cache economics need them.
    cache_control: tuple[FrozenDict, ...] = field(default=(), compare=False)
    # Blocks accepted and left out of the model's input ({"path", "type", "reason"}: Anthropic redacted_thinking);
    # not compared (they never reach the template), reported as unseen parts (accounting) and in count answers.
    ignored: tuple[FrozenDict, ...] = field(default=(), compare=False)

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

        `extra`, the dialect and the byte provenance are not part of it (a record stores them next to it). Fast
        path: the same text written piece by piece (`_canonical.request_json_bytes`).
        """
        if fast_enabled() and type(self) is Request:  # a subclass may write its own template_messages
            data = request_json_bytes(self, Message)
            if data is not None:
                return data.decode("utf-8")
        return self._reference_json()

    def json_sha256(self) -> str:
        """The SHA-256 (hex) of `to_json()` encoded as UTF-8: the request's digest (a `ctxlock batch` row's
        `request_sha256`). Raises what `to_json()` or the encoding raises (UnicodeEncodeError for a lone surrogate).
        Fast path: the UTF-8 text written piece by piece (`_canonical.request_json_bytes`), not encoded again."""
        if fast_enabled() and type(self) is Request:
            data = request_json_bytes(self, Message)
            if data is not None:
                return hashlib.sha256(data).hexdigest()
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def _reference_json(self) -> str:
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


def request_of(
    *,
    dialect: Dialect,
    messages: tuple[Message, ...],
    tools: tuple[FrozenDict, ...] | None,
    documents: tuple[FrozenDict, ...] | None,
    chat_template_kwargs: FrozenDict,
    extra: FrozenDict,
    source_sha256: str,
    utf8_policy: Utf8Policy,
    replaced_bytes: tuple[int, ...],
    cache_control: tuple[FrozenDict, ...],
    ignored: tuple[FrozenDict, ...] = (),
) -> Request:
    """`Request(...)` of every field, made without the frozen dataclass's `__init__` as `text_message` makes a
    Message: the same instance dict, in field order. `build_request`'s fast path; tests/request/test_parse_speedups.py
    holds it to the dataclass's own `__init__`."""
    request = _new(Request)
    _set(
        request,
        "__dict__",
        {
            "dialect": dialect,
            "messages": messages,
            "tools": tools,
            "documents": documents,
            "chat_template_kwargs": chat_template_kwargs,
            "extra": extra,
            "source_sha256": source_sha256,
            "utf8_policy": utf8_policy,
            "replaced_bytes": replaced_bytes,
            "cache_control": cache_control,
            "ignored": ignored,
        },
    )
    return request


def _message_strings(m: Message) -> Iterator[tuple[str, str]]:
    if isinstance(m.content, str):
        yield m.path_of(".content"), m.content
    elif m.content is not None:
        for j, part in enumerate(m.content):
            for key in ("text", "url", "detail", "title", "context"):
                if key in part:
                    yield m.path_of(f".content[{j}].{key}"), part[key]
            for c, chunk in enumerate(part.get("chunks") or ()):  # a content-source document's text blocks
                yield m.path_of(f".content[{j}].chunks[{c}]"), chunk
            yield from _media_strings(part, m.path_of(f".content[{j}]"))
            image = part.get("image_url")  # an OpenAI image part, kept as sent: a URL string or {url, detail}
            if isinstance(image, str):
                yield m.path_of(f".content[{j}].image_url"), image
            elif image is not None:
                for key in ("url", "detail"):
                    if key in image:
                        yield m.path_of(f".content[{j}].image_url.{key}"), image[key]
    if m.name is not None:
        yield m.path_of(".name"), m.name
    for k, tc in enumerate(m.tool_calls or ()):
        if tc.id is not None:
            yield m.path_of(f".tool_calls[{k}].id"), tc.id
        yield m.path_of(f".tool_calls[{k}].function.name"), tc.name
        yield from _walk_strings(tc.arguments, m.path_of(f".tool_calls[{k}].function.arguments"))
    if m.tool_call_id is not None:
        yield m.path_of(".tool_call_id"), m.tool_call_id
    if m.reasoning_content is not None:
        yield m.path_of(".reasoning_content"), m.reasoning_content


def _media_strings(part: Any, path: str) -> Iterator[tuple[str, str]]:
    """The sources of transformers-style image parts (`image`, `base64`) and of video parts (`video`: a URL or a
    list of frame URLs; `video_url`: a URL or {url})."""
    for key in ("image", "base64", "video", "video_url"):
        value = part.get(key)
        if isinstance(value, str):
            yield f"{path}.{key}", value
        elif isinstance(value, tuple | list):
            yield from ((f"{path}.{key}[{k}]", v) for k, v in enumerate(value) if isinstance(v, str))
        elif isinstance(value, Mapping) and isinstance(value.get("url"), str):
            yield f"{path}.{key}.url", value["url"]


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
