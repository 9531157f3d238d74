"""The Tekken backend (`ctxlock.tokenizer.backends._tekken`) on mistral-common's own `tekken_*.json` files, against
mistral-common's `Tekkenizer`: the special-token table, ids, decode, each id's bytes, and the on-disk cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

import ctxlock
from ctxlock.errors import ArtifactFormatError
from ctxlock.generation._decode import decode_stream
from ctxlock.tokenizer.backends._tekken import TekkenTokenizer

DATA = Path(__import__("mistral_common").__file__).resolve().parent / "data"
FILES = sorted(p.name for p in DATA.glob("tekken_*.json"))
TEXTS = [
    "Hello, world!",
    "  leading spaces and trailing  ",
    "天空为什么是蓝色？",
    "naïve café — emoji 🙂 and tabs\tnew\nlines",
    "[INST] not a control token in plain text [/INST]",
    "",
]


@pytest.fixture(scope="module", params=FILES)
def pair(request: pytest.FixtureRequest) -> tuple[TekkenTokenizer, Tekkenizer]:
    path = DATA / request.param
    return TekkenTokenizer(path, id=f"test/{request.param}"), Tekkenizer.from_file(str(path))


def test_files_are_there() -> None:
    assert FILES == ["tekken_240718.json", "tekken_240911.json"]


def test_special_tokens_are_mistral_commons(pair) -> None:
    ours, ref = pair
    assert ours.num_special == ref.num_special_tokens
    assert [t.id for t in ours.added_tokens] == list(range(ref.num_special_tokens))
    for t in ours.added_tokens:
        assert ref.get_special_token(t.content) == t.id
        assert t.content == ref.id_to_piece(t.id)
    assert ours.vocab_size == ref.n_words
    assert ours.eos_id == ref.eos_id
    assert ours.token_to_id("<s>") == ref.bos_id
    assert {"<s>", "</s>", "[INST]", "[/INST]"} <= ours.control_tokens


@pytest.mark.parametrize("text", TEXTS)
def test_encode_text_is_mistral_commons(pair, text: str) -> None:
    ours, ref = pair
    assert ours.encode_text(text, at_start=True) == ref.encode(text, bos=False, eos=False)
    assert ours.encode(text, add_special_tokens=True) == ref.encode(text, bos=True, eos=False)


def test_control_tokens_in_a_rendered_chat(pair) -> None:
    ours, ref = pair
    text = "<s>[INST]Hi there[/INST]Hello!</s>"
    ids, matches = ours.encode_matched(text)
    inst, end = ref.get_special_token("[INST]"), ref.get_special_token("[/INST]")
    expected = [ref.bos_id, inst, *ref.encode("Hi there", bos=False, eos=False), end]
    expected += [*ref.encode("Hello!", bos=False, eos=False), ref.eos_id]
    assert ids == expected
    assert [(m.start, m.end, m.id) for m in matches] == [(0, 3, ref.bos_id), (3, 9, inst), (17, 24, end), (30, 34, 2)]
    assert ours.split_controls(text) == matches
    assert ours.encode(text, parse_special=True) == ids
    # Without parse_special the strings are text, as mistral-common's encode treats them.
    assert ours.encode(text) == ref.encode(text, bos=False, eos=False)


def test_decode_and_ids(pair) -> None:
    ours, ref = pair
    ids = ours.encode("<s>[INST]天空 🙂[/INST]", parse_special=True)
    assert ours.decode(ids) == ref.decode(ids, special_token_policy=SpecialTokenPolicy.KEEP)
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, special_token_policy=SpecialTokenPolicy.IGNORE)
    for i in ids:
        # A token holding part of a character is spelled with backslash escapes (mistral-common writes U+FFFD).
        assert ours.id_to_token(i) == ref.id_to_byte_piece(i, SpecialTokenPolicy.KEEP).decode(
            "utf-8", "backslashreplace"
        )
    assert ours.token_to_id("no such token at all") is None
    assert ours.id_to_token(ours.vocab_size + 5) is None


def test_token_bytes_are_mistral_commons_byte_pieces(pair) -> None:
    ours, ref = pair
    table = ours.token_bytes()
    assert len(table) == ref.n_words
    assert table.special == frozenset(range(ref.num_special_tokens))
    for i in [*range(0, ref.num_special_tokens, 97), *range(ref.num_special_tokens, ref.n_words, 1013)]:
        assert table.pieces[i] == ref.id_to_byte_piece(i, SpecialTokenPolicy.KEEP), i


def test_decode_pieces_break_at_control_tokens(pair) -> None:
    ours, _ = pair
    view = ours.decode_pieces(skip_special_tokens=True)
    assert view.lookup(1) == (b"", False, False, True)  # <s>: skipped, and the runs on either side decode apart
    hello = ours.encode_text("Hello", at_start=True)[0]
    assert view.lookup(hello) == (b"Hello", True, False, False)
    assert view.lookup(ours.vocab_size + 1) is None
    ids = ours.encode("<s>[INST]天空 🙂[/INST]", parse_special=True)
    assert "".join(decode_stream(ours, ids)) == ours.decode(ids)


def test_describe_replay_spec_and_the_builtin(pair) -> None:
    ours, _ = pair
    desc = ours.describe()
    assert desc["format"] == "tekken" and desc["num_special_tokens"] == ours.num_special
    spec, files = ours.replay_spec()
    name = Path(ours.source).name
    assert spec == {"format": "tekken", "file": name} and files == {name: Path(ours.source)}
    if name == "tekken_240911.json":
        builtin = ctxlock.load("mistral-nemo").tokenizer
        assert isinstance(builtin, TekkenTokenizer) and builtin.sha256 == ours.sha256


def test_a_warm_load_from_the_disk_cache_is_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path / "cache"))
    path = DATA / "tekken_240911.json"
    cold = TekkenTokenizer(path, id="cold")
    assert list((tmp_path / "cache").rglob("*.json"))  # the parsed parts were kept
    warm = TekkenTokenizer(path, id="warm")
    assert [t.content for t in warm.added_tokens] == [t.content for t in cold.added_tokens]
    text = "Hello <s> 天空 [INST]"
    assert warm.encode(text, parse_special=True) == cold.encode(text, parse_special=True)


def test_not_a_tekken_file(tmp_path: Path) -> None:
    bad = tmp_path / "tekken.json"
    bad.write_text(json.dumps({"vocab": []}), "utf-8")
    with pytest.raises(ArtifactFormatError) as info:
        TekkenTokenizer(bad, id="bad")
    assert info.value.path == str(bad)
    assert "not a Tekken tokenizer file" in str(info.value)
