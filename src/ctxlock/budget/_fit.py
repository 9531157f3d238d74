"""Budget stage: fit a request into a context window by the algorithm of docs/budgets.md, and clamp the output.

    keep all required segments atomically; render and tokenize them; reject if over budget
    for each optional segment in priority order:
        add it tentatively; render and tokenize the whole candidate; keep it only if it fits
    assert: the current user message is present; every tool result keeps its call;
            exactly one assistant generation prefix

Required: system/developer messages, the tool schemas, the current turn (the last user message and everything
after it), the generation prefix. Optional: earlier history, one unit per user turn (a user message and every
assistant and tool message it triggers, so a call and its results are kept or dropped together), and retrieved
documents (`budget_policy` splits a request into these segments and orders them). Every decision is recorded:
segment, kept or dropped, its tokens, the reason, the running total. The required segments' tokens are measured by
adding them one at a time in request order (the first one carries the template's fixed text), so the required rows
add up to the required candidate's count.

History is kept as a contiguous most-recent suffix by default (`BudgetPolicy.history="suffix"`, as mistral-common's
truncation drops whole user turns from the oldest): turns are tried newest first, and the first one that does not
fit closes the history, so every older turn is dropped too and the model never sees a gap. `history="greedy"` is the
documented literal loop: every turn is tried, and a small old turn can be kept after a newer one was dropped. Documents
are always tried greedily. The generation prefix is checked, not assumed: the fitted input ends with exactly one
assistant generation prefix (the template's, or the open final assistant message with `continue_final_message`),
unless the policy says `generation_prefix="none"`.

Each candidate is rendered (the template is a black box) and its tokens are counted by the counting service
(`_counting.TokenCounter`): exactly the tokenizer stage's count, which on the fast path looks only where the text
differs from the last kept candidate, and on the reference path (`CTXLOCK_FAST=0`) is the tokenizer stage itself.
`fit_context(naive=True)` runs the whole fit on the reference path: the oracle, with the same decisions and ids. The
fitted request then goes through the full pipeline once, and its count must match.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ctxlock.budget._counting import TokenCounter, common_prefix
from ctxlock.budget._policy import BudgetPolicy, Decision, Segment, candidate, priority_order, segments
from ctxlock.errors import BudgetError, BudgetExceeded, TemplateError
from ctxlock.multimodal import image_refs, plan_images, plan_videos, processor_special_tokens, video_refs
from ctxlock.pipeline import Pipeline
from ctxlock.request import Request, parse_request
from ctxlock.settings import reference_path
from ctxlock.template import Rendered
from ctxlock.tensors import ModelInput, assemble

GENERATION = "generation prefix"  # the decision row of the generation prefix (kind "generation")


@dataclass(frozen=True)
class Fitted:
    request: Request  # the fitted request: what was kept, in the original order
    rendered: Rendered
    ids: tuple[int, ...]
    model_input: ModelInput
    decisions: tuple[Decision, ...]
    policy: BudgetPolicy
    budget: int
    kept_messages: tuple[int, ...] = ()  # indexes into the original request's messages, in order
    kept_documents: tuple[int, ...] = ()  # indexes into the original request's documents

    @property
    def input_tokens(self) -> int:
        return len(self.ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.to_dict(),
            "policy_sha256": self.policy.sha256,
            "budget": self.budget,
            "input_tokens": self.input_tokens,
            "decisions": [d.to_dict() for d in self.decisions],
        }


class _Candidates:
    """Candidate requests, rendered with the fit's options and counted by the counting service, each against the
    last kept candidate (the base)."""

    def __init__(
        self, model: Pipeline, options: Mapping[str, Any], images: Mapping[str, int] | None = None, family: Any = None
    ) -> None:
        self.model = model
        self.options = dict(options)
        self.tokens = TokenCounter(model.tokenizer)
        self.images = images  # image URL -> its placeholder tokens (from its header), for a model that takes images
        self.family = family

    def _image_tokens(self, req: Request, rendered: Rendered) -> int:
        # Each image kept adds its tokens in place of the one placeholder token the template wrote: an image is
        # kept or dropped whole, with its message. With images, the ids are `run_images`', which adds what the
        # family's HF processor adds around the prompt (LLaVA's <s>).
        if not self.images:
            return 0
        refs = (*image_refs(req), *video_refs(req))  # a video, like an image, is kept or dropped whole
        if not refs:
            return 0
        bos = self.model.special_tokens.get("bos_token")
        added = processor_special_tokens(self.family, self.model.tokenizer, bos, rendered.text)
        return sum(self.images[ref.url] - 1 for ref in refs) + len(added.before) + len(added.after)

    def base(self, req: Request) -> tuple[int, Rendered]:
        """Count the first candidate (the required segments) and make it the base."""
        rendered = self.model.render(req, **self.options)
        return self.tokens.rebase(rendered) + self._image_tokens(req, rendered), rendered

    def measure(self, req: Request, **overrides: Any) -> tuple[int, Rendered]:
        """The count of `req` rendered with `overrides` over the fit's options; the base is left as is."""
        rendered = self.model.render(req, **{**self.options, **overrides})
        return self.tokens.count(rendered) + self._image_tokens(req, rendered), rendered

    def keep(self, rendered: Rendered) -> None:
        self.tokens.rebase(rendered)


def _image_plans(request: Request, family: Any, media: Mapping[str, bytes] | None) -> dict[str, int] | None:
    """{url: tokens} of every image, from its header alone, when the model takes images (None otherwise)."""
    if family is None or not (image_refs(request) or video_refs(request)):
        return None
    found = (*plan_images(request, family, media), *plan_videos(request, family, media))
    return {im.ref.url: im.n_tokens for im in found}


def _final_ids(
    model: Pipeline,
    best: Request,
    rendered: Rendered,
    options: Mapping[str, Any],
    images: Mapping[str, int] | None,
    media: Mapping[str, bytes] | None,
    family: Any,
) -> list[int]:
    """The fitted request's ids: the tokenizer stage's, or, with images kept, the expanded ones."""
    if images and (image_refs(best) or video_refs(best)):
        return list(model.run_images(best, decode=False, media=media, family=family, **options).ids)
    return list(model.tokenize(rendered).ids)


def fit_context(
    request: Request,
    model: Pipeline,
    policy: BudgetPolicy,
    *,
    naive: bool = False,
    media: Mapping[str, bytes] | None = None,
    image_family: Any = None,
    **render_options: Any,
) -> Fitted:
    """fit_context (docs/budgets.md). `naive=True` runs the whole fit on the reference path (every candidate rendered
    and tokenized by the full tokenizer stage, no run cache, no fast engine): the oracle. The default gives
    identical decisions and ids, faster. For a model that takes images, each image counts its tokens (from its header
    alone; `media` gives the bytes of http(s) image URLs; `image_family` overrides the model's) and is kept or dropped
    whole with its message; the fitted ids are the expanded ones (`Model.run_images`).

    `render_options` are `Model.render`'s. The fitted input must end with exactly one assistant generation prefix:
    `add_generation_prompt` (the default) or `continue_final_message` on a final assistant message (a prefill);
    `add_generation_prompt=False` alone raises BudgetError unless `policy.generation_prefix == "none"`."""
    if naive:
        with reference_path():
            return fit_context(request, model, policy, media=media, image_family=image_family, **render_options)
    budget = policy.budget
    options = _generation_options(request, policy, render_options)
    segs = segments(request)
    family = image_family or getattr(model, "image_family", None)
    counter = _Candidates(model, options, _image_plans(request, family, media), family)
    kept: set[str] = set()
    best = candidate(request, segs, kept)
    total, base = counter.base(best)
    decisions = _required_decisions(request, segs, counter, policy, options, total, base)
    if total > budget:
        raise _over_budget(decisions, total, budget, policy)
    closed: str | None = None  # history="suffix": the newest history turn that was dropped; older ones follow it
    for s in priority_order(segs, request, policy):
        if closed is not None and s.kind == "history":
            reason = f"older than {closed}, dropped: the history stays a contiguous suffix"
            decisions.append(Decision(s.id, s.kind, False, None, reason, total))
            continue
        trial = candidate(request, segs, kept | {s.id})
        try:
            n, rendered = counter.measure(trial)
        except TemplateError as exc:
            # The template refuses this candidate (e.g. roles must alternate): it cannot be what the model sees.
            decisions.append(Decision(s.id, s.kind, False, 0, f"the template rejects it: {exc.message}", total))
            if policy.history == "suffix" and s.kind == "history":
                closed = s.id
            continue
        added = n - total
        if n <= budget:
            kept.add(s.id)
            total = n
            best = trial
            counter.keep(rendered)
            decisions.append(Decision(s.id, s.kind, True, added, "fits", total))
        else:
            decisions.append(Decision(s.id, s.kind, False, added, f"would make {n:,} > {budget:,}", total))
            if policy.history == "suffix" and s.kind == "history":
                closed = s.id
    _check_invariants(best, request)
    # The fitted request goes through the full stage once: the render and the tokenizer stage.
    final_rendered = model.render(best, **options)
    final_ids = _final_ids(model, best, final_rendered, options, counter.images, media, family)
    if len(final_ids) != total:
        raise AssertionError(f"fit_context counted {total} tokens but the pipeline gives {len(final_ids)}")
    _check_generation_prefix(best, model, options, final_rendered)
    messages, documents = _kept_indexes(segs, kept)
    return Fitted(
        request=best,
        rendered=final_rendered,
        ids=tuple(final_ids),
        model_input=assemble(final_ids),
        decisions=tuple(decisions),
        policy=policy,
        budget=budget,
        kept_messages=messages,
        kept_documents=documents,
    )


def _over_budget(decisions: Sequence[Decision], total: int, budget: int, policy: BudgetPolicy) -> BudgetExceeded:
    """The error for required segments alone over the budget, listing each one's tokens."""
    sizes = {d.segment: d.tokens for d in decisions if d.tokens is not None}
    parts, into = [], ""
    for d in reversed(decisions):  # a segment counted with a later one names it
        parts.append(f"{d.segment} {d.tokens:,}" if d.tokens is not None else f"{d.segment} (with {into})")
        into = d.segment if d.tokens is not None else into
    listing = ", ".join(reversed(parts))
    return BudgetExceeded(
        f"the required segments alone take {total:,} tokens, over the budget of {budget:,} ({listing})",
        path="policy.max_input_tokens" if policy.max_input_tokens is not None else "policy.context_window",
        hint="raise the budget, or shorten the system prompt, tools or current message; nothing was dropped",
        sizes=sizes,
        total=total,
        budget=budget,
    )


_NO_PREFIX_HINT = (
    "fit_context fits a generation request: pass add_generation_prompt=True (the default), or "
    "continue_final_message=True (fit --continue-final-message) to continue a final assistant message (a prefill); "
    "for an input that is not a generation request (scoring, training) opt out with "
    "BudgetPolicy(generation_prefix='none') (fit --no-generation-prompt)"
)


def _generation_options(request: Request, policy: BudgetPolicy, render_options: Mapping[str, Any]) -> dict[str, Any]:
    """The render options with `add_generation_prompt` made explicit, after checking that they give the fitted input
    exactly one assistant generation prefix (or, with policy generation_prefix="none", none)."""
    options = dict(render_options)
    cfm = bool(options.get("continue_final_message"))
    agp = options.get("add_generation_prompt")
    if agp is None:
        agp = not cfm and policy.generation_prefix != "none"
    options["add_generation_prompt"] = bool(agp)
    if policy.generation_prefix == "none":
        if agp or cfm:
            which = "continue_final_message=True" if cfm else "add_generation_prompt=True"
            raise BudgetError(
                f"the policy says generation_prefix='none', but {which} opens an assistant turn",
                path="policy.generation_prefix",
                hint="pass add_generation_prompt=False for an input without one (fit --no-generation-prompt alone), or "
                "drop the opt-out",
            )
        return options
    if cfm and not agp:
        last = request.messages[-1]
        if last.role != "assistant":
            raise BudgetError(
                f"continue_final_message continues the final {last.role} message: the input would end without an "
                "assistant generation prefix",
                path=last.source or f"messages[{len(request.messages) - 1}]",
                hint=_NO_PREFIX_HINT,
            )
    elif not agp:
        raise BudgetError(
            "add_generation_prompt=False: the fitted input would end without an assistant generation prefix "
            "(the fit asserts exactly one)",
            path="add_generation_prompt",
            hint=_NO_PREFIX_HINT,
        )
    return options


def _subset(request: Request, segs: Sequence[Segment], ids: set[str]) -> Request:
    """The request holding only the segments in `ids` (no documents)."""
    keep = sorted(k for s in segs if s.id in ids for k in s.messages)
    return dataclasses.replace(
        request,
        messages=tuple(request.messages[k] for k in keep),
        tools=request.tools if "tools" in ids else None,
        documents=None,
    )


def _required_decisions(
    request: Request,
    segs: Sequence[Segment],
    counter: _Candidates,
    policy: BudgetPolicy,
    options: Mapping[str, Any],
    total: int,
    base: Rendered,
) -> list[Decision]:
    """One row per required segment with the tokens it adds: the segments are added one at a time in request
    order, rendered without a generation prefix (the first row carries the template's own text), then the
    generation prefix row; the rows add up to `total`, the required candidate's count. A segment the template
    refuses to render without the next one, or renders only with it, is counted with the next (tokens None).
    The generation prefix is checked here, on the required candidate (`base`), and again on the fitted one."""
    required = [s for s in segs if s.required]
    cfm = bool(options.get("continue_final_message"))
    rows: list[Decision] = []
    running = 0
    pending: list[Segment] = []
    included: set[str] = set()
    closed_text: str | None = None  # the required candidate without a generation prefix
    for k, s in enumerate(required):
        included.add(s.id)
        pending.append(s)
        last = k == len(required) - 1  # the current turn: the final message, the one a prefill continues
        try:
            n, rendered = counter.measure(
                _subset(request, segs, included), add_generation_prompt=False, continue_final_message=cfm and last
            )
        except TemplateError:
            continue
        if last:
            closed_text = rendered.text
        elif not _shows(rendered, s, request):
            continue  # the template places it with a later segment (Mistral's system prompt goes in the last turn)
        for p in pending[:-1]:
            rows.append(_folded(p, s.id, rendered, request, running, n))
        first = not rows
        rows.append(Decision(s.id, s.kind, True, n - running, "required" + (" (+ the template's own text)" * first), n))
        running = n
        pending = []
    for p in pending:
        rows.append(_folded(p, GENERATION, base, request, running, total))
    kept = True
    if policy.generation_prefix == "none":
        kept, reason = False, "none: the policy opts out (generation_prefix 'none')"
    elif cfm:
        reason = "required: the final assistant message, left open (a prefill)"
    elif base.template.features.generation_prompt:
        if closed_text == base.text:
            raise _no_prefix_added()
        tail = base.text[common_prefix(closed_text, base.text) :] if closed_text is not None else ""
        reason = "required: exactly one, at the end" + (f": {tail!r}" if tail else "")
    else:
        final = request.messages[-1]
        if final.role == "assistant":
            raise BudgetError(
                "the template has no generation prompt and the final message is an assistant one: the input would "
                "end with a closed assistant turn, without a generation prefix",
                path=final.source or f"messages[{len(request.messages) - 1}]",
                hint="continue it with continue_final_message=True (fit --continue-final-message), a prefill, or end "
                "with a user or tool message",
            )
        reason = f"required: implicit, the template opens the reply after the final {final.role} turn"
    rows.append(Decision(GENERATION, "generation", kept, total - running, reason, total))
    return rows


def _folded(seg: Segment, into: str, rendered: Rendered, request: Request, before: int, after: int) -> Decision:
    """The row of a required segment whose tokens are in a later row, or that the template does not render."""
    if _shows(rendered, seg, request):
        return Decision(seg.id, seg.kind, True, None, f"required; counted in {into}, rendered with it", after)
    return Decision(seg.id, seg.kind, True, 0, "required; the template does not render it", before)


def _shows(rendered: Rendered, seg: Segment, request: Request) -> bool:
    """Whether the render holds text from the segment (by provenance); True when that cannot be told."""
    prefixes = ["tools"] if seg.kind == "tools" else [request.messages[k].source for k in seg.messages]
    if not rendered.provenance_exact or not all(prefixes):
        return True
    return any(
        sp.path == p or sp.path.startswith((p + ".", p + "[")) for sp in rendered.request_spans for p in prefixes
    )


def _no_prefix_added() -> BudgetError:
    return BudgetError(
        "add_generation_prompt=True, but the template added no assistant generation prefix: the input ends as it "
        "does without one",
        path="add_generation_prompt",
        hint="check how the template reads add_generation_prompt (ctxlock render --no-generation-prompt shows the "
        "difference); to fit an input without one, set BudgetPolicy(generation_prefix='none')",
    )


def _check_generation_prefix(fitted: Request, model: Pipeline, options: Mapping[str, Any], rendered: Rendered) -> None:
    """The fit's third assertion on the fitted input (docs/budgets.md): the template's generation prompt appends text
    (the one prefix) to the same conversation rendered without it. A prefill, a template with no generation prompt and
    the opt-out were settled on the required candidate."""
    if not options.get("add_generation_prompt") or not rendered.template.features.generation_prompt:
        return
    try:
        closed = model.render(fitted, **{**options, "add_generation_prompt": False}).text
    except TemplateError:
        return  # the template renders this conversation only with its generation prompt: it is there
    if closed == rendered.text:
        raise _no_prefix_added()


def _check_invariants(fitted: Request, original: Request) -> None:
    msgs = fitted.messages
    last_user = max(i for i, m in enumerate(original.messages) if m.role == "user")
    if original.messages[last_user] not in msgs:
        raise AssertionError("the current user message must be present")
    calls = {c.id for m in msgs for c in (m.tool_calls or ())}
    results = {m.tool_call_id for m in msgs if m.role == "tool"}
    if not results <= calls:
        raise AssertionError("a tool result lost its call")
    for m in msgs:
        if m.tool_calls:
            own = {c.id for c in m.tool_calls}
            answered = {r.tool_call_id for r in original.messages if r.role == "tool" and r.tool_call_id in own}
            if not answered <= results:
                raise AssertionError("a tool call lost its result")


def _kept_indexes(segs: Sequence[Segment], kept: set[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    messages = sorted(k for s in segs if s.required or s.id in kept for k in s.messages)
    documents = sorted(s.document for s in segs if s.document is not None and s.id in kept)
    return tuple(messages), tuple(documents)


_MESSAGE_SOURCE = re.compile(r"messages\[(\d+)\](?:\.content\[(\d+)\])?")


def fitted_request_json(raw: Mapping[str, Any], original: Request, fitted: Fitted) -> dict[str, Any]:
    """The fitted request in the caller's own shape: `raw` (the JSON object `original` was parsed from, in either
    dialect) without the messages and documents the fit dropped, every other key as sent. An Anthropic user message
    whose tool_result blocks and text went to different turns keeps only the kept blocks. Checked: the result
    parses to `fitted.request`."""
    kept = set(fitted.kept_messages)
    whole: set[int] = set()  # raw messages whose own canonical message is kept
    results: dict[int, set[int]] = {}  # raw message -> kept blocks that became messages of their own
    split: set[int] = set()  # raw messages some of whose blocks became messages of their own
    for k, m in enumerate(original.messages):
        found = _MESSAGE_SOURCE.fullmatch(m.source)
        if found is None:
            if m.source == "system" and original.dialect == "anthropic":
                continue  # Anthropic's top-level system prompt: required, kept as sent
            raise BudgetError(
                f"message {k} has no JSON path into the request as sent",
                path=f"messages[{k}]",
                hint="use Fitted.request (the canonical fitted request) for a request not parsed from JSON",
            )
        i, j = int(found.group(1)), found.group(2)
        if j is not None:
            split.add(i)
            if k in kept:
                results.setdefault(i, set()).add(int(j))
        elif k in kept:
            whole.add(i)
    messages: list[Any] = []
    for i, msg in enumerate(raw.get("messages") or ()):
        if i not in split:
            if i in whole:
                messages.append(msg)
            continue
        blocks = [
            b
            for j, b in enumerate(msg["content"])
            if j in results.get(i, ()) or (i in whole and not _is_own_message(original, i, j))
        ]
        if blocks:
            messages.append({**msg, "content": blocks})
    out = {**raw, "messages": messages}
    if raw.get("documents") is not None:
        docs = [d for k, d in enumerate(raw["documents"]) if k in set(fitted.kept_documents)]
        if docs:
            out["documents"] = docs
        else:
            del out["documents"]
    again = parse_request(out, dialect=original.dialect, tool_arguments=_arguments_mode(original))
    if again != fitted.request:
        raise AssertionError("the fitted request as sent does not parse to the fitted request")
    return out


def _is_own_message(original: Request, i: int, j: int) -> bool:
    return any(m.source == f"messages[{i}].content[{j}]" for m in original.messages)


def _arguments_mode(request: Request) -> str:
    as_sent = any(isinstance(c.arguments, str) for m in request.messages for c in (m.tool_calls or ()))
    return "as-sent" if as_sent else "parsed"


def clamp_margin(input_tokens: int, margin_tokens: int = 0, margin_fraction: float | str = 0.0) -> int:
    """The output-cap margin of Pi (github.com/badlogic/pi-mono): max(C, ⌈input·r⌉), the ceiling taken exactly (r as
    written in decimal, never a binary float's rounding: 0.1 · 1000 is 100, not 101)."""
    return max(margin_tokens, math.ceil(Fraction(str(margin_fraction)) * input_tokens))


def clamp_max_tokens(
    context_window: int,
    input_tokens: int,
    requested: int | None,
    *,
    margin_tokens: int = 0,
    margin_fraction: float | str = 0.0,
    min_output_tokens: int = 1,
) -> int:
    """The effective output cap: min(requested, window - input - margin), margin = max(floor, ⌈fraction·input⌉).

    Raises BudgetExceeded when the room left is below `min_output_tokens`."""
    margin = clamp_margin(input_tokens, margin_tokens, margin_fraction)
    room = context_window - input_tokens - margin
    if room < min_output_tokens:
        raise BudgetExceeded(
            f"only {max(room, 0):,} tokens left for output (window {context_window:,}, input {input_tokens:,}, "
            f"margin {margin:,}); at least {min_output_tokens:,} are needed",
            path="max_tokens",
            hint="fit the input to a smaller budget first (ctxlock fit)",
            sizes={},
            total=input_tokens,
            budget=context_window - margin,
        )
    return room if requested is None else min(requested, room)


__all__ = [
    "BudgetPolicy",
    "Decision",
    "Fitted",
    "Segment",
    "clamp_margin",
    "clamp_max_tokens",
    "fit_context",
    "fitted_request_json",
    "priority_order",
    "segments",
]
