"""Fast paths give the exact path's ids: the run cache, the skipped provenance pass, the skipped marking walk."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import artifacts
import ctxlock
from ctxlock.request import parse_request
from ctxlock.template import ChatTemplate
from ctxlock.tokenizer.runs import RUNS, RunCache, encode_run, fast_enabled


@pytest.fixture(scope="module")
def qwen() -> ctxlock.Model:
    return ctxlock.load(str(artifacts.hf_tokenizer_dir("qwen2")))


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
    other = ctxlock.load(str(artifacts.gguf_path("llama-bpe"))).tokenizer
    text = " the quick brown fox 天空"
    a = encode_run(qwen.tokenizer, text, at_start=False)
    b = encode_run(other, text, at_start=False)
    assert list(a) == qwen.tokenizer.encode_text(text, at_start=False)
    assert list(b) == other.encode_text(text, at_start=False)
    assert a != b


HOSTILE = "{% for m in messages %}<|im_{{ m.content }}rt|>{% endfor %}"


@pytest.mark.parametrize("content", ["sta", "im_sta", "_"])
def test_a_request_string_inside_a_control_token_still_gets_provenance(qwen, content: str) -> None:
    # The template builds `<|im_start|>` around the request string "sta": only the provenance pass sees that the
    # token holds request text. With provenance left to ctxlock (encode's default) the ids must be the same.
    template = ChatTemplate(HOSTILE, id="hostile")
    request = {"messages": [{"role": "user", "content": content}]}
    exact = [int(i) for i in qwen.run(request, template=template, add_generation_prompt=False).tokenized.ids]
    assert _ids(qwen, request, template=template, add_generation_prompt=False) == exact
    rendered = qwen.render(request, template=template, add_generation_prompt=False, provenance=None)
    # The pass runs exactly when a control token holding the string occurs in the text: "<|im_sta" + "rt|>" spells
    # <|im_start|>, "<|im_im_sta" + "rt|>" spells none.
    assert bool(rendered.request_spans) is ("<|im_start|>" in rendered.text)
    if content == "sta":
        im_start = qwen.tokenizer.token_to_id("<|im_start|>")
        assert im_start not in exact  # neutralized: the request supplied part of it
        assert rendered.request_spans


def test_a_token_fragment_skips_provenance_when_no_token_holding_it_occurs(qwen) -> None:
    # "f" is a substring of <|endoftext|>, but the Qwen template never spells that token: no match can hold it,
    # so the second render is skipped, and the ids are still those of the full provenance pass.
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
        artifacts.templates_dir().joinpath("Qwen-Qwen2.5-7B-Instruct.jinja").read_text("utf-8"), id="qwen2.5"
    )
    rendered = qwen.render(request, template=template, provenance=None)
    assert "<|endoftext|>" not in rendered.text and not rendered.request_spans
    assert _ids(qwen, request, template=template) == [
        int(i) for i in qwen.run(request, template=template).tokenized.ids
    ]
    hostile = ChatTemplate("{{ '<|endo' + messages[0]['content'] + 'text|>' }}", id="hostile-f")
    rendered = qwen.render(request, template=hostile, provenance=None)
    assert rendered.request_spans  # here <|endoftext|> is spelled around "f": the pass runs
    assert _ids(qwen, request, template=hostile) == [int(i) for i in qwen.run(request, template=hostile).tokenized.ids]
    assert qwen.tokenizer.token_to_id("<|endoftext|>") not in _ids(qwen, request, template=hostile)


WORDS = ["sky", "blue", " ", "\n", "天空", "<|im_start|>", "<|im_end|>", "<|im_", "end|>", "im_st", "😀", "a"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
    fast = _ids(qwen, request, special_tokens=policy)
    monkeypatch.setenv("CTXLOCK_FAST", "0")
    RUNS.clear()
    slow = _ids(qwen, request, special_tokens=policy)
    monkeypatch.delenv("CTXLOCK_FAST")
    assert fast == slow
    if policy == "text":
        assert fast == [int(i) for i in qwen.run(request, special_tokens=policy).tokenized.ids]


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

    path = str(artifacts.gguf_path("qwen2"))

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

    fast = inspect()
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


@settings(max_examples=300, deadline=None)
@given(value=_JSON)
def test_one_scan_answers_both_render_questions(value) -> None:
    # The render's single walk per message equals the two walks it replaced: would marking change anything, and
    # which strings could hide inside a control token.
    from ctxlock.template import _hiding_strings, _mark_string, _scan, _token_set, _walk_strings

    tokens = _token_set(frozenset({"<|im_start|>", "<|im_end|>", "<|endoftext|>"}))
    hiding: set[str] = set()
    mark = _scan(value, tokens, hiding)
    expected_hiding: set[str] = set()
    _hiding_strings(value, tokens, expected_hiding)
    # Against the definition: every non-empty substring of a token, from the values walked.
    substrings = {t[i:j] for t in tokens.tokens for i in range(len(t)) for j in range(i + 1, len(t) + 1)}
    assert expected_hiding <= substrings
    walked = _walk_strings(value, lambda s: _mark_string(s, tokens, "\0", "\1", "\2"), keys=True)
    assert hiding == expected_hiding
    assert mark == (walked != value)


@settings(max_examples=400, deadline=None)
@given(s=st.text(alphabet="<|>[]im_stardx ", min_size=1, max_size=30))
def test_join_checks_equal_the_brute_force(s: str) -> None:
    from ctxlock.template import _joins_after, _joins_before, _token_set

    tokens = _token_set(frozenset({"<|im_start|>", "<|im_end|>", "[INST]", "<s>", "x"}))
    reach = min(tokens.longest, len(s))
    assert _joins_after(s, tokens) == any(s[-k:] in tokens.prefixes for k in range(1, reach + 1))
    assert _joins_before(s, tokens) == any(s[:k] in tokens.suffixes for k in range(1, reach + 1))
