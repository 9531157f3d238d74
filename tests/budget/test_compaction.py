"""Compaction planning (Pi's semantics) with a real tokenizer and template: Qwen2's vocabulary and Qwen2.5's template.

The oracle for sizes is the definition itself: message i costs T(i+1) - T(i), T(i) being the token count of
`messages[:i]` rendered and tokenized in full. `reference_cut` walks back one message at a time, as Pi does.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import ctxlock
import fetched
from ctxlock.budget._compaction import (
    DEFAULT_KEEP_RECENT_TOKENS,
    DEFAULT_RESERVE_TOKENS,
    SPLIT_TURN_SEPARATOR,
    SUMMARY_PREFIX,
    SUMMARY_SUFFIX,
    SUMMARY_TOKENS_TOLERANCE,
    CompactionPlan,
    apply_compaction,
    compaction_event,
    message_tokens,
    plan_compaction,
    should_compact,
)
from ctxlock.cli.compaction import register
from ctxlock.errors import BudgetError
from ctxlock.request import Request
from ctxlock.settings import reference_path
from ctxlock.template._render import ChatTemplate
from hypothesis_profiles import examples

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega"]
QWEN_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"


@pytest.fixture(scope="module")
def qwen() -> tuple[ctxlock.Model, ChatTemplate]:
    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    source = (fetched.templates_dir() / QWEN_TEMPLATE).read_text("utf-8")
    return model, ChatTemplate(source, id=QWEN_TEMPLATE)


@pytest.fixture(scope="module")
def nemo() -> ctxlock.Model:
    return ctxlock.load()


# ------------------------------------------------------------------------------------------------ builders


def text(n: int, seed: int = 0) -> str:
    return " ".join(WORDS[(seed + k * 7) % len(WORDS)] for k in range(n))


class Conversation:
    """Builds OpenAI-style messages; tool call ids are 9 characters (Mistral's templates require it)."""

    def __init__(self, system: str | None = "You are a careful assistant.") -> None:
        self.messages: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
        self.calls = 0

    def user(self, words: int) -> Conversation:
        self.messages.append({"role": "user", "content": text(words, len(self.messages))})
        return self

    def say(self, words: int) -> Conversation:
        self.messages.append({"role": "assistant", "content": text(words, len(self.messages))})
        return self

    def tools(self, *result_words: int) -> Conversation:
        ids = []
        for _ in result_words:
            self.calls += 1
            ids.append(f"call{self.calls:05d}")
        calls = [
            {"id": i, "type": "function", "function": {"name": "search", "arguments": json.dumps({"q": i})}}
            for i in ids
        ]
        self.messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for i, words in zip(ids, result_words, strict=True):
            self.messages.append({"role": "tool", "tool_call_id": i, "content": text(words, len(self.messages))})
        return self

    def request(self) -> Request:
        return ctxlock.parse_request({"messages": self.messages})


def prefix_count(model: ctxlock.Model, template: ChatTemplate | None, req: Request, i: int) -> int:
    if i == 0:
        return 0
    prefix = dataclasses.replace(req, messages=req.messages[:i])
    return len(model.run(prefix, chat_template=template, add_generation_prompt=False, provenance=False).tokenized.ids)


def reference_sizes(model: ctxlock.Model, template: ChatTemplate | None, req: Request) -> list[int]:
    t = [prefix_count(model, template, req, i) for i in range(len(req.messages) + 1)]
    return [t[i + 1] - t[i] for i in range(len(req.messages))]


def reference_cut(req: Request, sizes: list[int], keep: int) -> tuple[int, bool]:
    """The cut by the letter of the rules, walking back one message at a time."""
    roles = [m.role for m in req.messages]
    n = len(roles)
    conv = [k for k in range(n) if roles[k] not in ("system", "developer")]
    if not conv:
        return n, False
    first = conv[0]
    acc, i = 0, None
    for k in range(n - 1, first - 1, -1):
        acc += sizes[k]
        if acc >= keep:
            i = k
            break
    if i is None:
        return first, False
    user_start = next((k for k in range(i, first - 1, -1) if roles[k] == "user"), None)
    start = first if user_start is None else user_start
    end = next((k for k in range(i + 1, n) if roles[k] == "user"), n)
    if sum(sizes[start:end]) <= keep:
        return start, False
    valid = [c for c in range(start + 1, end) if roles[c] in ("user", "assistant")]
    after = [c for c in valid if c >= i]
    before = [c for c in valid if c < i]
    cut = after[0] if after else (before[-1] if before else start)
    return cut, cut != start and user_start is not None


def check_partition(req: Request, plan: CompactionPlan) -> None:
    roles = [m.role for m in req.messages]
    conv = [k for k, r in enumerate(roles) if r not in ("system", "developer")]
    kept = [k for k in conv if k >= plan.first_kept_index]
    parts = [*plan.messages_to_summarize, *plan.turn_prefix_to_summarize, *kept]
    assert parts == conv  # in order, disjoint, complete
    if plan.first_kept_index < len(roles):
        assert roles[plan.first_kept_index] in ("user", "assistant")
    # No kept tool result without its call: every kept result's call id is in a kept assistant message.
    kept_calls = {tc.id for m in req.messages[plan.first_kept_index :] for tc in (m.tool_calls or ())}
    for m in req.messages[plan.first_kept_index :]:
        if m.role == "tool":
            assert m.tool_call_id in kept_calls
    if plan.split_turn:
        assert plan.turn_prefix_to_summarize
        assert roles[plan.turn_prefix_to_summarize[0]] == "user"
        assert roles[plan.first_kept_index] == "assistant"
    else:
        assert plan.turn_prefix_to_summarize == ()


def summary_of(model: ctxlock.Model, n: int) -> str:
    """A text that encodes to exactly n tokens on its own."""
    out = "alpha" + " alpha" * (n - 1)
    assert len(model.tokenizer.encode(out)) == n
    return out


# ------------------------------------------------------------------------------------------------ trigger


def test_should_compact_is_pis_threshold() -> None:
    assert DEFAULT_RESERVE_TOKENS == 16384 and DEFAULT_KEEP_RECENT_TOKENS == 20000
    assert not should_compact(128000 - 16384, 128000)
    assert should_compact(128000 - 16384 + 1, 128000)
    assert should_compact(101, 200, reserve_tokens=100)
    assert not should_compact(100, 200, reserve_tokens=100)
    assert should_compact(1, 100, reserve_tokens=100)  # the reserve takes the whole window
    with pytest.raises(BudgetError, match="reserve_tokens"):
        should_compact(10, 100, reserve_tokens=-1)
    with pytest.raises(BudgetError, match="context_window"):
        should_compact(10, 0)


# ------------------------------------------------------------------------------------------------ exact sizes


def test_message_tokens_are_exact_prefix_differences(qwen: Any, nemo: ctxlock.Model) -> None:
    conv = Conversation().user(30).tools(40, 5, 60).say(12).user(8).tools(25).say(30).user(9)
    req = conv.request()
    model, template = qwen
    assert message_tokens(req, model, chat_template=template) == dict(enumerate(reference_sizes(model, template, req)))
    # Mistral's template moves the system prompt next to the last user message: prefixes are not prefixes of the
    # full render, so the counter tokenizes them, and stays exact.
    assert message_tokens(req, nemo) == dict(enumerate(reference_sizes(nemo, None, req)))


def test_plan_counts_are_exact(qwen: Any) -> None:
    model, template = qwen
    req = Conversation().user(50).tools(80, 80).say(20).user(40).say(60).user(30).tools(90).say(10).request()
    plan = plan_compaction(req, model, context_window=4096, keep_recent_tokens=150, chat_template=template)
    assert plan.tokens_before == len(model.run(req, chat_template=template).tokenized.ids)
    sizes = reference_sizes(model, template, req)
    assert plan.kept_tokens == sum(sizes[plan.first_kept_index :])


# ------------------------------------------------------------------------------------------------ the cut


def test_nothing_to_summarize_when_everything_fits(qwen: Any) -> None:
    model, template = qwen
    req = Conversation().user(10).say(10).user(10).request()
    plan = plan_compaction(req, model, context_window=32768, chat_template=template)
    assert plan.summarizes_nothing and plan.to_dict()["summarizes_nothing"] is True
    assert plan.first_kept_index == 1  # the first non-system message
    assert plan.messages_to_summarize == () and plan.turn_prefix_to_summarize == () and not plan.split_turn
    assert plan.estimated_tokens_after == plan.tokens_before
    assert apply_compaction(req, plan, "unused") is req
    # No system message: the first kept index is 0.
    bare = Conversation(system=None).user(10).say(10).request()
    assert plan_compaction(bare, model, context_window=32768, chat_template=template).first_kept_index == 0


def test_cut_moves_back_to_the_user_turn_boundary(qwen: Any) -> None:
    model, template = qwen
    conv = Conversation()
    for _ in range(5):
        conv.user(20).tools(30).say(20)
    req = conv.request()
    sizes = reference_sizes(model, template, req)
    # keep_recent_tokens reached in the middle of the fourth turn (at its tool result): the turn fits, so the cut
    # is that turn's user message.
    turn4 = 1 + 3 * 4
    keep = sum(sizes[turn4 + 2 :]) + 1
    plan = plan_compaction(req, model, context_window=4096, keep_recent_tokens=keep, chat_template=template)
    assert plan.first_kept_index == turn4
    assert req.messages[turn4].role == "user"
    assert not plan.split_turn
    assert plan.messages_to_summarize == tuple(range(1, turn4))
    assert plan.kept_tokens >= keep
    check_partition(req, plan)


def test_split_turn_when_one_turn_exceeds_keep_recent(qwen: Any) -> None:
    model, template = qwen
    req = Conversation().user(20).say(20).user(15).tools(300).tools(300).say(40).request()
    # messages: 0 system, 1 user, 2 assistant, 3 user, 4 call, 5 result, 6 call, 7 result, 8 assistant
    sizes = reference_sizes(model, template, req)
    keep = sizes[7] + sizes[8] + 10  # not reached at 7, reached at 6 (the second call)
    plan = plan_compaction(req, model, context_window=4096, keep_recent_tokens=keep, chat_template=template)
    # The turn 3..8 is far larger than keep: it is split at 6, a valid point (the call keeps its result).
    assert plan.split_turn
    assert plan.first_kept_index == 6
    assert plan.turn_prefix_to_summarize == (3, 4, 5)
    assert plan.messages_to_summarize == (1, 2)
    check_partition(req, plan)
    assert (plan.first_kept_index, plan.split_turn) == reference_cut(req, sizes, keep)


def test_cut_never_at_a_tool_result(qwen: Any) -> None:
    model, template = qwen
    # One call with several results; keep_recent_tokens is reached at each of them in turn.
    req = Conversation().user(10).say(10).user(10).tools(120, 120, 120, 120).tools(100).say(10).request()
    # 0 sys, 1 user, 2 asst, 3 user, 4 call x4, 5-8 results, 9 call, 10 result, 11 assistant
    sizes = reference_sizes(model, template, req)
    for crossing in (5, 6, 7, 8):
        keep = sum(sizes[crossing:])
        plan = plan_compaction(req, model, context_window=8192, keep_recent_tokens=keep, chat_template=template)
        # The turn 3..11 is larger than keep: the cut is the first valid point at or after the crossing, the
        # second call (9), never one of the results 5-8, and never between call 4 and its results.
        assert plan.first_kept_index == 9, crossing
        assert plan.split_turn and plan.turn_prefix_to_summarize == (3, 4, 5, 6, 7, 8)
        check_partition(req, plan)
    # Reached inside the final results with nothing valid after them: the cut falls back to their call.
    tail = Conversation().user(10).say(10).user(10).say(10).tools(200, 200, 200).request()
    # 0 sys, 1 user, 2 asst, 3 user, 4 asst, 5 call, 6-8 results
    tail_sizes = reference_sizes(model, template, tail)
    plan = plan_compaction(
        tail, model, context_window=8192, keep_recent_tokens=tail_sizes[8] + 1, chat_template=template
    )
    assert plan.first_kept_index == 5 and plan.split_turn
    assert plan.turn_prefix_to_summarize == (3, 4)
    check_partition(tail, plan)


def test_system_and_developer_messages_are_never_summarized(qwen: Any) -> None:
    model, template = qwen
    conv = Conversation().user(40).say(40)
    conv.messages.append({"role": "system", "content": "Mid-conversation instruction."})
    conv.user(40).say(40).user(40).say(40)
    req = conv.request()
    # messages: 0 system, 1 user, 2 assistant, 3 system, 4 user, 5 assistant, 6 user, 7 assistant
    keep = sum(reference_sizes(model, template, req)[6:])  # reached at 6
    plan = plan_compaction(req, model, context_window=4096, keep_recent_tokens=keep, chat_template=template)
    assert plan.first_kept_index == 6 and not plan.split_turn
    assert plan.messages_to_summarize == (1, 2, 4, 5)
    check_partition(req, plan)
    out = apply_compaction(req, plan, "s")
    assert [m.role for m in out.messages[:3]] == ["system", "system", "user"]
    assert out.messages[1].content == "Mid-conversation instruction."


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_conversations_cut_at_valid_points(qwen: Any, data: st.DataObject) -> None:
    model, template = qwen
    conv = Conversation(system=data.draw(st.sampled_from([None, "sys"])))
    if data.draw(st.booleans()):
        conv.say(data.draw(st.integers(1, 30)))  # a preamble before the first user message
    for _ in range(data.draw(st.integers(1, 4))):
        conv.user(data.draw(st.integers(1, 60)))
        for _ in range(data.draw(st.integers(0, 3))):
            if data.draw(st.booleans()):
                conv.tools(*data.draw(st.lists(st.integers(1, 80), min_size=1, max_size=3)))
            else:
                conv.say(data.draw(st.integers(1, 40)))
    req = conv.request()
    sizes = reference_sizes(model, template, req)
    keep = data.draw(st.integers(0, sum(sizes) + 20))
    summary_tokens = data.draw(st.integers(2, 120))
    plan = plan_compaction(
        req, model, context_window=8192, keep_recent_tokens=keep, summary_tokens=summary_tokens, chat_template=template
    )
    check_partition(req, plan)
    assert (plan.first_kept_index, plan.split_turn) == reference_cut(req, sizes, keep)
    assert plan.kept_tokens == sum(sizes[plan.first_kept_index :])
    if not plan.summarizes_nothing:
        # The summary (both summaries, for a split turn) has summary_tokens tokens in all.
        half = summary_tokens // 2 if plan.split_turn else summary_tokens
        first = summary_of(model, half)
        second = summary_of(model, summary_tokens - half) if plan.split_turn else None
        out = apply_compaction(req, plan, first, turn_prefix_summary=second)
        exact = len(model.run(out, chat_template=template).tokenized.ids)
        assert abs(exact - plan.estimated_tokens_after) <= SUMMARY_TOKENS_TOLERANCE


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_plans_are_the_same_on_the_reference_path(qwen: Any, nemo: ctxlock.Model, data: st.DataObject) -> None:
    # The counting service against the tokenizer stage itself (CTXLOCK_FAST=0): the same plan and sizes, on Qwen's
    # template (prefixes of the full render) and on Mistral's (prefixes that are not).
    use_qwen = data.draw(st.booleans(), label="qwen")
    model, template = qwen if use_qwen else (nemo, None)
    conv = Conversation(system=data.draw(st.sampled_from([None, "sys"])))
    for _ in range(data.draw(st.integers(1, 4))):
        conv.user(data.draw(st.integers(1, 60)))
        for _ in range(data.draw(st.integers(0, 2 if use_qwen else 1))):  # Mistral's roles alternate
            if use_qwen and data.draw(st.booleans()):
                conv.tools(*data.draw(st.lists(st.integers(1, 80), min_size=1, max_size=2)))
            else:
                conv.say(data.draw(st.integers(1, 40)))
    req = conv.request()
    keep = data.draw(st.integers(0, 400))
    fast = plan_compaction(req, model, context_window=8192, keep_recent_tokens=keep, chat_template=template)
    sizes = message_tokens(req, model, chat_template=template)
    with reference_path():
        assert plan_compaction(req, model, context_window=8192, keep_recent_tokens=keep, chat_template=template) == fast
        assert message_tokens(req, model, chat_template=template) == sizes


def test_sizes_on_a_vocabulary_with_stripping_control_tokens() -> None:
    # Phi-3's rstrip control tokens take the whitespace after them: the counting service widens its split the same
    # way, and the sizes are the reference path's.
    model = ctxlock.load(str(fetched.gguf_path("phi-3")))
    assert any(t.rstrip for t in model.tokenizer.added_tokens if t.control)
    conv = {
        "messages": [
            {"role": "user", "content": "  Why is the sky blue?\n"},
            {"role": "assistant", "content": "\n Rayleigh scattering. "},
            {"role": "user", "content": "\tAnd at sunset? "},
            {"role": "assistant", "content": "Longer paths."},
            {"role": "user", "content": " Thanks "},
        ]
    }
    fast = plan_compaction(conv, model, context_window=4096, keep_recent_tokens=12)
    sizes = message_tokens(conv, model)
    with reference_path():
        assert plan_compaction(conv, model, context_window=4096, keep_recent_tokens=12) == fast
        assert message_tokens(conv, model) == sizes
    assert fast.tokens_before == len(model.run(conv).tokenized.ids)


# ------------------------------------------------------------------------------------------------ applying


@pytest.mark.parametrize("summary_tokens", [50, 400])
def test_apply_lands_within_tolerance_of_the_estimate(qwen: Any, summary_tokens: int) -> None:
    model, template = qwen
    req = Conversation().user(60).tools(90, 40).say(30).user(50).say(50).user(20).tools(80).say(20).request()
    # 0 system, 1 user, 2 call, 3-4 results, 5 assistant, 6 user, 7 assistant, 8 user, 9 call, 10 result, 11 ...
    sizes = reference_sizes(model, template, req)
    keep = sum(sizes[8:]) + sizes[7] // 2  # reached at 7; its turn 6..7 fits: the cut moves back to 6
    plan = plan_compaction(
        req, model, context_window=4096, keep_recent_tokens=keep, summary_tokens=summary_tokens, chat_template=template
    )
    assert plan.first_kept_index == 6 and not plan.split_turn
    out = apply_compaction(req, plan, summary_of(model, summary_tokens))
    assert out.messages[0] == req.messages[0]
    assert out.messages[1].role == "user"
    assert out.messages[1].content.startswith(SUMMARY_PREFIX) and out.messages[1].content.endswith(SUMMARY_SUFFIX)
    assert out.messages[2:] == req.messages[plan.first_kept_index :]
    exact = len(model.run(out, chat_template=template).tokenized.ids)
    assert abs(exact - plan.estimated_tokens_after) <= SUMMARY_TOKENS_TOLERANCE
    assert (exact < plan.tokens_before) == (summary_tokens == 50)  # 400 is more than the 5 messages it replaces


def test_estimate_with_a_structured_summary(qwen: Any, nemo: ctxlock.Model) -> None:
    pi_summary = (
        "## Goal\n- Fix the failing `test_compaction.py::test_cut` in src/ctxlock/compaction.py\n\n"
        "## Progress\n### Done\n- [x] Found the off-by-one in `_walk_back`\n\n## Next Steps\n1. Re-run pytest."
    )
    conv = Conversation()
    for _ in range(3):
        conv.user(40).tools(60, 20).say(30)
    req = conv.request()
    for m, tpl in ((qwen[0], qwen[1]), (nemo, None)):
        n = len(m.tokenizer.encode(pi_summary))
        sizes = reference_sizes(m, tpl, req)
        keep = sum(sizes[-5:])  # the last turn exactly: cut at its user message
        plan = plan_compaction(
            req, m, context_window=4096, keep_recent_tokens=keep, summary_tokens=n, chat_template=tpl
        )
        assert not plan.split_turn and plan.first_kept_index == len(sizes) - 5
        exact = len(m.run(apply_compaction(req, plan, pi_summary), chat_template=tpl).tokenized.ids)
        assert abs(exact - plan.estimated_tokens_after) <= SUMMARY_TOKENS_TOLERANCE


def test_apply_split_turn_merges_both_summaries(qwen: Any, nemo: ctxlock.Model) -> None:
    model, template = qwen
    conv = Conversation().user(20).say(20).user(15).tools(300).tools(300).say(40)
    for m, tpl in ((model, template), (nemo, None)):
        req = conv.request()
        # 0 system, 1 user, 2 assistant, 3 user, 4 call, 5 result, 6 call, 7 result, 8 assistant
        keep = sum(reference_sizes(m, tpl, req)[6:])  # reached at 6, inside the oversized turn 3..8
        plan = plan_compaction(
            req, m, context_window=4096, keep_recent_tokens=keep, summary_tokens=60, chat_template=tpl
        )
        assert plan.split_turn and plan.first_kept_index == 6
        history, prefix = summary_of(m, 30), summary_of(m, 30)
        with pytest.raises(BudgetError, match="turn_prefix_summary"):
            apply_compaction(req, plan, history)
        out = apply_compaction(req, plan, history, turn_prefix_summary=prefix)
        assert out.messages[1].content == f"{SUMMARY_PREFIX}{history}{SPLIT_TURN_SEPARATOR}{prefix}{SUMMARY_SUFFIX}"
        assert out.messages[2:] == req.messages[plan.first_kept_index :]
        assert out.messages[2].role == "assistant" and out.messages[3].role == "tool"
        exact = len(m.run(out, chat_template=tpl).tokenized.ids)
        assert abs(exact - plan.estimated_tokens_after) <= SUMMARY_TOKENS_TOLERANCE, m


def test_apply_on_the_default_model(nemo: ctxlock.Model) -> None:
    conv = Conversation()
    for _ in range(4):
        conv.user(40).tools(60).say(30)
    req = conv.request()
    plan = plan_compaction(req, nemo, context_window=1024, keep_recent_tokens=200, summary_tokens=80)
    assert not plan.split_turn and req.messages[plan.first_kept_index].role == "user"
    out = apply_compaction(req, plan, summary_of(nemo, 80))
    exact = len(nemo.run(out).tokenized.ids)
    assert abs(exact - plan.estimated_tokens_after) <= SUMMARY_TOKENS_TOLERANCE


def test_apply_rejects_a_plan_for_another_request(qwen: Any) -> None:
    model, template = qwen
    req = Conversation().user(30).say(30).user(30).say(30).user(30).request()
    keep = reference_sizes(model, template, req)[5]  # reached at the last user message
    plan = plan_compaction(req, model, context_window=4096, keep_recent_tokens=keep, chat_template=template)
    assert plan.first_kept_index == 5 and not plan.split_turn
    with pytest.raises(BudgetError, match="only for a plan that splits"):
        apply_compaction(req, plan, "s", turn_prefix_summary="t")
    short = Conversation().user(5).request()
    with pytest.raises(BudgetError, match="does not fit"):
        apply_compaction(short, plan, "s")


# ------------------------------------------------------------------------------------------------ events


def test_compaction_event_shapes(qwen: Any) -> None:
    model, template = qwen
    req = Conversation().user(30).say(30).user(30).say(30).user(30).request()
    plan = plan_compaction(req, model, context_window=4096, keep_recent_tokens=40, chat_template=template)
    event = compaction_event(plan, reason="threshold", summary="Summary of conversation...")
    assert list(event) == ["type", "reason", "result", "aborted", "willRetry"]
    assert event["type"] == "compaction_end" and event["aborted"] is False and event["willRetry"] is False
    result = event["result"]
    assert set(result) == {"summary", "firstKeptEntryId", "tokensBefore", "estimatedTokensAfter", "details"}
    assert result["firstKeptEntryId"] == f"messages[{plan.first_kept_index}]"
    assert result["tokensBefore"] == plan.tokens_before
    assert result["estimatedTokensAfter"] == plan.estimated_tokens_after
    assert result["details"]["messagesToSummarize"] == list(plan.messages_to_summarize)
    json.dumps(event)  # one JSON line

    aborted = compaction_event(plan, reason="manual", summary=None, aborted=True)
    assert "result" not in aborted and aborted["aborted"] is True and aborted["willRetry"] is False

    retry = compaction_event(plan, reason="overflow", summary="s", will_retry=True)
    assert retry["willRetry"] is True and "result" in retry

    with pytest.raises(BudgetError, match="unknown compaction reason"):
        compaction_event(plan, reason="timeout", summary="s")
    with pytest.raises(BudgetError, match="will_retry"):
        compaction_event(plan, reason="threshold", summary="s", will_retry=True)
    with pytest.raises(BudgetError, match="summary"):
        compaction_event(plan, reason="manual", summary=None)


def test_plan_to_dict_is_json(qwen: Any) -> None:
    model, template = qwen
    req = Conversation().user(30).say(30).user(30).request()
    d = plan_compaction(req, model, context_window=4096, keep_recent_tokens=20, chat_template=template).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert {"messages_to_summarize", "turn_prefix_to_summarize", "first_kept_index", "split_turn"} <= set(d)
    with pytest.raises(BudgetError, match="keep_recent_tokens"):
        plan_compaction(req, model, context_window=4096, keep_recent_tokens=-5, chat_template=template)


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_compact_plan_json(tmp_path: Any, nemo: ctxlock.Model) -> None:
    app = typer.Typer()
    register(app)

    @app.command()
    def noop() -> None:  # a second command, so typer keeps `compact-plan` as a subcommand
        pass

    conv = Conversation()
    for _ in range(4):
        conv.user(40).tools(60).say(30)
    path = tmp_path / "req.json"
    path.write_text(json.dumps({"messages": conv.messages}), "utf-8")
    runner = CliRunner()
    args = ["compact-plan", str(path), "--context-window", "600", "--reserve-tokens", "100"]
    result = runner.invoke(app, [*args, "--keep-recent-tokens", "200", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    plan = plan_compaction(conv.request(), nemo, context_window=600, reserve_tokens=100, keep_recent_tokens=200)
    assert out["should_compact"] is True
    extra = (
        "should_compact",
        "context_window",
        "helps",
        "problems",
        "first_kept_entry_id",
        "first_kept_entry_id_source",
    )
    # No message carries an id: the first kept entry is named by its JSON path, and the output says so.
    assert (out["first_kept_entry_id"], out["first_kept_entry_id_source"]) == (
        f"messages[{plan.first_kept_index}]",
        "json_path",
    )
    assert {k: v for k, v in out.items() if k not in extra} == plan.to_dict()

    human = runner.invoke(app, [*args, "--keep-recent-tokens", "200"])
    assert human.exit_code == 0, human.output
    assert "should compact" in human.stdout and "split turn" in human.stdout and "estimated after" in human.stdout

    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [{"role": "user"}]}', "utf-8")
    failed = runner.invoke(app, ["compact-plan", str(bad), "--context-window", "600", "--json"])
    assert failed.exit_code != 0
    assert json.loads(failed.stdout)["error"]["type"] == "RequestValidationError"


def test_cli_says_when_a_plan_does_not_help(nemo: ctxlock.Model) -> None:
    """Issue 16 item 6: the README's example planned 1,094 -> 1,400 tokens in a 1,200-token window, silently."""
    from pathlib import Path

    app = typer.Typer()
    register(app)

    @app.command()
    def noop() -> None:  # a second command, so typer keeps `compact-plan` as a subcommand
        pass

    example = Path(__file__).resolve().parents[2] / "examples" / "long-chat.json"
    args = ["compact-plan", str(example), "--context-window", "1200", "--reserve-tokens", "200"]
    args += ["--keep-recent-tokens", "300"]
    runner = CliRunner()
    out = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert (out["tokens_before"], out["estimated_tokens_after"]) == (1094, 1400)
    assert out["helps"] is False and len(out["problems"]) == 2
    assert "does not shrink" in out["problems"][0] and "over the context window 1,200" in out["problems"][1]
    human = runner.invoke(app, args)
    assert human.exit_code == 0 and "does not help" in human.stdout and "1,400 >= tokens before 1,094" in human.stdout
    checked = runner.invoke(app, [*args, "--check", "--json"])
    assert checked.exit_code == 1 and json.loads(checked.stdout)["helps"] is False
    # The failed check is one line on stderr, as every failure is.
    assert checked.stderr.startswith("error: check: the plan does not help: ") and checked.stderr.count("\n") == 1
    # A summary small enough makes the same cut help: exit 0 under --check.
    small = runner.invoke(app, [*args, "--summary-tokens", "200", "--check"])
    assert small.exit_code == 0 and "the plan helps" in small.stdout
    # Compaction due, nothing to summarize: that does not help either.
    from ctxlock.budget._compaction import plan_problems

    req = json.loads(example.read_text("utf-8"))
    plan = plan_compaction(req, nemo, context_window=1200, reserve_tokens=200, keep_recent_tokens=5000)
    assert plan.summarizes_nothing and "nothing can be summarized" in plan_problems(plan, 1200)[0]
    # Still over window - reserve after compacting, though smaller.
    plan = plan_compaction(
        req, nemo, context_window=1200, reserve_tokens=200, keep_recent_tokens=300, summary_tokens=650
    )
    assert plan.estimated_tokens_after < plan.tokens_before
    assert plan_problems(plan, 1200) == (
        f"estimated after {plan.estimated_tokens_after:,} is still over the compaction threshold 1,000 "
        "(window 1,200 - reserve 200)",
    )
    not_due = plan_compaction(req, nemo, context_window=100_000, reserve_tokens=200, keep_recent_tokens=5000)
    assert plan_problems(not_due, 100_000) == ()


def test_python_and_cli_take_the_same_entry_ids(nemo: ctxlock.Model) -> None:
    """examples/greet-session.json carries entry ids on its messages: Python's `plan_compaction` takes them as
    `compact-plan` does (read and removed before parsing; a bad one is the same BudgetError in both), as bytes, text
    or a dict, and the plans are the CLI's."""
    from pathlib import Path

    from ctxlock.request._entry_ids import strip_entry_ids, take_entry_ids

    path = Path(__file__).parents[2] / "examples" / "greet-session.json"
    data = path.read_bytes()
    raw = json.loads(data)
    kwargs = {"context_window": 1000, "reserve_tokens": 200, "keep_recent_tokens": 400, "summary_tokens": 40}
    plans = [plan_compaction(r, nemo, **kwargs) for r in (data, data.decode("utf-8"), raw)]
    assert plans[0] == plans[1] == plans[2]
    assert raw["messages"][0]["id"] == "e00"  # the caller's object is not changed
    app = typer.Typer()
    register(app)

    @app.command()
    def other() -> None:  # a second command, so that typer keeps `compact-plan` as a named subcommand
        """unused"""

    args = ["compact-plan", str(path), "--json", *(f"--{k.replace('_', '-')}={v}" for k, v in kwargs.items())]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    cli = json.loads(out.output)
    assert cli["first_kept_entry_id"] == take_entry_ids(data)[1][plans[0].first_kept_index]
    for key in ("messages_to_summarize", "first_kept_index", "tokens_before", "estimated_tokens_after"):
        assert cli[key] == plans[0].to_dict()[key], (key, cli)
    bad = {"messages": [{"id": 7, "role": "user", "content": "hi"}]}
    with pytest.raises(BudgetError, match="entry id") as e:
        plan_compaction(bad, nemo, **kwargs)
    assert e.value.path == "messages[0].id"
    assert strip_entry_ids(bad | {"messages": []}) == (bad | {"messages": []}, {})
