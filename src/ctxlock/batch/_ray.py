"""`ctxlock batch --engine ray`: the same job on Ray Data, with the same shards and manifest as the local engine.

- **The dataset** is the job's shards, not its rows: `ray.data.from_items` of one `batch.ShardSpec` per shard that
  is not finished (its input rows, and for JSONL its byte range, from `batch.plan_shards`: a scan for line offsets,
  or the Parquet footer), one block each. Row numbers are the input's own, counted by the driver, so a bad line, a
  blank line or invalid UTF-8 stays an error row at its number (`ray.data.read_json` would parse the lines itself:
  it fails on a broken line, skips blank ones and numbers nothing). The input must be readable at the same path by
  every node (a shared filesystem); nothing is read whole.
- **`map_batches` with a callable class** (`ShardEncoder`, `batch_size=1`, `concurrency=workers` actors of one CPU
  each): each actor pins its tokenizer to one thread and loads the model once, in its constructor; each call reads
  its shard's rows (`batch.read_spec`, the same rows the local reader gives) and encodes them with the local
  engine's code (`batch.shard_bytes`: the same Parquet writer settings), returning the Parquet bytes, which carry
  the shard's record in their footer.
- **The driver** takes the results as they come (`iter_rows`; Ray Data streams with its own backpressure), reads
  each shard's record from its bytes' footer (`batch_output.record_of_bytes`, checked as a resume checks one) and
  writes them with the local engine's writer (`batch.write_shard`: temporary name, rename, then the record), so the
  output directory is on the driver only, and `--resume` works across engines. `run_batch` writes the manifest.

`address`: `None` starts a local Ray for the job (and stops it after), `"auto"` or `ray://...` joins a cluster; when
Ray is already initialized in this process (a test's `ray.init(num_cpus=2)`), the job uses it and leaves it running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np

from ctxlock.batch._output import Resume, record_of_bytes
from ctxlock.batch._run import (
    BatchOptions,
    Engine,
    ShardSpec,
    init_worker,
    kept_spec,
    plan_shards,
    read_spec,
    shard_bytes,
    write_shard,
)
from ctxlock.errors import InputError

_SPEC_FIELDS = tuple(f.name for f in fields(ShardSpec))


class ShardEncoder:
    """The Ray Data callable class: one per actor, one model per actor; a call encodes the shards in its batch."""

    def __init__(self, source: str, opts: BatchOptions) -> None:
        init_worker(opts.model)  # tokenizer threads pinned, then the model, once
        self.source = Path(source)
        self.opts = opts

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        index, data = [], []
        for k in range(len(batch["index"])):
            spec = ShardSpec(**{name: int(batch[name][k]) for name in _SPEC_FIELDS})
            blob, _ = shard_bytes(spec.index, read_spec(self.source, spec), self.opts)  # the record is in the blob
            index.append(spec.index)
            data.append(blob)
        return {"index": np.asarray(index, dtype=np.int64), "parquet": np.asarray(data, dtype=object)}


def ray_engine(address: str | None = None, workers: int = 1) -> Engine:
    """The engine `run_batch(..., engine=...)` runs: `workers` Ray actors (module docstring)."""

    def run(
        source: Path,
        out: Path,
        opts: BatchOptions,
        resume: Resume | None,
        done: Callable[[dict[str, Any], bool], None],
    ) -> None:
        ray = _ray()
        started = not ray.is_initialized()
        if started:
            _init(ray, address)
        try:
            todo = []
            for spec in plan_shards(source, opts.shard_rows):
                finished = kept_spec(resume, source, spec)
                if finished is not None:
                    done(finished, True)
                else:
                    todo.append(asdict(spec))
            if todo:
                _run(ray, todo, source, out, opts, workers, done)
        finally:
            if started:
                ray.shutdown()

    return run


def _run(
    ray: Any,
    todo: list[dict[str, int]],
    source: Path,
    out: Path,
    opts: BatchOptions,
    workers: int,
    done: Callable[[dict[str, Any], bool], None],
) -> None:
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # ctxlock's own bar shows rows/s and tokens/s
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # not a line per dataset on the command's stderr
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # nor "progress bars disabled"
    shards = ray.data.from_items(todo, override_num_blocks=len(todo))
    encoded = shards.map_batches(
        ShardEncoder,
        fn_constructor_args=(str(source.resolve()), opts),
        batch_size=1,
        # A fixed pool of actors, at most two shards in flight per actor (as the local engine): memory stays bounded.
        compute=ray.data.ActorPoolStrategy(size=min(workers, len(todo)), max_tasks_in_flight_per_actor=2),
        num_cpus=1,
        batch_format="numpy",
    )
    for row in encoded.iter_rows():
        data = bytes(row["parquet"])
        record = record_of_bytes(data, int(row["index"]))
        done(write_shard(out, data, {k: v for k, v in record.items() if k != "sha256"}), False)


def _init(ray: Any, address: str | None) -> None:
    """Start a local Ray, or join the cluster at `address`; a failure is one InputError, not Ray's traceback."""
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        first = (str(exc).splitlines() or [""])[0]
        raise InputError(
            f"Ray did not start or join a cluster: {type(exc).__name__}: {first}",
            path="--ray-address" if address else "--engine ray",
            hint="check --ray-address (e.g. 'auto' on a node of a running cluster), or drop it to start a local Ray",
        ) from None


def _ray() -> Any:
    try:
        import ray
        import ray.data  # the Data library is its own import
    except ImportError:
        raise InputError(
            "Ray Data is not installed", path="--engine ray", hint="pip install 'ctxlock[ray]' (ray[data]==2.60.0)"
        ) from None
    return ray


__all__ = ["ShardEncoder", "ray_engine"]
