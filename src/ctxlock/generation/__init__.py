"""The way back: model output into text and calls. Incremental decoding and stop strings, JSON-Schema token
masks with a deterministic sampler, gpt-oss's Harmony messages parsed back (`parse_harmony`), and streaming tool
calls (`toolcalls`) in each model family's wire format.

The names are imported on first use: the parts are independent, and constrained decoding loads llguidance."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxlock.core import lazy_exports

_EXPORTS = {
    "HarmonyMessage": "ctxlock.generation._harmony",
    "HarmonyParser": "ctxlock.generation._harmony",
    "IncrementalDecoder": "ctxlock.generation._decode",
    "JsonSchemaMask": "ctxlock.generation._constrain",
    "Sampler": "ctxlock.generation._sampler",
    "SamplerConfig": "ctxlock.generation._sampler",
    "StopMatcher": "ctxlock.generation._decode",
    "ToolCallAssembler": "ctxlock.generation.toolcalls",
    "parse_harmony": "ctxlock.generation._harmony",
    "stream_text": "ctxlock.generation._decode",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "HarmonyMessage",
    "HarmonyParser",
    "IncrementalDecoder",
    "JsonSchemaMask",
    "Sampler",
    "SamplerConfig",
    "StopMatcher",
    "ToolCallAssembler",
    "parse_harmony",
    "stream_text",
]

if TYPE_CHECKING:
    from ctxlock.generation._constrain import JsonSchemaMask
    from ctxlock.generation._decode import IncrementalDecoder, StopMatcher, stream_text
    from ctxlock.generation._harmony import HarmonyMessage, HarmonyParser, parse_harmony
    from ctxlock.generation._sampler import Sampler, SamplerConfig
    from ctxlock.generation.toolcalls import ToolCallAssembler
