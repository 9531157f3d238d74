"""`ctxlock compact-plan`: where Pi-style compaction would cut a conversation, in exact tokens for one model."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ctxlock.budget._compaction import (
    COMPACTION_REASONS,
    DEFAULT_KEEP_RECENT_TOKENS,
    DEFAULT_RESERVE_TOKENS,
    CompactionPlan,
    apply_compaction,
    entry_id,
    message_tokens,
    plan_compaction,
    plan_problems,
    record_section,
    should_compact,
)
from ctxlock.cli.files import read_text, store_dir, template_file
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.render import JsonOpt, ModelOpt, RequestArg, StoreOpt, TemplateOpt, read_request_arg
from ctxlock.economics._usage import Usage, read_usage, sum_usage
from ctxlock.errors import BudgetError
from ctxlock.model._model import Model, load
from ctxlock.records import ExecutionRecord, RunOptions
from ctxlock.records._replay import run_and_record, save
from ctxlock.records._store import Store
from ctxlock.request._entry_ids import take_entry_ids
from ctxlock.template._options import RenderOptions


def _verdict(problems: tuple[str, ...]) -> None:
    if not problems:
        console.print("verdict         [green]the plan helps[/]: fewer tokens, under window - reserve")
        return
    console.print("verdict         [bold red]this plan does not help[/]")
    for p in problems:
        console.print(f"  - {escape(p)}")


def _show(
    model: Model,
    plan: CompactionPlan,
    compact: bool,
    context_window: int,
    sizes: dict[int, int],
    req: Any,
    problems: tuple[str, ...],
) -> None:
    threshold = context_window - plan.reserve_tokens
    verdict = "[bold red]yes[/]" if compact else "[green]no[/]"
    console.print(f"[bold]{escape(model.id)}[/] · context window {context_window} · reserve {plan.reserve_tokens}")
    console.print(f"should compact  {verdict}  ({plan.tokens_before} tokens {'>' if compact else '<='} {threshold})")
    console.print(f"tokens before   {plan.tokens_before}")
    if plan.summarizes_nothing:
        console.print(
            f"cut             none: the conversation fits in keep_recent_tokens={plan.keep_recent_tokens}, "
            "nothing to summarize"
        )
        if problems:
            _verdict(problems)
        return
    first = req.messages[plan.first_kept_index] if plan.first_kept_index < len(req.messages) else None
    role = first.role if first is not None else "-"
    console.print(
        f"cut             before messages[{plan.first_kept_index}] ({role}); "
        f"kept {plan.kept_tokens} tokens (keep_recent_tokens={plan.keep_recent_tokens})"
    )
    console.print(f"split turn      {'yes' if plan.split_turn else 'no'}")
    table = Table(title="summarized", title_justify="left")
    table.add_column("index", justify="right")
    table.add_column("role")
    table.add_column("tokens", justify="right")
    table.add_column("part")
    for k in plan.messages_to_summarize:
        table.add_row(str(k), req.messages[k].role, str(sizes[k]), "history")
    for k in plan.turn_prefix_to_summarize:
        table.add_row(str(k), req.messages[k].role, str(sizes[k]), "turn prefix")
    console.print(table)
    console.print(
        f"estimated after {plan.estimated_tokens_after}  (system + a {plan.summary_tokens}-token summary + kept)"
    )
    _verdict(problems)


WindowOpt = Annotated[int, typer.Option("--context-window", min=1, help="The model's context window, in tokens.")]
ReserveTokensOpt = Annotated[
    int, typer.Option("--reserve-tokens", min=0, help="Compact when tokens > window - reserve (Pi's default).")
]
KeepRecentTokensOpt = Annotated[
    int, typer.Option("--keep-recent-tokens", min=0, help="Recent tokens kept verbatim (Pi's default).")
]
SummaryTokensOpt = Annotated[
    int, typer.Option("--summary-tokens", min=0, help="Summary size assumed by the estimate after.")
]
CheckOpt = Annotated[
    bool,
    typer.Option(
        "--check",
        help="Exit 1 when the plan does not help: compaction is due but nothing can be summarized, or the "
        "estimate after is not below the tokens before, or is still over window - reserve.",
    ),
]


RecordOpt = Annotated[
    bool,
    typer.Option(
        "--record",
        help="Store an execution record of the compaction: the original request (kept whole), the plan, the cut, "
        "the summary's sha256, the summary call's usage and Pi's compaction_end event. With --summary the record's "
        "run is the compacted request (system + summary + kept messages), as the model sees it next.",
    ),
]
SummaryOpt = Annotated[
    Path | None,
    typer.Option("--summary", help="The summary text (UTF-8 file) that replaces the summarized messages."),
]
TurnPrefixSummaryOpt = Annotated[
    Path | None,
    typer.Option("--turn-prefix-summary", help="For a split-turn plan: the summary of the turn's first part."),
]
SummaryUsageOpt = Annotated[
    Path | None,
    typer.Option(
        "--summary-usage",
        help="The usage of the summarization call: a provider response or usage object (any format `ctxlock usage` "
        "reads; several are summed). Recorded, and put in the compaction_end event in Pi's shape.",
    ),
]
ReasonOpt = Annotated[
    str | None,
    typer.Option(
        "--reason", help="Pi's compaction reason: manual|threshold|overflow (default: threshold when due, else manual)."
    ),
]


def _usage(path: Path | None) -> Usage | None:
    if path is None:
        return None
    usages = read_usage(read_text(path, option="--summary-usage"), f"--summary-usage {path}")
    return usages[0] if len(usages) == 1 else sum_usage(usages)


def _record(
    m: Model,
    data: bytes,
    options: RenderOptions,
    plan: CompactionPlan,
    section: dict[str, Any],
    summaries: tuple[str | None, str | None],
    store_path: Path | None,
) -> str:
    """Run (the compacted request when a summary is given, else the request as given), record with the
    `compaction` section, store; the record id."""
    summary, prefix = summaries
    applied = summary is not None and not plan.summarizes_nothing
    spec = {"plan": plan.to_dict(), "summary": summary, "turn_prefix_summary": prefix} if applied else None
    result, rec, error = run_and_record(
        m, data, RunOptions(**options.to_record(), compaction=spec), template=options.chat_template
    )
    if error is not None:
        raise error
    if applied:
        section["tokens_after"] = len(result.tokenized.ids)
    rec = ExecutionRecord.from_data({**rec.data, "compaction": section})
    used = result.rendered.template if result is not None else None
    return save(Store(store_path), m, rec, used)


def _summary_inputs(
    reason: str | None, summary: Path | None, turn_prefix_summary: Path | None, summary_usage: Path | None
) -> tuple[tuple[str | None, str | None], Usage | None]:
    """The summary texts and the summary call's usage, checked before the model loads."""
    if reason is not None and reason not in COMPACTION_REASONS:
        raise BudgetError(f"unknown reason {reason!r}", path="--reason", hint="manual, threshold or overflow")
    if (summary_usage is not None or turn_prefix_summary is not None) and summary is None:
        raise BudgetError("a summary's usage or turn prefix needs --summary", path="--summary")
    texts = (
        None if summary is None else read_text(summary, option="--summary"),
        None if turn_prefix_summary is None else read_text(turn_prefix_summary, option="--turn-prefix-summary"),
    )
    return texts, _usage(summary_usage)


def _section(
    plan: CompactionPlan,
    req: Any,
    reason: str,
    context_window: int,
    entry_ids: dict[int, str],
    texts: tuple[str | None, str | None],
    usage: Usage | None,
) -> dict[str, Any]:
    return record_section(
        plan,
        req,
        reason=reason,
        context_window=context_window,
        entry_ids=entry_ids,
        summary=texts[0],
        turn_prefix_summary=texts[1],
        usage=usage,
        at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _show_entry_and_record(plan: CompactionPlan, extra: dict[str, Any]) -> None:
    if not plan.summarizes_nothing:
        source = "the caller's id" if extra["first_kept_entry_id_source"] == "caller" else "its JSON path: no id"
        console.print(f"first kept      {escape(extra['first_kept_entry_id'])} ({source})")
    if "record_id" in extra:
        console.print(f"record          {extra['record_id']}")


def compact_plan(
    context_window: WindowOpt,
    request: RequestArg = "-",
    model: ModelOpt = None,
    reserve_tokens: ReserveTokensOpt = DEFAULT_RESERVE_TOKENS,
    keep_recent_tokens: KeepRecentTokensOpt = DEFAULT_KEEP_RECENT_TOKENS,
    summary_tokens: SummaryTokensOpt = 1000,
    template: TemplateOpt = None,
    check: CheckOpt = False,
    record: RecordOpt = False,
    summary: SummaryOpt = None,
    turn_prefix_summary: TurnPrefixSummaryOpt = None,
    summary_usage: SummaryUsageOpt = None,
    reason: ReasonOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Plan a compaction (the semantics of Pi, github.com/badlogic/pi-mono): the cut, what gets summarized, tokens
    before and after, and whether the plan helps (with the reasons when it does not; --check makes that exit 1). No LLM
    call.

    Messages may carry an `id` (the caller's entry id): it is read and removed before parsing, and
    firstKeptEntryId is that id (else the first kept message's JSON path, said so). --record stores the
    compaction (see --record); `records show ID` shows it, and `explain` uses it for cause 3."""
    extra: dict[str, Any] = {}

    def go() -> tuple[Model, Any, CompactionPlan, bool, dict[int, int]]:
        texts, usage = _summary_inputs(reason, summary, turn_prefix_summary, summary_usage)
        store_path = store_dir(store) if record else None
        data, entry_ids = take_entry_ids(read_request_arg(request))
        m = load(model)
        options = RenderOptions(chat_template=template_file(template))
        req = options.parse(data)
        plan = plan_compaction(
            req,
            m,
            context_window=context_window,
            reserve_tokens=reserve_tokens,
            keep_recent_tokens=keep_recent_tokens,
            summary_tokens=summary_tokens,
            options=options,
        )
        compact = should_compact(plan.tokens_before, context_window, reserve_tokens)
        if texts[0] is not None and not plan.summarizes_nothing:
            apply_compaction(req, plan, texts[0], turn_prefix_summary=texts[1])  # a missing turn prefix: an error now
        extra["first_kept_entry_id"], extra["first_kept_entry_id_source"] = entry_id(
            req, plan.first_kept_index, entry_ids
        )
        if record:
            why = reason or ("threshold" if compact else "manual")
            section = _section(plan, req, why, context_window, entry_ids, texts, usage)
            extra["record_id"] = _record(m, data, options, plan, section, texts, store_path)
        sizes: dict[int, int] = {}
        if not as_json and not plan.summarizes_nothing:
            wanted = (*plan.messages_to_summarize, *plan.turn_prefix_to_summarize)
            sizes = message_tokens(req, m, wanted, options=options)
        return m, req, plan, compact, sizes

    m, req, plan, compact, sizes = guarded(as_json, go)
    problems = plan_problems(plan, context_window)
    if as_json:
        print_json(
            {
                **plan.to_dict(),
                "should_compact": compact,
                "context_window": context_window,
                "helps": not problems,
                "problems": list(problems),
                **extra,
            }
        )
    else:
        _show(m, plan, compact, context_window, sizes, req, problems)
        _show_entry_and_record(plan, extra)
    if check and problems:
        # A failed check is one line on stderr, as every failure is (README: Errors and exit statuses).
        print(f"error: check: the plan does not help: {'; '.join(problems)}", file=sys.stderr)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("compact-plan")(compact_plan)
