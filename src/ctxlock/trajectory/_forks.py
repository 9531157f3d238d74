"""Forks: where the trajectory's ids and the canonical render of the whole conversation part (docs/trajectories.md).

The two id sequences are aligned (`difflib.SequenceMatcher`, no junk heuristic) and every run that is not shared is
one fork: the step and part of the trajectory where it is, the token spans on both sides (with the canonical side's
characters), both sides' ids and text, and the cause:

- `retokenization`: the same bytes, other ids (the engine's pieces are not the ones the tokenizer would choose);
- `rerender`: in a completion whose parsed message the template renders otherwise than the engine wrote it, even as
  the last turn (a tool call's JSON spacing, whitespace around reasoning, a call the parser did not release);
- `history-rewrite`: text the template wrote (or reproduced) when its turn was the last, and writes otherwise once
  later turns follow (Qwen3 drops earlier reasoning, gpt-oss the analysis of a turn a final answer follows; a
  generation prompt that is not how the template starts the turn);
- `other`: anything else (text a located delta could not place).

The trainer uses the trajectory's side (`used`): the ids the model saw and wrote. A trainer that re-renders the
conversation would use the canonical side.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from ctxlock.caches import LRU
from ctxlock.errors import CtxlockError

if TYPE_CHECKING:
    from ctxlock.accounting import Layout
    from ctxlock.tokenizer import Tokenizer


class Step(Protocol):
    """What the forks read of a trajectory's step (`ctxlock.trajectory.Step`)."""

    @property
    def index(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def how(self) -> str: ...

    @property
    def agrees(self) -> int: ...

    @property
    def last_turn(self) -> bytes: ...


CAUSES = ("retokenization", "rerender", "history-rewrite", "other")
# Each vocabulary's bytes per id (False: a vocabulary without per-token bytes), by the tokenizer's sha256.
_PIECES: LRU[str, tuple[bytes, ...] | Literal[False]] = LRU("trajectory.pieces", max_items=4, scope="artifact")


class Pieces:
    """Each id's bytes: the vocabulary's pieces (control tokens as their text), else each id decoded alone."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        hit = _PIECES.get(tokenizer.sha256)  # a vocabulary's bytes take about a second to build: once per process
        if hit is None:
            try:
                hit = tokenizer.token_bytes().pieces
            except CtxlockError:
                hit = False
            _PIECES.put(tokenizer.sha256, hit)
        self.pieces: tuple[bytes, ...] | None = hit or None

    def lengths(self, ids: Sequence[int]) -> np.ndarray:
        """The byte offset of each id's start, and the total at the end (len(ids) + 1 values)."""
        sizes = [len(self.join([i])) for i in ids]
        return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]) if sizes else np.zeros(1, dtype=np.int64)

    def join(self, ids: Sequence[int]) -> bytes:
        if self.pieces is not None:
            return b"".join(self.pieces[i] for i in ids)
        return self.tokenizer.decode(list(ids)).encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Fork:
    """One place where the trajectory and the canonical render part. Spans are [start, end) token indices."""

    step: int
    part: str
    cause: str
    trajectory_tokens: tuple[int, int]
    canonical_tokens: tuple[int, int]
    canonical_chars: tuple[int, int]
    trajectory_ids: tuple[int, ...]
    canonical_ids: tuple[int, ...]
    trajectory_text: str
    canonical_text: str
    detail: str
    used: str = "trajectory"

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "part": self.part,
            "cause": self.cause,
            "used": self.used,
            "trajectory": {
                "tokens": list(self.trajectory_tokens),
                "ids": list(self.trajectory_ids),
                "text": self.trajectory_text,
            },
            "canonical": {
                "tokens": list(self.canonical_tokens),
                "chars": list(self.canonical_chars),
                "ids": list(self.canonical_ids),
                "text": self.canonical_text,
            },
            "detail": self.detail,
        }


def find_forks(
    ids: list[int],
    canonical: list[int],
    steps: Sequence[Step],
    pieces: Pieces,
    lay: Layout,
    ends_with_prompt: bool,
) -> tuple[list[Fork], list[str]]:
    """Every fork between the trajectory `ids` and the `canonical` ids (laid over their text by `lay`)."""
    notes: list[str] = []
    n = len(canonical)
    # The canonical render of a conversation that ends with an assistant turn may go on past the engine's last id
    # with the template's closing: that tail is not a fork, and a note says so.
    ops = _opcodes(ids, canonical, notes)
    if not ends_with_prompt and ops and ops[-1][0] == "insert" and ops[-1][1] == len(ids):
        _, _, _, j1, j2 = ops.pop()
        text = pieces.join(canonical[j1:j2]).decode("utf-8", "replace")
        notes.append(
            f"the canonical render goes on past the trajectory's last id with {j2 - j1} token(s) of the template's "
            f"closing ({text!r}): not part of the trajectory, not a fork"
        )
        n = j1
    forks = []
    owner = _owners(steps, len(ids))
    offsets = pieces.lengths(ids)
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        ours, theirs = pieces.join(ids[i1:i2]), pieces.join(canonical[j1:j2])
        # The fork belongs to the token where the bytes first differ (a merged token may start earlier): one of its
        # own, or the token after it when the canonical side only adds bytes after the trajectory's (text inserted
        # before that token, as an insertion with no trajectory token is).
        same = _shared(ours, theirs)
        byte = int(offsets[i1]) + (same if ours != theirs else 0)
        last = i2 if same == len(ours) < len(theirs) and i2 < len(ids) else max(i2 - 1, i1)
        at = min(max(int(np.searchsorted(offsets, byte, side="right")) - 1, i1), last, len(ids) - 1)
        step = steps[owner[at]]
        local = byte - int(offsets[step.start])
        cause, detail = _cause(ours, theirs, same, step, i1 <= step.start <= at, local)
        c1 = _char(lay, int(lay.starts[j1]) if j1 < len(canonical) else int(lay.offsets[-1]))
        c2 = _char(lay, int(lay.ends[j2 - 1])) if j2 > j1 else c1
        forks.append(
            Fork(
                step=step.index,
                part=_part(step),
                cause=cause,
                trajectory_tokens=(i1, i2),
                canonical_tokens=(j1, min(j2, n)),
                canonical_chars=(c1, c2),
                trajectory_ids=tuple(ids[i1:i2]),
                canonical_ids=tuple(canonical[j1:j2]),
                trajectory_text=ours.decode("utf-8", "replace"),
                canonical_text=lay.rendered.text[c1:c2],
                detail=detail,
            )
        )
    return forks, notes


# The exact alignment's inner loop visits, for each token of one side, every place its id holds in the other: a
# long run of one id on both sides (a tool's output of 100,000 "x") makes it quadratic (minutes for one line).
# Past this many visits, the shared head and tail are taken as they are and the rest is aligned with difflib's
# popular-id heuristic (https://docs.python.org/3/library/difflib.html#difflib.SequenceMatcher, autojunk), and a
# note says so.
MAX_ALIGN_WORK = 10_000_000


def _opcodes(ids: list[int], canonical: list[int], notes: list[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib's opcodes from `ids` to `canonical`: exact, or bounded (see MAX_ALIGN_WORK) with a note."""
    counts: dict[int, int] = {}
    for i in canonical:
        counts[i] = counts.get(i, 0) + 1
    work = sum(counts.get(i, 0) for i in ids)
    if work <= MAX_ALIGN_WORK:
        return list(difflib.SequenceMatcher(None, ids, canonical, autojunk=False).get_opcodes())
    head = 0
    while head < min(len(ids), len(canonical)) and ids[head] == canonical[head]:
        head += 1
    tail = 0
    while tail < min(len(ids), len(canonical)) - head and ids[-1 - tail] == canonical[-1 - tail]:
        tail += 1
    a, b = ids[head : len(ids) - tail], canonical[head : len(canonical) - tail]
    inner = difflib.SequenceMatcher(None, a, b, autojunk=True).get_opcodes()
    notes.append(
        f"the trajectory and the canonical render repeat ids too much to align exactly in bounded time ({work:,} "
        f"comparisons, over {MAX_ALIGN_WORK:,}): between their shared head ({head} tokens) and tail ({tail}) the "
        "forks were found with difflib's popular-id heuristic and may be coarser than the exact ones"
    )
    ops: list[tuple[str, int, int, int, int]] = [("equal", 0, head, 0, head)] if head else []
    ops += [(tag, i1 + head, i2 + head, j1 + head, j2 + head) for tag, i1, i2, j1, j2 in inner]
    if tail:
        ops.append(("equal", len(ids) - tail, len(ids), len(canonical) - tail, len(canonical)))
    return ops


def _owners(steps: Sequence[Step], n: int) -> np.ndarray:
    owner = np.zeros(max(n, 1), dtype=np.int64)
    for k, s in enumerate(steps):
        owner[s.start : s.end] = k
    return owner


def _part(step: Step) -> str:
    return {"prompt": "prompt", "completion": "completion"}.get(step.kind, "delta")


def _shared(a: bytes, b: bytes) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _cause(ours: bytes, theirs: bytes, same: int, step: Step, at_start: bool, local: int) -> tuple[str, str]:
    """The cause of a fork whose bytes first differ `local` bytes into its step (`same` bytes into both sides);
    `at_start`: the fork spans the step's first token."""
    if ours == theirs:
        return "retokenization", "the same bytes as other ids: decoding and re-encoding would change the ids"
    if step.kind == "completion":
        # A history rewrite is text the template wrote as the engine did while the turn was the last: not where the
        # last-turn render already reads as the canonical side does (a shared character there, such as the `<` of
        # `<tool_call>` and `</assistant>`, is no agreement).
        rest = theirs[same:]
        if local < step.agrees and not (rest and step.last_turn.startswith(rest, local)):
            return "history-rewrite", (
                "the template wrote this completion as the engine did while it was the last turn, and writes it "
                "otherwise once later turns follow"
            )
        return "rerender", "the template renders the parsed message otherwise than the engine wrote it"
    if step.kind == "messages" and step.how == "located" and at_start:
        return "other", "at the start of a delta the template's rewrite made ctxlock locate"
    return "history-rewrite", (
        "the template wrote this text (a message, or the generation prompt the model answered) when it was appended, "
        "and writes it otherwise in the whole conversation"
    )


def _char(lay: Layout, byte: int) -> int:
    return int(np.searchsorted(lay.offsets, byte, side="left"))
