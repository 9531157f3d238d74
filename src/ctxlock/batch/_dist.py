"""The job's steps that run where the data lives (a Ray engine's workers): no Ray here, plain functions of paths.

The input is a local path or a `pyarrow.fs` URI (`s3://`, `gs://`, `file://`, ...) opened in the worker
(`open_source`); the output directory is a path every worker can write (a shared filesystem, the same path on every
node) or a `pyarrow.fs` URI (`batch.out_dir`). Each step returns plain data (a few numbers, digests, shard records
without their error rows) and never the input's or the shards' bytes:

- `probe`: the input's size and kind (Parquet's footer: its row count), the output directory checked, created and
  cleaned of a killed run's temporary files, and the job's digests (the model is loaded there).
- `scan`: a run of the input's `BLOCK_BYTES` blocks: each block's sha256 and, for JSONL, its newline count. The
  driver joins these into the input's digest (`blocks_digest`) and, by prefix sums of the newline counts, into each
  shard's `Place`: the block where its first row starts and how many newlines to skip from there.
- `make_shard`: one shard's rows read from its `Place` (exactly the rows `read_shards` gives the local engine: row
  numbers are the input's own, a blank or broken line stays a row), checked for `--resume` or encoded, and written
  with its record (`write_shard`: temporary name, rename). Running it twice (a retry after a lost worker) writes the
  same bytes.
- `commit`: the manifest and `errors.jsonl` from the shards' record files (each checked against the sha256 its
  task sent back), after removing a killed run's temporary files and, on a resume, the shards of an earlier,
  longer input.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import posixpath
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ctxlock.batch._input import BLOCK_BYTES, MESSAGES, messages_column_problem, parquet_rows_of, rows_sha256
from ctxlock.batch._output import (
    FsDir,
    Out,
    Resume,
    clean,
    filesystem_of,
    json_bytes,
    open_regular,
    out_dir,
    read_record_of,
    record_file,
    remove_stale,
)
from ctxlock.batch._run import (
    BatchOptions,
    check_out,
    encode_shard,
    init_worker,
    job_of,
    write_job_manifest,
)
from ctxlock.errors import InputError


def is_uri(source: str) -> bool:
    return "://" in source


def open_source(source: str) -> tuple[Any, str]:
    """The input's `pyarrow.fs` filesystem and its path there: a URI's own, else the local filesystem."""
    import pyarrow.fs as pafs

    if not is_uri(source):
        return pafs.LocalFileSystem(), os.path.abspath(source)
    return filesystem_of(
        source, "give a local path or a pyarrow.fs URI (s3://bucket/key, gs://bucket/key, file:///path)"
    )


def source_name(source: str) -> str:
    """The input's file name, as the manifest gives it (a local path's `Path.name`)."""
    return posixpath.basename(urlparse(source).path) if is_uri(source) else Path(source).name


@dataclass(frozen=True)
class Place:
    """Where shard `index` is in the input: rows [first_row, stop_row); for JSONL its first row starts after `skip`
    newlines from byte `offset` (a block's start)."""

    index: int
    first_row: int
    stop_row: int
    offset: int = 0
    skip: int = 0


def _is_parquet(fs: Any, path: str, size: int) -> bool:
    """As `batch.read_shards` tells: by the name, or by Parquet's magic at both ends and a readable footer."""
    if posixpath.splitext(path)[1].lower() in (".parquet", ".pq"):
        return True
    if size < 12:
        return False
    with fs.open_input_file(path) as fh:
        if fh.read_at(4, 0) != b"PAR1" or fh.read_at(4, size - 4) != b"PAR1":
            return False
    try:
        _parquet_file(fs, path)
    except InputError:
        return False
    return True


def _parquet_file(fs: Any, path: str) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(fs.open_input_file(path))
    except (pa.ArrowException, OSError) as exc:
        raise InputError(
            f"the input looks like Parquet (PAR1 at both ends) but cannot be read: {exc}",
            path=path,
            hint="check the file (pyarrow.parquet.read_metadata), or give the rows as JSONL",
        ) from exc


def probe(source: str, out: str, resume: bool, opts: BatchOptions) -> dict[str, Any]:
    """The input's size, kind and (Parquet) row count; the output directory checked, made and cleaned; the job."""
    import pyarrow.fs as pafs

    fs, path = open_source(source)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise InputError(f"no such input file: {source}", path=source, hint="give a .jsonl or .parquet file")
    if info.type != pafs.FileType.File:
        # A directory, or on file:// a device or FIFO (pyarrow follows links): not an input to read.
        raise InputError(
            f"{source} is not a regular file ({info.type.name})", path=source, hint="give a .jsonl or .parquet file"
        )
    size = int(info.size)
    parquet = _is_parquet(fs, path, size)
    pf = _parquet_file(fs, path) if parquet else None
    rows = pf.metadata.num_rows if pf is not None else 0
    names = pf.schema_arrow.names if pf is not None else []
    schema = pf.schema_arrow if pf is not None else None
    messages_column_problem(source, "Parquet" if parquet else "JSONL", names, opts.messages_column, schema)
    target = out_dir(out)
    if isinstance(target, FsDir):
        target.check(resume)
    else:
        check_out(target, resume)
        target.mkdir(parents=True, exist_ok=True)
    clean(target)  # a killed run's half-written files
    init_worker(opts.model)
    return {"size": size, "parquet": parquet, "rows": rows, "job": job_of(opts)}


def scan(source: str, first_block: int, stop_block: int, count_lines: bool) -> list[tuple[bytes, int, bool]]:
    """Blocks [first_block, stop_block) of the input: each one's sha256, newline count (JSONL) and whether it ends
    with a newline."""
    fs, path = open_source(source)
    found = []
    with fs.open_input_file(path) as fh:
        for block in range(first_block, stop_block):
            data = fh.read_at(BLOCK_BYTES, block * BLOCK_BYTES)
            lines = data.count(b"\n") if count_lines else 0
            found.append((hashlib.sha256(data).digest(), lines, data.endswith(b"\n")))
    return found


def plan_jsonl(blocks: list[tuple[bytes, int, bool]], shard_rows: int) -> list[Place]:
    """Each shard's `Place` from the blocks' newline counts (prefix sums): row r > 0 starts after the r-th newline,
    and a last line without one is a row, as `for line in file` reads them."""
    through = list(itertools.accumulate(b[1] for b in blocks))
    total = (through[-1] if through else 0) + (1 if blocks and not blocks[-1][2] else 0)
    places = []
    for index, first in enumerate(range(0, total, shard_rows)):
        stop = min(first + shard_rows, total)
        if first == 0:
            places.append(Place(index, 0, stop))
            continue
        block = bisect_left(through, first)  # the block holding the first-th newline
        before = through[block] - blocks[block][1]
        places.append(Place(index, first, stop, block * BLOCK_BYTES, first - before))
    return places


def plan_parquet(rows: int, shard_rows: int) -> list[Place]:
    return [
        Place(index, first, min(first + shard_rows, rows)) for index, first in enumerate(range(0, rows, shard_rows))
    ]


def read_place(source: str, place: Place, parquet: bool, column: str = MESSAGES) -> list[tuple[int, Any]]:
    """One shard's rows, as `batch.read_shards` gives them: JSONL lines without their line ending (row numbers
    counted from the place's first row), or Parquet rows."""
    fs, path = open_source(source)
    want = place.stop_row - place.first_row
    if parquet:
        pf = _parquet_file(fs, path)
        return list(itertools.islice(parquet_rows_of(pf, source, place.first_row, column), want))
    rows: list[tuple[int, Any]] = []
    skip, n, buf = place.skip, place.first_row, b""
    with fs.open_input_file(path) as fh:
        fh.seek(place.offset)
        while len(rows) < want:
            piece = fh.read(BLOCK_BYTES)
            if not piece:
                if buf and not skip:
                    rows.append((n, buf.rstrip(b"\r\n")))  # the last line, with no newline after it
                break
            buf += piece
            start = 0
            while len(rows) < want and (end := buf.find(b"\n", start)) >= 0:
                if skip:
                    skip -= 1
                else:
                    rows.append((n, buf[start : end + 1].rstrip(b"\r\n")))
                    n += 1
                start = end + 1
            buf = buf[start:]
    if len(rows) != want:
        raise InputError(
            f"the input has {place.first_row + len(rows):,} rows where the plan counted {place.stop_row:,}",
            path=source,
            hint="the input changed while the job ran: run the same command again with --resume",
        )
    return rows


# What of a shard's record stays in the output directory, not sent back to the driver: its error rows and its fitted
# rows (each proportional to the shard's rows). The commit task reads them from the record file.
_LEFT_THERE = ("errors", "fitted")


def slim(record: dict[str, Any]) -> dict[str, Any]:
    """What a shard task sends back: its record without its rows' lists, and the sha256 of its record file's bytes
    (so that the commit task uses the very record the task wrote)."""
    kept = {k: v for k, v in record.items() if k not in _LEFT_THERE}
    return {**kept, "record_sha256": hashlib.sha256(json_bytes(record)).hexdigest()}


def make_shard(
    source: str, place: Place, parquet: bool, out: str, opts: BatchOptions, resume_job: dict[str, Any] | None
) -> tuple[dict[str, Any], bool, str | None]:
    """Shard `place`: with `resume_job`, kept when it passes every `--resume` check (its record, kept True), else
    made (read, encoded, written) and its record returned with why a started one was made again; the record
    `slim`med."""
    init_worker(opts.model)
    read: list[list[tuple[int, Any]]] = []

    def rows() -> list[tuple[int, Any]]:
        if not read:
            read.append(read_place(source, place, parquet, opts.messages_column))
        return read[0]

    why = None
    if resume_job is not None:
        check = Resume(out_dir(out), resume_job)
        kept = check.kept(place.index, (place.first_row, place.stop_row), lambda: rows_sha256(rows()))
        if kept is not None:
            return slim(kept), True, None
        why = check.remade.get(place.index)
    return slim(encode_shard(place.index, rows(), out, opts)), False, why


def _whole(target: Out, record: dict[str, Any]) -> dict[str, Any]:
    """A shard's whole record, read from its record file and checked against what its task sent back."""
    name = record_file(record["index"])
    opened = target.open(name) if isinstance(target, FsDir) else open_regular(target / name)
    whole, data = read_record_of(opened, name)
    if isinstance(whole, str) or hashlib.sha256(data).hexdigest() != record["record_sha256"]:
        raise InputError(
            f"{name} is not the record its shard task wrote ({whole if isinstance(whole, str) else 'it changed'})",
            path=name,
            hint="another process writes in the output directory? run the same command again with --resume",
        )
    return whole


def commit(
    source: dict[str, Any], out: str, opts: BatchOptions, records: list[dict[str, Any]], resume: bool
) -> tuple[dict[str, Any], list[str]]:
    """The manifest and errors.jsonl, written last from the shards' records (read whole from their record files:
    the error rows never went through the driver); returns it and the stale files removed."""
    target = out_dir(out)
    clean(target)  # a temporary file a killed worker left
    removed = remove_stale(target, len(records)) if resume else []
    return write_job_manifest(source, target, opts, [_whole(target, r) for r in records]), removed


__all__ = [
    "Place",
    "commit",
    "is_uri",
    "make_shard",
    "open_source",
    "plan_jsonl",
    "plan_parquet",
    "probe",
    "read_place",
    "scan",
    "slim",
    "source_name",
]
