"""Tekken backend: mistral-common's tiktoken-format tokenizer (`tekken_*.json`), through tiktoken.

Ids follow mistral-common: the first `num_special_tokens` ids are control tokens, and a vocabulary rank r has id
`r + num_special_tokens`. The special-token table comes from mistral-common itself, through its public API
(`id_to_piece`, `get_special_token`): old Tekken files do not list their specials, mistral-common supplies them, so
the table cannot drift from the reference.
"""

from __future__ import annotations

import hashlib
import re
from binascii import a2b_base64, b2a_base64
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from ctxlock.core import longest_first
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError
from ctxlock.outside import SYNTAX_ERROR, load_cached, loads_outside, read_artifact, store_cached
from ctxlock.tokenizer import encode_between
from ctxlock.tokenizer._base import AddedToken, ControlMatch, ManifestFiles, Piece, PieceView, TokenBytes, TokenizerBase


class TekkenTokenizer(TokenizerBase):
    format = "tekken"

    def __init__(self, path: Path, *, id: str) -> None:
        self.id = id
        self.source = str(path)
        raw = read_artifact(path, missing=ArtifactNotFoundError, error=ArtifactFormatError)  # regular, capped
        self.sha256 = hashlib.sha256(raw).hexdigest()
        parts = _parts(path, raw, self.sha256)
        specials, pattern, ranks = parts["specials"], parts["pattern"], parts["ranks"]
        self.num_special = len(specials)
        import tiktoken  # imported on first use: `import ctxlock` does not load it

        self._enc = tiktoken.Encoding(
            name=f"ctxlock-tekken-{self.sha256[:12]}",
            pat_str=pattern,
            mergeable_ranks=ranks,
            special_tokens={},
        )
        self._specials = tuple(AddedToken(content=s, id=i, special=True) for i, s in enumerate(specials))
        self._special_ids = {t.content: t.id for t in self._specials}
        self._control_tokens = frozenset(self._special_ids)
        self._n_words: int = self.num_special + parts["n_vocab"]
        self.version = parts["version"]
        self.pattern = pattern
        self.eos_id = self.token_to_id("</s>")  # mistral-common's end-of-sequence token

    @property
    def vocab_size(self) -> int:
        return self._n_words

    @property
    def added_tokens(self) -> tuple[AddedToken, ...]:
        return self._specials

    @property
    def control_tokens(self) -> frozenset[str]:
        return self._control_tokens

    @cached_property
    def _special_re(self) -> re.Pattern[str] | None:
        return longest_first(self._special_ids)

    def encode_text(self, text: str, *, at_start: bool) -> list[int]:
        return [i + self.num_special for i in self._enc.encode_ordinary(text)]

    def split_controls(self, text: str) -> list[ControlMatch]:
        # As mistral-common builds a chat: control ids, with the text between them encoded on its own.
        regex = self._special_re
        found = regex.finditer(text) if regex is not None else ()
        return [ControlMatch(m.start(), m.end(), self._special_ids[m.group(0)]) for m in found]

    def encode_matched(self, text: str) -> tuple[list[int], list[ControlMatch]]:
        matches = self.split_controls(text)
        return encode_between(text, matches, self), matches

    def encode(self, text: str, *, parse_special: bool = False, add_special_tokens: bool = False) -> list[int]:
        bos: list[int] = [self._special_ids["<s>"]] if add_special_tokens else []
        if not parse_special:
            return bos + self.encode_text(text, at_start=True)
        return bos + self.encode_matched(text)[0]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        out: list[str] = []
        buf: list[int] = []
        for i in ids:
            if i < self.num_special:
                if buf:
                    out.append(self._enc.decode(buf))
                    buf = []
                if not skip_special_tokens:
                    out.append(self._specials[i].content)
            else:
                buf.append(i - self.num_special)
        if buf:
            out.append(self._enc.decode(buf))
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        if token in self._special_ids:
            return self._special_ids[token]
        try:
            return self._enc.encode_single_token(token.encode("utf-8")) + self.num_special
        except KeyError:
            return None

    def id_to_token(self, id: int) -> str | None:
        if 0 <= id < self.num_special:
            return self._specials[id].content
        try:
            return self._enc.decode_single_token_bytes(id - self.num_special).decode("utf-8", "backslashreplace")
        except KeyError:
            return None

    def token_bytes(self) -> TokenBytes:
        # The tiktoken Encoding holds the vocabulary ranks; id = rank + num_special.
        pieces = [t.content.encode("utf-8") for t in self._specials]
        pieces += [self._enc.decode_single_token_bytes(r) for r in range(self.vocab_size - self.num_special)]
        return TokenBytes(tuple(pieces), frozenset(range(self.num_special)), "tiktoken")

    def decode_pieces(self, *, skip_special_tokens: bool) -> PieceView:
        enc, n_special, skip = self._enc, self.num_special, skip_special_tokens
        specials = {t.id: t.content for t in self._specials}

        def lookup(i: int) -> Piece | None:
            if i < n_special:
                # `decode` decodes the text runs between special tokens separately.
                return (b"", False, False, True) if skip else (specials[i].encode("utf-8"), True, False, True)
            try:
                return enc.decode_single_token_bytes(i - n_special), True, False, False
            except (KeyError, ValueError, OverflowError):
                return None

        return PieceView(lookup)

    @classmethod
    def from_manifest(cls, spec: Mapping[str, Any], files: ManifestFiles, model_id: str) -> TekkenTokenizer:
        """`{"format": "tekken", "file": "tekken.json"}`, or a `package` + `resource` naming a packaged file."""
        return cls(files.file(packaged=True), id=f"{model_id}/tekken")

    def replay_spec(self) -> tuple[dict[str, Any], dict[str, Path | bytes]]:
        name = Path(self.source).name
        return {"format": "tekken", "file": name}, {name: Path(self.source)}

    def describe(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "id": self.id,
            "sha256": self.sha256,
            "model": "BPE (tiktoken ranks)",
            "normalizer": None,
            "pre_tokenizer": "regex split (Tekken pattern)",
            "version": self.version,
            "num_special_tokens": self.num_special,
            "vocab_size": self.vocab_size,
        }


def _parts(path: Path, raw: bytes, sha256: str) -> dict[str, Any]:
    """The pattern, version, special table (from mistral-common itself: old Tekken files do not list their
    specials) and the byte ranks. Parsing the 14 MB JSON, decoding 130K base64 strings and building
    mistral-common's Tekkenizer take over a second, so the result is cached on disk under the file's digest and
    mistral-common's version, with the ranks as one blob; a warm load only rebuilds the dict."""
    import mistral_common

    kind = f"tekken-mistral-common-{mistral_common.__version__}"
    cached = load_cached(kind, sha256)
    if cached is not None:
        blob = a2b_base64(cached["blob"])
        ranks: dict[bytes, int] = {}
        pos = 0
        for i, n in enumerate(cached["lengths"]):
            ranks[blob[pos : pos + n]] = i
            pos += n
        return {**cached, "ranks": ranks, "n_vocab": len(cached["lengths"])}
    try:
        data = loads_outside(raw, f"{path} $", error=ArtifactFormatError, last_key_wins=True)
        config = data["config"]
        pattern = config["pattern"]
        vocab = data["vocab"]
    except ArtifactFormatError as exc:  # the strict reader's, naming the JSON path
        message = exc.message.removeprefix(SYNTAX_ERROR)
        raise ArtifactFormatError(f"not a Tekken tokenizer file: {message}", path=exc.path, hint=exc.hint) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ArtifactFormatError(f"not a Tekken tokenizer file: {exc}", path=str(path)) from None
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tek = Tekkenizer.from_file(str(path))
    # The special-token table through mistral-common's public API: id i < num_special_tokens is the special token
    # `id_to_piece(i)`, and `get_special_token` maps it back to i.
    specials = [tek.id_to_piece(i) for i in range(tek.num_special_tokens)]
    for i, s in enumerate(specials):
        if tek.get_special_token(s) != i:
            raise ArtifactFormatError(
                f"special token {s!r} has two ids ({i} and {tek.get_special_token(s)})", path=str(path)
            )
    n_vocab = int(config.get("default_vocab_size", len(vocab) + len(specials))) - len(specials)
    tokens = [a2b_base64(t["token_bytes"]) for t in vocab[:n_vocab]]
    ranks = {b: i for i, b in enumerate(tokens)}
    out = {"pattern": pattern, "version": config.get("version"), "specials": specials}
    store_cached(
        kind,
        sha256,
        {**out, "blob": b2a_base64(b"".join(tokens), newline=False).decode("ascii"), "lengths": list(map(len, tokens))},
    )
    return {**out, "ranks": ranks, "n_vocab": n_vocab}
