"""Wire format `deepseek_v4` (DeepSeek-V4, V4-Flash): V3.2's DSML markup (`_dsml.py`) in a `<｜DSML｜tool_calls>` block.

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="P" string="true">raw text</｜DSML｜parameter>
    <｜DSML｜parameter name="Q" string="false">JSON</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

A call is complete when `</｜DSML｜invoke>` is seen. Only an invoke inside a `<｜DSML｜tool_calls>` block is a call: a
V3.2 `<｜DSML｜function_calls>` block is text, as in vLLM's tests/tool_parsers/test_deepseekv4_tool_parser.py
(`test_function_calls_block_is_not_accepted`). Templates deepseek-ai-DeepSeek-V4.jinja and
deepseek-ai-DeepSeek-V4-Flash-0731.jinja; vllm/tool_parsers/deepseekv4_tool_parser.py."""

from __future__ import annotations

from ctxlock.generation.toolcalls._dsml import DSML, DsmlParser


class DeepSeekV4Parser(DsmlParser):
    """DSML invokes in a `<｜DSML｜tool_calls>` block; an invoke outside one is text."""

    section_begin = (f"<{DSML}tool_calls>",)
    section_end = (f"</{DSML}tool_calls>",)
    bare_calls = False
