"""The fast engine builds a tokenizer.json's normalizer alone (`_hf_normalizer.normalizer_alone`), not the whole
`tokenizers` pipeline: it must be the pipeline's own normalizer, and a text that needs normalizing must get the
reference's ids without the pipeline being built."""

from __future__ import annotations

import functools
import json

import pytest
import tokenizers

import fetched
from ctxlock.settings import fast_path, reference_path
from ctxlock.tokenizer.backends._hf import HFTokenizer
from ctxlock.tokenizer.backends._hf_normalizer import normalizer_alone

pytestmark = pytest.mark.fast_path  # about the fast path itself: on even under CTXLOCK_FAST=0

# Text every normalization form touches: combining marks, precomposed letters, Hangul jamo, compatibility forms,
# characters newer than some Unicode tables (U+11938), case, accents and whitespace.
TEXTS = [
    "e\u0301 A\u030a \u212b \u1100\u1161\u11a8 \ufb01 \u2460 \uff21 \U00011935\U00011930 \U00011938 Straße ǅ İ",
    "".join(chr(c) for c in range(0x300, 0x370)) + " " + "".join(chr(c) for c in range(0xAC00, 0xAC40)),
    "  Hello\tWORLD\n  ÀÉÎÕÜ ﬃ ㍿ 𝔘𝔫𝔦 ",
    "",
]

SECTIONS = [
    {"type": "NFC"},
    {"type": "NFKD"},
    {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"}]},
    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    {"type": "Prepend", "prepend": "\u2581"},
]


@functools.cache
def _qwen_head() -> dict:
    """qwen2's tokenizer.json with its first 2,000 tokens and merges among them (a whole pipeline, smaller)."""
    data = json.loads(fetched.hf_tokenizer_dir("qwen2").joinpath("tokenizer.json").read_text("utf-8"))
    vocab = {t: i for t, i in data["model"]["vocab"].items() if i < 2000}
    merges = [m for m in data["model"]["merges"] if "".join(m if isinstance(m, list) else m.split(" ")) in vocab]
    data["model"] = {**data["model"], "vocab": vocab, "merges": merges}
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] >= 2000]
    return data


def _full(section: dict) -> tokenizers.normalizers.Normalizer:
    """The normalizer of a whole pipeline holding `section` (qwen2's added tokens, pre-tokenizer, decoder, ...)."""
    data = {**_qwen_head(), "normalizer": section}
    return tokenizers.Tokenizer.from_str(json.dumps(data)).normalizer


def test_no_section_is_no_normalizer() -> None:
    assert normalizer_alone(None) is None


@pytest.mark.parametrize("section", SECTIONS, ids=[s["type"] for s in SECTIONS])
def test_alone_equals_the_whole_pipelines_normalizer(section: dict) -> None:
    alone = normalizer_alone(section)
    assert alone is not None
    full = _full(section)
    for text in TEXTS:
        assert alone(text) == full.normalize_str(text)
    assert alone(TEXTS[0]) != TEXTS[0]  # the texts do exercise it


def test_a_text_that_needs_normalizing_does_not_build_the_pipeline() -> None:
    text = fetched.hf_tokenizer_dir("qwen2").joinpath("tokenizer.json").read_text("utf-8")
    first = HFTokenizer(text, id="qwen2 (first)")  # builds it if this cache never saw the file, and says so on disk
    second = HFTokenizer(text, id="qwen2 (a later process)")
    assert "_tok" not in second.__dict__
    with fast_path():
        assert second.engine == "tiktoken"
        fast = [second.encode_text(t, at_start=True) for t in TEXTS]
    assert "_tok" not in second.__dict__, "the fast engine built the whole pipeline for its normalizer"
    with reference_path():
        assert first.engine == "tokenizers"
        assert fast == [first.encode_text(t, at_start=True) for t in TEXTS]
