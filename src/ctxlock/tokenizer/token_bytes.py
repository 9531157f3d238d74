"""The exact bytes each token id stands for, for every tokenizer backend: what a constraint engine needs.

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
mistral-common's `id_to_byte_piece`, and every backend against its own `decode` (tests/test_constrain.py).
WordPiece vocabularies (BERT) are refused: `##` continuation pieces and the spaces `decode` inserts between words
depend on the neighbours, so no token has bytes of its own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import ConstraintError
from . import Tokenizer

__all__ = ["TokenBytes", "byte_level_decoder_table", "token_bytes"]

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPIECE_UNDERLINE = "\u2581"


@dataclass(frozen=True)
class TokenBytes:
    """`pieces[i]` is the byte string of id i; `special` holds the control ids (their pieces are their content)."""

    pieces: tuple[bytes, ...]
    special: frozenset[int]
    scheme: str  # how the vocabulary spells bytes: byte-level, metaspace, raw, tiktoken, sentencepiece, book

    def __len__(self) -> int:
        return len(self.pieces)

    def join(self, ids: list[int] | tuple[int, ...]) -> bytes:
        """The bytes a grammar sees for `ids`: control tokens contribute nothing (they are not text)."""
        return b"".join(self.pieces[i] for i in ids if i not in self.special)


@lru_cache(maxsize=1)
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


def _decoder_types(node: Any) -> list[dict[str, Any]]:
    """The decoder steps of a tokenizer.json, a `Sequence` flattened."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [d for sub in node.get("decoders", []) for d in _decoder_types(sub)]
    return [node]


def _hf_scheme(data: dict[str, Any], where: str) -> tuple[str, bool]:
    """(scheme, byte_fallback) of a tokenizer.json, read from its decoder as HF's own `decode` reads it."""
    steps = _decoder_types(data.get("decoder"))
    kinds = {d.get("type") for d in steps}
    model = data.get("model") or {}
    byte_fallback = "ByteFallback" in kinds or bool(model.get("byte_fallback"))
    if "ByteLevel" in kinds:
        return "byte-level", False
    for unsupported in ("WordPiece", "BPEDecoder", "CTC"):
        if unsupported in kinds:
            raise ConstraintError(
                f"a {unsupported} decoder gives tokens no bytes of their own (decode joins them with context-"
                "dependent spaces), so a byte-level grammar cannot be applied to this vocabulary",
                path=where,
                hint="use a byte-level BPE, SentencePiece, Tekken or tiktoken vocabulary",
            )
    spaces = any(
        d.get("type") == "Metaspace"
        or (d.get("type") == "Replace" and (d.get("pattern") or {}).get("String") == _SPIECE_UNDERLINE)
        for d in steps
    )
    return ("metaspace" if spaces else "raw"), byte_fallback


def _hf_token_bytes(tokenizer: Any) -> TokenBytes:
    data = getattr(tokenizer, "_data", None)
    if not isinstance(data, dict):  # HFTokenizer keeps its parsed tokenizer.json; anything else is a new backend
        data = json.loads(tokenizer._json_text)
    where = getattr(tokenizer, "source", "") or tokenizer.id
    scheme, byte_fallback = _hf_scheme(data, where)
    added = {t.id: t for t in tokenizer.added_tokens}
    table = byte_level_decoder_table()
    pieces: list[bytes] = []
    for i in range(tokenizer.vocab_size):
        if i in added:
            # Added tokens are stored as their text, not in the model's byte spelling (HF decodes them as is).
            pieces.append(added[i].content.encode("utf-8"))
            continue
        token = tokenizer.id_to_token(i)
        if token is None:
            pieces.append(b"")
        elif scheme == "byte-level":
            try:
                pieces.append(bytes(table[c] for c in token))
            except KeyError:
                pieces.append(token.encode("utf-8"))  # not in the byte alphabet: HF's ByteLevel decoder keeps it
        else:
            m = _BYTE_PIECE.fullmatch(token) if byte_fallback else None
            if m is not None:
                pieces.append(bytes([int(m.group(1), 16)]))
            elif scheme == "metaspace":
                pieces.append(token.replace(_SPIECE_UNDERLINE, " ").encode("utf-8"))
            else:
                pieces.append(token.encode("utf-8"))
    special = frozenset(t.id for t in tokenizer.added_tokens if t.control)
    return TokenBytes(tuple(pieces), special, scheme)


def _tekken_token_bytes(tokenizer: Any) -> TokenBytes:
    enc = tokenizer._enc  # the tiktoken Encoding over the vocabulary ranks; id = rank + num_special
    n_special = tokenizer.num_special
    pieces = [t.content.encode("utf-8") for t in tokenizer.added_tokens]
    pieces += [enc.decode_single_token_bytes(r) for r in range(tokenizer.vocab_size - n_special)]
    return TokenBytes(tuple(pieces), frozenset(range(n_special)), "tiktoken")


def _tiktoken_token_bytes(tokenizer: Any) -> TokenBytes:
    enc = tokenizer._enc
    specials = {t.id: t for t in tokenizer.added_tokens}
    pieces: list[bytes] = []
    for i in range(tokenizer.vocab_size):
        if i in specials:
            pieces.append(specials[i].content.encode("utf-8"))
            continue
        try:
            pieces.append(enc.decode_single_token_bytes(i))
        except KeyError:
            pieces.append(b"")  # a gap between the last rank and the first special id
    return TokenBytes(tuple(pieces), frozenset(t.id for t in tokenizer.added_tokens if t.control), "tiktoken")


def _sentencepiece_token_bytes(tokenizer: Any) -> TokenBytes:
    from .sentencepiece import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED

    pieces: list[bytes] = []
    special: set[int] = {t.id for t in tokenizer.added_tokens if t.control}
    for i, (piece, kind) in enumerate(tokenizer.info.pieces):
        if kind == BYTE:
            m = _BYTE_PIECE.fullmatch(piece)
            pieces.append(bytes([int(m.group(1), 16)]) if m else b"")
        elif kind in (NORMAL, USER_DEFINED):
            pieces.append(piece.replace(_SPIECE_UNDERLINE, " ").encode("utf-8"))
        elif kind in (CONTROL, UNKNOWN):
            pieces.append(piece.encode("utf-8"))
            special.add(i)  # <s>, </s>, <unk>: never text
        else:
            assert kind == UNUSED
            pieces.append(b"")
    return TokenBytes(tuple(pieces), frozenset(special), "sentencepiece")


def _book_token_bytes(tokenizer: Any) -> TokenBytes:
    pieces = tuple((tokenizer.id_to_token(i) or "").encode("utf-8") for i in range(tokenizer.vocab_size))
    control = tokenizer.control_tokens
    return TokenBytes(pieces, frozenset(i for i in range(len(pieces)) if tokenizer.id_to_token(i) in control), "book")


def token_bytes(tokenizer: Tokenizer) -> TokenBytes:
    """Every id's bytes, by backend. Raises `ConstraintError` for a vocabulary without per-token bytes."""
    from .book import BookTokenizer
    from .hf import HFTokenizer
    from .sentencepiece import SentencePieceTokenizer
    from .tekken import TekkenTokenizer
    from .tiktoken_file import TiktokenTokenizer

    if isinstance(tokenizer, HFTokenizer):
        return _hf_token_bytes(tokenizer)
    if isinstance(tokenizer, TekkenTokenizer):
        return _tekken_token_bytes(tokenizer)
    if isinstance(tokenizer, TiktokenTokenizer):
        return _tiktoken_token_bytes(tokenizer)
    if isinstance(tokenizer, SentencePieceTokenizer):
        return _sentencepiece_token_bytes(tokenizer)
    if isinstance(tokenizer, BookTokenizer):
        return _book_token_bytes(tokenizer)
    raise ConstraintError(
        f"no byte mapping for tokenizer format {getattr(tokenizer, 'format', type(tokenizer).__name__)!r}",
        path=getattr(tokenizer, "id", None),
        hint="supported: hf-tokenizers / gguf (byte-level BPE, SentencePiece-style), tekken, tiktoken, sentencepiece",
    )
