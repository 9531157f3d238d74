"""A second price source: the data genai-prices (https://github.com/pydantic/genai-prices, on PyPI) ships in its
wheel, read as a `PriceTable` so that a bill prices through the same code (`price_usage`) whichever source it uses.

Never the network. genai-prices fetches newer prices only when a caller starts its `UpdatePrices` background task
(`genai_prices/update_prices.py`), and `calc_price` then prefers the fetched snapshot (`data_snapshot.get_snapshot`).
ctxlock starts no such task and does not go through `get_snapshot`: it reads the bundled providers
(`genai_prices.data.providers`) into its own `DataSnapshot(..., from_auto_update=False)`, so a snapshot another
part of the process fetched is not used either. The table's sha256 is the sha256 of that bundled data module.

genai-prices gives prices per million tokens (`input_mtok`, `output_mtok`, `cache_read_mtok`, `cache_write_mtok`,
`cache_write_1h_mtok`, `output_reasoning_mtok`), some as tiers (`TieredPrices`: above `start` prompt tokens, every
token at the tier's price, the rule `price_usage` applies to LiteLLM's `*_above_200k_tokens`). Prices of other
units (audio, images, web searches) are not text tokens and are left out, by name, in `GenaiTable.left_out`.
A model's prices can change over time (`ConditionalPrice`): the prices in force at `at` are read.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from ctxlock.economics._usage import Price, PriceTable
from ctxlock.errors import PriceError

# genai-prices' price keys -> `Price.per_token` kinds (the LiteLLM fields `_usage._PRICE_FIELDS` reads).
_KINDS = {
    "input_mtok": "input",
    "output_mtok": "output",
    "output_reasoning_mtok": "reasoning",
    "cache_read_mtok": "cache_read",
    "cache_write_mtok": "cache_write",
    "cache_write_1h_mtok": "cache_write_1h",
}
_MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class GenaiTable:
    """The bundled genai-prices data for some models, as a `PriceTable` (keyed by the names asked for), with the
    genai-prices model each name matched and the priced units ctxlock does not bill."""

    table: PriceTable
    matched: Mapping[str, str]  # name asked -> "provider/model id" in genai-prices
    left_out: Mapping[str, tuple[str, ...]]  # name asked -> price keys of other units (audio, images, searches)
    version: str


def available() -> bool:
    """Whether genai-prices is installed (the `prices` extra)."""
    return importlib.util.find_spec("genai_prices") is not None


def genai_table(models: Iterable[str], *, provider: str | None = None, at: datetime | None = None) -> GenaiTable:
    """The bundled prices of `models` (each as the session names it), read offline. A model genai-prices does not
    know is left out of the table (`lookup` then says so); none known at all is a `PriceError`. `provider`
    ("openai", "anthropic", ...) narrows the match; `at` picks the prices in force then (default: now)."""
    if not available():
        raise PriceError(
            "genai-prices is not installed", path="genai-prices", hint="pip install 'ctxlock[prices]', or pass --prices"
        )
    from genai_prices import __version__
    from genai_prices.data import providers
    from genai_prices.data_snapshot import DataSnapshot

    snapshot = DataSnapshot(providers, from_auto_update=False)  # the bundled data only: never an update
    when = at or datetime.now(UTC)
    entries: dict[str, Price] = {}
    matched: dict[str, str] = {}
    left: dict[str, tuple[str, ...]] = {}
    for name in dict.fromkeys(models):
        try:
            prov, info = snapshot.find_provider_model(name, None, provider, None)
        except LookupError:
            continue
        price = info.get_prices(when)
        entries[name], left[name] = _price(name, price.__dict__)
        matched[name] = f"{prov.id}/{info.id}"
    origin = importlib.util.find_spec("genai_prices.data")
    data = Path(origin.origin).read_bytes() if origin is not None and origin.origin else b""
    label = f"genai-prices {__version__} (bundled data)"
    if not entries:
        raise PriceError(
            f"genai-prices {__version__} knows none of {', '.join(repr(m) for m in dict.fromkeys(models))}",
            path=label,
            hint="pass --prices with a LiteLLM-format table, or --price-model NAME",
        )
    table = PriceTable(entries, hashlib.sha256(data).hexdigest(), label)
    return GenaiTable(table, matched, left, __version__)


def _price(name: str, raw: Mapping[str, Any]) -> tuple[Price, tuple[str, ...]]:
    base: dict[str, Decimal] = {}
    tiers: dict[int, dict[str, Decimal]] = {}
    left = []
    for key, value in raw.items():
        if value is None:
            continue
        kind = _KINDS.get(key)
        if kind is None:
            left.append(key)
            continue
        if isinstance(value, Decimal | int):
            base[kind] = Decimal(value) / _MILLION
            continue
        base[kind] = Decimal(value.base) / _MILLION  # TieredPrices: base, then [Tier(start, price)]
        for tier in value.tiers:
            tiers.setdefault(int(tier.start), {})[kind] = Decimal(tier.price) / _MILLION
    ordered = tuple((start, tiers[start]) for start in sorted(tiers))
    return Price(name, base, ordered), tuple(sorted(left))


__all__ = ["GenaiTable", "available", "genai_table"]
