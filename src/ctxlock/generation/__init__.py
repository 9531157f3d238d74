"""The way back: model output into text and calls. Incremental decoding and stop strings, JSON-Schema token
masks with a deterministic sampler, gpt-oss's Harmony messages parsed back (`parse_harmony`), reasoning split from
the answer over ids (`ReasoningSplitter`), and streaming tool calls (`toolcalls`) in each model family's wire format.

The names are imported on first use: the parts are independent, and constrained decoding loads llguidance."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxlock.core import lazy_exports

_EXPORTS = {
    "ContentDelta": "ctxlock.generation._reasoning",
    "END_TOKENS": "ctxlock.generation._parse",
    "REASONING_FORMATS": "ctxlock.generation._reasoning",
    "ReasoningDelta": "ctxlock.generation._reasoning",
    "ReasoningFormat": "ctxlock.generation._reasoning",
    "ReasoningResult": "ctxlock.generation._reasoning",
    "ReasoningSplitter": "ctxlock.generation._reasoning",
    "HarmonyMessage": "ctxlock.generation._harmony",
    "HarmonyParser": "ctxlock.generation._harmony",
    "IncrementalDecoder": "ctxlock.generation._decode",
    "ParsedMessage": "ctxlock.generation._parse",
    "formats_for_template": "ctxlock.generation._parse",
    "parse_output": "ctxlock.generation._parse",
    "JsonSchemaMask": "ctxlock.generation._constrain",
    "Sampler": "ctxlock.generation._sampler",
    "SamplerConfig": "ctxlock.generation._sampler",
    "StopMatcher": "ctxlock.generation._decode",
    "ToolCallAssembler": "ctxlock.generation.toolcalls",
    "parse_harmony": "ctxlock.generation._harmony",
    "split_reasoning": "ctxlock.generation._reasoning",
    "split_reasoning_text": "ctxlock.generation._reasoning",
    "start_from_prompt": "ctxlock.generation._reasoning",
    "stream_text": "ctxlock.generation._decode",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "END_TOKENS",
    "REASONING_FORMATS",
    "ContentDelta",
    "HarmonyMessage",
    "HarmonyParser",
    "IncrementalDecoder",
    "JsonSchemaMask",
    "ParsedMessage",
    "ReasoningDelta",
    "ReasoningFormat",
    "ReasoningResult",
    "ReasoningSplitter",
    "Sampler",
    "SamplerConfig",
    "StopMatcher",
    "ToolCallAssembler",
    "formats_for_template",
    "parse_harmony",
    "parse_output",
    "split_reasoning",
    "split_reasoning_text",
    "start_from_prompt",
    "stream_text",
]

if TYPE_CHECKING:
    from ctxlock.generation._constrain import JsonSchemaMask
    from ctxlock.generation._decode import IncrementalDecoder, StopMatcher, stream_text
    from ctxlock.generation._harmony import HarmonyMessage, HarmonyParser, parse_harmony
    from ctxlock.generation._parse import END_TOKENS, ParsedMessage, formats_for_template, parse_output
    from ctxlock.generation._reasoning import (
        REASONING_FORMATS,
        ContentDelta,
        ReasoningDelta,
        ReasoningFormat,
        ReasoningResult,
        ReasoningSplitter,
        split_reasoning,
        split_reasoning_text,
        start_from_prompt,
    )
    from ctxlock.generation._sampler import Sampler, SamplerConfig
    from ctxlock.generation.toolcalls import ToolCallAssembler
