"""The cache discipline of tests/llama_server.py's build, on a stand-in source tree (a CMake project that "builds"
llama-server by copying a shell script, in well under a second) instead of llama.cpp's minutes: a build lands whole
with its marker, a damaged or partial cache is built again, and a failed build raises ArtifactError naming the log
and showing its tail, leaving nothing that looks done."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

import fetched
import llama_server

FAKE_SERVER = "#!/bin/sh\necho 'version: 0 (stand-in)'\n"
BUILDS = """cmake_minimum_required(VERSION 3.16)
project(stand_in NONE)
add_custom_target(llama-server ALL
    COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_SOURCE_DIR}/fake.sh ${CMAKE_BINARY_DIR}/bin/llama-server)
"""
FAILS = 'cmake_minimum_required(VERSION 3.16)\nmessage(FATAL_ERROR "stand-in configure failure")\n'


def _sdist(path: Path, cmakelists: str) -> Path:
    """A stand-in llama-cpp-python sdist: vendor/llama.cpp/{CMakeLists.txt, fake.sh} and a model it must skip."""
    top = "llama_cpp_python-0.3.36/"
    files = {
        f"{top}vendor/llama.cpp/CMakeLists.txt": (cmakelists.encode(), 0o644),
        f"{top}vendor/llama.cpp/fake.sh": (FAKE_SERVER.encode(), 0o755),
        f"{top}vendor/llama.cpp/models/ggml-vocab-x.gguf": (b"GGUF", 0o644),
        f"{top}llama_cpp/__init__.py": (b"", 0o644),
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(fetched.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(llama_server, "_CHECKED", set())
    archive = _sdist(tmp_path / "builds.tar.gz", BUILDS)
    monkeypatch.setattr(fetched, "archive_path", lambda artifact: archive)
    return tmp_path


def test_a_build_lands_whole_and_a_damaged_cache_is_built_again(stand_in: Path) -> None:
    binary = llama_server.llama_server_binary()
    final = llama_server.build_dir()
    assert binary == final / "bin" / "llama-server"
    assert binary.read_text() == FAKE_SERVER
    marker = json.loads((final / fetched.MARKER).read_text())
    assert marker["binary_sha256"] == fetched.sha256_file(binary)
    assert marker["cmake_flags"] == list(llama_server.CMAKE_FLAGS)
    assert marker["version"] == "version: 0 (stand-in)"
    left = sorted(p.name for p in final.parent.iterdir() if p.name != ".locks")
    assert left == [final.name, f"{final.name}.build.log"]

    killed = final.parent / f".tmp-{final.name}-killed"  # what a build killed halfway leaves
    for damage in (
        lambda: binary.write_text(FAKE_SERVER + "#"),  # same path, other bytes
        lambda: (final / fetched.MARKER).unlink(),
        lambda: binary.unlink(),
    ):
        damage()
        (killed / "build").mkdir(parents=True)
        llama_server._CHECKED.clear()
        assert llama_server.llama_server_binary().read_text() == FAKE_SERVER
        assert (final / fetched.MARKER).is_file()
        assert not killed.exists()


def test_only_the_vendored_sources_are_extracted(stand_in: Path) -> None:
    src = stand_in / "src"
    llama_server._extract_llama_cpp(fetched.archive_path(fetched.LLAMA_CPP_PYTHON), src)
    assert sorted(p.name for p in src.rglob("*")) == ["CMakeLists.txt", "fake.sh"]  # no models/, no llama_cpp/
    assert (src / "fake.sh").stat().st_mode & 0o100


def test_a_failed_build_raises_with_the_log_and_leaves_nothing_that_looks_done(
    stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = _sdist(stand_in / "fails.tar.gz", FAILS)
    monkeypatch.setattr(fetched, "archive_path", lambda artifact: archive)
    with pytest.raises(fetched.ArtifactError) as caught:
        llama_server.llama_server_binary()
    final = llama_server.build_dir()
    log = final.parent / f"{final.name}.build.log"
    assert str(log) in str(caught.value)
    assert "stand-in configure failure" in str(caught.value)  # the tail of the log
    assert "stand-in configure failure" in log.read_text()
    assert not final.exists()
    assert not list(final.parent.glob(".tmp-*"))
