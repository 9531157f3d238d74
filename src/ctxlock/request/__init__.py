"""Request stage: bytes -> canonical frozen `Request`.

A pure stage (no I/O). The input is decoded under a UTF-8 policy, parsed with the stdlib JSON parser (duplicate
keys, NaN and Infinity rejected), validated in one of two dialects (OpenAI Chat Completions or Anthropic
Messages) and normalized to one canonical form, so the same conversation gives `==` Requests whatever dialect
it came in. Every error is a `RequestError` subclass whose `path` names the location: `byte N` for encoding,
`line L column C (byte B)` for JSON syntax, or a JSON path such as `messages[3].tool_calls[0].function.arguments`.

The package, one job per module: `values` (the frozen Request, Message and ToolCall, and the enums), `checks`
(validation helpers), `openai` and `anthropic` (one module per dialect), `build` (dialect detection and the
Request), `parse` (`parse_request`, the stage), `_memo` (the request memo, a fast path: a Mapping in the OpenAI
dialect is parsed incrementally across calls, and the Request is the reference path's in every field, errors
included) and `_canonical` (a fast path: `Request.to_json()` and `Request.json_sha256()` from the canonical text
written piece by piece, the same text). `CTXLOCK_FAST=0` and `reference_path()` turn the fast paths off;
`clear_request_memo()` or `ctxlock.caches.clear_caches()` empties the memo. JSON paths are `ctxlock.outside` and
the strict JSON reader `ctxlock.outside`: below this package, so that every reader of outside JSON (`ctxlock.economics`
too) can use it.
"""

from __future__ import annotations

from ctxlock.outside import MAX_JSON_DEPTH, decode_bytes, join_path
from ctxlock.request._checks import json_type_name
from ctxlock.request._entry_ids import without_entry_ids
from ctxlock.request._memo import clear_request_memo
from ctxlock.request._parse import parse_request
from ctxlock.request._values import (
    NO_ORIGINS,
    RESERVED_TEMPLATE_KWARGS,
    Dialect,
    Message,
    Request,
    ToolArguments,
    ToolCall,
    Utf8Policy,
)

__all__ = [
    "MAX_JSON_DEPTH",
    "NO_ORIGINS",
    "RESERVED_TEMPLATE_KWARGS",
    "Dialect",
    "Message",
    "Request",
    "ToolArguments",
    "ToolCall",
    "Utf8Policy",
    "clear_request_memo",
    "decode_bytes",
    "join_path",
    "json_type_name",
    "parse_request",
    "without_entry_ids",
]
