"""The shard speed-ups of `ctxlock batch` (issue 21, acceptance 3) give what the plain code gives.

- `_fast_batch.mask_rows` runs a chunk of rows stage by stage (`_planned_rows`: every parse, every render, the
  encodes, then each lay, mask and digest) instead of row by row, and encodes the chunk's texts in one native call:
  its rows (ids, masks, notes, digests, errors) equal the reference path's (`CTXLOCK_FAST=0`) and the plain
  row-by-row fast path's (`_planned_row`), over several chunks, with error rows at every stage (bad JSON, no trained
  turn, lone surrogates) and texts NFC would change (which go to the run-by-run fallback).
- `Accelerator.encode_many` (one `encode_batch_flat` call) equals `encode` of each text; a call that raises is
  made again text by text, with the failures counted per text as `encode` counts them.
- `WholeText.encode_many` equals `encode_prepared` of each text, with fastokens and with tiktoken.
- `batch.shard_bytes` builds the shard's columns once (labels by one `np.where` over the shard): the Parquet bytes
  and record equal those of the per-row build (kept here as it was), with and without `pack` and `max_length`.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from batch_tables import reference_table
from ctxlock.accounting import _tokenlay as tokenlay
from ctxlock.batch import _fast as _fast_batch
from ctxlock.batch import _run as batch
from ctxlock.batch import _tables as tables
from ctxlock.settings import call_fast, fast_path, reference_path
from ctxlock.training import _fastmask
from ctxlock.training import _masks as masks
from ctxlock.training._masks import MaskOptions
from hypothesis_profiles import examples
from vocabularies import native_engine

pytestmark = pytest.mark.fast_path


@cache
def _qwen() -> ctxlock.Model:
    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    accelerator = model.tokenizer.whole_text.accelerator
    assert accelerator is not None and accelerator.wait(), "fastokens must be admitted: the batched call is its"
    return model


def _key(row: Any) -> Any:
    if isinstance(row, ctxlock.CtxlockError):
        return ("error", type(row).__name__, row.path, row.message, row.hint)
    assert row.ids.dtype == np.int64 and row.mask.dtype == np.int64 and not row.ids.flags.writeable
    return (row.request_sha256, row.ids.tolist(), row.mask.tolist(), row.notes)


WORDS = ["alpha", "données", "日本語", "текст", "🙂", "print(x)", "42", "\n", " ", "한국어", "<|im_end|>", "<think>"]
_CONTENT = st.one_of(
    st.lists(st.sampled_from(WORDS), max_size=30).map(" ".join),
    st.text(max_size=20),  # lone surrogates, NFC-changing marks (e + U+0301), control characters
    st.sampled_from(["", "e\u0301", "\u1100\u1161", "x<|endoftext|>y", "\ud800"]),
)
_ROW = st.one_of(
    st.lists(st.tuples(st.sampled_from(["user", "assistant", "system", "tool"]), _CONTENT), min_size=1, max_size=5).map(
        lambda ms: json.dumps({"messages": [{"role": r, "content": c} for r, c in ms]}, ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )
    ),
    st.sampled_from([b"", b'{"messages": [', b'{"messages": []}', b"\xff", b'{"messages":[{"role":"user"}]}']),
)
_OPTIONS = st.sampled_from([MaskOptions(), MaskOptions(train_on_eot="last"), MaskOptions(last_turn_only=True)])


@settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(rows=st.lists(_ROW, min_size=1, max_size=40), options=_OPTIONS, chunk=st.sampled_from([1, 3, 7, 64]))
def test_chunked_rows_equal_the_reference_and_the_row_by_row_path(
    rows: list[bytes], options: MaskOptions, chunk: int
) -> None:
    model = _qwen()
    with fast_path(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(_fast_batch, "_CHUNK", chunk)  # chunk edges among the generated rows
        chunked = [_key(r) for r in _fast_batch.mask_rows(model, rows, options)]
        plan = _fast_batch._plan(dict(_fast_batch._RENDER))
        assert plan is not None
        one_by_one = []
        for raw in rows:
            try:
                one_by_one.append(_key(call_fast(_fast_batch._planned_row, model, raw, options, plan)))
            except ctxlock.CtxlockError as exc:
                one_by_one.append(_key(exc))
    with reference_path():
        reference = [_key(r) for r in _fast_batch.mask_rows(model, rows, options)]
    assert chunked == one_by_one == reference


def test_a_chunk_mixes_error_rows_at_every_stage_with_good_ones() -> None:
    # 200 rows (four chunks): parse errors (bad JSON, a lone surrogate), mask errors (no assistant), NFC-changing
    # text (`encode_many` leaves it to the run-by-run fallback) and plain rows, interleaved.
    good = {"messages": [{"role": "user", "content": "hi 日本語"}, {"role": "assistant", "content": "ok 🙂"}]}
    kinds = [
        json.dumps(good, ensure_ascii=False).encode(),
        b'{"messages": [',
        json.dumps({"messages": [{"role": "user", "content": "no answer"}]}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "\ud800"}]}).encode(
            "utf-8", "surrogatepass"
        ),
        json.dumps({"messages": [{"role": "user", "content": "e\u0301"}, {"role": "assistant", "content": "e\u0301"}]}),
    ]
    rows = [kinds[(i * 7) % len(kinds)] for i in range(200)]
    model = _qwen()
    with fast_path():
        fast = [_key(r) for r in _fast_batch.mask_rows(model, rows, MaskOptions())]
    with reference_path():
        slow = [_key(r) for r in _fast_batch.mask_rows(model, rows, MaskOptions())]
    assert fast == slow
    errors = Counter(r[1] for r in fast if r[0] == "error")
    assert errors == Counter({"RequestJSONError": 40, "RequestEncodingError": 40, "MaskError": 40})
    assert len({r[0] for r in fast if r[0] != "error"}) == 2  # the plain and the NFC rows, 40 each


def test_an_iterator_of_requests_is_read_chunk_by_chunk() -> None:
    model = _qwen()
    good = json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    seen: list[int] = []

    def requests() -> Any:
        for i in range(3 * _fast_batch._CHUNK):
            seen.append(i)
            yield good

    with fast_path():
        rows = _fast_batch.mask_rows(model, requests(), MaskOptions())
        first = next(rows)
        assert len(seen) == _fast_batch._CHUNK  # one chunk read, not the whole input
        rest = list(rows)
    assert len(rest) == 3 * _fast_batch._CHUNK - 1 and all(_key(r) == _key(first) for r in rest)


# -- the batched native calls ---------------------------------------------------------------------------------------

_TEXTS = st.lists(
    st.one_of(st.text(st.characters(codec="utf-8"), max_size=60), _CONTENT.filter(lambda t: "\ud800" not in t)),
    max_size=12,
)


@settings(max_examples=examples(150), deadline=None)
@given(texts=_TEXTS)
def test_accelerator_encode_many_equals_encode_each(texts: list[str]) -> None:
    accelerator = _qwen().tokenizer.whole_text.accelerator
    many = accelerator.encode_many(texts)
    assert len(many) == len(texts)
    for text, ids in zip(texts, many, strict=True):
        alone = accelerator.encode(text)
        assert ids is not None and alone is not None
        assert ids.dtype == alone.dtype and ids.tolist() == alone.tolist()


def test_a_batch_call_that_raises_is_made_text_by_text() -> None:
    # A value fastokens refuses (not a string) makes the one call raise: every text is then encoded on its own, the
    # refused one counted as a failure (and None: tiktoken's), the others with their own ids.
    accelerator = _qwen().tokenizer.whole_text.accelerator
    before = accelerator.failures
    many = accelerator.encode_many(["hello 日本語", 42, "<|im_end|>x"])  # type: ignore[list-item]
    assert many[1] is None and accelerator.failures == before + 1
    assert many[0].tolist() == accelerator.encode("hello 日本語").tolist()
    assert many[2].tolist() == accelerator.encode("<|im_end|>x").tolist()


@settings(max_examples=examples(100), deadline=None)
@given(texts=_TEXTS, engine=st.sampled_from(["fastokens", "tiktoken"]))
def test_whole_text_encode_many_equals_encode_prepared(texts: list[str], engine: str) -> None:
    whole = _qwen().tokenizer.whole_text
    datas = [t.encode("utf-8") for t in texts]
    with native_engine(whole, engine):
        many = whole.encode_many(texts, datas)
        each = [whole.encode_prepared(t, d, None, 0, 0, cache=False) for t, d in zip(texts, datas, strict=True)]
    assert [None if a is None else a.tolist() for a in many] == [None if a is None else a.tolist() for a in each]
    assert all(a is None or (a.dtype == np.int64 and not a.flags.writeable) for a in many)


# -- the shard's columns, built once ----------------------------------------------------------------------------------


def _plain_table(kept: list[tuple[Any, ...]], pack: int | None) -> pa.Table:
    """The shard's table as the per-row code built it: each row's int32 ids and labels (`np.where` on its own mask),
    then the columns from Python values (`batch_tables.reference_table`)."""
    rows = [(r, sha, np.asarray(ids, dtype=np.int32), m) for r, sha, ids, m, _ in kept]
    rows = [(r, sha, ids, np.where(np.asarray(m) == 1, ids, -100).astype(np.int32)) for r, sha, ids, m in rows]
    return reference_table(rows, pack)


_KEPT = st.lists(
    st.tuples(
        st.integers(0, 2**40),
        st.text(max_size=70),
        st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(0, 1)), min_size=1, max_size=40),
    ),
    max_size=30,
)


@settings(max_examples=examples(150), deadline=None)
@given(rows=_KEPT, pack=st.one_of(st.none(), st.integers(1, 120)))
def test_shard_columns_equal_the_per_row_build_and_write_the_same_bytes(rows: list[Any], pack: int | None) -> None:
    kept = [
        (r, sha, np.array([i for i, _ in pairs], np.int64), np.array([m for _, m in pairs], np.int64), None)
        for r, sha, pairs in rows
    ]
    if pack is not None:
        kept = [k for k in kept if len(k[2]) <= pack]
    columns = tables.Columns.of_masks(kept)
    ours = columns.table() if pack is None else columns.packed_table(pack)
    plain = _plain_table(kept, pack)
    assert ours.schema.equals(plain.schema, check_metadata=True) and ours.equals(plain)
    assert tables.parquet_bytes(ours) == tables.parquet_bytes(plain)
    # the record's counts, as the per-row code summed them
    assert len(columns.ids) == sum(len(k[2]) for k in kept)
    per_row = [np.where(k[3] == 1, np.asarray(k[2], np.int32), -100).astype(np.int32) for k in kept]
    assert int(np.count_nonzero(columns.labels != -100)) == sum(int((labels != -100).sum()) for labels in per_row)


@pytest.mark.parametrize("extra", [{}, {"pack": 900}, {"max_length": 60}, {"max_length": 80, "pack": 200}])
def test_shard_bytes_equal_on_both_paths_over_several_chunks(extra: dict[str, Any]) -> None:
    # 150 rows (three chunks) with error rows, over-long rows (fitted, or over --pack): the same bytes and record on
    # the reference path (its rows one by one); the columns themselves are checked against the per-row build above.
    good = [
        {
            "messages": [
                {"role": "user", "content": f"q{i} " + "données 日本語 " * (i % 9)},
                {"role": "assistant", "content": f"a{i} " + "🙂 text " * (i % 13)},
                {"role": "user", "content": "more"},
                {"role": "assistant", "content": "yes " * (i % 5)},
            ]
        }
        for i in range(150)
    ]
    raws = [
        b'{"messages": [' if i % 17 == 0 else json.dumps(g, ensure_ascii=False).encode() for i, g in enumerate(good)
    ]
    opts = batch.BatchOptions(model=str(fetched.hf_tokenizer_dir("qwen2")), shard_rows=150, **extra)
    _qwen()
    with fast_path():
        fast = batch.shard_bytes(3, list(enumerate(raws)), opts)
    with reference_path():
        slow = batch.shard_bytes(3, list(enumerate(raws)), opts)
    assert fast == slow
    table = pq.read_table(pa.BufferReader(fast[0]))
    assert fast[1]["row_count"] == len(table) if "pack" not in extra else fast[1]["sequence_count"] == len(table)
    assert fast[1]["error_count"] >= 9 and fast[1]["trained_tokens"] > 0


@settings(max_examples=examples(300), deadline=None)
@given(
    texts=st.lists(
        st.one_of(st.text(max_size=12), st.sampled_from(["e\u0301", "\u0301", "한", "\u1100", "A"])), max_size=5
    )
)
def test_inert_of_texts_joined_means_inert_of_each(texts: list[str]) -> None:
    # `WholeText.encode_many` tests a chunk's texts joined, once, and takes them all as inert when it passes.
    inert = _qwen().tokenizer.whole_text._inert
    assert inert is not None  # Qwen2 normalizes (NFC): the test applies
    if inert("".join(texts)):
        assert all(inert(t) for t in texts)
    assert inert("".join(texts)) == all(inert(t) for t in texts)


# -- the chunk's lays and offsets, made at once ------------------------------------------------------------------------


@settings(max_examples=examples(300), deadline=None)
@given(texts=st.lists(st.text(st.characters(codec="utf-8"), max_size=30), max_size=8))
def test_offsets_many_equal_offsets_of_each(texts: list[str]) -> None:
    datas = [t.encode("utf-8") for t in texts]
    many = _fast_batch._offsets_many(texts, datas)
    each = [_fast_batch._offsets(t, d) for t, d in zip(texts, datas, strict=True)]
    assert [a.dtype for a in many] == [np.dtype(np.int64)] * len(texts)
    assert [a.tolist() for a in many] == [a.tolist() for a in each]


_PLAIN = _CONTENT.filter(lambda t: not any("\ud800" <= c <= "\udfff" for c in t))
_SPOIL = st.sampled_from(["none", "swap", "drop", "huge", "negative", "control"])


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(st.tuples(_PLAIN, _PLAIN), min_size=1, max_size=6),
    spoil=_SPOIL,
    at=st.integers(0, 5),
)
def test_whole_lays_equal_whole_lay_of_each(turns: list[tuple[str, str]], spoil: str, at: int) -> None:
    # Each row a conversation the whole-text encoder takes; then one row's ids spoiled (another row's ids, one id
    # dropped, an id past the vocabulary, a negative id, a control id put in): the joined lay must give what each
    # row's own lay gives, None for the spoiled one.
    model = _qwen()
    tok = model.tokenizer
    rendered = []
    for user, assistant in turns:
        r = model.render({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]})
        if _fast_batch.whole_text_encoder(r, tok) is not None:
            rendered.append(r)
    datas = [r.text.encode("utf-8") for r in rendered]
    with fast_path():
        ids = [np.array(x) for x in tok.whole_text.encode_many([r.text for r in rendered], datas)]
        if rendered:
            k = at % len(rendered)
            if spoil == "swap" and len(rendered) > 1:
                ids[k] = ids[(k + 1) % len(rendered)]
            elif spoil == "drop" and len(ids[k]):
                ids[k] = ids[k][1:]
            elif spoil == "huge":
                ids[k] = np.append(ids[k], 10**9)
            elif spoil == "negative":
                ids[k] = np.append(ids[k], -1)
            elif spoil == "control":
                ids[k] = np.append(ids[k], next(t.id for t in tok.added_tokens if t.content == "<|im_end|>"))
        joined = tokenlay.whole_lays(tok, rendered, ids, datas)
        each = [tokenlay.whole_lay(tok, r, i, d) for r, i, d in zip(rendered, ids, datas, strict=True)]
    if rendered and spoil in ("drop", "huge", "negative", "control"):
        assert each[at % len(rendered)] is None
    if spoil == "none":  # every NFC-inert text laid (one NFC changes has ids whose bytes are not its bytes)
        assert all(a is not None for a, r in zip(each, rendered, strict=True) if tok.whole_text._inert(r.text))
    assert [None if a is None else (a.dtype, a.tolist()) for a in joined] == [
        None if a is None else (a.dtype, a.tolist()) for a in each
    ]


# -- the chunk's provenance masks, made at once ------------------------------------------------------------------------

_BOUNDS_ROW = st.one_of(
    st.lists(st.integers(0, 6), max_size=25).map(lambda ls: np.concatenate(([0], np.cumsum(ls))).astype(np.int64)),
    st.sampled_from([[0], [0, 0], [0, 0, 0], [0, 0, 3, 3], [3, 5], [0, 4, 2, 6]]).map(np.array),  # hostile shapes
)
_REGIONS = st.lists(st.tuples(st.integers(-3, 160), st.integers(-2, 12)).map(lambda t: (t[0], t[0] + t[1])), max_size=5)


@settings(max_examples=examples(500), deadline=None)
@given(rows=st.lists(st.tuples(_BOUNDS_ROW, _REGIONS), max_size=7))
def test_region_masks_equal_region_mask_of_each(rows: list[tuple[np.ndarray, list[tuple[int, int]]]]) -> None:
    # Empty tokens at a row's edges, rows with no bytes or no token, regions out of range, overlapping or empty,
    # rows that do not start at 0 or go down: each row's mask is `region_mask`'s (itself checked against
    # `assign_owners` in tests/batch/test_row_speedups.py).
    bounds = [b for b, _ in rows]
    regions = [r for _, r in rows]
    joined = _fastmask.region_masks(bounds, regions)
    each = [_fastmask.region_mask(b, r) for b, r in rows]
    assert [(a.dtype, a.tolist()) for a in joined] == [(a.dtype, a.tolist()) for a in each]


def test_masks_of_equals_mask_of_of_each_with_errors_in_place() -> None:
    model = _qwen()
    requests = [
        {"messages": [{"role": "user", "content": "q 日本語"}, {"role": "assistant", "content": "a 🙂"}]},
        {"messages": [{"role": "user", "content": "no answer"}]},  # a MaskError
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]},  # nothing written
        {"messages": [{"role": "user", "content": "e\u0301"}, {"role": "assistant", "content": "e\u0301 ok"}]},
    ] * 5
    with fast_path():
        lays = [_fast_batch._lay(model.tokenizer, model.parse(r), model.render(r)) for r in requests]
        for options in (MaskOptions(), MaskOptions(train_on_eot="none"), MaskOptions(last_turn_only=True)):
            joined = masks.masks_of(model, lays, options, add_generation_prompt=False)
            each = []
            for lay in lays:
                try:
                    each.append(masks.mask_of(model, lay, options, add_generation_prompt=False))
                except ctxlock.CtxlockError as exc:
                    each.append(exc)
            assert [_mask_key(m) for m in joined] == [_mask_key(m) for m in each]
            assert sum(isinstance(m, ctxlock.CtxlockError) for m in joined) >= 5


def _mask_key(m: Any) -> Any:
    if isinstance(m, ctxlock.CtxlockError):
        return ("error", type(m).__name__, m.path, m.message)
    assert not m.mask.flags.writeable
    return (m.mask.tolist(), m.source, m.regions, m.exact_bytes, m.notes)
