"""Tests for the tensors stage (ctxlock.tensors._assemble): padding, masks, position ids, conversions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlock.errors import TensorError
from ctxlock.tensors._assemble import ModelInput, PaddingSide, assemble, assemble_batch
from hypothesis_profiles import examples

# Realistic Qwen2-style ids: <|im_start|>=151644, <|im_end|>=151645, <|endoftext|>=151643 (Qwen's pad token).
P = 151643
A = [151644, 872, 198, 9707, 151645]  # "<|im_start|>user\nHello<|im_end|>"  (5)
B = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644]  # a system turn + next start (12)
C = [198]  # (1)

SRC = Path(__file__).resolve().parents[2] / "src"


def _torch_reference_positions(mask: np.ndarray) -> np.ndarray:
    """transformers' generation convention, computed with torch exactly as GenerationMixin does."""
    import torch

    m = torch.tensor(mask, dtype=torch.long)
    pos = m.cumsum(-1) - 1
    pos.masked_fill_(m == 0, 1)
    return pos.numpy()


# ---------------------------------------------------------------------------------------------------------------
# acceptance: a batch of lengths 5, 12, 1 padded right and left, arrays written out by hand
# ---------------------------------------------------------------------------------------------------------------


def test_acceptance_right_padding_5_12_1():
    mi = assemble_batch([A, B, C], pad_id=P, padding_side="right")
    assert mi.input_ids.tolist() == [
        [151644, 872, 198, 9707, 151645, P, P, P, P, P, P, P],
        [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644],
        [198, P, P, P, P, P, P, P, P, P, P, P],
    ]
    assert mi.attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ]
    assert mi.position_ids.tolist() == [
        [0, 1, 2, 3, 4, 1, 1, 1, 1, 1, 1, 1],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    ]
    assert mi.valid_lengths == (5, 12, 1)
    assert mi.padding_side is PaddingSide.RIGHT
    assert mi.pad_id == P
    assert (mi.batch_size, mi.seq_len) == (3, 12)
    assert [mi.row(b) for b in range(3)] == [A, B, C]
    for arr in (mi.input_ids, mi.attention_mask, mi.position_ids):
        assert arr.dtype == np.int64


def test_acceptance_left_padding_5_12_1():
    mi = assemble_batch([A, B, C], pad_id=P, padding_side=PaddingSide.LEFT)
    assert mi.input_ids.tolist() == [
        [P, P, P, P, P, P, P, 151644, 872, 198, 9707, 151645],
        [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644],
        [P, P, P, P, P, P, P, P, P, P, P, 198],
    ]
    assert mi.attention_mask.tolist() == [
        [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    ]
    assert mi.position_ids.tolist() == [
        [1, 1, 1, 1, 1, 1, 1, 0, 1, 2, 3, 4],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0],
    ]
    assert mi.valid_lengths == (5, 12, 1)
    assert mi.padding_side is PaddingSide.LEFT
    assert [mi.row(b) for b in range(3)] == [A, B, C]


def test_small_case_right_by_hand():
    mi = assemble_batch([[5, 6, 7], [8]], pad_id=0)
    assert mi.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert mi.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert mi.position_ids.tolist() == [[0, 1, 2], [0, 1, 1]]
    assert mi.valid_lengths == (3, 1)


def test_small_case_left_by_hand():
    mi = assemble_batch([[5, 6, 7], [8]], pad_id=0, padding_side="left")
    assert mi.input_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mi.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert mi.position_ids.tolist() == [[0, 1, 2], [1, 1, 0]]


def test_pad_to_multiple_of_by_hand():
    right = assemble_batch([[5, 6, 7], [8]], pad_id=9, pad_to_multiple_of=4)
    assert right.input_ids.tolist() == [[5, 6, 7, 9], [8, 9, 9, 9]]
    assert right.attention_mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert right.position_ids.tolist() == [[0, 1, 2, 1], [0, 1, 1, 1]]
    left = assemble_batch([[5, 6, 7], [8]], pad_id=9, padding_side="left", pad_to_multiple_of=4)
    assert left.input_ids.tolist() == [[9, 5, 6, 7], [9, 9, 9, 8]]
    assert left.position_ids.tolist() == [[1, 0, 1, 2], [1, 1, 1, 0]]
    # already a multiple: no rounding
    assert assemble_batch([[1, 2, 3, 4]], pad_id=None, pad_to_multiple_of=4).seq_len == 4
    # 5/12/1 rounded to 16
    assert assemble_batch([A, B, C], pad_id=P, pad_to_multiple_of=8).input_ids.shape == (3, 16)


def test_zero_length_rows_are_all_padding():
    mi = assemble_batch([[], [4, 5]], pad_id=0, padding_side="left")
    assert mi.input_ids.tolist() == [[0, 0], [4, 5]]
    assert mi.attention_mask.tolist() == [[0, 0], [1, 1]]
    assert mi.position_ids.tolist() == [[1, 1], [0, 1]]
    assert mi.valid_lengths == (0, 2)
    assert mi.row(0) == []
    empty = assemble_batch([[], []], pad_id=None)
    assert empty.input_ids.shape == (2, 0)
    assert empty.valid_lengths == (0, 0)
    assert assemble([]).input_ids.shape == (1, 0)


def test_pad_id_may_equal_a_real_token():
    # pad = eos is common; the mask, not the id, says what is padding.
    mi = assemble_batch([[7, 3], [3]], pad_id=3)
    assert mi.input_ids.tolist() == [[7, 3], [3, 3]]
    assert mi.row(0) == [7, 3]
    assert mi.row(1) == [3]


def test_assemble_single():
    mi = assemble([151644, 872, 198])
    assert mi.input_ids.tolist() == [[151644, 872, 198]]
    assert mi.attention_mask.tolist() == [[1, 1, 1]]
    assert mi.position_ids.tolist() == [[0, 1, 2]]
    assert mi.valid_lengths == (3,)
    assert mi.pad_id is None
    assert mi == assemble_batch([[151644, 872, 198]], pad_id=None)
    assert mi.row(0) == mi.row(-1) == [151644, 872, 198]


def test_accepts_numpy_and_tuples():
    mi = assemble_batch([np.array([1, 2, 3], dtype=np.int32), (4,), [np.int64(5), 6]], pad_id=0)
    assert [mi.row(b) for b in range(3)] == [[1, 2, 3], [4], [5, 6]]
    assert all(type(x) is int for x in mi.row(0))
    mi2 = assemble_batch(np.array([[1, 2], [3, 4]], dtype=np.uint16), pad_id=None)
    assert mi2.input_ids.tolist() == [[1, 2], [3, 4]]


def test_input_not_aliased():
    row = np.array([1, 2, 3], dtype=np.int64)
    mi = assemble_batch([row], pad_id=None)
    row[0] = 99
    assert mi.row(0) == [1, 2, 3]
    assert row.flags.writeable


def test_arrays_read_only():
    mi = assemble_batch([A, C], pad_id=P)
    for arr in (mi.input_ids, mi.attention_mask, mi.position_ids):
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[0, 0] = 1
    with pytest.raises(AttributeError):
        mi.pad_id = 1  # type: ignore[misc]


def test_matches_transformers_position_convention():
    for side in ("left", "right"):
        mi = assemble_batch([A, B, C, []], pad_id=P, padding_side=side)
        np.testing.assert_array_equal(mi.position_ids, _torch_reference_positions(mi.attention_mask))


# ---------------------------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------------------------


def test_padding_needed_without_pad_id():
    with pytest.raises(TensorError) as e:
        assemble_batch([A, B, C], pad_id=None)
    assert e.value.path == "pad_id"
    assert "pad_token" in e.value.hint and "pad_id" in e.value.hint
    assert "(5, 12, 1)" in e.value.message
    with pytest.raises(TensorError) as e:
        assemble_batch([[1, 2, 3]], pad_id=None, pad_to_multiple_of=8)
    assert e.value.path == "pad_id"
    assert "pad_to_multiple_of" in e.value.message
    # equal lengths: no padding, so pad_id=None is fine
    assert assemble_batch([[1, 2], [3, 4]], pad_id=None).pad_id is None


def test_empty_batch():
    with pytest.raises(TensorError) as e:
        assemble_batch([], pad_id=0)
    assert e.value.path == "sequences"
    assert e.value.hint


@pytest.mark.parametrize(
    ("sequences", "path"),
    [
        ([[1, 2], [3, -4]], "sequences[1][1]"),
        ([[1, 2.0]], "sequences[0][1]"),
        ([[1.5]], "sequences[0][0]"),
        ([[True, 2]], "sequences[0][0]"),
        ([[1], ["7"]], "sequences[1][0]"),
        ([[1], [None]], "sequences[1][0]"),
        ([[1], [2**63]], "sequences[1][0]"),
        ([[1], "abc"], "sequences[1]"),
        ([[1], 5], "sequences[1]"),
        ([[1], np.array([[1, 2]])], "sequences[1]"),
        ([[1], np.array([1.0, 2.0])], "sequences[1]"),
        ([[1], np.array([1, -2, 3])], "sequences[1][1]"),
        ([[1], np.array([1, 2**63], dtype=np.uint64)], "sequences[1][1]"),
    ],
)
def test_bad_ids(sequences, path):
    with pytest.raises(TensorError) as e:
        assemble_batch(sequences, pad_id=0)
    assert e.value.path == path
    assert e.value.hint


def test_bad_ids_single():
    with pytest.raises(TensorError) as e:
        assemble([1, -1])
    assert e.value.path == "ids[1]"
    with pytest.raises(TensorError) as e:
        assemble("hello")  # type: ignore[arg-type]
    assert e.value.path == "ids"


@pytest.mark.parametrize("side", ["middle", "LEFT", "", None, 1])
def test_bad_padding_side(side):
    with pytest.raises(TensorError) as e:
        assemble_batch([[1]], pad_id=0, padding_side=side)
    assert e.value.path == "padding_side"
    assert "left" in e.value.hint


@pytest.mark.parametrize("pad_id", [-1, 1.0, True, "0", 2**63])
def test_bad_pad_id(pad_id):
    with pytest.raises(TensorError) as e:
        assemble_batch([[1], [2, 3]], pad_id=pad_id)
    assert e.value.path == "pad_id"


@pytest.mark.parametrize("multiple", [0, -8, 2.0, True, "8"])
def test_bad_pad_to_multiple_of(multiple):
    with pytest.raises(TensorError) as e:
        assemble_batch([[1]], pad_id=0, pad_to_multiple_of=multiple)
    assert e.value.path == "pad_to_multiple_of"


def test_row_out_of_range():
    mi = assemble_batch([[1], [2]], pad_id=0)
    for bad in (2, -3, 1.0):
        with pytest.raises(TensorError) as e:
            mi.row(bad)  # type: ignore[arg-type]
        assert e.value.path.startswith("row(")


def test_error_is_ctxlock_error():
    from ctxlock.errors import CtxlockError

    with pytest.raises(CtxlockError):
        assemble_batch([], pad_id=0)


# ---------------------------------------------------------------------------------------------------------------
# ModelInput construction is validated (e.g. when read back from a record)
# ---------------------------------------------------------------------------------------------------------------


def _good() -> dict:
    return assemble_batch([[5, 6, 7], [8]], pad_id=0, padding_side="left").to_dict()


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.update(valid_lengths=[3, 2]), "attention_mask[1]"),
        (lambda d: d.update(valid_lengths=[3]), "valid_lengths"),
        (lambda d: d.update(valid_lengths=[3, -1]), "valid_lengths[1]"),
        (lambda d: d.update(padding_side="right"), "attention_mask[1]"),
        (lambda d: d.update(padding_side="up"), "padding_side"),
        (lambda d: d["position_ids"].__setitem__(1, [0, 0, 0]), "position_ids[1]"),
        (lambda d: d["input_ids"].__setitem__(1, [0, 5, 8]), "input_ids[1]"),
        (lambda d: d.update(pad_id=None), "pad_id"),
        (lambda d: d["attention_mask"].__setitem__(0, [1, 1, 2]), "attention_mask[0]"),
        (lambda d: d.update(input_ids=[[5, 6, 7], [0, 8]]), "input_ids"),
        (lambda d: d.update(input_ids=[[5.0, 6, 7], [0, 0, 8]]), "input_ids"),
        (lambda d: d.update(attention_mask=[[1, 1], [0, 1]]), "attention_mask"),
        (lambda d: d.update(input_ids=[], attention_mask=[], position_ids=[]), "input_ids"),
        (lambda d: d.pop("pad_id"), "pad_id"),
    ],
)
def test_from_dict_validates(mutate, path):
    d = _good()
    assert ModelInput.from_dict(d) == assemble_batch([[5, 6, 7], [8]], pad_id=0, padding_side="left")
    mutate(d)
    with pytest.raises(TensorError) as e:
        ModelInput.from_dict(d)
    assert e.value.path == path


def test_direct_construction_copies_writable_arrays():
    ids = np.array([[1, 2]], dtype=np.int64)
    mi = ModelInput(
        input_ids=ids,
        attention_mask=np.ones((1, 2), dtype=np.int64),
        position_ids=np.array([[0, 1]]),
        valid_lengths=(2,),
        padding_side="right",  # type: ignore[arg-type]
        pad_id=None,
    )
    ids[0, 0] = 42
    assert mi.row(0) == [1, 2]
    assert mi.padding_side is PaddingSide.RIGHT
    assert not mi.input_ids.flags.writeable
    assert ids.flags.writeable


# ---------------------------------------------------------------------------------------------------------------
# equality, hashing, serialization
# ---------------------------------------------------------------------------------------------------------------


def test_equality_and_hash():
    a = assemble_batch([A, C], pad_id=P, padding_side="left")
    b = assemble_batch([list(A), list(C)], pad_id=P, padding_side=PaddingSide.LEFT)
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != assemble_batch([A, C], pad_id=P, padding_side="right")
    assert a != assemble_batch([A, C], pad_id=0, padding_side="left")
    assert a != assemble_batch([A, [199]], pad_id=P, padding_side="left")
    # same arrays, different recorded pad_id / side when there is no padding
    assert assemble_batch([[1, 2]], pad_id=None) != assemble_batch([[1, 2]], pad_id=0)
    assert assemble_batch([[1, 2]], pad_id=None) != assemble_batch([[1, 2]], pad_id=None, padding_side="left")
    assert a != "not a model input"
    assert (a == object()) is False


def test_to_dict_is_json_ready():
    mi = assemble_batch([A, B, C], pad_id=P, padding_side="left")
    d = mi.to_dict()
    assert set(d) == {"input_ids", "attention_mask", "position_ids", "valid_lengths", "padding_side", "pad_id"}
    assert d["padding_side"] == "left" and type(d["padding_side"]) is str
    assert d["pad_id"] == P
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert all(type(x) is int for row in d[key] for x in row)
    assert all(type(x) is int for x in d["valid_lengths"])
    text = json.dumps(d)
    assert "." not in text.replace('"left"', "")  # no floats anywhere
    assert ModelInput.from_dict(json.loads(text)) == mi


def test_repr_is_short():
    r = repr(assemble_batch([A, B, C], pad_id=P))
    assert "batch_size=3" in r and "seq_len=12" in r


# ---------------------------------------------------------------------------------------------------------------
# torch
# ---------------------------------------------------------------------------------------------------------------


def test_to_torch():
    import torch

    mi = assemble_batch([A, B, C], pad_id=P, padding_side="left")
    t = mi.to_torch()
    assert set(t) == {"input_ids", "attention_mask", "position_ids"}
    for key, tensor in t.items():
        assert tensor.dtype == torch.int64
        assert tensor.shape == (3, 12)
        assert tensor.tolist() == getattr(mi, key).tolist()
    t["input_ids"][0, 0] = 1  # a fresh copy: writing to it does not touch the ModelInput
    assert mi.input_ids[0, 0] == P


def test_to_torch_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(TensorError) as e:
        assemble([1, 2]).to_torch()
    assert e.value.hint == "pip install 'ctxlock[torch]'"


def test_import_does_not_import_torch():
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    code = (
        "import ctxlock.tensors._assemble, sys; "
        "mi = ctxlock.tensors._assemble.assemble_batch([[1, 2], [3]], pad_id=0); mi.to_dict(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------------------------

ids_st = st.lists(st.integers(min_value=0, max_value=150_000), min_size=0, max_size=40)
batch_st = st.lists(ids_st, min_size=1, max_size=8)
side_st = st.sampled_from([PaddingSide.LEFT, PaddingSide.RIGHT, "left", "right"])
multiple_st = st.one_of(st.none(), st.integers(min_value=1, max_value=64))
pad_st = st.integers(min_value=0, max_value=151_000)


@settings(max_examples=examples(300), deadline=None)
@given(batch_st, side_st, multiple_st, pad_st)
def test_properties(seqs, side, multiple, pad_id):
    mi = assemble_batch(seqs, pad_id=pad_id, padding_side=side, pad_to_multiple_of=multiple)
    bsz = len(seqs)
    longest = max(len(s) for s in seqs)
    n = longest if multiple is None else -(-longest // multiple) * multiple
    assert mi.input_ids.shape == mi.attention_mask.shape == mi.position_ids.shape == (bsz, n)
    assert (mi.batch_size, mi.seq_len) == (bsz, n)
    assert mi.padding_side == PaddingSide(side)
    assert mi.valid_lengths == tuple(len(s) for s in seqs)
    for arr in (mi.input_ids, mi.attention_mask, mi.position_ids):
        assert arr.dtype == np.int64
        assert not arr.flags.writeable
    for b, seq in enumerate(seqs):
        length = len(seq)
        mask = mi.attention_mask[b]
        assert int(mask.sum()) == length == mi.valid_lengths[b]
        assert mi.row(b) == seq
        real = np.flatnonzero(mask == 1)
        pads = np.flatnonzero(mask == 0)
        assert mi.input_ids[b, real].tolist() == seq
        assert mi.position_ids[b, real].tolist() == list(range(length))
        assert (mi.position_ids[b, pads] == 1).all()
        assert (mi.input_ids[b, pads] == pad_id).all()
        if length:
            if mi.padding_side is PaddingSide.LEFT:
                assert real[-1] == n - 1  # last real token in the last column
                assert real.tolist() == list(range(n - length, n))
            else:
                assert real[0] == 0
                assert real.tolist() == list(range(length))
    np.testing.assert_array_equal(mi.position_ids, _torch_reference_positions(mi.attention_mask))
    # assemble skips the constructor's checks (its values hold by construction): they must pass all the same.
    checked = ModelInput(
        input_ids=mi.input_ids,
        attention_mask=mi.attention_mask,
        position_ids=mi.position_ids,
        valid_lengths=mi.valid_lengths,
        padding_side=mi.padding_side,
        pad_id=mi.pad_id,
    )
    assert checked == mi
    d = mi.to_dict()
    back = ModelInput.from_dict(json.loads(json.dumps(d)))
    assert back == mi and hash(back) == hash(mi)
    assert back.to_dict() == d
    again = assemble_batch([list(s) for s in seqs], pad_id=pad_id, padding_side=side, pad_to_multiple_of=multiple)
    assert again == mi


@settings(max_examples=examples(100), deadline=None)
@given(batch_st, multiple_st, pad_st)
def test_property_sides_agree_on_rows(seqs, multiple, pad_id):
    left = assemble_batch(seqs, pad_id=pad_id, padding_side="left", pad_to_multiple_of=multiple)
    right = assemble_batch(seqs, pad_id=pad_id, padding_side="right", pad_to_multiple_of=multiple)
    assert [left.row(b) for b in range(len(seqs))] == [right.row(b) for b in range(len(seqs))]
    assert left.valid_lengths == right.valid_lengths
    # left padding is right padding with each row rotated so the real tokens end in the last column
    for b, length in enumerate(left.valid_lengths):
        np.testing.assert_array_equal(np.roll(right.input_ids[b], left.seq_len - length), left.input_ids[b])
    if any(length != left.seq_len for length in left.valid_lengths):
        assert left != right


@settings(max_examples=examples(100), deadline=None)
@given(ids_st)
def test_property_single(ids):
    mi = assemble(ids)
    assert mi.input_ids.shape == (1, len(ids))
    assert mi.row(0) == ids
    assert mi.position_ids.tolist() == [list(range(len(ids)))]
    assert mi.attention_mask.tolist() == [[1] * len(ids)]
    assert mi == assemble_batch([ids], pad_id=None)
    from ctxlock.tensors._assemble import assemble_own

    assert assemble_own(tuple(ids)) == mi  # the pipeline's own path, without per-id checks
