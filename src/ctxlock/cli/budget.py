"""`ctxlock fit`: fit a request into a token budget (docs/budgets.md) and show every decision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table

from ctxlock.accounting._layout import unseen_parts
from ctxlock.budget._fit import BudgetPolicy, Fitted, fit_context, fitted_request_json
from ctxlock.cli.files import open_output, read_json, store_dir, template_file
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.render import JsonOpt, ModelOpt, RequestArg, StoreOpt, TemplateOpt, read_request_arg, run_recorded
from ctxlock.errors import BudgetError, CapacityUnknownError
from ctxlock.model._model import Model, load
from ctxlock.records import RunOptions
from ctxlock.records._wire import fit_to_dict
from ctxlock.template._options import RenderOptions


def _policy(
    policy_file: Path | None,
    max_input: int | None,
    window: int | None,
    reserve: int | None,
    history: str | None,
    no_generation_prompt: bool,
) -> dict[str, Any]:
    """The policy as given (a file, then the flags over it), not yet validated: without a budget, `_with_window`
    takes the model's window."""
    data: dict[str, Any] = {}
    if policy_file is not None:
        data = read_json(policy_file, option="--policy", error=BudgetError)
        if not isinstance(data, dict):
            raise BudgetError("a policy file holds a JSON object", path=f"--policy {policy_file}")
        if data.get("context_window") is not None and "window_source" not in data:
            data["window_source"] = f"--policy {policy_file}"
    if max_input is not None:
        data["max_input_tokens"] = max_input
    if window is not None:
        data["context_window"] = window
        data["window_source"] = "--context-window"
    if reserve is not None:
        data["reserve_output_tokens"] = reserve
    if history is not None:
        data["history"] = history
    if no_generation_prompt:
        data["generation_prefix"] = "none"
    return data


def _has_budget(data: dict[str, Any]) -> bool:
    return data.get("max_input_tokens") is not None or data.get("context_window") is not None


def _with_window(data: dict[str, Any], model: Model) -> dict[str, Any]:
    """The policy as a complete dict (every field, defaults included), so a record states the history mode, the
    generation prefix and where its window came from, whatever later versions default to. Without a budget, the
    model's own window (`model.capacity`) is the budget, and its source is recorded."""
    if not _has_budget(data):
        cap = model.capacity
        if cap.context_window is None:
            raise CapacityUnknownError(
                f"model {model.id!r} states no context window, and no budget was given",
                path="--context-window",
                hint="pass --context-window N (with --reserve-output G) or --max-input-tokens N",
            )
        data = {**data, "context_window": cap.context_window, "window_source": f"model {cap.source}"}
    return BudgetPolicy.from_dict(data).to_dict()  # validated now, with a typed error


MaxInputTokensOpt = Annotated[
    int | None, typer.Option("--max-input-tokens", help="Budget for the whole input, in tokens.")
]
ContextWindowOpt = Annotated[
    int | None, typer.Option("--context-window", help="The model's window N (with --reserve-output g).")
]
ReserveOutputOpt = Annotated[
    int | None, typer.Option("--reserve-output", help="Tokens kept for the answer: n_input + g <= N.")
]
HistoryOpt = Annotated[
    str | None,
    typer.Option(
        "--history",
        help="suffix (default): keep a contiguous run of the newest turns, stopping at the first that does "
        "not fit; greedy: try every turn, newest first, and keep each that fits (the literal loop; it can "
        "leave gaps in the conversation).",
    ),
]
FitNoGenerationPromptOpt = Annotated[
    bool,
    typer.Option(
        "--no-generation-prompt",
        help="Fit an input that ends without an assistant generation prefix (not a generation request: "
        "scoring, training). Recorded in the policy as generation_prefix 'none'.",
    ),
]
FitContinueFinalMessageOpt = Annotated[
    bool,
    typer.Option(
        "--continue-final-message",
        help="Leave the final assistant message open, to be continued (a prefill): it is the generation prefix.",
    ),
]
PolicyOpt = Annotated[
    Path | None,
    typer.Option("--policy", help="A BudgetPolicy JSON file (priority, order, history, budget)."),
]
EmitRequestOpt = Annotated[
    Path | None,
    typer.Option(
        "--emit-request",
        help="Write the fitted request to this file: the request as given, in its own dialect, without the "
        "dropped messages and documents (what to send to the API).",
    ),
]
FitRecordOpt = Annotated[bool, typer.Option("--record", help="Store an execution record with the decisions.")]


def fit(
    request: RequestArg = "-",
    model: ModelOpt = None,
    max_input_tokens: MaxInputTokensOpt = None,
    context_window: ContextWindowOpt = None,
    reserve_output: ReserveOutputOpt = None,
    history: HistoryOpt = None,
    no_generation_prompt: FitNoGenerationPromptOpt = False,
    continue_final_message: FitContinueFinalMessageOpt = False,
    policy: PolicyOpt = None,
    template: TemplateOpt = None,
    emit_request: EmitRequestOpt = None,
    record: FitRecordOpt = False,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Keep the required segments (system, tools, current turn, generation prefix), then add history (a
    contiguous run of the newest turns, or greedily with --history greedy) and documents (greedily, by
    priority) while the whole rendered, tokenized candidate fits. A tool call and its results stay together.
    --json adds the fitted request as "request"; --emit-request writes it to a file."""

    def go() -> tuple[Any, str | None, dict[str, Any]]:
        data = read_request_arg(request)
        store_path = store_dir(store) if record else None  # refused before the model loads and the run
        given = _policy(policy, max_input_tokens, context_window, reserve_output, history, no_generation_prompt)
        if _has_budget(given):
            BudgetPolicy.from_dict(given)  # a bad policy fails before the model loads
        m = load(model)
        pol = _with_window(given, m)
        chosen = template_file(template)
        options = RenderOptions(
            add_generation_prompt=False if no_generation_prompt or continue_final_message else None,
            continue_final_message=continue_final_message,
            chat_template=chosen,
        )
        if record:
            fitted, rid = run_recorded(m, data, RunOptions(**options.to_record(), budget=pol), chosen, store_path)
        else:
            req = options.parse(data)
            fitted = fit_context(req, m, BudgetPolicy.from_dict(pol), **options.to_kwargs(parse=False))
            rid = None
        original = options.parse(data)
        sent = fitted_request_json(json.loads(data), original, fitted)
        if emit_request is not None:
            with open_output(emit_request, option="--emit-request") as fh:
                fh.write((json.dumps(sent, ensure_ascii=False, indent=2) + "\n").encode("utf-8"))
        return fitted, rid, sent

    fitted, rid, sent = guarded(as_json, go)
    if as_json:
        print_json(fit_to_dict(fitted, sent, rid))
        return
    _show(fitted, sent, emit_request, rid)


def _show(fitted: Fitted, sent: dict[str, Any], emit_request: Path | None, rid: str | None) -> None:
    used, budget = fitted.input_tokens, fitted.budget
    console.print(f"[bold]{used:,}[/] / {budget:,} input tokens ({used / budget:.0%} of the budget)")
    if fitted.policy.window_source is not None:
        console.print(f"window {fitted.policy.context_window:,} from {escape(fitted.policy.window_source)}")
    console.print(ProgressBar(total=budget, completed=used, width=60))
    console.print()
    table = Table("segment", "kind", "kept", "tokens", "total", "reason")
    for d in fitted.decisions:
        if d.kind == "generation":
            kept = "[green]yes[/]" if d.kept else "none"
        else:
            kept = "[green]kept[/]" if d.kept else "[red]dropped[/]"
        table.add_row(
            escape(d.segment),
            d.kind,
            kept,
            f"{d.tokens:,}" if d.tokens is not None else "-",
            f"{d.total:,}",
            escape(d.reason),
        )
    console.print(table)
    dropped = sum(1 for d in fitted.decisions if not d.kept and d.kind != "generation")
    console.print(
        f"{dropped} segment(s) dropped; history {fitted.policy.history}; policy sha256 {fitted.policy.sha256[:16]}…"
    )
    for path in unseen_parts(fitted.request, fitted.rendered):
        console.print(
            f"[yellow]unseen[/]     {escape(path)}: kept, but the template wrote no byte of it: the model never sees it"
        )
    if emit_request is not None:
        console.print(f"request    {escape(str(emit_request))} ({len(sent['messages'])} messages)")
    if rid:
        console.print(f"record     {rid}")


def register(app: typer.Typer) -> None:
    app.command()(fit)
