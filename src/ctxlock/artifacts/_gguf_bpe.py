"""Rebuild a byte-level BPE tokenizer (`tokenizer.ggml.model == "gpt2"`) from a GGUF vocabulary.

A GGUF file keeps the vocabulary, the merges and the token types, but not the pipeline around them: the
normalizer, the pre-tokenizer, the BPE options and the post-processor are reduced to one name,
`tokenizer.ggml.pre`. llama.cpp maps that name to a list of regexes that approximate the original pipeline.
Here the name selects a recipe that reproduces the *original* HF `tokenizer.json` pipeline of the model the
name was registered for (llama.cpp's `convert_hf_to_gguf_update.py`), so `tokenizers` gives the same ids as
`AutoTokenizer.from_pretrained(repo).encode(text, add_special_tokens=False)`: that is what llama.cpp's own
tokenizer test vectors (`ggml-vocab-*.gguf.inp/.out`) were generated with.

The recipes are data (`BPE_PRE_TOKENIZERS`); `bpe_tokenizer_json` only assembles them with the vocabulary.
An unknown name is an error: a wrong guess would give plausible but different ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ctxlock.artifacts._gguf import GGUFVocab
from ctxlock.artifacts._gguf_constants import TokenType
from ctxlock.core import FrozenDict, freeze, thaw
from ctxlock.errors import ArtifactFormatError

__all__ = ["BPE_PRE_TOKENIZERS", "BPERecipe", "bpe_tokenizer_json"]

# ------------------------------------------------------------------------------------------ regexes
# The regexes of the models' tokenizer.json files, character for character: they are data and must match
# exactly. llama.cpp's llama-vocab.cpp lists the same strings per pre type, except that it rewrites
# `(?i:...)` for its own regex engine; `tokenizers` (Oniguruma) takes the original form. GPT-2's own regex
# needs no entry: ByteLevel(use_regex=True) applies it.

# Qwen/Qwen1.5-7B (and Qwen2): single digits.
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3.5: combining marks join letters.
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# meta-llama/Meta-Llama-3-8B: digits in runs of up to three.
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# deepseek-ai/deepseek-llm-7b-base and deepseek-coder-6.7b-base.
_DEEPSEEK_NEWLINE = "[\r\n]"
_DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+"
)
_DEEPSEEK_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
_DEEPSEEK_TRAILING_SPACE = r"\s+$"
_DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"


# ------------------------------------------------------------------------------------ JSON pieces


def _split(pattern: str) -> FrozenDict:
    return freeze({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False})


def _digits(individual: bool) -> FrozenDict:
    return freeze({"type": "Digits", "individual_digits": individual})


def _byte_level(use_regex: bool, trim_offsets: bool = True) -> FrozenDict:
    return freeze(
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trim_offsets, "use_regex": use_regex}
    )


_NFC = freeze({"type": "NFC"})
_PUNCTUATION = freeze({"type": "Punctuation", "behavior": "Contiguous"})


@dataclass(frozen=True)
class BPERecipe:
    """The parts of a model's original tokenizer.json that a GGUF file does not keep."""

    source: str  # the HF repo the pre name was registered for (convert_hf_to_gguf_update.py)
    pre_tokenizers: tuple[FrozenDict, ...]  # tokenizers JSON, applied in order
    normalizer: FrozenDict | None = None
    ignore_merges: bool = False  # Llama 3: a word already in the vocabulary is one token, merges or not
    add_bos: bool = False  # llama.cpp's default when the GGUF has no tokenizer.ggml.add_bos_token
    added_normalized: bool = False  # `normalized` of the non-special added tokens
    notes: str = field(default="", compare=False)


_GPT2_DEFAULT = BPERecipe(
    source="openai-community/gpt2",
    pre_tokenizers=(_byte_level(use_regex=True),),
    notes="ByteLevel with GPT-2's built-in regex, no normalizer",
)

BPE_PRE_TOKENIZERS: Mapping[str, BPERecipe] = MappingProxyType(
    {
        "default": _GPT2_DEFAULT,
        "gpt-2": _GPT2_DEFAULT,
        "qwen2": BPERecipe(
            source="Qwen/Qwen1.5-7B",
            normalizer=_NFC,
            pre_tokenizers=(_split(_QWEN2), _byte_level(use_regex=False, trim_offsets=False)),
            notes="NFC is not exercised by the vectors (none is NFD)",
        ),
        "qwen35": BPERecipe(
            source="Qwen/Qwen3.5-9B-Instruct",
            pre_tokenizers=(_split(_QWEN35), _byte_level(use_regex=False, trim_offsets=False)),
            notes="no normalizer: the vectors keep NFD input decomposed",
        ),
        "llama-bpe": BPERecipe(
            source="meta-llama/Meta-Llama-3-8B",
            pre_tokenizers=(_split(_LLAMA3), _byte_level(use_regex=False)),
            ignore_merges=True,
            add_bos=True,
            notes="ignore_merges and add_bos as llama.cpp sets them for LLAMA3",
        ),
        "deepseek-llm": BPERecipe(
            source="deepseek-ai/deepseek-llm-7b-base",
            pre_tokenizers=(
                _split(_DEEPSEEK_NEWLINE),
                _split(_DEEPSEEK_LETTERS),
                _split(_DEEPSEEK_PUNCT),
                _split(_DEEPSEEK_TRAILING_SPACE),
                _split(_DEEPSEEK_CJK),
                _digits(individual=False),
                _byte_level(use_regex=False),
            ),
            notes="the same regex list as llama.cpp's DEEPSEEK_LLM",
        ),
        "deepseek-coder": BPERecipe(
            source="deepseek-ai/deepseek-coder-6.7b-base",
            pre_tokenizers=(
                _split(_DEEPSEEK_NEWLINE),
                _split(r"\s?\p{L}+"),
                _split(r"\s?\p{P}+"),
                _split(_DEEPSEEK_CJK),
                _digits(individual=True),
                _byte_level(use_regex=False),
            ),
            notes="the same regex list as llama.cpp's DEEPSEEK_CODER",
        ),
        "falcon": BPERecipe(
            source="tiiuae/falcon-7b",
            pre_tokenizers=(
                _PUNCTUATION,
                _byte_level(use_regex=True),
                _digits(individual=False),
                _split("[0-9][0-9][0-9]"),
            ),
            notes="Punctuation runs, then GPT-2, then numbers in groups of three",
        ),
        "mpt": BPERecipe(
            source="mosaicml/mpt-7b (EleutherAI/gpt-neox-20b tokenizer)",
            normalizer=_NFC,
            pre_tokenizers=(_byte_level(use_regex=True),),
            added_normalized=True,
            notes="the whitespace-run added tokens are normalized (matched after NFC)",
        ),
        "starcoder": BPERecipe(
            source="bigcode/starcoder2-3b",
            pre_tokenizers=(_digits(individual=True), _byte_level(use_regex=True)),
        ),
        "refact": BPERecipe(
            source="smallcloudai/Refact-1_6-base",
            pre_tokenizers=(_digits(individual=True), _byte_level(use_regex=True)),
        ),
        "command-r": BPERecipe(
            source="CohereForAI/c4ai-command-r-v01",
            normalizer=_NFC,
            pre_tokenizers=(_digits(individual=True), _byte_level(use_regex=True)),
        ),
    }
)


# ------------------------------------------------------------------------------------------ build


def _recipe(vocab: GGUFVocab) -> BPERecipe:
    if vocab.model != "gpt2":
        raise ArtifactFormatError(
            f"tokenizer model {vocab.model!r} is not byte-level BPE",
            path=f"{vocab.path}:tokenizer.ggml.model",
            hint="only GGUF vocabularies with tokenizer.ggml.model == 'gpt2' are built here",
        )
    name = vocab.pre if vocab.pre is not None else "default"
    recipe = BPE_PRE_TOKENIZERS.get(name)
    if recipe is None:
        raise ArtifactFormatError(
            f"unknown pre-tokenizer {vocab.pre!r}",
            path=f"{vocab.path}:tokenizer.ggml.pre",
            hint=f"ctxlock knows {', '.join(sorted(BPE_PRE_TOKENIZERS))}; load the model's tokenizer.json instead",
        )
    return recipe


def bpe_tokenizer_json(vocab: GGUFVocab) -> dict[str, Any]:
    """A `tokenizers` JSON dict for a byte-level BPE GGUF vocabulary (load it with `Tokenizer.from_str`)."""
    recipe = _recipe(vocab)
    if vocab.merges is None:
        raise ArtifactFormatError(
            "a byte-level BPE vocabulary without merges",
            path=f"{vocab.path}:tokenizer.ggml.merges",
            hint="the GGUF file is incomplete; re-convert it",
        )
    tokens = vocab.tokens
    # First id wins if a string repeats (it cannot be two vocabulary entries); reversed() keeps the first.
    ids = {tok: i for i, tok in reversed(tuple(enumerate(tokens)))}
    merges = [merge.partition(" ")[::2] for merge in vocab.merges]

    types = vocab.token_types
    added: list[dict[str, Any]] = []
    if types is not None:
        control, user = int(TokenType.CONTROL), int(TokenType.USER_DEFINED)
        for i in ((types == control) | (types == user)).nonzero()[0].tolist():
            content = tokens[i]
            special = int(types[i]) == control
            if not special and _is_padding_filler(content, i):
                continue  # a filler the converter invented for an id the model never defined
            added.append(
                {
                    "id": i,
                    "content": content,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False if special else recipe.added_normalized,
                    "special": special,
                }
            )

    pre = [thaw(p) for p in recipe.pre_tokenizers]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": thaw(recipe.normalizer) if recipe.normalizer is not None else None,
        "pre_tokenizer": pre[0] if len(pre) == 1 else {"type": "Sequence", "pretokenizers": pre},
        "post_processor": _post_processor(vocab, recipe),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": recipe.ignore_merges,
            "vocab": ids,
            "merges": merges,
        },
    }


def _is_padding_filler(content: str, i: int) -> bool:
    return content == f"[PAD{i}]"


def _post_processor(vocab: GGUFVocab, recipe: BPERecipe) -> dict[str, Any]:
    add_bos = recipe.add_bos if vocab.add_bos is None else vocab.add_bos
    add_eos = bool(vocab.add_eos)
    bos = vocab.special_ids.get("bos") if add_bos else None
    eos = vocab.special_ids.get("eos") if add_eos else None
    if bos is None and eos is None:
        return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    special: dict[str, Any] = {}

    def piece(token_id: int | None, type_id: int) -> list[dict[str, Any]]:
        if token_id is None:
            return []
        name = vocab.tokens[token_id]
        special[name] = {"id": name, "ids": [token_id], "tokens": [name]}
        return [{"SpecialToken": {"id": name, "type_id": type_id}}]

    single = [*piece(bos, 0), {"Sequence": {"id": "A", "type_id": 0}}, *piece(eos, 0)]
    pair = [*single, *piece(bos, 1), {"Sequence": {"id": "B", "type_id": 1}}, *piece(eos, 1)]
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special}
