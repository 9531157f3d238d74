"""Exact accounting: every token of `input_ids` attributed to one request part (template, system, each tool,
message and document, the generation prompt), marginal costs, and the parts the template never wrote."""

from typing import TYPE_CHECKING

from ctxlock.core import lazy_exports

# Imported on first use: `Model.encode` and `ctxlock render` never count (tests/project/test_imports.py).
_EXPORTS = {
    "Counts": "ctxlock.accounting._layout",
    "Layout": "ctxlock.accounting._layout",
    "assign_owners": "ctxlock.accounting._tokenlay",
    "count": "ctxlock.accounting._layout",
    "layout": "ctxlock.accounting._layout",
    "layout_of": "ctxlock.accounting._layout",
    "part_of": "ctxlock.accounting._layout",
    "runs": "ctxlock.accounting._layout",
    "unseen_parts": "ctxlock.accounting._layout",
    "unseen_warnings": "ctxlock.accounting._layout",
    "whole_lay": "ctxlock.accounting._tokenlay",
    "whole_lays": "ctxlock.accounting._tokenlay",
    "with_images": "ctxlock.accounting._layout",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
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
