"""The probe run: recognise the server, render the corpus with ctxlock, ask each route for each probe, compare,
and (when a divergence is to be recorded) store ctxlock's side as an execution record."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ctxlock.liveprobe._compare import Cause, ProbeResult, Verdict, compare
from ctxlock.liveprobe._http import HttpLimits, ServerClient
from ctxlock.liveprobe._manifest import Manifest, ManifestCheck, check_manifest
from ctxlock.liveprobe._report import LocalSide, ProbeReport, RouteUse
from ctxlock.liveprobe._routes import Route, RouteAbsent, routes_for
from ctxlock.liveprobe._servers import ServerKind, detect
from ctxlock.pipeline import Pipeline
from ctxlock.probes import PROBE_NOW, Corpus, Probe, ProbeRender, load_corpus, render_probe, render_probes
from ctxlock.template import ChatTemplate

# Stores ctxlock's side of a diverging probe, rendered at the given time, as an execution record; returns its id.
Recorder = Callable[[Probe, datetime], str]


@dataclass(frozen=True)
class _Side:
    """ctxlock's side: the model, the template (None: the model's own) and the extra template variables."""

    model: Pipeline
    template: ChatTemplate | None
    variables: Mapping[str, Any] | None


def _local(model: Pipeline, renders: tuple[ProbeRender, ...]) -> LocalSide:
    used = next((r.rendered.template for r in renders if r.rendered is not None), None)
    return LocalSide(
        model=model.id,
        template_id=None if used is None else used.id,
        template_sha256=None if used is None else used.sha256,
        tokenizer_sha256=model.tokenizer.sha256,
    )


def _ask(route: Route, pr: ProbeRender, side: _Side) -> ProbeResult:
    why = route.skip(pr.probe)
    if why is not None:
        return ProbeResult(pr.probe.name, route.name, Verdict.NOT_SENT, pr.ids, cause=Cause("not sent", why))
    answer = route.ask(pr.probe, side.variables)
    notes = route.notes(pr.probe)
    result = compare(pr, answer, side.model, route.name, lambda a, b: route.texts(a, b, side.model), notes)
    if result.cause is None or result.cause.kind != "clock":
        return result
    # The template reads the clock and the server renders at its own time: ctxlock's side again at this machine's.
    now = datetime.now().astimezone().replace(microsecond=0)
    again = render_probe(side.model, pr.probe, side.template, variables=side.variables, now=now)
    note = (
        f"the template reads the clock: ctxlock's side is rendered at this machine's time, {now.isoformat()}, as "
        "the server renders at its own (a server in another time zone may still part at the date)"
    )
    retried = compare(again, answer, side.model, route.name, lambda a, b: route.texts(a, b, side.model), notes)
    return dataclasses.replace(retried, notes=(*retried.notes, note), now=now.isoformat())


def _run(
    routes: list[Route], renders: tuple[ProbeRender, ...], side: _Side
) -> tuple[list[ProbeResult], list[RouteUse]]:
    results: list[ProbeResult] = []
    absent: dict[str, str] = {}
    for pr in renders:
        for route in routes:
            if route.name in absent:
                continue
            try:
                results.append(_ask(route, pr, side))
            except RouteAbsent as exc:
                absent[route.name] = f"the server does not have it ({exc.why}); {route.absent_hint}"
    return results, [RouteUse(r.name, r.name not in absent, absent.get(r.name, "")) for r in routes]


def _record(results: list[ProbeResult], corpus: Corpus, recorder: Recorder) -> list[ProbeResult]:
    ids: dict[tuple[str, str | None], str] = {}
    out = []
    for r in results:
        if r.verdict is Verdict.DIVERGE and r.ctxlock_ids is not None:
            if (r.probe, r.now) not in ids:
                at = PROBE_NOW if r.now is None else datetime.fromisoformat(r.now)
                ids[r.probe, r.now] = recorder(corpus.named(r.probe), at)
            r = dataclasses.replace(r, record_id=ids[r.probe, r.now])
        out.append(r)
    return out


def probe_server(
    url: str,
    model: Pipeline | None,
    *,
    template: ChatTemplate | None = None,
    corpus: Corpus | None = None,
    kind: ServerKind | str | None = None,
    served_model: str | None = None,
    token: str | None = None,
    limits: HttpLimits | None = None,
    variables: Mapping[str, Any] | None = None,
    manifest: Manifest | None = None,
    recorder: Recorder | None = None,
) -> ProbeReport:
    """Ask the server at `url` for the probe corpus on its render and tokenize routes and compare every answer with
    ctxlock's exact render of `model` (with `template`, default the model's own) at the corpus's fixed clock (and,
    for a probe whose template reads the clock, again at this machine's time).

    `kind` skips the server's detection; `served_model` names the model at the server (default: the one it
    serves, or its default). `variables` are template variables sent with every probe (and rendered with). With a
    `manifest`, its template and tokenizer digests are checked against what the server serves (`model` may then be
    None: the digests only). `recorder` stores ctxlock's side of each diverging probe as a record (its id goes into
    the result)."""
    client = ServerClient(url, token=token, limits=limits)
    info, props = detect(client, kind, served_model)
    corpus = corpus if corpus is not None else load_corpus()
    results: list[ProbeResult] = []
    uses: list[RouteUse] = []
    local = None
    if model is not None:
        renders = render_probes(model, corpus, template, variables=variables)
        local = _local(model, renders)
        results, uses = _run(routes_for(client, info), renders, _Side(model, template, variables))
        if recorder is not None:
            results = _record(results, corpus, recorder)
    checked: ManifestCheck | None = None
    if manifest is not None:
        checked = check_manifest(
            client,
            info,
            props,
            manifest,
            local_template=None if local is None else local.template_sha256,
            local_tokenizer=None if model is None else model.tokenizer.sha256,
        )
    return ProbeReport(info, tuple(uses), local, corpus.sources, tuple(results), checked, client.calls)
