"""`ctxlock explain`: why didn't the model see it — five causes (docs/explain.md), judged from a record or a request,
the provider's events and usage, and the records of fit decisions and compactions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ctxlock.accounting._layout import Layout, layout, layout_of, unseen_parts
from ctxlock.cli.files import read_text, template_file
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.records import open_store, record_at
from ctxlock.cli.render import JsonOpt, ModelOpt, StoreOpt, TemplateOpt, read_request_arg
from ctxlock.economics._explain import Explanation, Origin, Window, check_find, explain, origin_of_record
from ctxlock.economics._usage import Usage, read_usage, sum_usage
from ctxlock.errors import ExplainError
from ctxlock.model._model import load
from ctxlock.outside._json import SYNTAX_ERROR, loads_outside
from ctxlock.records import ExecutionRecord
from ctxlock.records._replay import materialized, record_values, recorded_request, run_and_record
from ctxlock.request._entry_ids import take_entry_ids
from ctxlock.template._options import RenderOptions

RecordArg = Annotated[
    str | None,
    typer.Argument(help="The record of the request the model received: an id, an id prefix or a record file."),
]
FindOpt = Annotated[str, typer.Option("--find", help="The text the model did not see (exact, case-sensitive).")]
RequestOpt = Annotated[
    str | None, typer.Option("--request", help="Instead of a record: the request JSON file (or - for stdin).")
]
UsageOpt = Annotated[
    Path | None,
    typer.Option(
        "--usage", help="The response's usage (any format `ctxlock usage` reads): reported input tokens for cause 1."
    ),
]
EventsOpt = Annotated[
    Path | None,
    typer.Option(
        "--events",
        help="The provider's responses, stream events or errors, or a Pi --mode json event stream "
        "(github.com/badlogic/pi-mono): JSON lines or one JSON document. Read for overflow errors (cause 1) and "
        "finish reasons and tool calls (cause 2).",
    ),
]
WindowOpt = Annotated[
    int | None,
    typer.Option(
        "--context-window",
        min=1,
        help="The model's context window, in tokens (cause 1; default: the window the model's files state, "
        "as `ctxlock inspect` shows it).",
    ),
]
HistoryOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--history",
        help="A record whose decisions may have removed the text (a `fit --record` or `compact-plan --record` "
        "record); repeatable. The RECORD itself is always searched.",
    ),
]

_MAX_EVENTS = 100_000


def read_events(path: Path, option: str = "--events") -> list[tuple[str, Any]]:
    """(where, JSON value) for each value of an events file: one JSON document (an array is its items) or one
    JSON value per line. Anything else is an ExplainError naming the line."""
    text = read_text(path, option=option)
    name = f"{option} {path}"
    if not text.strip():
        raise ExplainError("holds no event", path=name, hint="pass JSON lines of responses or events")
    try:
        whole = loads_outside(text, f"{name} $", error=ExplainError)
    except ExplainError as exc:
        if not exc.message.startswith(SYNTAX_ERROR):  # JSON, but hostile: deep, a duplicate key, NaN, ...
            raise
        whole = None  # not one JSON document: JSON lines
    else:
        items = whole if isinstance(whole, list) else [whole]
        return [(f"{name} $[{i}]" if isinstance(whole, list) else f"{name} $", v) for i, v in enumerate(items)]
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((f"{name}:{n}", loads_outside(line, f"{name}:{n} $", error=ExplainError)))
        except ExplainError as exc:
            raise ExplainError(exc.message, path=exc.path, hint=exc.hint or "one JSON value per line") from None
        if len(out) > _MAX_EVENTS:
            raise ExplainError(f"holds over {_MAX_EVENTS:,} events", path=name, hint="pass the events of one session")
    return out


def _usage(path: Path | None) -> Usage | None:
    if path is None:
        return None
    usages = read_usage(read_text(path, option="--usage"), f"--usage {path}")
    return usages[0] if len(usages) == 1 else sum_usage(usages)


def _model_window(model: Any) -> Window | None:
    """The window the model's files (or none) state, with its source: `ctxlock.economics`."""
    cap = model.capacity
    return None if cap.context_window is None else Window(cap.context_window, f"the model's capacity ({cap.source})")


def _from_record(spec: str, store: Path | None) -> tuple[Layout, list[str], Origin, list[str], Window | None]:
    """The record's request as the model received it (fitted, compacted or as sent), replayed on the record's own
    stored artifacts and laid out; its unseen parts; its history; notes."""
    s = open_store(store)
    rec = record_at(spec, s)
    notes: list[str] = []
    with record_values(rec):
        raw, options = recorded_request(rec)
        with materialized(rec, s) as (model, template):
            result, _, error = run_and_record(model, raw, options, template=template)
            if error is not None:
                raise ExplainError(f"the record's run failed: {error}", path=f"record {rec.id[:12]}")
            lay = layout_of(model.tokenizer, result.request, result.rendered)
            window = _model_window(model)
        if [int(i) for i in lay.ids] != rec.data.get("input_ids"):
            notes.append("the record's ids differ from its replay here: positions are the replay's (`ctxlock replay`)")
        origin = origin_of_record(rec.id, rec.data)
    return lay, list(unseen_parts(lay.request, lay.rendered)), origin, notes, window


def _history(specs: list[str], store: Path | None) -> list[Origin]:
    s = open_store(store)
    out = []
    for spec in specs:
        rec: ExecutionRecord = record_at(spec, s, option="--history")
        with record_values(rec):
            out.append(origin_of_record(rec.id, rec.data))
    return out


def explain_cmd(
    record: RecordArg = None,
    find: FindOpt = "",
    request: RequestOpt = None,
    model: ModelOpt = None,
    template: TemplateOpt = None,
    usage: UsageOpt = None,
    events: EventsOpt = None,
    context_window: WindowOpt = None,
    history: HistoryOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Why didn't the model see TEXT? Judges five causes, each yes, no or unknown with its evidence:
    1 too large (input tokens against --context-window or the model's own window, or a provider overflow error in
    --events); 2 output truncated (a finish reason of length/max_tokens, and the tool calls of that response);
    3 dropped (a fit decision or a compaction plan in a record removed the part that held it); 4 never read (in no
    request string, only in user-pasted content and no tool result, or in a part the template never wrote); 5 in
    the middle (its exact token position and percentile; flagged in a context of >= 2,000 tokens when every
    occurrence lies between the 10th and 90th percentile, after Liu et al., Lost in the Middle, TACL 2024)."""

    def go() -> Explanation:
        check_find(find)
        if (record is None) == (request is None):
            raise ExplainError("give a RECORD or --request FILE, one of them", path="RECORD", hint="see --help")
        origins = _history(history or [], store)
        notes: list[str] = []
        if record is not None:
            lay, unseen, origin, notes, model_window = _from_record(record, store)
            origins.insert(0, origin)
            label = f"record {origin.label.split()[-1]}"
        else:
            assert request is not None
            data, _ = take_entry_ids(read_request_arg(request))  # messages' entry ids, as compact-plan reads them
            m = load(model)
            model_window = _model_window(m)
            chosen = template_file(template)
            lay = layout(m, data, **RenderOptions(chat_template=chosen).to_kwargs(parse=False))
            unseen = list(unseen_parts(lay.request, lay.rendered))
            label = "stdin" if request == "-" else f"request {request}"
        evs = read_events(events) if events is not None else []
        if usage is not None:
            evs += read_events(usage, option="--usage")
        # The flag wins; else the window the model's files state (`ctxlock.economics`), else cause 1 is unknown.
        window = Window(context_window, "--context-window") if context_window is not None else model_window
        out = explain(
            find, lay, label=label, unseen=unseen, origins=origins, window=window, usage=_usage(usage), events=evs
        )
        if notes:
            out = Explanation(out.find, out.seen, out.input_tokens, out.causes, out.occurrences, (*out.notes, *notes))
        return out

    result = guarded(as_json, go)
    if as_json:
        print_json(result.to_dict())
        return
    _show(result)


_COLOUR = {"yes": "bold red", "no": "green", "unknown": "yellow"}


def _show(e: Explanation) -> None:
    shown = e.find if len(e.find) <= 60 else e.find[:59] + "…"
    console.print(
        f"[bold]explain[/] {escape(json.dumps(shown, ensure_ascii=False))} · {escape(e.seen)} · "
        f"{e.input_tokens:,} input tokens"
    )
    for c in e.causes:
        colour = _COLOUR[c.verdict]
        console.print(f"{c.number} {c.name:<17}[{colour}]{c.verdict}[/]")
        for line in c.evidence:
            console.print(f"    {escape(line)}", soft_wrap=True)
    answer = ", ".join(e.answer) if e.answer else "none of the five is a yes"
    console.print(f"[bold]answer[/]  {escape(answer)}")
    for note in e.notes:
        console.print(f"note    {escape(note)}")


def register(app: typer.Typer) -> None:
    app.command("explain")(explain_cmd)
