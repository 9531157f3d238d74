"""The Harmony reference for differential tests: a chat request mapped to a Harmony conversation the way vLLM's
chat completions route maps it (vllm/entrypoints/openai/parser/harmony_utils.py: a generated system message, a
developer message with the function tools, then each chat message), rendered by openai-harmony offline over the
pinned o200k_base file (`fetched.o200k_base_path()`).

Test-only; ctxlock is never imported here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import fetched

__all__ = ["encoding", "harmony_messages", "reference_completion_ids", "reference_training_ids"]


@functools.cache
def encoding() -> Any:
    """openai-harmony's gpt-oss encoding, read from the pinned file (TIKTOKEN_ENCODINGS_BASE: no network)."""
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(fetched.o200k_base_path().parent)
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


def harmony_messages(
    request: Mapping[str, Any], *, date: str, reasoning_effort: str | None = None, join_parts: bool = True
) -> list[Any]:
    """vLLM's mapping of a chat completions request to Harmony messages. vLLM makes each text part of a content list
    its own TextContent, which openai-harmony encodes on its own (["0", "0"] is two tokens, "00" one); with
    `join_parts` (ctxlock's rule, docs/harmony.md) the parts are one text."""
    from openai_harmony import (
        Author,
        DeveloperContent,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
        TextContent,
        ToolDescription,
    )

    efforts = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
    system = SystemContent.new()
    if reasoning_effort is not None:
        system = system.with_reasoning_effort(efforts[reasoning_effort])
    system = system.with_conversation_start_date(date)
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    tools = request.get("tools")
    if tools:
        described = [
            ToolDescription.new(
                name=t["function"]["name"],
                description=t["function"].get("description") or "",
                parameters=t["function"].get("parameters"),
            )
            for t in tools
        ]
        out.append(Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_function_tools(described)))

    messages: Sequence[Mapping[str, Any]] = request["messages"]
    names = {c.get("id"): c.get("function", {}).get("name") for m in messages for c in m.get("tool_calls") or []}
    chat: list[Any] = []
    for m in messages:
        role, calls = m["role"], m.get("tool_calls") or []
        reasoning = m.get("reasoning") or m.get("reasoning_content")
        if role == "assistant" and calls:
            content = _text(m.get("content"))
            if content:
                chat.append(Message.from_role_and_content(Role.ASSISTANT, content).with_channel("commentary"))
            if reasoning:
                chat.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
            for call in calls:
                fn = call.get("function", {})
                chat.append(
                    Message.from_role_and_content(Role.ASSISTANT, fn.get("arguments") or "")
                    .with_channel("commentary")
                    .with_recipient(f"functions.{fn.get('name', '')}")
                    .with_content_type("json")
                )
            continue
        if role == "tool":
            name = names.get(m.get("tool_call_id", ""), "") or ""
            chat.append(
                Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), _text(m.get("content")))
                .with_channel("commentary")
                .with_recipient("assistant")
            )
            continue
        if role == "assistant" and reasoning:
            chat.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
        content = m.get("content") or ""
        if isinstance(content, str):
            parts = [TextContent(text=content)]
        elif join_parts:
            parts = [TextContent(text="".join(p.get("text", "") for p in content))] if content else []
        else:
            parts = [TextContent(text=p.get("text", "")) for p in content]
        if role == "assistant":
            first = content if isinstance(content, str) else (content[0].get("text", "") if content else "")
            if first:  # (vLLM keeps an answer whose first part has text)
                chat.append(Message.from_role_and_contents(Role.ASSISTANT, parts).with_channel("final"))
        else:
            chat.append(Message.from_role_and_contents(Role(role), parts))
    return out + _drop_current_turn_analysis(chat)


def _drop_current_turn_analysis(msgs: list[Any]) -> list[Any]:
    """vLLM's auto_drop_analysis_messages: the analysis messages of the current turn (after the last user message)
    that come before its last final message."""
    start = next((i + 1 for i in range(len(msgs) - 1, -1, -1) if msgs[i].author.role == "user"), 0)
    last_final = next(
        (
            i
            for i in range(len(msgs) - 1, start - 1, -1)
            if msgs[i].author.role == "assistant" and msgs[i].channel == "final"
        ),
        -1,
    )
    if last_final < start:
        return msgs
    return [
        m
        for i, m in enumerate(msgs)
        if not (start <= i < last_final and m.channel == "analysis" and m.author.role != "user")
    ]


def reference_completion_ids(
    request: Mapping[str, Any], *, date: str, reasoning_effort: str | None = None, join_parts: bool = True
) -> list[int]:
    """`render_conversation_for_completion(conversation, Role.ASSISTANT)`, as vLLM calls it."""
    from openai_harmony import Conversation, Role

    messages = harmony_messages(request, date=date, reasoning_effort=reasoning_effort, join_parts=join_parts)
    conversation = Conversation.from_messages(messages)
    return list(encoding().render_conversation_for_completion(conversation, Role.ASSISTANT))


def reference_training_ids(request: Mapping[str, Any], *, date: str, reasoning_effort: str | None = None) -> list[int]:
    """`render_conversation_for_training(conversation)`: the last final message ends with <|return|>."""
    from openai_harmony import Conversation

    conversation = Conversation.from_messages(harmony_messages(request, date=date, reasoning_effort=reasoning_effort))
    return list(encoding().render_conversation_for_training(conversation))
