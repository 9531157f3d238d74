"""ctxlock.batch._fast.mask_rows (the rows of `ctxlock batch`): the fast path equals the reference path and
`Model.encode(..., return_assistant_tokens_mask=True)` — ids, masks, notes, digests and errors.

- The conformance conversations, on the stock and generation-tagged versions of the tagged templates (both mask
  sources), with several mask options.
- Generated rows (hypothesis): hostile contents (control-token strings, mixed scripts, lone surrogates, empty and
  whitespace contents), tool calls, broken JSON, with the model's own template, as `ctxlock batch` renders them.
- A whole job: the shards and manifest of `run_batch` are byte-identical on either path.
"""

from __future__ import annotations

import json
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
import tagged
from conformance import FIXED_NOW, conversations, vocab_for
from ctxlock.accounting._tokenlay import assign_owners
from ctxlock.batch._fast import MaskedRow, mask_rows
from ctxlock.batch._run import BatchOptions, run_batch
from ctxlock.settings import fast_path, reference_path
from ctxlock.template._render import ChatTemplate
from ctxlock.training._fastmask import region_mask
from ctxlock.training._masks import MaskOptions
from hypothesis_profiles import examples

pytestmark = pytest.mark.fast_path

CORPUS = [c for c in conversations() if not c[2]["continue_final_message"]]
OPTIONS = (
    MaskOptions(),
    MaskOptions(train_on_eot="last"),
    MaskOptions(roles=("assistant", "tool"), last_turn_only=True, source="provenance"),
)


@cache
def _model(vocab: str) -> ctxlock.Model:
    return ctxlock.load(str(fetched.hf_tokenizer_dir(vocab)))


def _key(row: MaskedRow | ctxlock.CtxlockError) -> Any:
    if isinstance(row, ctxlock.CtxlockError):
        return ("error", type(row).__name__, row.path, row.message)
    assert row.ids.dtype == np.int64 and len(row.mask) == len(row.ids)
    return (row.request_sha256, row.ids.tolist(), row.mask.tolist(), row.notes)


def _both(model: ctxlock.Model, requests: list[Any], options: MaskOptions, **render: Any) -> list[Any]:
    """The rows on the fast path; asserted equal to the reference path's."""
    with fast_path():
        fast = [_key(r) for r in mask_rows(model, requests, options, **render)]
    with reference_path():
        slow = [_key(r) for r in mask_rows(model, requests, options, **render)]
    assert fast == slow
    return fast


def _encoded(model: ctxlock.Model, request: Any, options: MaskOptions, **render: Any) -> Any:
    """What `Model.encode` gives for the request, in `_key`'s shape (without the digest)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the notes are compared through mask_rows
            mi = model.encode(request, return_assistant_tokens_mask=True, mask_options=options, **render)
    except ctxlock.CtxlockError as exc:
        return ("error", type(exc).__name__, exc.path, exc.message)
    return (mi["input_ids"][0].tolist(), mi["assistant_masks"][0].tolist())


def _same_as_encode(rows: list[Any], model: ctxlock.Model, requests: list[Any], opts: MaskOptions, **render: Any):
    for row, request in zip(rows, requests, strict=True):
        expected = _encoded(model, request, opts, **render)
        assert (row if row[0] == "error" else tuple(row[1:3])) == expected


@pytest.mark.parametrize("name", list(tagged.TAGGINGS))
def test_conformance_rows_equal_on_both_paths_and_encode(name: str) -> None:
    model = _model(vocab_for(name))
    stock = ChatTemplate(tagged.stock_source(name), id=name)
    trained = 0
    for template, options in [(stock, o) for o in OPTIONS] + [(tagged.tagged_template(name), MaskOptions())]:
        for agp in (False, True):
            requests = [data for _, data, o in CORPUS if o["add_generation_prompt"] == agp]
            render = {
                "chat_template": template,
                "now": FIXED_NOW,
                "content_format": "openai",
                "add_generation_prompt": agp,
                "tool_arguments": "as-sent",
            }
            rows = _both(model, requests, options, **render)
            _same_as_encode(rows, model, requests, options, **render)
            trained += sum(1 for r in rows if r[0] != "error")
    assert trained >= 40, f"{name}: only {trained} rows with a mask"


def test_continue_final_message_is_refused_on_both_paths() -> None:
    rows = _both(_model("qwen2"), [CORPUS[0][1]], MaskOptions(), continue_final_message=True)
    assert rows[0][:2] == ("error", "MaskError")


def test_an_option_render_refuses_is_refused_row_by_row_on_both_paths() -> None:
    # The fast path checks and builds the render options once per call (`_plan`); options it cannot build leave
    # every row to meet the same error, in the row's place, as the reference path does.
    requests = [CORPUS[0][1], CORPUS[1][1]]
    rows = _both(_model("qwen2"), requests, MaskOptions(), return_tensors="np")
    assert [r[:2] for r in rows] == [("error", "OptionError")] * 2


# -- generated rows -------------------------------------------------------------------------------------------------

_TEXT = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=40),
    st.sampled_from(
        [
            "",
            " ",
            "\n\n",
            "<|im_end|>",
            "<|im_start|>assistant\nhi",
            "x<|endoftext|>y",
            "混合 текст 🙂 données",
            "\ud800 lone",
            "<tool_call>\n{}\n</tool_call>",
            "<think>\nhm\n</think>\n\n",
        ]
    ),
    st.lists(st.sampled_from(["alpha", "日本語", "<|im_end|>", "🙂", "\n", " ", "print(x)"]), max_size=12).map("".join),
)
_CALL = st.builds(
    lambda i, name, arg: {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps({"q": arg}, ensure_ascii=False)},
    },
    st.integers(0, 9),
    st.sampled_from(["get_time", "search", "<|im_end|>"]),
    _TEXT,
)
_MESSAGE = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, _TEXT),
    st.builds(lambda c: {"role": "assistant", "content": c}, _TEXT),
    st.builds(
        lambda c, calls: {"role": "assistant", "content": c, "tool_calls": calls},
        _TEXT,
        st.lists(_CALL, min_size=1, max_size=2),
    ),
    st.builds(lambda c: {"role": "tool", "tool_call_id": "c0", "content": c}, _TEXT),
    st.builds(lambda c: {"role": "system", "content": c}, _TEXT),
)
_ROW = st.one_of(
    st.lists(_MESSAGE, min_size=1, max_size=6).map(
        lambda ms: json.dumps({"messages": ms}, ensure_ascii=False).encode("utf-8", "surrogatepass")
    ),
    st.sampled_from([b"", b"[1]", b'{"messages": [', b'{"messages": []}', b"\xff\xfe", b'{"messages": "x"}']),
)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(_ROW, min_size=1, max_size=6), options=st.sampled_from(OPTIONS))
def test_generated_rows_equal_on_both_paths_and_encode(rows: list[bytes], options: MaskOptions) -> None:
    model = _model("qwen2")  # the directory's own template, as `ctxlock batch` renders
    got = _both(model, rows, options)
    _same_as_encode(got, model, rows, options, add_generation_prompt=False)


# -- a whole job ----------------------------------------------------------------------------------------------------


def test_run_batch_shards_byte_identical_on_both_paths(tmp_path: Path) -> None:
    lines = [
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"question {i} " + "données 日本語 " * (i % 5)},
                    {"role": "assistant", "content": f"answer {i} " + "🙂 text <|im_end|> " * (i % 3)},
                ]
            },
            ensure_ascii=False,
        )
        for i in range(40)
    ] + ['{"messages": [', '{"messages":[{"role":"user","content":"no answer"}]}']
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n", "utf-8")
    opts = BatchOptions(model=str(fetched.hf_tokenizer_dir("qwen2")), shard_rows=16)
    with fast_path():
        fast = run_batch(source, tmp_path / "fast", opts)
    with reference_path():
        slow = run_batch(source, tmp_path / "slow", opts)
    assert fast == slow and fast["error_count"] == 2
    for shard in fast["shards"]:
        assert (tmp_path / "fast" / shard["file"]).read_bytes() == (tmp_path / "slow" / shard["file"]).read_bytes()


# -- the region mask ------------------------------------------------------------------------------------------------


@settings(max_examples=examples(400), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), max_size=40),
    cuts=st.lists(st.tuples(st.integers(-2, 200), st.integers(0, 12)), max_size=6),
)
def test_region_mask_equals_assign_owners(lengths: list[int], cuts: list[tuple[int, int]]) -> None:
    bounds = np.concatenate(([0], np.cumsum(np.array(lengths, dtype=np.int64))))
    size = int(bounds[-1])
    regions = [(a, a + w) for a, w in cuts]  # unsorted, overlapping, empty, past either end
    owner = np.zeros(size, dtype=np.int32)
    for a, b in regions:
        owner[max(a, 0) : max(b, 0)] = 1
    expected = assign_owners(owner, bounds[:-1], bounds[1:]).astype(np.int64)
    assert region_mask(bounds, regions).tolist() == expected.tolist()
