"""The DSML markup DeepSeek-V3.2 (`deepseek_v32`) and DeepSeek-V4 (`deepseek_v4`) share: `｜DSML｜` (fullwidth bars)
in every tag, a block of invokes whose parameters are raw text (`string="true"`) or JSON (`string="false"`).

    <｜DSML｜BLOCK>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="P" string="true">raw text</｜DSML｜parameter>
    <｜DSML｜parameter name="Q" string="false">JSON</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜BLOCK>

BLOCK is `function_calls` for V3.2 and `tool_calls` for V4 (vllm/tool_parsers/deepseekv4_tool_parser.py keeps the
V3.2 grammar and changes only the block's markers). A call is complete when `</｜DSML｜invoke>` is seen (values are
raw text: there is no JSON string to be inside). Each value is turned into the type its property's schema declares
(`coerce_parameter`, as for qwen3_coder); without a typed property, a `string="false"` value is parsed as JSON and a
`string="true"` one stays text, as the templates write them."""

from __future__ import annotations

import re
from typing import Any

from ctxlock.generation.toolcalls._coerce import coerce_parameter
from ctxlock.generation.toolcalls._jsontext import dumps_arguments, loads_object
from ctxlock.generation.toolcalls._schemas import arguments_path
from ctxlock.generation.toolcalls._sectioned import SectionedParser

DSML = "｜DSML｜"
INVOKE = f"<{DSML}invoke"
INVOKE_END = f"</{DSML}invoke>"
PARAMETER_END = f"</{DSML}parameter>"
_NAME = re.compile(r'\s+name="([^"]*)"\s*>')
_PARAMETER = re.compile(rf'<{DSML}parameter\s+name="([^"]*)"(?:\s+string="(true|false)")?\s*>')
_TYPED = ("type", "anyOf", "oneOf", "enum", "const")


class DsmlParser(SectionedParser):
    """Body: ` name="NAME">` then `<｜DSML｜parameter name="P" string="true|false">value</｜DSML｜parameter>`;
    subclasses set the block's markers (`section_begin`, `section_end`)."""

    call_begin = INVOKE
    call_end = INVOKE_END
    json_body = False
    example = f'{INVOKE} name="NAME"><{DSML}parameter name="P" string="true">value{PARAMETER_END}{INVOKE_END}'

    def _close(self, body: str) -> None:
        index = self.index
        m = _NAME.match(body)
        if m is None:
            self._fail(f'expected name="NAME"> after {INVOKE}', None, f"tool_calls[{index}].name")
            return
        name = m.group(1).strip()
        args = self._parameters(name, body, m.end())
        if args is None:
            return
        raw, problem = dumps_arguments(args)
        if problem is not None:
            self._fail(f"arguments are not valid JSON: {problem}", name, f"tool_calls[{index}].arguments")
            return
        self.sink.complete(index, None, name, args, raw, f"tool_calls[{index}].name")

    def _parameters(self, name: str, body: str, pos: int) -> dict[str, Any] | None:
        """The call's parameters, converted by the tool's schema; None once a problem is reported."""
        schema = self.sink.tool_schema(name)
        properties = schema.get("properties") if isinstance(schema, dict) else None
        properties = properties if isinstance(properties, dict) else {}
        args: dict[str, Any] = {}
        while True:
            while pos < len(body) and body[pos].isspace():
                pos += 1
            if pos == len(body):
                return args
            p = _PARAMETER.match(body, pos)
            if p is None:
                self._fail(f"unexpected {body[pos : pos + 40]!r} in the call", name, f"tool_calls[{self.index}]")
                return None
            pname, string = p.group(1), p.group(2)
            end = body.find(PARAMETER_END, p.end())
            if end < 0:
                self._fail(f"parameter {pname!r} is not closed", name, arguments_path(self.index, [pname]))
                return None
            if pname in args:
                self._fail(f"parameter {pname!r} is given twice", name, arguments_path(self.index, [pname]))
                return None
            args[pname] = _value(body[p.end() : end], string, properties.get(pname))
            pos = end + len(PARAMETER_END)

    def _fail(self, message: str, name: str | None, path: str) -> None:
        self.sink.fail(self.index, None, name, message, path=path, hint=f"write {self.example}")


def _value(text: str, string: str | None, schema: Any) -> Any:
    """A parameter's value: by its property's type when the schema gives one, else by the `string` attribute."""
    if isinstance(schema, dict) and any(k in schema for k in _TYPED):
        return coerce_parameter(text, schema)
    if string == "true":
        return text
    value, problem = loads_object(text.strip())
    return text if problem is not None else value
