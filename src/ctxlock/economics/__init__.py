"""economics."""

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
