"""The tiktoken fast path of `HFTokenizer.encode_text` (issue 7): where it is chosen, it gives the `tokenizers` plain
variant's ids, on llama.cpp's vectors, on every code point in several contexts, and on random text; where it is
refused, the reason says which condition failed."""

from __future__ import annotations

import hashlib
import json
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

import fetched
from ctxlock.tokenizer import _fastbpe as fastbpe
from ctxlock.tokenizer.backends._hf import HFTokenizer
from hypothesis_profiles import examples
from vocabularies import TOKENIZERS

MUST_BE_FAST = ("gguf:qwen2", "gguf:llama-bpe", "gguf:gpt-2", "hf:qwen2", "hf:llama-bpe")


pytestmark = pytest.mark.fast_path  # about the fast path itself: on even under CTXLOCK_FAST=0
RUN_BY = "key"  # vocabulary by vocabulary (tests/conftest.py), each loaded once (tests/vocabularies.py)

# Which vocabularies take the fast path (the engine ctxlock chooses with it on), and the sweep's vocabularies (one,
# the smallest, per distinct split pattern: the split is independent of the vocabulary): written out, not computed
# at collection, where choosing every vocabulary's engine cost each test process about 10 s of CPU (and choosing the
# sweep's built the fast encoders too). `test_verdicts` computes both, in its one pass over the vocabularies, and
# fails with the lists to write here when they change.
FAST = [
    "gguf:aquila", "gguf:gpt-2", "gguf:gpt-neox", "gguf:llama-bpe", "gguf:mpt", "gguf:qwen2", "gguf:qwen35",
    "hf:deepseek-llm", "hf:llama-bpe", "hf:qwen2", "hf:qwen35",
]  # fmt: skip
SWEEP_KEYS = ["gguf:gpt-2", "gguf:llama-bpe", "gguf:qwen2", "gguf:qwen35"]


def reference(tok: HFTokenizer, text: str) -> list[int]:
    first, _ = tok._plain  # byte-level vocabularies have no Metaspace: one plain variant
    return first.encode(text, add_special_tokens=False).ids


def fast_ids(tok: HFTokenizer, text: str) -> list[int]:
    fast = tok._choose_engine()[2]
    ids = fast.encode(text)
    assert ids is not None, f"the fast path handed {text!r} back"
    return ids


# --------------------------------------------------------------------------------------------------- verdicts


def test_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    engines: dict[str, tuple[str, str]] = {}
    splits: list[tuple[int, str, str]] = []  # (vocabulary size, key, split pattern) of the fast ones
    with capsys.disabled():
        print()
        for key, tok in sorted(TOKENIZERS.items()):  # each vocabulary loaded once
            print(f"  {key:22} {tok.engine:10} {tok.engine_reason}")
            engines[key] = (tok.engine, tok.engine_reason)
            # describe() names the engine and why, as the verdict has them (checked here, in the one pass that
            # loads every vocabulary, rather than by a test per vocabulary that loaded each again)
            d = tok.describe()
            assert d["engine"] == tok.engine in ("tiktoken", "tokenizers"), key
            assert d["engine_reason"] == tok.engine_reason, key
            if tok.engine == "tiktoken":
                splits.append((tok.vocab_size, key, tok._choose_engine()[2].verdict.pattern))
    fast = sorted(k for k, (engine, _) in engines.items() if engine == "tiktoken")
    assert fast == FAST, f"the vocabularies on the fast path are now FAST = {fast}"
    seen: dict[str, str] = {}
    for _, key, pattern in sorted(splits, key=lambda s: s[0]):  # the smallest first, ties in key order
        seen.setdefault(pattern, key)
    assert sorted(seen.values()) == SWEEP_KEYS, f"one per split pattern is now SWEEP_KEYS = {sorted(seen.values())}"
    for key in MUST_BE_FAST:
        assert engines[key][0] == "tiktoken", f"{key}: {engines[key][1]}"
    assert {"gguf:qwen35", "gguf:aquila", "gguf:mpt", "gguf:gpt-neox", "hf:qwen35"} <= set(FAST)
    # Refusals name the failed condition, specifically.
    reasons = {k: reason for k, (engine, reason) in engines.items() if engine != "tiktoken"}
    assert reasons["gguf:phi-3"] == "normalizer Sequence[Prepend, Replace] is not supported"
    assert reasons["gguf:falcon"] == (
        "pre-tokenizer Sequence[Punctuation, ByteLevel, Digits, Split] is not Sequence[Split, ByteLevel]"
    )
    assert reasons["gguf:bert-bge"] == "normalizer BertNormalizer is not supported"
    assert reasons["gguf:starcoder"].startswith("pre-tokenizer Sequence[Digits, ByteLevel] cannot be one regex")
    for key, reason in reasons.items():
        assert reason and reason != "CTXLOCK_FAST=0", key


def test_ctxlock_fast_0_forces_tokenizers(monkeypatch: pytest.MonkeyPatch) -> None:
    qwen = TOKENIZERS["gguf:qwen2"]
    monkeypatch.setenv("CTXLOCK_FAST", "0")
    fresh = HFTokenizer(qwen._json_text, id="qwen2-fresh")
    assert fresh.engine == "tokenizers"
    assert fresh.engine_reason == "CTXLOCK_FAST=0"
    assert fresh.describe()["engine"] == "tokenizers"
    assert qwen.engine == "tokenizers"  # read per call: an already chosen engine is turned off too
    text = "Hello, 世界! It's 2024."
    assert fresh.encode_text(text, at_start=True) == reference(qwen, text)
    monkeypatch.setenv("CTXLOCK_FAST", "1")
    assert fresh.engine == "tiktoken"


# ----------------------------------------------------------------------------------------- equivalence: vectors


@pytest.mark.parametrize("key", FAST)
def test_vectors_and_sources_give_reference_ids(key: str) -> None:
    tok = TOKENIZERS[key]
    texts = [text for name in fetched.vector_vocabs() for text, _ in fetched.vocab_vectors(name)]
    texts += [p.read_text("utf-8") for p in fetched.template_paths()[:20]]
    texts += [p.read_text("utf-8") for p in sorted(Path(fastbpe.__file__).parent.glob("*.py"))]
    expected = [reference(tok, t) for t in texts]
    bad = [t for t, ids in zip(texts, expected, strict=True) if fast_ids(tok, t) != ids]
    assert not bad, f"{len(bad)}/{len(texts)} differ; first {bad[0]!r}"
    # encode_text is the fast path, and the batch API agrees with it.
    assert tok.encode_text(texts[0], at_start=True) == fast_ids(tok, texts[0])
    flags = [i % 2 == 0 for i in range(len(texts))]
    assert tok.encode_text_batch(texts, flags) == expected


# Each code point in one context that exercises the split regexes' classes and boundaries (letters, marks, numbers,
# contractions and their case folding, whitespace before letters, numbers and the end) and NFC composition. Planes
# 0-3 and 14 hold every assigned or soon-to-be-assigned character outside private use; newly assigned characters
# are where two engines' Unicode tables can differ.
CONTEXT = "'{c}a{c}1 {c}{c}  {c}\u0301\n"
# Blocks fully assigned since Unicode 5 or earlier (CJK ideographs, Hangul syllables) have the same classes in every
# engine; the sweep leaves them out to stay fast.
_STABLE = (
    (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x20000, 0x2A6DF),
    (0x2A700, 0x2B734), (0x2B740, 0x2B81D), (0x2B820, 0x2CEA1), (0x2CEB0, 0x2EBE0),
)  # fmt: skip
SWEEP = [
    c
    for c in (*range(0x40000), *range(0xE0000, 0xE1000))
    if not 0xD800 <= c < 0xE000 and not any(lo <= c <= hi for lo, hi in _STABLE)
]


def test_nfc_inert_text_is_left_alone_by_tokenizers_nfc() -> None:
    # The fast path skips NFC on text made only of NFC-inert characters: tokenizers' own NFC must agree.
    import tokenizers

    inert = "".join(chr(c) for lo, hi in fastbpe.nfc_inert_spans() for c in range(lo, hi + 1))
    assert len(inert) > 100_000  # Latin, Cyrillic, CJK, Hangul syllables, emoji, ...
    assert fastbpe.nfc_inert(inert)
    nfc = tokenizers.normalizers.NFC()
    assert nfc.normalize_str(inert) == inert
    assert nfc.normalize_str(inert[::-1]) == inert[::-1]
    # and the characters it does not skip include what NFC changes or combines
    for text in ("e\u0301", "\u212b", "\u1100\u1161", "\U00011935\U00011930", "\u0344"):
        assert not fastbpe.nfc_inert(text)


@pytest.mark.parametrize("key", SWEEP_KEYS)
def test_every_code_point_in_context(key: str) -> None:
    tok = TOKENIZERS[key]
    block = 1 << 14
    bad = []
    for start in range(0, len(SWEEP), block):
        text = "".join(CONTEXT.format(c=chr(c)) for c in SWEEP[start : start + block])
        if fast_ids(tok, text) != reference(tok, text):
            bad.append(hex(SWEEP[start]))
    assert not bad, f"blocks starting at {bad[:5]} differ"


# ---------------------------------------------------------------------------------------- equivalence: random

WORDS = [
    "'S", "'s", "'ll", "'LL", "'ve", "'re", "'d", "'M", "'t", "don't", "I'M", "\u017f", "'\u017f",
    "def f(x):\n    return x**2\n", "if (a && b) { c++; }", "http://x.y/z?q=1",
    "123456789", "3.14159", "١٢٣", "①②", "  ", "\t\t", "\n\n\n", " \n ", "\r\n",
    "中文字符", "日本語のテキスト", "한국어", "Привет", "مرحبا", "עברית", "ภาษาไทย", "हिन्दी",
    "e\u0301", "\u00e9", "\u1e9b\u0323", "A\u030a", "\uac00\u11a8", "\u1100\u1161",
    "😀", "👨‍👩‍👧", "🇺🇸", "✓", "<think>", "<|im_start|>", "<|endoftext|>", "\u00a0", "\u3000", "\u2028",
]  # fmt: skip
TEXT = st.lists(
    st.one_of(
        st.sampled_from(WORDS),
        st.text(alphabet=string.printable, max_size=12),
        st.text(max_size=8),
        st.text(alphabet=st.characters(min_codepoint=0x300, max_codepoint=0x36F), max_size=3),
        st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), max_size=6),
        st.text(alphabet=" \t\n\r\u00a0", max_size=6),
        st.text(alphabet="0123456789", min_size=1, max_size=9),
    ),
    max_size=14,
).map("".join)


@pytest.mark.parametrize("key", FAST)
@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT)
def test_random_text_gives_reference_ids(key: str, text: str) -> None:
    tok = TOKENIZERS[key]
    assert fast_ids(tok, text) == reference(tok, text)


def test_text_that_is_not_utf8_goes_to_tokenizers() -> None:
    qwen = TOKENIZERS["gguf:qwen2"]
    assert qwen._choose_engine()[2].encode("a\ud800b") is None  # a lone surrogate: tokenizers decides what happens


# ------------------------------------------------------------------------------------------ refusals, synthetic

B = fastbpe.BYTE_CHARS


def _tiny(**over: Any) -> dict[str, Any]:
    """A byte-level BPE with 256 bytes and merges a+b -> ab (256), ab+c -> abc (257)."""
    vocab = {c: i for i, c in enumerate(B)}
    vocab |= {"ab": 256, "abc": 257}
    data: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [["a", "b"], ["ab", "c"]],
        },
    }
    for k, v in over.items():
        if k.startswith("model_"):
            data["model"][k[6:]] = v
        else:
            data[k] = v
    return data


def _verdict(data: dict[str, Any]) -> fastbpe.Verdict:
    tok = HFTokenizer(json.dumps(data), id="tiny")  # tokenizers must accept it: refusals are about real files
    plain = [t for t in data["added_tokens"] if not _is_control(t)]
    verdict, _ = fastbpe.check(data, plain)
    assert tok.engine == ("tiktoken" if verdict.ok else "tokenizers")
    return verdict


def _is_control(t: dict[str, Any]) -> bool:  # AddedToken.control
    return not t["content"].isspace()


def test_tiny_vocabulary_is_fast_and_equal() -> None:
    data = _tiny()
    assert _verdict(data).ok
    tok = HFTokenizer(json.dumps(data), id="tiny")
    assert tok.engine == "tiktoken"
    for text in ("abc", "ababcabc", "cab abc", "xabcx"):
        assert tok.encode_text(text, at_start=False) == reference(tok, text)


def _vocab(**extra: int) -> dict[str, int]:
    return {c: i for i, c in enumerate(B)} | extra


_LSTRIP = {"id": 258, "content": " ", "special": False, "lstrip": True, "rstrip": False, "single_word": False}
_TRUNCATION = {"max_length": 8, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}
_METASPACE = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({"normalizer": {"type": "NFKC"}}, "normalizer NFKC is not supported"),
    ({"pre_tokenizer": _METASPACE}, "pre-tokenizer Metaspace is not byte-level"),
    ({"model_dropout": 0.1}, "BPE dropout 0.1 is random"),
    ({"model_byte_fallback": True}, "BPE byte_fallback is on (not byte-level)"),
    ({"added_tokens": [{**_LSTRIP, "normalized": False}]}, "added token ' ' has lstrip"),
    # The merge list builds ab after bc, but ab has the lower id: merge order is not rank order.
    (
        {"model_vocab": _vocab(ab=257, bc=256, abc=258), "model_merges": [["a", "b"], ["b", "c"], ["ab", "c"]]},
        "merge 0 ('a', 'b') makes token 'ab' of rank 257 but a later merge (1) made 'bc' of the lower rank 256",
    ),
    # abc is made from (a, bc) in the merge list, but rank BPE reaches it through (ab, c).
    (
        {"model_vocab": _vocab(ab=256, bc=257, abc=258), "model_merges": [["a", "b"], ["b", "c"], ["a", "bc"]]},
        "token 'abc' (rank 258): rank BPE on its bytes builds it from ('ab', 'c'), which is not one of its merges",
    ),
]


def test_truncation_and_padding_sections_neither_apply_nor_keep_the_fast_path_off() -> None:
    # fastbpe.check still refuses a JSON that holds them (tiktoken cannot truncate), but HFTokenizer never applies
    # them (issue 15: transformers switches both off in apply_chat_template) and hands check the JSON without them.
    data = _tiny(truncation=_TRUNCATION, padding={"strategy": {"Fixed": 12}, "pad_id": 0, "pad_token": "!"})
    assert fastbpe.check(data, [])[0].reason == "the tokenizer.json sets truncation"
    tok = HFTokenizer(json.dumps(data), id="tiny")
    assert tok.engine == "tiktoken"
    text = "abcabc " * 5
    plain = Tokenizer.from_str(json.dumps(_tiny()))
    assert tok.encode(text) == plain.encode(text, add_special_tokens=False).ids and len(tok.encode(text)) > 8


@pytest.mark.parametrize(("over", "reason"), REFUSALS)
def test_refusal_reasons(over: dict[str, Any], reason: str) -> None:
    verdict = _verdict(_tiny(**over))
    assert not verdict.ok
    assert verdict.reason.startswith(reason), verdict.reason


def test_split_regexes_are_checked() -> None:
    def split(regex: str) -> dict[str, Any]:
        return {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        }

    empty = fastbpe.check(_tiny(pre_tokenizer=split(r"\p{L}*")), [])[0]
    assert (empty.ok, empty.reason) == (False, "split regex can match the empty string")
    # A Split that leaves gaps: tokenizers keeps the text between matches, and so must the fast path.
    gaps = HFTokenizer(json.dumps(_tiny(pre_tokenizer=split(r"[a-c]+"))), id="gaps")
    assert gaps.engine == "tiktoken"
    for text in ("xxabcyy abc", "  ab  c ", "zzz"):
        assert gaps.encode_text(text, at_start=True) == reference(gaps, text)


# --------------------------------------------------------------------------------------------------- disk cache


def test_verdict_is_cached_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path))
    gpt2 = TOKENIZERS["gguf:gpt-2"]
    first = HFTokenizer(gpt2._json_text, id="gpt2-a")
    assert first.engine == "tiktoken"
    metas = list((tmp_path / "fastbpe").glob("*.json"))
    ranks = list((tmp_path / "fastbpe").glob("*.ranks"))
    assert len(ranks) == 1 and len([m for m in metas if not m.name.startswith("nfc-")]) == 1
    # A damaged ranks file is not trusted: the check runs again and rewrites it.
    ranks[0].write_bytes(ranks[0].read_bytes()[:-1] + b"\x00")
    again = HFTokenizer(gpt2._json_text, id="gpt2-b")
    assert again.engine == "tiktoken"
    text = "Hello world, it's 12345 ünïcödé"
    assert again.encode_text(text, at_start=True) == first.encode_text(text, at_start=True) == reference(gpt2, text)


def test_ranks_are_also_kept_as_a_marshal_dump_and_a_bad_one_counts_as_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16 item 1: the rank table is read back through `marshal` (faster than unpacking the packed form); a
    dump that is damaged, foreign or of another type is never used: the packed form (checked by its digest) is,
    and the dump is written again."""
    import marshal

    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path))
    qwen = TOKENIZERS["gguf:qwen2"]
    text = "Hello world, it's 12345 ünïcödé 天空"
    expected = reference(qwen, text)
    first = HFTokenizer(qwen._json_text, id="qwen2-a")
    assert first.encode_text(text, at_start=True) == expected
    [dump] = (tmp_path / "fastbpe").glob("*.marshal*")
    kept = dump.read_bytes()
    magic = kept[: kept.index(b"\n") + 1]
    payload = marshal.dumps([1, 2, 3])
    bad = [
        b"",
        kept[:-1],  # truncated: its digest no longer matches
        kept[:-1] + bytes([kept[-1] ^ 1]),
        magic + hashlib.sha256(payload).digest() + payload,  # well-formed, but not a rank table
    ]
    for damaged in bad:
        dump.write_bytes(damaged)
        again = HFTokenizer(qwen._json_text, id="qwen2-b")
        assert again.encode_text(text, at_start=True) == expected
        rebuilt = dump.read_bytes()  # rebuilt from the packed form: the same table
        assert rebuilt[: len(magic)] == magic
        assert marshal.loads(rebuilt[len(magic) + 32 :]) == marshal.loads(kept[len(magic) + 32 :])
    # Read back through the dump, the table is the one the check proved.
    third = HFTokenizer(qwen._json_text, id="qwen2-c")
    assert third.encode_text(text, at_start=True) == expected
    assert first._choose_engine()[2].ranks == third._choose_engine()[2].ranks
