"""Wire format `seed_oss` (ByteDance Seed-OSS): `<seed:tool_call>\\n<function=NAME>\\n<parameter=P>value</parameter>\\n
</function>\\n</seed:tool_call>`, Qwen3-Coder's body in Seed's own markers (template ByteDance-Seed-OSS.jinja, vLLM's
vllm/tool_parsers/seed_oss_tool_parser.py). A call is complete when `</seed:tool_call>` is seen.

The model reasons first, in `<seed:think>` ... `</seed:think>`; that reasoning is text here (splitting it off is not
the tool-call reader's job), and a `<seed:tool_call>` written inside it is text too, as in vLLM's cases: the model
describes the call format while thinking. The template writes each value with `| string` (Python's `True`, `None`,
`{'a': 1}`), so values are converted by the tool's schema as for `qwen3_coder`."""

from __future__ import annotations

from ctxlock.generation.toolcalls._qwen3_coder import Qwen3CoderParser


class SeedOssParser(Qwen3CoderParser):
    """Qwen3-Coder's `<function=...>` body between `<seed:tool_call>` and `</seed:tool_call>`."""

    open_marker = "<seed:tool_call>"
    close_marker = "</seed:tool_call>"
    quote_open = "<seed:think>"
    quote_close = "</seed:think>"
