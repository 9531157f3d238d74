"""Model input tensors: `ModelInput` (`input_ids`, `attention_mask`, `position_ids`, and `assistant_masks` when
asked), assembled for one request or a padded batch, as numpy or torch."""

from ctxlock.tensors._assemble import (
    ModelInput,
    PaddingSide,
    TorchInput,
    assemble,
    assemble_batch,
    assemble_own,
    check_return_tensors,
    tensors_as,
)

__all__ = [
    "ModelInput",
    "PaddingSide",
    "TorchInput",
    "assemble",
    "assemble_batch",
    "assemble_own",
    "check_return_tensors",
    "tensors_as",
]
