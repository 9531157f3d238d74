"""`ctxlock export --otel` and `ctxlock import --otel`: execution records as OpenTelemetry GenAI spans (an OTLP/HTTP
endpoint or an OTLP JSON file), and OTLP JSON or Langfuse exports back as sessions for `cache-report` and, with the
records they carry, `replay` (docs/telemetry.md)."""

from __future__ import annotations

import io
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlock import __version__
from ctxlock.accounting import count
from ctxlock.cli.cachereport import read_records, record_ids
from ctxlock.cli.files import open_output
from ctxlock.cli.output import guarded, print_json
from ctxlock.cli.records import open_store, record_at
from ctxlock.cli.render import JsonOpt, ModelOpt, StoreOpt
from ctxlock.economics._session import cache_report
from ctxlock.errors import CtxlockError, UsageError
from ctxlock.model._model import load
from ctxlock.outside._files import read_input
from ctxlock.records import ExecutionRecord, Store
from ctxlock.records._replay import materialized, record_values, recorded_request
from ctxlock.telemetry import (
    SEMCONV_PACKAGE,
    SEMCONV_VERSION,
    CacheFigures,
    Imported,
    SpanSpec,
    otlp_json,
    read_traces,
    record_span,
    sdk_spans,
    send,
    trace_id_for,
)
from ctxlock.template import RenderOptions

OtelOpt = Annotated[
    bool,
    typer.Option("--otel", help="OpenTelemetry GenAI spans (OTLP), the one format of this command for now."),
]


def _counts(record: ExecutionRecord, store: Store, request: Any) -> tuple[list[tuple[str, int]] | None, str | None]:
    """Each part's tokens (ctxlock.accounting.count) on the record's own model, rebuilt from the store as replay
    rebuilds it; none, with the reason, when the count does not give the record's ids."""
    _, options = recorded_request(record)
    try:
        with materialized(record, store) as (model, template):
            render = RenderOptions.from_record(options.to_dict(), template=template)
            kwargs = {f.name: getattr(render, f.name) for f in fields(render) if getattr(render, f.name) is not None}
            counted = count(model, request, **kwargs)
    except CtxlockError as exc:
        return None, f"per-part counts not given: {exc}"
    if counted.total != len(record.data.get("input_ids") or []):
        return None, f"per-part counts not given: the count gave {counted.total} tokens, the record holds others"
    return [(p.part, p.tokens) for p in counted.parts], None


def _export(
    specs_in: list[str],
    store_dir: Path | None,
    provider: str | None,
    model: str | None,
    content: bool,
) -> tuple[list[SpanSpec], int]:
    ids = record_ids(specs_in)
    store = open_store(store_dir)
    records = [record_at(spec, store, option="RECORD") for spec in ids]
    session = read_records([r.id for r in records], store_dir)
    caches: list[CacheFigures | None] = [None] * len(records)
    if provider is not None:
        run = cache_report(load(model), session, provider, options={})
        for i, t in enumerate(run.reports):
            kind, text = (t.buster.kind, t.buster.message) if t.buster is not None else (None, None)
            caches[i] = CacheFigures(provider, t.split.cache_read, t.split.cache_write, kind, text)
    trace_id = trace_id_for([r.id for r in records])
    specs = []
    for turn, (record, (request, _, _), cache) in enumerate(zip(records, session, caches, strict=True)):
        with record_values(record):
            parts, note = _counts(record, store, request)
            specs.append(
                record_span(
                    record.id,
                    record.data,
                    request,
                    turn=turn,
                    trace_id=trace_id,
                    provider=provider or "ctxlock",
                    counts=parts,
                    count_note=note,
                    cache=cache,
                    content=content,
                    record_text=record.body.decode("utf-8") if content else None,
                )
            )
    return specs, trace_id


def export_cmd(
    records: Annotated[
        list[str],
        typer.Argument(
            help="Record ids (or unique prefixes, or record files) in turn order; @FILE reads them from a file, one "
            "per line.",
            show_default=False,
        ),
    ],
    otel: OtelOpt = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write OTLP JSON to this file (- for stdout).")
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option("--endpoint", help="POST the spans to this OTLP/HTTP traces URL (http://HOST:4318/v1/traces)."),
    ] = None,
    content: Annotated[
        bool,
        typer.Option(
            "--content",
            help="Also export the content: gen_ai.input.messages, gen_ai.system_instructions, gen_ai.tool.definitions, "
            "the exact request (ctxlock.request) and the record (ctxlock.record). Without it no message text leaves.",
        ),
    ] = False,
    provider: Annotated[
        str | None,
        typer.Option(
            "--provider",
            help="Add each turn's cache reads and writes and its buster under this provider's caching rule, as "
            "`cache-report --records` computes them (openai|anthropic|vllm); also gen_ai.provider.name.",
        ),
    ] = None,
    model: ModelOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write each record as an OpenTelemetry GenAI span (semantic conventions 1.44.0): `chat {model}`,
    gen_ai.request.model, gen_ai.usage.input_tokens (the record's ids) and, with --provider, the cache figures, plus
    ctxlock.* attributes: template, tokenizer and ids digests, per-part counts, neutralized control strings, the
    cache buster. The records are one trace, in the order given. Message content only with --content."""

    def go() -> dict[str, Any]:
        if not otel:
            raise UsageError("name the format", path="--otel", hint="pass --otel (OpenTelemetry spans)")
        if (out is None) == (endpoint is None):
            raise UsageError("say where the spans go", path="--out/--endpoint", hint="pass one of --out or --endpoint")
        specs, trace_id = _export(records, store, provider, model, content)
        spans = sdk_spans(specs, version=__version__)
        if endpoint is not None:
            send(spans, endpoint)
        else:
            text = json.dumps(otlp_json(spans), ensure_ascii=False, separators=(",", ":")) + "\n"
            if str(out) == "-":
                sys.stdout.write(text)
            else:
                with open_output(out) as fh:  # type: ignore[arg-type]
                    fh.write(text.encode("utf-8"))
        return {
            "spans": len(spans),
            "trace_id": f"{trace_id:032x}",
            "semconv": SEMCONV_VERSION,
            "content": content,
            "to": endpoint if endpoint is not None else str(out),
        }

    result = guarded(as_json, go)
    if as_json:
        print_json(result)
        return
    what = "with content" if content else "without content (pass --content for the messages)"
    print(
        f"exported {result['spans']} span(s), trace {result['trace_id']}, semantic conventions {SEMCONV_VERSION} "
        f"({SEMCONV_PACKAGE}), {what}, to {result['to']}",
        file=sys.stderr,
    )


def import_cmd(
    source: Annotated[
        str, typer.Argument(help="OTLP JSON (or JSON lines), or a Langfuse observation export; - reads stdin.")
    ],
    otel: OtelOpt = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the session (JSONL) here; default stdout.")
    ] = None,
    trace: Annotated[
        str | None, typer.Option("--trace", help="The trace to read, when the file holds several.")
    ] = None,
    store: Annotated[
        Path | None,
        typer.Option(
            "--store",
            help="Also import the records the spans carry (ctxlock.record, exported with --content) into this store, "
            "for `ctxlock replay`.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Read a trace file as a session for `cache-report`: one line per chat span (or Langfuse GENERATION), in time
    order, {"request", "timestamp"[, "usage"]}. A ctxlock span's exact request (ctxlock.request) is taken whole;
    otherwise the request is rebuilt from gen_ai.input.messages, gen_ai.system_instructions and
    gen_ai.tool.definitions as an OpenAI chat request (parts it cannot carry are named). A provider's
    gen_ai.usage figures become the line's usage; ctxlock's own (ctxlock.usage.source) do not."""

    def go() -> tuple[Imported, list[str]]:
        if not otel:
            raise UsageError("name the format", path="--otel", hint="pass --otel (OTLP JSON or a Langfuse export)")
        if as_json and out is None:
            raise UsageError(
                "--json prints the summary on stdout", path="--out", hint="pass --out FILE for the session"
            )
        label = "stdin" if source == "-" else source
        imported = read_traces(read_input(source, label=label), label, trace=trace)
        stored: list[str] = []
        carried = [t.record.encode("utf-8") for t in imported.turns if t.record is not None]
        if store is not None and carried:

            def validate(line: bytes) -> Any:
                return ExecutionRecord.from_bytes(line).index()

            body = b"".join(r if r.endswith(b"\n") else r + b"\n" for r in carried)
            stored = open_store(store).import_records(io.BytesIO(body), validate=validate)
        lines = "".join(json.dumps(t.session_line(), ensure_ascii=False) + "\n" for t in imported.turns)
        if out is None:
            sys.stdout.write(lines)
        else:
            with open_output(out) as fh:
                fh.write(lines.encode("utf-8"))
        return imported, stored

    imported, stored = guarded(as_json, go)
    rebuilt = [t for t in imported.turns if t.source != "ctxlock.request"]
    notes = [n for t in imported.turns for n in t.notes]
    summary = {
        "format": imported.format,
        "trace_id": imported.turns[0].trace_id,
        "turns": len(imported.turns),
        "whole": sum(t.whole and t.source == "ctxlock.request" for t in imported.turns),
        "rebuilt": len(rebuilt),
        "with_usage": sum(t.usage is not None for t in imported.turns),
        "records": stored,
        "skipped": imported.skipped,
        "notes": notes,
    }
    if as_json:
        print_json(summary)
        return
    line = (
        f"imported {summary['turns']} turn(s) of trace {summary['trace_id']} ({imported.format}): "
        f"{summary['whole']} exact request(s), {summary['rebuilt']} rebuilt from messages, "
        f"{summary['with_usage']} with a provider's usage"
    )
    if store is not None:
        line += f", {len(stored)} record(s) stored"
    print(line, file=sys.stderr)
    for text in [*notes, *imported.skipped]:
        print(f"  note: {text}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)
    app.command("import")(import_cmd)
