"""The JSON the CLI prints with `--json` and `ctxlock serve` answers with: pure functions of a run's values."""

from __future__ import annotations

from typing import Any

from ctxlock.accounting import unseen_parts, unseen_warnings
from ctxlock.core import thaw
from ctxlock.model import Model, Run
from ctxlock.records import model_warnings


def run_to_dict(model: Model, run: Run) -> dict[str, Any]:
    r, t, mi = run.rendered, run.tokenized, run.model_input
    tok = model.tokenizer
    return {
        "model": model.id,
        "text": r.text,
        "input_ids": mi.input_ids[0].tolist(),
        "attention_mask": mi.attention_mask[0].tolist(),
        "position_ids": mi.position_ids[0].tolist(),
        "num_tokens": int(mi.valid_lengths[0]),
        "template": r.template.to_dict(),
        "tokenizer": {"id": tok.id, "format": tok.format, "sha256": tok.sha256},
        "request": {
            "dialect": str(run.request.dialect),
            "sha256": run.request.source_sha256,
            "utf8_policy": str(run.request.utf8_policy),
            "replaced_bytes": list(run.request.replaced_bytes),
        },
        "special_tokens": str(r.policy),
        "control_tokens": [[m.start, m.end, m.id] for m in t.control],
        "neutralized": [
            {"start": m.start, "end": m.end, "text": r.text[m.start : m.end], "path": path_at(r, m.start)}
            for m in t.neutralized
        ],
        "now": r.now,
        "clock_zone": r.clock_zone,
        "clock_used": r.clock_used,
        "random": {"seed": r.seed, "draws": [thaw(d) for d in r.draws]},
        "hub": model.hub.to_dict() if model.hub is not None else None,
        "warnings": run_warnings(model, r, run.request),
        "content_format": {
            "used": r.content_format,
            "detected": r.content_format_detected,
            "flattened": list(r.flattened),
        },
        "provenance_exact": r.provenance_exact,
        "request_spans": [[s.start, s.end, s.path] for s in r.request_spans],
    }


def run_warnings(model: Model, rendered: Any, request: Any) -> list[dict[str, Any]]:
    """What the record's `warnings` holds for this run: a rolling hub revision, the render's own, and every request
    part the template never wrote."""
    return model_warnings(model) + [thaw(w) for w in rendered.warnings] + unseen_warnings(request, rendered)


def path_at(rendered: Any, offset: int) -> str:
    return next((s.path for s in rendered.request_spans if s.start <= offset < s.end), "")


def fit_to_dict(fitted: Any, sent: dict[str, Any], rid: str | None) -> dict[str, Any]:
    """`ctxlock fit --json`: the decisions, the fitted request as sent (`sent`), its ids, the unseen parts."""
    unseen = list(unseen_parts(fitted.request, fitted.rendered))
    out = {**fitted.to_dict(), "request": sent, "input_ids": list(fitted.ids), "unseen": unseen}
    if rid:
        out["record_id"] = rid
    return out
