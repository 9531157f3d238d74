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

from ctxlock.errors import ImageDecodeError, ImageMemoryError, ImagePlacementError, ImageSizeError, MediaError
from ctxlock.multimodal import _media as media
from ctxlock.multimodal._base import (
    AnimationPolicy,
    DecodedImage,
    ImageFamily,
    ImageHeader,
    ImagePlan,
    Preprocessed,
    VideoFamily,
    pixel_digest,
)
from ctxlock.multimodal._sources import ImageBytes, ImageRef, VideoRef, image_refs, resolve, video_refs
from ctxlock.request import Request


@dataclass(frozen=True)
class StageOptions:
    """The caller's choices for the image stage (recorded)."""

    max_pixels: int = media.DEFAULT_MAX_PIXELS  # the header cap, before any decode (each video frame too)
    animation: AnimationPolicy = AnimationPolicy.FIRST_FRAME
    max_frames: int = 768  # a video's frames, refused above before any is read (Qwen2-VL's max_frames)
    # a video's frames' pixels together, from their headers, before any decode (4x the image cap: about 1 GB of
    # decoded RGB); transformers has no such limit
    max_video_pixels: int = 4 * media.DEFAULT_MAX_PIXELS
    # the memory one image's decode (a video's: all its frames) may take, estimated from the header before any
    # decode; None: $CTXLOCK_MAX_DECODE_BYTES, else 256 MiB (docs/images.md)
    max_decode_bytes: int | None = None

    def decode_limit(self) -> int:
        return media.max_decode_bytes() if self.max_decode_bytes is None else self.max_decode_bytes

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_pixels": self.max_pixels, "animation": self.animation.value}
        if self.max_decode_bytes is not None:
            out["max_decode_bytes"] = self.max_decode_bytes
        if self.max_frames != StageOptions.max_frames:
            out["max_frames"] = self.max_frames
        if self.max_video_pixels != StageOptions.max_video_pixels:
            out["max_video_pixels"] = self.max_video_pixels
        return out


def _decode_json(decoded: DecodedImage) -> dict[str, Any]:
    """A decoded image or frame in a record: its decode facts and a fingerprint of its RGB pixels."""
    return {**decoded.to_json(), "fingerprint": list(media.fingerprint(decoded.rgb))}


def _pixels_json(pixels: Preprocessed) -> dict[str, Any]:
    """Preprocessed pixels in a record: shape, dtype and sha256 (the values themselves are not kept)."""
    return {
        "shape": list(pixels.pixel_values.shape),
        "dtype": str(pixels.pixel_values.dtype),
        "sha256": pixels.pixel_sha256,
    }


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
            out["decode"] = _decode_json(self.decoded)
        if self.pixels is not None:
            out["pixel_values"] = _pixels_json(self.pixels)
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
    header = media.read_header(
        ib.data,
        path=path,
        media_type=ib.declared_type,
        max_pixels=options.max_pixels,
        max_decode_bytes=options.decode_limit(),
    )
    if header.frames > 1 and options.animation is AnimationPolicy.ERROR:
        raise ImageDecodeError(
            f"an animated {header.format} with {header.frames} frames",
            path=path,
            hint='send a still image, or use the animation policy "first-frame"',
        )
    media.check_decode_memory(
        header,
        family.orientation,
        family.colour,
        limit=options.decode_limit(),
        full_size_bytes=_full_size_bytes(family),
        path=path,
    )
    with at_path(path):
        plan = family.plan(header)
    return ImageInput(ib.ref, ib.origin, ib.declared_type, header, plan)


def _full_size_bytes(family: ImageFamily) -> int:
    """Bytes a pixel of the family's first step on the full-size RGB array (see `media.decode_steps`)."""
    return int(getattr(family, "full_size_bytes", 4))


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


@dataclass(frozen=True, eq=False)
class VideoFrame:
    """One frame of a video: its source, its header and, once processed, its decoded pixels."""

    ref: ImageRef  # ref.index is the frame's number within the video
    origin: str
    declared_type: str | None
    header: ImageHeader
    decoded: DecodedImage | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.ref.path,
            "origin": self.origin,
            "declared_type": self.declared_type,
            "header": self.header.to_json(),
        }
        if self.decoded is not None:
            out["decode"] = _decode_json(self.decoded)
        return out


@dataclass(frozen=True, eq=False)
class VideoInput:
    """One video of a request: its frames, the family's plan (grid_t, grid_h, grid_w) and, once processed, its
    `pixel_values_videos` rows."""

    ref: VideoRef
    frames: tuple[VideoFrame, ...]
    plan: ImagePlan
    pixels: Preprocessed | None = None

    @property
    def n_tokens(self) -> int:
        return self.plan.n_tokens

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.ref.index,
            "path": self.ref.path,
            "frames": [f.to_json() for f in self.frames],
            "plan": self.plan.to_json(),
        }
        if self.pixels is not None:
            out["pixel_values"] = _pixels_json(self.pixels)
        return out


def _video_family(family: ImageFamily, path: str) -> VideoFamily:
    if not isinstance(family, VideoFamily):
        raise ImagePlacementError(
            f"the {family.name} image family takes no video",
            path=path,
            hint="send the frames as images, or use a model that takes video (Qwen2-VL, Qwen2.5-VL)",
        )
    return family


def _frame(ref: ImageRef, media_map: Mapping[str, bytes] | None, options: StageOptions) -> VideoFrame:
    ib = resolve(ref, media_map)
    header = media.read_header(
        ib.data,
        path=ref.path,
        media_type=ib.declared_type,
        max_pixels=options.max_pixels,
        max_decode_bytes=options.decode_limit(),
    )
    if header.frames > 1 and options.animation is AnimationPolicy.ERROR:
        raise ImageDecodeError(
            f"a video frame is an animated {header.format} with {header.frames} frames",
            path=ref.path,
            hint='send still frames, or use the animation policy "first-frame"',
        )
    return VideoFrame(ref, ib.origin, ib.declared_type, header)


def plan_video(
    ref: VideoRef, family: ImageFamily, media_map: Mapping[str, bytes] | None, options: StageOptions
) -> VideoInput:
    """A video planned from its frames' headers alone (nothing decoded); the frame count is checked first."""
    fam = _video_family(family, ref.path)
    if len(ref.frames) > options.max_frames:
        raise ImageSizeError(
            f"a video of {len(ref.frames)} frames is over the cap of {options.max_frames}",
            path=ref.path,
            hint="sample fewer frames, or raise max_frames in the image stage options",
        )
    frames = tuple(_frame(f, media_map, options) for f in ref.frames)
    total = sum(f.header.width * f.header.height for f in frames)
    if total > options.max_video_pixels:
        raise ImageSizeError(
            f"a video of {len(frames)} frames holds {total:,} pixels, over the cap of {options.max_video_pixels:,} "
            "(refused from the headers, before any decode)",
            path=ref.path,
            hint="send fewer or smaller frames, or raise max_video_pixels in the image stage options",
        )
    _check_video_memory(ref, frames, fam, options)
    with at_path(ref.path):
        plan = fam.plan_video([f.header.oriented_size(fam.orientation) for f in frames])
    return VideoInput(ref, frames, plan)


def _check_video_memory(ref: VideoRef, frames: tuple[VideoFrame, ...], fam: VideoFamily, options: StageOptions) -> None:
    """Every frame's RGB array is kept until the video's preprocessing: their bytes and the costliest frame's decode
    together stay under the decode-memory limit (from the headers, before any decode)."""
    limit = options.decode_limit()
    kept = sum(3 * f.header.width * f.header.height for f in frames)
    for f in frames:
        peak = media.check_decode_memory(
            f.header, fam.orientation, fam.colour, limit=limit, path=f.ref.path, what="video frame"
        )
        if kept + peak > limit:
            raise ImageMemoryError(
                f"a video of {len(frames)} frames would hold about {(kept + peak) / 2**20:,.0f} MiB while decoding "
                f"({kept / 2**20:,.0f} MiB of decoded frames), over the decode-memory limit of {limit / 2**20:,.0f} "
                "MiB",
                path=ref.path,
                hint=f"send fewer or smaller frames, or raise the limit: ${media.DECODE_BYTES_ENV}=<bytes> (or "
                "StageOptions(max_decode_bytes=...) in Python); nothing was decoded",
            )


def process_video(
    ref: VideoRef, family: ImageFamily, media_map: Mapping[str, bytes] | None, options: StageOptions
) -> VideoInput:
    planned = plan_video(ref, family, media_map, options)
    fam = _video_family(family, ref.path)
    frames = tuple(
        VideoFrame(
            f.ref,
            f.origin,
            f.declared_type,
            f.header,
            media.decode(
                resolve(f.ref, media_map).data,
                f.header,
                orientation=fam.orientation,
                colour=fam.colour,
                animation=options.animation,
                path=f.ref.path,
            ),
        )
        for f in planned.frames
    )
    with at_path(ref.path):
        pixels = fam.preprocess_video([f.decoded for f in frames if f.decoded is not None])
    if pixels.plan != planned.plan:
        raise ImageDecodeError(
            f"the decoded frames give another plan ({pixels.plan.resized}) than their headers ({planned.plan.resized})",
            path=ref.path,
            hint="the headers and the pixels disagree; re-encode the frames",
        )
    return VideoInput(ref, frames, planned.plan, pixels)


def plan_videos(
    request: Request,
    family: ImageFamily,
    media_map: Mapping[str, bytes] | None = None,
    options: StageOptions = StageOptions(),
) -> tuple[VideoInput, ...]:
    return tuple(plan_video(ref, family, media_map, options) for ref in video_refs(request))


def process_videos(
    request: Request,
    family: ImageFamily,
    media_map: Mapping[str, bytes] | None = None,
    options: StageOptions = StageOptions(),
) -> tuple[VideoInput, ...]:
    return tuple(process_video(ref, family, media_map, options) for ref in video_refs(request))


def stack_videos(videos: tuple[VideoInput, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values_videos, video_grid_thw) over the videos in order, as the HF video processor returns them."""
    done = [v.pixels for v in videos if v.pixels is not None]
    values = np.concatenate([p.pixel_values for p in done], axis=0) if done else np.zeros((0, 0), dtype=np.float32)
    grids = np.array([list(p.plan.grid) for p in done], dtype=np.int64).reshape(-1, 3)
    values.flags.writeable = False
    grids.flags.writeable = False
    return values, grids


def image_bytes(request: Request, media_map: Mapping[str, bytes] | None = None) -> tuple[ImageBytes, ...]:
    return tuple(resolve(ref, media_map) for ref in image_refs(request))


@dataclass(frozen=True)
class ImageSize:
    """An image of a request and its size as stored (width x height), read from its header alone."""

    ref: ImageRef
    width: int
    height: int
    media_type: str


def image_sizes(
    request: Request,
    media_map: Mapping[str, bytes] | None = None,
    options: StageOptions = StageOptions(),
    *,
    unfetched: bool = False,
) -> tuple[ImageSize, ...]:
    """Every image's size from its header alone (nothing decoded), under the same caps as `plan_images`: what a
    provider's published image rule needs (`ctxlock.providers`). With `unfetched`, an http(s) image whose bytes
    were not supplied is listed with size 0 x 0 (its size is unknown) instead of refused."""
    out = []
    for ref in image_refs(request):
        if unfetched and ref.kind == "http" and (media_map is None or ref.url not in media_map):
            out.append(ImageSize(ref, 0, 0, ""))
            continue
        ib = resolve(ref, media_map)
        header = media.read_header(
            ib.data,
            path=ib.ref.path,
            media_type=ib.declared_type,
            max_pixels=options.max_pixels,
            max_decode_bytes=options.decode_limit(),
        )
        out.append(ImageSize(ib.ref, header.width, header.height, header.media_type))
    return tuple(out)


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
    "VideoFrame",
    "VideoInput",
    "image_bytes",
    "pixel_digest",
    "plan_image",
    "plan_images",
    "plan_video",
    "plan_videos",
    "process_image",
    "process_images",
    "process_video",
    "process_videos",
    "stack_pixels",
    "stack_videos",
]
