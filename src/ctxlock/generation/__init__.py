"""The way back: model output into text and calls. Incremental decoding and stop strings, JSON-Schema token
masks with a deterministic sampler, and streaming tool calls (`toolcalls`) in each model family's wire format.

The names are imported on first use: the parts are independent, and constrained decoding loads llguidance."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxlock.core import lazy_exports

_EXPORTS = {
    "IncrementalDecoder": "ctxlock.generation._decode",
    "JsonSchemaMask": "ctxlock.generation._constrain",
    "Sampler": "ctxlock.generation._sampler",
    "SamplerConfig": "ctxlock.generation._sampler",
    "StopMatcher": "ctxlock.generation._decode",
    "ToolCallAssembler": "ctxlock.generation.toolcalls",
    "stream_text": "ctxlock.generation._decode",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "IncrementalDecoder",
    "JsonSchemaMask",
    "Sampler",
    "SamplerConfig",
    "StopMatcher",
    "ToolCallAssembler",
    "stream_text",
]

if TYPE_CHECKING:
    from ctxlock.generation._constrain import JsonSchemaMask
    from ctxlock.generation._decode import IncrementalDecoder, StopMatcher, stream_text
    from ctxlock.generation._sampler import Sampler, SamplerConfig
    from ctxlock.generation.toolcalls import ToolCallAssembler
