"""The Python API as someone who knows transformers uses it (issue 16, items 12 and 13).

Item 12: `ModelInput` is a read-only mapping like `BatchEncoding` (the same keys and arrays as
`apply_chat_template(tokenize=True, return_dict=True)`), and `encode(return_tensors="np"|"pt")` is accepted.
Item 13: an unknown keyword argument is an `OptionError` (a CtxlockError, and a TypeError as Python's own is) that
names the option and says what to use instead.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

import ctxlock
import fetched
import reference
from conformance import FIXED_NOW
from ctxlock.errors import OptionError, TensorError, TensorKeyError
from ctxlock.template._render import ChatTemplate
from ctxlock.tensors._assemble import TorchInput

QWEN = "Qwen-Qwen2.5-7B-Instruct.jinja"
REQUEST: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "You are concise."},
        {"role": "user", "content": "Why is the sky blue?"},
    ]
}
SHORT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def qwen() -> tuple[ctxlock.Model, ChatTemplate, str, Any]:
    tok_dir = fetched.hf_tokenizer_dir("qwen2")
    source = (fetched.templates_dir() / QWEN).read_text("utf-8")
    return ctxlock.load(str(tok_dir)), ChatTemplate(source, id=QWEN), source, tok_dir


def _batch_encoding(tok_dir: Any, source: str, return_tensors: str) -> Any:
    tok = reference.reference_tokenizer(tok_dir)
    return tok.apply_chat_template(
        copy.deepcopy(REQUEST["messages"]),
        chat_template=source,
        tokenize=True,
        return_dict=True,
        add_generation_prompt=True,
        return_tensors=return_tensors,
    )


# ---------------------------------------------------------------------------------------------------------------
# item 12: ModelInput as a mapping


def test_model_input_is_a_mapping_like_batch_encoding(qwen) -> None:
    model, template, source, tok_dir = qwen
    mi = model.encode(REQUEST, chat_template=template, now=FIXED_NOW)
    enc = _batch_encoding(tok_dir, source, "np")
    # What transformers users write, on both objects: the same keys first, in the same order, and the same arrays.
    assert list(mi.keys())[: len(enc.keys())] == list(enc.keys()) == ["input_ids", "attention_mask"]
    for key in enc:
        assert np.array_equal(mi[key], enc[key]), key
        assert key in mi
    assert isinstance(mi, Mapping)
    assert list(mi.keys()) == list(mi) == ["input_ids", "attention_mask", "position_ids"]
    assert len(mi) == 3
    assert mi["input_ids"] is mi.input_ids  # the arrays themselves, attribute access unchanged
    assert [k for k, _ in mi.items()] == list(mi)
    assert all(v is getattr(mi, k) for k, v in mi.items())
    assert [v is getattr(mi, k) for k, v in zip(mi, mi.values(), strict=True)] == [True] * 3
    assert dict(mi) == mi.data and list(mi.data) == list(mi)
    assert mi["position_ids"].tolist() == [list(range(mi.seq_len))]
    assert "valid_lengths" not in mi and mi.get("valid_lengths") is None
    assert mi.valid_lengths == (mi.seq_len,)  # still an attribute


def test_model_input_stays_immutable(qwen) -> None:
    model, template, *_ = qwen
    mi = model.encode(REQUEST, chat_template=template, now=FIXED_NOW)
    with pytest.raises(TypeError):
        mi["input_ids"] = np.zeros((1, 1), dtype=np.int64)  # type: ignore[index]
    with pytest.raises(TypeError):
        del mi["input_ids"]  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        mi.input_ids = np.zeros((1, 1), dtype=np.int64)  # type: ignore[misc]
    with pytest.raises(ValueError, match="read-only"):
        mi["input_ids"][0, 0] = 0
    mi.data["input_ids"] = None  # a fresh dict each time: the ModelInput is untouched
    assert mi["input_ids"] is not None
    assert mi == model.encode(REQUEST, chat_template=template, now=FIXED_NOW)


def test_a_missing_key_is_a_key_error_naming_the_keys(qwen) -> None:
    model, template, *_ = qwen
    mi = model.encode(SHORT, chat_template=template, now=FIXED_NOW)
    with pytest.raises(KeyError) as info:
        mi["valid_lengths"]
    assert isinstance(info.value, TensorKeyError) and isinstance(info.value, ctxlock.CtxlockError)
    assert "input_ids, attention_mask, position_ids" in info.value.hint
    assert "mi.valid_lengths" in info.value.hint
    with pytest.raises(TensorKeyError):
        mi[0]  # type: ignore[index]


def test_return_tensors_np_and_pt_as_transformers(qwen) -> None:
    import torch

    model, template, source, tok_dir = qwen
    default = model.encode(REQUEST, chat_template=template, now=FIXED_NOW)
    assert model.encode(REQUEST, chat_template=template, now=FIXED_NOW, return_tensors="np") == default
    pt = model.encode(REQUEST, chat_template=template, now=FIXED_NOW, return_tensors="pt")
    enc = _batch_encoding(tok_dir, source, "pt")
    assert isinstance(pt, TorchInput) and isinstance(pt, Mapping)
    assert list(pt.keys()) == list(default.keys())
    for key in enc:
        assert pt[key].dtype == enc[key].dtype == torch.long
        assert torch.equal(pt[key], enc[key]), key
    assert pt.input_ids is pt["input_ids"] and len(pt) == 3 and "position_ids" in pt
    assert pt.model_input == default
    moved = pt.to("cpu")
    assert isinstance(moved, TorchInput) and moved.input_ids.device.type == "cpu"
    assert torch.equal(moved["attention_mask"], pt["attention_mask"])
    assert isinstance(default.to("cpu"), TorchInput)  # numpy has no device: `.to` gives the torch form
    with pytest.raises(AttributeError):
        pt.input_ids = None  # type: ignore[misc]


def test_encode_batch_return_tensors(qwen) -> None:
    import torch

    model, template, *_ = qwen
    batch = model.encode_batch([REQUEST, SHORT], chat_template=template, now=FIXED_NOW)
    pt = model.encode_batch([REQUEST, SHORT], chat_template=template, now=FIXED_NOW, return_tensors="pt")
    assert isinstance(pt, TorchInput)
    for key in batch:
        assert pt[key].tolist() == batch[key].tolist()
        assert pt[key].dtype == torch.long
    assert pt.model_input.valid_lengths == batch.valid_lengths


@pytest.mark.parametrize("value", ["tf", "jax", "mlx", "PT", 1])
def test_other_return_tensors_are_a_typed_error(qwen, value: Any) -> None:
    model, template, *_ = qwen
    for call in (
        lambda: model.encode(SHORT, chat_template=template, return_tensors=value),
        lambda: model.encode_batch([SHORT], chat_template=template, return_tensors=value),
    ):
        with pytest.raises(TensorError) as info:
            call()
        assert info.value.path == "return_tensors"
        assert repr(value) in info.value.message
        assert "'np'" in info.value.hint and "'pt'" in info.value.hint


def test_return_tensors_pt_without_torch(qwen, monkeypatch: pytest.MonkeyPatch) -> None:
    model, template, *_ = qwen
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(TensorError) as info:
        model.encode(SHORT, chat_template=template, return_tensors="pt")
    assert info.value.hint == "pip install 'ctxlock[torch]'"
    assert info.value.path == "return_tensors='pt'"


# ---------------------------------------------------------------------------------------------------------------
# item 13: unknown keyword arguments


CALLS = {
    "render": lambda m, t, kw: m.render(SHORT, chat_template=t, **kw),
    "run": lambda m, t, kw: m.run(SHORT, chat_template=t, **kw),
    "encode": lambda m, t, kw: m.encode(SHORT, chat_template=t, **kw),
    "encode_batch": lambda m, t, kw: m.encode_batch([SHORT], chat_template=t, **kw),
}

# option -> words its hint must hold (what to use instead)
INSTEAD = {
    "truncation": ("fit_context", "ctxlock fit --max-input-tokens"),
    "max_length": ("fit_context", "BudgetPolicy(max_input_tokens"),
    "return_assistant_mask": ("return_assistant_tokens_mask=True", "assistant_masks"),
    "return_dict": ("ModelInput", "mapping"),
    "tokenize": ("render() is tokenize=False", "encode() is tokenize=True"),
    "template": ("chat_template=",),
    "special_tokens": ("injection=",),
    "padding": ("encode_batch",),
}


@pytest.mark.parametrize("method", list(CALLS))
@pytest.mark.parametrize("option", list(INSTEAD))
def test_transformers_options_say_what_to_use_instead(qwen, method: str, option: str) -> None:
    model, template, *_ = qwen
    with pytest.raises(ctxlock.CtxlockError) as info:
        CALLS[method](model, template, {option: True})
    err = info.value
    assert isinstance(err, OptionError) and isinstance(err, TypeError)
    assert err.path == option and repr(option) in err.message and f"{method}()" in err.message
    for words in INSTEAD[option]:
        assert words in err.hint, (option, err.hint)


@pytest.mark.parametrize(
    ("typo", "meant", "method"),
    [
        ("add_generation_promt", "add_generation_prompt", "encode"),
        ("continue_final", "continue_final_message", "run"),
        ("injections", "injection", "render"),
        ("paddingside", "padding_side", "encode_batch"),
        ("return_tensor", "return_tensors", "encode"),
    ],
)
def test_a_typo_gets_a_close_match_and_the_accepted_names(qwen, typo: str, meant: str, method: str) -> None:
    model, template, *_ = qwen
    with pytest.raises(ctxlock.CtxlockError) as info:
        CALLS[method](model, template, {typo: True})
    err = info.value
    assert isinstance(err, OptionError) and err.path == typo
    assert f"did you mean {meant!r}?" in err.hint
    assert "add_generation_prompt" in err.hint and "content_format" in err.hint  # the accepted names


def test_an_unrelated_name_lists_the_accepted_ones(qwen) -> None:
    model, template, *_ = qwen
    with pytest.raises(OptionError) as info:
        model.encode(SHORT, chat_template=template, zzz=1)
    assert "did you mean" not in info.value.hint
    assert info.value.hint.startswith("encode takes: add_generation_prompt, ")
    assert "return_tensors" in info.value.hint


def test_padding_options_on_encode_point_to_encode_batch(qwen) -> None:
    model, template, *_ = qwen
    with pytest.raises(OptionError) as info:
        model.encode(SHORT, chat_template=template, padding_side="left")
    assert "encode_batch" in info.value.hint
    # ... and they are encode_batch's own options, accepted there.
    batch = model.encode_batch([SHORT, REQUEST], chat_template=template, padding_side="right", pad_to_multiple_of=8)
    assert batch.seq_len % 8 == 0


def test_parse_refuses_a_typo_with_a_close_match(qwen) -> None:
    model, *_ = qwen
    with pytest.raises(OptionError) as info:
        model.parse(SHORT, dialekt="openai")
    assert info.value.path == "dialekt" and info.value.hint.startswith("did you mean 'dialect'?")
