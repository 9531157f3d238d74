"""What context costs: provider usage objects normalised and priced in exact decimals (`parse_usage`,
`PriceTable`), the model's window and output cap (`Capacity`), the prompt-cache report and "why didn't the model see
it" (`explain`), and the bill of a session per request part (`bill_session`, `PartTokens`; genai-prices' bundled
data as a second price source, `genai_table`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ctxlock.economics._capacity import Capacity
from ctxlock.economics._capacity import from_files as capacity_from_files

if TYPE_CHECKING:
    from ctxlock.economics._bill import Bill, PartTokens, TurnBill, bill_session, bill_turn, request_bill
    from ctxlock.economics._genai import GenaiTable, genai_table
    from ctxlock.economics._usage import PriceTable, Usage, parse_usage

# The bill's names are imported when first used: the bill brings the cache report (and its numpy and template
# imports), which a command such as `render` never needs (tests/cli/test_cli_lazy.py); usage and prices (decimal,
# the price tables' parser) on first use too: loading a model reads only its capacity (tests/project/test_imports.py).
_LAZY = {
    "PriceTable": "_usage",
    "Usage": "_usage",
    "parse_usage": "_usage",
    "Bill": "_bill",
    "PartTokens": "_bill",
    "TurnBill": "_bill",
    "bill_session": "_bill",
    "bill_turn": "_bill",
    "request_bill": "_bill",
    "GenaiTable": "_genai",
    "genai_table": "_genai",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Bill",
    "Capacity",
    "GenaiTable",
    "PartTokens",
    "PriceTable",
    "TurnBill",
    "Usage",
    "bill_session",
    "bill_turn",
    "capacity_from_files",
    "genai_table",
    "parse_usage",
    "request_bill",
]
