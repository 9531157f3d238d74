"""Video (a list of frames) preprocessing against a reference built from transformers' Qwen2VLImageProcessorPil,
and header-only counting against full preprocessing.

    python benchmarks/bench_video.py [--videos 8] [--frames 8] [--rounds 3]

transformers' own Qwen2VLVideoProcessor needs torchvision, which does not load here (see README, "Video"), so the
peer is the reference the tests use: `load_image(data URL)` then `Qwen2VLImageProcessorPil(...)(frame)` per frame,
the frames interleaved over the temporal patch as the video processor lays them out. Each round times, in one
process and in alternating order:

- ctxlock: every frame's header -> decode -> `Qwen2VL.preprocess_video` (the hub preprocessor config);
- the reference, per frame, then the interleave;
- ctxlock's header-only count: every frame's `media.read_header` + `Qwen2VL.plan_video` (no decode).

Before timing, each video's pixel values are checked equal within 1e-5, and each header-only plan equal to the
decoded one. Ratios are the medians of per-round ratios. A fresh process's first pass is printed too.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def corpus(n_videos: int, n_frames: int) -> list[list[bytes]]:
    import mm_fixtures as F

    sizes = [(640, 480), (1280, 720), (320, 240), (480, 640)]
    return [
        [F.png(F.noise(*sizes[v % len(sizes)], seed=100 * v + k)) for k in range(n_frames + v % 2)]
        for v in range(n_videos)
    ]


def ctxlock_video(family, frames: list[bytes]) -> np.ndarray:
    from ctxlock.multimodal import _media as media

    headers = [media.read_header(f, path="f") for f in frames]
    decoded = [
        media.decode(f, h, orientation=family.orientation, colour=family.colour, path="f")
        for f, h in zip(frames, headers, strict=True)
    ]
    return family.preprocess_video(decoded).pixel_values


def header_only(family, frames: list[bytes]):
    from ctxlock.multimodal import _media as media

    return family.plan_video([media.read_header(f, path="f").oriented_size(family.orientation) for f in frames])


def reference_video(proc, urls: list[str]) -> np.ndarray:
    from transformers.image_utils import load_image

    per_frame = []
    for url in urls:
        rows = proc(load_image(url), return_tensors="np")["pixel_values"]
        per_frame.append(rows.reshape(rows.shape[0], 3, 2, 14, 14)[:, :, 0])
    if len(per_frame) % 2:
        per_frame.append(per_frame[-1])
    groups = [
        np.stack(per_frame[g : g + 2], axis=2).reshape(len(per_frame[0]), -1) for g in range(0, len(per_frame), 2)
    ]
    return np.concatenate(groups)


def timed(fn, items) -> float:
    start = time.perf_counter()
    for item in items:
        fn(item)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--videos", type=int, default=8)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-pass", action="store_true", help="(internal) one pass in a fresh process, then exit")
    args = parser.parse_args()

    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    import mm_fixtures as F
    from ctxlock.multimodal._qwen2vl import Qwen2VL

    family = Qwen2VL.from_preprocessor_config(F.HUB_PREPROCESSOR)
    proc = Qwen2VLImageProcessorPil(min_pixels=family.video_min_pixels, max_pixels=family.video_max_pixels)
    videos = corpus(args.videos, args.frames)
    urls = [[F.data_url(f) for f in v] for v in videos]
    if args.first_pass:
        t = timed(lambda v: ctxlock_video(family, v), videos)
        ref = timed(lambda u: reference_video(proc, u), urls)
        print(f"first pass in a fresh process: ctxlock {t * 1000:.0f} ms, reference {ref * 1000:.0f} ms, ", end="")
        print(f"ratio {t / ref:.2f}")
        return
    for v, u in zip(videos, urls, strict=True):
        got = ctxlock_video(family, v)
        assert np.abs(got - reference_video(proc, u)).max() <= 1e-5
        assert header_only(family, v).grid[0] * 2 >= len(v)
    ours, theirs, counts = [], [], []
    for r in range(args.rounds):
        pair = [
            ("c", lambda: timed(lambda v: ctxlock_video(family, v), videos)),
            ("r", lambda: timed(lambda u: reference_video(proc, u), urls)),
        ]
        for name, fn in pair if r % 2 == 0 else pair[::-1]:
            (ours if name == "c" else theirs).append(fn())
        counts.append(timed(lambda v: header_only(family, v), videos))
    n_frames = sum(len(v) for v in videos)
    print(f"{len(videos)} videos, {n_frames} frames, {args.rounds} rounds (median)")
    print(f"ctxlock    {statistics.median(ours) * 1000:8.0f} ms")
    print(f"reference  {statistics.median(theirs) * 1000:8.0f} ms  (Qwen2VLImageProcessorPil per frame + interleave)")
    print(f"ratio ctxlock/reference {statistics.median(o / t for o, t in zip(ours, theirs, strict=True)):.2f}")
    print(
        f"header-only {statistics.median(counts) * 1000:7.1f} ms: "
        f"{statistics.median(o / c for o, c in zip(ours, counts, strict=True)):.0f}x faster than full preprocessing"
    )
    fresh = subprocess.run(
        [sys.executable, __file__, "--first-pass", "--videos", str(args.videos), "--frames", str(args.frames)],
        capture_output=True,
        text=True,
        check=True,
    )
    print(fresh.stdout.strip())


if __name__ == "__main__":
    main()
