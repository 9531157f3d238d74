"""Which tool-call format each fixture chat template writes (docs/tool-call-formats.md, "the fixture templates'
other formats").

Every chat template of llama.cpp in the fixture cache (`fetched.template_paths()`) renders one conversation: the
user asks, the assistant answers with text and two tool calls (one with unicode and quotes, one with nested
arguments). The part the assistant wrote (the render minus the longest prefix it shares with the prompt rendered
with the generation prompt) is classified by its markers into the format a parser must read. `SURVEY` is the
expected answer, kept as data: a new template, or a template that changes what it writes, fails here until the
table (and the docs table) say so. Each template is rendered once.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import fetched
from ctxlock.artifacts import load_template_file
from ctxlock.errors import CtxlockError
from ctxlock.generation import formats_for_template
from ctxlock.generation._detect import NO_CALLS, classify_written
from ctxlock.generation.toolcalls import PARSERS
from ctxlock.request import ToolArguments, parse_request
from ctxlock.template._render import render


def _prop(kind: str, text: str, **more: Any) -> dict[str, Any]:
    # Every property has a description (command-r-plus' template reads it) and one plain type (Hermes-2-Pro's
    # json_to_python_type recurses without end on a type list).
    return {"type": kind, "description": text, **more}


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": _prop("string", "The city."), "metric": _prop("boolean", "Metric units.")},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": _prop("string", "What to look for."),
                    # additionalProperties: command-r-plus' json_to_python_type reads it on every object.
                    "filters": _prop("object", "Filters.", additionalProperties={"type": "string"}),
                    "tags": _prop("array", "Tags.", items={"type": "string"}),
                    "limit": _prop("integer", "How many."),
                },
                "required": ["query"],
            },
        },
    },
]
WEATHER_ARGS = {"city": 'Zürich "HB" \\ 天气 🌧', "metric": True}
SEARCH_ARGS = {
    "query": "line one\nline two <b>x</b>",
    "filters": {"lang": "de", "region": "CH"},
    "tags": ["a"],
    "limit": 5,
}
CALLS = [
    # Mistral's templates want ids of 9 alphanumeric characters.
    {"id": "a1b2c3d4e", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(WEATHER_ARGS)}},
    {"id": "f5g6h7i8j", "type": "function", "function": {"name": "search_docs", "arguments": json.dumps(SEARCH_ARGS)}},
]
USER = {"role": "user", "content": "Weather in Zürich, and search the docs?"}
ASSISTANT = {"role": "assistant", "content": "Looking it up.", "tool_calls": CALLS}
# What llama.cpp hands every template (common/chat.cpp): bos and eos; firefunction-v2's `functions` (the tools as
# JSON) and `datetime`. functionary-v3.2 concatenates the arguments as a string, as transformers passes them.
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}
EXTRA_VARIABLES = {
    "fireworks-ai-llama-3-firefunction-v2.jinja": {"functions": json.dumps(TOOLS, indent=2), "datetime": "2026-12-05"}
}
AS_SENT = {"meetkai-functionary-medium-v3.2.jinja"}


# The markers that tell the formats apart are ctxlock's own (`WRITTEN`, used by `formats_for_template` too).
def _render(path: Path, template: Any, messages: list[dict[str, Any]], prompt: bool) -> str:
    body = {"messages": messages, "tools": TOOLS, "chat_template_kwargs": EXTRA_VARIABLES.get(path.name, {})}
    arguments = ToolArguments.AS_SENT if path.name in AS_SENT else ToolArguments.PARSED
    request = parse_request(json.dumps(body).encode(), tool_arguments=arguments)
    return render(request, template, add_generation_prompt=prompt, special_tokens=SPECIAL_TOKENS).text


def generated_part(path: Path, calls: list[dict[str, Any]]) -> str:
    """What the template writes for the assistant turn (past the prefix it shares with the generation prompt)."""
    template = load_template_file(path)
    full = _render(path, template, [USER, {**ASSISTANT, "tool_calls": calls}], prompt=False)
    prompt = _render(path, template, [USER], prompt=True)
    k = 0
    while k < min(len(full), len(prompt)) and full[k] == prompt[k]:
        k += 1
    return full[k:]


@cache
def survey(path: Path) -> tuple[str, int, str]:
    """(format, calls rendered, note) for one template: its error when it renders neither two calls nor one."""
    try:
        text = generated_part(path, CALLS)
        note = ""
    except CtxlockError as exc:
        # Templates that accept one call per turn (Llama 3.x) say so by raising: survey them with one call.
        try:
            text = generated_part(path, CALLS[:1])
        except CtxlockError:
            return "render error", 0, f"{type(exc).__name__}: {exc.message}"
        note = f"one call only: two raise {type(exc).__name__}"
    rendered = sum(name in text for name in ("get_weather", "search_docs"))
    return classify_written(text), rendered, note


# template -> (format, how many of the two calls the template writes). Each row is explained in
# docs/tool-call-formats.md (render errors with their reason).
SURVEY: dict[str, tuple[str, int]] = {
    "Apertus-8B-Instruct.jinja": ("apertus", 2),
    "Apriel-1.6-15b-Thinker-fixed.jinja": ("apriel", 2),
    "Bielik-11B-v3.0-Instruct.jinja": ("hermes", 2),
    "ByteDance-Seed-OSS.jinja": ("seed_oss", 2),
    "Cohere2MoE.jinja": ("cohere_command", 2),
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": ("command_r_plus", 2),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": ("cohere_command", 2),
    "GLM-4.6.jinja": ("glm45", 2),
    "GLM-4.7-Flash.jinja": ("glm45", 2),
    "GigaChat3-10B-A1.8B.jinja": ("gigachat3", 1),
    "GigaChat3.1-10B-A1.8B.jinja": ("gigachat3", 1),
    "HuggingFaceTB-SmolLM3-3B.jinja": (NO_CALLS, 0),
    "Kimi-K2-Instruct.jinja": ("render error", 0),
    "Kimi-K2-Thinking.jinja": ("render error", 0),
    "Kimi-K3.jinja": ("kimi_k3", 2),
    "LFM2-8B-A1B.jinja": (NO_CALLS, 0),
    "LFM2.5-8B-A1B.jinja": ("lfm2", 2),
    "LFM2.5-Instruct.jinja": (NO_CALLS, 0),
    "MiMo-VL.jinja": ("hermes", 2),
    "MiniMax-M1.jinja": ("minimax", 2),
    "MiniMax-M2.jinja": ("minimax_m2", 2),
    "MiniMax-M3.jinja": ("minimax_m3", 2),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("mistral", 2),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": ("qwen3_coder", 2),
    "NVIDIA-Nemotron-Nano-v2.jinja": ("nemotron_json", 2),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": ("hermes", 2),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("hermes", 2),
    "Qwen-QwQ-32B.jinja": ("hermes", 2),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("hermes", 2),
    "Qwen-Qwen3-0.6B.jinja": ("hermes", 2),
    "Qwen3-Coder.jinja": ("qwen3_coder", 2),
    "Qwen3.5-4B.jinja": ("qwen3_coder", 2),
    "Reka-Edge.jinja": ("hermes", 2),
    "Spark2.5.jinja": ("glm45", 2),
    "StepFun3.5-Flash.jinja": ("qwen3_coder", 2),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": (NO_CALLS, 0),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("deepseek_v3", 2),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek_v31", 2),
    "deepseek-ai-DeepSeek-V3.2.jinja": ("deepseek_v32", 2),
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": ("deepseek_v4", 2),
    "deepseek-ai-DeepSeek-V4.jinja": ("deepseek_v4", 2),
    "fireworks-ai-llama-3-firefunction-v2.jinja": ("firefunction_v2", 2),
    "google-gemma-2-2b-it.jinja": (NO_CALLS, 0),
    "google-gemma-4-31B-it-interleaved.jinja": ("gemma4", 2),
    "google-gemma-4-31B-it.jinja": ("gemma4", 2),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": (NO_CALLS, 0),
    "ibm-granite-granite-4.0.jinja": ("hermes", 2),
    "ibm-granite-granite-4.1.jinja": ("hermes", 2),
    "inclusionai-ling-3.0-flash.jinja": ("glm45", 2),
    "llama-cpp-deepseek-r1.jinja": ("render error", 0),
    "llama-cpp-rwkv-world.jinja": (NO_CALLS, 0),
    "meetkai-functionary-medium-v3.1.jinja": ("functionary_v3_1", 2),
    "meetkai-functionary-medium-v3.2.jinja": ("functionary_v3_2", 2),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("llama3_json", 1),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("llama3_json", 1),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("llama3_json", 1),
    "microsoft-Phi-3.5-mini-instruct.jinja": (NO_CALLS, 0),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("mistral", 2),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("mistral", 2),
    "moonshotai-Kimi-K2.jinja": ("kimi_k2", 2),
    "muse-glimmer.jinja": ("muse_glimmer", 2),
    "openai-gpt-oss-120b.jinja": ("harmony", 1),
    "openbmb-MiniCPM5-1B.jinja": ("minicpm5", 2),
    "poolside-Laguna-S-2.1.jinja": ("glm45", 2),
    "poolside-Laguna-XS-2.1.jinja": ("glm45", 2),
    "poolside-Laguna-XS.2.jinja": ("glm45", 2),
    "tencent-Hy3.jinja": ("hy_v3", 2),
    "unsloth-Apriel-1.5.jinja": ("apriel", 2),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("mistral", 2),
    "upstage-Solar-Open-100B.jinja": ("solar_open", 2),
}


def test_every_fixture_template_is_in_the_table() -> None:
    names = {p.name for p in fetched.template_paths()}
    assert names - SURVEY.keys() == set(), "a new fixture template: survey it and add its row (and the docs row)"
    assert SURVEY.keys() - names == set(), "a template left the fixtures: remove its row"


@pytest.mark.parametrize("name", sorted(SURVEY))
def test_template_writes_the_surveyed_format(name: str) -> None:
    fmt, rendered, note = survey(fetched.templates_dir() / name)
    assert (fmt, rendered) == SURVEY[name], note


def test_the_transformers_conversions_render_no_calls() -> None:
    """The chat templates transformers wrote when converting fixture GGUFs (qwen2, qwen35, phi-3), where present:
    they come from the GGUF's own metadata and ignore `tool_calls`."""
    root = fetched.cache_dir() / "hf-from-gguf"
    for path in sorted(root.rglob("chat_template.jinja")) if root.is_dir() else []:
        assert survey(path)[:2] == (NO_CALLS, 0), path


# Templates the survey cannot render a call through, whose format `formats_for_template` reads all the same: Kimi-K2's
# from the markers of its source (no probe renders: the sandbox refuses its `list.append`), llama.cpp's deepseek-r1
# from a probe without tools (its `tools | map(...) | tojson` fails on any tools; it writes DeepSeek-V3's calls, which
# vLLM's deepseek_v3 parser reads for R1, docs/tool-call-formats.md).
READ_WITHOUT_THE_SURVEYS_RENDER = {
    "Kimi-K2-Instruct.jinja": ("kimi_k2", "read from the template's source"),
    "Kimi-K2-Thinking.jinja": ("kimi_k2", "read from the template's source"),
    "llama-cpp-deepseek-r1.jinja": ("deepseek_v3", "read without the probe's tools"),
}


@pytest.mark.parametrize("name", sorted(SURVEY))
def test_parse_reads_the_format_each_template_writes(name: str) -> None:
    """`formats_for_template` (what `ctxlock parse` uses when no format is named) gives the surveyed format when
    ctxlock parses it, and None, with a note naming it, when it does not."""
    source = (fetched.templates_dir() / name).read_text(encoding="utf-8")
    tool, _, note = formats_for_template(source)
    if name in READ_WITHOUT_THE_SURVEYS_RENDER:
        assert SURVEY[name][0] == "render error"
        fmt, how = READ_WITHOUT_THE_SURVEYS_RENDER[name]
        assert tool == fmt and how in note, note
        return
    surveyed = SURVEY[name][0]
    parsed = {f.value for f in PARSERS}
    assert tool == (surveyed if surveyed in parsed else None), note
    if surveyed not in parsed and surveyed not in (NO_CALLS, "render error") and "probe render failed" not in note:
        assert surveyed in note and "does not parse yet" in note
