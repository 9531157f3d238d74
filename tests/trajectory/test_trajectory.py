"""Token-in/token-out trajectories (docs/trajectories.md) over every fixture template with tool calls.

Each template answers one conversation, computed once per module: a user asks, the engine calls a tool, the tool
answers, the engine answers, the user thanks it. The engine's ids are what a real engine returns: the template's own
render of each assistant turn, up to and including the end-of-turn token the model stops on (see `engine_ids`; where
the suite's stand-in vocabulary lacks the model's token, `END_OF_TURN` and `MODEL_TOKENS` add it), with a log-prob of
its own for each token of the first turn. They must parse back to the call and answer they were written from.

The oracle is `ctxlock lint`'s history-rewrite verdict (`prefix_stable`). Where the template is prefix-stable, every
delta is exact and the trajectory decodes to the canonical render (a fork there is only a retokenization), unless
`NOT_EXACT` names the template with its reason and its forks; where it is not, the first fork is located against the
texts and the cut renders (`check_first_fork`). Everywhere, the forks are complete (the canonical ids are the
trajectory's with each fork's canonical side in its place) and each log-prob is the one given, at its token. gpt-oss
(Harmony) has a test of its own; the templates that refuse the conversation are asserted to refuse it, by name
(`REFUSES`), and those with tool calls ctxlock has no parser for are named with why (`NO_PARSER`)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
from dataclasses import dataclass, replace
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
from ctxlock.core import freeze
from ctxlock.errors import CtxlockError, TrajectoryError
from ctxlock.generation import END_TOKENS, REASONING_FORMATS, formats_for_template, start_from_prompt
from ctxlock.lint import lint
from ctxlock.probes import Corpus, Probe
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


# -- the engine's end-of-turn token -------------------------------------------------------------------------------

# The token each model ends its turn with, where the suite's stand-in vocabulary (`conformance.vocab_for`) lacks it
# as one token or has another eos. An engine stops on it and returns it with the ids, and ctxlock's parser ends the
# message at the model's `eos_token` or one of `generation.END_TOKENS` (it does not read generation_config.json): so
# the stand-in gets the token as a special token, and as its eos (`model_for`; one stand-in vocabulary holds the tokens
# of all the templates that run on it). The tokens are the ones the templates write at the end of the assistant turn
# (docs/tool-call-formats.md names the stop token for Seed-OSS, Kimi K3, Hy3), except GigaChat 3 and 3.1: they write
# `<|message_sep|>` after the text of a turn and again after its call, so the model cannot stop there; it ends with
# its end of sequence `</s>`, which vLLM's parser and its tests drop after a call
# (vllm/tool_parsers/gigachat3_tool_parser.py), and which the template writes as `<|message_sep|>` (`WRITES_INSTEAD`).
# Laguna's `</assistant>` is not its eos_token (its template opens with that, `〈|EOS|〉`).
END_OF_TURN: dict[str, str] = {
    "ByteDance-Seed-OSS.jinja": "<seed:eos>",
    "GigaChat3-10B-A1.8B.jinja": "</s>",
    "GigaChat3.1-10B-A1.8B.jinja": "</s>",
    "Kimi-K3.jinja": "<|end_of_msg|>",
    "MiniMax-M1.jinja": "<end_of_sentence>",
    "MiniMax-M2.jinja": "[e~[",
    "MiniMax-M3.jinja": "[e~[",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "<|im_end|>",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "<|im_end|>",
    "Reka-Edge.jinja": "<sep>",
    "ibm-granite-granite-4.0.jinja": "<|end_of_text|>",
    "ibm-granite-granite-4.1.jinja": "<|end_of_text|>",
    "inclusionai-ling-3.0-flash.jinja": "<|role_end|>",
    "poolside-Laguna-S-2.1.jinja": "</assistant>",
    "poolside-Laguna-XS-2.1.jinja": "</assistant>",
    "poolside-Laguna-XS.2.jinja": "</assistant>",
    "tencent-Hy3.jinja": "<｜hy_eos:opensource｜>",
}
STAND_IN_VERSION = 1  # of how `_stand_in` writes a vocabulary: a change writes new ones
# Where the model's end token is not what the template writes at the end of the turn: the text it stands in for.
WRITES_INSTEAD = {name: "<|message_sep|>" for name in ("GigaChat3-10B-A1.8B.jinja", "GigaChat3.1-10B-A1.8B.jinja")}
# Other control tokens of the models that their stand-ins lack: GigaChat's separators (the template's
# `<|message_sep|>` that the engine's `</s>` stands in for is one token, as in GigaChat's vocabulary), and Llama 3.1's
# `<|eom_id|>`, which ends functionary v3.1's tool-call turn (Llama 3's vocabulary, the stand-in, has none).
MODEL_TOKENS: dict[str, tuple[str, ...]] = {
    "GigaChat3-10B-A1.8B.jinja": ("<|message_sep|>", "<|role_sep|>"),
    "GigaChat3.1-10B-A1.8B.jinja": ("<|message_sep|>", "<|role_sep|>", "<|function_call|>"),
    "meetkai-functionary-medium-v3.1.jinja": ("<|eom_id|>",),
}


def _added(name: str) -> set[str]:
    return {*([END_OF_TURN[name]] if name in END_OF_TURN else []), *MODEL_TOKENS.get(name, ())}


@cache
def _stand_in(vocab: str) -> ctxlock.Model:
    """The stand-in vocabulary with the tokens of `END_OF_TURN` and `MODEL_TOKENS` it lacks (those of the templates
    that run on it) as special tokens, named at its placeholder ids (`[PAD151646]`, `<|reserved_special_token_4|>`,
    ...) as tests/reasoning_vocab.py names Qwen3's. Written once per machine into the test cache, next to the
    vocabulary it is made from (its pipeline is then built once per machine too)."""
    src = fetched.hf_tokenizer_dir(vocab)
    wanted = sorted({t for name in (*END_OF_TURN, *MODEL_TOKENS) if vocab_for(name) == vocab for t in _added(name)})
    if not wanted:
        return _model(vocab)
    key = hashlib.sha256(json.dumps([STAND_IN_VERSION, wanted]).encode()).hexdigest()[:12]
    out = src.parent / f"{src.name}-trajectory-{key}"
    if not (out / "tokenizer_config.json").is_file():
        data = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
        control = {t["content"] for t in data["added_tokens"] if t.get("special")}
        spare = iter(
            [t for t in data["added_tokens"] if t["content"].startswith(("[PAD", "<|reserved_special_token_"))]
        )
        vocab_ids = data["model"]["vocab"]
        for name in [t for t in wanted if t not in control]:
            if name in vocab_ids:  # a piece of the vocabulary (`</s>` in Qwen2's): made a special token at its id
                data["added_tokens"].append({**data["added_tokens"][0], "id": vocab_ids[name], "content": name})
                continue
            token = next(spare)
            vocab_ids[name] = vocab_ids.pop(token["content"])  # the model's vocab and the added token must agree
            token["content"], token["special"] = name, True
        tmp = Path(tempfile.mkdtemp(prefix=f".writing-{out.name}-", dir=src.parent))
        (tmp / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
        shutil.copy(src / "tokenizer_config.json", tmp / "tokenizer_config.json")  # last: the directory is complete
        try:
            tmp.rename(out)
        except OSError:  # another process wrote it first
            shutil.rmtree(tmp, ignore_errors=True)
    return ctxlock.load(str(out))


@cache
def model_for(name: str) -> ctxlock.Model:
    """The model a fixture template runs with: its stand-in vocabulary, with the model's tokens it lacks and the
    model's end-of-turn token as eos where `END_OF_TURN` names one."""
    vocab = vocab_for(name)
    base = _stand_in(vocab)
    end = END_OF_TURN.get(name)
    if end is None:
        return base
    special = freeze({**base.special_tokens, "eos_token": end})
    return ctxlock.Model(replace(base.artifacts, id=f"{base.id}+{end}", special_tokens=special))


_formats = cache(formats_for_template)  # a probe render per call: once per template source in this module


def _tool_templates() -> list[Path]:
    """The fixture templates with a tool-call format ctxlock parses, those of one model vocabulary together (each is
    loaded once, and its pieces, which ctxlock's trajectory caches for four vocabularies, are built once)."""
    out = []
    for path in fetched.template_paths():
        tool, _, _ = _formats(path.read_text("utf-8"))
        if tool is not None and tool != "harmony":  # Harmony needs gpt-oss's vocabulary: test_gpt_oss below
            out.append(path)
    return sorted(out, key=lambda p: (vocab_for(p.name), p.name))


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
# The other fixture templates, each by name with why it is not in the survey. Those that write tool calls in a
# format ctxlock has no parser for (why each has none yet: docs/tool-call-formats.md, "the other formats"), and one
# whose calls no request reaches: a new parser, or a template that changes what it writes, fails
# `test_every_other_fixture_template_is_named`.
NO_PARSER = {
    **dict.fromkeys(
        ("Apriel-1.6-15b-Thinker-fixed.jinja", "unsloth-Apriel-1.5.jinja"),
        "apriel: no vLLM parser, so no reference cases to check a parser against",
    ),
    **dict.fromkeys(
        ("Cohere2MoE.jinja", "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja"),
        "cohere_command: vLLM's parser hands the whole output to the cohere_melody package, so its cases do not pin "
        "the format down",
    ),
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "command_r_plus: no vLLM parser",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "firefunction_v2: no vLLM parser",
    "muse-glimmer.jinja": "muse_glimmer: vLLM has no tests for it",
    "upstage-Solar-Open-100B.jinja": "solar_open: no vLLM parser",
    # Its calls are DeepSeek-V3's (vLLM reads R1's with deepseek_v3), but no probe renders one:
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": (
        "no tool calls rendered: it writes its calls only for a message whose content is null, which a request "
        "ctxlock reads leaves out (the template then fails on the missing key), and with a content of '' it drops them"
    ),
}
# The templates that write no tool calls (the assistant's text only), and gpt-oss's, which has a test of its own.
NO_TOOL_CALLS = (
    "HuggingFaceTB-SmolLM3-3B.jinja",
    "LFM2-8B-A1B.jinja",
    "LFM2.5-Instruct.jinja",
    "google-gemma-2-2b-it.jinja",
    "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "llama-cpp-rwkv-world.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
)
HARMONY = "openai-gpt-oss-120b.jinja"  # gpt-oss's vocabulary: test_gpt_oss_harmony, on gpt-oss's own template
REASONING = "Let me check."


def _shared(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def engine_ids(
    model: ctxlock.Model,
    opts: dict[str, Any],
    data: dict[str, Any],
    message: dict[str, Any],
    prefix: str = "",
    instead: str | None = None,
) -> list[int]:
    """What an engine answering `data` writes for `message`: the template's own render of the assistant turn
    (the conversation with `message`, no generation prompt) from where it parts from the prompt with the
    generation prompt (never inside a `<...>` tag: a prompt ending `<think>` and a turn starting `</think>` part
    at the `<`) up to and including the last end token of the model in it (its eos or one of
    `generation.END_TOKENS`; else the template's end-of-turn text), as the render's own tokens (a token across
    either edge: its part encoded alone). `prefix`: text the engine writes first (a reasoning block the template
    does not write); `instead`: the template's text at the turn's end that the engine writes its eos in place of."""
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
    # The turn ends after the last end token of the model in it (a turn may end a message and start another:
    # GigaChat), else after the template's end-of-turn text; the engine writes its own end token instead of the text
    # `instead` names.
    eos = model.special_tokens.get("eos_token")
    at, end_token = max(((text.rfind(e, k), e) for e in (*END_TOKENS, eos) if e), key=lambda x: x[0])
    if at < 0:
        end_token = turn_marks(model, lay.rendered, opts, TOOLS).eot
        at = text.rfind(end_token, k) if end_token else -1
    end = at + len(end_token) if at >= 0 else len(text.rstrip())
    if instead is not None:
        end = text.rfind(instead, k)
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
    if instead is not None:
        ids += model.tokenizer.encode(str(eos), parse_special=True)
    return ids


def prefix_stable(model: ctxlock.Model, opts: dict[str, Any], data: dict[str, Any]) -> bool:
    """The oracle: `ctxlock lint`'s history-rewrite verdict on the whole conversation (docs/template-checks.md), run
    on it as the one probe: the render cut before each assistant turn (with the generation prompt) is a prefix of the
    render with the turn, and the render up to the turn a prefix of the render with the next message."""
    corpus = Corpus((Probe("trajectory", data),), ("test_trajectory",))
    template = opts.get("chat_template") or model.render(data, **opts).template
    variables = data.get("chat_template_kwargs")
    report = lint(model, template, corpus=corpus, rules=["history-rewrite"], engines=(), variables=variables)
    assert not report.skipped, report.skipped
    return not any(f.rule == "history-rewrite" for f in report.findings)


def first_parting(model: ctxlock.Model, opts: dict[str, Any], data: dict[str, Any]) -> int:
    """Where the whole render first parts from the first cut render (before an assistant turn with the generation
    prompt, or after it) that is not a prefix of it: the trajectory's text holds each cut render up to there. Its
    length when every cut render is a prefix of it. (Not lint's: its finding says where a cut render parts from the
    next cut, and the bound `check_first_fork` needs is against the whole render.)"""
    msgs = data["messages"]
    full = model.render(data, **opts, add_generation_prompt=msgs[-1]["role"] != "assistant").text
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        for cut, prompt in ((msgs[:k], True), (msgs[: k + 1], False)):
            text = model.render({**data, "messages": cut}, **opts, add_generation_prompt=prompt).text
            if not full.startswith(text):
                return _shared(text, full)
    return len(full)


@dataclass(frozen=True)
class Run:
    result: TrajectoryResult
    model: ctxlock.Model
    opts: dict[str, Any]
    given: list[list[int]]
    how: str  # how the engine's completions were written: "render", "render+reasoning", "tags"
    logprobs: list[list[float | None] | None]  # the log-probs given with each completion (None: none given)


def _prefix(reasoning: str | None, prompt: str) -> str:
    """The reasoning block an engine writes before its answer when the template writes none: the closing tag when
    the prompt opened the block, else an empty block."""
    fmt = REASONING_FORMATS.get(reasoning or "")
    if fmt is None:
        return ""
    return f"{fmt.close}\n\n" if start_from_prompt(fmt, prompt) == "reasoning" else f"{fmt.open}\n{fmt.close}\n\n"


def run_conversation(path: Path, how: str = "render", model: ctxlock.Model | None = None) -> Run:
    """A user asks, the engine calls the tool, the tool answers, the engine answers, the user thanks it."""
    model = model or model_for(path.name)
    instead = WRITES_INSTEAD.get(path.name) if model is model_for(path.name) else None
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
    turn = {"role": "assistant", "content": "", "tool_calls": [CALL], **extra}
    ids = engine_ids(model, opts, data, turn, prefix, instead)
    given.append(ids)
    # Each token its own log-prob (one not given in every third place), so a value out of place shows.
    probs: list[float | None] = [None if k % 3 == 2 else -(k + 1) / 64 for k in range(len(ids))]
    message = traj.complete(ids, probs, "tool_calls").to_openai()
    calls = message.get("tool_calls") or []
    after = (
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C"}
        if calls
        else {"role": "user", "content": "18 C"}
    )
    traj.add([after])
    data = traj.result().conversation
    ids = engine_ids(model, opts, data, {"role": "assistant", "content": "It is 18 C.", **extra}, prefix, instead)
    given.append(ids)
    traj.complete(ids)
    traj.add([{"role": "user", "content": "Thanks!"}])
    return Run(traj.result(), model, opts, given, how, [probs, None])


def _parsed_as_meant(run: Run) -> bool:
    """The call and the answer parse back (the answer's content with whatever else the engine wrote around it)."""
    first, second = (s.message or {} for s in run.result.steps if s.kind == "completion")
    calls = first.get("tool_calls") or []
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ] and "It is 18 C." in (second.get("content") or "")


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


def check_invariants(
    r: TrajectoryResult, given: list[list[int]], logprobs: list[list[float | None] | None] | None = None
) -> None:
    """The engine's ids are kept as given, trained, with their log-probs (`logprobs`: each completion's as given,
    None for none given) at their own tokens, each value as given, and NaN everywhere else; the forks are
    complete."""
    completions = [s for s in r.steps if s.kind == "completion"]
    assert [r.ids[s.start : s.end].tolist() for s in completions] == given
    trained = np.zeros(len(r.ids), dtype=np.int8)
    expected = np.full(len(r.ids), np.nan)
    for s, probs in zip(completions, logprobs or [None] * len(completions), strict=True):
        trained[s.start : s.end] = 1
        if probs is not None:
            expected[s.start : s.end] = [np.nan if p is None else p for p in probs]
    assert r.loss_mask.tolist() == trained.tolist()
    np.testing.assert_array_equal(r.logprobs, expected)  # NaN where expected NaN; every value exactly as given
    json_probs = r.to_dict()["logprobs"]
    assert json_probs == [None if math.isnan(x) else x for x in expected.tolist()]
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


def check_first_fork(run: Run, cut: int | None) -> None:
    """The independent oracle of where the trajectory first parts from the canonical render: the decoded texts'
    first differing character (no alignment), which can be no later than where the whole render parts from the
    first cut render that is not a prefix of it (`cut`: the trajectory's text holds each cut render up to there).
    The first fork whose sides' bytes differ must span that character on the canonical side, and belong to the
    step whose decoded tokens hold it."""
    r, tok = run.result, run.model.tokenizer
    ours, theirs = tok.decode(r.ids.tolist()), tok.decode(list(r.canonical_ids))
    first = _shared(ours, theirs)
    assert cut is None or first <= cut, (first, cut)
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


# The prefix-stable templates whose trajectory cannot be exact, each with the reason and the forks whose texts differ
# (step, cause, the trajectory's text, the canonical text). docs/trajectories.md lists them with the same reasons.
NOT_EXACT: dict[str, tuple[str, list[tuple[int, str, str, str]]]] = {
    **{
        name: (
            "the model ends its turn with its end of sequence `</s>` (END_OF_TURN), which the template writes as "
            "`<|message_sep|>`: a rerender at each turn's end, and the next delta is located after it",
            [(1, "rerender", "</s>", "<|message_sep|>"), (3, "rerender", "</s>", "<|message_sep|>")],
        )
        for name in ("GigaChat3-10B-A1.8B.jinja", "GigaChat3.1-10B-A1.8B.jinja")
    },
    **{
        name: (
            "the template writes a blank line between the content and the tool-call block; the parser (as vLLM's "
            "deepseek_v4) gives it back as the content, `\\n\\n`, which the template writes before its own blank "
            "line: the call turn is a rerender, and the delta after it is located",
            [(1, "rerender", "", "\n\n")],
        )
        for name in ("deepseek-ai-DeepSeek-V4.jinja", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja")
    },
    "Reka-Edge.jinja": (
        "its `<think>` markers are read as the qwen3 reasoning format, which takes an output without a reasoning "
        "block as reasoning when the prompt opens none; the template thinks only with enable_thinking, so the "
        "engine's turns parse back only with an empty block written first (how='tags'), which the template drops: "
        "both turns are rerenders",
        [
            (1, "rerender", "<think>\n</think>\n\n <", " \n\n \n\n<"),
            (3, "rerender", "<think>\n</think>\n\n", " \n\n"),
            (3, "rerender", ".\n\n", ".\n\n\n\n"),
        ],
    ),
}


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_fixture_templates(path: Path) -> None:
    """Where lint's verdict says prefix-stable, every delta is exact and the trajectory is the canonical render's
    text (a fork there is only a retokenization, at a step's edge), unless `NOT_EXACT` names the template, its
    reason and its forks (none a history rewrite); where it is not, a fork is a history rewrite and the first fork is
    where the cut renders say."""
    if path.name in REFUSES:  # asserted by test_a_refusing_template_is_a_typed_error
        with pytest.raises(CtxlockError):
            conversation(path.name)
        return
    run = conversation(path.name)
    r = run.result
    check_invariants(r, run.given, run.logprobs)
    assert _parsed_as_meant(run), f"{path.name}: the engine's ids did not parse back ({[s.notes for s in r.steps]})"
    if not prefix_stable(run.model, run.opts, r.conversation):
        assert path.name not in NOT_EXACT
        check_first_fork(run, first_parting(run.model, run.opts, r.conversation))
        # The labels agree with the verdict: a history rewrite here, none where the template is prefix-stable.
        assert any(f.cause == "history-rewrite" for f in r.forks), [f.to_dict() for f in r.forks]
        return
    check_first_fork(run, None)
    changed = [(f.step, f.cause, f.trajectory_text, f.canonical_text) for f in r.forks if f.cause != "retokenization"]
    if path.name in NOT_EXACT:
        assert changed == NOT_EXACT[path.name][1], [f.to_dict() for f in r.forks]
        return
    assert [s.how for s in r.steps] == ["render", "engine", "exact", "engine", "exact"], [s.notes for s in r.steps]
    assert changed == [] and all(s.reproduces for s in r.steps if s.kind == "completion"), changed
    tok = run.model.tokenizer
    assert tok.decode(list(r.ids)) == tok.decode(list(r.canonical_ids))
    first, second = (s.message or {} for s in r.steps if s.kind == "completion")
    assert (first["content"].strip(), second["content"].strip()) == ("", "It is 18 C."), (first, second)


def test_an_end_token_left_in_the_content_is_a_rerender_not_a_history_rewrite() -> None:
    """An end of turn the parser does not know as one stays in the parsed tool-call message's content, and these
    prefix-stable templates write that content before the call even while the turn is the last: Laguna's
    `</assistant>` when the model's eos is not named so (the stand-in's own `<|endoftext|>`), granite's
    `<|end_of_text|>` when the engine wrote it as plain pieces. The fork is the completion's (step 1) and a rerender:
    the template writes the turn so from the start and never rewrites it (a shared `<` between the engine's
    `<tool_call>` and the template's `</assistant>` is no agreement), and text the canonical render adds after the
    prompt's last token is the completion's."""
    for name, inserted in (
        ("poolside-Laguna-XS.2.jinja", "</assistant>"),
        ("ibm-granite-granite-4.0.jinja", "<|end_of_text|>"),
    ):
        path = fetched.templates_dir() / name
        model = _stand_in(vocab_for(name))
        opts: dict[str, Any] = {"chat_template": ChatTemplate(path.read_text("utf-8"), id=name), "now": FIXED_NOW}
        data: dict[str, Any] = {"tools": TOOLS, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
        ids = engine_ids(model, opts, data, {"role": "assistant", "content": "", "tool_calls": [CALL]})
        assert model.tokenizer.id_to_token(ids[-1]) == inserted
        if inserted in END_TOKENS:
            ids = ids[:-1] + model.tokenizer.encode_text(inserted, at_start=False)
        traj = Trajectory(model, data, opts)
        message = traj.complete(ids, None, "tool_calls").to_openai()
        assert inserted in message["content"]
        traj.add([{"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "18 C"}])
        r = traj.result()
        assert prefix_stable(model, opts, r.conversation)
        changed = [f for f in r.forks if f.trajectory_text != f.canonical_text]
        assert [(f.step, f.cause) for f in changed] == [(1, "rerender")], [f.to_dict() for f in r.forks]
        assert inserted in changed[0].canonical_text


def test_every_other_fixture_template_is_named() -> None:
    """Every fixture template is in the survey (`TEMPLATES`: a tool-call format ctxlock parses, `REFUSES` among
    them), or named with why not: `NO_PARSER` (the format its note names, which ctxlock does not parse yet; or no
    call rendered), `NO_TOOL_CALLS`, or gpt-oss's Harmony. A new parser, or a new template, changes this test."""
    names = {p.name for p in fetched.template_paths()}
    surveyed = {p.name for p in TEMPLATES}
    others = {*NO_PARSER, *NO_TOOL_CALLS, HARMONY}
    assert surveyed.isdisjoint(others) and names == surveyed | others, (names - surveyed - others, others - names)
    for name in sorted(others):
        tool, _, note = _formats((fetched.templates_dir() / name).read_text("utf-8"))
        assert tool == ("harmony" if name == HARMONY else None), (name, note)
        if name in NO_PARSER and not NO_PARSER[name].startswith("no tool calls"):
            fmt = NO_PARSER[name].split(":")[0]
            assert f"writes {fmt} tool calls, which ctxlock does not parse yet" in note, (name, note)
        elif name != HARMONY:
            assert "writes no tool calls ctxlock recognizes (no tool calls rendered)" in note, (name, note)


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
    assert not prefix_stable(model, opts, r.conversation)
    check_first_fork(Run(r, model, opts, given, "harmony", [None, None]), first_parting(model, opts, r.conversation))
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
    model = model_for(QWEN)
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
    """The example line through `build_line`: its ids kept, each of its log-probs at its token (its first completion
    gives them, a few null; its second none), its two forks."""
    line = Path("examples/weather-trajectory.jsonl").read_bytes()
    value = read_line(line, "ex:1")
    r = build_line(ctxlock.load(), value, "ex:1")
    completions = [step for step in value["steps"] if "completion_ids" in step]
    check_invariants(r, [c["completion_ids"] for c in completions], [c.get("logprobs") for c in completions])
    assert [c.get("logprobs") is None for c in completions] == [False, True]
    assert [f.cause for f in r.forks] == ["history-rewrite", "retokenization"]


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
