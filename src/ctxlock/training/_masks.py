"""Assistant-token masks: the tokens of `input_ids` a model is trained on (`return_assistant_tokens_mask=True`).

**The rule (provenance).** The rendered text's characters each come from somewhere: a request string (by the
render's exact provenance, `Rendered.request_spans`) or the template's own text. A token is trained when its bytes
come from a trained turn:

- **the turn's body**: from the end of its header to the last character the message itself wrote. The message's
  strings are its content, its reasoning and its tool calls (everything it carries but its `name`); template text
  *between* them (`<tool_call>\\n{"name": "` around a call's name and arguments) is part of the body, because the
  model writes it. The header is the text the template's generation prompt appends (`<|im_start|>assistant\\n`,
  probed once per template and options by rendering `[user]` with and without `add_generation_prompt`); the body
  starts after the last occurrence of the header between the previous request string and the message's first
  character (so a `<think>\\n\\n</think>\\n\\n` or a `<tool_call>` the template writes after the header is trained),
  and at the message's first character when the header is not found there.
- **its end-of-turn text**: the template text that closes the turn, up to and including its end-of-turn token
  (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`, `</s>`). It is probed once per template (render `[user, assistant]`
  and take the text after the assistant's content, trailing whitespace removed), and found in the template text
  that follows the message's last character, before the next request string. When the probe gives nothing (the
  template refuses the probe conversation), the first control token of that text is the end of turn.
- A header (`<|im_start|>assistant\\n`), other messages, the template's own text elsewhere and the generation
  prompt are never trained. A message that wrote no character (empty content, no calls) has no trained token.

A token whose bytes straddle trained and untrained text takes the side of most of its bytes, ties to the side of
its first byte: `ctxlock.accounting.assign_owners`, the rule `ctxlock count` attributes tokens with.

**Options** (`MaskOptions`): `roles` (default `("assistant",)`): the roles whose turns are trained; `train_on_eot`:
`"all"` (every trained turn's end-of-turn text), `"last"` (only the last trained turn's) or `"none"`; `last_turn_only`:
train only the last message of those roles. `source`: `"auto"` (default) uses the template's `{% generation %}` blocks
when it has them and the options are the defaults, else provenance; `"generation"` and `"provenance"` force one.

**`{% generation %}` templates** (`source="generation"`): exactly transformers' `return_assistant_tokens_mask`: a
token is trained when its character range overlaps a generation block (`Rendered.generation_spans`), walked in
transformers' one pass. Here, unlike the provenance rule, a straddling token is trained if any of its bytes is.

**Never a silent zero mask.** A row with no trained token is a `MaskError` naming why (no message of those roles,
nothing written, a generation-tagged template with no block rendered).

**The cross-check** (`cross_check`): the same turns found without provenance, as axolotl does: render the
conversation cut before each trained message with the generation prompt (where its body starts), and cut after it
with its content replaced by a sentinel (where its content ends, and the closing text after it), each of which must
be a prefix of the full render. The two methods must give the same trained characters; a template where the cuts
are not prefixes (it rewrites earlier turns, as Qwen3 drops earlier reasoning) or where they disagree is reported
with the reason, per template digest (`ctxlock inspect`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctxlock.accounting import Layout, assign_owners, layout, part_of
from ctxlock.caches import LRU
from ctxlock.errors import CtxlockError, MaskError, OptionError
from ctxlock.pipeline import Pipeline
from ctxlock.request import Request
from ctxlock.settings import fast_enabled
from ctxlock.template import Rendered
from ctxlock.tokenizer import control_matches
from ctxlock.training._fastmask import region_mask, region_masks

EOT_CHOICES = ("all", "last", "none")
SOURCES = ("auto", "provenance", "generation")
_SENTINEL = "ctxlock-sentinel-{}-end"
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")  # transformers' test for the tag


@dataclass(frozen=True, slots=True)
class MaskOptions:
    """What is trained: see the module docstring."""

    roles: tuple[str, ...] = ("assistant",)
    train_on_eot: str = "all"
    last_turn_only: bool = False
    source: str = "auto"

    def __post_init__(self) -> None:
        roles = (self.roles,) if isinstance(self.roles, str) else tuple(self.roles)
        if not roles or not all(isinstance(r, str) and r for r in roles):
            raise OptionError("roles must be a non-empty list of role names", path="roles", hint="e.g. ('assistant',)")
        object.__setattr__(self, "roles", roles)
        if self.train_on_eot not in EOT_CHOICES:
            raise OptionError(
                f"train_on_eot={self.train_on_eot!r}", path="train_on_eot", hint=f"one of {', '.join(EOT_CHOICES)}"
            )
        if self.source not in SOURCES:
            raise OptionError(f"source={self.source!r}", path="source", hint=f"one of {', '.join(SOURCES)}")
        if not isinstance(self.last_turn_only, bool):
            raise OptionError("last_turn_only must be a bool", path="last_turn_only", hint="True or False")

    @property
    def default_choice(self) -> bool:
        return self.roles == ("assistant",) and self.train_on_eot == "all" and not self.last_turn_only


@dataclass(frozen=True, slots=True)
class Mask:
    """One row's mask: 0/1 per token (int64, read-only), the method, the trained character ranges of the rendered
    text (provenance) or the generation blocks, and whether every token's bytes were laid exactly."""

    mask: np.ndarray
    source: str
    regions: tuple[tuple[int, int], ...]
    exact_bytes: bool
    notes: tuple[str, ...] = ()  # what a reader must know: no end-of-turn text found, bytes not laid exactly

    @property
    def trained(self) -> int:
        return int(self.mask.sum())


@dataclass(frozen=True, slots=True)
class TurnMarks:
    """A template's assistant header (what the generation prompt appends), end-of-turn text, and the text between a
    user's content and the assistant's that follows it (`[/INST]` where the generation prompt is empty), probed."""

    header: str
    eot: str
    separator: str = ""


# -- probing the template -----------------------------------------------------------------------------------------

_MARKS: LRU[str, TurnMarks] = LRU("masks.turn_marks", max_items=256, scope="artifact")


def turn_marks(model: Pipeline, rendered: Rendered, options: Mapping[str, Any], tools: Any = None) -> TurnMarks:
    """The header and end-of-turn text of `rendered`'s template under these render options (cached per template).
    The probes carry no tools; when the template refuses them so, they are made again with the request's `tools`."""
    rest = {k: v for k, v in options.items() if k not in ("add_generation_prompt", "continue_final_message")}
    # No other options (every `ctxlock batch` row): a key without JSON (which made a tenth of a batch row's mask).
    key = (
        json.dumps([rendered.template.sha256, model.id, rest], sort_keys=True, default=repr)
        if rest
        else f"{rendered.template.sha256}\0{model.id}"
    )
    hit = _MARKS.get(key)
    if hit is None:
        hit = TurnMarks(_probe_header(model, rest, {}), *_probe_eot(model, rest, {}))
        _MARKS.put(key, hit)
    if hit.header or hit.eot or not tools:
        return hit
    key = json.dumps([key, tools], sort_keys=True, default=repr)
    with_tools = _MARKS.get(key)
    if with_tools is None:
        extra = {"tools": tools}
        with_tools = TurnMarks(_probe_header(model, rest, extra), *_probe_eot(model, rest, extra))
        _MARKS.put(key, with_tools)
    return with_tools


def _probe_header(model: Pipeline, options: Mapping[str, Any], extra: dict[str, Any]) -> str:
    """What the generation prompt appends: the text with it, past what it shares with the text without it (which may
    end in an EOS instead), never cutting a control token."""
    probe = {"messages": [{"role": "user", "content": "x"}], **extra}
    try:
        with_prompt = model.render(probe, **options, add_generation_prompt=True)
        without = model.render(probe, **options, add_generation_prompt=False).text
    except CtxlockError:
        return ""
    text = with_prompt.text
    n = _shared(text, without)
    for m in control_matches(with_prompt, model.tokenizer):
        if m.start < n < m.end:
            n = m.start
    return text[n:]


def _shared(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _probe_eot(model: Pipeline, options: Mapping[str, Any], extra: dict[str, Any]) -> tuple[str, str]:
    """The text after the assistant's content, in a conversation that ends with it and in one that goes on, cut to
    what the two share (a final turn may be followed by an EOS, a later one by the next header), then back to the
    end of the last control token in it (or, with none, its trailing whitespace removed). And the separator."""
    closings = []
    separator = ""
    for messages in (_PROBE[:2], _PROBE):
        try:
            rendered = model.render({"messages": list(messages), **extra}, **options, add_generation_prompt=False)
        except CtxlockError:
            return "", ""
        spans = rendered.request_spans
        ends = [s.end for s in spans if s.path == "messages[1].content"]
        starts = [s.start for s in spans if s.path == "messages[2].content"]
        if not ends:
            return "", ""
        if not separator:
            user_end = max((s.end for s in spans if s.path == "messages[0].content"), default=-1)
            at = min(s.start for s in spans if s.path == "messages[1].content")
            separator = rendered.text[user_end:at] if 0 <= user_end <= at else ""
        closings.append((rendered, max(ends), min(starts, default=len(rendered.text))))
    (first, a, a_end), (_, b, b_end) = closings
    x, y = first.text[a:a_end], closings[1][0].text[b:b_end]
    n = _shared(x, y)
    tokens = [m.end - a for m in control_matches(first, model.tokenizer) if a <= m.start and m.end <= a + n]
    return (x[: max(tokens)] if tokens else x[:n].rstrip()), separator


_PROBE = (
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": "y"},
    {"role": "user", "content": "z"},
)


# -- the provenance rule ------------------------------------------------------------------------------------------


def _trained_sources(request: Request, opts: MaskOptions) -> list[str]:
    sources: list[str] = []
    for m in request.messages:
        if m.role in opts.roles and m.source not in sources:
            sources.append(m.source)
    return sources[-1:] if opts.last_turn_only else sources


def provenance_regions(
    rendered: Rendered, request: Request, opts: MaskOptions, marks: TurnMarks
) -> list[tuple[int, int, int]]:
    """Each trained turn as (body start, end of its body, end of its end-of-turn text) in characters of the rendered
    text; the last two are equal when no end-of-turn text is trained (see `train_on_eot`)."""
    text = rendered.text
    spans = [(s.start, s.end, part_of(s.path), s.path) for s in rendered.request_spans if s.end > s.start]
    order: dict[str, int] | None = None
    out: list[tuple[int, int, int]] = []
    for source in _trained_sources(request, opts):
        # One pass for the message's own characters, one for the spans around them (None: there was none).
        first: int | None = None
        last = 0
        for s, e, part, path in spans:
            if part == source and path != f"{source}.name":  # not the message's own name; a call's is written
                if first is None:
                    first, last = s, e
                else:
                    first, last = min(first, s), max(last, e)
        if first is not None:
            before: int | None = None
            after: int | None = None
            for s, e, part, _ in spans:
                if part != source:
                    if e <= first and (before is None or e > before):
                        before = e
                    if s >= last and (after is None or s < after):
                        after = s
            before = 0 if before is None else before
            after = len(text) if after is None else after
            start = body_start(text, before, first, marks)
            out.append((start, last, _eot_end(text, last, after, marks)))
            continue
        if order is None:
            order = {m.source: i for i, m in reversed(list(enumerate(request.messages)))}
        turn = _empty_turn(text, spans, order, order[source], marks)
        if turn is not None:
            out.append(turn)
    if opts.train_on_eot == "none":
        return [(s, e, e) for s, e, _ in out]
    if opts.train_on_eot == "last":
        return [(s, e, e) for s, e, _ in out[:-1]] + out[-1:]
    return out


def body_start(text: str, before: int, first: int, marks: TurnMarks) -> int:
    """Where a turn's body starts, in the template text `text[before:first]` in front of the message's first
    character: after the last header there, else after the last separator, else at that character."""
    run = text[before:first]
    for mark in (marks.header, marks.separator):
        at = run.rfind(mark) if mark else -1
        if at >= 0:
            return before + at + len(mark)
    return first


def _empty_turn(
    text: str, spans: list[tuple[int, int, str, str]], order: dict[str, int], index: int, marks: TurnMarks
) -> tuple[int, int, int] | None:
    """A message that wrote no character (empty content): its turn is the one header between the messages around
    it, and the end-of-turn text after that header; None when that is not exactly one header followed by it."""
    if not marks.eot:
        return None
    before = max((e for s, e, part, _ in spans if order.get(part, -1) < index), default=0)
    after = min((s for s, e, part, _ in spans if order.get(part, -1) > index and s >= before), default=len(text))
    run = text[before:after]
    mark = next((m for m in (marks.header, marks.separator) if m and run.count(m) == 1), "")
    if not mark:
        return None
    body = before + run.index(mark) + len(mark)
    eot = text.find(marks.eot, body, after)
    return None if eot < 0 else (body, eot, eot + len(marks.eot))


def _eot_end(text: str, last: int, after: int, marks: TurnMarks) -> int:
    if not marks.eot:
        return last
    at = text.find(marks.eot, last, after)
    return at + len(marks.eot) if at >= 0 else last


def _char_regions(regions: list[tuple[int, int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple((s, t) for s, _, t in regions if t > s)


def _provenance_mask(lay: Layout, regions: tuple[tuple[int, int], ...]) -> np.ndarray:
    """1 for a token most of whose bytes lie in the regions (ties: its first byte's side), by `assign_owners` on
    every byte's owner; the fast path (`_fastmask.region_mask`) counts them from the regions' ends alone."""
    if fast_enabled() and lay.bounds is not None:
        fast = region_mask(lay.bounds, [(int(lay.offsets[s]), int(lay.offsets[e])) for s, e in regions])
        if fast is not None:
            return fast
    owner = np.zeros(int(lay.offsets[-1]), dtype=np.int32)
    for s, e in regions:
        owner[int(lay.offsets[s]) : int(lay.offsets[e])] = 1
    return assign_owners(owner, lay.starts, lay.ends).astype(np.int64)


def _generation_mask(lay: Layout, spans: tuple[tuple[int, int], ...]) -> np.ndarray:
    """transformers' pass: spans in render order, each token trained when it overlaps the current span."""
    mask = np.zeros(len(lay.ids), dtype=np.int64)
    byte_spans = [(int(lay.offsets[s]), int(lay.offsets[e])) for s, e in spans]
    k = 0
    for t, (start, end) in enumerate(zip(lay.starts.tolist(), lay.ends.tolist(), strict=True)):
        while k < len(byte_spans) and start >= byte_spans[k][1]:
            k += 1
        if k == len(byte_spans):
            break
        if end > byte_spans[k][0]:
            mask[t] = 1
    return mask


# -- the entry point ----------------------------------------------------------------------------------------------


def assistant_mask(
    model: Pipeline, request: Any, opts: MaskOptions | None = None, **render_options: Any
) -> tuple[Layout, Mask]:
    """Render, encode and lay one request (`accounting.layout`), and its mask. A row with no trained token is a
    `MaskError`. Refused: `continue_final_message` (a cut turn has no end), images (`Model.refuse_images`)."""
    if render_options.get("continue_final_message"):
        raise MaskError(
            "assistant masks are not computed with continue_final_message",
            path="continue_final_message",
            hint="render whole turns for training; the final message's end-of-turn is then trained too",
        )
    lay = layout(model, request, **render_options)
    model.refuse_images(lay.request)
    return lay, mask_of(model, lay, opts or MaskOptions(), **render_options)


def mask_of(model: Pipeline, lay: Layout, opts: MaskOptions, **render_options: Any) -> Mask:
    """The mask of a request already rendered, encoded and laid (`accounting.layout`, or any lay equal to it) with
    these render options: what `assistant_mask` gives with that lay."""
    source, regions, mask, notes = _mask_parts(model, lay, opts, render_options)
    return _mask_end(lay, opts, source, regions, _provenance_mask(lay, regions) if mask is None else mask, notes)


def masks_of(
    model: Pipeline, lays: list[Layout], opts: MaskOptions, **render_options: Any
) -> list[Mask | CtxlockError]:
    """`mask_of` of each lay, its `CtxlockError` given in its place, with the provenance masks of the lays laid end
    to end (`bounds`) made at once (`_fastmask.region_masks`: each one `region_mask`'s, which `mask_of` takes)."""
    parts = [_attempt(_mask_parts, model, lay, opts, render_options) for lay in lays]
    fast = fast_enabled()
    todo = [k for k, p in enumerate(parts) if fast and not isinstance(p, CtxlockError) and p[2] is None]
    todo = [k for k in todo if lays[k].bounds is not None]
    byte_regions = [[(int(lays[k].offsets[s]), int(lays[k].offsets[e])) for s, e in parts[k][1]] for k in todo]
    made = dict(zip(todo, region_masks([lays[k].bounds for k in todo], byte_regions), strict=True))
    out: list[Mask | CtxlockError] = []
    for k, (p, lay) in enumerate(zip(parts, lays, strict=True)):
        if isinstance(p, CtxlockError):
            out.append(p)
            continue
        source, regions, mask, notes = p
        mask = (made[k] if k in made else _provenance_mask(lay, regions)) if mask is None else mask
        out.append(_attempt(_mask_end, lay, opts, source, regions, mask, notes))
    return out


def _attempt(fn: Any, *args: Any) -> Any:
    """`fn(*args)`, or the `CtxlockError` it raises."""
    try:
        return fn(*args)
    except CtxlockError as exc:
        return exc


def _mask_parts(
    model: Pipeline, lay: Layout, opts: MaskOptions, render_options: Mapping[str, Any]
) -> tuple[str, tuple[tuple[int, int], ...], np.ndarray | None, list[str]]:
    """`mask_of` up to the mask: its source, regions, the mask itself when it is the generation blocks' (None: the
    provenance mask of the regions is still to make) and the notes so far."""
    rendered = lay.rendered
    notes: list[str] = []
    use_generation = opts.source == "generation" or (
        opts.source == "auto" and bool(_has_generation_tag(rendered)) and opts.default_choice
    )
    if use_generation:
        if not opts.default_choice:
            raise OptionError(
                "roles, train_on_eot and last_turn_only apply to the provenance rule, not to {% generation %} blocks",
                path="source",
                hint="use source='provenance' (or 'auto') with these options",
            )
        regions = rendered.generation_spans
        mask = _generation_mask(lay, regions)
        source = "generation"
    else:
        marks = turn_marks(model, rendered, _render_only(render_options), _tools(lay.request))
        regions = _char_regions(provenance_regions(rendered, lay.request, opts, marks))
        mask = None
        source = "provenance"
        if not marks.eot and opts.train_on_eot != "none":
            notes.append(
                "the template writes no end-of-turn text after an assistant's content (or refused the probe "
                "conversation): no end-of-turn token is trained"
            )
    return source, regions, mask, notes


def _mask_end(lay: Layout, opts: MaskOptions, source: str, regions: Any, mask: np.ndarray, notes: list[str]) -> Mask:
    """`mask_of` from the mask on: read-only, never all 0 (a `MaskError`), the lay's note."""
    mask.flags.writeable = False
    if not np.count_nonzero(mask):  # not `mask.any()`, which goes through Python
        raise MaskError(_zero_reason(lay.request, opts, source, lay.rendered), path=f"{source} mask", hint=_ZERO_HINT)
    if not lay.exact:
        notes.append("token bytes were spread over the text, not laid exactly: a token at a turn's edge may differ")
    return Mask(mask, source, tuple(regions), lay.exact, tuple(notes))


# -- the cross-check ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Check:
    """The two methods on one conversation: `status` is "agree", "disagree", "not-prefix-stable" (the conversation
    cut before a trained message, with the generation prompt, or after it, is not a prefix of the full render),
    "rewrites-turns" (changing one message's strings changes the text around them), "no-turns" (nothing to
    compare) or "error" (the template refused it); `path` names the message and `detail` says where."""

    status: str
    path: str = ""
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"status": self.status, "path": self.path, "detail": self.detail}


def cross_check(model: Pipeline, request: Any, **render_options: Any) -> Check:
    """Find every assistant turn of `request` twice, by provenance and by sentinel re-renders (module docstring),
    and compare the trained characters. Takes `render`'s options; default mask options."""
    options = {**render_options, "add_generation_prompt": False}
    try:
        req = model.parse(request)
        data = json.loads(req.to_json())
        rendered = model.render(data, **options)
    except CtxlockError as exc:
        return Check("error", exc.path or "", exc.message)
    req = model.parse(data)
    marks = turn_marks(model, rendered, options, data.get("tools"))
    ours = provenance_regions(rendered, req, MaskOptions(), marks)
    indices = [i for i, m in enumerate(req.messages) if m.role == "assistant"]
    if not indices:
        return Check("no-turns")
    theirs: list[tuple[int, int, int]] = []
    for i in indices:
        found = _sentinel_turn(model, data, i, rendered.text, marks, options)
        if isinstance(found, Check):
            return found
        if found is not None:
            theirs.append(found)
    a, b = _char_regions(ours), _char_regions(theirs)
    if a == b:
        return Check("agree")
    where = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return Check(
        "disagree", f"turn {where}", f"provenance {list(a[where : where + 1])}, sentinel {list(b[where : where + 1])}"
    )


def _sentinel_turn(
    model: Pipeline, data: dict[str, Any], i: int, text: str, marks: TurnMarks, options: dict[str, Any]
) -> tuple[int, int, int] | Check | None:
    """Message i's turn in `text`, found by re-renders: (body start, body end, end-of-turn end), a Check saying why
    it cannot be found so, or None for a message the template does not write at all."""
    path = f"messages[{i}]"
    messages = data["messages"]
    marked_messages = [*messages[:i], _sentinels(messages[i], i), *messages[i + 1 :]]
    try:
        prompt = model.render({**data, "messages": messages[:i]}, **{**options, "add_generation_prompt": True}).text
        bare = model.render({**data, "messages": messages[:i]}, **options).text
        cut = model.render({**data, "messages": messages[: i + 1]}, **options).text
        marked = model.render({**data, "messages": marked_messages}, **options).text
    except CtxlockError as exc:
        return Check("error", path, f"a re-render failed: {exc.message}")
    tag = _SENTINEL.format(i)
    first, last = marked.find(tag), marked.rfind(tag)
    eos = model.special_tokens.get("eos_token") or ""
    if eos and bare.endswith(eos) and not text.startswith(bare):  # a template that ends every conversation so
        bare = bare[: -len(eos)]
    if not text.startswith(bare):
        return Check(
            "not-prefix-stable", path, f"the conversation cut before {path} is not a prefix of the full render"
        )
    if not marked.startswith(bare) or (first >= 0 and marked[:first] != text[:first]):
        return Check("rewrites-turns", path, f"changing {path}'s strings changed the text before them")
    if text.startswith(prompt):  # the generation prompt is this turn's header
        start = len(prompt)
    elif first >= 0:
        start = body_start(text, len(bare), first, marks)
    else:
        return Check("not-prefix-stable", path, f"the generation prompt is not {path}'s header, and it writes nothing")
    if last < 0:  # the template wrote none of the message's strings: its turn is the header and its end of turn
        if marked != text:
            return Check("rewrites-turns", path, "the template wrote none of the sentinels, yet the text changed")
        end = start
    else:
        tail = marked[last + len(tag) :]
        if not text.endswith(tail):
            return Check("rewrites-turns", path, f"changing {path}'s strings changed the text after them")
        end = len(text) - len(tail)
    shared = _shared(text, cut)  # a conversation cut after the message may end otherwise (an EOS)
    if shared < end:
        return Check("not-prefix-stable", path, f"the conversation cut after {path} renders its turn differently")
    eot = text.find(marks.eot, end, shared) if marks.eot else -1
    if last < 0 and eot < 0:
        return None
    return (start, end, eot + len(marks.eot) if eot >= 0 else end)


def _sentinels(message: dict[str, Any], i: int) -> dict[str, Any]:
    """The message with every string it carries replaced by one sentinel (the name and the string values of its
    calls' arguments too)."""
    tag = _SENTINEL.format(i)
    out = dict(message)
    for key in ("content", "reasoning_content"):
        if isinstance(out.get(key), str) and (out[key] or key == "content"):
            out[key] = tag
        elif isinstance(out.get(key), list):
            out[key] = [{**p, "text": tag} if p.get("type") == "text" and p.get("text") else p for p in out[key]]
    calls = []
    for call in out.get("tool_calls") or ():
        fn = dict(call.get("function", {}))
        args = fn.get("arguments")
        fn["name"] = tag
        if isinstance(args, dict):  # each string value in its place: the markup around them stays the template's
            fn["arguments"] = {k: tag if isinstance(v, str) else v for k, v in args.items()}
        calls.append({**call, "function": fn})
    if calls:
        out["tool_calls"] = calls
    return out


# What `template_report` (and `ctxlock inspect`) checks each template on: plain turns, a tool call, reasoning.
_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}
REPORT_CONVERSATIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "turns",
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"},
                {"role": "assistant", "content": "Goodbye."},
            ]
        },
    ),
    (
        "tool call",
        {
            "tools": [_TOOL],
            "messages": [
                {"role": "user", "content": "What time is it?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
                {"role": "assistant", "content": "It is noon."},
            ],
        },
    ),
    (
        "reasoning",
        {
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "reasoning_content": "Add them.", "content": "4"},
                {"role": "user", "content": "3+3?"},
                {"role": "assistant", "reasoning_content": "Add again.", "content": "6"},
            ]
        },
    ),
)


@dataclass(frozen=True, slots=True)
class TemplateReport:
    """A template's masks, checked: `source` is "generation" (it has `{% generation %}` blocks: transformers' rule)
    or "provenance"; `checks` the cross-check on each of `REPORT_CONVERSATIONS` (name, Check); `agree` when no
    check disagrees or cannot be made (a conversation the template refuses, or without turns, does not count)."""

    template_id: str
    template_sha256: str
    source: str
    checks: tuple[tuple[str, Check], ...]

    @property
    def agree(self) -> bool:
        return all(c.status in ("agree", "error", "no-turns") for _, c in self.checks)

    @property
    def reported(self) -> tuple[tuple[str, Check], ...]:
        return tuple((n, c) for n, c in self.checks if c.status not in ("agree", "error", "no-turns"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "template": self.template_id,
            "sha256": self.template_sha256,
            "source": self.source,
            "agree": self.agree,
            "checks": [{"conversation": n, **c.to_dict()} for n, c in self.checks],
        }


_REPORTS: LRU[str, TemplateReport] = LRU("masks.template_reports", max_items=64, scope="artifact")


def template_report(model: Pipeline, template: Any, **render_options: Any) -> TemplateReport:
    """`cross_check` on `REPORT_CONVERSATIONS` with this template, cached per template digest and model."""
    key = json.dumps([template.sha256, model.id, render_options], sort_keys=True, default=repr)
    hit = _REPORTS.get(key)
    if hit is None:
        checks = tuple(
            (name, cross_check(model, data, chat_template=template, **render_options))
            for name, data in REPORT_CONVERSATIONS
        )
        source = "generation" if _GENERATION_TAG.search(template.source) else "provenance"
        hit = TemplateReport(template.id, template.sha256, source, checks)
        _REPORTS.put(key, hit)
    return hit


_ZERO_HINT = "a row with nothing to train on is an error row, never a zero mask: drop it or fix the conversation"


def _has_generation_tag(rendered: Rendered) -> bool:
    return "generation" in rendered.template.source and bool(_GENERATION_TAG.search(rendered.template.source))


def _tools(request: Request) -> Any:
    return json.loads(request.to_json()).get("tools") if request.tools else None


def _render_only(options: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k not in ("dialect", "utf8", "tool_arguments")}


def _zero_reason(request: Request, opts: MaskOptions, source: str, rendered: Rendered) -> str:
    if source == "generation":
        return "the template's {% generation %} blocks cover no token of this conversation"
    if not any(m.role in opts.roles for m in request.messages):
        return f"no message has a trained role ({', '.join(opts.roles)}): nothing to train on"
    return f"the {', '.join(opts.roles)} messages wrote no character into the rendered text: nothing to train on"


__all__ = [
    "EOT_CHOICES",
    "REPORT_CONVERSATIONS",
    "SOURCES",
    "Check",
    "Mask",
    "MaskOptions",
    "TemplateReport",
    "TurnMarks",
    "assistant_mask",
    "cross_check",
    "mask_of",
    "masks_of",
    "provenance_regions",
    "template_report",
    "turn_marks",
]
