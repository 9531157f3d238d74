"""The emitter protocol between the assembler and the wire-format parsers.

A wire-format parser (`openai`, `hermes`, `qwen3_coder`, `mistral`, `anthropic`) turns one provider's deltas into
calls. It knows the format and nothing about release: it reports what it read to a `ToolCallSink`, and the sink
(`ToolCallAssembler`) decides what is validated, held, released or refused. A parser is a `FormatParser`, built as
`Parser(sink, choice)`; the assembler feeds it deltas and finishes it.

What a parser reports, in stream order:

- `emit_text(text)`: text outside calls, once it cannot be part of a marker; `emit_thinking(text)`: reasoning text
  (never part of the answer); `note(text)`: something that is neither text nor a call (a skipped block).
- `new_index()`: a call starts; indexes are given out in the order calls start (0, 1, ...).
- Every started call ends in exactly one of:
  - `complete(index, call_id, name, arguments, raw, src)`: its closing marker was seen and its arguments parsed
    (`arguments` as parsed, `raw` as written, `src` the path that names the call). The sink checks the name, the
    schema and the id, and holds or releases the call.
  - `fail(index, call_id, name, message, path=, hint=, cls=)`: the call is complete but malformed (refused).
  - `unfinished(indexes, reason, where, call_id=, name=)`: from `finish()`, calls still open when the stream ended.
- `provider_error(payload, path)`: an in-band error; it raises `ProviderStreamError` and never returns.
- `mark_cut_off(why)`: the stream is known to be cut off whatever its finish reason says (arguments end mid-JSON
  under `finish_reason="tool_calls"`), so no call of it is released.

And what it may ask: `make_id(index)` (the id of a call whose stream carries none), `tool_schema(name)` (the
declared tool's JSON Schema, or None; Qwen3-Coder converts parameter text by it), `format` and `max_event_size`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ctxlock.errors import ToolCallError
from ctxlock.generation.toolcalls._events import ToolCallFormat
from ctxlock.generation.toolcalls._jsontext import dumps_arguments, loads_object
from ctxlock.request import json_type_name


@runtime_checkable
class ToolCallSink(Protocol):
    """What a wire-format parser reports to, and may ask of, the assembler (see the module docstring)."""

    @property
    def format(self) -> ToolCallFormat: ...

    @property
    def max_event_size(self) -> int: ...

    def emit_text(self, text: str) -> None:
        """Text outside any call (empty text is ignored)."""

    def emit_thinking(self, text: str) -> None:
        """Reasoning text (anthropic thinking blocks): kept in `Result.thinking`, never in the text."""

    def note(self, text: str) -> None:
        """Something the stream held that is neither text nor a call (`Result.notes`)."""

    def new_index(self) -> int:
        """The index of a call that starts now."""
        ...

    def make_id(self, index: int) -> str:
        """The id of call `index` when its stream carries none."""
        ...

    def tool_schema(self, name: str) -> Any:
        """The JSON Schema of the declared tool `name` (after OpenAI's default), or None when it is not declared."""

    def complete(self, index: int, call_id: str | None, name: Any, arguments: Any, raw: str, src: str) -> None:
        """A call whose closing marker has been seen: release it (or hold it) if it names a known tool and its
        arguments validate, else refuse it."""

    def fail(
        self,
        index: int,
        call_id: str | None,
        name: str | None,
        message: str,
        *,
        path: str,
        hint: str,
        cls: type[ToolCallError] = ToolCallError,
    ) -> None:
        """A complete call that is malformed: refused (`ToolCallRejected`) with this error."""

    def unfinished(
        self,
        indexes: list[int],
        reason: str | None,
        where: str,
        *,
        call_id: str | None = None,
        name: str | None = None,
    ) -> None:
        """Calls still open when the stream ended: never released (truncated under a length stop)."""

    def provider_error(self, payload: Any, path: str) -> None:
        """An in-band provider error: ends the stream and raises `ProviderStreamError`."""

    def mark_cut_off(self, why: str) -> None:
        """The stream is cut off whatever its finish reason says: no call of it is released."""


class FormatParser(Protocol):
    """One wire format's reader, built as `Parser(sink, choice)` (`choice`: the OpenAI choice index to read)."""

    # How the stream ended when its finish reason alone does not say (anthropic: no message_stop), else None.
    ended: str | None

    def feed(self, delta: Any) -> None:
        """Read one delta, reporting to the sink."""

    def finish(self, finish_reason: str | None) -> str | None:
        """End the stream: report calls still open as unfinished; return the stream's finish reason."""
        ...

    def open_indexes(self) -> list[int]:
        """The indexes of the calls started and not yet complete."""
        ...


def complete_named_object(sink: ToolCallSink, index: int, obj: Any, path: str, *, ids: bool = False) -> None:
    """{"name": ..., "arguments": {...} or "<json>"} (hermes; mistral before v11 also carries "id")."""
    cid = None
    if ids and isinstance(obj, dict) and isinstance(obj.get("id"), str):
        cid = obj["id"]
    if not isinstance(obj, dict):
        sink.fail(
            index,
            cid,
            None,
            f"a tool call must be a JSON object, got {json_type_name(obj)}",
            path=path,
            hint='write {"name": ..., "arguments": {...}}',
        )
        return
    name = obj.get("name")
    if "arguments" not in obj:
        sink.fail(
            index,
            cid if cid is not None else sink.make_id(index),
            name if isinstance(name, str) else None,
            'the tool call has no "arguments"',
            path=f"{path}.arguments",
            hint='write "arguments": {} for a call without arguments',
        )
        return
    args = obj["arguments"]
    if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI's wire form does
        raw = args
        args, problem = loads_object(args)
    else:
        raw, problem = dumps_arguments(args)
    if problem is not None:
        sink.fail(
            index,
            cid if cid is not None else sink.make_id(index),
            name if isinstance(name, str) else None,
            f"arguments are not valid JSON: {problem}",
            path=f"{path}.arguments",
            hint="send the arguments as a JSON object",
        )
        return
    sink.complete(index, cid, name, args, raw, f"{path}.name")


class BufferedCall(Protocol):
    """A parser that gathers the text of the call it is reading in `parts`, `size` characters so far, and has a
    state that means "skip the rest of this call"."""

    sink: ToolCallSink
    state: int
    index: int
    parts: list[str]
    size: int


def add_to_call(parser: BufferedCall, text: str, skip: int) -> None:
    """Add `text` to the call `parser` is reading, bounded by the sink's `max_event_size`: past it the call is
    refused (once), its text let go, and the parser put in state `skip` until the call's end."""
    if parser.state == skip or not text:
        return
    parser.size += len(text)
    if parser.size > parser.sink.max_event_size:
        parser.state = skip
        parser.parts = []
        parser.sink.fail(
            parser.index,
            None,
            None,
            f"the call is longer than max_event_size={parser.sink.max_event_size} characters",
            path=f"tool_calls[{parser.index}]",
            hint="the call is not released; raise max_event_size if such a call is real",
        )
        return
    parser.parts.append(text)
