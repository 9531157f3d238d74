"""The fit's inputs and rows: the budget policy, the segments of a request (docs/budgets.md), the order in which the
optional ones are tried, the candidate request for a set of kept segments, and the decision row of each.

Required segments: system/developer messages, the tool schemas, the current turn (the last user message and
everything after it). Optional: earlier history, one unit per user turn (a user message and every assistant and tool
message it triggers, so a call and its results are kept or dropped together), and retrieved documents.
`ctxlock.budget.fit_context` runs the documented loop (docs/budgets.md) over them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ctxlock.core import canonical_json
from ctxlock.errors import BudgetError
from ctxlock.request import Message, Request

SegmentKind = Literal["system", "tools", "current", "history", "document"]
HistoryMode = Literal["suffix", "greedy"]
GenerationPrefix = Literal["required", "none"]


@dataclass(frozen=True)
class BudgetPolicy:
    """How to fit: the token budget and the order in which optional segments are tried.

    `history`: "suffix" (default) keeps a contiguous most-recent run of history turns; "greedy" tries every turn
    newest first and keeps each one that fits (the literal loop of docs/budgets.md; it can leave gaps). Either way a
    history turn holding the call of a result in the current turn is required, kept with it. `generation_prefix`:
    "required" (default) checks that the fitted input ends with exactly one assistant generation prefix; "none" is the
    caller's explicit opt-out for an input that is not a generation request (scoring, training), rendered with
    add_generation_prompt=False. `order` lists optional segment ids to try first, in that order: any segment with
    history="greedy", documents only with "suffix" (a suffix is always tried newest first)."""

    max_input_tokens: int | None = None
    context_window: int | None = None
    reserve_output_tokens: int = 0
    optional_priority: tuple[str, ...] = ("history", "documents")  # which kind is tried first
    order: tuple[str, ...] | None = None  # a user-supplied order of optional segment ids (overrides the above)
    history: HistoryMode = "suffix"
    generation_prefix: GenerationPrefix = "required"
    # Where the window came from ("--context-window", "config.json max_position_embeddings", ...): recorded only
    # when set, so the policies (and digests) of earlier records are unchanged.
    window_source: str | None = None

    def __post_init__(self) -> None:
        self._check_types()
        if (self.max_input_tokens is None) == (self.context_window is None):
            raise BudgetError(
                "give exactly one of max_input_tokens or context_window (with reserve_output_tokens)",
                path="policy",
                hint="the budget must hold the input and the output: n_input + g <= N (docs/budgets.md)",
            )
        if self.reserve_output_tokens < 0 or (self.context_window is not None and self.context_window <= 0):
            raise BudgetError("token counts must be positive", path="policy")
        if set(self.optional_priority) - {"history", "documents"}:
            raise BudgetError("optional_priority lists 'history' and 'documents'", path="policy.optional_priority")
        if self.history not in get_args(HistoryMode):
            raise BudgetError(
                f"unknown history mode {self.history!r}",
                path="policy.history",
                hint="use 'suffix' (a contiguous most-recent history, the default) or 'greedy' (every turn tried, "
                "newest first)",
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
        if self.window_source is not None and not isinstance(self.window_source, str):
            raise BudgetError("window_source must be a string", path="policy.window_source")
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
            **({"window_source": self.window_source} if self.window_source is not None else {}),
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


def segments(request: Request) -> list[Segment]:
    """Split a request into its budget segments, in the order they appear."""
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


__all__ = [
    "BudgetPolicy",
    "Decision",
    "GenerationPrefix",
    "HistoryMode",
    "Segment",
    "SegmentKind",
    "candidate",
    "priority_order",
    "segments",
]
