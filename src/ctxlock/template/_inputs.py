"""What a chat template sees: request strings as Tainted strings with their JSON paths (each message and each tool
list converted once per value: `template_messages`, `template_tools`), content-part lists joined when the template
reads a string, and transformers' continue_final_message tagging. A part of the template stage, below
`ctxlock.template`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from ctxlock.caches import memoize
from ctxlock.core import FrozenDict, freeze, thaw
from ctxlock.errors import ControlTokenError, RequestValidationError, TemplateError
from ctxlock.request import NO_ORIGINS, Dialect, Message, Request, join_path
from ctxlock.template import _mistral as mistral
from ctxlock.template import _taint as taint
from ctxlock.template._options import ContentFormat, RenderOptions
from ctxlock.template._values import ChatTemplate, TemplateSet

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


def tool_call(tc: dict[str, Any], path: Callable[[str], str]) -> dict[str, Any]:
    """A tool call as templates see it; `path(suffix)` is the request path of its field `suffix` (".id",
    ".function.name", ".function.arguments", ".type"). An empty path marks a value ctxlock made, not the client (the
    "function" type of an Anthropic tool_use): it stays a plain string, as the role does."""
    out = {}
    for k, v in tc.items():
        if k != "function":
            where = path(f".{k}")
            out[k] = tainted(v, where) if where else v
    fn = tc["function"]
    out["function"] = {
        "name": tainted(fn["name"], path(".function.name")),
        "arguments": tainted(fn["arguments"], path(".function.arguments")),
    }
    return out


def template_messages(request: Request) -> list[dict[str, Any]]:
    """The request's messages as templates see them (`template_message`, per message)."""
    return [template_message(m, m.source, None if m.origins is NO_ORIGINS else m.origins) for m in request.messages]


@memoize("template.message", 8192)
def template_message(message: Message, source: str, origins: FrozenDict | None = None) -> dict[str, Any]:
    """A message as templates see it. Memoized (per message, its place in the request and its `origins`, which
    `Message` equality leaves out: the same conversation sent in the OpenAI and the Anthropic dialect is equal but
    has other paths): the sandbox is immutable, so a template cannot change the dict, and a long chat re-rendered
    turn after turn (or candidate after candidate) converts each message once. The role is a validated structural
    value and stays a plain string. `origins` is only the key: pass `message.origins`, or None when it is the
    shared empty one (`NO_ORIGINS`, every plain message: an identity test, no hashing of an empty map).

    A message with a role and a string content only, at its own path (most of a training set), is the dict
    `convert_message` builds, made directly."""
    content = message.content
    if (
        type(content) is str
        and message.name is None
        and message.tool_calls is None
        and message.tool_call_id is None
        and message.reasoning_content is None
        and not message.origins
    ):
        return {"role": message.role, "content": taint.leaf(content, source + ".content")}
    return convert_message(message, source)


# A content string joined from several request strings (Anthropic system blocks, a tool_result's text blocks) keeps
# each piece's own path: `origins[".content@START"]` is the path of the piece starting at offset START.
PIECE = ".content@"


def _joined(value: str, origins: FrozenDict) -> str:
    """The joined content with each piece tainted with its own path (a piece runs to the next one's start)."""
    starts = sorted(int(k[len(PIECE) :]) for k in origins if k.startswith(PIECE))
    ends = [*starts[1:], len(value)]
    return taint.concat([taint.leaf(value[s:e], origins[f"{PIECE}{s}"]) for s, e in zip(starts, ends, strict=True)])


def _call_path(path: Callable[[str], str], k: int) -> Callable[[str], str]:
    """The request path of a field of tool call K: `path(".tool_calls[K]" + suffix)`."""
    return lambda suffix: path(f".tool_calls[{k}]{suffix}")


def convert_message(message: Message, source: str) -> dict[str, Any]:
    """`template_message`, for every message: each field as `Message.to_template` gives it, tainted with its path."""
    origins = message.origins

    def path(suffix: str) -> str:
        where = origins.get(suffix)
        return f"{source}{suffix}" if where is None else where

    m: dict[str, Any] = {}
    for key, value in message.to_template().items():
        if key == "role":
            m[key] = value
        elif key == "content" and isinstance(value, list):
            m[key] = [
                {k: tainted(v, path(f".content[{j}].{k}")) for k, v in part.items()} for j, part in enumerate(value)
            ]
        elif key == "content" and isinstance(value, str) and PIECE + "0" in origins:
            m[key] = _joined(value, origins)
        elif key == "tool_calls":
            # Each field's own origin (an Anthropic tool_use's id, name and input), else source + suffix (OpenAI).
            m[key] = [tool_call(tc, _call_path(path, k)) for k, tc in enumerate(value)]
        else:
            m[key] = tainted(value, path(f".{key}"))
    # transformers' _alias_reasoning_fields: reasoning is visible as `thinking` (gpt-oss) and `reasoning_content`.
    reasoning = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
    if reasoning is not None:
        m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    return m


@memoize("template.tools", 256)
def template_tools(tools: tuple[Any, ...], dialect: Dialect) -> tuple[dict[str, Any], ...]:
    """A request's tools as templates see them, converted once per distinct tool list: the sandbox is immutable, so
    templates cannot change the shared dicts, and a chat sends the same tools every turn."""
    out = []
    for k, tool in enumerate(tools):
        plain = thaw(tool)
        t: dict[str, Any] = {}
        for key, value in plain.items():
            if key == "function" and isinstance(value, dict):
                fn_path = f"tools[{k}]" if dialect is Dialect.ANTHROPIC else f"tools[{k}].function"
                t[key] = {
                    fk: tainted(
                        fv,
                        join_path(
                            fn_path, "input_schema" if dialect is Dialect.ANTHROPIC and fk == "parameters" else fk
                        ),
                    )
                    for fk, fv in value.items()
                }
            else:
                t[key] = tainted(value, join_path(f"tools[{k}]", key))
        out.append(t)
    return tuple(out)


def strftime_now_of(clock: datetime) -> tuple[Any, list[str]]:
    """The template's `strftime_now`, reading `clock`, and the list of the formats it is called with."""
    clock_calls: list[str] = []

    def strftime_now(fmt: str) -> str:
        clock_calls.append(fmt)
        wall = clock.replace(tzinfo=None)  # transformers formats a naive local time: %z and %Z are empty
        formatted: str = taint.derived(wall.strftime(fmt), (fmt,), "strftime_now()")
        return formatted

    return strftime_now, clock_calls


# template.render's keyword form: its own names for two fields, and what it ignores.
_KEYWORD_NAMES = {"policy": "injection", "template_name": "chat_template"}
_KEYWORDS = frozenset(
    {
        *_KEYWORD_NAMES,
        *("add_generation_prompt", "continue_final_message", "tools", "documents", "chat_template_kwargs"),
        *("injection", "now", "limits", "provenance", "seed", "content_format"),
    }
)


def keyword_options(
    options: RenderOptions | None, keywords: Mapping[str, Any], default: RenderOptions
) -> RenderOptions:
    """`template.render`'s keyword form as RenderOptions, over `options` (else `default`). Without `options`,
    `add_generation_prompt` defaults to True here (it always did: a caller asking for `continue_final_message` says
    so)."""
    changes: dict[str, Any] = {} if options is not None else {"add_generation_prompt": True}
    for name, value in keywords.items():
        if name not in _KEYWORDS:
            raise TypeError(f"render() got an unexpected keyword argument {name!r}")
        if name != "provenance":  # provenance is kept per character whatever it says
            changes[_KEYWORD_NAMES.get(name, name)] = value
    return (options or default).replace(**changes)


def tools_and_documents(request: Request, opts: RenderOptions) -> tuple[list[Any] | None, list[Any] | None]:
    """The request's tools and documents as templates see them, then the caller's (plain, trusted)."""
    tools = None if opts.tools is None else thaw(opts.tools)
    documents = None if opts.documents is None else thaw(opts.documents)
    req_tools = None if request.tools is None else list(template_tools(request.tools, request.dialect))
    all_tools = (req_tools or []) + list(tools or []) if (req_tools or tools) else None
    req_docs = request.template_documents()
    if req_docs is not None:
        req_docs = [tainted(d, f"documents[{k}]") for k, d in enumerate(req_docs)]
    all_docs = (req_docs or []) + list(documents or []) if (req_docs or documents) else None
    return all_tools, all_docs


def select_template(templates: TemplateSet | ChatTemplate, opts: RenderOptions, *, has_tools: bool) -> ChatTemplate:
    """The template to render: a ChatTemplate given in the options or as `templates`, else chosen from the set."""
    if isinstance(opts.chat_template, ChatTemplate):
        return opts.chat_template
    if isinstance(templates, ChatTemplate):
        return templates
    return templates.select(opts.chat_template, has_tools=has_tools)


def template_variables(
    request: Request | None, special_tokens: Mapping[str, str] | None, opts: RenderOptions, agp: Any
) -> dict[str, Any]:
    """Precedence: the caller's kwargs (an operator's --var) over the request's, over the tokenizer's special
    tokens. A request may not set one of the model's named special tokens (an `image_token` the model's files
    name, beyond the standard names RESERVED_TEMPLATE_KWARGS holds): its value would replace the control token the
    template writes. (`request` None: a request without chat_template_kwargs.)"""
    request_kwargs = (
        {k: tainted(v, join_path("chat_template_kwargs", k)) for k, v in request.chat_template_kwargs.items()}
        if request is not None and request.chat_template_kwargs
        else {}
    )
    shadowed = sorted(request_kwargs.keys() & (special_tokens or {}).keys())
    if shadowed:
        raise RequestValidationError(
            f"{shadowed[0]} is reserved: it is one of the model's special tokens",
            path=join_path("chat_template_kwargs", shadowed[0]),
            hint="rename the variable; the model's special tokens cannot be overridden by a request",
        )
    return {
        **dict(special_tokens or {}),
        **request_kwargs,
        **opts.template_variables(),
        "add_generation_prompt": agp,
    }


def refuse_control_tokens(request: Request, regex: Any) -> None:
    """Under the `raise` policy: the first request string that holds a control token (`regex`) is refused."""
    for path, s in request.strings():
        m = regex.search(s)
        if m:
            raise ControlTokenError(
                f"request string contains the control token {m.group(0)!r} at character {m.start()}",
                path=path,
                hint="remove it, or render with injection='text' to encode it as plain text",
            )


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
                text: str = part["text"]
                return text
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
    "keyword_options",
    "parts_hint",
    "reference_warnings",
    "refuse_control_tokens",
    "select_template",
    "strftime_now_of",
    "tag_final_message",
    "tainted",
    "template_message",
    "template_messages",
    "template_tools",
    "template_variables",
    "tool_call",
    "tools_and_documents",
]
