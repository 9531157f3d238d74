"""Qwen3-VL images: Qwen2-VL's semantics (transformers' Qwen3-VL processor uses `Qwen2VLImageProcessor`, PIL
backend `Qwen2VLImageProcessorPil`) with Qwen3-VL's values: patch_size 16, merge_size 2 (factor 32), mean and std
0.5, and a pixel range of [65536, 16777216] (the values Qwen3-VL checkpoints' preprocessor_config.json holds;
they are the defaults here, where Qwen2-VL's class has patch 14 and CLIP's mean). Placeholders are the same:
grid_t * grid_h * grid_w / merge^2 copies of `<|image_pad|>` between `<|vision_start|>` and `<|vision_end|>`.

Videos are refused: Qwen3-VL's processor writes a timestamp (`<t seconds>`) before each temporal group, from the
video's fps (metadata a list of frames does not carry), and its video processor resizes over the frame count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from ctxlock.errors import ImagePlacementError
from ctxlock.multimodal._base import DecodedImage, ImagePlan, Preprocessed
from ctxlock.multimodal._qwen2vl import Qwen2VL

QWEN3VL_MEAN = (0.5, 0.5, 0.5)
QWEN3VL_STD = (0.5, 0.5, 0.5)
QWEN3VL_DEFAULTS: dict[str, Any] = {
    "min_pixels": 65536,
    "max_pixels": 16777216,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": list(QWEN3VL_MEAN),
    "image_std": list(QWEN3VL_STD),
}


@dataclass(frozen=True)
class Qwen3VL(Qwen2VL):
    """The Qwen3-VL image family (Qwen2VLImageProcessorPil's computation with Qwen3-VL's values)."""

    min_pixels: int = 65536
    max_pixels: int = 16777216
    patch_size: int = 16
    image_mean: tuple[float, ...] = QWEN3VL_MEAN
    image_std: tuple[float, ...] = QWEN3VL_STD
    source: str = "Qwen3-VL checkpoint values"

    name = "qwen3-vl"

    @classmethod
    def from_preprocessor_config(cls, config: Mapping[str, Any], *, source: str = "preprocessor_config.json") -> Self:
        """As Qwen2-VL's, over Qwen3-VL's values: a key the file leaves out keeps Qwen3-VL's value."""
        merged = dict(QWEN3VL_DEFAULTS)
        if isinstance(config.get("size"), Mapping) or "min_pixels" in config or "max_pixels" in config:
            merged.pop("min_pixels")
            merged.pop("max_pixels")
        merged.update(config)
        return super().from_preprocessor_config(merged, source=source)

    def plan_video(self, sizes: Sequence[tuple[int, int]]) -> ImagePlan:
        raise ImagePlacementError(
            "Qwen3-VL videos are not supported: its processor writes a timestamp before each group of frames, from "
            "the video's fps, which a list of frames does not carry",
            hint="send the frames as images, or use a Qwen2-VL / Qwen2.5-VL model for video",
        )

    def preprocess_video(self, frames: Sequence[DecodedImage]) -> Preprocessed:
        return self.plan_video([f.size for f in frames])  # type: ignore[return-value]  # always raises
