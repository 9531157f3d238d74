"""Streaming tool-call assembly: a call is released whole and valid, or not at all.

A model streams a tool call a few characters at a time; the first delta is half a JSON object (docs/way-back.md).
`ToolCallAssembler` consumes the stream and emits events:

- `TextDelta` for text outside calls, as soon as it cannot be the start of a call marker (only a possible prefix
  of the marker, at most `len(marker) - 1` characters, is held back);
- `ToolCallReady` for a call that is complete (its closing marker has been seen), whose arguments are a JSON object
  that validates against the tool's JSON Schema, and whose response ended normally (see "Release" below);
- `ToolCallRejected` once a call is complete but cannot be released (unknown tool, malformed JSON, invalid
  arguments); its `error` can go back to the model as a tool result (`to_model`).

`finish(finish_reason)` ends the stream and returns a `Result`. A call still open at the end is never released:
with a length stop it is a `ToolCallTruncatedError`, otherwise an unterminated `ToolCallError`.

Release (the truncation rule of Pi (github.com/badlogic/pi-mono): it runs no tool call from a response that hit the
output limit). By default (`release="finish"`) `ToolCallReady` comes only from `finish()`, and only when the stream
ended normally: `stop`, `tool_calls`, `end_turn`, `tool_use` or `stop_sequence`. Under any other end (`length`,
`max_tokens`, `content_filter`, `refusal`, `pause_turn`, an unknown reason, no reason at all, or arguments that end
mid-JSON whatever the reason says) every complete call becomes an error saying it was not executed, and nothing is
released. `release="early"` releases each call from `feed()` as soon as it is complete; a call of a response that is
then cut off may have run, and the errors and `Result.notes` say so.

In-band errors: a provider error inside a started stream (an OpenAI `{"error": ...}` chunk, vLLM's flat
`{"object": "error", ...}`, Anthropic's `event: error`; for raw-text formats, that object fed in place of text)
makes `feed()` raise `ProviderStreamError` with the provider's type and message; nothing still pending is
released, and `finish()` raises the same error again.

When is a call complete?

| format        | the call is complete when ...                                                              |
|---------------|---------------------------------------------------------------------------------------------|
| `hermes`      | `</tool_call>` is seen outside a JSON string                                                |
| `qwen3_coder` | `</tool_call>` is seen                                                                      |
| `mistral`     | the JSON value after the name (v11+: `[TOOL_CALLS]name[ARGS]{...}`) or the JSON array (before |
|               | v11: `[TOOL_CALLS][{...}, ...]`) closes; the closing bracket is the marker                  |
| `openai`      | a fragment for another call arrives (the stream moved past it), or `finish("tool_calls")` / |
|               | `finish("stop")`; and in both cases its concatenated arguments parse as one JSON object     |
| `anthropic`   | its `tool_use` block's `content_block_stop` arrives (SSE text or parsed events)             |
| `harmony`     | its `<|call|>` is seen, or the stream ends normally inside its content (`<|call|>` is a stop |
|               | token that servers often do not stream); analysis is `Result.thinking`                      |
| `deepseek_v3` | `<｜tool▁call▁end｜>` is seen outside a JSON string (DeepSeek-V3 / R1)                        |
| `deepseek_v31`| `<｜tool▁call▁end｜>` is seen outside a JSON string (DeepSeek-V3.1)                           |
| `deepseek_v32`| `</｜DSML｜invoke>` is seen (DeepSeek-V3.2's DSML; values converted by the schema)         |
| `kimi_k2`     | `<|tool_call_end|>` is seen outside a JSON string (Kimi-K2; `functions.name:0` is the id)   |
| `llama3_json` | its JSON object (after `<|python_tag|>`, or a `{"name"` anywhere in the text) closes; valid |
|               | JSON without `"name"` and `"parameters"`/`"arguments"` is text                             |
| `pythonic`    | the `]` closing its list `[f(a=1), g()]` is seen outside a string (a response that starts   |
|               | with `[name(`, or after `<|python_start|>` / `<|tool_call_start|>`)                         |
| `granite`     | the JSON list after `<|tool_call|>` / `<tool_call>` (or a response that starts with `[{`)   |
|               | closes; one object after the marker closes                                                  |
| `minimax_m2`  | its `</invoke>` is seen (inside `<minimax:tool_call>`; the block's close is not needed)      |
| `gemma4`      | `<tool_call|>` is seen outside a `<|"|>` string                                              |
| `lfm2`        | `<|tool_call_end|>` is seen; each call of the list is then read on its own                  |
| `gigachat3`   | the JSON object after the function-call header closes (a `</s>` after it is dropped)        |
| `nemotron_json` | `</TOOLCALL>` is seen outside a JSON string                                               |
| `hy_v3`       | its `</tool_call>` is seen (bare or `:opensource` tags; the block's close is not needed)     |
| `minimax_m3`  | its `]<]minimax[>[</invoke>` is seen (the block's close is not needed)                      |
| `kimi_k3`     | its `<|close|>call<|sep|>` is seen (XTML; the tools channel's close is not needed)           |
| `apertus`     | the JSON array after `<|tools_prefix|>` closes (`<|tools_suffix|>` is not needed)            |
| `glm45`       | `</tool_call>` is seen outside an `<arg_value>`                                             |
| `qwen3_xml`   | as `qwen3_coder` (vLLM's other name for the same output; the same parser)                   |
| `seed_oss`    | `</seed:tool_call>` is seen (a `<seed:tool_call>` inside `<seed:think>` ... is text)        |
| `minicpm5`    | `</function>` is seen outside a `<![CDATA[` ... `]]>` value (MiniCPM5)                       |
| `functionary_v3_1` | `</function>` is seen outside a JSON string (`<function=name>{...}</function>`)        |
| `functionary_v3_2` | the next `>>>` is seen outside a JSON string, or the stream ends normally inside the call |
|               | (`<|eot_id|>` is a stop token); the recipient `all` is text                                 |
| `deepseek_v4` | `</｜DSML｜invoke>` is seen inside `<｜DSML｜tool_calls>` (V3.2's DSML in V4's block)          |
| `minimax`     | `</tool_calls>` is seen outside a JSON string (MiniMax-M1; a block inside `<think>` is text) |

The `Result.finish_reason` is `"tool_calls"` only when the stream ended normally, at least one call was released
and no call failed; a normal end that does not meet that is `"stop"`; a length stop in any provider's words
(`"max_tokens"`, `"model_length"`, ...) is `"length"`; any other reason (`"content_filter"`, `"refusal"`, ...) is
kept as it was. So `"length"` is never hidden behind `"tool_calls"` (vLLM's streaming handler used to do exactly
that: vllm-project/vllm issue 53269).

The package, one job per module: `events` (the formats, events and `Result`), `assembler` (`ToolCallAssembler`, the
release rules), `sink` (the public emitter protocol, `ToolCallSink`, between the assembler and the parsers), one
module per wire format (`PARSERS` names them; `tagged` and `sectioned` hold the framing several formats share,
`dsml` DeepSeek's DSML markup (V3.2 and V4), `sse` Anthropic's event stream), `schemas` (the tools' JSON Schemas),
`coerce` (parameter text to the schema's types) and `jsontext` (strict JSON and the scanners the formats share).
"""

from __future__ import annotations

from ctxlock.generation.toolcalls._assembler import PARSERS, ToolCallAssembler, assemble
from ctxlock.generation.toolcalls._events import (
    DEFAULT_MAX_EVENT_SIZE,
    TRUNCATED_MESSAGE,
    Event,
    Release,
    Result,
    TextDelta,
    ToolCallFormat,
    ToolCallReady,
    ToolCallRejected,
    to_model,
)
from ctxlock.generation.toolcalls._jsontext import loads_object
from ctxlock.generation.toolcalls._sink import FormatParser, ToolCallSink

__all__ = [
    "DEFAULT_MAX_EVENT_SIZE",
    "PARSERS",
    "TRUNCATED_MESSAGE",
    "Event",
    "FormatParser",
    "Release",
    "Result",
    "TextDelta",
    "ToolCallAssembler",
    "ToolCallFormat",
    "ToolCallReady",
    "ToolCallRejected",
    "ToolCallSink",
    "assemble",
    "loads_object",
    "to_model",
]
