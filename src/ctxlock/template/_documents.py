"""Document blocks (Anthropic `document`, canonical `{"type": "document", ...}` content parts) at the template.

A chat template never sees a document part in a message: `pull_documents` takes each out of its message and, when
the template reads `documents` (HF's RAG variable, as Command-R's and Granite's templates do), appends it to the
template's `documents` as `{"title": ..., "text": ...}` (title only when sent), after the request's and the
caller's own documents, every character keeping its request path. A `content` source's text blocks are joined
with "\n". Otherwise a `DocumentError` names the block's JSON path: a template without `documents` would drop it,
and a PDF has no text ctxlock can render (the provider extracts it by its own rules).
"""

from __future__ import annotations

from typing import Any

from ctxlock.errors import DocumentError
from ctxlock.request import Message, Request
from ctxlock.template import _taint as taint

__all__ = ["pull_documents"]


def _text_of(part: dict[str, Any], message: Message, j: int) -> Any:
    """The document's text: a text source's as the template saw it; a content source's text blocks joined with a
    newline, each keeping the path of its block's `text` (the request's own strings, re-marked)."""
    if part.get("source") != "content":
        return part.get("text") or ""
    chunks = message.content[j]["chunks"] if isinstance(message.content, tuple) else ()
    return taint.join(
        "\n", [taint.leaf(c, message.path_of(f".content[{j}].chunks[{k}]")) for k, c in enumerate(chunks)]
    )


def pull_documents(
    messages: list[dict[str, Any]], request: Request, *, takes_documents: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the messages without document parts, the documents they held in request order)."""
    if not any(
        isinstance(m.content, tuple) and any(p.get("type") == "document" for p in m.content) for m in request.messages
    ):
        return messages, []
    out: list[dict[str, Any]] = []
    docs: list[dict[str, Any]] = []
    for m, message in zip(messages, request.messages, strict=True):
        content = m.get("content")
        if not isinstance(content, list) or not any(p.get("type") == "document" for p in content):
            out.append(m)
            continue
        kept = []
        for j, part in enumerate(content):
            if part.get("type") != "document":
                kept.append(part)
                continue
            where = message.path_of(f".content[{j}]")
            if part.get("source") == "pdf":
                raise DocumentError(
                    f"a PDF document ({part.get('pages')} pages, sha256 {str(part.get('sha256'))[:12]}...): ctxlock "
                    "does not extract a PDF's text, which the provider turns into tokens by its own rules",
                    path=where,
                    hint="send the document's text as a text source to render it; its provider-side count is unknown",
                )
            if not takes_documents:
                raise DocumentError(
                    "the chat template does not read `documents`: it would drop this document",
                    path=where,
                    hint="use a template that renders documents (a RAG template), or put the text in a text block",
                )
            doc = {"title": part["title"]} if part.get("title") is not None else {}
            doc["text"] = _text_of(part, message, j)
            docs.append(doc)
        out.append({**m, "content": kept})
    return out, docs
