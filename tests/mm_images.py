"""Generated test images for the multimodal family tests (pixtral, llava) and the image benchmark.

Sizes from 1x1 to 4000x3000, portrait / landscape / square, and the colour modes the issue names (palette with and
without transparency, RGBA, LA, L, CMYK, 16-bit grey, 1-bit), plus EXIF-rotated JPEGs. Each image is made from a
seeded generator, so every run sees the same pixels. `as_decoded(img)` gives the DecodedImage ctxlock's media stage
makes under `ColourPolicy.COMPOSITE_WHITE` and `Orientation.IGNORE` (what the families' references see).
"""

from __future__ import annotations

import hashlib
import io

import numpy as np
import PIL
from PIL import Image

from ctxlock.multimodal.base import AnimationPolicy, ColourPolicy, DecodedImage, ImageHeader, Orientation

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


def exif_rotated(width: int, height: int, orientation: int, seed: int = 0) -> Image.Image:
    """A JPEG (re-opened) carrying an EXIF orientation tag."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    make(width, height, "RGB", seed).save(buf, format="JPEG", exif=exif, quality=90)
    return Image.open(io.BytesIO(buf.getvalue()))


def corpus(limit_pixels: int | None = None) -> list[tuple[str, Image.Image]]:
    """(label, image) for every size x a rotating choice of modes, plus every mode at a small size."""
    out = []
    for i, (w, h) in enumerate(SIZES):
        if limit_pixels is not None and w * h > limit_pixels:
            continue
        mode = MODES[i % len(MODES)]
        out.append((f"{w}x{h}-{mode}", make(w, h, mode, seed=i)))
    for j, mode in enumerate(MODES):
        out.append((f"37x23-{mode}", make(37, 23, mode, seed=100 + j)))
    for k in (3, 6, 8):
        out.append((f"exif{k}-300x200", exif_rotated(300, 200, k, seed=200 + k)))
    return out


def composite_white(img: Image.Image) -> np.ndarray:
    """transformers' convert_to_rgb (alpha or a transparency key composited onto white, else convert("RGB"))."""
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.array(Image.alpha_composite(background, rgba).convert("RGB"))
    return np.array(img.convert("RGB"))


def as_decoded(img: Image.Image) -> DecodedImage:
    rgb = composite_white(img)
    rgb.flags.writeable = False
    header = ImageHeader(
        sha256=hashlib.sha256(rgb.tobytes()).hexdigest(),
        n_bytes=rgb.nbytes,
        format="PNG",
        media_type="image/png",
        width=img.width,
        height=img.height,
        mode=img.mode,
        frames=1,
        orientation=1,
    )
    return DecodedImage(
        header=header,
        rgb=rgb,
        decoder=f"Pillow {PIL.__version__}",
        orientation=Orientation.IGNORE,
        colour=ColourPolicy.COMPOSITE_WHITE,
        animation=AnimationPolicy.FIRST_FRAME,
        transposed=False,
    )
