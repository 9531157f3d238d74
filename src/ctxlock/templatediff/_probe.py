"""One probe through both sides, and how the two renders differ: the first diverging token when the ids are
comparable (one tokenizer), else the first differing character; an error on one side against a render on the other;
two errors that are not the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxlock.probes import Divergence, Probe, ProbeError, ProbeRender, diverge, excerpt, text_difference
from ctxlock.templatediff._sides import Side


@dataclass(frozen=True)
class ProbeDiff:
    """One probe rendered by A and by B. `divergence` is where the ids part (both render, one tokenizer);
    `text_index` the first character where the texts differ (both render). Two errors are the same when their class
    and message are (the template line may move with the source and is not compared)."""

    probe: Probe
    a: ProbeRender
    b: ProbeRender
    divergence: Divergence | None
    text_index: int | None
    ids_comparable: bool

    @property
    def kind(self) -> str:
        """ "same"; "ids" (the ids differ), "text" (the texts differ: other tokenizers, or one tokenizer and the same
        ids); "error" (one side fails, or both fail differently)."""
        if self.a.error is not None or self.b.error is not None:
            return "same" if _same_error(self.a.error, self.b.error) else "error"
        if self.divergence is not None:
            return "ids"
        return "same" if self.text_index is None else "text"

    @property
    def differs(self) -> bool:
        return self.kind != "same"

    @property
    def excerpt_at(self) -> int | None:
        """The character where the report's excerpts are centred: the diverging token's start, or (other
        tokenizers, or a token start past the first differing character) the first differing character."""
        d = self.divergence
        if d is not None and d.a_offset is not None and self.text_index is not None and d.a_offset <= self.text_index:
            return d.a_offset
        return self.text_index

    def excerpts(self, width: int = 24) -> tuple[str, str] | None:
        """Each side's text around `excerpt_at` (both render and differ), else None."""
        at = self.excerpt_at
        if at is None or self.a.text is None or self.b.text is None:
            return None
        return excerpt(self.a.text, at, width), excerpt(self.b.text, at, width)

    def to_dict(self) -> dict[str, Any]:
        pair = self.excerpts()
        return {
            "probe": self.probe.name,
            "status": "differs" if self.differs else "same",
            "kind": self.kind,
            "a": _side_dict(self.a, self.differs),
            "b": _side_dict(self.b, self.differs),
            "divergence": None if self.divergence is None else self.divergence.to_dict(),
            "text": None if pair is None else {"index": self.text_index, "a": pair[0], "b": pair[1]},
        }


def _same_error(a: ProbeError | None, b: ProbeError | None) -> bool:
    return a is not None and b is not None and (a.type, a.message) == (b.type, b.message)


def _side_dict(r: ProbeRender, with_ids: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": r.ok}
    if r.rendered is not None:
        out["tokens"] = len(r.ids or ())
        out["template"] = r.rendered.template.id
        if with_ids:
            out["ids"] = list(r.ids or ())
    if r.error is not None:
        out["error"] = r.error.to_dict()
    return out


def compare(probe: Probe, a: ProbeRender, b: ProbeRender, sa: Side, sb: Side) -> ProbeDiff:
    """`probe`'s two renders compared; ids token for token only when both sides share a tokenizer (sha256)."""
    comparable = sa.model.tokenizer.sha256 == sb.model.tokenizer.sha256
    if a.rendered is None or b.rendered is None:
        return ProbeDiff(probe, a, b, None, None, comparable)
    index = text_difference(a.rendered.text, b.rendered.text)
    div = None
    if comparable and a.ids is not None and b.ids is not None:
        div = diverge(a.ids, b.ids, sa.model, sb.model)
    return ProbeDiff(probe, a, b, div, index, comparable)
