"""OpenAI counts from the real vocabulary: every text part of the conformance corpus equals tiktoken's count on the
same encoding, and the framing equals the cookbook's rule computed here from its description
(https://cookbook.openai.com/examples/how_to_count_tokens_with_tiktoken).

The reference is tiktoken itself, given the ranks file the bpe-openai package ships with the sha256 tiktoken's own
encoding definitions expect (tiktoken_ext/openai_public.py): the vocabulary is verified, not trusted."""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiktoken

from conformance import conversations
from ctxlock.artifacts import openai_encoding
from ctxlock.providers import count_provider

PINNED = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
MODELS = {"o200k_base": "gpt-4o", "cl100k_base": "gpt-4"}


URLS = {name: f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken" for name in PINNED}


def _reference(name: str, cache: Path) -> tiktoken.Encoding:
    """tiktoken's own encoding, offline: its loader reads the file from its cache (named by the sha1 of the URL,
    tiktoken/load.py) and checks the sha256 its definition expects before using it."""
    raw = gzip.decompress(importlib.resources.files("bpe_openai").joinpath(f"data/{name}.tiktoken.gz").read_bytes())
    assert hashlib.sha256(raw).hexdigest() == PINNED[name]
    (cache / hashlib.sha1(URLS[name].encode()).hexdigest()).write_bytes(raw)
    return tiktoken.get_encoding(name)


@pytest.fixture(scope="module", params=sorted(PINNED))
def encoding(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, tiktoken.Encoding]]:
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        yield request.param, _reference(request.param, cache)


def _texts(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return []


def _cookbook_framing(enc: tiktoken.Encoding, messages: list[dict[str, Any]]) -> int:
    n = 3  # the reply's priming
    for m in messages:
        n += 3 + len(enc.encode(m["role"], disallowed_special=()))
        if m.get("name"):
            n += 1 + len(enc.encode(m["name"], disallowed_special=()))
    return n


def test_the_model_names_map_as_tiktoken_maps_them() -> None:
    for name in ("gpt-4o", "gpt-4o-2024-08-06", "gpt-4.1-mini", "gpt-5", "o3", "o4-mini", "gpt-4", "gpt-3.5-turbo"):
        assert openai_encoding(name) == tiktoken.encoding_name_for_model(name), name


def test_every_text_part_of_the_corpus_equals_tiktoken(encoding: tuple[str, tiktoken.Encoding]) -> None:
    name, enc = encoding
    model = MODELS[name]
    checked = 0
    for stem, request, _ in conversations():
        counted = count_provider(request, provider="openai", model=model)
        parts = {p.part: p for p in counted.parts}
        messages = request["messages"]
        for j, message in enumerate(messages):
            expected = sum(len(enc.encode(t, disallowed_special=())) for t in _texts(message))
            part = parts[f"messages[{j}]"]
            assert (part.tokens, part.basis) == (expected, "exact"), (stem, j)
            checked += 1
        framing = parts["framing"]
        assert (framing.tokens, framing.basis) == (_cookbook_framing(enc, messages), "documented"), stem
        assert counted.low <= counted.total <= counted.high
    assert checked == sum(len(r["messages"]) for _, r, _ in conversations()) > 50


def test_special_token_text_is_counted_as_text(encoding: tuple[str, tiktoken.Encoding]) -> None:
    name, enc = encoding
    text = "say <|endoftext|> and <|endofprompt|> and <|fim_prefix|> literally"
    request = {"messages": [{"role": "user", "content": text}]}
    part = count_provider(request, provider="openai", model=MODELS[name]).parts[0]
    assert part.tokens == len(enc.encode(text, disallowed_special=())) == len(enc.encode_ordinary(text))
