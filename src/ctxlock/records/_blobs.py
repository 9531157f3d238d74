"""The content-addressed artifact store: immutable blobs (templates, tokenizer files) named by their sha256.

    <root>/<aa>/<sha256>     a blob, read-only once installed
    <root>/.tmp/             where blobs are written before the atomic rename into place

A blob is written to a temporary file on the same filesystem, fsynced, and renamed into place, so a reader only ever
sees a complete blob. `get_path` hashes a blob on its first use in a process (the verified ones are remembered in
the cache registry as `store.verified_blobs`). `ArtifactStaging` holds blobs read from an untrusted stream (a
bundle) until every one of them has checked out.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from ctxlock import caches
from ctxlock.errors import ArtifactError, ArtifactFormatError, ArtifactNotFoundError, CtxlockError

_CHUNK = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")

# Blobs whose content hash was checked by this process, keyed by (path, inode, size, mtime_ns): a blob is hashed
# once per process, and again only if the file was replaced or rewritten since.
_VERIFIED_BLOBS: set[tuple[str, int, int, int]] = set()
caches.register(
    "store.verified_blobs", size=lambda: len(_VERIFIED_BLOBS), clear=_VERIFIED_BLOBS.clear, scope="artifact"
)

# A temporary blob file untouched for this long was left by a killed writer (an active copy rewrites it constantly).
_STALE_TMP_S = 3600.0


class BlobStore:
    """The blobs under `root` (a store's `artifacts/` directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._swept_tmp = False

    def put(self, data: bytes) -> str:
        """Store a blob once under its sha256; returns the digest. A stored blob of the wrong size is replaced."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ArtifactFormatError(f"artifact data must be bytes, got {type(data).__name__}", path="data")
        data = bytes(data)
        sha256 = hashlib.sha256(data).hexdigest()
        if self.size(sha256) == len(data):
            return sha256
        with self.tmp() as (tmp, fh):
            fh.write(data)
            self.install(tmp, fh, sha256)
        return sha256

    def put_file(self, path: Path | str) -> str:
        """Store a file (GGUF files run to GBs) by hashing it while copying to a temporary file; returns the digest."""
        src = Path(path)
        try:
            src_fh = src.open("rb")
        except FileNotFoundError as exc:
            raise ArtifactNotFoundError("artifact file not found", path=str(src)) from exc
        except IsADirectoryError as exc:
            raise ArtifactFormatError("artifact path is a directory, not a file", path=str(src)) from exc
        except OSError as exc:
            raise ArtifactError(f"cannot read artifact file: {exc.strerror}", path=str(src)) from exc
        with src_fh, self.tmp() as (tmp, fh):
            digest = hashlib.sha256()
            buf = bytearray(_CHUNK)
            view = memoryview(buf)
            size = 0
            while True:
                try:
                    n = src_fh.readinto(buf)
                except OSError as exc:
                    raise ArtifactError(f"cannot read artifact file: {exc.strerror}", path=str(src)) from exc
                if not n:
                    break
                digest.update(view[:n])
                fh.write(view[:n])
                size += n
            sha256 = digest.hexdigest()
            if self.size(sha256) != size:
                self.install(tmp, fh, sha256)
        return sha256

    def get_path(self, sha256: str) -> Path:
        """The path of a stored blob; its content is hashed on first use in this process to catch corruption."""
        sha256 = check_sha256(sha256)
        blob = self.path(sha256)
        try:
            st = blob.stat()
        except FileNotFoundError as exc:
            raise ArtifactNotFoundError(
                f"artifact {sha256} is not in the store",
                path=str(blob),
                hint="on the machine that made the record, run `ctxlock records export --bundle RECORD_ID -o FILE`; "
                "then `ctxlock records import FILE` here",
            ) from exc
        key = (str(blob), st.st_ino, st.st_size, st.st_mtime_ns)
        if key in _VERIFIED_BLOBS:
            return blob
        actual = _file_sha256(blob)
        if actual != sha256:
            raise ArtifactFormatError(
                f"artifact blob is corrupt: its content hashes to {actual}",
                path=str(blob),
                hint="delete the blob and store the artifact again",
            )
        _VERIFIED_BLOBS.add(key)
        return blob

    def has(self, sha256: str) -> bool:
        return self.path(check_sha256(sha256)).is_file()

    @contextmanager
    def staging(self) -> Iterator[ArtifactStaging]:
        """Blobs copied in from a stream are held in temporary files and installed together when the block ends
        without an error; on an error none is installed and every temporary file is removed."""
        staged = ArtifactStaging(self)
        try:
            yield staged
            staged.install()
        finally:
            staged.discard()

    def path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256

    def size(self, sha256: str) -> int | None:
        try:
            return self.path(sha256).stat().st_size
        except FileNotFoundError:
            return None

    @contextmanager
    def tmp(self) -> Iterator[tuple[Path, BinaryIO]]:
        """A temporary file on the store's filesystem (so the final rename is atomic), removed unless installed."""
        tmp_dir = self.root / ".tmp"
        try:
            tmp_dir.mkdir(parents=True, exist_ok=True)
            if not self._swept_tmp:
                _remove_stale_files(tmp_dir)
                self._swept_tmp = True
            fd, name = tempfile.mkstemp(prefix="blob-", dir=tmp_dir)
        except OSError as exc:
            raise CtxlockError(f"cannot write to the artifact store: {exc.strerror}", path=str(tmp_dir)) from exc
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as fh:
                yield tmp, fh
        except OSError as exc:
            raise CtxlockError(f"cannot write to the artifact store: {exc.strerror}", path=str(tmp)) from exc
        finally:
            with suppress(FileNotFoundError):
                tmp.unlink()

    def install(self, tmp: Path, fh: BinaryIO, sha256: str) -> None:
        """fsync the temporary file, then rename it over `artifacts/<aa>/<sha256>`. Concurrent writers of the same
        blob each rename identical bytes into place, so readers only ever see a complete blob."""
        fh.flush()
        os.fsync(fh.fileno())
        os.chmod(tmp, 0o444)  # blobs are immutable
        blob = self.path(sha256)
        blob.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, blob)
        _fsync_dir(blob.parent)


class ArtifactStaging:
    """Blobs read from an untrusted stream (a bundle), checked before any of them enters the store
    (`Store.staging`).

    `add` copies exactly `size` bytes into a temporary file while hashing them; a blob is kept for installation
    only when its bytes hash to the digest it was declared under."""

    def __init__(self, blobs: BlobStore) -> None:
        self._blobs = blobs
        self._files: list[tuple[Path, BinaryIO]] = []
        self._staged: dict[str, tuple[Path, BinaryIO]] = {}

    def add(self, source: BinaryIO, size: int, sha256: str) -> tuple[str, int]:
        """Copy `size` bytes of `source`; returns (their sha256, how many were read: fewer means truncated)."""
        expected = check_sha256(sha256)
        tmp_dir = self._blobs.root / ".tmp"
        try:
            tmp_dir.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix="bundle-", dir=tmp_dir)
        except OSError as exc:
            raise CtxlockError(f"cannot write to the artifact store: {exc.strerror}", path=str(tmp_dir)) from exc
        fh = os.fdopen(fd, "wb")
        entry = (Path(name), fh)
        self._files.append(entry)
        digest = hashlib.sha256()
        left = size
        while left > 0:
            chunk = source.read(min(_CHUNK, left))  # a read error is the source's own, raised as it is
            if not chunk:
                break
            digest.update(chunk)
            try:
                fh.write(chunk)
            except OSError as exc:
                raise CtxlockError(f"cannot write to the artifact store: {exc.strerror}", path=name) from exc
            left -= len(chunk)
        actual = digest.hexdigest()
        if left == 0 and actual == expected:
            self._staged.setdefault(expected, entry)
        return actual, size - left

    def install(self) -> list[str]:
        """Move every checked blob into place (atomic renames); returns their digests."""
        installed = []
        for sha256, (tmp, fh) in self._staged.items():
            self._blobs.install(tmp, fh, sha256)
            fh.close()
            # Renamed into place: its temporary name is no longer this staging's to remove.
            self._files = [entry for entry in self._files if entry[0] != tmp]
            installed.append(sha256)
        self._staged = {}
        return installed

    def discard(self) -> None:
        for tmp, fh in self._files:
            with suppress(OSError):
                fh.close()
            with suppress(FileNotFoundError):
                tmp.unlink()
        self._files, self._staged = [], {}


def _remove_stale_files(tmp_dir: Path) -> None:
    """Remove temporary blobs left behind by writers that were killed before their rename."""
    cutoff = time.time() - _STALE_TMP_S
    for entry in os.scandir(tmp_dir):
        with suppress(OSError):  # another process may be removing it too
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(entry.path)


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; not every platform can open a directory, and that is not an error.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_sha256(sha256: str) -> str:
    value = sha256.lower() if isinstance(sha256, str) else ""
    if not _SHA256.fullmatch(value):
        raise ArtifactFormatError(f"not a sha256 hex digest: {sha256!r}", path="sha256")
    return value


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
