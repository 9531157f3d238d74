"""The declared tools: each tool's JSON Schema, checked against its metaschema once and compiled to a validator
(memoized in the cache registry as `toolcalls.validator`), and where a schema violation lies in the arguments."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxlock import caches
from ctxlock.core import thaw
from ctxlock.errors import ToolCallError
from ctxlock.request import Request, join_path

if TYPE_CHECKING:
    import jsonschema.exceptions


def _jsonschema() -> Any:
    """jsonschema, imported on first use (about 50 ms at start-up, which commands without tools never need)."""
    import jsonschema
    import jsonschema.exceptions
    import jsonschema.validators

    return jsonschema


@dataclass(frozen=True)
class Tool:
    name: str
    schema: dict[str, Any]
    validator: Any  # a jsonschema Validator instance
    path: str  # where the schema came from: tools[i].function.parameters


def _tool_list(tools: Request | Iterable[Mapping[str, Any]] | None) -> list[Any]:
    if tools is None:
        return []
    if isinstance(tools, Request):
        return tools.template_tools() or []
    if isinstance(tools, (Mapping, str | bytes)):
        raise ToolCallError(
            "tools must be a list of tool objects", path="tools", hint='pass [{"type": "function", "function": {...}}]'
        )
    return [thaw(t) for t in tools]


def compile_tools(tools: Request | Iterable[Mapping[str, Any]] | None) -> dict[str, Tool]:
    out: dict[str, Tool] = {}
    for k, tool in enumerate(_tool_list(tools)):
        path = f"tools[{k}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise ToolCallError(
                "a tool must be an object with a function object",
                path=path,
                hint='pass {"type": "function", "function": {"name": ..., "parameters": {...}}}',
            )
        if tool.get("type", "function") != "function":
            raise ToolCallError(f"unsupported tool type {tool['type']!r}", path=f"{path}.type", hint='use "function"')
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ToolCallError("a tool needs a non-empty name", path=f"{path}.function.name", hint="name the tool")
        if name in out:
            raise ToolCallError(
                f"duplicate tool name {name!r}", path=f"{path}.function.name", hint="give every tool its own name"
            )
        spath = f"{path}.function.parameters"
        # OpenAI: omitting `parameters` declares a function without parameters; its arguments are still an object.
        schema = fn.get("parameters")
        schema = {"type": "object"} if schema is None else schema
        out[name] = Tool(name=name, schema=schema, validator=_validator(schema, spath), path=spath)
    return out


def _validator(schema: Any, path: str) -> Any:
    if not isinstance(schema, dict | bool):
        raise ToolCallError("a tool's parameters must be a JSON Schema object", path=path, hint="pass a JSON Schema")
    try:
        key = json.dumps(schema, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ToolCallError(f"the schema is not JSON: {exc}", path=path, hint="pass plain JSON values") from None
    js = _jsonschema()
    try:
        return _checked_validator(key)
    except _UnknownDialect as exc:
        raise ToolCallError(
            f"unknown $schema {exc.args[0]!r}",
            path=f"{path}.$schema",
            hint="use a JSON Schema draft jsonschema knows (draft 4, 6, 7, 2019-09, 2020-12) or omit $schema",
        ) from None
    except js.exceptions.SchemaError as exc:
        where = path + exc.json_path[1:] if exc.json_path.startswith("$") else path
        draft = js.validators.validator_for(schema, default=js.Draft202012Validator).__name__.removesuffix("Validator")
        raise ToolCallError(
            f"not a valid JSON Schema: {exc.message}",
            path=where,
            hint=f"fix the schema so it validates against the {draft} metaschema",
        ) from None


class _UnknownDialect(Exception):
    pass


@caches.memoize("toolcalls.validator", 256)
def _checked_validator(key: str) -> Any:
    """A validator for one schema (canonical JSON), metaschema-checked once: a server builds an assembler per
    request with the same tools, and check_schema costs far more than assembling a call."""
    schema = json.loads(key)  # a private copy: the caller may mutate theirs
    js = _jsonschema()
    validator_for = js.validators.validator_for
    if isinstance(schema, dict) and "$schema" in schema and validator_for(schema, default=None) is None:
        raise _UnknownDialect(schema["$schema"])
    cls = validator_for(schema, default=js.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def arguments_path(index: int, keys: Iterable[str | int] = ()) -> str:
    path = f"tool_calls[{index}].arguments"
    for key in keys:
        path = join_path(path, key)
    return path


def violation_keys(error: jsonschema.exceptions.ValidationError) -> list[str | int]:
    """The path of the offending value; for `required`/`additionalProperties` it names the property itself."""
    keys: list[str | int] = list(error.absolute_path)
    instance = error.instance
    if isinstance(instance, dict):
        if error.validator == "required":
            missing = [p for p in error.validator_value if p not in instance and repr(p) in error.message]
            if missing:
                keys.append(missing[0])
        elif error.validator in ("additionalProperties", "unevaluatedProperties"):
            declared = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
            extra = [p for p in instance if p not in declared and repr(p) in error.message]
            if extra:
                keys.append(extra[0])
    return keys


def document_position(arguments: Any, keys: Sequence[str | int]) -> tuple[int, ...]:
    """Where a path lies in the arguments as written (object key order); a missing property sorts last."""
    position: list[int] = []
    node = arguments
    for key in keys:
        if isinstance(node, dict) and key in node:
            position.append(list(node).index(key))
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            position.append(key)
            node = node[key]
        else:
            position.append(1 << 30)
            break
    return tuple(position)
