"""`ctxlock cache-report`: a session's prompt-cache hits and writes, turn by turn, the cost, and what busts it. The
computation is `ctxlock.economics` (shared with `ctxlock serve`); this module reads the files and records and
prints."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ctxlock.cli.files import template_file
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.records import open_store, record_at
from ctxlock.cli.render import TEMPLATE_HELP, JsonOpt, ModelOpt, StoreOpt
from ctxlock.economics._promptcache import PROVIDERS, TurnReport
from ctxlock.economics._promptcache_bytes import ClosedTurn
from ctxlock.economics._session import CacheRun, Session, money, parse_time, read_session, sum_or_none
from ctxlock.economics._session import cache_report as report_session
from ctxlock.economics._usage import PriceTable
from ctxlock.errors import CtxlockError, RecordFormatError, RequestError, UsageError
from ctxlock.model._model import load
from ctxlock.outside._files import decode_utf8, read_input
from ctxlock.outside._json import Utf8Policy, decode_bytes, loads_strict
from ctxlock.records._replay import record_values


def record_ids(args: list[str]) -> list[str]:
    """The record ids of `--records`: each argument an id, an id prefix or a record file; `@FILE` a text file of
    them, one per line (blank lines and `#` comments skipped; `@-` reads stdin)."""
    out: list[str] = []
    for arg in args:
        if not arg.startswith("@"):
            out.append(arg)
            continue
        name = arg[1:]
        label = "stdin" if name == "-" else f"SESSION {arg}"
        text = decode_utf8(read_input(name, label=label), label=label)
        out += [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not out:
        raise RequestError("no record id given", path="SESSION", hint="pass record ids, or @FILE with one per line")
    return out


def read_records(ids: list[str], store: Path | None) -> Session:
    """(request as sent, None, time in seconds) per record, in the order given: the request's bytes as the record
    kept them, and the time the record's render ran (`dynamic.now`). Records carry no provider usage."""
    opened = open_store(store)
    out = []
    for spec in ids:
        record = record_at(spec, opened, option="SESSION")
        with record_values(record):
            data = record.data
            raw = base64.b64decode(data["request"]["bytes_b64"], validate=True)
            try:  # the strict reader, under the policy that lets any recorded request be read (utf8='replace')
                text, _ = decode_bytes(raw, Utf8Policy.REPLACE)
                request = loads_strict(text, f"record {spec} request", Utf8Policy.REPLACE, source=raw)
            except (ValueError, CtxlockError) as exc:
                raise RecordFormatError(f"the recorded request is not JSON: {exc}", path=f"record {spec}") from None
            now = (data.get("dynamic") or {}).get("now")
            out.append((request, None, parse_time(now, f"record {spec} dynamic.now")))
    return out


def _show(
    reports: list[TurnReport],
    provider: str,
    estimate: str | None,
    fixed: list[TurnReport] | None,
    closed: list[ClosedTurn] | None = None,
    proxy: str | None = None,
) -> None:
    console.print(f"provider {provider} · {len(reports)} turns" + (f" · {escape(estimate)}" if estimate else ""))
    for k, t in enumerate(reports):
        line = (
            f"#{t.index:<3} input {t.input_tokens:>7,}  shared {t.common_prefix:>7,}  read {t.split.cache_read:>7,}  "
            f"write {t.split.cache_write:>7,}  uncached {t.split.uncached:>7,}  cost {money(t.cost)}"
        )
        if t.reported_cache_read is not None:
            line += f"  reported read {t.reported_cache_read:,}"
        if closed is not None:
            line += "  (reported)" if closed[k].predicted is not None else f"  (estimate: {proxy})"
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
    list[str],
    typer.Argument(
        help='A JSONL session: one request per line, or per line {"request": ..., "usage": ..., "timestamp": ...}. '
        "- reads stdin. With --records: record ids (or id prefixes, or record files) in turn order, and @FILE for "
        "a text file of ids, one per line.",
        show_default=False,
    ),
]
RecordsOpt = Annotated[
    bool,
    typer.Option(
        "--records",
        help="SESSION names stored records (ctxlock render --record, fit --record): each turn is the request a "
        "record kept, timed by the record's render (dynamic.now). Records carry no usage.",
    ),
]
ProviderOpt = Annotated[str, typer.Option("--provider", help="The caching rule: " + "|".join(PROVIDERS) + ".")]
TemplateOpt = Annotated[str | None, typer.Option("--template", "-t", help=TEMPLATE_HELP)]
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


def _go(session: list[str], provider: str, model: str | None, records: bool, store: Path | None, kw: dict) -> CacheRun:
    if provider not in PROVIDERS:
        raise UsageError(f"unknown provider {provider!r}", path="--provider", hint=" or ".join(PROVIDERS))
    turns_in: Session
    if records:
        turns_in = read_records(record_ids(session), store)
    else:
        if len(session) != 1:
            raise UsageError(
                f"a JSONL session is one file, got {len(session)}",
                path="SESSION",
                hint="pass --records to list record ids",
            )
        label = "stdin" if session[0] == "-" else f"SESSION {session[0]}"
        turns_in = read_session(decode_utf8(read_input(session[0], label=label), label=label), label)
    return report_session(load(model), turns_in, provider, **kw)


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
        records: RecordsOpt = False,
        store: StoreOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """For every turn of a session: the token prefix it shares with earlier requests (within the TTL), what the
        provider's cache reads and writes under its rule (OpenAI: 1,024 tokens then 128-token steps; Anthropic:
        cache_control breakpoints; vLLM: 16-token blocks), the cost with and without caching, and the buster: the
        first place the request stops extending the one before, named by its path in the request. For anthropic and
        openai, whose tokenizers are not public, the buster is found on the request's canonical bytes in the
        provider's prefix order (tools, system, messages), and token figures are the reported usage's, else
        estimates from the model given. SESSION is a JSONL file, or with --records a list of stored records."""

        def go() -> CacheRun:
            table = PriceTable.parse(read_input(prices, label=f"--prices {prices}"), str(prices)) if prices else None
            if table is not None and price_model is None:
                raise UsageError(
                    "a price table needs the session's model", path="--price-model", hint="pass --price-model NAME"
                )
            options: dict[str, Any] = {"chat_template": template_file(template)} if template is not None else {}
            kw = {"ttl": ttl, "table": table, "price_model": price_model, "minimum": min_prefix}
            return _go(session, provider, model, records, store, {**kw, "options": options, "fix": fix})

        run = guarded(as_json, go)
        if as_json:
            print_json(run.to_dict())
        else:
            _show(run.reports, provider, run.estimate, run.fixed, run.closed, run.proxy_tokenizer)
            for note in run.notes:
                console.print(f"[yellow]note[/] {escape(note)}")
