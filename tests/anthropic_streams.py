"""Anthropic Messages API streams for the tests: how tests/data/streams/anthropic_*.sse were written.

Each file is the response body of a streaming `POST /v1/messages` in the documented wire format: server-sent
events `event: <type>` / `data: <compact JSON>` / blank line, in the order `message_start`, then per content block
`content_block_start`, `content_block_delta`*, `content_block_stop`, with `ping` between, then `message_delta`
(`stop_reason`, usage) and `message_stop`. Thinking blocks stream `thinking_delta` then one `signature_delta`;
`tool_use` blocks start with `"input": {}` and stream their input as `input_json_delta` pieces, the first one
empty, as the API does. `test_anthropic_stream.py` checks the files are exactly what this module writes.
"""

from __future__ import annotations

import json
from typing import Any

WEATHER_ARGS = {"city": 'Zürich "HB" \\ 天气 🌧', "metric": True}
SEARCH_ARGS = {
    "query": 'line one\nline two </tool_call> {[("',
    "filters": {"lang": "de", "year": 2024},
    "tags": ["a", "b"],
    "limit": 5,
    "cursor": None,
}
TEXT = "I'll check the weather in Zürich and search the docs. 天气 🌧"
THINKING = "The user wants two things: the weather, then a docs search.\nCall both tools."
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds3vP0w2kmsV1z3nXKAeRKqGp2lW5fhVhTQ=="
CALLS = [
    {"id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather", "arguments": WEATHER_ARGS},
    {"id": "toolu_01QYgLT3Aq8ceXqWbkMhYjbK", "name": "search_docs", "arguments": SEARCH_ARGS},
]


def _event(data: dict[str, Any]) -> str:
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _pieces(text: str, size: int, halves: bool = False) -> list[str]:
    if halves:  # two pieces, whatever the length
        size = -(-len(text) // 2)
    return [text[k : k + size] for k in range(0, len(text), size)]


def events(
    stop_reason: str = "tool_use", *, cut_last_call: bool = False, thinking: bool = True, halves: bool = False
) -> list[dict]:
    """The events of one response; `cut_last_call` stops the last tool_use part way through its input (as the
    API does at max_tokens: the block is stopped, then message_delta says why). `halves` streams each block's
    text in two deltas instead of pieces of 23, 11 and 9 characters: the same events of every kind, in a stream
    under half as long (the tests that feed a stream split at every index take a time quadratic in its length)."""
    out: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 472,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 4,
                },
            },
        }
    ]
    index = 0
    if thinking:
        out.append({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}})
        out += [
            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": p}}
            for p in _pieces(THINKING, 23, halves)
        ]
        out.append(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": SIGNATURE}}
        )
        out.append({"type": "content_block_stop", "index": 0})
        index = 1
    out.append({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
    out.append({"type": "ping"})
    out += [
        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}}
        for p in _pieces(TEXT, 11, halves)
    ]
    out.append({"type": "content_block_stop", "index": index})
    for k, call in enumerate(CALLS):
        index += 1
        out.append(
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "tool_use", "id": call["id"], "name": call["name"], "input": {}},
            }
        )
        raw = json.dumps(call["arguments"], ensure_ascii=False)
        if cut_last_call and k == len(CALLS) - 1:
            raw = raw[: len(raw) // 2]
        out.append(
            {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": ""}}
        )
        out += [
            {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": p}}
            for p in _pieces(raw, 9, halves)
        ]
        out.append({"type": "content_block_stop", "index": index})
    out.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 187},
        }
    )
    out.append({"type": "message_stop"})
    return out


def sse(evs: list[dict]) -> str:
    return "".join(_event(e) for e in evs)


def fixtures() -> dict[str, str]:
    return {
        "anthropic_thinking_text_two_tools": sse(events()),
        "anthropic_max_tokens_mid_input": sse(events("max_tokens", cut_last_call=True, thinking=False)),
    }


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "metric": {"type": "boolean"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "filters": {"type": "object"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "limit": {"type": "integer"},
                    "cursor": {"type": ["string", "null"]},
                },
                "required": ["query"],
            },
        },
    },
]


def block_stop_ends(text: str) -> list[int]:
    """For each tool_use call, the offset just past the blank line that ends its content_block_stop event."""
    ends = []
    pos = 0
    blocks = []
    for e in _split_events(text):
        pos += len(e)
        data = json.loads(e.split("data: ", 1)[1])
        if data["type"] == "content_block_start" and data["content_block"]["type"] == "tool_use":
            blocks.append(data["index"])
        if data["type"] == "content_block_stop" and data["index"] in blocks:
            ends.append(pos)
    return ends


def _split_events(text: str) -> list[str]:
    parts = text.split("\n\n")
    return [p + "\n\n" for p in parts[:-1]]


def message_stop_end(text: str) -> int:
    """The offset just past the message_stop event: the stream is complete only from here."""
    return text.index("event: message_stop\n") + len(_split_events(text[text.index("event: message_stop\n") :])[0])
