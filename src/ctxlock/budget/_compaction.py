"""Compaction planning: which messages to replace with a summary, following the documented semantics of Pi
(github.com/badlogic/pi-mono): packages/coding-agent/docs/compaction.md.

ctxlock makes no LLM calls: it plans the cut, measures it exactly, and assembles the compacted request once the
caller has a summary.

    should_compact      Pi's trigger: context_tokens > context_window - reserve_tokens
    plan_compaction     Request -> CompactionPlan (the cut, what to summarize, exact token counts)
    apply_compaction    Request + plan + summary text -> the compacted Request
    compaction_event    the `compaction_end` JSON-line event of Pi's JSON mode
    record_section      the `compaction` section of a compaction's execution record (`compact-plan --record`)

The cut (Pi's `findCutPoint`, preferring user-turn boundaries):
1. Walk back from the newest message, accumulating exact message sizes, until `keep_recent_tokens` is reached
   at message i. If it never is, nothing is summarized.
2. A turn is a user message and everything it triggers, up to the next user message. If the turn holding i fits
   in `keep_recent_tokens`, the cut moves back to that turn's user message.
3. Otherwise the turn alone is larger than `keep_recent_tokens`: it is a *split turn*. The cut is the first valid
   point at or after i inside the turn (the last one before i when only tool results follow), the turn's messages
   before it are `turn_prefix_to_summarize`, and the history before the turn is `messages_to_summarize`.
A valid cut point is a user or assistant message that does not separate a tool call from any of its results, so a
call and its results are kept or summarized together. System and developer messages are never summarized.

Sizes are exact for the model: message i costs T(i+1) - T(i), where T(i) is the token count of
`messages[:i]` rendered with the model's template (no generation prompt) and tokenized (T(0) = 0). T is measured
on demand, not for every prefix: the walk back gallops (1, 2, 4, ... messages from the end) and then bisects, so a
plan costs O(log n) prefix renders, plus one render and count of the whole request. Counts go through the counting
service (`_counting.TokenCounter`), measured against the whole request's render: the runs between control tokens
are tokenized independently, so a prefix's count needs only its last runs looked at (through the shared run
cache); on the reference path (`CTXLOCK_FAST=0`) every count is the tokenizer stage's. Counts are exact either way.
The bisection assumes T grows with i (true when a template appends turns); a template that rewrites earlier turns
when a message is added (dropping past reasoning, say) still gets a valid crossing point.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Unpack

from ctxlock.budget._counting import TokenCounter
from ctxlock.economics import Usage
from ctxlock.errors import BudgetError
from ctxlock.pipeline import Pipeline, RequestLike
from ctxlock.request import Message, Request, without_entry_ids
from ctxlock.template import RENDER_OPTIONS, Rendered, RenderKwargs, RenderOptions, aware_clock

__all__ = [
    "COMPACTION_REASONS",
    "DEFAULT_KEEP_RECENT_TOKENS",
    "DEFAULT_RESERVE_TOKENS",
    "SPLIT_TURN_SEPARATOR",
    "SUMMARY_PREFIX",
    "SUMMARY_SUFFIX",
    "SUMMARY_TOKENS_TOLERANCE",
    "CompactionPlan",
    "apply_compaction",
    "compaction_event",
    "entry_id",
    "message_tokens",
    "pi_usage",
    "plan_compaction",
    "plan_problems",
    "record_section",
    "should_compact",
    "summary_message",
]

# Pi's defaults (coding-agent settings: compaction.reserveTokens, compaction.keepRecentTokens).
DEFAULT_RESERVE_TOKENS = 16384
DEFAULT_KEEP_RECENT_TOKENS = 20000

# The summary reaches the model as one user message, worded as Pi's compaction summary message.
SUMMARY_PREFIX = "The conversation history before this point was compacted into the following summary:\n\n<summary>\n"
SUMMARY_SUFFIX = "\n</summary>"
# Pi merges the history summary and the split turn's prefix summary into one text with this separator, and
# writes "No prior history." when the split turn is the first turn.
SPLIT_TURN_SEPARATOR = "\n\n---\n\n**Turn Context (split turn):**\n\n"
NO_PRIOR_HISTORY = "No prior history."

# `estimated_tokens_after` is exact for everything but the summary text, which is counted as `summary_tokens`.
# Stated tolerance: when the summary text (for a split turn, both texts together) encodes to about
# `summary_tokens` tokens on its own, the applied request's exact count is within
#     SUMMARY_TOKENS_TOLERANCE + |tokens(summary text) - summary_tokens|
# of the estimate. The slack is for tokenizer merges across the joins around the summary text (a newline on each
# side, and the split-turn separator); on Qwen2 and Tekken with word-initial, word-final summaries it is 0.
SUMMARY_TOKENS_TOLERANCE = 4

COMPACTION_REASONS = ("manual", "threshold", "overflow")

_STAND_IN = "summary"

_NEVER_SUMMARIZED = frozenset({"system", "developer"})
_CUT_ROLES = frozenset({"user", "assistant"})


def should_compact(context_tokens: int, context_window: int, reserve_tokens: int = DEFAULT_RESERVE_TOKENS) -> bool:
    """Pi's trigger: compact when the context uses more than `context_window - reserve_tokens` tokens."""
    _check_counts(context_tokens=context_tokens, context_window=context_window, reserve_tokens=reserve_tokens)
    if context_window <= 0:
        raise BudgetError("context_window must be positive", path="context_window", hint="pass the model's window")
    return context_tokens > context_window - reserve_tokens


@dataclass(frozen=True)
class CompactionPlan:
    """Where to cut a conversation, what to summarize, and what it costs, in exact tokens for one model.

    Indexes are into `request.messages`. System and developer messages are in none of the index tuples: they stay.
    The non-system messages are partitioned into `messages_to_summarize`, `turn_prefix_to_summarize` and those
    from `first_kept_index` on.
    """

    messages_to_summarize: tuple[int, ...]  # history before the cut (before the split turn, for a split turn)
    turn_prefix_to_summarize: tuple[int, ...]  # a split turn's messages before the cut; else ()
    first_kept_index: int  # the first message kept verbatim
    split_turn: bool
    tokens_before: int  # exact tokens of the whole request as given (render + tokenize)
    estimated_tokens_after: int  # system + summary of `summary_tokens` tokens + kept messages
    keep_recent_tokens: int
    reserve_tokens: int
    kept_tokens: int = 0  # exact tokens of messages[first_kept_index:] (prefix differences)
    summary_tokens: int = 0  # the summary size `estimated_tokens_after` assumes

    @property
    def summarizes_nothing(self) -> bool:
        """Everything fits within keep_recent_tokens: there is nothing to summarize."""
        return not self.messages_to_summarize and not self.turn_prefix_to_summarize

    def to_dict(self) -> dict[str, Any]:
        return {
            "messages_to_summarize": list(self.messages_to_summarize),
            "turn_prefix_to_summarize": list(self.turn_prefix_to_summarize),
            "first_kept_index": self.first_kept_index,
            "split_turn": self.split_turn,
            "summarizes_nothing": self.summarizes_nothing,
            "tokens_before": self.tokens_before,
            "estimated_tokens_after": self.estimated_tokens_after,
            "kept_tokens": self.kept_tokens,
            "summary_tokens": self.summary_tokens,
            "keep_recent_tokens": self.keep_recent_tokens,
            "reserve_tokens": self.reserve_tokens,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompactionPlan:
        """The plan `to_dict` wrote (a record's `options.compaction.plan`); a malformed one is a BudgetError."""
        try:
            return cls(
                messages_to_summarize=tuple(int(k) for k in d["messages_to_summarize"]),
                turn_prefix_to_summarize=tuple(int(k) for k in d["turn_prefix_to_summarize"]),
                first_kept_index=int(d["first_kept_index"]),
                split_turn=bool(d["split_turn"]),
                tokens_before=int(d["tokens_before"]),
                estimated_tokens_after=int(d["estimated_tokens_after"]),
                keep_recent_tokens=int(d["keep_recent_tokens"]),
                reserve_tokens=int(d["reserve_tokens"]),
                kept_tokens=int(d.get("kept_tokens", 0)),
                summary_tokens=int(d.get("summary_tokens", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BudgetError(
                f"not a compaction plan: {type(exc).__name__}: {exc}",
                path="compaction.plan",
                hint="the record was altered or was not written by ctxlock",
            ) from None


def plan_problems(plan: CompactionPlan, context_window: int) -> tuple[str, ...]:
    """Why the plan would not help, in words (empty: it helps, or no compaction is due and none is planned).

    A plan does not help when compaction is due (`should_compact`) but nothing can be summarized, when the compacted
    request is estimated at no fewer tokens than the request as given (the assumed summary costs more than the
    messages it replaces), or when it is still over the compaction threshold (`context_window - reserve_tokens`),
    let alone over the window itself.
    """
    threshold = context_window - plan.reserve_tokens
    before, after = plan.tokens_before, plan.estimated_tokens_after
    due = should_compact(before, context_window, plan.reserve_tokens)
    out: list[str] = []
    if plan.summarizes_nothing:
        if due:
            out.append(
                f"compaction is due ({before:,} > {threshold:,}) but nothing can be summarized: the newest "
                f"keep_recent_tokens={plan.keep_recent_tokens:,} hold the whole conversation; keep fewer"
            )
        return tuple(out)
    if after >= before:
        out.append(
            f"it does not shrink the context: estimated after {after:,} >= tokens before {before:,} (the assumed "
            f"{plan.summary_tokens:,}-token summary costs more than the messages it replaces)"
        )
    if after > context_window:
        out.append(f"estimated after {after:,} is over the context window {context_window:,} itself")
    elif after > threshold:
        out.append(
            f"estimated after {after:,} is still over the compaction threshold {threshold:,} "
            f"(window {context_window:,} - reserve {plan.reserve_tokens:,})"
        )
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------------
# Exact sizes


class _PrefixTokens:
    """T(i): exact token counts of the conversation prefixes `messages[:i]`, measured on demand and memoized.

    Each prefix is rendered and counted by the counting service against the render of the whole request with the
    caller's options (`full`): a prefix's text shares all of its beginning with it, so only its last runs are looked
    at (`_counting`), and the count is the tokenizer stage's either way.
    """

    def __init__(self, model: Pipeline, request: Request, options: RenderOptions, full: Rendered) -> None:
        self.model, self.request, self.options = model, request, options
        self.tokens = TokenCounter(model.tokenizer)
        self.total = self.tokens.rebase(full)  # the whole request's count, with the caller's options
        self.counts: dict[int, int] = {0: 0}

    def __call__(self, i: int) -> int:
        if i not in self.counts:
            prefix = dataclasses.replace(self.request, messages=self.request.messages[:i])
            self.counts[i] = self.tokens.count(self.model.render(prefix, self.options))
        return self.counts[i]

    def size(self, i: int) -> int:
        """Exact tokens of message i: T(i+1) - T(i)."""
        return self(i + 1) - self(i)


def _prepare(
    request: RequestLike,
    model: Pipeline,
    options: RenderOptions | None,
    render_options: Mapping[str, Any],
) -> tuple[Request, RenderOptions, RenderOptions]:
    """The parsed request, the caller's render options (`options` with the keyword ones over it; clock fixed),
    and the options for prefix renders."""
    opts = RenderOptions.from_kwargs(render_options, base=options, accepted=RENDER_OPTIONS, method="render")
    req = opts.parse(without_entry_ids(request))  # the messages' entry ids, as `ctxlock compact-plan` takes them
    # One clock for every render, so a template that prints the date sees the same one in each prefix.
    # Timezone-aware, like the render's own clock (`template.aware_clock`): the zone is recorded with it.
    opts = opts.replace(now=aware_clock(opts.now))
    return req, opts, opts.replace(add_generation_prompt=False, continue_final_message=False)


def _counter(model: Pipeline, req: Request, options: RenderOptions, prefix_options: RenderOptions) -> _PrefixTokens:
    return _PrefixTokens(model, req, prefix_options, model.render(req, options))


def message_tokens(
    request: RequestLike,
    model: Pipeline,
    indexes: Iterable[int] | None = None,
    *,
    options: RenderOptions | None = None,
    **render_options: Unpack[RenderKwargs],
) -> dict[int, int]:
    """Exact tokens of each message (all, or those in `indexes`): T(i+1) - T(i), as `plan_compaction` measures.
    Takes `plan_compaction`'s render options.

    Costs one prefix render per message asked for (plus one), each counted where it differs from the request's
    render; meant for showing a plan, not for planning.
    """
    req, opts, prefix_options = _prepare(request, model, options, render_options)
    count = _counter(model, req, opts, prefix_options)
    wanted = range(len(req.messages)) if indexes is None else indexes
    return {i: count.size(i) for i in wanted}


# ---------------------------------------------------------------------------------------------------------------
# The cut


def _unit_breaks(messages: tuple[Message, ...]) -> set[int]:
    """Indexes c where a cut would separate a tool call (before c) from one of its results (at or after c)."""
    breaks: set[int] = set()
    call_at: dict[str, int] = {}
    last_caller: int | None = None
    for j, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls:
            last_caller = j
            for tc in m.tool_calls:
                if tc.id is not None:
                    call_at[tc.id] = j
        elif m.role == "tool":
            caller = call_at.get(m.tool_call_id) if m.tool_call_id is not None else None
            if caller is None:
                caller = last_caller  # a result without an id answers the latest call
            if caller is not None:
                breaks.update(range(caller + 1, j + 1))
    return breaks


def _walk_back(count: _PrefixTokens, first: int, n: int, keep: int) -> int | None:
    """The largest i in [first, n) whose suffix messages[i:] reaches `keep` tokens; None if even [first:] does not.

    Pi walks one message at a time; with suffix sizes T(n) - T(i) the same point is found by galloping back from
    the end and bisecting, in O(log n) prefix measurements.
    """
    total = count(n)

    def reached(i: int) -> bool:
        return total - count(i) >= keep

    if n - 1 < first:
        return None
    if reached(n - 1):
        return n - 1
    below, step = n - 1, 1  # `below`: the suffix from here is still under keep
    while True:
        j = max(first, below - step)
        if reached(j):
            above = j
            break
        if j == first:
            return None
        below, step = j, step * 2
    while below - above > 1:
        mid = (above + below) // 2
        if reached(mid):
            above = mid
        else:
            below = mid
    return above


def _cut_point(
    count: _PrefixTokens, messages: tuple[Message, ...], first: int, i: int, keep: int
) -> tuple[int, int, bool]:
    """Where to cut, given i, the message at which the walk back reached `keep` tokens: (the cut, the start of the
    turn holding i, whether the cut is plain history, at a user message or before the first one)."""
    roles = [m.role for m in messages]
    n = len(messages)
    breaks = _unit_breaks(messages)

    def valid(c: int) -> bool:
        return roles[c] in _CUT_ROLES and c not in breaks

    user_start = next((k for k in range(i, first - 1, -1) if roles[k] == "user" and valid(k)), None)
    start = first if user_start is None else user_start
    end = next((k for k in range(i + 1, n) if roles[k] == "user" and valid(k)), n)
    if count(end) - count(start) <= keep:
        cut = start
    else:
        # The turn alone is over keep_recent_tokens: cut inside it, at or after i when a valid point exists there.
        after_i = [c for c in range(max(i, start + 1), end) if valid(c)]
        before_i = [c for c in range(start + 1, i) if valid(c)]
        cut = after_i[0] if after_i else (before_i[-1] if before_i else start)
    return cut, start, cut == start or user_start is None


def plan_compaction(
    request: RequestLike,
    model: Pipeline,
    *,
    context_window: int,
    reserve_tokens: int = DEFAULT_RESERVE_TOKENS,
    keep_recent_tokens: int = DEFAULT_KEEP_RECENT_TOKENS,
    summary_tokens: int = 1000,
    options: RenderOptions | None = None,
    **render_options: Unpack[RenderKwargs],
) -> CompactionPlan:
    """Plan a compaction of `request` for `model` (see the module docstring for the cut rules).

    `options` (a `RenderOptions`) and the keyword `render_options` over it are `Model.render`'s
    (`add_generation_prompt`, `chat_template_kwargs`, `now`, ...) and apply to `tokens_before` and
    `estimated_tokens_after`; prefixes are always measured without a generation prompt.
    `estimated_tokens_after` is the exact count of the compacted request with a one-word stand-in summary, less the
    stand-in, plus `summary_tokens`; see `SUMMARY_TOKENS_TOLERANCE`. Cost: one render and tokenization of the
    request, O(log n) prefix renders (each counted where it differs from the request's render), and one render and
    count of the compacted request. `context_window` is validated here and used by
    `should_compact(plan.tokens_before, context_window, plan.reserve_tokens)`.
    """
    _check_counts(
        context_window=context_window,
        reserve_tokens=reserve_tokens,
        keep_recent_tokens=keep_recent_tokens,
        summary_tokens=summary_tokens,
    )
    if context_window <= 0:
        raise BudgetError("context_window must be positive", path="context_window", hint="pass the model's window")
    req, opts, prefix_options = _prepare(request, model, options, render_options)
    count = _counter(model, req, opts, prefix_options)
    tokens_before = count.total
    messages = req.messages
    n = len(messages)
    roles = [m.role for m in messages]
    conversation = [k for k in range(n) if roles[k] not in _NEVER_SUMMARIZED]

    def plan(cut: int, history: list[int], prefix: list[int], split: bool) -> CompactionPlan:
        kept = count(n) - count(cut)
        base = CompactionPlan(
            messages_to_summarize=tuple(history),
            turn_prefix_to_summarize=tuple(prefix),
            first_kept_index=cut,
            split_turn=split,
            tokens_before=tokens_before,
            estimated_tokens_after=tokens_before,
            keep_recent_tokens=keep_recent_tokens,
            reserve_tokens=reserve_tokens,
            kept_tokens=kept,
            summary_tokens=summary_tokens,
        )
        if base.summarizes_nothing:
            return base
        # The compacted request with a one-word stand-in for each summary: exact for everything but the summary
        # text. (An empty stand-in would let the newlines around it merge into one token, which real text keeps
        # apart.)
        stand_in = len(model.tokenizer.encode(_STAND_IN)) * (2 if split else 1)
        compacted = _compacted(req, cut, summary_message(_STAND_IN, _STAND_IN if split else None))
        after = count.tokens.count(model.render(compacted, opts)) - stand_in + summary_tokens
        return dataclasses.replace(base, estimated_tokens_after=after)

    if not conversation:
        return plan(n, [], [], False)
    first = conversation[0]
    i = _walk_back(count, first, n, keep_recent_tokens)
    if i is None:
        return plan(first, [], [], False)

    cut, start, plain = _cut_point(count, messages, first, i, keep_recent_tokens)
    if plain:
        # A cut at a user message, or inside the messages before the first user message (no turn to split: Pi
        # summarizes them as plain history).
        return plan(cut, [k for k in conversation if k < cut], [], False)
    history = [k for k in conversation if k < start]
    prefix = [k for k in conversation if start <= k < cut]
    return plan(cut, history, prefix, True)


# ---------------------------------------------------------------------------------------------------------------
# Applying a plan


def summary_message(summary_text: str, turn_prefix_summary: str | None = None) -> Message:
    """The one user message that replaces the summarized messages, in Pi's wording.

    For a split turn, the history summary and the turn-prefix summary are merged as Pi merges them.
    """
    text = summary_text
    if turn_prefix_summary is not None:
        text = f"{summary_text}{SPLIT_TURN_SEPARATOR}{turn_prefix_summary}"
    return Message(role="user", content=f"{SUMMARY_PREFIX}{text}{SUMMARY_SUFFIX}", source="compaction.summary")


def apply_compaction(
    request: Request, plan: CompactionPlan, summary_text: str, *, turn_prefix_summary: str | None = None
) -> Request:
    """The compacted request: the system and developer messages before the cut (unchanged, in order), then one
    summary message (`summary_message`), then `messages[plan.first_kept_index:]` verbatim.

    A split-turn plan needs `turn_prefix_summary` (the summary of `turn_prefix_to_summarize`), and only such a plan
    accepts it. A plan that summarizes nothing gives the request back unchanged. The cut never separates a tool call
    from its results, so no kept tool result loses its call.
    """
    _check_plan(request, plan)
    if plan.split_turn and turn_prefix_summary is None:
        raise BudgetError(
            "this plan splits a turn: it needs the summary of turn_prefix_to_summarize too",
            path="turn_prefix_summary",
            hint="pass turn_prefix_summary=... (Pi merges it after the history summary)",
        )
    if not plan.split_turn and turn_prefix_summary is not None:
        raise BudgetError(
            "turn_prefix_summary is only for a plan that splits a turn",
            path="turn_prefix_summary",
            hint="drop it; this plan cuts at a user-turn boundary",
        )
    if plan.summarizes_nothing:
        return request
    if plan.split_turn and not plan.messages_to_summarize and not summary_text:
        summary_text = NO_PRIOR_HISTORY  # Pi's history summary when the split turn is the first turn
    return _compacted(request, plan.first_kept_index, summary_message(summary_text, turn_prefix_summary))


def _compacted(request: Request, cut: int, summary: Message) -> Request:
    messages = request.messages
    kept_system = tuple(m for m in messages[:cut] if m.role in _NEVER_SUMMARIZED)
    return dataclasses.replace(request, messages=(*kept_system, summary, *messages[cut:]))


def _check_plan(request: Request, plan: CompactionPlan) -> None:
    n = len(request.messages)
    cut = plan.first_kept_index
    summarized = (*plan.messages_to_summarize, *plan.turn_prefix_to_summarize)
    if not 0 <= cut <= n or any(not 0 <= k < cut for k in summarized):
        raise BudgetError(
            f"the plan does not fit this request ({n} messages, first kept index {cut})",
            path="plan",
            hint="apply a plan to the request it was made for",
        )
    for k in summarized:
        if request.messages[k].role in _NEVER_SUMMARIZED:
            raise BudgetError(
                f"the plan summarizes a {request.messages[k].role} message",
                path=f"messages[{k}]",
                hint="apply a plan to the request it was made for",
            )
    if cut < n and request.messages[cut].role == "tool":
        raise BudgetError(
            "the plan keeps a tool result without its call",
            path=f"messages[{cut}]",
            hint="apply a plan to the request it was made for",
        )


# ---------------------------------------------------------------------------------------------------------------
# Events


def compaction_event(
    plan: CompactionPlan,
    *,
    reason: str,
    summary: str | None,
    aborted: bool = False,
    will_retry: bool = False,
    first_kept_entry_id: str | None = None,
    usage: Usage | None = None,
) -> dict[str, Any]:
    """Pi's `compaction_end` JSON-mode event for this plan.

    `result` is absent when the compaction was aborted. `firstKeptEntryId` is `first_kept_entry_id` (the id the
    caller gave the first kept entry) or, without one, the JSON path of the first kept message; `details` carries
    the plan (Pi's own details list files read and modified, which ctxlock does not track). `usage` is the summary
    call's usage in Pi's shape when the caller gives it (ctxlock makes no summarization call itself); absent
    otherwise. `willRetry` (the request is retried with the compacted context) only follows a successful
    `overflow` compaction.
    """
    if reason not in COMPACTION_REASONS:
        raise BudgetError(
            f"unknown compaction reason {reason!r}", path="reason", hint=f"use one of {', '.join(COMPACTION_REASONS)}"
        )
    if will_retry and (aborted or reason != "overflow"):
        raise BudgetError(
            "will_retry is only for a completed overflow compaction",
            path="will_retry",
            hint="Pi retries the request only after recovering from a context overflow",
        )
    event: dict[str, Any] = {"type": "compaction_end", "reason": reason}
    if not aborted:
        if summary is None:
            raise BudgetError("a completed compaction has a summary", path="summary", hint="pass summary=...")
        event["result"] = {
            "summary": summary,
            "firstKeptEntryId": first_kept_entry_id or f"messages[{plan.first_kept_index}]",
            "tokensBefore": plan.tokens_before,
            "estimatedTokensAfter": plan.estimated_tokens_after,
            **({"usage": pi_usage(usage)} if usage is not None else {}),
            "details": {
                "messagesToSummarize": list(plan.messages_to_summarize),
                "turnPrefixToSummarize": list(plan.turn_prefix_to_summarize),
                "firstKeptIndex": plan.first_kept_index,
                "splitTurn": plan.split_turn,
                "keepRecentTokens": plan.keep_recent_tokens,
                "reserveTokens": plan.reserve_tokens,
            },
        }
    event["aborted"] = aborted
    event["willRetry"] = will_retry
    return event


# ---------------------------------------------------------------------------------------------------------------
# Records

# The version of the record's `compaction` section (an optional section of ctxlock.record/2; older records lack it).
COMPACTION_SECTION_VERSION = 1
_SOURCE_INDEX = re.compile(r"^messages\[(\d+)\]")


def entry_id(request: Request, index: int, entry_ids: Mapping[int, str]) -> tuple[str, str]:
    """The caller's id of message `index` ("abc123", "caller"), else its JSON path ("messages[3]", "json_path").
    `entry_ids` is keyed by the index in the request as sent (an Anthropic request's reshaping can differ)."""
    if index >= len(request.messages):
        return f"messages[{index}]", "json_path"
    source = request.messages[index].source or f"messages[{index}]"
    m = _SOURCE_INDEX.match(source)
    if m is not None and int(m.group(1)) in entry_ids:
        return entry_ids[int(m.group(1))], "caller"
    return source, "json_path"


def pi_usage(usage: Usage) -> dict[str, Any]:
    """A normalized usage in Pi's `Usage` shape (`input`, `output`, `cacheRead`, `cacheWrite`, ...)."""
    out: dict[str, Any] = {
        "input": usage.input,
        "output": usage.output,
        "cacheRead": usage.cache_read,
        "cacheWrite": usage.cache_write,
        "totalTokens": usage.total_tokens,
    }
    if usage.cache_write_1h:
        out["cacheWrite1h"] = usage.cache_write_1h
    if usage.reasoning is not None:
        out["reasoning"] = usage.reasoning
    if usage.cost is not None:
        c = usage.cost.to_dict()
        names = {"cache_read": "cacheRead", "cache_write": "cacheWrite", "total_from_provider": "totalFromProvider"}
        keys = ("input", "output", "cache_read", "cache_write", "total", "total_from_provider")
        out["cost"] = {names.get(k, k): c[k] for k in keys}
    return out


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def record_section(
    plan: CompactionPlan,
    request: Request,
    *,
    reason: str,
    context_window: int,
    entry_ids: Mapping[int, str],
    summary: str | None = None,
    turn_prefix_summary: str | None = None,
    usage: Usage | None = None,
    tokens_after: int | None = None,
    at: str | None = None,
) -> dict[str, Any]:
    """The `compaction` section of a compaction's record: the plan, the cut (with the caller's id of the first kept
    entry, or its JSON path, said so), every summarized message (path, role, id), the summary's digest, the
    compacted request's exact tokens, the summary call's usage, and Pi's `compaction_end` event (null when no
    summary was given: the compaction was planned, not applied). The originals are the record's `request`."""
    first_id, id_source = entry_id(request, plan.first_kept_index, entry_ids)
    notes: list[str] = []
    if id_source == "json_path" and not plan.summarizes_nothing:
        notes.append(
            f"the first kept message carries no id: firstKeptEntryId is its JSON path {first_id} (give each "
            "message an `id` to have the caller's ids)"
        )
    parts = [(k, "history") for k in plan.messages_to_summarize]
    parts += [(k, "turn_prefix") for k in plan.turn_prefix_to_summarize]
    summarized = []
    for k, part in parts:
        eid, src = entry_id(request, k, entry_ids)
        path = request.messages[k].source or f"messages[{k}]"
        summarized.append(
            {
                "index": k,
                "path": path,
                "role": request.messages[k].role,
                "part": part,
                "entry_id": eid if src == "caller" else None,
            }
        )
    event = None
    if summary is not None:
        event = compaction_event(plan, reason=reason, summary=summary, first_kept_entry_id=first_id, usage=usage)
    problems = plan_problems(plan, context_window)
    return {
        "version": COMPACTION_SECTION_VERSION,
        "at": at,
        "reason": reason,
        "applied": summary is not None and not plan.summarizes_nothing,
        "context_window": context_window,
        "should_compact": should_compact(plan.tokens_before, context_window, plan.reserve_tokens),
        "helps": not problems,
        "problems": list(problems),
        "plan": plan.to_dict(),
        "cut": {
            "first_kept_index": plan.first_kept_index,
            "first_kept_entry_id": first_id,
            "first_kept_entry_id_source": id_source,
            "split_turn": plan.split_turn,
        },
        "summarized": summarized,
        "summary": None
        if summary is None
        else {
            "sha256": _digest(summary),
            "chars": len(summary),
            "turn_prefix_sha256": None if turn_prefix_summary is None else _digest(turn_prefix_summary),
        },
        "tokens_after": tokens_after,
        "usage": None if usage is None else usage.to_dict(),
        "event": event,
        "notes": notes,
    }


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BudgetError(f"{name} must be a non-negative integer, got {value!r}", path=name)
