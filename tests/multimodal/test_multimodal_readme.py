"""The README's "Images (multimodal input)" examples run as shown.

The Python example (the span map) is taken from README.md as it is, run in a directory holding a `qwen2-vl` model
directory (tests/mm_fixtures.py: the qwen2 vocabulary with Qwen's vision tokens, the Qwen2-VL template, the hub's
preprocessor_config.json) and a 1024×768 JPEG `photo.jpg`, and its output must be the README's output block, line
for line. The console session runs each `$ ctxlock ...` command shown, with a 640×480 PNG `chart.png` beside the
photo (the README's images are these fixtures: `noise(1024, 768, seed=7)` as JPEG, `noise(640, 480, seed=8)` as PNG),
and must print the README's lines, digests included, the model directory's path aside.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import mm_fixtures as F

README = Path(__file__).resolve().parents[2] / "docs" / "multimodal.md"
SRC = Path(__file__).resolve().parents[2] / "src"


def _section() -> str:
    text = README.read_text("utf-8")
    start = text.index("\n## Images (multimodal input)\n")
    return text[start : text.index("\n## ", start + 5)]


def _blocks(section: str) -> list[tuple[str, str]]:
    """The fenced blocks, in order: (language, text)."""
    out, lang, lines = [], None, []
    for line in section.splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, lines = line[3:].strip(), []
            else:
                out.append((lang, "".join(f"{x}\n" for x in lines)))
                lang = None
        elif lang is not None:
            lines.append(line)
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("readme")
    F.build_qwen2vl_dir(out / "qwen2-vl", F.HUB_PREPROCESSOR)
    (out / "photo.jpg").write_bytes(F.encode(F.noise(1024, 768, seed=7), "JPEG"))
    (out / "chart.png").write_bytes(F.png(F.noise(640, 480, seed=8)))
    return out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), "NO_COLOR": "1", "COLUMNS": "80"}


def test_span_map_example_prints_what_the_readme_shows(workdir: Path) -> None:
    blocks = _blocks(_section())
    k = next(k for k, (lang, text) in enumerate(blocks) if lang == "python" and "print(mm.span_map())" in text)
    code, (_, shown) = blocks[k][1], blocks[k + 1]  # the output block right after it
    assert shown.startswith("{0: (15, 1014)}")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=workdir, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == shown


def _normal(text: str) -> list[str]:
    text = re.sub(r"\(\S*/qwen2-vl/", "(<dir>/qwen2-vl/", text)
    return [line.rstrip() for line in text.strip().splitlines()]


def test_console_session_prints_what_the_readme_shows(workdir: Path) -> None:
    (session,) = [t for lang, t in _blocks(_section()) if lang == "console" and "ctxlock render request.json" in t]
    commands: list[tuple[str, list[str]]] = []
    for line in session.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif commands and commands[-1][0].endswith("\\"):
            commands[-1] = (commands[-1][0][:-1] + line.strip(), [])
        elif commands:
            commands[-1][1].append(line)
    heads = [c.split()[:2] for c, _ in commands]
    assert heads == [["cat", "request.json"], ["ctxlock", "render"], ["ctxlock", "count"], ["ctxlock", "render"]]
    (workdir / "request.json").write_text("\n".join(commands[0][1]) + "\n", encoding="utf-8")
    for command, expected in commands[1:]:
        argv = [sys.executable, "-m", "ctxlock", *shlex.split(command)[1:]]
        done = subprocess.run(argv, cwd=workdir, env=_env(), capture_output=True, text=True, timeout=300)
        got = done.stdout + done.stderr
        shown = "\n".join(expected)
        if "…]" in shown and "1419 tokens" in shown:
            # the README shortens the id list ("The id list is shortened here"): compare its first ids
            (ids,) = [line for line in expected if line.startswith("[151644")]
            (full,) = [line for line in got.splitlines() if line.startswith("[151644")]
            assert full.startswith(ids[: -len(", …]")])
            got = got.replace(full, ids)
        assert _normal(got) == _normal(shown), command
