#!/usr/bin/env python3
"""Build llama.cpp's llama-server for the tests, from the pinned llama-cpp-python sdist (see tests/llama_server.py).

    python scripts/build_llama_server.py            build it if the cache has none (or a damaged one), print its path
    python scripts/build_llama_server.py --rebuild  build it again even if the cached one is intact

The cache is $CTXLOCK_TEST_CACHE, default ~/.cache/ctxlock-test. Exit status 0 when the binary is in place,
1 with a message on stderr otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fetched
import llama_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rebuild", action="store_true", help="discard the cached binary and build it again")
    args = parser.parse_args(argv)
    try:
        if args.rebuild:
            with fetched.locked(llama_server.build_dir().name):
                shutil.rmtree(llama_server.build_dir(), ignore_errors=True)
        print(f"ok  llama-server                 {llama_server.llama_server_binary()}")
    except fetched.ArtifactError as exc:
        print(f"build_llama_server: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
