"""Shared output helpers: JSON to stdout, errors as {"error": {...}} when --json is on."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console

from ..errors import CtxlockError

T = TypeVar("T")
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


def guarded(as_json: bool, fn: Callable[[], T]) -> T:
    """Run fn; with --json, a CtxlockError is also printed as {"error": {type, message, path, hint}}."""
    try:
        return fn()
    except CtxlockError as exc:
        if as_json:
            print_json({"error": exc.to_dict()})
        raise
