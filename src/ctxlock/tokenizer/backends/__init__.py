"""Tokenizer backends, one private module each, independent of each other: HF `tokenizer.json` (with
transformers' tokenizer classes and special-token sources), SentencePiece, Mistral Tekken, tiktoken files, and the
book fixture. Each implements `ctxlock.tokenizer.Tokenizer`."""

from ctxlock.tokenizer.backends._book import BookTokenizer
from ctxlock.tokenizer.backends._hf import HFTokenizer
from ctxlock.tokenizer.backends._hf_classes import PIPELINE_VERSION, SPM_NOTE, Pipeline, bare_bpe, spm_bpe
from ctxlock.tokenizer.backends._hf_pipeline import build_pipeline
from ctxlock.tokenizer.backends._sentencepiece import SentencePieceTokenizer, read_model_info
from ctxlock.tokenizer.backends._tekken import TekkenTokenizer
from ctxlock.tokenizer.backends._tiktoken_file import TiktokenTokenizer

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
