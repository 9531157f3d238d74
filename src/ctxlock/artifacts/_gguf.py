"""Read the tokenizer metadata of a GGUF file (llama.cpp, Ollama): vocabulary, merges, types, ids, template.

The names and enums come from the `gguf` package (`gguf.Keys`, `gguf.GGUFValueType`, `gguf.TokenType`; read from
its constants module alone by `gguf_constants`, without the package's costly `__init__`). The bytes are read here,
by a strict reader over a memory map, because a GGUF file is untrusted input:
- every length is checked against the bytes that remain before anything is allocated, so a declared array of
  2**60 items fails at once with a typed error instead of allocating or looping;
- every failure is an ArtifactFormatError naming the file, the key and the byte offset;
- only the key/value header is read (tensor data is never touched), and numeric arrays are read in one step
  each, which keeps a 262k-token vocabulary under a second (gguf's own GGUFReader builds a Python object per item).
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctxlock import caches
from ctxlock.artifacts._gguf_constants import GGUFValueType, Keys, TokenType
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError, TemplateLimitError
from ctxlock.template.sandbox import DEFAULT_LIMITS

GGUF_MAGIC = b"GGUF"
MAX_KV = 1 << 20  # far above any real file; a bound on a corrupt count


@caches.memoize("artifacts.gguf_value_types", 1, scope="artifact")
def _value_types() -> tuple[dict[int, tuple[str, int]], dict[int, str]]:
    """(struct format and size, numpy dtype) of each numeric GGUF value type (built on first use: see
    `gguf_constants`)."""
    scalars: dict[int, tuple[str, int]] = {
        GGUFValueType.UINT8: ("B", 1),
        GGUFValueType.INT8: ("b", 1),
        GGUFValueType.UINT16: ("H", 2),
        GGUFValueType.INT16: ("h", 2),
        GGUFValueType.UINT32: ("I", 4),
        GGUFValueType.INT32: ("i", 4),
        GGUFValueType.FLOAT32: ("f", 4),
        GGUFValueType.BOOL: ("?", 1),
        GGUFValueType.UINT64: ("Q", 8),
        GGUFValueType.INT64: ("q", 8),
        GGUFValueType.FLOAT64: ("d", 8),
    }
    numpy_types: dict[int, str] = {
        GGUFValueType.UINT8: "u1",
        GGUFValueType.INT8: "i1",
        GGUFValueType.UINT16: "u2",
        GGUFValueType.INT16: "i2",
        GGUFValueType.UINT32: "u4",
        GGUFValueType.INT32: "i4",
        GGUFValueType.FLOAT32: "f4",
        GGUFValueType.BOOL: "u1",
        GGUFValueType.UINT64: "u8",
        GGUFValueType.INT64: "i8",
        GGUFValueType.FLOAT64: "f8",
    }
    return scalars, numpy_types


class _Reader:
    def __init__(self, buf: memoryview, path: str) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path
        self.endian = "<"
        self.key = "header"

    def fail(self, message: str) -> ArtifactFormatError:
        return ArtifactFormatError(
            f"{message} (at byte {self.pos:,})",
            path=f"{self.path}:{self.key}",
            hint="the GGUF file is truncated or corrupt; re-download or re-convert it",
        )

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"needs {n:,} more bytes but only {len(self.buf) - self.pos:,} remain")

    def scalar(self, vtype: int) -> Any:
        fmt, size = _value_types()[0][vtype]
        self.need(size)
        (value,) = struct.unpack_from(self.endian + fmt, self.buf, self.pos)
        self.pos += size
        return value

    # Lengths and counts are fixed-size by the format (uint32, uint64): read directly, not through the value-type
    # table (a string's length is read once per vocabulary entry, 150k times for Qwen2).
    def u32(self) -> int:
        self.need(4)
        (value,) = struct.unpack_from(self.endian + "I", self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self) -> int:
        self.need(8)
        (value,) = struct.unpack_from(self.endian + "Q", self.buf, self.pos)
        self.pos += 8
        return value

    def string(self) -> str:
        n = self.u64()
        self.need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.pos -= n
            raise self.fail(f"string is not UTF-8 ({exc.reason} at string byte {exc.start})") from None

    def value(self, vtype: int) -> Any:
        if vtype in _value_types()[0]:
            return self.scalar(vtype)
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            etype = self.u32()
            count = self.u64()
            if etype in _value_types()[1]:
                size = _value_types()[0][etype][1]
                if count > (len(self.buf) - self.pos) // size:
                    raise self.fail(f"array declares {count:,} items of {size} bytes; the file is shorter")
                dtype = np.dtype(_value_types()[1][etype]).newbyteorder(self.endian)
                # Copied at once: a view would pin the memory map, which must close even when parsing fails.
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos += size * count
                return arr.astype(bool) if etype == GGUFValueType.BOOL else arr
            if etype == GGUFValueType.STRING:
                # Each string takes at least its 8-byte length: bound the count before building the list.
                if count > (len(self.buf) - self.pos) // 8:
                    raise self.fail(f"array declares {count:,} strings; the file is shorter")
                return [self.string() for _ in range(count)]
            if etype == GGUFValueType.ARRAY:
                if count > (len(self.buf) - self.pos) // 12:
                    raise self.fail(f"array declares {count:,} arrays; the file is shorter")
                return [self.value(GGUFValueType.ARRAY) for _ in range(count)]
            raise self.fail(f"unknown array item type {etype}")
        raise self.fail(f"unknown value type {vtype}")


@dataclass(frozen=True)
class GGUFMetadata:
    path: str
    sha256: str
    version: int
    values: Mapping[str, Any] = field(repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def read_metadata(path: str | Path) -> GGUFMetadata:
    """Parse the key/value header of a GGUF file, strictly."""
    p = Path(path)
    try:
        fh = p.open("rb")
    except FileNotFoundError:
        raise ArtifactNotFoundError("GGUF file not found", path=str(p)) from None
    with fh:
        size = p.stat().st_size
        if size < 24:
            raise ArtifactFormatError(
                f"file is {size} bytes, shorter than a GGUF header", path=f"{p}:header", hint="not a GGUF file"
            )
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            digest = hashlib.sha256(mm).hexdigest()
            buf = memoryview(mm)
            try:
                return _parse(buf, str(p), digest)
            finally:
                buf.release()


def _parse(buf: memoryview, path: str, digest: str) -> GGUFMetadata:
    r = _Reader(buf, path)
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise ArtifactFormatError(
            f"wrong magic {bytes(buf[:4])!r}, expected {GGUF_MAGIC!r}", path=f"{path}:magic", hint="not a GGUF file"
        )
    r.pos = 4
    version = r.u32()
    if version & 0xFFFF == 0 and version != 0:  # a big-endian file read as little-endian
        r.endian = ">"
        version = struct.unpack_from(">I", buf, 4)[0]
    if version not in (2, 3):
        raise r.fail(f"unsupported GGUF version {version}")
    r.u64()  # tensor count: not needed for the tokenizer
    n_kv = r.u64()
    if n_kv > MAX_KV:
        raise r.fail(f"declares {n_kv:,} metadata keys")
    values: dict[str, Any] = {}
    for i in range(n_kv):
        r.key = f"metadata[{i}]"
        key = r.string()
        r.key = key
        vtype = r.u32()
        values[key] = r.value(vtype)
    return GGUFMetadata(path=path, sha256=digest, version=version, values=values)


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer of a GGUF file as llama.cpp reads it: `tokenizer.ggml.*` and `tokenizer.chat_template*`."""

    path: str
    sha256: str
    architecture: str | None
    model: str  # gpt2 (byte-level BPE), llama (SentencePiece), bert (WordPiece), t5 (Unigram), gemma4, ...
    pre: str | None  # the pre-tokenizer name (qwen2, llama-bpe, deepseek-llm, ...)
    tokens: tuple[str, ...] = field(repr=False)
    token_types: np.ndarray | None = field(repr=False, compare=False)
    scores: np.ndarray | None = field(repr=False, compare=False)
    merges: tuple[str, ...] | None = field(repr=False)
    special_ids: Mapping[str, int]  # bos, eos, unk, pad, sep, cls, mask, eot, eom, ...
    add_bos: bool | None
    add_eos: bool | None
    add_space_prefix: bool | None
    remove_extra_whitespaces: bool | None
    precompiled_charsmap: bytes | None = field(repr=False)
    chat_templates: Mapping[str, str] = field(repr=False)  # "default" plus any named ones
    context_length: Any = field(default=None, compare=False)  # `<architecture>.context_length` as written

    def token_type(self, i: int) -> int:
        return int(self.token_types[i]) if self.token_types is not None else int(TokenType.NORMAL)


def _id_keys() -> dict[str, str]:
    """The special-token id keys, by the name the template variables use (read on first use: `gguf_constants`)."""
    return {
        "bos": Keys.Tokenizer.BOS_ID,
        "eos": Keys.Tokenizer.EOS_ID,
        "unk": Keys.Tokenizer.UNK_ID,
        "pad": Keys.Tokenizer.PAD_ID,
        "sep": Keys.Tokenizer.SEP_ID,
        "cls": "tokenizer.ggml.cls_token_id",  # not in gguf.Keys; written by llama.cpp for BERT vocabs
        "mask": Keys.Tokenizer.MASK_ID,
        "eot": Keys.Tokenizer.EOT_ID,
        "eom": Keys.Tokenizer.EOM_ID,
    }


def read_vocab(path: str | Path) -> GGUFVocab:
    """Read a GGUF file's tokenizer, checking that the pieces fit together."""
    meta = read_metadata(path)
    where = meta.path

    def typed(key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        value = meta.get(key, default)
        if value is not None and not isinstance(value, kind):
            raise ArtifactFormatError(f"has type {type(value).__name__}", path=f"{where}:{key}")
        return value

    model = typed(Keys.Tokenizer.MODEL, str)
    if model is None:
        raise ArtifactFormatError(
            "no tokenizer.ggml.model: this GGUF file carries no tokenizer", path=f"{where}:{Keys.Tokenizer.MODEL}"
        )
    tokens = typed(Keys.Tokenizer.LIST, list)
    if not tokens:
        raise ArtifactFormatError("no vocabulary", path=f"{where}:{Keys.Tokenizer.LIST}")
    n = len(tokens)
    token_types = typed(Keys.Tokenizer.TOKEN_TYPE, np.ndarray)
    scores = typed(Keys.Tokenizer.SCORES, np.ndarray)
    for key, arr in ((Keys.Tokenizer.TOKEN_TYPE, token_types), (Keys.Tokenizer.SCORES, scores)):
        if arr is not None and len(arr) != n:
            raise ArtifactFormatError(f"has {len(arr):,} entries for {n:,} tokens", path=f"{where}:{key}")
    merges = typed(Keys.Tokenizer.MERGES, list)
    if merges is not None:
        known = set(tokens)
        for i, merge in enumerate(merges):
            left, sep, right = merge.partition(" ")
            if not sep or left not in known or right not in known or left + right not in known:
                raise ArtifactFormatError(
                    f"merge {merge!r} references a token that is not in the vocabulary",
                    path=f"{where}:{Keys.Tokenizer.MERGES}[{i}]",
                    hint="the merges do not belong to this vocabulary",
                )
    special_ids: dict[str, int] = {}
    for name, key in _id_keys().items():
        value = meta.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or not 0 <= value < n:
            raise ArtifactFormatError(f"id {value!r} is outside the vocabulary of {n:,}", path=f"{where}:{key}")
        special_ids[name] = value
    templates: dict[str, str] = {}
    if isinstance(meta.get(Keys.Tokenizer.CHAT_TEMPLATE), str):
        templates["default"] = meta.get(Keys.Tokenizer.CHAT_TEMPLATE)
    for name in typed(Keys.Tokenizer.CHAT_TEMPLATES, list, []) or []:
        text = meta.get(f"{Keys.Tokenizer.CHAT_TEMPLATE}.{name}")
        if isinstance(text, str):
            templates[name] = text
    for name, text in templates.items():
        # A template is compiled only up to this size (see ctxlock.template.sandbox); refused before anything is cached.
        if len(text) > DEFAULT_LIMITS.max_source_chars:
            key = Keys.Tokenizer.CHAT_TEMPLATE + ("" if name == "default" else f".{name}")
            raise TemplateLimitError(
                f"the chat template has {len(text):,} characters (limit {DEFAULT_LIMITS.max_source_chars:,})",
                path=f"{where}:{key}",
                hint="the file's template is over ctxlock's limits; it may be hostile",
            )
    charsmap = meta.get(Keys.Tokenizer.PRECOMPILED_CHARSMAP)
    return GGUFVocab(
        path=meta.path,
        sha256=meta.sha256,
        architecture=typed("general.architecture", str),
        model=model,
        pre=typed(Keys.Tokenizer.PRE, str),
        tokens=tuple(tokens),
        token_types=token_types,
        scores=scores,
        merges=tuple(merges) if merges is not None else None,
        special_ids=special_ids,
        add_bos=_flag(meta, Keys.Tokenizer.ADD_BOS),
        add_eos=_flag(meta, Keys.Tokenizer.ADD_EOS),
        add_space_prefix=_flag(meta, Keys.Tokenizer.ADD_PREFIX),
        remove_extra_whitespaces=_flag(meta, Keys.Tokenizer.REMOVE_EXTRA_WS),
        precompiled_charsmap=bytes(charsmap.astype("u1")) if isinstance(charsmap, np.ndarray) else None,
        chat_templates=templates,
        context_length=_context_length(meta),
    )


def _context_length(meta: GGUFMetadata) -> Any:
    """`<general.architecture>.context_length` as written (the model's window; `ctxlock.economics` checks it)."""
    arch = meta.get("general.architecture")
    return meta.get(f"{arch}.context_length") if isinstance(arch, str) else None


def _flag(meta: GGUFMetadata, key: str) -> bool | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ArtifactFormatError(f"expected a bool, got {type(value).__name__}", path=f"{meta.path}:{key}")
    return value
