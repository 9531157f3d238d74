"""GGUF tokenizer load time: ctxlock's native loader vs transformers' GGUF path, side by side in one process.

    python benchmarks/bench_load.py [--vocab qwen2 --vocab llama-spm ...] [--rounds 3]

- cold: ctxlock reads the GGUF header, converts the vocabulary and builds the `tokenizers` pipeline, with an
  empty conversion cache; transformers runs `AutoTokenizer.from_pretrained(dir, gguf_file=...)`.
- warm: ctxlock again with the conversion cache filled (hash the file, read the cached pipeline).
Both sides are checked to give the same ids on a sample text first. Medians; the ratio is transformers / ctxlock.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from timing import median_seconds

import fetched
from ctxlock.artifacts import load_gguf as _load_gguf

SAMPLE = "Hello world! 天空为什么是蓝色？ def f(x): return x ** 2  🦙"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", action="append", help="ggml-vocab name (repeatable); default qwen2, llama-spm")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    print(f"{'vocab':12s} {'ctxlock cold s':>15s} {'transformers s':>15s} {'ratio':>7s} {'ctxlock warm s':>15s}")
    for vocab in args.vocab or ["qwen2", "llama-spm"]:
        path = fetched.gguf_path(vocab)

        def cold(path: Path = path) -> None:
            os.environ["CTXLOCK_CACHE_DIR"] = tempfile.mkdtemp(prefix="ctxlock-bench-")
            _load_gguf(path)

        def hf(path: Path = path) -> object:
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

        os.environ["CTXLOCK_CACHE_DIR"] = tempfile.mkdtemp(prefix="ctxlock-bench-")
        ours = _load_gguf(path).tokenizer
        theirs = hf()
        same = ours.encode(SAMPLE) == theirs.encode(SAMPLE, add_special_tokens=False)
        t_cold = median_seconds(cold, args.rounds)
        t_hf = median_seconds(hf, args.rounds)
        warm_dir = tempfile.mkdtemp(prefix="ctxlock-bench-")
        os.environ["CTXLOCK_CACHE_DIR"] = warm_dir
        _load_gguf(path)  # fill the cache
        t_warm = median_seconds(lambda path=path: _load_gguf(path), max(args.rounds, 5))
        note = "" if same else "  (ids differ on the sample text)"
        print(f"{vocab:12s} {t_cold:15.2f} {t_hf:15.2f} {t_hf / t_cold:7.1f} {t_warm:15.2f}{note}")


if __name__ == "__main__":
    main()
