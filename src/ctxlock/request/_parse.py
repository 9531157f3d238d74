"""The request stage: bytes, str or Mapping -> canonical frozen `Request` (`parse_request`).

The reference algorithm, in order: serialize a Mapping to compact JSON, encode a str as UTF-8, hash the bytes,
decode them under the UTF-8 policy, read the JSON strictly (`jsonread`), detect the dialect and build the
Request (`build`, with the `openai` or `anthropic` module). A Mapping may first be answered by the request memo
(`_memo.lookup_or_parse`, a fast path: the same Request, field for field), unless the fast paths are off.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ctxlock.errors import RequestJSONError, RequestValidationError
from ctxlock.outside import byte_offset, decode_bytes, loads_strict, to_plain
from ctxlock.request import _memo
from ctxlock.request._build import build_request, detect
from ctxlock.request._checks import fail, json_type_name
from ctxlock.request._values import Dialect, Request, ToolArguments, Utf8Policy
from ctxlock.settings import call_fast, fast_enabled

_UTF8_BOM = b"\xef\xbb\xbf"


# Each member by (enum, value): what `enum(value)` looks up first (its value-to-member dict), without the call.
_MEMBERS: dict[tuple[type, Any], Any] = {(type(m), m.value): m for e in (Dialect, Utf8Policy, ToolArguments) for m in e}


def _coerce(enum: type[Dialect] | type[Utf8Policy] | type[ToolArguments], value: Any, arg: str) -> Any:
    try:
        return _MEMBERS[enum, value]
    except (KeyError, TypeError):  # not a member's value, or unhashable: the enum says which (or raises)
        pass
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(repr(e.value) for e in enum)
        raise RequestValidationError(f"unknown {arg} {value!r}", path=arg, hint=f"use one of {allowed}") from None


def _as_bytes(data: Any, forced: Dialect | None, policy: Utf8Policy, as_sent: bool) -> bytes | Request:
    """The bytes `parse_request` parses, or the memo's Request for a Mapping."""
    if isinstance(data, Mapping):
        if fast_enabled() and not as_sent:  # the memo (a fast path) keeps parsed arguments only
            fast = _memo.lookup_or_parse(data, forced, policy)
            if fast is not None:
                return fast
        # NaN stays NaN here (allow_nan) so the parser reports it with its JSON path.
        data = json.dumps(to_plain(data, "$"), ensure_ascii=False, separators=(",", ":"))
    if isinstance(data, str):
        # surrogatepass: a lone surrogate in the str becomes invalid UTF-8 and is reported like a bad byte.
        data = data.encode("utf-8", "surrogatepass")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise RequestValidationError(
            f"cannot parse a {type(data).__name__}", path="$", hint="pass bytes, a str or a mapping"
        )
    return bytes(data)


def parse_request(
    data: bytes | str | Mapping[str, Any],
    *,
    dialect: Dialect | str | None = None,
    utf8: Utf8Policy | str = Utf8Policy.STRICT,
    tool_arguments: ToolArguments | str = ToolArguments.PARSED,
) -> Request:
    """Decode, parse and validate a chat request into its canonical frozen form.

    `dialect=None` detects the dialect (Anthropic if anything only Anthropic has is present, else OpenAI); an
    explicit dialect wins. `tool_arguments` says what an OpenAI tool call's string `arguments` becomes: the parsed
    object (`"parsed"`, the default, as vLLM renders it) or the string as sent (`"as-sent"`, as transformers renders
    it); either way it must hold a JSON object. A str is encoded as UTF-8 first, and a Mapping serialized to compact
    JSON first, so every input goes through the same checks and `source_sha256` is always the digest of the bytes
    parsed.
    """
    policy: Utf8Policy = _coerce(Utf8Policy, utf8, "utf8")
    forced: Dialect | None = None if dialect is None else _coerce(Dialect, dialect, "dialect")
    as_sent = _coerce(ToolArguments, tool_arguments, "tool_arguments") is ToolArguments.AS_SENT
    if fast_enabled():  # the setting read once: the stages ask again, cheaply, inside `call_fast`
        return call_fast(_parse, data, forced, policy, as_sent)
    return _parse(data, forced, policy, as_sent)


def _parse(data: Any, forced: Dialect | None, policy: Utf8Policy, as_sent: bool) -> Request:
    """`parse_request` once its options are checked (the reference algorithm, module docstring)."""
    if type(data) is not bytes:  # (bytes, what a batch row is, pass none of these checks)
        data = _as_bytes(data, forced, policy, as_sent)
        if isinstance(data, Request):
            return data
    sha = hashlib.sha256(data).hexdigest()

    text, runs = decode_bytes(data, policy)
    # A leading UTF-8 BOM is stripped, not rejected: RFC 8259 section 8.1 lets parsers ignore it, and it carries
    # no content. It is still part of the hashed bytes (source_sha256), so a record keeps it, and byte offsets in
    # errors and replaced_bytes count from the very first byte of the input, BOM included.
    bom_chars = 1 if data.startswith(_UTF8_BOM) else 0

    try:
        obj = loads_strict(text[bom_chars:], "$", policy, source=data)
    except json.JSONDecodeError as exc:
        byte = byte_offset(data, runs, text, exc.pos + bom_chars)
        raise RequestJSONError(
            f"invalid JSON: {exc.msg}",
            path=f"line {exc.lineno} column {exc.colno} (byte {byte})",
            hint="fix the JSON syntax at that position",
        ) from None
    if not isinstance(obj, dict):
        raise fail(
            "$",
            f"the request must be a JSON object, got {json_type_name(obj)}",
            'send an object such as {"messages": [...]}',
        )
    return build_request(obj, forced or detect(obj), sha, policy, runs, as_sent=as_sent)
