"""Wire format `deepseek_v32` (DeepSeek-V3.2): DSML markup (`_dsml.py`) in a `<｜DSML｜function_calls>` block.

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="P" string="true">raw text</｜DSML｜parameter>
    <｜DSML｜parameter name="Q" string="false">JSON</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

A call is complete when `</｜DSML｜invoke>` is seen. Values are converted by the tool's schema, else by the `string`
attribute, as the template writes them (deepseek-ai-DeepSeek-V3.2.jinja;
vllm/tool_parsers/deepseekv32_tool_parser.py)."""

from __future__ import annotations

from ctxlock.generation.toolcalls._dsml import DSML, DsmlParser


class DeepSeekV32Parser(DsmlParser):
    """DSML invokes in a `<｜DSML｜function_calls>` block (an invoke outside one is read too)."""

    section_begin = (f"<{DSML}function_calls>",)
    section_end = (f"</{DSML}function_calls>",)
