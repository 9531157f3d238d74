"""What context costs: provider usage objects normalised and priced in exact decimals (`parse_usage`,
`PriceTable`), the model's window and output cap (`Capacity`), the prompt-cache report and "why didn't the model see
it" (`explain`)."""

from ctxlock.economics._capacity import Capacity
from ctxlock.economics._capacity import from_files as capacity_from_files
from ctxlock.economics._usage import PriceTable, Usage, parse_usage

__all__ = [
    "Capacity",
    "PriceTable",
    "Usage",
    "capacity_from_files",
    "parse_usage",
]
