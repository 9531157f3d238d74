"""A cache of converted tokenizers under the user cache directory, keyed by the source file's sha256.

A GGUF vocabulary is converted to a `tokenizers` pipeline once; later loads read the converted JSON and the few
facts the model needs (special-token ids, templates, flags) from here, without parsing the GGUF again. The key is
the sha256 of the source bytes plus the converter version, so a changed file is never served stale, and a
converter fix invalidates old entries. Writes are atomic (a temporary file renamed into place).

Location: `settings.cache_root()`. A bottom-layer module: it imports only `settings`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ctxlock.settings import cache_root

CONVERTER_VERSION = "1"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _entry(kind: str, sha256: str) -> Path:
    return cache_root() / "converted" / kind / f"{sha256}-v{CONVERTER_VERSION}.json"


def load(kind: str, sha256: str) -> dict[str, Any] | None:
    """The cached conversion of the source with this digest, or None. A corrupt entry counts as absent."""
    path = _entry(kind, sha256)
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("source_sha256") != sha256:
        return None
    return data


def store(kind: str, sha256: str, data: dict[str, Any]) -> None:
    """Write atomically; a cache that cannot be written is not an error (the next load converts again)."""
    path = _entry(kind, sha256)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({**data, "source_sha256": sha256}, fh, ensure_ascii=False)
        os.replace(tmp, path)
    except OSError:
        return
