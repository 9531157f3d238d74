"""tensors."""

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
