"""`ctxlock cache-report`: a session's prompt-cache hits and writes, turn by turn, the cost, and what busts it."""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ..accounting import layout
from ..errors import RecordFormatError, RequestError, UsageError
from ..inputs import decode_utf8, read_input
from ..model import Model, load
from ..promptcache import PROVIDERS, Breakpoint, TurnData, TurnReport, session_report
from ..promptcache_bytes import ORDER, ClosedTurn, closed_turns
from ..replay import record_values
from ..usage import PriceTable, parse_usage
from .files import template_file
from .output import console, guarded, print_json
from .records import open_store, record_at
from .render import JsonOpt, ModelOpt, StoreOpt

Session = list[tuple[dict[str, Any], Any, float | None]]  # (request as sent, usage object, time in seconds)


def read_session(text: str, name: str) -> Session:
    """(request, usage object or None, time in seconds or None) per line of a session file: a request, or
    {"request": ..., "usage": ..., "timestamp": ISO 8601 or seconds}."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise RequestError(f"invalid JSON: {exc.msg}", path=f"{name}:{n} column {exc.colno}") from None
        if not isinstance(obj, dict):
            raise RequestError("each line is a request object", path=f"{name}:{n}")
        if "request" in obj:
            request, usage, stamp = obj["request"], obj.get("usage"), obj.get("timestamp")
        else:
            request, usage, stamp = obj, None, None
        out.append((request, usage, _seconds(stamp, f"{name}:{n} $.timestamp")))
    if not out:
        raise RequestError("holds no request", path=name, hint="one request per line")
    return out


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
            try:
                request = json.loads(raw)
            except ValueError as exc:
                raise RecordFormatError(f"the recorded request is not JSON: {exc}", path=f"record {spec}") from None
            now = (data.get("dynamic") or {}).get("now")
            out.append((request, None, _seconds(now, f"record {spec} dynamic.now")))
    return out


def _seconds(stamp: Any, path: str) -> float | None:
    if stamp is None:
        return None
    if isinstance(stamp, int | float) and not isinstance(stamp, bool):
        return float(stamp)
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise RequestError(f"not a time: {stamp!r}", path=path, hint="ISO 8601 or seconds since the epoch")


def _breakpoints(lay: Any) -> tuple[Breakpoint, ...]:
    """Each cache_control block's prefix (`Request.cache_control`, in the provider's order: tools, system,
    messages), in tokens: up to the end of the block's last rendered character. A block the template never wrote
    has no breakpoint."""
    out = []
    for mark in lay.request.cache_control:
        if mark.get("type") != "ephemeral":
            continue  # not a cache breakpoint Anthropic knows
        path = mark["path"]
        under = (path + ".", path + "[")
        ends = [sp.end for sp in lay.rendered.request_spans if sp.path == path or sp.path.startswith(under)]
        if ends:
            out.append(Breakpoint(lay.tokens_before(max(ends)), "1h" if mark["ttl"] == "1h" else "5m"))
    return tuple(out)


def build_turns(model: Model, session: Session, options: dict) -> list[TurnData]:
    turns = []
    for i, (request, usage, at) in enumerate(session):
        lay = layout(model, request, **options)
        parsed = parse_usage(usage, path=f"turn {i} $.usage") if usage is not None else None
        turns.append(
            TurnData(lay.ids, lay.rendered.text, lay.rendered.request_spans, request, _breakpoints(lay), at, parsed)
        )
    return turns


def fixed_session(
    session: list[tuple[dict[str, Any], Any, float | None]],
) -> list[tuple[dict[str, Any], Any, float | None]]:
    """The session with the usual busters removed: tools sorted by name and their schema keys sorted, and the part
    of the system prompt that changes from turn to turn moved to the end of the last message (after every
    breakpoint). The usage objects are dropped: they belong to the requests as they were sent."""
    systems = [_system_text(r) for r, _, _ in session]
    head = tail = ""
    if all(isinstance(s, str) for s in systems) and len({*systems}) > 1:
        head = _common_prefix(systems)  # type: ignore[arg-type]
        tail = _common_prefix([s[len(head) :][::-1] for s in systems])[::-1]  # type: ignore[index]
    blocks = [r.get("system") for r, _, _ in session]
    varying: list[int] = []
    if all(isinstance(b, list) for b in blocks) and len({len(b) for b in blocks}) == 1:  # type: ignore[arg-type]
        varying = [j for j in range(len(blocks[0])) if len({json.dumps(b[j], sort_keys=True) for b in blocks}) > 1]  # type: ignore[index]
    out = []
    for request, _, at in session:
        r = copy.deepcopy(request)
        if varying:  # Anthropic system blocks that change: after every breakpoint, at the end of the last message
            moved = [r["system"][j] for j in varying]
            r["system"] = [blk for j, blk in enumerate(r["system"]) if j not in varying]
            for blk in moved:
                _append_to_last(r, blk.get("text", "") if isinstance(blk, dict) else str(blk))
        if r.get("tools"):
            r["tools"] = sorted(
                (_sorted_keys(t) for t in r["tools"]),
                key=lambda t: json.dumps(t.get("function", t).get("name", ""), ensure_ascii=False),
            )
        text = _system_text(r)
        if isinstance(text, str) and (head or tail):
            moving = text[len(head) : len(text) - len(tail)]
            _set_system_text(r, head + tail)
            _append_to_last(r, moving)
        out.append((r, None, at))
    return out


def _tool_name(tool: dict[str, Any]) -> str:
    fn = tool.get("function", tool)
    return str(fn.get("name", "")) if isinstance(fn, dict) else ""


def _common_prefix(texts: list[str]) -> str:
    first = min(texts, key=len)
    n = next((i for i in range(len(first)) if any(t[i] != first[i] for t in texts)), len(first))
    return first[:n]


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(v) for v in value]
    return value


def _system_text(r: dict[str, Any]) -> str | None:
    if isinstance(r.get("system"), str):
        return r["system"]
    msgs = r.get("messages") or []
    if (
        msgs
        and isinstance(msgs[0], dict)
        and msgs[0].get("role") == "system"
        and isinstance(msgs[0].get("content"), str)
    ):
        return msgs[0]["content"]
    return None


def _set_system_text(r: dict[str, Any], text: str) -> None:
    if isinstance(r.get("system"), str):
        r["system"] = text
    else:
        r["messages"][0]["content"] = text


def _append_to_last(r: dict[str, Any], text: str) -> None:
    if not text:
        return
    last = r["messages"][-1]
    if isinstance(last.get("content"), str):
        last["content"] = f"{last['content']}\n\n{text}"
    elif isinstance(last.get("content"), list):
        last["content"] = [*last["content"], {"type": "text", "text": text}]


def _money(value: Decimal | None) -> str:
    return "-" if value is None else (format(value.normalize(), "f") if value else "0")


def _show(
    reports: list[TurnReport],
    provider: str,
    estimate: str | None,
    fixed: list[TurnReport] | None,
    closed: list[ClosedTurn] | None = None,
) -> None:
    console.print(f"provider {provider} · {len(reports)} turns" + (f" · {escape(estimate)}" if estimate else ""))
    for k, t in enumerate(reports):
        line = (
            f"#{t.index:<3} input {t.input_tokens:>7,}  shared {t.common_prefix:>7,}  read {t.split.cache_read:>7,}  "
            f"write {t.split.cache_write:>7,}  uncached {t.split.uncached:>7,}  cost {_money(t.cost)}"
        )
        if t.reported_cache_read is not None:
            line += f"  reported read {t.reported_cache_read:,}"
        if closed is not None:
            line += "  (reported)" if closed[k].predicted is not None else "  (estimate)"
        console.print(escape(line))
        if t.buster is not None:
            console.print(f"     [yellow]buster[/] {escape(t.buster.kind)}: {escape(t.buster.message)}")
    _totals("total", reports)
    if fixed is not None:
        _totals("with --fix", fixed)


def _totals(label: str, reports: list[TurnReport]) -> None:
    reads = sum(t.split.cache_read for t in reports)
    writes = sum(t.split.cache_write for t in reports)
    cost = _sum([t.cost for t in reports])
    plain = _sum([t.cost_uncached for t in reports])
    busted = sum(1 for t in reports if t.buster is not None)
    console.print(
        f"[bold]{label}[/]  read {reads:,}  written {writes:,}  turns busted {busted}  cost {_money(cost)}"
        f"  without caching {_money(plain)}"
    )


def _sum(values: list[Decimal | None]) -> Decimal | None:
    return None if any(v is None for v in values) else sum(values, Decimal(0))  # type: ignore[arg-type]


def _as_json(reports: list[TurnReport], closed: list[ClosedTurn] | None = None) -> dict[str, Any]:
    cost, plain = _sum([t.cost for t in reports]), _sum([t.cost_uncached for t in reports])
    return {
        "turns": [t.to_dict() for t in (closed or reports)],
        "cache_read": sum(t.split.cache_read for t in reports),
        "cache_write": sum(t.split.cache_write for t in reports),
        "busted_turns": [t.index for t in reports if t.buster is not None],
        "cost": None if cost is None else _money(cost),
        "cost_uncached": None if plain is None else _money(plain),
    }


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


@dataclass(frozen=True)
class _Run:
    reports: list[TurnReport]
    fixed: list[TurnReport] | None
    estimate: str | None
    closed: list[ClosedTurn] | None = None
    closed_fixed: list[ClosedTurn] | None = None


def _report(m: Model, turns_in: Session, provider: str, options: dict[str, Any], kw: dict[str, Any]) -> Any:
    """The report, and for a closed provider (anthropic, openai) each turn's buster named by bytes and its figures
    from the reported usage, else the proxy's estimate."""
    turns = build_turns(m, turns_in, options)
    reports = session_report(turns, provider, **kw)  # type: ignore[arg-type]
    if provider not in ("openai", "anthropic"):
        return reports, None
    requests = [m.parse(r) for r, _, _ in turns_in]
    closed = closed_turns(
        reports, requests, [t.usage for t in turns], m.id, table=kw["table"], price_model=kw["price_model"]
    )
    return [c.report for c in closed], closed


def _go(session: list[str], provider: str, model: str | None, records: bool, store: Path | None, kw: dict) -> _Run:
    if provider not in PROVIDERS:
        raise UsageError(f"unknown provider {provider!r}", path="--provider", hint=" or ".join(PROVIDERS))
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
    m = load(model)
    options, fix = kw.pop("options"), kw.pop("fix")
    reports, closed = _report(m, turns_in, provider, options, kw)
    fixed = closed_fixed = None
    if fix:
        fixed, closed_fixed = _report(m, fixed_session(turns_in), provider, options, kw)
    estimate = None
    if provider in ("openai", "anthropic"):
        estimate = (
            f"busters are exact (the canonical request's bytes, {ORDER}); token figures are the reported usage's "
            f"where a turn has one, else estimates from {m.id}'s tokenizer (the provider's is not public)"
        )
    return _Run(reports, fixed, estimate, closed, closed_fixed)


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

        def go() -> _Run:
            table = PriceTable.parse(read_input(prices, label=f"--prices {prices}"), str(prices)) if prices else None
            if table is not None and price_model is None:
                raise UsageError(
                    "a price table needs the session's model", path="--price-model", hint="pass --price-model NAME"
                )
            options: dict[str, Any] = {"template": template_file(template)} if template is not None else {}
            kw = {"ttl": ttl or None, "table": table, "price_model": price_model, "minimum": min_prefix}
            return _go(session, provider, model, records, store, {**kw, "options": options, "fix": fix})

        run = guarded(as_json, go)
        if as_json:
            out = {"provider": provider, "estimate": run.estimate, **_as_json(run.reports, run.closed)}
            if run.fixed is not None:
                out["fixed"] = _as_json(run.fixed, run.closed_fixed)
            print_json(out)
        else:
            _show(run.reports, provider, run.estimate, run.fixed, run.closed)
