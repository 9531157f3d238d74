"""The reference outputs cached on disk (tests/reference.py) are the outputs transformers computes: a cached answer
equals a fresh one (renders, ids, assistant masks, and a mask's refusal), a damaged or mismatched entry is computed
again, and inputs that are not plain JSON are never cached."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

import fetched
import reference
import tagged
from reference import CACHE_ENV, ReferenceRefusal, reference_assistant_mask, reference_ids, reference_render

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <|im_end|> [INST] 天气"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Again?"},
]


TEMPLATES = ["Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja", "google-gemma-2-2b-it.jinja"]


@pytest.fixture(scope="module")
def sources() -> tuple[Path, list[str]]:
    """Qwen2's tokenizer directory and three templates, read from the real cache before a private one is set."""
    texts = [(fetched.templates_dir() / t).read_text(encoding="utf-8") for t in TEMPLATES]
    return fetched.hf_tokenizer_dir("qwen2"), texts


@pytest.fixture(scope="module")
def tagged_qwen() -> str:
    """Qwen2.5's template with {% generation %} tags (tests/tagged.py), read before a private cache is set."""
    return tagged.tagged_source("Qwen-Qwen2.5-7B-Instruct.jinja")


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(fetched.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(fetched, "cache_dir", lambda: tmp_path)  # the artifacts stay where they are
    return tmp_path


@pytest.mark.reference
def test_cached_answers_equal_fresh_ones(
    sources: tuple[Path, list[str]], private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    qwen, cases = sources

    def answers() -> list[tuple[str, list[int]]]:
        return [
            (
                reference_render(t, MESSAGES[1:], add_generation_prompt=True, bos_token="<s>"),
                reference_ids(qwen, t, MESSAGES[1:]),
            )
            for t in cases
        ]

    first = answers()
    assert len(list((private_cache / "reference-outputs").rglob("*.json"))) == 2 * len(cases)
    again = answers()
    monkeypatch.setenv(CACHE_ENV, "0")
    assert first == again == answers()


@pytest.mark.reference
def test_cached_masks_and_refusals_equal_fresh_ones(
    sources: tuple[Path, list[str]], tagged_qwen: str, private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2.5 with {% generation %} tags masks the assistant's turn; Gemma 2 refuses a system turn, and the
    refusal is cached as its type and message. A fixed clock is part of the key."""
    qwen, (_, _, gemma) = sources
    rows = [*MESSAGES, {"role": "assistant", "content": "Once more."}]
    now = datetime.datetime(2025, 1, 15, 9, 30, tzinfo=datetime.UTC)

    def answers() -> list[object]:
        out: list[object] = [reference_assistant_mask(qwen, tagged_qwen, rows, now=now)]
        with pytest.raises(ReferenceRefusal) as refused:
            reference_assistant_mask(qwen, gemma, rows, now=now)
        return [*out, (refused.value.kind, refused.value.message)]

    first = answers()
    assert len(list(private_cache.rglob("assistant-masks/*/*.json"))) == 2
    assert first[1] == ("TemplateError", "System role not supported")
    mask = first[0]
    assert isinstance(mask, dict) and 0 < sum(mask["assistant_masks"]) < len(mask["input_ids"])
    again = answers()
    reference_assistant_mask(qwen, tagged_qwen, rows, now=now + datetime.timedelta(days=1))
    assert len(list(private_cache.rglob("assistant-masks/*/*.json"))) == 3  # another clock, another entry
    monkeypatch.setenv(CACHE_ENV, "0")
    assert first == again == answers()


def test_a_damaged_or_mismatched_entry_is_computed_again(private_cache: Path) -> None:
    calls = []

    def compute() -> str:
        calls.append(1)
        return "answer"

    key = {"template": "x", "messages": MESSAGES}
    assert reference.cached("t", key, compute) == "answer"
    (entry,) = private_cache.rglob("*.json")
    for damaged in ["{not json", json.dumps({"key": "another key", "value": "wrong"}), json.dumps([1])]:
        entry.write_text(damaged, encoding="utf-8")
        assert reference.cached("t", key, compute) == "answer"
    assert len(calls) == 4
    assert reference.cached("t", key, compute) == "answer" and len(calls) == 4  # the last write is read back


def test_inputs_that_are_not_plain_json_are_never_cached(private_cache: Path) -> None:
    assert reference.cached("t", {"x": object()}, lambda: 1) == 1
    assert reference.cached("t", {"x": float("nan")}, lambda: 2) == 2
    assert list(private_cache.rglob("*.json")) == []
