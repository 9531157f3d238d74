"""The values every image family shares, and the interface a family module (`qwen2vl`, `pixtral`, `llava`) keeps.

An image goes through these steps, each a recorded value:

    bytes --media.read_header--> ImageHeader     (sha256, format, size, frames, mode, EXIF orientation; no decode)
          --family.plan-------> ImagePlan        (resize steps, grid, placeholder count; from the header alone)
          --media.decode------> DecodedImage     (Pillow, version recorded; orientation and colour policy applied)
          --family.preprocess-> Preprocessed     (pixel_values float32, grid, the plan it was computed under)
          --family.placeholders(plan)--> the token strings that replace the template's one placeholder

`plan` never decodes: `count` and the budget use it. `preprocess(decoded)` must give the same `plan` as
`plan(header)` for the same image (tests hold every family to that). Every parameter the result depends on is in
`params` (mean, std, sizes, patch, merge, resample...), as plain JSON values, so records can keep it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ctxlock.core import FrozenDict, thaw


class Orientation(StrEnum):
    """What is done with an EXIF orientation tag."""

    EXIF_TRANSPOSE = "exif-transpose"  # PIL.ImageOps.exif_transpose, as transformers' load_image does (default)
    IGNORE = "ignore"  # the stored pixels as they are, as an image processor given a PIL image directly does


class ColourPolicy(StrEnum):
    """How any mode becomes 8-bit RGB."""

    # PIL's Image.convert("RGB"), as transformers' `load_image` does for URLs, paths and base64 (what
    # apply_chat_template uses): an alpha channel is dropped, the colour under it kept.
    PIL_CONVERT = "pil-convert"
    # transformers' `convert_to_rgb` (image processors' do_convert_rgb on a PIL image), and mistral-common: anything
    # with alpha (or a palette transparency) is composited onto white, the rest goes through convert("RGB").
    COMPOSITE_WHITE = "composite-white"


class AnimationPolicy(StrEnum):
    """What is done with an image that has more than one frame (GIF, APNG, WebP, multi-page TIFF)."""

    FIRST_FRAME = "first-frame"  # frame 0, as PIL.Image.open and transformers do; the frame count is recorded
    ERROR = "error"  # refuse with ImageDecodeError


@dataclass(frozen=True, eq=False)
class ImageHeader:
    """What the header says, read before any pixel is decoded. `width`/`height` are as stored;
    `oriented_size()` is (height, width) after the EXIF orientation under a policy.

    `sha256` (of the whole file) is computed on first use from the bytes the header was read from (`source`):
    counting needs the header alone, records and replay ask for the digest. Two headers are equal when their
    fields and digests are."""

    n_bytes: int
    format: str  # Pillow's format name: PNG, JPEG, GIF, WEBP, BMP, TIFF
    media_type: str  # the media type the bytes' signature names, e.g. image/png
    width: int
    height: int
    mode: str  # Pillow's mode as stored: RGB, RGBA, P, L, LA, CMYK, I;16, 1, ...
    frames: int
    orientation: int  # the EXIF orientation tag, 1 when absent
    source: bytes = field(default=b"", repr=False)  # the file's bytes (the same object, not a copy)
    digest: str = field(default="", repr=False)  # sha256 of `source`, filled on first use of `sha256`
    # a transparency entry (PNG tRNS, GIF transparent index) in the header: the decode composites onto white
    transparency: bool = field(default=False, repr=False)

    @property
    def sha256(self) -> str:
        if not self.digest:
            object.__setattr__(self, "digest", hashlib.sha256(self.source).hexdigest())
        return self.digest

    def read_from(self, data: bytes) -> bool:
        """Whether `data` is the very object this header was read from (bytes are immutable: the same file)."""
        return self.source is data

    def identity(self) -> tuple[Any, ...]:
        return (
            self.n_bytes,
            self.format,
            self.media_type,
            self.width,
            self.height,
            self.mode,
            self.frames,
            self.orientation,
            self.sha256,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageHeader) and self.identity() == other.identity()

    def __hash__(self) -> int:
        return hash(self.identity())

    def oriented_size(self, policy: Orientation = Orientation.EXIF_TRANSPOSE) -> tuple[int, int]:
        """(height, width) the family sees: swapped for EXIF orientations 5-8 under exif-transpose."""
        if policy is Orientation.EXIF_TRANSPOSE and self.orientation in (5, 6, 7, 8):
            return self.width, self.height
        return self.height, self.width

    def to_json(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "bytes": self.n_bytes,
            "format": self.format,
            "media_type": self.media_type,
            "width": self.width,
            "height": self.height,
            "mode": self.mode,
            "frames": self.frames,
            "orientation": self.orientation,
        }


@dataclass(frozen=True, eq=False)
class DecodedImage:
    """Decoded pixels as 8-bit RGB, (height, width, 3) uint8, read-only, and how they were obtained."""

    header: ImageHeader
    rgb: np.ndarray
    decoder: str  # e.g. "Pillow 13.0.0"
    orientation: Orientation
    colour: ColourPolicy
    animation: AnimationPolicy
    transposed: bool  # an EXIF orientation other than 1 was applied

    @property
    def size(self) -> tuple[int, int]:
        return int(self.rgb.shape[0]), int(self.rgb.shape[1])

    def to_json(self) -> dict[str, Any]:
        return {
            "decoder": self.decoder,
            "orientation": self.orientation.value,
            "colour": self.colour.value,
            "animation": self.animation.value,
            "transposed": self.transposed,
            "decoded_size": list(self.size),
        }


@dataclass(frozen=True)
class ResizeStep:
    """One step of a family's resize policy, e.g. ("smart_resize", (3000, 4000), (1316, 1764), "max_pixels")."""

    name: str
    size_in: tuple[int, int]  # (height, width)
    size_out: tuple[int, int]
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.name, "from": list(self.size_in), "to": list(self.size_out), "why": self.why}


@dataclass(frozen=True)
class ImagePlan:
    """What a family will make of an image, computed from its (oriented) size alone: no pixel is decoded."""

    family: str
    image_size: tuple[int, int]  # (height, width) after orientation
    resized: tuple[int, int]  # (height, width) the pixels are resized to
    grid: tuple[int, ...]  # the family's grid, e.g. Qwen2-VL (t, h, w) in patches; Pixtral (rows, cols)
    n_tokens: int  # placeholder tokens the image takes in the expanded text
    steps: tuple[ResizeStep, ...]
    params: FrozenDict  # every parameter the result depends on

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "image_size": list(self.image_size),
            "resized": list(self.resized),
            "grid": list(self.grid),
            "tokens": self.n_tokens,
            "steps": [s.to_json() for s in self.steps],
            "params": thaw(self.params),
        }


@dataclass(frozen=True, eq=False)
class Preprocessed:
    """A family's tensors for one image: `pixel_values` float32 (read-only), laid out as its HF processor does."""

    plan: ImagePlan
    pixel_values: np.ndarray
    digest: str = field(default="")  # computed on first use of `pixel_sha256` (hashing 288 MB takes a while)

    def __post_init__(self) -> None:
        self.pixel_values.flags.writeable = False

    @property
    def pixel_sha256(self) -> str:
        if not self.digest:
            object.__setattr__(self, "digest", pixel_digest(self.pixel_values))
        return self.digest


def pixel_digest(values: np.ndarray) -> str:
    """sha256 over dtype, shape and the C-order bytes: equal digests mean bit-identical tensors."""
    h = hashlib.sha256()
    h.update(f"{values.dtype.str}{tuple(values.shape)}".encode())
    h.update(np.ascontiguousarray(values).data.cast("B"))
    return h.hexdigest()


@runtime_checkable
class ImageFamily(Protocol):
    """A model family's image semantics. Instances are frozen dataclasses holding their parameters (so the
    attributes are read-only here)."""

    @property
    def name(self) -> str:
        """The family's name: "qwen2-vl", "pixtral", "llava"."""
        ...

    @property
    def template_placeholder(self) -> str:
        """What the template emits per image and expansion replaces, e.g. "<|image_pad|>"."""
        ...

    @property
    def orientation(self) -> Orientation:
        """The decode policies the family's reference uses (with `colour`)."""
        ...

    @property
    def colour(self) -> ColourPolicy: ...

    def params(self) -> FrozenDict:
        """Every parameter, as JSON values (recorded)."""
        ...

    def plan(self, header: ImageHeader) -> ImagePlan:
        """Resize steps, grid and placeholder count from the header alone (raises ImageSizeError)."""
        ...

    def preprocess(self, image: DecodedImage) -> Preprocessed:
        """pixel_values for decoded pixels; `.plan` equals `plan(image.header)`."""
        ...

    def placeholders(self, plan: ImagePlan) -> tuple[str, ...]:
        """The token strings, in order, that replace one `template_placeholder`; always `plan.n_tokens` of them
        (Qwen2-VL: ("<|image_pad|>",) * n; Pixtral: [IMG]... [IMG_BREAK] ... [IMG_END])."""
        ...


@runtime_checkable
class VideoFamily(Protocol):
    """A family that also takes videos given as lists of frames (Qwen2-VL)."""

    @property
    def name(self) -> str: ...
    @property
    def video_placeholder(self) -> str:
        """What the template emits per video, e.g. "<|video_pad|>"."""
        ...

    @property
    def orientation(self) -> Orientation: ...
    @property
    def colour(self) -> ColourPolicy: ...

    def plan_video(self, sizes: Sequence[tuple[int, int]]) -> ImagePlan:
        """The grid and placeholder count of a video whose frames have these oriented (height, width) sizes."""
        ...

    def preprocess_video(self, frames: Sequence[DecodedImage]) -> Preprocessed:
        """pixel_values_videos for the decoded frames; `.plan` equals `plan_video` of their sizes."""
        ...

    def video_placeholders(self, plan: ImagePlan) -> tuple[str, ...]:
        """The token strings that replace one `video_placeholder`."""
        ...
