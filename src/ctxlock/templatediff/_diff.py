"""The behavioural diff of two sides over a probe corpus: every probe rendered by both (same clock, same seed, same
variables), compared, and the capabilities of each side.

`TemplateDiff.to_dict()` is `ctxlock diff-template --json`; its keys are documented in docs/template-diff.md."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ctxlock.probes import Corpus, render_probes
from ctxlock.templatediff._capabilities import CapabilityDiff, capability_diffs
from ctxlock.templatediff._probe import ProbeDiff, compare
from ctxlock.templatediff._sides import Side


@dataclass(frozen=True)
class TemplateDiff:
    """A against B over `corpus`: one `ProbeDiff` per probe, in corpus order, and one `CapabilityDiff` per
    capability. `identical` when no probe renders differently and no capability changed."""

    a: Side
    b: Side
    corpus: Corpus
    variables: Mapping[str, Any]
    probes: tuple[ProbeDiff, ...]
    capabilities: tuple[CapabilityDiff, ...]

    @property
    def ids_comparable(self) -> bool:
        """Both sides tokenize with one tokenizer (equal sha256): ids are compared token for token; else only the
        texts are, and each side's ids are reported."""
        return self.a.model.tokenizer.sha256 == self.b.model.tokenizer.sha256

    @property
    def differing(self) -> tuple[ProbeDiff, ...]:
        return tuple(p for p in self.probes if p.differs)

    @property
    def changed(self) -> tuple[CapabilityDiff, ...]:
        return tuple(c for c in self.capabilities if c.changed)

    @property
    def identical(self) -> bool:
        return not self.differing and not self.changed

    def to_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "differences": len(self.differing),
            "capabilities_changed": len(self.changed),
            "ids_comparable": self.ids_comparable,
            "a": {**self.a.to_dict(), "templates": _templates(self, "a")},
            "b": {**self.b.to_dict(), "templates": _templates(self, "b")},
            "probes": {
                "count": len(self.corpus),
                "sources": list(self.corpus.sources),
                "variables": dict(self.variables),
            },
            "results": [p.to_dict() for p in self.probes],
            "capabilities": {c.capability: c.to_dict() for c in self.capabilities},
        }


def _templates(diff: TemplateDiff, side: str) -> list[dict[str, str]]:
    """The templates a side rendered with, in first use order (a model may pick its tool_use one for tools)."""
    seen: dict[str, dict[str, str]] = {}
    own = diff.a.template if side == "a" else diff.b.template
    if own is not None:
        seen[own.sha256] = own.to_dict()
    for p in diff.probes:
        r = p.a if side == "a" else p.b
        if r.rendered is not None and r.rendered.template.sha256 not in seen:
            seen[r.rendered.template.sha256] = r.rendered.template.to_dict()
    return list(seen.values())


def diff_templates(
    a: Side, b: Side, corpus: Corpus, *, variables: Mapping[str, Any] | None = None, masks: bool = True
) -> TemplateDiff:
    """Render every probe of `corpus` with A and with B (`variables`: template variables for both, over each probe's
    own `chat_template_kwargs`) and compare them probe by probe and capability by capability (`masks=False` skips
    the assistant-mask check, which renders conversations of its own)."""
    renders_a = render_probes(a.model, corpus, a.template, variables=variables)
    renders_b = render_probes(b.model, corpus, b.template, variables=variables)
    probes = tuple(compare(p, ra, rb, a, b) for p, ra, rb in zip(corpus, renders_a, renders_b, strict=True))
    caps = capability_diffs(a, b, renders_a, renders_b, variables, masks=masks)
    return TemplateDiff(a, b, corpus, dict(variables or {}), probes, caps)
