"""SentencePiece backend: a `.model` file (mistral-common's `tokenizer.model.v1`, `*.model.v3`, ...), through the
`sentencepiece` package, used the way mistral-common uses it.

- `encode_text(text)` is `sp.encode(text)`: SentencePiece adds its dummy prefix ("▁") on every call, and that is
  exactly how mistral-common encodes each text chunk of a chat (`tokenizer.encode(chunk, bos=False, eos=False)`),
  so the result does not depend on the run's position (`at_start` is ignored).
- Control tokens are the pieces of type CONTROL (`sp.IsControl`: `<s>`, `</s>`, `[INST]`, ...) plus the
  USER_DEFINED ones, or exactly the pieces given as `control=`. `encode_matched` finds them in the text, longest
  first, emits their ids, and encodes the text between them chunk by chunk, as mistral-common assembles a chat.
- `encode(s, add_special_tokens=True)` prepends BOS, like mistral-common's `encode(s, bos=True, eos=False)`.

The file is walked as protobuf once before sentencepiece sees it: that gives the piece types sentencepiece's
Python API does not expose (USER_DEFINED), the model type and normalizer for `describe()`, and turns a truncated or
garbage file into an `ArtifactFormatError` naming the byte offset rather than an opaque library error.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ctxlock.core import longest_first
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError, TokenizerError
from ctxlock.tokenizer import encode_between
from ctxlock.tokenizer._base import AddedToken, ControlMatch, ManifestFiles, Piece, PieceView, TokenBytes, TokenizerBase
from ctxlock.tokenizer._token_bytes import SPIECE_UNDERLINE, byte_piece

# sentencepiece_model.proto: ModelProto.SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
PIECE_TYPES = {NORMAL: "NORMAL", UNKNOWN: "UNKNOWN", CONTROL: "CONTROL", USER_DEFINED: "USER_DEFINED"}
PIECE_TYPES.update({UNUSED: "UNUSED", BYTE: "BYTE"})
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


class _ProtoError(Exception):
    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    for shift in range(0, 70, 7):
        if pos >= end:
            raise _ProtoError(pos, "truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
    raise _ProtoError(pos, "varint longer than 10 bytes")


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, Any, int]]:
    """(field number, wire type, value, offset) for each field of the message in buf[start:end]; LEN values are
    (start, end) ranges."""
    pos = start
    while pos < end:
        at = pos
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        value: int | bytes | tuple[int, int]  # VARINT, I64/I32, LEN
        if field == 0:
            raise _ProtoError(at, "field number 0")
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 1:
            if pos + 8 > end:
                raise _ProtoError(pos, "truncated 64-bit field")
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if length > end - pos:
                raise _ProtoError(pos, f"a field of {length} bytes runs past the end of its message")
            value, pos = (pos, pos + length), pos + length
        elif wire == 5:
            if pos + 4 > end:
                raise _ProtoError(pos, "truncated 32-bit field")
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise _ProtoError(at, f"unsupported protobuf wire type {wire}")
        yield field, wire, value, at


@dataclass(frozen=True)
class ModelInfo:
    """What ctxlock reads from a `.model` file itself (sentencepiece does the encoding)."""

    pieces: tuple[tuple[str, int], ...]  # (piece, type) in id order
    model_type: str
    byte_fallback: bool
    normalizer: str
    add_dummy_prefix: bool
    remove_extra_whitespaces: bool


def read_model_info(raw: bytes, *, source: str) -> ModelInfo:
    """Walk a serialized `ModelProto`; a structural problem is an `ArtifactFormatError` at `<file>:byte <n>`."""
    hint = "the SentencePiece model is truncated or not a .model file; fetch it again from its source"
    pieces: list[tuple[str, int]] = []
    model_type, byte_fallback = 1, False
    normalizer, add_dummy_prefix, remove_extra = "", True, True
    try:
        for field, wire, value, at in _fields(raw, 0, len(raw)):
            if field == 1:  # repeated SentencePiece pieces
                if wire != 2:
                    raise _ProtoError(at, "a piece must be a length-delimited message")
                text: str | None = None
                kind = NORMAL
                for f, w, v, a in _fields(raw, *value):
                    if f == 1:
                        if w != 2:
                            raise _ProtoError(a, "a piece's text must be a string")
                        try:
                            text = raw[v[0] : v[1]].decode("utf-8")
                        except UnicodeDecodeError:
                            raise _ProtoError(a, "a piece's text is not UTF-8") from None
                    elif f == 3:
                        if w != 0 or v not in PIECE_TYPES:
                            raise _ProtoError(a, f"piece {len(pieces)} has an unknown type {v!r}")
                        kind = v
                if text is None:
                    raise _ProtoError(at, f"piece {len(pieces)} has no text")
                pieces.append((text, kind))
            elif field == 2 and wire == 2:  # TrainerSpec
                for f, w, v, _ in _fields(raw, *value):
                    if f == 3 and w == 0:
                        model_type = v
                    elif f == 35 and w == 0:
                        byte_fallback = bool(v)
            elif field == 3 and wire == 2:  # NormalizerSpec
                for f, w, v, _ in _fields(raw, *value):
                    if f == 1 and w == 2:
                        normalizer = raw[v[0] : v[1]].decode("utf-8", "replace")
                    elif f == 3 and w == 0:
                        add_dummy_prefix = bool(v)
                    elif f == 4 and w == 0:
                        remove_extra = bool(v)
    except _ProtoError as exc:
        raise ArtifactFormatError(
            f"not a valid SentencePiece model: {exc.message}", path=f"{source}:byte {exc.offset}", hint=hint
        ) from None
    if not pieces:
        raise ArtifactFormatError("not a valid SentencePiece model: it has no pieces", path=source, hint=hint)
    return ModelInfo(
        pieces=tuple(pieces),
        model_type=MODEL_TYPES.get(model_type, f"type {model_type}"),
        byte_fallback=byte_fallback,
        normalizer=normalizer,
        add_dummy_prefix=add_dummy_prefix,
        remove_extra_whitespaces=remove_extra,
    )


class SentencePieceTokenizer(TokenizerBase):
    format = "sentencepiece"

    def __init__(self, path: Path, *, id: str, control: Iterable[str] | None = None) -> None:
        try:
            import sentencepiece
        except ImportError:
            raise ArtifactNotFoundError(
                "reading a SentencePiece model needs the sentencepiece package, which is not installed",
                path=str(path),
                hint="pip install 'sentencepiece>=0.2'",
            ) from None

        self.id = id
        self.source = str(path)
        try:
            raw = Path(path).read_bytes()
        except FileNotFoundError:
            raise ArtifactNotFoundError(
                "SentencePiece model not found", path=str(path), hint="check the tokenizer file name"
            ) from None
        except OSError as exc:
            raise ArtifactFormatError(f"cannot read the SentencePiece model: {exc}", path=str(path)) from None
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.info = read_model_info(raw, source=str(path))
        sp = sentencepiece.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(raw)
        except Exception as exc:  # sentencepiece raises RuntimeError/OSError with its status message
            raise ArtifactFormatError(
                f"sentencepiece cannot load the model: {exc}",
                path=str(path),
                hint="the file is damaged or not a SentencePiece model",
            ) from None
        if sp.get_piece_size() != len(self.info.pieces):
            raise ArtifactFormatError(
                f"sentencepiece sees {sp.get_piece_size()} pieces, the file lists {len(self.info.pieces)}",
                path=str(path),
            )
        self._sp = sp
        self._n = sp.get_piece_size()
        self.bos_id: int = sp.bos_id()
        self.eos_id: int = sp.eos_id()
        self.unk_id: int = sp.unk_id()

        if control is None:
            chosen = [(i, piece) for i, (piece, kind) in enumerate(self.info.pieces) if kind in (CONTROL, USER_DEFINED)]
        else:
            if isinstance(control, str):
                raise ArtifactFormatError(
                    "control must be a list of piece strings, not one string", path=f"{path}:control"
                )
            chosen = []
            for piece in control:
                i = sp.piece_to_id(piece) if isinstance(piece, str) else -1
                if not isinstance(piece, str) or not piece or i < 0 or sp.id_to_piece(i) != piece:
                    raise ArtifactFormatError(
                        f"control token {piece!r} is not a piece of the model",
                        path=f"{path}:control",
                        hint="list piece strings exactly as the model spells them",
                    )
                chosen.append((i, piece))
            chosen = sorted(set(chosen))
        self._added = tuple(
            AddedToken(content=piece, id=i, special=self.info.pieces[i][1] == CONTROL) for i, piece in chosen
        )
        self._control_ids = {t.content: t.id for t in self._added if t.control}
        self._control_tokens = frozenset(self._control_ids)

    # ------------------------------------------------------------------------------------------ protocol

    @property
    def vocab_size(self) -> int:
        return self._n

    @property
    def added_tokens(self) -> tuple[AddedToken, ...]:
        return self._added

    @property
    def control_tokens(self) -> frozenset[str]:
        return self._control_tokens

    @cached_property
    def _control_re(self) -> re.Pattern[str] | None:
        return longest_first(self._control_ids)

    def encode_text(self, text: str, *, at_start: bool) -> list[int]:
        # The dummy prefix is added per call, wherever the run is (mistral-common's chunk-by-chunk encoding).
        return list(self._sp.encode(text)) if text else []

    def split_controls(self, text: str) -> list[ControlMatch]:
        if self._control_re is None:
            return []
        found = self._control_re.finditer(text)
        return [ControlMatch(m.start(), m.end(), self._control_ids[m.group(0)]) for m in found]

    def encode_matched(self, text: str) -> tuple[list[int], list[ControlMatch]]:
        matches = self.split_controls(text)
        return encode_between(text, matches, self), matches

    def encode(self, text: str, *, parse_special: bool = False, add_special_tokens: bool = False) -> list[int]:
        bos = [self.bos_id] if add_special_tokens and self.bos_id >= 0 else []
        if not parse_special:
            return bos + self.encode_text(text, at_start=True)
        return bos + self.encode_matched(text)[0]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text runs through `sp.decode`; control ids as their piece strings (or dropped)."""
        out: list[str] = []
        run: list[int] = []
        for n, i in enumerate(ids):
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self._n:
                raise TokenizerError(
                    f"id {i!r} is not in the vocabulary", path=f"ids[{n}]", hint=f"ids are below {self._n}"
                )
            if self._sp.IsControl(i):
                if run:
                    out.append(self._sp.decode(run))
                    run = []
                if not skip_special_tokens:
                    out.append(self._sp.id_to_piece(i))
            else:
                run.append(i)
        if run:
            out.append(self._sp.decode(run))
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        i = self._sp.piece_to_id(token)
        return i if 0 <= i < self._n and self._sp.id_to_piece(i) == token else None

    def id_to_token(self, id: int) -> str | None:
        if isinstance(id, bool) or not isinstance(id, int) or not 0 <= id < self._n:
            return None
        return self._sp.id_to_piece(id)

    def token_bytes(self) -> TokenBytes:
        pieces: list[bytes] = []
        special: set[int] = {t.id for t in self._added if t.control}
        for i, (piece, kind) in enumerate(self.info.pieces):
            if kind == BYTE:
                pieces.append(byte_piece(piece) or b"")
            elif kind in (NORMAL, USER_DEFINED):
                pieces.append(piece.replace(SPIECE_UNDERLINE, " ").encode("utf-8"))
            elif kind in (CONTROL, UNKNOWN):
                pieces.append(piece.encode("utf-8"))
                special.add(i)  # <s>, </s>, <unk>: never text
            else:
                assert kind == UNUSED
                pieces.append(b"")
        return TokenBytes(tuple(pieces), frozenset(special), "sentencepiece")

    def decode_pieces(self, *, skip_special_tokens: bool) -> PieceView:
        sp, skip = self._sp, skip_special_tokens  # piece types (control, byte, unknown) come from the processor

        def lookup(i: int) -> Piece | None:
            piece = sp.id_to_piece(i)
            if sp.IsControl(i):
                # `decode` decodes the runs between control ids separately.
                return (b"", False, False, True) if skip else (piece.encode("utf-8"), True, False, True)
            if sp.IsByte(i):
                raw = byte_piece(piece)
                if raw is not None:
                    return raw, True, False, False
            if sp.IsUnknown(i):
                return " \u2047 ".encode(), True, False, False
            return piece.replace(SPIECE_UNDERLINE, " ").encode("utf-8"), True, False, False

        return PieceView(lookup)

    @classmethod
    def from_manifest(cls, spec: Mapping[str, Any], files: ManifestFiles, model_id: str) -> SentencePieceTokenizer:
        """`{"format": "sentencepiece", "file": "tokenizer.model.v3"}` (see the module's `from_manifest`), or a
        `package` + `resource` naming a packaged file."""
        path = files.file(packaged=True)
        return from_manifest(spec, path, f"{model_id}/{path.name}", manifest=files.manifest)

    def replay_spec(self) -> tuple[dict[str, Any], dict[str, Path | bytes]]:
        name = Path(self.source).name
        return {"format": "sentencepiece", "file": name, "control": sorted(self._control_tokens)}, {
            name: Path(self.source)
        }

    def describe(self) -> dict[str, Any]:
        types: dict[str, int] = {}
        for _, kind in self.info.pieces:
            name = PIECE_TYPES[kind]
            types[name] = types.get(name, 0) + 1
        return {
            "format": self.format,
            "id": self.id,
            "sha256": self.sha256,
            "model": f"SentencePiece {self.info.model_type}",
            "byte_fallback": self.info.byte_fallback,
            "normalizer": self.info.normalizer or None,
            "add_dummy_prefix": self.info.add_dummy_prefix,
            "remove_extra_whitespaces": self.info.remove_extra_whitespaces,
            "piece_types": dict(sorted(types.items())),
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "unk_id": self.unk_id,
            "num_control_tokens": len(self._control_tokens),
            "vocab_size": self.vocab_size,
        }


def from_manifest(
    spec: Mapping[str, Any], file: Path, id: str, *, manifest: Path | str | None = None
) -> SentencePieceTokenizer:
    """Build from a manifest's tokenizer object: `{"format": "sentencepiece", "file": "tokenizer.model.v3"}`, with
    an optional `control` list of piece strings (default: every CONTROL and USER_DEFINED piece).

    `file` is the `.model` file, already resolved (and contained) by the caller.
    """
    where = f"{manifest}:tokenizer.control" if manifest is not None else "tokenizer.control"
    control = spec.get("control") if isinstance(spec, Mapping) else None
    if control is not None and (not isinstance(control, list) or not all(isinstance(c, str) for c in control)):
        raise ArtifactFormatError("control must be a list of piece strings", path=where)
    return SentencePieceTokenizer(Path(file), id=id, control=control)


__all__ = ["ModelInfo", "SentencePieceTokenizer", "from_manifest", "read_model_info"]
