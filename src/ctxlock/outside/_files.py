"""Bounded reading of input files and streams: the I/O edge every command-line input and model file goes through.

One rule for every input: a regular file (or stdin, given as `-`), read at most up to a size cap. A directory,
a device (`/dev/zero` would be read until memory runs out) or a FIFO (opening one blocks until a writer appears)
is refused before any byte is read, and a file over the cap is refused after reading one byte past it, so a
read never holds more than the cap in memory. Every refusal is a typed error naming the input, never an
OSError or UnicodeDecodeError.

The file is opened once and checked with fstat on the opened descriptor: a path swapped for a FIFO or a device
between a stat and the open is still refused. The open itself is non-blocking, so even a FIFO that appears in
that window cannot block it.

Caps, in bytes, read from the environment at every call:
- `CTXLOCK_MAX_INPUT_BYTES` (default 64 MiB): requests, templates, policies, schemas, sampler configs, --file
  text, record imports, and each line of a --jsonl stream.
- `CTXLOCK_MAX_ARTIFACT_BYTES` (default 1 GiB): a model's JSON and template files (a large tokenizer.json is
  tens of MB). GGUF and other tokenizer files are read by their own loaders, once checked to be regular files.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ctxlock.errors import CtxlockError, InputError

MAX_INPUT_ENV = "CTXLOCK_MAX_INPUT_BYTES"
MAX_ARTIFACT_ENV = "CTXLOCK_MAX_ARTIFACT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_ARTIFACT_BYTES = 1024 * 1024 * 1024
STDIN = "-"

ErrorClass = type[CtxlockError]


def _cap(env: str, default: int) -> int:
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise InputError(
            f"{raw!r} is not a size in bytes", path=env, hint=f"set a non-negative integer, or unset it for {default}"
        )
    return value


def max_input_bytes() -> int:
    """The cap on one command-line input or --jsonl line: $CTXLOCK_MAX_INPUT_BYTES, default 64 MiB."""
    return _cap(MAX_INPUT_ENV, DEFAULT_MAX_INPUT_BYTES)


def max_artifact_bytes() -> int:
    """The cap on one model JSON or template file: $CTXLOCK_MAX_ARTIFACT_BYTES, default 1 GiB."""
    return _cap(MAX_ARTIFACT_ENV, DEFAULT_MAX_ARTIFACT_BYTES)


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _too_large(label: str, limit: int, size: int | None, env: str | None, error: ErrorClass) -> CtxlockError:
    got = f"{size:,} bytes" if size is not None else "more than that"
    hint = f"set {env} higher if this input is meant to be this large" if env else "pass a smaller input"
    return error(f"over the {limit:,}-byte input limit ({got})", path=label, hint=hint)


def _not_regular(label: str, kind: str, error: ErrorClass, *, stdin_ok: bool) -> CtxlockError:
    hint = "pass a regular file" + (", or - to read stdin" if stdin_ok else "")
    return error(f"is {kind}, not a regular file", path=label, hint=hint)


def _os_error(exc: OSError, label: str, error: ErrorClass, missing: ErrorClass) -> CtxlockError:
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return missing("no such file", path=label, hint="check the path")
    if isinstance(exc, NotADirectoryError):
        return missing(f"no such file ({reason.lower()} in the path)", path=label, hint="check the path")
    return error(f"cannot read: {reason}", path=label, hint="check that the file is readable")


def open_regular(
    path: str | os.PathLike[str],
    *,
    label: str | None = None,
    error: ErrorClass = InputError,
    missing: ErrorClass | None = None,
    stdin_ok: bool = False,
) -> BinaryIO:
    """Open a regular file for reading, refusing anything else without blocking; the caller closes it.

    `error` is the class raised for a refusal, `missing` (default `error`) for a path that does not exist."""
    where = label if label is not None else str(path)
    missing = missing or error
    try:
        # A stat first, so that a device is never opened at all (opening some has side effects).
        kind = _kind(os.stat(path).st_mode)
        if kind is not None:
            raise _not_regular(where, kind, error, stdin_ok=stdin_ok)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _os_error(exc, where, error, missing) from None
    except ValueError:  # an embedded NUL byte, or a character the file system encoding cannot hold
        raise error("is not a usable file name", path=where, hint="check the path") from None
    try:
        kind = _kind(os.fstat(fd).st_mode)  # the descriptor's own file: the path may have changed since the stat
        if kind is not None:
            raise _not_regular(where, kind, error, stdin_ok=stdin_ok)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def stdin_stream() -> BinaryIO:
    """The binary stdin; a typed error when there is none (started with stdin closed, `<&-`)."""
    stream: BinaryIO | None = getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise InputError("there is no stdin to read", path="stdin", hint="pipe the input in, or pass a file")
    return stream


def _read_capped(fh: BinaryIO, label: str, limit: int, env: str | None, error: ErrorClass) -> bytes:
    try:
        data = fh.read(limit + 1)
    except OSError as exc:
        raise _os_error(exc, label, error, error) from None
    if len(data) > limit:
        raise _too_large(label, limit, None, env, error)
    return data


def read_input(
    source: str | os.PathLike[str],
    *,
    label: str | None = None,
    limit: int | None = None,
    env: str | None = MAX_INPUT_ENV,
    error: ErrorClass = InputError,
    missing: ErrorClass | None = None,
) -> bytes:
    """The bytes of a regular file, or of stdin for `-`, at most `limit` (default `max_input_bytes()`).

    `label` is the `path` its errors carry (default: the file name); CLI callers name the option, `--file x`.
    `env` is the variable an over-the-cap error tells the user to raise (None: the cap is fixed)."""
    where = label if label is not None else str(source)
    cap = max_input_bytes() if limit is None else limit
    if str(source) == STDIN:
        return _read_capped(stdin_stream(), where, cap, env, error)
    with open_regular(source, label=where, error=error, missing=missing, stdin_ok=True) as fh:
        try:
            size = os.fstat(fh.fileno()).st_size
        except OSError as exc:
            raise _os_error(exc, where, error, error) from None
        if size > cap:  # known before reading; /proc files say 0 and are capped by the read below
            raise _too_large(where, cap, size, env, error)
        return _read_capped(fh, where, cap, env, error)


def check_input_file(
    path: str | os.PathLike[str], *, label: str | None = None, missing: ErrorClass | None = None
) -> None:
    """Check, without reading it, that `path` is a readable regular file within `max_input_bytes()`: for a file a
    later loader reads itself (a record file given by path). `missing` is the class for a path that is not there."""
    where = label if label is not None else str(path)
    cap = max_input_bytes()
    with open_regular(path, label=where, missing=missing, stdin_ok=False) as fh:
        size = os.fstat(fh.fileno()).st_size
        try:
            fh.read(1)  # a regular file can still fail to read (EIO): find out here, not in the loader
        except OSError as exc:
            raise _os_error(exc, where, InputError, InputError) from None
    if size > cap:
        raise _too_large(where, cap, size, MAX_INPUT_ENV, InputError)


def read_artifact(path: Path, *, missing: ErrorClass, error: ErrorClass) -> bytes:
    """A model file's bytes: a regular file at most `max_artifact_bytes()`, with the artifact's error classes."""
    return read_input(
        path, label=str(path), limit=max_artifact_bytes(), env=MAX_ARTIFACT_ENV, error=error, missing=missing
    )


def decode_utf8(data: bytes, *, label: str, error: ErrorClass = InputError) -> str:
    """UTF-8 text, or a typed error naming the first bad byte's offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"not UTF-8 ({exc.reason} at byte {exc.start})", path=label, hint="save the file as UTF-8"
        ) from None


def read_text_input(source: str | os.PathLike[str], *, label: str | None = None) -> str:
    """`read_input` decoded as UTF-8 (an input error at the first bad byte)."""
    where = label if label is not None else str(source)
    return decode_utf8(read_input(source, label=where), label=where)


class CappedStream:
    """A binary stream (stdin) that refuses to yield more than `limit` bytes in all, as a typed error.

    It iterates by lines like a file, each line read with `readline(n)`, so a stream without newlines
    (`/dev/zero`) is cut at the cap instead of being buffered whole."""

    def __init__(self, stream: BinaryIO, *, label: str, limit: int | None = None) -> None:
        self._stream = stream
        self._label = label
        self._limit = max_input_bytes() if limit is None else limit
        self._left = self._limit

    def _take(self, data: bytes) -> bytes:
        self._left -= len(data)
        if self._left < 0:
            raise _too_large(self._label, self._limit, None, MAX_INPUT_ENV, InputError)
        return data

    def read(self, size: int = -1) -> bytes:
        want = self._left + 1 if size is None or size < 0 else min(size, self._left + 1)
        try:
            return self._take(self._stream.read(want))
        except OSError as exc:
            raise _os_error(exc, self._label, InputError, InputError) from None

    def readline(self, size: int = -1) -> bytes:
        want = self._left + 1 if size is None or size < 0 else min(size, self._left + 1)
        try:
            return self._take(self._stream.readline(want))
        except OSError as exc:
            raise _os_error(exc, self._label, InputError, InputError) from None

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line


def iter_lines(stream: BinaryIO, *, label: str, limit: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number, line) from a stream, each line at most `limit` bytes (default `max_input_bytes()`).

    For --jsonl streams that run as long as the client sends: the whole stream is not capped, one line is, so
    memory stays bounded while a line without an end (`/dev/zero`) is refused at the cap."""
    cap = max_input_bytes() if limit is None else limit
    number = 0
    while True:
        number += 1
        try:
            line = stream.readline(cap + 1)
        except OSError as exc:
            raise _os_error(exc, f"{label} line {number}", InputError, InputError) from None
        if not line:
            return
        if len(line) > cap and not (len(line) == cap + 1 and line.endswith(b"\n")):
            raise _too_large(f"{label} line {number}", cap, None, MAX_INPUT_ENV, InputError)
        yield number, line


@contextmanager
def opened_input(source: str | os.PathLike[str], *, label: str | None = None) -> Iterator[BinaryIO]:
    """A stream over a regular file at most `max_input_bytes()` long, or over stdin for `-` capped as it is read.

    For readers that take a file object (record import); the whole input is capped, not each line."""
    where = label if label is not None else str(source)
    if str(source) == STDIN:
        yield CappedStream(stdin_stream(), label=where)  # type: ignore[misc]
        return
    cap = max_input_bytes()
    with open_regular(source, label=where, stdin_ok=True) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > cap:
            raise _too_large(where, cap, size, MAX_INPUT_ENV, InputError)
        yield CappedStream(fh, label=where)  # type: ignore[misc]
