"""Image preprocessing against transformers' Qwen2VLImageProcessorPil, and header-only counting against it.

    python benchmarks/bench_images.py [--images 100] [--rounds 3]

A fixed set of generated images (mixed sizes 1x1 .. 4000x3000, PNG and JPEG, RGB, RGBA, palette, grayscale, EXIF
orientations), bytes in memory. Each round times, in one process and in alternating order:

- ctxlock: header -> decode -> Qwen2-VL pixel values, for every image (`media.read_header`, `media.decode`,
  `Qwen2VL.preprocess`), with the hub's preprocessor config;
- transformers: `load_image(base64)` then `Qwen2VLImageProcessorPil(...)(image, return_tensors="np")` per image, the
  path `apply_chat_template` takes for a base64 image (the base64 encoding is done before timing);
- ctxlock's header-only count: `media.read_header` + `Qwen2VL.plan` per image (no decode).

Before timing, every image's pixel values are checked equal (within 1e-5) and every header-only count equal to the
decoded one. The ratios are the medians of the per-round ratios. A fresh process's first pass is printed too.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def corpus(n: int) -> list[bytes]:
    import mm_fixtures as F

    sizes = [(1, 1), (64, 48), (320, 240), (640, 480), (480, 640), (1024, 768), (1280, 720), (2000, 1500)]
    sizes += [(4000, 3000), (3000, 4000), (800, 800), (300, 1200)]
    modes = ["RGB", "RGBA", "P", "L", "RGB", "RGB"]
    out: list[bytes] = []
    k = 0
    while len(out) < n:
        w, h = sizes[k % len(sizes)]
        mode = modes[k % len(modes)]
        image = F.noise(w, h, mode="RGB" if mode == "L" else mode, seed=k)
        image = image.convert("L") if mode == "L" else image
        if k % 5 == 0:
            out.append(F.with_orientation(image, 1 + k % 8))
        elif k % 2 == 0 and mode in ("RGB", "L"):
            out.append(F.encode(image, "JPEG", quality=90))
        else:
            out.append(F.png(image))
        k += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--max-pixels", type=int, default=None, help="max_pixels instead of the hub config's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-pass", action="store_true", help="(internal) one untimed-before pass, then exit")
    args = parser.parse_args()

    import numpy as np
    from transformers.image_utils import load_image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    import mm_fixtures as F
    from ctxlock.multimodal import _media as media
    from ctxlock.multimodal._qwen2vl import Qwen2VL

    hub = dict(F.HUB_PREPROCESSOR, **({"max_pixels": args.max_pixels} if args.max_pixels else {}))
    config = {k: v for k, v in hub.items() if k not in ("image_processor_type", "processor_class")}
    family = Qwen2VL.from_preprocessor_config(hub)
    reference = Qwen2VLImageProcessorPil(**config)
    images = corpus(args.images)
    encoded = [base64.b64encode(data).decode() for data in images]

    # Each result is dropped as soon as it is made (the hub config's 4000x3000 image is 288 MB of float32).
    def one_ours(data: bytes):
        header = media.read_header(data)
        decoded = media.decode(data, header, orientation=family.orientation, colour=family.colour)
        return family.preprocess(decoded)

    def one_theirs(b64: str):
        return reference(load_image(b64), return_tensors="np")

    def ours() -> None:
        for data in images:
            one_ours(data)

    def theirs() -> None:
        for b64 in encoded:
            one_theirs(b64)

    def counted() -> list:
        return [family.plan(media.read_header(data)) for data in images]

    if args.first_pass:
        timings = {}
        for name, fn in (("ctxlock", ours), ("transformers", theirs), ("header-only", counted)):
            t0 = time.perf_counter()
            fn()
            timings[name] = time.perf_counter() - t0
        print(" ".join(f"{k}={v:.3f}" for k, v in timings.items()))
        return

    for data, b64, plan in zip(images, encoded, counted(), strict=True):
        mine, ref = one_ours(data), one_theirs(b64)
        assert mine.pixel_values.shape == ref["pixel_values"].shape
        assert np.abs(mine.pixel_values - ref["pixel_values"]).max() <= 1e-5
        assert tuple(ref["image_grid_thw"][0].tolist()) == mine.plan.grid and plan == mine.plan
    print(f"{len(images)} images, {sum(map(len, images)) / 1e6:.1f} MB; pixel values equal, counts equal")

    ratios, speedups, rows = [], [], []
    for r in range(args.rounds):
        order = [("ctxlock", ours), ("transformers", theirs)]
        if r % 2:
            order.reverse()
        t = {}
        for name, fn in order:
            t0 = time.perf_counter()
            fn()
            t[name] = time.perf_counter() - t0
        t0 = time.perf_counter()
        counted()
        t["header-only"] = time.perf_counter() - t0
        ratios.append(t["ctxlock"] / t["transformers"])
        speedups.append(t["ctxlock"] / t["header-only"])
        rows.append(t)
        print(
            f"round {r}: ctxlock {t['ctxlock']:.3f}s  transformers {t['transformers']:.3f}s  "
            f"header-only {t['header-only'] * 1000:.1f}ms"
        )
    print(
        f"ctxlock / transformers: median {statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})"
    )
    print(f"full preprocessing / header-only count: median {statistics.median(speedups):.0f}x")
    fresh = subprocess.run(
        [sys.executable, __file__, "--images", str(args.images), "--first-pass"]
        + (["--max-pixels", str(args.max_pixels)] if args.max_pixels else []),
        capture_output=True,
        text=True,
        check=True,
    )
    print(f"fresh process, first pass: {fresh.stdout.strip()}")


if __name__ == "__main__":
    main()
