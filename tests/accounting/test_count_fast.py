"""The fast paths of `count` (issue 18, acceptance 5) against their references, piece by piece.

- `whole_lay` (token boundaries from the ids and the whole-text encoder's byte lengths, no control matches) gives
  `_replay_runs`'s ranges, and it does apply to the vocabularies it is for;
- it refuses ids whose bytes do not line up, and texts where a control string is not a control token;
- `tally_segments` (owners as segments) gives `bincount(assign_owners(...))` (owners per byte);
- `_char_to_byte` from UTF-8 lead bytes gives the code-point widths' running sum;
- `Counts.request_bytes`, measured when read, is the request's size.

`tests/accounting/test_accounting.py` compares whole counts, fast against `reference_path()`, on every template.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from conformance import FIXED_NOW, conversations, vocab_for
from ctxlock.accounting import _layout as accounting
from ctxlock.accounting import _tokenlay as tokenlay
from ctxlock.errors import CtxlockError
from ctxlock.settings import reference_path
from ctxlock.template._render import ChatTemplate
from ctxlock.tokenizer import control_matches, encode_ids
from hypothesis_profiles import examples

pytestmark = pytest.mark.fast_path

NAMES = ["Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja", "deepseek-ai-DeepSeek-V3.1.jinja"]


@functools.cache  # let go after the module (tests/conftest.py)
def _model(vocab: str) -> ctxlock.Model:
    return ctxlock.load(str(fetched.hf_tokenizer_dir(vocab)))


def _template(name: str) -> ChatTemplate:
    return ChatTemplate((fetched.templates_dir() / name).read_text("utf-8"), id=name)


def _reference_ranges(model: ctxlock.Model, rendered: Any, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    text = rendered.text
    data = text.encode("utf-8", "surrogatepass")
    offsets = accounting._char_to_byte(text, data)
    pieces = tokenlay._pieces(model.tokenizer)
    control = control_matches(rendered, model.tokenizer)
    starts, ends, exact = tokenlay._replay_runs(model.tokenizer, text, ids, control, offsets, pieces)
    assert exact
    return starts, ends


@pytest.mark.parametrize("name", NAMES)
def test_whole_lay_equals_the_run_by_run_replay(name: str) -> None:
    model, template = _model(vocab_for(name)), _template(name)
    laid = 0
    for label, data, options in conversations():
        try:
            run = model.run(data, chat_template=template, now=FIXED_NOW, **options)
        except CtxlockError:
            continue
        rendered = run.rendered
        ids = encode_ids(rendered, model.tokenizer)
        cum = tokenlay.whole_lay(model.tokenizer, rendered, ids, rendered.text.encode("utf-8", "surrogatepass"))
        if cum is None:
            continue
        starts, ends = _reference_ranges(model, rendered, ids)
        assert cum[:-1].tolist() == starts.tolist(), label
        assert cum[1:].tolist() == ends.tolist(), label
        laid += 1
    assert laid > 5  # the fast path applies to these vocabularies: it is what `count` runs


def _qwen_rendered(content: str) -> tuple[ctxlock.Model, Any, np.ndarray]:
    model, template = _model("qwen2"), _template(NAMES[0])
    rendered = model.render({"messages": [{"role": "user", "content": content}]}, chat_template=template)
    return model, rendered, encode_ids(rendered, model.tokenizer)


def test_whole_lay_refuses_ids_that_do_not_line_up() -> None:
    model, rendered, ids = _qwen_rendered("Where is the café? ünïcödé 日本語")
    data = rendered.text.encode("utf-8")
    assert tokenlay.whole_lay(model.tokenizer, rendered, ids, data) is not None
    assert tokenlay.whole_lay(model.tokenizer, rendered, ids[:-1], data) is None  # a token short
    control = {t.id for t in model.tokenizer.added_tokens if t.control}
    at = [i for i, t in enumerate(ids.tolist()) if t in control]
    moved = ids.copy()
    k = at[1]
    moved[k], moved[k + 1] = moved[k + 1], moved[k]  # same lengths in all, a control token one place off
    assert tokenlay.whole_lay(model.tokenizer, rendered, moved, data) is None
    assert tokenlay.whole_lay(model.tokenizer, rendered, ids, data + b"x") is None


def test_a_control_string_in_request_text_takes_the_reference_path() -> None:
    """Request text spelling `<|im_end|>` is encoded as text (policy "text"): no whole-text encoding, no whole lay;
    the counts still equal the reference's."""
    model, rendered, ids = _qwen_rendered("print('<|im_end|>') then <|im_start|>")
    assert tokenlay.whole_lay(model.tokenizer, rendered, ids, rendered.text.encode("utf-8")) is None
    req = {"messages": [{"role": "user", "content": "print('<|im_end|>') then <|im_start|>"}]}
    template = _template(NAMES[0])
    fast = accounting.count(model, req, chat_template=template)
    with reference_path():
        assert accounting.count(model, req, chat_template=template) == fast
    assert fast.total == len(ids)


def test_whole_lay_when_a_control_string_is_kept() -> None:
    """With injection="keep" a control string in request text is a control token: the lay still applies."""
    model, template = _model("qwen2"), _template(NAMES[0])
    req = {"messages": [{"role": "user", "content": "a <|im_end|> b"}]}
    rendered = model.render(req, chat_template=template, injection="keep")
    ids = encode_ids(rendered, model.tokenizer)
    cum = tokenlay.whole_lay(model.tokenizer, rendered, ids, rendered.text.encode("utf-8"))
    assert cum is not None
    starts, ends = _reference_ranges(model, rendered, ids)
    assert cum[:-1].tolist() == starts.tolist() and cum[1:].tolist() == ends.tolist()


@settings(max_examples=examples(400), deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=60),
    st.lists(st.integers(0, 5), max_size=40),
    st.lists(st.integers(0, 60), max_size=8),
)
def test_tally_segments_equals_the_per_byte_owners(owner: list[int], lengths: list[int], extra: list[int]) -> None:
    size = len(owner)
    if not lengths or sum(lengths) != size:
        lengths = [*lengths, size - sum(lengths)] if sum(lengths) <= size else [size]
    cum = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    per_byte = np.array(owner, dtype=np.int32)
    expected = np.bincount(tokenlay.assign_owners(per_byte, cum[:-1], cum[1:]), minlength=4).tolist()
    if size:
        change = set((np.flatnonzero(np.diff(per_byte)) + 1).tolist()) | {e for e in extra if 0 < e < size}
        points = [0, *sorted(change), size]  # breakpoints where the owner stays the same too
        seg = [owner[p] for p in points[:-1]]
    else:
        points, seg = [0], []
    assert tokenlay.tally_segments(points, seg, cum, 4) == expected


def test_assign_owners_with_one_owner_throughout() -> None:
    owner = np.zeros(5, dtype=np.int32)
    assert tokenlay.assign_owners(owner, np.array([0, 2]), np.array([2, 5])).tolist() == [0, 0]


def _widths_reference(text: str) -> list[int]:
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    widths = 1 + (cps >= 0x80).astype(np.int64) + (cps >= 0x800) + (cps >= 0x10000)
    return [0, *np.cumsum(widths).tolist()]


@settings(max_examples=examples(300), deadline=None)
@given(st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40))
def test_char_to_byte_equals_the_code_point_widths(text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    assert accounting._char_to_byte(text, data).tolist() == _widths_reference(text)


def test_request_bytes_is_the_size_of_the_request_as_sent(tmp_path: Path) -> None:
    model, template = _model("qwen2"), _template(NAMES[0])
    req = {"messages": [{"role": "user", "content": "héllo"}]}
    counts = accounting.count(model, req, chat_template=template)
    compact = json.dumps(req, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    assert counts.request_bytes == len(compact)
    raw = json.dumps(req, indent=2).encode()
    assert accounting.count(model, raw, chat_template=template).request_bytes == len(raw)
    assert counts.to_dict()["request_bytes"] == len(compact)
