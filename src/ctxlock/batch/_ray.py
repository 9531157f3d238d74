"""`ctxlock batch --engine ray`: the job on a Ray cluster, read and written by the workers, the same bytes as local.

The driver (the process that calls `run_batch`) handles only metadata; every step that touches the input or the
output directory is a Ray task (`ctxlock.batch._dist`, one CPU each), so the driver needs neither the input nor
the output directory (tests/batch/test_batch_ray.py runs it in a mount namespace where both are hidden):

1. **probe** (one task): the input's size and kind, the Parquet row count from its footer; the output directory
   checked, created and cleaned; the job's digests (model, template, tokenizer, options).
2. **scan** (a task per `chunk_blocks` blocks of 1 MiB): each block's sha256 and, for JSONL, its newline count.
   The driver joins the block digests into the input's digest (`batch.input_record`, what the manifest records
   with either engine) and, by prefix sums of the newline counts, places every shard: the block where its first
   row starts and the newlines to skip from there. Row numbers are the input's own line numbers, so a bad line, a
   blank line or invalid UTF-8 stays an error row at its number (Ray Data's `read_json` parses lines itself: it
   fails the read on a broken line and adds keys to messages: tests/batch/test_batch_ray.py).
3. **shards** (a task per shard, at most `2 * workers` in flight): the worker reads its rows from the input,
   checks a `--resume` shard or encodes it with the local engine's code, and writes the Parquet file and its record
   (temporary name, rename). Only the record's counts and digests come back (`batch.slim`): the error rows stay
   in the record file.
4. **check and commit**: the blocks are digested again (scan tasks) and must give the same digest (else the input
   changed while the job ran: no manifest); then one task reads the record files (each with the sha256 its task
   sent back) and writes `errors.jsonl` and `manifest.json` from them (`batch.write_manifest`, as the local engine
   does).

The input and OUT may each be a `pyarrow.fs` URI (`batch.FsDir` for OUT: temporary name, then
`FileSystem.move`). Ray Core only: Ray Data's readers are not used (docs/batch-ray.md says why).

**Faults.** Every task may run twice: a worker process or a node lost mid-task makes Ray run it again
(`max_retries`, https://docs.ray.io/en/latest/ray-core/fault_tolerance/tasks.html), and a lost result is made
again from its lineage (https://docs.ray.io/en/latest/ray-core/fault_tolerance/objects.html). A shard task writes
the same bytes each time, by rename, so a retry leaves one whole file and the killed attempt at most a temporary
file, which the commit removes. A typed ctxlock error in a task (a bad `--model`, an output directory in the way)
is sent back as data and raised in the driver as itself; it is not retried.

`address`: `None` starts a local Ray for the job (and stops it after), `"auto"`, `"host:port"` or `ray://...`
joins a cluster; when Ray is already initialized in this process, the job uses it and leaves it running.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from typing import Any

from ctxlock.batch._dist import (
    Place,
    commit,
    is_uri,
    make_shard,
    plan_jsonl,
    plan_parquet,
    probe,
    scan,
    source_name,
)
from ctxlock.batch._input import BLOCK_BYTES, input_record
from ctxlock.batch._run import BatchOptions, Engine, Progress, Tally, changed_input
from ctxlock.errors import CtxlockError, InputError

# A task lost with its worker process or its node is run again up to this many times (Ray's default is 3).
RETRIES = 5


def _call(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """Run a step in a worker: its result, or its ctxlock error as data (a CtxlockError's keyword arguments do not
    survive pickling, and a deterministic error must not be retried)."""
    try:
        return "ok", fn(*args)
    except CtxlockError as exc:
        return "error", (type(exc).__module__, type(exc).__qualname__, exc.message, exc.path, exc.hint)


def _unwrap(result: tuple[str, Any]) -> Any:
    status, value = result
    if status == "ok":
        return value
    module, name, message, path, hint = value
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, CtxlockError)):
        cls = InputError
    exc = cls.__new__(cls)
    CtxlockError.__init__(exc, message, path=path, hint=hint)
    raise exc


def ray_engine(address: str | None = None, workers: int = 1, chunk_blocks: int = 64) -> Engine:
    """The engine `run_batch(..., engine=...)` runs (module docstring): at most `2 * workers` shard tasks in
    flight, the input scanned `chunk_blocks` MiB per task."""

    def run(
        source: str,
        out: str,
        opts: BatchOptions,
        resume: bool,
        on_progress: Callable[[Progress], None] | None,
    ) -> dict[str, Any]:
        ray = _ray()
        started = not ray.is_initialized()
        if started:
            _init(ray, address)
        try:
            return _Job(ray, source, out, opts, max(1, workers), max(1, chunk_blocks)).run(resume, on_progress)
        finally:
            if started:
                ray.shutdown()

    return run


class _Job:
    def __init__(self, ray: Any, source: str, out: str, opts: BatchOptions, workers: int, chunk_blocks: int) -> None:
        self.ray = ray
        # Paths are made absolute here (the driver's working directory; a string operation, nothing is opened).
        self.source = source if is_uri(source) else os.path.abspath(source)
        self.out = out if is_uri(out) else os.path.abspath(out)
        self.opts = opts
        self.workers = workers
        self.chunk_blocks = chunk_blocks
        self.task = ray.remote(num_cpus=1, max_retries=RETRIES, retry_exceptions=False)(_call)

    def get(self, fn: Callable[..., Any], *args: Any) -> Any:
        return _unwrap(self.ray.get(self.task.remote(fn, *args)))

    def scan(self, size: int, count_lines: bool) -> list[tuple[bytes, int, bool]]:
        blocks = -(-size // BLOCK_BYTES)
        step = self.chunk_blocks
        refs = [
            self.task.remote(scan, self.source, b, min(b + step, blocks), count_lines) for b in range(0, blocks, step)
        ]
        return [block for ref in refs for block in _unwrap(self.ray.get(ref))]

    def run(self, resume: bool, on_progress: Callable[[Progress], None] | None) -> dict[str, Any]:
        info = self.get(probe, self.source, self.out, resume, self.opts)
        parquet = info["parquet"]
        blocks = self.scan(info["size"], not parquet)
        digest = input_record(source_name(self.source), info["size"], [b[0] for b in blocks])
        places = (
            plan_parquet(info["rows"], self.opts.shard_rows) if parquet else plan_jsonl(blocks, self.opts.shard_rows)
        )
        tally = Tally(on_progress)
        self._shards(places, parquet, info["job"] if resume else None, tally)
        again = self.scan(info["size"], False)
        if [b[0] for b in again] != [b[0] for b in blocks]:
            raise changed_input(digest["file"], self.source)
        manifest, removed = self.get(commit, digest, self.out, self.opts, tally.sorted_records(), resume)
        tally.progress.removed += removed
        return manifest

    def _shards(self, places: list[Place], parquet: bool, job: dict[str, Any] | None, tally: Tally) -> None:
        """The shard tasks, at most `2 * workers` in flight, each result reported as it comes."""
        pending: list[Any] = []
        todo = iter(places)
        while True:
            while len(pending) < 2 * self.workers and (place := next(todo, None)) is not None:
                pending.append(self.task.remote(make_shard, self.source, place, parquet, self.out, self.opts, job))
            if not pending:
                return
            ready, pending = self.ray.wait(pending, num_returns=1)
            record, kept, why = _unwrap(self.ray.get(ready[0]))
            if why is not None:
                tally.progress.remade[record["index"]] = why
            tally.done(record, kept)


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
    except ImportError:
        raise InputError(
            "Ray is not installed", path="--engine ray", hint="pip install 'ctxlock[ray]' (ray[data]==2.60.0)"
        ) from None
    return ray


__all__ = ["RETRIES", "ray_engine"]
