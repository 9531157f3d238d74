"""Names a package exports without importing them until first use (PEP 562, https://peps.python.org/pep-0562/).

A package whose parts are independent and heavy (the way back: llguidance for constrained decoding) exports them
lazily, so importing one part (`ctxlock.generation` runs `ctxlock/generation/__init__.py` first) does not
import the others."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, table: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`: `table` maps each exported name to the module defining it."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(table[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *table})

    return __getattr__, __dir__
