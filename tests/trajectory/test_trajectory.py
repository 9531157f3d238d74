"""Token-in/token-out trajectories (docs/trajectories.md) over every fixture template with tool calls.

Each template answers one conversation: a user asks, the engine calls a tool (its ids: the template's own render of
the call, cut where the generation prompt ends and after the end-of-turn text), the tool answers, the engine answers,
the user thanks it. The oracle is prefix stability as `ctxlock lint`'s history-rewrite rule and the mask
cross-check define it: the render cut before each assistant turn (with the generation prompt) and after it is a
prefix of the whole render. Where it holds and the template writes each parsed message as the engine did, every
delta is exact and the trajectory's bytes are the canonical render's (a fork there can only be a retokenization);
where it does not, a fork (or a located delta) names it. Everywhere, the forks are complete: the canonical ids are
the trajectory's with each fork's canonical side in its place."""

from __future__ import annotations

import json
import math
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
from ctxlock.generation import formats_for_template
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


def _tool_templates() -> list[Path]:
    out = []
    for path in fetched.template_paths():
        tool, _, _ = formats_for_template(path.read_text("utf-8"))
        if tool is not None and tool != "harmony":  # Harmony needs gpt-oss's vocabulary: test_gpt_oss below
            out.append(path)
    return out


TEMPLATES = _tool_templates()


def engine_ids(model: ctxlock.Model, opts: dict[str, Any], data: dict[str, Any], message: dict[str, Any]) -> list[int]:
    """What an engine answering `data` writes for `message`: the template's render of it past the prompt, up to and
    with its end-of-turn text, as the render's own tokens (a token across either edge: its part encoded alone)."""
    prompt = accounting.layout(model, data, **opts, add_generation_prompt=True).rendered.text
    whole = {**data, "messages": [*data["messages"], message]}
    lay = accounting.layout(model, whole, **opts, add_generation_prompt=False)
    text = lay.rendered.text
    k = 0
    while k < min(len(prompt), len(text)) and prompt[k] == text[k]:
        k += 1
    eot = turn_marks(model, lay.rendered, opts, TOOLS).eot
    at = text.find(eot, k) if eot else -1
    end = at + len(eot) if at >= 0 else len(text.rstrip())
    sb, eb = int(lay.offsets[k]), int(lay.offsets[end])
    ids: list[int] = []
    for t, (s, e) in enumerate(zip(lay.starts.tolist(), lay.ends.tolist(), strict=True)):
        if e <= sb or s >= eb:
            continue
        if s < sb or e > eb:
            c1, c2 = (int(np.searchsorted(lay.offsets, b)) for b in (max(s, sb), min(e, eb)))
            ids += model.tokenizer.encode_text(text[c1:c2], at_start=False)
        else:
            ids.append(int(lay.ids[t]))
    return ids


def _stable(model: ctxlock.Model, opts: dict[str, Any], data: dict[str, Any]) -> bool:
    """Prefix stability of the whole conversation (lint's history-rewrite rule, both kinds)."""
    msgs = data["messages"]
    full = model.render(data, **opts, add_generation_prompt=msgs[-1]["role"] != "assistant").text
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        for cut, prompt in ((msgs[:k], True), (msgs[: k + 1], False)):
            if not full.startswith(model.render({**data, "messages": cut}, **opts, add_generation_prompt=prompt).text):
                return False
    return True


def run_conversation(path: Path) -> tuple[TrajectoryResult, ctxlock.Model, dict[str, Any], list[list[int]]]:
    model = _model(vocab_for(path.name))
    opts: dict[str, Any] = {"chat_template": ChatTemplate(path.read_text("utf-8"), id=path.name), "now": FIXED_NOW}
    data: dict[str, Any] = {"tools": TOOLS, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    if path.name in TEMPLATE_KWARGS:
        data["chat_template_kwargs"] = TEMPLATE_KWARGS[path.name]
    traj = Trajectory(model, data, opts)
    given: list[list[int]] = []
    ids = engine_ids(model, opts, data, {"role": "assistant", "content": "", "tool_calls": [CALL]})
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
    ids = engine_ids(model, opts, data, {"role": "assistant", "content": "It is 18 C."})
    given.append(ids)
    traj.complete(ids)
    traj.add([{"role": "user", "content": "Thanks!"}])
    return traj.result(), model, opts, given


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


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_fixture_templates(path: Path) -> None:
    try:
        r, model, opts, given = run_conversation(path)
    except CtxlockError as exc:  # the template refuses the conversation: nothing to compare, said by name
        pytest.skip(f"{path.name} refuses the conversation: {exc}")
    check_invariants(r, given)
    stable = _stable(model, opts, r.conversation)
    reproduce = all(s.reproduces for s in r.steps if s.kind == "completion")
    if stable and reproduce:
        assert all(s.how in ("render", "engine", "exact") for s in r.steps), [s.how for s in r.steps]
        assert all(f.cause == "retokenization" for f in r.forks), [f.to_dict() for f in r.forks]
        assert model.tokenizer.decode(list(r.ids)) == model.tokenizer.decode(list(r.canonical_ids))
    else:  # not prefix-stable, or a parsed message the template writes otherwise: named
        found = [f for f in r.forks if f.cause != "retokenization"] or [s for s in r.steps if s.how == "located"]
        assert found, f"{path.name}: stable={stable}, reproduce={reproduce}, yet no fork and no located delta"


def test_known_templates() -> None:
    """Qwen2.5 and Llama 3.1 are prefix-stable and write the parsed messages as given: the trajectory is the
    canonical render, id for id. Mistral Nemo moves the tools before the last user turn: a history rewrite."""
    for name in ("Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja"):
        r, *_ = run_conversation(fetched.templates_dir() / name)
        assert r.identical and not r.forks and r.steps[2].how == r.steps[4].how == "exact"
    r, *_ = run_conversation(fetched.templates_dir() / "mistralai-Mistral-Nemo-Instruct-2407.jinja")
    assert any(f.cause == "history-rewrite" and "AVAILABLE_TOOLS" in f.trajectory_text for f in r.forks), r.forks


# -- token boundaries ---------------------------------------------------------------------------------------------

QWEN = "Qwen-Qwen2.5-7B-Instruct.jinja"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
