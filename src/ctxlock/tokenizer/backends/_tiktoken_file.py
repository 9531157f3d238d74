"""tiktoken-format ranks files (`<base64 token> <rank>` per line), through `tiktoken.Encoding`.

A ranks file holds only the BPE vocabulary: the split pattern, the special-token table and the normalizer come
from elsewhere (the model's own tokenizer code). They are passed explicitly or taken from a preset,
`TIKTOKEN_PRESETS`, which is data: `{"pattern", "special_tokens", "normalizer"}`.

The `qwen` preset is Qwen(1)'s `QWenTokenizer` (`tokenization_qwen.py`): `PAT_STR`, `<|endoftext|>` = 151643,
`<|im_start|>` = 151644, `<|im_end|>` = 151645, then `<|extra_0|>` .. `<|extra_204|>` = 151646 .. 151850
(`SPECIAL_START_ID = 151643`), and NFC normalization of the whole text before encoding.

The ranks file is parsed here, strictly, rather than with tiktoken's loader, so that a damaged file gives an
`ArtifactFormatError` naming the line instead of a crash: tiktoken's Rust core panics (an exception outside
`Exception`) when a byte has no rank, and silently keeps the last of two duplicate tokens.

Reference semantics (QWenTokenizer): `tiktoken.Encoding.encode(unicodedata.normalize("NFC", text),
allowed_special="all")`. `encode_matched` reproduces it with offsets in the *original* text: a special-token
string is matched on the raw text, and kept only if normalization leaves it intact (`<|im_end|>` followed by
U+0338 COMBINING LONG SOLIDUS OVERLAY becomes `<|im_end|≯` under NFC, so the reference sees text there).
Between kept matches, NFC commutes with the split: the special strings are ASCII, start with a character that
cannot be the second of a composition pair, and end with one that we just checked is not composed.

`sha256` identifies the whole tokenizer: it digests the ranks file's sha256 together with the pattern, the
special-token table and the normalizer, since the file alone does not determine the ids. `describe()` gives
both digests.

A ranks file whose name ends in `.gz` is gunzipped (bounded by `CTXLOCK_MAX_ARTIFACT_BYTES`): the `bpe-openai`
package ships o200k_base so. A manifest's `sha256` pins the ranks (after gunzipping): tiktoken's own digest of
o200k_base is 446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import unicodedata
import zlib
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from ctxlock.core import longest_first
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError, TokenizerError
from ctxlock.outside import MAX_ARTIFACT_ENV, max_artifact_bytes, read_artifact
from ctxlock.tokenizer import encode_between
from ctxlock.tokenizer._base import AddedToken, ControlMatch, ManifestFiles, Piece, PieceView, TokenBytes, TokenizerBase

QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# o200k_base's split pattern, tiktoken_ext/openai_public.py (tiktoken 0.14), joined from the same seven parts.
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_O200K_SPECIALS = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
# cl100k_base (gpt-4, gpt-3.5-turbo, the text-embedding models): its pattern and special tokens as
# tiktoken_ext/openai_public.py (tiktoken 0.14) defines them.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)
_CL100K_SPECIALS = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
# o200k_harmony, the encoding of gpt-oss: o200k_base's ranks and pattern, Harmony's control tokens, and every
# other id from 200013 to 201087 a reserved token, as openai-harmony 0.0.8 loads it. Two tables differ from it at
# the edges, and this one follows openai-harmony inside the model's 201,088 ids: tiktoken's o200k_harmony
# (tiktoken_ext/openai_public.py) also keeps o200k_base's `<|endofprompt|>` at 200018, a second string for the id
# of `<|reserved_200018|>` (openai-harmony encodes that text as plain text); openai-harmony also names
# `<|reserved_201088|>`, id 201088, one past gpt-oss's embedding (vocab_size 201088), left out here.
_HARMONY_SPECIALS = {
    "<|startoftext|>": 199998,
    "<|endoftext|>": 199999,
    "<|reserved_200000|>": 200000,
    "<|reserved_200001|>": 200001,
    "<|return|>": 200002,
    "<|constrain|>": 200003,
    "<|reserved_200004|>": 200004,
    "<|channel|>": 200005,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|reserved_200009|>": 200009,
    "<|reserved_200010|>": 200010,
    "<|reserved_200011|>": 200011,
    "<|call|>": 200012,
    **{f"<|reserved_{i}|>": i for i in range(200013, 201088)},
}

TIKTOKEN_PRESETS: dict[str, dict[str, Any]] = {
    # OpenAI's o200k_base (gpt-4o, o1, o3): the file is o200k_base.tiktoken.
    "o200k_base": {"pattern": O200K_PATTERN, "special_tokens": _O200K_SPECIALS, "normalizer": None},
    # OpenAI's cl100k_base (gpt-4, gpt-3.5-turbo): the file is cl100k_base.tiktoken.
    "cl100k_base": {"pattern": CL100K_PATTERN, "special_tokens": _CL100K_SPECIALS, "normalizer": None},
    # gpt-oss (Harmony): the file is o200k_base.tiktoken.
    "o200k_harmony": {"pattern": O200K_PATTERN, "special_tokens": _HARMONY_SPECIALS, "normalizer": None},
    # Qwen(1) QWenTokenizer, tokenization_qwen.py: SPECIAL_START_ID = 151643, (ENDOFTEXT, IMSTART, IMEND) + EXTRAS.
    "qwen": {
        "pattern": QWEN_PATTERN,
        "special_tokens": {
            "<|endoftext|>": 151643,
            "<|im_start|>": 151644,
            "<|im_end|>": 151645,
            **{f"<|extra_{i}|>": 151646 + i for i in range(205)},
        },
        "normalizer": "NFC",
    },
}

NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")
_MAX_RANK = 2**32 - 1  # tiktoken ranks are u32
_RANK_RE = re.compile(rb"[0-9]{1,10}")


def _gunzip(raw: bytes, source: str) -> bytes:
    """A gzip file's content, at most `max_artifact_bytes()`; a damaged or truncated file is an ArtifactFormatError."""
    limit = max_artifact_bytes()
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise ArtifactFormatError(f"not a valid gzip file: {exc}", path=source, hint="fetch the file again") from None
    if len(out) > limit:
        raise ArtifactFormatError(
            f"the ranks file gunzips to more than {limit:,} bytes",
            path=source,
            hint=f"raise {MAX_ARTIFACT_ENV} if the file is genuine",
        )
    if not inflater.eof:
        raise ArtifactFormatError("the gzip file is truncated", path=source, hint="fetch the file again")
    return out


def parse_ranks(raw: bytes, *, source: str) -> dict[bytes, int]:
    """Parse a tiktoken ranks file strictly: every non-empty line is `<base64> <decimal rank>`.

    Blank lines are skipped (as tiktoken's and Qwen's loaders do) and a CR before the LF is tolerated; anything
    else malformed, a duplicate token or rank, or a single byte without a rank is an `ArtifactFormatError`
    whose path is `<file>:line <n>`.
    """
    ranks: dict[bytes, int] = {}
    token_line: dict[bytes, int] = {}
    rank_line: dict[int, int] = {}
    hint = "the ranks file is damaged; fetch it again from its source"
    for n, line in enumerate(raw.split(b"\n"), start=1):
        line = line.removesuffix(b"\r")
        if not line:
            continue
        where = f"{source}:line {n}"
        parts = line.split(b" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ArtifactFormatError(
                f"expected '<base64 token> <rank>', got {line[:80]!r}", path=where, hint=hint
            ) from None
        b64, rank_text = parts
        try:
            token = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ArtifactFormatError(
                f"token is not valid base64 ({exc}): {b64[:80]!r}", path=where, hint=hint
            ) from None
        if not token:
            raise ArtifactFormatError("token decodes to zero bytes", path=where, hint=hint)
        if not _RANK_RE.fullmatch(rank_text):
            raise ArtifactFormatError(
                f"rank is not a non-negative integer below 2**32: {rank_text[:80]!r}", path=where, hint=hint
            )
        rank = int(rank_text)
        if rank > _MAX_RANK:
            raise ArtifactFormatError(f"rank {rank} does not fit in 32 bits", path=where, hint=hint)
        if token in token_line:
            raise ArtifactFormatError(
                f"duplicate token {token!r} (first on line {token_line[token]})", path=where, hint=hint
            )
        if rank in rank_line:
            raise ArtifactFormatError(f"duplicate rank {rank} (first on line {rank_line[rank]})", path=where, hint=hint)
        token_line[token] = n
        rank_line[rank] = n
        ranks[token] = rank
    if not ranks:
        raise ArtifactFormatError("the ranks file holds no tokens", path=source, hint=hint)
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ArtifactFormatError(
            f"{len(missing)} single bytes have no rank (first: 0x{missing[0]:02x}); byte-level BPE needs all 256",
            path=source,
            hint=hint,
        )
    return ranks


class TiktokenTokenizer(TokenizerBase):
    format = "tiktoken"

    def __init__(
        self,
        path: Path,
        *,
        pattern: str,
        special_tokens: Mapping[str, int],
        normalizer: str | None = None,
        id: str,
        sha256: str | None = None,
    ) -> None:
        self.id = id
        self.source = str(path)
        # A regular file of at most CTXLOCK_MAX_ARTIFACT_BYTES (a FIFO or a device is refused, not read).
        raw = read_artifact(Path(path), missing=ArtifactNotFoundError, error=ArtifactFormatError)
        if str(path).endswith(".gz"):
            raw = _gunzip(raw, str(path))
        self.file_sha256 = hashlib.sha256(raw).hexdigest()
        if sha256 is not None and sha256 != self.file_sha256:
            raise ArtifactFormatError(
                f"the ranks have sha256 {self.file_sha256}, not the pinned {sha256}",
                path=str(path),
                hint="the file is not the one the manifest names; fetch or reinstall it",
            )
        ranks = parse_ranks(raw, source=str(path))
        if not isinstance(pattern, str) or not pattern:
            raise ArtifactFormatError("pattern must be a non-empty string", path=f"{path}:pattern")
        if normalizer is not None and normalizer not in NORMALIZERS:
            raise ArtifactFormatError(
                f"unknown normalizer {normalizer!r}", path=f"{path}:normalizer", hint=f"use one of {NORMALIZERS}"
            )
        specials = self._check_specials(special_tokens, ranks, path)
        self.pattern = pattern
        self.normalizer = normalizer
        self.num_ranks = len(ranks)
        config = {
            "file_sha256": self.file_sha256,
            "pattern": pattern,
            "special_tokens": dict(sorted(specials.items(), key=lambda kv: kv[1])),
            "normalizer": normalizer,
        }
        self.sha256 = hashlib.sha256(
            json.dumps(config, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        ).hexdigest()
        import tiktoken  # imported on first use: `import ctxlock` does not load it

        try:
            self._enc = tiktoken.Encoding(
                name=f"ctxlock-tiktoken-{self.sha256[:12]}",
                pat_str=pattern,
                mergeable_ranks=ranks,
                special_tokens={},
            )
        except ValueError as exc:  # an invalid regex
            raise ArtifactFormatError(f"tiktoken rejects the configuration: {exc}", path=f"{path}:pattern") from None
        self._specials = tuple(
            AddedToken(content=s, id=i, special=True) for s, i in sorted(specials.items(), key=lambda kv: kv[1])
        )
        self._special_ids = dict(specials)
        self._special_by_id = {i: s for s, i in specials.items()}
        self._control_tokens = frozenset(t.content for t in self._specials if t.control)
        self._n_vocab = max(self._enc.max_token_value, max(specials.values(), default=-1)) + 1

    @staticmethod
    def _check_specials(special_tokens: Any, ranks: Mapping[bytes, int], path: Path) -> dict[str, int]:
        where = f"{path}:special_tokens"
        if not isinstance(special_tokens, Mapping):
            raise ArtifactFormatError("special_tokens must map token strings to ids", path=where)
        used = set(ranks.values())
        seen: dict[int, str] = {}
        out: dict[str, int] = {}
        for s, i in special_tokens.items():
            if not isinstance(s, str) or not s:
                raise ArtifactFormatError(f"a special token must be a non-empty string, got {s!r}", path=where)
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= _MAX_RANK:
                raise ArtifactFormatError(f"the id of {s!r} must be an integer in [0, 2**32), got {i!r}", path=where)
            if i in used:
                raise ArtifactFormatError(
                    f"special token {s!r} has id {i}, which is also a rank in the ranks file",
                    path=where,
                    hint="special-token ids must lie outside the BPE ranks (check the preset against the file)",
                )
            if i in seen:
                raise ArtifactFormatError(f"{s!r} and {seen[i]!r} share the id {i}", path=where)
            seen[i] = s
            out[s] = i
        return out

    # ------------------------------------------------------------------------------------------ protocol

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    @property
    def added_tokens(self) -> tuple[AddedToken, ...]:
        return self._specials

    @property
    def control_tokens(self) -> frozenset[str]:
        return self._control_tokens

    @cached_property
    def _special_re(self) -> re.Pattern[str] | None:
        return longest_first(self._special_ids)

    def _normalize(self, text: str) -> str:
        return unicodedata.normalize(self.normalizer, text) if self.normalizer else text  # type: ignore[arg-type]

    def encode_text(self, text: str, *, at_start: bool) -> list[int]:
        # No position-dependent step: a run encodes the same wherever it is.
        return self._enc.encode_ordinary(self._normalize(text))

    def _survives(self, text: str, start: int, end: int) -> bool:
        """Whether normalizing the whole text leaves the special string at [start, end) intact."""
        if not self.normalizer:
            return True
        k = end
        while k < len(text) and unicodedata.combining(text[k]):
            k += 1
        if k == end:
            return True
        return self._normalize(text[start:k]) == text[start:end] + self._normalize(text[end:k])

    def split_controls(self, text: str) -> list[ControlMatch]:
        matches: list[ControlMatch] = []
        if self._special_re is not None:
            for m in self._special_re.finditer(text):
                if self._survives(text, m.start(), m.end()):
                    matches.append(ControlMatch(m.start(), m.end(), self._special_ids[m.group(0)]))
        return matches

    def encode_matched(self, text: str) -> tuple[list[int], list[ControlMatch]]:
        matches = self.split_controls(text)
        return encode_between(text, matches, self), matches

    def encode(self, text: str, *, parse_special: bool = False, add_special_tokens: bool = False) -> list[int]:
        # tiktoken files define no BOS/EOS post-processing (QWenTokenizer adds none): add_special_tokens adds nothing.
        if not parse_special:
            return self.encode_text(text, at_start=True)
        return self.encode_matched(text)[0]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        out: list[bytes] = []
        for n, i in enumerate(ids):
            special = self._special_by_id.get(i)
            if special is not None:
                if not skip_special_tokens:
                    out.append(special.encode("utf-8"))
                continue
            try:
                out.append(self._enc.decode_single_token_bytes(i))
            except (KeyError, ValueError, OverflowError, TypeError):
                raise TokenizerError(
                    f"id {i!r} is not in the vocabulary", path=f"ids[{n}]", hint=f"ids are below {self.vocab_size}"
                ) from None
        return b"".join(out).decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        if token in self._special_ids:
            return self._special_ids[token]
        try:
            return self._enc.encode_single_token(token.encode("utf-8"))
        except KeyError:
            return None

    def id_to_token(self, id: int) -> str | None:
        if id in self._special_by_id:
            return self._special_by_id[id]
        try:
            return self._enc.decode_single_token_bytes(id).decode("utf-8", "backslashreplace")
        except (KeyError, ValueError, OverflowError, TypeError):
            return None

    def token_bytes(self) -> TokenBytes:
        specials = {t.id: t for t in self._specials}
        pieces: list[bytes] = []
        for i in range(self.vocab_size):
            if i in specials:
                pieces.append(specials[i].content.encode("utf-8"))
                continue
            try:
                pieces.append(self._enc.decode_single_token_bytes(i))
            except KeyError:
                pieces.append(b"")  # a gap between the last rank and the first special id
        return TokenBytes(tuple(pieces), frozenset(t.id for t in self._specials if t.control), "tiktoken")

    def decode_pieces(self, *, skip_special_tokens: bool) -> PieceView:
        enc = self._enc  # exact bytes per rank (id_to_token is lossy for partial UTF-8)
        specials = {t.id: t.content for t in self._specials}
        skip = skip_special_tokens

        def lookup(i: int) -> Piece | None:
            if i in specials:
                return (b"", False, False, False) if skip else (specials[i].encode("utf-8"), True, False, False)
            try:
                return enc.decode_single_token_bytes(i), True, False, False
            except (KeyError, ValueError, OverflowError):
                return None

        return PieceView(lookup)

    @classmethod
    def from_manifest(cls, spec: Mapping[str, Any], files: ManifestFiles, model_id: str) -> TiktokenTokenizer:
        """`{"format": "tiktoken", "file": ..., "preset": "qwen"}`, or a `package` + `resource` naming a packaged
        file (see the module's `from_manifest`)."""
        path = files.file(packaged=True)
        return from_manifest(spec, path, f"{model_id}/{path.name}", manifest=files.manifest)

    def replay_spec(self) -> tuple[dict[str, Any], dict[str, Path | bytes]]:
        name = Path(self.source).name
        spec = {
            "format": "tiktoken",
            "file": name,
            "pattern": self.pattern,
            "special_tokens": {t.content: t.id for t in self._specials},
            "normalizer": self.normalizer,
        }
        return spec, {name: Path(self.source)}

    def describe(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "id": self.id,
            "sha256": self.sha256,
            "file_sha256": self.file_sha256,
            "model": "BPE (tiktoken ranks)",
            "normalizer": self.normalizer,
            "pre_tokenizer": "regex split",
            "pattern": self.pattern,
            "num_ranks": self.num_ranks,
            "num_special_tokens": len(self._specials),
            "vocab_size": self.vocab_size,
        }


def from_manifest(
    spec: Mapping[str, Any], file: Path, id: str, *, manifest: Path | str | None = None
) -> TiktokenTokenizer:
    """Build from a manifest's tokenizer object: `{"format": "tiktoken", "file": ..., "preset": "qwen"}`, or with
    explicit `pattern` / `special_tokens` / `normalizer` (which override the preset's, when both are given).

    `file` is the ranks file, already resolved (and contained) by the caller; `manifest`, when given, prefixes the
    path of configuration errors (`<manifest>:tokenizer.preset`).
    """
    where = f"{manifest}:tokenizer" if manifest is not None else "tokenizer"
    if not isinstance(spec, Mapping):
        raise ArtifactFormatError("the tokenizer spec must be an object", path=where)
    config: dict[str, Any] = {}
    preset = spec.get("preset")
    if preset is not None:
        if not isinstance(preset, str) or preset not in TIKTOKEN_PRESETS:
            raise ArtifactFormatError(
                f"unknown tiktoken preset {preset!r}",
                path=f"{where}.preset",
                hint=f"known presets: {', '.join(sorted(TIKTOKEN_PRESETS))}; or give pattern and special_tokens",
            )
        config.update(TIKTOKEN_PRESETS[preset])
    for key in ("pattern", "special_tokens", "normalizer"):
        if key in spec:
            config[key] = spec[key]
    if "pattern" not in config:
        raise ArtifactFormatError(
            "a tiktoken tokenizer needs a split pattern",
            path=f"{where}.pattern",
            hint=f"give a preset ({', '.join(sorted(TIKTOKEN_PRESETS))}) or a pattern",
        )
    specials = config.get("special_tokens", {})
    normalizer = config.get("normalizer")
    pinned = spec.get("sha256")
    if pinned is not None and (not isinstance(pinned, str) or not re.fullmatch(r"[0-9a-f]{64}", pinned)):
        raise ArtifactFormatError("sha256 must be 64 lowercase hex digits", path=f"{where}.sha256")
    if normalizer is not None and not isinstance(normalizer, str):
        raise ArtifactFormatError("normalizer must be a string or null", path=f"{where}.normalizer")
    return TiktokenTokenizer(
        Path(file), pattern=config["pattern"], special_tokens=specials, normalizer=normalizer, id=id, sha256=pinned
    )


__all__ = [
    "NORMALIZERS",
    "O200K_PATTERN",
    "QWEN_PATTERN",
    "TIKTOKEN_PRESETS",
    "TiktokenTokenizer",
    "from_manifest",
    "parse_ranks",
]
