"""Training data: assistant-token masks (which tokens a model is trained on), from `{% generation %}` blocks as
transformers does, or from provenance for any template, with a sentinel cross-check per template."""

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
