"""The HF backend (`ctxlock.tokenizer.backends.HFTokenizer`) on real tokenizer.json files, against `tokenizers` itself:
encode/encode_matched/encode_text, the declared capabilities (split_controls, engine, whole_text, truncation,
pipeline), each id's bytes, loading from a manifest, and malformed input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers

import fetched
from ctxlock.artifacts import load_artifacts
from ctxlock.errors import ArtifactFormatError, ConstraintError, DecodeError
from ctxlock.generation._decode import decode_stream
from ctxlock.tokenizer import Tokenizer
from ctxlock.tokenizer._token_bytes import byte_level_decoder_table
from ctxlock.tokenizer.backends._hf import HFTokenizer

TEXTS = ["Hello, world!", "  two  spaces\tand a tab\n", "天空为什么是蓝色？", "naïve café 🙂", ""]


@pytest.fixture(scope="module")
def qwen_json() -> str:
    return (fetched.hf_tokenizer_dir("qwen2") / "tokenizer.json").read_text("utf-8")


@pytest.fixture(scope="module")
def qwen(qwen_json: str) -> HFTokenizer:
    return HFTokenizer(qwen_json, id="qwen2/tokenizer.json", source="tokenizer.json")


@pytest.fixture(scope="module")
def ref(qwen_json: str) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_str(qwen_json)


def test_identity(qwen: HFTokenizer, qwen_json: str, ref: tokenizers.Tokenizer) -> None:
    import hashlib

    assert isinstance(qwen, Tokenizer)
    assert qwen.format == "hf-tokenizers"
    assert qwen.sha256 == hashlib.sha256(qwen_json.encode("utf-8")).hexdigest()
    assert qwen.vocab_size == ref.get_vocab_size(with_added_tokens=True)
    data = json.loads(qwen_json)
    assert [(t.content, t.id) for t in qwen.added_tokens] == [(t["content"], t["id"]) for t in data["added_tokens"]]
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= qwen.control_tokens


@pytest.mark.parametrize("text", TEXTS)
def test_encode_is_tokenizers(qwen: HFTokenizer, ref: tokenizers.Tokenizer, text: str) -> None:
    assert qwen.encode(text, parse_special=True) == ref.encode(text, add_special_tokens=False).ids
    assert qwen.encode_text(text, at_start=True) == ref.encode(text, add_special_tokens=False).ids
    assert qwen.decode(qwen.encode(text)) == text


def test_control_tokens_are_matched_where_tokenizers_extracts_them(qwen, ref) -> None:
    text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids, matches = qwen.encode_matched(text)
    assert ids == ref.encode(text, add_special_tokens=False).ids
    start, end = qwen.token_to_id("<|im_start|>"), qwen.token_to_id("<|im_end|>")
    second = text.index("<|im_start|>", 1)
    assert [(m.start, m.end, m.id) for m in matches] == [(0, 12, start), (19, 29, end), (second, second + 12, start)]
    assert qwen.split_controls(text) == matches
    # As plain text the strings are not control tokens.
    assert start not in qwen.encode(text) and end not in qwen.encode_text(text, at_start=True)


def test_declared_capabilities(qwen: HFTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXLOCK_FAST", "1")  # the suite also runs with CTXLOCK_FAST=0; this test sets both
    assert qwen.engine in ("tiktoken", "tokenizers") and qwen.engine_reason
    assert qwen.truncation is None and qwen.padding is None
    assert qwen.eos_id is None  # an HF tokenizer's EOS is its config's eos_token, not the backend's
    pipeline = qwen.pipeline()
    assert set(pipeline) == {"normalizer", "pre_tokenizer"}
    assert pipeline["normalizer"]["type"] == "NFC"
    batch = qwen.encode_text_batch(TEXTS, [True] * len(TEXTS))
    assert batch == [qwen.encode_text(t, at_start=True) for t in TEXTS]
    with pytest.raises(ValueError):
        qwen.encode_text_batch(["a"], [])
    whole = qwen.whole_text
    assert whole is not None and qwen.whole_text_engine
    text = "<|im_start|>user\n天空<|im_end|>\n"
    assert [int(i) for i in whole.encode(text, cache=False)] == qwen.encode(text, parse_special=True)
    monkeypatch.setenv("CTXLOCK_FAST", "0")
    assert qwen.whole_text is None and qwen.engine == "tokenizers" and qwen.whole_text_engine == ""


def test_token_bytes_follow_the_byte_level_decoder(qwen: HFTokenizer) -> None:
    table = qwen.token_bytes()
    assert table.scheme == "byte-level" and len(table) == qwen.vocab_size
    byte = byte_level_decoder_table()
    hello = qwen.token_to_id("Hello")
    space_world = qwen.token_to_id("Ġworld")
    assert table.pieces[hello] == b"Hello" and table.pieces[space_world] == b" world"
    assert byte["Ġ"] == 0x20
    assert table.pieces[qwen.token_to_id("<|im_end|>")] == b"<|im_end|>"
    assert qwen.token_to_id("<|im_end|>") in table.special
    ids = qwen.encode("naïve café 🙂 天空")
    assert table.join(ids) == "naïve café 🙂 天空".encode()


def test_decode_pieces_stream_the_full_decode(qwen: HFTokenizer) -> None:
    ids = qwen.encode("<|im_start|>naïve café 🙂 天空<|im_end|>", parse_special=True)
    assert "".join(decode_stream(qwen, ids)) == qwen.decode(ids)
    assert "".join(decode_stream(qwen, ids, skip_special_tokens=True)) == qwen.decode(ids, skip_special_tokens=True)
    view = qwen.decode_pieces(skip_special_tokens=True)
    assert view.lookup(qwen.token_to_id("<|im_end|>")) == (b"", False, False, False)
    assert view.groups_bytes is False


def _with(data: dict, **changes: object) -> str:
    return json.dumps({**data, **changes})


def test_decoders_without_bytes_of_their_own_are_refused(qwen_json: str) -> None:
    data = json.loads(qwen_json)
    wordpiece = HFTokenizer(_with(data, decoder={"type": "WordPiece", "prefix": "##", "cleanup": True}), id="wp")
    with pytest.raises(ConstraintError) as info:
        wordpiece.token_bytes()
    assert info.value.path == "wp" and "WordPiece decoder" in str(info.value)
    with pytest.raises(DecodeError) as dinfo:
        wordpiece.decode_pieces(skip_special_tokens=False)
    assert dinfo.value.path == "wp: decoder" and "WordPiece decoder with cleanup" in str(dinfo.value)


def test_from_manifest_and_replay_spec(tmp_path: Path, qwen_json: str, qwen: HFTokenizer) -> None:
    (tmp_path / "tokenizer.json").write_text(qwen_json, "utf-8")
    (tmp_path / "ctxlock.json").write_text(
        json.dumps({"tokenizer": {"format": "hf-tokenizers", "file": "tokenizer.json"}}), "utf-8"
    )
    loaded = load_artifacts(tmp_path).tokenizer
    assert type(loaded) is HFTokenizer
    assert loaded.id == f"{tmp_path.name}/tokenizer.json" and loaded.source == str(tmp_path / "tokenizer.json")
    assert loaded.sha256 == qwen.sha256
    spec, files = loaded.replay_spec()
    assert spec == {"format": "hf-tokenizers", "file": "tokenizer.json"}
    assert files == {"tokenizer.json": qwen_json.encode("utf-8")}


def test_a_manifest_naming_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "ctxlock.json").write_text(json.dumps({"tokenizer": {"format": "hf-tokenizers", "file": "x.json"}}))
    with pytest.raises(Exception) as info:
        load_artifacts(tmp_path)
    assert "x.json" in str(info.value.path)  # type: ignore[attr-defined]


def test_malformed_json_is_a_typed_error() -> None:
    with pytest.raises(ArtifactFormatError) as info:
        HFTokenizer("{not json", id="broken", source="/m/tokenizer.json")
    assert str(info.value.path).startswith("/m/tokenizer.json column ") and "not a valid tokenizer.json" in str(
        info.value
    )
