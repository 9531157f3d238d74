"""A Qwen3 tokenizer for the reasoning tests, built from what the registries hold.

Qwen3's tokenizer is Qwen2's byte-level BPE with more added tokens; llama.cpp's qwen2 vocabulary (converted to an HF
directory by transformers, tests/fetched.py) has placeholders (`[PAD151646]` ...) at their ids. `qwen3_dir` names
them as Qwen3's tokenizer_config.json does (`<tool_call>` 151657, `</tool_call>` 151658, `<think>` 151667,
`</think>` 151668), so ids match the real model's. The other families' tags (`<seed:think>`, `[THINK]`, Kimi's
`<|tool_calls_section_begin|>`, ...) are added at the next placeholders, as vLLM's own base-parser test adds its tags
to a real tokenizer (tests/reasoning/test_base_thinking_reasoning_parser.py in vllm-project/vllm): their ids are not
the real models', but the splitter only needs each tag to be one token."""

from __future__ import annotations

import json
import shutil
from functools import cache
from pathlib import Path

import fetched
from ctxlock.artifacts._hf_dir import load_hf_dir
from ctxlock.tokenizer import Tokenizer

QWEN3_ADDED = {
    151657: "<tool_call>",
    151658: "</tool_call>",
    151665: "<tool_response>",
    151666: "</tool_response>",
    151667: "<think>",
    151668: "</think>",
}
OTHER_TAGS = (
    "<seed:think>",
    "</seed:think>",
    "[THINK]",
    "[/THINK]",
    "<seed:tool_call>",
    "</seed:tool_call>",
    "<|tool_calls_section_begin|>",
)


@cache
def qwen3_dir(root: Path) -> Path:
    """An HF tokenizer directory under `root` with Qwen3's added tokens and the other families' tags."""
    src = fetched.hf_tokenizer_dir("qwen2")
    data = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    names = dict(QWEN3_ADDED)
    names.update({151669 + k: tag for k, tag in enumerate(OTHER_TAGS)})
    vocab = data["model"]["vocab"]
    for token in data["added_tokens"]:
        name = names.get(token["id"])
        if name is not None:
            vocab[name] = vocab.pop(token["content"])  # the model's vocab and the added token must agree
            token["content"] = name
    out = root / "qwen3-tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    shutil.copy(src / "tokenizer_config.json", out / "tokenizer_config.json")
    return out


def qwen3_model_dir(root: Path, template: str = "Qwen-Qwen3-0.6B.jinja") -> Path:
    """`qwen3_dir` with a real Qwen3 chat template from the fixture cache as its chat_template.jinja: a model
    directory ctxlock loads like the real one (same ids, same template)."""
    out = root / f"qwen3-model-{Path(template).stem}"
    if not out.is_dir():
        shutil.copytree(qwen3_dir(root), out)
        shutil.copy(fetched.templates_dir() / template, out / "chat_template.jinja")
    return out


@cache
def qwen3_tokenizer(root: Path) -> Tokenizer:
    """The tokenizer of `qwen3_dir(root)`, loaded once per session for every reasoning test module (parsing its
    vocabulary takes seconds)."""
    return load_hf_dir(qwen3_dir(root)).tokenizer
