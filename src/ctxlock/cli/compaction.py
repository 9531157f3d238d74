"""`ctxlock compact-plan`: where Pi-style compaction would cut a conversation, in exact tokens for one model."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..compaction import (
    DEFAULT_KEEP_RECENT_TOKENS,
    DEFAULT_RESERVE_TOKENS,
    CompactionPlan,
    message_tokens,
    plan_compaction,
    plan_problems,
    should_compact,
)
from ..model import Model, load
from ..options import RenderOptions
from .files import template_file
from .output import console, guarded, print_json
from .render import JsonOpt, ModelOpt, RequestArg, TemplateOpt, _read_input


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


def compact_plan(
    context_window: WindowOpt,
    request: RequestArg = "-",
    model: ModelOpt = None,
    reserve_tokens: ReserveTokensOpt = DEFAULT_RESERVE_TOKENS,
    keep_recent_tokens: KeepRecentTokensOpt = DEFAULT_KEEP_RECENT_TOKENS,
    summary_tokens: SummaryTokensOpt = 1000,
    template: TemplateOpt = None,
    check: CheckOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Plan a compaction (Pi's semantics): the cut, what gets summarized, tokens before and after, and whether
    the plan helps (with the reasons when it does not; --check makes that exit 1). No LLM call."""

    def go() -> tuple[Model, Any, CompactionPlan, bool, dict[int, int]]:
        data = _read_input(request)
        m = load(model)
        options = RenderOptions(template=template_file(template))
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
            }
        )
    else:
        _show(m, plan, compact, context_window, sizes, req, problems)
    if check and problems:
        # A failed check is one line on stderr, as every failure is (README: Errors and exit statuses).
        print(f"error: check: the plan does not help: {'; '.join(problems)}", file=sys.stderr)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("compact-plan")(compact_plan)
