"""`ctxlock bill`'s computation: a session's dollars per request part, per turn, by cache state (docs/bill.md).

The inputs are three things ctxlock already has: each turn's tokens per part in the order the provider caches
them (a `PartTokens` sequence: from `ctxlock.accounting.runs` for an open model, exact; from the provider's layout
counted by a proxy tokenizer for a closed one, estimated; or from any other counter), the cache report's split and
buster (`cache_report`), and a price table (`PriceTable`, LiteLLM's format, or genai-prices' bundled data).

**A turn's totals.** With the provider's reported usage, a turn's tokens per state and its dollars are that
usage priced by `price_usage`, the code `ctxlock usage` runs: the bill's total equals `usage`'s to the Decimal.
The states: `read` (cache reads), `written_1h` and `written` (cache writes kept an hour, or five minutes),
`uncached` (input at the full price), `output` (output that is not reasoning) and `reasoning`. Without usage the
input split is the cache report's prediction under the provider's rule, no output is known, and the figures are
labelled estimates.

**Per part.** A prompt cache serves a prefix, so the states lie in order along the prompt: the cached prefix is
read first, then the 1-hour writes (Anthropic requires them before the 5-minute ones), then the 5-minute writes,
then the uncached rest. Each part's tokens in each state are its overlap with that stretch, the layout scaled to
the turn's prompt tokens when the count and the usage differ (a closed provider's count is an estimate). Each
state's dollars are divided over the parts in proportion to those overlaps, as exact fractions, and rounded to a
quantum of 10^-12 dollars (finer when the state's dollars are finer) by the largest-remainder rule, so the parts
add up to the state's dollars exactly, and the states to the turn's total. Output and reasoning are parts of
their own.

**The buster.** When a turn stops extending the turn before (the cache report names where), the tokens it would
have read without the buster (what the turn before left in the cache: its whole prompt for OpenAI, at 1,024 tokens
then 128-token steps, and for vLLM in 16-token blocks; its breakpoint prefix, read or written, for Anthropic), from
the end of what it did read, were billed as writes or uncached input; the buster's part is charged the difference
between those dollars and what the same tokens cost as cache reads. That charge names where the money went: it
is already inside the parts' dollars and is never added to a total.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any, Protocol

from ctxlock.accounting import part_of, runs
from ctxlock.economics._genai import available as genai_available
from ctxlock.economics._genai import genai_table
from ctxlock.economics._promptcache import Buster, TurnReport, openai_cached, vllm_cached
from ctxlock.economics._promptcache_bytes import canonical_bytes, estimate_label, provider_layout
from ctxlock.economics._session import Session, cache_report
from ctxlock.economics._usage import Cost, PriceTable, Usage, parse_usage, price_usage, unit_prices
from ctxlock.errors import PriceError
from ctxlock.pipeline import Pipeline

INPUT_STATES = ("read", "written_1h", "written", "uncached")  # in prompt order: what a cache serves comes first
STATES = (*INPUT_STATES, "output", "reasoning")
QUANTUM_EXP = -12  # dollars are apportioned to 10^-12 at least (finer when a state's dollars are finer)
OUTPUT = "output"
REASONING = "reasoning"
UNLAID = "input (no layout)"


@dataclass(frozen=True, slots=True)
class PartTokens:
    """One stretch of a turn's prompt in the provider's order: the part (a request path: `system`, `tools[0]`,
    `messages[3]`, `template`, `framing`), its tokens, and how they were counted ("exact", "documented",
    "estimated"). A part may come back (the template's text between parts); its stretches add up."""

    part: str
    tokens: int
    basis: str = "exact"


class CountedPart(Protocol):
    """What a counter gives per part (`ctxlock.providers.PartCount` is one): a request path, tokens and a basis."""

    @property
    def part(self) -> str: ...
    @property
    def tokens(self) -> int: ...
    @property
    def basis(self) -> str: ...


def _cache_order(part: str) -> tuple[int, int]:
    """Where a part sits in the provider's prefix order (tools → system → messages): the tool-use prompt with the
    tools, documents after the messages, and the message framing last (a simplification: the provider spreads it
    through the messages, and where exactly is not published)."""
    head = part.split("[", 1)[0]
    index = int(part[len(head) + 1 : part.index("]")]) if "[" in part else 0
    rank = {"tool_framing": 0, "tools": 1, "system": 2, "messages": 3, "documents": 4, "framing": 5}
    return rank.get(head, 6), index


def provider_parts(parts: Sequence[CountedPart]) -> list[PartTokens]:
    """A closed provider's count (`ctxlock.providers.count_provider(...).parts`) as the bill's parts: sub-parts
    (`messages[2].content[1]`, `messages[2].tool_calls`) folded into their part, each part's basis its weakest,
    in the provider's prefix order (`_cache_order`)."""
    tokens: dict[str, int] = {}
    bases: dict[str, set[str]] = {}
    for p in parts:
        name = part_of(p.part)
        tokens[name] = tokens.get(name, 0) + p.tokens
        bases.setdefault(name, set()).add(p.basis)
    return [PartTokens(name, tokens[name], _basis(bases[name])) for name in sorted(tokens, key=_cache_order)]


def plain(value: Decimal) -> str:
    """A Decimal in plain notation without trailing zeros."""
    return format(value.normalize(), "f") if value else "0"


@dataclass(frozen=True)
class PartBill:
    part: str
    basis: str
    tokens: Mapping[str, int]  # state -> tokens
    dollars: Mapping[str, Decimal]  # state -> dollars
    buster: Decimal | None = None  # what busting the cache at this part cost (already inside `dollars`)

    @property
    def total(self) -> Decimal:
        return sum(self.dollars.values(), Decimal(0))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "part": self.part,
            "basis": self.basis,
            "tokens": dict(self.tokens),
            "dollars": {k: plain(v) for k, v in self.dollars.items()},
            "total": plain(self.total),
        }
        if self.buster is not None:
            out["buster_cost"] = plain(self.buster)
        return out


@dataclass(frozen=True)
class BusterCharge:
    """What a buster cost its turn: `tokens` of the earlier prompt not read from the cache, `charged` what they
    were billed (writes and uncached input), `as_reads` what they would have cost as cache reads, `cost` the
    difference (None when the price entry has no cache-read price)."""

    buster: Buster
    part: str
    tokens: int
    charged: Decimal
    as_reads: Decimal | None

    @property
    def cost(self) -> Decimal | None:
        return None if self.as_reads is None else self.charged - self.as_reads

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.buster.to_dict(),
            "part": self.part,
            "tokens": self.tokens,
            "charged": plain(self.charged),
            "as_reads": None if self.as_reads is None else plain(self.as_reads),
            "cost": None if self.cost is None else plain(self.cost),
        }


@dataclass(frozen=True)
class TurnBill:
    index: int
    figures: str  # "reported usage" or "estimate: ..."
    model: str  # the price entry's key asked for
    tokens: Mapping[str, int]  # state -> tokens
    dollars: Mapping[str, Decimal]  # state -> dollars
    cost: Cost  # `price_usage`'s: the same figure `ctxlock usage` prints
    parts: tuple[PartBill, ...]
    layout_tokens: int  # the parts' own count of the prompt (the usage's may differ: then the layout is scaled)
    buster: BusterCharge | None = None
    provider_cost: Decimal | None = None  # the provider's own figure, when its usage gave one (Pi)

    @property
    def total(self) -> Decimal:
        return self.cost.total

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn": self.index,
            "figures": self.figures,
            "model": self.model,
            "tokens": dict(self.tokens),
            "dollars": {k: plain(v) for k, v in self.dollars.items()},
            "total": plain(self.total),
            "price_entry": self.cost.price_entry,
            "tier": self.cost.tier,
            "layout_tokens": self.layout_tokens,
            "parts": [p.to_dict() for p in self.parts],
            "buster": None if self.buster is None else self.buster.to_dict(),
            "provider_cost": None if self.provider_cost is None else plain(self.provider_cost),
        }


# -- exact apportioning ----------------------------------------------------------------------------------------


def _largest_remainder(units: int, weights: Sequence[Fraction]) -> list[int]:
    """`units` split over `weights` in proportion, as integers that add up to `units`: each share rounded down,
    then one more unit to the largest remainders (ties to the earlier part)."""
    whole = sum(weights, Fraction(0))
    if not weights:
        return []
    if whole == 0:  # nothing to weigh by: all on the last (a state with dollars but no tokens never reaches here)
        return [0] * (len(weights) - 1) + [units]
    shares = [Fraction(units) * w / whole for w in weights]
    floors = [math.floor(s) for s in shares]
    left = units - sum(floors)
    order = sorted(range(len(shares)), key=lambda k: (-(shares[k] - floors[k]), k))
    for k in order[:left]:
        floors[k] += 1
    return floors


def apportion_tokens(total: int, weights: Sequence[Fraction]) -> list[int]:
    return _largest_remainder(total, weights)


def apportion_dollars(total: Decimal, weights: Sequence[Fraction]) -> list[Decimal]:
    """`total` split over `weights`, in quanta of 10^-12 (or of `total`'s own last digit when finer), adding up
    to `total` exactly."""
    exp = min(int(total.as_tuple().exponent), QUANTUM_EXP)
    with localcontext() as ctx:
        ctx.prec = 100
        units = int(total.scaleb(-exp))
        return [Decimal(u).scaleb(exp) for u in _largest_remainder(units, weights)]


def _overlap(a: Fraction, b: Fraction, lo: Fraction, hi: Fraction) -> Fraction:
    return max(Fraction(0), min(b, hi) - max(a, lo))


# -- one turn --------------------------------------------------------------------------------------------------


def state_dollars(usage: Usage, table: PriceTable, model: str) -> tuple[dict[str, Decimal], Cost, dict[str, Decimal]]:
    """The usage's dollars by state, adding up to `price_usage`'s total exactly, with that cost and the prices per
    token that applied (a long-context tier's when the prompt is over its threshold)."""
    cost = price_usage(usage, table, model)
    _, prices, _ = unit_prices(usage, table, model)
    hour = prices["cache_write_1h"] * usage.cache_write_1h if usage.cache_write_1h else Decimal(0)
    reasoning = usage.reasoning or 0
    think = prices.get("reasoning", prices.get("output", Decimal(0))) * reasoning if reasoning else Decimal(0)
    out = {
        "read": cost.cache_read or Decimal(0),
        "written_1h": hour,
        "written": (cost.cache_write or Decimal(0)) - hour,
        "uncached": cost.input or Decimal(0),
        OUTPUT: (cost.output or Decimal(0)) - think,
        REASONING: think,
    }
    assert sum(out.values(), Decimal(0)) == cost.total  # each state is a piece of price_usage's own sum
    return out, cost, prices


def _state_tokens(usage: Usage) -> dict[str, int]:
    reasoning = usage.reasoning or 0
    return {
        "read": usage.cache_read,
        "written_1h": usage.cache_write_1h,
        "written": usage.cache_write - usage.cache_write_1h,
        "uncached": usage.input,
        OUTPUT: usage.output - reasoning,
        REASONING: reasoning,
    }


def _intervals(tokens: Mapping[str, int]) -> dict[str, tuple[Fraction, Fraction]]:
    out, pos = {}, 0
    for state in INPUT_STATES:
        out[state] = (Fraction(pos), Fraction(pos + tokens[state]))
        pos += tokens[state]
    return out


def bill_turn(
    index: int,
    parts: Sequence[PartTokens],
    usage: Usage,
    table: PriceTable,
    model: str,
    *,
    figures: str,
    buster: Buster | None = None,
    previous_prompt: int | None = None,
    would_read: Callable[[int], int] = lambda n: n,
) -> TurnBill:
    """One turn's bill: `usage` (reported, or the cache report's estimate) priced, each input state's dollars
    apportioned over `parts` by their positions, output and reasoning as parts of their own, and the buster's
    part charged what the buster cost (see the module docstring): `previous_prompt` is what the turn before left
    in the cache, `would_read` what the provider's rule reads of a prefix that long."""
    dollars, cost, prices = state_dollars(usage, table, model)
    tokens = _state_tokens(usage)
    prompt = usage.prompt_tokens
    laid = [p for p in parts if p.tokens > 0]
    n = sum(p.tokens for p in laid)
    if prompt and not n:
        laid, n = [PartTokens(UNLAID, prompt, "estimated")], prompt
    scale = Fraction(prompt, n) if n else Fraction(0)
    names: dict[str, int] = {}  # part -> row, in order of first appearance
    segments: list[tuple[int, Fraction, Fraction]] = []
    bases: list[set[str]] = []
    pos = 0
    for p in laid:
        row = names.setdefault(p.part, len(names))
        if row == len(bases):
            bases.append(set())
        bases[row].add(p.basis)
        segments.append((row, pos * scale, (pos + p.tokens) * scale))
        pos += p.tokens
    spans = _intervals(tokens)
    part_tokens: list[dict[str, int]] = [{} for _ in names]
    part_dollars: list[dict[str, Decimal]] = [{} for _ in names]
    for state in INPUT_STATES:
        lo, hi = spans[state]
        weights = [Fraction(0)] * len(names)
        for row, a, b in segments:
            weights[row] += _overlap(a, b, lo, hi)
        if not tokens[state] and not dollars[state]:
            continue
        for row, t in enumerate(apportion_tokens(tokens[state], weights)):
            part_tokens[row][state] = t
        for row, d in enumerate(apportion_dollars(dollars[state], weights)):
            part_dollars[row][state] = d
    rows = [PartBill(name, _basis(bases[row]), part_tokens[row], part_dollars[row]) for name, row in names.items()]
    for state in (OUTPUT, REASONING):
        if tokens[state] or dollars[state]:
            rows.append(
                PartBill(
                    state,
                    "reported" if figures == "reported usage" else "unknown",
                    {state: tokens[state]},
                    {state: dollars[state]},
                )
            )
    charge = None
    if buster is not None and previous_prompt is not None:
        charge = _charge(buster, tokens, dollars, prices, would_read(min(previous_prompt, prompt)))
        rows = [replace(r, buster=charge.cost) if r.part == charge.part else r for r in rows]
        if charge.part not in names:  # "tools" (reordered) or a part this turn no longer has: its own row
            rows.append(PartBill(charge.part, "buster", {}, {}, buster=charge.cost))
    provider_cost = usage.cost.total if usage.cost is not None and usage.cost.total_from_provider else None
    return TurnBill(index, figures, model, tokens, dollars, cost, tuple(rows), n, charge, provider_cost)


def _basis(bases: set[str]) -> str:
    for b in ("estimated", "documented", "exact"):
        if b in bases:
            return b  # the weakest basis of a part's stretches
    return sorted(bases)[0]


def _charge(
    buster: Buster,
    tokens: Mapping[str, int],
    dollars: Mapping[str, Decimal],
    prices: Mapping[str, Decimal],
    would_read: int,
) -> BusterCharge:
    """What the tokens the turn no longer read cost beyond cache reads: the stretch from the end of its read to
    where it would have read without the buster, billed as writes or uncached input."""
    start = tokens["read"]
    lost = max(0, would_read - start)
    spans = _intervals(tokens)
    charged = Fraction(0)
    for state in ("written_1h", "written", "uncached"):
        lo, hi = spans[state]
        if hi > lo:
            charged += Fraction(dollars[state]) * _overlap(Fraction(start), Fraction(start + lost), lo, hi) / (hi - lo)
    exp = QUANTUM_EXP
    with localcontext() as ctx:
        ctx.prec = 100
        charged_d = (Decimal(charged.numerator) / Decimal(charged.denominator)).quantize(Decimal(1).scaleb(exp))
    read_price = prices.get("cache_read")
    as_reads = None if read_price is None else read_price * lost
    part = "tools" if buster.kind == "tools reordered" else part_of(buster.path)
    return BusterCharge(buster, part, lost, charged_d, as_reads)


# -- a session -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Disagreement:
    """Two price sources that price the same model differently: each kind's price per token in both, the session's
    total under both, and which one the bill used."""

    model: str
    used: str
    other: str
    prices: Mapping[str, tuple[Decimal | None, Decimal | None]]  # kind -> (used, other), per token
    total_used: Decimal
    total_other: Decimal | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "used": self.used,
            "other": self.other,
            "prices_per_million": {
                k: [None if a is None else plain(a * 1_000_000), None if b is None else plain(b * 1_000_000)]
                for k, (a, b) in self.prices.items()
            },
            "total_used": plain(self.total_used),
            "total_other": None if self.total_other is None else plain(self.total_other),
        }


@dataclass(frozen=True)
class Bill:
    turns: tuple[TurnBill, ...]
    table: PriceTable
    provider: str
    layout: str  # where the per-part counts came from
    other: PriceTable | None = None  # the second source, when one was compared
    disagreements: tuple[Disagreement, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def total(self) -> Decimal:
        return sum((t.total for t in self.turns), Decimal(0))

    def part_totals(self) -> dict[str, Decimal]:
        """Each part's dollars over the session, the prompt's parts first (in the provider's prefix order,
        `_cache_order`), then output and reasoning."""
        out: dict[str, Decimal] = {}
        for t in self.turns:
            for p in t.parts:
                out[p.part] = out.get(p.part, Decimal(0)) + p.total
        last = [k for k in (OUTPUT, REASONING) if k in out]
        first = sorted((k for k in out if k not in last), key=_cache_order)
        return {**{k: out[k] for k in first}, **{k: out[k] for k in last}}

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "layout": self.layout,
            "prices": {"name": self.table.name, "sha256": self.table.sha256},
            "compared_with": None if self.other is None else {"name": self.other.name, "sha256": self.other.sha256},
            "disagreements": [d.to_dict() for d in self.disagreements],
            "turns": [t.to_dict() for t in self.turns],
            "parts": {k: plain(v) for k, v in self.part_totals().items()},
            "total": plain(self.total),
            "notes": list(self.notes),
        }


def bill_turns(
    layouts: Sequence[Sequence[PartTokens]],
    reports: Sequence[TurnReport],
    usages: Sequence[Usage | None],
    models: Sequence[str],
    table: PriceTable,
    *,
    provider: str = "anthropic",
    minimum: int = 1024,
) -> list[TurnBill]:
    """Each turn's bill: its reported usage when it has one, else the cache report's split (no output), labelled
    an estimate; the buster of the cache report charged to its part, for the tokens of the earlier prompt the
    provider's rule would have read (`would_read`)."""

    def would_read(held: int) -> int:
        if provider == "openai":
            return openai_cached(held)
        if provider == "vllm":
            return vllm_cached(held)
        return held if held >= minimum else 0  # Anthropic: the breakpoint prefix the earlier turn read or wrote

    out: list[TurnBill] = []
    previous: int | None = None
    for i, (parts, report, usage, model) in enumerate(zip(layouts, reports, usages, models, strict=True)):
        if usage is not None:
            u, figures = replace(usage, model=model), "reported usage"
        else:
            s = report.split
            u = Usage(
                input=s.uncached,
                output=0,
                cache_read=s.cache_read,
                cache_write=s.cache_write,
                cache_write_1h=s.cache_write_1h,
                model=model,
                source="estimate",
            )
            figures = "estimate (no usage: the cache report's split, no output)"
        out.append(
            bill_turn(
                i,
                parts,
                u,
                table,
                model,
                figures=figures,
                buster=report.buster,
                previous_prompt=previous,
                would_read=would_read,
            )
        )
        # What this turn leaves in the cache for the next: OpenAI and vLLM cache the whole prompt (at their
        # granularity); Anthropic the breakpoint prefix it read or wrote.
        previous = u.cache_read + u.cache_write if provider == "anthropic" else u.prompt_tokens
    return out


def compare(turns: Sequence[TurnBill], used: PriceTable, other: PriceTable) -> tuple[list[Disagreement], list[str]]:
    """Each model the two tables price differently for what the session used, and notes for a model the other
    table does not price."""
    out, notes = [], []
    by_model: dict[str, list[TurnBill]] = {}
    for t in turns:
        by_model.setdefault(t.model, []).append(t)
    for model, ts in by_model.items():
        usages = [_usage_of(t) for t in ts]
        try:
            other_total: Decimal | None = sum((price_usage(u, other, model).total for u in usages), Decimal(0))
        except PriceError as exc:
            notes.append(f"{other.name} does not price {model!r} as used here ({exc.message}): not compared")
            continue
        kinds: dict[str, tuple[Decimal | None, Decimal | None]] = {}
        for u in usages:
            _, a, _ = unit_prices(u, used, model)
            _, b, _ = unit_prices(u, other, model)
            for kind in _used_kinds(u):
                if a.get(kind) != b.get(kind):
                    kinds[kind] = (a.get(kind), b.get(kind))
        total = sum((t.total for t in ts), Decimal(0))
        if kinds or other_total != total:
            out.append(Disagreement(model, used.name, other.name, kinds, total, other_total))
    return out, notes


def _used_kinds(u: Usage) -> list[str]:
    kinds = []
    for kind, n in (
        ("input", u.input),
        ("cache_read", u.cache_read),
        ("cache_write", u.cache_write - u.cache_write_1h),
        ("cache_write_1h", u.cache_write_1h),
        ("output", u.output - (u.reasoning or 0)),
        ("reasoning", u.reasoning or 0),
    ):
        if n:
            kinds.append(kind)
    return kinds


def _usage_of(t: TurnBill) -> Usage:
    k = t.tokens
    return Usage(
        input=k["uncached"],
        output=k[OUTPUT] + k[REASONING],
        cache_read=k["read"],
        cache_write=k["written"] + k["written_1h"],
        cache_write_1h=k["written_1h"],
        reasoning=k[REASONING] or None,
        model=t.model,
    )


def request_bill(parts: Sequence[PartTokens], table: PriceTable, model: str) -> TurnBill:
    """One request on its own (`ctxlock count --prices`): every input token uncached (a single request has no
    cache history), each part's dollars its tokens at the input price, adding up to the request's."""
    n = sum(p.tokens for p in parts)
    return bill_turn(0, parts, Usage(input=n, output=0, model=model), table, model, figures="estimate: uncached")


__all__ = [
    "INPUT_STATES",
    "STATES",
    "Bill",
    "BusterCharge",
    "Disagreement",
    "PartBill",
    "PartTokens",
    "TurnBill",
    "apportion_dollars",
    "apportion_tokens",
    "bill_session",
    "bill_turn",
    "bill_turns",
    "compare",
    "plain",
    "provider_parts",
    "request_bill",
    "session_layouts",
    "state_dollars",
]


def session_layouts(
    model: Pipeline, session: Session, provider: str, options: Mapping[str, Any]
) -> tuple[list[list[PartTokens]], str]:
    """Each turn's parts in the provider's order, and where they come from: for anthropic and openai, the
    canonical request in their order (tools → system → messages) counted by `model`'s tokenizer as a proxy
    (estimated); for an open model (vllm), `ctxlock.accounting.runs` over its own render (exact)."""
    if provider in ("openai", "anthropic"):
        memo: dict[Any, Any] = {}
        tokens: dict[Any, Any] = {}
        out = []
        for raw, _, _ in session:
            request = model.parse(raw)
            lay = provider_layout(canonical_bytes(request, memo), request, model.tokenizer, tokens)
            out.append([PartTokens(p, n, "estimated") for p, n in lay.parts])
        return out, estimate_label(model.tokenizer.id)
    layouts = [[PartTokens(p, n, "exact") for p, n in runs(model, raw, **options)] for raw, _, _ in session]
    return layouts, f"exact: {model.id}'s tokens by part (ctxlock.accounting)"


def bill_session(
    model: Pipeline,
    session: Session,
    provider: str,
    *,
    options: Mapping[str, Any],
    table: PriceTable | None,
    source: str = "prices",
    compare_sources: bool = True,
    price_model: str | None = None,
    ttl: float = 300.0,
    minimum: int = 1024,
    layouts: Sequence[Sequence[PartTokens]] | None = None,
    layout_label: str | None = None,
) -> Bill:
    """The bill of a session: its cache report (`cache_report`), each turn's parts (`layouts`, default
    `session_layouts`), priced with `table` (source "prices") or genai-prices' bundled data ("genai-prices", the
    only source when no table is given); with `compare_sources`, the other source prices the same turns and every
    model they disagree on is named."""
    run = cache_report(model, session, provider, options=dict(options), ttl=ttl, minimum=minimum)
    usages = [
        parse_usage(u, path=f"turn {i} $.usage") if u is not None else None for i, (_, u, _) in enumerate(session)
    ]
    models = []
    for i, ((raw, _, _), usage) in enumerate(zip(session, usages, strict=True)):
        name = price_model or raw.get("model") or (usage.model if usage is not None else None)
        if not isinstance(name, str) or not name:
            raise PriceError(f"turn {i} names no model", path=f"turn {i} $.model", hint="pass --price-model NAME")
        models.append(name)
    if layouts is None:
        layouts, proxy = session_layouts(model, session, provider, options)
        layout_label = f"{layout_label}; {proxy}" if layout_label else proxy
    use_genai = table is None or source == "genai-prices"
    genai, notes = None, list(run.notes)
    if use_genai or (compare_sources and genai_available()):
        times = [at for _, _, at in session if at is not None]
        when = datetime.fromtimestamp(times[0], UTC) if times else None
        try:
            genai = genai_table(models, provider=provider if provider != "vllm" else None, at=when).table
        except PriceError as exc:
            if use_genai:
                raise
            notes.append(f"not compared with genai-prices: {exc.message}")
    used = genai if use_genai else table
    other = (table if use_genai else genai) if compare_sources else None
    assert used is not None
    turns = bill_turns(layouts, run.reports, usages, models, used, provider=provider, minimum=minimum)
    disagreements: list[Disagreement] = []
    if other is not None and compare_sources:
        disagreements, more = compare(turns, used, other)
        notes += more
    if any(u is None for u in usages):
        notes.append(
            f"{sum(u is None for u in usages)} of {len(usages)} turns have no usage: their figures are estimates "
            "(the cache report's split, no output)"
        )
    return Bill(tuple(turns), used, provider, layout_label or "given", other, tuple(disagreements), tuple(notes))
