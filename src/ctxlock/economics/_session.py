"""`ctxlock cache-report`'s computation, shared by the CLI and `ctxlock serve`'s /v1/cache-report: a session (one
request per line, with its usage and time) -> each turn's shared prefix, cache reads and writes, cost and buster.
For anthropic and openai, whose tokenizers are not public, the buster is found on the canonical request's bytes in
the provider's prefix order (`promptcache_bytes`), and token figures are the reported usage's, else estimates: the
same order laid out in the proxy tokenizer's tokens, never through the model's chat template (whose layout is the
model's: mistral-nemo's moves the system prompt to the last user turn). See docs/closed-providers.md."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from ctxlock.accounting import layout
from ctxlock.economics._promptcache import PROVIDERS, Breakpoint, TurnData, TurnReport, retention_note, session_report
from ctxlock.economics._promptcache_bytes import ORDER, ClosedTurn, canonical_bytes, closed_turns, provider_layout
from ctxlock.economics._usage import PriceTable, parse_usage
from ctxlock.errors import RequestError, UsageError
from ctxlock.outside import Utf8Policy, loads_strict
from ctxlock.pipeline import Pipeline

Session = list[tuple[dict[str, Any], Any, float | None]]  # (request as sent, usage object, time in seconds)


def read_session(text: str, name: str) -> Session:
    """(request, usage object or None, time in seconds or None) per line of a session file: a request, or
    {"request": ..., "usage": ..., "timestamp": ISO 8601 or seconds}."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:  # the strict reader: depth, duplicate keys, NaN, long integers and lone surrogates refused by path
            obj = loads_strict(line, f"{name}:{n} $", Utf8Policy.STRICT)
        except json.JSONDecodeError as exc:
            raise RequestError(f"invalid JSON: {exc.msg}", path=f"{name}:{n} column {exc.colno}") from None
        if not isinstance(obj, dict):
            raise RequestError("each line is a request object", path=f"{name}:{n}")
        if "request" in obj:
            request, usage, stamp = obj["request"], obj.get("usage"), obj.get("timestamp")
        else:
            request, usage, stamp = obj, None, None
        out.append((request, usage, parse_time(stamp, f"{name}:{n} $.timestamp")))
    if not out:
        raise RequestError("holds no request", path=name, hint="one request per line")
    return out


def parse_time(stamp: Any, path: str) -> float | None:
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


def build_turns(model: Pipeline, session: Session, options: dict) -> list[TurnData]:
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


def money(value: Decimal | None) -> str:
    return "-" if value is None else (format(value.normalize(), "f") if value else "0")


def sum_or_none(values: list[Decimal | None]) -> Decimal | None:
    return None if any(v is None for v in values) else sum(values, Decimal(0))  # type: ignore[arg-type]


def reports_json(reports: list[TurnReport], closed: list[ClosedTurn] | None = None) -> dict[str, Any]:
    cost, plain = sum_or_none([t.cost for t in reports]), sum_or_none([t.cost_uncached for t in reports])
    return {
        "turns": [t.to_dict() for t in (closed or reports)],
        "cache_read": sum(t.split.cache_read for t in reports),
        "cache_write": sum(t.split.cache_write for t in reports),
        "busted_turns": [t.index for t in reports if t.buster is not None],
        "cost": None if cost is None else money(cost),
        "cost_uncached": None if plain is None else money(plain),
    }


@dataclass(frozen=True)
class CacheRun:
    """A session's report (and the fixed session's, with `fix`), with each turn's closed-provider view."""

    provider: str
    reports: list[TurnReport]
    fixed: list[TurnReport] | None
    estimate: str | None
    closed: list[ClosedTurn] | None = None
    closed_fixed: list[ClosedTurn] | None = None
    proxy_tokenizer: str | None = None  # a closed provider's: the tokenizer that estimated the token figures
    notes: tuple[str, ...] = ()  # what the report could not check (OpenAI's retention without timestamps)

    def to_dict(self) -> dict[str, Any]:
        """`ctxlock cache-report --json`."""
        out = {"provider": self.provider, "estimate": self.estimate, **reports_json(self.reports, self.closed)}
        out["notes"] = list(self.notes)
        if self.proxy_tokenizer is not None:
            out["proxy_tokenizer"] = self.proxy_tokenizer
            out["layout"] = f"provider: {ORDER}, each part's canonical JSON"
        if self.fixed is not None:
            out["fixed"] = reports_json(self.fixed, self.closed_fixed)
        return out


def _report(m: Pipeline, turns_in: Session, provider: str, options: dict[str, Any], kw: dict[str, Any]) -> Any:
    """The report, and for a closed provider (anthropic, openai) each turn's buster named by bytes and its figures
    from the reported usage, else the proxy tokenizer's estimate over the provider's layout."""
    if provider not in ("openai", "anthropic"):
        return session_report(build_turns(m, turns_in, options), provider, **kw), None  # type: ignore[arg-type]
    requests = [m.parse(r) for r, _, _ in turns_in]
    memo: dict[Any, Any] = {}  # one session's serialized tools and messages, reused from turn to turn
    docs = [canonical_bytes(r, memo) for r in requests]
    tokens: dict[Any, Any] = {}  # and their tokens
    turns = []
    for i, ((raw, usage, at), req, doc) in enumerate(zip(turns_in, requests, docs, strict=True)):
        lay = provider_layout(doc, req, m.tokenizer, tokens)
        parsed = parse_usage(usage, path=f"turn {i} $.usage") if usage is not None else None
        # No rendered text: the buster is named on the bytes (`closed_turns`), not on a template's text.
        turns.append(TurnData(lay.ids, "", (), raw, lay.breakpoints(req), at, parsed))
    reports = session_report(turns, provider, **kw)  # type: ignore[arg-type]
    closed = closed_turns(
        reports,
        requests,
        [t.usage for t in turns],
        m.tokenizer.id,
        table=kw["table"],
        price_model=kw["price_model"],
        docs=docs,
    )
    return [c.report for c in closed], closed


def cache_report(
    model: Pipeline,
    session: Session,
    provider: str,
    *,
    options: dict[str, Any],
    table: PriceTable | None = None,
    price_model: str | None = None,
    ttl: float = 300.0,
    minimum: int = 1024,
    fix: bool = False,
) -> CacheRun:
    """The report of `session` under `provider`'s rule (and of the fixed session, with `fix`)."""
    if provider not in PROVIDERS:
        raise UsageError(f"unknown provider {provider!r}", path="--provider", hint=" or ".join(PROVIDERS))
    if table is not None and price_model is None:
        raise UsageError(
            "a price table needs the session's model", path="--price-model", hint="pass --price-model NAME"
        )
    kw = {"ttl": ttl or None, "table": table, "price_model": price_model, "minimum": minimum}
    reports, closed = _report(model, session, provider, options, kw)
    fixed = closed_fixed = None
    if fix:
        fixed, closed_fixed = _report(model, fixed_session(session), provider, options, kw)
    estimate = proxy = None
    if provider in ("openai", "anthropic"):
        proxy = model.tokenizer.id
        estimate = (
            f"busters are exact (the canonical request's bytes, {ORDER}); token figures are the reported usage's "
            f"where a turn has one, else estimates: the proxy tokenizer {proxy} counting the provider's layout "
            f"({ORDER}), not {model.id}'s chat template (the provider's tokenizer is not public)"
        )
    note = retention_note([r for r, _, _ in session], [at for _, _, at in session], provider)
    return CacheRun(provider, reports, fixed, estimate, closed, closed_fixed, proxy, (note,) if note else ())
