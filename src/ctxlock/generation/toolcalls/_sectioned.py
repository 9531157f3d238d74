"""The framing `deepseek_v3`, `deepseek_v31`, `kimi_k2` and the DSML formats (`deepseek_v32`, `deepseek_v4`) share:
text, then a section of calls between special tokens, each call between its own begin and end tokens, then text
again.

    text <section-begin> <call-begin> body <call-end> <call-begin> body <call-end> <section-end> text

Whitespace between the markers of a section is framing. Other text there (outside any call) is reported as a
malformed call, never passed on as text: vLLM's Kimi-K2 parser drops it (vllm/tool_parsers/kimi_k2_tool_parser.py).
A call begin without a section begin still opens a call (with `bare_calls = False` it is text). A call is complete
when its end token is seen outside a JSON string of its body (anywhere, for a body of raw text values:
`json_body = False`); each format subclasses `SectionedParser` and parses the body its own way. The DeepSeek-V3 /
V3.1 markers and what those two formats share (`DeepSeekSectionParser`) are here too: the formats do not import each
other.
"""

from __future__ import annotations

from typing import Any

from ctxlock.generation.toolcalls._jsontext import JsonSpan, loads_object, split_marker_prefix, text_delta
from ctxlock.generation.toolcalls._sink import ToolCallSink

_TEXT, _SECTION, _CALL = 0, 1, 2
_SAMPLE = 40  # characters of stray section text quoted in its error


def split_markers_prefix(text: str, markers: tuple[str, ...]) -> tuple[str, str]:
    """Split off the longest suffix of `text` that is a proper prefix of one of `markers`."""
    best = (text, "")
    for marker in markers:
        safe, held = split_marker_prefix(text, marker)
        if len(held) > len(best[1]):
            best = (safe, held)
    return best


def _first(t: str, start: int, markers: tuple[str, ...]) -> tuple[int, str]:
    """The earliest of `markers` in t[start:] (position and marker), or (-1, "")."""
    found, which = -1, ""
    for marker in markers:
        j = t.find(marker, start)
        if j >= 0 and (found < 0 or j < found):
            found, which = j, marker
    return found, which


class SectionedParser:
    """Text, then sections of calls; subclasses set the markers and parse a call's body in `_close`."""

    ended: str | None = None  # the finish reason says how the stream ended
    section_begin: tuple[str, ...] = ()
    section_end: tuple[str, ...] = ()
    call_begin = ""
    call_end = ""
    example = ""  # how a call is written, for hints
    json_body = True  # the end token inside a JSON string of the body is text (not for bodies of raw text values)
    bare_calls = True  # a call begin outside a section opens a call (deepseek_v4: it is text)

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.state = _TEXT
        self.pending = ""  # a possible marker prefix, not yet classified
        self.index = -1
        self.parts: list[str] = []
        self.size = 0
        self.span = JsonSpan()
        self.too_long = False
        self.stray = ""  # the start of non-whitespace text inside a section, outside any call
        self.in_section = False  # a call opened without a section returns to text when it closes

    def feed(self, text: Any) -> None:
        t = self.pending + text_delta(text, self.sink.format.value)
        self.pending = ""
        i: int | None = 0
        while i is not None:
            if self.state == _TEXT:
                i = self._text(t, i)
            elif self.state == _SECTION:
                i = self._section(t, i)
            else:
                i = self._call(t, i)

    def _text(self, t: str, i: int) -> int | None:
        markers = (*self.section_begin, self.call_begin) if self.bare_calls else self.section_begin
        j, marker = _first(t, i, markers)
        if j < 0:
            safe, self.pending = split_markers_prefix(t[i:], markers)
            self.sink.emit_text(safe)
            return None
        self.sink.emit_text(t[i:j])
        self.in_section = marker != self.call_begin
        if self.in_section:
            self.state = _SECTION
            self.stray = ""
        else:
            self._open_call()
        return j + len(marker)

    def _section(self, t: str, i: int) -> int | None:
        markers = (self.call_begin, *self.section_end)
        j, marker = _first(t, i, markers)
        if j < 0:
            gap, self.pending = split_markers_prefix(t[i:], markers)
            self._gap(gap)
            return None
        self._gap(t[i:j])
        self._report_stray()
        if marker == self.call_begin:
            self._open_call()
        else:
            self.state = _TEXT
        return j + len(marker)

    def _gap(self, text: str) -> None:
        if len(self.stray) < _SAMPLE:
            stripped = (self.stray + text).strip() if self.stray else text.strip()
            self.stray = stripped[:_SAMPLE]

    def _report_stray(self) -> None:
        if self.stray:
            index = self.sink.new_index()
            self.sink.fail(
                index,
                None,
                None,
                f"text inside the tool-call section, outside any call: {self.stray!r}",
                path=f"tool_calls[{index}]",
                hint=f"write each call as {self.example}",
            )
            self.stray = ""

    def _open_call(self) -> None:
        self.state = _CALL
        self.index = self.sink.new_index()
        self.parts = []
        self.size = 0
        self.span = JsonSpan()
        self.too_long = False

    def _call(self, t: str, i: int) -> int | None:
        j = t.find(self.call_end, i)
        if j < 0:
            body, self.pending = split_marker_prefix(t[i:], self.call_end)
            self._body(body)
            return None
        self._body(t[i:j])
        if self.json_body and self.span.in_string:  # the end token inside a JSON string of the arguments is text
            self._body(self.call_end)
            return j + len(self.call_end)
        self.state = _SECTION if self.in_section else _TEXT
        self.stray = ""
        if not self.too_long:
            self._close("".join(self.parts))
        self.parts = []
        return j + len(self.call_end)

    def _body(self, text: str) -> None:
        if not text:
            return
        self.span.feed(text)
        if self.too_long:
            return
        self.size += len(text)
        if self.size > self.sink.max_event_size:
            self.too_long = True
            self.parts = []
            self.sink.fail(
                self.index,
                None,
                None,
                f"the tool call is longer than max_event_size={self.sink.max_event_size} characters",
                path=f"tool_calls[{self.index}]",
                hint="the call is not released; raise max_event_size if such a call is real",
            )
            return
        self.parts.append(text)

    def _close(self, body: str) -> None:
        raise NotImplementedError

    def open_indexes(self) -> list[int]:
        return [self.index] if self.state == _CALL and not self.too_long else []

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _TEXT:
            self.sink.emit_text(self.pending)
        elif self.state == _SECTION:
            if self.stray:  # text in the section that never became a call: a call cut off before its begin token
                where = f"inside the tool-call section, before {self.call_begin}"
                self.sink.unfinished([self.sink.new_index()], finish_reason, where)
        elif not self.too_long:
            self.sink.unfinished([self.index], finish_reason, f"before {self.call_end}")
        self.pending = ""
        return finish_reason


# The DeepSeek-V3 / V3.1 special tokens: fullwidth bars (U+FF5C), U+2581 in place of spaces.
CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


class DeepSeekSectionParser(SectionedParser):
    """The DeepSeek markers; `deepseek_v3` and `deepseek_v31` differ in the call's body only."""

    section_begin = (CALLS_BEGIN,)
    section_end = (CALLS_END,)
    call_begin = CALL_BEGIN
    call_end = CALL_END

    def _arguments(self, name: str, raw: str) -> None:
        """Parse the arguments of the current call (`raw` as written) and report it."""
        index = self.index
        value, problem = loads_object(raw)
        if problem is not None:
            self.sink.fail(
                index,
                None,
                name or None,
                f"arguments are not valid JSON: {problem}",
                path=f"tool_calls[{index}].arguments",
                hint="send the arguments as one JSON object",
            )
            return
        self.sink.complete(index, None, name, value, raw, f"tool_calls[{index}].name")

    def _malformed(self, message: str, name: str | None = None, field: str = "") -> None:
        self.sink.fail(
            self.index,
            None,
            name,
            message,
            path=f"tool_calls[{self.index}]{field}",
            hint=f"write {self.example}",
        )
