"""Wire format `minicpm5` (MiniCPM5; template openbmb-MiniCPM5-1B.jinja): text, then calls written as

    <function name="get_weather"><param name="city">Paris</param><param name="days">3</param></function>

one element per call, with no wrapper around them (vLLM's vllm/tool_parsers/minicpm5xml_tool_parser.py reads the
same form). A call is complete when `</function>` is seen outside a `<![CDATA[` ... `]]>` section: the template wraps
a value holding `<`, `&` or a newline in CDATA and writes every other value as it is (Python's `True`, `[1, 2]`,
`{'a': 1}` for non-strings), so a value is unwrapped from its CDATA and converted by the tool's schema
(`coerce_parameter`). The framing is `TaggedParser`'s with `<function` as the opening marker.

What vLLM repairs is refused here with an error naming the call: a tag the tokenizer mangled
(`<function\\u0120name=`, `<functionname=`), a `<param>` without a name, a parameter given twice."""

from __future__ import annotations

import re
from typing import Any

from ctxlock.generation.toolcalls._coerce import coerce_parameter
from ctxlock.generation.toolcalls._jsontext import dumps_arguments
from ctxlock.generation.toolcalls._schemas import arguments_path
from ctxlock.generation.toolcalls._tagged import TaggedParser

_NAME = r"""name=(?:"([^"]*)"|'([^']*)')\s*>"""
_HEAD = re.compile(r"[ \t\r\n]+" + _NAME)
_PARAM = re.compile(r"\s*<param[ \t\r\n]+" + _NAME + r"(?:<!\[CDATA\[(.*?)\]\]>|(.*?))</param>", re.DOTALL)
_CDATA_TAG = re.compile(r"<!\[CDATA\[|\]\]>")
_TAIL = len("<![CDATA[") - 1
_HINT = 'write <function name="f"><param name="p">value</param></function>'


def _name(m: re.Match[str]) -> str:
    return m.group(1) if m.group(1) is not None else m.group(2)


class MiniCPM5Parser(TaggedParser):
    """`<function name=...>` ... `</function>`, with `<param name=...>` elements as the arguments."""

    open_marker = "<function"
    close_marker = "</function>"

    def _start_body(self) -> None:
        self.in_cdata = False
        self.tail = ""  # the last characters fed, which may hold the start of a CDATA tag

    def _body(self, text: str) -> None:
        if not text:
            return
        self.parts.append(text)
        window = self.tail + text
        for m in _CDATA_TAG.finditer(window):
            if m.end() > len(self.tail):  # a tag wholly inside the tail was seen with the text before
                self.in_cdata = m.group() == "<![CDATA["
        self.tail = window[-_TAIL:]

    def _closes_here(self) -> bool:
        return not self.in_cdata

    def _close(self, body: str) -> None:
        index = self.index
        path = f"tool_calls[{index}]"
        m = _HEAD.match(body)
        if m is None or not _name(m).strip():
            got = ("<function" + body)[:40]
            self.sink.fail(
                index, None, None, f'expected <function name="...">, got {got!r}', path=f"{path}.name", hint=_HINT
            )
            return
        name = _name(m).strip()
        args = self._params(index, name, body[m.end() :])
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
                hint="write each parameter value as valid Unicode text",
            )
            return
        self.sink.complete(index, None, name, args, raw, f"{path}.name")

    def _params(self, index: int, name: str, rest: str) -> dict[str, Any] | None:
        """The `<param name=...>` values, converted by the tool's schema; None once a problem is reported."""
        schema = self.sink.tool_schema(name)
        properties = schema.get("properties") if isinstance(schema, dict) else None
        properties = properties if isinstance(properties, dict) else {}
        args: dict[str, Any] = {}
        pos = 0
        while (p := _PARAM.match(rest, pos)) is not None:
            key = _name(p)
            if key in args:
                self._fail(index, name, [key], f"parameter {key!r} is given twice", "give each parameter once")
                return None
            value = p.group(3) if p.group(3) is not None else p.group(4)
            args[key] = coerce_parameter(value, properties.get(key))
            pos = p.end()
        if rest[pos:].strip():
            self._fail(index, name, [], f"expected <param name=...>, got {rest[pos:].strip()[:40]!r}", _HINT)
            return None
        return args

    def _fail(self, index: int, name: str, keys: list[str], message: str, hint: str) -> None:
        self.sink.fail(index, None, name, message, path=arguments_path(index, keys), hint=hint)
