"""The public Python API: small, and exactly these names."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock
from hypothesis_profiles import examples

PUBLIC = {
    "BudgetPolicy",
    "ChatTemplate",
    "CtxlockError",
    "IncrementalDecoder",
    "InjectionPolicy",
    "JsonSchemaMask",
    "MaskOptions",
    "Model",
    "ModelInput",
    "Pipeline",
    "PriceTable",
    "RenderOptions",
    "Rendered",
    "Request",
    "Run",
    "Sampler",
    "StageOptions",
    "StopMatcher",
    "Store",
    "Tokenized",
    "ToolCallAssembler",
    "Usage",
    "__version__",
    "clear_caches",
    "fit_context",
    "load",
    "parse_request",
    "parse_usage",
    "stream_text",
}


def test_public_names_are_exactly_these() -> None:
    import types

    assert ctxlock.__all__ == sorted(PUBLIC)  # sorted, and exactly these
    for name in ctxlock.__all__:  # each resolves (imported on first use) and is listed by dir()
        assert getattr(ctxlock, name) is not None and name in dir(ctxlock)
    # Besides submodules (imported by whoever uses them), the package exposes exactly the public names.
    exposed = {n for n, v in vars(ctxlock).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert exposed | {"__version__"} == PUBLIC


def test_import_is_light() -> None:
    code = (
        "import ctxlock, sys; print(sorted(m for m in ('torch', 'transformers', 'mistral_common') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_request_forms_are_equivalent() -> None:
    model = ctxlock.load("book")
    req = {"messages": [{"role": "user", "content": "天空"}]}
    a = model.encode(req)
    b = model.encode(json.dumps(req))
    c = model.encode(json.dumps(req).encode("utf-8"))
    d = model.encode(ctxlock.parse_request(req))
    assert a == b == c == d
    assert a.input_ids.tolist() == [[1, 4, 8, 5, 6]]


def test_render_and_options_use_transformers_names() -> None:
    model = ctxlock.load("book")
    req = {"messages": [{"role": "user", "content": "天空"}, {"role": "assistant", "content": "蓝色"}]}
    assert model.render(req).text.endswith("<assistant>蓝色<assistant>")
    assert model.render(req, add_generation_prompt=False).text.endswith("<assistant>蓝色")
    assert model.render(req, continue_final_message=True).text.endswith("<assistant>蓝色")


def test_encode_batch_left_and_right() -> None:
    model = ctxlock.load("book")
    reqs = [
        {"messages": [{"role": "user", "content": "天空"}]},
        {"messages": [{"role": "system", "content": "简洁回答"}, {"role": "user", "content": "天空为什么是蓝色？"}]},
        {"messages": [{"role": "user", "content": "是"}]},
    ]
    left = model.encode_batch(reqs, padding_side="left")
    right = model.encode_batch(reqs, padding_side="right")
    assert left.valid_lengths == right.valid_lengths == (5, 12, 5)
    assert left.input_ids.shape == (3, 12)
    assert left.input_ids[0].tolist() == [0] * 7 + [1, 4, 8, 5, 6]
    assert right.input_ids[0].tolist() == [1, 4, 8, 5, 6] + [0] * 7
    assert np.array_equal(left.attention_mask.sum(axis=1), [5, 12, 5])
    assert left.position_ids[0].tolist() == [1] * 7 + [0, 1, 2, 3, 4]
    assert [left.row(i) for i in range(3)] == [right.row(i) for i in range(3)]


def test_tokenizer_protocol() -> None:
    from ctxlock.tokenizer import Tokenizer

    for name in ("book", None):
        tok = ctxlock.load(name).tokenizer
        assert isinstance(tok, Tokenizer)
        assert len(tok.sha256) == 64 and tok.vocab_size > 0
        ids = tok.encode("天空", parse_special=False)
        assert tok.decode(ids) == "天空"


BOOK_TEXT = st.lists(st.sampled_from(["天空", "为什么", "是", "蓝色", "？", "?", "x", " ", "<user>"]), max_size=12).map(
    "".join
)


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(BOOK_TEXT, min_size=3, max_size=3), st.sampled_from(["left", "right"]))
def test_batch_of_three_requests_is_consistent_with_single_encodes(texts: list[str], side: str) -> None:
    model = ctxlock.load("book")
    requests = [{"messages": [{"role": "user", "content": t}]} for t in texts]
    singles = [model.encode(r).input_ids[0].tolist() for r in requests]
    batch = model.encode_batch(requests, padding_side=side)
    n = max(map(len, singles))
    assert batch.input_ids.shape == (3, n)
    assert batch.valid_lengths == tuple(map(len, singles))
    for b, ids in enumerate(singles):
        mask = batch.attention_mask[b].tolist()
        assert sum(mask) == len(ids)
        real = [p for p, m in zip(batch.position_ids[b].tolist(), mask, strict=True) if m]
        assert real == list(range(len(ids)))
        assert batch.row(b) == ids
        pad = n - len(ids)
        expected_mask = [0] * pad + [1] * len(ids) if side == "left" else [1] * len(ids) + [0] * pad
        assert mask == expected_mask
        padding = [i for i, m in zip(batch.input_ids[b].tolist(), mask, strict=True) if not m]
        assert padding == [model.pad_id] * pad
