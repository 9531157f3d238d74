"""Generated test images for the multimodal family tests (pixtral, llava) and the image benchmark.

Sizes from 1x1 to 4000x3000, portrait / landscape / square, and the colour modes the issue names (palette with and
without transparency, RGBA, LA, L, CMYK, 16-bit grey, 1-bit), plus EXIF-rotated JPEGs. Each image is made from a
seeded generator, so every run sees the same pixels. `as_decoded(img)` gives the DecodedImage ctxlock's media stage
makes from the file bytes under `ColourPolicy.COMPOSITE_WHITE` and `Orientation.IGNORE` (what the families'
references see); `reopen(data)` is the Pillow image a reference library is given.
"""

from __future__ import annotations

import functools
import io

import numpy as np
from PIL import Image

from ctxlock.multimodal import _media as media
from ctxlock.multimodal._base import ColourPolicy, DecodedImage, Orientation

SIZES = [
    (1, 1),
    (2, 3),
    (15, 17),
    (16, 16),
    (33, 1024),
    (224, 224),
    (336, 500),
    (640, 480),
    (480, 640),
    (1023, 1025),
    (1024, 1024),
    (1500, 40),
    (3000, 4000),
    (4000, 3000),
]

MODES = ["RGB", "RGBA", "P", "P-transparent", "L", "LA", "CMYK", "I;16", "1"]


def _rgb(width: int, height: int, seed: int) -> np.ndarray:
    """Smooth gradients plus noise (resampling errors show on both)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255) // max(width, 1), (y * 255) // max(height, 1), ((x + y) * 7) % 256], axis=-1)
    noise = rng.integers(0, 64, (height, width, 3))
    return ((base + noise) % 256).astype(np.uint8)


def make(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rgb = _rgb(width, height, seed)
    img = Image.fromarray(rgb)
    rng = np.random.default_rng(seed + 1)
    if mode == "RGB":
        return img
    if mode in ("RGBA", "LA"):
        alpha = rng.integers(0, 256, (height, width), dtype=np.uint8)
        out = img.convert(mode[:-1])
        out.putalpha(Image.fromarray(alpha))
        return out
    if mode == "P":
        return img.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    if mode == "P-transparent":
        out = img.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
        out.info["transparency"] = 3
        return out
    if mode == "I;16":
        values = rng.integers(0, 65536, (height, width), dtype=np.uint16)
        return Image.fromarray(values)
    return img.convert(mode)


def exif_rotated(width: int, height: int, orientation: int, seed: int = 0) -> bytes:
    """A JPEG carrying an EXIF orientation tag."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    make(width, height, "RGB", seed).save(buf, format="JPEG", exif=exif, quality=90)
    return buf.getvalue()


def _entries(limit_pixels: int | None) -> list[tuple[str, str, int, int, int]]:
    """(label, mode, width, height, seed) of every corpus image; exif entries have mode "exif" and the orientation as
    seed."""
    out = []
    for i, (w, h) in enumerate(SIZES):
        if limit_pixels is not None and w * h > limit_pixels:
            continue
        mode = MODES[i % len(MODES)]
        out.append((f"{w}x{h}-{mode}", mode, w, h, i))
    for j, mode in enumerate(MODES):
        out.append((f"37x23-{mode}", mode, 37, 23, 100 + j))
    for k in (3, 6, 8):
        out.append((f"exif{k}-300x200", "exif", 300, 200, k))
    return out


def corpus_labels(limit_pixels: int | None = None) -> list[str]:
    """The corpus' labels, without building an image: for parametrizing at collection."""
    return [label for label, *_ in _entries(limit_pixels)]


@functools.cache
def corpus(limit_pixels: int | None = None) -> tuple[tuple[str, bytes], ...]:
    """(label, file bytes) for every size x a rotating choice of modes, plus every mode at a small size. Built once per
    process, on first use (some images are 12 megapixels); tests/conftest.py lets it go after a module when memory is
    high."""
    out = []
    for label, mode, w, h, seed in _entries(limit_pixels):
        if mode == "exif":
            out.append((label, exif_rotated(w, h, seed, seed=200 + seed)))
        else:
            out.append((label, to_bytes(make(w, h, mode, seed=seed))))
    return tuple(out)


def to_bytes(img: Image.Image) -> bytes:
    """The image as a file a request would carry: PNG, or TIFF for CMYK (PNG has no CMYK)."""
    return _save(img, "TIFF" if img.mode == "CMYK" else "PNG")


def _save(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def reopen(data: bytes) -> Image.Image:
    """What a reference library is given: Pillow's image opened from the same bytes."""
    return Image.open(io.BytesIO(data))


def as_decoded(data: bytes) -> DecodedImage:
    """ctxlock's media stage on the bytes: header (pixel cap) then decode, with the policies the families' references
    use (EXIF orientation ignored, alpha composited onto white)."""
    header = media.read_header(data)
    return media.decode(data, header, orientation=Orientation.IGNORE, colour=ColourPolicy.COMPOSITE_WHITE)
