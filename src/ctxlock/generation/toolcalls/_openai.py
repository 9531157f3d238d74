"""Wire format `openai`: `chat.completion.chunk` dicts (or SDK objects) whose `delta.tool_calls` carry fragments.

A call is complete when a fragment for another call arrives (the stream moved past it), or at `finish("tool_calls")`
/ `finish("stop")`; its concatenated arguments must then parse as one JSON object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ctxlock.errors import ToolCallError, ToolCallTruncatedError
from ctxlock.generation.toolcalls._events import NORMAL_STOPS, TRUNCATED_MESSAGE, error_payload
from ctxlock.generation.toolcalls._jsontext import loads_object, looks_cut_off
from ctxlock.generation.toolcalls._sink import ToolCallSink


@dataclass
class _OpenCall:
    index: int  # our position
    stream_index: int | None
    id: str | None = None
    name: str | None = None
    parts: list[str] = field(default_factory=list)


class OpenAIParser:
    """Fragments are keyed by `index` (and `id` when sent). One call is open at a time; a fragment for another
    call means the stream has moved past the open one, which is then complete."""

    ended: str | None = None  # the finish reason says how the stream ended

    def __init__(self, sink: ToolCallSink, choice: int) -> None:
        self.sink = sink
        self.choice = choice
        self.open: _OpenCall | None = None
        self.closed_stream_indexes: set[int] = set()
        self.closed_ids: set[str] = set()
        self.late: set[tuple[int | None, str | None]] = set()
        self.seen_finish: str | None = None
        self.chunks = 0

    def feed(self, chunk: Any) -> None:
        k = self.chunks
        self.chunks += 1
        if hasattr(chunk, "model_dump"):  # an openai SDK ChatCompletionChunk
            chunk = chunk.model_dump(exclude_none=True)
        if not isinstance(chunk, Mapping):
            raise ToolCallError(
                f"a chunk must be an object, got {type(chunk).__name__}",
                path=f"chunks[{k}]",
                hint="feed the parsed JSON of each `data:` line",
            )
        payload = error_payload(chunk)
        if payload is not None:
            self.sink.provider_error(payload, f"chunks[{k}]")
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise ToolCallError("choices must be an array", path=f"chunks[{k}].choices", hint="send a list")
        for c, choice in enumerate(choices):
            cpath = f"chunks[{k}].choices[{c}]"
            if not isinstance(choice, Mapping):
                raise ToolCallError("a choice must be an object", path=cpath, hint="send an object")
            if choice.get("index", 0) != self.choice:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, Mapping):
                raise ToolCallError("delta must be an object", path=f"{cpath}.delta", hint="send an object")
            content = delta.get("content")
            if isinstance(content, str):
                self.sink.emit_text(content)
            elif content is not None:
                raise ToolCallError(
                    "delta.content must be a string", path=f"{cpath}.delta.content", hint="send text or null"
                )
            fragments = delta.get("tool_calls") or []
            if not isinstance(fragments, list):
                raise ToolCallError(
                    "tool_calls must be an array", path=f"{cpath}.delta.tool_calls", hint="send a list of fragments"
                )
            for j, fragment in enumerate(fragments):
                self._fragment(fragment, f"{cpath}.delta.tool_calls[{j}]")
            if choice.get("finish_reason"):
                self.seen_finish = choice["finish_reason"]

    def _fragment(self, fragment: Any, path: str) -> None:
        if not isinstance(fragment, Mapping):
            raise ToolCallError("a tool_calls fragment must be an object", path=path, hint="send an object")
        sidx = fragment.get("index")
        fid = fragment.get("id")
        fn = fragment.get("function") or {}
        if (sidx is not None and (not isinstance(sidx, int) or isinstance(sidx, bool))) or (
            fid is not None and not isinstance(fid, str)
        ):
            raise ToolCallError("index must be an integer and id a string", path=path, hint="send the OpenAI shape")
        if sidx is None and fid is None:
            raise ToolCallError(
                "a tool_calls fragment needs an index (or an id)", path=f"{path}.index", hint="send the index"
            )
        if not isinstance(fn, Mapping):
            raise ToolCallError("function must be an object", path=f"{path}.function", hint="send an object")
        name = fn.get("name")
        args = fn.get("arguments")
        if (name is not None and not isinstance(name, str)) or (args is not None and not isinstance(args, str)):
            raise ToolCallError(
                "function.name and function.arguments must be strings",
                path=f"{path}.function",
                hint="send arguments as a JSON-encoded string fragment",
            )
        call = self.open
        same = (
            call is not None
            and (sidx is None or sidx == call.stream_index)
            and (fid is None or call.id is None or fid == call.id)
        )
        if not same:
            if call is not None:
                self._close(call)
            if (sidx is not None and sidx in self.closed_stream_indexes and fid is None) or fid in self.closed_ids:
                # The call this fragment belongs to was complete by the rule above and may have been released.
                self.open = None
                late = (sidx, fid)
                if late in self.late:
                    return
                self.late.add(late)
                index = self.sink.new_index()
                self.sink.fail(
                    index,
                    fid,
                    name,
                    f"a fragment for stream index {sidx} arrived after the stream had moved past that call",
                    path=path,
                    hint="the server interleaved tool-call fragments; its calls cannot be assembled safely",
                )
                return
            call = self.open = _OpenCall(index=self.sink.new_index(), stream_index=sidx)
        assert call is not None
        if fid is not None:
            call.id = fid
        if name:
            if call.name is None:
                call.name = name
            elif name != call.name:
                raise ToolCallError(
                    f"the function name changed mid-call from {call.name!r} to {name!r}",
                    path=f"{path}.function.name",
                    hint="send the name once, in the call's first fragment",
                )
        if args:
            call.parts.append(args)

    def _close(self, call: _OpenCall) -> None:
        self.open = None
        if call.stream_index is not None:
            self.closed_stream_indexes.add(call.stream_index)
        if call.id is not None:
            self.closed_ids.add(call.id)
        raw = "".join(call.parts)
        cid = call.id if call.id is not None else self.sink.make_id(call.index)
        value, problem = loads_object(raw)
        if problem is not None:
            self.sink.fail(
                call.index,
                cid,
                call.name,
                f"arguments are not valid JSON: {problem}",
                path=f"tool_calls[{call.index}].arguments",
                hint='the model must send a complete JSON object, e.g. {"city": "Paris"}',
            )
            return
        self.sink.complete(call.index, cid, call.name, value, raw, f"tool_calls[{call.index}].name")

    def open_indexes(self) -> list[int]:
        return [] if self.open is None else [self.open.index]

    def finish(self, finish_reason: str | None) -> str | None:
        reason = finish_reason if finish_reason is not None else self.seen_finish
        call = self.open
        if call is None:
            return reason
        if reason in NORMAL_STOPS:
            raw = "".join(call.parts)
            if looks_cut_off(raw):
                # Arguments cut off mid-JSON under a "tool_calls"/"stop" finish: a server that rewrote "length"
                # (vLLM did in its streaming path) would look exactly like this. Never released, and neither is any
                # other call of this response (release="finish"): the response was cut off.
                self.open = None
                self.sink.mark_cut_off(f"tool_calls[{call.index}] ends mid-JSON although finish_reason is {reason!r}")
                cid = call.id if call.id is not None else self.sink.make_id(call.index)
                self.sink.fail(
                    call.index,
                    cid,
                    call.name,
                    f"arguments end mid-JSON although finish_reason is {reason!r}: {TRUNCATED_MESSAGE}",
                    path=f"tool_calls[{call.index}].arguments",
                    hint="a server may have reported a length stop as tool_calls; raise max_tokens and ask again",
                    cls=ToolCallTruncatedError,
                )
                return reason
            self._close(call)
            return reason
        self.open = None
        self.sink.unfinished(
            [call.index], reason, "before the stream moved past the call", call_id=call.id, name=call.name
        )
        return reason
