"""The tokenizer backends, by the `format` a `ctxlock.json` manifest names (and `Tokenizer.format` reports).

One entry per backend: adding a backend is its module (a `TokenizerBase` subclass with `from_manifest`) and one
line here. Nothing else branches on the backend: `decode`, `constrain` and the token bytes go through the
protocol (`ctxlock.tokenizer`), and manifests are loaded through `backend(format).from_manifest`.

The registry lives in the artifacts layer because one backend, GGUF, is built from what the artifacts layer
reads (the GGUF reader and its converters); the others are in `ctxlock.tokenizer`.
"""

from __future__ import annotations

from ctxlock.artifacts._gguf_load import GGUFTokenizer
from ctxlock.tokenizer import TokenizerBase
from ctxlock.tokenizer.backends import (
    BookTokenizer,
    HFTokenizer,
    SentencePieceTokenizer,
    TekkenTokenizer,
    TiktokenTokenizer,
)

BACKENDS: dict[str, type[TokenizerBase]] = {
    "book": BookTokenizer,
    "tekken": TekkenTokenizer,
    "tiktoken": TiktokenTokenizer,
    "sentencepiece": SentencePieceTokenizer,
    "gguf": GGUFTokenizer,
    "hf-tokenizers": HFTokenizer,
}


def backend(format: str) -> type[TokenizerBase] | None:
    """The backend class for a manifest's tokenizer `format`, or None for a format no backend reads."""
    return BACKENDS.get(format) if isinstance(format, str) else None


def formats_hint() -> str:
    """The known formats, for an error hint: "book, tekken, ... or hf-tokenizers"."""
    names = list(BACKENDS)
    return f"use {', '.join(names[:-1])} or {names[-1]}"


__all__ = ["BACKENDS", "backend", "formats_hint"]
