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
_VALUE_TAG = re.compile(r"</parameter>|<parameter=([^>\n]*)>")
_SPACE = re.compile(r"\s*")


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
                f"expected <function=NAME> after {self.open_marker}",
                path=f"{path}.name",
                hint=f"write {self.open_marker}<function=name><parameter=p>v</parameter></function>{self.close_marker}",
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
                    hint=f"close the call with {self.close_marker} right after </function>",
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

    def _start_body(self) -> None:
        self.nested = 0  # literal calls opened inside a parameter value and not yet closed
        self.tail = ""

    def _body(self, text: str) -> None:
        """Count the literal calls a value holds (an agent writing a file that shows one): a `<tool_call>` that
        starts a line and is followed by `<function=` on the next. Their `</tool_call>` is value text."""
        if not text:
            return
        self.parts.append(text)
        nested = f"\n{self.open_marker}\n<function="
        window = self.tail + text
        start = window.find(nested)
        while start >= 0:
            if start + len(nested) > len(self.tail):  # not wholly inside the tail, which was counted before
                self.nested += 1
            start = window.find(nested, start + 1)
        self.tail = window[-(len(nested) - 1) :]

    def _closes_here(self) -> bool:
        if self.nested > 0:
            self.nested -= 1
            return False
        return True

    def _parameters(self, index: int, name: str, rest: str) -> dict[str, Any] | None:
        """The call's `<parameter=...>` values, converted by the tool's schema; None once a problem is reported.

        A value may hold literal tags. Only a `<parameter=P>` whose P the tool declares (any P when it declares
        none) and that is not given yet opens a parameter, and a `</parameter>` closes the value only when what
        follows it is such an opening or the end (as vLLM's parsers read Qwen3-Coder output, in
        vllm/tool_parsers/qwen3coder_tool_parser.py). A value whose `</parameter>` is missing ends at the next
        opening."""
        properties = _properties(self.sink.tool_schema(name))
        args: dict[str, Any] = {}
        first = _PARAMETER_OPEN.search(rest)
        if rest[: first.start() if first else len(rest)].strip():
            self.sink.fail(
                index,
                None,
                name,
                "unexpected text before the first <parameter=...>",
                path=f"tool_calls[{index}]",
                hint="remove it",
            )
            return None
        p = first
        while p is not None:
            pname = p.group(1).strip()
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
            opens = [n for n in properties if n not in args and n != pname] if properties else None
            end, nxt = _value_end(rest, p.end(), opens)
            if end < 0:
                self.sink.fail(
                    index,
                    None,
                    name,
                    f"unexpected text after </parameter> of {pname!r}",
                    path=arguments_path(index, [pname]),
                    hint="write one <parameter=...>...</parameter> after another",
                )
                return None
            # Like vLLM's parser (and the template, which writes "\n" + value + "\n"): one newline on each side is
            # framing, the rest is the value.
            value = rest[p.end() : end].removeprefix("\n").removesuffix("\n")
            args[pname] = coerce_parameter(value, properties.get(pname))
            p = nxt
        return args


def _value_end(rest: str, start: int, opens: list[str] | None) -> tuple[int, re.Match[str] | None]:
    """Where the value starting at `start` ends, and the `<parameter=...>` that follows it (None at the end).

    `opens`: the names that may open the next parameter (None: any). (-1, None) when the value's last
    `</parameter>` is followed by something else than the end or an opening."""
    for m in _VALUE_TAG.finditer(rest, start):
        if m.group(1) is not None:  # an opening without a </parameter> before it: the close is missing
            if opens is None or m.group(1).strip() in opens:
                return m.start(), _PARAMETER_OPEN.match(rest, m.start())
            continue
        space = _SPACE.match(rest, m.end())
        after = space.end() if space is not None else m.end()
        if after == len(rest):
            return m.start(), None
        nxt = _PARAMETER_OPEN.match(rest, after)
        if nxt is not None and (opens is None or nxt.group(1).strip() in opens):
            return m.start(), nxt
    if rest.find(_PARAMETER_CLOSE, start) >= 0:
        return -1, None
    return len(rest), None


def _properties(schema: Any) -> dict[str, Any]:
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
        return schema["properties"]
    return {}
