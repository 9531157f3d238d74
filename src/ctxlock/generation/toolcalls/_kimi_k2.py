"""Wire format `kimi_k2` (Kimi-K2): `<|tool_calls_section_begin|>`, then per call `<|tool_call_begin|>`
`functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>`, then `<|tool_calls_section_end|>`. The
`functions.NAME:IDX` is the call's id (the template numbers the calls of a conversation) and names the tool. A call
is complete when `<|tool_call_end|>` is seen outside a JSON string (the framing is `SectionedParser`'s)."""

from __future__ import annotations

import re

from ctxlock.generation.toolcalls._jsontext import loads_object
from ctxlock.generation.toolcalls._sectioned import SectionedParser

CALL_BEGIN = "<|tool_call_begin|>"
CALL_END = "<|tool_call_end|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
_ID = re.compile(r"(.+):(\d+)", re.DOTALL)  # functions.NAME:IDX, or NAME:IDX (vllm/tool_parsers/kimi_k2_tool_parser.py)


class KimiK2Parser(SectionedParser):
    """Body: `functions.NAME:IDX<|tool_call_argument_begin|>{...}`; whitespace around each part is framing."""

    # The singular spellings are Kimi-K2 variants vLLM's parser also accepts.
    section_begin = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
    section_end = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
    call_begin = CALL_BEGIN
    call_end = CALL_END
    example = f"{CALL_BEGIN}functions.NAME:0{ARGUMENT_BEGIN}{{...}}{CALL_END}"

    def _close(self, body: str) -> None:
        index = self.index
        head, sep, raw = body.partition(ARGUMENT_BEGIN)
        call_id = head.strip() or None
        m = _ID.fullmatch(call_id or "")
        if not sep or m is None:
            self.sink.fail(
                index,
                call_id,
                None,
                f"expected functions.NAME:IDX{ARGUMENT_BEGIN} after {CALL_BEGIN}, got {head.strip()[:60]!r}",
                path=f"tool_calls[{index}].id",
                hint=f"write {self.example}",
            )
            return
        name = m.group(1).removeprefix("functions.")
        raw = raw.strip()
        value, problem = loads_object(raw)
        if problem is not None:
            self.sink.fail(
                index,
                call_id,
                name,
                f"arguments are not valid JSON: {problem}",
                path=f"tool_calls[{index}].arguments",
                hint="send the arguments as one JSON object",
            )
            return
        self.sink.complete(index, call_id, name, value, raw, f"tool_calls[{index}].name")
