"""`ctxlock batch`: a file of requests -> Parquet shards of `input_ids` and `labels`, a manifest, an errors file.

The job (`run_batch`), in order:

- **Input**: JSONL (one request per line, either dialect) or Parquet (a `request` column of JSON strings, or one
  column per request field: `messages`, `tools`, ...). Row numbers count from 0 in file order; a blank JSONL line is
  a row (an error row). The input is read in shards of `shard_rows` rows and never held whole in memory.
- **Rows**: each row is parsed, rendered, tokenized and masked exactly as `Model.encode(..., return_assistant_mask=
  True)` does (`ctxlock.masks`; `add_generation_prompt` False). `labels` are the ids where the mask is 1 and -100
  elsewhere. A row that fails (bad JSON, a template refusal, nothing to train on, longer than `max_length`) is an
  error row: `{row, type, path, message}` in `errors.jsonl`, never dropped silently.
- **Shards**: shard k holds rows [k*shard_rows, (k+1)*shard_rows): `shard-00000.parquet` (zstd), columns `row`
  (int64), `request_sha256` (of the canonical request), `input_ids` and `labels` (list<int32>), `length` (int32).
  The shards depend on the input and the options only, never on `workers`: the same input gives byte-identical
  shards and manifest.
- **Resumable**: a shard is written under a temporary name and renamed into place; then its record
  (`shard-00000.json`: digest, rows, tokens, its error rows) is written the same way. `resume=True` keeps a shard
  whose record exists and whose file has the recorded sha256, and makes the others again. `manifest.json` and
  `errors.jsonl` are written last, from the records.
- **Workers**: `workers` processes, started with `spawn` (never `fork` after threads), each loading the model once
  and running its tokenizer single-threaded (`RAYON_NUM_THREADS=1`, `TOKENIZERS_PARALLELISM=false`,
  `OMP_NUM_THREADS=1`): parallelism is across processes. At most two shards per worker are in flight.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from ._fast_batch import MaskedRow, mask_rows
from .caches import LRU
from .errors import CtxlockError, InputError
from .masks import MaskOptions
from .model import Model, load

SCHEMA_VERSION = 1
_THREADS = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
_IGNORE = -100


@dataclass(frozen=True)
class BatchOptions:
    """What a job is: everything that changes the shards (and so is recorded in the manifest as the policy)."""

    model: str | None = None
    shard_rows: int = 10_000
    max_length: int | None = None
    pack: int | None = None
    mask: MaskOptions = field(default_factory=MaskOptions)

    def policy(self) -> dict[str, Any]:
        return {
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
            "labels_ignore_index": _IGNORE,
        }


@dataclass
class Progress:
    """Counts the job reports as it goes (`on_progress` gets it after every shard)."""

    rows: int = 0
    tokens: int = 0
    errors: int = 0
    shards_done: int = 0
    shards_kept: int = 0


# -- reading the input -----------------------------------------------------------------------------------------


def _is_parquet(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == b"PAR1"


def read_shards(path: Path, shard_rows: int) -> Iterator[list[tuple[int, Any]]]:
    """The input's rows, `shard_rows` at a time: (row number, raw row) with the raw row a JSONL line's bytes or a
    Parquet row's dict."""
    rows = _parquet_rows(path) if _is_parquet(path) else _jsonl_rows(path)
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


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow.parquet as pq  # an optional extra: ctxlock[batch]

    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield n, row
            n += 1


def _request_of(raw: Any) -> Any:
    """A raw row -> what `Model.parse` takes: JSONL bytes as they are; a Parquet row's `request` JSON string, or
    its columns as a request object (None-valued columns dropped)."""
    if isinstance(raw, bytes):
        return raw
    if set(raw) == {"request"} or ("request" in raw and "messages" not in raw):
        return raw["request"]
    return {k: v for k, v in raw.items() if v is not None}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- one shard (in a worker) -------------------------------------------------------------------------------------

# The model a process encodes with, loaded once per process (a worker's initializer, or the first local shard).
_MODELS: LRU[str, Model] = LRU("batch.models", max_items=2, scope="artifact")


def _model(spec: str | None) -> Model:
    key = "" if spec is None else spec
    hit = _MODELS.get(key)
    if hit is None:
        hit = load(spec)
        _MODELS.put(key, hit)
    return hit


def _init_worker(model: str | None) -> None:
    os.environ.update(_THREADS)
    _model(model)


def _encode_row(
    masked: MaskedRow | CtxlockError, opts: BatchOptions, notes: set[str]
) -> tuple[str, np.ndarray, np.ndarray]:
    """One row of `mask_rows` (ctxlock._fast_batch: parse, render, encode, mask, as `Model.encode` does) -> its
    digest, ids and labels; its error raised."""
    if isinstance(masked, CtxlockError):
        raise masked
    notes.update(masked.notes)
    ids = np.asarray(masked.ids, dtype=np.int32)
    limits = [n for n in (opts.max_length, opts.pack) if n is not None]
    if limits and len(ids) > min(limits):
        raise _TooLong(len(ids), min(limits))
    labels = np.where(masked.mask == 1, ids, _IGNORE).astype(np.int32)
    return masked.request_sha256, ids, labels


class _TooLong(CtxlockError):
    def __init__(self, n: int, limit: int) -> None:
        super().__init__(
            f"the row is {n:,} tokens, over the limit of {limit:,} (--max-length or --pack)",
            path="input_ids",
            hint="raise --max-length, or fit the conversation first (ctxlock fit)",
        )


def _error_row(row: int, exc: CtxlockError) -> dict[str, Any]:
    kind = "TooLongError" if isinstance(exc, _TooLong) else type(exc).__name__
    return {"row": row, "type": kind, "path": exc.path, "message": exc.message}


def encode_shard(index: int, rows: list[tuple[int, Any]], out: str, opts: BatchOptions) -> dict[str, Any]:
    """Encode one shard's rows and write its Parquet file and record (atomically); return the record."""
    model = _model(opts.model)
    kept: list[tuple[int, str, np.ndarray, np.ndarray]] = []
    errors: list[dict[str, Any]] = []
    notes: set[str] = set()  # what the masks say a reader must know (ctxlock.masks.Mask.notes)
    masked = mask_rows(model, [_request_of(raw) for _, raw in rows], opts.mask)
    for (row, _), result in zip(rows, masked, strict=True):
        try:
            kept.append((row, *_encode_row(result, opts, notes)))
        except CtxlockError as exc:
            errors.append(_error_row(row, exc))
    table = _packed_table(kept, opts.pack) if opts.pack else _table(kept)
    name = f"shard-{index:05d}.parquet"
    digest = _write_parquet(table, Path(out) / name)
    record = {
        "index": index,
        "file": name,
        "sha256": digest,
        "rows": [rows[0][0], rows[-1][0] + 1],
        "row_count": len(kept),
        "error_count": len(errors),
        "token_count": int(sum(len(k[2]) for k in kept)),
        "trained_tokens": int(sum(int((k[3] != _IGNORE).sum()) for k in kept)),
        "sequence_count": table.num_rows,
        "notes": sorted(notes),
        "errors": errors,
    }
    _write_atomic(Path(out) / f"shard-{index:05d}.json", _json_bytes(record))
    return record


def _table(kept: list[tuple[int, str, np.ndarray, np.ndarray]]) -> Any:
    import pyarrow as pa

    list32 = pa.list_(pa.int32())
    return pa.table(
        {
            "row": pa.array([k[0] for k in kept], pa.int64()),
            "request_sha256": pa.array([k[1] for k in kept], pa.string()),
            "input_ids": pa.array([k[2] for k in kept], list32),
            "labels": pa.array([k[3] for k in kept], list32),
            "length": pa.array([len(k[2]) for k in kept], pa.int32()),
        }
    )


def _packed_table(kept: list[tuple[int, str, np.ndarray, np.ndarray]], pack: int) -> Any:
    """Rows packed greedily in row order, within the shard, into sequences of at most `pack` tokens: `row` is the
    first row's number, `rows` and `request_sha256` list each row's, `position_ids` restart at 0 for each row and
    `seq_lengths` are the rows' lengths."""
    import pyarrow as pa

    packs: list[list[tuple[int, str, np.ndarray, np.ndarray]]] = []
    size = pack + 1
    for k in kept:
        if size + len(k[2]) > pack:
            packs.append([])
            size = 0
        packs[-1].append(k)
        size += len(k[2])
    list32 = pa.list_(pa.int32())
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


def _write_parquet(table: Any, path: Path) -> str:
    import pyarrow.parquet as pq

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd", compression_level=3, use_dictionary=False, store_schema=True)
        digest = sha256_file(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return digest


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, ensure_ascii=False, sort_keys=True, indent=1) + "\n").encode("utf-8")


# -- the job ----------------------------------------------------------------------------------------------------


def _finished(out: Path, index: int) -> dict[str, Any] | None:
    """A shard's record when the shard is complete: the record is there and the file has its sha256."""
    try:
        record = json.loads((out / f"shard-{index:05d}.json").read_text("utf-8"))
        if sha256_file(out / record["file"]) == record["sha256"]:
            return record
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def run_batch(
    source: Path,
    out: Path,
    opts: BatchOptions,
    *,
    workers: int = 1,
    resume: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
) -> dict[str, Any]:
    """Run the job (module docstring); return the manifest. `out` must be empty or absent unless `resume`."""
    check_paths(source, out, resume)
    out.mkdir(parents=True, exist_ok=True)
    for leftover in out.glob(".shard-*.tmp"):  # a killed run's half-written files
        leftover.unlink()
    progress = Progress()
    records: dict[int, dict[str, Any]] = {}
    todo: Iterator[tuple[int, list[tuple[int, Any]]]] = enumerate(read_shards(source, opts.shard_rows))

    def done(record: dict[str, Any], kept: bool) -> None:
        records[record["index"]] = record
        progress.rows += record["row_count"] + record["error_count"]
        progress.tokens += record["token_count"]
        progress.errors += record["error_count"]
        progress.shards_done += 1
        progress.shards_kept += kept
        if on_progress is not None:
            on_progress(progress)

    if workers <= 1:
        _init_local(opts)
        for index, rows in todo:
            finished = _finished(out, index) if resume else None
            done(finished or encode_shard(index, rows, str(out), opts), finished is not None)
    else:
        _run_pool(todo, out, opts, workers, resume, done)
    return _write_manifest(source, out, opts, [records[k] for k in sorted(records)])


def _init_local(opts: BatchOptions) -> None:
    _model(opts.model)


def _run_pool(
    todo: Iterator[tuple[int, list[tuple[int, Any]]]],
    out: Path,
    opts: BatchOptions,
    workers: int,
    resume: bool,
    done: Callable[[dict[str, Any], bool], None],
) -> None:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(opts.model,)) as pool:
        pending: set[Future] = set()
        for index, rows in todo:
            finished = _finished(out, index) if resume else None
            if finished is not None:
                done(finished, True)
                continue
            pending.add(pool.submit(encode_shard, index, rows, str(out), opts))
            if len(pending) >= 2 * workers:  # bounded: the input is never read far ahead of the workers
                finished_now, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished_now:
                    done(f.result(), False)
        for f in pending:
            done(f.result(), False)


def check_paths(source: Path, out: Path, resume: bool) -> None:
    """The job's input and output can be used (and pyarrow is installed): else an InputError, before any work."""
    try:
        import pyarrow  # noqa: F401  (an optional extra: ctxlock[batch])
    except ImportError:
        raise InputError(
            "pyarrow is not installed", path="ctxlock batch", hint="pip install 'ctxlock[batch]'"
        ) from None
    if not source.is_file():
        raise InputError(f"no such input file: {source}", path=str(source), hint="give a .jsonl or .parquet file")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory", path=str(out), hint="give a directory for the shards")
    if out.is_dir() and any(out.iterdir()) and not resume:
        raise InputError(
            f"{out} is not empty", path=str(out), hint="use --resume to finish a job there, or an empty directory"
        )


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def _write_manifest(source: Path, out: Path, opts: BatchOptions, records: list[dict[str, Any]]) -> dict[str, Any]:
    errors = b"".join(
        (json.dumps(e, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8") for r in records for e in r["errors"]
    )
    _write_atomic(out / "errors.jsonl", errors)
    model = _model(opts.model)
    templates = model.templates
    policy = opts.policy()
    manifest = {
        "ctxlock_version": _version("ctxlock"),
        "pyarrow_version": _version("pyarrow"),  # the shards' bytes are pyarrow's writer's
        "model": model.id,
        "template_sha256": {}
        if templates is None
        else {n: t.sha256 for n, t in zip(templates.names, templates.templates, strict=True)},
        "tokenizer_sha256": model.tokenizer.sha256,
        "policy": policy,
        "policy_sha256": hashlib.sha256(_json_bytes(policy)).hexdigest(),
        "input": {"file": source.name, "sha256": sha256_file(source)},
        "rows": sum(r["row_count"] + r["error_count"] for r in records),
        "row_count": sum(r["row_count"] for r in records),
        "error_count": sum(r["error_count"] for r in records),
        "token_count": sum(r["token_count"] for r in records),
        "trained_tokens": sum(r["trained_tokens"] for r in records),
        "errors": {"file": "errors.jsonl", "sha256": hashlib.sha256(errors).hexdigest()},
        "notes": sorted({n for r in records for n in r.get("notes", ())}),
        "shards": [{k: v for k, v in r.items() if k != "errors"} for r in records],
    }
    _write_atomic(out / "manifest.json", _json_bytes(manifest))
    return manifest


__all__ = ["BatchOptions", "Progress", "check_paths", "encode_shard", "read_shards", "run_batch", "sha256_file"]
