"""The values of a closed provider's count: each part's figure, its range and how it is known."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Basis = Literal["exact", "documented", "estimated"]
# The order of trust: a total is as good as its weakest part.
BASES: tuple[Basis, ...] = ("exact", "documented", "estimated")

# What a part is made of, for the calibration's per-kind factors (`ctxlock calibrate`).
KINDS = ("text", "framing", "tool", "tool_call", "image", "document")


def weakest(bases: list[Basis] | tuple[Basis, ...]) -> Basis:
    """The least certain basis of several ("exact" for none)."""
    return max(bases, key=BASES.index, default="exact")


@dataclass(frozen=True, slots=True)
class PartCount:
    """One part of a request as a closed provider counts it.

    `part` is the request path as sent (`system`, `tools[0]`, `messages[2]`, `messages[2].content[1]` for an image,
    `messages[2].tool_calls`), or a name for what the provider adds: `framing` (the message framing), `tool_framing`
    (the tool-use prompt). `tokens` is the point figure, `low`..`high` its range (equal when exact), `basis` how it
    is known and `method` the rule or tokenizer that gave it."""

    part: str
    kind: str
    tokens: int
    low: int
    high: int
    basis: Basis
    method: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "kind": self.kind,
            "tokens": self.tokens,
            "range": [self.low, self.high],
            "basis": self.basis,
            "method": self.method,
        }


@dataclass(frozen=True, slots=True)
class ProviderCount:
    """A request's input tokens as a closed provider counts them, part by part, each figure labelled."""

    provider: str
    model: str
    parts: tuple[PartCount, ...]
    tokenizer: str  # the encoding (OpenAI) or the proxy (the others), by name and digest
    exact_tokenizer: bool  # True when `tokenizer` is the provider's own (OpenAI's published encodings)
    calibration: dict[str, Any] | None = None  # {"sha256", "requests", ...} of the calibration file applied
    notes: tuple[str, ...] = field(default=())

    @property
    def total(self) -> int:
        return sum(p.tokens for p in self.parts)

    @property
    def low(self) -> int:
        return sum(p.low for p in self.parts)

    @property
    def high(self) -> int:
        return sum(p.high for p in self.parts)

    @property
    def basis(self) -> Basis:
        return weakest([p.basis for p in self.parts])

    def by_basis(self) -> dict[str, int]:
        out: dict[str, int] = {b: 0 for b in BASES}
        for p in self.parts:
            out[p.basis] += p.tokens
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.model,
            "input_tokens": self.total,
            "range": [self.low, self.high],
            "basis": self.basis,
            "by_basis": self.by_basis(),
            "tokenizer": self.tokenizer,
            "exact_tokenizer": self.exact_tokenizer,
            "calibration": self.calibration,
            "parts": [p.to_dict() for p in self.parts],
            "notes": list(self.notes),
        }
