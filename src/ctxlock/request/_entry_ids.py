"""Entry ids a caller attaches to messages (`{"id": "e01", "role": "user", ...}`: the session entry ids of Pi
(github.com/badlogic/pi-mono), which no chat API sends): read and removed before the request is parsed, by the CLI's
`compact-plan` and by Python's `plan_compaction` alike, so that both take the same requests (docs: README,
"compact-plan")."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ctxlock.errors import BudgetError, CtxlockError, RequestError
from ctxlock.outside import loads_outside

MAX_ENTRY_ID_CHARS = 512


def strip_entry_ids(raw: Any) -> tuple[Any, dict[int, str]]:
    """(the request without its messages' `id` keys, the ids by message index as sent). A request without ids, or
    not an object with a list of messages, comes back as it is (the same object); one with ids is a shallow copy
    (the caller's object is not changed). An id that is not a non-empty string of at most 512 characters is a
    `BudgetError` at its JSON path."""
    messages = raw.get("messages") if isinstance(raw, Mapping) else None
    if not isinstance(messages, list | tuple) or not any(isinstance(m, Mapping) and "id" in m for m in messages):
        return raw, {}
    ids: dict[int, str] = {}
    stripped = []
    for k, m in enumerate(messages):
        if isinstance(m, Mapping) and "id" in m:
            value = m["id"]
            if not isinstance(value, str) or not value or len(value) > MAX_ENTRY_ID_CHARS:
                raise BudgetError(
                    f"an entry id must be a non-empty string of at most {MAX_ENTRY_ID_CHARS} characters",
                    path=f"messages[{k}].id",
                    hint="give each message the id of its session entry, or no id",
                )
            ids[k] = value
            m = {key: v for key, v in m.items() if key != "id"}
        stripped.append(m)
    return {**raw, "messages": stripped}, ids


def take_entry_ids(data: bytes | str) -> tuple[bytes | str, dict[int, str]]:
    """`strip_entry_ids` of request bytes (or text): the bytes re-serialized without the ids, or unchanged when
    there are none (or when they are not JSON: the request parser then reports what is wrong with them)."""
    try:  # any doubt (not JSON, duplicate keys, NaN, too deep): the bytes as they are, for the request parser
        raw = loads_outside(data, "request $", error=RequestError)
    except CtxlockError:
        return data, {}
    stripped, ids = strip_entry_ids(raw)
    if not ids:
        return data, {}
    text = json.dumps(stripped, ensure_ascii=False)
    return (text.encode("utf-8") if isinstance(data, bytes | bytearray) else text), ids


def without_entry_ids(request: Any) -> Any:
    """The request (bytes, text or a mapping; a parsed `Request` as it is) without its messages' entry ids."""
    if isinstance(request, bytearray):
        request = bytes(request)
    if isinstance(request, bytes | str):
        return take_entry_ids(request)[0]
    return strip_entry_ids(request)[0]
