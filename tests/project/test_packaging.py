"""The wheel `pip install` gets: every file of the package in the tree is in it (the built-in models' manifests and
templates, `py.typed`), and nothing else of the tree's. A wheel built from pyproject.toml's package data alone, so
a built-in model missing from the installed package (which an editable install would hide) fails here."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_every_file_of_the_package(tmp_path: Path) -> None:
    left = not (ROOT / "build").exists()  # setuptools builds in the tree: its build/ is removed after, if it is ours
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_NO_INPUT": "1"},
        timeout=300,
    )
    if left:
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    [wheel] = tmp_path.glob("ctxlock-*.whl")
    packaged = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("ctxlock/") and "__pycache__" not in n}
    tracked = subprocess.run(
        ["git", "ls-files", "src/ctxlock"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    tree = {p.removeprefix("src/") for p in tracked}
    assert tree - packaged == set()  # nothing of the package left out
    assert packaged - tree == set()  # nothing packaged that the tree does not hold
    assert {"ctxlock/py.typed", "ctxlock/models/book/ctxlock.json", "ctxlock/models/gpt-oss/harmony.jinja"} <= packaged
