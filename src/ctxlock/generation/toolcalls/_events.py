"""The values a tool-call stream produces: the formats and release modes, the events, the `Result`, and how a
stream may end (the finish reasons that count as a normal end, and the output-limit ones)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ctxlock.errors import ToolCallError

DEFAULT_MAX_EVENT_SIZE = 64 << 20  # characters buffered for one SSE line / event / tool_use input (anthropic)

TRUNCATED_MESSAGE = (
    "the response hit the output token limit, so tool call arguments may be truncated; re-issue the call"
)


class ToolCallFormat(StrEnum):
    """How the model writes its calls: OpenAI streaming chunks, or one of the raw-text conventions."""

    OPENAI = "openai"  # chat.completion.chunk dicts with delta.tool_calls fragments
    HERMES = "hermes"  # Hermes 2 Pro / Qwen2.5: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
    QWEN3_CODER = "qwen3_coder"  # Qwen3-Coder / Qwen3.5: <tool_call><function=f><parameter=p>v</parameter>...
    MISTRAL = "mistral"  # [TOOL_CALLS]name[ARGS]{...} (v11+) or [TOOL_CALLS][{"name": ..., ...}] (before v11)
    # Llama 3.1-3.3: {"name": ..., "parameters": {...}}, optionally after <|python_tag|>, several joined by "; "
    LLAMA3_JSON = "llama3_json"
    # [get_weather(city='Paris'), g()]: bare (Llama 3.2), in <|python_start|>...<|python_end|> (Llama 4) or in
    # <|tool_call_start|>...<|tool_call_end|> (LFM2.5)
    PYTHONIC = "pythonic"
    # Granite 3.x: <|tool_call|>[{"name": ..., "arguments": {...}}, ...] (Granite 4 writes the hermes form)
    GRANITE = "granite"
    ANTHROPIC = "anthropic"  # Messages API stream: SSE text (event:/data: lines) or the parsed event dicts
    HARMONY = "harmony"  # gpt-oss: <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>
    # DeepSeek-V3 / R1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{...}\n```
    # <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
    DEEPSEEK_V3 = "deepseek_v3"
    # DeepSeek-V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
    # <｜tool▁calls▁end｜>
    DEEPSEEK_V31 = "deepseek_v31"
    # DeepSeek-V3.2 (DSML): <｜DSML｜function_calls>\n<｜DSML｜invoke name="name">\n<｜DSML｜parameter name="p"
    # string="true">value</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>
    DEEPSEEK_V32 = "deepseek_v32"
    # DeepSeek-V4 (DSML, as V3.2 in another block): <｜DSML｜tool_calls>\n<｜DSML｜invoke name="name">\n
    # <｜DSML｜parameter name="p" string="true">value</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>
    DEEPSEEK_V4 = "deepseek_v4"
    # Kimi-K2: <|tool_calls_section_begin|><|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}
    # <|tool_call_end|>...<|tool_calls_section_end|>; "functions.name:0" is the call's id
    KIMI_K2 = "kimi_k2"
    # MiniMax-M2: <minimax:tool_call><invoke name="f"><parameter name="p">v</parameter></invoke>...</minimax:tool_call>
    MINIMAX_M2 = "minimax_m2"
    # MiniMax-M1: <tool_calls>\n{"name": "f", "arguments": {...}}\n{"name": "g", "arguments": {...}}\n</tool_calls>
    MINIMAX = "minimax"
    APERTUS = "apertus"  # Apertus: <|tools_prefix|>[{"f": {...}}, ...]<|tools_suffix|>
    LFM2 = "lfm2"  # LFM2 / LFM2.5: <|tool_call_start|>[f(city='Paris', days=3), ...]<|tool_call_end|>
    # GigaChat 3 / 3.1: <|message_sep|>\n\nfunction call<|role_sep|>\n{"name": ...} or <|function_call|>{"name": ...}
    GIGACHAT3 = "gigachat3"
    NEMOTRON_JSON = "nemotron_json"  # Nemotron Nano v2: <TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL>
    # Tencent Hy3: <tool_calls><tool_call>f<tool_sep><arg_key>k</arg_key><arg_value>v</arg_value></tool_call>...
    HY_V3 = "hy_v3"
    # MiniMax-M3: ]<]minimax[>[<tool_call>, <invoke name="f">, one element per argument; ]<]minimax[>[ before each tag
    MINIMAX_M3 = "minimax_m3"
    # Kimi K3 (XTML): <|open|>tools<|sep|><|open|>call tool="f"<|sep|><|open|>argument key="k" type="string"<|sep|>...
    KIMI_K3 = "kimi_k3"
    GEMMA4 = "gemma4"  # Gemma 4: <|tool_call>call:f{city:<|"|>Paris<|"|>,days:3}<tool_call|>
    # vLLM's qwen3_xml parser reads the same Qwen3-Coder output as qwen3_coder: one parser serves both names.
    QWEN3_XML = "qwen3_xml"
    SEED_OSS = "seed_oss"  # Seed-OSS: <seed:tool_call>\n<function=f>\n<parameter=p>v</parameter>\n</function>\n...
    GLM45 = "glm45"  # GLM-4.5/4.6/4.7: <tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>
    MINICPM5 = "minicpm5"  # MiniCPM5: <function name="f"><param name="p">v</param></function>, one element per call
    FUNCTIONARY_V3_1 = "functionary_v3_1"  # functionary-medium-v3.1: <function=f>{"city": "Paris"}</function>
    # functionary-medium-v3.2 (after the prompt's >>>): all\nsome text>>>f\n{"city": "Paris"}>>>g\n{...}
    FUNCTIONARY_V3_2 = "functionary_v3_2"


class Release(StrEnum):
    """When a complete, valid call is handed out as `ToolCallReady`."""

    # Default: only from finish(), and only when the stream ended normally (stop, tool_calls, end_turn, tool_use,
    # stop_sequence). A response cut off by the output limit, a filter or an error releases nothing.
    FINISH = "finish"
    # As soon as the call is complete, from feed(). The stream may still end at the output limit or in an error
    # after the call was handed out: a call from a cut-off response may then have run.
    EARLY = "early"


# How a stream may end for its calls to be released (OpenAI's and Anthropic's words for a normal end).
NORMAL_STOPS = frozenset({"stop", "tool_calls", "end_turn", "tool_use", "stop_sequence"})
# The output limit, in the words of OpenAI and vLLM ("length"), Anthropic ("max_tokens",
# "model_context_window_exceeded") and Mistral's API ("model_length").
LENGTH_STOPS = frozenset({"length", "max_tokens", "model_length", "model_context_window_exceeded"})


# ---------------------------------------------------------------------------------------------------------------
# Events and the result


@dataclass(frozen=True)
class TextDelta:
    """Text outside any tool call, passed through unchanged."""

    text: str


@dataclass(frozen=True)
class ToolCallReady:
    """A complete call whose arguments validate against its tool's schema: safe to execute."""

    index: int  # position of the call in the message (0, 1, ...), in the order the calls started
    id: str
    name: str
    arguments: dict[str, Any] = field(hash=False)
    raw_arguments: str  # the arguments as the model wrote them (openai, mistral v11) or as canonical JSON

    def to_openai(self) -> dict[str, Any]:
        """The call in OpenAI's message form (`arguments` as a JSON string)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.raw_arguments}}

    def to_anthropic(self) -> dict[str, Any]:
        """The call as an Anthropic `tool_use` content block (`input` as an object)."""
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": self.arguments}


@dataclass(frozen=True)
class ToolCallRejected:
    """A complete call that is not released; `error` says why and can be sent back with `to_model(error)`."""

    index: int
    id: str | None
    name: str | None
    error: ToolCallError = field(hash=False)


Event = TextDelta | ToolCallReady | ToolCallRejected


@dataclass(frozen=True)
class Result:
    """What a finished stream amounts to."""

    calls: tuple[ToolCallReady, ...]  # released calls, in index order
    errors: tuple[ToolCallError, ...]  # rejected, truncated and unterminated calls, in index order
    text: str  # all text outside calls
    finish_reason: str | None  # see the module docstring for the mapping
    stream_finish_reason: str | None  # the reason the stream itself gave
    events: tuple[Event, ...] = ()  # the events that finish() itself released (held-back text, last calls)
    notes: tuple[str, ...] = ()  # what the stream held that is neither text nor a released call (anthropic)
    thinking: str = ""  # anthropic: the text of the thinking blocks (never part of `text`)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_message(self) -> dict[str, Any]:
        """The assistant message in OpenAI form: the text and the released calls (never a failed one)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.calls:
            message["tool_calls"] = [c.to_openai() for c in self.calls]
        return message


def to_model(error: ToolCallError) -> dict[str, Any]:
    """A tool-result message that tells the model what was wrong with its call, so it can call again.

    `content` is JSON: the error type, message, path (`tool_calls[0].arguments.location`), hint and, for invalid
    arguments, every schema violation. `tool_call_id` is the failed call's id when it had one.
    """
    message: dict[str, Any] = {"role": "tool", "content": json.dumps(error.to_dict(), ensure_ascii=False)}
    if error.call_id is not None:
        message["tool_call_id"] = error.call_id
    if error.tool_name is not None:
        message["name"] = error.tool_name
    return message


def error_payload(chunk: Any) -> Any:
    """The provider's error object when a chunk is an in-band error, else None.

    OpenAI (and vLLM since 0.6) send `{"error": {"message", "type", "param", "code"}}`; older vLLM sent its
    ErrorResponse flat, `{"object": "error", "message", "type", "code"}`."""
    if not isinstance(chunk, Mapping):
        return None
    if chunk.get("error") is not None:
        return chunk["error"]
    if chunk.get("object") == "error":
        return chunk
    return None
