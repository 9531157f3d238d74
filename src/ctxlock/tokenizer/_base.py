"""The tokenizer seam: the `Tokenizer` protocol every backend implements, and `TokenizerBase`, which declares the
optional capabilities with their defaults.

Callers use only what is declared here. A capability a backend does not have is not an attribute that is missing
(callers never probe with `getattr`): it is a member whose default says "not here" (`whole_text` is None,
`split_controls` returns None, `engine` is "").

Required of every backend (`Tokenizer`): the identity (`id`, `format`, `sha256`), the vocabulary (`vocab_size`,
`added_tokens`, `control_tokens`, `token_to_id`, `id_to_token`), the encoders (`encode`, `encode_matched`,
`encode_text`), `decode`, each id's exact bytes (`token_bytes`, `decode_pieces`), and how to rebuild it
(`replay_spec`, `from_manifest`, `describe`).

`encode_text_batch` has a default (run by run). Optional (`TokenizerBase` defaults): `split_controls`,
`whole_text`, `engine`, `whole_text_engine`, `eos_id`, `truncation`, `pipeline`, `source`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from ctxlock.errors import ConstraintError, DecodeError

if TYPE_CHECKING:
    from ctxlock.tokenizer._prefix import WholeText


@dataclass(frozen=True)
class AddedToken:
    """A token matched on the raw text before the vocabulary model runs (HF `added_tokens`, tiktoken specials)."""

    content: str
    id: int
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False
    normalized: bool = False

    @property
    def control(self) -> bool:
        # Whitespace-only added tokens (Gemma's tab and space runs) are ordinary text pieces, not control tokens.
        return not self.content.isspace()


class ControlMatch(NamedTuple):
    """A control token in a text: its character range and id. A named tuple: chats hold thousands of them.

    The range is what the reference consumed, and the runs between matches are the rest of the text. An HF added
    token with `lstrip`/`rstrip` takes the whitespace next to it into its match (`lead` characters before its own,
    `trail` after them); that whitespace may come from a request string, as it does in the reference on benign
    input. Whether a match is the template's is decided on its own characters, `core_start:core_end`."""

    start: int
    end: int
    id: int
    lead: int = 0  # whitespace consumed before the token's own characters (lstrip)
    trail: int = 0  # whitespace consumed after them (rstrip)

    @property
    def core_start(self) -> int:
        return self.start + self.lead

    @property
    def core_end(self) -> int:
        return self.end - self.trail


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


# What one id adds to a decoded stream, as far as completeness goes (see `ctxlock.generation`):
#   data        the bytes it adds to the stream (b"" for a special token that skip_special_tokens drops);
#   visible     the decoder sees it (False: a skipped special token);
#   byte_token  an HF ByteFallback `<0xNN>` token, which decodes as part of a run;
#   breaks      the backend decodes the text on either side of it separately (Tekken / SentencePiece control
#               ids, non-byte tokens under ByteFallback), so a UTF-8 sequence open before it is finished for good.
Piece = tuple[bytes, bool, bool, bool]


@dataclass(frozen=True)
class PieceView:
    """A backend's vocabulary as the incremental decoder reads it: `lookup(id)` is the id's `Piece` (None for an id
    outside the vocabulary); `groups_bytes` says that byte tokens decode as runs (HF `ByteFallback`)."""

    lookup: Callable[[int], Piece | None]
    groups_bytes: bool = False


class ManifestFiles(Protocol):
    """What a backend may ask of the `ctxlock.json` it is loaded from (`from_manifest`); the artifacts layer
    implements it, checking every name against the model directory."""

    @property
    def manifest(self) -> Path:
        """The manifest file itself (error paths are `<manifest>:tokenizer.<key>`)."""
        ...

    def file(self, *, packaged: bool = False) -> Path:
        """The regular file the entry's `file` names (with `packaged`, a `package` + `resource` may name it)."""
        ...

    def text(self) -> tuple[Path, str]:
        """The path and UTF-8 text of the file the entry's `file` names."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """Everything a caller may use of a tokenizer. Backends subclass `TokenizerBase`, which supplies the optional
    members' defaults."""

    id: str
    format: str
    sha256: str

    @property
    def vocab_size(self) -> int: ...
    @property
    def added_tokens(self) -> tuple[AddedToken, ...]: ...
    @property
    def control_tokens(self) -> frozenset[str]: ...

    def encode(self, text: str, *, parse_special: bool = False, add_special_tokens: bool = False) -> list[int]: ...
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...
    def token_to_id(self, token: str) -> int | None: ...
    def id_to_token(self, id: int) -> str | None: ...
    def encode_matched(self, text: str) -> tuple[list[int], list[ControlMatch]]: ...
    def encode_text(self, text: str, *, at_start: bool) -> list[int]: ...
    def encode_text_batch(self, texts: Sequence[str], at_start_flags: Sequence[bool]) -> list[list[int]]: ...
    def token_bytes(self) -> TokenBytes: ...
    def decode_pieces(self, *, skip_special_tokens: bool) -> PieceView: ...
    def describe(self) -> dict[str, Any]: ...
    def replay_spec(self) -> tuple[dict[str, Any], dict[str, Path | bytes]]:
        """A `ctxlock.json` tokenizer entry and the files it names, enough to rebuild this tokenizer elsewhere."""
        ...

    # -- optional capabilities (TokenizerBase gives each its "not here" default)
    source: str

    @property
    def eos_id(self) -> int | None: ...
    @property
    def engine(self) -> str: ...
    @property
    def whole_text(self) -> WholeText | None: ...
    @property
    def whole_text_engine(self) -> str: ...
    @property
    def truncation(self) -> dict[str, Any] | None: ...

    def split_controls(self, text: str) -> list[ControlMatch] | None: ...
    def pipeline(self) -> dict[str, Any]: ...


class TokenizerBase:
    """The base of every backend: the optional capabilities, declared with the defaults that mean "not here", and
    the required members as methods that say which backend lacks them."""

    id: str
    format: str
    sha256: str
    source: str = ""  # the file the tokenizer was read from, when there is one
    eos_id: int | None = None  # the backend's own end-of-sequence id (SentencePiece, Tekken), else None

    # -- loading

    @classmethod
    def from_manifest(cls, spec: Mapping[str, Any], files: ManifestFiles, model_id: str) -> TokenizerBase:
        """Build the tokenizer a `ctxlock.json` entry (`spec`, whose `format` is this backend's) describes."""
        raise NotImplementedError(f"{cls.__name__} cannot be loaded from a manifest")

    if TYPE_CHECKING:  # every backend defines it (the `Tokenizer` protocol's); `encode_text_batch` calls it

        def encode_text(self, text: str, *, at_start: bool) -> list[int]: ...

    # -- optional capabilities

    def split_controls(self, text: str) -> list[ControlMatch] | None:
        """The control-token matches of `text` when the runs between them are encoded independently (then the
        reference ids are the control ids and the runs' ids, and every run goes through the run cache); None when
        this backend cannot tell them apart from its reference encoder (`encode_matched` does it then)."""
        return None

    def encode_text_batch(self, texts: Sequence[str], at_start_flags: Sequence[bool]) -> list[list[int]]:
        """`encode_text` over many runs: a backend whose engine spreads them over the cores overrides this; the
        default encodes them one by one."""
        if len(texts) != len(at_start_flags):
            raise ValueError(f"{len(texts)} texts but {len(at_start_flags)} at_start flags")
        return [self.encode_text(t, at_start=bool(a)) for t, a in zip(texts, at_start_flags, strict=True)]

    @property
    def whole_text(self) -> WholeText | None:
        """The whole-text encoder (`prefix.WholeText`) when it is proved equal to the reference here, else None."""
        return None

    @property
    def engine(self) -> str:
        """What makes `encode_text`'s calls, when the backend has a choice ("" when it has none)."""
        return ""

    @property
    def whole_text_engine(self) -> str:
        """What makes the whole-text encoder's native calls ("" without a whole-text encoder)."""
        return ""

    @property
    def truncation(self) -> dict[str, Any] | None:
        """A truncation section the tokenizer file carries (never applied unless asked), else None."""
        return None

    def pipeline(self) -> dict[str, Any]:
        """The normalizer and pre-tokenizer, as their JSON where the backend has one, else as `describe` names
        them: their identity, which records keep so that `diff` can name one that differs."""
        desc = self.describe()
        return {"normalizer": desc.get("normalizer"), "pre_tokenizer": desc.get("pre_tokenizer")}

    # -- required: each backend overrides these

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    def token_bytes(self) -> TokenBytes:
        """Every id's exact bytes, for a constraint engine. Raises `ConstraintError` for a vocabulary without
        per-token bytes."""
        raise ConstraintError(
            f"no byte mapping for tokenizer format {self.format!r}",
            path=self.id,
            hint="supported: hf-tokenizers / gguf (byte-level BPE, SentencePiece-style), tekken, tiktoken, "
            "sentencepiece",
        )

    def decode_pieces(self, *, skip_special_tokens: bool) -> PieceView:
        """Each id's `Piece`, for the incremental decoder. Raises `DecodeError` when a token's text would depend on
        the tokens after it."""
        raise DecodeError(
            f"no incremental decoder for tokenizer format {self.format!r}",
            path=self.id,
            hint="supported: hf-tokenizers, gguf, tiktoken, tekken, sentencepiece, book",
        )


__all__ = [
    "AddedToken",
    "ControlMatch",
    "ManifestFiles",
    "Piece",
    "PieceView",
    "TokenBytes",
    "Tokenizer",
    "TokenizerBase",
]
