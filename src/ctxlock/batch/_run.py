"""`ctxlock batch`: a file of requests -> Parquet shards of `input_ids` and `labels`, a manifest, an errors file.

The job (`run_batch`), in order:

- **Input**: JSONL (one request per line, either dialect) or Parquet (a `request` column of JSON strings, or one
  column per request field: `messages`, `tools`, ...). Row numbers count from 0 in file order; a blank JSONL line is
  a row (an error row). The input is read in shards of `shard_rows` rows and never held whole in memory.
- **Rows**: each row is parsed, rendered, tokenized and masked exactly as
  `Model.encode(..., return_assistant_tokens_mask=
  True)` does (`ctxlock.training`; `add_generation_prompt` False). `labels` are the ids where the mask is 1 and -100
  elsewhere. A row that fails (bad JSON, a template refusal, nothing to train on) is an error row: `{row, type,
  path, message}` in `errors.jsonl`, never dropped silently. With `trajectories` each row is a trajectory line
  instead, built by `batch._trajectories.trajectory_row` (docs/trajectories.md), and its shard has that module's
  columns; the rest of the job is the same.
- **`max_length`**: a row over it is fitted (`budget.fit_context`, no generation prefix: the system messages, tools
  and current turn are required; the kept history is a contiguous most-recent suffix of turns) and then
  masked; a row whose required part alone is over it is an error row (`BudgetExceeded`, the fit's message). The
  manifest's `fit` counts rows kept whole, fitted and over, and the fit decisions per kind (`history dropped`, ...);
  each shard's record lists its fitted rows with the indexes of the messages they kept (`fitted`).
  `request_sha256` stays the digest of the row as given. `pack` alone: a row longer than it is an error row.
- **Shards**: shard k holds rows [k*shard_rows, (k+1)*shard_rows): `shard-00000.parquet` (zstd), columns `row`
  (int64), `request_sha256` (of the canonical request), `input_ids` and `labels` (list<int32>), `length` (int32).
  The shards depend on the input and the options only, never on `workers`: the same input gives byte-identical
  shards and manifest.
- **Resumable**: a shard is written under a temporary name and renamed into place; then its record
  (`shard-00000.json`: digest, rows, tokens, its error rows, its input rows' sha256, the job's digests; the same
  record is in the Parquet file's footer) is written the same way. `resume=True` keeps a shard only when it passes
  every check of `ctxlock.batch` (a regular file of its own name, its sha256, its record equal to its
  footer's, its row range and counts, the same job and the same input rows), and makes the others again, saying
  why (`Progress.remade`); an earlier run's shards beyond this input are removed. `manifest.json` and
  `errors.jsonl` are written last, from the kept and made records, and only when the input did not change while
  the job ran. docs/batch.md.
- **Workers**: `workers` processes: the job's own and N - 1 more, forked after the model is loaded when the job's
  process has no other thread (`ctxlock.core`; never `fork` after threads), else spawned, each then loading
  the model once. Each runs its tokenizer single-threaded (`RAYON_NUM_THREADS=1`, `TOKENIZERS_PARALLELISM=false`,
  `OMP_NUM_THREADS=1`): parallelism is across processes. The job's own process encodes shards too (as it does
  alone with `workers` 1). At most two shards per started worker are in flight. The parent hands out where each
  shard is in the input (`plan_shards`) and each worker reads its own rows (`read_spec`).
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctxlock.batch._fast import MaskedRow, mask_rows
from ctxlock.batch._input import (
    MESSAGES,
    ShardSpec,
    check_columns,
    input_digest,
    plan_shards,
    read_shards,
    read_spec,
    request_of,
    rows_sha256,
    sha256_file,
)
from ctxlock.batch._output import (
    Out,
    Resume,
    clean,
    json_bytes,
    one_job,
    out_dir,
    put,
    record_file,
    remove_stale,
    shard_file,
    write_manifest,
)
from ctxlock.batch._tables import IGNORE, Columns, parquet_bytes
from ctxlock.batch._trajectories import policy as trajectory_policy
from ctxlock.batch._trajectories import trajectory_row, trajectory_table
from ctxlock.budget import BudgetPolicy, Fitted, fit_context
from ctxlock.caches import LRU
from ctxlock.core import die_with_parent, start_method
from ctxlock.errors import BudgetError, CtxlockError, InputError
from ctxlock.model import Model, load
from ctxlock.tokenizer import ENCODE_THREADS
from ctxlock.training import MaskOptions, assistant_mask

SCHEMA_VERSION = 1
# A worker's thread policy: one tokenizer thread (rayon, OpenMP), and no second thread for a long text's half.
THREADS = {
    "RAYON_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    ENCODE_THREADS: "1",
}


@dataclass(frozen=True)
class BatchOptions:
    """What a job is: everything that changes the shards (and so is recorded in the manifest as the policy)."""

    model: str | None = None
    shard_rows: int = 10_000
    max_length: int | None = None
    pack: int | None = None
    mask: MaskOptions = field(default_factory=MaskOptions)
    # Parquet input: the column that holds each request's messages (--messages-column).
    messages_column: str = MESSAGES
    trajectories: bool = False  # rows are trajectory lines (docs/trajectories.md): `batch._trajectories`

    def __post_init__(self) -> None:
        if self.trajectories and (self.max_length is not None or self.pack is not None or self.mask != MaskOptions()):
            raise InputError(
                "--trajectories keeps each trajectory whole, as the engine saw it, with its own loss mask",
                path="--trajectories",
                hint="drop --max-length, --pack, --train-on-eot and --last-turn-only",
            )

    def policy(self) -> dict[str, Any]:
        extra = trajectory_policy() if self.trajectories else {}
        # A messages column other than the default is part of the policy (it chooses what is read); the default is
        # left out, so that the policy's digest of a job without the option is what it always was.
        column = {} if self.messages_column == MESSAGES else {"messages_column": self.messages_column}
        return {
            **column,
            "schema": SCHEMA_VERSION,
            "shard_rows": self.shard_rows,
            "max_length": self.max_length,
            "pack": self.pack,
            "add_generation_prompt": False,
            "mask": {
                "roles": list(self.mask.roles),
                "train_on_eot": self.mask.train_on_eot,
                "last_turn_only": self.mask.last_turn_only,
                "source": self.mask.source,
            },
            "labels_ignore_index": IGNORE,
            **extra,
        }


@dataclass
class Progress:
    """Counts the job reports as it goes (`on_progress` gets it after every shard)."""

    rows: int = 0
    tokens: int = 0
    errors: int = 0
    shards_done: int = 0
    shards_kept: int = 0
    # --resume: the started shards made again, each with why (`batch_output.Resume`), and the earlier run's shard
    # files removed because this input has fewer shards.
    remade: dict[int, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)


# -- one shard (in a worker) -------------------------------------------------------------------------------------

# The model a process encodes with, loaded once per process (a worker's initializer, or the first local shard).
_MODELS: LRU[str, Model] = LRU("batch.models", max_items=2, scope="artifact")


def load_model(spec: str | None) -> Model:
    """The model this process encodes with (loaded once per process, kept in the `batch.models` cache)."""
    key = "" if spec is None else spec
    hit = _MODELS.get(key)
    if hit is None:
        hit = load(spec)
        _MODELS.put(key, hit)
    return hit


def init_worker(model: str | None, parent: int | None = None) -> None:
    """A worker process's start: dying with the job's process `parent` (even when it is SIGKILLed; a Ray actor has
    none), one tokenizer thread (parallelism is across processes), then the model (a forked worker has it)."""
    if parent is not None:
        die_with_parent(parent)
    os.environ.update(THREADS)
    load_model(model)


def _encode_row(
    model: Model, raw: Any, masked: MaskedRow | CtxlockError, opts: BatchOptions, notes: set[str], fits: Counter[str]
) -> tuple[str, np.ndarray, np.ndarray, tuple[int, ...] | None]:
    """One row of `mask_rows` (ctxlock.batch: parse, render, encode, mask, as `Model.encode` does) -> its
    digest (of the row as given, fitted or not), ids, labels, and the kept messages' indexes when the row was
    fitted over --max-length, else None; its error raised. The ids and mask are the row's own arrays: the shard
    makes its int32 ids and its labels once for all its rows (`Columns`)."""
    if isinstance(masked, CtxlockError):
        raise masked
    ids_seq, mask_arr, row_notes = masked.ids, masked.mask, masked.notes
    kept_messages: tuple[int, ...] | None = None
    if opts.max_length is not None:
        if len(ids_seq) > opts.max_length:
            fitted = _fit(model, model.parse(request_of(raw)), opts.max_length, fits)
            kept_messages = fitted.kept_messages
            lay, mask = assistant_mask(model, fitted.request, opts.mask, add_generation_prompt=False)
            ids_seq, mask_arr, row_notes = lay.ids, mask.mask, mask.notes
        else:
            fits["rows_whole"] += 1
    notes.update(row_notes)
    if opts.pack is not None and len(ids_seq) > opts.pack:
        raise _TooLong(len(ids_seq), opts.pack)
    return masked.request_sha256, ids_seq, mask_arr, kept_messages


def _fit(model: Model, request: Any, max_length: int, fits: Counter[str]) -> Fitted:
    """`budget.fit_context` of a row over `max_length` (no generation prefix: training data); its decisions are
    counted per kind (`history kept`, `history dropped`, ...). Required segments over the length raise
    BudgetExceeded: the row is an error row."""
    policy = BudgetPolicy(max_input_tokens=max_length, generation_prefix="none")
    try:
        fitted = fit_context(request, model, policy, add_generation_prompt=False)
    except BudgetError:
        fits["rows_over"] += 1
        raise
    fits["rows_fitted"] += 1
    for d in fitted.decisions:
        if d.kind != "generation":  # not a segment: with no generation prefix its row says "none"
            fits[f"{d.kind} {'kept' if d.kept else 'dropped'}"] += 1
    return fitted


class _TooLong(CtxlockError):
    def __init__(self, n: int, limit: int) -> None:
        super().__init__(
            f"the row is {n:,} tokens, over the --pack length of {limit:,}",
            path="input_ids",
            hint="raise --pack, or give --max-length to fit each row (ctxlock fit) to at most that many tokens",
        )


def _error_row(row: int, exc: CtxlockError) -> dict[str, Any]:
    kind = "TooLongError" if isinstance(exc, _TooLong) else type(exc).__name__
    return {"row": row, "type": kind, "path": exc.path, "message": exc.message}


def encode_shard(index: int, rows: list[tuple[int, Any]], out: str, opts: BatchOptions) -> dict[str, Any]:
    """Encode one shard's rows and write its Parquet file and record (atomically) in `out` (a path, or a
    `pyarrow.fs` URI: `batch.out_dir`); return the record."""
    data, record = shard_bytes(index, rows, opts)
    return write_shard(out_dir(out), data, record)


def shard_bytes(index: int, rows: list[tuple[int, Any]], opts: BatchOptions) -> tuple[bytes, dict[str, Any]]:
    """One shard's Parquet bytes and its record (without the file's sha256, which `write_shard` adds): what both
    engines compute where the rows are, and the writer then puts on disk."""
    model = load_model(opts.model)
    kept: list[tuple[int, str, np.ndarray, np.ndarray, tuple[int, ...] | None]] = []  # Row with the mask, not labels
    errors: list[dict[str, Any]] = []
    notes: set[str] = set()  # what the masks say a reader must know (ctxlock.training.Mask.notes)
    fits: Counter[str] = Counter()  # --max-length: rows whole, fitted, over; fit decisions per kind
    extra: dict[str, Any] = {}
    if opts.trajectories:  # trajectory lines: each row built by `trajectory_row`, never the mask rows' fast path
        built = []
        for row, raw in rows:
            try:
                built.append(trajectory_row(model, row, raw))
            except CtxlockError as exc:
                errors.append(_error_row(row, exc))
        shard = trajectory_table(built)
        table, tokens, trained, extra = shard.table, shard.token_count, shard.trained_tokens, {"forks": shard.forks}
        notes.update(shard.notes)
    else:
        masked = mask_rows(model, [request_of(raw) for _, raw in rows], opts.mask)
        for (row, raw), result in zip(rows, masked, strict=True):
            try:
                kept.append((row, *_encode_row(model, raw, result, opts, notes, fits)))
            except CtxlockError as exc:
                errors.append(_error_row(row, exc))
        columns = Columns.of_masks(kept)
        table = columns.packed_table(opts.pack) if opts.pack else columns.table()
        tokens, trained = len(columns.ids), int(np.count_nonzero(columns.labels != IGNORE))
    record = {
        "index": index,
        "file": shard_file(index),
        "job": _job(model, opts),
        "rows": [rows[0][0], rows[-1][0] + 1],
        "input_sha256": rows_sha256(rows),
        "row_count": len(rows) - len(errors),
        "error_count": len(errors),
        "token_count": tokens,
        "trained_tokens": trained,
        "sequence_count": table.num_rows,
        "notes": sorted(notes),
        "errors": errors,
        **extra,
    }
    if opts.max_length is not None:
        record["fit"] = dict(sorted(fits.items()))
        # Which rows were fitted, and the indexes of the input messages each one kept (the rest were dropped).
        record["fitted"] = [{"row": k[0], "kept_messages": list(k[4])} for k in kept if k[4] is not None]
    return parquet_bytes(table, record), record


def write_shard(out: Out, data: bytes, record: dict[str, Any]) -> dict[str, Any]:
    """Write a shard's Parquet bytes, then its record with their sha256, each under a temporary name renamed into
    place (a shard counts as done only once its record is there); return the record."""
    record = {**record, "sha256": hashlib.sha256(data).hexdigest()}
    put(out, shard_file(record["index"]), data)
    put(out, record_file(record["index"]), json_bytes(record))
    return record


def _job(model: Model, opts: BatchOptions) -> dict[str, Any]:
    """What made a shard: the model's digests and the policy's (every shard of one output must have the same)."""
    templates = model.templates
    return {
        "model": model.id,
        "template_sha256": {}
        if templates is None
        else {n: t.sha256 for n, t in zip(templates.names, templates.templates, strict=True)},
        "tokenizer_sha256": model.tokenizer.sha256,
        "policy_sha256": hashlib.sha256(json_bytes(opts.policy())).hexdigest(),
    }


# -- the job ----------------------------------------------------------------------------------------------------


def kept_spec(resume: Resume | None, source: Path, spec: ShardSpec, column: str = MESSAGES) -> dict[str, Any] | None:
    """With `resume`, shard `spec`'s record when it passes every check (`batch_output.Resume`; its input rows read
    only to compare their sha256, after everything else held), else None."""
    if resume is None:
        return None
    return resume.kept(
        spec.index, (spec.first_row, spec.stop_row), lambda: rows_sha256(read_spec(source, spec, column))
    )


# Another engine runs the whole job where the data lives (`ctxlock.batch._ray`): (source, out, options, resume,
# on_progress) -> the manifest, with `source` a path or a `pyarrow.fs` URI, reporting each shard to a `Tally`. The
# local one is `run_batch`'s own.
Engine = Callable[[str, str, BatchOptions, bool, Callable[[Progress], None] | None], dict[str, Any]]


class Tally:
    """The shards' records as they come (kept by a resume or made), counted into a `Progress` for `on_progress`."""

    def __init__(self, on_progress: Callable[[Progress], None] | None, remade: dict[int, str] | None = None) -> None:
        self.progress = Progress(remade={} if remade is None else remade)
        self.records: dict[int, dict[str, Any]] = {}
        self.on_progress = on_progress

    def done(self, record: dict[str, Any], kept: bool) -> None:
        progress = self.progress
        self.records[record["index"]] = record
        progress.rows += record["row_count"] + record["error_count"]
        progress.tokens += record["token_count"]
        progress.errors += record["error_count"]
        progress.shards_done += 1
        progress.shards_kept += kept
        if self.on_progress is not None:
            self.on_progress(progress)

    def sorted_records(self) -> list[dict[str, Any]]:
        return [self.records[k] for k in sorted(self.records)]


def run_batch(
    source: Path | str,
    out: Path | str,
    opts: BatchOptions,
    *,
    workers: int = 1,
    resume: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """Run the job (module docstring); return the manifest. `out` must be empty or absent unless `resume`.
    `engine`: another engine (`ctxlock.batch.ray_engine`: it does the whole job where the data lives, `source`
    and `out` then paths its workers see, or `source` a `pyarrow.fs` URI); by default `workers` local processes."""
    if engine is not None:
        return engine(str(source), str(out), opts, resume, on_progress)
    for where in (str(source), str(out)):
        if "://" in where:
            raise InputError(
                f"the local engine reads and writes local paths, not {where}",
                path=where,
                hint="give a local path, or use the Ray engine (its workers open pyarrow.fs URIs: docs/batch-ray.md)",
            )
    source, out = Path(source), Path(out)
    check_paths(source, out, resume)
    check_columns(source, opts.messages_column)
    out.mkdir(parents=True, exist_ok=True)
    clean(out)  # a killed run's half-written files
    digest = input_digest(source)
    check = Resume(out, _job(load_model(opts.model), opts)) if resume else None
    tally = Tally(on_progress, None if check is None else check.remade)
    progress, done = tally.progress, tally.done
    if workers <= 1:
        load_model(opts.model)
        for index, rows in enumerate(read_shards(source, opts.shard_rows, opts.messages_column)):
            span = (rows[0][0], rows[-1][0] + 1)
            finished = None if check is None else check.kept(index, span, lambda rows=rows: rows_sha256(rows))
            done(finished or encode_shard(index, rows, str(out), opts), finished is not None)
    else:
        with _one_encode_thread():
            _run_pool(source, out, opts, workers, check, done)
    if check is not None:
        progress.removed += remove_stale(out, len(tally.records))
    if input_digest(source) != digest:
        raise changed_input(source.name, str(source))
    return write_job_manifest(digest, out, opts, tally.sorted_records())


def changed_input(name: str, path: str) -> InputError:
    return InputError(
        f"{name} changed while the job ran: its shards may hold rows of either version",
        path=path,
        hint="run the same command again with --resume (only the shards whose rows changed are made again)",
    )


@contextlib.contextmanager
def _one_encode_thread() -> Iterator[None]:
    """While this process is one of the job's workers: no second encoding thread (`prefix.helper_thread_allowed`),
    as in the other workers; the caller's setting is restored after."""
    saved = os.environ.get(ENCODE_THREADS)
    os.environ[ENCODE_THREADS] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(ENCODE_THREADS, None)
        else:
            os.environ[ENCODE_THREADS] = saved


def _run_pool(
    source: Path,
    out: Path,
    opts: BatchOptions,
    workers: int,
    resume: Resume | None,
    done: Callable[[dict[str, Any], bool], None],
) -> None:
    """The shards on `workers` processes: `workers - 1` started ones and this one, which has ctxlock imported and
    the model loaded already (a process less is a start-up less). The others are forked from this process after it
    loaded the model, when it has no other thread (`ctxlock.core`: they start at once, with the model), else
    spawned (each imports ctxlock and loads the model: about 1.2 s of CPU, measured). The parent hands out each
    shard's place in the input (`plan_shards`) and a worker reads its rows (`read_spec`, the rows `read_shards`
    gives), so the parent neither splits nor pickles rows. A started worker has at most two shards handed out
    ahead; the parent encodes a shard itself when the workers have theirs, and near the end leaves them no more
    than their share of what remains, so that all finish together."""
    todo: list[ShardSpec] = []
    kept: list[dict[str, Any]] = []
    for spec in plan_shards(source, opts.shard_rows):
        finished = kept_spec(resume, source, spec, opts.messages_column)
        if finished is not None:
            kept.append(finished)
        else:
            todo.append(spec)
    load_model(opts.model)  # before the workers start: a forked one has it already
    method, _ = start_method()
    others = workers - 1
    with ProcessPoolExecutor(
        others,
        mp_context=multiprocessing.get_context(method),
        initializer=init_worker,
        initargs=(opts.model, os.getpid()),
    ) as pool:
        pending: set[Future] = set()

        def collect(timeout: float | None) -> None:
            nonlocal pending
            finished_now, pending = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
            for f in finished_now:
                done(f.result(), False)

        for k, spec in enumerate(todo):
            if pending:
                collect(0)
            left = len(todo) - k  # this shard and the ones after it
            share = others * (left + len(pending)) / workers  # the spawned workers' share of the work still to do
            # With 2+ shards the first one always goes to the pool (share >= 1): a forked pool starts before this
            # process runs a shard (which may start threads: the fork is only taken while there are none).
            if len(pending) < 2 * others and len(pending) + 1 <= share:
                pending.add(pool.submit(encode_spec, str(source), spec, str(out), opts))
            else:
                done(encode_spec(str(source), spec, str(out), opts), False)
            if k == 0:
                report_kept(kept, done)
        if not todo:
            report_kept(kept, done)
        while pending:
            collect(None)


def report_kept(kept: list[dict[str, Any]], done: Callable[[dict[str, Any], bool], None]) -> None:
    """The finished shards `resume` kept, reported after the workers started (a progress bar's thread starts at
    the first report, and a fork is taken only while this process has no thread but one)."""
    for record in kept:
        done(record, True)


def encode_spec(source: str, spec: ShardSpec, out: str, opts: BatchOptions) -> dict[str, Any]:
    """`encode_shard` of the rows of `spec` (read here, in the worker)."""
    return encode_shard(spec.index, read_spec(Path(source), spec, opts.messages_column), out, opts)


def check_paths(source: Path, out: Path, resume: bool) -> None:
    """The job's input and output can be used (and pyarrow is installed): else an InputError, before any work."""
    try:
        import pyarrow  # noqa: F401  (an optional extra: ctxlock[batch])
    except ImportError:
        raise InputError(
            "pyarrow is not installed", path="ctxlock batch", hint="pip install 'ctxlock[batch]'"
        ) from None
    if not source.is_file():
        # A directory, a device or a FIFO (a link followed) is there but is no input to read.
        what = "no such input file" if not source.exists() else "not a regular file"
        raise InputError(f"{what}: {source}", path=str(source), hint="give a .jsonl or .parquet file")
    check_out(out, resume)


def check_out(out: Path, resume: bool) -> None:
    """The output directory can be used: absent, or a directory that is empty unless `resume`."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory", path=str(out), hint="give a directory for the shards")
    if out.is_dir() and any(out.iterdir()) and not resume:
        raise InputError(
            f"{out} is not empty", path=str(out), hint="use --resume to finish a job there, or an empty directory"
        )


def job_of(opts: BatchOptions) -> dict[str, Any]:
    """The job a shard made now with `opts` records (model, template, tokenizer and policy digests)."""
    return _job(load_model(opts.model), opts)


def write_job_manifest(
    source: dict[str, Any], out: Out, opts: BatchOptions, records: list[dict[str, Any]]
) -> dict[str, Any]:
    """`batch_output.write_manifest` of these records (the job their records name; with none, the model's);
    `source` is the manifest's `input` (`batch.input_record`)."""
    job = one_job(out, records) if records else _job(load_model(opts.model), opts)
    return write_manifest(source, out, opts.policy(), job, records, opts.max_length is not None)


__all__ = [
    "THREADS",
    "BatchOptions",
    "Engine",
    "Progress",
    "ShardSpec",
    "Tally",
    "changed_input",
    "check_out",
    "check_paths",
    "encode_shard",
    "encode_spec",
    "init_worker",
    "job_of",
    "kept_spec",
    "load_model",
    "plan_shards",
    "read_shards",
    "read_spec",
    "run_batch",
    "sha256_file",
    "shard_bytes",
    "write_job_manifest",
    "write_shard",
]
