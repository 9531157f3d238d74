"""`ctxlock cache-report`: a session's prompt-cache hits and writes, turn by turn, the cost, and what busts it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ..cache_session import cache_report as report_session
from ..cache_session import money, read_session, sum_or_none
from ..errors import UsageError
from ..inputs import decode_utf8, read_input
from ..model import load
from ..promptcache import PROVIDERS, TurnReport
from ..usage import PriceTable
from .files import template_file
from .output import console, guarded, print_json
from .render import JsonOpt, ModelOpt


def _show(reports: list[TurnReport], provider: str, estimate: str | None, fixed: list[TurnReport] | None) -> None:
    console.print(f"provider {provider} · {len(reports)} turns" + (f" · {escape(estimate)}" if estimate else ""))
    for t in reports:
        line = (
            f"#{t.index:<3} input {t.input_tokens:>7,}  shared {t.common_prefix:>7,}  read {t.split.cache_read:>7,}  "
            f"write {t.split.cache_write:>7,}  uncached {t.split.uncached:>7,}  cost {money(t.cost)}"
        )
        if t.reported_cache_read is not None:
            line += f"  reported read {t.reported_cache_read:,}"
        console.print(escape(line))
        if t.buster is not None:
            console.print(f"     [yellow]buster[/] {escape(t.buster.kind)}: {escape(t.buster.message)}")
    _totals("total", reports)
    if fixed is not None:
        _totals("with --fix", fixed)


def _totals(label: str, reports: list[TurnReport]) -> None:
    reads = sum(t.split.cache_read for t in reports)
    writes = sum(t.split.cache_write for t in reports)
    cost = sum_or_none([t.cost for t in reports])
    plain = sum_or_none([t.cost_uncached for t in reports])
    busted = sum(1 for t in reports if t.buster is not None)
    console.print(
        f"[bold]{label}[/]  read {reads:,}  written {writes:,}  turns busted {busted}  cost {money(cost)}"
        f"  without caching {money(plain)}"
    )


SessionArg = Annotated[
    str,
    typer.Argument(
        help='A JSONL session: one request per line, or per line {"request": ..., "usage": ..., "timestamp": ...}. '
        "- reads stdin."
    ),
]
ProviderOpt = Annotated[str, typer.Option("--provider", help="The caching rule: " + "|".join(PROVIDERS) + ".")]
TemplateOpt = Annotated[Path | None, typer.Option("--template", "-t", help="Use this .jinja chat template.")]
PricesOpt = Annotated[Path | None, typer.Option("--prices", help="A price table (LiteLLM's format, JSON or TOML).")]
PriceModelOpt = Annotated[str | None, typer.Option("--price-model", help="The price table's entry for the session.")]
TtlOpt = Annotated[
    float,
    typer.Option(
        "--ttl",
        min=0,
        help="Seconds a cached prefix lives (default 300, 5 minutes; an Anthropic 1-hour breakpoint keeps an hour; "
        "0: no expiry).",
    ),
]
MinPrefixOpt = Annotated[
    int, typer.Option("--min-prefix", min=0, help="Anthropic: the model's shortest cacheable prefix, in tokens.")
]
FixOpt = Annotated[
    bool,
    typer.Option(
        "--fix",
        help="Also report the session with tools and schema keys in canonical order and the part of the system "
        "prompt that changes from turn to turn moved to the end of the last message.",
    ),
]


def register(app: typer.Typer) -> None:
    @app.command("cache-report")
    def cache_report(
        session: SessionArg,
        provider: ProviderOpt,
        model: ModelOpt = None,
        template: TemplateOpt = None,
        prices: PricesOpt = None,
        price_model: PriceModelOpt = None,
        ttl: TtlOpt = 300.0,
        min_prefix: MinPrefixOpt = 1024,
        fix: FixOpt = False,
        as_json: JsonOpt = False,
    ) -> None:
        """For every turn of a session: the token prefix it shares with earlier requests (within the TTL), what the
        provider's cache reads and writes under its rule (OpenAI: 1,024 tokens then 128-token steps; Anthropic:
        cache_control breakpoints; vLLM: 16-token blocks), the cost with and without caching, and the buster: the
        first place the request stops extending the one before, named by its path in the request."""

        def go() -> dict[str, Any]:
            if provider not in PROVIDERS:
                raise UsageError(f"unknown provider {provider!r}", path="--provider", hint=" or ".join(PROVIDERS))
            label = "stdin" if session == "-" else f"SESSION {session}"
            turns_in = read_session(decode_utf8(read_input(session, label=label), label=label), label)
            m = load(model)
            options: dict[str, Any] = {"template": template_file(template)} if template is not None else {}
            table = PriceTable.parse(read_input(prices, label=f"--prices {prices}"), str(prices)) if prices else None
            kw = {"table": table, "price_model": price_model, "ttl": ttl, "minimum": min_prefix, "fix": fix}
            return report_session(m, turns_in, provider, options=options, **kw)

        out = guarded(as_json, go)
        reports, fixed = out.pop("_reports"), out.pop("_fixed_reports", None)
        if as_json:
            print_json(out)
        else:
            _show(reports, provider, out["estimate"], fixed)
