"""fit_context (seed 000 §1.7): invariants under random conversations and budgets, the naive oracle, the clamp."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import artifacts
import ctxlock
from ctxlock.budget import BudgetPolicy, clamp_max_tokens, fit_context, segments
from ctxlock.errors import BudgetError, BudgetExceeded
from ctxlock.request import parse_request
from ctxlock.template import ChatTemplate

WORDS = ["the", "sky", "is", "blue", "天空", "为什么", "code", "def", "x", "Rayleigh", "😀", "\n"]


@pytest.fixture(scope="module")
def qwen() -> tuple[ctxlock.Model, ChatTemplate]:
    model = ctxlock.load(str(artifacts.hf_tokenizer_dir("qwen2")))
    source = (artifacts.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text("utf-8")
    return model, ChatTemplate(source, id="qwen2.5")


def _text(draw, lo: int, hi: int) -> str:
    return " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=lo, max_size=hi)))


@st.composite
def conversations(draw) -> dict:
    msgs: list[dict] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": _text(draw, 1, 20)})
    n_call = 0
    for _ in range(draw(st.integers(0, 7))):
        msgs.append({"role": "user", "content": _text(draw, 1, 40)})
        if draw(st.booleans()):
            calls = []
            for _ in range(draw(st.integers(1, 3))):
                calls.append(
                    {"id": f"c{n_call:08d}", "type": "function", "function": {"name": "f", "arguments": {"q": "x"}}}
                )
                n_call += 1
            msgs.append({"role": "assistant", "content": "", "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "content": _text(draw, 1, 30)})
        msgs.append({"role": "assistant", "content": _text(draw, 1, 40)})
    msgs.append({"role": "user", "content": _text(draw, 1, 20)})
    req: dict = {"messages": msgs}
    if draw(st.booleans()):
        req["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    if draw(st.booleans()):
        req["documents"] = [{"title": f"d{i}", "text": _text(draw, 1, 30)} for i in range(draw(st.integers(1, 3)))]
    return req


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=conversations(), budget=st.integers(20, 900))
def test_invariants_and_the_naive_oracle(qwen, data: dict, budget: int) -> None:
    model, template = qwen
    request = parse_request(data)
    policy = BudgetPolicy(max_input_tokens=budget)
    try:
        fast = fit_context(request, model, policy, template=template)
    except BudgetExceeded as exc:
        with pytest.raises(BudgetExceeded):
            fit_context(request, model, policy, template=template, naive=True)
        required_only = model.encode(_required_only(request), template=template).input_ids.shape[1]
        assert required_only > budget and exc.total == required_only  # rejected only when required alone overflow
        return
    naive = fit_context(request, model, policy, template=template, naive=True)
    assert fast.decisions == naive.decisions
    assert fast.ids == naive.ids
    assert fast.input_tokens <= budget
    msgs = fast.request.messages
    assert request.messages[max(i for i, m in enumerate(request.messages) if m.role == "user")] in msgs
    calls = {c.id for m in msgs for c in (m.tool_calls or ())}
    results = {m.tool_call_id for m in msgs if m.role == "tool"}
    assert results <= calls  # no tool result without its call
    for m in msgs:  # and no call without its results
        for c in m.tool_calls or ():
            assert c.id in results
    assert fast.rendered.text.endswith("<|im_start|>assistant\n")  # exactly one generation prefix, at the end
    assert fast.rendered.text.count("<|im_start|>assistant\n") == sum(1 for m in msgs if m.role == "assistant") + 1
    assert list(fast.model_input.input_ids[0]) == list(fast.ids)


def _required_only(request):
    segs = segments(request)
    from ctxlock.budget import candidate

    return candidate(request, segs, set())


def test_required_overflow_is_rejected_with_sizes(qwen) -> None:
    model, template = qwen
    request = parse_request(
        {"messages": [{"role": "system", "content": "long " * 200}, {"role": "user", "content": "hi"}]}
    )
    with pytest.raises(BudgetExceeded) as info:
        fit_context(request, model, BudgetPolicy(max_input_tokens=50), template=template)
    assert set(info.value.sizes) == {"system", "current"} and info.value.sizes["system"] > 150
    assert info.value.total > 50 and "nothing was dropped" in info.value.hint


def test_decisions_log_and_policy_digest(qwen) -> None:
    model, template = qwen
    msgs = []
    for i in range(6):
        msgs += [
            {"role": "user", "content": f"question {i} " * 10},
            {"role": "assistant", "content": f"answer {i} " * 10},
        ]
    msgs.append({"role": "user", "content": "last"})
    request = parse_request({"messages": msgs})
    policy = BudgetPolicy(context_window=300, reserve_output_tokens=100)
    fitted = fit_context(request, model, policy, template=template)
    assert fitted.budget == 200 and fitted.input_tokens <= 200
    kept = [d.segment for d in fitted.decisions if d.kept and d.reason == "fits"]
    dropped = [d.segment for d in fitted.decisions if not d.kept]
    assert kept and dropped
    # Recency: everything kept is newer than everything dropped.
    assert min(int(s.split("[")[1].split(":")[0]) for s in kept) > max(
        int(s.split("[")[1].split(":")[0]) for s in dropped
    )
    assert len(policy.sha256) == 64 and BudgetPolicy.from_dict(policy.to_dict()) == policy


def test_policy_validation() -> None:
    with pytest.raises(BudgetError):
        BudgetPolicy()
    with pytest.raises(BudgetError):
        BudgetPolicy(max_input_tokens=10, context_window=20)


def test_clamp_max_tokens() -> None:
    assert clamp_max_tokens(32768, 20000, 8000) == 8000
    assert clamp_max_tokens(32768, 30000, 8000) == 2768
    assert clamp_max_tokens(32768, 20000, None, margin_tokens=4096) == 8672
    assert clamp_max_tokens(32768, 20000, 20000, margin_fraction=0.1) == 10768  # margin 10% of 20,000
    with pytest.raises(BudgetExceeded):
        clamp_max_tokens(32768, 32000, 1000, margin_tokens=4096)


def test_fit_cli_json_and_record(tmp_path) -> None:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "long-chat.json"
    env = {**os.environ, "CTXLOCK_DATA_DIR": str(tmp_path / "store")}
    args = [sys.executable, "-m", "ctxlock", "fit", str(example), "--model", str(artifacts.hf_tokenizer_dir("qwen2"))]
    proc = subprocess.run([*args, "--max-input-tokens", "600", "--json"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["input_tokens"] == len(out["input_ids"]) <= 600
    assert {"segment", "kept", "tokens", "reason"} <= set(out["decisions"][0])
    assert any(not d["kept"] for d in out["decisions"])
    human = subprocess.run(
        [*args, "--context-window", "1000", "--reserve-output", "400", "--record"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert human.returncode == 0 and "dropped" in human.stdout and "record " in human.stdout
    too_small = subprocess.run([*args, "--max-input-tokens", "10"], capture_output=True, text=True, env=env)
    assert too_small.returncode == 1 and "BudgetExceeded" in too_small.stderr and "Traceback" not in too_small.stderr


# -- the incremental counter on its own: edits anywhere, control tokens that are prefixes of one another ----------

# Llama 3's control tokens share long prefixes (`<|reserved_special_token_1|>`, `..._10|>`, `..._100|>`;
# `<|eot_id|>` and `<|end_of_text|>`), and the pieces can build or break one across an edit boundary.
PIECES = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|reserved_special_token_1|>",
    "<|reserved_special_token_10|>",
    "<|reserved_special_token_100|>",
    "<|",
    "|>",
    "<|eot",
    "_id|>",
    "reserved_special_token_1",
    "0|>",
    "user",
    " hello",
    "\n\n",
    " ",
    "天空",
    "😀",
    "é",
    "x",
]


@pytest.fixture(scope="module")
def llama_tok():
    return ctxlock.load(str(artifacts.gguf_path("llama-bpe"))).tokenizer


@st.composite
def edits(draw) -> tuple[str, str]:
    base = draw(st.lists(st.sampled_from(PIECES), max_size=40))
    cand = list(base)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(cand)))
        j = draw(st.integers(i, min(len(cand), i + 4)))
        cand[i:j] = draw(st.lists(st.sampled_from(PIECES), max_size=6))
    return "".join(base), "".join(cand)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=edits())
def test_incremental_count_equals_a_full_tokenization(llama_tok, pair: tuple[str, str]) -> None:
    from types import SimpleNamespace

    from ctxlock.budget import _RunCache

    base, cand = pair
    cache = _RunCache(llama_tok)
    assert cache.plain
    cache.rebase(SimpleNamespace(text=base, untrusted=()))
    expected = len(llama_tok.encode(cand, parse_special=True))
    assert len(cache.encode(SimpleNamespace(text=cand, untrusted=()))) == expected
    assert cache.count(SimpleNamespace(text=cand, untrusted=())) == expected


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=conversations(), budget=st.integers(40, 900))
def test_the_naive_oracle_on_llama3(llama_tok, data: dict, budget: int) -> None:
    # A second template family: Llama 3.1's headers, a tools preamble in the first user turn, ipython results.
    model = ctxlock.load(str(artifacts.gguf_path("llama-bpe")))
    source = (artifacts.templates_dir() / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text("utf-8")
    template = ChatTemplate(source, id="llama3.1")
    request = parse_request(data)
    policy = BudgetPolicy(max_input_tokens=budget)
    try:
        fast = fit_context(request, model, policy, template=template)
    except BudgetExceeded:
        with pytest.raises(BudgetExceeded):
            fit_context(request, model, policy, template=template, naive=True)
        return
    naive = fit_context(request, model, policy, template=template, naive=True)
    assert fast.decisions == naive.decisions
    assert fast.ids == naive.ids
    assert fast.input_tokens <= budget
