"""ctxlock: what exactly did the model receive, why, and what did it cost?

>>> import ctxlock
>>> model = ctxlock.load("book")
>>> model.encode({"messages": [{"role": "user", "content": "天空"}]}).input_ids.tolist()
[[1, 4, 8, 5, 6]]

The names below are the public API (docs/architecture.md, "The packages and their layers"). Each is imported on
first use, so `import ctxlock` (and every `ctxlock` command) pays only for what it touches; `__all__` is pinned by
tests/project/test_api.py.
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

# public name -> the package that defines it
_PUBLIC: dict[str, str] = {
    "BudgetPolicy": "ctxlock.budget",
    "ChatTemplate": "ctxlock.template",
    "CtxlockError": "ctxlock.errors",
    "IncrementalDecoder": "ctxlock.generation",
    "InjectionPolicy": "ctxlock.template",
    "JsonSchemaMask": "ctxlock.generation",
    "MaskOptions": "ctxlock.training",
    "Model": "ctxlock.model",
    "ModelInput": "ctxlock.tensors",
    "Pipeline": "ctxlock.pipeline",
    "PriceTable": "ctxlock.economics",
    "RenderOptions": "ctxlock.template",
    "Rendered": "ctxlock.template",
    "Request": "ctxlock.request",
    "Run": "ctxlock.model",
    "Sampler": "ctxlock.generation",
    "StageOptions": "ctxlock.multimodal",
    "StopMatcher": "ctxlock.generation",
    "Store": "ctxlock.records",
    "Tokenized": "ctxlock.tokenizer",
    "ToolCallAssembler": "ctxlock.generation",
    "Usage": "ctxlock.economics",
    "clear_caches": "ctxlock.model",
    "fit_context": "ctxlock.budget",
    "load": "ctxlock.model",
    "parse_request": "ctxlock.request",
    "parse_usage": "ctxlock.economics",
    "stream_text": "ctxlock.generation",
}

__all__ = [
    "BudgetPolicy",
    "ChatTemplate",
    "CtxlockError",
    "IncrementalDecoder",
    "InjectionPolicy",
    "JsonSchemaMask",
    "MaskOptions",
    "Model",
    "ModelInput",
    "Pipeline",
    "PriceTable",
    "RenderOptions",
    "Rendered",
    "Request",
    "Run",
    "Sampler",
    "StageOptions",
    "StopMatcher",
    "Store",
    "Tokenized",
    "ToolCallAssembler",
    "Usage",
    "__version__",
    "clear_caches",
    "fit_context",
    "load",
    "parse_request",
    "parse_usage",
    "stream_text",
]


def __getattr__(name: str) -> _typing.Any:
    """A public name, imported from its package on first use (PEP 562); a subpackage by name, as `import` would."""
    if name in _PUBLIC:
        value = getattr(_importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if _typing.TYPE_CHECKING:
    from ctxlock.budget import BudgetPolicy, fit_context
    from ctxlock.economics import PriceTable, Usage, parse_usage
    from ctxlock.errors import CtxlockError
    from ctxlock.generation import (
        IncrementalDecoder,
        JsonSchemaMask,
        Sampler,
        StopMatcher,
        ToolCallAssembler,
        stream_text,
    )
    from ctxlock.model import Model, Run, clear_caches, load
    from ctxlock.multimodal import StageOptions
    from ctxlock.pipeline import Pipeline
    from ctxlock.records import Store
    from ctxlock.request import Request, parse_request
    from ctxlock.template import ChatTemplate, InjectionPolicy, Rendered, RenderOptions
    from ctxlock.tensors import ModelInput
    from ctxlock.tokenizer import Tokenized
