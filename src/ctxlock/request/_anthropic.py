"""The Anthropic Messages dialect, made canonical (the OpenAI form every later stage reads).

`parse_system` turns the top-level `system` into a system message; `parse_messages` validates the user and
assistant turns: text, image, tool_use, tool_result and thinking blocks are reshaped into canonical messages (a
tool_result becomes a tool message), each string keeping the JSON path the client sent it at (`Message.origins`).
`parse_tools` turns `{name, description, input_schema}` tools into the OpenAI function-tool form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ctxlock.core import FrozenDict, freeze
from ctxlock.outside import join_path
from ctxlock.request._checks import (
    as_array,
    as_object,
    as_str,
    check_tool_function,
    fail,
    image_part,
    no_tool_call,
    only_keys,
    part_type,
    required,
    text_part,
)
from ctxlock.request._documents import document_part
from ctxlock.request._values import Message, ToolCall

_ANTHROPIC_ROLES = ("user", "assistant")
# `cache_control` is a prompt-caching hint to Anthropic's servers and never reaches the model's input: accepted
# on every block, kept apart in `Request.cache_control` (`cache_breakpoints`), never rendered.
_CC = "cache_control"


def parse_conversation(obj: Mapping[str, Any]) -> list[Message]:
    """The top-level `system` and the `messages` as canonical messages. A `role: "system"` entry inside `messages`
    (Claude Code sends them) is hoisted into the system message after the top-level `system`, as vLLM's
    `hoist_system_messages` (vllm/entrypoints/anthropic/protocol.py) and `_convert_system_message` do."""
    raw = obj.get("messages")
    inline = []
    if isinstance(raw, list):
        inline = [(f"messages[{i}]", m) for i, m in enumerate(raw) if isinstance(m, dict) and m.get("role") == "system"]
    system = _system(obj.get("system"), inline)
    return [*system, *parse_messages(raw, hoisted=True)]


def parse_system(raw: Any) -> Message:
    """The top-level `system` (a string or text blocks) as a system message."""
    return _system(raw, [])[0]


def _system(raw: Any, inline: list[tuple[str, dict[str, Any]]]) -> list[Message]:
    """The system message of the top-level `system` and the hoisted `role: "system"` entries, or none. Several text
    blocks are joined with nothing between them into one string, as vLLM (`_convert_system_message` in
    vllm/entrypoints/anthropic/serving.py) and llama.cpp (`server_chat_convert_anthropic_to_oai`) both do."""
    pieces: list[tuple[str, str]] = []  # (text, its path)
    if raw is not None:
        pieces += _system_texts(raw, "system")
    for path, m in inline:
        only_keys(m, ("role", "content"), path, "an Anthropic message")
        pieces += _system_texts(required(m, "content", path, "a string or text blocks"), f"{path}.content")
    if raw is None and not inline:
        return []
    # One piece keeps its own path; the string of several is named by `system` as a whole, and each piece keeps
    # its own path for provenance (`.content@START`, read by template_inputs: cache breakpoints, request spans).
    origins = {".content": pieces[0][1] if len(pieces) == 1 else "system", **_piece_origins(pieces, "")}
    content = "".join(t for t, _ in pieces)
    return [Message(role="system", content=content, source="system", origins=FrozenDict(origins))]


def _piece_origins(pieces: list[tuple[str, str]], sep: str) -> dict[str, str]:
    """`.content@START` -> path for each non-empty piece of `sep.join(texts)`, when there are several."""
    if len(pieces) < 2:
        return {}
    out, at = {}, 0
    for text, path in pieces:
        if text:
            out[f".content@{at}"] = path
        at += len(text) + len(sep)
    return out


def _system_texts(raw: Any, path: str) -> list[tuple[str, str]]:
    if isinstance(raw, str):
        return [(raw, path)]
    blocks = as_array(raw, path, "a string or an array of text blocks")
    return [(_text(b, f"{path}[{j}]")["text"], f"{path}[{j}].text") for j, b in enumerate(blocks)]


def _text(raw: Any, path: str) -> FrozenDict:
    block = as_object(raw, path, 'a text block {"type": "text", "text": ...}')
    kind = part_type(block, path)
    if kind != "text":
        raise fail(join_path(path, "type"), f"expected a text block, got {json.dumps(kind)}", 'use "type": "text"')
    only_keys(block, ("type", "text", _CC), path, "a text block")
    return text_part(as_str(required(block, "text", path, "the text"), join_path(path, "text")))


def parse_messages(raw: Any, *, hoisted: bool = False) -> list[Message]:
    """The user and assistant turns as canonical messages (a tool_result becomes a tool message of its own); the
    `role: "system"` entries are skipped when `hoisted` (`parse_conversation` put them in the system message)."""
    messages = as_array(raw, "messages", "a non-empty array of messages")
    if not messages:
        raise fail("messages", "messages is empty", "send at least one message")
    seen_ids: set[str] = set()
    out: list[Message] = []
    for i, m in enumerate(messages):
        path = f"messages[{i}]"
        m = as_object(m, path, "a message object")
        only_keys(m, ("role", "content"), path, "an Anthropic message")
        role = as_str(required(m, "role", path, "user or assistant"), join_path(path, "role"))
        if role == "system" and hoisted:
            continue  # in the system message (`parse_conversation`)
        if role not in _ANTHROPIC_ROLES:
            raise fail(
                join_path(path, "role"),
                f"unknown role {json.dumps(role, ensure_ascii=False)}",
                'allowed roles: user, assistant, system (hoisted into the top-level "system")',
            )
        content = required(m, "content", path, "a string or an array of content blocks")
        if isinstance(content, str):
            out.append(Message(role=role, content=content, source=path))
            continue
        blocks = as_array(content, join_path(path, "content"), "a string or an array of content blocks")
        if role == "assistant":
            out.append(_assistant(blocks, path, seen_ids))
        else:
            out.extend(_user(blocks, path, seen_ids))
    return out


def _assistant(blocks: list[Any], path: str, seen_ids: set[str]) -> Message:
    parts: list[FrozenDict] = []
    calls: list[ToolCall] = []
    thinking: list[str] = []
    origins: dict[str, str] = {}
    for j, raw in enumerate(blocks):
        bpath = f"{path}.content[{j}]"
        block = as_object(raw, bpath, "a content block object")
        kind = part_type(block, bpath)
        if kind == "text":
            origins[f".content[{len(parts)}].text"] = f"{bpath}.text"
            parts.append(_text(block, bpath))
        elif kind == "tool_use":
            only_keys(block, ("type", "id", "name", "input", _CC), bpath, "a tool_use block")
            call_id = as_str(required(block, "id", bpath, "the tool_use id"), f"{bpath}.id", nonempty=True)
            name = as_str(required(block, "name", bpath, "the tool name"), f"{bpath}.name", nonempty=True)
            args = as_object(required(block, "input", bpath, "the input object"), f"{bpath}.input", "a JSON object")
            k = len(calls)
            # Each canonical field at the block's own key (templates name them as OpenAI does). The "function" type
            # is ctxlock's, not the client's: an empty origin keeps it out of the request's text (a plain string).
            origins.update(
                {
                    f".tool_calls[{k}].type": "",
                    f".tool_calls[{k}].id": f"{bpath}.id",
                    f".tool_calls[{k}].function.name": f"{bpath}.name",
                    f".tool_calls[{k}].function.arguments": f"{bpath}.input",
                }
            )
            calls.append(ToolCall(name=name, arguments=freeze(args), id=call_id, source=bpath))
        elif kind == "thinking":
            only_keys(block, ("type", "thinking", "signature"), bpath, "a thinking block")
            # The signature authenticates the thinking to Anthropic's API; it is not model input.
            thinking.append(as_str(required(block, "thinking", bpath, "the thinking text"), f"{bpath}.thinking"))
            origins.setdefault(".reasoning_content", f"{bpath}.thinking")
        elif kind == "redacted_thinking":
            # Encrypted reasoning only Anthropic's API can read: accepted and left out of the model's input, as
            # vLLM does. Not silent: `ignored_blocks` names every such block and the count answer lists them.
            only_keys(block, ("type", "data"), bpath, "a redacted_thinking block")
            as_str(required(block, "data", bpath, "the opaque data"), f"{bpath}.data", nonempty=True)
        else:
            raise fail(
                f"{bpath}.type",
                f"unsupported assistant content block type {json.dumps(kind)}",
                "allowed: text, tool_use, thinking, redacted_thinking",
            )
    if len(thinking) > 1:
        # Several thinking blocks are concatenated as is (no separator is added): the path names the whole list.
        origins[".reasoning_content"] = f"{path}.content"
    seen_ids.update(c.id for c in calls if c.id is not None)
    # A turn of only tool_use, thinking or redacted_thinking blocks has no text: its content is "", as llama.cpp's
    # conversion sets and vLLM's chat parser makes of an absent content, so templates that concatenate it work.
    return Message(
        role="assistant",
        content=tuple(parts) if parts else "",
        tool_calls=tuple(calls) if calls else None,
        reasoning_content="".join(thinking) if thinking else None,
        source=path,
        origins=FrozenDict(origins),
    )


def _user(blocks: list[Any], path: str, seen_ids: set[str]) -> list[Message]:
    """A user turn: each tool_result becomes a canonical tool message, emitted before the turn's text/images."""
    results: list[Message] = []
    parts: list[FrozenDict] = []
    origins: dict[str, str] = {}
    for j, raw in enumerate(blocks):
        bpath = f"{path}.content[{j}]"
        block = as_object(raw, bpath, "a content block object")
        kind = part_type(block, bpath)
        if kind == "text":
            origins[f".content[{len(parts)}].text"] = f"{bpath}.text"
            parts.append(_text(block, bpath))
        elif kind == "image":
            origins[f".content[{len(parts)}].url"] = f"{bpath}.source"
            parts.append(_image(block, bpath))
        elif kind == "document":
            part, doc_origins = document_part(block, bpath)
            origins.update({f".content[{len(parts)}]{k}": v for k, v in doc_origins.items()})
            parts.append(part)
        elif kind == "tool_result":
            results.extend(_tool_result(block, bpath, seen_ids))
        else:
            raise fail(
                f"{bpath}.type",
                f"unsupported user content block type {json.dumps(kind)}",
                "allowed: text, image, document, tool_result",
            )
    if results and not parts:
        return results
    return [*results, Message(role="user", content=tuple(parts), source=path, origins=FrozenDict(origins))]


def _image(block: dict[str, Any], path: str) -> FrozenDict:
    only_keys(block, ("type", "source", _CC), path, "an image block")
    spath = join_path(path, "source")
    source = as_object(required(block, "source", path, "an image source"), spath)
    kind = part_type(source, spath)
    if kind == "base64":
        only_keys(source, ("type", "media_type", "data"), spath, "a base64 image source")
        media = as_str(required(source, "media_type", spath, "the media type, e.g. image/png"), f"{spath}.media_type")
        data = as_str(required(source, "data", spath, "the base64 data"), f"{spath}.data")
        return image_part(f"data:{media};base64,{data}")
    if kind == "url":
        only_keys(source, ("type", "url"), spath, "a url image source")
        return image_part(as_str(required(source, "url", spath, "the image URL"), f"{spath}.url"))
    raise fail(f"{spath}.type", f"unsupported image source type {json.dumps(kind)}", "allowed: base64, url")


def _tool_result(block: dict[str, Any], path: str, seen_ids: set[str]) -> list[Message]:
    """A tool_result as a tool message holding its text, then (when it holds images) a user message of those images,
    as vLLM's `_convert_user_tool_result` (vllm/entrypoints/anthropic/serving.py) places them: the canonical tool
    message is text. Several text blocks are joined with "\n" (vLLM; llama.cpp joins with nothing)."""
    # is_error has no place in the canonical (OpenAI) tool message, and chat templates never read it; it is
    # validated and dropped, as vLLM's Anthropic endpoint does. Put the error in the content if the model needs it.
    only_keys(block, ("type", "tool_use_id", "content", "is_error", _CC), path, "a tool_result block")
    id_path = f"{path}.tool_use_id"
    call_id = as_str(required(block, "tool_use_id", path, "the id of the tool_use this answers"), id_path)
    if call_id not in seen_ids:
        raise no_tool_call(call_id, seen_ids, id_path, "tool_result")
    if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
        raise fail(f"{path}.is_error", "is_error must be a boolean", "send true or false")
    raw = block.get("content")
    origins = {".tool_call_id": id_path}
    if raw is None or isinstance(raw, str):
        # Anthropic allows a result with no content; the canonical tool message needs one ("", as vLLM sets).
        tool = Message(role="tool", content=raw or "", tool_call_id=call_id, source=path, origins=FrozenDict(origins))
        return [tool]
    items = as_array(raw, f"{path}.content", "a string or an array of text and image blocks")
    texts: list[tuple[str, str]] = []
    images: list[FrozenDict] = []
    image_origins: dict[str, str] = {}
    for j, item in enumerate(items):
        ipath = f"{path}.content[{j}]"
        kind = part_type(as_object(item, ipath, "a text or image block"), ipath)
        if kind == "image":
            image_origins[f".content[{len(images)}].url"] = f"{ipath}.source"
            images.append(_image(item, ipath))
        elif kind == "text":
            texts.append((_text(item, ipath)["text"], f"{ipath}.text"))
        else:
            raise fail(f"{ipath}.type", f"unsupported tool_result block {json.dumps(kind)}", "allowed: text, image")
    if texts:
        origins[".content"] = texts[0][1] if len(texts) == 1 else f"{path}.content"
        origins.update(_piece_origins(texts, "\n"))
    content = "\n".join(t for t, _ in texts)
    out = [Message(role="tool", content=content, tool_call_id=call_id, source=path, origins=FrozenDict(origins))]
    if images:
        out.append(Message(role="user", content=tuple(images), source=path, origins=FrozenDict(image_origins)))
    return out


def parse_tools(raw: Any) -> tuple[FrozenDict, ...]:
    """Client tools `{name, description, input_schema}` in the OpenAI function-tool form."""
    tools = as_array(raw, "tools", "an array of tools")
    out = []
    for k, tool in enumerate(tools):
        path = f"tools[{k}]"
        tool = as_object(tool, path, 'a tool object {"name", "description", "input_schema"}')
        only_keys(tool, ("type", "name", "description", "input_schema", _CC), path, "a tool")
        if tool.get("type") not in (None, "custom"):
            raise fail(
                f"{path}.type",
                f"unsupported tool type {json.dumps(tool['type'])} (server tools run on Anthropic's side)",
                'send client tools: omit "type" or use "custom"',
            )
        required(tool, "input_schema", path, "the input JSON schema")
        check_tool_function(tool, path, schema_key="input_schema")
        fn: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        fn["parameters"] = tool["input_schema"]
        out.append(freeze({"type": "function", "function": fn}))
    return tuple(out)


def cache_breakpoints(obj: Mapping[str, Any]) -> tuple[FrozenDict, ...]:
    """Every block marked with `cache_control`, in Anthropic's prefix order (tools, system, messages), as
    {"path", "type", "ttl"} with the type and TTL as sent (Anthropic's defaults, "ephemeral" and "5m", when absent).
    A `cache_control` that is not an object is kept as {"path", "value"}: ctxlock does not validate what only the
    provider reads, but it does not drop it either."""
    marks: list[FrozenDict] = []

    def mark(block: Any, path: str) -> None:
        if not isinstance(block, Mapping) or block.get(_CC) is None:
            return
        cc = block[_CC]
        if isinstance(cc, Mapping):
            marks.append(FrozenDict({"path": path, "type": cc.get("type", "ephemeral"), "ttl": cc.get("ttl", "5m")}))
        else:
            marks.append(FrozenDict({"path": path, "value": freeze(cc)}))

    for i, tool in enumerate(obj.get("tools") or ()):
        mark(tool, f"tools[{i}]")
    if isinstance(obj.get("system"), list):
        for j, block in enumerate(obj["system"]):
            mark(block, f"system[{j}]")
    for k, message in enumerate(obj.get("messages") or ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            for m, block in enumerate(content):
                mark(block, f"messages[{k}].content[{m}]")
    return tuple(marks)


def ignored_blocks(obj: Mapping[str, Any]) -> tuple[FrozenDict, ...]:
    """Every block ctxlock accepts and leaves out of the model's input, as {"path", "type", "reason"}: today the
    assistant turns' `redacted_thinking` blocks (encrypted reasoning only Anthropic's API can read; vLLM ignores
    them too). The count answer of `ctxlock serve` lists them, so nothing is dropped silently."""
    out: list[FrozenDict] = []
    for k, message in enumerate(obj.get("messages") or ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for m, block in enumerate(content):
            if isinstance(block, Mapping) and block.get("type") == "redacted_thinking":
                reason = "encrypted reasoning only Anthropic's API can read; not model input"
                out.append(
                    FrozenDict({"path": f"messages[{k}].content[{m}]", "type": "redacted_thinking", "reason": reason})
                )
    return tuple(out)
