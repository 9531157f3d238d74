"""`ctxlock records …`, `ctxlock replay` and `ctxlock diff`: the execution-record commands."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer
from rich.markup import escape
from rich.table import Table

from ctxlock.cli.files import check_record_arg, check_template_file, is_template_name, open_output, store_dir
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.render import MODEL_HELP, TEMPLATE_HELP
from ctxlock.errors import CtxlockError, InputError
from ctxlock.outside._files import open_regular, opened_input, stdin_stream
from ctxlock.records import DIVERGED, IDENTICAL, SAME_IDS, Diff, ExecutionRecord, diff
from ctxlock.records._bundle import MAGIC, import_bundle, is_bundle, prepare_bundle
from ctxlock.records._replay import load_record, record_values, replay, rerun
from ctxlock.records._store import Store

StoreOpt = Annotated[
    Path | None,
    typer.Option("--store", help="The record store directory (default: $CTXLOCK_DATA_DIR or ~/.local/share/ctxlock)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the human view.")]


def open_store(path: Path | None) -> Store:
    return Store(store_dir(path))


def record_at(spec: str, store: Store, *, option: str = "RECORD") -> ExecutionRecord:
    """A record by id, id prefix or file; a path that is a directory, FIFO or device is refused, not opened."""
    return load_record(check_record_arg(spec, option=option), store)


# The exit status of `replay` and `diff` for each outcome (`Diff.kind`); an error exits 1 as well, with one line.
EXIT_CODES = {IDENTICAL: 0, DIVERGED: 1, SAME_IDS: 3}


def show_fixture(fixture: Mapping[str, Any] | None) -> None:
    if fixture is not None:
        console.print(
            f"[bold green]fixture[/]  {escape(str(fixture['name']))}: "
            f"{len(fixture['ids'])} ids as expected, {fixture['ids']}"
        )


def show_ids(ids: Mapping[str, Any] | None) -> None:
    if ids is None:
        return
    if ids["equal"]:
        console.print(f"  ids     equal ({ids['a']}/{ids['b']})")
    elif ids["a"] is None or ids["b"] is None:
        console.print(f"  ids     only one run produced ids ({ids['a']} vs {ids['b']})")
    else:
        console.print(f"  ids     differ from token {ids['first_difference']} ({ids['a']} vs {ids['b']} ids)")


def show_diff(result: Diff, *, label_a: str, label_b: str) -> None:
    if result.identical:
        console.print(f"[bold green]identical[/]: {escape(label_a)} and {escape(label_b)} agree on every layer")
        show_ids(result.ids)
    else:
        d = result.first_divergence
        assert d is not None
        if result.kind == SAME_IDS:
            console.print("[bold yellow]same ids, different tokenizer artifacts[/] at layer [bold]tokenizer[/]")
        else:
            console.print(f"[bold red]first divergence[/] at layer [bold]{d.layer}[/]")
        show_ids(result.ids)
        console.print(f"  where   {escape(d.location)}")
        console.print(f"  {escape(label_a):8s}{escape(json.dumps(d.a, ensure_ascii=False))[:200]}")
        console.print(f"  {escape(label_b):8s}{escape(json.dumps(d.b, ensure_ascii=False))[:200]}")
        console.print(f"  cause   {escape(d.cause)}")
    for note in result.notes:
        console.print(f"  note    {escape(note)}")


def register(app: typer.Typer) -> None:
    records_app = typer.Typer(help="List, show, export and import execution records.", no_args_is_help=True)
    app.add_typer(records_app, name="records")
    records_app.command("list")(list_)
    records_app.command("show")(show)
    records_app.command("export")(export)
    records_app.command("import")(import_)
    app.command("replay")(replay_cmd)
    app.command("diff")(diff_cmd)


def list_(
    store: StoreOpt = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many, newest first.")] = 50,
    model: Annotated[
        str | None, typer.Option("--model", help="Only records of this model (its id, as `records list` shows it).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List stored records, newest first."""
    rows = guarded(as_json, lambda: open_store(store).list_records(limit=limit, model=model))
    if as_json:
        print_json(rows)
        return
    table = Table("id", "created", "model", "tokens", "template", "tokenizer")
    for r in rows:
        table.add_row(
            r["id"][:12],
            str(r.get("created_at", "")),
            str(r.get("model")),
            str(r.get("input_tokens")),
            str(r.get("template_sha256") or "")[:12],
            str(r.get("tokenizer_sha256") or "")[:12],
        )
    console.print(table)


def show(
    record: Annotated[str, typer.Argument(help="Record id (or unique prefix) or record file.")],
    store: StoreOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON, a compaction record too.")] = False,
) -> None:
    """Print a record as JSON (indented, keys sorted). A compaction record (`compact-plan --record`) is shown as
    a readable view instead: the reason, the window, tokens before and after, the cut with the first kept entry's
    id, every summarized message, the summary's digest and usage, and the compaction_end event; --json prints it
    as JSON like any record."""
    rec = record_at(record, open_store(store))
    data = rec.data
    if not as_json and isinstance(data.get("compaction"), dict):
        with record_values(rec):
            show_compaction(rec.id, data)
        return
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2, sort_keys=True) + "\n")


def _snippet(message: Any, limit: int = 60) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    text = " ".join(str(content or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show_compaction(rid: str, data: dict[str, Any]) -> None:
    """The readable view of a record's `compaction` section (see `show`)."""
    c = data["compaction"]
    plan, cut = c["plan"], c["cut"]
    model = (data.get("replay") or {}).get("model")
    console.print(
        f"[bold]compaction record[/] {rid[:12]}… ({escape(str(data['format']))}) · model {escape(str(model))}"
    )
    applied = "applied (the record's run is the compacted request)" if c["applied"] else "planned, not applied"
    console.print(f"reason          {escape(str(c['reason']))} · {applied} · at {escape(str(c.get('at')))}")
    console.print(
        f"window          {c['context_window']:,} (reserve {plan['reserve_tokens']:,}) · should compact "
        f"{'yes' if c['should_compact'] else 'no'} · helps {'yes' if c['helps'] else 'no'}"
    )
    for p in c.get("problems") or ():
        console.print(f"  - {escape(str(p))}")
    after = f"{c['tokens_after']:,} after (exact)" if c.get("tokens_after") is not None else "not applied"
    console.print(
        f"tokens          {plan['tokens_before']:,} before → {after}; estimated {plan['estimated_tokens_after']:,} "
        f"with a {plan['summary_tokens']:,}-token summary"
    )
    source = "the caller's id" if cut["first_kept_entry_id_source"] == "caller" else "its JSON path: no id given"
    console.print(
        f"cut             before messages[{cut['first_kept_index']}] · firstKeptEntryId "
        f"{escape(str(cut['first_kept_entry_id']))} ({source}) · split turn {'yes' if cut['split_turn'] else 'no'}"
    )
    originals = ((data.get("request") or {}).get("canonical") or {}).get("messages") or []
    table = Table("index", "path", "role", "entry id", "part", "text (original, kept in the record)")
    for s in c["summarized"]:
        k = s["index"]
        text = _snippet(originals[k]) if isinstance(k, int) and 0 <= k < len(originals) else ""
        table.add_row(str(k), escape(s["path"]), s["role"], escape(str(s["entry_id"] or "-")), s["part"], escape(text))
    console.print(table)
    summary = c.get("summary")
    if summary:
        console.print(f"summary         {summary['chars']:,} characters, sha256 {summary['sha256']}")
    usage = c.get("usage")
    if usage:
        console.print(
            f"summary usage   input {usage['input']:,} · output {usage['output']:,} · cache read "
            f"{usage['cache_read']:,} · cache write {usage['cache_write']:,} ({escape(str(usage['source']))})"
        )
    if c.get("event") is not None:
        console.print(f"event           {escape(json.dumps(c['event'], ensure_ascii=False))}", soft_wrap=True)
    for note in c.get("notes") or ():
        console.print(f"note            {escape(str(note))}")
    console.print(
        f"originals       {len(originals)} messages in the record's request section; `records show {rid[:12]} "
        "--json` prints the whole record"
    )


def export(
    ids: Annotated[list[str] | None, typer.Argument(help="Record ids to export (default: all).")] = None,
    store: StoreOpt = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write to this file (default: stdout).")] = None,
    bundle: Annotated[
        bool,
        typer.Option(
            "--bundle",
            help="Write one bundle file (ctxlock.bundle/1) with the records and every template and tokenizer "
            "file they replay from, so that `records import` + `replay` work on a machine without the model.",
        ),
    ] = False,
) -> None:
    """Export records as JSON lines (one canonical record per line), or with --bundle as one self-contained file."""
    s = open_store(store)
    if bundle:
        if out is None and sys.stdout.isatty():
            raise InputError(
                "a bundle is binary, not for a terminal",
                path="--bundle",
                hint="pass --out FILE, or redirect stdout",
            )
        plan = prepare_bundle(s, ids or None)  # every artifact found and checked before the file is created
        with open_output(out) if out is not None else nullcontext(sys.stdout.buffer) as fh:
            summary = plan.write(fh)
        print(
            f"exported {len(summary.records)} record(s) and {len(summary.artifacts)} artifact(s), "
            f"{summary.size:,} bytes",
            file=sys.stderr,
        )
        return
    if out is None:
        n = s.export_records(ids or None, sys.stdout.buffer)
    else:
        with open_output(out) as fh:
            n = s.export_records(ids or None, fh)
    print(f"exported {n} record(s)", file=sys.stderr)


def import_(
    source: Annotated[
        Path, typer.Argument(help="A JSON-lines file or a bundle from `records export` (or - for stdin).")
    ],
    store: StoreOpt = None,
) -> None:
    """Import records (all or nothing); each is checked, a corrupt line is a typed error naming it.

    A bundle (`records export --bundle`) is recognized by its first line: every entry's digest is checked, and
    its records and artifacts are stored only when all of them are intact (a BundleError names the entry)."""

    def validate(line: bytes) -> Any:
        return ExecutionRecord.from_bytes(line).index()

    s = open_store(store)
    label = "stdin" if str(source) == "-" else f"SOURCE {source}"
    ids, head = _import_bundle_if_one(s, source, label)
    if ids is None:
        # A regular file or stdin, capped as a whole at $CTXLOCK_MAX_INPUT_BYTES: /dev/zero or a FIFO is refused.
        with opened_input(source, label=label) as fh:
            try:
                ids = s.import_records(_Prefixed(head, fh), validate=validate)
            except CtxlockError as exc:  # the store names the line; the command names the file it is in
                if exc.path is None or not exc.path.startswith(label):
                    exc.path = f"{label} {exc.path}" if exc.path else label
                    exc.args = (str(exc),)
                raise
    for i in ids:
        print(i)
    print(f"imported {len(ids)} record(s)", file=sys.stderr)


def replay_cmd(
    record: Annotated[str, typer.Argument(help="Record id (or unique prefix) or record file.")],
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-run a record's whole pipeline from its own stored artifacts and check every layer.

    First runs the book fixture (the book model must give its 12 ids) and reports it; if it fails,
    nothing is compared. Exits 0 when every layer is identical, 1 with a report of the first divergence, 3 when
    only the tokenizer layer differs and the ids are the same. A missing artifact names the commands that bring
    it (`records export --bundle`, then `records import`)."""

    def go() -> Diff:
        s = open_store(store)
        result, _ = replay(record_at(record, s), s)
        return result

    result = guarded(as_json, go)
    if as_json:
        print_json(result.to_dict())
    else:
        show_fixture(result.fixture)
        show_diff(result, label_a="recorded", label_b="replayed")
    raise typer.Exit(EXIT_CODES[result.kind])


def diff_cmd(
    a: Annotated[str, typer.Argument(help="Record id/prefix or file.")],
    b: Annotated[str | None, typer.Argument(help="Second record; omit to re-run A under --model/--template.")] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Re-run A's request on this model and compare. " + MODEL_HELP),
    ] = None,
    template: Annotated[
        str | None,
        typer.Option("--template", "-t", help="Re-run A's request with this template and compare. " + TEMPLATE_HELP),
    ] = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Name the first layer where two runs diverge (request, policy, messages, dynamic, template, rendered,
    tokenizer, multimodal, input_ids, tensors), where exactly, and the likely cause, and whether the ids are equal.
    Exits 0 if identical, 1 if a layer diverges, 3 for "same ids, different tokenizer artifacts" (the tokenizer
    layer differs, the ids and tensors do not; a differing normalizer or pre-tokenizer is named).

    The policy layer covers the context-budget decisions and the sampler config (processor order included). The
    multimodal layer names what changed about an image: "image re-encoded" (other bytes, the same size, pixels
    close), "image rotated" (its EXIF orientation), "image replaced", "resize policy changed" (only the image
    processor's parameters), "decoder changed"."""

    def go() -> tuple[Diff, str]:
        s = open_store(store)
        ra = record_at(a, s, option="A")
        if b is not None:
            if model is not None or template is not None:
                raise typer.BadParameter("give a second record or --model/--template, not both")
            rb = record_at(b, s, option="B")
            with record_values(ra, rb):
                return diff(ra, rb), b
        if model is None and template is None:
            raise typer.BadParameter("give a second record, or --model/--template to re-run the first")
        check_template_file(template)
        named = template if template is not None and is_template_name(template) else None
        path = Path(template) if template is not None and named is None else None
        with record_values(ra):
            again = rerun(ra, model_spec=model, template_file=path, template_name=named, store=s)
            return diff(ra, again), "re-run"

    result, _label = guarded(as_json, go)
    if as_json:
        print_json(result.to_dict())
    else:
        show_diff(result, label_a="a", label_b="b")
    raise typer.Exit(EXIT_CODES[result.kind])


class _Prefixed:
    """A binary stream that yields `prefix` first, then `stream` (read and readline, as the importers use); a read
    error of the stream is an InputError naming `label`."""

    def __init__(self, prefix: bytes, stream: BinaryIO, label: str = "stdin") -> None:
        self._prefix = prefix
        self._stream = stream
        self._label = label

    def read(self, size: int = -1) -> bytes:
        try:
            return self._read(size)
        except OSError as exc:
            raise _unreadable(exc, self._label) from None

    def readline(self, size: int = -1) -> bytes:
        try:
            return self._readline(size)
        except OSError as exc:
            raise _unreadable(exc, self._label) from None

    def _read(self, size: int = -1) -> bytes:
        if not self._prefix:
            return self._stream.read(size)
        if size is None or size < 0:
            head, self._prefix = self._prefix, b""
            return head + self._stream.read()
        head, self._prefix = self._prefix[:size], self._prefix[size:]
        return head if len(head) == size else head + self._stream.read(size - len(head))

    def _readline(self, size: int = -1) -> bytes:
        if not self._prefix:
            return self._stream.readline(size)
        cut = self._prefix.find(b"\n")
        end = len(self._prefix) if cut < 0 else cut + 1
        if size is not None and size >= 0:
            end = min(end, size)
        head, self._prefix = self._prefix[:end], self._prefix[end:]
        if head.endswith(b"\n") or (size is not None and 0 <= size <= len(head)):
            return head
        return head + self._stream.readline(-1 if size is None or size < 0 else size - len(head))


def _import_bundle_if_one(s: Store, source: Path, label: str) -> tuple[list[str] | None, bytes]:
    """(the ids imported, b"") if `source` is a bundle; else (None, the bytes of stdin already read to tell, which
    the JSON-lines reader must see first: stdin cannot be read twice)."""
    if str(source) == "-":
        stream = _Prefixed(b"", stdin_stream(), label)
        prefix = stream.read(len(MAGIC))
        if not is_bundle(prefix):
            return None, prefix
        return import_bundle(s, _Prefixed(prefix, stream, label), label=label), b""
    with open_regular(source, label=label, error=InputError, stdin_ok=True) as fh:
        reader = _Prefixed(b"", fh, label)
        if not is_bundle(reader.read(len(MAGIC))):
            return None, b""
        fh.seek(0)
        return import_bundle(s, reader, label=label, size=os.fstat(fh.fileno()).st_size), b""


def _unreadable(exc: OSError, label: str) -> InputError:
    reason = exc.strerror or type(exc).__name__
    return InputError(f"cannot read: {reason}", path=label, hint="check that the file is readable")
