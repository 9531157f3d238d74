"""Wire format `functionary_v3_1` (MeetKai functionary-medium-v3.1, on Llama 3.1; template
meetkai-functionary-medium-v3.1.jinja): text, then `<function=NAME>{"arg": ...}</function>`, repeated. The arguments
are one JSON object (the template writes them with `tojson`). A call is complete when `</function>` is seen outside
a JSON string; the framing is `TaggedParser`'s with `<function=` as the opening marker.

llama.cpp reads the same form (common/chat.cpp, COMMON_CHAT_FORMAT_FUNCTIONARY_V3_1_LLAMA_3_1); the calls to its
built-in `python` tool, which the template writes as `<|python_tag|>` and the code, are text here (no declared tool
takes raw code)."""

from __future__ import annotations

import re

from ctxlock.generation.toolcalls._jsontext import JsonSpan, loads_object
from ctxlock.generation.toolcalls._tagged import TaggedParser

_NAME = re.compile(r"([\w.\-]+)>")
_HINT = 'write <function=name>{"arg": "value"}</function>'


class FunctionaryV31Parser(TaggedParser):
    """Body: `NAME>` then one JSON object. `</function>` inside a JSON string is text."""

    open_marker = "<function="
    close_marker = "</function>"

    def _start_body(self) -> None:
        self.span = JsonSpan()

    def _body(self, text: str) -> None:
        if text:
            self.parts.append(text)
            self.span.feed(text)

    def _closes_here(self) -> bool:
        return not self.span.in_string

    def _close(self, body: str) -> None:
        index = self.index
        path = f"tool_calls[{index}]"
        m = _NAME.match(body)
        if m is None:
            got = ("<function=" + body)[:40]
            self.sink.fail(index, None, None, f"expected <function=name>, got {got!r}", path=f"{path}.name", hint=_HINT)
            return
        name = m.group(1)
        raw = body[m.end() :].strip()
        args, problem = loads_object(raw)
        if problem is not None:
            self.sink.fail(
                index,
                None,
                name,
                f"arguments are not valid JSON: {problem}",
                path=f"{path}.arguments",
                hint="send the arguments as one JSON object between <function=name> and </function>",
            )
            return
        self.sink.complete(index, None, name, args, raw, f"{path}.name")
