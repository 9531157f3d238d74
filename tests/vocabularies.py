"""The `tokenizers`-backed vocabularies the fast-path suites run on: every GGUF file of llama.cpp's distribution that
loads as an `HFTokenizer`, and transformers' HF conversions. Loaded once per test process and shared."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache

import fetched
from ctxlock.artifacts import load_artifacts
from ctxlock.tokenizer._prefix import WholeText
from ctxlock.tokenizer.backends._hf import HFTokenizer

HF_DIRS = ("qwen2", "llama-bpe", "qwen35", "deepseek-llm", "phi-3")


@cache
def hf_backend_tokenizers() -> dict[str, HFTokenizer]:
    """{"gguf:<name>" | "hf:<name>": tokenizer}."""
    out: dict[str, HFTokenizer] = {}
    for name in fetched.gguf_names():
        tok = load_artifacts(fetched.gguf_path(name)).tokenizer
        if isinstance(tok, HFTokenizer):
            out[f"gguf:{name}"] = tok
    for name in HF_DIRS:
        tok = load_artifacts(fetched.hf_tokenizer_dir(name)).tokenizer
        assert isinstance(tok, HFTokenizer)
        out[f"hf:{name}"] = tok
    return out


class _Loaded(Mapping[str, HFTokenizer]):
    """`hf_backend_tokenizers()`, looked up at each use: a module may keep this at its top level (and compute its
    parameters from it at collection) without keeping the vocabularies alive once the caches are let go
    (tests/conftest.py lets them go after collection and between modules)."""

    def __getitem__(self, key: str) -> HFTokenizer:
        return hf_backend_tokenizers()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(hf_backend_tokenizers())

    def __len__(self) -> int:
        return len(hf_backend_tokenizers())


TOKENIZERS: Mapping[str, HFTokenizer] = _Loaded()

ENGINES = ("tiktoken", "fastokens")


@contextmanager
def native_engine(whole: WholeText, engine: str) -> Iterator[WholeText]:
    """Make `whole`'s native calls with one engine for the duration: "fastokens" (built and checked here, and it
    must be admitted) or "tiktoken" (the accelerator detached)."""
    saved = whole.accelerator
    if engine == "fastokens":
        assert saved is not None and saved.wait(), f"fastokens not admitted: {saved and saved.describe()}"
        assert whole.engine == "fastokens"
        yield whole
        return
    whole.accelerator = None
    try:
        assert whole.engine == "tiktoken"
        yield whole
    finally:
        whole.accelerator = saved
