"""A template source rendered with plain variables, as transformers renders it, and every failure as a value.

`render_source` is the sandbox seen from outside the template stage: no request, no provenance, no control tokens;
the variables are given as they are (JSON values), `strftime_now` reads a fixed clock, and the answer is the text
or the failure with its template line, plus the template line that printed each piece of the text (so a caller
that compares this text with another engine's can say which line printed the first difference).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2

from ctxlock.template import _taint as taint
from ctxlock.template.sandbox._env import (
    Limit,
    Nondeterministic,
    Raised,
    compile_source,
    render_limited,
    template_globals,
    template_line,
)
from ctxlock.template.sandbox._limits import DEFAULT_LIMITS, RenderLimits, where

_MAX_MESSAGE = 2000  # characters of a failure's message kept


@dataclass(frozen=True)
class SourceRender:
    """One render of a template source (`render_source`): `text`, or `error` (what failed, as
    `Kind: message`; the kind is `TemplateSyntaxError`, `raise_exception`, `limit`, `nondeterministic` (it would print a
    memory address), `SecurityError`, or the Python
    exception's name) with the template `line` it names, when known. `printed` holds, for each piece of the text,
    (offset in the text, template line that printed it)."""

    text: str | None
    error: str | None = None
    line: int | None = None
    printed: tuple[tuple[int, int], ...] = ()

    def line_at(self, offset: int) -> int | None:
        """The template line that printed the character at `offset` of the text (the last piece printed, at or past
        the end), or None when nothing was printed."""
        found = None
        for start, line in self.printed:
            if start > offset:
                break
            found = line
        return found


def render_source(
    source: str,
    variables: Sequence[Mapping[str, Any]],
    *,
    now: datetime,
    limits: RenderLimits = DEFAULT_LIMITS,
) -> list[SourceRender]:
    """Render `source` once for each mapping of `variables` (compiled once), in ctxlock's sandbox: transformers'
    environment (`trim_blocks`, `lstrip_blocks`, `loopcontrols`, `raise_exception`, a `tojson` that does not
    escape HTML, `strftime_now`), bounded by `limits`. `strftime_now(fmt)` formats `now` as a naive wall time, as
    transformers formats `datetime.now()`. A failure (syntax, a limit, `raise_exception`, any error) is a
    `SourceRender` with `error`, never an exception."""
    try:
        compiled = compile_source(source, limits)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        failed = SourceRender(None, _message("TemplateSyntaxError", exc.message or str(exc)), exc.lineno)
        return [failed for _ in variables]
    except Limit as exc:
        return [SourceRender(None, _message("limit", exc.message)) for _ in variables]
    except (RecursionError, MemoryError):
        return [SourceRender(None, "limit: the template nests too deeply to compile") for _ in variables]
    names = template_globals(compiled)
    return [_render_one(compiled, names, dict(v), now, limits) for v in variables]


def _render_one(
    compiled: jinja2.Template, names: dict[str, Any], variables: dict[str, Any], now: datetime, limits: RenderLimits
) -> SourceRender:
    wall = now.replace(tzinfo=None)

    def strftime_now(fmt: str) -> str:
        return wall.strftime(fmt)

    context = {**variables, "strftime_now": strftime_now}
    printed: list[tuple[int, int]] = []
    checker = taint.Checker(lambda _s: False, where)
    try:
        text, _spans = render_limited(compiled, context, limits, checker, template_globals=names, printed=printed)
    except Raised as exc:
        said = exc.message if exc.message is not None else exc
        return SourceRender(None, _message("raise_exception", str(said)), template_line(exc.__traceback__))
    except Nondeterministic as exc:
        return SourceRender(None, _message("nondeterministic", exc.message), exc.line)
    except Limit as exc:
        return SourceRender(None, _message("limit", exc.message), template_line(exc.__traceback__))
    except (RecursionError, MemoryError, OverflowError) as exc:
        return SourceRender(None, _message("limit", f"{type(exc).__name__}: {exc}"), template_line(exc.__traceback__))
    except jinja2.exceptions.SecurityError as exc:
        return SourceRender(None, _message("SecurityError", str(exc)), template_line(exc.__traceback__))
    except Exception as exc:  # UndefinedError, TypeError, ...: the template failed on these variables
        return SourceRender(None, _message(type(exc).__name__, str(exc)), template_line(exc.__traceback__))
    return SourceRender(text, printed=tuple(printed))


def _message(kind: str, message: str) -> str:
    text = f"{kind}: {message}"
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"


__all__ = ["SourceRender", "render_source"]
