"""Wire format `deepseek_v3` (DeepSeek-V3, DeepSeek-R1 and its distills): a section of calls, each
`<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` then the arguments in a ```json fence, then `<｜tool▁call▁end｜>`.
The markers use fullwidth bars (U+FF5C) and U+2581 in place of spaces, as DeepSeek's tokenizer writes them. A call
is complete when `<｜tool▁call▁end｜>` is seen outside a JSON string (the framing is `_sectioned.py`'s)."""

from __future__ import annotations

from ctxlock.generation.toolcalls._sectioned import CALL_BEGIN, CALL_END, SEP, DeepSeekSectionParser

_FENCE = "```"


class DeepSeekV3Parser(DeepSeekSectionParser):
    """Body: `function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n````. As in vLLM's parser
    (vllm/tool_parsers/deepseekv3_tool_parser.py), the name runs to the end of its line; the fence is optional."""

    example = f"{CALL_BEGIN}function{SEP}NAME\\n```json\\n{{...}}\\n```{CALL_END}"

    def _close(self, body: str) -> None:
        kind, sep, rest = body.partition(SEP)
        if not sep:
            self._malformed(f"expected function{SEP}NAME after {CALL_BEGIN}")
            return
        if kind.strip() != "function":
            self._malformed(f"the call's type is {kind.strip()!r}, not 'function'", field=".type")
            return
        line_end = rest.find("\n")
        fence = rest.find(_FENCE)
        ends = [k for k in (line_end, fence) if k >= 0]
        cut = min(ends) if ends else len(rest)
        name, args = rest[:cut].strip(), rest[cut:].strip()
        if args.startswith(_FENCE):
            opening, _, inner = args.partition("\n")
            if opening.strip() not in ("```", "```json") or not inner.rstrip().endswith(_FENCE):
                self._malformed("the arguments' ```json fence is not closed", name or None, ".arguments")
                return
            args = inner.rstrip()[: -len(_FENCE)].strip()
        self._arguments(name, args)
