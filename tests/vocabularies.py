"""The `tokenizers`-backed vocabularies the fast-path suites run on: every GGUF file of llama.cpp's distribution that
loads as an `HFTokenizer`, and transformers' HF conversions. Loaded once per test process and shared."""

from __future__ import annotations

from functools import cache

import artifacts
from ctxlock.artifacts import load_artifacts
from ctxlock.tokenizer.hf import HFTokenizer

HF_DIRS = ("qwen2", "llama-bpe", "qwen35", "deepseek-llm", "phi-3")


@cache
def hf_backend_tokenizers() -> dict[str, HFTokenizer]:
    """{"gguf:<name>" | "hf:<name>": tokenizer}."""
    out: dict[str, HFTokenizer] = {}
    for name in artifacts.gguf_names():
        tok = load_artifacts(artifacts.gguf_path(name)).tokenizer
        if isinstance(tok, HFTokenizer):
            out[f"gguf:{name}"] = tok
    for name in HF_DIRS:
        tok = load_artifacts(artifacts.hf_tokenizer_dir(name)).tokenizer
        assert isinstance(tok, HFTokenizer)
        out[f"hf:{name}"] = tok
    return out
