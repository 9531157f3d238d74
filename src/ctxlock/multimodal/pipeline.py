"""One image through the stage: bytes -> header (pixel cap) -> plan -> decode -> pixel values, each step a value.

`plan_images` stops at the plan (header only: what `count` and the budget use); `process_images` goes on to the
pixels, and checks that the decoded image gives the plan the header gave.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctxlock.errors import ImageDecodeError, MediaError
from ctxlock.multimodal import media
from ctxlock.multimodal.base import (
    AnimationPolicy,
    DecodedImage,
    ImageFamily,
    ImageHeader,
    ImagePlan,
    Preprocessed,
    pixel_digest,
)
from ctxlock.multimodal.sources import ImageBytes, ImageRef, image_refs, resolve
from ctxlock.request import Request


@dataclass(frozen=True)
class StageOptions:
    """The caller's choices for the image stage (recorded)."""

    max_pixels: int = media.DEFAULT_MAX_PIXELS  # the header cap, before any decode
    animation: AnimationPolicy = AnimationPolicy.FIRST_FRAME

    def to_json(self) -> dict[str, Any]:
        return {"max_pixels": self.max_pixels, "animation": self.animation.value}


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One image of a request: where it came from, its header, the family's plan and, once processed, its pixels."""

    ref: ImageRef
    origin: str  # "data-url" or "supplied"
    declared_type: str | None
    header: ImageHeader
    plan: ImagePlan
    decoded: DecodedImage | None = None
    pixels: Preprocessed | None = None

    @property
    def n_tokens(self) -> int:
        return self.plan.n_tokens

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.ref.index,
            "path": self.ref.path,
            "origin": self.origin,
            "declared_type": self.declared_type,
            "header": self.header.to_json(),
            "plan": self.plan.to_json(),
        }
        if self.decoded is not None:
            out["decode"] = {**self.decoded.to_json(), "fingerprint": list(media.fingerprint(self.decoded.rgb))}
        if self.pixels is not None:
            out["pixel_values"] = {
                "shape": list(self.pixels.pixel_values.shape),
                "dtype": str(self.pixels.pixel_values.dtype),
                "sha256": self.pixels.pixel_sha256,
            }
        return out


@contextmanager
def at_path(path: str) -> Iterator[None]:
    """Errors raised without a path (a family's size checks) get the image part's."""
    try:
        yield
    except MediaError as e:
        if e.path is None:
            e.path = path
            e.args = (str(e),)
        raise


def plan_image(ib: ImageBytes, family: ImageFamily, options: StageOptions) -> ImageInput:
    path = ib.ref.path
    header = media.read_header(ib.data, path=path, media_type=ib.declared_type, max_pixels=options.max_pixels)
    if header.frames > 1 and options.animation is AnimationPolicy.ERROR:
        raise ImageDecodeError(
            f"an animated {header.format} with {header.frames} frames",
            path=path,
            hint='send a still image, or use the animation policy "first-frame"',
        )
    with at_path(path):
        plan = family.plan(header)
    return ImageInput(ib.ref, ib.origin, ib.declared_type, header, plan)


def process_image(ib: ImageBytes, family: ImageFamily, options: StageOptions) -> ImageInput:
    planned = plan_image(ib, family, options)
    path = ib.ref.path
    decoded = media.decode(
        ib.data,
        planned.header,
        orientation=family.orientation,
        colour=family.colour,
        animation=options.animation,
        path=path,
    )
    with at_path(path):
        pixels = family.preprocess(decoded)
    if pixels.plan != planned.plan:
        raise ImageDecodeError(
            f"the decoded image gives another plan ({pixels.plan.resized}) than its header ({planned.plan.resized})",
            path=path,
            hint="the header and the pixels disagree; re-encode the image",
        )
    return ImageInput(ib.ref, ib.origin, ib.declared_type, planned.header, planned.plan, decoded, pixels)


def image_bytes(request: Request, media_map: Mapping[str, bytes] | None = None) -> tuple[ImageBytes, ...]:
    return tuple(resolve(ref, media_map) for ref in image_refs(request))


def plan_images(
    request: Request,
    family: ImageFamily,
    media_map: Mapping[str, bytes] | None = None,
    options: StageOptions = StageOptions(),
) -> tuple[ImageInput, ...]:
    """Every image of the request planned from its header alone (nothing decoded)."""
    return tuple(plan_image(ib, family, options) for ib in image_bytes(request, media_map))


def process_images(
    request: Request,
    family: ImageFamily,
    media_map: Mapping[str, bytes] | None = None,
    options: StageOptions = StageOptions(),
) -> tuple[ImageInput, ...]:
    return tuple(process_image(ib, family, options) for ib in image_bytes(request, media_map))


def stack_pixels(images: tuple[ImageInput, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values, grids) over images in order, concatenated as the HF processor does."""
    done = [im.pixels for im in images if im.pixels is not None]
    if not done:
        return np.zeros((0, 0), dtype=np.float32), np.zeros((0, 3), dtype=np.int64)
    arrays = [p.pixel_values for p in done]
    if all(a.ndim == 3 for a in arrays) and len({a.shape for a in arrays}) == 1:
        values = np.stack(arrays)  # whole images (C, H, W): (N, C, H, W), as CLIP/LLaVA processors return them
    elif all(a.ndim == 3 for a in arrays):  # whole images of different sizes (Pixtral): one per entry, as
        values = np.empty(len(arrays), dtype=object)  # mistral-common returns a list of them
        values[:] = arrays
    else:
        values = np.concatenate(arrays, axis=0)  # patch rows (Qwen2-VL): concatenated over the images
    grids = np.array([list(p.plan.grid) for p in done], dtype=np.int64)
    values.flags.writeable = False
    grids.flags.writeable = False
    return values, grids


__all__ = [
    "ImageInput",
    "StageOptions",
    "image_bytes",
    "pixel_digest",
    "plan_image",
    "plan_images",
    "process_image",
    "process_images",
    "stack_pixels",
]
