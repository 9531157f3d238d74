"""HF model directories built from the cached real vocabularies, for the tokenizer-class and slow-file tests.

Each directory holds what people's directories hold: a `tokenizer.json` (the GGUF vocabulary converted by ctxlock,
optionally edited the way fine-tuned checkpoints differ, e.g. `"normalizer": null`), a `tokenizer_config.json`
naming a transformers tokenizer class, a chat template, and whatever else a test asks for (`config.json`,
`added_tokens.json`, slow `vocab.json` + `merges.txt` instead of `tokenizer.json`). The reference is transformers'
`AutoTokenizer.from_pretrained` on the very same directory.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import fetched

# One transformers class per cached vocabulary that class is used with.
CLASS_VOCABS: dict[str, str] = {
    "Qwen2Tokenizer": "qwen2",
    "Qwen3_5Tokenizer": "qwen35",
    "LlamaTokenizer": "llama-spm",
    "CodeLlamaTokenizer": "llama-spm",
    "GemmaTokenizer": "gemma-4",
    "GPT2Tokenizer": "gpt-2",
    "GPTNeoXTokenizer": "gpt-neox",
    "CohereTokenizer": "command-r",
}

# A template that puts each message between the model's own BOS/EOS strings, so control tokens, text runs after
# them and the text of every message all go through the tokenizer as apply_chat_template sends them.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ bos_token or '' }}{{ m['role'] }}\n{{ m['content'] }}{{ eos_token or '' }}\n"
    "{% endfor %}{% if add_generation_prompt %}{{ bos_token or '' }}assistant\n{% endif %}"
)

# Text transformers' classes and the files disagree on: non-NFC sequences (the issue's repro), digits, spaces.
NON_NFC = [
    "e\u0301",  # e + combining acute: NFC makes it é
    "\u1100\u1161\u11a8 \u1112\u1161\u11ab",  # Hangul jamo: NFC composes syllables
    "A\u030a \u2126 \ufb01",  # Å (decomposed), Ω (ohm sign), ﬁ: NFC changes the first two
    "café  naïve\u0301\n\n  12345 tabs\tand  double  spaces",
]


@functools.cache
def gguf_tokenizer_json(vocab: str) -> str:
    """ctxlock's conversion of `ggml-vocab-<vocab>.gguf` to a tokenizer.json (cached by its digest)."""
    from ctxlock.artifacts import load_artifacts

    return load_artifacts(fetched.gguf_path(vocab)).tokenizer._json_text


@functools.cache
def gguf_special_tokens(vocab: str) -> dict[str, str]:
    from ctxlock.artifacts import load_artifacts

    return dict(load_artifacts(fetched.gguf_path(vocab)).special_tokens)


def build_dir(
    root: Path,
    vocab: str,
    tokenizer_class: str | None,
    *,
    edit: Callable[[dict[str, Any]], None] | None = None,
    config: Mapping[str, Any] | None = None,
    model_config: Mapping[str, Any] | None = None,
    slow: bool = False,
    files: Mapping[str, str] | None = None,
) -> Path:
    """Write an HF directory for `vocab` into `root` (created) and return it.

    `edit` changes the tokenizer.json data before it is written; `config` adds to tokenizer_config.json;
    `model_config` is written as config.json; `slow` writes vocab.json + merges.txt instead of tokenizer.json
    (a BPE vocabulary's own pieces, one merge per line, with the `#version` line tokenizers' files start with)."""
    root.mkdir(parents=True, exist_ok=False)
    data = json.loads(gguf_tokenizer_json(vocab))
    if edit is not None:
        data = copy.deepcopy(data)
        edit(data)
    if slow:
        model = data["model"]
        (root / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        (root / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    else:
        (root / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    cfg: dict[str, Any] = dict(gguf_special_tokens(vocab))
    if tokenizer_class is not None:
        cfg["tokenizer_class"] = tokenizer_class
    cfg.update(config or {})
    (root / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False), encoding="utf-8")
    if model_config is not None:
        (root / "config.json").write_text(json.dumps(model_config), encoding="utf-8")
    (root / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    for name, text in (files or {}).items():
        (root / name).write_text(text, encoding="utf-8")
    return root


@functools.cache
def auto_tokenizer(path: Path) -> Any:
    """transformers' AutoTokenizer for the directory (each test directory is new, so never another's)."""
    import transformers
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(path))


def reference_chat_ids(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """`apply_chat_template(tokenize=True)`, with ctxlock's default of a generation prompt."""
    kwargs.setdefault("add_generation_prompt", True)
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    if isinstance(out, Mapping) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(i) for i in out]
