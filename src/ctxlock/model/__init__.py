"""model."""

from ctxlock.model._model import Model, Run, clear_caches, load

__all__ = [
    "Model",
    "Run",
    "clear_caches",
    "load",
]
