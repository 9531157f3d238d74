"""The command line's file arguments, checked at the edge: every file a command reads goes through
`ctxlock.outside` (a regular file or stdin, capped at $CTXLOCK_MAX_INPUT_BYTES), so a directory, a device, a FIFO,
an unreadable or oversize file is one typed error line naming the option, never a traceback or a hang."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import stat
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ctxlock.errors import ArtifactNotFoundError, CtxlockError, InputError, RequestEncodingError, RequestJSONError
from ctxlock.outside._files import STDIN, check_input_file, decode_utf8, read_input
from ctxlock.outside._json import loads_outside
from ctxlock.request import Utf8Policy, decode_bytes

if TYPE_CHECKING:
    from ctxlock.template._render import ChatTemplate


def read_request(source: str, *, option: str = "REQUEST") -> bytes:
    """A request's bytes, undecoded: the request parser reports bad UTF-8 itself, with its utf8 policy. The
    request's label (`stdin`, `REQUEST path`) is kept for `name_request_source`; an empty request is refused here,
    naming it."""
    label = "stdin" if source == STDIN else f"{option} {source}"
    data = read_input(source, label=label)
    _REQUEST_LABEL.set(label)
    if not data.strip():
        raise RequestJSONError(
            "is empty" if not data else "holds only whitespace", path=label, hint="pass a request JSON object"
        )
    return data


# The label of the request the command read: the request parser knows lines and bytes, not where they came from.
_REQUEST_LABEL: ContextVar[str | None] = ContextVar("ctxlock_cli_request_label", default=None)


# Hints the library writes in Python's words, and the command line's words for them: a CLI user is told the
# option, never the keyword (the hint's Python spelling stays for Python callers).
_CLI_WORDS = (
    ("parse with utf8='replace'", "pass --utf8 replace"),
    ("render with injection='text'", "pass --injection text"),
    ("injection='keep'", "--injection keep"),
    ("injection='text'", "--injection text"),
)


def cli_hint(hint: str) -> str:
    """A library hint in the command line's words (`_CLI_WORDS`)."""
    for python, cli in _CLI_WORDS:
        hint = hint.replace(python, cli)
    return hint


def name_request_source(exc: CtxlockError) -> None:
    """Put the request's source in front of a JSON or UTF-8 error's position (`stdin line 1 column 5 (byte 4)`,
    `REQUEST chat.json byte 41`), in place: the parser names the position, the CLI names the input. Every hint is
    put in the command line's words (`cli_hint`): the option, not the Python keyword."""
    if exc.hint and (spoken := cli_hint(exc.hint)) != exc.hint:
        exc.hint = spoken
        exc.args = (str(exc),)
    label = _REQUEST_LABEL.get()
    if label is None or not isinstance(exc, RequestJSONError | RequestEncodingError) or exc.path is None:
        return
    # A position in the bytes (`line 2 column 1 (byte 2)`, `byte 41`) is named with its input; a JSON path
    # (`messages[0]`, a duplicate key) is a place in the request, and stays as the parser gives it.
    if exc.path.startswith(("line ", "byte ")):
        exc.path = f"{label} {exc.path}"
    exc.args = (str(exc),)


def read_text(path: Path | str, *, option: str) -> str:
    label = f"{option} {path}"
    return decode_utf8(read_input(path, label=label), label=label)


def decode_with_policy(data: bytes, *, label: str, utf8: str) -> tuple[str, tuple[int, ...]]:
    """Bytes as text under the request's UTF-8 policy (`ctxlock.request`): `strict` refuses the first bad byte
    with an InputError naming the input and the byte offset; `replace` substitutes U+FFFD for each bad run, as
    `bytes.decode("utf-8", "replace")` does, and returns the offset of every replaced byte. The bytes are taken
    as they are: no newline translation, no BOM stripping."""
    policy = _utf8_policy(utf8)
    try:
        text, runs = decode_bytes(data, policy)
    except RequestEncodingError as exc:
        raise InputError(
            f"{exc.message} at {exc.path}", path=label, hint="pass UTF-8 text, or --utf8 replace to substitute U+FFFD"
        ) from None
    return text, tuple(i for start, end in runs for i in range(start, end)) if policy is Utf8Policy.REPLACE else ()


def check_scalar_values(text: str, *, label: str, utf8: str) -> str:
    """A str that may hold lone surrogates (a JSON `\\ud800` escape, an argv byte that was not UTF-8, which
    Python keeps as U+DC80..U+DCFF): no tokenizer can encode one, so `strict` refuses it and `replace` writes
    U+FFFD for each, as a request's strings are treated."""
    match = _LONE_SURROGATE.search(text)
    if match is None:
        return text
    if _utf8_policy(utf8) is Utf8Policy.REPLACE:
        return _LONE_SURROGATE.sub("\ufffd", text)
    raise InputError(
        f"holds a lone surrogate \\u{ord(match.group()):04x} at character {match.start()}, which is not a character",
        path=label,
        hint="pass UTF-8 text, or --utf8 replace to substitute U+FFFD",
    )


def _utf8_policy(utf8: str) -> Any:
    try:
        return Utf8Policy(utf8)
    except ValueError:
        raise InputError(f"unknown UTF-8 policy {utf8!r}", path="--utf8", hint="use strict or replace") from None


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def read_json(path: Path, *, option: str, error: type[CtxlockError]) -> Any:
    """A JSON config file (--policy, --sampling): unreadable is an InputError; not JSON, or JSON the strict reader
    refuses (depth, duplicate keys, NaN, over-long integers, lone surrogates), is `error` naming the JSON path."""
    return loads_outside(read_text(path, option=option), f"{option} {path} $", error=error)


def is_template_name(value: str | Path) -> bool:
    """--template's rule, from the text alone (never from what exists on disk): no path separator and no dot is a
    name of the model's template set (default, tool_use, a file of additional_chat_templates/ by its stem); anything
    else is a file (./NAME for a file whose name has neither). README.md, "--template"."""
    text = str(value)
    return bool(text) and "/" not in text and os.sep not in text and "." not in text


def template_file(value: str | Path | None, *, option: str = "--template") -> ChatTemplate | str | None:
    """A --template value (`is_template_name`): a name of the model's template set, returned as it is (the render
    selects it, as Python's `chat_template="tool_use"` does), or a file, checked as a command-line input (regular,
    readable, within the input cap), then loaded and compiled like a model's own template file."""
    if value is None:
        return None
    if not str(value):
        raise InputError("the value is empty", path=option, hint="give a template name (default, tool_use) or a file")
    if is_template_name(value):
        return str(value)
    check_template_file(value, option=option)
    # start-up: `ctxlock.artifacts` brings the tokenizers and numpy, which `import ctxlock.cli` (every command, and
    # `--help`) does not need (tests/project/test_imports.py)
    from ctxlock.artifacts import load_template_file

    return load_template_file(Path(value))


def check_template_file(value: str | Path | None, *, option: str = "--template") -> None:
    if value is not None and not is_template_name(value):
        # Missing is the ArtifactNotFoundError a model's own template file gives, as before this check.
        check_input_file(Path(value), label=f"{option} {value}", missing=ArtifactNotFoundError)


def store_dir(path: Path | None, *, option: str = "--store") -> Path | None:
    """A record store directory: it may not exist yet (it is created), but if it does it must be a directory."""
    if path is None:
        return None
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise InputError(f"cannot use: {exc.strerror}", path=f"{option} {path}") from None
    if not stat.S_ISDIR(mode):
        raise InputError(
            "is not a directory", path=f"{option} {path}", hint="pass a store directory (created if missing)"
        )
    return path


def check_record_arg(spec: str, *, option: str = "RECORD") -> str:
    """A record id or a record file: a path that exists must be a regular file (a FIFO would block the read)."""
    try:
        mode = os.stat(spec).st_mode
    except (OSError, ValueError):
        return spec  # not a path: an id or an id prefix, looked up in the store
    if stat.S_ISREG(mode):
        check_input_file(spec, label=f"{option} {spec}")  # readable and within the cap; the loader reads it
        return spec
    kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
    raise InputError(f"is {kind}", path=f"{option} {spec}", hint="pass a record id, an id prefix or a record file")


class _Output(io.BufferedWriter):
    """A file being written whose failed writes (a full disk, /dev/full, a /proc file) are one error line naming the
    option and the path, as a failed open is; the file object every command writes through (`open_output`)."""

    def __init__(self, raw: io.FileIO, where: str) -> None:
        super().__init__(raw)
        self._where = where

    def _failed(self, exc: OSError) -> InputError:
        hint = "free space on its disk or pass a file on another" if exc.errno == errno.ENOSPC else ""
        return InputError(
            f"cannot write: {exc.strerror or type(exc).__name__}",
            path=self._where,
            hint=hint or "pass a file you can write",
        )

    def write(self, data: Any, /) -> int:
        try:
            return super().write(data)
        except OSError as exc:
            raise self._failed(exc) from None

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as exc:
            raise self._failed(exc) from None

    def close(self) -> None:
        try:
            super().close()
        except OSError as exc:
            raise self._failed(exc) from None


def open_output(path: Path, *, option: str = "--out") -> BinaryIO:
    """A file to write (created or truncated), each failure one error line naming `option` and the path: a FIFO or a
    socket there is refused before opening (a FIFO's open waits for a reader for ever), a directory or a missing
    parent is the open's error, and a write or close the file refuses (a full disk) is the returned file's."""
    where = f"{option} {path}"
    with contextlib.suppress(OSError):  # nothing there yet (or not reachable: the open says why)
        mode = os.stat(path).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket"
            raise InputError(f"is {kind}, not a file", path=where, hint="pass a file path in an existing directory")
    try:
        raw = io.FileIO(path, "wb")
    except OSError as exc:
        raise InputError(
            f"cannot write: {exc.strerror or type(exc).__name__}",
            path=where,
            hint="pass a file path in an existing directory",
        ) from None
    return _Output(raw, where)


__all__ = [
    "STDIN",
    "check_record_arg",
    "check_scalar_values",
    "check_template_file",
    "decode_with_policy",
    "is_template_name",
    "name_request_source",
    "open_output",
    "read_json",
    "read_request",
    "read_text",
    "store_dir",
    "template_file",
]
