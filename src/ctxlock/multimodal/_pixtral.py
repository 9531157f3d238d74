"""Pixtral / Mistral images, with mistral-common's image encoder semantics (`ImageEncoder`, mistral-common 1.13).

mistral-common turns an image into tokens and pixels like this, and so does this module:

1. size: the image's stored (width, height), EXIF orientation not applied (mistral-common opens the image and
   reads `img.size`), so `orientation` is `Orientation.IGNORE`;
2. downscale: `ratio = max(w, h) / max_image_size`; above 1, `w, h = max(round(w / ratio), 1), max(round(h /
   ratio), 1)` (Python's `round`: half to even);
3. grid: `cols = (w - 1) // (patch * merge) + 1`, `rows = (h - 1) // (patch * merge) + 1`;
4. tokens: `[IMG]` x cols then `[IMG_BREAK]`, per row, with the very last token replaced by `[IMG_END]`:
   `rows * (cols + 1)` tokens;
5. pixels: any non-RGB mode composited onto white (`ColourPolicy.COMPOSITE_WHITE`), float32, resized to
   `(cols * patch * merge, rows * patch * merge)` with OpenCV's bicubic, divided by 255, minus the mean, over the
   std, laid out (C, H, W).

The resize is mistral-common's own call, `cv2.resize(float32, size, interpolation=cv2.INTER_CUBIC)`, when OpenCV
is installed (`pip install ctxlock[opencv]`): then the pixels are mistral-common's bit for bit in the same process
(OpenCV's x86 wheels send some resizes through Intel IPP, whose bicubic is not OpenCV's portable algorithm, so
mistral-common's own pixels depend on the OpenCV build and the CPU; ctxlock calls the same build). Without OpenCV,
`resample.cubic_resize` computes OpenCV's portable algorithm in numpy: not exact against mistral-common, max |diff|
<= `resample.PORTABLE_MAX_DIFF` (2e-4, measured 1.14e-4) after normalization. `params()` names the resizer and its
version (`resizer`, `resizer_version`, `resample`), so a record says which one ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

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
from ctxlock.multimodal._resample import Resizer

__all__ = ["DATASET_MEAN", "DATASET_STD", "MAX_ASPECT", "PixtralFamily", "pixtral_grid"]

# mistral-common's DATASET_MEAN / DATASET_STD (the CLIP values), RGB.
DATASET_MEAN = (0.48145466, 0.4578275, 0.40821073)
DATASET_STD = (0.26862954, 0.26130258, 0.27577711)

# ctxlock's own bound (mistral-common has none): a longer side more than this many times the shorter is refused,
# since the downscale would keep the long side at max_image_size and squash the short one to a single pixel row.
MAX_ASPECT = 200


def pixtral_grid(
    width: int, height: int, *, patch: int, max_size: int, merge: int = 1
) -> tuple[int, int, int, int, bool]:
    """(cols, rows, w, h, downscaled): mistral-common's `_image_to_num_tokens`, plus the size it was computed at."""
    w: float | int = width
    h: float | int = height
    ratio = max(h / max_size, w / max_size)
    downscaled = ratio > 1
    if downscaled:
        w = max(round(w / ratio), 1)
        h = max(round(h / ratio), 1)
    step = patch * merge
    cols = (int(w) - 1) // step + 1
    rows = (int(h) - 1) // step + 1
    return cols, rows, int(w), int(h), downscaled


@dataclass(frozen=True)
class PixtralFamily:
    """mistral-common's `ImageConfig` (patch size, max image size, spatial merge) and the three marker tokens."""

    image_patch_size: int = 16
    max_image_size: int = 1024
    spatial_merge_size: int = 1
    img_token: str = "[IMG]"
    img_break_token: str = "[IMG_BREAK]"
    img_end_token: str = "[IMG_END]"
    image_mean: tuple[float, float, float] = DATASET_MEAN
    image_std: tuple[float, float, float] = DATASET_STD
    max_aspect: int = MAX_ASPECT
    name: str = "pixtral"
    orientation: Orientation = Orientation.IGNORE
    colour: ColourPolicy = ColourPolicy.COMPOSITE_WHITE
    # the full-size float32 RGB copy mistral-common resizes (media.decode_steps)
    full_size_bytes: ClassVar[int] = 12
    # OpenCV (exact against mistral-common) when installed, else the portable numpy resizer (not exact)
    resizer: Resizer = field(default_factory=Resizer.detect)

    def __post_init__(self) -> None:
        if self.resizer.kind not in ("opencv", "portable"):
            raise ImageSizeError(
                f"unknown resizer {self.resizer.kind!r}",
                path="resizer",
                hint='use Resizer.detect(), Resizer.portable() or Resizer("opencv", version)',
            )
        for field_name in ("image_patch_size", "max_image_size", "spatial_merge_size", "max_aspect"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ImageSizeError(
                    f"pixtral {field_name} must be a positive integer, got {value!r}",
                    path=field_name,
                    hint="take the values from the tokenizer's `image` section (tekken.json)",
                )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PixtralFamily:
        """From mistral-common's image settings (a Tekken file's `image` section, as the artifacts layer passes it:
        `image_patch_size`, `max_image_size`, `spatial_merge_size`)."""
        return cls(
            image_patch_size=config.get("image_patch_size", 16),
            max_image_size=config.get("max_image_size", 1024),
            spatial_merge_size=config.get("spatial_merge_size", 1),
        )

    @property
    def template_placeholder(self) -> str:
        """What mistral-common's template writes for one image; expansion replaces it with `placeholders(plan)`."""
        return self.img_token

    def params(self) -> FrozenDict:
        return freeze(
            {
                "family": self.name,
                "reference": "mistral-common ImageEncoder (1.13)",
                "image_patch_size": self.image_patch_size,
                "max_image_size": self.max_image_size,
                "spatial_merge_size": self.spatial_merge_size,
                "downscale": "ratio = max(w, h) / max_image_size; if > 1: round(w / ratio), round(h / ratio), min 1",
                "resample": self.resizer.describe(),
                "resizer": self.resizer.kind,
                "resizer_version": self.resizer.version,
                "exact_vs_reference": self.resizer.exact,
                "rescale_factor": 1 / 255,
                "image_mean": list(self.image_mean),
                "image_std": list(self.image_std),
                "layout": "CHW float32",
                "orientation": self.orientation.value,
                "colour": self.colour.value,
                "tokens": [self.img_token, self.img_break_token, self.img_end_token],
                "max_aspect": self.max_aspect,
            }
        )

    def plan_size(self, width: int, height: int) -> ImagePlan:
        """The plan for an image of this stored size (what `plan(header)` computes)."""
        if width < 1 or height < 1:
            raise ImageSizeError(
                f"the image is {width}x{height} pixels: a side of zero has no patch",
                path="image",
                hint="send an image at least one pixel wide and high",
            )
        if max(width, height) > self.max_aspect * min(width, height):
            raise ImageSizeError(
                f"the image is {width}x{height}: its aspect ratio is over {self.max_aspect}:1",
                path="image",
                hint=f"crop or pad the image to an aspect ratio of at most {self.max_aspect}:1",
            )
        cols, rows, w, h, downscaled = pixtral_grid(
            width, height, patch=self.image_patch_size, max_size=self.max_image_size, merge=self.spatial_merge_size
        )
        step = self.image_patch_size * self.spatial_merge_size
        steps = []
        if downscaled:
            steps.append(ResizeStep("downscale", (height, width), (h, w), f"longest side over {self.max_image_size}"))
        steps.append(ResizeStep("patch-grid", (h, w), (rows * step, cols * step), f"{rows}x{cols} cells of {step}px"))
        return ImagePlan(
            family=self.name,
            image_size=(height, width),
            resized=(rows * step, cols * step),
            grid=(rows, cols),
            n_tokens=rows * (cols + 1),
            steps=tuple(steps),
            params=self.params(),
        )

    def plan(self, header: ImageHeader) -> ImagePlan:
        return self.plan_size(header.width, header.height)

    def placeholders(self, plan: ImagePlan) -> tuple[str, ...]:
        rows, cols = plan.grid
        tokens = ([self.img_token] * cols + [self.img_break_token]) * rows
        tokens[-1] = self.img_end_token
        return tuple(tokens)

    def pixel_values(self, rgb: np.ndarray, plan: ImagePlan) -> np.ndarray:
        """(3, H, W) float32 for (h, w, 3) uint8 RGB pixels, under `plan` (a transposed view of an (H, W, 3)
        array, as mistral-common's own result is)."""
        out_h, out_w = plan.resized
        resized = self.resizer(np.asarray(rgb), out_w, out_h)
        # mistral-common's `normalize`, the same float32 operations in the same order (in place on OpenCV's
        # fresh array; the portable resizer's view gets a new one)
        own = resized.flags.c_contiguous and resized.flags.writeable and resized.dtype == np.float32
        image = np.divide(resized, np.float32(255.0), dtype=np.float32, out=resized if own else None)
        image -= np.asarray(self.image_mean, dtype=np.float32)
        image /= np.asarray(self.image_std, dtype=np.float32)
        chw: np.ndarray = image.transpose(2, 0, 1)
        return chw  # (C, H, W), a view, as mistral-common returns it

    def preprocess(self, image: DecodedImage) -> Preprocessed:
        height, width = image.size
        plan = self.plan_size(width, height)
        return Preprocessed(plan=plan, pixel_values=self.pixel_values(image.rgb, plan))
