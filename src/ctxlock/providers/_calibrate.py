"""Calibration from the user's own logs: per-kind correction factors for a closed provider's estimates, and the
error they leave, measured on requests the fit never saw.

A log is JSON lines, each a request as sent and the provider's reported usage for it:
`{"request": {...}, "usage": {...}}` (the usage in any shape `ctxlock usage` reads: the provider's input is its
`input + cache_read + cache_write`). Each request is counted uncalibrated (`count_provider`); its parts are summed
by kind. The exact and documented parts are taken as they are; the estimated kinds (`text` under a proxy, `tool`,
`tool_call`, `framing`, ...) get one factor each, fitted by least squares over the training lines so that

    reported input ≈ exact + documented + Σ factor[kind] × estimated[kind]

Every `HOLDOUT`-th line (by position, deterministic) is held back: the residuals reported are the relative errors
of the calibrated count on those lines alone, so they say how far the next request will be off. A calibrated count's
estimated parts are scaled by their factor and carry the held-back 95th-percentile error as their range.

The file `calibrate` writes is an artifact: its sha256 (of the file's bytes) names it in every count that used it.
Nothing is calibrated silently: a count only uses a calibration it is given, for the provider and model it was
fitted on.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ctxlock.economics import parse_usage
from ctxlock.errors import CalibrationError, CtxlockError
from ctxlock.outside import loads_outside
from ctxlock.providers._count import count_provider
from ctxlock.providers._values import PartCount, ProviderCount

FORMAT = "ctxlock-calibration/1"
HOLDOUT = 5  # every 5th line (the 5th, 10th, ...) is held back: 20%
MAX_LINE_BYTES = 16 << 20  # one request and its usage
MAX_CALIBRATION_BYTES = 1 << 20
MIN_LINES = 10


@dataclass(frozen=True, slots=True)
class Residuals:
    """Relative errors |calibrated − reported| / reported, in percent, over `requests` held-back requests."""

    requests: int
    mean_abs_pct: float
    p95_pct: float
    max_pct: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "mean_abs_pct": self.mean_abs_pct,
            "p95_pct": self.p95_pct,
            "max_pct": self.max_pct,
        }

    def summary(self) -> str:
        return f"±{self.mean_abs_pct:.1f}% over {self.requests} held-back requests, 95th percentile {self.p95_pct:.1f}%"


@dataclass(frozen=True, slots=True)
class Calibration:
    provider: str
    model: str
    factors: Mapping[str, float]  # estimated kind -> factor
    unfitted: tuple[str, ...]  # estimated kinds the log never had: factor 1, range the prior's
    fitted_on: int
    residuals: Residuals
    sha256: str = ""  # of the file's bytes, once written or read
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "provider": self.provider,
            "model": self.model,
            "factors": {k: round(v, 6) for k, v in sorted(self.factors.items())},
            "unfitted": list(self.unfitted),
            "fitted_on": self.fitted_on,
            "held_back": self.residuals.to_dict(),
        }

    def file_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode()

    def ref(self) -> dict[str, Any]:
        """What a count that used this calibration carries."""
        return {
            "sha256": self.sha256,
            "file": self.source,
            "fitted_on": self.fitted_on,
            "held_back": self.residuals.to_dict(),
            "summary": self.residuals.summary(),
        }

    def apply(self, counted: ProviderCount) -> ProviderCount:
        """`counted` (uncalibrated) with each estimated part scaled by its kind's factor, its range the held-back
        95th-percentile error; refused for another provider or model."""
        if counted.provider != self.provider or counted.model != self.model:
            raise CalibrationError(
                f"the calibration is for {self.provider} {self.model}, not {counted.provider} {counted.model}",
                path=self.source or None,
                hint="calibrate on a log of this provider and model (ctxlock calibrate)",
            )
        p95 = self.residuals.p95_pct / 100
        parts = []
        for p in counted.parts:
            if p.basis != "estimated" or p.kind not in self.factors or p.kind in self.unfitted:
                parts.append(p)
                continue
            tokens = round(p.tokens * self.factors[p.kind])
            method = f"{p.method}; × {self.factors[p.kind]:.4f} calibrated"
            parts.append(
                PartCount(
                    p.part,
                    p.kind,
                    tokens,
                    math.floor(tokens * (1 - p95)),
                    math.ceil(tokens * (1 + p95)),
                    "estimated",
                    method,
                )
            )
        return replace(counted, parts=tuple(parts), calibration=self.ref())


def _by_kind(counted: ProviderCount) -> tuple[int, dict[str, int]]:
    """(the exact and documented tokens, {estimated kind: tokens})."""
    fixed = 0
    est: dict[str, int] = {}
    for p in counted.parts:
        if p.basis == "estimated":
            est[p.kind] = est.get(p.kind, 0) + p.tokens
        else:
            fixed += p.tokens
    return fixed, est


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else 0.0


def residuals_of(
    factors: Mapping[str, float], rows: Sequence[tuple[int, Mapping[str, int], int]]
) -> tuple[Residuals, list[float]]:
    """The relative errors (percent) of `factors` on `rows` of (fixed, {kind: tokens}, reported)."""
    errors = []
    for fixed, est, reported in rows:
        predicted = fixed + sum(factors.get(k, 1.0) * v for k, v in est.items())
        errors.append(abs(predicted - reported) / reported * 100 if reported else 0.0)
    res = Residuals(
        requests=len(rows),
        mean_abs_pct=round(float(np.mean(errors)), 3) if errors else 0.0,
        p95_pct=round(_percentile(errors, 95), 3),
        max_pct=round(max(errors, default=0.0), 3),
    )
    return res, errors


def fit(
    rows: Sequence[tuple[int, Mapping[str, int], int]], *, provider: str, model: str, holdout: int = HOLDOUT
) -> Calibration:
    """Fit per-kind factors on every row but each `holdout`-th; measure the residuals on those."""
    if len(rows) < MIN_LINES:
        raise CalibrationError(
            f"{len(rows)} requests: too few to calibrate and hold some back",
            hint=f"give at least {MIN_LINES} requests with their reported usage",
        )
    train = [r for i, r in enumerate(rows) if (i + 1) % holdout != 0]
    held = [r for i, r in enumerate(rows) if (i + 1) % holdout == 0]
    kinds = sorted({k for _, est, _ in rows for k, v in est.items() if v > 0})
    seen = [k for k in kinds if any(est.get(k, 0) > 0 for _, est, _ in train)]
    factors = {k: 1.0 for k in kinds}
    if seen:
        a = np.array([[est.get(k, 0) for k in seen] for _, est, _ in train], dtype=float)
        b = np.array([reported - fixed for fixed, _, reported in train], dtype=float)
        solution, *_ = np.linalg.lstsq(a, b, rcond=None)
        factors.update({k: float(max(v, 0.0)) for k, v in zip(seen, solution, strict=True)})
    residuals, _ = residuals_of(factors, held)
    return Calibration(
        provider=provider,
        model=model,
        factors=factors,
        unfitted=tuple(k for k in kinds if k not in seen),
        fitted_on=len(train),
        residuals=residuals,
    )


def log_rows(
    lines: Iterable[tuple[str, bytes]], *, provider: str, model: str | None
) -> tuple[list[tuple[int, dict[str, int], int]], str]:
    """Each log line (`where`, raw bytes) counted uncalibrated: (fixed, {kind: tokens}, reported), and the model."""
    rows = []
    for where, raw in lines:
        if len(raw) > MAX_LINE_BYTES:
            raise CalibrationError(
                f"a line of {len(raw):,} bytes, over the {MAX_LINE_BYTES:,} one request and its usage may take",
                path=where,
                hint="one request and its usage per line",
            )
        obj = loads_outside(raw, f"{where} $", error=CalibrationError)
        if not isinstance(obj, dict) or "request" not in obj or "usage" not in obj:
            raise CalibrationError(
                "a calibration line is an object with a request and its usage",
                path=f"{where} $",
                hint='write {"request": {...as sent...}, "usage": {...as the provider reported it...}} per line',
            )
        request = obj["request"]
        if not isinstance(request, dict):
            raise CalibrationError("the request is not an object", path=f"{where} $.request")
        line_model = model or request.get("model")
        if not isinstance(line_model, str) or not line_model:
            raise CalibrationError(
                "no model: the request names none", path=f"{where} $.request.model", hint="pass --model"
            )
        if model is None:
            model = line_model
        elif line_model != model and "model" in request and request["model"] != model:
            raise CalibrationError(
                f"the log mixes models: {request['model']!r} after {model!r}",
                path=f"{where} $.request.model",
                hint="calibrate one model per file, or pass --model to count every line as that model",
            )
        try:
            usage = parse_usage(obj["usage"], path=f"{where} $.usage")
            counted = count_provider(request, provider=provider, model=model)
        except CalibrationError:
            raise
        except CtxlockError as e:
            raise CalibrationError(
                str(e.message), path=f"{where} {e.path or '$'}", hint=e.hint or "fix or drop this line"
            ) from None
        reported = usage.input + usage.cache_read + usage.cache_write
        fixed, est = _by_kind(counted)
        rows.append((fixed, est, reported))
    if model is None:
        raise CalibrationError("the log is empty", hint="give request and usage lines")
    return rows, model


def read_calibration(raw: bytes, source: str) -> Calibration:
    """A calibration file, checked; its sha256 is of these bytes."""
    if len(raw) > MAX_CALIBRATION_BYTES:
        raise CalibrationError(f"{len(raw):,} bytes: not a calibration file", path=source)
    obj = loads_outside(raw, f"{source} $", error=CalibrationError)
    hint = "write it with ctxlock calibrate"
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CalibrationError(f"not a calibration file (no format {FORMAT!r})", path=f"{source} $.format", hint=hint)
    try:
        factors = obj["factors"]
        held = obj["held_back"]
        if not isinstance(factors, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and 0 <= v < 1e6 for k, v in factors.items()
        ):
            raise TypeError("factors")
        residuals = Residuals(
            requests=int(held["requests"]),
            mean_abs_pct=float(held["mean_abs_pct"]),
            p95_pct=float(held["p95_pct"]),
            max_pct=float(held["max_pct"]),
        )
        if not all(math.isfinite(x) and x >= 0 for x in (residuals.mean_abs_pct, residuals.p95_pct, residuals.max_pct)):
            raise ValueError("residuals")
        cal = Calibration(
            provider=str(obj["provider"]),
            model=str(obj["model"]),
            factors={k: float(v) for k, v in factors.items()},
            unfitted=tuple(str(k) for k in obj.get("unfitted", [])),
            fitted_on=int(obj["fitted_on"]),
            residuals=residuals,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CalibrationError(
            f"a calibration file with a missing or bad field ({e})", path=source, hint=hint
        ) from None
    return replace(cal, sha256=hashlib.sha256(raw).hexdigest(), source=source)


def load_calibration(path: str | Path) -> Calibration:
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CALIBRATION_BYTES + 1)
    except OSError as e:
        raise CalibrationError(f"cannot read the calibration file: {e.strerror}", path=str(path)) from None
    return read_calibration(raw, str(path))
