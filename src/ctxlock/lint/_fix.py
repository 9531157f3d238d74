"""`ctxlock lint --fix` for the training-mask rule: a template tagged with `{% generation %}` blocks that renders the
same text as the original on the probe corpus and whose blocks train exactly the tokens ctxlock's provenance mask
trains (`ctxlock.training`: the assistant body from after its header through its end-of-turn token).

How (`tag_generation`):

1. Each probe with an assistant turn is rendered as a training row (no generation prompt, no continuation; a turn
   that only calls tools also with content before its calls, a branch templates write apart) and its provenance
   mask taken: the trained characters of the text.
2. The template is rendered again with a marker before every piece that writes output at the top level (literal
   text, a `{{ ... }}` expression; `_fixsource.Unit`), which says which piece wrote what, the length of each `+`/`~`
   operand of the expression, and `X.role == "assistant"` for each enclosing `{% for X in ... %}` loop. With the
   markers removed the text must be the original's.
3. transformers' rule trains a token when a block overlaps it, provenance when most of its bytes are trained. So
   what a block must cover is said per token: none of an untrained token's characters, at least one trained
   character of a trained token (`_targets`). Each piece's characters (of literal text and string operands) and
   other operands are then cut the same way in every place the piece writes, leaving out what any place must leave
   out and covering what a place needs covered (`_solve`): `{% generation %}` between two operands, inside a string
   literal or literal text. A piece written for several roles (one expression for every message) is written twice
   under `{% if X.role == "assistant" %}`, each branch cut as its own places say.
4. The tagged template is rendered on every probe as it is and as a training row: the text must be the original's,
   and its generation mask (`source="generation"`, transformers' rule) the original's provenance mask, token for
   token. Anything else is refused with the reason (`TagResult.applies` False), never a template that differs.

What cannot be tagged so is said: trained text that begins or ends inside an operand that is not a string literal
(a variable, a filter, a macro call: the whole turn written by one macro); a token that holds both the end of a
header and the start of a body (`><` where the vocabulary has no `<tool_call>` token), which no block boundary can
split as provenance does; a piece trained in one place and not in another that no `X.role` tells apart (the
header's last character written by the tool-call loop, the first call's text a header and the second's a body);
a block that renders empty inside a token, or a token with no character of its own at the body's start
(sentencepiece's `▁`), which the check finds; text a `{% filter %}` or `{% call %}` block writes; a template the
probes all fail on. A part of a piece that no probe reaches is trained as the next part written is (as the one
before, at the end)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ctxlock.accounting import Layout, layout, layout_of
from ctxlock.errors import CtxlockError
from ctxlock.lint import _fixsource as fs
from ctxlock.pipeline import Pipeline
from ctxlock.probes import PROBE_NOW, Probe
from ctxlock.template import ChatTemplate
from ctxlock.training import MaskOptions, mask_of

_PROVENANCE = MaskOptions(source="provenance")
_EVERY = -1  # a character that is in every cell of its unit (`_cell_of_chars`)
_GENERATION = MaskOptions(source="generation")


class ProbeCheck(NamedTuple):
    """One probe through the tagged template: the same text as the original (or the same refusal), and for a
    training row the same mask (True, with the detail saying so, for a probe rendered only)."""

    probe: str
    render_identical: bool
    mask_equal: bool
    detail: str


@dataclass(frozen=True, slots=True)
class TagResult:
    """The tagged template (`source`, None when it cannot be made), whether it applies, why not, and the check of
    every probe (`checked`; empty when no tagged template was made)."""

    source: str | None
    applies: bool
    reason: str
    checked: tuple[ProbeCheck, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "applies": self.applies,
            "reason": self.reason,
            "source": self.source,
            "checked": [c._asdict() for c in self.checked],
        }


class _Refused(Exception):
    """Why the template cannot be tagged (the message is `TagResult.reason`)."""


@dataclass(frozen=True, slots=True)
class _Row:
    """A probe as rendered by the original template: its text (None: refused, with the error), and for a training
    row its lay and provenance mask (None: no trained token, with the error)."""

    probe: Probe
    training: bool
    text: str | None
    error: str
    lay: Layout | None = None
    mask: np.ndarray | None = None
    regions: tuple[tuple[int, int], ...] = ()


# -- the entry point ----------------------------------------------------------------------------------------------


def tag_generation(
    model: Pipeline, template: ChatTemplate, probes: Sequence[Probe], *, variables: Mapping[str, Any] | None = None
) -> TagResult:
    """`template` with `{% generation %}` blocks that train what ctxlock's provenance mask trains, checked on
    `probes` (module docstring). `variables`: template variables for every render, as `render_probe` takes them."""
    rows = [_original(model, template, p, variables) for p in _with_training_rows(probes)]
    try:
        _trainable(rows)  # first: a template that renders nothing is never read further
        base = _without_tags(model, template, rows, variables)
        tagged = _tag(model, base, rows, variables)
    except _Refused as exc:
        return TagResult(None, False, str(exc))
    candidate = ChatTemplate(tagged, id=f"{template.id} (tagged)", origin="ctxlock lint --fix")
    checked = tuple(_check(model, candidate, row, variables) for row in rows)
    bad = next((c for c in checked if not (c.render_identical and c.mask_equal)), None)
    if bad is not None:
        return TagResult(None, False, f"the tagged template fails on probe {bad.probe}: {bad.detail}", checked)
    return TagResult(tagged, True, "", checked)


def _with_training_rows(probes: Sequence[Probe]) -> list[tuple[Probe, bool]]:
    """Every probe as it is; each probe with an assistant turn as a training row (no generation prompt, no
    continuation; the probe itself when it is one already); and a probe whose assistant turn calls tools without
    content, as a training row where that turn says something first (the branch that writes both)."""
    out: list[tuple[Probe, bool]] = []
    for p in probes:
        messages = [m for m in p.request.get("messages", ()) if isinstance(m, Mapping)]
        has_turn = any(m.get("role") == "assistant" for m in messages)
        shaped = not p.add_generation_prompt and not p.continue_final_message
        out.append((p, has_turn and shaped))
        if has_turn and not shaped:
            out.append((_training(p, "training", p.request), True))
        if any(_calls_only(m) for m in messages):
            said = [{**m, "content": "Let me check."} if _calls_only(m) else m for m in messages]
            out.append((_training(p, "content", {**p.request, "messages": said}), True))
    return out


def _calls_only(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "assistant" and bool(message.get("tool_calls")) and not message.get("content")


def _training(probe: Probe, suffix: str, request: Mapping[str, Any]) -> Probe:
    return dataclasses.replace(
        probe,
        name=f"{probe.name}+{suffix}",
        request=request,
        add_generation_prompt=False,
        continue_final_message=False,
    )


def _options(template: ChatTemplate, probe: Probe, variables: Mapping[str, Any] | None) -> dict[str, Any]:
    """`render_probe`'s options for this probe and template."""
    kwargs = {**(probe.request.get("chat_template_kwargs") or {}), **(variables or {})}
    return {
        "add_generation_prompt": probe.add_generation_prompt,
        "continue_final_message": probe.continue_final_message,
        "chat_template": template,
        "chat_template_kwargs": kwargs or None,
        "now": PROBE_NOW,
        "seed": 0,
    }


def _request(probe: Probe) -> dict[str, Any]:
    return {k: v for k, v in probe.request.items() if k != "chat_template_kwargs"}


def _original(
    model: Pipeline, template: ChatTemplate, item: tuple[Probe, bool], variables: Mapping[str, Any] | None
) -> _Row:
    probe, training = item
    options = _options(template, probe, variables)
    try:
        if not training:
            return _Row(probe, False, model.render(_request(probe), **options).text, "")
        lay = layout(model, _request(probe), **options)
    except CtxlockError as exc:
        return _Row(probe, training, None, _describe(exc))
    try:
        mask = mask_of(model, lay, _PROVENANCE, **options)
    except CtxlockError as exc:
        return _Row(probe, True, lay.rendered.text, _describe(exc), lay)
    return _Row(probe, True, lay.rendered.text, "", lay, mask.mask, mask.regions)


def _describe(exc: CtxlockError) -> str:
    return f"{type(exc).__name__}: {exc.message}"


# -- the template without its own tags ----------------------------------------------------------------------------


def _without_tags(
    model: Pipeline, template: ChatTemplate, rows: list[_Row], variables: Mapping[str, Any] | None
) -> str:
    """The source to tag: the template's own, without the `{% generation %}` tags it has (which must not change
    what it renders)."""
    if not fs.has_generation_tags(template.source):
        return template.source
    try:
        source = fs.strip_generation_tags(template.source)
    except fs.SourceError as exc:
        raise _Refused(f"the template cannot be read token by token: {exc}") from None
    bare = ChatTemplate(source, id=f"{template.id} (untagged)")
    for row in rows:
        if row.text is not None and _render(model, bare, row.probe, variables)[0] != row.text:
            raise _Refused(
                f"removing the template's own {{% generation %}} tags changes its render (probe {row.probe.name})"
            )
    return source


def _render(
    model: Pipeline, template: ChatTemplate, probe: Probe, variables: Mapping[str, Any] | None
) -> tuple[str | None, str]:
    try:
        return model.render(_request(probe), **_options(template, probe, variables)).text, ""
    except CtxlockError as exc:
        return None, _describe(exc)


# -- where each piece of the template writes, and what of it is trained --------------------------------------------


@dataclass(frozen=True, slots=True)
class _Place:
    """One place a unit wrote: its `X.role == "assistant"` values; per cell 0 (a character of an untrained token:
    no block may cover it), 1 (trained text: a block should cover it) or None (either, or nothing written); and the
    trained tokens that lie within the place, each as the cells of its trained characters (a block must cover one)."""

    probe: str
    conds: tuple[str, ...]
    cells: tuple[int | None, ...]
    tokens: tuple[tuple[int, ...], ...]
    crossing: tuple[tuple[int, str], ...] = ()  # (cell, token): an untrained token holding trained text there


@dataclass(frozen=True, slots=True)
class _Targets:
    """Per character of a training row: 1, 0 or -1 (see `_Place`), and the token it belongs to."""

    target: np.ndarray
    token: np.ndarray
    region: np.ndarray  # per character: in the provenance mask's trained text
    spans: tuple[tuple[int, int], ...]  # per token: its characters


def _tag(model: Pipeline, source: str, rows: list[_Row], variables: Mapping[str, Any] | None) -> str:
    """The tagged source (`_Refused` with the reason when no cut fits every place)."""
    training = _trainable(rows)
    try:
        src = fs.read_source(source)
    except fs.SourceError as exc:
        raise _Refused(f"the template cannot be read token by token: {exc}") from None
    marker = _marker(source, [r.text or "" for r in rows])
    instrumented = ChatTemplate(fs.instrument(src, marker), id="instrumented")
    places: dict[int, list[_Place]] = {u.id: [] for u in src.units}
    for row in training:
        text, error = _render(model, instrumented, row.probe, variables)
        if text is None:
            raise _Refused(f"the template fails with ctxlock's markers in it (probe {row.probe.name}): {error}")
        _observe(src, row, text, marker, places)
    edits: list[fs.Edit] = []
    for unit in src.units:
        edits += _edits(src, unit, places[unit.id])
    try:
        return fs.apply_edits(source, edits)
    except fs.SourceError as exc:
        raise _Refused(f"the tags cannot be placed: {exc}") from None


def _trainable(rows: list[_Row]) -> list[_Row]:
    """The training rows the template renders; `_Refused` when there is none, or none with a trained token."""
    training = [r for r in rows if r.training and r.text is not None]
    if not training:
        raise _Refused("the template refuses every training probe: there is nothing to check a tagging on")
    if not any(r.regions for r in training):
        raise _Refused("no training probe has a trained token: there is nothing to tag")
    return training


def _marker(source: str, texts: list[str]) -> str:
    """Two private-use characters that are in neither the template nor any render."""
    used = set(source).union(*map(set, texts))
    found = [chr(c) for c in range(0xE000, 0xF900) if chr(c) not in used][:2]
    if len(found) < 2:
        raise _Refused("the template and its renders use every private-use character: no marker is left")
    return "".join(found)


def _observe(src: fs.Source, row: _Row, text: str, marker: str, places: dict[int, list[_Place]]) -> None:
    """Add the places of one instrumented render: where each unit wrote, and what of it is trained."""
    pattern = re.compile(re.escape(marker[0]) + "([^" + re.escape(marker[1]) + "]*)" + re.escape(marker[1]))
    clean: list[str] = []
    at, size = 0, 0
    marks: list[tuple[int, str]] = []
    for m in pattern.finditer(text):
        clean.append(text[at : m.start()])
        size += m.start() - at
        marks.append((size, m.group(1)))
        at = m.end()
    clean.append(text[at:])
    if "".join(clean) != row.text:
        raise _Refused(f"the template renders differently with ctxlock's markers in it (probe {row.probe.name})")
    targets = _targets(row)
    first = marks[0][0] if marks else len(row.text or "")
    if (targets.target[:first] > 0).any():
        raise _Refused("trained text is written outside every piece of the template ctxlock can see")
    ends = [p for p, _ in marks[1:]] + [len(row.text or "")] if marks else []  # no mark: nothing written here
    for (start, body), end in zip(marks, ends, strict=True):
        try:
            uid, conds, lengths = body.split(";")
            unit = src.units[int(uid)]
            sizes = [int(n) for n in lengths.split(",")] if lengths else []
        except (ValueError, IndexError):
            raise _Refused(f"ctxlock's markers came back changed (probe {row.probe.name})") from None
        where = _cell_of_chars(src, unit, end - start, sizes, row)
        cells, tokens, crossing = _place(targets, row.text or "", start, where, len(fs.cells(src, unit)))
        conds_of = tuple(conds.split(",")) if conds else ()
        places[unit.id].append(_Place(row.probe.name, conds_of, cells, tokens, crossing))


def _targets(row: _Row) -> _Targets:
    """What a generation block must do with each character of the row for transformers' rule (a token is trained
    when a block overlaps it) to give the provenance mask: leave out every character of an untrained token (0),
    cover at least one of each trained token, taken from its trained text (1); its other characters may go either
    way (-1)."""
    n = len(row.text or "")
    if row.lay is None or row.mask is None:
        return _Targets(np.zeros(n, dtype=np.int8), np.full(n, -1), np.zeros(n, dtype=bool), ())
    lay = row.lay
    target = np.zeros(n, dtype=np.int8)
    for s, e in row.regions:
        target[s:e] = 1
    region = target == 1
    token = np.full(n, -1)
    starts = (np.searchsorted(lay.offsets, lay.starts, side="right") - 1).tolist()
    ends = np.searchsorted(lay.offsets, lay.ends, side="left").tolist()
    spans = tuple(zip(starts, ends, strict=True))
    trained = row.mask.astype(bool).tolist()
    for t, (s, e) in enumerate(spans):
        token[s:e] = t
        if trained[t]:
            target[s:e][target[s:e] == 0] = -1
    for t, (s, e) in enumerate(spans):
        if not trained[t]:
            target[s:e] = 0
    return _Targets(target, token, region, spans)


def _cell_of_chars(src: fs.Source, unit: fs.Unit, size: int, sizes: list[int], row: _Row) -> list[int]:
    """The cell (`_fixsource.cells`) each character of one place of the unit is in."""
    parts = fs.cells(src, unit)
    if unit.kind == "data" or (len(unit.operands) == 1 and unit.operands[0].const is not None):
        if size != len(parts):
            raise _Refused(f"the text at line {unit.line} wrote other text than its own (probe {row.probe.name})")
        return list(range(size))
    if len(parts) == 1:
        return [0] * size
    if sum(sizes) != size:  # operands not written one after the other (a number added): every cell at once
        return [_EVERY] * size
    out: list[int] = []
    cell = 0
    for op, n in zip(unit.operands, sizes, strict=True):
        if op.const is not None:
            if n != len(op.const):
                raise _Refused(f"a string at line {unit.line} wrote other text than its own (probe {row.probe.name})")
            out += range(cell, cell + n)
            cell += n
        else:
            out += [cell] * n
            cell += 1
    return out


def _place(
    targets: _Targets, text: str, start: int, where: list[int], n: int
) -> tuple[tuple[int | None, ...], tuple[tuple[int, ...], ...], tuple[tuple[int, str], ...]]:
    """One place's cell statuses (0 wins over 1 inside a cell), its trained tokens, and the cells an untrained
    token holding trained text leaves out."""
    cells: list[int | None] = [None] * n
    by_token: dict[int, set[int]] = {}
    crossing: dict[int, str] = {}
    end = start + len(where)
    for k, cell in enumerate(where):
        v, t = int(targets.target[start + k]), int(targets.token[start + k])
        group = range(n) if cell == _EVERY else (cell,)
        for c in group:
            if v == 0:
                cells[c] = 0
                if targets.region[start + k] and t >= 0:
                    crossing.setdefault(c, text[targets.spans[t][0] : targets.spans[t][1]])
            elif v == 1 and cells[c] is None:
                cells[c] = 1
        if v == 1 and t >= 0:
            by_token.setdefault(t, set()).update(group)
    inside = {
        tuple(sorted(found))
        for t, found in by_token.items()
        if start <= targets.spans[t][0] and targets.spans[t][1] <= end
    }
    return tuple(cells), tuple(sorted(inside)), tuple(sorted(crossing.items()))


# -- the cut of each unit -----------------------------------------------------------------------------------------


def _edits(src: fs.Source, unit: fs.Unit, places: list[_Place]) -> list[fs.Edit]:
    """The unit cut the same way in every place; else, written twice under the first enclosing loop's
    `X.role == "assistant"` that parts its places into two that each have one cut."""
    if not places:
        return []
    n = len(places[0].cells)
    same = _solve(places, n)
    if same is not None:
        status = _fill(same)
        if any(status) and unit.kind == "opaque":
            raise _Refused(f"trained text is written by the block at line {unit.line} as a whole: {src.excerpt(unit)}")
        return fs.cut(src, unit, status)
    for j, var in enumerate(unit.loops):
        if var is None or unit.kind == "opaque":
            continue
        yes = _solve([p for p in places if p.conds[j] == "True"], n)
        no = _solve([p for p in places if p.conds[j] != "True"], n)
        if yes is not None and no is not None:
            return [fs.conditional(src, unit, f'{var}.role == "assistant"', _fill(yes), _fill(no))]
    first = next((k for k, var in enumerate(unit.loops) if var is not None), None)
    groups = (
        [places]
        if first is None
        else [[p for p in places if (p.conds[first] == "True") is side] for side in (True, False)]
    )
    unsolved = next((g for g in groups if _solve(g, n) is None), None)
    if unsolved is None:  # each side has a cut, and the unit cannot be written twice: a block written as a whole
        raise _Refused(f"trained text is written by the block at line {unit.line} as a whole: {src.excerpt(unit)}")
    raise _Refused(_conflict(src, unit, unsolved, n))


def _solve(places: list[_Place], n: int) -> list[int | None] | None:
    """One status per cell for all these places: 0 where any place must leave it out, else 1 where any place
    trains it, else None; None when a trained token of some place is then left with no covered cell."""
    status: list[int | None] = [None] * n
    for p in places:
        for i, v in enumerate(p.cells):
            if v == 0:
                status[i] = 0
    for p in places:
        for i, v in enumerate(p.cells):
            if v == 1 and status[i] is None:
                status[i] = 1
    if all(any(status[c] == 1 for c in tok) for p in places for tok in p.tokens):
        return status
    return None


def _conflict(src: fs.Source, unit: fs.Unit, places: list[_Place], n: int) -> str:
    """Why a unit has no one cut: a trained token left uncovered, and the place that leaves its cell out."""
    status = _solve_zeros(places, n)
    parts = fs.cells(src, unit)
    for p in places:
        for tok in p.tokens:
            if any(status[c] != 0 for c in tok):
                continue
            cell = tok[0]
            if parts[cell][1] < 0 and p.cells[cell] == 0:  # a whole operand or expression, partly trained here
                return (
                    "an assistant turn's trained text begins or ends inside a template expression that also writes "
                    f"untrained text, at line {unit.line} (probe {p.probe}): {src.excerpt(unit)}"
                )
            crossed = [(q, dict(q.crossing)[cell]) for q in places if cell in dict(q.crossing)]
            if crossed:
                other, crossing = crossed[0]
                return (
                    f"the token {crossing!r} holds both trained and untrained text at line {unit.line} (probe "
                    f"{other.probe}): no generation block trains exactly the tokens provenance trains there: "
                    f"{src.excerpt(unit)}"
                )
            other = next(q for q in places if q.cells[cell] == 0)
            what = (
                f"its character {src.cell_text(unit, parts[cell])!r}"
                if parts[cell][1] >= 0
                else (f"operand {parts[cell][0] + 1}" if unit.operands else "its text")
            )
            return (
                f"the template text at line {unit.line} is trained in one place and not in another ({what}: "
                f'trained in probe {p.probe}, not in probe {other.probe}), and no `X.role == "assistant"` of '
                f"a loop around it tells them apart: {src.excerpt(unit)}"
            )
    return f"the template text at line {unit.line} has no one cut: {src.excerpt(unit)}"


def _solve_zeros(places: list[_Place], n: int) -> list[int]:
    return [0 if any(p.cells[i] == 0 for p in places) else 1 for i in range(n)]


def _fill(status: list[int | None]) -> list[int]:
    """A cell no place decides takes the status of the next cell decided (of the one before, at the end)."""
    out: list[int] = []
    for i, v in enumerate(status):
        if v is not None:
            out.append(v)
            continue
        after = next((w for w in status[i + 1 :] if w is not None), None)
        before = out[-1] if out else None
        out.append(int(bool(after)) if after is not None else int(bool(before)))
    return out


# -- the check ----------------------------------------------------------------------------------------------------


def _check(model: Pipeline, tagged: ChatTemplate, row: _Row, variables: Mapping[str, Any] | None) -> ProbeCheck:
    """The probe through the tagged template: the original's text (or refusal), and for a training row the
    original's provenance mask as the generation mask (or no trained token on both sides)."""
    name = row.probe.name
    options = _options(tagged, row.probe, variables)
    try:
        if row.training:
            req = model.parse(_request(row.probe))
            rendered = model.render(req, **options)
        else:
            rendered = model.render(_request(row.probe), **options)
    except CtxlockError as exc:
        same = row.text is None and _describe(exc) == row.error
        return ProbeCheck(name, same, True, "refused as the original is" if same else f"refused: {_describe(exc)}")
    if row.text is None:
        return ProbeCheck(name, False, True, f"renders, where the original refuses it ({row.error})")
    if rendered.text != row.text:
        at = next((i for i, (a, b) in enumerate(zip(rendered.text, row.text, strict=False)) if a != b), None)
        at = min(len(rendered.text), len(row.text)) if at is None else at
        return ProbeCheck(name, False, False, f"the text differs at character {at}")
    if not row.training:
        return ProbeCheck(name, True, True, "same text (not a training row: no mask)")
    return _check_mask(model, req, rendered, row, options)


def _check_mask(model: Pipeline, req: Any, rendered: Any, row: _Row, options: dict[str, Any]) -> ProbeCheck:
    name = row.probe.name
    try:
        lay = layout_of(model.tokenizer, req, rendered)
        ours = mask_of(model, lay, _GENERATION, **options).mask
    except CtxlockError as exc:
        if row.mask is None:
            return ProbeCheck(name, True, True, "no trained token on either side")
        return ProbeCheck(name, True, False, f"the generation mask fails: {_describe(exc)}")
    if row.mask is None:
        return ProbeCheck(name, True, False, f"the blocks train tokens where provenance has none ({row.error})")
    if not np.array_equal(ours, row.mask):  # same text, same ids: the same length
        return ProbeCheck(name, True, False, _mask_difference(lay, ours, row.mask, rendered.generation_spans))
    return ProbeCheck(name, True, True, f"same text, same mask ({int(ours.sum())} trained tokens)")


def _mask_difference(lay: Layout, ours: np.ndarray, theirs: np.ndarray, spans: tuple[tuple[int, int], ...]) -> str:
    """Where the generation mask and the provenance mask part: the token, its characters, and why."""
    t = int(np.flatnonzero(ours != theirs)[0])
    start, end = (int(np.searchsorted(lay.offsets, b, side="right")) - 1 for b in (lay.starts[t], lay.ends[t]))
    end = max(end, start)
    text = lay.rendered.text[start:end]
    what = f"token {t} ({text!r}, characters {start}-{end})" if end > start else f"token {t} (no character of its own)"
    if ours[t]:
        empty = [s for s, e in spans if s == e and start < s < end]
        why = f": an empty generation block at character {empty[0]} lies inside it" if empty else ""
        return f"the masks differ at {what}: the generation blocks train it, provenance does not{why}"
    return f"the masks differ at {what}: provenance trains it, no generation block overlaps it"


__all__ = ["ProbeCheck", "TagResult", "tag_generation"]
