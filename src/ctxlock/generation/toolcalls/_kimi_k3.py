"""Wire format `kimi_k3` (Kimi K3's XTML; template Kimi-K3.jinja): channels opened by `<|open|>NAME attrs<|sep|>` and
closed by `<|close|>NAME<|sep|>`, as vLLM's vllm/tool_parsers/kimi_k3_tool_parser.py reads them:

    <|open|>response<|sep|>Looking it up.<|close|>response<|sep|>
    <|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>
    <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>
    <|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>
    <|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>

The response channel's text is the text (its markers may be missing: the generation prompt can open it), and so is
text outside any channel; a `think` channel's text is thinking. A close of `think`, `response`, `message` or
`tools` that nothing opened (the prompt did) is dropped; so the reasoning the prompt opened reaches the text unless
the caller splits it off first, as vLLM's reasoning parser does. Each `call` is complete at its `<|close|>call<|sep|>`.
An argument's `type` says how to read it: `string` is the raw text, any other type is JSON. Attribute values are
unescaped (`&quot;`, `&amp;`). A tag that is not XTML's (an unknown name) is text. A call longer than
`sink.max_event_size` characters is refused.
"""

from __future__ import annotations

import re
from typing import Any

from ctxlock.generation.toolcalls._jsontext import dumps_arguments, loads_object, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._schemas import arguments_path
from ctxlock.generation.toolcalls._sink import ToolCallSink

_OPEN, _CLOSE, _SEP = "<|open|>", "<|close|>", "<|sep|>"
_KNOWN = frozenset({"think", "response", "message", "tools", "call", "argument"})
_PROMPT_OPENED = frozenset({"think", "response", "message", "tools"})
_ATTR = re.compile(r'(\w+)="([^"]*)"')
_MAX_HEADER = 4096
_HINT = (
    '<|open|>call tool="f"<|sep|><|open|>argument key="k" type="string"<|sep|>v<|close|>argument<|sep|>'
    "<|close|>call<|sep|>"
)


def _unescape(value: str) -> str:
    return value.replace("&quot;", '"').replace("&amp;", "&")


class KimiK3Parser:
    """XTML channels: response text, thinking, and `call`s in the `tools` channel (see the module docstring)."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.pending = ""
        self.header: str | None = None  # the marker and header of a tag still arriving
        self.stack: list[str] = []
        self.index = -1  # the open call's index, -1 when no call is open
        self.name = ""
        self.args: dict[str, Any] = {}
        self.arg: tuple[str, str] | None = None  # (key, type) of the open argument
        self.value: list[str] = []
        self.size = 0
        self.bad = False  # the open call was already refused

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, self.sink.format.value)
        self.pending = ""
        i: int | None = 0
        while i is not None:
            i = self._text(t, i) if self.header is None else self._header(t, i)

    def _text(self, t: str, i: int) -> int | None:
        o, c = t.find(_OPEN, i), t.find(_CLOSE, i)
        found = [j for j in (o, c) if j >= 0]
        if not found:
            rest = t[i:]
            self.pending = max(split_marker_prefix(rest, _OPEN)[1], split_marker_prefix(rest, _CLOSE)[1], key=len)
            self._route(rest[: len(rest) - len(self.pending)])
            return None
        j = min(found)
        self._route(t[i:j])
        marker = _OPEN if j == o else _CLOSE
        self.header = marker
        return j + len(marker)

    def _header(self, t: str, i: int) -> int | None:
        assert self.header is not None
        j = t.find(_SEP, i)
        if j < 0:
            body, self.pending = split_marker_prefix(t[i:], _SEP)
            self.header += body
            if len(self.header) > _MAX_HEADER:
                self._not_a_tag(self.header)
            return None
        header = self.header + t[i:j]
        self.header = None
        self._tag(header, header + _SEP)
        return j + len(_SEP)

    def _not_a_tag(self, raw: str) -> None:
        self.header = None
        self._route(raw)

    def _route(self, text: str) -> None:
        """Text, by the channel it is in."""
        if not text:
            return
        top = self.stack[-1] if self.stack else None
        if top == "argument":
            self._grow(text)
        elif top == "think":
            self.sink.emit_thinking(text)
        elif top in ("call", "tools"):
            if text.strip() and top == "call":
                self._refuse(f"unexpected text {text.strip()[:40]!r} between arguments", [])
            elif text.strip():
                self.sink.note(f"text inside the tools channel outside any call was dropped: {text.strip()[:80]!r}")
        else:
            self.sink.emit_text(text)

    def _grow(self, text: str) -> None:
        if self.bad:
            return
        self.size += len(text)
        if self.size > self.sink.max_event_size:
            self.value = []
            self._refuse(f"the call is longer than max_event_size={self.sink.max_event_size} characters", None)
            return
        self.value.append(text)

    def _tag(self, header: str, raw: str) -> None:
        opening = header.startswith(_OPEN)
        body = header[len(_OPEN if opening else _CLOSE) :].strip()
        name, _, attrs = body.partition(" ")
        if name not in _KNOWN:
            self._route(raw)  # not XTML's: text as written
            return
        if opening:
            self._open(name, {k: _unescape(v) for k, v in _ATTR.findall(attrs)}, raw)
        else:
            self._close(name)

    def _open(self, name: str, attrs: dict[str, str], raw: str) -> None:
        if name == "call":
            if self.index >= 0:
                self._refuse("a call opened inside a call", None)
                self._end_call()
            self.index = self.sink.new_index()
            self.name, self.args, self.size, self.bad = attrs.get("tool", ""), {}, len(raw), False
        elif name == "argument":
            if not self.stack or self.stack[-1] != "call":
                self._route(raw)
                return
            self.arg = (attrs.get("key", ""), attrs.get("type", "string"))
            self.value = []
        self.stack.append(name)

    def _close(self, name: str) -> None:
        if not self.stack or self.stack[-1] != name:
            if name in self.stack:  # close what was left open inside it
                while self.stack and self.stack[-1] != name:
                    self._close(self.stack[-1])
            elif not self.stack and name in _PROMPT_OPENED:
                return  # opened by the generation prompt, or the end of the message
            else:
                if self.index >= 0:
                    self._refuse(f"<|close|>{name} closes nothing open", None)
                return
        self.stack.pop()
        if name == "argument":
            self._argument()
        elif name == "call":
            self._finish_call()

    def _argument(self) -> None:
        assert self.arg is not None
        key, kind = self.arg
        self.arg = None
        raw = "".join(self.value)
        self.value = []
        if self.bad:
            return
        if not key:
            self._refuse('an argument without key="..."', [])
            return
        if key in self.args:
            self._refuse(f"argument {key!r} is given twice", [key])
            return
        if kind == "string":
            self.args[key] = raw
            return
        value, problem = loads_object(raw)
        if problem is not None:
            self._refuse(f"the {kind} value is not valid JSON: {problem}", [key])
            return
        self.args[key] = value

    def _refuse(self, message: str, keys: list[str] | None) -> None:
        if self.index < 0 or self.bad:
            return
        self.bad = True
        path = arguments_path(self.index, keys) if keys is not None else f"tool_calls[{self.index}]"
        self.sink.fail(self.index, None, self.name or None, message, path=path, hint=f"write {_HINT}")

    def _finish_call(self) -> None:
        if not self.bad:
            index = self.index
            if not self.name:
                self._refuse('a call without tool="..."', None)
            else:
                raw, problem = dumps_arguments(self.args)
                if problem is not None:
                    self._refuse(f"arguments are not valid JSON: {problem}", [])
                else:
                    self.sink.complete(index, None, self.name, self.args, raw, f"tool_calls[{index}].name")
        self._end_call()

    def _end_call(self) -> None:
        self.index, self.name, self.args, self.bad = -1, "", {}, False
        while self.stack and self.stack[-1] in ("call", "argument"):
            self.stack.pop()

    def open_indexes(self) -> list[int]:
        return [self.index] if self.index >= 0 and not self.bad else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.index >= 0:  # a call is open: what is held back is part of it, and it is unfinished
            if not self.bad:
                self.sink.unfinished([self.index], finish_reason, "before <|close|>call<|sep|>")
        else:
            if self.header is not None:
                self._not_a_tag(self.header)
            self._route(self.pending)
        self.header, self.pending = None, ""
        return finish_reason
