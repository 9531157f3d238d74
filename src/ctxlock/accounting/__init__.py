"""Exact accounting: every token of `input_ids` attributed to one request part (template, system, each tool,
message and document, the generation prompt), marginal costs, and the parts the template never wrote."""

from ctxlock.accounting._layout import (
    Counts,
    Layout,
    count,
    layout,
    layout_of,
    part_of,
    runs,
    unseen_parts,
    unseen_warnings,
    with_images,
)
from ctxlock.accounting._tokenlay import assign_owners, whole_lay, whole_lays

__all__ = [
    "Counts",
    "Layout",
    "assign_owners",
    "count",
    "layout",
    "layout_of",
    "part_of",
    "runs",
    "unseen_parts",
    "unseen_warnings",
    "whole_lay",
    "whole_lays",
    "with_images",
]
