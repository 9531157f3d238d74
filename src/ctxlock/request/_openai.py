"""The OpenAI Chat Completions dialect: messages and tools, validated and made canonical.

`parse_messages` validates the `messages` array (roles, the keys each role may carry, content parts, tool calls
and the ids tool messages answer) into `Message` values; `parse_message` does one message, given the tool-call
ids seen before it; `parse_tools` validates `tools`, kept verbatim. A tool call's `arguments` sent as a JSON
string goes through the request's own strict JSON reader.
"""

from __future__ import annotations

import json
from typing import Any

from ctxlock.core import FrozenDict, freeze
from ctxlock.outside import join_path, loads_strict
from ctxlock.request._checks import (
    as_array,
    as_object,
    as_str,
    check_tool_function,
    fail,
    json_type_name,
    no_tool_call,
    only_keys,
    opt_str,
    part_type,
    required,
    text_part,
)
from ctxlock.request._values import Message, ToolCall, Utf8Policy, text_message
from ctxlock.settings import fast_enabled

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


def parse_messages(raw: Any, policy: Utf8Policy, as_sent: bool = False) -> tuple[Message, ...]:
    """The `messages` array as canonical Messages; a tool message must answer an earlier assistant tool call."""
    messages = as_array(raw, "messages", "a non-empty array of messages")
    if not messages:
        raise fail("messages", "messages is empty", "send at least one message")
    seen_ids: set[str] = set()
    if fast_enabled():
        return _text_messages(messages, seen_ids, policy, as_sent)
    return tuple(parse_message(m, f"messages[{i}]", seen_ids, policy, as_sent) for i, m in enumerate(messages))


_TEXT_ROLES = ("system", "developer", "user", "assistant")  # the roles a message of role and content alone may have


def _text_messages(messages: list[Any], seen_ids: set[str], policy: Utf8Policy, as_sent: bool) -> tuple[Message, ...]:
    """`parse_messages`' loop, a fast path: a plain dict of exactly two keys, a `role` of `_TEXT_ROLES` and a str
    `content` (what most chats are made of), is made a Message at once (`text_message`), any other message goes
    through `parse_message`. Such a message passes every check of `parse_message` (its keys are allowed in every
    role, it carries no tool call, and a str content is kept as is), and it adds no tool-call id, so the Message is
    the same."""
    out = []
    for i, m in enumerate(messages):
        if type(m) is dict and len(m) == 2:
            role, content = m.get("role"), m.get("content")
            if type(content) is str and type(role) is str and role in _TEXT_ROLES:
                out.append(text_message(role, content, f"messages[{i}]"))
                continue
        out.append(parse_message(m, f"messages[{i}]", seen_ids, policy, as_sent))
    return tuple(out)


def parse_message(raw: Any, path: str, seen_ids: set[str], policy: Utf8Policy, as_sent: bool = False) -> Message:
    """One message at `path`, given the tool-call ids of the messages before it (updated with its own)."""
    m = as_object(raw, path, "a message object")
    role = m.get("role")
    if type(role) is not str:  # the checks (and the paths they name) for anything but a plain string
        role = as_str(required(m, "role", path, _ONE_OF_ROLES), join_path(path, "role"))
    if role not in _OPENAI_ROLES:
        raise fail(
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
            raise fail(
                kpath,
                f"unknown key {json.dumps(key, ensure_ascii=False)} in a {role} message",
                f"allowed keys: {', '.join(allowed)}",
            )
        if value is None:
            continue  # harmless: null is what "absent" looks like when an SDK dumps every field
        if key == "function_call":
            raise fail(kpath, "function_call is deprecated and not supported", 'send "tool_calls" instead')
        if key in _OPENAI_NULL_ONLY:
            raise fail(kpath, f"ctxlock does not support {key}", f"drop {key} or set it to null")
        raise fail(kpath, f"{key} is not allowed in a {role} message", f"allowed keys: {', '.join(allowed)}")

    tool_calls: tuple[ToolCall, ...] | None = None
    if m.get("tool_calls") is not None:
        calls = as_array(m["tool_calls"], join_path(path, "tool_calls"), "an array of tool calls")
        tool_calls = tuple(_tool_call(c, f"{path}.tool_calls[{j}]", policy, as_sent) for j, c in enumerate(calls))

    reasoning = opt_str(m, "reasoning_content", path)
    if m.get("reasoning") is not None:
        if reasoning is not None:
            raise fail(
                join_path(path, "reasoning"),
                "both reasoning and reasoning_content are set",
                "send one of them; reasoning is an alias of reasoning_content",
            )
        reasoning = as_str(m["reasoning"], join_path(path, "reasoning"))

    tool_call_id: str | None = None
    if role == "tool":
        tool_call_id = as_str(
            required(m, "tool_call_id", path, "the id of the tool call this answers"), join_path(path, "tool_call_id")
        )
        if tool_call_id not in seen_ids:
            raise no_tool_call(tool_call_id, seen_ids, join_path(path, "tool_call_id"), "tool message")

    content = m.get("content")
    if content is not None and not isinstance(content, str):  # a string needs no check (nor its path)
        content = _content(content, join_path(path, "content"), role)
    if content is None and not (role == "assistant" and tool_calls):
        raise fail(
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
        name=opt_str(m, "name", path),
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        reasoning_content=reasoning,
        source=path,
    )


def _content(raw: Any, path: str, role: str) -> str | tuple[FrozenDict, ...] | None:
    if raw is None or isinstance(raw, str):
        return raw
    parts = as_array(raw, path, "a string or an array of content parts")
    return tuple(_part(p, f"{path}[{j}]", role) for j, p in enumerate(parts))


def _part(raw: Any, path: str, role: str) -> FrozenDict:
    part = as_object(raw, path, "a content part object")
    kind = part_type(part, path)
    if kind == "text":
        only_keys(part, ("type", "text"), path, "a text part")
        return text_part(as_str(required(part, "text", path, "the text"), join_path(path, "text")))
    if kind in _MEDIA_PARTS:
        if role != "user":
            what = "videos" if "video" in kind else "images"
            raise fail(join_path(path, "type"), f"a {role} message cannot hold {what}", f"send {what} in user messages")
        return _MEDIA_PARTS[kind](part, path)
    allowed = "text, " + ", ".join(_MEDIA_PARTS) if role == "user" else "text"
    raise fail(
        join_path(path, "type"),
        f"unknown content part type {json.dumps(kind, ensure_ascii=False)}",
        f"allowed: {allowed}",
    )


def _detail(obj: dict[str, Any], path: str) -> None:
    detail = opt_str(obj, "detail", path)
    if detail is not None and detail not in _IMAGE_DETAILS:
        raise fail(
            join_path(path, "detail"),
            f"unknown detail {json.dumps(detail, ensure_ascii=False)}",
            f"allowed: {', '.join(_IMAGE_DETAILS)}",
        )


def _image_url_part(part: dict[str, Any], path: str) -> FrozenDict:
    only_keys(part, ("type", "image_url"), path, "an image_url part")
    image = required(part, "image_url", path, 'an "image_url" object with a "url"')
    ipath = join_path(path, "image_url")
    # Kept as sent, after the checks: templates read `image_url` parts themselves, as under transformers.
    if isinstance(image, str):  # accepted by vLLM and several clients
        return _frozen(part)
    image = as_object(image, ipath, 'an object {"url": ...} or a URL string')
    only_keys(image, ("url", "detail"), ipath, "image_url")
    as_str(required(image, "url", ipath, "the image URL"), join_path(ipath, "url"))
    _detail(image, ipath)
    return _frozen(part)


def _input_image_part(part: dict[str, Any], path: str) -> FrozenDict:
    """The Responses API's `input_image` (as vLLM takes it in chat messages): `image_url` is the URL string. It
    reaches the template as `{"type": "image", "image_url": <url>, "detail": ...}`, an image part every template
    that reads images recognizes."""
    only_keys(part, ("type", "image_url", "file_id", "detail"), path, "an input_image part")
    if part.get("file_id") is not None:
        raise fail(
            join_path(path, "file_id"),
            "an input_image given by file_id: the bytes are in OpenAI's file store, which ctxlock cannot read",
            'send the image as "image_url": "data:<media type>;base64,..."',
        )
    as_str(
        required(part, "image_url", path, 'the image as a URL string: "data:image/png;base64,..."'),
        join_path(path, "image_url"),
    )
    _detail(part, path)
    return _frozen({**part, "type": "image"})


def _image_part(part: dict[str, Any], path: str) -> FrozenDict:
    """transformers' `{"type": "image", "image" | "url" | "base64": ...}` (apply_chat_template's), kept as sent."""
    only_keys(part, ("type", "image", "url", "base64", "path"), path, "an image part")
    if part.get("path") is not None:
        raise fail(
            join_path(path, "path"),
            "an image given by a local file path: ctxlock reads no files named in a request",
            'send the bytes: "image": "data:<media type>;base64,..." or "base64": "<base64>"',
        )
    sources = [k for k in ("image", "url", "base64") if k in part]
    if len(sources) != 1:
        raise fail(path, f"an image part with {len(sources)} sources", 'send exactly one of "image", "url", "base64"')
    key = sources[0]
    as_str(part[key], join_path(path, key))
    return _frozen(part)


def _video_part(part: dict[str, Any], path: str) -> FrozenDict:
    """`{"type": "video", "video" | "url": [<frame url>, ...] or <url>}` (transformers, qwen-vl-utils) and
    `{"type": "video_url", "video_url": {"url": ...}}` (vLLM), which reaches the template as type "video" with its
    keys as sent (vLLM too gives templates a "video" part). The frames are checked in `multimodal.sources`."""
    keys = ("video_url",) if part.get("type") == "video_url" else ("video", "url", "path")
    only_keys(part, ("type", *keys), path, f"a {part.get('type')} part")
    if part.get("path") is not None:
        raise fail(
            join_path(path, "path"),
            "a video given by a local file path: ctxlock reads no files named in a request",
            'send the frames: "video": ["data:image/png;base64,...", ...]',
        )
    sources = [k for k in keys if k in part]
    if len(sources) != 1:
        raise fail(path, f"a video part with {len(sources)} sources", f"send exactly one of {', '.join(keys[:2])}")
    key = sources[0]
    vpath, value = join_path(path, key), part[key]
    if key == "video_url" and isinstance(value, dict):
        only_keys(value, ("url",), vpath, "video_url")
        vpath, value = join_path(vpath, "url"), required(value, "url", vpath, "the video URL")
    if isinstance(value, list):
        if not value:
            raise fail(vpath, "a video without frames", "send at least one frame")
        for k, frame in enumerate(value):
            as_str(frame, f"{vpath}[{k}]")
    else:
        as_str(value, vpath)
    return _frozen({**part, "type": "video"})


_MEDIA_PARTS = {
    "image_url": _image_url_part,
    "input_image": _input_image_part,
    "image": _image_part,
    "video": _video_part,
    "video_url": _video_part,
}


def _tool_call(raw: Any, path: str, policy: Utf8Policy, as_sent: bool = False) -> ToolCall:
    call = as_object(raw, path, "a tool call object")
    only_keys(call, ("id", "type", "function"), path, "a tool call")
    kind = call.get("type")
    if kind is not None and kind != "function":
        raise fail(join_path(path, "type"), f"unsupported tool call type {json.dumps(kind)}", 'use "function"')
    fpath = join_path(path, "function")
    fn = as_object(required(call, "function", path, 'a "function" object with name and arguments'), fpath)
    only_keys(fn, ("name", "arguments"), fpath, "a tool call function")
    name = as_str(required(fn, "name", fpath, "the function name"), join_path(fpath, "name"), nonempty=True)
    apath = join_path(fpath, "arguments")
    args = required(fn, "arguments", fpath, 'the arguments as a JSON object or a JSON string, e.g. "{}"')
    sent = args
    if isinstance(args, str):
        args = _parse_arguments(args, apath, policy)
    if not isinstance(args, dict):
        raise fail(
            apath,
            f"arguments must decode to a JSON object, got {json_type_name(args)}",
            'wrap the arguments in an object, e.g. {"value": ...}',
        )
    # as-sent keeps the string: it passed the request's own string checks, and it holds a JSON object.
    kept = sent if as_sent and isinstance(sent, str) else freeze(args)
    return ToolCall(name=name, arguments=kept, id=opt_str(call, "id", path), type=kind, source=path)


def _parse_arguments(text: str, path: str, policy: Utf8Policy) -> Any:
    """Parse an OpenAI JSON-string `arguments` (as vLLM does); invalid JSON is an error, never a silent {}.

    The same strict parser as the request: duplicate keys, NaN and lone surrogates are errors, with their path.
    """
    try:
        return loads_strict(text, path, policy)
    except json.JSONDecodeError as exc:
        raise fail(
            path,
            f"arguments is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})",
            'send the arguments as a JSON object encoded in a string, e.g. "{\\"city\\": \\"Paris\\"}" or "{}"',
        ) from None


def _frozen(part: dict[str, Any]) -> FrozenDict:
    frozen: FrozenDict = freeze(part)
    return frozen


def parse_tools(raw: Any) -> tuple[FrozenDict, ...]:
    """The `tools` array, checked and kept verbatim (key order of schemas is data: templates render it)."""
    tools = as_array(raw, "tools", "an array of tools")
    out = []
    for k, tool in enumerate(tools):
        path = f"tools[{k}]"
        tool = as_object(tool, path, 'a tool object {"type": "function", "function": {...}}')
        only_keys(tool, ("type", "function"), path, "a tool")
        kind = required(tool, "type", path, '"type": "function"')
        if kind != "function":
            raise fail(join_path(path, "type"), f"unsupported tool type {json.dumps(kind)}", 'use "function"')
        fpath = join_path(path, "function")
        fn = as_object(required(tool, "function", path, 'a "function" object with a name'), fpath)
        only_keys(fn, ("name", "description", "parameters", "strict"), fpath, "a tool function")
        check_tool_function(fn, fpath)
        out.append(freeze(tool))  # kept verbatim: key order of schemas is data, templates render it
    return tuple(out)


# -- the Responses API's input items (POST /v1/responses/input_tokens) --------------------------------------------

_RESPONSES_TEXT_PARTS = ("input_text", "output_text", "text")
_RESPONSES_ROLES = ("user", "system", "developer", "assistant")
_TOOL_CHOICES = ("auto", "none", "required")


def responses_request(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses API body (`input`, `instructions`, `tools`, `tool_choice`) as the Chat Completions request it
    stands for, the way vLLM's and llama.cpp's Responses endpoints turn one into chat messages: `instructions` is a
    leading system message; a `message` item is a message of its role (text parts as text, `input_image` kept); a
    `function_call` item is a tool call of the assistant turn before it (a new assistant turn with content "" when
    the item before is not one); a `function_call_output` item is a tool message answering its `call_id`. Function
    tools lose `type` and `strict`. `tool_choice` is validated and does not change the input (vLLM renders the tools
    whatever it says, unless its server is started with --exclude-tools-when-tool-choice-none)."""
    raw = body.get("input")
    if isinstance(raw, str):
        messages: list[dict[str, Any]] = [{"role": "user", "content": raw}]
    else:
        items = as_array(raw, "input", "a string or an array of input items")
        messages = []
        seen: set[str] = set()
        for i, item in enumerate(items):
            _response_item(as_object(item, f"input[{i}]", "an input item object"), f"input[{i}]", messages, seen)
    if body.get("instructions") is not None:
        messages.insert(0, {"role": "system", "content": as_str(body["instructions"], "instructions")})
    _tool_choice(body.get("tool_choice"))
    request: dict[str, Any] = {"messages": messages}
    if body.get("tools") is not None:
        request["tools"] = [_response_tool(t, f"tools[{k}]") for k, t in enumerate(as_array(body["tools"], "tools"))]
    return request


def _response_item(item: dict[str, Any], path: str, out: list[dict[str, Any]], seen: set[str]) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        only_keys(item, ("type", "role", "content", "id", "status"), path, "a message item")
        role = as_str(required(item, "role", path, "the role"), f"{path}.role")
        if role not in _RESPONSES_ROLES:
            raise fail(f"{path}.role", f"unknown role {json.dumps(role)}", "allowed: " + ", ".join(_RESPONSES_ROLES))
        out.append({"role": role, "content": _response_content(required(item, "content", path, "the content"), path)})
    elif kind == "function_call":
        only_keys(item, ("type", "call_id", "name", "arguments", "id", "status"), path, "a function_call item")
        call_id = as_str(required(item, "call_id", path, "the call id"), f"{path}.call_id", nonempty=True)
        name = as_str(required(item, "name", path, "the function name"), f"{path}.name", nonempty=True)
        arguments = as_str(required(item, "arguments", path, "the arguments as a JSON string"), f"{path}.arguments")
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        if out and out[-1]["role"] == "assistant":
            out[-1].setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        seen.add(call_id)
    elif kind == "function_call_output":
        only_keys(item, ("type", "call_id", "output", "id", "status"), path, "a function_call_output item")
        call_id = as_str(required(item, "call_id", path, "the call id"), f"{path}.call_id")
        if call_id not in seen:
            raise no_tool_call(call_id, seen, f"{path}.call_id", "function_call_output")
        output = _response_content(required(item, "output", path, "the output"), path, key="output")
        out.append({"role": "tool", "tool_call_id": call_id, "content": output})
    else:
        raise fail(
            f"{path}.type",
            f"unsupported input item type {json.dumps(kind, ensure_ascii=False)}",
            "allowed: message, function_call, function_call_output (other items are refused, not skipped)",
        )


def _response_content(raw: Any, path: str, key: str = "content") -> str | list[dict[str, Any]]:
    cpath = f"{path}.{key}"
    if isinstance(raw, str):
        return raw
    parts = as_array(raw, cpath, "a string or an array of content parts")
    out: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        ppath = f"{cpath}[{j}]"
        kind = part_type(as_object(part, ppath, "a content part object"), ppath)
        if kind in _RESPONSES_TEXT_PARTS:
            only_keys(part, ("type", "text", "annotations", "logprobs"), ppath, "a text part")
            out.append({"type": "text", "text": as_str(required(part, "text", ppath, "the text"), f"{ppath}.text")})
        elif kind == "input_image":
            out.append(part)  # validated by the chat parser, as in a chat message
        else:
            raise fail(
                f"{ppath}.type",
                f"unsupported content part {json.dumps(kind)}",
                "allowed: input_text, output_text, input_image",
            )
    return out


def _tool_choice(raw: Any) -> None:
    if raw is None or (isinstance(raw, str) and raw in _TOOL_CHOICES):
        return
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        return
    raise fail("tool_choice", "tool_choice is auto, none, required or a tool-choice object", 'e.g. "auto"')


def _response_tool(raw: Any, path: str) -> dict[str, Any]:
    tool = as_object(raw, path, "a function tool")
    if tool.get("type") != "function":
        raise fail(f"{path}.type", "only function tools are supported", '"type": "function"')
    only_keys(tool, ("type", "name", "description", "parameters", "strict"), path, "a function tool")
    return {"type": "function", "function": {k: v for k, v in tool.items() if k not in ("type", "strict")}}
