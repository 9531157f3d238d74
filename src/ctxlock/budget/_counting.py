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

The split is done here only when it finds what the tokenizer extracts (`splittable`, the argument of
`HFTokenizer.split_controls`): every control token is matched on raw text (no `normalized`, `single_word`), no two
share a string, and no other added token can overlap one. An `lstrip`/`rstrip` control token takes the whitespace
beside it (Rust's `char::is_whitespace`, as `tokenizers` strips; `tests/security/test_sec_strip_tokens.py` checks
the counts against transformers); such a vocabulary is counted run by run without a base, since a stripping match
is not its literal string. Otherwise, and for a text holding request-sourced control strings (`rendered.untrusted`),
the count is the tokenizer stage's.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ctxlock.core import longest_first
from ctxlock.settings import fast_enabled
from ctxlock.template import Rendered
from ctxlock.tokenizer import AddedToken, Tokenizer, run_encoder, tokenize

# What `tokenizers` strips next to an lstrip/rstrip added token: Rust's `char::is_whitespace` (Unicode White_Space).
# Python's `str.isspace` also takes U+001C..U+001F, which the tokenizer keeps as text.
_STRIPPED_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def splittable(added: Sequence[AddedToken]) -> bool:
    """Whether a leftmost-longest alternation of the control tokens among `added` (each widened by the whitespace an
    lstrip/rstrip token takes) finds exactly the control tokens the tokenizer extracts, with the other added tokens
    left to `encode_text` inside each run."""
    controls = [t for t in added if t.control]
    if any(t.normalized or t.single_word for t in controls):
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
    ends: list[int]  # parallel to starts, increasing
    cum: list[int]  # parallel to starts
    total: int

    def spliced(self, text: str, k: int, scanned: _Scanned, j: int | None, shift: int, total: int) -> _Base:
        """The split of `text`, which shares this one's control tokens up to k, then has the `scanned` ones, then
        (when the scan came back in step at this one's control token j) this one's after j, moved by `shift`."""
        starts = self.starts[: k + 1] + scanned.starts
        ends = self.ends[: k + 1] + scanned.ends
        cum = self.cum[: k + 1] + scanned.cum
        if j is not None:
            delta = total - self.total
            starts += [x + shift for x in self.starts[j + 1 :]]
            ends += [x + shift for x in self.ends[j + 1 :]]
            cum += [x + delta for x in self.cum[j + 1 :]]
        return _Base(text, starts, ends, cum, total)


@dataclass
class _Scanned:
    """The control tokens a count scanned past the shared part: where each starts and ends, and the running count."""

    starts: list[int]
    ends: list[int]
    cum: list[int]


class TokenCounter:
    """Exact token counts of rendered texts for one tokenizer (see the module docstring). Not thread-safe: one per
    fit or plan."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._base: _Base | None = None
        # The last rendered text counted, its count, and how to make it the base without scanning it again.
        self._last: tuple[Rendered, int, Callable[[], _Base] | None] | None = None
        self._regex: re.Pattern[str] | None = None
        self._longest = 0
        # None: every count is the tokenizer stage's (the reference path, or a split this module cannot prove).
        self._encode: Any = None
        self._stripping: dict[str, AddedToken] = {}  # lstrip/rstrip control tokens by content
        if fast_enabled() and splittable(tokenizer.added_tokens):
            controls = [t for t in tokenizer.added_tokens if t.control]
            self._regex = longest_first(t.content for t in controls)
            self._longest = max((len(t.content) for t in controls), default=0)
            self._stripping = {t.content: t for t in controls if t.lstrip or t.rstrip}
            self._encode = run_encoder(tokenizer)
        # Counting against a base needs each control token to be exactly its match.
        self._incremental = self._regex is not None and not self._stripping

    def count(self, rendered: Rendered) -> int:
        """`len(tokenize(rendered, tokenizer).ids)`, looking only at what differs from the base when there is one."""
        text = rendered.text
        build: Callable[[], _Base] | None = None
        if self._encode is None or rendered.untrusted:
            n = len(tokenize(rendered, self.tokenizer).ids)
        elif self._base is not None:
            n, build = self._against_base(text, self._base)
        else:
            split = self._split(text)
            n = split.total
            if self._incremental:
                build = functools.partial(_unchanged, split)
        self._last = (rendered, n, build)
        return n

    def rebase(self, rendered: Rendered) -> int:
        """Count `rendered` and make it the text later counts are compared with (the text counted last is not
        counted again)."""
        last = self._last
        if last is None or last[0] is not rendered:
            self.count(rendered)
            last = self._last
            assert last is not None
        n, build = last[1], last[2]
        self._base = None if rendered.untrusted or build is None else build()
        return n

    def _split(self, text: str) -> _Base:
        """`text` scanned from its start: its control tokens and its count, run by run."""
        starts: list[int] = []
        ends: list[int] = []
        cum: list[int] = []
        n = 0
        pos = 0
        for m in self._regex.finditer(text) if self._regex is not None else ():
            start, end = m.start(), m.end()
            if self._stripping:
                start, end = self._widened(text, m.group(0), start, end, pos)
            if start > pos:
                n += len(self._encode(text[pos:start], pos == 0))
            n += 1
            starts.append(start)
            ends.append(end)
            cum.append(n)
            pos = end
        if pos < len(text):
            n += len(self._encode(text[pos:], pos == 0))
        return _Base(text, starts, ends, cum, n)

    def _widened(self, text: str, content: str, start: int, end: int, pos: int) -> tuple[int, int]:
        """A match with the whitespace its token strips (back to `pos` at most, the end of the previous one)."""
        token = self._stripping.get(content)
        if token is not None:
            if token.lstrip:
                while start > pos and text[start - 1] in _STRIPPED_WHITESPACE:
                    start -= 1
            if token.rstrip:
                while end < len(text) and text[end] in _STRIPPED_WHITESPACE:
                    end += 1
        return start, end

    def _against_base(self, text: str, base: _Base) -> tuple[int, Callable[[], _Base]]:
        """The count of `text` from the base's, and how to make `text` the base."""
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
        scanned = _Scanned([], [], [])
        for m in self._regex.finditer(text, pos):
            if m.start() > pos:
                n += len(self._encode(text[pos : m.start()], pos == 0))
            n += 1
            pos = m.end()
            scanned.starts.append(m.start())
            scanned.ends.append(pos)
            scanned.cum.append(n)
            if pos >= tail:
                # Back in step with the base where the base also ends a control token: the rest is the base's.
                j = bisect.bisect_left(base.ends, pos - shift)
                if j < len(base.ends) and base.ends[j] == pos - shift:
                    total = n + base.total - base.cum[j]
                    return total, functools.partial(base.spliced, text, k, scanned, j, shift, total)
        if pos < len(text):
            n += len(self._encode(text[pos:], pos == 0))
        return n, functools.partial(base.spliced, text, k, scanned, None, shift, n)


def _unchanged(base: _Base) -> _Base:
    return base


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
