"""Training data: assistant-token masks (which tokens a model is trained on), from `{% generation %}` blocks as
transformers does, or from provenance for any template, with a sentinel cross-check per template."""

from typing import TYPE_CHECKING

from ctxlock.core import lazy_exports

# Imported on first use: only masks need it (tests/project/test_imports.py).
_EXPORTS = {
    "MaskOptions": "ctxlock.training._masks",
    "REPORT_CONVERSATIONS": "ctxlock.training._masks",
    "TemplateReport": "ctxlock.training._masks",
    "assistant_mask": "ctxlock.training._masks",
    "mask_of": "ctxlock.training._masks",
    "masks_of": "ctxlock.training._masks",
    "template_report": "ctxlock.training._masks",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from ctxlock.training._masks import (
        REPORT_CONVERSATIONS,
        MaskOptions,
        TemplateReport,
        assistant_mask,
        mask_of,
        masks_of,
        template_report,
    )

__all__ = [
    "REPORT_CONVERSATIONS",
    "MaskOptions",
    "TemplateReport",
    "assistant_mask",
    "mask_of",
    "masks_of",
    "template_report",
]
