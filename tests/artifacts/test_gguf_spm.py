"""GGUF vocabularies that are not byte-level BPE (llama / bert / t5 / gemma4) as tokenizers pipelines.

The reference is llama.cpp's own tokenizer test vectors (``ggml-vocab-*.gguf.inp`` / ``.out``), which were
produced by each model's original HF tokenizer with ``encode(text, add_special_tokens=False)``: every case of
every vocab that ships vectors must give the same ids.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

import fetched
from ctxlock.artifacts._gguf import GGUFVocab, read_vocab
from ctxlock.artifacts._gguf_spm import (
    gemma4_tokenizer_json,
    spm_tokenizer_json,
    unigram_tokenizer_json,
    wordpiece_tokenizer_json,
)
from ctxlock.errors import ArtifactFormatError

BUILDERS = {
    "llama": spm_tokenizer_json,
    "bert": wordpiece_tokenizer_json,
    "t5": unigram_tokenizer_json,
    "gemma4": gemma4_tokenizer_json,
}
VECTOR_VOCABS = {"llama-spm": "llama", "phi-3": "llama", "bert-bge": "bert", "gemma-4": "gemma4"}
NO_VECTOR_VOCABS = {"baichuan": "llama", "nomic-bert-moe": "t5"}
ALL_VOCABS = {**VECTOR_VOCABS, **NO_VECTOR_VOCABS}


@cache
def vocab(name: str) -> GGUFVocab:
    return read_vocab(fetched.gguf_path(name))


@cache
def tokenizer_dict(name: str) -> dict[str, Any]:
    v = vocab(name)
    return BUILDERS[v.model](v)


@cache
def tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_str(json.dumps(tokenizer_dict(name)))


def fresh_tokenizer(name: str) -> Tokenizer:
    """A tokenizer of its own, for tests that change its settings."""
    return Tokenizer.from_str(json.dumps(tokenizer_dict(name)))


# ------------------------------------------------------------------------------------ the test vectors


@pytest.mark.parametrize("name", sorted(VECTOR_VOCABS))
def test_every_llama_cpp_vector(name: str) -> None:
    v = vocab(name)
    assert v.model == VECTOR_VOCABS[name]
    tok = tokenizer(name)
    cases = fetched.vocab_vectors(name)
    assert len(cases) >= 40, f"{name}: only {len(cases)} vectors"
    failures = []
    for text, expected in cases:
        got = tok.encode(text, add_special_tokens=False).ids
        if got != expected:
            failures.append((text, expected, got))
    passed = len(cases) - len(failures)
    print(f"{name} ({v.model}): {passed}/{len(cases)} vectors pass")
    if failures:
        shown = "\n".join(f"  {t!r}\n    expected {e}\n    got      {g}" for t, e, g in failures[:5])
        pytest.fail(f"{name}: {len(failures)} of {len(cases)} vectors fail; the first ones:\n{shown}")


@pytest.mark.parametrize("name", ["llama-spm", "phi-3", "gemma-4"])
def test_decode_inverts_the_vectors(name: str) -> None:
    tok = tokenizer(name)
    for text, ids in fetched.vocab_vectors(name):
        assert tok.decode(ids, skip_special_tokens=False) == text


# ----------------------------------------------------------------------------- vocabs without vectors

SIMPLE = ["Hello world", "The quick brown fox jumps over the lazy dog.", "a", "x = 3 + 4; print(x)", "don't stop"]


@pytest.mark.parametrize("name", sorted(NO_VECTOR_VOCABS))
def test_vocab_without_vectors_builds_and_round_trips(name: str) -> None:
    v = vocab(name)
    assert v.model == NO_VECTOR_VOCABS[name]
    tok = tokenizer(name)
    assert tok.get_vocab_size(with_added_tokens=True) == len(v.tokens)
    for text in SIMPLE:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids, text
        assert v.special_ids.get("unk") not in ids, (text, ids)
        decoded = tok.decode(ids)
        if v.model == "t5":  # compare modulo the normalizer (charsmap, extra whitespace removal)
            assert decoded == tok.normalizer.normalize_str(text), text
        else:
            assert decoded == text


def test_wordpiece_round_trips_modulo_its_normalizer() -> None:
    tok = tokenizer("bert-bge")
    for text in ["Hello world", "the quick brown fox", "Tokenizers are EXACT"]:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert 100 not in ids  # [UNK]
        assert tok.decode(ids) == tok.normalizer.normalize_str(text)


def test_nomic_collapses_whitespace_like_sentencepiece() -> None:
    tok = tokenizer("nomic-bert-moe")
    assert vocab("nomic-bert-moe").remove_extra_whitespaces is True
    one = tok.encode("Hello world", add_special_tokens=False).ids
    assert tok.encode("  Hello    world  ", add_special_tokens=False).ids == one


# ------------------------------------------------------------------------------- ids and added tokens


@pytest.mark.parametrize("name", sorted(ALL_VOCABS))
def test_every_gguf_id_is_kept(name: str) -> None:
    v = vocab(name)
    d = tokenizer_dict(name)
    tok = tokenizer(name)
    assert tok.get_vocab_size(with_added_tokens=True) == len(v.tokens)
    for added in d["added_tokens"]:
        assert tok.token_to_id(added["content"]) == added["id"]
    if v.model != "bert":  # WordPiece pieces are respelled (see test_wordpiece_pieces_are_respelled)
        for i in range(0, len(v.tokens), max(1, len(v.tokens) // 5000)):
            assert tok.token_to_id(v.tokens[i]) == i, (i, v.tokens[i])


@pytest.mark.parametrize("name", sorted(ALL_VOCABS))
def test_added_tokens_follow_the_token_types(name: str) -> None:
    v = vocab(name)
    types = np.asarray(v.token_types)
    added = {a["id"]: a for a in tokenizer_dict(name)["added_tokens"]}
    for i in np.nonzero(types == 3)[0].tolist():  # CONTROL
        assert added[i]["special"] is True
        assert added[i]["normalized"] is False
    for i in np.nonzero(types == 4)[0].tolist():  # USER_DEFINED
        assert added[i]["special"] is False
    for i in np.nonzero(types == 5)[0].tolist():  # UNUSED: padding rows, not added tokens
        assert i not in added
    unk = v.special_ids.get("unk")
    if unk is not None:
        assert added[unk]["special"] is True


def test_phi3_strip_flags_are_the_original_ones() -> None:
    added = {a["content"]: a for a in tokenizer_dict("phi-3")["added_tokens"]}
    assert added["</s>"]["special"] is False  # USER_DEFINED in the GGUF, a plain added token in Phi-3
    for token in ("</s>", "<|assistant|>", "<|end|>", "<|user|>", "<|system|>"):
        assert added[token]["rstrip"] is True, token
    for token in ("<unk>", "<s>", "<|endoftext|>"):
        assert added[token]["rstrip"] is False, token
    tok = tokenizer("phi-3")
    end = tok.token_to_id("<|end|>")
    assert tok.encode("<|end|>\n  x", add_special_tokens=False).ids == [
        end,
        *tok.encode("x", add_special_tokens=False).ids,
    ]


def test_nomic_mask_lstrips() -> None:
    added = {a["content"]: a for a in tokenizer_dict("nomic-bert-moe")["added_tokens"]}
    assert added["<mask>"]["lstrip"] is True
    assert added["<s>"]["lstrip"] is False


def test_wordpiece_pieces_are_respelled() -> None:
    v = vocab("bert-bge")
    ids = tokenizer_dict("bert-bge")["model"]["vocab"]
    for i, token in enumerate(v.tokens):
        if v.token_type(i) == 3:
            assert ids[token] == i
        elif token.startswith("▁"):
            assert ids[token[1:]] == i
        else:
            assert ids["##" + token] == i
    assert tokenizer_dict("bert-bge")["normalizer"]["lowercase"] is True


@pytest.mark.parametrize(
    ("name", "controls"),
    [
        ("llama-spm", ["<s>", "</s>", "<unk>"]),
        ("phi-3", ["<s>", "<|endoftext|>", "<|end|>", "<|user|>"]),
        ("gemma-4", ["<bos>", "<eos>", "<|turn>", "<turn|>", "<pad>"]),
        ("nomic-bert-moe", ["<s>", "</s>", "<pad>", "<mask>"]),
        ("bert-bge", ["[CLS]", "[SEP]", "[MASK]", "[PAD]"]),
        ("baichuan", ["<s>", "</s>"]),
    ],
)
def test_text_never_becomes_a_control_token(name: str, controls: list[str]) -> None:
    """With special-token matching off, the model itself cannot produce a control id from text."""
    tok = fresh_tokenizer(name)
    tok.encode_special_tokens = True
    control_ids = {tok.token_to_id(c) for c in controls}
    assert None not in control_ids
    for c in controls:
        for text in (c, f"x{c}y", f" {c} ", c * 2):
            ids = tok.encode(text, add_special_tokens=False).ids
            assert not control_ids & set(ids), (text, ids)


@pytest.mark.parametrize(("name", "first"), [("llama-spm", 1), ("phi-3", 1), ("gemma-4", 2)])
def test_post_processor_adds_bos(name: str, first: int) -> None:
    tok = tokenizer(name)
    assert tok.encode("Hello").ids[0] == first
    assert tok.encode("Hello").ids[1:] == tok.encode("Hello", add_special_tokens=False).ids


def test_bert_post_processor_adds_cls_and_sep() -> None:
    tok = tokenizer("bert-bge")
    assert tok.encode("hello").ids == [101, 7592, 102]


def test_gemma4_keeps_the_gguf_merges() -> None:
    v = vocab("gemma-4")
    merges = tokenizer_dict("gemma-4")["model"]["merges"]
    assert len(merges) == len(v.merges) == 514906
    assert tokenizer_dict("gemma-4")["normalizer"]["normalizers"] == [
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    ]  # add_space_prefix is False: no dummy prefix


def test_spm_merges_are_ranked_by_score() -> None:
    v = vocab("llama-spm")
    merges = tokenizer_dict("llama-spm")["model"]["merges"]
    ids = {t: i for i, t in enumerate(v.tokens)}
    merged_scores = [float(v.scores[ids[a + b]]) for a, b in merges]
    assert merged_scores == sorted(merged_scores, reverse=True)
    assert merges[0] == ["▁", "t"]


# ------------------------------------------------------------------------------------------ typed errors


@pytest.mark.parametrize("function", list(BUILDERS.values()))
@pytest.mark.parametrize("name", ["llama-spm", "bert-bge"])
def test_unsupported_model_is_a_typed_error(function: Any, name: str) -> None:
    bad = dataclasses.replace(vocab(name), model="nonsense")
    with pytest.raises(ArtifactFormatError) as info:
        function(bad)
    assert info.value.path == f"{bad.path}:tokenizer.ggml.model"
    assert "nonsense" in info.value.message
    assert info.value.hint


@pytest.mark.parametrize(
    ("name", "function"),
    [("llama-spm", wordpiece_tokenizer_json), ("bert-bge", spm_tokenizer_json), ("phi-3", gemma4_tokenizer_json)],
)
def test_wrong_builder_for_the_model_is_a_typed_error(name: str, function: Any) -> None:
    with pytest.raises(ArtifactFormatError, match="converts tokenizer model"):
        function(vocab(name))


def test_missing_scores_is_a_typed_error() -> None:
    bad = dataclasses.replace(vocab("llama-spm"), scores=None)
    with pytest.raises(ArtifactFormatError) as info:
        spm_tokenizer_json(bad)
    assert info.value.path.endswith(":tokenizer.ggml.scores")


def test_nan_scores_are_a_typed_error() -> None:
    v = vocab("nomic-bert-moe")
    scores = np.array(v.scores, dtype=np.float32)
    scores[10] = np.nan
    with pytest.raises(ArtifactFormatError, match="NaN"):
        unigram_tokenizer_json(dataclasses.replace(v, scores=scores))


def test_duplicate_token_is_a_typed_error() -> None:
    v = vocab("llama-spm")
    tokens = list(v.tokens)
    tokens[500] = tokens[400]
    with pytest.raises(ArtifactFormatError, match="both the piece") as info:
        spm_tokenizer_json(dataclasses.replace(v, tokens=tuple(tokens)))
    assert info.value.path.endswith(":tokenizer.ggml.tokens")


def test_incomplete_byte_tokens_are_a_typed_error() -> None:
    v = vocab("llama-spm")
    tokens = list(v.tokens)
    tokens[3] = "<0xZZ>"  # <0x00> is id 3
    with pytest.raises(ArtifactFormatError, match="BYTE tokens"):
        spm_tokenizer_json(dataclasses.replace(v, tokens=tuple(tokens)))


def test_gemma4_bad_merge_is_a_typed_error() -> None:
    v = vocab("gemma-4")
    merges = list(v.merges)
    merges[7] = "no-such-token another-one"
    with pytest.raises(ArtifactFormatError, match="not in the vocabulary") as info:
        gemma4_tokenizer_json(dataclasses.replace(v, merges=tuple(merges)))
    assert info.value.path.endswith(":tokenizer.ggml.merges[7]")


def test_gemma4_without_merges_is_a_typed_error() -> None:
    with pytest.raises(ArtifactFormatError, match=r"needs tokenizer\.ggml\.merges"):
        gemma4_tokenizer_json(dataclasses.replace(vocab("gemma-4"), merges=None))


def test_wordpiece_without_unk_is_a_typed_error() -> None:
    v = vocab("bert-bge")
    tokens = list(v.tokens)
    tokens[100] = "[NOT-UNK]"
    special = {k: i for k, i in v.special_ids.items() if k != "unk"}
    with pytest.raises(ArtifactFormatError, match="unknown token"):
        wordpiece_tokenizer_json(dataclasses.replace(v, tokens=tuple(tokens), special_ids=special))


def test_builders_are_pure() -> None:
    v = vocab("phi-3")
    assert spm_tokenizer_json(v) == spm_tokenizer_json(v)
    assert json.loads(json.dumps(spm_tokenizer_json(v))) == spm_tokenizer_json(v)
