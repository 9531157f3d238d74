"""Both dialects: which one a request is in (`detect`), and the canonical `Request` built from a parsed top-level
object (`build_request`): the messages and tools by the dialect's module, documents and chat_template_kwargs
checked here, every other key kept in `extra`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ctxlock.core import FrozenDict, freeze
from ctxlock.outside import join_path
from ctxlock.request import _anthropic as anthropic
from ctxlock.request import _openai as openai
from ctxlock.request._checks import as_array, as_object, fail
from ctxlock.request._values import RESERVED_TEMPLATE_KWARGS, Dialect, Message, Request, Utf8Policy, request_of
from ctxlock.settings import fast_enabled

_ANTHROPIC_ONLY = ("tool_use", "tool_result", "thinking", "redacted_thinking", "document")  # block types


def detect(obj: dict[str, Any]) -> Dialect:
    """Anthropic if anything only Anthropic has is present; otherwise OpenAI."""
    if "system" in obj:
        return Dialect.ANTHROPIC
    tools = obj.get("tools")
    if isinstance(tools, list) and any(isinstance(t, dict) and "input_schema" in t for t in tools):
        return Dialect.ANTHROPIC
    messages = obj.get("messages")
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):  # most messages: text, nothing to look into
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind in _ANTHROPIC_ONLY or (kind == "image" and "source" in block):
                return Dialect.ANTHROPIC
    return Dialect.OPENAI


def _template_kwargs(raw: Any) -> FrozenDict:
    if raw is None:
        return FrozenDict()
    kwargs = as_object(raw, "chat_template_kwargs")
    for key in kwargs:
        path = join_path("chat_template_kwargs", key)
        if not key.isidentifier():
            raise fail(
                path,
                f"{json.dumps(key, ensure_ascii=False)} is not a template variable name",
                "use an identifier: letters, digits and underscores, not starting with a digit",
            )
        if key in RESERVED_TEMPLATE_KWARGS:
            raise fail(
                path,
                f"{key} is reserved: the template stage sets it",
                "rename the variable; the conversation, tools and special tokens cannot be overridden",
            )
    frozen: FrozenDict = freeze(kwargs)
    return frozen


def _documents(raw: Any) -> tuple[FrozenDict, ...]:
    docs = as_array(raw, "documents", "an array of document objects")
    for k, doc in enumerate(docs):
        as_object(doc, f"documents[{k}]", 'a document object, e.g. {"title": ..., "text": ...}')
    return tuple(freeze(d) for d in docs)


_HANDLED = frozenset({"messages", "tools", "documents", "chat_template_kwargs"})  # the top-level keys not in `extra`
_HANDLED_ANTHROPIC = _HANDLED | {"system"}


def build_request(
    obj: dict[str, Any],
    dialect: Dialect,
    sha: str,
    policy: Utf8Policy,
    runs: list[tuple[int, int]],
    *,
    openai_messages: Callable[..., tuple[Message, ...]] = openai.parse_messages,
    as_sent: bool = False,
) -> Request:
    """The canonical Request of a parsed top-level object in `dialect`; `sha`, `policy` and `runs` (the replaced
    byte ranges) record where its bytes came from.

    `openai_messages` is replaced only by the request memo (`_memo`), which validates the messages itself and
    uses only the other fields of this Request."""
    if "messages" not in obj:
        raise fail("messages", "messages is required", "send a non-empty array of messages")
    handled = _HANDLED
    tools: tuple[FrozenDict, ...] | None = None
    if dialect is Dialect.OPENAI:
        if obj.get("functions") is not None:
            # Silently keeping these in `extra` would drop tool definitions the client meant the model to see.
            raise fail("functions", "functions is deprecated and not supported", 'send "tools" instead')
        messages = openai_messages(obj["messages"], policy, as_sent)
        if obj.get("tools") is not None:
            tools = openai.parse_tools(obj["tools"])
    else:
        handled = _HANDLED_ANTHROPIC
        messages = tuple(anthropic.parse_conversation(obj))
        if obj.get("tools") is not None:
            tools = anthropic.parse_tools(obj["tools"])
    documents = None if obj.get("documents") is None else _documents(obj["documents"])
    extra = {k: v for k, v in obj.items() if k not in handled}
    make = request_of if fast_enabled() else Request  # fast path: the same Request without the dataclass __init__
    return make(
        dialect=dialect,
        messages=tuple(messages),
        tools=tools,
        documents=documents,
        chat_template_kwargs=_template_kwargs(obj.get("chat_template_kwargs")),
        extra=freeze(extra) if extra else FrozenDict(),  # (what freeze makes of {}, made directly)
        source_sha256=sha,
        utf8_policy=policy,
        replaced_bytes=tuple(b for start, end in runs for b in range(start, end)) if runs else (),
        cache_control=anthropic.cache_breakpoints(obj) if dialect is Dialect.ANTHROPIC else (),
        ignored=anthropic.ignored_blocks(obj) if dialect is Dialect.ANTHROPIC else (),
    )
