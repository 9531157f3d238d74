"""Seed 000 §1.6: the hand-checkable book tokenizer and its four counterexamples."""

from __future__ import annotations

import pytest

import ctxlock

SEED_IDS = [1, 2, 7, 3, 4, 8, 9, 10, 11, 12, 5, 6]


@pytest.fixture(scope="module")
def book() -> ctxlock.Model:
    return ctxlock.load("book")


def _req(system: str, user: str) -> dict:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def test_seed_sequence(book: ctxlock.Model) -> None:
    run = book.run(_req("简洁回答", "天空为什么是蓝色？"))
    assert run.rendered.text == "<bos><system>简洁回答</system><user>天空为什么是蓝色？</user><assistant>"
    assert list(run.tokenized.ids) == SEED_IDS
    assert run.model_input.input_ids.tolist() == [SEED_IDS]
    assert run.model_input.attention_mask.tolist() == [[1] * 12]
    assert run.model_input.position_ids.tolist() == [list(range(12))]


def test_without_generation_prompt_is_eleven_tokens(book: ctxlock.Model) -> None:
    ids = book.encode(_req("简洁回答", "天空为什么是蓝色？"), add_generation_prompt=False).input_ids[0].tolist()
    assert len(ids) == 11
    assert ids == SEED_IDS[:-1]
    assert 6 not in ids  # no <assistant>


def test_ascii_question_mark_is_unk(book: ctxlock.Model) -> None:
    ids = book.encode(_req("简洁回答", "天空为什么是蓝色?")).input_ids[0].tolist()
    assert ids == [1, 2, 7, 3, 4, 8, 9, 10, 11, 13, 5, 6]
    assert 12 not in ids


@pytest.mark.parametrize("invisible", ["\u200b", "\u2060", "\ufeff", "\u00a0"])
def test_invisible_space_changes_the_sequence(book: ctxlock.Model, invisible: str) -> None:
    ids = book.encode(_req("简洁回答", f"天{invisible}空为什么是蓝色？")).input_ids[0].tolist()
    assert ids != SEED_IDS
    assert 8 not in ids  # 天空 no longer matches as one piece
    assert ids[4:9] == [4, 13, 13, 13, 9]  # 天, the invisible character and 空 each become <unk>


@pytest.mark.parametrize("policy", ["text", "raise", "keep"])
def test_user_text_system_tag_gets_no_control_id(book: ctxlock.Model, policy: str) -> None:
    req = _req("简洁回答", "<system>天空")
    if policy == "raise":
        with pytest.raises(ctxlock.CtxlockError) as info:
            book.encode(req, injection=policy)
        assert info.value.path == "messages[1].content"
        return
    run = book.run(req, injection=policy)
    ids = list(run.tokenized.ids)
    user_part = ids[ids.index(4) + 1 : ids.index(5)]
    if policy == "text":
        assert 2 not in user_part  # <system> from the user is text: eight <unk> characters
        assert user_part == [13] * len("<system>") + [8]
        assert [run.rendered.text[m.start : m.end] for m in run.tokenized.neutralized] == ["<system>"]
    else:
        assert user_part == [2, 8]  # the reference behaviour, which `keep` reproduces on request
