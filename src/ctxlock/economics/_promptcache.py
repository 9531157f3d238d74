"""Prompt-cache economics (docs/prompt-caching.md): how many input tokens a provider serves from its cache, and at what
cost.

Providers match an exact prefix, at their own granularity (not byte by byte: each provider's prompt-caching docs):

- **OpenAI** caches automatically: a request whose prefix matches an earlier one's for at least 1,024 tokens reads
  the match from the cache, in 128-token steps (1,024, 1,152, 1,280, …). Writes cost nothing extra. A request's
  `prompt_cache_key` is combined with the prefix hash that routes it, so requests with different keys are modelled
  as not sharing a cache (the same prefix and key are routed together); `prompt_cache_retention` "in_memory" (the
  default: the report's `ttl`) or "24h" (extended retention: a prefix stays up to 24 hours). The rules:
  https://platform.openai.com/docs/guides/prompt-caching (How it works; Prompt cache retention).
- **Anthropic** caches at `cache_control` breakpoints (at most 4 per request), each with a TTL of 5 minutes or 1
  hour, and only prefixes of at least the model's minimum length. A request reads the longest breakpoint prefix it
  wrote earlier (within the TTL), and writes every longer breakpoint prefix: at 1.25x the input price for 5
  minutes, 2x for an hour, where a read costs 0.1x (the multipliers are the price table's, never constants).
- **vLLM** (automatic prefix caching) reuses full blocks of 16 tokens of the longest prefix it has computed.

A prefix broken on every turn (a timestamp at the top, tools in an unstable order) pays the write every turn and
never the read. `cached_tokens` gives what each rule serves for a given common prefix, and `turn_cost` prices a
turn's split with and without caching from a price table (`ctxlock.economics.PriceTable`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import numpy as np

from ctxlock.economics._usage import PriceTable, Usage, price_usage
from ctxlock.errors import UsageError
from ctxlock.template import Span

Provider = Literal["openai", "anthropic", "vllm"]
PROVIDERS: tuple[str, ...] = ("openai", "anthropic", "vllm")

OPENAI_MIN = 1024
OPENAI_STEP = 128
# `prompt_cache_retention`: "in_memory" (the default) or "24h", which keeps a prefix up to 24 hours
# (https://platform.openai.com/docs/guides/prompt-caching#prompt-cache-retention).
OPENAI_RETENTIONS = ("in_memory", "24h")
OPENAI_EXTENDED_TTL = 24 * 3600.0
VLLM_BLOCK = 16
ANTHROPIC_MAX_BREAKPOINTS = 4
ANTHROPIC_DEFAULT_MIN = 1024  # the shortest cacheable prefix when the price table does not give the model's


def openai_cached(common: int) -> int:
    """Tokens OpenAI serves from its cache for a prefix of `common` tokens shared with an earlier request."""
    if common < OPENAI_MIN:
        return 0
    return OPENAI_MIN + (common - OPENAI_MIN) // OPENAI_STEP * OPENAI_STEP


def vllm_cached(common: int, block: int = VLLM_BLOCK) -> int:
    """Tokens vLLM's prefix cache reuses: the full blocks of the shared prefix."""
    return common // block * block


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """An Anthropic `cache_control` breakpoint: the prefix up to token `end` (exclusive), with its TTL."""

    end: int
    ttl: Literal["5m", "1h"] = "5m"


@dataclass(frozen=True, slots=True)
class Split:
    """One turn's input tokens by how the provider bills them."""

    cache_read: int
    cache_write: int
    cache_write_1h: int
    uncached: int

    @property
    def total(self) -> int:
        return self.cache_read + self.cache_write + self.uncached


def anthropic_split(
    total: int, breakpoints: Sequence[Breakpoint], written_before: int, *, minimum: int = ANTHROPIC_DEFAULT_MIN
) -> Split:
    """How Anthropic bills a request of `total` input tokens with these breakpoints, when the longest breakpoint
    prefix it wrote earlier and still holds (within its TTL, byte-identical) ends at token `written_before` (0: none).

    The read is that prefix; every breakpoint beyond it, of at least `minimum` tokens, is written (the last one
    decides how far the write goes; a 1-hour breakpoint's part is `cache_write_1h`); the rest is uncached input."""
    if len(breakpoints) > ANTHROPIC_MAX_BREAKPOINTS:
        raise UsageError(
            f"{len(breakpoints)} cache_control breakpoints; Anthropic allows at most {ANTHROPIC_MAX_BREAKPOINTS}",
            path="cache_control",
            hint="remove breakpoints: the API rejects the request",
        )
    points = sorted((b for b in breakpoints if b.end <= total), key=lambda b: b.end)
    read = written_before if written_before >= minimum else 0
    write = write_1h = 0
    pos = read
    for b in points:
        if b.end <= pos or b.end < minimum:
            continue
        if b.ttl == "1h":
            write_1h += b.end - pos
        write += b.end - pos
        pos = b.end
    return Split(cache_read=read, cache_write=write, cache_write_1h=write_1h, uncached=total - read - write)


def cached_split(provider: Provider, total: int, common: int) -> Split:
    """The split of an automatically cached provider (OpenAI, vLLM) for a request of `total` tokens sharing
    `common` tokens with an earlier one."""
    if provider == "openai":
        read = openai_cached(min(common, total))
    elif provider == "vllm":
        read = vllm_cached(min(common, total))
    else:
        raise UsageError(f"{provider} caches at breakpoints: use anthropic_split", path="--provider")
    return Split(cache_read=read, cache_write=0, cache_write_1h=0, uncached=total - read)


def turn_cost(split: Split, output: int, table: PriceTable, model: str) -> tuple[Decimal, Decimal]:
    """(cost with caching, cost without) of one turn: the same input tokens, billed as `split` or all at the full
    input price, plus `output` output tokens. Prices and cache multipliers come from the table."""
    cached = Usage(
        input=split.uncached,
        output=output,
        cache_read=split.cache_read,
        cache_write=split.cache_write,
        cache_write_1h=split.cache_write_1h,
        model=model,
    )
    plain = Usage(input=split.total, output=output, model=model)
    return price_usage(cached, table).total, price_usage(plain, table).total


__all__ = [
    "OPENAI_EXTENDED_TTL",
    "OPENAI_RETENTIONS",
    "PROVIDERS",
    "Breakpoint",
    "Buster",
    "Split",
    "TurnData",
    "TurnReport",
    "anthropic_split",
    "cached_split",
    "name_buster",
    "openai_cache_options",
    "openai_cached",
    "retention_note",
    "session_report",
    "turn_cost",
    "vllm_cached",
]


# -- a session, turn by turn -------------------------------------------------------------------------------------

BLOCK = 16  # tokens per hashed block when looking up the longest earlier prefix


@dataclass(frozen=True)
class TurnData:
    """One turn of a session as the report needs it: its ids and rendered text with the request's spans, the
    request as sent, its Anthropic breakpoints (token positions), when it was sent (seconds), and what the provider
    reported, if anything."""

    ids: np.ndarray
    text: str
    spans: tuple[Span, ...]
    raw: Mapping[str, Any]
    breakpoints: tuple[Breakpoint, ...] = ()
    at: float | None = None
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class Buster:
    """What broke the cached prefix at a turn: `kind` is "content", "tools reordered", "schema key order" or
    "template rewrite"; `path` is where in the request; `message` says it with both sides' text."""

    kind: str
    path: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "path": self.path, "message": self.message}


@dataclass(frozen=True, slots=True)
class TurnReport:
    index: int
    input_tokens: int
    common_prefix: int  # the longest token prefix shared with an earlier request still within the TTL
    split: Split
    output_tokens: int
    cost: Decimal | None  # with caching, under the provider's rule
    cost_uncached: Decimal | None  # every input token at the full price
    reported_cache_read: int | None  # what the provider said it read, when usage was given
    buster: Buster | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn": self.index,
            "input_tokens": self.input_tokens,
            "common_prefix": self.common_prefix,
            "cache_read": self.split.cache_read,
            "cache_write": self.split.cache_write,
            "cache_write_1h": self.split.cache_write_1h,
            "uncached": self.split.uncached,
            "output_tokens": self.output_tokens,
            "cost": None if self.cost is None else _plain(self.cost),
            "cost_uncached": None if self.cost_uncached is None else _plain(self.cost_uncached),
            "reported_cache_read": self.reported_cache_read,
            "buster": None if self.buster is None else self.buster.to_dict(),
        }


def _plain(value: Decimal) -> str:
    return format(value.normalize(), "f") if value else "0"


class _Prefixes:
    """Every earlier request's prefixes, by a chained hash per 16-token block: the longest one a new request shares,
    within the TTL, in O(new tokens) per request (a chain is extended from the previous request's where they agree)."""

    def __init__(self, ttl: float | None) -> None:
        self.ttl = ttl
        self.seen: dict[bytes, tuple[int, float | None]] = {}  # block-chain hash -> (turn, last used)
        self.chains: list[list[bytes]] = []
        self.ids: list[np.ndarray] = []
        self.times: list[float | None] = []
        self.ttls: list[float | None] = []  # each request's own retention (OpenAI's `prompt_cache_retention`)

    def _chain(self, ids: np.ndarray) -> list[bytes]:
        n = len(ids) // BLOCK
        reuse: list[bytes] = []
        if self.ids:
            prev, prev_chain = self.ids[-1], self.chains[-1]
            same = _common(ids, prev) // BLOCK
            reuse = prev_chain[: min(same, len(prev_chain))]
        chain = list(reuse)
        h = chain[-1] if chain else b""
        data = ids.astype("<i8", copy=False).tobytes()
        for k in range(len(chain), n):
            h = hashlib.blake2b(h + data[k * BLOCK * 8 : (k + 1) * BLOCK * 8], digest_size=16).digest()
            chain.append(h)
        return chain

    def longest(self, ids: np.ndarray, at: float | None, ttl: float | None = -1.0) -> tuple[int, int | None]:
        """(common prefix length, the earlier turn it is shared with) and record this request's prefixes, kept for
        `ttl` seconds (-1: the report's; None: no expiry)."""
        chain = self._chain(ids)
        best, turn = 0, None
        for k in range(len(chain) - 1, -1, -1):
            hit = self.seen.get(chain[k])
            if hit is not None and self._alive(hit[0], at):
                turn = hit[0]
                best = (k + 1) * BLOCK + _common(ids[(k + 1) * BLOCK :], self.ids[turn][(k + 1) * BLOCK :])
                break
        if turn is None:  # nothing shared for a whole block: the longest shorter prefix, among live requests
            for j in range(len(self.ids) - 1, -1, -1):
                if self._alive(j, at):
                    c = _common(ids, self.ids[j])
                    if c > best:
                        best, turn = c, j
        if turn is not None:  # a hit refreshes the TTL of what it read (as the providers do)
            self.times[turn] = at
        index = len(self.ids)
        for h in chain:
            self.seen[h] = (index, at)
        self.chains.append(chain)
        self.ids.append(ids)
        self.times.append(at)
        self.ttls.append(self.ttl if ttl == -1.0 else ttl)
        return best, turn

    def _alive(self, turn: int, now: float | None) -> bool:
        """Whether earlier request `turn`'s prefixes are still held at `now`. Without times (a session whose lines
        carry no timestamp) nothing expires: the report cannot tell, and says so (`retention_note`)."""
        last, ttl = self.times[turn], self.ttls[turn]
        return ttl is None or last is None or now is None or now - last <= ttl


def _common(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _breakpoint_key(ids: np.ndarray, end: int) -> bytes:
    return hashlib.blake2b(ids[:end].astype("<i8", copy=False).tobytes(), digest_size=16).digest()


def session_report(
    turns: Sequence[TurnData],
    provider: Provider,
    *,
    ttl: float | None = 300.0,
    table: PriceTable | None = None,
    price_model: str | None = None,
    minimum: int = ANTHROPIC_DEFAULT_MIN,
) -> list[TurnReport]:
    """Each turn's cached, written and uncached input tokens under the provider's rule, its cost with and without
    caching (when a price table and its model entry are given), and the buster when the turn does not extend the
    turn before it. The common prefix is the longest token prefix shared with any earlier request sent within
    `ttl` seconds (None: no expiry)."""
    by_key: dict[str | None, _Prefixes] = {}  # OpenAI: one cache per prompt_cache_key (None: no key)
    written: dict[bytes, float | None] = {}  # Anthropic: breakpoint prefix -> when last written or read
    out: list[TurnReport] = []
    for i, turn in enumerate(turns):
        cache_key, retention = openai_cache_options(turn.raw, i) if provider == "openai" else (None, "in_memory")
        prefixes = by_key.setdefault(cache_key, _Prefixes(ttl))
        common, _ = prefixes.longest(turn.ids, turn.at, OPENAI_EXTENDED_TTL if retention == "24h" else -1.0)
        total = len(turn.ids)
        if provider == "anthropic":
            before = 0
            for b in sorted(turn.breakpoints, key=lambda b: b.end, reverse=True):
                key = _breakpoint_key(turn.ids, b.end)
                last = written.get(key, -1.0)
                if last != -1.0 and (ttl is None or last is None or turn.at is None or turn.at - last <= _ttl(b, ttl)):
                    before = b.end
                    break
            split = anthropic_split(total, turn.breakpoints, before, minimum=minimum)
            for b in turn.breakpoints:
                if b.end <= before or b.end >= minimum:
                    written[_breakpoint_key(turn.ids, b.end)] = turn.at
        else:
            split = cached_split(provider, total, common)
        output = turn.usage.output if turn.usage is not None else 0
        cost = uncached = None
        if table is not None and price_model is not None:
            cost, uncached = turn_cost(split, output, table, price_model)
        reported = turn.usage.cache_read if turn.usage is not None else None
        buster = name_buster(turns[i - 1], turn) if i else None
        out.append(TurnReport(i, total, common, split, output, cost, uncached, reported, buster))
    return out


def openai_cache_options(raw: Mapping[str, Any], turn: int) -> tuple[str | None, str]:
    """A request's `prompt_cache_key` (None when it sends none) and `prompt_cache_retention` ("in_memory" when it
    sends none), checked against the documented values
    (https://platform.openai.com/docs/guides/prompt-caching#prompt-cache-retention)."""
    key, retention = raw.get("prompt_cache_key"), raw.get("prompt_cache_retention")
    if key is not None and not isinstance(key, str):
        raise UsageError(f"prompt_cache_key must be a string, got {key!r}", path=f"turn {turn} $.prompt_cache_key")
    if retention is None:
        return key, "in_memory"
    if retention not in OPENAI_RETENTIONS:
        raise UsageError(
            f"prompt_cache_retention {retention!r} is not one OpenAI documents",
            path=f"turn {turn} $.prompt_cache_retention",
            hint=" or ".join(OPENAI_RETENTIONS),
        )
    return key, str(retention)


def retention_note(raws: Sequence[Mapping[str, Any]], times: Sequence[float | None], provider: str) -> str | None:
    """What the report could not check about OpenAI's cache retention: when a session's lines carry no timestamp,
    no turn can be held to its window (in_memory's `ttl`, or 24 hours), so no cached prefix expires."""
    missing = sum(t is None for t in times)
    if provider != "openai" or not missing:
        return None
    asked = sorted({openai_cache_options(r, i)[1] for i, r in enumerate(raws)})
    return (
        f"prompt_cache_retention ({', '.join(asked)}) not checked: {missing} of {len(times)} turns carry no "
        "timestamp, so no cached prefix expires"
    )


def _ttl(b: Breakpoint, default: float) -> float:
    return 3600.0 if b.ttl == "1h" else default


# -- naming the buster -----------------------------------------------------------------------------------------

_TOP = re.compile(r"^(system|tools\[\d+\]|messages\[\d+\]|documents\[\d+\])")
_SNIPPET = 24


def _part(path: str) -> str:
    m = _TOP.match(path)
    return m.group(1) if m else path


def _raw_part(raw: Mapping[str, Any], part: str) -> Any:
    m = re.fullmatch(r"(tools|messages|documents)\[(\d+)\]", part)
    if m is None:
        return raw.get(part)
    items = raw.get(m.group(1))
    i = int(m.group(2))
    return items[i] if isinstance(items, list) and i < len(items) else None


def _span_at(spans: Sequence[Span], char: int) -> Span | None:
    for sp in spans:
        if sp.start <= char < sp.end:
            return sp
    return None


def _owner_near(spans: Sequence[Span], char: int) -> Span | None:
    """The span holding `char`, else the last span that ends at or before it (the part the template was writing)."""
    inside = _span_at(spans, char)
    if inside is not None:
        return inside
    before = [sp for sp in spans if sp.end <= char]
    return max(before, key=lambda sp: sp.end) if before else None


def _names(tools: Any) -> list[str]:
    out = []
    for t in tools or ():
        fn = t.get("function", t) if isinstance(t, Mapping) else {}
        out.append(str(fn.get("name", "?")) if isinstance(fn, Mapping) else "?")
    return out


def _key_order_path(a: Any, b: Any, path: str) -> str | None:
    """The first object (depth first) whose keys are the same as the other's in another order."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if list(a) != list(b) and sorted(a) == sorted(b):
            return path
        for k in a:
            if k in b:
                found = _key_order_path(a[k], b[k], f"{path}.{k}")
                if found:
                    return found
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = _key_order_path(x, y, f"{path}[{i}]")
            if found:
                return found
    return None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _tools_buster(prev: Mapping[str, Any], cur: Mapping[str, Any]) -> Buster | None:
    a, b = prev.get("tools") or [], cur.get("tools") or []
    if a == b and [list(t) for t in a] == [list(t) for t in b] and _as_sent(a) == _as_sent(b):
        return None
    na, nb = _names(a), _names(b)
    if na != nb and sorted(na) == sorted(nb) and sorted(map(_canonical, a)) == sorted(map(_canonical, b)):
        return Buster("tools reordered", "tools", f"tools reordered: [{', '.join(na)}] vs [{', '.join(nb)}]")
    if len(a) == len(b) and [_canonical(t) for t in a] == [_canonical(t) for t in b]:
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            where = _key_order_path(x, y, f"tools[{i}]")
            if where:
                return Buster(
                    "schema key order", where, f"{where} key order: {list(_at(x, where))} vs {list(_at(y, where))}"
                )
    return None


def _as_sent(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _at(value: Any, path: str) -> Any:
    for key in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path.split("]", 1)[1] if path.startswith("tools[") else path):
        name, index = key
        value = value[int(index)] if index else value[name]
    return value


def name_buster(prev: TurnData, cur: TurnData) -> Buster | None:
    """Why `cur` does not extend `prev` (None when prev's rendered text is a prefix of cur's): tools reordered,
    schema keys reordered, a request string that changed (with both sides' text at the first differing character,
    by its path in the request), or the template writing an unchanged part differently (a rewrite of an earlier
    turn, such as Qwen3 dropping the reasoning of turns that are no longer the last)."""
    n = min(len(prev.text), len(cur.text))
    c = next((i for i in range(n) if prev.text[i] != cur.text[i]), n) if prev.text[:n] != cur.text[:n] else n
    if c == len(prev.text):
        return None
    tools = _tools_buster(prev.raw, cur.raw)
    if tools is not None:
        return tools
    span = _owner_near(cur.spans, c) or _owner_near(prev.spans, c)
    if span is None:
        return Buster("template rewrite", "template", f"the template's own text differs at rendered character {c}")
    part = _part(span.path)
    before = prev.text[c : c + _SNIPPET]
    after = cur.text[c : c + _SNIPPET]
    a, b = _raw_part(prev.raw, part), _raw_part(cur.raw, part)
    if a is not None and a == b:
        return Buster(
            "template rewrite",
            part,
            f"the template renders {part} differently once it is no longer the last turn: {before!r} vs {after!r}",
        )
    inside = _span_at(cur.spans, c)
    where = f"{inside.path} char {c - inside.start}" if inside is not None else f"{part} (after {span.path})"
    return Buster("content", inside.path if inside is not None else part, f"{where}: {before!r} vs {after!r}")
