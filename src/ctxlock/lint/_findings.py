"""What `ctxlock lint` reports: findings (rule, severity, message, template line, the probe that shows it) and the
report of one template, with the rules that could not run and why (never a silent pass)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class Severity(IntEnum):
    """How bad a finding is; `--fail-on` takes the name. Ordered: note < warning < error."""

    NOTE = 1
    WARNING = 2
    ERROR = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def named(cls, name: str) -> Severity:
        return cls[name.upper()]


@dataclass(frozen=True)
class Rule:
    """One lint rule: its id, a one-line summary and the failure it comes from (a public report a reader can open)."""

    id: str
    summary: str
    why: str
    help_uri: str = ""


@dataclass(frozen=True)
class Finding:
    """One thing the linter found: the rule, how bad, what, where in the template (1-based line, None for the
    template as a whole), the probe conversation that shows it (when one does), what to do, and details."""

    rule: str
    severity: Severity
    message: str
    line: int | None = None
    probe: str | None = None
    hint: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "severity": self.severity.label,
            "message": self.message,
            "line": self.line,
            "probe": self.probe,
            "hint": self.hint,
        }
        if self.data:
            out["data"] = self.data
        return out


@dataclass(frozen=True)
class Skipped:
    """A rule (or one engine of a rule) that did not run, and why: reported, never a silent pass."""

    rule: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "reason": self.reason}


@dataclass(frozen=True)
class Report:
    """One template's lint: what was linted (its id, digest, file), with which model's tokenizer, the findings in
    template-line order, and the rules that did not run."""

    template_id: str
    template_sha256: str
    origin: str
    model: str
    findings: tuple[Finding, ...]
    skipped: tuple[Skipped, ...] = ()
    notes: tuple[str, ...] = ()

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    def counts(self) -> dict[str, int]:
        return {s.label: sum(1 for f in self.findings if f.severity == s) for s in reversed(Severity)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "template": {"id": self.template_id, "sha256": self.template_sha256, "origin": self.origin},
            "model": self.model,
            "counts": self.counts(),
            "findings": [f.to_dict() for f in self.findings],
            "skipped": [s.to_dict() for s in self.skipped],
            "notes": list(self.notes),
        }
