"""`ctxlock batch`: requests -> Parquet shards of input_ids and labels, a manifest and an errors file."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.render import JsonOpt, ModelOpt
from ctxlock.errors import InputError

EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="local: worker processes on this machine. ray: Ray tasks on a cluster (pip install 'ctxlock\\[ray]'); the "
        "same shards and manifest, byte for byte.",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        help="With --engine ray: the cluster to join ('auto', 'host:6379', 'ray://host:10001'); by default a local "
        "Ray is started for the job. The workers read the input and write OUT (each a path every node sees, or a "
        "pyarrow.fs URI: s3://, gs://, file://); this process handles only metadata.",
    ),
]
MaxLengthOpt = Annotated[
    int | None,
    typer.Option(
        "--max-length",
        help="Fit a row with more tokens (ctxlock fit: older history turns dropped, counted in the manifest's "
        "'fit'); a row whose system, tools and last turn alone are longer is an error row. Never cut mid-turn.",
    ),
]
PackOpt = Annotated[
    int | None,
    typer.Option(
        "--pack",
        help="Pack rows, in order within a shard, into sequences of at most this many tokens (position_ids "
        "restart per row; seq_lengths); a longer row is an error row.",
    ),
]

WorkersOpt = Annotated[
    int,
    typer.Option(
        "--workers",
        help="Worker processes: this one and N-1 more, forked after the model is loaded (spawned if a thread could "
        "be copied mid-state), one model each; with --engine ray, at most 2N shard tasks in flight, one CPU each.",
    ),
]
MessagesColumnOpt = Annotated[
    str,
    typer.Option(
        "--messages-column",
        help="Parquet input: the column holding each request's messages (read as 'messages'; the other columns "
        "are the request's other fields). Recorded in the manifest's policy when not 'messages'.",
    ),
]
TrajectoriesOpt = Annotated[
    bool,
    typer.Option(
        "--trajectories",
        help="Rows are trajectory lines (ctxlock trajectory's input: a request and steps of completion ids and new "
        "messages): shards of input_ids, labels, loss_mask, logprobs, step/part provenance, and the steps, forks "
        "and notes as JSON (docs/trajectories.md).",
    ),
]


def register(app: typer.Typer) -> None:
    app.command("batch")(batch)


def batch(
    source: Annotated[
        str,
        typer.Argument(
            help="Input: a .jsonl file (one request per line) or a .parquet file; with --engine ray also a pyarrow.fs "
            "URI (s3://bucket/in.jsonl, gs://..., file:///data/in.jsonl)."
        ),
    ],
    out: Annotated[
        str,
        typer.Argument(
            help="Output directory for the shards, manifest.json and errors.jsonl; with --engine ray also a pyarrow.fs "
            "URI (s3://bucket/prefix, gs://..., file:///data/out), written by the workers."
        ),
    ],
    model: ModelOpt = None,
    workers: WorkersOpt = 1,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
    max_length: MaxLengthOpt = None,
    shard_rows: Annotated[int, typer.Option("--shard-rows", help="Input rows per shard.")] = 10_000,
    pack: PackOpt = None,
    messages_column: MessagesColumnOpt = "messages",
    train_on_eot: Annotated[
        str, typer.Option("--train-on-eot", help="Train the end-of-turn token of: all turns, the last, none.")
    ] = "all",
    last_turn_only: Annotated[
        bool, typer.Option("--last-turn-only", help="Train only the last assistant turn of each row.")
    ] = False,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Keep the shards an earlier run finished that check out (regular files, digests, records, the same "
            "model, options and input rows); make the rest, saying why on stderr (docs/batch.md).",
        ),
    ] = False,
    trajectories: TrajectoriesOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Render a file of chat requests into training data: Parquet shards (zstd) of row, request_sha256, input_ids,
    labels (-100 where not trained: ctxlock's assistant-mask rule) and length; manifest.json (versions, template,
    tokenizer and policy digests, the input's sha256, each shard's sha256, rows and tokens); errors.jsonl (one line
    per row that could not be encoded). The same input gives byte-identical output for any --workers and either
    --engine. With --trajectories, each row is a trajectory line instead (docs/trajectories.md)."""
    from ctxlock.batch import BatchOptions, check_paths, run_batch  # the job (and pyarrow) load only for this command
    from ctxlock.training import MaskOptions  # with the job: `ctxlock --help` does not pay for it

    def go() -> dict[str, Any]:
        _check_options(source, out, workers, shard_rows, max_length, pack, engine, ray_address)
        if engine == "local":
            check_paths(_local(source), _local(out), resume)  # before the progress bar (Ray's workers check there)
        opts = BatchOptions(
            model=model,
            shard_rows=shard_rows,
            max_length=max_length,
            pack=pack,
            mask=MaskOptions(train_on_eot=train_on_eot, last_turn_only=last_turn_only),
            trajectories=trajectories,
            messages_column=messages_column,
        )
        run = None if engine == "local" else _ray_engine(ray_address, workers)
        with bar as (update, _):
            src: str | Path = source if run is not None else _local(source)
            dst: str | Path = out if run is not None else _local(out)
            return run_batch(src, dst, opts, workers=workers, resume=resume, on_progress=update, engine=run)

    bar = _ProgressBar(as_json)
    manifest = guarded(as_json, go)
    if bar.last is not None:
        _resume_note(bar.last)
    if as_json:
        print_json(manifest)
        return
    console.print(
        f"{manifest['rows']:,} rows: {manifest['row_count']:,} in {len(manifest['shards'])} shards, "
        f"{manifest['error_count']:,} in errors.jsonl · {manifest['token_count']:,} tokens, "
        f"{manifest['trained_tokens']:,} trained · {out.rstrip('/')}/manifest.json"
    )


def _check_options(
    source: str,
    out: str,
    workers: int,
    shard_rows: int,
    max_length: int | None,
    pack: int | None,
    engine: str,
    ray_address: str | None,
) -> None:
    """The options' own checks, before any file is opened."""
    if workers < 1 or shard_rows < 1 or any(n is not None and n < 1 for n in (max_length, pack)):
        raise InputError(
            "--workers, --shard-rows, --max-length and --pack must be positive",
            path="options",
            hint="e.g. --workers 2 --shard-rows 10000",
        )
    if engine not in ("local", "ray"):
        raise InputError(f"--engine is 'local' or 'ray', not {engine!r}", path="--engine", hint="e.g. --engine ray")
    if ray_address is not None and engine != "ray":
        raise InputError(
            "--ray-address goes with --engine ray",
            path="--ray-address",
            hint="e.g. --engine ray --ray-address auto",
        )
    if engine == "local":
        for where in (source, out):
            if "://" in where and not where.startswith("file://"):
                raise InputError(
                    f"the local engine reads and writes local files, not {where}",
                    path=where,
                    hint="give a local path, or --engine ray to read and write a URI in the workers",
                )


def _resume_note(progress: Any) -> None:
    """--resume: one line on stderr saying which started shards were made again and why, and which files of an
    earlier run beyond this input were removed (nothing a resume does is silent)."""
    parts = []
    if progress.remade:
        why = "; ".join(f"shard {k}: {v}" for k, v in sorted(progress.remade.items()))
        parts.append(f"made {len(progress.remade)} started shards again ({why})")
    if progress.removed:
        parts.append(
            f"removed {len(progress.removed)} files of shards beyond this input ({', '.join(progress.removed)})"
        )
    if parts:
        kept = f"kept {progress.shards_kept} of {progress.shards_done} shards"
        line = f"note: --resume {kept}; " + "; ".join(parts)
        print(" ".join(line.splitlines()), file=sys.stderr)


def _local(source: str) -> Path:
    """A local path (a file:// URI's path). A host other than localhost is refused (RFC 8089: a local file URI is
    `file:///path`, https://www.rfc-editor.org/rfc/rfc8089#section-2), not dropped: `file://out/x` is not `/x`."""
    from urllib.parse import unquote, urlparse

    if not source.startswith("file://"):
        return Path(source)
    parsed = urlparse(source)
    if parsed.netloc not in ("", "localhost"):
        raise InputError(
            f"{source} names the host {parsed.netloc!r}: a file URI's path starts at its third slash",
            path=source,
            hint="write file:///absolute/path, or give the path without file://",
        )
    return Path(unquote(parsed.path))


def _ray_engine(address: str | None, workers: int) -> Any:
    from ctxlock.batch._ray import ray_engine  # Ray loads only for --engine ray

    return ray_engine(address, workers)


class _ProgressBar:
    """A rich progress bar on stderr with rows/s and tokens/s (nothing with --json). It starts (and with it rich's
    refresh thread) at the first shard reported, after the job started its workers: a job forks them only while
    its process has no other thread (ctxlock.core)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.progress: Progress | None = None
        self.last: Any = None  # the job's last `ctxlock.batch.Progress`

    def __enter__(self) -> tuple[Any, Any]:
        if self.quiet:
            return (lambda p: setattr(self, "last", p)), None
        started = time.monotonic()
        task: list[Any] = []

        def update(p: Any) -> None:
            self.last = p
            if self.progress is None:
                self.progress = self._bar()
                self.progress.start()
                task.append(self.progress.add_task("batch", total=None, rows=0, rows_s=0.0, tok_s=0.0, errors=0))
            elapsed = max(time.monotonic() - started, 1e-9)
            self.progress.update(
                task[0], rows=p.rows, rows_s=p.rows / elapsed, tok_s=p.tokens / elapsed, errors=p.errors, advance=1
            )

        return update, task

    @staticmethod
    def _bar() -> Progress:
        return Progress(
            TextColumn("[bold]batch[/]"),
            BarColumn(),
            TextColumn(
                "{task.fields[rows]:,} rows · {task.fields[rows_s]:,.0f} rows/s · {task.fields[tok_s]:,.0f} tokens/s"
            ),
            TextColumn("· {task.fields[errors]:,} errors"),
            TimeElapsedColumn(),
            console=console.__class__(stderr=True),
            transient=False,
        )

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
