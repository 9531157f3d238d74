"""The probe corpus rendered through one template with one model's tokenizer, and where two renders part.

Every render uses a fixed clock (`PROBE_NOW`) and seed 0, so two renders of the same template are equal and a
difference between two templates is the templates'. A probe the template refuses is a result too: the error, its
class, and the template line it names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ctxlock.errors import CtxlockError, TemplateLimitError, TemplateRaisedError
from ctxlock.pipeline import Pipeline
from ctxlock.probes._corpus import Probe
from ctxlock.template import ChatTemplate, Rendered

PROBE_NOW = datetime(2025, 1, 15, 9, 30, 0, tzinfo=UTC)
_LINE = re.compile(r"\bline (\d+)$")
# Characters a probe's render may have beyond twice its request's: the shipped probes render to kilobytes, and a
# template that writes megabytes for every probe would cost seconds and tens of MB per probe to tokenize and keep
# (lint keeps every render), where the pipeline's own bound is for one request.
MAX_RENDER_CHARS = 1_000_000


@dataclass(frozen=True)
class ProbeError:
    """Why a probe did not render: the error's class, its message, where (its path) and the template line."""

    type: str
    message: str
    path: str | None
    line: int | None

    @property
    def raised(self) -> bool:
        """The template itself refused the conversation (`raise_exception`)."""
        return self.type == TemplateRaisedError.__name__ and self.line is not None

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "path": self.path, "line": self.line}

    @classmethod
    def of(cls, exc: CtxlockError) -> ProbeError:
        m = _LINE.search(exc.path or "")
        return cls(type(exc).__name__, exc.message, exc.path, int(m.group(1)) if m else None)


@dataclass(frozen=True)
class ProbeRender:
    """One probe through one template: the text and ids, or the error; what the render read besides the request."""

    probe: Probe
    rendered: Rendered | None
    ids: tuple[int, ...] | None
    error: ProbeError | None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def text(self) -> str | None:
        return None if self.rendered is None else self.rendered.text

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"probe": self.probe.name, "ok": self.ok}
        if self.rendered is not None:
            out["text"] = self.rendered.text
            out["ids"] = list(self.ids or ())
            out["clock_used"] = self.rendered.clock_used
        if self.error is not None:
            out["error"] = self.error.to_dict()
        return out


def render_probe(
    model: Pipeline,
    probe: Probe,
    template: ChatTemplate | None = None,
    *,
    variables: Mapping[str, Any] | None = None,
    tokenize: bool = True,
    now: datetime = PROBE_NOW,
) -> ProbeRender:
    """`probe` rendered with `template` (None: the model's own), its `chat_template_kwargs` plus `variables`, at
    `now` (default `PROBE_NOW`) with seed 0; its ids with the model's tokenizer when `tokenize`."""
    request = dict(probe.request)
    kwargs = {**(request.pop("chat_template_kwargs", None) or {}), **(variables or {})}
    try:
        rendered = model.render(
            request,
            add_generation_prompt=probe.add_generation_prompt,
            continue_final_message=probe.continue_final_message,
            chat_template=template,
            chat_template_kwargs=kwargs or None,
            now=now,
            seed=0,
        )
    except CtxlockError as exc:
        return ProbeRender(probe, None, None, ProbeError.of(exc))
    limit = MAX_RENDER_CHARS + 2 * len(json.dumps(probe.request, ensure_ascii=False))
    if len(rendered.text) > limit:
        too_long = TemplateLimitError(  # one message for every probe, so that a report groups them
            f"the render is longer than a probe may render to ({MAX_RENDER_CHARS:,} characters beyond twice its "
            "request's)",
            path=f"probe {probe.name}: {len(rendered.text):,} characters",
            hint="a chat template's render of a probe is kilobytes; one this long is not tokenized",
        )
        return ProbeRender(probe, None, None, ProbeError.of(too_long))
    ids = tuple(model.tokenize(rendered).ids) if tokenize else None
    return ProbeRender(probe, rendered, ids, None)


def render_probes(
    model: Pipeline,
    probes: Iterable[Probe],
    template: ChatTemplate | None = None,
    *,
    variables: Mapping[str, Any] | None = None,
    tokenize: bool = True,
) -> tuple[ProbeRender, ...]:
    """Every probe through `template` (see `render_probe`), in order."""
    return tuple(render_probe(model, p, template, variables=variables, tokenize=tokenize) for p in probes)


@dataclass(frozen=True)
class Divergence:
    """Where two id sequences part: the first index that differs (or where the shorter one ends), the token on each
    side there (None past the end), the character offset in each text where that token starts, and the shared
    prefix length in tokens."""

    index: int
    a_id: int | None
    b_id: int | None
    a_token: str | None
    b_token: str | None
    a_offset: int | None
    b_offset: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "a": {"id": self.a_id, "token": self.a_token, "offset": self.a_offset},
            "b": {"id": self.b_id, "token": self.b_token, "offset": self.b_offset},
        }

    def describe(self) -> str:
        def side(tok: str | None, i: int | None) -> str:
            return "the end" if i is None else f"{tok!r} (id {i})"

        return f"token {self.index}: {side(self.a_token, self.a_id)} vs {side(self.b_token, self.b_id)}"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where `a` and `b` differ (the shorter length when one extends the other), None when equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def _offset(model: Pipeline, ids: Sequence[int], index: int) -> int | None:
    if index >= len(ids):
        return None
    return len(model.tokenizer.decode(list(ids[:index])))


def diverge(
    a: Sequence[int], b: Sequence[int], model_a: Pipeline, model_b: Pipeline | None = None
) -> Divergence | None:
    """Where `a` (ids of `model_a`'s vocabulary) and `b` (of `model_b`'s, default the same) part; None when equal."""
    index = first_difference(a, b)
    if index is None:
        return None
    mb = model_b or model_a
    a_id = a[index] if index < len(a) else None
    b_id = b[index] if index < len(b) else None
    return Divergence(
        index,
        a_id,
        b_id,
        None if a_id is None else model_a.tokenizer.id_to_token(a_id),
        None if b_id is None else mb.tokenizer.id_to_token(b_id),
        _offset(model_a, a, index),
        _offset(mb, b, index),
    )


def text_difference(a: str, b: str) -> int | None:
    """The first character index where two texts differ (the shorter length when one extends the other)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def excerpt(text: str, at: int, width: int = 24) -> str:
    """`text` around character `at`, for a report line."""
    start = max(0, at - width)
    return ("…" if start else "") + text[start : at + width] + ("…" if at + width < len(text) else "")
