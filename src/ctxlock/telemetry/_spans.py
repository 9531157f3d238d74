"""One execution record -> one span description (`SpanSpec`): the GenAI attributes, ctxlock's own, and with
`content` the messages in the conventions' shape plus the exact request and record. Pure data; `_export` turns the
descriptions into OpenTelemetry SDK spans."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ctxlock.telemetry import _conventions as c

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int]


@dataclass(frozen=True)
class CacheFigures:
    """One turn of `cache-report` under a provider's rule: what it reads and writes, and its buster if any."""

    provider: str
    cache_read: int
    cache_write: int
    buster_kind: str | None = None
    buster: str | None = None


@dataclass(frozen=True)
class SpanSpec:
    """What one span holds: its name, times (ns since the epoch), ids and attributes."""

    name: str
    start_ns: int
    end_ns: int
    trace_id: int
    span_id: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


def trace_id_for(record_ids: Sequence[str]) -> int:
    """A session's trace id: the first 16 bytes of the sha256 of its record ids in order (never 0)."""
    digest = hashlib.sha256("\n".join(record_ids).encode("ascii")).digest()
    return int.from_bytes(digest[:16], "big") or 1


def span_id_for(record_id: str, turn: int) -> int:
    """A record's span id in its session: the first 8 bytes of the sha256 of its id and turn (never 0)."""
    digest = hashlib.sha256(f"{turn}:{record_id}".encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big") or 1


def time_ns(iso: str | None) -> int:
    """An ISO 8601 time in ns since the epoch (0 when the record has none)."""
    if not iso:
        return 0
    moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def ids_sha256(ids: Sequence[int]) -> str:
    """The sha256 of the ids as canonical JSON (`[1,2,3]`): what `ctxlock.ids.sha256` holds."""
    return hashlib.sha256(json.dumps(list(ids), separators=(",", ":")).encode("ascii")).hexdigest()


def record_span(
    record_id: str,
    data: Mapping[str, Any],
    request: Mapping[str, Any],
    *,
    turn: int,
    trace_id: int,
    provider: str,
    counts: Sequence[tuple[str, int]] | None = None,
    count_note: str | None = None,
    cache: CacheFigures | None = None,
    content: bool = False,
    record_text: str | None = None,
) -> SpanSpec:
    """The span of one record (`data`, its parsed JSON; `request`, the request as sent). Without `content`, no
    message text, tool schema, request or record leaves: only names, digests and counts."""
    model = str((data.get("model") or {}).get("id") or (data.get("replay") or {}).get("model") or "unknown")
    template, tokenizer = data.get("template") or {}, data.get("tokenizer") or {}
    ids = data.get("input_ids") or []
    attrs: dict[str, AttributeValue] = {
        c.OPERATION_NAME: c.CHAT,
        c.PROVIDER_NAME: provider,
        c.REQUEST_MODEL: model,
        c.INPUT_TOKENS: len(ids),
        c.USAGE_SOURCE: "ctxlock",
        c.SEMCONV_ATTR: c.SEMCONV_VERSION,
        c.RECORD_ID: record_id,
        c.IDS_SHA256: ids_sha256(ids),
    }
    for key, value in (
        (c.TEMPLATE_ID, template.get("id")),
        (c.TEMPLATE_SHA256, template.get("sha256")),
        (c.TOKENIZER_ID, tokenizer.get("id")),
        (c.TOKENIZER_SHA256, tokenizer.get("sha256")),
        (c.REQUEST_SHA256, (data.get("request") or {}).get("sha256")),
    ):
        if isinstance(value, str):
            attrs[key] = value
    if counts is not None:
        attrs[c.COUNT_PARTS] = [name for name, _ in counts]
        attrs[c.COUNT_TOKENS] = [n for _, n in counts]
    if count_note:
        attrs[c.COUNT_NOTE] = count_note
    attrs |= _neutralized(data, tokenizer)
    if cache is not None:
        attrs |= {c.CACHE_PROVIDER: cache.provider, c.CACHE_READ: cache.cache_read, c.CACHE_CREATION: cache.cache_write}
        if cache.buster_kind is not None:
            attrs[c.CACHE_BUSTER_KIND] = cache.buster_kind
            attrs[c.CACHE_BUSTER] = cache.buster or ""
    if content:
        attrs |= content_attributes(request)
        attrs[c.REQUEST] = json.dumps(request, ensure_ascii=False, separators=(",", ":"))
        if record_text is not None:
            attrs[c.RECORD] = record_text
    start = time_ns((data.get("dynamic") or {}).get("now"))
    return SpanSpec(f"{c.CHAT} {model}", start, start, trace_id, span_id_for(record_id, turn), attrs)


def _neutralized(data: Mapping[str, Any], tokenizer: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """How many neutralized matches the record lists (`rendered.neutralized`: control-token strings in request text,
    each encoded as text, never as the control token), and which of the vocabulary's control strings they were: a
    match's text is named only when it is one of the vocabulary's added-token strings, so no request text leaves."""
    found = (data.get("rendered") or {}).get("neutralized") or []
    text = (data.get("rendered") or {}).get("text") or ""
    vocabulary = {str(row[0]) for row in tokenizer.get("added_tokens") or [] if row}
    strings = sorted({text[int(row[0]) : int(row[1])] for row in found} & vocabulary)
    out: dict[str, AttributeValue] = {c.NEUTRALIZED_COUNT: len(found)}
    if strings:
        out[c.NEUTRALIZED_TOKENS] = strings
    return out


# -- the conventions' message shape (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-input-messages.json)


def content_attributes(request: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """gen_ai.input.messages, gen_ai.system_instructions (a top-level `system`, as Anthropic takes it) and
    gen_ai.tool.definitions, each a JSON string. OpenAI's system messages stay in the messages, where it takes
    them."""
    out: dict[str, AttributeValue] = {}
    messages = request.get("messages")
    if isinstance(messages, list):
        out[c.INPUT_MESSAGES] = _json([_message(m) for m in messages if isinstance(m, Mapping)])
    system = request.get("system")
    if system is not None:
        out[c.SYSTEM_INSTRUCTIONS] = _json(_parts(system))
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        out[c.TOOL_DEFINITIONS] = _json([_tool(t) for t in tools if isinstance(t, Mapping)])
    return out


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    if role == "tool":
        parts = [{"type": "tool_call_response", "id": message.get("tool_call_id"), "response": message.get("content")}]
    else:
        parts = _parts(message.get("content"))
    for call in message.get("tool_calls") or []:
        if not isinstance(call, Mapping):
            continue
        fn: Mapping[str, Any] = call["function"] if isinstance(call.get("function"), Mapping) else {}
        parts.append(
            {"type": "tool_call", "id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")}
        )
    out: dict[str, Any] = {"role": role, "parts": parts}
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out


def _parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    if not isinstance(content, list):
        return [{"type": "text", "content": _json(content)}]
    out: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, str):
            out.append({"type": "text", "content": block})
        elif not isinstance(block, Mapping):
            continue
        elif block.get("type") in ("text", "input_text") and isinstance(block.get("text"), str):
            out.append({"type": "text", "content": block["text"]})
        elif block.get("type") == "tool_use":
            out.append(
                {"type": "tool_call", "id": block.get("id"), "name": block.get("name"), "arguments": block.get("input")}
            )
        elif block.get("type") == "tool_result":
            out.append({"type": "tool_call_response", "id": block.get("tool_use_id"), "response": block.get("content")})
        else:  # an image, a document, a thinking block: the conventions' generic part, the block as sent
            out.append({**block, "type": str(block.get("type", "unknown"))})
    return out


def _call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn: Mapping[str, Any] = tool["function"] if isinstance(tool.get("function"), Mapping) else tool
    out: dict[str, Any] = {"type": "function", "name": fn.get("name")}
    if fn.get("description") is not None:
        out["description"] = fn.get("description")
    schema = fn.get("parameters", fn.get("input_schema"))
    if schema is not None:
        out["parameters"] = schema
    return out
