"""Shared pytest setup for ctxlock's tests.

Real artifacts (tests/fetched.py) are fetched before collection, so test modules may parametrize over them
at import time (``fetched.template_paths()``, ``fetched.vector_vocabs()``). If they cannot be fetched or
verified, the run stops with exit status 1 and the reason: nothing is skipped.

Test helpers are plain modules next to this file, imported by their top-level names:
``import fetched`` (the pinned real artifacts, their cache) and ``import reference`` (the transformers oracle).
This file must not import ctxlock.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:  # pytest's default "prepend" import mode does this already; other modes do not
    sys.path.insert(0, _TESTS_DIR)

from hypothesis import settings  # noqa: E402

import fetched  # noqa: E402
import hypothesis_profiles  # noqa: E402

# Hypothesis profiles: `ci` (the default; `make test`) and `dev` (`make check`). A test's own count is its weight
# through `hypothesis_profiles.examples(N)`; the profile scales it (tests/hypothesis_profiles.py).
settings.register_profile("ci", print_blob=True)
settings.register_profile("dev", max_examples=10, print_blob=True)
settings.load_profile(hypothesis_profiles.profile())

# fastokens (whole-text encoding's native call once checked against tiktoken) is built and checked on first use, in
# the test's own thread, rather than on a daemon thread racing the tests: which engine a test exercises is then
# decided by the test (tests/vocabularies.py `native_engine`). tests/tokenizer/test_accel.py covers the daemon-thread
# mode.
os.environ.setdefault("CTXLOCK_FASTOKENS", "sync")

# ------------------------------------------------------------------------------------------- hooks


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[object]:
    """Collection writes bytecode even where PYTHONDONTWRITEBYTECODE is set (as on this project's machines): pytest
    keeps each test module's assertion-rewritten code in `__pycache__` (git ignores it) only when writing is on, and
    reads it back in every later process. Without it every test process (`-n 2` makes two, each collecting every
    module) rewrote and compiled all of them again: 21 to 29 s of CPU to collect the suite, against 11.5 to 15 s with
    the cached code (`pytest --collect-only`, user time, three pairs of runs on 2 shared cores). Only collection is
    affected: the tests themselves run with the environment's setting, and so do the processes they start."""
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = saved


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
    tests = Path(__file__).parent
    for item in items:
        if not item.path.is_relative_to(tests) or item.path.relative_to(tests).as_posix() not in FAST_TIER:
            item.add_marker(slow)
    items[:] = run_by_parameter(items)


def run_by_parameter(items: list[pytest.Item]) -> list[pytest.Item]:
    """A module that sets `RUN_BY = "<parameter>"` runs its tests grouped by that parameter's value (stable
    otherwise), so a resource loaded per value (a vocabulary) is loaded once and let go before the next; the other
    modules keep their order, and every module stays in its place."""
    out: list[pytest.Item] = []
    for _, group in itertools.groupby(items, key=lambda item: item.path):
        run = list(group)
        module = getattr(run[0], "module", None)
        name = getattr(module, "RUN_BY", None)
        if isinstance(name, str):

            def value(item: pytest.Item, name: str = name) -> tuple[bool, str]:
                params = getattr(getattr(item, "callspec", None), "params", {})
                return (name in params, str(params.get(name, "")))

            run.sort(key=value)
        out.extend(run)
    return out


def pytest_report_header(config: pytest.Config) -> str:
    return f"ctxlock test artifacts: {fetched.cache_dir()}; hypothesis profile: {hypothesis_profiles.profile()}"


@pytest.fixture(autouse=True)
def _fast_path_marker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests marked `fast_path` are about the fast paths themselves: they run with them on even when the suite runs
    with CTXLOCK_FAST=0 (`make test` reruns parts of it so, and the whole suite passes so). The switch is read from
    the environment at each use, here and in the processes the tests start; a test may still set it to 0 itself."""
    if request.node.get_closest_marker("fast_path") is not None:
        monkeypatch.setenv("CTXLOCK_FAST", "1")


# ---------------------------------------------------------------------------------- memory between modules

# A module may load vocabularies, reference tokenizers and images that later modules do not need. After a module,
# its own functools caches are emptied (a module runs whole on one process, so it is done with them); and when this
# process holds more than MEMORY_SOFT_LIMIT_MIB, everything shared is let go too: ctxlock's caches
# (`ctxlock.clear_caches()`), the functools caches of the test helpers, then the heap is handed back to the system
# (glibc `malloc_trim`). Results never depend on caches; a later module that needs a value loads it again. This keeps
# a whole run's peak bounded (docs/contributing.md has the figures).
MEMORY_SOFT_LIMIT_MIB = int(os.environ.get("CTXLOCK_TEST_MEMORY_MIB", "1536"))
# CTXLOCK_TEST_MEMORY_LOG=FILE appends, per module: worker pid, module, RSS (MiB) before, after, after the release.
_MEMORY_LOG = os.environ.get("CTXLOCK_TEST_MEMORY_LOG", "")
_HELPERS = ("fetched", "reference", "vocabularies", "hf_dirs", "mm_images", "mm_fixtures", "conformance", "tagged")
try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6")
except OSError:  # not glibc
    _LIBC = None


def rss_mib() -> int:
    """This process's resident set size, in MiB (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
    except OSError:
        return 0


def release_memory(*modules: object) -> None:
    """Empty ctxlock's caches and every functools cache found on MODULES and the test helpers, then trim the heap."""
    lib = sys.modules.get("ctxlock")
    if lib is not None:
        lib.clear_caches()
    clear_function_caches(*modules, *(sys.modules.get(name) for name in _HELPERS))
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the test modules loaded to compute their parameters is let go before the first test: otherwise every
    process of the run would hold it (each one collects every module) until a module happens to release it."""
    release_memory()


def clear_function_caches(*modules: object) -> None:
    """Empty every functools cache defined at the top level of MODULES."""
    for module in modules:
        for value in list(getattr(module, "__dict__", {}).values()):
            if isinstance(value, type):
                continue
            clear = getattr(value, "cache_clear", None)
            if callable(clear) and hasattr(value, "cache_info"):
                clear()


@pytest.fixture(autouse=True, scope="module")
def _bounded_memory(request: pytest.FixtureRequest) -> Iterator[None]:
    before = rss_mib()
    yield
    after = rss_mib()
    module = getattr(request, "module", None)  # None for a page of docs examples
    if module is not None:  # a module runs whole on one process (--dist loadfile): its own caches are done with
        clear_function_caches(module)
    if after > MEMORY_SOFT_LIMIT_MIB:
        release_memory()
    released = rss_mib()
    if _MEMORY_LOG:
        with open(_MEMORY_LOG, "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()} {request.node.nodeid} {before} {after} {released}\n")


# ---------------------------------------------------------------------------------- artifact fixtures


@pytest.fixture(scope="session")
def llama_models_dir() -> Path:
    """``<cache>/llama-cpp-python-0.3.36/models``: ggml-vocab-*.gguf, *.gguf.inp/.out, templates/."""
    return fetched.llama_models_dir()


@pytest.fixture(scope="session")
def template_paths() -> list[Path]:
    """llama.cpp's real chat templates, ``templates/*.jinja``, sorted."""
    return fetched.template_paths()
