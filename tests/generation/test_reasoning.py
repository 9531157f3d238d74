"""Reasoning split from the answer over ids (ctxlock.generation.ReasoningSplitter).

Qwen3's cases are vLLM's (tests/reasoning/test_qwen3_reasoning_parser.py in vllm-project/vllm): the model output, the
reasoning and the content vLLM expects. Each is tokenized with a Qwen3 tokenizer (tests/reasoning_vocab.py) and fed
whole, one id at a time, and split in two at every id; the result must be the same each time, and equal to vLLM's.
Where the generation prompt starts the output is read from the real chat templates. gpt-oss is checked against
openai-harmony's own parse of the same completion ids. The other families' vLLM cases are in
test_reasoning_vllm.py."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from ctxlock.artifacts import load_template_file
from ctxlock.artifacts._hf_dir import load_hf_dir
from ctxlock.errors import CtxlockError, ReasoningError
from ctxlock.generation import (
    ContentDelta,
    ReasoningDelta,
    ReasoningResult,
    ReasoningSplitter,
    split_reasoning,
    split_reasoning_text,
    start_from_prompt,
)
from ctxlock.request import parse_request
from ctxlock.template import render
from hypothesis_profiles import examples
from reasoning_vocab import qwen3_tokenizer

TOOL_CALL_BODY = (
    "<tool_call>\n<function=bash>\n<parameter=command>\ncat /etc/hosts\n</parameter>\n</function>\n</tool_call>"
)

# (id, model output, where it starts, reasoning, content): vLLM's qwen3 cases. "reasoning" is the family's rule when
# the prompt does not say (thinking on); "content" is enable_thinking=False, whose prompt closes an empty block.
QWEN3_CASES = [
    (
        "without_start_token",
        "This is a reasoning section</think>This is the rest",
        None,
        "This is a reasoning section",
        "This is the rest",
    ),
    (
        "without_start_token_complete_reasoning",
        "This is a reasoning section</think>",
        None,
        "This is a reasoning section",
        None,
    ),
    (
        "with_think",
        "<think>This is a reasoning section</think>This is the rest",
        None,
        "This is a reasoning section",
        "This is the rest",
    ),
    ("without_think", "This is the rest", None, "This is the rest", None),
    ("complete_reasoning", "<think>This is a reasoning section</think>", None, "This is a reasoning section", None),
    (
        "multiline_reasoning",
        "<think>This is a reasoning\nsection</think>This is the rest\nThat",
        None,
        "This is a reasoning\nsection",
        "This is the rest\nThat",
    ),
    ("only_open_tag", "<think>This is a reasoning section", None, "This is a reasoning section", None),
    ("truncated_no_start_token", "This is a reasoning section", None, "This is a reasoning section", None),
    (
        "tool_call_no_think_end",
        "I need to read the file.\n\n" + TOOL_CALL_BODY,
        None,
        "I need to read the file.\n\n",
        TOOL_CALL_BODY,
    ),
    (
        "tool_call_with_think_no_end",
        "<think>I need to read the file.\n\n" + TOOL_CALL_BODY,
        None,
        "I need to read the file.\n\n",
        TOOL_CALL_BODY,
    ),
    ("start_and_end_in_one_delta_no_content", "<think>reasoning</think>", None, "reasoning", None),
    ("no_start_end_grouped_with_content", "reasoning section</think>content", None, "reasoning section", "content"),
    ("thinking_disabled_plain_content", "This is plain content", "content", None, "This is plain content"),
    (
        "thinking_disabled_no_think_tokens",
        "Some output without think tokens",
        "content",
        None,
        "Some output without think tokens",
    ),
    (
        "thinking_disabled_with_tool_call",
        "I need to read the file.\n\n" + TOOL_CALL_BODY,
        "content",
        None,
        "I need to read the file.\n\n" + TOOL_CALL_BODY,
    ),
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return qwen3_tokenizer(tmp_path_factory.getbasetemp())


def feed_all(tok: Any, ids: list[int], fmt: str, chunks: list[list[int]], **kw: Any) -> ReasoningResult:
    """Feed `chunks` and finish; the result carries every event, as split_reasoning's does."""
    finish_reason = kw.pop("finish_reason", None)
    splitter = ReasoningSplitter(tok, fmt, **kw)
    events = [e for c in chunks for e in splitter.feed(c)]
    result = splitter.finish(finish_reason)
    return ReasoningResult(**{**result.__dict__, "events": (*events, *result.events)})


def chunkings(ids: list[int]) -> list[list[list[int]]]:
    """One id at a time, and the ids split in two at every point."""
    return [[[i] for i in ids], *[[ids[:k], ids[k:]] for k in range(len(ids) + 1)]]


def merged(events: tuple[Any, ...]) -> list[tuple[str, str]]:
    """The events as (kind, text) runs, adjacent ones of a kind joined: the same whatever the chunking."""
    out: list[tuple[str, str]] = []
    for e in events:
        kind = "reasoning" if isinstance(e, ReasoningDelta) else "content"
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + e.text)
        else:
            out.append((kind, e.text))
    return out


@pytest.mark.parametrize(
    ("name", "output", "starts", "reasoning", "content"), QWEN3_CASES, ids=[c[0] for c in QWEN3_CASES]
)
def test_vllm_qwen3_cases_whole_and_at_every_split(
    tok: Any, name: str, output: str, starts: Any, reasoning: Any, content: Any
) -> None:
    ids = tok.encode(output, parse_special=True)
    whole = split_reasoning(tok, ids, "qwen3", starts=starts)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    assert "<think>" not in (whole.content or "") and "</think>" not in (whole.content or "")
    for chunks in chunkings(ids):
        fed = feed_all(tok, ids, "qwen3", chunks, starts=starts)
        assert (fed.reasoning, fed.content, fed.notes) == (whole.reasoning, whole.content, whole.notes), chunks
        assert merged(fed.events) == merged(whole.events)


def test_a_response_cut_off_inside_reasoning_has_no_content(tok: Any) -> None:
    ids = tok.encode("<think>Let me think about this.</think>The answer is 4.", parse_special=True)
    close = ids.index(tok.token_to_id("</think>"))
    for cut in range(len(ids) + 1):
        r = split_reasoning(tok, ids[:cut], "qwen3", finish_reason="length")
        if cut <= close:
            assert r.content is None and not r.reasoning_complete and r.cut_off, cut
            assert "hit the output limit inside reasoning" in r.notes[-1]
            assert r.reasoning == tok.decode(ids[1:cut]) if cut else r.reasoning == ""
        else:
            assert r.reasoning_complete and not r.cut_off and r.reasoning == "Let me think about this."
            assert r.content == (tok.decode(ids[close + 1 : cut]) or None)
    stopped = split_reasoning(tok, ids[:close], "qwen3", finish_reason="stop")
    assert not stopped.cut_off and not stopped.reasoning_complete and stopped.content is None
    assert "ended (finish_reason='stop') inside reasoning" in stopped.notes[-1]


def test_tags_written_as_text_stay_text(tok: Any) -> None:
    """Over ids only the tag's own token is a tag: the model writing "</think>" as characters is reasoning text."""
    plain = tok.encode("an HTML-ish </think> in prose", parse_special=False)
    assert tok.token_to_id("</think>") not in plain
    ids = [tok.token_to_id("<think>"), *plain, tok.token_to_id("</think>"), *tok.encode("done")]
    r = split_reasoning(tok, ids, "qwen3")
    assert (r.reasoning, r.content) == ("an HTML-ish </think> in prose", "done")
    # On text there is no telling them apart; split_reasoning_text says so in its notes.
    t = split_reasoning_text(tok.decode(ids), "qwen3")
    assert (t.reasoning, t.content) == ("an HTML-ish ", " in prose</think>done".replace("</think>", "", 1))
    assert any("matched as text" in n for n in t.notes)


def test_stray_tags_never_reach_the_content_and_are_noted(tok: Any) -> None:
    ids = tok.encode("First</think>Middle</think>Last<think>", parse_special=True)
    r = split_reasoning(tok, ids, "qwen3", starts="reasoning")
    # vLLM keeps the second </think> in the content ("Middle</think>Last"): a tag is not answer text.
    assert (r.reasoning, r.content) == ("First", "MiddleLast")
    assert any("</think> outside reasoning dropped" in n for n in r.notes)
    assert not r.reasoning_complete  # the trailing <think> opened a new block that never closed


@cache
def _render(template: str, kwargs: str, generation: bool = True) -> str:
    tpl = load_template_file(fetched.templates_dir() / template)
    body = {"messages": [{"role": "user", "content": "What is 2+2?"}], **json.loads(kwargs)}
    return render(parse_request(json.dumps(body).encode()), tpl, add_generation_prompt=generation).text


# Where each real template's generation prompt leaves the output: the template-opened case, thinking off, or silent
# (the family's rule). (template, format, request fields, expected)
TEMPLATE_STARTS = [
    ("Qwen-Qwen3-0.6B.jinja", "qwen3", {}, None),
    ("Qwen-Qwen3-0.6B.jinja", "qwen3", {"chat_template_kwargs": {"enable_thinking": False}}, "content"),
    ("Qwen3.5-4B.jinja", "qwen3", {}, "reasoning"),
    ("Qwen3.5-4B.jinja", "qwen3", {"chat_template_kwargs": {"enable_thinking": False}}, "content"),
    # llama.cpp's copy of QwQ's template closes the block unless enable_thinking is set.
    ("Qwen-QwQ-32B.jinja", "qwen3", {}, "content"),
    ("Qwen-QwQ-32B.jinja", "qwen3", {"chat_template_kwargs": {"enable_thinking": True}}, "reasoning"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "deepseek_r1", {}, "reasoning"),
    # llama.cpp's copy of the Qwen distill's template closes the block unless enable_thinking is set.
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseek_r1", {}, "content"),
    (
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        "deepseek_r1",
        {"chat_template_kwargs": {"enable_thinking": True}},
        "reasoning",
    ),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseek_v3", {"chat_template_kwargs": {"thinking": True}}, "reasoning"),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseek_v3", {}, "content"),
    ("GLM-4.6.jinja", "glm45", {}, None),
    ("GLM-4.6.jinja", "glm45", {"chat_template_kwargs": {"enable_thinking": False}}, "content"),
    ("Kimi-K2-Thinking.jinja", "kimi_k2", {}, None),
    ("ByteDance-Seed-OSS.jinja", "seed_oss", {}, None),
    # MiniMax-M3's system prompt shows the tags (`<mm:think></mm:think>`) mid-text: not the end of the prompt.
    ("MiniMax-M3.jinja", "minimax_m3", {}, None),
    ("MiniMax-M3.jinja", "minimax_m3", {"chat_template_kwargs": {"thinking_mode": "enabled"}}, "reasoning"),
    ("MiniMax-M3.jinja", "minimax_m3", {"chat_template_kwargs": {"thinking_mode": "disabled"}}, "content"),
]


@pytest.mark.parametrize(("template", "fmt", "fields", "expected"), TEMPLATE_STARTS, ids=lambda v: str(v)[:40])
def test_where_the_output_starts_is_read_from_the_template(
    template: str, fmt: str, fields: dict, expected: Any
) -> None:
    prompt = _render(template, json.dumps(fields))
    assert start_from_prompt(fmt, prompt) == expected, prompt[-80:]


def test_the_template_opened_case_end_to_end(tok: Any) -> None:
    """DeepSeek-R1's prompt ends with <think>: the output holds only </think>, and a length stop before it is
    flagged, not turned into content."""
    prompt = _render("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "{}")
    ids = tok.encode("Two and two.</think>4", parse_special=True)
    r = split_reasoning(tok, ids, "deepseek_r1", prompt=prompt)
    assert (r.starts, r.reasoning, r.content, r.notes) == ("reasoning", "Two and two.", "4", ())
    cut = split_reasoning(tok, ids[:3], "deepseek_r1", prompt=prompt, finish_reason="length")
    assert cut.content is None and cut.cut_off and cut.reasoning == tok.decode(ids[:3])


PIECES = st.lists(
    st.one_of(
        st.sampled_from(["<think>", "</think>", "<tool_call>"]).map(lambda t: ("tag", t)),
        st.text(st.characters(codec="utf-8", exclude_characters="<"), max_size=12).map(lambda s: ("text", s)),
    ),
    max_size=12,
)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=PIECES, starts=st.sampled_from(["reasoning", "content"]), data=st.data())
def test_any_chunking_gives_the_whole_split_and_loses_only_tags(tok: Any, pieces: list, starts: Any, data: Any) -> None:
    ids: list[int] = []
    for kind, value in pieces:
        ids += [tok.token_to_id(value)] if kind == "tag" else tok.encode(value)
    whole = split_reasoning(tok, ids, "qwen3", starts=starts, finish_reason="stop")
    cuts = sorted(data.draw(st.sets(st.integers(0, len(ids)), max_size=6)))
    chunks = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True)]
    fed = feed_all(tok, ids, "qwen3", chunks, starts=starts, finish_reason="stop")
    assert (fed.reasoning, fed.content, fed.notes, fed.reasoning_complete) == (
        whole.reasoning,
        whole.content,
        whole.notes,
        whole.reasoning_complete,
    )
    assert merged(fed.events) == merged(whole.events)
    # Nothing but the think tags is lost: the text of the other ids, in order, is the events' text.
    tags = {tok.token_to_id("<think>"), tok.token_to_id("</think>")}
    runs, run = [], []
    for i in ids:
        if i in tags:
            runs.append(run)
            run = []
        else:
            run.append(i)
    runs.append(run)
    assert "".join(e.text for e in whole.events) == "".join(tok.decode(r) for r in runs)
    for _kind, text in merged(whole.events):
        assert "<think>" not in text and "</think>" not in text


def test_errors_name_the_format_and_what_to_do(tok: Any) -> None:
    with pytest.raises(ReasoningError, match="unknown reasoning format 'qwen9'") as info:
        ReasoningSplitter(tok, "qwen9")
    assert "qwen3" in info.value.hint and isinstance(info.value, CtxlockError)
    plain = load_hf_dir(fetched.hf_tokenizer_dir("qwen2")).tokenizer  # Qwen2's vocabulary: no <think> token
    with pytest.raises(ReasoningError, match="'<think>' is not one token") as info:
        ReasoningSplitter(plain, "qwen3")
    assert "split_reasoning_text" in info.value.hint
    splitter = ReasoningSplitter(tok, "qwen3")
    splitter.finish()
    with pytest.raises(ReasoningError, match="feed"):
        splitter.feed([1])


# ------------------------------------------------------------------------------------------------- gpt-oss


@pytest.mark.reference
def test_harmony_analysis_is_the_reasoning_as_openai_harmony_parses_it() -> None:
    from openai_harmony import Role, StreamableParser

    from harmony_reference import encoding

    tok = ctxlock.load("gpt-oss").tokenizer
    text = (
        "<|channel|>analysis<|message|>User asks 2+2. Simple: 4.<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Working on it.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"
    )
    ids = tok.encode(text, parse_special=True)
    parser = StreamableParser(encoding(), Role.ASSISTANT)
    for i in ids:
        parser.process(i)
    theirs = {m.channel: m.content[0].text for m in parser.messages}
    whole = split_reasoning(tok, ids, "harmony", finish_reason="stop")
    assert whole.reasoning == theirs["analysis"]
    assert whole.content == theirs["commentary"] + theirs["final"]
    assert any("preamble" in n for n in whole.notes)
    for chunks in chunkings(ids):
        fed = feed_all(tok, ids, "harmony", chunks, finish_reason="stop")
        assert (fed.reasoning, fed.content) == (whole.reasoning, whole.content)
        assert merged(fed.events) == merged(whole.events)
    analysis_end = ids.index(tok.token_to_id("<|end|>"))
    for cut in range(analysis_end):
        r = split_reasoning(tok, ids[:cut], "harmony", finish_reason="length")
        assert r.content is None and (r.cut_off if cut > 3 else True)
    tool = tok.encode(
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>',
        parse_special=True,
    )
    r = split_reasoning(tok, tool, "harmony", finish_reason="stop")
    assert r.content is None and any("functions.get_weather" in n for n in r.notes)


def test_events_are_typed_deltas(tok: Any) -> None:
    ids = tok.encode("<think>a</think>b", parse_special=True)
    assert split_reasoning(tok, ids, "qwen3").events == (ReasoningDelta("a"), ContentDelta("b"))
    assert split_reasoning(tok, ids, "qwen3").to_dict()["notes"] == [
        "no prompt given: starting in reasoning, the qwen3 family's rule"
    ]
