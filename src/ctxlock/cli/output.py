"""Shared output helpers: JSON to stdout, errors as {"error": {...}} when --json is on, and text that must stay exact.

Rich (the human views' rules, colours and tables) wraps long lines at the terminal width, or at 80 columns in a
pipe, and drops some control characters: fine for labels, wrong for a rendered prompt or a list of ids, which are
written here instead, byte for byte (`write_exact`, `write_ids`)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ctxlock.cli.files import name_request_source
from ctxlock.errors import CtxlockError

if TYPE_CHECKING:
    from rich.console import Console

T = TypeVar("T")


_CONSOLES: dict[str, Console] = {}  # not a cache: the two consoles of the process, made once
_CONSOLE_OPTIONS: dict[str, dict[str, Any]] = {
    "console": {"highlight": False, "soft_wrap": True},
    "err_console": {"stderr": True, "highlight": False, "soft_wrap": True},
}


def __getattr__(name: str) -> Console:
    # `console` and `err_console`, rich Consoles made on first use (PEP 562): a command that prints only JSON or
    # exact text, and reads them at call time (`output.console`), never imports rich (about a tenth of a fresh
    # `ctxlock render --json`'s imports).
    if name not in _CONSOLE_OPTIONS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _CONSOLES:
        from rich.console import Console

        _CONSOLES[name] = Console(**_CONSOLE_OPTIONS[name])
    return _CONSOLES[name]


def _console() -> Console:
    return __getattr__("console")


# The human views show at most this many ids, the first and the last half of them; --json prints all.
MAX_SHOWN_IDS = 1000


def print_json(obj: Any) -> None:
    """One JSON document, indented by 2, with every array of numbers, strings, booleans or nulls on one line (a
    560K-token request's ids are one line, not 560K): `json.loads` gives back exactly `obj`."""
    sys.stdout.write(json_text(obj) + "\n")
    sys.stdout.flush()


def json_text(obj: Any, depth: int = 0) -> str:
    """`obj` as `print_json` writes it, as if nested `depth` levels deep (for a caller that writes a long array one
    element at a time, instead of building the whole document)."""
    out: list[str] = []
    _dump(obj, depth, out)
    return "".join(out)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _dump(obj: Any, depth: int, out: list[str]) -> None:
    if isinstance(obj, dict) and obj:
        inner = "\n" + "  " * (depth + 1)
        out.append("{")
        for i, (key, value) in enumerate(obj.items()):
            out.append(("," if i else "") + inner + json.dumps(str(key), ensure_ascii=False) + ": ")
            _dump(value, depth + 1, out)
        out.append("\n" + "  " * depth + "}")
    elif isinstance(obj, list | tuple) and obj and not _flat(obj):
        inner = "\n" + "  " * (depth + 1)
        out.append("[")
        for i, value in enumerate(obj):
            out.append(("," if i else "") + inner)
            _dump(value, depth + 1, out)
        out.append("\n" + "  " * depth + "]")
    else:
        out.append(json.dumps(obj, ensure_ascii=False, separators=(", ", ": ")))


def _flat(items: Sequence[Any]) -> bool:
    """An array written on one line: one of scalars only (ids, a mask, a span's [start, end, path])."""
    return set(map(type, items)) <= _SCALARS


def guarded(as_json: bool, fn: Callable[[], T]) -> T:
    """Run fn; with --json, a CtxlockError is also printed as {"error": {type, message, path, hint}}."""
    try:
        return fn()
    except CtxlockError as exc:
        name_request_source(exc)
        if as_json:
            print_json({"error": exc.to_dict()})
        raise


# Characters a terminal acts on (cursor moves, colours, title changes, erasing): C0 and C1 controls other than tab
# and newline, and DEL. On a terminal they are shown escaped, so a request cannot rewrite the screen; in a pipe or a
# file the text is written exactly.
_TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_RESET = "\x1b[0m"


def colours() -> bool:
    """Whether the human view may colour its output: a terminal that takes colour, and no NO_COLOR."""
    console = _console()
    return console.is_terminal and console.color_system is not None and not console.no_color


def write_exact(text: str, marks: Iterable[tuple[int, int, str]] = ()) -> None:
    """Write `text` as it is (no wrapping, nothing dropped), then a newline. `marks` are (start, end, SGR code)
    spans coloured on a terminal (ANSI `\\x1b[<code>m`); elsewhere they are ignored and the bytes are exactly
    `text`. On a terminal, control characters are shown escaped (`\\x1b`), reversed, instead of acting."""
    _console().file.flush()
    out = sys.stdout
    if not colours():
        out.write(text)
        out.write("\n")
        out.flush()
        return
    pos = 0
    parts: list[str] = []
    for start, end, code in sorted(marks):
        if start < pos:
            continue
        parts.append(_visible(text[pos:start]))
        parts.append(f"\x1b[{code}m{_visible(text[start:end], code)}{_RESET}")
        pos = end
    parts.append(_visible(text[pos:]))
    out.write("".join(parts) + _RESET + "\n")
    out.flush()


def _visible(text: str, code: str = "") -> str:
    if not _TERMINAL_CONTROLS.search(text):
        return text
    resume = f"\x1b[{code}m" if code else ""

    def shown(match: re.Match[str]) -> str:
        escaped = repr(match.group())[1:-1]  # '\x1b', '\r', '\x85'
        return f"\x1b[7m{escaped}{_RESET}{resume}"

    return _TERMINAL_CONTROLS.sub(shown, text)


def ids_line(ids: Sequence[int], limit: int = MAX_SHOWN_IDS) -> str:
    """A JSON array of ids for the human views; a longer list shows its first and last `limit // 2` ids around
    `…` and says how many were left out (`--json` prints them all)."""
    if len(ids) <= limit:
        return json.dumps(list(ids))
    half = limit // 2
    head, tail = json.dumps(list(ids[:half]))[:-1], json.dumps(list(ids[-half:]))[1:]
    return f"{head}, … {len(ids) - 2 * half:,} ids not shown (--json prints all) …, {tail}"


def write_ids(ids: Sequence[int], limit: int = MAX_SHOWN_IDS) -> None:
    _console().file.flush()
    sys.stdout.write(ids_line(ids, limit) + "\n")
    sys.stdout.flush()
