"""Byte-level BPE pipelines rebuilt from GGUF metadata, checked against every llama.cpp tokenizer test vector."""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import pytest
from gguf import TokenType
from tokenizers import Tokenizer

import fetched
from ctxlock.artifacts._gguf import GGUFVocab, read_vocab
from ctxlock.artifacts._gguf_bpe import BPE_PRE_TOKENIZERS, bpe_tokenizer_json
from ctxlock.core._frozen import thaw
from ctxlock.errors import ArtifactFormatError

# The vocabs with vectors whose tokenizer.ggml.model is "gpt2" (byte-level BPE).
# test_every_gpt2_vector_vocab_is_covered keeps this list honest.
BPE_VECTOR_VOCABS = [
    "qwen2",
    "qwen35",
    "llama-bpe",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "gpt-2",
    "mpt",
    "starcoder",
    "refact",
    "command-r",
]
# gpt2-model vocabs without vectors (no tokenizer.ggml.pre: the GPT-2 default).
BPE_OTHER_VOCABS = ["aquila", "gpt-neox"]


@cache
def _vocab(name: str) -> GGUFVocab:
    return read_vocab(fetched.gguf_path(name))


@cache
def _tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_str(json.dumps(bpe_tokenizer_json(_vocab(name))))


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def test_every_gpt2_vector_vocab_is_covered() -> None:
    gpt2 = sorted(name for name in fetched.vector_vocabs() if _vocab(name).model == "gpt2")
    assert gpt2 == sorted(BPE_VECTOR_VOCABS)
    for name in BPE_OTHER_VOCABS:
        assert _vocab(name).model == "gpt2"


@pytest.mark.parametrize("name", BPE_VECTOR_VOCABS)
def test_llama_cpp_vectors(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    tok = _tokenizer(name)
    cases = fetched.vocab_vectors(name)
    assert cases, name
    failures = []
    for text, expected in cases:
        got = _ids(tok, text)
        if got != expected:
            failures.append((text, expected, got))
    with capsys.disabled():
        print(f"\n  gguf_bpe {name} (pre={_vocab(name).pre}): {len(cases) - len(failures)}/{len(cases)} vectors")
    if failures:
        shown = "\n".join(
            f"  text={text!r} bytes={text.encode()!r}\n    expected={expected}\n    got     ={got}"
            for text, expected, got in failures[:5]
        )
        pytest.fail(f"{name}: {len(failures)} of {len(cases)} cases differ; first {min(5, len(failures))}:\n{shown}")


def test_unknown_pre_raises() -> None:
    vocab = dataclasses.replace(_vocab("qwen2"), pre="nonsense")
    with pytest.raises(ArtifactFormatError, match="unknown pre-tokenizer 'nonsense'") as info:
        bpe_tokenizer_json(vocab)
    assert info.value.path == f"{vocab.path}:tokenizer.ggml.pre"
    assert info.value.hint


def test_not_byte_level_bpe_raises() -> None:
    with pytest.raises(ArtifactFormatError, match="not byte-level BPE"):
        bpe_tokenizer_json(_vocab("llama-spm"))


def test_missing_pre_is_the_gpt2_default() -> None:
    assert _vocab("gpt-neox").pre is None
    d = bpe_tokenizer_json(_vocab("gpt-neox"))
    assert d["pre_tokenizer"] == thaw(BPE_PRE_TOKENIZERS["default"].pre_tokenizers[0])
    assert d["pre_tokenizer"]["type"] == "ByteLevel" and d["pre_tokenizer"]["use_regex"] is True
    named = bpe_tokenizer_json(dataclasses.replace(_vocab("gpt-neox"), pre="default"))
    assert named["pre_tokenizer"] == d["pre_tokenizer"]


@pytest.mark.parametrize("name", ["qwen2", "qwen35", "llama-bpe", "deepseek-llm", "mpt", "command-r"])
def test_decode_round_trips_vector_texts(name: str) -> None:
    tok = _tokenizer(name)
    for text, _ in fetched.vocab_vectors(name):
        assert tok.decode(_ids(tok, text), skip_special_tokens=False) == text


@pytest.mark.parametrize("name", BPE_VECTOR_VOCABS + BPE_OTHER_VOCABS)
def test_control_tokens_are_special(name: str) -> None:
    vocab = _vocab(name)
    d = bpe_tokenizer_json(vocab)
    added = {a["id"]: a for a in d["added_tokens"]}
    control = [i for i, t in enumerate(vocab.token_types.tolist()) if t == TokenType.CONTROL]
    assert control
    for i in control:
        assert added[i]["special"] is True
        assert added[i]["content"] == vocab.tokens[i]
    for a in d["added_tokens"]:
        assert d["model"]["vocab"][a["content"]] == a["id"]
    tok = _tokenizer(name)
    for i in control:
        assert _ids(tok, vocab.tokens[i]) == [i]


@pytest.mark.parametrize("name", BPE_OTHER_VOCABS)
def test_vocabs_without_vectors_load_and_round_trip(name: str) -> None:
    tok = _tokenizer(name)
    assert tok.get_vocab_size() == len(_vocab(name).tokens)
    for text, _ in fetched.vocab_vectors("qwen2"):
        ids = _ids(tok, text)
        assert ids or not text
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_user_defined_tokens() -> None:
    # DeepSeek Coder's FIM tokens are non-special added tokens: matched in text, kept by decode.
    vocab = _vocab("deepseek-coder")
    tok = _tokenizer("deepseek-coder")
    fim = vocab.tokens.index("<｜fim▁hole｜>")
    assert int(vocab.token_types[fim]) == TokenType.USER_DEFINED
    assert _ids(tok, "a<｜fim▁hole｜>b") == [_ids(tok, "a")[0], fim, _ids(tok, "b")[0]]
    assert tok.decode([fim], skip_special_tokens=True) == "<｜fim▁hole｜>"
    # GPT-NeoX/MPT whitespace runs are added tokens.
    mpt = _vocab("mpt")
    assert _ids(_tokenizer("mpt"), "   ") == [mpt.tokens.index("   ")]


def test_padding_fillers_are_plain_text() -> None:
    # The converter's `[PAD<id>]` fillers are not tokens of the original model: text spelling one is text.
    vocab = _vocab("qwen2")
    pad = vocab.tokens.index("[PAD151646]")
    d = bpe_tokenizer_json(vocab)
    assert pad not in {a["id"] for a in d["added_tokens"]}
    assert d["model"]["vocab"]["[PAD151646]"] == pad
    tok = _tokenizer("qwen2")
    assert pad not in _ids(tok, "[PAD151646]")
    assert tok.decode([pad]) == "[PAD151646]"


def test_bos_in_post_processor() -> None:
    for name, bos in (("llama-bpe", 128000), ("deepseek-llm", 100000), ("command-r", 5)):
        tok = _tokenizer(name)
        assert tok.encode("Hello").ids[0] == bos
        assert _ids(tok, "Hello")[0] != bos
    for name in ("qwen2", "gpt-2", "starcoder"):
        tok = _tokenizer(name)
        assert tok.encode("Hello").ids == _ids(tok, "Hello")
    no_bos = dataclasses.replace(_vocab("llama-bpe"), add_bos=False)
    tok = Tokenizer.from_str(json.dumps(bpe_tokenizer_json(no_bos)))
    assert tok.encode("Hello").ids == _ids(tok, "Hello")


def test_llama3_ignores_merges() -> None:
    assert bpe_tokenizer_json(_vocab("llama-bpe"))["model"]["ignore_merges"] is True
    assert bpe_tokenizer_json(_vocab("qwen2"))["model"]["ignore_merges"] is False


def test_recipe_table_is_data() -> None:
    for name, recipe in BPE_PRE_TOKENIZERS.items():
        assert recipe.source, name
        assert recipe.pre_tokenizers, name
        assert any(p["type"] == "ByteLevel" for p in recipe.pre_tokenizers), name
        json.dumps(thaw(recipe.pre_tokenizers))  # plain JSON data
        with pytest.raises(TypeError):
            recipe.pre_tokenizers[0]["type"] = "x"  # frozen: a caller cannot change the table
