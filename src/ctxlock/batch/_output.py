"""`ctxlock batch`'s output directory: files written atomically, the shard records, and what `--resume` checks
before it keeps a shard (docs/batch.md, "What --resume verifies").

A shard's record is written twice: inside its Parquet file (the footer's key-value metadata, key `ctxlock.shard`,
covered by the file's sha256) and beside it as `shard-NNNNN.json` (the same record plus that sha256). On a resume,
everything in the directory is data from outside, which may be stale, edited or hostile:

- A file is opened by its own name in the directory (`shard-NNNNN.json`, `shard-NNNNN.parquet`, made from the
  shard's index: a record never says where its data is), without following a link (`O_NOFOLLOW`) and without
  blocking (`O_NONBLOCK`: a FIFO), and read only when `fstat` says it is a regular file; a record is read up to
  `MAX_RECORD_BYTES`, a footer up to `MAX_FOOTER_BYTES`, and both as strict JSON (`ctxlock.outside`).
- The Parquet file's sha256 is computed from the bytes read through that same descriptor, and its record is read
  from its footer through it; the JSON record's bytes must be exactly those ctxlock writes for that record plus
  the sha256. A record's fields are
  checked for their types, its row range must be the shard's, its rows and errors must add up to that range, its
  sequence count must be the file's row count (Parquet metadata), and its job (model, template, tokenizer and
  options digests) and its input rows' sha256 must be this run's.

A shard that fails any check is made again, and the reason is reported (`Resume.remade`); one that passes is kept.
Nothing but a kept shard's record reaches the manifest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import re
import secrets
import stat
import tempfile
from collections import Counter
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, BinaryIO

from ctxlock.batch._trajectories import COLUMNS as TRAJECTORY_COLUMNS
from ctxlock.errors import CtxlockError, InputError
from ctxlock.outside import loads_strict
from ctxlock.request import Utf8Policy

RECORD_KEY = "ctxlock.shard"  # the record's key in a shard's Parquet footer (key-value metadata)
MAX_RECORD_BYTES = 64 << 20  # a shard record (its error rows included) read on --resume
MAX_FOOTER_BYTES = 64 << 20  # a shard's Parquet footer read on --resume
_BLOCK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SHARD_NAME = re.compile(r"shard-(\d{5,})\.(?:parquet|json)")
_COLUMNS = ("row", "request_sha256", "input_ids", "labels", "length")
_PACKED_COLUMNS = ("row", "rows", "request_sha256", "input_ids", "labels", "length", "position_ids", "seq_lengths")
_COUNTS = ("row_count", "error_count", "token_count", "trained_tokens", "sequence_count")
_JOB_NAMES = {
    "model": "another model",
    "template_sha256": "another template",
    "tokenizer_sha256": "another tokenizer",
    "policy_sha256": "other options (--shard-rows, --max-length, --pack, --train-on-eot, --last-turn-only)",
}


def shard_file(index: int) -> str:
    return f"shard-{index:05d}.parquet"


def record_file(index: int) -> str:
    return f"shard-{index:05d}.json"


def json_bytes(value: Any) -> bytes:
    return (json.dumps(value, ensure_ascii=False, sort_keys=True, indent=1) + "\n").encode("utf-8")


def write_atomic(path: Path, data: bytes) -> None:
    """Write under a temporary name in the same directory, then rename into place (a link or a FIFO that stood
    there is replaced, never written through). What cannot be written is an InputError naming the path."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _unwritable(path: Path, exc: OSError) -> InputError:
    return InputError(
        f"cannot write {path.name}: {exc.strerror or exc}",
        path=str(path),
        hint="remove what stands at that name in the output directory (a directory?), or use an empty directory",
    )


def filesystem_of(uri: str, hint: str) -> tuple[Any, str]:
    """`pyarrow.fs.FileSystem.from_uri(uri)`, or an InputError naming `uri`. A `file://` URI with a host other
    than localhost is refused: pyarrow drops the host, so `file://out/x` would be `/x` (RFC 8089: a local file URI
    is `file:///path`, https://www.rfc-editor.org/rfc/rfc8089#section-2)."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    scheme, _, rest = uri.partition("://")
    host = rest.split("/", 1)[0]
    if scheme.lower() == "file" and host not in ("", "localhost"):
        raise InputError(
            f"{uri} names the host {host!r}: a file URI's path starts at its third slash, and pyarrow would "
            f"use /{rest.partition('/')[2]}",
            path=uri,
            hint="write file:///absolute/path, or give the path without file://",
        )
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise InputError(f"cannot open {uri}: {exc}", path=uri, hint=hint) from None
    return fs, path


class FsDir:
    """An output directory on a `pyarrow.fs` filesystem, named by a URI (`file:///path`, `s3://bucket/prefix`,
    `gs://bucket/prefix`): the same operations as a local directory's, through the filesystem's own calls. A file
    is written under a temporary name in the same directory and then moved to its name (`FileSystem.move`): a
    rename on a local or POSIX filesystem; on an object store a copy then a delete, where the object appears whole
    or not at all (docs/batch-ray.md, "Output on an object store"). An object store has no links or FIFOs: what
    is read on --resume is a file or is missing."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.fs, path = filesystem_of(
            uri, "give a directory path or a pyarrow.fs URI (s3://bucket/prefix, gs://bucket/prefix, file:///path)"
        )
        self.base = path.rstrip("/") or "/"
        self.name = posixpath.basename(self.base)

    def path(self, name: str) -> str:
        return posixpath.join(self.base, name)

    def _kind(self, name: str | None = None) -> Any:
        import pyarrow.fs as pafs

        info = self.fs.get_file_info(self.base if name is None else self.path(name))
        if info.type == pafs.FileType.NotFound:
            return None
        return {pafs.FileType.File: "file", pafs.FileType.Directory: "directory"}.get(info.type, "not a file")

    def check(self, resume: bool) -> None:
        """As `check_out`: absent, or a directory that is empty unless `resume`; then made."""
        kind = self._kind()
        if kind == "file":
            raise InputError(f"{self.uri} is a file", path=self.uri, hint="give a directory for the shards")
        if kind == "directory" and self.names() and not resume:
            raise InputError(
                f"{self.uri} is not empty", path=self.uri, hint="use --resume to finish a job there, or an empty one"
            )
        self._call(self.uri, lambda: self.fs.create_dir(self.base, recursive=True))

    def names(self) -> list[str]:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.base, allow_not_found=True)
        return sorted(posixpath.basename(i.path) for i in self.fs.get_file_info(selector))

    def put(self, name: str, data: bytes) -> None:
        tmp = self.path(f".{name}.{secrets.token_hex(8)}.tmp")

        def write() -> None:
            with self.fs.open_output_stream(tmp) as fh:
                fh.write(data)
            self.fs.move(tmp, self.path(name))

        try:
            self._call(self.path(name), write)
        finally:
            if self._kind(posixpath.basename(tmp)) is not None:
                self.fs.delete_file(tmp)

    def exists(self, name: str) -> bool:
        return self._kind(name) is not None

    def open(self, name: str) -> BinaryIO | str:
        """The file opened for reading (seekable), or why not (as `open_regular`)."""
        kind = self._kind(name)
        if kind is None:
            return "is missing"
        if kind != "file":
            return f"is not a regular file ({kind})"
        try:
            return self.fs.open_input_file(self.path(name))
        except OSError as exc:
            return f"cannot be opened ({exc})"

    def remove(self, name: str) -> None:
        if self._kind(name) == "directory":
            raise InputError(
                f"{name} is a directory",
                path=self.path(name),
                hint="ctxlock batch writes only files there: remove it, or use an empty directory",
            )
        self._call(self.path(name), lambda: self.fs.delete_file(self.path(name)))

    def _call(self, where: str, fn: Callable[[], Any]) -> None:
        import pyarrow as pa

        try:
            fn()
        except FileNotFoundError:
            pass
        except (pa.ArrowException, OSError) as exc:
            raise InputError(
                f"cannot write {where}: {exc}",
                path=where,
                hint="check the filesystem's permissions and credentials, or use another directory",
            ) from None


# An output directory: a local path, or a `pyarrow.fs` one.
Out = Path | FsDir


def out_dir(out: str) -> Out:
    """The output directory named by `out`: a `pyarrow.fs` URI (`scheme://...`) or a local path."""
    return FsDir(out) if "://" in out else Path(out)


def put(out: Out, name: str, data: bytes) -> None:
    """Write `name` in the output directory atomically (`write_atomic`, or `FsDir.put`)."""
    if isinstance(out, FsDir):
        out.put(name, data)
    else:
        write_atomic(out / name, data)


def remove(path: Path) -> None:
    """Remove a leftover or stale entry of the output directory (a link itself, never its target); a directory
    there is an InputError (ctxlock never makes one)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise InputError(
                f"{path.name} is a directory",
                path=str(path),
                hint="ctxlock batch writes only files there: remove it, or use an empty directory",
            )
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise _unwritable(path, exc) from None


def _leftover(name: str) -> bool:
    return name.startswith((".shard-", ".manifest.json.", ".errors.jsonl.")) and name.endswith(".tmp")


def clean(out: Out) -> None:
    """Remove a killed run's half-written files (`.shard-*.tmp`, `.manifest.json.*.tmp`, ...)."""
    if isinstance(out, FsDir):
        for name in out.names():
            if _leftover(name):
                out.remove(name)
        return
    for leftover in out.glob(".*.tmp"):
        if _leftover(leftover.name):
            remove(leftover)


def remove_stale(out: Out, shards: int) -> list[str]:
    """Remove the shard files of an earlier run beyond this run's `shards` (its input had more rows): a loader
    that reads `shard-*.parquet` must not meet rows that are not in the manifest. Returns their names."""
    removed = []
    names = out.names() if isinstance(out, FsDir) else sorted(p.name for p in out.iterdir())
    for name in names:
        m = _SHARD_NAME.fullmatch(name)
        if m is not None and int(m.group(1)) >= shards:
            if isinstance(out, FsDir):
                out.remove(name)
            else:
                remove(out / name)
            removed.append(name)
    return removed


# -- the manifest ---------------------------------------------------------------------------------------------


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def write_manifest(
    source: dict[str, Any],
    out: Out,
    policy: dict[str, Any],
    job: dict[str, Any],
    records: list[dict[str, Any]],
    fit: bool,
) -> dict[str, Any]:
    """Write `errors.jsonl`, then `manifest.json`, from the shards' records (each one kept or made by this run);
    `source` is the manifest's `input` (`batch.input_record`: the file's name, size and blocks' digest)."""
    errors = b"".join(
        (json.dumps(e, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8") for r in records for e in r["errors"]
    )
    put(out, "errors.jsonl", errors)
    manifest = {
        "ctxlock_version": _version("ctxlock"),
        "pyarrow_version": _version("pyarrow"),  # the shards' bytes are pyarrow's writer's
        "model": job["model"],
        "template_sha256": job["template_sha256"],
        "tokenizer_sha256": job["tokenizer_sha256"],
        "policy": policy,
        "policy_sha256": hashlib.sha256(json_bytes(policy)).hexdigest(),
        "input": source,
        "rows": sum(r["row_count"] + r["error_count"] for r in records),
        "row_count": sum(r["row_count"] for r in records),
        "error_count": sum(r["error_count"] for r in records),
        "token_count": sum(r["token_count"] for r in records),
        "trained_tokens": sum(r["trained_tokens"] for r in records),
        "errors": {"file": "errors.jsonl", "sha256": hashlib.sha256(errors).hexdigest()},
        "notes": sorted({n for r in records for n in r.get("notes", ())}),
        **({"fit": _fit_counts(records)} if fit else {}),
        "shards": [{k: v for k, v in r.items() if k not in ("errors", "job", "fitted")} for r in records],
    }
    put(out, "manifest.json", json_bytes(manifest))
    return manifest


def one_job(out: Out, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The job every shard was made by (their records say it): shards of different models cannot share a manifest."""
    jobs = {json.dumps(r["job"], sort_keys=True) for r in records}
    if len(jobs) > 1:
        raise InputError(
            f"the shards in {out} were made by different models or templates ({len(jobs)} kinds)",
            path=str(out),
            hint="a --resume must use the same --model as the run it finishes; or start in an empty directory",
        )
    return records[0]["job"]


def _fit_counts(records: list[dict[str, Any]]) -> dict[str, int]:
    """--max-length: the shards' fit counts added up (rows kept whole, fitted, over; decisions per kind)."""
    total: Counter[str] = Counter({"rows_whole": 0, "rows_fitted": 0, "rows_over": 0})
    for r in records:
        total.update(r.get("fit", {}))
    return dict(sorted(total.items()))


# -- reading on --resume ----------------------------------------------------------------------------------------


def open_regular(path: Path) -> BinaryIO | str:
    """The file at `path` opened for reading when it is a regular file, not followed if it is a link and not
    waited on if it is a FIFO; else why not (a short phrase)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    mode = _lmode(path)
    if mode and not stat.S_ISREG(mode):  # not even opened (opening a device may act); checked again once open
        return "is a symbolic link" if stat.S_ISLNK(mode) else f"is not a regular file ({_kind(mode)})"
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        if stat.S_ISLNK(_lmode(path)):
            return "is a symbolic link"
        return f"cannot be opened ({exc.strerror or exc})"
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        return f"is not a regular file ({_kind(mode)})"
    return os.fdopen(fd, "rb")


def _lmode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


def read_json_record(path: Path) -> tuple[dict[str, Any] | str, bytes]:
    """A shard's JSON record (bounded, strict JSON), or why it cannot be used; and its bytes."""
    return read_record_of(open_regular(path), path.name)


def read_record_of(opened: BinaryIO | str, name: str) -> tuple[dict[str, Any] | str, bytes]:
    """`read_json_record` of a file opened by `open_regular` or `FsDir.open` (or why it was not)."""
    if isinstance(opened, str):
        return f"its record {name} {opened}", b""
    with opened as fh:
        data = fh.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        return f"its record {name} is over {MAX_RECORD_BYTES >> 20} MiB", b""
    return _parse_record(data, name), data


def _parse_record(data: bytes, where: str) -> dict[str, Any] | str:
    try:
        value = loads_strict(data.decode("utf-8"), where, Utf8Policy.STRICT)
    except (ValueError, CtxlockError) as exc:  # not UTF-8, JSONDecodeError, the strict reader's own refusals
        return f"its record in {where} is not valid JSON ({type(exc).__name__})"
    return value if isinstance(value, dict) else f"its record in {where} is not a JSON object"


def sha256_and_footer(fh: BinaryIO, where: str) -> tuple[str, dict[str, Any] | str, int]:
    """The sha256 of the file's bytes, the record in its Parquet footer (or why there is none) and the file's row
    count, all read through this one open file."""
    digest = hashlib.sha256()
    size = 0
    while block := fh.read(_BLOCK):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), *footer_record(fh, size, where)


def footer_record(fh: BinaryIO, size: int, where: str) -> tuple[dict[str, Any] | str, int]:
    """The record in a Parquet file's footer and the file's row count; the footer's length is checked against
    `MAX_FOOTER_BYTES` before pyarrow reads it. Or why it cannot be read (row count 0)."""
    import pyarrow as pa  # an optional extra: ctxlock[batch] (the job checked it is installed)
    import pyarrow.parquet as pq

    if size < 12:
        return f"{where} is not a Parquet file", 0
    fh.seek(size - 8)
    tail = fh.read(8)
    footer = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or footer + 12 > size:
        return f"{where} is not a Parquet file", 0
    if footer > MAX_FOOTER_BYTES:
        return f"{where}'s footer is over {MAX_FOOTER_BYTES >> 20} MiB", 0
    fh.seek(0)
    try:
        meta = pq.ParquetFile(fh).metadata
        kv = meta.metadata or {}
        rows = meta.num_rows
        names = tuple(meta.schema.to_arrow_schema().names)
    except (pa.ArrowException, OSError, ValueError) as exc:
        return f"{where} cannot be read as Parquet ({type(exc).__name__})", 0
    raw = kv.get(RECORD_KEY.encode())
    if raw is None:
        return f"{where} has no ctxlock record in its footer", 0
    if names not in (_COLUMNS, _PACKED_COLUMNS, TRAJECTORY_COLUMNS):
        return f"{where} does not have a shard's columns", 0
    return _parse_record(raw, f"{where}'s footer"), rows


def record_of_bytes(data: bytes, index: int) -> dict[str, Any]:
    """The record a shard's Parquet bytes carry (what a Ray actor sends back): the driver writes the record the
    bytes hold, not a second copy sent beside them."""
    record, rows = footer_record(io.BytesIO(data), len(data), shard_file(index))
    problem = record if isinstance(record, str) else check_record(record, index, None, rows)
    if problem is not None:
        raise InputError(
            f"a worker's shard {index} is not whole: {problem}", path=shard_file(index), hint="run with --resume"
        )
    assert isinstance(record, dict)
    return record


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _error_ok(e: Any, first: int, stop: int) -> bool:
    return (
        isinstance(e, dict)
        and set(e) == {"row", "type", "path", "message"}
        and type(e["row"]) is int
        and first <= e["row"] < stop
        and all(isinstance(e[k], str) for k in ("type", "message"))
        and (e["path"] is None or isinstance(e["path"], str))
    )


def check_record(record: dict[str, Any], index: int, span: tuple[int, int] | None, rows: int) -> str | None:
    """Why a record (read from a footer) is not shard `index`'s, covering rows `span` (None: any span) in a file
    of `rows` rows; None when its fields have their types and add up."""
    keys = {"index", "file", "job", "rows", "input_sha256", "notes", "errors", *_COUNTS}
    if not keys <= set(record) <= keys | {"fit", "fitted", "forks"}:
        return "its record does not have a shard record's fields"
    forks = record.get("forks", {})  # --trajectories: the forks by cause
    if not (isinstance(forks, dict) and all(isinstance(k, str) and _count(v) for k, v in forks.items())):
        return "its record's forks are not counts by cause"
    if record["index"] != index or record["file"] != shard_file(index):
        return f"its record is not shard {index}'s"
    first_stop = record["rows"]
    if not (isinstance(first_stop, list) and len(first_stop) == 2 and all(_count(v) for v in first_stop)):
        return "its record's row range is not two row numbers"
    first, stop = first_stop
    if span is not None and (first, stop) != span:
        return f"its record covers rows [{first}, {stop}), not this input's [{span[0]}, {span[1]})"
    if not all(_count(record[k]) for k in _COUNTS):
        return "its record's counts are not counts"
    if record["row_count"] + record["error_count"] != stop - first or stop <= first:
        return f"its record counts {record['row_count'] + record['error_count']:,} rows for rows [{first}, {stop})"
    if record["sequence_count"] != rows:
        return f"its record counts {record['sequence_count']:,} sequences; its Parquet file holds {rows:,}"
    errors = record["errors"]
    if not (isinstance(errors, list) and len(errors) == record["error_count"]):
        return "its record's error rows are not its error count"
    if not all(_error_ok(e, first, stop) for e in errors) or len({e["row"] for e in errors}) != len(errors):
        return "its record's error rows are not rows of the shard"
    if not (isinstance(record["notes"], list) and all(isinstance(n, str) for n in record["notes"])):
        return "its record's notes are not strings"
    if not (isinstance(record["input_sha256"], str) and _HEX64.fullmatch(record["input_sha256"])):
        return "its record has no input sha256"
    return None


def job_change(made: Any, now: dict[str, Any]) -> str | None:
    """What differs between the job a shard was made by and this run's, named for a user; None if nothing."""
    if not isinstance(made, dict) or set(made) != set(now):
        return "it was made by another version of ctxlock batch (its record's job differs)"
    changed = [_JOB_NAMES.get(k, k) for k in now if made[k] != now[k]]
    if not changed:
        return None
    if made.get("model") != now.get("model"):
        return f"it was made with another model ({made.get('model')!r}, now {now.get('model')!r})"
    return "it was made with " + " and ".join(changed)


class Resume:
    """What `--resume` keeps: `kept(...)` gives a finished shard's record when it passes every check (module
    docstring), else None, with the reason in `remade` (shard index -> reason) when the shard had been started."""

    def __init__(self, out: Out, job: dict[str, Any]) -> None:
        self.out = out
        self.job = job
        self.remade: dict[int, str] = {}

    def kept(self, index: int, span: tuple[int, int], input_sha256: Callable[[], str]) -> dict[str, Any] | None:
        """Shard `index`'s record when it is finished and this run's: input rows `span` whose sha256 is
        `input_sha256()` (called only when everything else holds: it reads the shard's input rows)."""
        why = self._why_not(index, span, input_sha256)
        if isinstance(why, dict):
            return why
        if why is not None:
            self.remade[index] = why
        return None

    def _why_not(
        self, index: int, span: tuple[int, int], input_sha256: Callable[[], str]
    ) -> dict[str, Any] | str | None:
        if not self._exists(record_file(index)) and not self._exists(shard_file(index)):
            return None  # never started: nothing to report
        record, data = read_record_of(self._open(record_file(index)), record_file(index))
        if isinstance(record, str):
            return record
        change = job_change(record.get("job"), self.job)
        if change is not None:
            return change
        sha = record.get("sha256")
        opened = self._open(shard_file(index))
        if isinstance(opened, str):
            return f"its Parquet file {shard_file(index)} {opened}"
        with opened as fh:
            digest, embedded, rows = sha256_and_footer(fh, shard_file(index))
        if digest != sha:
            return f"{shard_file(index)}'s sha256 is not the one its record gives"
        if isinstance(embedded, str):
            return embedded
        problem = check_record(embedded, index, span, rows) or job_change(embedded["job"], self.job)
        if problem is not None:
            return problem
        if json_bytes({**embedded, "sha256": digest}) != data:
            return f"its record {record_file(index)} differs from the one in {shard_file(index)} (edited?)"
        if embedded["input_sha256"] != input_sha256():
            return "its input rows changed"
        return record

    def _exists(self, name: str) -> bool:
        return self.out.exists(name) if isinstance(self.out, FsDir) else os.path.lexists(self.out / name)

    def _open(self, name: str) -> BinaryIO | str:
        return self.out.open(name) if isinstance(self.out, FsDir) else open_regular(self.out / name)


__all__ = [
    "MAX_FOOTER_BYTES",
    "MAX_RECORD_BYTES",
    "RECORD_KEY",
    "FsDir",
    "Out",
    "Resume",
    "check_record",
    "clean",
    "filesystem_of",
    "json_bytes",
    "one_job",
    "open_regular",
    "out_dir",
    "put",
    "read_record_of",
    "record_file",
    "record_of_bytes",
    "remove",
    "remove_stale",
    "shard_file",
    "write_atomic",
    "write_manifest",
]
