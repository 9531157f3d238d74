"""The shard table as `pa.array` builds it from Python values: the reference that `ctxlock.batch._run`'s column
builders must equal (`tests/batch/test_batch.py`, `tests/batch/test_shard_speedups.py`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa


def reference_table(kept: list[tuple[Any, ...]], pack: int | None) -> pa.Table:
    """The columns as `pa.array` builds them from Python values: what `batch._table` and `_packed_table` must equal."""
    list32 = pa.list_(pa.int32())
    if pack is None:
        return pa.table(
            {
                "row": pa.array([k[0] for k in kept], pa.int64()),
                "request_sha256": pa.array([k[1] for k in kept], pa.string()),
                "input_ids": pa.array([k[2] for k in kept], list32),
                "labels": pa.array([k[3] for k in kept], list32),
                "length": pa.array([len(k[2]) for k in kept], pa.int32()),
            }
        )
    packs: list[list[Any]] = []
    size = pack + 1
    for k in kept:
        if size + len(k[2]) > pack:
            packs.append([])
            size = 0
        packs[-1].append(k)
        size += len(k[2])
    return pa.table(
        {
            "row": pa.array([p[0][0] for p in packs], pa.int64()),
            "rows": pa.array([[k[0] for k in p] for p in packs], pa.list_(pa.int64())),
            "request_sha256": pa.array([[k[1] for k in p] for p in packs], pa.list_(pa.string())),
            "input_ids": pa.array([np.concatenate([k[2] for k in p]) for p in packs], list32),
            "labels": pa.array([np.concatenate([k[3] for k in p]) for p in packs], list32),
            "length": pa.array([sum(len(k[2]) for k in p) for p in packs], pa.int32()),
            "position_ids": pa.array(
                [np.concatenate([np.arange(len(k[2]), dtype=np.int32) for k in p]) for p in packs], list32
            ),
            "seq_lengths": pa.array([[len(k[2]) for k in p] for p in packs], list32),
        }
    )
