"""What a template does with each part of a request, read off the probe renders.

A capability is judged on one probe of the corpus by the render's provenance (`Rendered.request_spans`: which
request strings reached the text, by JSON path), with a marker string as the fallback where the template passes a
value through a filter that does not keep provenance (`tojson` of the tools). Each verdict is one of:

- `rendered`: the probe renders and the part reaches the text;
- `dropped`: the probe renders, and the part does not reach it (the template ignores it);
- `refused`: the template raises on the probe (`raise_exception`), with its line;
- `error`: the probe fails otherwise (the error says why);
- `not probed`: the corpus has no probe of that name (a user's corpus that replaced it)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ctxlock.probes._render import ProbeRender

# capability -> (probe, path pattern of the part, marker text that shows it when provenance does not)
_CHECKS: dict[str, tuple[str, str, str]] = {
    "system": ("system", r"messages\[0\]\.content", "You are a terse assistant."),
    "tools": ("tools", r"tools\[0\]", "get_weather"),
    "tool_calls": ("tool-call", r"messages\[1\]\.tool_calls\[0\]\.function", "Paris"),
    "tool_results": ("tool-call", r"messages\[2\]\.content", "temperature"),
    "parallel_tool_calls": ("parallel-tool-calls", r"messages\[1\]\.tool_calls\[1\]\.function", "Rome"),
    "reasoning": ("reasoning-last", r"messages\[1\]\.reasoning_content", "Two plus two is four."),
    "reasoning_in_history": ("reasoning", r"messages\[1\]\.reasoning_content", "Two plus two is four."),
    "content_parts": ("content-parts", r"messages\[0\]\.content\[\d+\]\.text", "of France?"),
    "name": ("named", r"messages\[0\]\.name", "alice"),
    "documents": ("documents", r"documents\[0\]", "The Eiffel Tower is in Paris."),
    "continue_final": ("continue-final", r"messages\[1\]\.content", "Morning on the Seine,"),
}
CAPABILITIES = (*_CHECKS, "generation_prompt")


@dataclass(frozen=True)
class Verdict:
    """One capability's verdict, the probe it was judged on, and the detail (an error's message and line)."""

    capability: str
    verdict: str
    probe: str
    detail: str = ""
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verdict": self.verdict, "probe": self.probe}
        if self.detail:
            out["detail"] = self.detail
        if self.line is not None:
            out["line"] = self.line
        return out


def _reached(r: ProbeRender, pattern: str, marker: str) -> bool:
    assert r.rendered is not None
    rx = re.compile(pattern)
    if any(rx.match(s.path) for s in r.rendered.request_spans):
        return True
    return bool(marker) and marker in r.rendered.text


def _verdict(capability: str, r: ProbeRender | None, probe: str, pattern: str, marker: str) -> Verdict:
    if r is None:
        return Verdict(capability, "not probed", probe, "the corpus has no probe of this name")
    if r.error is not None:
        kind = "refused" if r.error.raised else "error"
        return Verdict(capability, kind, probe, r.error.message, r.error.line)
    return Verdict(capability, "rendered" if _reached(r, pattern, marker) else "dropped", probe)


def capabilities(renders: Sequence[ProbeRender]) -> dict[str, Verdict]:
    """Each capability's verdict on these renders (of one template, over a corpus holding the shipped probes)."""
    by_name = {r.probe.name: r for r in renders}
    out = {
        cap: _verdict(cap, by_name.get(probe), probe, pattern, marker)
        for cap, (probe, pattern, marker) in _CHECKS.items()
    }
    with_prompt, without = by_name.get("user"), by_name.get("user-no-generation-prompt")
    if with_prompt is None or without is None:
        out["generation_prompt"] = Verdict("generation_prompt", "not probed", "user")
    elif with_prompt.error is not None:
        out["generation_prompt"] = _verdict("generation_prompt", with_prompt, "user", "", "")
    elif without.error is None and with_prompt.text == without.text:
        out["generation_prompt"] = Verdict(
            "generation_prompt", "dropped", "user", "add_generation_prompt changes nothing: the template never reads it"
        )
    else:
        out["generation_prompt"] = Verdict("generation_prompt", "rendered", "user")
    return out
