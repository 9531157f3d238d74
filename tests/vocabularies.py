"""The `tokenizers`-backed vocabularies the fast-path suites run on: every GGUF file of llama.cpp's distribution that
loads as an `HFTokenizer`, and transformers' HF conversions: `TOKENIZERS`, by key ("gguf:<name>", "hf:<name>"),
each loaded when looked up, the two used last kept."""

from __future__ import annotations

import gc
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import fetched
from ctxlock.artifacts import load_gguf
from ctxlock.artifacts._hf_dir import load_hf_dir
from ctxlock.tokenizer._prefix import WholeText
from ctxlock.tokenizer.backends._hf import HFTokenizer

HF_DIRS = ("qwen2", "llama-bpe", "qwen35", "deepseek-llm", "phi-3")


_KEYS: list[tuple[str, ...]] = []  # backend_keys(), once found


def backend_keys() -> tuple[str, ...]:
    """Every GGUF vocabulary that loads as an `HFTokenizer`, then the HF directories: found by loading each once and
    letting it go. Kept for the whole process, not in a functools cache: a tuple of names holds no vocabulary, and
    tests/conftest.py empties the helpers' caches between modules, after which every module that iterates
    `TOKENIZERS` loaded every GGUF file once more to find them again."""
    if not _KEYS:
        keys = [
            f"gguf:{n}"
            for n in fetched.gguf_names()
            if isinstance(load_gguf(fetched.gguf_path(n)).tokenizer, HFTokenizer)
        ]
        _KEYS.append((*keys, *(f"hf:{name}" for name in HF_DIRS)))
    return _KEYS[0]


def _load(key: str) -> HFTokenizer:
    kind, name = key.split(":", 1)
    if kind == "gguf":
        tok = load_gguf(fetched.gguf_path(name)).tokenizer
    else:
        tok = load_hf_dir(fetched.hf_tokenizer_dir(name)).tokenizer
    assert isinstance(tok, HFTokenizer), key
    return tok


class _LastTwo:
    """One vocabulary, loaded on its own, outside ctxlock's model cache: only the two used last stay in memory
    (with the whole-text encoder and native engine each builds, about 150 MB a vocabulary). The one pushed out is
    collected at once: its encoder and engine refer to each other, and would otherwise wait for the collector. A
    module that runs its tests vocabulary by vocabulary (`RUN_BY = "key"`, tests/conftest.py) loads each once.
    `cache_clear`/`cache_info` as functools' caches have them, so tests/conftest.py lets it go with the rest."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, HFTokenizer] = OrderedDict()
        self.loads = 0

    def __call__(self, key: str) -> HFTokenizer:
        tok = self._kept.pop(key, None)
        if tok is None:
            if len(self._kept) >= 2:
                self._kept.popitem(last=False)
                gc.collect()
            tok = _load(key)
            self.loads += 1
        self._kept[key] = tok
        return tok

    def cache_clear(self) -> None:
        self._kept.clear()

    def cache_info(self) -> tuple[int, int]:
        return self.loads, len(self._kept)


backend_tokenizer = _LastTwo()


class _Loaded(Mapping[str, HFTokenizer]):
    """The vocabularies by key, each loaded when looked up (`backend_tokenizer`): a
    module may keep this at its top level (and compute its parameters from it at collection) without keeping every
    vocabulary alive."""

    def __getitem__(self, key: str) -> HFTokenizer:
        # A lookup loads that vocabulary alone (`_load` asserts it is an HFTokenizer): finding every key first would
        # load every GGUF file.
        kind, _, name = key.partition(":")
        known = fetched.gguf_names() if kind == "gguf" else HF_DIRS if kind == "hf" else ()
        if name not in known or (_KEYS and key not in _KEYS[0]):
            raise KeyError(key)
        return backend_tokenizer(key)

    def __iter__(self) -> Iterator[str]:
        return iter(backend_keys())

    def __len__(self) -> int:
        return len(backend_keys())


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
