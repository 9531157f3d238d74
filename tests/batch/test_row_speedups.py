"""The per-row speed-ups of `ctxlock batch`'s encode and mask steps (issue 21, acceptance 3) give what the plain code
gives.

- `fastbpe.nfc_inert` looks each code point up in a table instead of searching a regex of the inert class: the
  verdict must equal the regex's (the code it replaced, rebuilt here from the same spans) on every code point alone,
  on every span's boundary code points in context, and on generated text (astral characters, lone surrogates,
  combining marks, Hangul jamo and syllables).
- `_fastmask.region_mask` searches both ends of every region in one call and stops each straddling token's count at
  the first region past it: equal to `assign_owners` on the per-byte owners (as tests/training/test_masks_batch.py
  checks it), here with many small regions inside long tokens.
- `_fast_batch._offsets` finds the characters' first bytes in one comparison (int8, a NUL appended for the end):
  the code points' UTF-8 widths summed. `tokenlay.whole_lay` sums with `np.add.accumulate`: the run-by-run lay's
  boundaries on generated rows.
- `settings.call_fast` (how `mask_rows` runs each row once it found the fast paths on) is `fast_path()` for one call;
  the rows themselves are compared with the reference path's in tests/training/test_masks_batch.py.
- `Tainted`'s `+` builds its result without the class call: the same string, spans and instance dict.
- `masks.provenance_regions` finds each turn's ends in two loops instead of five generator passes: the plain code's
  regions (kept here) on generated rows and options, and on any spans at all.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import unicodedata
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from ctxlock.accounting import _tokenlay as tokenlay
from ctxlock.accounting._layout import part_of
from ctxlock.accounting._tokenlay import assign_owners
from ctxlock.batch._fast import _offsets
from ctxlock.settings import call_fast, fast_enabled, fast_path, reference_path
from ctxlock.template import _taint as taint
from ctxlock.template._render import Span
from ctxlock.template._taint import Tainted
from ctxlock.tokenizer import _fastbpe as fastbpe
from ctxlock.tokenizer import control_matches, encode_ids
from ctxlock.training import _masks as masks
from ctxlock.training._fastmask import region_mask
from ctxlock.training._masks import MaskOptions
from hypothesis_profiles import examples

pytestmark = pytest.mark.fast_path  # about the fast paths themselves: on even under CTXLOCK_FAST=0

# ------------------------------------------------------------------------------------------------ NFC-inert


def _not_inert_regex() -> re.Pattern[str]:
    """The check as it was before the table: a regex of every character outside the inert spans."""
    cls = "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in fastbpe.nfc_inert_spans())
    return re.compile(f"[^{cls}]")


NOT_INERT = _not_inert_regex()
SPANS = fastbpe.nfc_inert_spans()
BOUNDARIES = sorted(
    {c for a, b in SPANS for c in (a - 1, a, a + 1, b - 1, b, b + 1) if 0 <= c <= 0x10FFFF}
    | {0, 0x7F, 0x80, 0xD7FF, 0xD800, 0xDBFF, 0xDC00, 0xDFFF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF}
)
COMBINING = [c for c in range(0x300, 0x370)] + [0x1AB0, 0x1DC0, 0x20D0, 0xFE20, 0x1D165, 0x11930, 0x11935]
HANGUL = [*range(0x1100, 0x1200), 0xAC00, 0xAC01, 0xD7A3, 0xD7A4, 0xD7B0, 0xD7FF, 0x3131]


def _regex_inert(text: str) -> bool:
    return NOT_INERT.search(text) is None


def test_the_spans_are_sorted_disjoint_runs_of_assigned_characters() -> None:
    assert len(SPANS) > 500
    assert all(a <= b for a, b in SPANS)
    assert all(b + 1 < a2 for (_, b), (a2, _) in itertools.pairwise(SPANS))
    assert not any(a <= 0xD800 + k <= b for a, b in SPANS for k in (0, 0x7FF))  # no surrogate
    assert unicodedata.category(chr(SPANS[-1][1])) != "Cn"


def test_every_code_point_alone_gets_the_regex_verdict() -> None:
    differ = [c for c in range(0x110000) if fastbpe.nfc_inert(chr(c)) != _regex_inert(chr(c))]
    assert not differ, [hex(c) for c in differ[:10]]
    assert fastbpe.nfc_inert("")


def test_every_boundary_code_point_in_context_gets_the_regex_verdict() -> None:
    for c in BOUNDARIES:
        for text in (f"ab{chr(c)}", f"{chr(c)}\u00e9", f"日本{chr(c)}語🙂", chr(c) * 3, f"\U0001f642{chr(c)}x"):
            assert fastbpe.nfc_inert(text) == _regex_inert(text), (hex(c), text)


CODE_POINTS = st.one_of(
    st.sampled_from(BOUNDARIES),
    st.sampled_from(COMBINING),
    st.sampled_from(HANGUL),
    st.integers(0, 0x7F),
    st.integers(0x80, 0xFFFF),
    st.integers(0x10000, 0x10FFFF),
    st.integers(0xD800, 0xDFFF),  # lone surrogates (the text is then not UTF-8)
)


@settings(max_examples=examples(600), deadline=None)
@given(st.lists(CODE_POINTS, max_size=40), st.text(max_size=30))
def test_generated_text_gets_the_regex_verdict(codes: list[int], tail: str) -> None:
    text = "".join(map(chr, codes))
    for t in (text, tail, text + tail, tail + text, "".join(sorted(text))):
        assert fastbpe.nfc_inert(t) == _regex_inert(t), [hex(ord(ch)) for ch in t]


# ------------------------------------------------------------------------------------------------ region_mask


@settings(max_examples=examples(400), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=30),
    cuts=st.lists(st.tuples(st.integers(-3, 400), st.integers(0, 5)), max_size=40),
)
def test_region_mask_many_small_regions_in_long_tokens(lengths: list[int], cuts: list[tuple[int, int]]) -> None:
    # `_owner` stops at the first region past the token and searches both ends of every region in one call: with
    # tokens longer than the regions and gaps, a token straddles several regions and a region several tokens.
    bounds = np.concatenate(([0], np.cumsum(np.array(lengths, dtype=np.int64))))
    regions = [(a, a + w) for a, w in cuts]
    owner = np.zeros(int(bounds[-1]), dtype=np.int32)
    for a, b in regions:
        owner[max(a, 0) : max(b, 0)] = 1
    expected = assign_owners(owner, bounds[:-1], bounds[1:]).astype(np.int64)
    got = region_mask(bounds, regions)
    assert got.dtype == np.int64
    assert got.tolist() == expected.tolist()


# ------------------------------------------------------------------------------------- _offsets, whole_lay


def _widths(text: str) -> list[int]:
    """The running sum of the code points' UTF-8 widths (a lone surrogate: three bytes, as `surrogatepass`)."""
    out = [0]
    for ch in text:
        out.append(out[-1] + (1 if ord(ch) < 0x80 else 2 if ord(ch) < 0x800 else 3 if ord(ch) < 0x10000 else 4))
    return out


@settings(max_examples=examples(400), deadline=None)
@given(st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=60))
def test_offsets_are_the_code_point_widths(text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    got = _offsets(text, data)
    assert got.dtype == np.int64
    assert got.tolist() == _widths(text)


@cache
def _qwen() -> ctxlock.Model:
    return ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))


WORDS = ["alpha", "données", "日本語", "текст", "🙂", "print(x)", "42", "\n", " ", "e\u0301", "한국어", "\t", "👨‍👩‍👧"]
CONTENT = st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=8)), max_size=12).map("".join)


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(CONTENT, CONTENT), min_size=1, max_size=3))
def test_whole_lay_on_generated_rows_equals_the_run_by_run_replay(turns: list[tuple[str, str]]) -> None:
    # whole_lay sums the lengths with np.add.accumulate into int64 and finds the control ids with the array's
    # nonzero: the same boundaries as the reference lay (`token_ranges` under CTXLOCK_FAST=0, run by run).
    model = _qwen()
    messages = [{"role": r, "content": c} for u, a in turns for r, c in (("user", u), ("assistant", a))]
    with fast_path():
        rendered = model.render({"messages": messages}, add_generation_prompt=False)
        ids = encode_ids(rendered, model.tokenizer)
        data = rendered.text.encode("utf-8", "surrogatepass")
        cum = tokenlay.whole_lay(model.tokenizer, rendered, ids, data)
    with reference_path():
        offsets = _offsets(rendered.text, data)
        starts, ends, exact = tokenlay.token_ranges(
            model.tokenizer, rendered.text, ids, control_matches(rendered, model.tokenizer), offsets
        )
    assert exact
    if cum is None:  # NFC changed a run's bytes (e + U+0301): the lengths cannot add up, the reference lay is used
        assert not fastbpe.nfc_inert(rendered.text)
        return
    assert cum.dtype == np.int64
    assert cum[:-1].tolist() == starts.tolist()
    assert cum[1:].tolist() == ends.tolist()


# ------------------------------------------------------------------------------------------------ call_fast


def test_call_fast_turns_the_fast_paths_on_for_one_call_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # mask_rows calls each row through it once it found the fast paths on: the row's checks skip the environment.
    seen: list[tuple[bool, bool]] = []

    def row(x: int) -> int:
        with reference_path():  # an oracle inside still gets the reference path
            inner = fast_enabled()
        seen.append((fast_enabled(), inner))
        return x + 1

    for value, outside in (("1", True), ("0", False)):
        monkeypatch.setenv("CTXLOCK_FAST", value)
        assert call_fast(row, 41) == 42
        assert seen[-1] == (True, False)
        assert fast_enabled() is outside  # reset afterwards

    def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        call_fast(fails)
    assert fast_enabled() is False  # still CTXLOCK_FAST=0: reset after an exception too


# ------------------------------------------------------------------------------------------------ taint


SPAN_TEXT = st.text(max_size=12)


@settings(max_examples=examples(300), deadline=None)
@given(SPAN_TEXT, SPAN_TEXT, st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), max_size=4))
def test_tainted_concatenation_builds_what_the_class_call_builds(plain: str, value: str, cuts: list) -> None:
    # `+` builds its result without the class call (`taint._tainted`): the same str, type, spans and instance dict.
    spans = tuple((min(a, b), max(a, b), f"messages[{k}].content", "") for k, (a, b) in enumerate(cuts))
    t = Tainted(value, spans)
    right, left = t + plain, plain + t
    n = len(plain)
    for got, text, want in (
        (right, value + plain, Tainted(value + plain, spans)),
        (left, plain + value, Tainted(plain + value, tuple((s + n, e + n, p, k) for s, e, p, k in spans))),
    ):
        assert type(got) is Tainted and str.__eq__(got, text) and got == want
        assert got.spans == want.spans and vars(got) == vars(want)
    assert taint.shift(spans, 3) == [(s + 3, e + 3, p, k) for s, e, p, k in spans]


# ------------------------------------------------------------------------------------------------ provenance_regions


def plain_provenance_regions(rendered: Any, request: Any, opts: MaskOptions, marks: Any) -> list[tuple[int, int, int]]:
    """`masks.provenance_regions` as it was written before the speed-up (generator passes, min/max): the oracle."""
    text = rendered.text
    spans = [(s.start, s.end, part_of(s.path), s.path) for s in rendered.request_spans if s.end > s.start]
    order = {m.source: i for i, m in reversed(list(enumerate(request.messages)))}
    out: list[tuple[int, int, int]] = []
    for source in masks._trained_sources(request, opts):
        own = [(s, e) for s, e, part, path in spans if part == source and not path.endswith(".name")]
        if own:
            first, last = min(s for s, _ in own), max(e for _, e in own)
            before = max((e for s, e, part, _ in spans if part != source and e <= first), default=0)
            start = masks.body_start(text, before, first, marks)
            after = min((s for s, e, part, _ in spans if part != source and s >= last), default=len(text))
            out.append((start, last, masks._eot_end(text, last, after, marks)))
            continue
        turn = masks._empty_turn(text, spans, order, order[source], marks)
        if turn is not None:
            out.append(turn)
    if opts.train_on_eot == "none":
        return [(s, e, e) for s, e, _ in out]
    if opts.train_on_eot == "last":
        return [(s, e, e) for s, e, _ in out[:-1]] + out[-1:]
    return out


MASK_OPTIONS = st.builds(
    MaskOptions,
    roles=st.sampled_from([("assistant",), ("assistant", "tool"), ("user",), ("user", "assistant")]),
    train_on_eot=st.sampled_from(["all", "last", "none"]),
    last_turn_only=st.booleans(),
)
PATHS = st.sampled_from(
    [f"messages[{k}]{s}" for k in range(6) for s in (".content", ".name", ".content[0].text")] + ["tools[0]", ""]
)


def _marks_at(text: str, marks: Any) -> list[int]:
    """Every position where a header, separator or end-of-turn text starts or ends, and the text's ends, +-1."""
    at = {0, len(text)}
    for mark in (marks.header, marks.separator, marks.eot):
        i = text.find(mark) if mark else -1
        while i >= 0:
            at |= {i, i + len(mark)}
            i = text.find(mark, i + 1)
    return sorted({p + d for p in at for d in (-1, 0, 1)})


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(st.tuples(CONTENT, CONTENT), min_size=1, max_size=3), MASK_OPTIONS, st.booleans(), st.data())
def test_provenance_regions_equal_the_plain_code(turns: list, opts: MaskOptions, forge: bool, data: Any) -> None:
    # The rendered spans as they are, or any spans at all (unsorted, overlapping, empty, past the text, on names),
    # their ends drawn at and next to the turn marks, where a span ending or starting one place off changes a region.
    model = _qwen()
    messages = [{"role": r, "content": c} for u, a in turns for r, c in (("user", u), ("assistant", a))]
    request = model.parse({"messages": messages})
    rendered = model.render(request, add_generation_prompt=False)
    marks = masks.turn_marks(model, rendered, {"add_generation_prompt": False}, None)
    if forge:
        real = [x for sp in rendered.request_spans for x in (sp.start, sp.end)]
        pool = data.draw(st.lists(st.sampled_from(_marks_at(rendered.text, marks) + real), min_size=1, max_size=4))
        at = st.one_of(st.sampled_from(pool), st.integers(-3, len(rendered.text) + 3))  # ends that meet, or any
        forged = data.draw(st.lists(st.tuples(at, at, PATHS), max_size=10))
        rendered = dataclasses.replace(rendered, request_spans=tuple(Span(a, b, p) for a, b, p in forged))
    assert masks.provenance_regions(rendered, request, opts, marks) == plain_provenance_regions(
        rendered, request, opts, marks
    )
