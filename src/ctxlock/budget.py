"""Budget stage: fit a request into a context window by the seed's algorithm (000 §1.7), and clamp the output.

    keep all required segments atomically; render and tokenize them; reject if over budget
    for each optional segment in priority order:
        add it tentatively; render and tokenize the whole candidate; keep it only if it fits
    assert: the current user message is present; every tool result keeps its call;
            exactly one assistant generation prefix

Required: system/developer messages, the tool schemas, the current turn (the last user message and everything
after it), the generation prefix. Optional: earlier history, one unit per user turn (a user message and every
assistant and tool message it triggers, so a call and its results are kept or dropped together), and retrieved
documents. Every decision is recorded: segment, kept or dropped, its tokens, the reason, the running total. The
required segments' tokens are measured by adding them one at a time in request order (the first one carries the
template's fixed text), so the required rows add up to the required candidate's count.

History is kept as a contiguous most-recent suffix by default (`BudgetPolicy.history="suffix"`, as mistral-common's
truncation drops whole user turns from the oldest): turns are tried newest first, and the first one that does not
fit closes the history, so every older turn is dropped too and the model never sees a gap. `history="greedy"` is the
seed's literal loop: every turn is tried, and a small old turn can be kept after a newer one was dropped. Documents
are always tried greedily. The generation prefix is checked, not assumed: the fitted input ends with exactly one
assistant generation prefix (the template's, or the open final assistant message with `continue_final_message`),
unless the policy says `generation_prefix="none"`.

`fit_context` gives the same decisions and ids as the naive algorithm (re-render and re-tokenize the whole
candidate each time), faster, and without approximation: each candidate is still rendered (the template is a
black box), and its tokens are counted only where its text differs from the last
kept candidate. HF tokenizers extract added tokens before they normalize, so the runs between the template's
control tokens are independent; runs are cached, and the shared prefix and suffix are not looked at at all
(`_RunCache.count` has the argument). The fitted request then goes through the full pipeline once, and its count
must match. `tests/test_budget.py` keeps the naive version as the oracle.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from .errors import BudgetError, BudgetExceeded, TemplateError
from .frozen import canonical_json
from .request import Message, Request, parse_request
from .settings import reference_path
from .template import Rendered
from .tensors import ModelInput, assemble
from .tokenizer import Tokenizer

SegmentKind = Literal["system", "tools", "current", "history", "document"]
HistoryMode = Literal["suffix", "greedy"]
GenerationPrefix = Literal["required", "none"]
GENERATION = "generation prefix"  # the decision row of the generation prefix (kind "generation")

# What `tokenizers` strips next to an lstrip/rstrip added token: Rust's `char::is_whitespace` (Unicode White_Space).
# Python's `str.isspace` also takes U+001C..U+001F, which the tokenizer keeps as text.
_STRIPPED_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


@dataclass(frozen=True)
class BudgetPolicy:
    """How to fit: the token budget and the order in which optional segments are tried.

    `history`: "suffix" (default) keeps a contiguous most-recent run of history turns; "greedy" tries every turn
    newest first and keeps each one that fits (the seed's loop; it can leave gaps). Either way a history turn holding
    the call of a result in the current turn is required, kept with it. `generation_prefix`: "required"
    (default) checks that the fitted input ends with exactly one assistant generation prefix; "none" is the caller's
    explicit opt-out for an input that is not a generation request (scoring, training), rendered with
    add_generation_prompt=False. `order` lists optional segment ids to try first, in that order: any segment with
    history="greedy", documents only with "suffix" (a suffix is always tried newest first)."""

    max_input_tokens: int | None = None
    context_window: int | None = None
    reserve_output_tokens: int = 0
    optional_priority: tuple[str, ...] = ("history", "documents")  # which kind is tried first
    order: tuple[str, ...] | None = None  # a user-supplied order of optional segment ids (overrides the above)
    history: HistoryMode = "suffix"
    generation_prefix: GenerationPrefix = "required"

    def __post_init__(self) -> None:
        self._check_types()
        if (self.max_input_tokens is None) == (self.context_window is None):
            raise BudgetError(
                "give exactly one of max_input_tokens or context_window (with reserve_output_tokens)",
                path="policy",
                hint="seed 000 §1.7: n_input + g <= N",
            )
        if self.reserve_output_tokens < 0 or (self.context_window is not None and self.context_window <= 0):
            raise BudgetError("token counts must be positive", path="policy")
        if set(self.optional_priority) - {"history", "documents"}:
            raise BudgetError("optional_priority lists 'history' and 'documents'", path="policy.optional_priority")
        if self.history not in get_args(HistoryMode):
            raise BudgetError(
                f"unknown history mode {self.history!r}",
                path="policy.history",
                hint="use 'suffix' (a contiguous most-recent history, the default) or 'greedy' (the seed's loop)",
            )
        if self.generation_prefix not in get_args(GenerationPrefix):
            raise BudgetError(
                f"unknown generation_prefix {self.generation_prefix!r}",
                path="policy.generation_prefix",
                hint="use 'required' (the default) or 'none' (an input that is not a generation request)",
            )
        if self.history == "suffix" and self.order is not None:
            named = [x for x in self.order if not x.startswith("documents[")]
            if named:
                raise BudgetError(
                    f"policy.order names history segments {named}, but history='suffix' keeps a contiguous "
                    "most-recent history, tried newest first",
                    path="policy.order",
                    hint='set "history": "greedy" (--history greedy) to try history in your own order',
                )

    def _check_types(self) -> None:
        """Each field of the JSON type it must have (a policy file is user input), as a BudgetError naming it."""
        counts = {"max_input_tokens": True, "context_window": True, "reserve_output_tokens": False}
        for name, optional in counts.items():
            value = getattr(self, name)
            if (value is None and optional) or (isinstance(value, int) and not isinstance(value, bool)):
                continue
            raise BudgetError(
                f"{name} must be an integer, got {_json_type(value)} {value!r:.40}",
                path=f"policy.{name}",
                hint="a token count, such as 4096",
            )
        for name, optional in (("optional_priority", False), ("order", True)):
            value = getattr(self, name)
            if value is None and optional:
                continue
            if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
                raise BudgetError(
                    f"{name} must be an array of strings, got {_json_type(value)} {value!r:.40}",
                    path=f"policy.{name}",
                    hint='["history", "documents"]'
                    if name == "optional_priority"
                    else 'segment ids, such as ["documents[0]"]',
                )
        for name in ("history", "generation_prefix"):
            if not isinstance(getattr(self, name), str):
                raise BudgetError(
                    f"{name} must be a string, got {_json_type(getattr(self, name))}", path=f"policy.{name}"
                )

    @property
    def budget(self) -> int:
        if self.max_input_tokens is not None:
            return self.max_input_tokens
        assert self.context_window is not None
        return self.context_window - self.reserve_output_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_input_tokens": self.max_input_tokens,
            "context_window": self.context_window,
            "reserve_output_tokens": self.reserve_output_tokens,
            "optional_priority": list(self.optional_priority),
            "order": list(self.order) if self.order is not None else None,
            "history": self.history,
            "generation_prefix": self.generation_prefix,
            "tool_pairs_atomic": True,
        }

    @property
    def sha256(self) -> str:
        return hashlib.sha256(canonical_json(self.to_dict()).encode()).hexdigest()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BudgetPolicy:
        known = {f.name for f in dataclasses.fields(cls)}
        extra = set(d) - known - {"tool_pairs_atomic"}
        if extra:
            raise BudgetError(f"unknown policy field(s) {sorted(extra)}", path="policy")
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known}
        return cls(**kw)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    return "an object" if isinstance(value, Mapping) else type(value).__name__


@dataclass(frozen=True)
class Segment:
    id: str  # "system", "tools", "current", "history[3:5]" (message indexes), "documents[2]"
    kind: SegmentKind
    required: bool
    messages: tuple[int, ...] = ()
    document: int | None = None


@dataclass(frozen=True)
class Decision:
    segment: str
    kind: str
    kept: bool
    # What the segment adds (or would have added) to the candidate; None where it was not measured: a history turn
    # older than a dropped one under history="suffix" (never tried), or a required segment the template renders only
    # with a later one (its tokens are in that one's row).
    tokens: int | None
    reason: str
    total: int  # the candidate's token count after this decision

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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


def segments(request: Request) -> list[Segment]:
    """Split a request into the seed's segments, in the order they appear."""
    msgs = request.messages
    last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=None)
    if last_user is None:
        raise BudgetError(
            "the request has no user message to keep", path="messages", hint="fit_context needs a current user turn"
        )
    out: list[Segment] = []
    system = tuple(i for i, m in enumerate(msgs) if m.role in ("system", "developer"))
    if system:
        out.append(Segment("system", "system", True, system))
    if request.tools:
        out.append(Segment("tools", "tools", True))
    history = [k for k in range(last_user) if msgs[k].role not in ("system", "developer")]
    # One unit per user turn: a user message and every assistant and tool message it triggers. A call and its
    # results therefore stay together, and a kept history never starts in the middle of a turn.
    units: list[list[int]] = []
    for k in history:
        m = msgs[k]
        if m.role == "tool":
            owner = next((u for u in reversed(units) if m.tool_call_id in _calls_of(msgs, u)), None)
            if owner is not None and owner is not (units[-1] if units else None):
                owner.append(k)  # a result filed after a later user message still goes with its call
                continue
        if m.role == "user" or not units:
            units.append([k])
        else:
            units[-1].append(k)
    for unit in units:
        out.append(Segment(f"history[{min(unit)}:{max(unit) + 1}]", "history", False, tuple(sorted(unit))))
    current = tuple(k for k in range(last_user, len(msgs)) if msgs[k].role not in ("system", "developer"))
    out.append(Segment("current", "current", True, current))
    # A history unit holding the call of a result in the current turn is required with it.
    needed = {msgs[k].tool_call_id for k in current if msgs[k].role == "tool"}
    out = [
        dataclasses.replace(s, required=True) if s.kind == "history" and _calls(msgs, s) & needed else s for s in out
    ]
    for d in range(len(request.documents or ())):
        out.append(Segment(f"documents[{d}]", "document", False, document=d))
    return out


def _answers(m: Message, call_ids: set[str]) -> bool:
    return m.role == "tool" and m.tool_call_id in call_ids


def _calls_of(msgs: Sequence[Message], indexes: Sequence[int]) -> set[str | None]:
    return {c.id for k in indexes for c in (msgs[k].tool_calls or ())}


def _calls(msgs: Sequence[Message], seg: Segment) -> set[str | None]:
    return {c.id for k in seg.messages for c in (msgs[k].tool_calls or ())}


def priority_order(segs: Sequence[Segment], request: Request, policy: BudgetPolicy) -> list[Segment]:
    optional = [s for s in segs if not s.required]
    if policy.order is not None:
        by_id = {s.id: s for s in optional}
        unknown = [x for x in policy.order if x not in by_id]
        if unknown:
            raise BudgetError(
                f"policy.order names unknown segments {unknown}", path="policy.order", hint=f"segments: {sorted(by_id)}"
            )
        rest = [s for s in optional if s.id not in set(policy.order)]
        return [by_id[x] for x in policy.order] + rest
    history = sorted((s for s in optional if s.kind == "history"), key=lambda s: -s.messages[0])  # newest first
    docs = [s for s in optional if s.kind == "document"]
    # Documents by their given priority (a numeric "priority", higher first), else in the order given.
    docs.sort(key=lambda s: -_doc_priority(request, s.document))
    groups = {"history": history, "documents": docs}
    return [s for kind in policy.optional_priority for s in groups[kind]]


def _doc_priority(request: Request, index: int | None) -> float:
    doc = (request.documents or ())[index or 0]
    p = doc.get("priority") if hasattr(doc, "get") else None
    return float(p) if isinstance(p, (int, float)) and not isinstance(p, bool) else 0.0


def candidate(request: Request, segs: Sequence[Segment], kept: set[str]) -> Request:
    """The request holding the required segments and the kept optional ones, in the original order."""
    keep_msgs: set[int] = set()
    docs: list[int] = []
    for s in segs:
        if s.required or s.id in kept:
            keep_msgs.update(s.messages)
            if s.document is not None:
                docs.append(s.document)
    messages = tuple(request.messages[i] for i in sorted(keep_msgs))
    documents = tuple(request.documents[d] for d in sorted(docs)) if request.documents else request.documents
    return dataclasses.replace(request, messages=messages, documents=documents or None)


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix; slice comparisons run in C, and each probe only covers the new part."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, limit
    na, nb = len(a), len(b)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[na - mid : na - lo] == b[nb - mid : nb - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class _Base:
    """A rendered text split at the template's control tokens: where each control token starts and ends, and how
    many tokens the text holds up to and including it."""

    text: str
    starts: list[int]
    cum_at_end: dict[int, int]  # control-token end offset -> tokens up to and including that control token
    cum: list[int]  # parallel to starts
    ends: list[int]  # parallel to starts
    total: int


class _RunCache:
    """Count a rendered chat's tokens run by run between the template's control tokens, caching every run.

    Exact for HF tokenizers (added tokens are split out before normalization, so each run is encoded on its own;
    the one position-dependent case, a dummy prefix on the first run, is part of the cache key) and by
    construction for Tekken and the book tokenizer.

    `count` goes further: a candidate differs from the current best text only around the segment it adds, so only
    the control-token-delimited runs that overlap the difference are looked at. The control-token split of a text
    is a left-to-right scan of a literal alternation: a match decision at offset t depends only on text[t:t+L]
    (L = the longest control token), so every split before the first difference minus L is shared with the base;
    after the difference, the scan of the candidate is back in step with the base's as soon as it ends a control
    token inside the common suffix at an offset where the base also ends one. The rest is the base's count."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self.cache: dict[tuple[str, bool], tuple[int, ...]] = {}
        added = sorted((t for t in tokenizer.added_tokens if t.control), key=lambda t: len(t.content), reverse=True)
        self.by_content = {t.content: t for t in added}
        self.regex = re.compile("|".join(re.escape(t.content) for t in added)) if added else None
        # Without lstrip/rstrip tokens a control token is exactly its match, and counting can be incremental.
        self.plain = self.regex is not None and not any(t.lstrip or t.rstrip for t in added)
        self.longest = max((len(t.content) for t in added), default=0)
        self.ids = {t.content: t.id for t in added}
        self.base: _Base | None = None

    def encode(self, rendered: Rendered) -> list[int] | None:
        """The ids, or None when the text holds request-sourced control strings (then the caller runs the stage)."""
        if rendered.untrusted:
            return None
        text = rendered.text
        ids: list[int] = []
        pos = 0
        n = len(text)
        matches = list(self.regex.finditer(text)) if self.regex is not None else []
        for m in matches:
            tok = self.by_content[m.group(0)]
            start, end = m.start(), m.end()
            if tok.lstrip:
                while start > pos and text[start - 1] in _STRIPPED_WHITESPACE:
                    start -= 1
            if tok.rstrip:
                while end < n and text[end] in _STRIPPED_WHITESPACE:
                    end += 1
            if start > pos:
                ids.extend(self._run(text[pos:start], pos == 0))
            ids.append(tok.id)
            pos = end
        if pos < n:
            ids.extend(self._run(text[pos:], pos == 0))
        return ids

    def rebase(self, rendered: Rendered) -> int | None:
        """Make `rendered` the text later candidates are compared with; returns its token count."""
        if rendered.untrusted or not self.plain:
            self.base = None
            return None
        text = rendered.text
        starts: list[int] = []
        ends: list[int] = []
        cum: list[int] = []
        count = 0
        pos = 0
        assert self.regex is not None
        for m in self.regex.finditer(text):
            if m.start() > pos:
                count += len(self._run(text[pos : m.start()], pos == 0))
            count += 1
            starts.append(m.start())
            ends.append(m.end())
            cum.append(count)
            pos = m.end()
        if pos < len(text):
            count += len(self._run(text[pos:], pos == 0))
        self.base = _Base(text, starts, dict(zip(ends, cum, strict=True)), cum, ends, count)
        return count

    def count(self, rendered: Rendered) -> int | None:
        """The candidate's token count, exactly `len(encode(rendered))`, looking only at what differs from the
        base; None when there is no base or the text holds request-sourced control strings."""
        base = self.base
        if base is None or rendered.untrusted:
            return None
        text = rendered.text
        old = base.text
        p = _common_prefix(old, text)
        q = _common_suffix(old, text, min(len(old), len(text)) - p)
        # The last base control token whose scan decision cannot see the difference; everything before it is shared.
        k = bisect.bisect_right(base.starts, p - self.longest) - 1
        pos = base.ends[k] if k >= 0 else 0
        count = base.cum[k] if k >= 0 else 0
        shift = len(text) - len(old)
        tail = len(text) - q
        assert self.regex is not None
        for m in self.regex.finditer(text, pos):
            if m.start() > pos:
                count += len(self._run(text[pos : m.start()], pos == 0))
            count += 1
            pos = m.end()
            if pos >= tail:
                synced = base.cum_at_end.get(pos - shift)
                if synced is not None:
                    return count + base.total - synced
        if pos < len(text):
            count += len(self._run(text[pos:], pos == 0))
        return count

    def _run(self, run: str, at_start: bool) -> tuple[int, ...]:
        key = (run, at_start)
        hit = self.cache.get(key)
        if hit is None:
            hit = tuple(self.tok.encode_text(run, at_start=at_start))
            self.cache[key] = hit
        return hit


class _Counter:
    """Token counts of candidate requests: the full pipeline (naive), or a render and
    an incremental count against the last kept candidate (fast). Both give the same numbers."""

    def __init__(self, model: Any, request: Request, render_options: Mapping[str, Any], *, fast: bool) -> None:
        self.model = model
        self.options = dict(render_options)
        self.cache = _RunCache(model.tokenizer) if fast else None
        self.base_rendered: Rendered | None = None

    def _render(self, req: Request) -> Rendered:
        return self.model.render(req, **self.options)

    def _full(self, rendered: Rendered) -> int:
        assert self.cache is not None
        ids = self.cache.encode(rendered)
        return len(ids) if ids is not None else len(self.model.tokenize(rendered).ids)

    def _naive(self, req: Request) -> int:
        # The oracle: the whole pipeline on the reference path (no run cache, no fast engine), every time.
        with reference_path():
            return len(self.model.run(req, **self.options).tokenized.ids)

    def base(self, req: Request) -> int:
        """Count the first candidate (the required segments), and make it the base; its render is kept in
        `base_rendered`."""
        if self.cache is None:
            with reference_path():
                run = self.model.run(req, **self.options)
            self.base_rendered = run.rendered
            return len(run.tokenized.ids)
        rendered = self.base_rendered = self._render(req)
        n = self.cache.rebase(rendered)
        return n if n is not None else self._full(rendered)

    def trial(self, req: Request) -> tuple[int, Rendered | None]:
        if self.cache is None:
            return self._naive(req), None
        rendered = self._render(req)
        n = self.cache.count(rendered)
        return (n if n is not None else self._full(rendered)), rendered

    def keep(self, rendered: Rendered | None) -> None:
        if self.cache is not None and rendered is not None:
            self.cache.rebase(rendered)

    def measure(self, req: Request, **overrides: Any) -> tuple[int, Rendered]:
        """The full count of `req` rendered with `overrides` over the options; the base is left as is."""
        options = {**self.options, **overrides}
        if self.cache is None:
            with reference_path():
                run = self.model.run(req, **options)
            return len(run.tokenized.ids), run.rendered
        rendered = self.model.render(req, **options)
        return self._full(rendered), rendered


def fit_context(
    request: Request, model: Any, policy: BudgetPolicy, *, naive: bool = False, **render_options: Any
) -> Fitted:
    """Seed 000 §1.7's fit_context. `naive=True` re-renders and re-tokenizes through the full pipeline each step,
    on the reference path (no run cache, no fast engine): the oracle. The default gives identical decisions and
    ids, faster.

    `render_options` are `Model.render`'s. The fitted input must end with exactly one assistant generation prefix:
    `add_generation_prompt` (the default) or `continue_final_message` on a final assistant message (a prefill);
    `add_generation_prompt=False` alone raises BudgetError unless `policy.generation_prefix == "none"`."""
    budget = policy.budget
    options = _generation_options(request, policy, render_options)
    segs = segments(request)
    counter = _Counter(model, request, options, fast=not naive)
    kept: set[str] = set()

    req = candidate(request, segs, kept)
    total = counter.base(req)
    assert counter.base_rendered is not None
    decisions = _required_decisions(request, segs, counter, policy, options, total, counter.base_rendered)
    if total > budget:
        sizes = {d.segment: d.tokens for d in decisions if d.tokens is not None}
        parts, into = [], ""
        for d in reversed(decisions):  # a segment counted with a later one names it
            parts.append(f"{d.segment} {d.tokens:,}" if d.tokens is not None else f"{d.segment} (with {into})")
            into = d.segment if d.tokens is not None else into
        listing = ", ".join(reversed(parts))
        raise BudgetExceeded(
            f"the required segments alone take {total:,} tokens, over the budget of {budget:,} ({listing})",
            path="policy.max_input_tokens" if policy.max_input_tokens is not None else "policy.context_window",
            hint="raise the budget, or shorten the system prompt, tools or current message; nothing was dropped",
            sizes=sizes,
            total=total,
            budget=budget,
        )
    best = req
    closed: str | None = None  # history="suffix": the newest history turn that was dropped; older ones follow it
    for s in priority_order(segs, request, policy):
        if closed is not None and s.kind == "history":
            reason = f"older than {closed}, dropped: the history stays a contiguous suffix"
            decisions.append(Decision(s.id, s.kind, False, None, reason, total))
            continue
        trial = candidate(request, segs, kept | {s.id})
        try:
            n, t_rendered = counter.trial(trial)
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
            counter.keep(t_rendered)
            decisions.append(Decision(s.id, s.kind, True, added, "fits", total))
        else:
            decisions.append(Decision(s.id, s.kind, False, added, f"would make {n:,} > {budget:,}", total))
            if policy.history == "suffix" and s.kind == "history":
                closed = s.id
    _check_invariants(best, request)
    # The fitted request goes through the full stage once: the render and the tokenizer stage.
    final_rendered = model.render(best, **options)
    final_ids = list(model.tokenize(final_rendered).ids)
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
            "(seed 000 §1.7 asserts exactly one)",
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
    counter: _Counter,
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
        tail = base.text[_common_prefix(closed_text, base.text) :] if closed_text is not None else ""
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


def _check_generation_prefix(fitted: Request, model: Any, options: Mapping[str, Any], rendered: Rendered) -> None:
    """Seed 000 §1.7's third assertion on the fitted input: the template's generation prompt appends text (the one
    prefix) to the same conversation rendered without it. A prefill, a template with no generation prompt and the
    opt-out were settled on the required candidate."""
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


def clamp_max_tokens(
    context_window: int,
    input_tokens: int,
    requested: int | None,
    *,
    margin_tokens: int = 0,
    margin_fraction: float = 0.0,
    min_output_tokens: int = 1,
) -> int:
    """The effective output cap: min(requested, window - input - margin), margin = max(floor, fraction * input).

    Raises BudgetExceeded when the room left is below `min_output_tokens`."""
    margin = max(margin_tokens, int(margin_fraction * input_tokens + 0.999999))
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
    "clamp_max_tokens",
    "fit_context",
    "fitted_request_json",
    "priority_order",
    "segments",
]
