"""Red-team regressions for issue 16's API and CLI work: defects found by generated inputs against what was built."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

import artifacts
import ctxlock
from conformance import FIXED_NOW
from ctxlock.template import ChatTemplate
from ctxlock.tensors import TorchInput

QWEN = "Qwen-Qwen2.5-7B-Instruct.jinja"
REQUESTS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hi"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]},
]


@pytest.fixture(scope="module")
def qwen() -> tuple[ctxlock.Model, ChatTemplate]:
    source = (artifacts.templates_dir() / QWEN).read_text("utf-8")
    return ctxlock.load(str(artifacts.hf_tokenizer_dir("qwen2"))), ChatTemplate(source, id=QWEN)


@pytest.mark.parametrize("batch", [False, True], ids=["encode", "encode_batch"])
def test_torch_input_pickles_copies_and_compares_like_batch_encoding(qwen, batch: bool) -> None:
    """`return_tensors="pt"` gave a TorchInput that pickle, copy and deepcopy could not rebuild (its read-only
    __setattr__ refused the slot state: a DataLoader worker pickles its batches) and whose == raised (Mapping's ==
    compares tensors elementwise). BatchEncoding does all three."""
    model, template = qwen
    kwargs = {"template": template, "now": FIXED_NOW, "return_tensors": "pt"}

    def make() -> TorchInput:
        if batch:
            return model.encode_batch(REQUESTS, pad_to_multiple_of=8, **kwargs)  # type: ignore[return-value]
        return model.encode(REQUESTS[1], **kwargs)  # type: ignore[return-value]

    ti = make()
    for again in (pickle.loads(pickle.dumps(ti)), copy.copy(ti), copy.deepcopy(ti)):
        assert isinstance(again, TorchInput)
        assert list(again) == list(ti)
        assert all(again[k].equal(ti[k]) and again[k].dtype == ti[k].dtype for k in ti)
        assert again.model_input == ti.model_input
        assert again == ti
    assert ti == make()
    other = model.encode(REQUESTS[0], **kwargs)
    assert ti != other and ti != dict(ti)
    with pytest.raises(TypeError):
        hash(ti)  # torch tensors are mutable: unhashable, as a BatchEncoding is
