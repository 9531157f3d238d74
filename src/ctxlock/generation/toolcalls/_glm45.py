"""Wire format `glm45` (GLM-4.5, GLM-4.6, GLM-4.7): `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...
</tool_call>`, GLM-4.5/4.6 with a newline after the name and after each tag (templates GLM-4.6.jinja), GLM-4.7 with
none (GLM-4.7-Flash.jinja). The framing is hermes' (`TaggedParser`); a call is complete when `</tool_call>` is seen
outside an `<arg_value>` (the templates write values raw, so a value may hold `</tool_call>`).

Values are text: the templates write a string as it is and anything else with `tojson`. As vLLM's parser does
(vllm/tool_parsers/glm4_moe_tool_parser.py), a value whose schema type is `string` is kept as written, a typed one
is converted by its schema (`coerce_parameter`), and an untyped one (the tool or the property is not declared) is
decoded as JSON (or a Python literal) when it is one, else kept as text with its surrounding whitespace stripped."""

from __future__ import annotations

import ast
import re
from typing import Any

from ctxlock.generation.toolcalls._coerce import coerce_parameter
from ctxlock.generation.toolcalls._jsontext import dumps_arguments, loads_object
from ctxlock.generation.toolcalls._schemas import arguments_path
from ctxlock.generation.toolcalls._tagged import TaggedParser

_NAME = re.compile(r"[^\n<]*")
_PAIR = re.compile(r"\s*<arg_key>([^<]*)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_VALUE_TAG = re.compile(r"</?arg_value>")
_TAIL = len("</arg_value>") - 1
_HINT = "write <tool_call>name<arg_key>key</arg_key><arg_value>value</arg_value></tool_call>"
_TYPE_KEYS = ("type", "anyOf", "oneOf", "allOf", "enum", "const", "$ref")


class Glm45Parser(TaggedParser):
    """A `<tool_call>` body: the function name, then `<arg_key>K</arg_key><arg_value>V</arg_value>` per argument."""

    def _start_body(self) -> None:
        self.in_value = False
        self.tail = ""  # the last characters fed, which may hold the start of a value tag

    def _body(self, text: str) -> None:
        if not text:
            return
        self.parts.append(text)
        window = self.tail + text
        for m in _VALUE_TAG.finditer(window):
            if m.end() > len(self.tail):  # a tag wholly inside the tail was seen with the text before
                self.in_value = m.group() == "<arg_value>"
        self.tail = window[-_TAIL:]

    def _closes_here(self) -> bool:
        return not self.in_value

    def _close(self, body: str) -> None:
        index = self.index
        path = f"tool_calls[{index}]"
        m = _NAME.match(body)
        name = m.group().strip() if m is not None else ""
        if not name:
            self.sink.fail(
                index, None, None, "expected the function name after <tool_call>", path=f"{path}.name", hint=_HINT
            )
            return
        args = self._arguments(index, name, body[m.end() if m is not None else 0 :])
        if args is None:
            return
        raw, problem = dumps_arguments(args)
        if problem is not None:
            self.sink.fail(
                index,
                None,
                name,
                f"arguments are not valid JSON: {problem}",
                path=f"{path}.arguments",
                hint="write each argument value as valid Unicode text",
            )
            return
        self.sink.complete(index, None, name, args, raw, f"{path}.name")

    def _arguments(self, index: int, name: str, rest: str) -> dict[str, Any] | None:
        """The `<arg_key>`/`<arg_value>` pairs, converted by the tool's schema; None once a problem is reported."""
        schema = self.sink.tool_schema(name)
        properties = schema.get("properties") if isinstance(schema, dict) else None
        properties = properties if isinstance(properties, dict) else {}
        args: dict[str, Any] = {}
        pos = 0
        while True:
            m = _PAIR.match(rest, pos)
            if m is None:
                break
            key = m.group(1).strip()
            if key in args:
                self.sink.fail(
                    index,
                    None,
                    name,
                    f"argument {key!r} is given twice",
                    path=arguments_path(index, [key]),
                    hint="give each argument once",
                )
                return None
            args[key] = glm_value(m.group(2), properties.get(key))
            pos = m.end()
        if rest[pos:].strip():
            self.sink.fail(
                index,
                None,
                name,
                f"expected <arg_key>...</arg_key><arg_value>...</arg_value>, got {rest[pos:].strip()[:40]!r}",
                path=f"tool_calls[{index}].arguments",
                hint=_HINT,
            )
            return None
        return args


def glm_value(value: str, schema: Any) -> Any:
    """A GLM argument value: converted by its property schema when it has a type, else decoded as vLLM does."""
    if isinstance(schema, dict) and any(k in schema for k in _TYPE_KEYS):
        return coerce_parameter(value, schema)
    text = value.strip()
    decoded, problem = loads_object(text)
    if problem is None:
        return decoded
    try:
        literal = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return literal if isinstance(literal, str | int | float | bool | list | dict) or literal is None else text
