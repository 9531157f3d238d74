"""Wire format `hermes` (Hermes 2 Pro, Qwen2.5): text, then `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
repeated. `TaggedParser` reads the `<tool_call>` ... `</tool_call>` framing, which `qwen3_coder` shares; a subclass
parses the body. A hermes call is complete when `</tool_call>` is seen outside a JSON string."""

from __future__ import annotations

from ctxlock.generation.toolcalls._jsontext import JsonSpan, loads_object
from ctxlock.generation.toolcalls._sink import complete_named_object
from ctxlock.generation.toolcalls._tagged import TaggedParser


class HermesParser(TaggedParser):
    """Body: one JSON object {"name": ..., "arguments": {...}}. `</tool_call>` inside a JSON string is text."""

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
        obj, problem = loads_object(body)
        if problem is not None:
            self.sink.fail(
                index,
                None,
                None,
                f"the tool call is not valid JSON: {problem}",
                path=f"tool_calls[{index}]",
                hint='write <tool_call>{"name": ..., "arguments": {...}}</tool_call>',
            )
            return
        complete_named_object(self.sink, index, obj, f"tool_calls[{index}]")
