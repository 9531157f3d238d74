"""The figures a span carries beside the record's own: each part's tokens (ctxlock.accounting.count on the model the
record ran on) and each turn's cache reads and writes and its buster from a prompt-cache report. Shared by
`ctxlock export --otel` (the model rebuilt from the store) and `ctxlock serve` (the served model)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ctxlock.accounting import count
from ctxlock.errors import CtxlockError
from ctxlock.records import ExecutionRecord, RunOptions
from ctxlock.telemetry._spans import CacheFigures
from ctxlock.template import RenderOptions


def part_counts(
    record: ExecutionRecord, request: Any, model: Any, template: Any
) -> tuple[list[tuple[str, int]] | None, str | None]:
    """Each part's tokens for `request` under the record's options on `model` (with `template`, the ChatTemplate the
    record ran with); none, with the reason, when the count fails or does not give the record's ids."""
    try:
        data = record.data
        recorded = dict(data["options"])
        now = (data.get("dynamic") or {}).get("now")
        if now and not recorded.get("now"):  # the record's clock, as replay reads it
            recorded["now"] = now
        render = RenderOptions.from_record(RunOptions.from_dict(recorded).to_dict(), template=template)
        kwargs = {f.name: getattr(render, f.name) for f in fields(render) if getattr(render, f.name) is not None}
        counted = count(model, request, **kwargs)
    except CtxlockError as exc:
        return None, f"per-part counts not given: {exc}"
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"per-part counts not given: the record's options cannot be read ({type(exc).__name__})"
    if counted.total != len(record.data.get("input_ids") or []):
        return None, f"per-part counts not given: the count gave {counted.total} tokens, the record holds others"
    return [(p.part, p.tokens) for p in counted.parts], None


def cache_figures(run: Any, provider: str) -> list[CacheFigures]:
    """Each turn's cache reads, writes and buster from a prompt-cache report (`cache-report`'s run under
    `provider`'s rule: its `reports`, each with a `split` and a `buster`)."""
    out = []
    for t in run.reports:
        kind, text = (t.buster.kind, t.buster.message) if t.buster is not None else (None, None)
        out.append(CacheFigures(provider, t.split.cache_read, t.split.cache_write, kind, text))
    return out
