"""`ctxlock cache` shows ctxlock's on-disk cache by part and `--clear` removes those parts and nothing else: a file of
the user's under the same root stays, and a symbolic link standing at a part's name is removed, never followed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import ctxlock
from cli_runner import run_main
from ctxlock.settings import CACHE_KINDS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "seed-sky-injection.json"


def test_cache_lists_its_parts_and_clear_removes_only_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(root))
    ctxlock.clear_caches()  # the template compiled again (not taken from this process's memory): jinja/ gets its code
    code, _, err = run_main(["render", "-m", "book", str(EXAMPLE), "--json"])
    assert code == 0, err
    (root / "mine.txt").write_text("the user's", "utf-8")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep").write_text("x", "utf-8")
    os.symlink(outside, root / "fastokens")  # a link at a part's name

    code, out, err = run_main(["cache", "--json"])
    assert code == 0, err
    report = json.loads(out)
    parts = {p["name"]: p for p in report["parts"]}
    assert report["root"] == str(root) and list(parts) == list(CACHE_KINDS) and report["cleared"] is False
    assert parts["jinja"]["files"] >= 1 and parts["jinja"]["bytes"] > 0
    assert parts["fastokens"]["files"] == 0  # a link is not followed
    assert all(p["holds"] for p in parts.values())

    code, out, err = run_main(["cache", "--clear"])
    assert code == 0, err
    assert out.splitlines()[0].startswith(f"removed from {root}: ")
    assert sorted(os.listdir(root)) == ["mine.txt"]
    assert (outside / "keep").read_text("utf-8") == "x"
    code, out, _ = run_main(["cache", "--json"])
    assert sum(p["files"] for p in json.loads(out)["parts"]) == 0
