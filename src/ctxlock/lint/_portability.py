"""The portability rule: the probe corpus rendered by jinja2 (the reference: transformers' environment), minijinja
(text-generation-inference, mistral.rs) and @huggingface/jinja (transformers.js), and every construct another
engine rejects or renders differently, named with its template line (`_engines.py` runs the engines)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxlock.core import thaw
from ctxlock.lint._engines import ENGINES, Divergence, Engine, compare, render_many
from ctxlock.lint._findings import Finding, Severity, Skipped
from ctxlock.lint._rules import Lint
from ctxlock.probes import ProbeRender

OTHER_ENGINES: tuple[Engine, ...] = tuple(e for e in ENGINES if e != "jinja2")
TIMEOUT_S = 5.0
_PEERS = {
    "minijinja": "minijinja (text-generation-inference, mistral.rs)",
    "hf-jinja": "hf-jinja (@huggingface/jinja, transformers.js)",
}


def context_of(render: ProbeRender) -> dict[str, Any]:
    """The variables a probe's render gave the template, as plain JSON: the messages, tools and documents as sent
    (content parts joined into one string with newlines when the render joined them: vLLM's flattening, see
    `ctxlock.template.content_format`), and what else the template saw (special tokens, add_generation_prompt,
    the arguments)."""
    assert render.rendered is not None
    request = render.probe.request
    messages = list(request.get("messages") or [])
    if render.rendered.flattened:  # the template read a string: it saw the text parts joined, as ctxlock renders
        messages = [_joined(m) for m in messages]
    out: dict[str, Any] = {"messages": messages}
    for key in ("tools", "documents"):
        if request.get(key) is not None:
            out[key] = request[key]
    variables = thaw(render.rendered.variables)
    assert isinstance(variables, dict)
    out.update(variables)
    return out


def _joined(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return {**message, "content": "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))}


def portability(lint: Lint, engines: Sequence[Engine] = OTHER_ENGINES) -> tuple[list[Finding], list[Skipped]]:
    """One finding per engine, line and kind of departure, with the probes that show it; an engine that is not
    installed is skipped, with what to install."""
    renders = [r for r in lint.renders if r.rendered is not None]
    if not renders:
        return [], []
    contexts = [context_of(r) for r in renders]
    source = lint.template.source
    reference = render_many("jinja2", source, contexts, timeout_s=TIMEOUT_S)
    findings: list[Finding] = []
    missing: dict[Engine, str] = {}
    for engine in engines:
        results = render_many(engine, source, contexts, timeout_s=TIMEOUT_S)
        groups: dict[tuple[str, int | None], list[tuple[ProbeRender, Divergence]]] = {}
        for r, ref, got in zip(renders, reference, results, strict=True):
            d = compare(ref, got)
            if d is None:
                continue
            if d.verdict == "unavailable":
                missing[engine] = d.message
                break
            groups.setdefault((d.verdict, d.line), []).append((r, d))
        findings += [_finding(engine, hits) for hits in groups.values()]
    ran = [e for e in engines if e not in missing]
    return findings, [Skipped("portability", _not_compared(e, why, ran)) for e, why in missing.items()]


def _not_compared(engine: Engine, why: str, ran: Sequence[Engine]) -> str:
    """Which engine was not compared and why, and which were: one engine missing is not the rule not running."""
    peer = _PEERS.get(engine, engine)
    if not ran:
        return f"{peer} was not compared with jinja2, and no other engine was either: {why}"
    others = " and ".join(ran)
    return f"only {peer} was not compared with jinja2 ({others} {'was' if len(ran) == 1 else 'were'}): {why}"


def _finding(engine: Engine, hits: list[tuple[ProbeRender, Divergence]]) -> Finding:
    r, d = hits[0]
    names = [h.probe.name for h, _ in hits]
    peer = _PEERS.get(engine, engine)
    if d.verdict == "differs":
        message = (
            f"{peer} renders different text: from {d.reference!r} jinja2 writes, it writes {d.got!r} "
            f"({len(hits)} probe(s))"
        )
    elif d.verdict == "limited":  # named the engine compared with: jinja2's own bound is met once per engine
        message = f"{d.message} with {peer} ({len(hits)} probe(s))"
    else:
        message = f"{d.message.replace(engine, peer, 1)} ({len(hits)} probe(s))"
    severity = Severity.NOTE if d.verdict in ("limited", "accepts") else Severity.WARNING
    return Finding(
        "portability",
        severity,
        message,
        line=d.line,
        probe=r.probe.name,
        hint="probes: " + ", ".join(names),
        data={"engine": engine, "verdict": d.verdict, "construct": d.construct, "probes": names},
    )
