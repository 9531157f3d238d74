"""Image bytes: the signature sniffed, the header read without decoding, the pixel cap checked against the header,
then the decode with Pillow under named orientation, colour and animation policies.

Every failure is a `MediaError` subclass naming the JSON path of the part. Nothing here does I/O: bytes come in.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import struct
import warnings
import zlib
from typing import Any

import numpy as np
import PIL
from PIL import Image, ImageOps

from ctxlock import settings
from ctxlock.errors import ImageDecodeError, ImageMemoryError, ImageSizeError, MediaTypeError
from ctxlock.multimodal._base import AnimationPolicy, ColourPolicy, DecodedImage, ImageHeader, Orientation
from ctxlock.multimodal._complete import check_complete

DECODER = f"Pillow {PIL.__version__}"

# The default pixel cap, checked against the header before any decode: Pillow's own warning threshold
# (Image.MAX_IMAGE_PIXELS, 89,478,485 = 0.25 GiB of RGBA), fixed here so a change of Pillow does not move it.
DEFAULT_MAX_PIXELS = 89_478_485
# More frames than this are refused from the header even under `first-frame` (counting them walks the file).
MAX_FRAMES = 10_000

# The default bound on the memory one image's decode may take (every buffer alive at the decode's peak, estimated
# from the header before anything is decoded): $CTXLOCK_MAX_DECODE_BYTES or StageOptions(max_decode_bytes=...).
# See docs/images.md.
DECODE_BYTES_ENV = "CTXLOCK_MAX_DECODE_BYTES"
DEFAULT_MAX_DECODE_BYTES = 256 * 1024 * 1024

# media type -> (Pillow format, signature test)
MEDIA_TYPES: dict[str, str] = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/gif": "GIF",
    "image/webp": "WEBP",
    "image/bmp": "BMP",
    "image/tiff": "TIFF",
}
_ALIASES = {"image/jpg": "image/jpeg", "image/x-png": "image/png", "image/x-ms-bmp": "image/bmp"}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sniff(data: bytes) -> str | None:
    """The media type the bytes' signature names, or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:2] == b"BM":
        return "image/bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "image/tiff"
    return None


def canonical_media_type(media_type: str) -> str:
    base = media_type.split(";", 1)[0].strip().lower()
    return _ALIASES.get(base, base)


def check_media_type(data: bytes, declared: str | None, *, path: str | None) -> str:
    """The bytes' media type; a declared type that is unsupported or that the signature disagrees with raises."""
    if declared is not None:
        declared = canonical_media_type(declared)
        if declared not in MEDIA_TYPES:
            raise MediaTypeError(
                f"unsupported media type {declared!r}",
                path=path,
                hint=f"supported: {', '.join(MEDIA_TYPES)}",
            )
    found = sniff(data)
    if found is None:
        head = data[:8].hex()
        raise MediaTypeError(
            f"the bytes are not a supported image (first bytes {head or 'none'}; {len(data)} bytes)",
            path=path,
            hint=f"send one of {', '.join(MEDIA_TYPES)}",
        )
    if declared is not None and declared != found:
        raise MediaTypeError(
            f"declared media type {declared} but the bytes are {found}",
            path=path,
            hint="declare the type the file really is, or re-encode the file",
        )
    return found


def _open(data: bytes, fmt: str, path: str | None) -> Image.Image:
    """Pillow's lazy open: reads the header only. Pillow's own bomb check (twice its cap) becomes ours."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # ctxlock's own cap applies below
            return Image.open(io.BytesIO(data), formats=[fmt])
    except Image.DecompressionBombError as e:
        raise ImageSizeError(
            f"decompression bomb refused from the header: {e}",
            path=path,
            hint=f"ctxlock refuses images over {DEFAULT_MAX_PIXELS:,} pixels before decoding; downscale it",
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError, struct.error, IndexError) as e:
        shown = _OBJECT_REPR.sub("", str(e)).rstrip()  # Pillow names the stream object, at an address
        raise ImageDecodeError(
            f"cannot read the {fmt} header: {shown}", path=path, hint="the file is corrupt or truncated"
        ) from None


_OBJECT_REPR = re.compile(r"\s*<[\w.]+ object at 0x[0-9a-f]+>")


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """The PNG chunks' (type, data), walked by their lengths without decompressing anything."""
    out: list[tuple[bytes, bytes]] = []
    pos = 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        # only the bodies read below are copied (an IDAT body is most of the file)
        body = data[pos + 8 : pos + 8 + length] if kind in (b"eXIf", b"iTXt") else b""
        out.append((kind, body))
        pos += 12 + length
        if kind == b"IEND":
            break
    return out


_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(="|>)([0-9])')


def _png_orientation(data: bytes) -> int:
    """EXIF orientation of a PNG from its eXIf chunk, else XMP, wherever the chunks are (Pillow reads chunks after
    IDAT only when it decodes)."""
    xmp = None
    for kind, body in _png_chunks(data):
        if kind == b"eXIf":
            exif = Image.Exif()
            exif.load(body)
            value = exif.get(0x0112)
            if value is not None:
                return int(value)
        elif kind == b"iTXt" and body.startswith(b"XML:com.adobe.xmp\x00") and xmp is None:
            parts = body.split(b"\x00", 5)
            if len(parts) == 6 and parts[1] == b"\x00":  # uncompressed iTXt
                xmp = parts[5]
    if xmp is not None and (m := _XMP_ORIENTATION.search(xmp)):
        return int(m[2])
    return 1


def _orientation(im: Image.Image, data: bytes) -> int:
    if im.format == "PNG" and "exif" not in im.info:
        return _png_orientation(data)
    value = im.getexif().get(0x0112, 1)
    return int(value) if isinstance(value, int) else 1


def read_header(
    data: bytes,
    *,
    path: str | None = None,
    media_type: str | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_decode_bytes: int | None = None,
) -> ImageHeader:
    """Signature, format, size, mode, frames and EXIF orientation, read without decoding any pixel, and the pixel
    cap checked against them (a decompression bomb is refused here, before any large allocation). A WebP's canvas
    is checked from its RIFF header before Pillow opens it: libwebp allocates its canvases when the file is opened.
    """
    found = check_media_type(data, media_type, path=path)
    fmt = MEDIA_TYPES[found]
    if fmt == "WEBP":
        _check_webp_canvas(data, max_pixels, max_decode_bytes, path)
    with _open(data, fmt, path) as im:
        width, height = im.size
        if width <= 0 or height <= 0:
            raise ImageSizeError(f"the image is {width}x{height}", path=path, hint="send an image with pixels")
        if width * height > max_pixels:
            raise ImageSizeError(
                f"decompression bomb refused from the header: {width}x{height} = {width * height:,} pixels, over "
                f"the cap of {max_pixels:,}",
                path=path,
                hint="downscale the image before sending it; nothing was decoded",
            )
        check_complete(im, data, fmt, path)
        try:
            frames = _frames(im)
            orientation = _orientation(im, data)
        except (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error) as e:
            raise ImageDecodeError(
                f"cannot read the {fmt} header: {e}", path=path, hint="the file is corrupt or truncated"
            ) from None
        if frames > MAX_FRAMES:
            raise ImageSizeError(f"{frames} frames, over the cap of {MAX_FRAMES}", path=path, hint="send one frame")
        return ImageHeader(
            transparency=im.info.get("transparency") is not None,
            n_bytes=len(data),
            format=fmt,
            media_type=found,
            width=width,
            height=height,
            mode=im.mode,
            frames=frames,
            orientation=orientation if orientation in range(1, 9) else 1,
            source=data if type(data) is bytes else bytes(data),  # the digest is computed when asked
            digest="" if settings.fast_enabled() else sha256(data),
        )


def _webp_canvas(data: bytes) -> tuple[int, int, bool] | None:
    """(width, height, animated) from a WebP's first chunk: VP8X (extended), VP8L (lossless) or VP8 (lossy); None
    when the chunk is too short to say (Pillow then refuses the file). RIFF container specification:
    https://developers.google.com/speed/webp/docs/riff_container"""
    kind = data[12:16]
    if kind == b"VP8X" and len(data) >= 30:
        width = 1 + int.from_bytes(data[24:27], "little")
        height = 1 + int.from_bytes(data[27:30], "little")
        return width, height, bool(data[20] & 0x02)
    if kind == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF), False
    if kind == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF, False
    return None


def _check_webp_canvas(data: bytes, max_pixels: int, limit: int | None, path: str | None) -> None:
    canvas = _webp_canvas(data)
    if canvas is None:
        return
    width, height, animated = canvas
    if width * height > max_pixels:
        raise ImageSizeError(
            f"decompression bomb refused from the header: a {width}x{height} WebP canvas = {width * height:,} "
            f"pixels, over the cap of {max_pixels:,}",
            path=path,
            hint="downscale the image before sending it; nothing was decoded",
        )
    cost = width * height * (16 if animated else 8)
    if limit is not None and cost > limit:
        raise ImageMemoryError(
            f"opening this {width}x{height} WebP would take about {cost / 2**20:,.0f} MiB (libwebp's canvases), "
            f"over the decode-memory limit of {limit / 2**20:,.0f} MiB",
            path=path,
            hint=f"downscale the image, or raise the limit: ${DECODE_BYTES_ENV}=<bytes> (or "
            "StageOptions(max_decode_bytes=...) in Python); nothing was decoded",
        )


def max_decode_bytes() -> int:
    """The decode-memory bound: $CTXLOCK_MAX_DECODE_BYTES (bytes), else `DEFAULT_MAX_DECODE_BYTES` (256 MiB)."""
    raw = os.environ.get(DECODE_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_DECODE_BYTES
    if not raw.isdigit() or int(raw) <= 0:
        raise ImageMemoryError(
            f"{raw!r} is not a size in bytes",
            path=DECODE_BYTES_ENV,
            hint=f"set a positive integer, or unset it for {DEFAULT_MAX_DECODE_BYTES:,}",
        )
    return int(raw)


def _mode_bytes(mode: str) -> int:
    """Bytes per pixel of a Pillow image of `mode` in memory (Pillow keeps every multi-band 8-bit mode, RGB too, in
    4 bytes a pixel; https://pillow.readthedocs.io/en/stable/handbook/concepts.html#modes)."""
    if mode in ("1", "L", "P"):
        return 1
    if mode.startswith("I;16"):
        return 2
    return 4 if len(mode) <= 4 and mode not in ("I;32", "F;64") else 8


def decode_steps(
    header: ImageHeader, orientation: Orientation, colour: ColourPolicy, full_size_bytes: int = 4
) -> tuple[tuple[str, int], ...]:
    """(step, bytes) of every full-size buffer `decode` and the family's first full-size step may hold at once,
    from the header alone: the decoded mode, the decoder's own buffer (libwebp's RGBA canvases), Pillow's
    intermediate for 16-bit modes, the EXIF-transpose copy, each conversion, the white composite, the RGB array,
    and the family's copy of it (`full_size_bytes` a pixel: Pillow's RGB for a resize, float32 for Pixtral's).
    Deliberately generous: what it allows, `decode` stays under (tests/multimodal/test_image_bounds.py measures it)."""
    px = header.width * header.height
    mode = header.mode
    steps = [(f"decoded {mode}", px * _mode_bytes(mode))]
    if header.format == "WEBP":
        steps.append(("libwebp's RGBA canvases", px * (16 if header.frames > 1 else 8)))
    if mode.startswith("I;16"):
        steps.append(("Pillow's 32-bit intermediate", px * 4))
    if orientation is Orientation.EXIF_TRANSPOSE:
        steps.append(("exif_transpose copy", px * _mode_bytes(mode)))
    alpha = header.transparency or "A" in mode
    if colour is ColourPolicy.PIL_CONVERT:
        steps.append(('convert("RGB")', px * 4))
        alpha = header.transparency
    if alpha:
        steps += [("RGBA", px * 4), ("white background", px * 4), ("composite", px * 4), ("composite RGB", px * 4)]
    elif colour is ColourPolicy.COMPOSITE_WHITE and mode != "RGB":
        steps.append(('convert("RGB")', px * 4))
    steps += [("RGB array", px * 3), ("the family's full-size copy", px * full_size_bytes)]
    return tuple(steps)


def check_decode_memory(
    header: ImageHeader,
    orientation: Orientation,
    colour: ColourPolicy,
    *,
    limit: int,
    full_size_bytes: int = 4,
    path: str | None = None,
    what: str = "image",
) -> int:
    """The estimated peak of the decode (`decode_steps`), or `ImageMemoryError` over `limit`, before any decode."""
    steps = decode_steps(header, orientation, colour, full_size_bytes)
    total = sum(n for _, n in steps)
    if total > limit:
        biggest = ", ".join(f"{name} {n / 2**20:,.0f} MiB" for name, n in sorted(steps, key=lambda s: -s[1])[:3])
        raise ImageMemoryError(
            f"decoding this {header.width}x{header.height} {header.mode} {header.format} {what} would take about "
            f"{total / 2**20:,.0f} MiB ({biggest}, ...), over the decode-memory limit of {limit / 2**20:,.0f} MiB",
            path=path,
            hint=f"downscale the image, or raise the limit: ${DECODE_BYTES_ENV}=<bytes> (or "
            "StageOptions(max_decode_bytes=...) in Python); nothing was decoded",
        )
    return total


def _frames(im: Image.Image) -> int:
    if not getattr(im, "is_animated", False):
        return 1
    return int(getattr(im, "n_frames", 1))


def decode(
    data: bytes,
    header: ImageHeader,
    *,
    orientation: Orientation = Orientation.EXIF_TRANSPOSE,
    colour: ColourPolicy = ColourPolicy.PIL_CONVERT,
    animation: AnimationPolicy = AnimationPolicy.FIRST_FRAME,
    path: str | None = None,
) -> DecodedImage:
    """Decode the first frame with Pillow under the named policies; the result is (H, W, 3) uint8 RGB."""
    # the bytes the header was read from (the same immutable object) need no second hash
    same = settings.fast_enabled() and header.read_from(data)
    if not same and header.sha256 != sha256(data):
        raise ImageDecodeError("the bytes are not those the header was read from", path=path, hint="read it again")
    if header.frames > 1 and animation is AnimationPolicy.ERROR:
        raise ImageDecodeError(
            f"an animated {header.format} with {header.frames} frames",
            path=path,
            hint='send a still image, or use the animation policy "first-frame"',
        )
    with _open(data, header.format, path) as im:
        try:
            im.load()
        except (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error, MemoryError) as e:
            raise ImageDecodeError(
                f"cannot decode the {header.format} image: {e}", path=path, hint="the file is corrupt or truncated"
            ) from None
        if im.format == "PNG":
            tag = im.getexif().get(0x0112, 1)
            if (tag if tag in range(1, 9) else 1) != header.orientation:
                raise ImageDecodeError(
                    f"the header's orientation {header.orientation} disagrees with the decoded image's {tag}",
                    path=path,
                    hint="the file carries its orientation where ctxlock does not read it without decoding",
                )
        transposed = orientation is Orientation.EXIF_TRANSPOSE and header.orientation != 1
        if orientation is Orientation.EXIF_TRANSPOSE:
            im = ImageOps.exif_transpose(im)
        rgb = to_rgb(im, colour)
    rgb.flags.writeable = False
    return DecodedImage(
        header=header,
        rgb=rgb,
        decoder=DECODER,
        orientation=orientation,
        colour=colour,
        animation=animation,
        transposed=transposed,
    )


def _composite_white(im: Image.Image) -> Image.Image:
    # transformers' convert_to_rgb on a PIL image: alpha (or a transparency entry) composited onto white.
    if "A" in im.getbands() or im.info.get("transparency") is not None:
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im if im.mode == "RGB" else im.convert("RGB")  # convert("RGB") of an RGB image is a copy of it


def to_rgb(im: Image.Image, colour: ColourPolicy) -> np.ndarray:
    """8-bit RGB (H, W, 3) under the colour policy (see `ColourPolicy`)."""
    # PIL_CONVERT: load_image's convert("RGB"), then the image processor's convert_to_rgb on what it returns (a
    # palette image's transparency survives convert("RGB") in `info`, and is then composited onto white).
    source = im.convert("RGB") if colour is ColourPolicy.PIL_CONVERT else im
    # asarray: Pillow's bytes viewed, not copied a second time (read-only, as DecodedImage keeps it anyway)
    return np.asarray(_composite_white(source), dtype=np.uint8)


def fingerprint(rgb: np.ndarray, side: int = 8) -> tuple[int, ...]:
    """The decoded image box-averaged to side x side RGB (192 values for 8): what `diff` compares to tell an image
    re-encoded (pixels close) from one replaced."""
    small = Image.fromarray(np.ascontiguousarray(rgb), mode="RGB").resize((side, side), Image.Resampling.BOX)
    return tuple(int(v) for v in np.asarray(small, dtype=np.uint8).reshape(-1))


def describe(header: ImageHeader) -> dict[str, Any]:
    return {**header.to_json(), "decoder": DECODER}
