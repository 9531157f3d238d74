"""Tokenizer backends, one private module each, independent of each other: HF `tokenizer.json` (with
transformers' tokenizer classes and special-token sources), SentencePiece, Mistral Tekken, tiktoken files, and the
book fixture. Each implements `ctxlock.tokenizer.Tokenizer`.

The HF backend is imported with the package (most models are HF directories); the others when first named, so a
process that loads an HF directory never imports them."""

from typing import TYPE_CHECKING

from ctxlock.core import lazy_exports
from ctxlock.tokenizer.backends._hf import HFTokenizer
from ctxlock.tokenizer.backends._hf_classes import PIPELINE_VERSION, SPM_NOTE, Pipeline, bare_bpe, spm_bpe
from ctxlock.tokenizer.backends._hf_pipeline import build_pipeline

if TYPE_CHECKING:
    from ctxlock.tokenizer.backends._book import BookTokenizer
    from ctxlock.tokenizer.backends._sentencepiece import SentencePieceTokenizer, read_model_info
    from ctxlock.tokenizer.backends._tekken import TekkenTokenizer
    from ctxlock.tokenizer.backends._tiktoken_file import TiktokenTokenizer

_EXPORTS = {
    "BookTokenizer": "ctxlock.tokenizer.backends._book",
    "SentencePieceTokenizer": "ctxlock.tokenizer.backends._sentencepiece",
    "read_model_info": "ctxlock.tokenizer.backends._sentencepiece",
    "TekkenTokenizer": "ctxlock.tokenizer.backends._tekken",
    "TiktokenTokenizer": "ctxlock.tokenizer.backends._tiktoken_file",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "PIPELINE_VERSION",
    "SPM_NOTE",
    "BookTokenizer",
    "HFTokenizer",
    "Pipeline",
    "SentencePieceTokenizer",
    "TekkenTokenizer",
    "TiktokenTokenizer",
    "bare_bpe",
    "build_pipeline",
    "read_model_info",
    "spm_bpe",
]
