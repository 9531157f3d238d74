"""What `ctxlock probe` found: the server and how it was recognised, the routes asked (and the ones it lacks), ctxlock's
side (model, template, tokenizer), one result per probe and route, and the manifest's digests against the server's;
as JSON (`to_dict`) and as lines for a terminal (`lines`)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ctxlock.liveprobe._compare import ProbeResult, Verdict
from ctxlock.liveprobe._manifest import ManifestCheck
from ctxlock.liveprobe._servers import ServerInfo
from ctxlock.probes import PROBE_NOW


@dataclass(frozen=True)
class RouteUse:
    """A route the probe asked, or meant to: whether it was used, and why not."""

    name: str
    used: bool
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"route": self.name, "used": self.used, "why": self.why or None}


@dataclass(frozen=True)
class LocalSide:
    """ctxlock's side: the model files, the template the probes rendered with, the tokenizer."""

    model: str
    template_id: str | None
    template_sha256: str | None
    tokenizer_sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "template": None
            if self.template_sha256 is None
            else {"id": self.template_id, "sha256": self.template_sha256},
            "tokenizer": {"sha256": self.tokenizer_sha256},
            "now": PROBE_NOW.isoformat(),
        }


@dataclass(frozen=True)
class ProbeReport:
    """Everything one `ctxlock probe` run found."""

    server: ServerInfo
    routes: tuple[RouteUse, ...]
    local: LocalSide | None
    corpus: tuple[str, ...]
    results: tuple[ProbeResult, ...]
    manifest: ManifestCheck | None = None
    calls: int = 0

    @property
    def divergences(self) -> tuple[ProbeResult, ...]:
        return tuple(r for r in self.results if r.verdict is Verdict.DIVERGE)

    @property
    def ok(self) -> bool:
        """No probe diverged and no manifest digest differs (a digest that could not be checked is not a failure;
        the report says it was not checked)."""
        return not self.divergences and not (self.manifest is not None and self.manifest.differs)

    def counts(self) -> dict[str, int]:
        c = Counter(str(r.verdict) for r in self.results)
        return {str(v): c.get(str(v), 0) for v in Verdict}

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server.to_dict(),
            "routes": [r.to_dict() for r in self.routes],
            "local": None if self.local is None else self.local.to_dict(),
            "corpus": {"sources": list(self.corpus), "probes": len({r.probe for r in self.results})},
            "counts": self.counts(),
            "results": [r.to_dict() for r in self.results],
            "manifest": None if self.manifest is None else self.manifest.to_dict(),
            "calls": self.calls,
            "ok": self.ok,
        }

    def lines(self) -> list[str]:
        """The report for a terminal: the head, each divergence with its cause, what was not sent, the summary."""
        s = self.server
        out = [f"server    {s.url}  {s.kind}" + (f" {s.version}" if s.version else "") + f"  ({s.detected})"]
        if s.model is not None:
            out.append(f"model     {s.model} (as the server names it)")
        for r in self.routes:
            out.append(f"route     {r.name}: " + ("asked" if r.used else f"not asked: {r.why}"))
        if self.local is not None:
            lo = self.local
            tpl = f"{lo.template_id} sha256 {lo.template_sha256[:16]}…" if lo.template_sha256 else "(none rendered)"
            out.append(f"ctxlock   {lo.model} · template {tpl} · tokenizer sha256 {lo.tokenizer_sha256[:16]}…")
        out += _result_lines(self.results)
        if self.manifest is not None:
            out += _manifest_lines(self.manifest)
        return [*out, self._summary()]

    def _summary(self) -> str:
        parts = []
        if self.local is not None:
            c = self.counts()
            asked = len(self.results) - c[str(Verdict.NOT_SENT)]
            probes = f"{c['agree']} of {asked} agree"
            if c[str(Verdict.BOTH_REFUSE)]:
                probes += f", {c[str(Verdict.BOTH_REFUSE)]} refused by both"
            probes += f", {c['diverge']} diverge"
            if c[str(Verdict.NOT_SENT)]:
                probes += f", {c[str(Verdict.NOT_SENT)]} not sent"
            parts.append(probes)
        if self.manifest is not None:
            statuses = [c.status for c in self.manifest.checks]
            differs, unchecked = statuses.count("differs"), statuses.count("not checked")
            text = f"manifest: {differs} digest{'s differ' if differs > 1 else ' differs'}" if differs else ""
            text = text or "manifest: the digests checked agree"
            parts.append(text + (f", {unchecked} not checked" if unchecked else ""))
        return "result    " + "; ".join(parts)


def _shown(text: str) -> str:
    # JSON's escapes: a newline or a control character in a text excerpt stays on the report's line.
    return json.dumps(text, ensure_ascii=False)


def _token(i: int | None, token: str | None) -> str:
    if i is None:
        return "the end"
    if token is None:  # a server's id past ctxlock's vocabulary: not an empty token
        return f"id {i}, not in ctxlock's vocabulary"
    return f"{_shown(token)} (id {i})"


def _group_key(r: ProbeResult) -> tuple[Any, ...]:
    d, c = r.divergence, r.cause
    where = None if d is None else (d.index, d.a_id, d.b_id)
    return (r.route, where, None if c is None else (c.kind, c.detail, c.text), r.notes)


def _divergence_lines(group: list[ProbeResult]) -> list[str]:
    """One block for the probes that part the same way (same token, same cause)."""
    first = group[0]
    names = ", ".join(r.probe for r in group)
    head = f"DIVERGE   {first.probe}" if len(group) == 1 else f"DIVERGE   {len(group)} probes ({names})"
    out = [f"{head} on {first.route}"]
    d, c = first.divergence, first.cause
    if d is not None:
        mine, theirs = _token(d.a_id, d.a_token), _token(d.b_id, d.b_token)
        out.append(f"          first diverging token: #{d.index}: ctxlock {mine}, server {theirs}")
    if c is not None:
        out.append(f"          cause: {c.kind}: {c.detail}")
        if c.text is not None:
            out.append(f"            ctxlock: {_shown(c.text.ctxlock)}")
            out.append(f"            server:  {_shown(c.text.server)}")
    out += [f"          note: {note}" for note in first.notes]
    for r in group:
        if r.record_id is not None:
            out.append(
                f"          record {r.record_id}  ({r.probe}, ctxlock's side: ctxlock replay {r.record_id[:12]})"
            )
    return out


def _result_lines(results: tuple[ProbeResult, ...]) -> list[str]:
    groups: dict[tuple[Any, ...], list[ProbeResult]] = {}
    out: list[str] = []
    for r in results:
        if r.verdict is Verdict.DIVERGE:
            groups.setdefault(_group_key(r), []).append(r)
        elif r.verdict is Verdict.NOT_SENT and r.cause is not None:
            out.append(f"not sent  {r.probe} on {r.route}: {r.cause.detail}")
    for group in groups.values():
        out += _divergence_lines(group)
    return out


def _manifest_lines(m: ManifestCheck) -> list[str]:
    out = [f"manifest  {m.source}" + (f" (model {m.model})" if m.model else "")]
    for c in m.checks:
        if c.status == "not checked" or c.manifest is None or c.server is None:
            out.append(f"          {c.what}: {c.status}: {c.detail}")
        else:
            digests = f"manifest {c.manifest[:16]}…, server {c.server[:16]}…"
            out.append(f"          {c.what}: {c.status}: {digests} ({c.detail})")
    return out
