"""Multimodal input as a deterministic, recorded stage: image bytes -> header -> decoded RGB -> a family's
pixel values, grid and placeholder tokens. One module per model family (`qwen2vl`, `pixtral`, `llava`); the
values and the family interface are in `base`, bytes and Pillow in `media`. Depends only on `request` values,
`frozen` and `errors`.
"""

from typing import TYPE_CHECKING

from ctxlock.core import lazy_exports

# Imported on first use: a text-only request (`ctxlock render`, `Model.encode`) never loads the image stage (Pillow,
# the families' resampling tables).
_EXPORTS = {
    "AnimationPolicy": "ctxlock.multimodal._base",
    "ImageFamily": "ctxlock.multimodal._base",
    "ImageInput": "ctxlock.multimodal._pipeline",
    "ImageSize": "ctxlock.multimodal._pipeline",
    "MultimodalInput": "ctxlock.multimodal._expand",
    "StageOptions": "ctxlock.multimodal._pipeline",
    "VideoInput": "ctxlock.multimodal._pipeline",
    "expand": "ctxlock.multimodal._expand",
    "family_for": "ctxlock.multimodal._registry",
    "image_refs": "ctxlock.multimodal._sources",
    "image_sizes": "ctxlock.multimodal._pipeline",
    "plan_images": "ctxlock.multimodal._pipeline",
    "plan_videos": "ctxlock.multimodal._pipeline",
    "process_images": "ctxlock.multimodal._pipeline",
    "process_videos": "ctxlock.multimodal._pipeline",
    "processor_image_parts": "ctxlock.multimodal._sources",
    "processor_parts_warning": "ctxlock.multimodal._sources",
    "processor_special_tokens": "ctxlock.multimodal._expand",
    "video_refs": "ctxlock.multimodal._sources",
    "with_processor_special_tokens": "ctxlock.multimodal._expand",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from ctxlock.multimodal._base import AnimationPolicy, ImageFamily
    from ctxlock.multimodal._expand import (
        MultimodalInput,
        expand,
        processor_special_tokens,
        with_processor_special_tokens,
    )
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
