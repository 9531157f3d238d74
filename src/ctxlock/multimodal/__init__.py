"""Multimodal input as a deterministic, recorded stage: image bytes -> header -> decoded RGB -> a family's
pixel values, grid and placeholder tokens. One module per model family (`qwen2vl`, `pixtral`, `llava`); the
values and the family interface are in `base`, bytes and Pillow in `media`. Depends only on `request` values,
`frozen` and `errors`.
"""

from ctxlock.multimodal._base import AnimationPolicy, ImageFamily
from ctxlock.multimodal._expand import MultimodalInput, expand, processor_special_tokens, with_processor_special_tokens
from ctxlock.multimodal._pipeline import (
    ImageInput,
    ImageSize,
    StageOptions,
    VideoInput,
    image_sizes,
    plan_images,
    plan_videos,
    process_images,
    process_videos,
)
from ctxlock.multimodal._registry import family_for
from ctxlock.multimodal._sources import image_refs, processor_image_parts, processor_parts_warning, video_refs

__all__ = [
    "AnimationPolicy",
    "ImageFamily",
    "ImageInput",
    "ImageSize",
    "MultimodalInput",
    "StageOptions",
    "VideoInput",
    "expand",
    "family_for",
    "image_refs",
    "image_sizes",
    "plan_images",
    "plan_videos",
    "process_images",
    "process_videos",
    "processor_image_parts",
    "processor_parts_warning",
    "processor_special_tokens",
    "video_refs",
    "with_processor_special_tokens",
]
