"""Shared pieces of the conformance suites: the corpus, the template↔vocabulary pairing, a fixed clock."""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from typing import Any

CONVERSATIONS_DIR = Path(__file__).parent / "data" / "conversations"
FIXED_NOW = datetime(2024, 7, 26, 10, 30, 0)


def conversations() -> list[tuple[str, dict[str, Any], dict[str, bool]]]:
    """(name, request without _options, options) for every corpus file."""
    out = []
    for path in sorted(CONVERSATIONS_DIR.glob("*.json")):
        data = json.loads(path.read_text("utf-8"))
        options = data.pop("_options", {})
        out.append(
            (
                path.stem,
                data,
                {
                    "add_generation_prompt": bool(options.get("add_generation_prompt", False)),
                    "continue_final_message": bool(options.get("continue_final_message", False)),
                },
            )
        )
    return out


def vocab_for(template_name: str) -> str:
    """The issue's pairing: Qwen↔qwen2/qwen35, Llama 3↔llama-bpe, Phi↔phi-3, DeepSeek↔deepseek, the rest↔qwen2.
    A distilled model keeps its base model's vocabulary (R1-Distill-Llama is Llama 3, R1-Distill-Qwen is Qwen)."""
    n = template_name.lower()
    if "qwen3.5" in n:
        return "qwen35"
    if "distill-llama" in n or "llama-3" in n or "llama3" in n or "firefunction" in n or "functionary" in n:
        return "llama-bpe"
    if "qwen" in n or "qwq" in n:
        return "qwen2"
    if "phi-3" in n or "phi3" in n:
        return "phi-3"
    if "deepseek" in n and "distill" not in n:
        return "deepseek-llm"
    return "qwen2"


class FixedClock(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
        return FIXED_NOW if tz is None else FIXED_NOW.replace(tzinfo=tz)


# Variables a template needs beyond the standard ones, passed to both ctxlock and transformers.
TEMPLATE_KWARGS: dict[str, dict[str, Any]] = {
    # firefunction-v2 reads `functions` (its tool list) and `datetime` strings, and fails as undefined without them.
    "fireworks-ai-llama-3-firefunction-v2.jinja": {"functions": "", "datetime": "2024-07-26 10:30"},
}


def string_argument_paths(data: dict[str, Any]) -> list[str]:
    """The JSON paths of tool-call `arguments` sent as strings (the OpenAI wire form) in a raw request."""
    return [
        f"messages[{i}].tool_calls[{k}].function.arguments"
        for i, m in enumerate(data.get("messages") or [])
        for k, call in enumerate(m.get("tool_calls") or [])
        if isinstance(call.get("function", {}).get("arguments"), str)
    ]


def with_parsed_arguments(data: dict[str, Any]) -> dict[str, Any]:
    """The raw request with every string `arguments` replaced by the object it holds: what ctxlock renders by default
    (as vLLM does), the one documented difference from transformers on the raw request."""
    out = copy.deepcopy(data)
    for m in out.get("messages") or []:
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            if isinstance(fn.get("arguments"), str):
                fn["arguments"] = json.loads(fn["arguments"])
    return out


def has_content_parts(data: dict[str, Any]) -> bool:
    """Whether some message of a raw request sends its content as a list of parts."""
    return any(isinstance(m.get("content"), list) for m in data.get("messages") or [])


def with_joined_content(data: dict[str, Any]) -> dict[str, Any]:
    """The raw request with every content-part list replaced by its text parts joined with "\n": what ctxlock
    renders, by default, with a template whose content format is "string" (README, "Differences from the
    references"); the lists must hold text parts only."""
    out = copy.deepcopy(data)
    for m in out.get("messages") or []:
        if isinstance(m.get("content"), list):
            assert all(p.get("type") == "text" for p in m["content"]), m["content"]
            m["content"] = "\n".join(p["text"] for p in m["content"])
    return out


def only_text_parts(data: dict[str, Any]) -> bool:
    return all(
        p.get("type") == "text"
        for m in data.get("messages") or []
        if isinstance(m.get("content"), list)
        for p in m["content"]
    )
