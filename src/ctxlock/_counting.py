"""The counting service: exact token counts of rendered texts, for the stages that count many similar texts (budget
fits candidate after candidate, compaction measures conversation prefixes).

    counter = TokenCounter(tokenizer)
    counter.rebase(rendered)   # count a text, and compare the texts counted next with it
    counter.count(rendered)    # len(tokenize(rendered, tokenizer).ids), exactly

**Reference path.** With `CTXLOCK_FAST=0`, or inside `settings.reference_path()` when the counter is made, every
count is the tokenizer stage itself: `len(tokenize(rendered, tokenizer).ids)`.

**Fast path.** The tokenizer stage splits a text at its control tokens and encodes the runs between them on their
own (HF extracts added tokens before it normalizes; Tekken, SentencePiece, tiktoken files and the book tokenizer
encode the text between special tokens on its own), so a text's count is its control tokens plus the lengths of its
runs, and a run's ids depend only on its text and on whether it starts the text (a dummy prefix). Runs go through the
process-wide run cache (`tokenizer.runs`), shared with the tokenizer stage: a run counted once, by any stage, is not
encoded again.

Counting goes further against the base text (the last `rebase`): a text differs from it only around the part that
changed, so only the runs that overlap the difference are looked at. The control-token split of a text is a
left-to-right scan of a leftmost-longest alternation: a match decision at offset t depends only on text[t:t+L]
(L = the longest control token), so every split before the first difference minus L is shared with the base; after
the difference, the scan of the text is back in step with the base's as soon as it ends a control token inside the
common suffix at an offset where the base also ends one. The rest is the base's count. A conversation prefix of the
base (compaction's T(i)) costs the scan of its last run or two; a candidate with one more history turn (budget)
costs the runs of that turn.

The split is done here only when it provably finds what the tokenizer extracts (as `HFTokenizer.split_controls`
proves it): every control token is matched on raw text as it is (no `normalized`, `lstrip`, `rstrip`,
`single_word`), no two share a string, and no other added token can overlap one. Otherwise, and for a text holding
request-sourced control strings (`rendered.untrusted`), the count is the tokenizer stage's.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .settings import fast_enabled
from .template import Rendered
from .tokenizer import AddedToken, Tokenizer, tokenize
from .tokenizer.runs import run_encoder
from .trie import longest_first


def splittable(added: Sequence[AddedToken]) -> bool:
    """Whether a leftmost-longest alternation of the control tokens among `added` finds exactly the control tokens
    the tokenizer extracts, with the other added tokens left to `encode_text` inside each run."""
    controls = [t for t in added if t.control]
    if any(t.normalized or t.lstrip or t.rstrip or t.single_word for t in controls):
        return False
    contents = [t.content for t in controls]
    if len(set(contents)) != len(contents):
        return False  # one string, two ids: the choice is the tokenizer's
    others = [t.content for t in added if not t.control]
    for c in contents:
        for o in others:
            if c in o or o in c:
                return False
            if any(c.endswith(o[:k]) or o.endswith(c[:k]) for k in range(1, min(len(c), len(o)))):
                return False
    return True


@dataclass(frozen=True)
class _Base:
    """A counted text split at its control tokens: where each starts and ends, and how many tokens the text holds up
    to and including it."""

    text: str
    starts: list[int]
    ends: list[int]  # parallel to starts
    cum: list[int]  # parallel to starts
    cum_at_end: dict[int, int]  # control-token end offset -> tokens up to and including that control token
    total: int


class TokenCounter:
    """Exact token counts of rendered texts for one tokenizer (see the module docstring). Not thread-safe: one per
    fit or plan."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._base: _Base | None = None
        self._regex: re.Pattern[str] | None = None
        self._ids: dict[str, int] = {}
        self._longest = 0
        # None: every count is the tokenizer stage's (the reference path, or a split this module cannot prove).
        self._encode: Any = None
        if fast_enabled() and splittable(tokenizer.added_tokens):
            controls = [t for t in tokenizer.added_tokens if t.control]
            self._regex = longest_first(t.content for t in controls)
            self._ids = {t.content: t.id for t in controls}
            self._longest = max((len(t.content) for t in controls), default=0)
            self._encode = run_encoder(tokenizer)

    def count(self, rendered: Rendered) -> int:
        """`len(tokenize(rendered, tokenizer).ids)`, looking only at what differs from the base when there is one."""
        if self._encode is None or rendered.untrusted:
            return len(tokenize(rendered, self.tokenizer).ids)
        if self._base is not None and self._regex is not None:
            return self._against_base(rendered.text, self._base)
        return self._scan(rendered.text, 0, 0)

    def rebase(self, rendered: Rendered) -> int:
        """Count `rendered` and make it the text later counts are compared with."""
        self._base = None
        if self._encode is None or rendered.untrusted or self._regex is None:
            return self.count(rendered)
        text = rendered.text
        starts: list[int] = []
        ends: list[int] = []
        cum: list[int] = []
        n = 0
        pos = 0
        for m in self._regex.finditer(text):
            if m.start() > pos:
                n += len(self._encode(text[pos : m.start()], pos == 0))
            n += 1
            starts.append(m.start())
            ends.append(m.end())
            cum.append(n)
            pos = m.end()
        if pos < len(text):
            n += len(self._encode(text[pos:], pos == 0))
        self._base = _Base(text, starts, ends, cum, dict(zip(ends, cum, strict=True)), n)
        return n

    def _scan(self, text: str, pos: int, n: int) -> int:
        """`n` plus the tokens of `text[pos:]`, where `pos` is 0 or the end of a control token."""
        if self._regex is not None:
            for m in self._regex.finditer(text, pos):
                if m.start() > pos:
                    n += len(self._encode(text[pos : m.start()], pos == 0))
                n += 1
                pos = m.end()
        if pos < len(text):
            n += len(self._encode(text[pos:], pos == 0))
        return n

    def _against_base(self, text: str, base: _Base) -> int:
        assert self._regex is not None
        old = base.text
        p = common_prefix(old, text)
        q = _common_suffix(old, text, min(len(old), len(text)) - p)
        # The last base control token whose scan decision cannot see the difference; everything before it is shared.
        k = bisect.bisect_right(base.starts, p - self._longest) - 1
        pos = base.ends[k] if k >= 0 else 0
        n = base.cum[k] if k >= 0 else 0
        shift = len(text) - len(old)
        tail = len(text) - q
        for m in self._regex.finditer(text, pos):
            if m.start() > pos:
                n += len(self._encode(text[pos : m.start()], pos == 0))
            n += 1
            pos = m.end()
            if pos >= tail:
                synced = base.cum_at_end.get(pos - shift)
                if synced is not None:
                    return n + base.total - synced
        if pos < len(text):
            n += len(self._encode(text[pos:], pos == 0))
        return n


def common_prefix(a: str, b: str) -> int:
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


__all__ = ["TokenCounter", "common_prefix", "splittable"]
