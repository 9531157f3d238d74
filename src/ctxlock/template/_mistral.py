"""mistral-common's request shapes for the template mistral-common generates (the embedded default, mistral-nemo).

A pure stage helper (no I/O). mistral-common's `convert_tokenizer_to_chat_template` writes a Jinja template for a
Tekken tokenizer, but `MistralTokenizer.encode_chat_completion` (the reference for these models) normalizes a
request before it encodes it, and the template does not do all of it:

- a tool result is parsed as JSON and written as the value it holds (`{"content": {"temp": 21}, ...}`), where the
  template writes every result as an escaped string but an int or a float;
- a tool result's text parts are joined with a blank line, and an empty result is the object `{}`;
- empty strings and empty text parts add no separator when messages of one role are merged;
- an assistant's text loses its trailing spaces;
- a tool definition is written as mistral-common's `Tool` model dumps it: `name`, `description` (`""` when
  absent), `parameters`, and never `strict`.

`patch_template` rewrites the two places of the generated source that need it (the tool result and the assistant
text), and marks the source, so that a template read back from a record is recognised (`is_patched`). `adapt` gives
the messages and tools to such a template in mistral-common's shapes, keeping each request string's provenance.
Where mistral-common rejects a shape that the template would render by dropping something (images without an image
encoder, `reasoning_content`, a tool without `parameters`), `adapt` rejects it too, with a `TemplateRaisedError`
that names the request path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ctxlock.errors import ArtifactFormatError, TemplateRaisedError
from ctxlock.outside import SYNTAX_ERROR, loads_outside
from ctxlock.template import _taint as taint

__all__ = ["IMAGES_MARKER", "MARKER", "adapt", "is_patched", "patch_template", "takes_images"]

MARKER = "{#- ctxlock: mistral-common request shapes (ctxlock.mistral) #}\n"
# Written after MARKER when the tokenizer has an image section (an image encoder in mistral-common): user image parts
# then reach the template, which writes one [IMG] each for the Pixtral family to expand (ctxlock.multimodal).
IMAGES_MARKER = "{#- ctxlock: images (ctxlock.multimodal.pixtral expands each [IMG]) #}\n"

# (what the generated source holds, what ctxlock writes instead): each must occur exactly once.
_TOOL_START = "{# Try to parse 'content' as int or float if possible #}"
_TOOL_END = "{%- if message['call_id'] is not undefined"
_ASSISTANT_OLD = "render_content(content=message['content'], context_name='assistant message contents'"
_ASSISTANT_NEW = (
    "render_content(content=(message['content'].rstrip(' ') if message['content'] is string else message['content']),"
    " context_name='assistant message contents'"
)


def is_patched(source: str) -> bool:
    """True for a template `patch_template` made: `render` then gives it the messages through `adapt`."""
    return source.startswith(MARKER)


def takes_images(source: str) -> bool:
    """True for a patched template whose tokenizer has an image encoder (`patch_template(..., images=True)`)."""
    return source.startswith(MARKER + IMAGES_MARKER)


def patch_template(source: str, *, origin: str, images: bool = False) -> str:
    """The generated template, with the tool result written as the JSON value `adapt` parsed and the assistant's
    trailing spaces stripped, as mistral-common encodes them. Raises ArtifactFormatError if the source is not the
    one this was written for (another mistral-common version): a silent half-patch would break parity unseen."""
    for anchor in (_TOOL_START, _TOOL_END, _ASSISTANT_OLD):
        if source.count(anchor) != 1:
            raise ArtifactFormatError(
                f"the generated Mistral template does not hold {anchor!r} exactly once",
                path=origin,
                hint="ctxlock's mistral-common shape patch was written for mistral-common 1.13; "
                "pin that version or update ctxlock (its mistral-common shapes: ctxlock/template/_mistral.py)",
            )
    start, end = source.index(_TOOL_START), source.index(_TOOL_END)
    source = source[:start] + "{%- set tool_content = message['content'] %}\n        " + source[end:]
    return MARKER + (IMAGES_MARKER if images else "") + source.replace(_ASSISTANT_OLD, _ASSISTANT_NEW)


def _reject(message: str, path: str, hint: str) -> TemplateRaisedError:
    return TemplateRaisedError(f"{message} (mistral-common rejects this request)", path=path, hint=hint)


def _tainted_json(value: Any, path: str) -> Any:
    """A parsed JSON value with every string and key a request string of `path` (the tool message's content)."""
    if isinstance(value, str):
        return taint.leaf(value, path)
    if isinstance(value, dict):
        return {taint.leaf(k, path): _tainted_json(v, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_tainted_json(v, path) for v in value]
    return value


def _joined_text(content: Any) -> str:
    """mistral-common's `_aggregate_content_chunks` on one message: text parts, empty ones skipped, joined by a
    blank line (the parts are text only: the request stage allows nothing else outside user messages)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = [p["text"] for p in content if p.get("type") == "text" and p.get("text")]
    return taint.join("\n\n", texts) if texts else ""


def _tool_content(content: Any, path: str) -> Any:
    """`_normalize_json_content` then `_parse_tool_content`: "" is `{}`, JSON is its value, other text stays text.
    Python's json, as mistral-common uses it (NaN and Infinity parse; a repeated key keeps its last value)."""
    text = _joined_text(content)
    if text == "":
        return {}
    try:
        # As json.loads reads it (NaN, Infinity and a repeated key's last value too); bounded like any outside JSON.
        value = loads_outside(text, path, error=TemplateRaisedError, last_key_wins=True, nonfinite=True)
    except TemplateRaisedError as exc:
        if exc.message.startswith(SYNTAX_ERROR):
            return text  # not JSON: the text as it is
        if exc.message.startswith("invalid JSON value"):  # an integer of over 4,300 digits: mistral-common fails too
            raise _reject(
                "the tool result holds an integer too long to convert (over 4,300 digits)",
                path,
                "send the number as a JSON string, or the result as plain text",
            ) from None
        # Nesting past MAX_JSON_DEPTH or a lone surrogate: mistral-common renders them, ctxlock reads no such JSON.
        raise TemplateRaisedError(
            f"the tool result is JSON ctxlock does not read: {exc.message}"
            " (mistral-common renders what Python's json reads)",
            path=exc.path,
            hint="send the result as plain text (docs/outside-json.md)",
        ) from None
    return _tainted_json(value, path)


def _drop_empty(content: Any) -> Any:
    """Content with no empty text: mistral-common skips "" and empty text parts when it merges messages of one role,
    where the template would add a blank line for each."""
    if isinstance(content, str):
        return content if content else []
    if isinstance(content, list):
        return [p for p in content if not (p.get("type") == "text" and not p.get("text"))]
    return content


def adapt(
    messages: Sequence[dict[str, Any]],
    sources: Sequence[str],
    tools: Sequence[dict[str, Any]] | None,
    *,
    images: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The template messages and tools in the shapes mistral-common encodes (see the module docstring).

    `sources` are the messages' JSON paths in the request, for errors and for the provenance of parsed tool results.
    """
    out: list[dict[str, Any]] = []
    for m, source in zip(messages, sources, strict=True):
        role = m["role"]
        if m.get("reasoning_content") is not None:
            raise _reject(
                "this tokenizer (Tekken v3) has no reasoning field, and the template would drop the reasoning",
                f"{source}.reasoning_content",
                "drop reasoning_content, or use a model whose template renders it",
            )
        if role != "tool" and m.get("name") is not None:
            raise _reject(
                f"a {role} message with a name: mistral-common has no name field there, and the template would drop it",
                f"{source}.name",
                "drop the name, or put it in the content",
            )
        m = {k: v for k, v in m.items() if k not in ("thinking", "reasoning_content")}
        if role == "tool":
            m["content"] = _tool_content(m.get("content"), f"{source}.content")
        elif role in ("user", "assistant", "system"):
            content = m.get("content")
            if isinstance(content, list):
                for j, part in enumerate(content):
                    if part.get("type") != "text" and not (images and role == "user" and _is_image(part)):
                        raise _reject(
                            f"a {part.get('type')} part: this tokenizer (Tekken v3) has no image encoder",
                            f"{source}.content[{j}]",
                            "send text only to this model",
                        )
            if content is not None:
                m["content"] = _drop_empty(content)
        out.append(m)
    return out, None if tools is None else [_tool(t, k) for k, t in enumerate(tools)]


def _is_image(part: dict[str, Any]) -> bool:
    return part.get("type") in ("image", "image_url")


def _tool(tool: dict[str, Any], k: int) -> dict[str, Any]:
    """mistral-common's `Tool.model_dump(exclude={"function": {"strict"}})`: its fields, in its order."""
    fn = tool.get("function") or {}
    if fn.get("parameters") is None:
        raise _reject(
            "a tool without parameters",
            f"tools[{k}].function.parameters",
            'send "parameters": {"type": "object", "properties": {}} for a tool that takes none',
        )
    description = fn.get("description")
    return {
        "type": tool.get("type", "function"),
        "function": {
            "name": fn.get("name"),
            "description": "" if description is None else description,
            "parameters": fn["parameters"],
        },
    }


_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_CALL_ID = re.compile(r"[a-zA-Z0-9]{9}")


def refused_names(request: Any) -> list[tuple[str, str]]:
    """(JSON path, message) for each function name and tool-call id mistral-common's validator refuses (names
    `^[a-zA-Z0-9_-]{1,64}$`, ids `^[a-zA-Z0-9]{9}$`). ctxlock renders them (a control-token string in one stays
    text); the render carries each as a `reference_refuses` warning."""
    out: list[tuple[str, str]] = []

    def name(value: Any, path: str) -> None:
        if isinstance(value, str) and not _NAME.fullmatch(value):
            out.append(
                (path, f"mistral-common refuses the function name {value[:80]!r}: a-z, A-Z, 0-9, _ and -, at most 64")
            )

    def call_id(value: Any, path: str) -> None:
        if isinstance(value, str) and not _CALL_ID.fullmatch(value):
            out.append((path, f"mistral-common refuses the tool call id {value[:80]!r}: 9 characters a-z, A-Z, 0-9"))

    for k, tool in enumerate(request.tools or ()):
        name((tool.get("function") or {}).get("name"), f"tools[{k}].function.name")
    for m in request.messages:
        for j, call in enumerate(m.tool_calls or ()):
            name(call.name, f"{call.source or m.source + f'.tool_calls[{j}]'}.function.name")
            call_id(call.id, f"{call.source or m.source + f'.tool_calls[{j}]'}.id")
        if m.role == "tool":
            name(m.name, m.path_of(".name") if m.name is not None else m.source)
            call_id(m.tool_call_id, m.path_of(".tool_call_id"))
    return out
