"""What a chat template sees: request strings as Tainted strings with their JSON paths, content-part lists joined
when the template reads a string, and transformers' continue_final_message tagging. A part of the template stage,
below `ctxlock.template` (which memoizes the per-message and per-tool conversions built from `tainted`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from . import mistral, taint
from .errors import TemplateError
from .frozen import FrozenDict, freeze
from .options import ContentFormat
from .request import Message, Request, join_path

# transformers' continue_final_message: the last message's content is tagged, rendered, and cut at the tag.
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def tainted(value: Any, path: str, *, keys: bool = True) -> Any:
    """Plain JSON data with every string (and key) a Tainted string carrying its JSON path."""
    if isinstance(value, str):
        return taint.leaf(value, path)
    if isinstance(value, Mapping):
        return {
            (taint.leaf(k, join_path(path, k)) if keys and isinstance(k, str) else k): tainted(
                v, join_path(path, k) if isinstance(k, str) else f"{path}[{k}]"
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [tainted(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def tool_call(tc: dict[str, Any], path: str) -> dict[str, Any]:
    out = {k: tainted(v, join_path(path, k)) for k, v in tc.items() if k != "function"}
    fn = tc["function"]
    out["function"] = {
        "name": tainted(fn["name"], f"{path}.function.name"),
        "arguments": tainted(fn["arguments"], f"{path}.function.arguments"),
    }
    return out


def content_format_option(value: Any) -> ContentFormat:
    try:
        return ContentFormat(value)
    except ValueError:
        raise TemplateError(
            f"unknown content format {value!r}",
            path="content_format",
            hint="use 'auto' (detect from the template), 'string' (join text parts) or 'openai' (parts as sent)",
        ) from None


def content_path(message: Message) -> str:
    """The JSON path of a message's content list (an Anthropic system list is `system` itself)."""
    first = message.origins.get(".content[0].text")
    if first is not None:
        return re.sub(r"\[\d+\]\.text$", "", first)
    return message.path_of(".content")


def flatten_contents(messages: list[dict[str, Any]], request: Request) -> list[dict[str, Any]]:
    """Each content list joined into one string: its text parts with "\n" between them (vLLM's flattening), the
    provenance of every character kept. The newlines between parts belong to the request too (their path is the
    content list's): the joined string is one request string, so no character of it, however many empty parts
    a client sends, counts as the template's own text where a control token is matched. Only called once every
    part is known to be text."""
    out = []
    for m, message in zip(messages, request.messages, strict=True):
        content = m.get("content")
        if isinstance(message.content, tuple) and isinstance(content, list):
            sep = taint.leaf("\n", content_path(message))
            m = {**m, "content": taint.join(sep, [part["text"] for part in content])}
        out.append(m)
    return out


def flatten_warning(flattened: tuple[str, ...], option: ContentFormat) -> tuple[FrozenDict, ...]:
    if not flattened:
        return ()
    why = (
        "content_format='string' was asked"
        if option is ContentFormat.STRING
        else "the template reads message content as a string (detected from its syntax tree)"
    )
    shown = ", ".join(flattened[:3]) + (f" and {len(flattened) - 3} more" if len(flattened) > 3 else "")
    return (
        freeze(
            {
                "kind": "content_parts_joined",
                "message": f"{why}, so the text parts of {len(flattened)} message content(s) were joined with "
                '"\\n" into one string, as vLLM does; transformers passes the list as sent, which this template '
                "cannot read (to pass it as sent: content_format='openai', --content-format openai)",
                "path": shown,
            }
        ),
    )


def parts_hint(hint: str | None, request: Request) -> str:
    """A failed render's hint, plus the content format option when the request holds content-part lists."""
    with_parts = [content_path(m) for m in request.messages if isinstance(m.content, tuple)]
    if not with_parts:
        return hint or ""
    extra = (
        f"{with_parts[0]} is a list of content parts, which this template may read as a string: "
        "content_format='string' (--content-format string) joins their text parts"
    )
    return f"{hint}; {extra}" if hint else extra


def reference_warnings(source: str, request: Any, continue_final_message: bool) -> tuple[FrozenDict, ...]:
    """What the render did that the reference would have refused (README, "Differences from the references")."""
    if not mistral.is_patched(source) or not request.messages:
        return ()
    out = [
        freeze({"kind": "reference_refuses", "message": message, "path": path})
        for path, message in mistral.refused_names(request)
    ]
    last = request.messages[-1]
    if last.role == "assistant" and not continue_final_message:
        out.append(
            freeze(
                {
                    "kind": "reference_refuses",
                    "message": "the request ends with an assistant message: ctxlock renders it as the template does, "
                    "where mistral-common's encode_chat_completion refuses it; pass continue_final_message to "
                    "continue it (mistral-common's prefix: true)",
                    "path": last.source,
                }
            )
        )
    return tuple(out)


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise TemplateError(
            f"the render seed must be an integer in [0, 2**64), not {seed!r}",
            path="seed",
            hint="pass an integer (the default is 0)",
        )
    return seed


def tag_final_message(msgs: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    # transformers' continue_final_message: tag the last message's content, render, then cut at the tag.
    if not msgs:
        raise TemplateError("continue_final_message is set but the conversation is empty!")
    last = dict(msgs[-1])
    content = last.get("content")
    if content is None:
        raise TemplateError('continue_final_message is set but the final message has no "content" to continue!')
    if "content" not in source:
        raise TemplateError(
            'continue_final_message is set to "content" but this is not an accepted field in the chat_template'
        )
    if isinstance(content, list):
        parts = [dict(x) if isinstance(x, dict) else x for x in content]
        for part in reversed(parts):
            if isinstance(part, dict) and "text" in part:
                part["text"] = part["text"] + CONTINUE_TAG
                break
        else:
            raise TemplateError(
                "continue_final_message is set but we could not find any text to continue in the final message!"
            )
        last["content"] = parts
    else:
        last["content"] = content + CONTINUE_TAG
    return [*msgs[:-1], last]


def _final_text(messages: list[dict[str, Any]]) -> str:
    content = messages[-1].get("content")
    if isinstance(content, list):
        for part in reversed(content):
            if isinstance(part, dict) and "text" in part:
                return part["text"]
        return ""
    return content or ""


def cut_at_continue_tag(
    text: str, spans: list[taint.SpanT], messages: list[dict[str, Any]]
) -> tuple[str, list[taint.SpanT]]:
    final = _final_text(messages).strip()
    tag = CONTINUE_TAG.strip()
    if final not in text or tag not in text:
        raise TemplateError(
            "continue_final_message is set but the final message does not appear in the chat after applying the "
            "chat template! This can happen if the chat template deletes portions of the final message. Please "
            "verify the chat template and final message in your chat to ensure they are compatible."
            f"Final message to continue: {final}\nRendered chat:\n{text}"
        )
    loc = text.rindex(tag)
    cut = text[:loc] if text[loc : loc + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:loc].rstrip()
    return cut, taint.cut(tuple(spans), 0, len(cut))


__all__ = [
    "CONTINUE_TAG",
    "check_seed",
    "content_format_option",
    "content_path",
    "cut_at_continue_tag",
    "flatten_contents",
    "flatten_warning",
    "parts_hint",
    "reference_warnings",
    "tag_final_message",
    "tainted",
    "tool_call",
]
