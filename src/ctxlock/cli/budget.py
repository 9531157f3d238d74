"""`ctxlock fit`: fit a request into a token budget (seed 000 §1.7) and show every decision."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table

from ..budget import BudgetPolicy, fit_context
from ..errors import BudgetError
from ..model import load
from ..record import RunOptions
from .files import read_json, store_dir, template_file
from .output import console, guarded, print_json
from .render import JsonOpt, ModelOpt, _read_input


def _policy(policy_file: Path | None, max_input: int | None, window: int | None, reserve: int | None) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if policy_file is not None:
        data = read_json(policy_file, option="--policy", error=BudgetError)
        if not isinstance(data, dict):
            raise BudgetError("a policy file holds a JSON object", path=f"--policy {policy_file}")
    if max_input is not None:
        data["max_input_tokens"] = max_input
    if window is not None:
        data["context_window"] = window
    if reserve is not None:
        data["reserve_output_tokens"] = reserve
    BudgetPolicy.from_dict(data)  # validate now, with a typed error
    return data


def register(app: typer.Typer) -> None:
    @app.command()
    def fit(
        request: Annotated[str, typer.Argument(help="Request JSON file, or - for stdin.")] = "-",
        model: ModelOpt = None,
        max_input_tokens: Annotated[
            int | None, typer.Option("--max-input-tokens", help="Budget for the whole input, in tokens.")
        ] = None,
        context_window: Annotated[
            int | None, typer.Option("--context-window", help="The model's window N (with --reserve-output g).")
        ] = None,
        reserve_output: Annotated[
            int | None, typer.Option("--reserve-output", help="Tokens kept for the answer: n_input + g <= N.")
        ] = None,
        policy: Annotated[
            Path | None, typer.Option("--policy", help="A BudgetPolicy JSON file (priority, order, budget).")
        ] = None,
        template: Annotated[Path | None, typer.Option("--template", "-t", help="Use this .jinja template.")] = None,
        record: Annotated[bool, typer.Option("--record", help="Store an execution record with the decisions.")] = False,
        store: Annotated[Path | None, typer.Option("--store", help="Record store directory.")] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Keep the required segments (system, tools, current turn), then add history and documents by priority
        while the whole rendered, tokenized candidate fits. A tool call and its results stay together."""

        def go() -> tuple[Any, str | None]:
            data = _read_input(request)
            store_path = store_dir(store) if record else None  # refused before the model loads and the run
            pol = _policy(policy, max_input_tokens, context_window, reserve_output)
            m = load(model)
            chosen = template_file(template)
            if record:
                from ..replay import run_and_record, save
                from ..store import Store

                fitted, rec, _ = run_and_record(m, data, RunOptions(budget=pol), template=chosen)
                rid = save(Store(store_path), m, rec, chosen or fitted.rendered.template)
                return fitted, rid
            req = m.parse(data)
            return fit_context(req, m, BudgetPolicy.from_dict(pol), template=chosen), None

        fitted, rid = guarded(as_json, go)
        if as_json:
            out = {**fitted.to_dict(), "input_ids": list(fitted.ids)}
            if rid:
                out["record_id"] = rid
            print_json(out)
            return
        used, budget = fitted.input_tokens, fitted.budget
        console.print(f"[bold]{used:,}[/] / {budget:,} input tokens ({used / budget:.0%} of the budget)")
        console.print(ProgressBar(total=budget, completed=used, width=60))
        console.print()
        table = Table("segment", "kind", "kept", "tokens", "total", "reason")
        for d in fitted.decisions:
            table.add_row(
                escape(d.segment),
                d.kind,
                "[green]kept[/]" if d.kept else "[red]dropped[/]",
                f"{d.tokens:,}" if d.reason != "required" else "",
                f"{d.total:,}",
                escape(d.reason),
            )
        console.print(table)
        dropped = sum(1 for d in fitted.decisions if not d.kept)
        console.print(f"{dropped} segment(s) dropped; policy sha256 {fitted.policy.sha256[:16]}…")
        if rid:
            console.print(f"record     {rid}")
