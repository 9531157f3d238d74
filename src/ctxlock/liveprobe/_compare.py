"""One probe's answer from the server against ctxlock's exact render: the verdict, the first diverging token, and
its cause.

The cause is read off the two sides in this order:

- `server refused` / `ctxlock refused`: one side rendered the probe, the other refused it (the refusal's words);
- `special tokens`: one id sequence is the other with one more id at the start or the end (a BOS or EOS the
  tokenizer added where the template wrote one, or did not);
- `tokenizer`: the server's text is ctxlock's, character for character, and its ids are not;

and whatever the cause, when one side's ids start with a BOS (the tokenizer's named `bos_token`, or what its
`add_special_tokens` puts first) that the other side's lack, or end with the EOS the tokenizer adds and the other's
do not, the detail says so first: a server that tokenizes the rendered prompt with the tokenizer's special tokens
(llama.cpp's `add_special: true`) adds a BOS the template does not write, besides any other difference.
- `clock`: the texts differ and the template read the clock (`strftime_now`): ctxlock renders at the probe corpus's
  fixed time, the server at its own (the run then renders ctxlock's side again at this machine's time, and compares
  that);
- `template`: the texts differ; the first differing character is named, with both texts around it;
- `unknown`: the route gives ids only and the server could not decode them, so text cannot be compared.

Which text is the server's depends on the route (`Route.texts`): its own rendered text where it answers one, else
both id sequences decoded by the server's own `/detokenize`, so both sides go through the same decoder."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ctxlock.liveprobe._routes import Refusal, ServerRender, special_affixes
from ctxlock.pipeline import Pipeline
from ctxlock.probes import PROBE_NOW, Divergence, ProbeRender, diverge, excerpt, text_difference


class Verdict(StrEnum):
    AGREE = "agree"
    BOTH_REFUSE = "both refuse"
    DIVERGE = "diverge"
    NOT_SENT = "not sent"


@dataclass(frozen=True)
class TextDifference:
    """Where the two texts part: the character offset and both texts around it, and which texts these are."""

    offset: int
    ctxlock: str
    server: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "ctxlock": self.ctxlock, "server": self.server, "source": self.source}


@dataclass(frozen=True)
class Cause:
    """Why the two sides part: a kind (see the module's list) and one sentence, with the text difference."""

    kind: str
    detail: str
    text: TextDifference | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "text": None if self.text is None else self.text.to_dict()}


@dataclass(frozen=True)
class ProbeResult:
    """One probe on one route: the verdict, both id sequences, the first diverging token and its cause, notes, and
    the id of the stored record of ctxlock's side when the probe diverged."""

    probe: str
    route: str
    verdict: Verdict
    ctxlock_ids: tuple[int, ...] | None = None
    server_ids: tuple[int, ...] | None = None
    divergence: Divergence | None = None
    cause: Cause | None = None
    notes: tuple[str, ...] = ()
    record_id: str | None = None
    now: str | None = None  # the time ctxlock's side was rendered at, when not the corpus's (a clock template)

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe,
            "route": self.route,
            "verdict": str(self.verdict),
            "ctxlock_ids": None if self.ctxlock_ids is None else list(self.ctxlock_ids),
            "server_ids": None if self.server_ids is None else list(self.server_ids),
            "divergence": None if self.divergence is None else _divergence(self.divergence),
            "cause": None if self.cause is None else self.cause.to_dict(),
            "notes": list(self.notes),
            "record_id": self.record_id,
            "now": self.now or PROBE_NOW.isoformat(),
        }


def _divergence(d: Divergence) -> dict[str, Any]:
    """`Divergence.to_dict` with its sides named: `a` is ctxlock's, `b` the server's."""
    raw = d.to_dict()
    return {"index": raw["index"], "ctxlock": raw["a"], "server": raw["b"]}


def _refusals(pr: ProbeRender, answer: ServerRender | Refusal) -> tuple[Verdict, Cause | None]:
    mine = None
    if pr.error is not None:
        line = f" (template line {pr.error.line})" if pr.error.line is not None else ""
        mine = f"{pr.error.type}: {pr.error.message}{line}"
    if isinstance(answer, Refusal) and mine is not None:
        detail = f"ctxlock refuses it ({mine}); the server too (HTTP {answer.status}: {answer.message})"
        return Verdict.BOTH_REFUSE, Cause("both refused", detail)
    if isinstance(answer, Refusal):
        n = len(pr.ids or ())
        detail = f"the server refuses it (HTTP {answer.status}: {answer.message}); ctxlock renders it ({n} tokens)"
        return Verdict.DIVERGE, Cause("server refused", detail)
    detail = f"ctxlock refuses it ({mine}); the server answers {len(answer.ids)} tokens"
    return Verdict.DIVERGE, Cause("ctxlock refused", detail)


def _token(model: Pipeline, i: int) -> str:
    tok = model.tokenizer.id_to_token(i)
    return f"id {i}" if tok is None else f"{tok!r} (id {i})"


def _extra_special(a: Sequence[int], b: Sequence[int], model: Pipeline) -> Cause | None:
    """One sequence is the other with one more id at the start or the end: the tokenizer's BOS or EOS."""
    for longer, shorter, side in ((a, b, "ctxlock's"), (b, a, "the server's")):
        if len(longer) != len(shorter) + 1:
            continue
        for where, extra, rest in (("start", longer[0], longer[1:]), ("end", longer[-1], longer[:-1])):
            if list(rest) == list(shorter):
                detail = (
                    f"{side} ids have one more token at the {where}, {_token(model, extra)}: a BOS or EOS the "
                    "tokenizer adds besides the template's own (or one side's tokenizer adds it and the other's not)"
                )
                return Cause("special tokens", detail)
    return None


def special_ends(a: Sequence[int], b: Sequence[int], model: Pipeline) -> str:
    """What one id sequence has at its start (end) that the other lacks there: a BOS (the named `bos_token`, or
    what the tokenizer's `add_special_tokens` puts first), or the EOS the tokenizer appends. `a` is ctxlock's, `b`
    the server's; "" when neither."""
    tok = model.tokenizer
    prefix, suffix = special_affixes(tok)
    starts = set(prefix)
    bos = model.special_tokens.get("bos_token")
    if isinstance(bos, str) and (bos_id := tok.token_to_id(bos)) is not None:
        starts.add(bos_id)
    said = []
    for ids, other, side, others in ((b, a, "the server's", "ctxlock's"), (a, b, "ctxlock's", "the server's")):
        if ids and ids[0] in starts and (not other or other[0] != ids[0]):
            said.append(f"{side} ids start with a BOS, {_token(model, ids[0])}, that {others} lack")
        if ids and suffix and ids[-1] in suffix and (not other or other[-1] != ids[-1]):
            said.append(f"{side} ids end with the EOS the tokenizer adds, {_token(model, ids[-1])}, that {others} lack")
    return "; ".join(said)


def _text_cause(
    pr: ProbeRender, sr: ServerRender, texts: tuple[str, str, str] | None, k: int, model: Pipeline
) -> Cause:
    assert pr.ids is not None
    ends = special_ends(pr.ids, sr.ids, model)
    first = f"{ends}; besides, " if ends else ""
    if texts is None:
        return Cause(
            "unknown",
            f"{first}the ids part at token {k}; the route answers ids only and the server did not decode them, so "
            "the texts cannot be compared",
        )
    mine, theirs, source = texts
    at = text_difference(mine, theirs)
    if at is None:
        return Cause(
            "tokenizer",
            f"{first}the texts are the same ({source}), character for character; the ids part at token {k}: the "
            "server's tokenizer makes other ids of the same text",
        )
    diff = TextDifference(at, excerpt(mine, at), excerpt(theirs, at), source)
    assert pr.rendered is not None
    if pr.rendered.clock_used:
        return Cause(
            "clock",
            f"{first}the texts part at character {at}, and the template reads the clock: ctxlock renders at "
            f"{PROBE_NOW.isoformat()} (the probe corpus's fixed time), the server at its own",
            diff,
        )
    detail = f"{first}the texts part at character {at} ({source}): the server's template renders other text here"
    mine_sha = pr.rendered.template.sha256
    if sr.template_sha256 is not None and sr.template_sha256 != mine_sha:
        detail += f"; it renders with template sha256 {sr.template_sha256[:16]}…, ctxlock with {mine_sha[:16]}…"
    return Cause("template", detail, diff)


def compare(
    pr: ProbeRender,
    answer: ServerRender | Refusal,
    model: Pipeline,
    route: str,
    texts: Callable[[ProbeRender, ServerRender], tuple[str, str, str] | None],
    notes: tuple[str, ...] = (),
) -> ProbeResult:
    """The result of `pr` (ctxlock's side) against the server's `answer` on `route`; `texts(pr, answer)` gives the
    two texts to compare and what they are (or None), asked only when the ids differ."""
    if isinstance(answer, Refusal) or pr.ids is None:
        verdict, cause = _refusals(pr, answer)
        server = None if isinstance(answer, Refusal) else answer.ids
        return ProbeResult(pr.probe.name, route, verdict, pr.ids, server, None, cause, notes)
    if pr.ids == answer.ids:
        return ProbeResult(pr.probe.name, route, Verdict.AGREE, pr.ids, answer.ids, notes=notes)
    d = diverge(pr.ids, answer.ids, model)
    assert d is not None
    cause = _extra_special(pr.ids, answer.ids, model) or _text_cause(pr, answer, texts(pr, answer), d.index, model)
    return ProbeResult(pr.probe.name, route, Verdict.DIVERGE, pr.ids, answer.ids, d, cause, notes)
