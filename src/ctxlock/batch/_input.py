"""`ctxlock batch`'s input: a JSONL or Parquet file of requests, read in shards, never whole.

Row numbers count from 0 in file order; a blank JSONL line is a row (the job makes it an error row). `read_shards`
gives the rows `shard_rows` at a time; `plan_shards` gives where each shard is (its rows, and for JSONL its byte
range) without reading them, and `read_spec` reads one shard's rows from that, exactly as `read_shards` gives them
(what an engine that reads each shard where it encodes it, Ray, hands out). Parquet is told from JSONL by the name
(`.parquet`, `.pq`) or by Parquet's magic at both ends with a readable footer; a damaged Parquet input is one
InputError naming the file (and the row where it broke).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxlock.errors import InputError
from ctxlock.outside import file_sha256

# -- reading the input -----------------------------------------------------------------------------------------


def _is_parquet(path: Path) -> bool:
    """Parquet when the name says so (`.parquet`, `.pq`: a damaged one is then an InputError), or when the file
    starts and ends with Parquet's magic `PAR1` and its footer reads; anything else is JSONL (a JSONL line may well
    start with those four bytes)."""
    if path.suffix.lower() in (".parquet", ".pq"):
        return True
    with path.open("rb") as fh:
        if fh.read(4) != b"PAR1":
            return False
        fh.seek(0, os.SEEK_END)
        if fh.tell() < 12:
            return False
        fh.seek(-4, os.SEEK_END)
        if fh.read(4) != b"PAR1":
            return False
    try:
        _parquet_file(path)
    except InputError:
        return False
    return True


def _parquet_file(path: Path) -> Any:
    """The input as a `pyarrow.parquet.ParquetFile`; a damaged one is an InputError naming it."""
    import pyarrow as pa  # an optional extra: ctxlock[batch]
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(
            f"the input looks like Parquet (PAR1 at both ends) but cannot be read: {exc}",
            path=str(path),
            hint="check the file (pyarrow.parquet.read_metadata), or give the rows as JSONL",
        ) from exc


MESSAGES = "messages"  # the request's field (and by default the Parquet column) that holds its messages


def check_columns(path: Path, column: str) -> None:
    """`column` can be read as the requests' messages (`--messages-column`): any Parquet input for the default; else
    the input must be Parquet with that column and no `messages` column beside it. An InputError otherwise."""
    if column != MESSAGES:
        kind = "Parquet" if _is_parquet(path) else "JSONL"
        schema = _parquet_file(path).schema_arrow if kind == "Parquet" else None
        messages_column_problem(str(path), kind, [] if schema is None else schema.names, column, schema)


def messages_column_problem(where: str, kind: str, names: list[str], column: str, schema: Any = None) -> None:
    """`check_columns` of an input of `kind` whose Parquet columns are `names` (also for a `pyarrow.fs` input);
    with the file's `schema` (a `pyarrow.Schema`), a column that cannot hold messages (not a list) is refused."""
    if column == MESSAGES:
        return
    if kind != "Parquet":
        raise InputError(
            f"--messages-column {column} applies to Parquet input; {where} is JSONL",
            path=where,
            hint="drop --messages-column (a JSONL request names its messages 'messages'), or give a Parquet file",
        )
    if column not in names:
        raise InputError(
            f"{where} has no column {column!r} (its columns: {', '.join(names) or 'none'})",
            path=where,
            hint="give --messages-column one of the file's columns",
        )
    if schema is not None:
        import pyarrow as pa  # an optional extra: ctxlock[batch]

        kind_of = schema.field(column).type
        if not (pa.types.is_list(kind_of) or pa.types.is_large_list(kind_of) or pa.types.is_fixed_size_list(kind_of)):
            raise InputError(
                f"{where}'s column {column!r} holds {kind_of}, not messages (a list of message structs)",
                path=where,
                hint="give --messages-column the column that holds each row's list of messages",
            )
    if MESSAGES in names:
        raise InputError(
            f"{where} has both a {column!r} and a 'messages' column: which one holds the messages is ambiguous",
            path=where,
            hint="drop or rename one of the two columns, or drop --messages-column to read 'messages'",
        )


def read_shards(path: Path, shard_rows: int, column: str = MESSAGES) -> Iterator[list[tuple[int, Any]]]:
    """The input's rows, `shard_rows` at a time: (row number, raw row) with the raw row a JSONL line's bytes or a
    Parquet row's dict (its column `column` named `messages`: `--messages-column`, checked by `check_columns`)."""
    rows = _parquet_rows(path, column=column) if _is_parquet(path) else _jsonl_rows(path)
    shard: list[tuple[int, Any]] = []
    for item in rows:
        shard.append(item)
        if len(shard) == shard_rows:
            yield shard
            shard = []
    if shard:
        yield shard


def _jsonl_rows(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as fh:
        for n, line in enumerate(fh):
            yield n, line.rstrip(b"\r\n")


def _parquet_rows(
    path: Path | str, first: int = 0, pf: Any = None, column: str = MESSAGES
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows from row `first` on, the row groups wholly before it not read (`pf`: the file already open, as a
    `pyarrow.parquet.ParquetFile`, e.g. on a `pyarrow.fs` filesystem; `path` then only names it). Column `column`
    is the row's `messages`, in its place among the columns (so the row is the one a `messages` column gives)."""
    if pf is None:
        pf = _parquet_file(Path(path))
    n, skip = 0, 0
    while skip < pf.num_row_groups and n + pf.metadata.row_group(skip).num_rows <= first:
        n += pf.metadata.row_group(skip).num_rows
        skip += 1
    import pyarrow as pa

    batches = pf.iter_batches(batch_size=1024, row_groups=range(skip, pf.num_row_groups))
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(
                f"the Parquet input cannot be read at row {n:,}: {exc}",
                path=f"{path}:row {n}",
                hint="check the file (pyarrow.parquet.read_table), or give the rows as JSONL",
            ) from exc
        if batch is None:
            return
        for row in batch.to_pylist():
            if n >= first:
                yield n, row if column == MESSAGES else {(MESSAGES if k == column else k): v for k, v in row.items()}
            n += 1


@dataclass(frozen=True)
class ShardSpec:
    """Where shard `index` is in the input: rows [first_row, stop_row), and for JSONL the bytes [start, end)."""

    index: int
    first_row: int
    stop_row: int
    start: int = 0
    end: int = 0


def plan_shards(path: Path, shard_rows: int) -> Iterator[ShardSpec]:
    """The input's shards without their rows (a scan for line offsets, or the Parquet footer): what an engine that
    reads each shard where it encodes it (Ray) hands out. `read_spec` gives exactly `read_shards`' rows."""
    if _is_parquet(path):
        total = _parquet_file(path).metadata.num_rows
        for index, first in enumerate(range(0, total, shard_rows)):
            yield ShardSpec(index, first, min(first + shard_rows, total))
        return
    with path.open("rb") as fh:
        index, first, n, start, at = 0, 0, 0, 0, 0
        for line in fh:
            at += len(line)
            n += 1
            if n - first == shard_rows:
                yield ShardSpec(index, first, n, start, at)
                index, first, start = index + 1, n, at
        if n > first:
            yield ShardSpec(index, first, n, start, at)


def read_spec(path: Path, spec: ShardSpec, column: str = MESSAGES) -> list[tuple[int, Any]]:
    """One shard's rows, as `read_shards` gives them."""
    if _is_parquet(path):
        rows = _parquet_rows(path, spec.first_row, column=column)
        return list(itertools.islice(rows, spec.stop_row - spec.first_row))
    with path.open("rb") as fh:
        fh.seek(spec.start)
        data = fh.read(spec.end - spec.start)
    return [(spec.first_row + k, line.rstrip(b"\r\n")) for k, line in enumerate(io.BytesIO(data))]


def parquet_rows_of(pf: Any, name: str, first: int, column: str = MESSAGES) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows of an open `pyarrow.parquet.ParquetFile` from row `first` on, as `read_shards` gives them."""
    return _parquet_rows(name, first, pf, column)


def request_of(raw: Any) -> Any:
    """A raw row -> what `Model.parse` takes: JSONL bytes as they are; a Parquet row's `request` JSON string, or
    its columns as a request object (None-valued columns dropped)."""
    if isinstance(raw, bytes):
        return raw
    if set(raw) == {"request"} or ("request" in raw and "messages" not in raw):
        return raw["request"]
    return {k: v for k, v in raw.items() if v is not None}


def rows_sha256(rows: list[tuple[int, Any]]) -> str:
    """The sha256 of a shard's input rows as the job encodes them (`request_of`: a JSONL line's bytes, a Parquet
    `request` string's UTF-8, or a Parquet row of columns as JSON), each after its row number and length: what a
    shard record keeps, so that `--resume` makes again exactly the shards whose rows changed (docs/batch.md). The
    same requests as JSONL or as a Parquet `request` column have the same digest."""
    digest = hashlib.sha256()
    for n, raw in rows:
        request = request_of(raw)
        if isinstance(request, str):
            data = request.encode("utf-8", "surrogatepass")
        elif isinstance(request, bytes):
            data = request
        else:
            data = json.dumps(request, ensure_ascii=False, default=repr).encode("utf-8", "surrogatepass")
        digest.update(b"%d %d\n" % (n, len(data)))
        digest.update(data)
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    return file_sha256(path)


# The input's digest in the manifest is over blocks, so that no process has to read the whole input to make it: the
# Ray engine's workers digest the blocks they scan, the driver joins 32 bytes per block (docs/batch.md).
BLOCK_BYTES = 1 << 20


def blocks_digest(block_sha256s: list[bytes]) -> str:
    """sha256 over the raw sha256 digests of the input's consecutive `BLOCK_BYTES` blocks, in order (the last one
    shorter; none for an empty file)."""
    return hashlib.sha256(b"".join(block_sha256s)).hexdigest()


def input_record(name: str, size: int, block_sha256s: list[bytes]) -> dict[str, Any]:
    """The manifest's `input`: the file's name, its size and its blocks' digest (`blocks_digest`)."""
    return {"file": name, "bytes": size, "block_bytes": BLOCK_BYTES, "blocks_sha256": blocks_digest(block_sha256s)}


def input_digest(path: Path) -> dict[str, Any]:
    """`input_record` of a local file, read here block by block (the local engine's)."""
    digests, size = [], 0
    with path.open("rb") as fh:
        while block := fh.read(BLOCK_BYTES):
            digests.append(hashlib.sha256(block).digest())
            size += len(block)
    return input_record(path.name, size, digests)


__all__ = [
    "BLOCK_BYTES",
    "MESSAGES",
    "ShardSpec",
    "blocks_digest",
    "check_columns",
    "input_digest",
    "input_record",
    "messages_column_problem",
    "parquet_rows_of",
    "plan_shards",
    "read_shards",
    "read_spec",
    "request_of",
    "rows_sha256",
    "sha256_file",
]
