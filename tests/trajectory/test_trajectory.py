"""Token-in/token-out trajectories (docs/trajectories.md) over every fixture template with tool calls.

Each template answers one conversation, computed once per module: a user asks, the engine calls a tool, the tool
answers, the engine answers, the user thanks it. The engine's ids are the template's own render of each assistant
turn (see `engine_ids`), and must parse back to the call and answer they were written from. The oracle is prefix
stability as `ctxlock lint`'s history-rewrite rule and the mask cross-check define it: the render cut before each
assistant turn (with the generation prompt) and after it is a prefix of the whole render. Where it holds and the
template writes each parsed message as the engine did, every delta is exact and the trajectory's bytes are the
canonical render's (a fork there can only be a retokenization); where it does not, the first fork is located
against the texts and the cut renders (`check_first_fork`). Everywhere, the forks are complete: the canonical ids
are the trajectory's with each fork's canonical side in its place. gpt-oss (Harmony) has a test of its own; the one
template that refuses the conversation is asserted to refuse it, by name."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from conformance import FIXED_NOW, TEMPLATE_KWARGS, vocab_for
from ctxlock import accounting
from ctxlock.errors import CtxlockError, TrajectoryError
from ctxlock.generation import REASONING_FORMATS, formats_for_template, start_from_prompt
from ctxlock.template._render import ChatTemplate
from ctxlock.training._masks import turn_marks
from ctxlock.trajectory import CAUSES, Trajectory, TrajectoryResult, build_line, read_line

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city."}},
                "required": ["city"],
            },
        },
    }
]
CALL = {"id": "a1b2c3d4e", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@cache
def _model(vocab: str) -> ctxlock.Model:
    return ctxlock.load(str(fetched.hf_tokenizer_dir(vocab)))


_formats = cache(formats_for_template)  # a probe render per call: once per template source in this module


def _tool_templates() -> list[Path]:
    out = []
    for path in fetched.template_paths():
        tool, _, _ = _formats(path.read_text("utf-8"))
        if tool is not None and tool != "harmony":  # Harmony needs gpt-oss's vocabulary: test_gpt_oss below
            out.append(path)
    return out


TEMPLATES = _tool_templates()
# The fixture templates with tool calls that refuse the conversation, each with the error it names:
# functionary-medium-v3.2 concatenates each tool call's `arguments` to a string, and a parsed call's arguments are an
# object (as in every request ctxlock reads); Kimi-K2-Instruct and Kimi-K2-Thinking queue the call ids with
# `list.append`, which the immutable sandbox refuses (as transformers' does); llama.cpp's deepseek-r1 template writes
# `tools | map(...) | tojson`, a generator JSON cannot hold, so it refuses any request that declares tools.
REFUSES = {
    "meetkai-functionary-medium-v3.2.jinja": "can only concatenate str",
    "Kimi-K2-Instruct.jinja": "access to attribute 'append' of 'list' object is unsafe",
    "Kimi-K2-Thinking.jinja": "access to attribute 'append' of 'list' object is unsafe",
    "llama-cpp-deepseek-r1.jinja": "Object of type generator is not JSON serializable",
}
REASONING = "Let me check."


def _shared(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def engine_ids(
    model: ctxlock.Model, opts: dict[str, Any], data: dict[str, Any], message: dict[str, Any], prefix: str = ""
) -> list[int]:
    """What an engine answering `data` writes for `message`: the template's own render of the assistant turn
    (the conversation with `message`, no generation prompt) from where it parts from the prompt with the
    generation prompt (never inside a `<...>` tag: a prompt ending `<think>` and a turn starting `</think>` part
    at the `<`) to its last end-of-turn text, as the render's own tokens (a token across either edge: its part
    encoded alone). `prefix`: text the engine writes first (a reasoning block the template does not write)."""
    prompt = accounting.layout(model, data, **opts, add_generation_prompt=True).rendered.text
    whole = {**data, "messages": [*data["messages"], message]}
    lay = accounting.layout(model, whole, **opts, add_generation_prompt=False)
    text = lay.rendered.text
    k = _shared(prompt, text)
    bare = accounting.layout(model, data, **opts, add_generation_prompt=False).rendered.text
    head = prompt[len(bare) :] if prompt.startswith(bare) else ""
    if k < len(bare) and head:  # the template rewrites the last message: the turn starts after its header
        n = next((n for n in range(len(head), 0, -1) if text.find(head[:n], k) >= 0), 0)
        k = text.find(head[:n], k) + n if n else k
    if text[:k].rfind("<") > text[:k].rfind(">"):
        k = text[:k].rfind("<")
    _, reasoning, _ = _formats(lay.rendered.template.source)
    close = REASONING_FORMATS[reasoning].close if reasoning in REASONING_FORMATS else None
    if close and prompt.rstrip().endswith(close) and text.startswith(close, k):  # the prompt closed the block
        k += len(close)
    eot = turn_marks(model, lay.rendered, opts, TOOLS).eot
    at = text.rfind(eot, k) if eot else -1  # the last one: a turn may end a message and start another (GigaChat)
    end = at + len(eot) if at >= 0 else len(text.rstrip())
    sb, eb = int(lay.offsets[k]), int(lay.offsets[end])
    ids: list[int] = model.tokenizer.encode_text(prefix, at_start=False) if prefix else []
    for t, (s, e) in enumerate(zip(lay.starts.tolist(), lay.ends.tolist(), strict=True)):
        if e <= sb or s >= eb:
            continue
        if s < sb or e > eb:
            c1, c2 = (int(np.searchsorted(lay.offsets, b)) for b in (max(s, sb), min(e, eb)))
            ids += model.tokenizer.encode_text(text[c1:c2], at_start=False)
        else:
            ids.append(int(lay.ids[t]))
    return ids


def _stable(model: ctxlock.Model, opts: dict[str, Any], data: dict[str, Any]) -> tuple[bool, int]:
    """Prefix stability of the whole conversation (lint's history-rewrite rule, both kinds), and where the whole
    render first parts from the first cut render that is not a prefix of it (its length when all are)."""
    msgs = data["messages"]
    full = model.render(data, **opts, add_generation_prompt=msgs[-1]["role"] != "assistant").text
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        for cut, prompt in ((msgs[:k], True), (msgs[: k + 1], False)):
            text = model.render({**data, "messages": cut}, **opts, add_generation_prompt=prompt).text
            if not full.startswith(text):
                return False, _shared(text, full)
    return True, len(full)


@dataclass(frozen=True)
class Run:
    result: TrajectoryResult
    model: ctxlock.Model
    opts: dict[str, Any]
    given: list[list[int]]
    how: str  # how the engine's completions were written: "render", "render+reasoning", "tags"


def _prefix(reasoning: str | None, prompt: str) -> str:
    """The reasoning block an engine writes before its answer when the template writes none: the closing tag when
    the prompt opened the block, else an empty block."""
    fmt = REASONING_FORMATS.get(reasoning or "")
    if fmt is None:
        return ""
    return f"{fmt.close}\n\n" if start_from_prompt(fmt, prompt) == "reasoning" else f"{fmt.open}\n{fmt.close}\n\n"


def run_conversation(path: Path, how: str = "render", model: ctxlock.Model | None = None) -> Run:
    """A user asks, the engine calls the tool, the tool answers, the engine answers, the user thanks it."""
    model = model or _model(vocab_for(path.name))
    opts: dict[str, Any] = {"chat_template": ChatTemplate(path.read_text("utf-8"), id=path.name), "now": FIXED_NOW}
    data: dict[str, Any] = {"tools": TOOLS, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    if path.name in TEMPLATE_KWARGS:
        data["chat_template_kwargs"] = TEMPLATE_KWARGS[path.name]
    extra = {"reasoning_content": REASONING} if how == "render+reasoning" else {}
    traj = Trajectory(model, data, opts)
    prefix = ""
    if how == "tags":
        _, reasoning, _ = _formats(path.read_text("utf-8"))
        prefix = _prefix(reasoning, model.render(data, **opts, add_generation_prompt=True).text)
    given: list[list[int]] = []
    ids = engine_ids(model, opts, data, {"role": "assistant", "content": "", "tool_calls": [CALL], **extra}, prefix)
    given.append(ids)
    message = traj.complete(ids, [-0.5] * len(ids), "tool_calls").to_openai()
    calls = message.get("tool_calls") or []
    after = (
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C"}
        if calls
        else {"role": "user", "content": "18 C"}
    )
    traj.add([after])
    data = traj.result().conversation
    ids = engine_ids(model, opts, data, {"role": "assistant", "content": "It is 18 C.", **extra}, prefix)
    given.append(ids)
    traj.complete(ids)
    traj.add([{"role": "user", "content": "Thanks!"}])
    return Run(traj.result(), model, opts, given, how)


def _parsed_as_meant(run: Run) -> bool:
    first, second = (s.message or {} for s in run.result.steps if s.kind == "completion")
    calls = first.get("tool_calls") or []
    return (
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
        == [("get_weather", {"city": "Paris"})]
        # An end-of-turn text the fixture's stand-in vocabulary holds as plain text (`<seed:eos>` in Qwen2's) is
        # no end token there: it stays in the content, after the answer.
        and "It is 18 C." in (second.get("content") or "")
    )


@cache
def conversation(name: str) -> Run:
    """The conversation through `name`, computed once per module: the engine writes each turn as the template
    renders it; when that does not parse back (the parser reads the output as still reasoning), as the template
    renders it with reasoning; then with the reasoning format's tags before it."""
    path = fetched.templates_dir() / name
    run = run_conversation(path)
    for how in ("render+reasoning", "tags"):
        if _parsed_as_meant(run):
            break
        run = run_conversation(path, how)
    return run


def check_invariants(r: TrajectoryResult, given: list[list[int]]) -> None:
    """The engine's ids are kept as given, trained, with their log-probs; the forks are complete."""
    completions = [s for s in r.steps if s.kind == "completion"]
    assert [r.ids[s.start : s.end].tolist() for s in completions] == given
    trained = np.zeros(len(r.ids), dtype=np.int8)
    for s in completions:
        trained[s.start : s.end] = 1
    assert r.loss_mask.tolist() == trained.tolist()
    assert np.isnan(r.logprobs[trained == 0]).all()
    assert r.steps[0].kind == "prompt" and all(s.end == t.start for s, t in zip(r.steps, r.steps[1:], strict=False))
    assert r.steps[-1].end == len(r.ids) == len(r.step) == len(r.part)
    rebuilt, at = [], 0
    for f in r.forks:
        assert f.cause in CAUSES and f.used == "trajectory"
        assert list(f.trajectory_ids) == r.ids[f.trajectory_tokens[0] : f.trajectory_tokens[1]].tolist()
        rebuilt += r.ids[at : f.trajectory_tokens[0]].tolist() + list(f.canonical_ids)
        at = f.trajectory_tokens[1]
    rebuilt += r.ids[at:].tolist()
    assert rebuilt == list(r.canonical_ids)[: len(rebuilt)]
    json.dumps(r.to_dict())  # the JSON form is JSON


def check_first_fork(run: Run, cut: int) -> None:
    """The independent oracle of where the trajectory first parts from the canonical render: the decoded texts'
    first differing character (no alignment), which can be no later than where the whole render parts from the
    first cut render that is not a prefix of it (`cut`: the trajectory's text holds each cut render up to there).
    The first fork whose sides' bytes differ must span that character on the canonical side, and belong to the
    step whose decoded tokens hold it."""
    r, tok = run.result, run.model.tokenizer
    ours, theirs = tok.decode(r.ids.tolist()), tok.decode(list(r.canonical_ids))
    first = _shared(ours, theirs)
    assert first <= cut, (first, cut)
    if ours == theirs:
        assert all(f.cause == "retokenization" for f in r.forks)
        return
    fork = next(f for f in r.forks if f.trajectory_text != f.canonical_text)
    c1 = fork.canonical_chars[0]  # the texts may share a few characters more inside the fork's tokens
    assert c1 <= first <= c1 + max(len(fork.canonical_text), len(fork.trajectory_text)), (fork.to_dict(), first)
    bounds = [len(tok.decode(r.ids[: s.end].tolist())) for s in r.steps]
    step = next(k for k, b in enumerate(bounds) if first < b or k == len(bounds) - 1)
    i1, i2 = fork.trajectory_tokens
    if i2 > i1:  # a fork is a token span: its step is one of its tokens' (the nearest to the character), or the
        # next token's when the canonical side only adds text after the trajectory's
        adds = fork.canonical_text.startswith(fork.trajectory_text) and fork.canonical_text != fork.trajectory_text
        last = i2 if adds and i2 < len(r.ids) else i2 - 1
        step = min(max(step, int(r.step[i1])), int(r.step[last]))
    assert fork.step == step, (fork.to_dict(), first, bounds)


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_fixture_templates(path: Path) -> None:
    if path.name in REFUSES:  # asserted by test_a_refusing_template_is_a_typed_error
        with pytest.raises(CtxlockError):
            conversation(path.name)
        return
    run = conversation(path.name)
    r = run.result
    check_invariants(r, run.given)
    assert _parsed_as_meant(run), f"{path.name}: the engine's ids did not parse back ({[s.notes for s in r.steps]})"
    stable, cut = _stable(run.model, run.opts, r.conversation)
    reproduce = all(s.reproduces for s in r.steps if s.kind == "completion")
    check_first_fork(run, cut)
    if stable and reproduce:
        assert all(s.how in ("render", "engine", "exact") for s in r.steps), [s.how for s in r.steps]
        assert all(f.cause == "retokenization" for f in r.forks), [f.to_dict() for f in r.forks]
        assert run.model.tokenizer.decode(list(r.ids)) == run.model.tokenizer.decode(list(r.canonical_ids))
    elif not stable:  # a history rewrite: a fork whose text differs, at the place the cut renders say (above)
        assert any(f.cause != "retokenization" for f in r.forks), f"{path.name}: not prefix-stable, yet no fork"
    else:  # a parsed message the template writes otherwise than the engine did: said by the step and a fork
        assert any(f.cause != "retokenization" for f in r.forks) or any(s.how == "located" for s in r.steps)


def test_an_end_token_left_in_the_content_is_a_rerender_not_a_history_rewrite() -> None:
    """An end-of-turn text the vocabulary holds as plain text (granite's `<|end_of_text|>`, Laguna's `</assistant>`
    in Qwen2's) is no end token there: it stays in the parsed tool-call message's content, which these prefix-stable
    templates write before the call even while the turn is the last. The fork is the completion's (step 1), a
    rerender: the template writes the turn so from the start, and never rewrites it (a shared `<` between the
    engine's `<tool_call>` and the template's `</assistant>` is no agreement), and it is the completion's even where
    the inserted text follows the prompt's last token."""
    for name, inserted in (
        ("ibm-granite-granite-4.0.jinja", "<|end_of_text|>"),
        ("poolside-Laguna-XS.2.jinja", "</assistant>"),
    ):
        path = fetched.templates_dir() / name
        run = run_conversation(path, model=_model(vocab_for(name)))
        r = run.result
        assert _stable(run.model, run.opts, r.conversation)[0]
        assert inserted in r.steps[1].message["content"]
        changed = [(f.step, f.cause) for f in r.forks if f.trajectory_text != f.canonical_text]
        assert changed == [(1, "rerender")], [f.to_dict() for f in r.forks]
        assert inserted in next(f.canonical_text for f in r.forks if f.trajectory_text != f.canonical_text)


def test_a_refusing_template_is_a_typed_error() -> None:
    """The templates of `REFUSES` cannot render the conversation (see there): the trajectory refuses with a typed
    error naming the template and the line, never a wrong trajectory."""
    assert set(REFUSES) <= {p.name for p in TEMPLATES}
    for name, why in REFUSES.items():
        with pytest.raises(CtxlockError) as exc:
            run_conversation(fetched.templates_dir() / name)
        assert name in str(exc.value) and why in str(exc.value), str(exc.value)


def test_known_templates() -> None:
    """Qwen2.5 and Llama 3.1 are prefix-stable and write the parsed messages as given: the trajectory is the
    canonical render, id for id. Mistral Nemo moves the tools before the last user turn: a history rewrite."""
    for name in ("Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja"):
        r = conversation(name).result
        assert r.identical and not r.forks and r.steps[2].how == r.steps[4].how == "exact"
    r = conversation("mistralai-Mistral-Nemo-Instruct-2407.jinja").result
    assert any(f.cause == "history-rewrite" and "AVAILABLE_TOOLS" in f.trajectory_text for f in r.forks), r.forks


def test_gpt_oss_harmony() -> None:
    """gpt-oss's own template and vocabulary (Harmony): the engine thinks, calls the tool (`<|call|>`), thinks
    again and answers (`<|return|>`). The calls and answer parse back; the forks are the documented ones: once a
    final answer follows, the template drops the tool-call turn's analysis (a history rewrite), and it writes the
    final turn without its analysis and ends it with `<|end|>`, even as the last turn (a rerender); the new user
    turn's delta is located after the engine's `<|return|>`, where the template writes `<|end|>`."""
    model = ctxlock.load("gpt-oss")
    opts: dict[str, Any] = {"now": FIXED_NOW}
    data: dict[str, Any] = {"tools": TOOLS, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    call = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris"}<|call|>'
    final = "<|start|>assistant<|channel|>final<|message|>It is 18 C.<|return|>"
    given = [
        model.tokenizer.encode(f"<|channel|>analysis<|message|>{why}<|end|>{then}", parse_special=True)
        for why, then in (("Look it up.", call), ("Answer.", final))
    ]
    traj = Trajectory(model, data, opts)
    message = traj.complete(given[0], None, "tool_calls").to_openai()
    assert message["reasoning_content"] == "Look it up." and message["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
    }
    traj.add([{"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "18 C"}])
    answer = traj.complete(given[1]).to_openai()
    assert (answer["content"], answer["reasoning_content"]) == ("It is 18 C.", "Answer.")
    traj.add([{"role": "user", "content": "Thanks!"}])
    r = traj.result()
    check_invariants(r, given)
    stable, cut = _stable(model, opts, r.conversation)
    assert not stable
    check_first_fork(Run(r, model, opts, given, "harmony"), cut)
    assert [s.how for s in r.steps] == ["render", "engine", "exact", "engine", "located"]
    assert [(f.step, f.cause, f.trajectory_text, f.canonical_text) for f in r.forks] == [
        (1, "history-rewrite", "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant", ""),
        (3, "rerender", "analysis<|message|>Answer.<|end|><|start|>assistant<|channel|>", ""),
        (3, "rerender", "<|return|>", "<|end|>"),
    ]
    assert "'<|end|>' in history" in " ".join(r.steps[4].notes)


# -- token boundaries ---------------------------------------------------------------------------------------------

QWEN = "Qwen-Qwen2.5-7B-Instruct.jinja"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    words=st.lists(st.sampled_from(["sunny", "weather", "Paris", "tomorrow", "héllo", "天气", "forecast"]), min_size=1),
    cut=st.integers(1, 8),
)
def test_noncanonical_pieces_are_kept_and_forked(words: list[str], cut: int) -> None:
    model = _model(vocab_for(QWEN))
    opts = {"chat_template": ChatTemplate((fetched.templates_dir() / QWEN).read_text("utf-8"), id=QWEN)}
    text = " ".join(words)
    at = min(cut, len(text) - 1) if len(text) > 1 else 1
    pieces = model.tokenizer.encode(text[:at]) + model.tokenizer.encode(text[at:])
    end = model.tokenizer.encode("<|im_end|>", parse_special=True)
    traj = Trajectory(model, {"messages": [{"role": "user", "content": "Say it."}]}, opts)
    traj.complete(pieces + end)
    traj.add([{"role": "user", "content": "Again."}])
    r = traj.result()
    check_invariants(r, [pieces + end])
    canonical = model.tokenizer.encode(text)
    if pieces == canonical:
        assert r.identical and not r.forks
    else:
        assert model.tokenizer.decode(pieces) == text
        assert [f.cause for f in r.forks] == ["retokenization"] and r.forks[0].step == 1
        assert r.forks[0].trajectory_text == r.forks[0].canonical_text


# -- input lines and hostile input --------------------------------------------------------------------------------


def test_example_file() -> None:
    line = Path("examples/weather-trajectory.jsonl").read_bytes()
    r = build_line(ctxlock.load(), read_line(line, "ex:1"), "ex:1")
    assert [f.cause for f in r.forks] == ["history-rewrite", "retokenization"]
    assert not math.isnan(r.logprobs[r.steps[1].start]) and math.isnan(r.logprobs[r.steps[3].start])


def test_a_tool_result_without_its_call_id_gets_the_parsed_calls_and_a_wrong_one_is_refused() -> None:
    """Mistral's template writes each tool result's `tool_call_id`: a result given without one gets the id of the
    completion's call at its place (the same ids as the line that gives it), and the step's notes say so; an id that
    names no call at all is refused by the request's own check, naming the step."""
    model = ctxlock.load()
    given = json.loads(Path("examples/weather-trajectory.jsonl").read_text("utf-8"))
    missing = json.loads(json.dumps(given))
    del missing["steps"][1]["messages"][0]["tool_call_id"]
    wrong = json.loads(json.dumps(given))
    wrong["steps"][1]["messages"][0]["tool_call_id"] = "zzzzzzzzz"
    full, filled = build_line(model, given, "ex:1"), build_line(model, missing, "ex:1")
    assert filled.ids.tolist() == full.ids.tolist()
    assert [n for n in full.steps[2].notes if "tool_call_id" in n] == []
    assert [n for n in filled.steps[2].notes if "tool_call_id" in n] == [
        "steps[1].messages[0].tool_call_id: filled with 'a1b2c3d4e', the id of the completion's call 0 (get_weather)"
    ]
    with pytest.raises(TrajectoryError, match='no earlier assistant tool call has id "zzzzzzzzz"') as exc:
        build_line(model, wrong, "ex:1")
    assert exc.value.path == "ex:1 $.steps[1].messages"


@pytest.mark.parametrize(
    ("line", "path"),
    [
        (b"[1]", "x:1 $"),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', "x:1 $.steps"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "steps": [{"messages": []}]}', "x:1 $.steps[0]"),
        (b'{"messages": [], "steps": [{"completion_ids": [1], "extra": 1}]}', "x:1 $.steps[0]"),
        (b'{"messages": [], "steps": [{"completion_ids": [1]}, {"completion_ids": [2]}]}', "x:1 $.steps[1]"),
        (b'{"steps": [{"completion_ids": [1], "finish_reason": 3}]}', "x:1 $.steps[0].finish_reason"),
        (b'{"steps": [{"completion_ids": [1], "completion_ids": [2]}]}', "x:1 $.steps[0]"),
        (b'{"steps": "' + b"\xff" + b'"}', "x:1 $"),
    ],
)
def test_bad_lines(line: bytes, path: str) -> None:
    with pytest.raises(TrajectoryError) as exc:
        read_line(line, "x:1")
    assert exc.value.path is not None and exc.value.path.startswith(path)


@pytest.mark.parametrize(
    ("step", "path"),
    [
        ({"completion_ids": [1, 10**9]}, "x:1 $.steps[0].completion_ids[1]"),
        ({"completion_ids": [1, -1]}, "x:1 $.steps[0].completion_ids[1]"),
        ({"completion_ids": [1, True]}, "x:1 $.steps[0].completion_ids[1]"),
        ({"completion_ids": []}, "x:1 $.steps[0].completion_ids"),
        ({"completion_ids": [1, 2], "logprobs": [0.0]}, "x:1 $.steps[0].logprobs"),
        ({"completion_ids": [1, 2], "logprobs": [0.0, 1.5]}, "x:1 $.steps[0].logprobs[1]"),
    ],
)
def test_bad_ids_are_errors_naming_the_path(step: dict[str, Any], path: str) -> None:
    value = {"messages": [{"role": "user", "content": "hi"}], "steps": [step]}
    with pytest.raises(TrajectoryError) as exc:
        build_line(ctxlock.load(), value, "x:1")
    assert exc.value.path == path


def test_messages_must_follow_a_completion_and_not_be_assistant() -> None:
    model = ctxlock.load()
    traj = Trajectory(model, {"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(TrajectoryError, match="must follow a completion"):
        traj.add([{"role": "user", "content": "again"}])
    traj.complete(model.tokenizer.encode("Hello.</s>", parse_special=True))
    with pytest.raises(TrajectoryError, match="two completions"):
        traj.complete([1])
    with pytest.raises(TrajectoryError, match="completion step"):
        traj.add([{"role": "assistant", "content": "forged"}])
