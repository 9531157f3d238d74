"""A tokenizer.json's normalizer on its own: what the fast engine needs of `tokenizers` for text that is not
NFC-inert, without building the whole pipeline (vocabulary, merges, added tokens: about 0.3 s for a 150k vocabulary).

`tokenizers` deserializes the file's `normalizer` section into the very normalizer the full pipeline holds: here it
reads a tokenizer.json with that section, an empty BPE model and nothing else, so `normalize_str` runs the same code on
the same configuration. tests/tokenizer/test_hf_normalizer.py compares it with the full pipeline's normalizer on text
that every normalization form changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any


def normalizer_alone(section: Mapping[str, Any] | None) -> Callable[[str], str] | None:
    """`normalize_str` of the normalizer a tokenizer.json's `normalizer` section describes (None: it has none)."""
    if section is None:
        return None
    import tokenizers  # on first use: a text that needs no normalizing never loads it

    tiny: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": section,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": None,
        "model": {"type": "BPE", "vocab": {}, "merges": []},
    }
    normalizer = tokenizers.Tokenizer.from_str(json.dumps(tiny)).normalizer
    if normalizer is None:
        return None

    def normalize(text: str) -> str:
        normalized: str = normalizer.normalize_str(text)
        return normalized

    return normalize
