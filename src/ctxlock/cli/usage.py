"""`ctxlock usage`: provider usage objects normalized to one shape, summed without double counting, and priced."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ctxlock.cli.output import console, guarded, json_text
from ctxlock.economics._usage import FORMATS, PriceTable, Usage, iter_usage, price_usage, sum_usage
from ctxlock.errors import UsageError
from ctxlock.outside._files import read_input

FilesArg = Annotated[
    list[str],
    typer.Argument(
        help="Files of usage objects: provider responses or their `usage`, one JSON per line, a JSON array, an "
        "Anthropic SSE event stream as JSON lines, or a Pi (github.com/badlogic/pi-mono) `--mode json` event "
        "stream. - reads stdin."
    ),
]
PricesOpt = Annotated[
    Path | None,
    typer.Option(
        "--prices",
        help="A price table: LiteLLM's model_prices_and_context_window.json format (per-token prices, "
        "*_above_200k_tokens tiers), as JSON or TOML. Without it only provider-reported costs are shown.",
    ),
]
ModelNameOpt = Annotated[
    str | None,
    typer.Option(
        "--model", help="The price entry to use, when the responses do not name their model (or to override)."
    ),
]
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        help="The usage objects' provider format: " + "|".join(FORMATS) + " (auto: detected from the keys).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the human view.")]


def _priced(usages: Iterable[Usage], table: PriceTable | None, model: str | None) -> list[tuple[Usage, Any]]:
    """Each usage with its estimate under the table. A provider's own cost stays the usage's cost; without one,
    the estimate becomes it (total_from_provider false)."""
    out = []
    for u in usages:
        estimate = price_usage(u, table, model) if table is not None else None
        if u.cost is None and estimate is not None:
            u = Usage(**{**_fields(u), "cost": estimate})
        out.append((u, estimate))
    return out


def _fields(u: Usage) -> dict[str, Any]:
    return {f: getattr(u, f) for f in Usage.__dataclass_fields__}


def _money(value: Decimal | None) -> str:
    return "-" if value is None else format(value.normalize(), "f") if value else "0"


def _line(u: Usage) -> str:
    reasoning = "" if u.reasoning is None else f" (reasoning {u.reasoning:,})"
    hour = f" (1h {u.cache_write_1h:,})" if u.cache_write_1h else ""
    if u.cost is None:
        cost = "no price"
    else:
        cost = _money(u.cost.total) + (" (provider)" if u.cost.total_from_provider else " (estimate)")
    return (
        f"input {u.input:,} · cache read {u.cache_read:,} · cache write {u.cache_write:,}{hour} · "
        f"output {u.output:,}{reasoning} · total {u.total_tokens:,} · cost {cost}"
    )


def _show(rows: list[tuple[Usage, Any]], total: Usage, table: PriceTable | None) -> None:
    for n, (u, _) in enumerate(rows, 1):
        where = (u.where or "").removesuffix(" $")
        console.print(f"[bold]#{n}[/] {escape(where)}  {u.source}  {escape(u.model or '(no model named)')}")
        console.print(f"   {escape(_line(u))}")
    console.print(f"[bold]sum of {total.calls}[/]")
    console.print(f"   {escape(_line(total))}")
    if table is not None:
        console.print(f"prices: {escape(table.name)} (sha256 {table.sha256})")


def register(app: typer.Typer) -> None:
    @app.command("usage")
    def usage(
        files: FilesArg,
        prices: PricesOpt = None,
        model: ModelNameOpt = None,
        format: FormatOpt = "auto",
        as_json: JsonOpt = False,
    ) -> None:
        """Normalize provider usage objects (OpenAI Chat Completions and Responses, Anthropic Messages and its
        stream, Gemini, Pi) to one shape: input (uncached), cache read, cache write (1-hour part), output
        (reasoning part), total. Sum them without counting cached or reasoning tokens twice, and price them with
        a price table in exact decimals, naming the entry and the table's sha256."""

        def go() -> tuple[list[tuple[Usage, Any]], Usage, PriceTable | None]:
            if format not in FORMATS:
                raise UsageError(f"unknown format {format!r}", path="--format", hint="one of " + ", ".join(FORMATS))
            table = None
            if prices is not None:
                table = PriceTable.parse(read_input(prices, label=f"--prices {prices}"), str(prices))
            rows: list[tuple[Usage, Any]] = []
            for f in files:
                label = "stdin" if f == "-" else f
                # Read one line at a time (`iter_usage`): only the normalized usages are kept, never the parsed file.
                rows += _priced(iter_usage(read_input(f, label=label), label, format=format), table, model)  # type: ignore[arg-type]
            return rows, sum_usage(u for u, _ in rows), table

        rows, total, table = guarded(as_json, go)
        if as_json:
            _print_json(rows, total, table)
        else:
            _show(rows, total, table)


def _print_json(rows: list[tuple[Usage, Any]], total: Usage, table: PriceTable | None) -> None:
    """`print_json` of {"usages", "sum", "prices"}, written one usage at a time (a file of many usages is not
    turned into one document in memory first)."""
    write = sys.stdout.write
    write('{\n  "usages": ' + ("[" if rows else "[]"))
    for i, (u, e) in enumerate(rows):
        row = {"from": u.where, **u.to_dict(), "estimate": None if e is None else e.to_dict()}
        write(("," if i else "") + "\n    " + json_text(row, 2))
    if rows:
        write("\n  ]")
    prices = None if table is None else {"file": table.name, "sha256": table.sha256}
    write(',\n  "sum": ' + json_text(total.to_dict(), 1) + ',\n  "prices": ' + json_text(prices, 1) + "\n}\n")
    sys.stdout.flush()
