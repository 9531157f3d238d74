"""The GGUF format's names and enums (`Keys`, `GGUFValueType`, `TokenType`) from the `gguf` package, without
importing the package.

`import gguf` runs its `__init__`, which imports `gguf.vocab` and, through it, mistral-common, requests, pydantic and
jsonschema: about 0.3 s at every start for three enums. `gguf/constants.py` imports only the standard library, so
it is loaded from the installed package on its own (the same file, the same values). Where `gguf` is imported
already, its own module is used; where the file cannot be loaded on its own, the package is imported.

Even that file costs about 30 ms to run, so it is loaded on first use: `Keys`, `GGUFValueType` and `TokenType` are
stand-ins that load it when one of their attributes is first read (`import ctxlock` does not read a GGUF file).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def _constants() -> ModuleType:
    loaded = sys.modules.get("gguf.constants")
    if loaded is not None:
        return loaded
    name = "ctxlock.artifacts._gguf_upstream_constants"  # gguf/constants.py, loaded on its own
    if name in sys.modules:
        return sys.modules[name]
    try:
        package = importlib.util.find_spec("gguf")
        locations = list(package.submodule_search_locations or []) if package is not None else []
        spec = importlib.util.spec_from_file_location(name, Path(locations[0]) / "constants.py")
        if spec is None or spec.loader is None:
            raise ImportError("gguf/constants.py not found")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    except Exception:
        sys.modules.pop(name, None)
        import gguf.constants

        return gguf.constants


class _OnFirstUse:
    """One of the module's namespaces (an enum, or `Keys`), loaded when an attribute of it is first read."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(vars(_constants())[self.name], attr)

    def __repr__(self) -> str:
        return f"<gguf.constants.{self.name}, loaded on first use>"


GGUFValueType: Any = _OnFirstUse("GGUFValueType")
Keys: Any = _OnFirstUse("Keys")
TokenType: Any = _OnFirstUse("TokenType")

__all__ = ["GGUFValueType", "Keys", "TokenType"]
