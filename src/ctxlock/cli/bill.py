"""`ctxlock bill`: a session's dollars per request part, per turn, by cache state (docs/bill.md). The computation is
`ctxlock.economics.bill_session`; this module reads the files and prints."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ctxlock.cli.cachereport import MinPrefixOpt, TemplateOpt, TtlOpt
from ctxlock.cli.files import template_file
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.render import JsonOpt, ModelOpt
from ctxlock.economics import Bill, PartTokens, PriceTable, bill_session
from ctxlock.economics._bill import provider_parts
from ctxlock.economics._promptcache import PROVIDERS
from ctxlock.economics._session import Session, read_session
from ctxlock.errors import CalibrationError, CtxlockError, UsageError
from ctxlock.model._model import load
from ctxlock.outside._files import decode_utf8, read_input
from ctxlock.providers import count_provider, load_calibration

SOURCES = ("prices", "genai-prices")
_LABELS = {
    "read": "read",
    "written_1h": "written 1h",
    "written": "written",
    "uncached": "uncached",
    "output": "output",
    "reasoning": "reasoning",
}

SessionsArg = Annotated[
    list[str],
    typer.Argument(
        help='JSONL sessions: one request per line, or per line {"request": ..., "usage": ..., "timestamp": ...} '
        "(the cache-report format). Each file is billed on its own; - reads stdin.",
        show_default=False,
    ),
]
ProviderOpt = Annotated[
    str,
    typer.Option(
        "--provider",
        help="The caching rule and layout: openai|anthropic (tools → system → messages, each part counted as "
        "the provider counts it by ctxlock.providers: exact, documented or estimated, per part) or vllm (--model's "
        "own render: exact). --model is the cache report's proxy tokenizer for the closed providers.",
    ),
]
PricesOpt = Annotated[
    Path | None,
    typer.Option(
        "--prices",
        help="A price table in LiteLLM's format (JSON or TOML). Without it, genai-prices' bundled data prices "
        "the session (the `prices` extra); with it, genai-prices is compared and every disagreement named.",
    ),
]
SourceOpt = Annotated[
    str,
    typer.Option(
        "--price-source",
        help="Which source prices the bill when both are there: prices (the --prices table, the default: the "
        "table you chose and pinned by its sha256) or genai-prices (its bundled data; --prices is then compared).",
    ),
]
PriceModelOpt = Annotated[
    str | None,
    typer.Option(
        "--price-model",
        help="The price entry for every turn (default: each request's `model`, else the model its usage names).",
    ),
]
NoCompareOpt = Annotated[
    bool, typer.Option("--no-compare", help="Do not price the session with the other source to compare.")
]


def _money(value: Decimal | None) -> str:
    return "-" if value is None else (format(value.normalize(), "f") if value else "0")


def _states(tokens: dict[str, int] | Any, dollars: dict[str, Decimal] | Any) -> str:
    cells = [f"{_LABELS[s]} {tokens.get(s, 0):,} ${_money(d)}" for s, d in dollars.items() if tokens.get(s, 0) or d]
    return " · ".join(cells) if cells else "-"


def _per_million(price: Decimal | None) -> str:
    return "-" if price is None else _money(price * 1_000_000)


def _show(name: str, bill: Bill) -> None:
    console.print(
        f"[bold]{escape(name)}[/] · provider {bill.provider} · {len(bill.turns)} turns · prices "
        f"{escape(bill.table.name)} (sha256 {bill.table.sha256[:16]}…)"
    )
    console.print(f"parts: {escape(bill.layout)}")
    for t in bill.turns:
        tier = f" · tier {t.cost.tier}" if t.cost.tier else ""
        prompt = sum(t.tokens[s] for s in ("read", "written_1h", "written", "uncached"))
        if t.layout_tokens and t.layout_tokens != prompt:
            tier += f" · parts scaled from {t.layout_tokens:,} counted tokens to the {prompt:,} billed"
        console.print(
            f"[bold]#{t.index}[/] {escape(t.model)} · ${_money(t.total)} · {escape(t.figures)}{tier}"
            + (f" · provider's own figure ${_money(t.provider_cost)}" if t.provider_cost is not None else "")
        )
        width = max((len(p.part) for p in t.parts), default=8)
        for p in t.parts:
            line = f"   {p.part:<{width}}  {p.basis:<9}  ${_money(p.total):<14} {_states(p.tokens, p.dollars)}"
            if p.buster is not None:
                line += f"  (buster: ${_money(p.buster)})"
            console.print(escape(line))
        if t.buster is not None:
            b = t.buster
            cost = (
                f"${_money(b.cost)} = ${_money(b.charged)} charged - ${_money(b.as_reads)} as cache reads"
                if b.cost is not None
                else "unpriced: the entry has no cache-read price"
            )
            lost = (
                f"{b.tokens:,} tokens not read"
                if b.tokens
                else "no token lost (the earlier prompt was under what the provider caches)"
            )
            console.print(f"   [yellow]buster[/] {escape(b.part)} ({escape(b.buster.kind)}): {lost}, {escape(cost)}")
    console.print("[bold]per part[/] " + escape(" · ".join(f"{k} ${_money(v)}" for k, v in bill.part_totals().items())))
    console.print(f"[bold]total[/] ${_money(bill.total)}")
    for d in bill.disagreements:
        kinds = "; ".join(f"{k} {_per_million(a)} vs {_per_million(b)}" for k, (a, b) in d.prices.items())
        console.print(
            f"[yellow]prices disagree[/] for {escape(d.model)}: {escape(d.used)} (used) ${_money(d.total_used)} vs "
            f"{escape(d.other)} ${_money(d.total_other)}" + (f" (per million tokens: {escape(kinds)})" if kinds else "")
        )
    if bill.other is not None and not bill.disagreements:
        console.print(f"prices agree with {escape(bill.other.name)}")
    for note in bill.notes:
        console.print(f"[yellow]note[/] {escape(note)}")


CalibrationOpt = Annotated[
    Path | None,
    typer.Option(
        "--calibration",
        help="With --provider openai|anthropic: a calibration file from `ctxlock calibrate`; each turn's parts are "
        "counted calibrated, and the file's sha256 is in the parts' label.",
    ),
]


def _provider_layouts(
    session: Session, provider: str, price_model: str | None, calibration: Path | None = None
) -> tuple[list[list[PartTokens]] | None, str | None]:
    """For anthropic and openai, each turn's parts as `ctxlock.providers.count_provider` counts them for the turn's
    model (OpenAI's text exact under its published encoding, framing and images by the documented rules, the rest
    estimated), in the provider's prefix order. None (the cache report's proxy layout) for vllm; for a turn that
    names no model, or a model the provider's count does not know, the proxy layout too, and the label says why."""
    if provider not in ("openai", "anthropic"):
        if calibration is not None:
            raise UsageError("--calibration applies to openai and anthropic", path="--calibration")
        return None, None
    cal = load_calibration(calibration) if calibration is not None else None
    layouts, tokenizers = [], set()
    for i, (raw, usage, _) in enumerate(session):
        name = price_model or raw.get("model") or (usage.get("model") if isinstance(usage, dict) else None)
        if not isinstance(name, str) or not name:
            return (
                None,
                f"the proxy layout: turn {i} names no model for ctxlock.providers to count (pass --price-model)",
            )
        try:
            counted = count_provider(raw, provider=provider, model=name, calibration=cal)
        except CalibrationError:
            raise
        except CtxlockError as exc:  # a model whose encoding the provider's count does not know
            return None, f"the proxy layout: ctxlock.providers cannot count turn {i} ({exc.message})"
        layouts.append(provider_parts(counted.parts))
        tokenizers.add(counted.tokenizer)
    label = f"ctxlock.providers ({provider}: {', '.join(sorted(tokenizers))}); each part's basis as counted"
    if cal is not None:
        label += f"; calibrated by {cal.source} (sha256 {cal.sha256}: {cal.residuals.summary()})"
    return layouts, label


def register(app: typer.Typer) -> None:
    @app.command("bill")
    def bill_cmd(
        sessions: SessionsArg,
        provider: ProviderOpt,
        model: ModelOpt = None,
        template: TemplateOpt = None,
        prices: PricesOpt = None,
        price_model: PriceModelOpt = None,
        price_source: SourceOpt = "prices",
        no_compare: NoCompareOpt = False,
        ttl: TtlOpt = 300.0,
        min_prefix: MinPrefixOpt = 1024,
        calibration: CalibrationOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Bill a session per request part: the dollars of every turn split over system, each tool, each message
        and document, the template's text, output and reasoning, and by cache state (read, written, uncached),
        adding up exactly to the turn's total. A turn with the provider's usage is that usage priced as
        `ctxlock usage` prices it (equal to the Decimal); without usage the cache report's split is the estimate.
        The part where a turn stops extending the one before (the buster) is charged what it cost: the tokens it
        kept from being read, at what they were billed minus their cache-read price."""

        def go() -> list[tuple[str, Bill]]:
            if provider not in PROVIDERS:
                raise UsageError(f"unknown provider {provider!r}", path="--provider", hint=" or ".join(PROVIDERS))
            if price_source not in SOURCES:
                raise UsageError(
                    f"unknown price source {price_source!r}", path="--price-source", hint=" or ".join(SOURCES)
                )
            table = PriceTable.parse(read_input(prices, label=f"--prices {prices}"), str(prices)) if prices else None
            options: dict[str, Any] = {"chat_template": template_file(template)} if template is not None else {}
            m = load(model)
            out = []
            for name in sessions:
                label = "stdin" if name == "-" else f"SESSION {name}"
                session = read_session(decode_utf8(read_input(name, label=label), label=label), label)
                layouts, layout_label = _provider_layouts(session, provider, price_model, calibration)
                bill = bill_session(
                    m,
                    session,
                    provider,
                    options=options,
                    table=table,
                    source=price_source,
                    compare_sources=not no_compare,
                    price_model=price_model,
                    ttl=ttl,
                    minimum=min_prefix,
                    layouts=layouts,
                    layout_label=layout_label,
                )
                out.append((name, bill))
            return out

        bills = guarded(as_json, go)
        if as_json:
            total = sum((b.total for _, b in bills), Decimal(0))
            print_json({"sessions": [{"file": n, **b.to_dict()} for n, b in bills], "total": _money(total)})
            return
        for name, bill in bills:
            _show(name, bill)
        if len(bills) > 1:
            console.print(f"[bold]all sessions[/] ${_money(sum((b.total for _, b in bills), Decimal(0)))}")
