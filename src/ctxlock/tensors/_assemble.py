# size: one mapping contract (ModelInput, its torch twin and their assembly), 700 lines before assistant_masks;
# splitting TorchInput out would make the two modules import each other.
"""The tensors stage: token ids -> the exact arrays a model receives.

    ids (one sequence, or a batch)  ->  ModelInput(input_ids, attention_mask, position_ids, valid_lengths)

Pure and I/O-free. Arrays are numpy int64 and read-only; `ModelInput.to_torch()` converts on request, and torch
is imported there and only there (it is an optional extra: ``pip install 'ctxlock[torch]'``).

Conventions (all of them Hugging Face's, so a ModelInput can be passed straight to a transformers model):

* ``padding_side="right"``: the real tokens of a row come first, then ``pad_id`` (``tokenizer.padding_side =
  "right"``, the default for training/encoders). ``padding_side="left"``: the pads come first and the last real
  token sits at index ``n - 1``, which is what decoder-only generation needs (the next token is predicted from the
  last column for every row).
* ``attention_mask`` is 1 on real tokens and 0 on padding.
* ``position_ids`` count real tokens only: the real tokens of every row get ``0 .. len - 1`` whichever side the
  padding is on, and padding slots get ``1``. This is exactly transformers' generation convention
  (``GenerationMixin.prepare_inputs_for_generation``)::

      position_ids = attention_mask.long().cumsum(-1) - 1
      position_ids.masked_fill_(attention_mask == 0, 1)

  The value on padding slots is irrelevant to the model (those positions are masked out) but it is fixed here so
  that the arrays, and therefore records and their digests, are deterministic.
* ``pad_to_multiple_of`` rounds the padded length up to a multiple, like ``tokenizer.pad(pad_to_multiple_of=...)``.

Decisions:

* ``pad_id`` is only required when padding actually happens (rows of different lengths, or a length that
  ``pad_to_multiple_of`` rounds up). Passing ``pad_id=None`` is the caller asserting "there is no padding".
  When padding is needed and ``pad_id`` is None, `TensorError` names ``pad_id``.
* A zero-length row is legal: it is all padding (mask all 0, positions all 1). A batch whose rows are all empty
  has shape ``[B, 0]``. ``assemble([])`` likewise gives shape ``[1, 0]``; refusing an empty prompt is the job of
  an earlier stage, not of the tensor layout.
* Ids must be ints (Python ``int`` or numpy integer; ``bool`` and floats are refused, even ``1.0``) in
  ``0 .. 2**63 - 1``. There is no vocabulary here, so no upper bound beyond int64.
* A ``ModelInput`` validates its own invariants when it is built (also from `ModelInput.from_dict`), so a value
  read back from a record is as trustworthy as one produced by `assemble_batch`.
* ``pad_id`` may equal a real token id (pad = eos is common); the mask, not the id, says what is padding.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import numpy as np

from ctxlock.errors import TensorError, TensorKeyError

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "KEYS",
    "ModelInput",
    "PaddingSide",
    "TorchInput",
    "assemble",
    "assemble_batch",
    "check_return_tensors",
    "tensors_as",
]

# The mapping keys of a ModelInput, in this order: the keyword names of a transformers model's `forward`, so that
# `model(**inputs)` works (BatchEncoding from `apply_chat_template(return_dict=True)` has the first two).
KEYS = ("input_ids", "attention_mask", "position_ids")

# The fields of a ModelInput, in order (`to_dict` keys).
_FIELDS = ("input_ids", "attention_mask", "position_ids", "valid_lengths", "padding_side", "pad_id")
_INT64_MAX = int(np.iinfo(np.int64).max)
_TORCH_HINT = "pip install 'ctxlock[torch]'"
_PAD_HINT = "set pad_token in the tokenizer config, or pass pad_id= explicitly"


class PaddingSide(StrEnum):
    """Where padding goes in a row (HF ``tokenizer.padding_side``)."""

    LEFT = "left"
    RIGHT = "right"


# ---------------------------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------------------------


def _is_int(x: object) -> TypeGuard[int | np.integer[Any]]:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _padding_side(value: PaddingSide | str, path: str = "padding_side") -> PaddingSide:
    if isinstance(value, PaddingSide):
        return value
    if isinstance(value, str):
        try:
            return PaddingSide(value)
        except ValueError:
            pass
    raise TensorError(
        f"invalid padding side {value!r}",
        path=path,
        hint="use 'left' (decoder-only generation) or 'right'",
    )


def _pad_id(value: object, path: str = "pad_id") -> int | None:
    if value is None:
        return None
    if not _is_int(value) or not 0 <= int(value) <= _INT64_MAX:
        raise TensorError(
            f"pad_id must be a non-negative int or None, got {value!r}",
            path=path,
            hint="pass the tokenizer's pad token id",
        )
    return int(value)


def _multiple(value: object) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or int(value) < 1:
        raise TensorError(
            f"pad_to_multiple_of must be a positive int or None, got {value!r}",
            path="pad_to_multiple_of",
            hint="use e.g. 8 or 64, or None for no rounding",
        )
    return int(value)


def _coerce_row(row: object, path: str) -> np.ndarray:
    """One sequence of ids -> a fresh 1-D int64 array, or TensorError naming ``path`` / ``path[j]``."""
    if isinstance(row, np.ndarray):
        if row.ndim != 1:
            raise TensorError(
                f"a sequence of ids must be 1-D, got an array of shape {row.shape}",
                path=path,
                hint="pass one flat list of token ids per row",
            )
        if row.size == 0:
            return np.zeros(0, dtype=np.int64)
        if row.dtype.kind not in "iu":
            raise TensorError(
                f"token ids must be integers, got an array of dtype {row.dtype}",
                path=path,
                hint="token ids are ints; convert with .astype(np.int64) only if the values are exact",
            )
        bad = np.flatnonzero(row < 0) if row.dtype.kind == "i" else np.flatnonzero(row > _INT64_MAX)
        if bad.size:
            j = int(bad[0])
            raise TensorError(
                f"token id {int(row[j])} is out of range (0 .. 2**63-1)",
                path=f"{path}[{j}]",
                hint="token ids are non-negative; check the tokenizer output",
            )
        return row.astype(np.int64, copy=True)
    if isinstance(row, (str, bytes, bytearray)) or not isinstance(row, Sequence):
        raise TensorError(
            f"expected a sequence of token ids, got {type(row).__name__}",
            path=path,
            hint="pass a list of int token ids (tokenize text first)",
        )
    if set(map(type, row)) <= {int}:
        # The common case, checked in C: plain ints, converted at once; the loop below names the first bad id.
        try:
            arr = np.array(row, dtype=np.int64).reshape(len(row))
        except OverflowError:
            arr = None
        if arr is not None and (arr.size == 0 or arr.min() >= 0):
            return arr
    for j, x in enumerate(row):
        if type(x) is not int and not _is_int(x):
            raise TensorError(
                f"token id must be an int, got {type(x).__name__} {x!r}",
                path=f"{path}[{j}]",
                hint="token ids are ints; bools and floats are refused",
            )
        if not 0 <= x <= _INT64_MAX:
            raise TensorError(
                f"token id {int(x)} is out of range (0 .. 2**63-1)",
                path=f"{path}[{j}]",
                hint="token ids are non-negative; check the tokenizer output",
            )
    return np.array(row, dtype=np.int64).reshape(len(row))


def _frozen_int64(value: object, name: str) -> np.ndarray:
    """A read-only 2-D int64 array from an array or nested lists; copies unless already a read-only int64 owner."""
    if isinstance(value, np.ndarray) and value.dtype == np.int64 and not value.flags.writeable and value.flags.owndata:
        arr = value
    else:
        try:
            raw = np.asarray(value)
        except (ValueError, TypeError) as exc:  # ragged lists
            raise TensorError(
                f"{name} is not a rectangular array: {exc}", path=name, hint="every row needs n values"
            ) from exc
        if raw.ndim != 2:
            raise TensorError(
                f"{name} must be 2-D [batch, seq], got shape {raw.shape}",
                path=name,
                hint="use assemble() / assemble_batch() to build a ModelInput",
            )
        if raw.size and raw.dtype.kind not in "iu":
            raise TensorError(
                f"{name} must hold integers, got dtype {raw.dtype}",
                path=name,
                hint="use assemble() / assemble_batch() to build a ModelInput",
            )
        if raw.size and raw.dtype.kind == "u" and raw.max() > _INT64_MAX:
            raise TensorError(f"{name} has values beyond int64", path=name, hint="ids must fit in int64")
        arr = np.array(raw, dtype=np.int64, copy=True)
        arr.flags.writeable = False
    if arr.ndim != 2:
        raise TensorError(
            f"{name} must be 2-D [batch, seq], got shape {arr.shape}",
            path=name,
            hint="use assemble() / assemble_batch() to build a ModelInput",
        )
    return arr


def _hf_position_ids(mask: np.ndarray) -> np.ndarray:
    """transformers' convention: ``cumsum(mask) - 1`` on real tokens, ``1`` on padding."""
    pos = np.cumsum(mask, axis=-1, dtype=np.int64) - 1
    pos[mask == 0] = 1
    return pos


def _first_bad_row(ok_per_row: np.ndarray) -> int:
    return int(np.flatnonzero(~ok_per_row)[0])


def _check_shapes(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray) -> None:
    """The three arrays have the same ``[B, n]`` shape, with ``B >= 1``."""
    for name, arr in (("attention_mask", mask), ("position_ids", pos)):
        if arr.shape != ids.shape:
            raise TensorError(
                f"{name} has shape {arr.shape}, input_ids has {ids.shape}",
                path=name,
                hint="all three arrays must be [batch, seq]",
            )
    if ids.shape[0] < 1:
        raise TensorError("a ModelInput needs at least one row", path="input_ids", hint="pass a non-empty batch")


def _valid_lengths(raw_lengths: object, batch: int, n: int) -> tuple[int, ...]:
    """One int in ``0..n`` per row, as a tuple."""
    if isinstance(raw_lengths, (str, bytes)) or not isinstance(raw_lengths, (Sequence, np.ndarray)):
        raise TensorError("valid_lengths must be a sequence of ints", path="valid_lengths", hint="one length per row")
    if len(raw_lengths) != batch:
        raise TensorError(
            f"valid_lengths has {len(raw_lengths)} entries for {batch} rows",
            path="valid_lengths",
            hint="one length per row",
        )
    for b, v in enumerate(raw_lengths):
        if not _is_int(v) or not 0 <= int(v) <= n:
            raise TensorError(
                f"valid length {v!r} is not an int in 0..{n}",
                path=f"valid_lengths[{b}]",
                hint="a valid length counts the real tokens of its row",
            )
    return tuple(int(v) for v in raw_lengths)


def _check_mask_and_positions(mask: np.ndarray, pos: np.ndarray, lengths: tuple[int, ...], side: PaddingSide) -> None:
    """The mask is 0/1, contiguous on ``side`` with ``lengths`` ones per row, and the positions are transformers'."""
    n = mask.shape[1]
    if mask.size and not np.isin(mask, (0, 1)).all():
        b = _first_bad_row(cast(np.ndarray, np.isin(mask, (0, 1)).all(axis=1)))  # 2-D: one bool per row
        raise TensorError("attention_mask must be 0/1", path=f"attention_mask[{b}]", hint="1 = real, 0 = pad")
    lens = np.asarray(lengths, dtype=np.int64)[:, None]
    cols = np.arange(n, dtype=np.int64)[None, :]
    expected_mask = (cols < lens) if side is PaddingSide.RIGHT else (cols >= n - lens)
    rows_ok = (mask == expected_mask.astype(np.int64)).all(axis=1)
    if not rows_ok.all():
        b = _first_bad_row(rows_ok)
        raise TensorError(
            f"attention_mask row does not match {side.value} padding with valid length {lengths[b]}",
            path=f"attention_mask[{b}]",
            hint=f"{side.value} padding puts {'real tokens first' if side is PaddingSide.RIGHT else 'pads first'}",
        )
    pos_ok = (pos == _hf_position_ids(mask)).all(axis=1)
    if not pos_ok.all():
        b = _first_bad_row(pos_ok)
        raise TensorError(
            "position_ids must be 0..len-1 on real tokens and 1 on padding (transformers' convention)",
            path=f"position_ids[{b}]",
            hint="build ModelInput with assemble_batch()",
        )


def _check_ids(ids: np.ndarray, mask: np.ndarray, pad_id: int | None) -> None:
    """Real ids are non-negative; every padding slot holds ``pad_id`` (and there is none when it is None)."""
    real = mask == 1
    if (ids[real] < 0).any():
        b = _first_bad_row(~((ids < 0) & real).any(axis=1))
        raise TensorError("negative token id", path=f"input_ids[{b}]", hint="token ids are non-negative")
    padding = ~real
    if padding.any():
        if pad_id is None:
            b = _first_bad_row(~padding.any(axis=1))
            raise TensorError(f"row {b} has padding but pad_id is None", path="pad_id", hint=_PAD_HINT)
        pad_ok = ~((ids != pad_id) & padding).any(axis=1)
        if not pad_ok.all():
            b = _first_bad_row(pad_ok)
            raise TensorError(
                f"a padding slot does not hold pad_id {pad_id}",
                path=f"input_ids[{b}]",
                hint="padding slots must hold pad_id",
            )


class _KeyedInput(Mapping[str, Any]):
    """The read-only mapping of the three `KEYS` that `ModelInput` and `TorchInput` are, as transformers'
    ``BatchEncoding`` is one; any other key is a TensorKeyError. A subclass gives a key's value (`_value`)."""

    __slots__ = ()
    _kind = "input"  # the type's name in messages
    _attributes: tuple[str, ...] = ()  # names that are attributes, not keys (a hint says so)

    def _value(self, key: str) -> Any:
        raise NotImplementedError

    def _keys(self) -> tuple[str, ...]:  # KEYS, and `assistant_masks` when it was asked for
        return KEYS

    def __getitem__(self, key: str) -> Any:
        if isinstance(key, str) and key in self._keys():
            return self._value(key)
        attribute = f"; {key} is an attribute: mi.{key}" if key in self._attributes else ""
        hint = f"the keys are {', '.join(self._keys())}" + attribute
        raise TensorKeyError(f"{self._kind} has no key {key!r}", path=f"{self._kind}[{key!r}]", hint=hint)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def __contains__(self, key: object) -> bool:
        return key in self._keys()

    @property
    def data(self) -> dict[str, Any]:
        """A fresh dict of the values (``BatchEncoding.data``): the originals, for a ModelInput read-only."""
        return {k: self._value(k) for k in self._keys()}


# ---------------------------------------------------------------------------------------------------------------
# ModelInput
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ModelInput(_KeyedInput):
    """The exact input of one forward pass: ``[B, n]`` int64 arrays, read-only.

    A read-only mapping, as transformers' ``BatchEncoding`` is: ``mi["input_ids"]``, ``mi.keys()`` (``input_ids``,
    ``attention_mask``, ``position_ids``, in that order), ``len(mi)`` (3), ``in``, iteration, ``items()``,
    ``dict(mi)`` and ``model(**mi.to("cpu"))``; attribute access (``mi.input_ids``) works too. The values are the
    numpy arrays themselves (read-only; ``mi.data`` is a fresh dict of them). ``valid_lengths``, ``padding_side``
    and ``pad_id`` are attributes, not keys. Unlike ``BatchEncoding``, nothing can be set or deleted.

    Invariants (checked on construction):
      * the three arrays have the same 2-D shape ``[B, n]`` with ``B >= 1``;
      * ``attention_mask`` is 0/1, contiguous: ones then zeros (right) or zeros then ones (left);
      * ``valid_lengths[b] == attention_mask[b].sum()``;
      * ``position_ids`` follow transformers' convention (``cumsum(mask) - 1``, 1 on padding);
      * every padding slot holds ``pad_id``; if ``pad_id`` is None there is no padding;
      * real token ids are ``>= 0``.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray
    valid_lengths: tuple[int, ...]
    padding_side: PaddingSide
    pad_id: int | None
    # [B, n] 0/1: the tokens a model is trained on
    # (`encode(..., return_assistant_tokens_mask=True)`, `ctxlock.training`);
    # a fourth key when set, as transformers' `return_assistant_tokens_mask` adds it. 0 on padding.
    assistant_masks: np.ndarray | None = None

    def __post_init__(self) -> None:
        ids = _frozen_int64(self.input_ids, "input_ids")
        mask = _frozen_int64(self.attention_mask, "attention_mask")
        pos = _frozen_int64(self.position_ids, "position_ids")
        side = _padding_side(self.padding_side)
        pad_id = _pad_id(self.pad_id)
        _check_shapes(ids, mask, pos)
        lengths = _valid_lengths(self.valid_lengths, *ids.shape)
        _check_mask_and_positions(mask, pos, lengths, side)
        _check_ids(ids, mask, pad_id)
        _set_fields(self, ids, mask, pos, lengths, side, pad_id)
        if self.assistant_masks is not None:
            object.__setattr__(self, "assistant_masks", _check_assistant_masks(self.assistant_masks, mask))

    def with_assistant_masks(self, masks: object) -> ModelInput:
        """This input with `assistant_masks` (``[B, n]``, 0/1, 0 on padding) added as a key."""
        out = _frozen_input(*(getattr(self, f) for f in _FIELDS))
        object.__setattr__(out, "assistant_masks", _check_assistant_masks(masks, self.attention_mask))
        return out

    def _keys(self) -> tuple[str, ...]:
        return KEYS if self.assistant_masks is None else (*KEYS, "assistant_masks")

    # -- shape -------------------------------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    def row(self, b: int) -> list[int]:
        """The real ids of row ``b`` (padding removed), as plain ints. Negative ``b`` counts from the end."""
        if not _is_int(b) or not -self.batch_size <= int(b) < self.batch_size:
            raise TensorError(
                f"row index {b!r} is out of range for batch size {self.batch_size}",
                path=f"row({b!r})",
                hint=f"use 0..{self.batch_size - 1}",
            )
        b = int(b) % self.batch_size
        n, length = self.seq_len, self.valid_lengths[b]
        start = 0 if self.padding_side is PaddingSide.RIGHT else n - length
        ids: list[int] = self.input_ids[b, start : start + length].tolist()
        return ids

    # -- mapping (transformers' BatchEncoding) --------------------------------------------------------------------

    _kind = "ModelInput"
    _attributes = ("valid_lengths", "padding_side", "pad_id")

    def _value(self, key: str) -> np.ndarray:
        value: np.ndarray = getattr(self, key)  # one of the three arrays (`_keys`)
        return value

    def to(self, device: Any, *, non_blocking: bool = False) -> TorchInput:
        """The arrays as torch tensors on ``device`` (``BatchEncoding.to``). numpy arrays have no device, so this
        returns a new `TorchInput` (the ModelInput is immutable): write ``inputs = mi.to("cuda")``."""
        return self.as_tensors("pt").to(device, non_blocking=non_blocking)

    def as_tensors(self, return_tensors: str | None) -> ModelInput | TorchInput:
        """transformers' ``return_tensors``: None or "np" -> this ModelInput (numpy int64), "pt" -> a `TorchInput`
        (``torch.long``); any other value is a TensorError naming it."""
        return tensors_as(self, return_tensors)

    # -- conversion ----------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (lists of ints, strings); `from_dict` is the inverse."""
        return {
            "input_ids": self.input_ids.tolist(),
            "attention_mask": self.attention_mask.tolist(),
            "position_ids": self.position_ids.tolist(),
            "valid_lengths": list(self.valid_lengths),
            "padding_side": self.padding_side.value,
            "pad_id": self.pad_id,
        } | ({} if self.assistant_masks is None else {"assistant_masks": self.assistant_masks.tolist()})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelInput:
        """Rebuild (and re-validate) a ModelInput from `to_dict` output, e.g. read back from a record."""
        if not isinstance(data, Mapping):
            raise TensorError(
                f"expected a mapping, got {type(data).__name__}", path="model_input", hint="pass to_dict() output"
            )
        missing = [k for k in _FIELDS if k not in data]
        if missing:
            raise TensorError(f"missing key {missing[0]!r}", path=missing[0], hint="pass to_dict() output")
        vl = data["valid_lengths"]
        return cls(
            input_ids=data["input_ids"],
            attention_mask=data["attention_mask"],
            position_ids=data["position_ids"],
            valid_lengths=tuple(vl) if isinstance(vl, (list, tuple)) else vl,
            padding_side=data["padding_side"],
            pad_id=data["pad_id"],
            assistant_masks=data.get("assistant_masks"),
        )

    def to_torch(self) -> dict[str, torch.Tensor]:
        """``input_ids`` / ``attention_mask`` / ``position_ids`` as ``torch.long`` tensors (fresh copies).

        The keys are the keyword names of a transformers model's ``forward``, so ``model(**mi.to_torch())`` works.
        torch is imported here, never at module import.
        """
        torch = _import_torch("to_torch")
        return {k: torch.tensor(getattr(self, k), dtype=torch.long) for k in self._keys()}

    # -- value semantics -----------------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        # dataclass eq would compare arrays with ==, which is elementwise (and ambiguous in a bool context).
        if not isinstance(other, ModelInput):
            return NotImplemented
        return (
            self.valid_lengths == other.valid_lengths
            and self.padding_side == other.padding_side
            and self.pad_id == other.pad_id
            and np.array_equal(self.input_ids, other.input_ids)
            and np.array_equal(self.attention_mask, other.attention_mask)
            and np.array_equal(self.position_ids, other.position_ids)
            and _same_masks(self.assistant_masks, other.assistant_masks)
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle and deepcopy rebuild through the constructor: numpy unpickles (and deep-copies) an array writable,
        # and the constructor validates and freezes it again.
        fields = (self.input_ids, self.attention_mask, self.position_ids, self.valid_lengths, self.padding_side)
        return (ModelInput, (*fields, self.pad_id, self.assistant_masks))

    def __hash__(self) -> int:
        # The arrays are read-only and int64, so their shape + bytes are a sound hash key.
        return hash(
            (
                self.input_ids.shape,
                self.input_ids.tobytes(),
                self.attention_mask.tobytes(),
                self.position_ids.tobytes(),
                self.valid_lengths,
                self.padding_side,
                self.pad_id,
                None if self.assistant_masks is None else self.assistant_masks.tobytes(),
            )
        )

    def __repr__(self) -> str:
        return (
            f"ModelInput(batch_size={self.batch_size}, seq_len={self.seq_len}, valid_lengths={self.valid_lengths}, "
            f"padding_side={self.padding_side.value!r}, pad_id={self.pad_id!r})"
        )


class TorchInput(_KeyedInput):
    """`ModelInput` as torch tensors (``encode(..., return_tensors="pt")``): a read-only mapping of ``input_ids``,
    ``attention_mask`` and ``position_ids`` (``torch.long``), with attribute access, like a ``BatchEncoding`` of
    torch tensors. ``to(device)`` returns a new TorchInput on that device. ``model_input`` is the ModelInput it was
    made from (``valid_lengths``, ``padding_side``, ``pad_id``, the numpy arrays)."""

    __slots__ = ("_tensors", "model_input")

    def __init__(self, tensors: Mapping[str, Any], model_input: ModelInput) -> None:
        object.__setattr__(self, "_tensors", {k: tensors[k] for k in model_input})
        object.__setattr__(self, "model_input", model_input)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"TorchInput is read-only: cannot set {name!r}")

    _kind = "TorchInput"

    def _value(self, key: str) -> Any:
        return self._tensors[key]

    def _keys(self) -> tuple[str, ...]:
        return tuple(self._tensors)

    def __getattr__(self, name: str) -> Any:
        if name in (*KEYS, "assistant_masks") and name in self._tensors:
            return self._tensors[name]
        raise AttributeError(f"TorchInput has no attribute {name!r}")

    # pickle, copy and deepcopy (a DataLoader worker pickles its batches): rebuilt through the constructor, since
    # attribute assignment is refused.
    def __reduce__(self) -> tuple[Any, ...]:
        return (TorchInput, (dict(self._tensors), self.model_input))

    def __eq__(self, other: object) -> bool:
        # Mapping's == compares the tensors with ==, which is elementwise (ambiguous as a bool): equal when the
        # ModelInputs are, and every tensor is equal and on the same device.
        if not isinstance(other, TorchInput):
            return NotImplemented
        return self.model_input == other.model_input and all(
            a.device == b.device and a.equal(b) for a, b in zip(self.values(), other.values(), strict=True)
        )

    __hash__ = None  # type: ignore[assignment]  # torch tensors are mutable, as BatchEncoding's are

    def to(self, device: Any, *, non_blocking: bool = False) -> TorchInput:
        """A new TorchInput with every tensor moved to ``device`` (``BatchEncoding.to``, without mutating)."""
        return TorchInput(
            {k: v.to(device=device, non_blocking=non_blocking) for k, v in self._tensors.items()}, self.model_input
        )

    def __repr__(self) -> str:
        mi = self.model_input
        return f"TorchInput(batch_size={mi.batch_size}, seq_len={mi.seq_len}, device={self.input_ids.device})"


def _import_torch(path: str) -> Any:
    try:
        import torch
    except ImportError as exc:
        raise TensorError("torch is not installed", path=path, hint=_TORCH_HINT) from exc
    return torch


def tensors_as(model_input: ModelInput, return_tensors: str | None) -> ModelInput | TorchInput:
    """transformers' ``return_tensors`` for a ModelInput: None or "np" keep it (numpy int64), "pt" gives a
    `TorchInput` (torch imported here, on request); "tf", "jax", "mlx" or anything else is a TensorError."""
    if check_return_tensors(return_tensors) is None:
        return model_input
    torch = _import_torch("return_tensors='pt'")
    return TorchInput({k: torch.tensor(model_input[k], dtype=torch.long) for k in model_input}, model_input)


def check_return_tensors(return_tensors: object) -> str | None:
    """None for numpy (None or "np"), "pt" for torch (checked to be importable); else a TensorError naming it."""
    if return_tensors is None or return_tensors == "np":
        return None
    if return_tensors == "pt":
        _import_torch("return_tensors='pt'")
        return "pt"
    raise TensorError(
        f"return_tensors={return_tensors!r} is not supported",
        path="return_tensors",
        hint="use 'np' (numpy, the default) or 'pt' (torch, pip install 'ctxlock[torch]'); "
        "for another framework convert the numpy arrays",
    )


# ---------------------------------------------------------------------------------------------------------------
# assembly
# ---------------------------------------------------------------------------------------------------------------


def assemble(ids: Sequence[int]) -> ModelInput:
    """One sequence -> a ``[1, n]`` ModelInput: no padding, mask all 1, ``position_ids = 0..n-1``.

    Equal to ``assemble_batch([ids], pad_id=None)``.
    """
    row = _coerce_row(ids, "ids")
    n = row.shape[0]
    return _build([row], n, pad_id=None, side=PaddingSide.RIGHT)


def assemble_own(ids: Sequence[int]) -> ModelInput:
    """`assemble` for ids ctxlock's own tokenizer stage produced (plain non-negative ints by construction): the
    per-id checks, which exist to name a bad id from a caller, are skipped."""
    n = len(ids)
    # One row, no padding: the mask is all ones and the positions are 0..n-1 (what `_build` computes, directly).
    input_ids = np.array(ids, dtype=np.int64).reshape(1, n)
    mask = np.ones((1, n), dtype=np.int64)
    pos = np.arange(n, dtype=np.int64).reshape(1, n)
    return _frozen_input(input_ids, mask, pos, (n,), PaddingSide.RIGHT, None)


def assemble_batch(
    sequences: Sequence[Sequence[int]],
    *,
    pad_id: int | None,
    padding_side: PaddingSide | str = PaddingSide.RIGHT,
    pad_to_multiple_of: int | None = None,
) -> ModelInput:
    """Pad a batch of id sequences to one ``[B, n]`` ModelInput (HF ``tokenizer.pad`` semantics).

    ``n`` is the longest row, rounded up to ``pad_to_multiple_of`` if given. ``pad_id`` is required only if some
    row is shorter than ``n``. See the module docstring for the padding and position-id conventions.
    """
    side = _padding_side(padding_side)
    pad = _pad_id(pad_id)
    multiple = _multiple(pad_to_multiple_of)
    if isinstance(sequences, (str, bytes, bytearray)) or not isinstance(sequences, (Sequence, np.ndarray)):
        raise TensorError(
            f"expected a sequence of id sequences, got {type(sequences).__name__}",
            path="sequences",
            hint="pass a list of lists of token ids",
        )
    if len(sequences) == 0:
        raise TensorError("empty batch", path="sequences", hint="pass at least one sequence")
    rows = [_coerce_row(seq, f"sequences[{i}]") for i, seq in enumerate(sequences)]
    lengths = [r.shape[0] for r in rows]
    n = max(lengths)
    if multiple is not None and n % multiple:
        n += multiple - n % multiple
    if pad is None and any(length != n for length in lengths):
        if len(set(lengths)) > 1:
            why = f"sequences have different lengths {tuple(lengths)}"
        else:
            why = f"pad_to_multiple_of={multiple} rounds length {lengths[0]} up to {n}"
        raise TensorError(f"{why}, so padding is needed, but pad_id is None", path="pad_id", hint=_PAD_HINT)
    return _build(rows, n, pad_id=pad, side=side)


def _build(rows: list[np.ndarray], n: int, *, pad_id: int | None, side: PaddingSide) -> ModelInput:
    batch = len(rows)
    ids = np.full((batch, n), 0 if pad_id is None else pad_id, dtype=np.int64)
    mask = np.zeros((batch, n), dtype=np.int64)
    for b, row in enumerate(rows):
        length = row.shape[0]
        if length == 0:
            continue
        # HF: right padding = real tokens then pads; left padding = pads then real tokens.
        sl = slice(0, length) if side is PaddingSide.RIGHT else slice(n - length, n)
        ids[b, sl] = row
        mask[b, sl] = 1
    return _frozen_input(ids, mask, _hf_position_ids(mask), tuple(r.shape[0] for r in rows), side, pad_id)


def _frozen_input(
    ids: np.ndarray,
    mask: np.ndarray,
    pos: np.ndarray,
    lengths: tuple[int, ...],
    side: PaddingSide,
    pad_id: int | None,
) -> ModelInput:
    for arr in (ids, mask, pos):
        arr.flags.writeable = False
    # Built to the invariants by construction (the rows are validated, the mask and positions derived), so the
    # constructor's re-validation is skipped; tests/tensors/test_tensors.py checks that it would accept every such
    # value.
    out = object.__new__(ModelInput)
    _set_fields(out, ids, mask, pos, lengths, side, pad_id)
    return out


def _check_assistant_masks(masks: object, attention_mask: np.ndarray) -> np.ndarray:
    arr = _frozen_int64(masks, "assistant_masks")
    if arr.shape != attention_mask.shape or not np.isin(arr, (0, 1)).all() or (arr > attention_mask).any():
        hint = "one 0/1 value per token, 0 on padding (ctxlock.training builds them)"
        raise TensorError(f"assistant_masks {arr.shape} do not fit the input", path="assistant_masks", hint=hint)
    return arr


def _same_masks(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))


def _set_fields(out: ModelInput, *values: Any) -> None:
    """Set the (frozen) fields of `out`, in `_FIELDS` order."""
    for name, value in zip(_FIELDS, values, strict=True):
        object.__setattr__(out, name, value)
