"""Qwen2-VL / Qwen2.5-VL images, as transformers' `Qwen2VLImageProcessorPil` computes them.

`smart_resize` (factor patch_size * merge_size = 28): both sides a multiple of the factor, the area within
[min_pixels, max_pixels], an aspect ratio over 200 refused. Pixels: PIL resize (bicubic) of the 8-bit RGB image,
x * (1/255) in float64 then float32, (x - mean) / std in float32, then patches laid out as
(grid_t * grid_h * grid_w, C * temporal_patch * patch * patch), in merge-window order. An image is one frame
repeated over the temporal patch (grid_t = 1). Placeholders: grid_t * grid_h * grid_w / merge^2 copies of
`<|image_pad|>`, between the template's `<|vision_start|>` and `<|vision_end|>`.

A video is a list of frames of one size (as `Qwen2VLVideoProcessor` takes them, none sampled): every frame goes
through the same smart_resize (with the video processor's own min/max pixels) and normalization as an image, the
frames are padded to a multiple of temporal_patch_size by repeating the last one, and each group of
temporal_patch_size frames gives grid_h * grid_w patch rows; placeholders are grid_t * grid_h * grid_w / merge^2
copies of `<|video_pad|>`. transformers resizes video frames with torchvision (a tensor bicubic), ctxlock with
PIL's bicubic, as the image processor does (the README says where they can differ).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
from PIL import Image

from ctxlock.core import FrozenDict, freeze, thaw
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

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200
# Qwen2VLVideoProcessor's class defaults (size shortest_edge / longest_edge), apart from the image processor's.
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 28 * 28 * 768
# The preprocessor_config.json keys this family reads; any other key is named in `params()["ignored_keys"]`.
_READ_KEYS = (
    "min_pixels",
    "max_pixels",
    "size",
    "patch_size",
    "temporal_patch_size",
    "merge_size",
    "image_mean",
    "image_std",
    "rescale_factor",
    "resample",
    "do_resize",
    "do_rescale",
    "do_normalize",
    "do_convert_rgb",
)
# Keys that say what the file is, not how to compute: not "ignored".
_NAMING_KEYS = ("image_processor_type", "processor_class", "feature_extractor_type")


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280
) -> tuple[int, int]:
    """(height, width) both multiples of `factor`, area within [min_pixels, max_pixels], aspect kept closely."""
    if min(height, width) <= 0:
        raise ImageSizeError(f"the image is {width}x{height}", hint="send an image with pixels")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ImageSizeError(
            f"aspect ratio {max(height, width) / min(height, width):g} of a {width}x{height} image is over "
            f"{MAX_ASPECT_RATIO}, which Qwen2-VL's smart_resize refuses",
            hint="crop or pad the image",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class Qwen2VL:
    """The Qwen2-VL image family with its parameters (class defaults of Qwen2VLImageProcessorPil)."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL bicubic
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    ignored_keys: tuple[str, ...] = ()
    source: str = "class defaults"
    orientation: Orientation = Orientation.EXIF_TRANSPOSE
    colour: ColourPolicy = ColourPolicy.PIL_CONVERT
    video_min_pixels: int = VIDEO_MIN_PIXELS
    video_max_pixels: int = VIDEO_MAX_PIXELS

    name = "qwen2-vl"
    template_placeholder = "<|image_pad|>"
    video_placeholder = "<|video_pad|>"

    @classmethod
    def from_preprocessor_config(cls, config: Mapping[str, Any], *, source: str = "preprocessor_config.json") -> Self:
        """Parameters as transformers reads them from a checkpoint: `min_pixels`/`max_pixels` win over `size`'s
        `shortest_edge`/`longest_edge`, which win over the class defaults. The video processor reads the same file
        when the checkpoint has no video_preprocessor_config.json, so the same keys set the video's pixel range
        (else the video processor's own defaults)."""
        kw: dict[str, Any] = {}
        size = config.get("size")
        if isinstance(size, Mapping):
            if "shortest_edge" in size:
                kw["min_pixels"] = int(size["shortest_edge"])
            if "longest_edge" in size:
                kw["max_pixels"] = int(size["longest_edge"])
        for key in ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size", "resample"):
            if config.get(key) is not None:
                kw[key] = int(config[key])
        for key in ("min_pixels", "max_pixels"):
            if key in kw:
                kw[f"video_{key}"] = kw[key]
        for key in ("image_mean", "image_std"):
            if config.get(key) is not None:
                value = config[key]
                kw[key] = tuple(float(v) for v in (value if isinstance(value, list | tuple) else [value] * 3))
        if config.get("rescale_factor") is not None:
            kw["rescale_factor"] = float(config["rescale_factor"])
        for key in ("do_resize", "do_rescale", "do_normalize"):
            if config.get(key) is not None:
                kw[key] = bool(config[key])
        ignored = tuple(k for k in config if k not in _READ_KEYS and k not in _NAMING_KEYS)
        return cls(**kw, ignored_keys=ignored, source=source)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def params(self) -> FrozenDict:
        return freeze(
            {
                "family": self.name,
                "source": self.source,
                "min_pixels": self.min_pixels,
                "max_pixels": self.max_pixels,
                "factor": self.factor,
                "patch_size": self.patch_size,
                "temporal_patch_size": self.temporal_patch_size,
                "merge_size": self.merge_size,
                "image_mean": list(self.image_mean),
                "image_std": list(self.image_std),
                "rescale_factor": self.rescale_factor,
                "resample": self.resample,
                "do_resize": self.do_resize,
                "do_rescale": self.do_rescale,
                "do_normalize": self.do_normalize,
                "orientation": self.orientation.value,
                "colour": self.colour.value,
                "ignored_keys": list(self.ignored_keys),
            }
        )

    def video_params(self) -> FrozenDict:
        """The image parameters, with the video processor's own (a video plan's `params`)."""
        video = {
            "min_pixels": self.video_min_pixels,
            "max_pixels": self.video_max_pixels,
            "frame_sampling": "none: every frame given is used",
            "cap_pixels_per_frame": False,
            "frame_resize": "PIL bicubic per frame (transformers: torchvision bicubic)",
        }
        params: FrozenDict = freeze({**thaw(self.params()), "video": video})
        return params

    def _resize(
        self, height: int, width: int, min_pixels: int, max_pixels: int
    ) -> tuple[tuple[int, int], list[ResizeStep]]:
        steps: list[ResizeStep] = []
        resized = (height, width)
        if self.do_resize:
            resized = smart_resize(height, width, self.factor, min_pixels, max_pixels)
            rounded = (round(height / self.factor) * self.factor, round(width / self.factor) * self.factor)
            area = rounded[0] * rounded[1]
            why = (
                f"area over max_pixels {max_pixels}"
                if area > max_pixels
                else f"area under min_pixels {min_pixels}"
                if area < min_pixels
                else f"rounded to multiples of {self.factor}"
            )
            steps.append(ResizeStep("smart_resize", (height, width), resized, why))
        elif height % self.factor or width % self.factor:
            raise ImageSizeError(
                f"do_resize is off and {width}x{height} is not a multiple of {self.factor}",
                hint="turn do_resize on in preprocessor_config.json",
            )
        return resized, steps

    def plan_size(self, height: int, width: int) -> ImagePlan:
        """The plan for an image of (height, width) after orientation."""
        resized, steps = self._resize(height, width, self.min_pixels, self.max_pixels)
        grid = (1, resized[0] // self.patch_size, resized[1] // self.patch_size)
        n_tokens = grid[0] * grid[1] * grid[2] // (self.merge_size**2)
        return ImagePlan(
            family=self.name,
            image_size=(height, width),
            resized=resized,
            grid=grid,
            n_tokens=n_tokens,
            steps=tuple(steps),
            params=self.params(),
        )

    def plan(self, header: ImageHeader) -> ImagePlan:
        height, width = header.oriented_size(self.orientation)
        return self.plan_size(height, width)

    def placeholders(self, plan: ImagePlan) -> tuple[str, ...]:
        return (self.template_placeholder,) * plan.n_tokens

    def preprocess(self, image: DecodedImage) -> Preprocessed:
        height, width = image.size
        plan = self.plan_size(height, width)
        chw = self.normalized(image.rgb, plan.resized)
        return Preprocessed(plan=plan, pixel_values=self.patchify(chw[None]))

    def normalized(self, rgb: np.ndarray, resized: tuple[int, int]) -> np.ndarray:
        """(C, H, W) float32: resized, rescaled and normalized as the PIL backend does."""
        pixels: np.ndarray = rgb
        if self.do_resize:
            im = Image.fromarray(np.ascontiguousarray(rgb), mode="RGB")
            pixels = np.array(im.resize((resized[1], resized[0]), resample=self.resample))
        chw = np.moveaxis(pixels, -1, 0)
        if self.do_rescale:
            chw = (chw.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            chw = chw.astype(np.float32) if not np.issubdtype(chw.dtype, np.floating) else chw
            mean = np.array(self.image_mean, dtype=chw.dtype)
            std = np.array(self.image_std, dtype=chw.dtype)
            chw = ((chw.T - mean) / std).T
        return np.asarray(chw, dtype=np.float32)

    def patchify(self, frames: np.ndarray) -> np.ndarray:
        """(T, C, H, W) frames -> (grid_t * grid_h * grid_w, C * temporal_patch * patch * patch). A single image is
        repeated over the temporal patch; a video's frames are padded by repeating the last one."""
        tp, p, m = self.temporal_patch_size, self.patch_size, self.merge_size
        if frames.shape[0] == 1:  # an image: one frame over the temporal patch, broadcast (no copy)
            frames = np.broadcast_to(frames, (tp, *frames.shape[1:]))
        elif frames.shape[0] % tp:
            frames = np.concatenate([frames, np.repeat(frames[-1:], tp - frames.shape[0] % tp, axis=0)])
        t, c, h, w = frames.shape
        gt, gh, gw = t // tp, h // p, w // p
        x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (gt, gh/m, gw/m, m, m, C, tp, p, p)
        return np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * p * p), dtype=np.float32)

    # -- video: a list of frames -----------------------------------------------------------------------------

    def plan_video(self, sizes: Sequence[tuple[int, int]]) -> ImagePlan:
        """The plan for a video whose frames have these (height, width) sizes after orientation (all equal)."""
        if not sizes:
            raise ImageSizeError("a video without frames", hint="send at least one frame")
        height, width = sizes[0]
        for k, size in enumerate(sizes):
            if size != sizes[0]:
                raise ImageSizeError(
                    f"frame {k} is {size[1]}x{size[0]} but frame 0 is {width}x{height}",
                    hint="a video's frames share one size; resize them alike before sending",
                )
        resized, steps = self._resize(height, width, self.video_min_pixels, self.video_max_pixels)
        n, tp = len(sizes), self.temporal_patch_size
        grid_t = -(-n // tp)
        if n % tp:
            why = f"{n} frames padded to {grid_t * tp} by repeating the last (temporal_patch_size {tp})"
            steps.append(ResizeStep("pad_frames", resized, resized, why))
        grid = (grid_t, resized[0] // self.patch_size, resized[1] // self.patch_size)
        return ImagePlan(
            family=self.name,
            image_size=(height, width),
            resized=resized,
            grid=grid,
            n_tokens=grid[0] * grid[1] * grid[2] // (self.merge_size**2),
            steps=tuple(steps),
            params=self.video_params(),
        )

    def video_placeholders(self, plan: ImagePlan) -> tuple[str, ...]:
        return (self.video_placeholder,) * plan.n_tokens

    def preprocess_video(self, frames: Sequence[DecodedImage]) -> Preprocessed:
        """pixel_values_videos for decoded frames, laid out as Qwen2VLVideoProcessor's."""
        plan = self.plan_video([f.size for f in frames])
        chw = np.stack([self.normalized(f.rgb, plan.resized) for f in frames])
        return Preprocessed(plan=plan, pixel_values=self.patchify(chw))
