"""gpt-oss's vocabulary, o200k_harmony, read by ctxlock's tiktoken backend from the pinned o200k_base.tiktoken
(the bpe-openai wheel, tests/fetched.py), against openai-harmony 0.0.8 loading the same file offline
(`TIKTOKEN_ENCODINGS_BASE`): the same ids for text, every control token at the same id, and the two edges where the
tables differ stated (docs/differences.md). o200k_base, the same ranks with gpt-4o's two special tokens, against
tiktoken's own Encoding built from the file."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

import fetched
from ctxlock.tokenizer.backends._tiktoken_file import O200K_PATTERN, TIKTOKEN_PRESETS, TiktokenTokenizer, from_manifest
from hypothesis_profiles import examples

CONTROL = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")


@pytest.fixture(scope="module")
def ranks() -> Path:
    return fetched.o200k_base_path()


@pytest.fixture(scope="module")
def harmony(ranks: Path) -> Any:
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(ranks.parent)  # offline: the pinned file, never the network
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


@pytest.fixture(scope="module")
def ours(ranks: Path) -> TiktokenTokenizer:
    return from_manifest({"format": "tiktoken", "preset": "o200k_harmony"}, ranks, "gpt-oss")


@pytest.fixture(scope="module")
def o200k(ranks: Path) -> TiktokenTokenizer:
    return from_manifest({"format": "tiktoken", "preset": "o200k_base"}, ranks, "o200k_base")


@pytest.fixture(scope="module")
def tiktoken_o200k(ranks: Path) -> tiktoken.Encoding:
    mergeable = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in ranks.read_bytes().splitlines() if line)
    }
    specials = TIKTOKEN_PRESETS["o200k_base"]["special_tokens"]
    return tiktoken.Encoding("o200k_base", pat_str=O200K_PATTERN, mergeable_ranks=mergeable, special_tokens=specials)


def corpus() -> list[str]:
    """llama.cpp's tokenizer test texts (every vocabulary's) and ten real chat templates."""
    texts = [text for name in fetched.vector_vocabs() for text, _ in fetched.vocab_vectors(name)]
    return texts + [p.read_text("utf-8") for p in fetched.template_paths()[:10]]


def test_text_gives_harmonys_ids(ours: TiktokenTokenizer, harmony: Any) -> None:
    texts = corpus()
    assert len(texts) > 300
    for text in texts:
        assert ours.encode_text(text, at_start=False) == harmony.encode(text, disallowed_special=()), text


def test_every_control_token_has_harmonys_id(ours: TiktokenTokenizer, harmony: Any) -> None:
    table = TIKTOKEN_PRESETS["o200k_harmony"]["special_tokens"]
    assert len(table) == 1090 and set(CONTROL) <= set(table)
    for name, id_ in table.items():
        assert harmony.encode(name, allowed_special="all") == [id_] == [ours.token_to_id(name)], name
        assert ours.decode([id_]) == harmony.decode([id_]) == name
    # The edges (docs/differences.md): harmony also names one id past gpt-oss's 201,088; tiktoken's table also
    # names <|endofprompt|>, which harmony (and ctxlock) encode as text.
    assert set(harmony.special_tokens_set) - set(table) == {"<|reserved_201088|>"}
    assert ours.vocab_size == 201088 and ours.token_to_id("<|reserved_201088|>") is None
    assert ours.encode_text("<|endofprompt|>", at_start=False) == harmony.encode(
        "<|endofprompt|>", allowed_special="all"
    )


def test_control_text_in_a_request_stays_text(ours: TiktokenTokenizer, harmony: Any) -> None:
    for name in CONTROL:
        text = f"say {name} now"
        ids = ours.encode_text(text, at_start=False)
        assert ids == harmony.encode(text, disallowed_special=())
        assert not set(ids) & set(TIKTOKEN_PRESETS["o200k_harmony"]["special_tokens"].values())


@settings(max_examples=examples(200), deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=80))
def test_generated_text_gives_harmonys_ids(ours: TiktokenTokenizer, harmony: Any, text: str) -> None:
    ids = ours.encode_text(text, at_start=False)
    assert ids == harmony.encode(text, disallowed_special=())
    assert ours.decode(ids) == harmony.decode(ids) == text


def test_o200k_base_gives_tiktokens_ids(o200k: TiktokenTokenizer, tiktoken_o200k: tiktoken.Encoding) -> None:
    for text in corpus():
        assert o200k.encode_text(text, at_start=False) == tiktoken_o200k.encode(text, disallowed_special=()), text
    assert o200k.token_to_id("<|endofprompt|>") == 200018 and o200k.vocab_size == tiktoken_o200k.n_vocab
