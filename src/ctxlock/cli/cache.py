"""`ctxlock cache`: where ctxlock's on-disk cache is, what each part holds and weighs, and `--clear` to start from
nothing (the next process builds what it needs again: a few seconds for a 150k vocabulary)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlock.cli.output import guarded, print_json
from ctxlock.errors import InputError
from ctxlock.settings import CACHE_KINDS, cache_root


def _size(path: Path) -> tuple[int, int]:
    """(files, bytes) under `path`, symbolic links not followed (a link counts as a file of its own size)."""
    files = size = 0
    for top, _, names in os.walk(path):
        for name in names:
            try:
                size += os.lstat(os.path.join(top, name)).st_size
                files += 1
            except OSError:  # removed meanwhile by another process
                continue
    return files, size


def _clear(path: Path) -> None:
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink()  # a link or a file standing at a kind's name: the link goes, never its target
        else:
            shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise InputError(
            f"cannot remove: {exc.strerror or type(exc).__name__}", path=str(path), hint="check its permissions"
        ) from None


def cache(
    clear: Annotated[
        bool, typer.Option("--clear", help="Remove every part listed (only these, never other files under the root).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the table.")] = False,
) -> None:
    """Show ctxlock's on-disk cache ($CTXLOCK_CACHE_DIR, else $XDG_CACHE_HOME/ctxlock, else ~/.cache/ctxlock): each
    part, what it holds, its files and bytes. Everything there is built again when missing; --clear removes it."""

    def go() -> dict[str, Any]:
        root = cache_root()
        parts = []
        for name, what in CACHE_KINDS.items():
            path = root / name
            files, size = _size(path) if path.is_dir() and not path.is_symlink() else (0, 0)
            if clear and (path.exists() or path.is_symlink()):
                _clear(path)
            parts.append({"name": name, "path": str(path), "files": files, "bytes": size, "holds": what})
        return {"root": str(root), "parts": parts, "cleared": clear}

    report = guarded(as_json, go)
    if as_json:
        print_json(report)
        return
    parts = report["parts"]
    files, size = sum(p["files"] for p in parts), sum(p["bytes"] for p in parts)
    print(f"{'removed from' if clear else 'cache'} {report['root']}: {files:,} files, {size:,} bytes")
    for p in parts:
        print(f"  {p['name']:<20} {p['files']:>7,} files {p['bytes']:>14,} bytes  {p['holds']}")


def register(app: typer.Typer) -> None:
    app.command("cache")(cache)
