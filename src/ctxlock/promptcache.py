"""Prompt-cache economics (seed 003 §2.4): how many input tokens a provider serves from its cache, and at what cost.

Providers match an exact prefix, at their own granularity (SEED-NOTES: not byte by byte):

- **OpenAI** caches automatically: a request whose prefix matches an earlier one's for at least 1,024 tokens reads
  the match from the cache, in 128-token steps (1,024, 1,152, 1,280, …). Writes cost nothing extra.
- **Anthropic** caches at `cache_control` breakpoints (at most 4 per request), each with a TTL of 5 minutes or 1
  hour, and only prefixes of at least the model's minimum length. A request reads the longest breakpoint prefix it
  wrote earlier (within the TTL), and writes every longer breakpoint prefix: at 1.25x the input price for 5
  minutes, 2x for an hour, where a read costs 0.1x (the multipliers are the price table's, never constants).
- **vLLM** (automatic prefix caching) reuses full blocks of 16 tokens of the longest prefix it has computed.

A prefix broken on every turn (a timestamp at the top, tools in an unstable order) pays the write every turn and
never the read. `cached_tokens` gives what each rule serves for a given common prefix, and `turn_cost` prices a
turn's split with and without caching from a price table (`ctxlock.usage.PriceTable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from .errors import UsageError
from .usage import PriceTable, Usage, price_usage

Provider = Literal["openai", "anthropic", "vllm"]
PROVIDERS: tuple[str, ...] = ("openai", "anthropic", "vllm")

OPENAI_MIN = 1024
OPENAI_STEP = 128
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
    "PROVIDERS",
    "Breakpoint",
    "Split",
    "anthropic_split",
    "cached_split",
    "openai_cached",
    "turn_cost",
    "vllm_cached",
]
