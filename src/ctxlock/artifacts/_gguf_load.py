"""A GGUF file as a model: its vocabulary converted natively to a `tokenizers` pipeline (cached on disk by the
file's sha256) and its embedded chat template(s).

This module sits above the GGUF reader (`gguf`) and the converters (`gguf_bpe`, `gguf_spm`): `tokenizer_json`
picks the converter for the vocabulary's model type, so the reader and the converters never import each other.
`GGUFTokenizer` is the HF backend over the converted pipeline, with the GGUF file as its artifact.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ctxlock.artifacts._common import ModelArtifacts, finish
from ctxlock.artifacts._gguf import GGUFVocab, read_vocab
from ctxlock.artifacts._gguf_bpe import bpe_tokenizer_json
from ctxlock.artifacts._gguf_constants import Keys
from ctxlock.artifacts._gguf_spm import (
    gemma4_tokenizer_json,
    spm_tokenizer_json,
    unigram_tokenizer_json,
    wordpiece_tokenizer_json,
)
from ctxlock.economics import capacity_from_files
from ctxlock.errors import ArtifactFormatError
from ctxlock.outside import file_sha256, load_cached, store_cached
from ctxlock.template import ChatTemplate, TemplateSet, compile_template
from ctxlock.tokenizer import ManifestFiles
from ctxlock.tokenizer.backends import HFTokenizer


class GGUFTokenizer(HFTokenizer):
    """The HF backend over a GGUF file's converted vocabulary; `sha256` is the GGUF file's digest, and the file
    itself is the artifact a replay needs."""

    format = "gguf"

    @classmethod
    def from_manifest(cls, spec: Mapping[str, Any], files: ManifestFiles, model_id: str) -> HFTokenizer:
        """`{"format": "gguf", "file": "model.gguf"}`: the file's vocabulary (its templates are not the manifest's)."""
        return load_gguf(files.file()).tokenizer  # type: ignore[return-value]

    def replay_spec(self) -> tuple[dict[str, Any], dict[str, Path | bytes]]:
        # Converted from a GGUF file: the file itself is the artifact (its digest is this tokenizer's).
        name = Path(self.source).name
        return {"format": "gguf", "file": name}, {name: Path(self.source)}


def tokenizer_json(vocab: GGUFVocab) -> dict[str, Any]:
    """The `tokenizers` pipeline equivalent to this GGUF vocabulary, by model type."""
    if vocab.model == "gpt2":
        return bpe_tokenizer_json(vocab)
    if vocab.model == "llama":
        return spm_tokenizer_json(vocab)
    if vocab.model == "bert":
        return wordpiece_tokenizer_json(vocab)
    if vocab.model == "t5":
        return unigram_tokenizer_json(vocab)
    if vocab.model == "gemma4":
        return gemma4_tokenizer_json(vocab)
    raise ArtifactFormatError(
        f"tokenizer model {vocab.model!r} is not supported",
        path=f"{vocab.path}:{Keys.Tokenizer.MODEL}",
        hint="supported: gpt2 (byte-level BPE), llama (SentencePiece BPE), bert (WordPiece), t5 (Unigram), gemma4",
    )


_TEMPLATE_VARIABLES = {
    "bos": "bos_token",
    "eos": "eos_token",
    "unk": "unk_token",
    "pad": "pad_token",
    "sep": "sep_token",
    "cls": "cls_token",
    "mask": "mask_token",
}


def conversion(vocab: GGUFVocab) -> dict[str, Any]:
    """Everything a model needs from a GGUF file, as JSON-ready data for the conversion cache."""
    return {
        "tokenizer_json": json.dumps(tokenizer_json(vocab), ensure_ascii=False),
        "architecture": vocab.architecture,
        "model": vocab.model,
        "pre": vocab.pre,
        "n_tokens": len(vocab.tokens),
        "special_ids": dict(vocab.special_ids),
        "special_tokens": {
            var: vocab.tokens[vocab.special_ids[name]]
            for name, var in _TEMPLATE_VARIABLES.items()
            if name in vocab.special_ids
        },
        "add_bos": vocab.add_bos,
        "add_eos": vocab.add_eos,
        "add_space_prefix": vocab.add_space_prefix,
        "chat_templates": dict(vocab.chat_templates),
        "context_length": _json_ready(vocab.context_length),
    }


def _json_ready(value: Any) -> Any:
    # A value of an unexpected type is kept as its repr, for capacity's note on it, never dropped.
    return value if value is None or isinstance(value, int | float | str) else repr(value)[:80]


def load_gguf(path: Path) -> ModelArtifacts:
    """A GGUF file: its vocabulary converted natively (cached by sha256) and its embedded chat template(s)."""
    sha = file_sha256(path)
    data = load_cached("gguf", sha)
    if data is None or "context_length" not in data:  # an entry cached before capacity was read is made again
        data = conversion(read_vocab(path))
        store_cached("gguf", sha, data)
    tokenizer = GGUFTokenizer(
        data["tokenizer_json"],
        id=path.name,
        source=str(path),
        sha256=sha,
        description={
            "gguf_model": data["model"],
            "gguf_pre": data["pre"],
            "architecture": data["architecture"],
            "add_bos": data["add_bos"],
            "add_eos": data["add_eos"],
        },
    )
    templates = None
    if data["chat_templates"]:
        # The embedded template is untrusted like any other: compiled and rendered in the same limited sandbox.
        names, items = [], []
        for name, source in data["chat_templates"].items():
            key = "tokenizer.chat_template" if name == "default" else f"tokenizer.chat_template.{name}"
            template = ChatTemplate(source, id=f"{path.name}/{name}", origin=f"{path}:{key}")
            compile_template(template)
            names.append(name)
            items.append(template)
        templates = TemplateSet(tuple(items), tuple(names))
    cap = capacity_from_files(
        gguf={"architecture": data["architecture"], "context_length": data["context_length"]}, gguf_name=path.name
    )
    return finish(path.name, str(path), tokenizer, templates, data["special_tokens"], "GGUF file", cap)


__all__ = ["GGUFTokenizer", "conversion", "load_gguf", "tokenizer_json"]
