"""The decode-memory bound (docs/images.md), proved on generated attacks measured in child processes.

Each attack is an image Pillow makes whose header declares a size inside the pixel cap but a mode (and a decode
path) that costs many bytes a pixel: lossless WebP (libwebp's canvases), 16-bit PNG, palette PNG with a
transparency entry (composited onto white), RGBA, LA, 1-bit, animated WebP and GIF, an EXIF-rotated JPEG, CMYK
TIFF. For each, `ctxlock render` runs in a child process under a low bound (`CTXLOCK_MAX_DECODE_BYTES`, to keep it
cheap): the image sized just under the bound's estimate decodes, and the child's peak RSS (`os.wait4`) grows over
the same command on a 16x16 image by at most the bound plus 64 MiB; the image at twice the side is refused from its
header with one typed line (`ImageMemoryError`, naming the limit and how to raise it), no traceback, and no decode.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image

import mm_fixtures
from cli_runner import run_cli
from ctxlock.batch._fast import mask_rows
from ctxlock.errors import CtxlockError, ImageMemoryError, ImagePlacementError
from ctxlock.model._model import Model, load
from ctxlock.multimodal import _media as media
from ctxlock.multimodal._base import ColourPolicy, Orientation
from ctxlock.multimodal._pipeline import StageOptions, plan_image
from ctxlock.multimodal._registry import family_for
from ctxlock.multimodal._sources import ImageBytes, ImageRef
from ctxlock.training._masks import MaskOptions

MIB = 1 << 20
LIMIT = 64 * MIB
# a small plan, so the family's resized tensors (bounded by the model's max_pixels, not by the image) stay small
PREPROCESSOR = {**mm_fixtures.HUB_PREPROCESSOR, "max_pixels": 200704}


def _rgb(side_w: int, side_h: int, mode: str) -> Image.Image:
    im = mm_fixtures.noise(min(side_w, 256), min(side_h, 256), "RGB").resize((side_w, side_h))
    return im if mode == "RGB" else im.convert(mode)


def _encode(kind: str, w: int, h: int) -> bytes:
    """The attack image `kind` at w x h."""
    buf = io.BytesIO()
    if kind == "webp-rgba-lossless":
        Image.new("RGBA", (w, h), (10, 20, 30, 40)).save(buf, "WEBP", lossless=True)
    elif kind == "webp-rgb":
        _rgb(w, h, "RGB").save(buf, "WEBP", quality=50)
    elif kind == "png-16bit":
        Image.new("I;16", (w, h), 300).save(buf, "PNG")
    elif kind == "png-palette-transparent":
        Image.new("P", (w, h), 1).save(buf, "PNG", transparency=1)
    elif kind == "png-rgb-trns":
        Image.new("RGB", (w, h), (1, 2, 3)).save(buf, "PNG", transparency=(1, 2, 3))
    elif kind in ("png-rgba", "png-la", "png-1bit"):
        mode = {"png-rgba": "RGBA", "png-la": "LA", "png-1bit": "1"}[kind]
        Image.new(mode, (w, h)).save(buf, "PNG")
    elif kind == "webp-animated":
        frames = [Image.new("RGBA", (w, h), (k * 40, 0, 0, 128)) for k in range(3)]
        frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    elif kind == "gif-animated":
        frames = [Image.new("P", (w, h), k) for k in range(3)]
        frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], transparency=0)
    elif kind == "jpeg-exif-rotated":
        exif = Image.Exif()
        exif[0x0112] = 6
        _rgb(w, h, "RGB").save(buf, "JPEG", exif=exif.tobytes(), quality=50)
    elif kind == "tiff-cmyk":
        Image.new("CMYK", (w, h), (1, 2, 3, 4)).save(buf, "TIFF", compression="tiff_deflate")
    else:
        raise AssertionError(kind)
    return buf.getvalue()


KINDS = [
    "webp-rgba-lossless",
    "webp-rgb",
    "png-16bit",
    "png-palette-transparent",
    "png-rgb-trns",
    "png-rgba",
    "png-la",
    "png-1bit",
    "webp-animated",
    "gif-animated",
    "jpeg-exif-rotated",
    "tiff-cmyk",
]


def _estimate_per_pixel(kind: str) -> float:
    header = media.read_header(_encode(kind, 64, 48))
    steps = media.decode_steps(header, Orientation.EXIF_TRANSPOSE, ColourPolicy.PIL_CONVERT)
    return sum(n for _, n in steps) / (64 * 48)


def _request(data: bytes) -> str:
    url = f"data:{media.sniff(data)};base64,{base64.b64encode(data).decode()}"
    return json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": url}]}]})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mm_fixtures.build_qwen2vl_dir(tmp_path_factory.mktemp("qwen2vl"), PREPROCESSOR)


# A child forked from this (large) test process would count this process's pages in its own peak, so a small
# Python process starts the command and reports its child's peak RSS (getrusage RUSAGE_CHILDREN, in KiB).
_PROBE = (
    "import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
    "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def _render(model: Path, data: bytes, tmp: Path) -> tuple[int, str, float]:
    """(exit status, stderr, peak RSS in MiB) of `ctxlock render` on a request holding `data`, in a child."""
    req = tmp / "req.json"
    req.write_text(_request(data), encoding="utf-8")
    env = {**os.environ, media.DECODE_BYTES_ENV: str(LIMIT), "NO_COLOR": "1"}
    command = [sys.executable, "-m", "ctxlock", "render", "-m", str(model), str(req), "--json"]
    proc = subprocess.run([sys.executable, "-c", _PROBE, *command], capture_output=True, text=True, env=env)
    rc, peak = proc.stdout.split()
    return int(rc), proc.stderr, int(peak) / 1024


def _side(kind: str) -> int:
    """The side of the attack `kind` whose estimate is 90% of the bound (at a 4:3 aspect, a little under)."""
    return int(math.sqrt(0.9 * LIMIT / _estimate_per_pixel(kind)))


def test_decode_memory_is_bounded_on_generated_attacks(model_dir: Path, tmp_path: Path) -> None:
    cases = [("baseline", _encode("webp-rgb", 16, 16))]
    cases += [(f"{kind} under", _encode(kind, _side(kind), _side(kind) * 3 // 4)) for kind in KINDS]
    # twice the side: four times the estimate, refused from the header
    over = ("webp-animated", "png-16bit", "png-palette-transparent")
    cases += [(f"{kind} over", _encode(kind, 2 * _side(kind), _side(kind) * 3 // 2)) for kind in over]
    dirs = [tmp_path / str(k) for k in range(len(cases))]
    for d in dirs:
        d.mkdir()
    with ThreadPoolExecutor(3) as pool:  # each probe measures its own child: running three at once changes nothing
        results = list(pool.map(lambda c: _render(model_dir, c[0][1], c[1]), zip(cases, dirs, strict=True)))
    (rc, err, baseline), failures = results[0], []
    assert rc == 0, err
    for (name, _), (rc, err, peak) in zip(cases[1:], results[1:], strict=True):
        if name.endswith("under") and (rc != 0 or peak - baseline > (LIMIT + 64 * MIB) / MIB):
            failures.append((name, rc, err[-300:], round(peak - baseline)))
        lines = err.strip().splitlines()
        refused = (
            rc == 1
            and len(lines) == 1
            and "ImageMemoryError" in lines[0]
            and "decode-memory limit of 64 MiB" in lines[0]
            and media.DECODE_BYTES_ENV in lines[0]
            and "Traceback" not in err
        )
        if name.endswith("over") and (not refused or peak > baseline):  # refused from the header: nothing decoded
            failures.append((name, rc, err[-300:], round(peak - baseline)))
    assert not failures, failures


def test_every_attack_over_the_bound_is_refused_from_its_header(model_dir: Path) -> None:
    """Each kind at twice the side is refused by the image stage itself, as `render` and `count` run it."""
    family = family_for(json.loads((model_dir / "preprocessor_config.json").read_text()), path="preprocessor")
    assert family is not None
    for kind in KINDS:
        data = _encode(kind, 2 * _side(kind), _side(kind) * 3 // 2)
        ref = ImageRef(0, "messages[0].content[0]", "data:", 0)
        ib = ImageBytes(ref, data, None, "data-url")
        with pytest.raises(ImageMemoryError, match="decode-memory limit of 64 MiB"):
            plan_image(ib, family, StageOptions(max_decode_bytes=LIMIT))
        plan_image(ib, family, StageOptions(max_decode_bytes=8 * LIMIT))  # raised: planned


def test_issue_attacks_refused_at_the_default_bound(model_dir: Path) -> None:
    """The issue's attacks (a 3 KB lossless WebP of 9000x9000, 16-bit and palette PNGs of the same size) are
    refused from the header at the default 256 MiB, and the estimate names each step; a bad setting is typed."""
    for kind in ("webp-rgba-lossless", "png-16bit", "png-palette-transparent"):
        header = media.read_header(_encode(kind, 9000, 9000))
        with pytest.raises(ImageMemoryError, match=r"decode-memory limit of 256 MiB") as e:
            media.check_decode_memory(
                header, Orientation.EXIF_TRANSPOSE, ColourPolicy.PIL_CONVERT, limit=media.max_decode_bytes()
            )
        assert media.DECODE_BYTES_ENV in e.value.hint
    os.environ[media.DECODE_BYTES_ENV] = "lots"
    try:
        with pytest.raises(ImageMemoryError, match="not a size in bytes"):
            media.max_decode_bytes()
    finally:
        del os.environ[media.DECODE_BYTES_ENV]


def _whole_files() -> dict[str, bytes]:
    img = mm_fixtures.noise(48, 40, "RGB")
    rgba = mm_fixtures.noise(48, 40, "RGBA")
    frames = [mm_fixtures.noise(24, 20, "RGB", seed=k).convert("P") for k in range(3)]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:])
    exif = Image.Exif()
    exif[0x0112] = 6
    return {
        "png": mm_fixtures.encode(img, "PNG"),
        "png-rgba": mm_fixtures.encode(rgba, "PNG"),
        "png-16bit": mm_fixtures.encode(mm_fixtures.noise(48, 40, "I;16"), "PNG"),
        "png-palette": mm_fixtures.encode(mm_fixtures.noise(48, 40, "P"), "PNG"),
        "jpeg": mm_fixtures.encode(img, "JPEG", quality=80),
        "jpeg-progressive-exif": mm_fixtures.encode(img, "JPEG", progressive=True, exif=exif.tobytes()),
        "gif-animated": gif.getvalue(),
        "webp": mm_fixtures.encode(img, "WEBP"),
        "webp-lossless-rgba": mm_fixtures.encode(rgba, "WEBP", lossless=True),
        "bmp": mm_fixtures.encode(img, "BMP"),
        "tiff": mm_fixtures.encode(img, "TIFF"),
        "tiff-deflate": mm_fixtures.encode(img, "TIFF", compression="tiff_deflate"),
    }


def _verdict(model: Model, data: bytes, decode: bool) -> str:
    url = "data:;base64," + base64.b64encode(data).decode()
    req = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": url}]}]}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's "Truncated File Read" on a cut TIFF
            model.run_images(json.dumps(req), decode=decode)
    except CtxlockError as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


def test_count_and_render_share_one_rule_for_truncated_and_corrupt_files(model_dir: Path) -> None:
    """The header-only path (`count`, the budget: `run_images(decode=False)`) and the decode (`render`) give the
    same verdict, the same error, on every file cut at 25 places (and, for PNG and deflate TIFF, whose data carry
    their own checks, with a byte flipped at 8): each whole file is accepted by both, each cut one refused by both.
    """
    model = load(str(model_dir))
    disagree = []
    for name, data in _whole_files().items():
        assert _verdict(model, data, False) == _verdict(model, data, True) == "ok", name
        cuts = sorted({max(1, len(data) * k // 24) for k in range(1, 24)} | {len(data) - 1, len(data) - 2})
        flips = [len(data) * k // 9 for k in range(1, 9)]
        variants = [(f"cut {c}", data[:c]) for c in cuts]
        if name.startswith("png") or name == "tiff-deflate":  # corrupt data the container shows (docs/images.md)
            variants += [(f"flip {f}", data[:f] + bytes([data[f] ^ 0x5A]) + data[f + 1 :]) for f in flips]
        for label, variant in variants:
            header_only, decoded = _verdict(model, variant, False), _verdict(model, variant, True)
            if header_only != decoded or (label.startswith("cut") and header_only == "ok"):
                disagree.append((name, label, header_only[:120], decoded[:120]))
    assert not disagree, disagree


def test_cli_count_and_render_refuse_a_truncated_png_alike(model_dir: Path, tmp_path: Path) -> None:
    data = _whole_files()["png"]
    req = tmp_path / "req.json"
    req.write_text(_request(data[: len(data) - 30]), encoding="utf-8")
    outs = [run_cli(command, "-m", str(model_dir), str(req)) for command in ("count", "render")]
    for out in outs:
        assert out.returncode == 1, out.stderr
        assert "Traceback" not in out.stderr
    lines = [out.stderr.strip().splitlines() for out in outs]
    assert lines[0] == lines[1] and len(lines[0]) == 1 and "ImageDecodeError" in lines[0][0], lines
    assert "truncated" in lines[0][0]


def _training_rows() -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(_whole_files()["png"]).decode()
    image = {"type": "image_url", "image_url": {"url": url}}
    return [
        {"messages": [{"role": "user", "content": [image, {"type": "text", "text": "hi"}]}, _ASSISTANT]},
        {"messages": [{"role": "user", "content": "hi"}, _ASSISTANT]},
        {"messages": [{"role": "user", "content": [{"type": "image", "url": url}]}, _ASSISTANT]},
    ]


_ASSISTANT = {"role": "assistant", "content": "ok"}


def test_training_rows_with_images_are_refused_not_one_unexpanded_placeholder(tmp_path: Path) -> None:
    """The default model (mistral-nemo, whose `render` expands an image to its Pixtral tokens) never trains on an
    image row's unexpanded `[IMG]`: `encode(return_assistant_tokens_mask=True)`, `mask_rows` (every path `ctxlock batch`
    takes) and the CLI's `batch` give the row `ImagePlacementError`; the text row is kept."""
    model = load()
    rows = _training_rows()
    for row in (rows[0], rows[2]):
        with pytest.raises(ImagePlacementError, match="unexpanded"):
            model.encode(row, return_assistant_tokens_mask=True)
    for render in ({}, {"add_generation_prompt": False}):
        got = list(mask_rows(model, rows, MaskOptions(), **render))
        assert [type(r).__name__ for r in got] == ["ImagePlacementError", "MaskedRow", "ImagePlacementError"], got
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = run_cli("batch", str(source), str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    errors = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [(e["row"], e["type"]) for e in errors] == [(0, "ImagePlacementError"), (2, "ImagePlacementError")]
    assert errors[0]["path"] == "messages[0].content[0].image_url.url"
