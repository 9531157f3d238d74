"""training."""

from ctxlock.training._masks import MaskOptions, assistant_mask, mask_of, masks_of

__all__ = [
    "MaskOptions",
    "assistant_mask",
    "mask_of",
    "masks_of",
]
