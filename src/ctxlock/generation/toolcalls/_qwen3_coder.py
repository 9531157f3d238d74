"""Wire format `qwen3_coder` (Qwen3-Coder, Qwen3.5): `<tool_call><function=NAME><parameter=P>value</parameter>...
</function></tool_call>`. The framing is hermes' (`TaggedParser`); a call is complete when `</tool_call>` is seen.
Parameter values are text, turned back into the type the tool's schema declares (`coerce_parameter`)."""

from __future__ import annotations

import re
from typing import Any

from ctxlock.generation.toolcalls._coerce import coerce_parameter
from ctxlock.generation.toolcalls._jsontext import dumps_arguments
from ctxlock.generation.toolcalls._schemas import arguments_path
from ctxlock.generation.toolcalls._tagged import TaggedParser

# Qwen3-Coder's XML-ish call. The template writes each value with `| string` (so Python's True/None) unless it is
# a mapping or a list (then `tojson`); the schema says which type to turn the text back into.
_FUNCTION_OPEN = re.compile(r"\s*<function=([^>\n]*)>")
_PARAMETER_OPEN = re.compile(r"<parameter=([^>\n]*)>")
_FUNCTION_CLOSE = "</function>"
_PARAMETER_CLOSE = "</parameter>"


class Qwen3CoderParser(TaggedParser):
    """A `<tool_call>` body: `<function=NAME>`, then `<parameter=P>value</parameter>` per argument."""

    def _close(self, body: str) -> None:
        index = self.index
        path = f"tool_calls[{index}]"
        m = _FUNCTION_OPEN.match(body)
        if m is None:
            self.sink.fail(
                index,
                None,
                None,
                "expected <function=NAME> after <tool_call>",
                path=f"{path}.name",
                hint="write <tool_call><function=name><parameter=p>value</parameter></function></tool_call>",
            )
            return
        name = m.group(1).strip()
        rest = body[m.end() :]
        end = rest.rfind(_FUNCTION_CLOSE)
        if end >= 0:
            if rest[end + len(_FUNCTION_CLOSE) :].strip():
                self.sink.fail(
                    index,
                    None,
                    name,
                    "unexpected text after </function>",
                    path=path,
                    hint="close the call with </tool_call> right after </function>",
                )
                return
            rest = rest[:end]
        args = self._parameters(index, name, rest)
        if args is None:
            return
        raw, problem = dumps_arguments(args)
        if problem is not None:
            self.sink.fail(
                index,
                None,
                name,
                f"arguments are not valid JSON: {problem}",
                path=f"tool_calls[{index}].arguments",
                hint="write each parameter value as valid Unicode text",
            )
            return
        self.sink.complete(index, None, name, args, raw, f"{path}.name")

    def _parameters(self, index: int, name: str, rest: str) -> dict[str, Any] | None:
        """The call's `<parameter=...>` values, converted by the tool's schema; None once a problem is reported."""
        properties = _properties(self.sink.tool_schema(name))
        args: dict[str, Any] = {}
        starts = list(_PARAMETER_OPEN.finditer(rest))
        if rest[: starts[0].start() if starts else len(rest)].strip():
            self.sink.fail(
                index,
                None,
                name,
                "unexpected text before the first <parameter=...>",
                path=f"tool_calls[{index}]",
                hint="remove it",
            )
            return None
        for k, p in enumerate(starts):
            pname = p.group(1).strip()
            stop = starts[k + 1].start() if k + 1 < len(starts) else len(rest)
            chunk = rest[p.end() : stop]
            close = chunk.find(_PARAMETER_CLOSE)
            if close >= 0:
                if chunk[close + len(_PARAMETER_CLOSE) :].strip():
                    self.sink.fail(
                        index,
                        None,
                        name,
                        f"unexpected text after </parameter> of {pname!r}",
                        path=arguments_path(index, [pname]),
                        hint="write one <parameter=...>...</parameter> after another",
                    )
                    return None
                chunk = chunk[:close]
            # Like vLLM's parser (and the template, which writes "\n" + value + "\n"): one newline on each side is
            # framing, the rest is the value.
            value = chunk.removeprefix("\n").removesuffix("\n")
            if pname in args:
                self.sink.fail(
                    index,
                    None,
                    name,
                    f"parameter {pname!r} is given twice",
                    path=arguments_path(index, [pname]),
                    hint="give each parameter once",
                )
                return None
            args[pname] = coerce_parameter(value, properties.get(pname))
        return args


def _properties(schema: Any) -> dict[str, Any]:
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
        return schema["properties"]
    return {}
