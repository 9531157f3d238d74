"""The book tokenizer (the fixture of docs/records.md): greedy longest match over a 14-entry vocabulary, no
normalization.

It exists to make "the template changes the tokens" checkable by hand:
`<bos><system>简洁回答</system><user>天空为什么是蓝色？</user><assistant>` -> [1, 2, 7, 3, 4, 8, 9, 10, 11, 12, 5, 6].
A character no entry covers becomes `<unk>` (one id per character).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ctxlock.errors import ArtifactFormatError
from ctxlock.tokenizer._base import AddedToken, ControlMatch, ManifestFiles, Piece, PieceView, TokenBytes, TokenizerBase

_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON escapes can spell a lone surrogate, which is not a character


class BookTokenizer(TokenizerBase):
    format = "book"

    def __init__(self, vocab: Sequence[str], *, control: Sequence[str], unk: str, id: str = "book") -> None:
        self.id = id
        self._unk_token = unk
        self._vocab = list(vocab)
        self._ids = {t: i for i, t in enumerate(self._vocab)}
        self._control = frozenset(control)
        self._unk = self._ids[unk]
        self.sha256 = hashlib.sha256(
            json.dumps({"vocab": self._vocab, "control": sorted(control), "unk": unk}, ensure_ascii=False).encode()
        ).hexdigest()
        self._added = tuple(AddedToken(t, self._ids[t], special=True) for t in self._vocab if t in self._control)
        self._text_pieces = sorted((t for t in self._vocab if t not in self._control), key=len, reverse=True)
        self._all_pieces = sorted(self._vocab, key=len, reverse=True)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    @property
    def added_tokens(self) -> tuple[AddedToken, ...]:
        return self._added

    @property
    def control_tokens(self) -> frozenset[str]:
        return self._control

    def _scan(self, text: str, pieces: Sequence[str]) -> list[tuple[int, int, int]]:
        out: list[tuple[int, int, int]] = []
        pos = 0
        while pos < len(text):
            for piece in pieces:
                if text.startswith(piece, pos):
                    out.append((pos, pos + len(piece), self._ids[piece]))
                    pos += len(piece)
                    break
            else:
                out.append((pos, pos + 1, self._unk))
                pos += 1
        return out

    def encode(self, text: str, *, parse_special: bool = False, add_special_tokens: bool = False) -> list[int]:
        ids = [i for _, _, i in self._scan(text, self._all_pieces if parse_special else self._text_pieces)]
        return [self._ids["<bos>"], *ids] if add_special_tokens else ids

    def encode_text(self, text: str, *, at_start: bool) -> list[int]:
        return self.encode(text, parse_special=False)

    def encode_matched(self, text: str) -> tuple[list[int], list[ControlMatch]]:
        scan = self._scan(text, self._all_pieces)
        controls = [ControlMatch(s, e, i) for s, e, i in scan if self._vocab[i] in self._control]
        return [i for _, _, i in scan], controls

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return "".join(self._vocab[i] for i in ids if not (skip_special_tokens and self._vocab[i] in self._control))

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)

    def id_to_token(self, id: int) -> str | None:
        return self._vocab[id] if 0 <= id < len(self._vocab) else None

    def token_bytes(self) -> TokenBytes:
        pieces = tuple(t.encode("utf-8") for t in self._vocab)
        return TokenBytes(pieces, frozenset(i for i, t in enumerate(self._vocab) if t in self._control), "book")

    def decode_pieces(self, *, skip_special_tokens: bool) -> PieceView:
        vocab, control, skip = self._vocab, self._control, skip_special_tokens

        def lookup(i: int) -> Piece | None:
            token = vocab[i] if 0 <= i < len(vocab) else None
            if token is None:
                return None
            if skip and token in control:
                return b"", False, False, False
            return token.encode("utf-8"), True, False, False

        return PieceView(lookup)

    @classmethod
    def from_manifest(cls, spec: Mapping[str, Any], files: ManifestFiles, model_id: str) -> BookTokenizer:
        """`{"format": "book", "vocab": [...], "control": [...], "unk": "<unk>"}`: the vocabulary is in the manifest
        itself. Checked: lists of non-empty strings, and unk one of the vocab."""
        where = f"{files.manifest}:tokenizer"

        def strings(key: str) -> list[str]:
            value = spec.get(key)
            if not isinstance(value, list) or not all(
                isinstance(t, str) and t and not _SURROGATE.search(t) for t in value
            ):
                raise ArtifactFormatError(f"{key} must be a list of non-empty strings", path=f"{where}.{key}")
            return value

        vocab, control, unk = strings("vocab"), strings("control"), spec.get("unk")
        if not isinstance(unk, str) or unk not in vocab:
            raise ArtifactFormatError("unk must be one of the vocab's strings", path=f"{where}.unk")
        return cls(vocab, control=control, unk=unk, id=model_id)

    def replay_spec(self) -> tuple[dict[str, Any], dict[str, Path | bytes]]:
        spec = {"format": "book", "vocab": self._vocab, "control": sorted(self._control), "unk": self._unk_token}
        return spec, {}

    def describe(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "id": self.id,
            "sha256": self.sha256,
            "model": "greedy longest match",
            "normalizer": None,
            "pre_tokenizer": None,
            "vocab_size": self.vocab_size,
        }
