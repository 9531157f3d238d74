"""The figures a span carries beside the record's own: each part's tokens (ctxlock.accounting.count on the model the
record ran on) and, under a provider's caching rule, each turn's cache reads and writes and its buster (the
prompt-cache report). Shared by `ctxlock export --otel` (the model rebuilt from the store) and `ctxlock serve` (the
served model)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ctxlock.accounting import count
from ctxlock.economics._promptcache import PROVIDERS
from ctxlock.economics._session import Session, cache_report
from ctxlock.errors import CtxlockError
from ctxlock.records import ExecutionRecord
from ctxlock.records._replay import recorded_request
from ctxlock.telemetry._spans import CacheFigures
from ctxlock.template import RenderOptions

CACHE_PROVIDERS: tuple[str, ...] = PROVIDERS


def part_counts(
    record: ExecutionRecord, request: Any, model: Any, template: Any
) -> tuple[list[tuple[str, int]] | None, str | None]:
    """Each part's tokens for `request` under the record's options on `model` (with `template`, the ChatTemplate the
    record ran with); none, with the reason, when the count fails or does not give the record's ids."""
    try:
        _, options = recorded_request(record)
        render = RenderOptions.from_record(options.to_dict(), template=template)
        kwargs = {f.name: getattr(render, f.name) for f in fields(render) if getattr(render, f.name) is not None}
        counted = count(model, request, **kwargs)
    except CtxlockError as exc:
        return None, f"per-part counts not given: {exc}"
    if counted.total != len(record.data.get("input_ids") or []):
        return None, f"per-part counts not given: the count gave {counted.total} tokens, the record holds others"
    return [(p.part, p.tokens) for p in counted.parts], None


def cache_figures(
    model: Any, session: Session, provider: str, *, options: dict[str, Any] | None = None
) -> list[CacheFigures]:
    """Each turn's cache reads, writes and buster under `provider`'s rule, as `cache-report` computes them."""
    run = cache_report(model, session, provider, options=options or {})
    out = []
    for t in run.reports:
        kind, text = (t.buster.kind, t.buster.message) if t.buster is not None else (None, None)
        out.append(CacheFigures(provider, t.split.cache_read, t.split.cache_write, kind, text))
    return out
