"""LLaVA-1.5 images: CLIP preprocessing at 336 px and 576 `<image>` placeholders, as transformers computes them.

The reference is transformers 5's PIL backend, `CLIPImageProcessorPil` (what LLaVA-1.5's checkpoints name, and what
transformers uses without torchvision), and `LlavaProcessor`'s expansion of `<image>`. Step by step:

1. load: what `apply_chat_template` does with an image part's URL or base64 (`transformers.image_utils.load_image`):
   EXIF orientation applied (`Orientation.EXIF_TRANSPOSE`), then `convert("RGB")` (an alpha channel dropped, the
   colour under it kept), then the processor's `convert_to_rgb` (a palette transparency composited onto white):
   `ColourPolicy.PIL_CONVERT`. Given a Pillow image directly, the image processor instead ignores EXIF and
   composites alpha onto white (`dataclasses.replace(family, orientation=IGNORE, colour=COMPOSITE_WHITE)`);
2. resize: the shorter side to `shortest_edge`, the longer to `int(shortest_edge * long / short)` (truncated),
   Pillow's BICUBIC on the 8-bit RGB image;
3. center crop to `crop_size`: top = (h - crop_h) // 2, left = (w - crop_w) // 2 (zero padding where the image is
   smaller, as transformers pads);
4. rescale: `uint8 -> float64 * rescale_factor -> float32`; normalize `(x - mean) / std` in float32, (C, H, W);
5. placeholders: `(crop_h // patch) * (crop_w // patch) + num_additional_image_tokens`, minus one when
   `vision_feature_select_strategy == "default"`: 24 * 24 + 1 - 1 = 576 copies of `<image>`;
6. ids: `LlavaProcessor.apply_chat_template(tokenize=True)` tokenizes the prompt with `add_special_tokens=True`
   unless it starts with the tokenizer's `bos_token` (transformers' `ProcessorMixin`), so LLaVA-1.5's ids begin
   with `<s>`, which its template does not write: `processor_adds_special_tokens` says so, and `Model.run_images`
   adds them (`images.with_processor_special_tokens`, recorded as `added_special_tokens`).

ctxlock refuses an aspect ratio over `max_aspect` (200:1) with `ImageSizeError`: transformers would first resize a
1 x 4000 image to 336 x 1,344,000 pixels before cropping it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from ctxlock.core import FrozenDict, freeze
from ctxlock.errors import ImageSizeError
from ctxlock.multimodal._base import (
    ColourPolicy,
    DecodedImage,
    ImageHeader,
    ImagePlan,
    Orientation,
    Preprocessed,
    ResizeStep,
)

__all__ = ["CLIP_MEAN", "CLIP_STD", "LlavaFamily", "shortest_edge_size"]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# PIL's resampling filters by the integer transformers writes in preprocessor_config.json.
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
_PIL_FILTER = {
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


def shortest_edge_size(height: int, width: int, shortest_edge: int) -> tuple[int, int]:
    """(height, width) after transformers' `get_resize_output_image_size(size=shortest_edge,
    default_to_square=False)`: the longer side truncated, not rounded."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = shortest_edge, int(shortest_edge * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def _config_error(message: str, key: str) -> ImageSizeError:
    return ImageSizeError(message, path=key, hint="use LLaVA-1.5's preprocessor_config.json values")


@dataclass(frozen=True)
class LlavaFamily:
    """CLIP image processing plus LlavaProcessor's placeholder count. Defaults: llava-hf/llava-1.5-7b-hf."""

    shortest_edge: int = 336
    crop_height: int = 336
    crop_width: int = 336
    resample: str = "bicubic"
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    patch_size: int = 14
    num_additional_image_tokens: int = 1
    vision_feature_select_strategy: str = "default"
    image_token: str = "<image>"
    max_aspect: int = 200
    name: str = "llava"
    orientation: Orientation = Orientation.EXIF_TRANSPOSE
    colour: ColourPolicy = ColourPolicy.PIL_CONVERT
    processor_adds_special_tokens: bool = True  # LlavaProcessor's tokenize step: add_special_tokens=True

    def __post_init__(self) -> None:
        for key in ("shortest_edge", "crop_height", "crop_width", "patch_size", "max_aspect"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise _config_error(f"llava {key} must be a positive integer, got {value!r}", key)
        if self.resample not in _PIL_FILTER:
            raise _config_error(f"unknown resample filter {self.resample!r}", "resample")
        if self.vision_feature_select_strategy not in ("default", "full"):
            raise _config_error(
                "vision_feature_select_strategy must be 'default' or 'full', "
                f"got {self.vision_feature_select_strategy!r}",
                "vision_feature_select_strategy",
            )
        if self.image_tokens() < 1:
            raise _config_error("the settings give an image no placeholder token", "patch_size")

    @classmethod
    def from_configs(cls, preprocessor: Mapping[str, Any], processor: Mapping[str, Any] | None = None) -> LlavaFamily:
        """From a checkpoint's preprocessor_config.json (and processor_config.json) values. A step turned off there
        (do_resize, do_center_crop, do_rescale, do_normalize, do_convert_rgb false) is refused: not what LLaVA does."""
        for flag in ("do_resize", "do_center_crop", "do_rescale", "do_normalize", "do_convert_rgb"):
            if preprocessor.get(flag, True) is not True:
                raise _config_error(f"{flag} is not true: ctxlock's LLaVA family does every CLIP step", flag)
        size = preprocessor.get("size", {"shortest_edge": 336})
        crop = preprocessor.get("crop_size", {"height": 336, "width": 336})
        if not isinstance(size, Mapping) or set(size) != {"shortest_edge"}:
            raise _config_error(f"size must be {{'shortest_edge': N}}, got {size!r}", "size")
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        if not isinstance(crop, Mapping) or set(crop) != {"height", "width"}:
            raise _config_error(f"crop_size must be {{'height': H, 'width': W}}, got {crop!r}", "crop_size")
        resample = preprocessor.get("resample", 3)
        proc = dict(processor or {})
        return cls(
            shortest_edge=size["shortest_edge"],
            crop_height=crop["height"],
            crop_width=crop["width"],
            resample=_RESAMPLE.get(resample, str(resample)) if isinstance(resample, int) else str(resample),
            rescale_factor=float(preprocessor.get("rescale_factor", 1 / 255)),
            image_mean=tuple(preprocessor.get("image_mean", CLIP_MEAN)),
            image_std=tuple(preprocessor.get("image_std", CLIP_STD)),
            patch_size=proc.get("patch_size", 14),
            num_additional_image_tokens=proc.get("num_additional_image_tokens", 1),
            vision_feature_select_strategy=proc.get("vision_feature_select_strategy", "default"),
            image_token=proc.get("image_token", "<image>"),
        )

    @property
    def template_placeholder(self) -> str:
        return self.image_token

    def image_tokens(self) -> int:
        n = (self.crop_height // self.patch_size) * (self.crop_width // self.patch_size)
        n += self.num_additional_image_tokens
        return n - 1 if self.vision_feature_select_strategy == "default" else n

    def params(self) -> FrozenDict:
        return freeze(
            {
                "family": self.name,
                "reference": "transformers CLIPImageProcessorPil + LlavaProcessor (5.24)",
                "shortest_edge": self.shortest_edge,
                "crop_size": [self.crop_height, self.crop_width],
                "resample": f"Pillow {self.resample}",
                "rescale_factor": self.rescale_factor,
                "image_mean": list(self.image_mean),
                "image_std": list(self.image_std),
                "layout": "CHW float32",
                "patch_size": self.patch_size,
                "num_additional_image_tokens": self.num_additional_image_tokens,
                "vision_feature_select_strategy": self.vision_feature_select_strategy,
                "image_token": self.image_token,
                "orientation": self.orientation.value,
                "colour": self.colour.value,
                "max_aspect": self.max_aspect,
                "add_special_tokens": self.processor_adds_special_tokens,
            }
        )

    def plan_size(self, height: int, width: int) -> ImagePlan:
        if width < 1 or height < 1:
            raise ImageSizeError(
                f"the image is {width}x{height} pixels", path="image", hint="send an image at least 1x1 pixels"
            )
        if max(width, height) > self.max_aspect * min(width, height):
            raise ImageSizeError(
                f"the image is {width}x{height}: its aspect ratio is over {self.max_aspect}:1",
                path="image",
                hint=f"crop or pad the image to an aspect ratio of at most {self.max_aspect}:1",
            )
        resized = shortest_edge_size(height, width, self.shortest_edge)
        crop = (self.crop_height, self.crop_width)
        steps = (
            ResizeStep("resize", (height, width), resized, f"shortest edge to {self.shortest_edge}, {self.resample}"),
            ResizeStep(
                "center-crop", resized, crop, f"top {(resized[0] - crop[0]) // 2}, left {(resized[1] - crop[1]) // 2}"
            ),
        )
        return ImagePlan(
            family=self.name,
            image_size=(height, width),
            resized=resized,
            grid=(self.crop_height // self.patch_size, self.crop_width // self.patch_size),
            n_tokens=self.image_tokens(),
            steps=steps,
            params=self.params(),
        )

    def plan(self, header: ImageHeader) -> ImagePlan:
        return self.plan_size(*header.oriented_size(self.orientation))

    def placeholders(self, plan: ImagePlan) -> tuple[str, ...]:
        return (self.image_token,) * plan.n_tokens

    def pixel_values(self, rgb: np.ndarray, plan: ImagePlan) -> np.ndarray:
        """(3, crop_h, crop_w) float32 for (h, w, 3) uint8 RGB pixels."""
        height, width = plan.resized
        resized = np.asarray(Image.fromarray(np.asarray(rgb)).resize((width, height), _PIL_FILTER[self.resample]))
        cropped = _center_crop(resized, self.crop_height, self.crop_width)
        scaled = (cropped.astype(np.float64) * self.rescale_factor).astype(np.float32)
        scaled -= np.asarray(self.image_mean, dtype=np.float32)
        scaled /= np.asarray(self.image_std, dtype=np.float32)
        return np.ascontiguousarray(scaled.transpose(2, 0, 1))

    def preprocess(self, image: DecodedImage) -> Preprocessed:
        height, width = image.size
        plan = self.plan_size(height, width)
        return Preprocessed(plan=plan, pixel_values=self.pixel_values(image.rgb, plan))


def _center_crop(image: np.ndarray, crop_h: int, crop_w: int) -> np.ndarray:
    """transformers' `center_crop` on (H, W, C): the centre, zero-padded (centred, ceil) where the image is smaller."""
    h, w = image.shape[:2]
    top, left = (h - crop_h) // 2, (w - crop_w) // 2
    if top >= 0 and left >= 0 and top + crop_h <= h and left + crop_w <= w:
        return image[top : top + crop_h, left : left + crop_w]
    new_h, new_w = max(crop_h, h), max(crop_w, w)
    padded = np.zeros((new_h, new_w, image.shape[2]), dtype=image.dtype)
    top_pad, left_pad = -(-(new_h - h) // 2), -(-(new_w - w) // 2)
    padded[top_pad : top_pad + h, left_pad : left_pad + w] = image
    top, left = top + top_pad, left + left_pad
    return padded[max(0, top) : min(new_h, top + crop_h), max(0, left) : min(new_w, left + crop_w)]
