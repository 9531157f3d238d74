"""Wire format `minimax` (MiniMax-M1; template MiniMax-M1.jinja): text, then a block of calls, one JSON object a line.

    <tool_calls>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    {"name": "search", "arguments": {"q": "rain"}}
    </tool_calls>

The calls of a block are complete when `</tool_calls>` is seen outside a JSON string; each is then released or
refused on its own (the arguments may be a JSON string: the template writes `arguments | tojson`, a string when the
history holds them as OpenAI's wire text). The model reasons in `<think>` ... `</think>` first; that is text here,
and a `<tool_calls>` block written inside it is text too, as in vLLM's vllm/tool_parsers/minimax_tool_parser.py
(the model describes calls while thinking). Unlike vLLM's parser, an object may span several lines, and an object
that is not a call (invalid JSON, no "name", no "arguments") is refused with an error rather than skipped; a block
still open when the stream ends is unfinished (docs/tool-call-formats.md lists these differences)."""

from __future__ import annotations

from ctxlock.generation.toolcalls._jsontext import JsonSpan, loads_object
from ctxlock.generation.toolcalls._sink import complete_named_object
from ctxlock.generation.toolcalls._tagged import TaggedParser

_HINT = 'write <tool_calls>\\n{"name": ..., "arguments": {...}}\\n</tool_calls>, one call a line'
_SAMPLE = 40  # characters of a malformed part quoted in its error


class MinimaxParser(TaggedParser):
    """Body: JSON objects `{"name": ..., "arguments": ...}` separated by whitespace (one a line)."""

    open_marker = "<tool_calls>"
    close_marker = "</tool_calls>"
    quote_open = "<think>"
    quote_close = "</think>"

    def _start_body(self) -> None:
        self.span = JsonSpan()

    def _body(self, text: str) -> None:
        if not text:
            return
        self.parts.append(text)
        pos = 0
        while pos < len(text):  # only whether `</tool_calls>` falls inside a JSON string matters here
            pos = self.span.feed(text, pos)
            if pos < 0:
                break

    def _closes_here(self) -> bool:
        return not self.span.in_string

    def _close(self, body: str) -> None:
        """Each object of the block is a call; the first has the index given when the block opened."""
        index: int | None = self.index
        pos = 0
        while True:
            while pos < len(body) and body[pos].isspace():
                pos += 1
            if pos == len(body):
                break
            if index is None:
                index = self.sink.new_index()
            end = JsonSpan().feed(body, pos) if body[pos] == "{" else -1
            if end < 0:
                what = body[pos : pos + _SAMPLE]
                self._fail(index, f"expected a JSON object {{...}} in the tool-call block, got {what!r}")
                return
            obj, problem = loads_object(body[pos:end])
            if problem is not None:
                self._fail(index, f"the tool call is not valid JSON: {problem}")
            else:
                complete_named_object(self.sink, index, obj, f"tool_calls[{index}]")
            index = None
            pos = end
        if index is not None:  # the block held no call at all
            self._fail(index, "the tool-call block holds no call")

    def _fail(self, index: int, message: str) -> None:
        self.sink.fail(index, None, None, message, path=f"tool_calls[{index}]", hint=_HINT)
