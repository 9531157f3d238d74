"""Wire format `deepseek_v31` (DeepSeek-V3.1): the `deepseek_v3` section and markers, each call
`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (no type, no fence). A call is complete when
`<｜tool▁call▁end｜>` is seen outside a JSON string."""

from __future__ import annotations

from ctxlock.generation.toolcalls._sectioned import CALL_BEGIN, CALL_END, SEP, DeepSeekSectionParser


class DeepSeekV31Parser(DeepSeekSectionParser):
    """Body: `NAME<｜tool▁sep｜>{...}` (vllm/tool_parsers/deepseekv31_tool_parser.py)."""

    example = f"{CALL_BEGIN}NAME{SEP}{{...}}{CALL_END}"

    def _close(self, body: str) -> None:
        name, sep, args = body.partition(SEP)
        if not sep:
            self._malformed(f"expected NAME{SEP}{{...}} after {CALL_BEGIN}")
            return
        self._arguments(name.strip(), args.strip())
