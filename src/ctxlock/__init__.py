"""ctxlock: what exactly did the model receive, and why?

>>> import ctxlock
>>> model = ctxlock.load("book")
>>> model.encode({"messages": [{"role": "user", "content": "天空"}]}).input_ids.tolist()
[[1, 4, 8, 5, 6]]
"""

from .errors import CtxlockError
from .model import Model, Run, clear_caches, load
from .request import Request, parse_request
from .template import ChatTemplate, Rendered, SpecialTokenPolicy
from .tensors import ModelInput
from .tokenizer import Tokenized

__version__ = "0.1.0"

__all__ = [
    "ChatTemplate",
    "CtxlockError",
    "Model",
    "ModelInput",
    "Rendered",
    "Request",
    "Run",
    "SpecialTokenPolicy",
    "Tokenized",
    "__version__",
    "clear_caches",
    "load",
    "parse_request",
]
