"""The issue's bad inputs sent as whole requests, in both dialects, through `run_images`, `count` and the CLI: each
is a typed error at the JSON path the client sent the image at, never a crash, a hang or a large allocation.
(tests/multimodal/test_multimodal_media.py proves the same limits on the media layer alone; this proves they hold, with
their paths, where users meet them.)"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

import ctxlock
import mm_fixtures as F
from cli_runner import run_cli
from ctxlock.errors import (
    CtxlockError,
    ImageDecodeError,
    ImagePlacementError,
    ImageSizeError,
    MediaTypeError,
)
from ctxlock.multimodal._base import AnimationPolicy
from ctxlock.multimodal._pipeline import StageOptions


def _bomb_png(side: int) -> bytes:
    """A valid side x side 1-bit PNG of zeros (its pixels would take side^2 * 3 bytes as RGB), a few hundred KB."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + (side + 7) // 8)
    rows = b"".join([comp.compress(row * 1000) for _ in range(side // 1000)] + [comp.compress(row * (side % 1000))])
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    body = rows + comp.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def _gif(frames: int) -> bytes:
    images = [F.noise(64, 48, seed=k).convert("P") for k in range(frames)]
    buf = io.BytesIO()
    images[0].save(buf, "GIF", save_all=True, append_images=images[1:], duration=50, loop=0)
    return buf.getvalue()


def _openai(data: bytes, media_type: str) -> dict:
    url = f"data:{media_type};base64,{base64.b64encode(data).decode()}"
    return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}


def _anthropic(data: bytes, media_type: str) -> dict:
    source = {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode()}
    return {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}]}


PATHS = {"openai": "messages[0].content[0].image_url.url", "anthropic": "messages[0].content[0].source"}
BUILD = {"openai": _openai, "anthropic": _anthropic}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return F.build_qwen2vl_dir(tmp_path_factory.mktemp("bad") / "qwen2-vl", F.HUB_PREPROCESSOR)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> ctxlock.Model:
    return ctxlock.load(str(model_dir))


CASES = [
    # (label, bytes, declared media type, error, message)
    ("bomb 30000x30000", _bomb_png(30000), "image/png", ImageSizeError, "decompression bomb refused from the header"),
    ("aspect 201:1", F.png(F.noise(201, 1)), "image/png", ImageSizeError, "aspect ratio"),
    ("aspect 1:4000", F.png(F.noise(1, 4000)), "image/png", ImageSizeError, "aspect ratio"),
    ("gif declared png", _gif(2), "image/png", MediaTypeError, "declared media type image/png"),
    ("svg", b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml", MediaTypeError, "unsupported media type"),
    ("truncated png", F.png(F.noise(300, 200))[:400], "image/png", ImageDecodeError, ""),
    ("not an image", b"hello, not an image at all", "image/png", MediaTypeError, ""),
]


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize(("label", "data", "declared", "error", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_images_are_typed_errors_at_their_path(
    model: ctxlock.Model, dialect: str, label: str, data: bytes, declared: str, error: type, message: str
) -> None:
    request = BUILD[dialect](data, declared)
    for run in (lambda: model.run_images(request), lambda: model.run_images(request, decode=False)):
        with pytest.raises(CtxlockError) as e:
            run()
        assert isinstance(e.value, error), (label, e.value)
        assert message in e.value.message and e.value.hint
        assert e.value.path == PATHS[dialect]


def test_one_pixel_images_in_both_dialects(model: ctxlock.Model) -> None:
    """A 1x1 image is no error: smart_resize takes it up to min_pixels (56x56: 4 tokens; transformers' parity for
    1x1 is in test_multimodal_media and test_multimodal_pipeline); both dialects give the same input."""
    data = F.png(F.noise(1, 1))
    a, b = model.run_images(_openai(data, "image/png")), model.run_images(_anthropic(data, "image/png"))
    assert a.images[0].n_tokens == 4 and a.image_grid_thw.tolist() == [[1, 4, 4]]
    assert list(a.ids) == list(b.ids) and (a.pixel_values == b.pixel_values).all()


def test_animated_image_first_frame_or_error_by_named_policy(model: ctxlock.Model) -> None:
    request = _openai(_gif(3), "image/gif")
    first = model.run_images(request)
    assert first.images[0].header.frames == 3
    assert first.to_json()["images"][0]["decode"]["animation"] == "first-frame"
    with pytest.raises(ImageDecodeError) as e:
        model.run_images(request, images=StageOptions(animation=AnimationPolicy.ERROR))
    assert e.value.path == PATHS["openai"] and "3 frames" in e.value.message


def test_image_to_a_text_only_model_in_both_dialects(tmp_path: Path) -> None:
    text_only = ctxlock.load(str(F.build_qwen2vl_dir(tmp_path / "text-only", None)))
    for dialect in ("openai", "anthropic"):
        with pytest.raises(ImagePlacementError, match="no image processor") as e:
            text_only.run_images(BUILD[dialect](F.png(F.noise(30, 30)), "image/png"))
        assert e.value.path == PATHS[dialect]


def test_bomb_through_the_pipeline_allocates_nothing_large(model_dir: Path, tmp_path: Path) -> None:
    """The 30,000x30,000 PNG as a data: URL through `Model.run_images`, in a fresh process: refused from its
    header, the peak resident size grows by under 64 MB (its pixels would be 2.7 GB as RGB)."""
    request = tmp_path / "bomb.json"
    request.write_text(json.dumps(_openai(_bomb_png(30000), "image/png")), encoding="utf-8")
    script = textwrap.dedent(
        f"""
        import json, resource
        import ctxlock
        from ctxlock.errors import ImageSizeError
        model = ctxlock.load({str(model_dir)!r})
        data = json.loads(open({str(request)!r}).read())
        req = model.parse(data)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            model.run_images(req)
            outcome = "accepted"
        except ImageSizeError as e:
            outcome = e.path + ": " + e.message
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"outcome": outcome, "rss_growth_kb": after - before}}))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["outcome"].startswith(PATHS["openai"] + ": ") and "refused from the header" in out["outcome"]
    assert out["rss_growth_kb"] < 64 * 1024, out


def test_cli_says_one_line_for_a_bomb_and_a_lying_media_type(model_dir: Path, tmp_path: Path) -> None:
    for data, declared, error in ((_bomb_png(30000), "image/png", "ImageSizeError"), (_gif(2), "image/png", "")):
        request = tmp_path / "r.json"
        request.write_text(json.dumps(_openai(data, declared)), encoding="utf-8")
        for command in ("render", "count"):
            done = run_cli(command, str(request), "--model", str(model_dir))
            assert done.returncode == 1 and done.stdout == "", done.stderr
            assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
            assert done.stderr.startswith(f"error: {error or 'MediaTypeError'}: {PATHS['openai']}: ")
