"""A shard's Parquet bytes: its kept rows as whole columns built from numpy buffers, and the one Parquet writer
both engines use (zstd level 3, no dictionary, the Arrow schema stored, the shard's record in the footer)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctxlock.batch._output import RECORD_KEY
from ctxlock.errors import CtxlockError

IGNORE = -100  # the labels' value where the mask is 0
# An encoded row: (row, request_sha256, input_ids, labels, the kept messages' indexes when fitted, else None).
Row = tuple[int, str, np.ndarray, np.ndarray, tuple[int, ...] | None]


@dataclass(frozen=True)
class Columns:
    """A shard's kept rows as whole columns: their numbers and digests, every row's ids end to end (int32), its
    labels the same way, and each row's length. Built once per shard (one concatenation, labels by one `np.where`),
    not row by row; the tables are those the rows' own arrays give (tests/batch/test_shard_speedups.py)."""

    rows: list[int]
    digests: list[str]
    ids: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of_masks(cls, kept: list[tuple[int, str, np.ndarray, np.ndarray, Any]]) -> Columns:
        """From (row, digest, ids, 0/1 mask, ...) rows: labels are the ids where the mask is 1, else -100."""
        ids = _joined([k[2] for k in kept])
        mask = _joined([k[3] for k in kept], np.int64)
        labels = np.where(mask == 1, ids, IGNORE).astype(np.int32, copy=False)
        return cls([k[0] for k in kept], [k[1] for k in kept], ids, labels, _lengths(kept))

    @classmethod
    def of_rows(cls, kept: list[Row]) -> Columns:
        """From `Row`s (row, digest, ids, labels, ...)."""
        ids, labels = _joined([k[2] for k in kept]), _joined([k[3] for k in kept])
        return cls([k[0] for k in kept], [k[1] for k in kept], ids, labels, _lengths(kept))

    def table(self) -> Any:
        import pyarrow as pa

        offsets = _offsets(self.lengths)
        return pa.Table.from_arrays(
            [
                _ints(self.rows, np.int64),
                strings(self.digests),
                pa.ListArray.from_arrays(offsets, _flat(self.ids)),
                pa.ListArray.from_arrays(offsets, _flat(self.labels)),
                _ints(self.lengths, np.int32),
            ],
            names=["row", "request_sha256", "input_ids", "labels", "length"],
        )

    def packed_table(self, pack: int) -> Any:
        """Rows packed greedily in row order, within the shard, into sequences of at most `pack` tokens: `row` is
        the first row's number, `rows` and `request_sha256` list each row's, `position_ids` restart at 0 for each
        row and `seq_lengths` are the rows' lengths. A pack is a run of consecutive rows: its ids are a slice of
        the shard's."""
        import pyarrow as pa

        per_pack: list[int] = []  # rows in each pack
        sizes: list[int] = []  # tokens in each pack
        firsts: list[int] = []  # each pack's first row's number
        size = pack + 1
        for row, n in zip(self.rows, self.lengths.tolist(), strict=True):
            if size + n > pack:
                per_pack.append(0)
                sizes.append(0)
                firsts.append(row)
                size = 0
            per_pack[-1] += 1
            sizes[-1] += n
            size += n
        offsets = _offsets(sizes)
        starts = np.zeros(len(self.lengths), dtype=np.int64)
        np.cumsum(self.lengths[:-1], out=starts[1:])
        positions = (np.arange(len(self.ids), dtype=np.int64) - np.repeat(starts, self.lengths)).astype(np.int32)
        return pa.Table.from_arrays(
            [
                _ints(firsts, np.int64),
                _nest(_ints(self.rows, np.int64), per_pack),
                _nest(strings(self.digests), per_pack),
                pa.ListArray.from_arrays(offsets, _flat(self.ids)),
                pa.ListArray.from_arrays(offsets, _flat(self.labels)),
                _ints(sizes, np.int32),
                pa.ListArray.from_arrays(offsets, _flat(positions)),
                _nest(_ints(self.lengths, np.int32), per_pack),
            ],
            names=["row", "rows", "request_sha256", "input_ids", "labels", "length", "position_ids", "seq_lengths"],
        )


def _joined(arrays: list[Any], dtype: Any = np.int32) -> np.ndarray:
    """The arrays end to end, as `dtype` (int32 ids and labels, int64 masks)."""
    if not arrays:
        return np.empty(0, dtype=dtype)
    return np.concatenate(arrays).astype(dtype, copy=False)


def _lengths(kept: list[Any]) -> np.ndarray:
    return np.fromiter((len(k[2]) for k in kept), dtype=np.int64, count=len(kept))


def table_of(kept: list[Row]) -> Any:
    """The shard's table of `Row`s."""
    return Columns.of_rows(kept).table()


def packed_table(kept: list[Row], pack: int) -> Any:
    """The shard's packed table of `Row`s (`Columns.packed_table`)."""
    return Columns.of_rows(kept).packed_table(pack)


# The columns are built from numpy buffers (`pa.Array.from_buffers`, `pa.ListArray.from_arrays` over int32
# offsets), not with `pa.array` on Python objects: `pa.array` imports pandas on its first call (0.5 s in a worker,
# over 1 s without a bytecode cache), and the arrays, so the Parquet bytes, are the same (tests/batch/test_batch.py).


def _ints(values: Any, dtype: Any) -> Any:
    """int64 or int32 (`dtype`, numpy's) of these values."""
    import pyarrow as pa

    data = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(pa.from_numpy_dtype(data.dtype), len(data), [None, pa.py_buffer(data)])


def _offsets(lengths: Any) -> Any:
    """int32 offsets of consecutive items of these lengths; over 2**31 - 1 in all is a `ShardTooBig` error."""
    import pyarrow as pa

    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    if len(ends) and ends[-1] > np.iinfo(np.int32).max:
        raise ShardTooBig(int(ends[-1]))
    out = np.zeros(len(ends) + 1, dtype=np.int32)
    out[1:] = ends
    return pa.Array.from_buffers(pa.int32(), len(out), [None, pa.py_buffer(out)])


def _flat(values: np.ndarray) -> Any:
    """int32 of these int32 values."""
    import pyarrow as pa

    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(np.ascontiguousarray(values))])


def _nest(flat: Any, lengths: list[int]) -> Any:
    """list<flat's type>: consecutive runs of `flat` of these lengths."""
    import pyarrow as pa

    return pa.ListArray.from_arrays(_offsets(lengths), flat)


def strings(values: list[str]) -> Any:
    import pyarrow as pa

    encoded = [v.encode("utf-8") for v in values]
    ends = np.cumsum([len(e) for e in encoded], dtype=np.int64)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    offsets[1:] = ends
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(values), buffers)


class ShardTooBig(CtxlockError):
    def __init__(self, n: int) -> None:
        super().__init__(
            f"a shard column holds {n:,} values, over the 2**31 - 1 a Parquet list<int32> column can offset",
            path="shard",
            hint="give a smaller --shard-rows",
        )


def parquet_bytes(table: Any, record: dict[str, Any] | None = None) -> bytes:
    """The one Parquet writer of both engines (zstd level 3, no dictionary, the Arrow schema stored), with the
    shard's record in the footer's key-value metadata (`batch_output.RECORD_KEY`: what a resume reads back)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    options = {"compression": "zstd", "compression_level": 3, "use_dictionary": False, "store_schema": True}
    with pq.ParquetWriter(sink, table.schema, **options) as writer:
        writer.write_table(table)
        if record is not None:
            writer.add_key_value_metadata({RECORD_KEY: json.dumps(record, ensure_ascii=False, sort_keys=True)})
    return sink.getvalue().to_pybytes()


__all__ = ["IGNORE", "Columns", "Row", "ShardTooBig", "packed_table", "parquet_bytes", "strings", "table_of"]
