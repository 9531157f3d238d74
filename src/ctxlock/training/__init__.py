"""Training data: assistant-token masks (which tokens a model is trained on), from `{% generation %}` blocks as
transformers does, or from provenance for any template, with a sentinel cross-check per template."""

from ctxlock.training._masks import MaskOptions, assistant_mask, mask_of, masks_of

__all__ = [
    "MaskOptions",
    "assistant_mask",
    "mask_of",
    "masks_of",
]
