"""Validation helpers both dialects share: each checks one JSON value and raises a `RequestValidationError`
naming its path and a hint (`as_object`, `as_array`, `as_str`, `required`, `only_keys`, ...).
"""

from __future__ import annotations

import json
from typing import Any

from ctxlock.core import FrozenDict
from ctxlock.errors import RequestValidationError
from ctxlock.outside import join_path


def fail(path: str, message: str, hint: str) -> RequestValidationError:
    return RequestValidationError(message, path=path, hint=hint)


def json_type_name(value: Any) -> str:
    """How an error message names the JSON type of a parsed value: "null", "a string", "an object", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def as_object(value: Any, path: str, what: str = "an object") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail(path, f"expected {what}, got {json_type_name(value)}", f"send {what} here")
    return value


def as_array(value: Any, path: str, what: str = "an array") -> list[Any]:
    if not isinstance(value, list):
        raise fail(path, f"expected {what}, got {json_type_name(value)}", f"send {what} here")
    return value


def as_str(value: Any, path: str, *, nonempty: bool = False) -> str:
    if not isinstance(value, str):
        raise fail(path, f"expected a string, got {json_type_name(value)}", "send a JSON string here")
    if nonempty and not value:
        raise fail(path, "must not be empty", "send a non-empty string")
    return value


def opt_str(obj: dict[str, Any], key: str, path: str) -> str | None:
    value = obj.get(key)
    return None if value is None else as_str(value, join_path(path, key))


def required(obj: dict[str, Any], key: str, path: str, what: str) -> Any:
    if obj.get(key) is None:
        raise fail(join_path(path, key), f"{key} is required", f"send {what}")
    return obj[key]


def only_keys(obj: dict[str, Any], allowed: tuple[str, ...], path: str, what: str) -> None:
    """Reject unknown keys (like pydantic extra="forbid"): a key ctxlock ignores would be silently lost."""
    for key in obj:
        if key not in allowed:
            raise fail(
                join_path(path, key),
                f"unknown key {json.dumps(key, ensure_ascii=False)} in {what}",
                f"allowed keys: {', '.join(allowed)}",
            )


def part_type(block: dict[str, Any], path: str) -> str:
    return as_str(required(block, "type", path, 'a "type"'), join_path(path, "type"))


def text_part(text: str) -> FrozenDict:
    return FrozenDict((("type", "text"), ("text", text)))


def image_part(url: str, detail: str | None = None) -> FrozenDict:
    pairs: tuple[tuple[str, str], ...] = (("type", "image"), ("url", url))
    return FrozenDict((*pairs, ("detail", detail)) if detail is not None else pairs)


def no_tool_call(tool_call_id: str, seen: set[str], path: str, noun: str) -> RequestValidationError:
    return fail(
        path,
        f"no earlier assistant tool call has id {json.dumps(tool_call_id, ensure_ascii=False)}",
        f"a {noun} must answer a tool call made in an earlier assistant message"
        + (f" (known ids: {', '.join(sorted(seen)[:10])})" if seen else ""),
    )


def check_tool_function(fn: dict[str, Any], path: str, *, schema_key: str = "parameters") -> None:
    as_str(required(fn, "name", path, "the tool name"), join_path(path, "name"), nonempty=True)
    opt_str(fn, "description", path)
    if fn.get(schema_key) is not None:
        as_object(fn[schema_key], join_path(path, schema_key), "a JSON schema object")
    if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
        raise fail(join_path(path, "strict"), "strict must be a boolean", "send true or false")
