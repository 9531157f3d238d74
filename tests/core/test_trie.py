"""The trie regex (`ctxlock.core._trie`) matches the same spans as the plain longest-first alternation the field writes,
on hypothesis token sets and texts, and on the real control-token sets of the vocabularies."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock
from ctxlock.core._trie import longest_first, longest_first_pattern
from hypothesis_profiles import examples

_ALPHABET = "ab<|>[]\\^-_. \n\u00e9\U0001f600"


def _plain(tokens: list[str]) -> re.Pattern[str] | None:
    ordered = sorted({t for t in tokens if t}, key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in ordered)) if ordered else None


def _spans(pattern: re.Pattern[str] | None, text: str) -> list[tuple[int, int]]:
    return [] if pattern is None else [m.span() for m in pattern.finditer(text)]


@settings(max_examples=examples(500), deadline=None)
@given(
    tokens=st.lists(st.text(alphabet=_ALPHABET, max_size=6), max_size=12),
    text=st.text(alphabet=_ALPHABET, max_size=60),
)
def test_same_spans_as_the_plain_alternation(tokens: list[str], text: str) -> None:
    assert _spans(longest_first(tokens), text) == _spans(_plain(tokens), text)


@settings(max_examples=examples(200), deadline=None)
@given(tokens=st.lists(st.text(alphabet=_ALPHABET, min_size=1, max_size=8), min_size=1, max_size=12), data=st.data())
def test_texts_built_from_the_tokens(tokens: list[str], data: st.DataObject) -> None:
    # Texts made of the tokens themselves, their prefixes and neighbours: where longest-first matters.
    pieces = st.one_of(st.sampled_from(tokens), st.sampled_from([t[:-1] for t in tokens]), st.sampled_from("ab<>"))
    text = "".join(data.draw(st.lists(pieces, max_size=10)))
    assert _spans(longest_first(tokens), text) == _spans(_plain(tokens), text)


def test_no_strings() -> None:
    assert longest_first([]) is None and longest_first([""]) is None and longest_first_pattern([]) == ""


def test_the_embedded_models_control_tokens() -> None:
    # Tekken's thousand <SPECIAL_n> tokens: the same matches, from a pattern a fraction of the size (what `re` takes
    # about 0.1 s to compile in the plain form; the figure is in the README, not asserted here).
    tokens = sorted(ctxlock.load().tokenizer.control_tokens)
    assert len(tokens) > 500
    text = "".join(f"{t}x{t[:-1]} <SPECIAL_{i}> [INST]" for i, t in enumerate(tokens))
    trie, plain = longest_first(tokens), _plain(tokens)
    assert _spans(trie, text) == _spans(plain, text)
    assert len(trie.pattern) * 2 < len(plain.pattern)
