"""Why didn't the model see it: five causes (docs/explain.md), each with a verdict (yes, no, unknown) and evidence.

`explain(find, seen, ...)` looks for one text in what the model received (`seen`: a request rendered and laid out
in tokens, `accounting.Layout`), in the history the records kept (`Origin`: the requests as received, and the fit
decisions and compaction plans that cut them), and in the provider's events, and judges each cause on its own:

1. **too large** — the input against the context window (a `Window`: its tokens and where the number came from),
   by ctxlock's exact count and by the reported usage; or a provider's context-overflow error in the events
   (`OVERFLOW_MESSAGES`: the wording of OpenAI, Anthropic, Gemini, vLLM, llama.cpp and Bedrock).
2. **output truncated** — a finish reason that means the output limit was hit (`TRUNCATED_REASONS`: OpenAI's
   `length`, Anthropic's `max_tokens`, Gemini's `MAX_TOKENS`, the Responses API's `max_output_tokens`, Pi's
   `length`), with the tool calls of that response, which must not have been executed (Pi (github.com/badlogic/pi-mono)
   refuses them).
3. **dropped** — the text is in the history a record kept but not in what the model received, and a fit decision
   or a compaction plan removed the part holding it: the decision, the plan, the record and when.
4. **never read** — the text is in no request string at all; or only in user-pasted content, never in a tool
   result; or in a part the template never wrote (`accounting.unseen_parts`).
5. **in the middle** — where the text's first token lies, exactly (the tokens' bytes are laid over the rendered
   text), as a position and a percentile. The rule, after Liu et al., "Lost in the Middle: How Language Models Use
   Long Contexts" (TACL 2024), who found recall highest at the start and end of the context and lowest in the
   middle: flagged when the context holds at least `MIDDLE_MIN_TOKENS` tokens and every occurrence of the text
   starts between the `MIDDLE_LOW` and `MIDDLE_HIGH` fractions of it (10% and 90%). The rule is ctxlock's
   choice of thresholds, not a number from the paper.

The search is for the exact text (case and whitespace as given). Nothing here reads a file: the CLI
(`cli/explain.py`) reads records, events and usage and builds the values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxlock.accounting import Layout, part_of
from ctxlock.economics._usage import Usage
from ctxlock.errors import ExplainError

__all__ = [
    "CAUSES",
    "MAX_FIND_CHARS",
    "MIDDLE_HIGH",
    "MIDDLE_LOW",
    "MIDDLE_MIN_TOKENS",
    "OVERFLOW_MESSAGES",
    "TRUNCATED_REASONS",
    "Cause",
    "Drop",
    "Explanation",
    "Origin",
    "Window",
    "check_find",
    "explain",
    "origin_of_record",
]

YES, NO, UNKNOWN = "yes", "no", "unknown"
CAUSES = ("too large", "output truncated", "dropped", "never read", "in the middle")
MAX_FIND_CHARS = 4096
MIDDLE_LOW, MIDDLE_HIGH = 0.10, 0.90
MIDDLE_MIN_TOKENS = 2000
_MAX_OCCURRENCES = 1000
_MAX_EVENT_DEPTH = 64

# (provider, the words of its context-overflow error, as its documentation or server source gives them)
OVERFLOW_MESSAGES: tuple[tuple[str, str], ...] = (
    ("OpenAI", "context_length_exceeded"),
    ("OpenAI", "maximum context length is"),
    ("OpenAI", "exceeds the context window"),
    ("Anthropic", "prompt is too long"),
    ("Anthropic", "exceed context limit"),
    ("Anthropic", "model_context_window_exceeded"),
    ("Gemini", "exceeds the maximum number of tokens allowed"),
    ("vLLM", "is longer than the maximum model length"),
    ("llama.cpp", "exceeds the available context size"),
    ("Bedrock", "input is too long for requested model"),
)
_OVERFLOW = re.compile("|".join(re.escape(m) for _, m in OVERFLOW_MESSAGES), re.IGNORECASE)
# finish-reason values that mean "the output limit was hit", by provider field
TRUNCATED_REASONS = frozenset({"length", "max_tokens", "MAX_TOKENS", "max_output_tokens"})
_REASON_KEYS = ("finish_reason", "finishReason", "stop_reason", "stopReason")
_NOT_EXECUTED = re.compile(r'Tool call "([^"]{1,200})" was not executed: the response hit the output token limit')


@dataclass(frozen=True)
class Window:
    """A context window in tokens and where the number came from (`--context-window`, a model's config...)."""

    tokens: int
    source: str


@dataclass(frozen=True)
class Drop:
    """A recorded decision that removed request parts: a fit decision or a compaction plan."""

    kind: str  # "fit" or "compaction"
    name: str  # "fit decision history[1:3]", "compaction plan (threshold)"
    parts: tuple[str, ...]  # the top-level parts it removed: "messages[3]", "documents[0]"
    detail: str
    record: str | None = None
    at: str | None = None
    applied: bool = True
    entries: tuple[tuple[str, str], ...] = ()  # (part, the caller's entry id) where the record has one

    def entry(self, part: str) -> str:
        found = dict(self.entries).get(part)
        return f"entry {found}; " if found else ""


@dataclass(frozen=True)
class Origin:
    """A request as received before a record's decisions (the history), with the decisions that cut it."""

    label: str
    strings: tuple[tuple[str, str, str], ...]  # (path, role, text)
    drops: tuple[Drop, ...] = ()


@dataclass(frozen=True)
class Cause:
    number: int
    name: str
    verdict: str
    evidence: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.number, "name": self.name, "verdict": self.verdict, "evidence": list(self.evidence)}


@dataclass(frozen=True)
class Explanation:
    find: str
    seen: str  # what the model received: "request chat.json", "record 1a2b3c4d5e6f"
    input_tokens: int
    causes: tuple[Cause, ...]
    occurrences: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def answer(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.causes if c.verdict == YES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "find": self.find,
            "seen": self.seen,
            "input_tokens": self.input_tokens,
            "answer": list(self.answer),
            "causes": [c.to_dict() for c in self.causes],
            "occurrences": list(self.occurrences),
            "rule": {
                "in_the_middle": f"flagged when the context holds >= {MIDDLE_MIN_TOKENS} tokens and every occurrence "
                f"starts between {MIDDLE_LOW:.0%} and {MIDDLE_HIGH:.0%} of it (Liu et al., Lost in the Middle, "
                "TACL 2024)",
            },
            "notes": list(self.notes),
        }


def check_find(find: str) -> str:
    if not isinstance(find, str) or not find:
        raise ExplainError("the text to find is empty", path="--find", hint="pass the text the model did not see")
    if len(find) > MAX_FIND_CHARS:
        raise ExplainError(
            f"the text to find is {len(find):,} characters, over the {MAX_FIND_CHARS:,}-character limit",
            path="--find",
            hint="search for a distinctive line of it",
        )
    if any(0xD800 <= ord(c) <= 0xDFFF for c in find):
        raise ExplainError("the text to find holds a lone surrogate", path="--find", hint="pass UTF-8 text")
    return find


# -- where the text is --------------------------------------------------------------------------------------------


def _roles(lay: Layout) -> list[tuple[str, str]]:
    """(source path, role) of every message, longest paths first, for naming the role of a string's path."""
    out = []
    for i, m in enumerate(lay.request.messages):
        out.append((m.source or f"messages[{i}]", m.role))
        out += [(p, "tool" if m.role == "tool" else m.role) for p in m.origins.values()]
    return sorted(out, key=lambda x: -len(x[0]))


def _role_of(path: str, roles: Sequence[tuple[str, str]]) -> str:
    for prefix, role in roles:
        if path == prefix or path.startswith((prefix + ".", prefix + "[")):
            return role
    if path.startswith("documents"):
        return "document"
    if path.startswith("tools"):
        return "tool definition"
    return "system" if path.startswith("system") else "template"


def _owner(lay: Layout, char: int) -> str:
    for span in lay.rendered.request_spans:
        if span.start <= char < span.end:
            return span.path
    return "template"


def _occurrences(find: str, lay: Layout, roles: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Every place the text starts in the rendered text: character, token (exact), percentile, owner, role."""
    text, total = lay.rendered.text, len(lay.ids)
    out: list[dict[str, Any]] = []
    at = text.find(find)
    while at >= 0 and len(out) < _MAX_OCCURRENCES:
        token = lay.tokens_before(at)
        if token > 0 and int(lay.ends[token - 1]) > int(lay.offsets[at]):
            token -= 1
        owner = _owner(lay, at)
        out.append(
            {
                "char": at,
                "token": token,
                "percentile": round(100 * token / total, 1) if total else 0.0,
                "path": owner,
                "role": _role_of(owner, roles) if owner != "template" else "template",
            }
        )
        at = text.find(find, at + 1)
    return out


def _unseen_holding(find: str, lay: Layout, unseen: Sequence[str]) -> list[str]:
    hits = []
    for path, value in lay.request.strings():
        if find in value and any(path == u or path.startswith((u + ".", u + "[")) for u in unseen):
            hits.append(path)
    return hits


# -- events -------------------------------------------------------------------------------------------------------


def _walk(value: Any, depth: int = 0) -> Iterator[Any]:
    if depth > _MAX_EVENT_DEPTH:
        return
    yield value
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _walk(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, depth + 1)


def _tool_name(node: Mapping[str, Any]) -> str | None:
    if node.get("type") in ("tool_use", "function_call", "toolCall") and isinstance(node.get("name"), str):
        return node["name"]
    for key in ("function", "functionCall"):
        inner = node.get(key)
        if isinstance(inner, Mapping) and isinstance(inner.get("name"), str):
            return inner["name"]
    return None


@dataclass
class _Events:
    overflow: list[str] = field(default_factory=list)
    finishes: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)  # (where, reason, tool calls)
    not_executed: list[str] = field(default_factory=list)
    compactions: list[str] = field(default_factory=list)


def _scan(events: Sequence[tuple[str, Any]]) -> _Events:
    """Overflow errors, finish reasons (with the tool calls of the response they end) and Pi's refusals."""
    found = _Events()
    pending: list[str] = []
    for where, event in events:
        if isinstance(event, Mapping) and event.get("type") == "message_start":
            pending = []
        if isinstance(event, Mapping) and event.get("type") == "compaction_end":
            result = event.get("result") if isinstance(event.get("result"), Mapping) else {}
            found.compactions.append(f"{where}: compaction_end, firstKeptEntryId {result.get('firstKeptEntryId')!r}")
        reasons: list[str] = []
        for node in _walk(event):
            if isinstance(node, str):
                if _OVERFLOW.search(node) and len(found.overflow) < 20:
                    found.overflow.append(f"{where}: {node[:200]!r}")
                hit = _NOT_EXECUTED.search(node)
                if hit:
                    found.not_executed.append(f"{where}: tool call {hit.group(1)!r} was not executed")
            elif isinstance(node, Mapping):
                name = _tool_name(node)
                if name is not None:
                    pending.append(name)
                reasons += [node[k] for k in _REASON_KEYS if isinstance(node.get(k), str)]
                details = node.get("incomplete_details")
                if node.get("status") == "incomplete" and isinstance(details, Mapping):
                    reasons.append(str(details.get("reason")))
        for reason in reasons:
            found.finishes.append((where, reason, tuple(pending)))
        if reasons:
            pending = []
    return found


# -- the five causes ----------------------------------------------------------------------------------------------


def _too_large(lay: Layout, window: Window | None, usage: Usage | None, ev: _Events) -> Cause:
    name = CAUSES[0]
    exact = len(lay.ids)
    if ev.overflow:
        return Cause(1, name, YES, tuple(f"provider overflow error: {e}" for e in ev.overflow))
    if window is None:
        return Cause(1, name, UNKNOWN, (f"{exact:,} input tokens (exact); no context window: pass --context-window N",))
    sizes = [(exact, "exact, by ctxlock")]
    if usage is not None:
        sizes.append((usage.prompt_tokens, f"reported: input + cache read + cache write, {usage.source}"))
    over = [(n, how) for n, how in sizes if n > window.tokens]
    shown = "; ".join(f"{n:,} input tokens ({how})" for n, how in sizes)
    where = f"the {window.tokens:,}-token window ({window.source})"
    if over:
        return Cause(1, name, YES, (f"{shown}: over {where}",))
    used = max(n for n, _ in sizes)
    return Cause(1, name, NO, (f"{shown}: within {where}, {used / window.tokens:.0%} used; no overflow error",))


def _truncated(ev: _Events, has_events: bool) -> Cause:
    name = CAUSES[1]
    cut = [(w, r, tools) for w, r, tools in ev.finishes if r in TRUNCATED_REASONS]
    if cut or ev.not_executed:
        evidence = []
        for where, reason, tools in cut:
            line = f"{where}: finish reason {reason!r}: the output hit its token limit"
            if tools:
                line += f"; its tool calls {', '.join(tools)} have arguments that may be cut: not executed"
            evidence.append(line)
        evidence += ev.not_executed
        return Cause(2, name, YES, tuple(evidence))
    if ev.finishes:
        reasons = ", ".join(sorted({f"{r!r}" for _, r, _ in ev.finishes}))
        return Cause(2, name, NO, (f"finish reasons {reasons}: none means the output limit was hit",))
    what = "no finish reason in the events or usage" if has_events else "no events or response given"
    return Cause(2, name, UNKNOWN, (f"{what}: pass the provider's response or event stream with --events",))


def _history_hits(find: str, origins: Sequence[Origin], lay: Layout) -> list[tuple[Origin, str, str]]:
    """The history's strings that hold the text, less those the received request still holds at the same path."""
    still = {path for path, value in lay.request.strings() if find in value}
    return [(o, path, role) for o in origins for path, role, text in o.strings if find in text and path not in still]


def _dropped(find: str, lay: Layout, seen_hits: list[dict[str, Any]], origins: Sequence[Origin], ev: _Events) -> Cause:
    name = CAUSES[2]
    hits = _history_hits(find, origins, lay)
    everywhere = [(o, path) for o in origins for path, _, text in o.strings if find in text]
    planned = [
        f"{d.name} in {o.label} would remove {part_of(path)} (planned, not applied)"
        for o, path in everywhere
        for d in o.drops
        if not d.applied and part_of(path) in d.parts
    ]
    if seen_hits:
        return Cause(3, name, NO, ("the model received it (see cause 5 for where)", *planned))
    evidence = []
    for o, path, _ in hits:
        for d in o.drops:
            if d.applied and part_of(path) in d.parts:
                when = f" at {d.at}" if d.at else ""
                top = part_of(path)
                evidence.append(f"{d.name} in {o.label}{when} removed {top} ({d.entry(top)}it held {path}): {d.detail}")
    if evidence:
        return Cause(3, name, YES, tuple(dict.fromkeys(evidence)))
    if hits:
        where = ", ".join(sorted({f"{p} in {o.label}" for o, p, _ in hits}))
        return Cause(3, name, UNKNOWN, (f"the history held it ({where}) but no recorded decision names that part",))
    if ev.compactions:
        return Cause(3, name, UNKNOWN, ("a compaction happened, but its record is not given:", *ev.compactions))
    if not origins:
        return Cause(
            3, name, UNKNOWN, ("no fit or compaction record given: the history before this request is unknown",)
        )
    labels = ", ".join(o.label for o in origins)
    return Cause(3, name, NO, (f"no part that held it was removed ({labels} searched)",))


def _never_read(
    find: str,
    lay: Layout,
    seen_hits: list[dict[str, Any]],
    origins: Sequence[Origin],
    unseen: Sequence[str],
    ev: _Events,
) -> Cause:
    name = CAUSES[3]
    if seen_hits:
        roles = {h["role"] for h in seen_hits}
        paths = ", ".join(dict.fromkeys(f"{h['path']} ({h['role']})" for h in seen_hits[:5]))
        if roles == {"user"}:
            return Cause(
                4,
                name,
                YES,
                (f"only in user-pasted content ({paths}); no tool result holds it: the model never read it itself",),
            )
        return Cause(4, name, NO, (f"in the request the model received: {paths}",))
    hidden = _unseen_holding(find, lay, unseen)
    if hidden:
        return Cause(
            4,
            name,
            YES,
            tuple(f"{p} holds it, but the template wrote no byte of it: the model never sees it" for p in hidden),
        )
    in_request = [p for p, v in lay.request.strings() if find in v]
    if in_request:
        where = ", ".join(in_request[:5])
        return Cause(
            4, name, UNKNOWN, (f"{where} holds it, but the rendered text does not hold it verbatim (escaped?)",)
        )
    if _history_hits(find, origins, lay):
        return Cause(4, name, NO, ("an earlier request held it (see cause 3): it was read, then removed",))
    if ev.compactions and not origins:
        return Cause(
            4, name, UNKNOWN, ("in no request string here, but a compaction happened whose record is not given",)
        )
    searched = sum(1 for _ in lay.request.strings())
    extra = f" and {sum(len(o.strings) for o in origins)} strings of the recorded history" if origins else ""
    return Cause(
        4, name, YES, (f"in no request string ({searched} strings of the request{extra}) nor the rendered text",)
    )


def _in_the_middle(seen_hits: list[dict[str, Any]], total: int) -> Cause:
    name = CAUSES[4]
    if not seen_hits:
        return Cause(5, name, NO, ("not in the request the model received: no position to judge",))
    first = seen_hits[0]
    at = (
        f"first occurrence at token {first['token']:,} of {total:,} ({first['percentile']}th percentile), in "
        f"{first['path']} ({first['role']})"
    )
    if len(seen_hits) > 1:
        at += f"; {len(seen_hits)} occurrences, the last at the {seen_hits[-1]['percentile']}th percentile"
    if total < MIDDLE_MIN_TOKENS:
        return Cause(5, name, NO, (at, f"the context holds {total:,} tokens, under the rule's {MIDDLE_MIN_TOKENS:,}"))
    low, high = 100 * MIDDLE_LOW, 100 * MIDDLE_HIGH
    if all(low <= h["percentile"] <= high for h in seen_hits):
        rule = f"every occurrence lies between the {low:.0f}th and {high:.0f}th percentile of a {total:,}-token context"
        return Cause(5, name, YES, (at, f"{rule}: lost in the middle (Liu et al., TACL 2024)"))
    return Cause(5, name, NO, (at, f"an occurrence lies outside the {low:.0f}th-{high:.0f}th percentile middle"))


def explain(
    find: str,
    lay: Layout,
    *,
    label: str,
    unseen: Sequence[str] = (),
    origins: Sequence[Origin] = (),
    window: Window | None = None,
    usage: Usage | None = None,
    events: Sequence[tuple[str, Any]] = (),
) -> Explanation:
    """Judge the five causes for `find` (see the module docstring). `lay` is what the model received; `unseen` the
    request parts its template never wrote; `events` (where, JSON value) pairs of the provider's responses, stream
    events or errors (usage files are events too: a response carries its finish reason)."""
    check_find(find)
    roles = _roles(lay)
    hits = _occurrences(find, lay, roles)
    ev = _scan(events)
    causes = (
        _too_large(lay, window, usage, ev),
        _truncated(ev, bool(events)),
        _dropped(find, lay, hits, origins, ev),
        _never_read(find, lay, hits, origins, unseen, ev),
        _in_the_middle(hits, len(lay.ids)),
    )
    notes = []
    if not lay.exact:
        notes.append("token bytes were spread in proportion over some runs: positions are approximate")
    if len(hits) >= _MAX_OCCURRENCES:
        notes.append(f"only the first {_MAX_OCCURRENCES} occurrences were located")
    return Explanation(find, label, len(lay.ids), causes, tuple(hits), tuple(notes))


# -- records as history ---------------------------------------------------------------------------------------------


def _strings(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    if depth > _MAX_EVENT_DEPTH:
        return
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            if k not in ("role", "type", "id", "tool_call_id"):
                yield from _strings(v, f"{path}.{k}", depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]", depth + 1)


def _canonical_strings(canonical: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    out: list[tuple[str, str, str]] = []
    for k, m in enumerate(canonical.get("messages") or ()):
        role = str(m.get("role")) if isinstance(m, Mapping) else "?"
        out += [(p, role, t) for p, t in _strings(m, f"messages[{k}]")]
    for k, d in enumerate(canonical.get("documents") or ()):
        out += [(p, "document", t) for p, t in _strings(d, f"documents[{k}]")]
    return tuple(out)


def _fit_drops(decisions: Mapping[str, Any], rid: str, at: str | None) -> list[Drop]:
    out = []
    for d in decisions.get("decisions") or ():
        if not isinstance(d, Mapping) or d.get("kept") or d.get("kind") == "generation":
            continue
        segment = str(d.get("segment"))
        m = re.fullmatch(r"history\[(\d+):(\d+)\]", segment)
        parts = tuple(f"messages[{i}]" for i in range(int(m.group(1)), int(m.group(2)))) if m else (segment,)
        detail = f"{d.get('reason')} (budget {decisions.get('budget')}, policy sha256 {decisions.get('policy_sha256')})"
        out.append(Drop("fit", f"fit decision {segment}", parts, detail, rid, at))
    return out


def _compaction_drop(c: Mapping[str, Any], rid: str) -> Drop:
    plan, cut = c.get("plan") or {}, c.get("cut") or {}
    summarized = [s for s in c.get("summarized") or () if isinstance(s, Mapping)]
    parts = tuple(f"messages[{s['index']}]" for s in summarized)
    digest = (c.get("summary") or {}).get("sha256")
    detail = (
        f"summarized {len(parts)} message(s) before the cut at messages[{cut.get('first_kept_index')}] "
        f"(firstKeptEntryId {cut.get('first_kept_entry_id')!r}); tokens {plan.get('tokens_before')} -> "
        f"{c.get('tokens_after') or plan.get('estimated_tokens_after')}"
        + (f"; summary sha256 {digest[:16]}…" if digest else "")
    )
    entries = tuple((f"messages[{s['index']}]", str(s["entry_id"])) for s in summarized if s.get("entry_id"))
    applied = bool(c.get("applied"))
    return Drop("compaction", f"compaction plan ({c.get('reason')})", parts, detail, rid, c.get("at"), applied, entries)


def origin_of_record(rid: str, data: Mapping[str, Any], at: str | None = None) -> Origin:
    """A record's request as received, with its fit decisions (`decisions.budget`) and compaction (`compaction`)."""
    canonical = (data.get("request") or {}).get("canonical") or {}
    decisions = data.get("decisions") or {}
    drops: list[Drop] = []
    if isinstance(decisions.get("budget"), Mapping):
        drops += _fit_drops(decisions["budget"], rid, at)
    if isinstance(data.get("compaction"), Mapping):
        drops.append(_compaction_drop(data["compaction"], rid))
    return Origin(f"record {rid[:12]}", _canonical_strings(canonical), tuple(drops))
