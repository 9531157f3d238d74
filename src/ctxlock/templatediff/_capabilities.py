"""What each side's template does with each part of a request, and which of those changed.

The probe capabilities (`ctxlock.probes.capabilities`: system, tools, tool calls and results, reasoning, content
parts, names, documents, continuation, generation prompt) are read off the probe renders. Two more are the
template's own:

- `content_format`: whether the template reads a message's content as a list of parts (`openai`) or as a string
  (`string`, content parts joined before it sees them), as `ctxlock.template` detects it from its syntax tree,
  read off the `content-parts` probe's render;
- `mask`: where assistant-token masks come from for training (`{% generation %}` blocks, transformers' rule, or
  ctxlock's provenance) and whether the sentinel cross-check agrees (`ctxlock.training.template_report`).

A capability changed when its verdict differs; the detail (an error's line) is shown, not compared."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxlock.probes import PROBE_NOW, ProbeRender, Verdict, capabilities
from ctxlock.templatediff._sides import Side
from ctxlock.training import REPORT_CONVERSATIONS, TemplateReport, template_report

CONTENT_FORMAT_PROBE = "content-parts"
TEMPLATE_CAPABILITIES = ("content_format", "mask")
MASK_CONVERSATIONS = ", ".join(name for name, _ in REPORT_CONVERSATIONS)  # what the mask verdict is judged on


@dataclass(frozen=True)
class CapabilityDiff:
    """One capability's verdict on each side."""

    capability: str
    a: Verdict
    b: Verdict

    @property
    def changed(self) -> bool:
        return self.a.verdict != self.b.verdict

    def to_dict(self) -> dict[str, Any]:
        return {"changed": self.changed, "a": self.a.to_dict(), "b": self.b.to_dict()}


def _content_format(renders: Sequence[ProbeRender]) -> Verdict:
    r = next((r for r in renders if r.probe.name == CONTENT_FORMAT_PROBE), None)
    if r is None:
        return Verdict("content_format", "not probed", CONTENT_FORMAT_PROBE, "the corpus has no probe of this name")
    if r.error is not None:
        kind = "refused" if r.error.raised else "error"
        return Verdict("content_format", kind, CONTENT_FORMAT_PROBE, r.error.message, r.error.line)
    assert r.rendered is not None
    detected = r.rendered.content_format_detected or r.rendered.content_format or "openai"
    how = "content parts reach the template as a list" if detected == "openai" else "parts are joined into a string"
    return Verdict("content_format", detected, CONTENT_FORMAT_PROBE, how)


def _mask_verdict(report: TemplateReport) -> Verdict:
    names = MASK_CONVERSATIONS
    if report.agree:
        return Verdict("mask", f"{report.source}: agree", names, "provenance and the sentinel re-renders agree")
    name, check = report.reported[0]
    detail = f"{check.status} on the {name} conversation at {check.path}: {check.detail}"
    return Verdict("mask", f"{report.source}: {check.status}", names, detail)


def _mask(side: Side, renders: Sequence[ProbeRender], variables: Mapping[str, Any] | None) -> Verdict:
    # The template the side renders a plain conversation with: a model's default (not its tool_use one), or the file.
    template = side.template
    if template is None:
        plain = (r.rendered.template for r in renders if r.rendered is not None and not r.probe.request.get("tools"))
        template = next(plain, None)
    if template is None:
        return Verdict("mask", "error", MASK_CONVERSATIONS, "no probe rendered: no template to check the masks of")
    options: dict[str, Any] = {"now": PROBE_NOW, "seed": 0}
    if variables:
        options["chat_template_kwargs"] = dict(variables)
    return _mask_verdict(template_report(side.model, template, **options))


def capability_diffs(
    a: Side,
    b: Side,
    renders_a: Sequence[ProbeRender],
    renders_b: Sequence[ProbeRender],
    variables: Mapping[str, Any] | None = None,
    *,
    masks: bool = True,
) -> tuple[CapabilityDiff, ...]:
    """Every capability's verdict on A and on B, in `ctxlock.probes.CAPABILITIES` order, then content format and
    mask (`masks=False`: not checked, "not probed")."""
    ca, cb = capabilities(renders_a), capabilities(renders_b)
    out = [CapabilityDiff(name, ca[name], cb[name]) for name in ca]
    out.append(CapabilityDiff("content_format", _content_format(renders_a), _content_format(renders_b)))
    if masks:
        out.append(CapabilityDiff("mask", _mask(a, renders_a, variables), _mask(b, renders_b, variables)))
    else:
        skipped = Verdict("mask", "not probed", MASK_CONVERSATIONS, "the mask check was not asked for")
        out.append(CapabilityDiff("mask", skipped, skipped))
    return tuple(out)
