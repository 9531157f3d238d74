"""A loaded model: its artifacts and the pipeline request -> template -> tokenizer -> tensors (`load`, `Model`,
`Run`). `Model` implements `ctxlock.pipeline.Pipeline`, the protocol the features call."""

from ctxlock.model._model import Model, Run, clear_caches, load

__all__ = [
    "Model",
    "Run",
    "clear_caches",
    "load",
]
