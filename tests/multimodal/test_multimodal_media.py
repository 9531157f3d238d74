"""Image bytes -> header -> decode -> Qwen2-VL pixel values, against transformers' Qwen2VLImageProcessorPil.

The reference takes bytes the way `apply_chat_template` does (transformers' `load_image` on the base64 string:
EXIF transpose, convert("RGB"), then the processor's convert_to_rgb), and, for the `composite-white` colour policy
with orientation ignored, a PIL image handed to the processor directly.
"""

from __future__ import annotations

import base64
import io
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from transformers.image_utils import load_image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as ref_smart_resize

import mm_fixtures as F
from ctxlock.errors import ImageDecodeError, ImageSizeError, MediaError, MediaTypeError
from ctxlock.multimodal import _media as media
from ctxlock.multimodal._base import AnimationPolicy, ColourPolicy, Orientation
from ctxlock.multimodal._qwen2vl import Qwen2VL, smart_resize
from hypothesis_profiles import examples

pytestmark = pytest.mark.reference

HUB = {k: v for k, v in F.HUB_PREPROCESSOR.items() if k not in ("image_processor_type", "processor_class")}
CONFIGS = {"class-defaults": {}, "hub": HUB}
_REF: dict[str, Qwen2VLImageProcessorPil] = {}


def reference(config: str) -> Qwen2VLImageProcessorPil:
    if config not in _REF:
        _REF[config] = Qwen2VLImageProcessorPil(**CONFIGS[config])
    return _REF[config]


def family(config: str, **policies: object) -> Qwen2VL:
    fam = Qwen2VL.from_preprocessor_config(CONFIGS[config]) if CONFIGS[config] else Qwen2VL()
    return fam if not policies else Qwen2VL(**{**fam.__dict__, **policies})


def ours(data: bytes, fam: Qwen2VL, declared: str | None = None):
    header = media.read_header(data, path="p", media_type=declared)
    decoded = media.decode(data, header, orientation=fam.orientation, colour=fam.colour, path="p")
    out = fam.preprocess(decoded)
    assert out.plan == fam.plan(header)  # the header alone gives the same plan as the pixels
    return header, out


def assert_parity(data: bytes, config: str) -> None:
    ref = reference(config)(load_image(base64.b64encode(data).decode()), return_tensors="np")
    header, out = ours(data, family(config))
    assert out.plan.grid == tuple(ref["image_grid_thw"][0].tolist())
    assert out.pixel_values.shape == ref["pixel_values"].shape
    assert out.pixel_values.dtype == np.float32
    assert np.abs(out.pixel_values - ref["pixel_values"]).max() <= 1e-5
    h, w = header.oriented_size()
    assert out.plan.n_tokens == reference(config).get_number_of_image_patches(h, w) // 4


SIZES = [(1, 1), (1, 2), (3, 1), (27, 29), (28, 28), (57, 56), (224, 224), (640, 480), (480, 640), (1000, 1000)]


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_sizes_match_transformers(width: int, height: int, config: str) -> None:
    assert_parity(F.png(F.noise(width, height, seed=width * 7 + height)), config)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize(("width", "height"), [(4000, 3000), (3000, 4000), (3000, 3000)])
def test_large_images_match_transformers(width: int, height: int, config: str) -> None:
    assert_parity(F.encode(F.noise(width, height), "JPEG", quality=90), config)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("mode", ["RGBA", "P", "CMYK", "I;16", "L", "LA", "1", "RGB"])
def test_colour_modes_match_transformers(mode: str, config: str) -> None:
    image = F.noise(301, 207, mode="RGB" if mode in ("L", "LA", "1", "CMYK") else mode, seed=3)
    if mode in ("L", "LA", "1", "CMYK"):
        image = image.convert(mode)
    data = F.encode(image, "JPEG", quality=92) if mode == "CMYK" else F.png(image)
    assert media.read_header(data).mode == Image.open(io.BytesIO(data)).mode
    assert_parity(data, config)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_matches_transformers(orientation: int) -> None:
    data = F.with_orientation(F.noise(120, 64, seed=orientation), orientation)
    header = media.read_header(data)
    assert header.orientation == orientation
    assert header.oriented_size() == ((120, 64) if orientation >= 5 else (64, 120))
    assert_parity(data, "hub")
    _, out = ours(data, family("hub"))
    assert out.plan.image_size == header.oriented_size()


def test_png_exif_after_idat_is_read_without_decoding() -> None:
    # Pillow reads a PNG's chunks after IDAT only when it decodes; the header reader walks the chunks itself.
    image = F.noise(90, 40)
    exif = Image.Exif()
    exif[0x0112] = 6
    plain = F.png(image)
    body = exif.tobytes()[6:]  # the TIFF structure, without the "Exif\0\0" marker (the PNG spec's eXIf form)
    chunk = struct.pack(">I", len(body)) + b"eXIf" + body + struct.pack(">I", zlib.crc32(b"eXIf" + body))
    data = plain[:-12] + chunk + plain[-12:]  # after IDAT, before IEND
    with Image.open(io.BytesIO(data)) as im:
        assert "exif" not in im.info  # Pillow has not seen it before decoding
    assert media.read_header(data).orientation == 6
    assert_parity(data, "hub")


@pytest.mark.parametrize("mode", ["RGBA", "P", "LA"])
def test_composite_white_policy_matches_processor_given_a_pil_image(mode: str) -> None:
    image = F.noise(200, 130, mode="RGBA" if mode == "LA" else mode, seed=5)
    image = image.convert("LA") if mode == "LA" else image
    data = F.png(image)
    ref = reference("hub")(Image.open(io.BytesIO(data)), return_tensors="np")
    fam = family("hub", orientation=Orientation.IGNORE, colour=ColourPolicy.COMPOSITE_WHITE)
    _, out = ours(data, fam)
    assert np.abs(out.pixel_values - ref["pixel_values"]).max() <= 1e-5
    # With an alpha channel the two policies differ: the policy is a real, recorded choice. A palette image's
    # transparency survives load_image's convert("RGB") in `info`, and is composited onto white under both.
    _, other = ours(data, family("hub"))
    assert (out.pixel_sha256 != other.pixel_sha256) == (mode != "P")


def test_animated_gif_first_frame_or_error() -> None:
    frames = [F.noise(64, 48, seed=k).convert("P") for k in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    data = buf.getvalue()
    header = media.read_header(data)
    assert header.frames == 3
    assert_parity(data, "hub")  # transformers takes frame 0 as well
    with pytest.raises(ImageDecodeError) as e:
        media.decode(data, header, animation=AnimationPolicy.ERROR, path="messages[0].content[0]")
    assert e.value.path == "messages[0].content[0]" and "3 frames" in e.value.message


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(1, 20000), st.integers(1, 20000), st.sampled_from(sorted(CONFIGS)))
def test_header_only_count_equals_transformers(height: int, width: int, config: str) -> None:
    fam = family(config)
    ref = reference(config)
    if max(height, width) / min(height, width) > 200:
        with pytest.raises(ValueError):
            ref_smart_resize(height, width, 28, ref.size["shortest_edge"], ref.size["longest_edge"])
        with pytest.raises(ImageSizeError):
            fam.plan_size(height, width)
        return
    plan = fam.plan_size(height, width)
    assert plan.resized == ref_smart_resize(height, width, 28, ref.size["shortest_edge"], ref.size["longest_edge"])
    assert plan.n_tokens == ref.get_number_of_image_patches(height, width) // 4
    assert plan.resized[0] % 28 == 0 and plan.resized[1] % 28 == 0


@settings(max_examples=examples(25), deadline=None)
@given(st.integers(1, 400), st.integers(1, 400), st.integers(0, 2**16))
def test_random_small_images_match_transformers(width: int, height: int, seed: int) -> None:
    if max(width, height) / min(width, height) > 200:
        return
    assert_parity(F.png(F.noise(width, height, seed=seed)), "class-defaults")


# -- bad input ---------------------------------------------------------------------------------------------------


def test_aspect_ratio_over_200_is_refused() -> None:
    data = F.png(F.noise(201, 1))
    header = media.read_header(data)
    with pytest.raises(ImageSizeError, match="aspect ratio"):
        family("hub").plan(header)
    assert smart_resize(1, 200) == ref_smart_resize(1, 200)


def test_truncated_and_corrupt_files() -> None:
    good = F.png(F.noise(300, 200))
    with pytest.raises(ImageDecodeError) as e:  # refused from the header, as the decode refuses it
        media.read_header(good[: len(good) // 2], path="x")
    assert e.value.path == "x" and e.value.hint and "truncated" in e.value.message
    with pytest.raises(ImageDecodeError):
        media.read_header(good[:20], path="x")  # cut inside IHDR
    corrupt = bytearray(good)
    corrupt[60:200] = os.urandom(140)
    with pytest.raises(MediaError):
        h = media.read_header(bytes(corrupt), path="x")
        media.decode(bytes(corrupt), h, path="x")
    jpeg = F.encode(F.noise(300, 200), "JPEG")
    with pytest.raises(MediaError):
        h = media.read_header(jpeg[:400], path="x")
        media.decode(jpeg[:400], h, path="x")


@pytest.mark.parametrize(
    ("data", "declared", "message"),
    [
        (b"GIF89a" + b"\x00" * 20, "image/png", "declared media type image/png but the bytes are image/gif"),
        (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml", "unsupported media type"),
        (b"hello world, not an image", None, "not a supported image"),
        (b"", None, "not a supported image"),
    ],
)
def test_media_type_errors(data: bytes, declared: str | None, message: str) -> None:
    with pytest.raises(MediaTypeError, match=message) as e:
        media.read_header(data, path="messages[0].content[1].image_url.url", media_type=declared)
    assert e.value.path == "messages[0].content[1].image_url.url"


def test_declared_type_that_agrees_and_aliases() -> None:
    jpeg = F.encode(F.noise(10, 10), "JPEG")
    assert media.read_header(jpeg, media_type="image/jpg").media_type == "image/jpeg"
    assert media.read_header(jpeg, media_type="IMAGE/JPEG").format == "JPEG"


def _png_header_only(width: int, height: int, *, bit_depth: int, colour_type: int, rows: bytes | None) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows or b"") + chunk(b"IEND", b"")


def bomb_png(side: int) -> bytes:
    """A valid side x side 1-bit PNG of zeros, compressed in chunks (its pixels would take side^2 * 3 bytes as RGB)."""
    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + (side + 7) // 8)
    parts = [comp.compress(row * 1000) for _ in range(side // 1000)]
    parts.append(comp.compress(row * (side % 1000)))
    parts.append(comp.flush())
    return _png_header_only(side, side, bit_depth=1, colour_type=0, rows=b"".join(parts))


def test_zero_sized_png_is_refused() -> None:
    data = _png_header_only(0, 10, bit_depth=8, colour_type=2, rows=None)
    with pytest.raises(MediaError) as e:
        media.read_header(data, path="p")
    assert e.value.path == "p"


def test_cap_below_pillows_own_bomb_check() -> None:
    # 12000^2 = 144M pixels: Pillow only warns (its error starts at twice its cap); ctxlock's cap refuses.
    with pytest.raises(ImageSizeError, match="over the cap") as e:
        media.read_header(bomb_png(12000), path="messages[0].content[0].image_url.url")
    assert e.value.path == "messages[0].content[0].image_url.url"
    with pytest.raises(ImageSizeError, match="over the cap"):
        media.read_header(F.png(F.noise(64, 64)), max_pixels=64 * 63)


def test_30000_square_png_refused_from_header_without_large_allocation(tmp_path: Path) -> None:
    data = bomb_png(30000)
    assert len(data) < 300_000  # a small file whose pixels would be 2.7 GB as RGB
    path = tmp_path / "bomb.png"
    path.write_bytes(data)
    # A fresh process, so the peak resident size measures only this: Pillow's C allocations are not seen by
    # tracemalloc, so both are measured (Python heap by tracemalloc, everything by ru_maxrss).
    script = textwrap.dedent(
        f"""
        import resource, tracemalloc, json
        from ctxlock.multimodal import _media as media
        from ctxlock.errors import ImageSizeError
        data = open({str(path)!r}, "rb").read()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        tracemalloc.start()
        try:
            media.read_header(data, path="messages[0].content[0]")
            outcome = "accepted"
        except ImageSizeError as e:
            outcome = str(e)
        _, peak = tracemalloc.get_traced_memory()
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"outcome": outcome, "traced_peak": peak, "rss_growth_kb": after - before}}))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    import json

    result = json.loads(done.stdout)
    assert "decompression bomb refused from the header" in result["outcome"]
    assert "messages[0].content[0]" in result["outcome"]
    assert result["traced_peak"] < 2_000_000  # the file itself is 0.1 MB; the pixels would be 2.7 GB
    assert result["rss_growth_kb"] < 20_000
