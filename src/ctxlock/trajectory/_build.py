"""Building a token-in/token-out trajectory (docs/trajectories.md).

The trajectory is the ids a multi-turn RL trainer trains on, kept as the model saw and wrote them:

1. **the prompt**: the render of the first messages with the generation prompt, tokenized (`Model.render`'s ids);
2. **each completion**: the ids the engine returned, appended as they are (never decoded and re-encoded), with
   their log-probs when given; the assistant message is rebuilt from them by the model's reasoning and tool-call
   parsers (`ctxlock.generation.parse_output`, the formats read from the chat template) and joins the conversation;
3. **each new tool or user turn**: only the template's delta, the tokens the template writes between the end of the
   assistant's ids and the next generation prompt. The conversation with the new messages is rendered with the
   generation prompt (N) and laid over its tokens; when N starts with the text the trajectory holds for the last
   turn (the canonical prompt that turn answered, then the completion's text) the delta is N's tokens from there:
   exact. When it does not (the template rewrites the turn once it is history), the delta is located after the
   assistant message's last character in N (past the part of the closing the completion already wrote; an engine's
   end-of-turn token the template writes as another control token counts as that one) and the step says "located".

`Trajectory.result()` compares the whole trajectory with the canonical render of the whole conversation (the
assistant turns as parsed messages) and names every fork (`ctxlock.trajectory._forks`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxlock import accounting, generation
from ctxlock.errors import CtxlockError, ReasoningError, TrajectoryError
from ctxlock.tokenizer import control_matches
from ctxlock.trajectory._forks import Fork, Pieces, find_forks

if TYPE_CHECKING:
    from ctxlock.accounting import Layout
    from ctxlock.generation import ParsedMessage
    from ctxlock.model import Model

PARTS = ("prompt", "completion", "delta")
MAX_STEPS = 4096  # steps of one trajectory (a bound on hostile input; each step renders the conversation once)
_ROLES = ("user", "tool", "system", "developer", "ipython")


@dataclass(frozen=True)
class Step:
    """One step: the prompt (step 0), a completion or new messages; its token range in the trajectory, how its
    tokens were made (`how`: "render", "engine", "exact" or "located") and what a reader must know."""

    index: int
    kind: str
    start: int
    end: int
    how: str
    message: dict[str, Any] | None = None
    reproduces: bool | None = None  # a completion: the template renders its parsed message as the engine wrote it
    agrees: int = 0  # a completion: how many of its bytes the template writes so while it is the last turn
    notes: tuple[str, ...] = ()
    # A completion: what the template writes from the prompt's end on while it is the last turn (its parsed message,
    # no generation prompt), in bytes; empty when that render does not start with the prompt.
    last_turn: bytes = field(default=b"", repr=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.index, "kind": self.kind, "tokens": [self.start, self.end], "how": self.how}
        if self.message is not None:
            out["message"] = self.message
        if self.reproduces is not None:
            out["reproduces"] = self.reproduces
        out["notes"] = list(self.notes)
        return out


@dataclass(frozen=True)
class TrajectoryResult:
    """The trajectory's per-token arrays (`ids` int64, `loss_mask` int8: 1 only on the engine's own tokens,
    `logprobs` float64: NaN where none was given or the token is not the engine's, `step` int32 and `part` int8
    into `PARTS`: each token's provenance), its steps, the forks from the canonical render and notes."""

    ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    step: np.ndarray
    part: np.ndarray
    steps: tuple[Step, ...]
    forks: tuple[Fork, ...]
    canonical_ids: tuple[int, ...]
    conversation: dict[str, Any]
    notes: tuple[str, ...] = ()

    @property
    def parts(self) -> list[str]:
        return [PARTS[int(k)] for k in self.part]

    @property
    def identical(self) -> bool:
        """The trajectory's ids are the canonical render's (then there is no fork)."""
        return list(self.ids) == list(self.canonical_ids)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`ctxlock trajectory --json`): log-probs not given are null."""
        return {
            "ids": self.ids.tolist(),
            "loss_mask": self.loss_mask.tolist(),
            "logprobs": [None if math.isnan(x) else x for x in self.logprobs.tolist()],
            "provenance": {"step": self.step.tolist(), "part": self.parts},
            "steps": [s.to_dict() for s in self.steps],
            "canonical": {"tokens": len(self.canonical_ids), "identical": self.identical},
            "forks": [f.to_dict() for f in self.forks],
            "conversation": self.conversation,
            "notes": list(self.notes),
        }


@dataclass
class _Pending:
    """The last completion, for the delta that follows it: the canonical prompt it answered, its text, the index of
    its message, its last id's text when that id is a control token (else "")."""

    prompt: str
    text: str
    message: int
    end_control: str


@dataclass
class Trajectory:
    """Build a trajectory step by step: `Trajectory(model, request)` renders the prompt; `complete(ids)` appends an
    engine's completion; `add(messages)` appends the template's delta for new tool or user messages; `result()`
    gives the arrays and the forks. `render_options` are `Model.render`'s (never `add_generation_prompt`)."""

    model: Model
    request: Mapping[str, Any]
    render_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "add_generation_prompt" in self.render_options or "continue_final_message" in self.render_options:
            raise TrajectoryError(
                "a trajectory chooses the generation prompt itself",
                path="render_options",
                hint="drop add_generation_prompt and continue_final_message",
            )
        data = json.loads(self.model.parse(self.request).to_json())
        if not data.get("messages"):
            raise TrajectoryError("the prompt has no messages", path="messages", hint="give the first messages")
        self._data: dict[str, Any] = data
        lay = self._lay(data, True)
        self._prompt = lay.rendered.text
        self._ids: list[int] = [int(i) for i in lay.ids]
        self._logprobs: list[float] = [math.nan] * len(self._ids)
        self._mask: list[int] = [0] * len(self._ids)
        self._step: list[int] = [0] * len(self._ids)
        self._part: list[int] = [0] * len(self._ids)
        self._steps: list[Step] = [Step(0, "prompt", 0, len(self._ids), "render")]
        self._pending: _Pending | None = None
        self._pieces = Pieces(self.model.tokenizer)
        tool, reasoning, note = generation.formats_for_template(lay.rendered.template.source)
        self._formats = (tool, reasoning)
        self._notes: list[str] = [note]

    # -- the steps --------------------------------------------------------------------------------------------------

    def complete(
        self, ids: Sequence[int], logprobs: Sequence[float | None] | None = None, finish_reason: str | None = "stop"
    ) -> ParsedMessage:
        """Append an engine's completion: `ids` as the engine returned them (an end-of-turn id included or not),
        `logprobs` one per id (None for one not given). Returns the assistant message parsed from the ids."""
        if self._pending is not None:
            raise TrajectoryError(
                "two completions in a row: the model has no generation prompt to answer",
                path=f"steps[{len(self._steps) - 1}]",
                hint="add the tool or user messages between them",
            )
        where = f"steps[{len(self._steps) - 1}]"
        ids = _checked_ids(ids, self.model.tokenizer.vocab_size, f"{where}.completion_ids")
        probs = _checked_logprobs(logprobs, len(ids), f"{where}.logprobs")
        text = self.model.tokenizer.decode(ids)
        parsed, notes = self._parse(ids, text, finish_reason)
        message = parsed.to_openai()
        if message.get("content") is None:
            # OpenAI's null content beside tool calls: chat templates read content as a string.
            message["content"] = ""
        data = {**self._data, "messages": [*self._data["messages"], message]}
        again = self.model.render(data, **self.render_options, add_generation_prompt=False).text
        reproduces = again.startswith(self._prompt + text)
        agrees = len(text[: _shared(again[len(self._prompt) :], text)].encode("utf-8", "surrogatepass"))
        last_turn = again[len(self._prompt) :].encode("utf-8", "surrogatepass")
        if not again.startswith(self._prompt):
            agrees, last_turn = 0, b""
        if not reproduces:
            notes.append(
                "the template renders the parsed message otherwise than the engine wrote it: the trajectory keeps "
                "the engine's ids (see the forks)"
            )
        index = len(self._steps)
        start = len(self._ids)
        self._append(ids, probs, index, 1, trained=True)
        last = self.model.tokenizer.id_to_token(ids[-1])
        control = last if last is not None and last in self.model.tokenizer.control_tokens else ""
        self._pending = _Pending(self._prompt, text, len(data["messages"]) - 1, control)
        self._data = data
        self._steps.append(
            Step(
                index,
                "completion",
                start,
                len(self._ids),
                "engine",
                message,
                reproduces,
                agrees,
                tuple(notes),
                last_turn,
            )
        )
        return parsed

    def add(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Append the template's delta for new messages (tool results, a user turn) that follow a completion."""
        where = f"steps[{len(self._steps) - 1}].messages"
        pending = self._pending
        if pending is None:
            raise TrajectoryError(
                "new messages must follow a completion (the prompt's messages are the request's)",
                path=where,
                hint="put them in the first messages, or after a completion step",
            )
        if not isinstance(messages, Sequence) or isinstance(messages, str | bytes) or not messages:
            raise TrajectoryError("expected a non-empty list of messages", path=where)
        for k, m in enumerate(messages):
            if not isinstance(m, Mapping) or m.get("role") not in _ROLES:
                raise TrajectoryError(
                    f"message {k} is not a message of role {', '.join(_ROLES)}",
                    path=f"{where}[{k}]",
                    hint="an assistant turn is a completion step: give its ids",
                )
        new, id_notes = _tool_call_ids(self._data["messages"][-1], messages, where)
        data = {**self._data, "messages": [*self._data["messages"], *new]}
        try:
            data = json.loads(self.model.parse(data).to_json())
        except CtxlockError as exc:
            raise TrajectoryError(f"the new messages do not make a request: {exc.message}", path=where) from None
        lay = self._lay(data, True)
        start_char, how, notes = _delta_start(lay, pending, self.model)
        notes = [*id_notes, *notes]
        delta = _delta_ids(lay, start_char, self.model, notes)
        index = len(self._steps)
        start = len(self._ids)
        self._append(delta, [math.nan] * len(delta), index, 2, trained=False)
        self._steps.append(Step(index, "messages", start, len(self._ids), how, notes=tuple(notes)))
        self._data = data
        self._prompt = lay.rendered.text
        self._pending = None

    def result(self) -> TrajectoryResult:
        """The arrays, and the forks from the canonical render of the whole conversation (with the generation
        prompt when the trajectory ends with one)."""
        ends_with_prompt = self._pending is None
        lay = self._lay(self._data, ends_with_prompt)
        canonical = [int(i) for i in lay.ids]
        forks, notes = find_forks(self._ids, canonical, self._steps, self._pieces, lay, ends_with_prompt)
        return TrajectoryResult(
            ids=_frozen(np.asarray(self._ids, dtype=np.int64)),
            loss_mask=_frozen(np.asarray(self._mask, dtype=np.int8)),
            logprobs=_frozen(np.asarray(self._logprobs, dtype=np.float64)),
            step=_frozen(np.asarray(self._step, dtype=np.int32)),
            part=_frozen(np.asarray(self._part, dtype=np.int8)),
            steps=tuple(self._steps),
            forks=tuple(forks),
            canonical_ids=tuple(canonical),
            conversation=self._data,
            notes=(*self._notes, *notes),
        )

    # -- helpers ----------------------------------------------------------------------------------------------------

    def _lay(self, data: dict[str, Any], prompt: bool) -> Layout:
        return accounting.layout(self.model, data, **self.render_options, add_generation_prompt=prompt)

    def _append(self, ids: Sequence[int], probs: Sequence[float], step: int, part: int, *, trained: bool) -> None:
        self._ids += ids
        self._logprobs += probs
        self._mask += [int(trained)] * len(ids)
        self._step += [step] * len(ids)
        self._part += [part] * len(ids)

    def _parse(self, ids: list[int], text: str, finish_reason: str | None) -> tuple[ParsedMessage, list[str]]:
        """The assistant message of `ids`, by the template's formats; over the text when the reasoning markers are
        not single tokens of this vocabulary (the notes say so)."""
        tool, reasoning = self._formats
        tools = self._data.get("tools")
        eos = self.model.special_tokens.get("eos_token")
        options: dict[str, Any] = {
            "tool_format": tool,
            "reasoning": reasoning,
            "tools": tools,
            "finish_reason": finish_reason,
            "prompt": self._prompt,
            "end_tokens": (*generation.END_TOKENS, *([eos] if eos else [])),
        }
        notes: list[str] = []
        try:
            parsed = generation.parse_output(ids, tokenizer=self.model.tokenizer, **options)
        except ReasoningError as exc:
            parsed = generation.parse_output(text, **options)
            notes.append(f"parsed from the decoded text: {exc.message}")
        for err in parsed.errors:
            notes.append(f"a call was not released ({err.message}): the message carries no such call")
        return parsed, [*notes, *parsed.notes]


def _tool_call_ids(
    assistant: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], where: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """The new messages, a tool result without `tool_call_id` given the id of the call at its place (the k-th tool
    result of the step answers the completion's k-th call, as engines and RL frameworks pair them), and notes: each
    id filled in, and each id given that names no call of this completion but one of an earlier turn (kept as given;
    an id naming no call at all is the request check's error)."""
    calls = [c for c in assistant.get("tool_calls") or [] if isinstance(c, Mapping)]
    ids = [str(c.get("id")) for c in calls]
    out: list[dict[str, Any]] = []
    notes: list[str] = []
    k = 0
    for n, m in enumerate(messages):
        message = dict(m)
        if message.get("role") == "tool":
            if message.get("tool_call_id") is None and k < len(calls):
                message["tool_call_id"] = ids[k]
                name = (calls[k].get("function") or {}).get("name")
                notes.append(
                    f"{where}[{n}].tool_call_id: filled with {ids[k]!r}, the id of the completion's call {k} ({name})"
                )
            elif message.get("tool_call_id") is not None and str(message["tool_call_id"]) not in ids:
                notes.append(
                    f"{where}[{n}].tool_call_id {message['tool_call_id']!r} names no call of the completion before it "
                    f"(its calls' ids: {', '.join(map(repr, ids)) or 'none'}), but an earlier turn's; kept as given"
                )
            k += 1
        out.append(message)
    return out, notes


def _delta_start(lay: Layout, pending: _Pending, model: Model) -> tuple[int, str, list[str]]:
    """Where, in the render N with the new messages and the generation prompt, the template's delta starts."""
    text = lay.rendered.text
    seen = pending.prompt + pending.text
    if text.startswith(seen):
        return len(seen), "exact", []
    source = f"messages[{pending.message}]"
    ends = [
        s.end
        for s in lay.rendered.request_spans
        if accounting.part_of(s.path) == source and s.path != f"{source}.name" and s.end > s.start
    ]
    notes = [
        "the render with the new messages does not start with the trajectory's text for the last turn (the template "
        "rewrites it once it is history): the delta is located after the assistant message's last character"
    ]
    if not ends:
        k = _shared(text, seen)
        notes.append(
            "the template wrote none of the assistant message's strings: the delta starts where the texts part"
        )
        return k, "located", notes
    end = max(ends)
    rest = text[end:]
    overlap = _overlap(pending.text, rest)
    if overlap == 0 and pending.end_control:
        # The completion ends with an end-of-turn token the template does not write there: past the part of the
        # closing the completion wrote before it (the `}` that closes a GigaChat call), the template's own control
        # token stands for it.
        at = end + _overlap(pending.text.removesuffix(pending.end_control), rest)
        match = next((m for m in control_matches(lay.rendered, model.tokenizer) if m.start == at), None)
        if match is not None:
            notes.append(
                f"the engine's end-of-turn token stands where the template writes {text[match.start : match.end]!r} "
                "in history: the delta starts after it"
            )
            return match.end, "located", notes
    return end + overlap, "located", notes


def _overlap(text: str, rest: str) -> int:
    """The length of the longest start of `rest` that `text` ends with."""
    return next((n for n in range(min(len(rest), len(text)), 0, -1) if text.endswith(rest[:n])), 0)


def _delta_ids(lay: Layout, start_char: int, model: Model, notes: list[str]) -> list[int]:
    """N's tokens from character `start_char` on; when a token of N straddles it, the straddling token's rest is
    encoded on its own (plain text) and the note says so."""
    ids = [int(i) for i in lay.ids]
    byte = int(lay.offsets[start_char])
    j = int(np.searchsorted(lay.starts, byte, side="left"))
    if j < len(ids) and int(lay.starts[j]) == byte:
        return ids[j:]
    if j >= len(ids) and (not len(ids) or int(lay.ends[-1]) <= byte):
        return []
    t = j - 1  # the token that straddles the start
    end_char = int(np.searchsorted(lay.offsets, int(lay.ends[t]), side="left"))
    piece = lay.rendered.text[start_char:end_char]
    notes.append(
        f"the delta starts inside a token of the render ({piece!r} is the rest of it): that rest is encoded on its own"
    )
    return [*model.tokenizer.encode_text(piece, at_start=False), *ids[t + 1 :]]


def _shared(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _checked_ids(ids: Any, size: int, where: str) -> list[int]:
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence | np.ndarray):
        raise TrajectoryError("expected a list of token ids", path=where)
    out = []
    for k, i in enumerate(ids):
        if isinstance(i, np.integer):
            i = int(i)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size:
            raise TrajectoryError(
                f"{_shown(i)} is not a token id of this vocabulary",
                path=f"{where}[{k}]",
                hint=f"ids are in [0, {size})",
            )
        out.append(i)
    if not out:
        raise TrajectoryError("a completion of no ids", path=where, hint="an empty completion has nothing to train")
    return out


def _checked_logprobs(probs: Any, n: int, where: str) -> list[float]:
    if probs is None:
        return [math.nan] * n
    if isinstance(probs, str | bytes) or not isinstance(probs, Sequence | np.ndarray) or len(probs) != n:
        raise TrajectoryError(f"expected a list of {n} log-probs (one per id, null for none)", path=where)
    out = []
    for k, p in enumerate(probs):
        if p is None:
            out.append(math.nan)
            continue
        # An integer past a float's range (JSON allows 1e400 written out) is no log-probability either.
        value = _float_or_none(p)
        if value is None or not math.isfinite(value) or value > 0:
            raise TrajectoryError(f"{_shown(p)} is not a log-probability (a finite number <= 0)", path=f"{where}[{k}]")
        out.append(value)
    return out


def _shown(value: Any) -> str:
    """A hostile value in an error message, cut to 40 characters (a 1 MB string would make a 1 MB line)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4,300-digit str() limit
        return f"an integer of about {value.bit_length() * 0.30103:,.0f} digits" if isinstance(value, int) else "?"
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text):,} chars)"


def _float_or_none(p: Any) -> float | None:
    if isinstance(p, bool) or not isinstance(p, int | float | np.floating | np.integer):
        return None
    try:
        return float(p)
    except OverflowError:
        return None


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a
