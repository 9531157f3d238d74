"""Each id's bytes for the HF backend (`HFTokenizer.token_bytes` and `decode_pieces`), read from tokenizer.json's
decoder section as HF's own `decode` reads it.

- `ByteLevel` (GPT-2, Llama 3, Qwen2, ...): every character of a token stands for one byte through GPT-2's
  byte<->unicode table (`Ġ` is 0x20, `Ċ` is 0x0A); a character outside the table is kept as its UTF-8, as the
  decoder keeps it;
- SentencePiece-style (`Metaspace`, or `Replace("▁", " ")`): `▁` is a space, and with `ByteFallback` the pieces
  `<0x00>` .. `<0xFF>` are single raw bytes, which decode as a run;
- added tokens are their content as UTF-8 (HF decodes them as they are).

WordPiece, BPEDecoder and CTC decoders give tokens no bytes of their own (decode joins them with context-dependent
spaces): `token_bytes` refuses them, and `decode_pieces` accepts only the WordPiece decoder without cleanup.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ctxlock.errors import ConstraintError, DecodeError
from ctxlock.tokenizer._base import AddedToken, Piece, PieceView, TokenBytes
from ctxlock.tokenizer._token_bytes import SPIECE_UNDERLINE, byte_level_decoder_table, byte_piece

_SUPPORTED_DECODERS = {"ByteLevel", "Metaspace", "Replace", "ByteFallback", "Fuse", "Strip", "WordPiece"}


def _decoder_types(node: Any) -> list[dict[str, Any]]:
    """The decoder steps of a tokenizer.json, a `Sequence` flattened."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [d for sub in node.get("decoders", []) for d in _decoder_types(sub)]
    return [node]


def _scheme(data: dict[str, Any], where: str) -> tuple[str, bool]:
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
        or (d.get("type") == "Replace" and (d.get("pattern") or {}).get("String") == SPIECE_UNDERLINE)
        for d in steps
    )
    return ("metaspace" if spaces else "raw"), byte_fallback


def hf_token_bytes(
    data: dict[str, Any],
    where: str,
    added_tokens: tuple[AddedToken, ...],
    vocab_size: int,
    id_to_token: Callable[[int], str | None],
) -> TokenBytes:
    """Every id's bytes for a parsed tokenizer.json (`where` names it in errors)."""
    scheme, byte_fallback = _scheme(data, where)
    added = {t.id: t for t in added_tokens}
    table = byte_level_decoder_table()
    # One C-level pass a token: the alphabet's characters translated to the bytes they stand for (as Latin-1
    # characters), a token with any character outside it found by one regex search (and kept as its UTF-8).
    to_latin1 = {ord(c): b for c, b in table.items()}
    outside = re.compile("[^" + "".join(re.escape(c) for c in table) + "]")
    model = data.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") in ("BPE", "WordPiece", "WordLevel") and isinstance(vocab, dict):
        # The model's own token -> id map, inverted (what tokenizers' id_to_token reads for an id that is not an
        # added token), instead of one call into tokenizers per id.
        by_id = {i: t for t, i in vocab.items() if isinstance(i, int)}
        id_to_token = by_id.get
    pieces: list[bytes] = []
    for i in range(vocab_size):
        if i in added:
            # Added tokens are stored as their text, not in the model's byte spelling (HF decodes them as is).
            pieces.append(added[i].content.encode("utf-8"))
            continue
        token = id_to_token(i)
        if token is None:
            pieces.append(b"")
        elif scheme == "byte-level":
            if outside.search(token):
                pieces.append(token.encode("utf-8"))  # not in the byte alphabet: HF's ByteLevel decoder keeps it
            else:
                pieces.append(token.translate(to_latin1).encode("latin-1"))
        else:
            raw = byte_piece(token) if byte_fallback else None
            if raw is not None:
                pieces.append(raw)
            elif scheme == "metaspace":
                pieces.append(token.replace(SPIECE_UNDERLINE, " ").encode("utf-8"))
            else:
                pieces.append(token.encode("utf-8"))
    special = frozenset(t.id for t in added_tokens if t.control)
    return TokenBytes(tuple(pieces), special, scheme)


def _decoder_kinds(node: Any, where: str) -> set[str]:
    if node is None:
        return set()  # no decoder: HF joins the tokens with spaces, which is local
    kind = node.get("type")
    if kind == "Sequence":
        kinds: set[str] = set()
        for sub in node.get("decoders", []):
            kinds |= _decoder_kinds(sub, where)
        return kinds
    why = None
    if kind not in _SUPPORTED_DECODERS:
        why = f"the {kind} decoder"
    elif kind == "Strip" and node.get("stop", 0):
        why = "a Strip decoder that trims the end of the text"
    elif kind == "WordPiece" and node.get("cleanup", True):
        why = "a WordPiece decoder with cleanup (it rewrites ' .' and ' do not' across tokens)"
    elif kind == "Replace" and "String" not in (node.get("pattern") or {}):
        why = "a regex Replace decoder"
    if why is not None:
        raise DecodeError(
            f"{why} is not supported for incremental decoding: a token's text would depend on later tokens",
            path=where,
            hint="decode the whole sequence with tokenizer.decode instead",
        )
    return {kind}


def hf_decode_pieces(
    decoder: Any,
    where: str,
    added_tokens: tuple[AddedToken, ...],
    id_to_token: Callable[[int], str | None],
    *,
    skip: bool,
) -> PieceView:
    """Each id's `Piece` under a tokenizer.json `decoder` section (`where` names it in errors)."""
    kinds = _decoder_kinds(decoder, where)
    special = {t.id for t in added_tokens if t.special}
    byte_level = "ByteLevel" in kinds
    byte_fallback = "ByteFallback" in kinds and not byte_level
    table = byte_level_decoder_table() if byte_level else {}

    def lookup(i: int) -> Piece | None:
        token = id_to_token(i)
        if token is None:
            return None
        if skip and i in special:
            return b"", False, False, False
        if byte_level:
            # As tokenizers' ByteLevel decoder: map every character through the table, or, if one is not in
            # it (an added token such as "\n\n"), take the token's own UTF-8.
            try:
                return bytes(table[c] for c in token), True, False, False
            except KeyError:
                return token.encode("utf-8"), True, False, False
        if byte_fallback:
            raw = byte_piece(token)
            if raw is not None:
                return raw, True, True, False
            return token.replace(SPIECE_UNDERLINE, " ").encode("utf-8"), True, False, True
        return token.replace(SPIECE_UNDERLINE, " ").encode("utf-8"), True, False, False

    return PieceView(lookup, groups_bytes=byte_fallback)


__all__ = ["hf_decode_pieces", "hf_token_bytes"]
