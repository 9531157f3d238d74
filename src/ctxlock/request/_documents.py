"""Anthropic `document` blocks, made canonical content parts (`{"type": "document", ...}`).

Three sources are accepted, each kept with what a replay needs and nothing guessed:

- `base64` PDF (`media_type: application/pdf`): the bytes' sha256, their size and the page count read by pypdf (the
  `pdf` extra: `pip install 'ctxlock[pdf]'`), plus the base64 data as sent. ctxlock does not extract a PDF's text:
  the provider turns pages into text and images by its own rules, so the template stage refuses to render one;
- `text` (`media_type: text/plain`): the text, which a template that takes `documents` renders;
- `content`: text blocks, kept as `chunks` (an image block inside a document is refused).

`url` and `file` sources are refused: ctxlock never fetches. `title` and `context` are kept; `citations` is kept
as sent (the provider reads it); `cache_control` is accepted and dropped, as on every block.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
from typing import Any

from ctxlock.core import FrozenDict, freeze
from ctxlock.outside import join_path
from ctxlock.request._checks import as_array, as_object, as_str, fail, only_keys, part_type, required

__all__ = ["PDF_EXTRA", "document_part", "pdf_pages"]

PDF_EXTRA = "pip install 'ctxlock[pdf]' (pypdf)"


def pdf_pages(data: bytes, path: str) -> int:
    """The page count of a PDF, by pypdf; a RequestValidationError at `path` when the bytes are not a readable PDF."""
    if not data.startswith(b"%PDF-"):
        raise fail(path, "the data is not a PDF (no %PDF- header)", "send the PDF file's bytes, base64-encoded")
    try:
        from pypdf import PdfReader  # heavy third-party import, only when a PDF document arrives
    except ImportError:
        raise fail(path, "a PDF document needs pypdf to count its pages", PDF_EXTRA) from None
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        pages = len(reader.pages)
    except Exception as exc:
        raise fail(
            path, f"the PDF cannot be read: {type(exc).__name__}: {str(exc)[:200]}", "send a valid PDF"
        ) from None
    if pages < 1:
        raise fail(path, "the PDF has no pages", "send a PDF with at least one page")
    return pages


def _b64(data: str, path: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise fail(path, "the data is not valid base64", "send standard base64 (A-Z a-z 0-9 + /, = padding)") from None


def document_part(block: dict[str, Any], path: str) -> tuple[FrozenDict, dict[str, str]]:
    """(the canonical part, origins relative to the part: `.text`, `.chunks[c]`, `.title`, `.context`)."""
    only_keys(block, ("type", "source", "title", "context", "citations", "cache_control"), path, "a document block")
    spath = join_path(path, "source")
    source = as_object(required(block, "source", path, "a document source"), spath)
    kind = part_type(source, spath)
    part: dict[str, Any] = {"type": "document"}
    origins: dict[str, str] = {"": path}
    for key in ("title", "context"):
        if block.get(key) is not None:
            part[key] = as_str(block[key], join_path(path, key))
            origins[f".{key}"] = join_path(path, key)
    if kind == "base64":
        only_keys(source, ("type", "media_type", "data"), spath, "a base64 document source")
        media = as_str(required(source, "media_type", spath, "application/pdf"), f"{spath}.media_type")
        if media != "application/pdf":
            raise fail(
                f"{spath}.media_type",
                f"unsupported document media type {json.dumps(media)}",
                "allowed: application/pdf",
            )
        data = as_str(required(source, "data", spath, "the base64 PDF"), f"{spath}.data")
        raw = _b64(data, f"{spath}.data")
        part.update(
            source="pdf",
            media_type=media,
            sha256=hashlib.sha256(raw).hexdigest(),
            bytes=len(raw),
            pages=pdf_pages(raw, f"{spath}.data"),
            data=data,
        )
    elif kind == "text":
        only_keys(source, ("type", "media_type", "data"), spath, "a text document source")
        media = as_str(required(source, "media_type", spath, "text/plain"), f"{spath}.media_type")
        if media != "text/plain":
            raise fail(f"{spath}.media_type", f"unsupported text media type {json.dumps(media)}", "allowed: text/plain")
        text = as_str(required(source, "data", spath, "the document text"), f"{spath}.data")
        part.update(source="text", media_type=media, text=text)
        origins[".text"] = f"{spath}.data"
    elif kind == "content":
        only_keys(source, ("type", "content"), spath, "a content document source")
        cpath = f"{spath}.content"
        raw_content = required(source, "content", spath, "a string or an array of text blocks")
        items = (
            [{"type": "text", "text": raw_content}] if isinstance(raw_content, str) else as_array(raw_content, cpath)
        )
        chunks = []
        origins[".chunks"] = cpath
        for c, item in enumerate(items):
            ipath = cpath if isinstance(raw_content, str) else f"{cpath}[{c}]"
            item = as_object(item, ipath, "a text block")
            if part_type(item, ipath) != "text":
                raise fail(f"{ipath}.type", "only text blocks are supported inside a document", "send text blocks")
            only_keys(item, ("type", "text", "cache_control"), ipath, "a text block")
            chunks.append(
                as_str(required(item, "text", ipath, "the text"), f"{ipath}.text" if ipath != cpath else ipath)
            )
            origins[f".chunks[{c}]"] = f"{ipath}.text" if ipath != cpath else ipath
        part.update(source="content", chunks=tuple(chunks))
    elif kind in ("url", "file"):
        raise fail(
            f"{spath}.type",
            f"a {kind} document source: ctxlock never fetches",
            "send the document's bytes as a base64 source (PDF) or its text as a text source",
        )
    else:
        raise fail(
            f"{spath}.type", f"unsupported document source type {json.dumps(kind)}", "allowed: base64, text, content"
        )
    if block.get("citations") is not None:
        part["citations"] = as_object(block["citations"], join_path(path, "citations"), 'an object {"enabled": bool}')
    return freeze(part), origins
