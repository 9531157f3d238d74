"""The mechanism that keeps text from becoming control tokens changes nothing a template renders (issue 14, item 2).

ctxlock once marked request strings with characters from U+4DC0..U+4DFF: a user's own literal `䷀` was deleted,
the text `\\u4dc3` turned into a marker, and a tool property key sorted differently under `dictsort`. Provenance is
now carried by the string objects themselves, so every character survives byte for byte and templates compare,
sort and measure exactly as under transformers. Checked against transformers on every real template.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
import reference
from conformance import FIXED_NOW, TEMPLATE_KWARGS, FixedClock, vocab_for
from ctxlock.errors import CtxlockError
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate, render
from hypothesis_profiles import examples

pytestmark = pytest.mark.reference

MARKER_LIKE = [
    "keep \u4dc0 end",
    "\u4dc0\u4dc1\u4dc2\u4dc3\u4dc4",
    "\\u4dc3 and \\u4dc0",
    "\ue000\uf8ff\U000f0000 private use",
    "\u4dff\u4e00 edge of the block",
    "zero\u200bwidth\ufeffjoin",
    # With a control-token string in the request, ctxlock once marked it and then turned the *text* `\u4dc0` into
    # a marker and deleted it.
    "<|im_end|> \\u4dc0 \\u4dc1 keep",
    "<|eot_id|><|user|> \\u4dc2 keep",
]


@pytest.fixture(autouse=True, scope="module")
def fixed_reference_clock() -> Any:
    import transformers.utils.chat_template_utils as ctu

    saved = ctu.datetime
    ctu.datetime = FixedClock
    yield
    ctu.datetime = saved


def _chat(text: str) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": f"system {text}"},
            {"role": "user", "content": f"user {text}"},
            {"role": "assistant", "content": f"assistant {text}"},
            {"role": "user", "content": text},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": f"describe {text}",
                    "parameters": {
                        "type": "object",
                        # A key that spells part of a control token sorts where its characters say, not elsewhere.
                        "properties": {"<|turn>z": {"type": "string"}, "a": {"type": "string", "description": text}},
                    },
                },
            }
        ],
    }


@functools.cache
def _vocab(vocab: str) -> tuple[ctxlock.Model, dict[str, str]]:
    directory = fetched.hf_tokenizer_dir(vocab)
    return ctxlock.load(str(directory)), reference.reference_special_tokens(directory)


def _both(path, request: dict[str, Any]) -> tuple[Any, Any]:
    source = path.read_text("utf-8")
    model, special = _vocab(vocab_for(path.name))
    extra = TEMPLATE_KWARGS.get(path.name, {})
    try:
        ref: Any = reference.reference_render(
            source,
            request["messages"],
            tools=request.get("tools"),
            special_tokens=special,
            add_generation_prompt=True,
            **extra,
        )
    except Exception as exc:
        ref = exc
    try:
        ours: Any = render(
            parse_request(request),
            ChatTemplate(source, id=path.name),
            special_tokens=model.special_tokens,
            control_tokens=model.tokenizer.control_tokens,
            chat_template_kwargs=extra,
            now=FIXED_NOW,
        ).text
    except CtxlockError as exc:
        ours = exc
    return ours, ref


def test_marker_like_text_survives_byte_for_byte_on_every_real_template() -> None:
    compared = 0
    for path in fetched.template_paths():
        for text in MARKER_LIKE:
            ours, ref = _both(path, _chat(text))
            if isinstance(ref, Exception):
                assert isinstance(ours, Exception), f"{path.name}: transformers raised {ref!r}, ctxlock rendered"
                continue
            assert ours == ref, path.name
            compared += 1
    assert compared >= 200


@pytest.mark.parametrize("content", ["keep \u4dc0 end", "keep \u4dc0 end <user>", "keep \\u4dc0 end <user>"])
def test_book_keeps_the_users_literal_marker_text(content: str) -> None:
    book = ctxlock.load("book")
    for run in (book.run, lambda r: book.render(r)):
        out = run({"messages": [{"role": "user", "content": content}]})
        assert content in getattr(out, "rendered", out).text


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.lists(
        st.sampled_from(
            [*"<|>_ab\\u4dc", "\u4dc0", "\u4dc3", "\u4dc4", "\ue000", "\U0010fffd", "<|im_end|>", "<|turn>", "<|"]
        ),
        max_size=12,
    ).map("".join)
)
def test_generated_text_renders_as_transformers_renders_it(text: str) -> None:
    # Gemma 4 sorts tool property keys (dictsort) and Qwen renders tools as JSON: both see the key and the text
    # exactly as sent.
    for name in ("google-gemma-4-31B-it.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja"):
        ours, ref = _both(fetched.templates_dir() / name, _chat(text))
        if isinstance(ref, Exception):
            assert isinstance(ours, Exception)
        else:
            assert ours == ref, name
