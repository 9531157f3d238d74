"""Shared pytest setup for ctxlock's tests.

Real artifacts (tests/fetched.py) are fetched before collection, so test modules may parametrize over them
at import time (``fetched.template_paths()``, ``fetched.vector_vocabs()``). If they cannot be fetched or
verified, the run stops with exit status 1 and the reason: nothing is skipped.

Test helpers are plain modules next to this file, imported by their top-level names:
``import fetched`` (the pinned real artifacts, their cache) and ``import reference`` (the transformers oracle).
This file must not import ctxlock.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:  # pytest's default "prepend" import mode does this already; other modes do not
    sys.path.insert(0, _TESTS_DIR)

import fetched  # noqa: E402

# fastokens (whole-text encoding's native call once checked against tiktoken) is built and checked on first use, in
# the test's own thread, rather than on a daemon thread racing the tests: which engine a test exercises is then
# decided by the test (tests/vocabularies.py `native_engine`). tests/test_accel.py covers the daemon-thread mode.
os.environ.setdefault("CTXLOCK_FASTOKENS", "sync")

# ------------------------------------------------------------------------------------------- hooks


def pytest_sessionstart(session: pytest.Session) -> None:
    try:
        fetched.ensure_all()
    except fetched.ArtifactError as exc:
        pytest.exit(
            f"cannot fetch the pinned test artifacts into {fetched.cache_dir()}:\n{exc}\n"
            f"(run `python scripts/fetch_artifacts.py` to retry; set ${fetched.CACHE_ENV} to use another cache)",
            returncode=1,
        )


# The fast tier (`make check`: the files listed in tests/fast_tier.txt): unit tests of the stages and features that
# run in about three minutes on 2 cores. Every other file is marked `slow`; `make test` runs both tiers. A new test
# file is slow until it is listed there, so the inner loop never grows by accident.
FAST_TIER = frozenset((Path(__file__).parent / "fast_tier.txt").read_text("utf-8").split())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = pytest.mark.slow
    for item in items:
        if item.path.name not in FAST_TIER:
            item.add_marker(slow)


def pytest_report_header(config: pytest.Config) -> str:
    return f"ctxlock test artifacts: {fetched.cache_dir()}"


@pytest.fixture(autouse=True)
def _fast_path_marker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests marked `fast_path` are about the fast paths themselves: they run with them on even when the suite runs
    with CTXLOCK_FAST=0 (`make test` reruns parts of it so, and the whole suite passes so). The switch is read from
    the environment at each use, here and in the processes the tests start; a test may still set it to 0 itself."""
    if request.node.get_closest_marker("fast_path") is not None:
        monkeypatch.setenv("CTXLOCK_FAST", "1")


# ---------------------------------------------------------------------------------- artifact fixtures


@pytest.fixture(scope="session")
def llama_models_dir() -> Path:
    """``<cache>/llama-cpp-python-0.3.36/models``: ggml-vocab-*.gguf, *.gguf.inp/.out, templates/."""
    return fetched.llama_models_dir()


@pytest.fixture(scope="session")
def template_paths() -> list[Path]:
    """llama.cpp's real chat templates, ``templates/*.jinja``, sorted."""
    return fetched.template_paths()
