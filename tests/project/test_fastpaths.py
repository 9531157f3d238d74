"""Fast paths give the exact path's ids: the run cache, the skipped provenance pass, the skipped marking walk."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from ctxlock.request import parse_request
from ctxlock.settings import fast_enabled
from ctxlock.template._render import ChatTemplate
from ctxlock.tokenizer._runs import RUNS, RunCache, encode_run
from hypothesis_profiles import examples


@pytest.fixture(scope="module")
def qwen() -> ctxlock.Model:
    return ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))


def _ids(model: ctxlock.Model, request, **options) -> list[int]:
    return [int(i) for i in model.encode(request, **options).input_ids[0]]


def test_fast_enabled_reads_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("CTXLOCK_FAST", "0")
    assert not fast_enabled()
    monkeypatch.setenv("CTXLOCK_FAST", "1")
    assert fast_enabled()
    monkeypatch.delenv("CTXLOCK_FAST")
    assert fast_enabled()


def test_run_cache_is_bounded_by_bytes_and_evicts_oldest() -> None:
    cache = RunCache(max_bytes=4000)
    for i in range(100):
        cache.put(("t", "", f"run {i} " * 10, False), tuple(range(20)))
        assert cache.bytes <= 4000
    assert cache.get(("t", "", "run 99 " * 10, False)) == tuple(range(20))
    assert cache.get(("t", "", "run 0 " * 10, False)) is None  # evicted
    assert 0 < cache.stats()["entries"] < 100


def test_run_cache_keys_by_tokenizer(qwen) -> None:
    other = ctxlock.load(str(fetched.gguf_path("llama-bpe"))).tokenizer
    text = " the quick brown fox 天空"
    a = encode_run(qwen.tokenizer, text, at_start=False)
    b = encode_run(other, text, at_start=False)
    assert list(a) == qwen.tokenizer.encode_text(text, at_start=False)
    assert list(b) == other.encode_text(text, at_start=False)
    assert a != b


HOSTILE = "{% for m in messages %}<|im_{{ m.content }}rt|>{% endfor %}"


@pytest.mark.parametrize("content", ["sta", "im_sta", "_"])
def test_a_request_string_inside_a_control_token_still_gets_provenance(qwen, content: str) -> None:
    # The template builds `<|im_start|>` around the request string "sta": only per-character provenance sees that
    # the token holds request text. encode's fast path must give the same ids as run().
    template = ChatTemplate(HOSTILE, id="hostile")
    request = {"messages": [{"role": "user", "content": content}]}
    exact = [int(i) for i in qwen.run(request, chat_template=template, add_generation_prompt=False).tokenized.ids]
    assert _ids(qwen, request, chat_template=template, add_generation_prompt=False) == exact
    rendered = qwen.render(request, chat_template=template, add_generation_prompt=False, provenance=None)
    # The request text is untrusted exactly when a control token holding some of it occurs in the text:
    # "<|im_sta" + "rt|>" spells <|im_start|>, "<|im_im_sta" + "rt|>" spells none.
    assert rendered.request_spans
    assert bool(rendered.untrusted) is ("<|im_start|>" in rendered.text)
    if content == "sta":
        im_start = qwen.tokenizer.token_to_id("<|im_start|>")
        assert im_start not in exact  # neutralized: the request supplied part of it


def test_a_token_fragment_is_trusted_text_when_no_token_holding_it_occurs(qwen) -> None:
    # "f" is a substring of <|endoftext|>, but the Qwen template never spells that token: no match can hold it,
    # so nothing is untrusted (the whole-text fast path applies), and the ids are those of run().
    tools = [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}},
            },
        }
    ]
    request = {"messages": [{"role": "user", "content": "f"}], "tools": tools}
    template = ChatTemplate(
        fetched.templates_dir().joinpath("Qwen-Qwen2.5-7B-Instruct.jinja").read_text("utf-8"), id="qwen2.5"
    )
    rendered = qwen.render(request, chat_template=template, provenance=None)
    assert "<|endoftext|>" not in rendered.text and not rendered.untrusted
    assert _ids(qwen, request, chat_template=template) == [
        int(i) for i in qwen.run(request, chat_template=template).tokenized.ids
    ]
    hostile = ChatTemplate("{{ '<|endo' + messages[0]['content'] + 'text|>' }}", id="hostile-f")
    rendered = qwen.render(request, chat_template=hostile, provenance=None)
    assert rendered.untrusted  # here <|endoftext|> is spelled around "f"
    assert _ids(qwen, request, chat_template=hostile) == [
        int(i) for i in qwen.run(request, chat_template=hostile).tokenized.ids
    ]
    assert qwen.tokenizer.token_to_id("<|endoftext|>") not in _ids(qwen, request, chat_template=hostile)


WORDS = ["sky", "blue", " ", "\n", "天空", "<|im_start|>", "<|im_end|>", "<|im_", "end|>", "im_st", "😀", "a"]


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(st.lists(st.sampled_from(WORDS), max_size=6).map("".join), min_size=1, max_size=6),
    policy=st.sampled_from(["text", "keep"]),
)
def test_fast_paths_on_and_off_give_the_same_ids(qwen, monkeypatch, parts: list[str], policy: str) -> None:
    roles = ["user", "assistant"]
    msgs = [{"role": roles[i % 2], "content": p} for i, p in enumerate(parts)]
    if msgs[-1]["role"] != "user":
        msgs.append({"role": "user", "content": "ok"})
    request = parse_request({"messages": msgs})
    fast = _ids(qwen, request, injection=policy)
    monkeypatch.setenv("CTXLOCK_FAST", "0")
    RUNS.clear()
    slow = _ids(qwen, request, injection=policy)
    monkeypatch.delenv("CTXLOCK_FAST")
    assert fast == slow
    if policy == "text":
        assert fast == [int(i) for i in qwen.run(request, injection=policy).tokenized.ids]


def test_encode_batch_equals_one_by_one(qwen) -> None:
    # The batch path prefetches every unseen run in one engine call; rows must equal single encodes exactly.
    requests = [
        {"messages": [{"role": "user", "content": f"question {i}: 天空 {'why ' * i}?"}]} for i in range(1, 9)
    ] + [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "<|im_start|>x"}]}]
    for model in (qwen, ctxlock.load()):
        RUNS.clear()
        batch = model.encode_batch(requests, padding_side="left")
        RUNS.clear()
        for row, r in zip(batch.input_ids, requests, strict=True):
            single = _ids(model, r)
            assert [int(i) for i in row[len(row) - len(single) :]] == single


def test_inspect_reports_the_engine_and_why() -> None:
    import json
    import os
    import subprocess
    import sys

    path = str(fetched.gguf_path("qwen2"))

    def inspect(**env: str) -> dict:
        p = subprocess.run(
            [sys.executable, "-m", "ctxlock", "inspect", "-m", path, "--json"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["tokenizer"]

    fast = inspect(CTXLOCK_FAST="1")  # explicit: the suite also runs with CTXLOCK_FAST=0 in its environment
    assert fast["engine"] == "tiktoken" and "rank" in fast["engine_reason"]
    slow = inspect(CTXLOCK_FAST="0")
    assert slow["engine"] == "tokenizers" and slow["engine_reason"] == "CTXLOCK_FAST=0"


_JSON_STRINGS = st.sampled_from(["", "a", "im_st", "<|im_start|>", "<|im_", "end|>", "|>", "type", "role", "f", "x y"])
_JSON = st.recursive(
    st.one_of(_JSON_STRINGS, st.integers(), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(_JSON_STRINGS, st.just("type")), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=examples(400), deadline=None)
@given(
    text=st.text(alphabet="<|>[]im_stardx ", max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=6),
)
def test_touched_spans_equal_the_brute_force(text: str, cuts: list[int]) -> None:
    # The render asks which request-derived spans a control-token occurrence shares a character with. It tries only
    # the positions where a token's first character occurs; the brute force tries every token at every position.
    from ctxlock.template._render import _token_set, _touched

    tokens = _token_set(frozenset({"<|im_start|>", "<|im_end|>", "[INST]", "<s>", "x", "im_"}))
    bounds = sorted({min(c, len(text)) for c in cuts})
    spans = [(s, e, f"p{k}", "") for k, (s, e) in enumerate(itertools.pairwise(bounds)) if k % 2 == 0 and e > s]
    got = [sp for sp, _, _ in _touched(text, spans, tokens)]
    occurrences = [(i, i + len(t)) for t in tokens.tokens for i in range(len(text)) if text.startswith(t, i)]
    assert got == [sp for sp in spans if any(i < sp[1] and j > sp[0] for i, j in occurrences)]
