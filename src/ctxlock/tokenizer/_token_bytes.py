"""The exact bytes each token id stands for, for every tokenizer backend: what a constraint engine needs.

Each backend owns its mapping (`Tokenizer.token_bytes()`); this module holds what they share (GPT-2's byte table,
the `<0xNN>` byte pieces) and `token_bytes(tokenizer)`, the stage function.

A grammar engine (llguidance, xgrammar, outlines) matches bytes, so it needs the vocabulary as `id -> bytes`
rather than as the vocabulary's own spelling of each token. The spelling depends on the backend:

- byte-level BPE (GPT-2, Llama 3, Qwen2, ...: a `ByteLevel` decoder): every character of a token stands for one
  byte through GPT-2's byte<->unicode table (`Ġ` is 0x20, `Ċ` is 0x0A);
- SentencePiece-style vocabularies (a `Replace("▁", " ")` / `Metaspace` decoder, or a SentencePiece `.model`):
  `▁` is a space, and with byte fallback the pieces `<0x00>` .. `<0xFF>` are single raw bytes;
- Tekken and tiktoken ranks files hold raw bytes already;
- added tokens (HF `added_tokens`, tiktoken specials, SentencePiece CONTROL pieces) are their content as UTF-8.

Control tokens are listed apart in `special`: they are never text (a grammar must not put `</s>` inside a JSON
string), and llguidance is told so with its 0xFF marker byte. Ids that no text can produce (unused padding rows,
gaps in an id space) are `b""`.

The HF mapping is checked against llguidance's own reader of `tokenizer.json` files, the Tekken one against
mistral-common's `id_to_byte_piece`, and every backend against its own `decode` (tests/generation/test_constrain.py).
WordPiece vocabularies (BERT) are refused: `##` continuation pieces and the spaces `decode` inserts between words
depend on the neighbours, so no token has bytes of its own.
"""

from __future__ import annotations

import re

from ctxlock import caches
from ctxlock.tokenizer._base import TokenBytes, Tokenizer

__all__ = ["BYTE_PIECE", "SPIECE_UNDERLINE", "TokenBytes", "byte_level_decoder_table", "byte_piece", "token_bytes"]

BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
SPIECE_UNDERLINE = "\u2581"


@caches.memoize("tokenizer.byte_level_table", 1, scope="artifact")
def byte_level_decoder_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable Latin-1 bytes stand for themselves, the other 68
    bytes are shifted to U+0100 and up in byte order (`bytes_to_unicode` in GPT-2's encoder.py)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table.values():
            table[chr(0x100 + shifted)] = b
            shifted += 1
    return table


def byte_piece(piece: str) -> bytes | None:
    """The byte a SentencePiece-style byte piece (`<0x0A>`) stands for, or None for any other piece."""
    m = BYTE_PIECE.fullmatch(piece)
    return bytes([int(m.group(1), 16)]) if m else None


def token_bytes(tokenizer: Tokenizer) -> TokenBytes:
    """Every id's bytes (`tokenizer.token_bytes()`). Raises `ConstraintError` for a vocabulary without per-token
    bytes."""
    return tokenizer.token_bytes()
