"""`ctxlock batch --trajectories`: trajectory lines (docs/trajectories.md, "The input") -> Parquet shards.

Each input row is one trajectory line (a JSONL line, a Parquet `request` string, or a Parquet row of columns:
`messages`, `tools`, `steps`, ...), built by `ctxlock.trajectory.build_line` exactly as `ctxlock trajectory` and
the Python API build it; a line that cannot be built is an error row. `trajectory_row(model, row, raw)` is one
row, a plain function that any engine can call where the rows are (it reads no module state); `trajectory_table`
makes a shard's table of the rows it gave. The mask rows' fast path (`batch._fast`) is not used: a trajectory's
ids are the engine's and the template's deltas, not one render of the request.

The columns (docs/batch.md, "Trajectories"): `row` (int64), `request_sha256` (of the line's canonical JSON: keys
sorted, no spaces), `input_ids` and `labels` (list<int32>: `labels` is the id where `loss_mask` is 1, else -100),
`loss_mask` (list<int8>), `logprobs` (list<double>, NaN where the line gave none, as in the Python API), `step`
(list<int32>) and `part` (list<int8>, an index into `PARTS`, which the policy records), `length` (int32), and
`steps`, `forks` and `notes` as JSON strings (the Python API's `to_dict()` forms).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxlock.batch._input import request_of
from ctxlock.errors import TrajectoryError
from ctxlock.trajectory import CAUSES, PARTS, TrajectoryResult, build_line, read_line

if TYPE_CHECKING:
    from ctxlock.model import Model

_IGNORE = -100
COLUMNS = (
    "row",
    "request_sha256",
    "input_ids",
    "labels",
    "loss_mask",
    "logprobs",
    "step",
    "part",
    "length",
    "steps",
    "forks",
    "notes",
)


@dataclass(frozen=True)
class TrajectoryRow:
    """One encoded row: its number, the digest of its line and its trajectory."""

    row: int
    request_sha256: str
    result: TrajectoryResult


def trajectory_row(model: Model, row: int, raw: Any) -> TrajectoryRow:
    """Row `row` of the input (`raw`: a JSONL line's bytes, a Parquet `request` string or a row of columns) as a
    trajectory; a `TrajectoryError` (or the `CtxlockError` of a refusing template) naming the JSON path when it
    cannot be built."""
    where = f"row {row}"
    raw = request_of(raw)
    if isinstance(raw, dict):
        raw = json.dumps(raw, ensure_ascii=False)
    if not isinstance(raw, bytes | str):
        raise TrajectoryError(f"a trajectory row is a JSON line, not {type(raw).__name__}", path=where)
    value = read_line(raw, where)
    digest = hashlib.sha256(
        json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8", "surrogatepass")
    ).hexdigest()
    return TrajectoryRow(row, digest, build_line(model, value, where))


@dataclass(frozen=True)
class TrajectoryShard:
    """A shard's table and what its record counts: tokens, trained tokens, the rows' notes and forks by cause."""

    table: Any
    token_count: int
    trained_tokens: int
    notes: list[str]
    forks: dict[str, int]


def trajectory_table(rows: list[TrajectoryRow]) -> TrajectoryShard:
    """The shard's table of its encoded rows, in row order."""
    import pyarrow as pa  # an optional extra: ctxlock[batch]

    results = [r.result for r in rows]
    lengths = np.fromiter((len(r.ids) for r in results), dtype=np.int64, count=len(results))
    offsets = np.zeros(len(results) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise TrajectoryError(
            f"a shard column holds {int(offsets[-1]):,} values, over the 2**31 - 1 a Parquet list column can offset",
            path="shard",
            hint="give a smaller --shard-rows",
        )
    offs = _array(offsets.astype(np.int32))

    def listed(arrays: list[np.ndarray], dtype: Any) -> Any:
        flat = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.empty(0, dtype=dtype)
        return pa.ListArray.from_arrays(offs, _array(flat))

    table = pa.Table.from_arrays(
        [
            _array(np.asarray([r.row for r in rows], dtype=np.int64)),
            _strings([r.request_sha256 for r in rows]),
            listed([r.ids for r in results], np.int32),
            listed([np.where(r.loss_mask == 1, r.ids, _IGNORE) for r in results], np.int32),
            listed([r.loss_mask for r in results], np.int8),
            listed([r.logprobs for r in results], np.float64),
            listed([r.step for r in results], np.int32),
            listed([r.part for r in results], np.int8),
            _array(lengths.astype(np.int32)),
            _strings([_json([s.to_dict() for s in r.steps]) for r in results]),
            _strings([_json([f.to_dict() for f in r.forks]) for r in results]),
            _strings([_json(list(r.notes)) for r in results]),
        ],
        names=list(COLUMNS),
    )
    causes: Counter[str] = Counter(f.cause for r in results for f in r.forks)
    return TrajectoryShard(
        table=table,
        token_count=int(lengths.sum()),
        trained_tokens=int(sum(int(r.loss_mask.sum()) for r in results)),
        notes=sorted({n for r in results for n in r.notes}),
        forks={c: causes[c] for c in CAUSES},
    )


# Arrays from numpy buffers, not `pa.array`: `pa.array` imports pandas on its first call (about 0.5 s a worker).


def _array(values: np.ndarray) -> Any:
    import pyarrow as pa

    data = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(data.dtype), len(data), [None, pa.py_buffer(data)])


def _strings(values: list[str]) -> Any:
    import pyarrow as pa

    encoded = [v.encode("utf-8", "surrogatepass") for v in values]
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(values), buffers)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def policy() -> dict[str, Any]:
    """What `--trajectories` adds to the job's policy (and so to its digest): the flag and the parts' names."""
    return {"trajectories": True, "trajectory_parts": list(PARTS)}


__all__ = ["COLUMNS", "TrajectoryRow", "TrajectoryShard", "policy", "trajectory_row", "trajectory_table"]
