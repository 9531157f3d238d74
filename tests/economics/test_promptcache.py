"""ctxlock.economics: what each provider's cache serves, and the seed's 1.25x-write, never-0.1x-read pattern.

The figures are worked by hand in the comments; prices come from tests/data/usage/prices.json (LiteLLM's format)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxlock.economics._promptcache import (
    Breakpoint,
    Split,
    anthropic_split,
    cached_split,
    openai_cached,
    turn_cost,
    vllm_cached,
)
from ctxlock.economics._usage import PriceTable
from ctxlock.errors import UsageError

PRICES = PriceTable.parse((Path(__file__).parents[1] / "data" / "usage" / "prices.json").read_bytes(), "prices.json")


def test_openai_rule() -> None:
    assert [openai_cached(n) for n in (0, 1023, 1024, 1151, 1152, 1279, 1280, 5000)] == [
        0,
        0,
        1024,
        1024,
        1152,
        1152,
        1280,
        1024 + (5000 - 1024) // 128 * 128,
    ]


@given(st.integers(0, 10**7))
def test_openai_and_vllm_granularity(common: int) -> None:
    o, v = openai_cached(common), vllm_cached(common)
    assert o <= common and (o == 0 or (o >= 1024 and (o - 1024) % 128 == 0)) and common - o < max(1024, 128) + 1
    assert v <= common and v % 16 == 0 and common - v < 16


def test_anthropic_breakpoints() -> None:
    # tools end at 1500, system at 2100 (1h), messages at 3000; 3500 tokens in all
    points = [Breakpoint(1500), Breakpoint(2100, "1h"), Breakpoint(3000)]
    first = anthropic_split(3500, points, written_before=0)
    assert first == Split(cache_read=0, cache_write=3000, cache_write_1h=600, uncached=500)
    again = anthropic_split(3600, points, written_before=3000)
    assert again == Split(cache_read=3000, cache_write=0, cache_write_1h=0, uncached=600)
    # a prefix under the minimum is neither written nor read
    assert anthropic_split(900, [Breakpoint(800)], 0) == Split(0, 0, 0, 900)
    with pytest.raises(UsageError, match="at most 4"):
        anthropic_split(10, [Breakpoint(i) for i in range(1, 6)], 0)


def test_the_seeds_buster_pattern() -> None:
    """A 2,000-token fixed prefix: behind a changing timestamp it is written at 1.25x every turn and never read at
    0.1x; with the timestamp after it, it is written once and read after."""
    table, model, turns = PRICES, "claude-sonnet-4-5", 30
    bp = [Breakpoint(2000)]
    busted = sum(turn_cost(anthropic_split(2100, bp, 0), 100, table, model)[0] for _ in range(turns))
    clean = turn_cost(anthropic_split(2100, bp, 0), 100, table, model)[0] + sum(
        turn_cost(anthropic_split(2100, bp, 2000), 100, table, model)[0] for _ in range(turns - 1)
    )
    plain = turn_cost(anthropic_split(2100, bp, 0), 100, table, model)[1] * turns
    # per turn: write 2000 x 3.75e-6 = 0.0075, read 2000 x 3e-7 = 0.0006, uncached 100 x 3e-6, output 100 x 1.5e-5
    per_turn_rest = Decimal("0.0003") + Decimal("0.0015")
    assert busted == turns * (Decimal("0.0075") + per_turn_rest)
    assert clean == Decimal("0.0075") + (turns - 1) * Decimal("0.0006") + turns * per_turn_rest
    assert plain == turns * (Decimal("0.006") + per_turn_rest)  # 2000 x 3e-6 without caching
    assert busted > plain > clean  # busting costs more than not caching at all: 1.25x write every turn
    assert busted / clean > 3


def test_automatic_providers() -> None:
    assert cached_split("openai", 3000, 2500) == Split(2432, 0, 0, 568)  # 1024 + 11 x 128
    assert cached_split("vllm", 3000, 2500) == Split(2496, 0, 0, 504)
    with pytest.raises(UsageError):
        cached_split("anthropic", 10, 5)  # type: ignore[arg-type]
