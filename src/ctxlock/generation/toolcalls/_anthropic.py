"""Wire format `anthropic`: the Messages API stream, fed as raw SSE text (str or UTF-8 bytes, split anywhere) or as
the parsed event dicts (or SDK event objects). A `tool_use` block is a call, complete at its `content_block_stop`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ctxlock.errors import ToolCallError
from ctxlock.generation.toolcalls._events import LENGTH_STOPS, NORMAL_STOPS
from ctxlock.generation.toolcalls._jsontext import dumps_arguments, loads_object, looks_cut_off
from ctxlock.generation.toolcalls._sink import ToolCallSink
from ctxlock.generation.toolcalls._sse import SSEReader
from ctxlock.request import json_type_name


@dataclass
class _Block:
    kind: str  # text, tool_use, thinking, skip
    type: str  # the content block's own type
    call: int = -1  # our call index (tool_use)
    id: str | None = None
    name: str | None = None
    start_input: Any = None
    parts: list[str] = field(default_factory=list)
    size: int = 0  # characters in parts


_TEXT_BLOCKS = {"text": "text", "tool_use": "tool_use", "thinking": "thinking"}
_DELTA_BLOCKS = {
    "text_delta": ("text", "text"),
    "input_json_delta": ("tool_use", "partial_json"),
    "thinking_delta": ("thinking", "thinking"),
    "signature_delta": ("thinking", "signature"),
    "citations_delta": ("text", None),
}


class AnthropicParser:
    """`message_start`, then per content block `content_block_start` / `content_block_delta`* /
    `content_block_stop`, then `message_delta` (with `stop_reason`) and `message_stop`; `ping` anywhere; `error`
    in-band. A `tool_use` block is a call, complete at its `content_block_stop` (Anthropic's streaming docs); with the
    default `release="finish"` it is released only once the message has ended normally.

    Fed either the raw SSE text (`event:`/`data:` lines, in pieces split anywhere, str or UTF-8 bytes) or the parsed
    events (dicts with `type`, or SDK event objects with `model_dump()`), never both in one stream."""

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.sse = SSEReader(sink.max_event_size)
        self.mode: str | None = None  # "sse" or "events"
        self.count = 0  # events seen
        self.blocks: dict[int, _Block] = {}  # open content blocks by their index
        self.closed: set[int] = set()
        self.started = False
        self.stopped = False  # message_stop seen
        self.stop_reason: str | None = None
        self.inconsistent: str | None = None  # set when two message_deltas disagree on stop_reason
        self.ended: str | None = None  # how the stream ended when not with message_stop (for withheld calls)
        self.cut: list[tuple[_Block, str]] = []  # tool_use blocks that stopped with their JSON cut off

    def feed(self, delta: Any) -> None:
        if isinstance(delta, str | bytes | bytearray):
            self._mode("sse", delta)
            for name, data in self.sse.feed(delta):
                self._sse_event(name, data)
            return
        if hasattr(delta, "model_dump"):  # an anthropic SDK RawMessageStreamEvent
            delta = delta.model_dump()
        self._mode("events", delta)
        if not isinstance(delta, Mapping):
            raise ToolCallError(
                f"an anthropic stream is fed SSE text or event objects, got {type(delta).__name__}",
                path=f"events[{self.count}]",
                hint="feed the response body's text, or each event's parsed `data:` JSON",
            )
        path = f"events[{self.count}]"
        self.count += 1
        self._event(delta, path)

    def _mode(self, mode: str, delta: Any) -> None:
        if self.mode is None:
            self.mode = mode
        elif self.mode != mode:
            raise ToolCallError(
                f"this stream was fed {'SSE text' if self.mode == 'sse' else 'event objects'}, then a "
                f"{type(delta).__name__}",
                path=f"events[{self.count}]",
                hint="feed either the raw SSE text or the parsed events, not both",
            )

    def _sse_event(self, name: str, data: str) -> None:
        path = f"events[{self.count}]"
        self.count += 1
        event, problem = loads_object(data, unicode=False)
        if problem is not None or not isinstance(event, Mapping):
            if name == "error":  # an error event is an error even when its data is not the documented JSON
                self.sink.provider_error(data, path)
            raise ToolCallError(
                f"the data of this `event: {name}` is not a JSON object: {problem or json_type_name(event)}",
                path=f"{path}.data",
                hint="feed the stream as the server sent it",
            )
        kind = event.get("type")
        if name != "message" and name != kind and name != "error":
            raise ToolCallError(
                f"`event: {name}` carries data of type {kind!r}",
                path=f"{path}.type",
                hint="the event name and the data's type must agree; feed the stream as the server sent it",
            )
        if name == "error" and kind != "error":
            self.sink.provider_error(event.get("error", event), path)
        self._event(event, path)

    def _event(self, event: Mapping[str, Any], path: str) -> None:
        kind = event.get("type")
        if kind == "error":
            self.sink.provider_error(event.get("error"), path)
        if kind == "ping":
            return
        if self.stopped:
            raise ToolCallError(
                f"a {kind!r} event after message_stop", path=f"{path}.type", hint="message_stop ends the stream"
            )
        if kind == "message_start":
            if self.started:
                raise ToolCallError("a second message_start", path=f"{path}.type", hint="one message per stream")
            self.started = True
        elif kind == "content_block_start":
            self._block_start(event, path)
        elif kind == "content_block_delta":
            self._block_delta(event, path)
        elif kind == "content_block_stop":
            self._block_stop(event, path)
        elif kind == "message_delta":
            delta = event.get("delta")
            if not isinstance(delta, Mapping):
                raise ToolCallError("delta must be an object", path=f"{path}.delta", hint="send an object")
            reason = delta.get("stop_reason")
            if reason is not None and not isinstance(reason, str):
                raise ToolCallError(
                    "stop_reason must be a string", path=f"{path}.delta.stop_reason", hint="send a string or null"
                )
            if reason is not None and self.stop_reason is not None and reason != self.stop_reason:
                earlier = self.stop_reason
                if earlier in NORMAL_STOPS:
                    self.stop_reason = reason  # the earliest reason that is not a normal end wins
                self.inconsistent = f"message_delta said stop_reason={earlier!r}, then {reason!r}"
                raise ToolCallError(
                    f"a second message_delta changes stop_reason from {earlier!r} to {reason!r}",
                    path=f"{path}.delta.stop_reason",
                    hint="a message has one stop_reason: the stream is inconsistent, no call from it is released;"
                    " ask again",
                )
            if reason is not None:
                self.stop_reason = reason
        elif kind == "message_stop":
            self.stopped = True
        else:
            # Anthropic documents that new event types may appear; they carry nothing the assembler knows.
            self.sink.note(f"{path}: an event of unknown type {kind!r} was skipped")

    def _index(self, event: Mapping[str, Any], path: str) -> int:
        index = event.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ToolCallError("index must be a non-negative integer", path=f"{path}.index", hint="send the index")
        return index

    def _block_start(self, event: Mapping[str, Any], path: str) -> None:
        index = self._index(event, path)
        block = event.get("content_block")
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise ToolCallError(
                "content_block must be an object with a type", path=f"{path}.content_block", hint="send an object"
            )
        if index in self.blocks or index in self.closed:
            raise ToolCallError(
                f"content block {index} started twice", path=f"{path}.index", hint="each block starts once"
            )
        btype = block["type"]
        kind = _TEXT_BLOCKS.get(btype, "skip")
        b = _Block(kind=kind, type=btype)
        if kind == "tool_use":
            b.call = self.sink.new_index()
            b.id = block.get("id") if isinstance(block.get("id"), str) else None
            b.name = block.get("name") if isinstance(block.get("name"), str) else None
            b.start_input = block.get("input")
        elif kind == "text" and isinstance(block.get("text"), str):
            self.sink.emit_text(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            self.sink.emit_thinking(block["thinking"])
        elif btype in ("server_tool_use", "mcp_tool_use"):
            name = block.get("name")
            self.sink.note(
                f"content[{index}]: a {btype} block ({name!r}) runs on the provider's side; it is not a call"
                " for you to execute and is not released"
            )
        elif btype == "redacted_thinking":
            self.sink.note(f"content[{index}]: a redacted_thinking block (encrypted reasoning) is not text")
        else:
            self.sink.note(f"content[{index}]: a {btype} block is neither text nor a tool call; skipped")
        self.blocks[index] = b

    def _block_delta(self, event: Mapping[str, Any], path: str) -> None:
        index = self._index(event, path)
        block = self.blocks.get(index)
        if block is None:
            state = "already stopped" if index in self.closed else "not started"
            raise ToolCallError(
                f"a delta for content block {index}, which is {state}",
                path=f"{path}.index",
                hint="deltas come between a block's content_block_start and content_block_stop",
            )
        delta = event.get("delta")
        if not isinstance(delta, Mapping):
            raise ToolCallError("delta must be an object", path=f"{path}.delta", hint="send an object")
        dtype = delta.get("type")
        known = _DELTA_BLOCKS.get(dtype) if isinstance(dtype, str) else None
        if known is None:
            self.sink.note(f"{path}: a delta of unknown type {dtype!r} for content block {index} was skipped")
            return
        want, key = known
        if block.kind == "skip":
            return  # the contents of a block that is neither text nor a call (server tools, redacted thinking)
        if block.kind != want:
            raise ToolCallError(
                f"a {dtype} for a {block.type} block",
                path=f"{path}.delta.type",
                hint=f"a {dtype} belongs to a {want} block",
            )
        if key is None or dtype == "signature_delta":
            return
        value = delta.get(key)
        if not isinstance(value, str):
            raise ToolCallError(f"{key} must be a string", path=f"{path}.delta.{key}", hint="send a string")
        if block.kind == "text":
            self.sink.emit_text(value)
        elif block.kind == "thinking":
            self.sink.emit_thinking(value)
        else:
            block.size += len(value)
            if block.size > self.sink.max_event_size:
                block.parts, block.size = [], 0
                raise ToolCallError(
                    f"the input of tool_use content block {index} is longer than max_event_size="
                    f"{self.sink.max_event_size} characters",
                    path=f"{path}.delta.partial_json",
                    hint="the call is not released; raise max_event_size if such input is real",
                )
            block.parts.append(value)

    def _block_stop(self, event: Mapping[str, Any], path: str) -> None:
        index = self._index(event, path)
        block = self.blocks.pop(index, None)
        if block is None:
            state = "already stopped" if index in self.closed else "not started"
            raise ToolCallError(
                f"content_block_stop for content block {index}, which is {state}",
                path=f"{path}.index",
                hint="each block stops once, after its start",
            )
        self.closed.add(index)
        if block.kind == "tool_use":
            self._close(block)

    def _close(self, block: _Block) -> None:
        index = block.call
        cid = block.id if block.id is not None else self.sink.make_id(index)
        if not self.started:
            # Anthropic's documented flow starts with message_start (ping and error may come anywhere). A call
            # from a stream without it is from no known message (a stream fed from its middle, a spliced one).
            self.sink.fail(
                index,
                cid,
                block.name,
                "a tool_use block completed in a stream without message_start",
                path=f"tool_calls[{index}]",
                hint="feed the whole stream from its first event (message_start); this call was not released",
            )
            return
        raw = "".join(block.parts)
        if not raw.strip():
            # A tool without parameters may stream no JSON at all: its input is the one content_block_start gave.
            value = block.start_input if block.start_input is not None else {}
            raw, problem = dumps_arguments(value)
            if problem is not None:
                self._bad_json(block, cid, f"input is not valid JSON: {problem}")
                return
        else:
            value, problem = loads_object(raw)
            if problem is not None:
                if looks_cut_off(raw):
                    # Input cut off mid-JSON: the output limit, most likely; the message's end says (finish).
                    self.cut.append((block, f"input is not valid JSON: {problem}"))
                    return
                self._bad_json(block, cid, f"input is not valid JSON: {problem}")
                return
        self.sink.complete(index, cid, block.name, value, raw, f"tool_calls[{index}].name")

    def _bad_json(self, block: _Block, cid: str, message: str) -> None:
        self.sink.fail(
            block.call,
            cid,
            block.name,
            message,
            path=f"tool_calls[{block.call}].arguments",
            hint="the model must send one complete JSON object as the tool's input",
        )

    def open_indexes(self) -> list[int]:
        return sorted([b.call for b in self.blocks.values() if b.kind == "tool_use"] + [b.call for b, _ in self.cut])

    def finish(self, finish_reason: str | None) -> str | None:
        if self.sse.leftover:
            self.sink.note("the stream ended inside an SSE event (no blank line after it); it was discarded")
        if self.inconsistent is not None:
            # Refused in feed(); should the caller finish anyway, nothing is released: a non-normal reason if one
            # was given, else an unknown end.
            reason: str | None = self.stop_reason if self.stop_reason not in NORMAL_STOPS else None
            self.ended = f"the stream is inconsistent ({self.inconsistent})"
        elif finish_reason is not None:
            reason = finish_reason
        elif self.stopped:
            reason = self.stop_reason
        else:
            reason = None
            self.ended = "the stream ended without message_stop" + (
                f" (message_delta said stop_reason={self.stop_reason!r})" if self.stop_reason else ""
            )
        for block in sorted(self.blocks.values(), key=lambda b: b.call):
            if block.kind == "tool_use":
                self.sink.unfinished(
                    [block.call], reason, "before its content_block_stop", call_id=block.id, name=block.name
                )
        self.blocks = {}
        for block, problem in self.cut:
            cid = block.id if block.id is not None else self.sink.make_id(block.call)
            if reason in LENGTH_STOPS:
                self.sink.unfinished([block.call], reason, "with its input cut off", call_id=cid, name=block.name)
            else:
                self._bad_json(block, cid, f"{problem} (it ends mid-JSON)")
        self.cut = []
        return reason
