"""Text back to the type a tool's JSON Schema declares: what the formats that write each argument as text need
(`qwen3_coder`'s `<parameter=P>`, `deepseek_v32`'s DSML `<｜DSML｜parameter>`). Moved out of `_qwen3_coder.py` so the
formats stay independent of each other."""

from __future__ import annotations

import ast
from typing import Any

from ctxlock.errors import ToolCallError
from ctxlock.generation.toolcalls._jsontext import loads_object
from ctxlock.outside import SYNTAX_ERROR, loads_outside


def _schema_types(schema: Any) -> list[str]:
    """The JSON types a property schema allows: `type` (string or list), else the union of anyOf/oneOf branches."""
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or []:
            out += [k for k in _schema_types(branch) if k not in out]
    if not out and "enum" in schema:
        out = sorted({_json_kind(v) for v in schema["enum"]})
    if not out and "const" in schema:
        out = [_json_kind(schema["const"])]
    return out


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


_NOT_CONVERTED = object()


def coerce_parameter(value: str, schema: Any) -> Any:
    """Turn a Qwen3-Coder parameter's text into the type its schema declares.

    A value that does not convert stays a string, so schema validation then names the parameter and says what
    was expected (vLLM instead degrades silently, e.g. a non-boolean becomes False). A parameter the schema does
    not type (or declare) stays a string, as in vLLM.
    """
    types = _schema_types(schema)
    if not types or types == ["string"]:
        return value
    text = value.strip()
    if ("null" in types or "string" not in types) and text.lower() in ("null", "none"):
        return None
    for kind in types:
        converted = _convert(text, kind)
        if converted is not _NOT_CONVERTED:
            return converted
    return value


def _convert(text: str, kind: str) -> Any:
    if kind == "boolean":
        lowered = text.lower()
        return True if lowered == "true" else False if lowered == "false" else _NOT_CONVERTED
    if kind in ("integer", "number"):
        number, problem = loads_object(text)
        if problem is not None:
            return _NOT_CONVERTED
        if isinstance(number, bool) or not isinstance(number, int | float):
            return _NOT_CONVERTED
        if kind == "integer" and isinstance(number, float) and not number.is_integer():
            return _NOT_CONVERTED
        return number
    if kind in ("object", "array"):
        want = dict if kind == "object" else list
        parsed, problem = loads_object(text)
        if problem is not None:
            try:
                loads_outside(text, "parameter $", error=ToolCallError)
            except ToolCallError as exc:
                if not exc.message.startswith(SYNTAX_ERROR):  # JSON, but deep, too long a number, NaN, a duplicate
                    return _NOT_CONVERTED
            else:
                return _NOT_CONVERTED  # JSON that RFC 8259 refuses (`loads_object`): NaN, a duplicate key, a surrogate
            # The template writes mappings with tojson, but models also write Python literals ({'a': 1}, True).
            try:
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return _NOT_CONVERTED
        return parsed if isinstance(parsed, want) else _NOT_CONVERTED
    return _NOT_CONVERTED
