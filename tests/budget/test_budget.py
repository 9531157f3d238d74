"""fit_context (seed 000 §1.7): invariants under random conversations and budgets, the naive oracle, the clamp."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from cli_runner import run_main
from ctxlock.budget._fit import BudgetPolicy, clamp_max_tokens, fit_context, segments
from ctxlock.errors import BudgetError, BudgetExceeded
from ctxlock.request import parse_request
from ctxlock.settings import reference_path
from ctxlock.template._render import ChatTemplate, InjectionPolicy
from hypothesis_profiles import examples

WORDS = ["the", "sky", "is", "blue", "天空", "为什么", "code", "def", "x", "Rayleigh", "😀", "\n"]


@pytest.fixture(scope="module")
def qwen() -> tuple[ctxlock.Model, ChatTemplate]:
    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    source = (fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text("utf-8")
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


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=conversations(), budget=st.integers(20, 900))
def test_invariants_and_the_naive_oracle(qwen, data: dict, budget: int) -> None:
    model, template = qwen
    request = parse_request(data)
    policy = BudgetPolicy(max_input_tokens=budget)
    try:
        fast = fit_context(request, model, policy, chat_template=template)
    except BudgetExceeded as exc:
        with pytest.raises(BudgetExceeded):
            fit_context(request, model, policy, chat_template=template, naive=True)
        required_only = model.encode(_required_only(request), chat_template=template).input_ids.shape[1]
        assert required_only > budget and exc.total == required_only  # rejected only when required alone overflow
        return
    naive = fit_context(request, model, policy, chat_template=template, naive=True)
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
    # The default history is a contiguous most-recent suffix: every kept optional turn is newer than every dropped one.
    history = [d for d in fast.decisions if d.kind == "history" and not d.reason.startswith("required")]
    kept = [int(d.segment[8:].split(":")[0]) for d in history if d.kept]
    dropped = [int(d.segment[8:].split(":")[0]) for d in history if not d.kept]
    assert not kept or not dropped or min(kept) > max(dropped)


def _required_only(request):
    segs = segments(request)
    from ctxlock.budget._fit import candidate

    return candidate(request, segs, set())


def test_required_overflow_is_rejected_with_sizes(qwen) -> None:
    model, template = qwen
    request = parse_request(
        {"messages": [{"role": "system", "content": "long " * 200}, {"role": "user", "content": "hi"}]}
    )
    with pytest.raises(BudgetExceeded) as info:
        fit_context(request, model, BudgetPolicy(max_input_tokens=50), chat_template=template)
    sizes = info.value.sizes
    assert set(sizes) == {"system", "current", "generation prefix"} and sizes["system"] > 200
    assert sum(sizes.values()) == info.value.total > 50 and "nothing was dropped" in info.value.hint


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
    fitted = fit_context(request, model, policy, chat_template=template)
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


def test_fit_cli_json_and_record(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setenv("CTXLOCK_DATA_DIR", str(tmp_path / "store"))
    args = ["fit", str(EXAMPLE), "--model", str(fetched.hf_tokenizer_dir("qwen2"))]
    # In this process (cli_runner.run_main: an exception escaping main, the traceback a user would see, fails the test)
    code, stdout, stderr = run_main([*args, "--max-input-tokens", "600", "--json"])
    assert code == 0, stderr
    out = json.loads(stdout)
    assert out["input_tokens"] == len(out["input_ids"]) <= 600
    assert {"segment", "kept", "tokens", "reason"} <= set(out["decisions"][0])
    assert any(not d["kept"] for d in out["decisions"])
    code, stdout, stderr = run_main([*args, "--context-window", "1000", "--reserve-output", "400", "--record"])
    assert code == 0 and "dropped" in stdout and "record " in stdout
    code, _, stderr = run_main([*args, "--max-input-tokens", "10"])
    assert code == 1 and "BudgetExceeded" in stderr and "Traceback" not in stderr
    assert "system 12, tools 0, current 12, generation prefix 3" in stderr  # real counts
    code, _, stderr = run_main([*args, "--max-input-tokens", "10", "--record"])
    assert code == 1 and "Traceback" not in stderr and "record " in stderr


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
    return ctxlock.load(str(fetched.gguf_path("llama-bpe"))).tokenizer


@st.composite
def edits(draw) -> tuple[str, str]:
    base = draw(st.lists(st.sampled_from(PIECES), max_size=40))
    cand = list(base)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(cand)))
        j = draw(st.integers(i, min(len(cand), i + 4)))
        cand[i:j] = draw(st.lists(st.sampled_from(PIECES), max_size=6))
    return "".join(base), "".join(cand)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=edits())
def test_incremental_count_equals_a_full_tokenization(llama_tok, pair: tuple[str, str]) -> None:
    # The counting service fit_context and plan_compaction count through: counted against a base text (the last
    # kept candidate), a text gives the full tokenization's count, as on the reference path.
    from types import SimpleNamespace

    from ctxlock.budget._counting import TokenCounter, splittable

    base, cand = pair
    assert splittable(llama_tok.added_tokens)

    def rendered(text: str) -> SimpleNamespace:
        return SimpleNamespace(text=text, untrusted=(), policy=InjectionPolicy.TEXT)

    expected = len(llama_tok.encode(cand, parse_special=True))
    assert TokenCounter(llama_tok).count(rendered(cand)) == expected
    counter = TokenCounter(llama_tok)
    assert counter.rebase(rendered(base)) == len(llama_tok.encode(base, parse_special=True))
    assert counter.count(rendered(cand)) == expected
    with reference_path():
        assert TokenCounter(llama_tok).count(rendered(cand)) == expected


@st.composite
def chains(draw) -> list[str]:
    texts = [draw(st.lists(st.sampled_from(PIECES), max_size=40))]
    for _ in range(draw(st.integers(1, 4))):
        cand = list(texts[-1])
        for _ in range(draw(st.integers(1, 2))):
            i = draw(st.integers(0, len(cand)))
            j = draw(st.integers(i, min(len(cand), i + 4)))
            cand[i:j] = draw(st.lists(st.sampled_from(PIECES), max_size=6))
        texts.append(cand)
    return ["".join(t) for t in texts]


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=chains())
def test_counts_along_a_chain_of_kept_texts(llama_tok, texts: list[str]) -> None:
    # As fit_context keeps candidate after candidate: each text is counted against the last kept one, then kept
    # (the base is spliced from the count, not scanned again); every count is the full tokenization's.
    from types import SimpleNamespace

    from ctxlock.budget._counting import TokenCounter

    counter = TokenCounter(llama_tok)
    for k, text in enumerate(texts):
        rendered = SimpleNamespace(text=text, untrusted=(), policy=InjectionPolicy.TEXT)
        expected = len(llama_tok.encode(text, parse_special=True))
        assert counter.count(rendered) == expected
        if k % 2 == 0 or k == 1:
            assert counter.rebase(rendered) == expected


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=conversations(), budget=st.integers(40, 900))
def test_the_naive_oracle_on_llama3(llama_tok, data: dict, budget: int) -> None:
    # A second template family: Llama 3.1's headers, a tools preamble in the first user turn, ipython results.
    model = ctxlock.load(str(fetched.gguf_path("llama-bpe")))
    source = (fetched.templates_dir() / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text("utf-8")
    template = ChatTemplate(source, id="llama3.1")
    request = parse_request(data)
    policy = BudgetPolicy(max_input_tokens=budget)
    try:
        fast = fit_context(request, model, policy, chat_template=template)
    except BudgetExceeded:
        with pytest.raises(BudgetExceeded):
            fit_context(request, model, policy, chat_template=template, naive=True)
        return
    naive = fit_context(request, model, policy, chat_template=template, naive=True)
    assert fast.decisions == naive.decisions
    assert fast.ids == naive.ids
    assert fast.input_tokens <= budget


# -- issue 16: a contiguous history, the fitted request, the generation prefix ------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "long-chat.json"


def _fit_cli(*extra: str) -> dict:
    """`ctxlock fit EXAMPLE EXTRA --json` in this process (cli_runner.run_main), its JSON output."""
    import json

    code, stdout, stderr = run_main(["fit", str(EXAMPLE), *extra, "--json"])
    assert code == 0, stderr
    return json.loads(stdout)


def _history_kept(decisions: list) -> list[tuple[int, int]]:
    spans = []
    for d in decisions:
        if d["kind"] == "history" and d["kept"]:
            a, b = d["segment"][len("history[") : -1].split(":")
            spans.append((int(a), int(b)))
    return sorted(spans)


def test_history_is_a_contiguous_most_recent_suffix_by_default() -> None:
    """Issue 16 item 3: at 625 tokens the seed's greedy loop kept history[9:11] after dropping [11:15] and [15:17]."""
    out = _fit_cli("--max-input-tokens", "625")
    kept = _history_kept(out["decisions"])
    assert kept and kept[-1][1] == 33  # up to the current turn (messages[33])
    assert all(a[1] == b[0] for a, b in itertools.pairwise(kept))  # no gap between kept turns
    dropped = [d for d in out["decisions"] if d["kind"] == "history" and not d["kept"]]
    assert dropped and all(int(d["segment"][8:].split(":")[0]) < kept[0][0] for d in dropped)
    assert out["policy"]["history"] == "suffix"
    # The first dropped turn was measured; the older ones were never tried, and say why.
    assert dropped[0]["tokens"] > 0 and "would make" in dropped[0]["reason"]
    assert all(d["tokens"] is None and "contiguous" in d["reason"] for d in dropped[1:])
    kept_messages = [m for m in out["request"]["messages"] if m["role"] != "system"]
    assert len(kept_messages) == 33 - kept[0][0] + 1
    # The seed's greedy order is an option, recorded in the policy: it keeps the small old turn after a gap.
    greedy = _fit_cli("--max-input-tokens", "625", "--history", "greedy")
    assert greedy["policy"]["history"] == "greedy"
    assert (9, 11) in _history_kept(greedy["decisions"]) and (15, 17) not in _history_kept(greedy["decisions"])


def test_suffix_and_greedy_in_python(qwen) -> None:
    model, template = qwen
    msgs = []
    for i in range(6):
        size = 60 if i == 3 else 4  # one large turn in the middle
        msgs += [{"role": "user", "content": f"q{i} " * size}, {"role": "assistant", "content": f"a{i} " * 4}]
    msgs.append({"role": "user", "content": "last"})
    request = parse_request({"messages": msgs})
    suffix = fit_context(request, model, BudgetPolicy(max_input_tokens=180), chat_template=template)
    greedy = fit_context(request, model, BudgetPolicy(max_input_tokens=180, history="greedy"), chat_template=template)
    assert suffix.request.messages[0].content == "q4 " * 4  # turns 4 and 5, then the current one
    assert suffix.kept_messages == tuple(range(8, 13))
    assert greedy.kept_messages == (0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12)  # the seed's loop leaves turn 3 out
    assert suffix.input_tokens < greedy.input_tokens <= 180
    assert BudgetPolicy.from_dict(greedy.policy.to_dict()) == greedy.policy
    with pytest.raises(BudgetError) as info:
        BudgetPolicy(max_input_tokens=10, order=("history[0:2]",))
    assert "greedy" in info.value.hint
    with pytest.raises(BudgetError):
        BudgetPolicy(max_input_tokens=10, history="oldest")


def test_fit_gives_the_request_to_send_and_real_required_counts(tmp_path) -> None:
    """Issue 16 item 4: the fitted request in --json and --emit-request, and required segments with their tokens."""
    import json

    emitted = tmp_path / "fitted.json"
    qwen_dir = str(fetched.hf_tokenizer_dir("qwen2"))
    out = _fit_cli("--model", qwen_dir, "--max-input-tokens", "600", "--emit-request", str(emitted))
    original = json.loads(Path(EXAMPLE).read_text("utf-8"))
    sent = out["request"]
    assert json.loads(emitted.read_text("utf-8")) == sent
    assert sent["tools"] == original["tools"] and sent["messages"][-1] == original["messages"][-1]
    assert all(m in original["messages"] for m in sent["messages"])  # the caller's own message objects
    # The request renders to exactly the ids fit reports.
    model = ctxlock.load(qwen_dir)
    assert list(model.encode(sent).input_ids[0]) == out["input_ids"]
    required = [d for d in out["decisions"] if d["reason"].startswith("required")]
    assert [d["segment"] for d in required] == ["system", "tools", "current", "generation prefix"]
    assert required[0]["tokens"] > 0 and required[2]["tokens"] > 0 and required[3]["tokens"] == 3
    assert sum(d["tokens"] or 0 for d in required) == required[-1]["total"]


def test_the_fitted_request_keeps_the_anthropic_shape() -> None:
    from ctxlock.budget._fit import fitted_request_json

    model = ctxlock.load()  # Mistral Nemo's template: list content, 9-character tool ids
    raw = {
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "weather? " * 40},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "abcdefghi", "name": "w", "input": {"c": "x"}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "abcdefghi", "content": "sunny " * 60},
                    {"type": "text", "text": "thanks, and tomorrow?"},
                ],
            },
            {"role": "assistant", "content": "Rain."},
            {"role": "user", "content": "ok"},
        ],
        "max_tokens": 100,
        "model": "x",
    }
    request = parse_request(raw)
    fitted = fit_context(request, model, BudgetPolicy(max_input_tokens=60))
    sent = fitted_request_json(raw, request, fitted)
    # The old turn (the call and its result) is dropped; the text block of the same user message is a newer turn.
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "thanks, and tomorrow?"}]},
        {"role": "assistant", "content": "Rain."},
        {"role": "user", "content": "ok"},
    ]
    assert sent["system"] == "Be brief." and sent["max_tokens"] == 100 and sent["model"] == "x"
    assert parse_request(sent) == fitted.request


def test_exactly_one_generation_prefix_is_asserted(qwen) -> None:
    """Issue 16 item 5: add_generation_prompt=False used to pass silently; the seed asserts one generation prefix."""
    model, template = qwen
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]}
    request = parse_request({"messages": [{"role": "user", "content": "hi"}]})
    policy = BudgetPolicy(max_input_tokens=100)
    with pytest.raises(BudgetError) as info:
        fit_context(request, model, policy, chat_template=template, add_generation_prompt=False)
    assert info.value.path == "add_generation_prompt" and "generation_prefix='none'" in info.value.hint
    fitted = fit_context(request, model, policy, chat_template=template)
    row = next(d for d in fitted.decisions if d.kind == "generation")
    assert row.kept and row.tokens == 3 and "<|im_start|>assistant\\n" in row.reason
    # The explicit opt-out is recorded in the policy and in the decisions.
    none = BudgetPolicy(max_input_tokens=100, generation_prefix="none")
    bare = fit_context(request, model, none, chat_template=template)
    row = next(d for d in bare.decisions if d.kind == "generation")
    assert not row.kept and row.tokens == 0 and bare.policy.to_dict()["generation_prefix"] == "none"
    assert bare.input_tokens == fitted.input_tokens - 3 and not bare.rendered.text.endswith("assistant\n")
    with pytest.raises(BudgetError):
        fit_context(request, model, none, chat_template=template, add_generation_prompt=True)
    # A prefill is the one generation prefix; continuing a user message is not one.
    prefill = fit_context(parse_request(chat), model, policy, chat_template=template, continue_final_message=True)
    row = next(d for d in prefill.decisions if d.kind == "generation")
    assert row.kept and "prefill" in row.reason and prefill.rendered.text.endswith("Hel")
    with pytest.raises(BudgetError):
        fit_context(request, model, policy, chat_template=template, continue_final_message=True)
    # A template with no generation prompt (Mistral's) opens the reply after a user turn, not after an assistant one.
    nemo = ctxlock.load()
    fit_context(request, nemo, policy)
    with pytest.raises(BudgetError) as info:
        fit_context(parse_request(chat), nemo, policy)
    assert "prefill" in info.value.hint


def test_fit_records_replay_identically(tmp_path) -> None:
    import json

    from ctxlock.records import RunOptions
    from ctxlock.records._replay import replay, run_and_record, save
    from ctxlock.records._store import Store

    store = Store(tmp_path / "store")
    model = ctxlock.load()
    data = Path(EXAMPLE).read_bytes()
    for history in ("suffix", "greedy"):
        pol = BudgetPolicy(max_input_tokens=625, history=history).to_dict()
        fitted, rec, err = run_and_record(model, data, RunOptions(budget=pol, now="2024-07-26T00:00:00+00:00"))
        assert err is None
        save(store, model, rec, fitted.rendered.template)
        assert rec.data["decisions"]["budget"]["policy"]["history"] == history
        result, _ = replay(rec, store)
        assert result.identical
    assert json.loads(data)["messages"]  # the example is a chat
