"""Streaming tool-call assembly: a call is released whole and valid, or not at all.

A model streams a tool call a few characters at a time; the first delta is half a JSON object (seed 003 §2.2/2.5).
`ToolCallAssembler` consumes the stream and emits events:

- `TextDelta` for text outside calls, as soon as it cannot be the start of a call marker (only a possible prefix
  of the marker, at most `len(marker) - 1` characters, is held back);
- `ToolCallReady` for a call that is complete (its closing marker has been seen), whose arguments are a JSON object
  that validates against the tool's JSON Schema, and whose response ended normally (see "Release" below);
- `ToolCallRejected` once a call is complete but cannot be released (unknown tool, malformed JSON, invalid
  arguments); its `error` can go back to the model as a tool result (`to_model`).

`finish(finish_reason)` ends the stream and returns a `Result`. A call still open at the end is never released:
with a length stop it is a `ToolCallTruncatedError`, otherwise an unterminated `ToolCallError`.

Release (seed 001's truncation rule: Pi runs no tool call from a response that hit the output limit). By default
(`release="finish"`) `ToolCallReady` comes only from `finish()`, and only when the stream ended normally: `stop`,
`tool_calls`, `end_turn`, `tool_use` or `stop_sequence`. Under any other end (`length`, `max_tokens`,
`content_filter`, `refusal`, `pause_turn`, an unknown reason, no reason at all, or arguments that end mid-JSON
whatever the reason says) every complete call becomes an error saying it was not executed, and nothing is
released. `release="early"` releases each call from `feed()` as soon as it is complete; a call of a response that
is then cut off may have run, and the errors and `Result.notes` say so.

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

The `Result.finish_reason` is `"tool_calls"` only when the stream ended normally, at least one call was released
and no call failed; a normal end that does not meet that is `"stop"`; a length stop in any provider's words
(`"max_tokens"`, `"model_length"`, ...) is `"length"`; any other reason (`"content_filter"`, `"refusal"`, ...) is
kept as it was. So `"length"` is never hidden behind `"tool_calls"` (vLLM's streaming handler used to do exactly
that: vllm-project/vllm issue 53269).
"""

from __future__ import annotations

import ast
import codecs
import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ctxlock.errors import ProviderStreamError, ToolCallError, ToolCallTruncatedError, ToolCallValidationError
from ctxlock.frozen import thaw
from ctxlock.request import Request, join_path, json_type_name

if TYPE_CHECKING:
    import jsonschema.exceptions


def _jsonschema() -> Any:
    """jsonschema, imported on first use (about 50 ms at start-up, which commands without tools never need)."""
    import jsonschema
    import jsonschema.exceptions
    import jsonschema.validators

    return jsonschema


__all__ = [
    "Event",
    "Release",
    "Result",
    "TextDelta",
    "ToolCallAssembler",
    "ToolCallFormat",
    "ToolCallReady",
    "ToolCallRejected",
    "assemble",
    "to_model",
]

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
    ANTHROPIC = "anthropic"  # Messages API stream: SSE text (event:/data: lines) or the parsed event dicts


class Release(StrEnum):
    """When a complete, valid call is handed out as `ToolCallReady`."""

    # Default: only from finish(), and only when the stream ended normally (stop, tool_calls, end_turn, tool_use,
    # stop_sequence). A response cut off by the output limit, a filter or an error releases nothing.
    FINISH = "finish"
    # As soon as the call is complete, from feed(). The stream may still end at the output limit or in an error
    # after the call was handed out: a call from a cut-off response may then have run.
    EARLY = "early"


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


def _text_delta(text: Any, fmt: str) -> str:
    """A raw-text format's delta, or the error that says what to feed instead."""
    if not isinstance(text, str):
        raise ToolCallError(
            f"{fmt} streams are fed text deltas (str), got {type(text).__name__}",
            path="stream",
            hint="decode the tokens to text first (with special tokens kept)",
        )
    return text


def _error(
    cls: type[ToolCallError],
    message: str,
    *,
    path: str,
    hint: str,
    index: int | None = None,
    call_id: str | None = None,
    name: str | None = None,
    violations: Sequence[dict[str, str]] = (),
    pending: Sequence[int] = (),
) -> ToolCallError:
    # Which call failed, so a server can answer it (to_model) without re-deriving it from the path.
    return cls(
        message,
        path=path,
        hint=hint,
        index=index,
        call_id=call_id,
        tool_name=name,
        violations=tuple(violations),
        pending=tuple(pending),
    )


# ---------------------------------------------------------------------------------------------------------------
# Tools and their schemas


@dataclass(frozen=True)
class _Tool:
    name: str
    schema: dict[str, Any]
    validator: Any  # a jsonschema Validator instance
    path: str  # where the schema came from: tools[i].function.parameters


def _tool_list(tools: Request | Iterable[Mapping[str, Any]] | None) -> list[Any]:
    if tools is None:
        return []
    if isinstance(tools, Request):
        return tools.template_tools() or []
    if isinstance(tools, (Mapping, str | bytes)):
        raise ToolCallError(
            "tools must be a list of tool objects", path="tools", hint='pass [{"type": "function", "function": {...}}]'
        )
    return [thaw(t) for t in tools]


def _compile_tools(tools: Request | Iterable[Mapping[str, Any]] | None) -> dict[str, _Tool]:
    out: dict[str, _Tool] = {}
    for k, tool in enumerate(_tool_list(tools)):
        path = f"tools[{k}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise ToolCallError(
                "a tool must be an object with a function object",
                path=path,
                hint='pass {"type": "function", "function": {"name": ..., "parameters": {...}}}',
            )
        if tool.get("type", "function") != "function":
            raise ToolCallError(f"unsupported tool type {tool['type']!r}", path=f"{path}.type", hint='use "function"')
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ToolCallError("a tool needs a non-empty name", path=f"{path}.function.name", hint="name the tool")
        if name in out:
            raise ToolCallError(
                f"duplicate tool name {name!r}", path=f"{path}.function.name", hint="give every tool its own name"
            )
        spath = f"{path}.function.parameters"
        # OpenAI: omitting `parameters` declares a function without parameters; its arguments are still an object.
        schema = fn.get("parameters")
        schema = {"type": "object"} if schema is None else schema
        out[name] = _Tool(name=name, schema=schema, validator=_validator(schema, spath), path=spath)
    return out


def _validator(schema: Any, path: str) -> Any:
    if not isinstance(schema, dict | bool):
        raise ToolCallError("a tool's parameters must be a JSON Schema object", path=path, hint="pass a JSON Schema")
    try:
        key = json.dumps(schema, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ToolCallError(f"the schema is not JSON: {exc}", path=path, hint="pass plain JSON values") from None
    js = _jsonschema()
    try:
        return _checked_validator(key)
    except _UnknownDialect as exc:
        raise ToolCallError(
            f"unknown $schema {exc.args[0]!r}",
            path=f"{path}.$schema",
            hint="use a JSON Schema draft jsonschema knows (draft 4, 6, 7, 2019-09, 2020-12) or omit $schema",
        ) from None
    except js.exceptions.SchemaError as exc:
        where = path + exc.json_path[1:] if exc.json_path.startswith("$") else path
        draft = js.validators.validator_for(schema, default=js.Draft202012Validator).__name__.removesuffix("Validator")
        raise ToolCallError(
            f"not a valid JSON Schema: {exc.message}",
            path=where,
            hint=f"fix the schema so it validates against the {draft} metaschema",
        ) from None


class _UnknownDialect(Exception):
    pass


@functools.lru_cache(maxsize=256)
def _checked_validator(key: str) -> Any:
    """A validator for one schema (canonical JSON), metaschema-checked once: a server builds an assembler per
    request with the same tools, and check_schema costs far more than assembling a call."""
    schema = json.loads(key)  # a private copy: the caller may mutate theirs
    js = _jsonschema()
    validator_for = js.validators.validator_for
    if isinstance(schema, dict) and "$schema" in schema and validator_for(schema, default=None) is None:
        raise _UnknownDialect(schema["$schema"])
    cls = validator_for(schema, default=js.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def _arguments_path(index: int, keys: Iterable[str | int] = ()) -> str:
    path = f"tool_calls[{index}].arguments"
    for key in keys:
        path = join_path(path, key)
    return path


def _violation_keys(error: jsonschema.exceptions.ValidationError) -> list[str | int]:
    """The path of the offending value; for `required`/`additionalProperties` it names the property itself."""
    keys: list[str | int] = list(error.absolute_path)
    instance = error.instance
    if isinstance(instance, dict):
        if error.validator == "required":
            missing = [p for p in error.validator_value if p not in instance and repr(p) in error.message]
            if missing:
                keys.append(missing[0])
        elif error.validator in ("additionalProperties", "unevaluatedProperties"):
            declared = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
            extra = [p for p in instance if p not in declared and repr(p) in error.message]
            if extra:
                keys.append(extra[0])
    return keys


def _document_position(arguments: Any, keys: Sequence[str | int]) -> tuple[int, ...]:
    """Where a path lies in the arguments as written (object key order); a missing property sorts last."""
    position: list[int] = []
    node = arguments
    for key in keys:
        if isinstance(node, dict) and key in node:
            position.append(list(node).index(key))
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            position.append(key)
            node = node[key]
        else:
            position.append(1 << 30)
            break
    return tuple(position)


# ---------------------------------------------------------------------------------------------------------------
# Small scanners


def _split_marker_prefix(text: str, marker: str) -> tuple[str, str]:
    """Split off the longest suffix of `text` that is a proper prefix of `marker` (it may yet become the marker)."""
    n = len(text)
    first = marker[0]
    start = max(0, n - len(marker) + 1)
    j = text.find(first, start)
    while j != -1:
        if marker.startswith(text[j:]):
            return text[:j], text[j:]
        j = text.find(first, j + 1)
    return text, ""


_IN_STRING = re.compile(r'["\\]')
_OUTSIDE_STRING = re.compile(r'["{}\[\]]')


class _JsonSpan:
    """Where a streamed JSON container ends, without parsing it: string, escape and bracket depth only.

    Each character is looked at once (regex jumps between the few that matter), so feeding a stream in any
    chunking costs O(length). Whether the span is valid JSON is json.loads' business once it has closed.
    """

    __slots__ = ("depth", "escaped", "in_string")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def feed(self, text: str, start: int = 0) -> int:
        """Consume text[start:]; return the index just past the bracket that closes the outermost container, or -1."""
        i = start
        n = len(text)
        while i < n:
            if self.escaped:
                self.escaped = False
                i += 1
            elif self.in_string:
                m = _IN_STRING.search(text, i)
                if m is None:
                    return -1
                i = m.end()
                if m.group() == '"':
                    self.in_string = False
                else:
                    self.escaped = True
            else:
                m = _OUTSIDE_STRING.search(text, i)
                if m is None:
                    return -1
                i = m.end()
                c = m.group()
                if c == '"':
                    self.in_string = True
                elif c in "{[":
                    self.depth += 1
                else:
                    self.depth -= 1
                    if self.depth <= 0:
                        return i
        return -1

    @property
    def incomplete(self) -> bool:
        """True when what was fed is an open container or string: JSON cut off part way."""
        return self.depth > 0 or self.in_string


def _looks_cut_off(raw: str) -> bool:
    if not raw.strip():
        return True
    span = _JsonSpan()
    return span.feed(raw) == -1 and span.incomplete


# ---------------------------------------------------------------------------------------------------------------
# The assembler


# How a stream may end for its calls to be released (OpenAI's and Anthropic's words for a normal end).
_NORMAL_STOPS = frozenset({"stop", "tool_calls", "end_turn", "tool_use", "stop_sequence"})
# The output limit, in the words of OpenAI and vLLM ("length"), Anthropic ("max_tokens",
# "model_context_window_exceeded") and Mistral's API ("model_length").
_LENGTH_STOPS = frozenset({"length", "max_tokens", "model_length", "model_context_window_exceeded"})
_RAW_FORMATS = frozenset({"hermes", "qwen3_coder", "mistral"})
_ABNORMAL_HINTS = {
    "pause_turn": "send the response back as the assistant turn so the model can continue it",
    "refusal": "the model declined: rephrase the request rather than re-running the calls",
    "content_filter": "the provider's filter stopped the response: change the request",
}


def _error_payload(chunk: Any) -> Any:
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


class ToolCallAssembler:
    """Assemble streamed tool calls; release each one only when it is complete and its arguments are valid.

    `tools`: the OpenAI tool list (`[{"type": "function", "function": {"name", "description", "parameters"}}]`)
    or a parsed `Request` (its `tools`). Every schema is checked against its metaschema here.
    `format`: a `ToolCallFormat` (or its value). Raw-text formats take text deltas in `feed(text)`; `openai`
    takes chunk dicts (or SDK objects with `model_dump()`).
    `make_id`: the id of a call whose stream carries none (raw-text formats); the default `call00000`,
    `call00001`, ... is deterministic and a valid Mistral id (9 alphanumerics). Pass your own to keep ids unique
    across turns.
    `choice`: for `openai`, which `choices[].index` to assemble (others are ignored).
    `release`: `"finish"` (the default) hands out `ToolCallReady` only from `finish()`, and only when the stream
    ended normally (`stop`, `tool_calls`, `end_turn`, `tool_use`, `stop_sequence`); a call from a response cut off
    by the output limit, a content filter, an error or an unknown end is never released. `"early"` hands out each
    call from `feed()` as soon as it is complete: sooner, but the response may still be cut off after it.
    An in-band provider error (an OpenAI `{"error": ...}` chunk, Anthropic's `event: error`) makes `feed()` raise
    `ProviderStreamError`; nothing still pending is released.
    `max_event_size` (anthropic): the most characters (bytes, when fed bytes) buffered for one SSE line, one
    event's `data`, or one `tool_use` block's streamed input; default `DEFAULT_MAX_EVENT_SIZE` (64 MiB). Past it
    `feed()` raises `ToolCallError` naming the event, and the buffer is dropped.
    """

    def __init__(
        self,
        tools: Request | Iterable[Mapping[str, Any]] | None,
        format: ToolCallFormat | str,
        *,
        make_id: Callable[[int], str] | None = None,
        choice: int = 0,
        release: Release | str = Release.FINISH,
        max_event_size: int = DEFAULT_MAX_EVENT_SIZE,
    ) -> None:
        if not isinstance(max_event_size, int) or isinstance(max_event_size, bool) or max_event_size < 1:
            raise ToolCallError(
                f"max_event_size must be a positive integer, got {max_event_size!r}",
                path="max_event_size",
                hint=f"pass a number of characters (default {DEFAULT_MAX_EVENT_SIZE})",
            )
        self.max_event_size = max_event_size
        self.format = _choice(ToolCallFormat, format, "tool-call format", "format")
        self.release = _choice(Release, release, "release mode", "release")
        self._tools = _compile_tools(tools)
        self._make_id = make_id or _default_id
        self._events: list[Event] = []
        self._text: list[str] = []
        self._calls: list[ToolCallReady] = []  # released
        self._held: list[ToolCallReady] = []  # complete and valid, waiting for a normal end (release="finish")
        self._errors: list[ToolCallError] = []
        self._notes: list[str] = []
        self._thinking: list[str] = []
        self._next_index = 0
        self._finished = False
        self._failed: ProviderStreamError | None = None
        self._cut_off: str | None = None  # set when the stream is seen to be cut off whatever its finish reason says
        self._stream = _STREAMS[self.format](self, choice)

    # -- public

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def feed(self, delta: Any) -> list[Event]:
        """Consume one delta (text for raw formats; a chunk for openai; SSE text or an event for anthropic);
        return the events it released. Raises `ProviderStreamError` when the delta is an in-band error."""
        if self._failed is not None:
            raise ToolCallError(
                "feed() after the stream ended with a provider error",
                path="stream",
                hint=f"the stream is over ({self._failed.message}); send the request again",
            )
        if self._finished:
            raise ToolCallError("feed() after finish()", path="stream", hint="create a new ToolCallAssembler")
        if self.format.value in _RAW_FORMATS:
            payload = _error_payload(delta)
            if payload is not None:
                self._provider_error(payload, "stream")
        self._stream.feed(delta)
        out, self._events = self._events, []
        return out

    def finish(self, finish_reason: str | None = None) -> Result:
        """End the stream. `finish_reason` is the stream's own (for openai it defaults to the last chunk's, for
        anthropic to `message_delta.stop_reason` once `message_stop` has arrived). Without one, the end is unknown
        and no call is released. After a provider error this raises that `ProviderStreamError` again."""
        if self._failed is not None:
            raise self._failed
        if self._finished:
            raise ToolCallError("finish() called twice", path="stream", hint="create a new ToolCallAssembler")
        self._finished = True
        reason = self._stream.finish(finish_reason)
        held = sorted(self._held, key=lambda c: c.index)
        self._held = []
        if reason in _NORMAL_STOPS and self._cut_off is None:
            for ready in held:
                self._calls.append(ready)
                self._events.append(ready)
        else:
            self._errors += [self._withheld(ready, reason) for ready in held]
            if self._calls:  # release="early": calls of this response were out before it ended badly
                listed = ", ".join(f"tool_calls[{c.index}]" for c in sorted(self._calls, key=lambda c: c.index))
                ended = self._cut_off or f"finish_reason={reason!r}"
                self._note(f"{listed} released early (release='early'), then the response ended abnormally ({ended})")
        events, self._events = tuple(self._events), []
        return self._result(reason, events)

    # -- used by the format streams

    def _result(self, reason: str | None, events: tuple[Event, ...]) -> Result:
        calls = tuple(sorted(self._calls, key=lambda c: c.index))
        errors = tuple(sorted(self._errors, key=lambda e: _sort_index(e)))
        if reason in _NORMAL_STOPS:
            mapped: str | None = "tool_calls" if calls and not errors else "stop"
        elif reason in _LENGTH_STOPS:
            mapped = "length"
        else:
            mapped = reason
        return Result(
            calls=calls,
            errors=errors,
            text="".join(self._text),
            finish_reason=mapped,
            stream_finish_reason=reason,
            events=events,
            notes=tuple(self._notes),
            thinking="".join(self._thinking),
        )

    def _withheld(self, ready: ToolCallReady, reason: str | None) -> ToolCallError:
        """A complete, valid call of a stream that did not end normally: never released (Pi's rule)."""
        what = f"tool call {ready.name!r} (tool_calls[{ready.index}]) was not executed"
        if self._cut_off is not None or reason in _LENGTH_STOPS:
            why = self._cut_off or f"finish_reason={reason!r}"
            return _error(
                ToolCallTruncatedError,
                f"{what}: the response hit the output token limit ({why}), and no call from a cut-off response"
                " is released, however complete it looks",
                path=f"tool_calls[{ready.index}]",
                hint="raise max_tokens (or shorten the context) and ask again; nothing was executed",
                index=ready.index,
                call_id=ready.id,
                name=ready.name,
            )
        ended = getattr(self._stream, "ended", None) or f"the stream ended with finish_reason={reason!r}"
        normal = ", ".join(sorted(_NORMAL_STOPS))
        hint = "nothing was executed; " + _ABNORMAL_HINTS.get(reason, "ask the model again")
        if reason is None:
            hint += ", or pass the stream's finish reason to finish() if it ended normally"
        return _error(
            ToolCallError,
            f"{what}: {ended}, not a normal end ({normal}), so the response may be incomplete",
            path=f"tool_calls[{ready.index}]",
            hint=hint,
            index=ready.index,
            call_id=ready.id,
            name=ready.name,
        )

    def _provider_error(self, payload: Any, path: str) -> None:
        """An in-band error: end the stream, release nothing still pending, raise ProviderStreamError."""
        if isinstance(payload, Mapping):
            ptype = payload.get("type")
            pmessage = payload.get("message")
            pcode = payload.get("code")
        else:
            ptype, pmessage, pcode = None, payload, None
        ptype = ptype if isinstance(ptype, str) else None
        pmessage = pmessage if isinstance(pmessage, str) else (None if pmessage is None else json.dumps(pmessage))
        pcode = pcode if isinstance(pcode, str | int) and not isinstance(pcode, bool) else None
        # A call released (early) by this same feed() never reached the caller: feed() raises instead of returning.
        undelivered = {id(e): e.index for e in self._events if isinstance(e, ToolCallReady)}
        self._calls = [c for c in self._calls if id(c) not in undelivered]
        self._events = [e for e in self._events if id(e) not in undelivered]
        pending = sorted({*self._stream.open_indexes(), *(c.index for c in self._held), *undelivered.values()})
        released = sorted(c.index for c in self._calls)
        said = ": ".join(x for x in (ptype, pmessage) if x) or "(no message)"
        hint = "the response is incomplete"
        if pending:
            hint += ": " + ", ".join(f"tool_calls[{i}]" for i in pending) + " not released"
        if released:
            listed = ", ".join(f"tool_calls[{i}]" for i in released)
            hint += f"; {listed} had already been released (release='early') and may have run"
        else:
            hint += "; nothing was executed"
        hint += "; send the request again" + (" later" if ptype in ("overloaded_error", "rate_limit_error") else "")
        self._finished = True
        self._held = []
        events, self._events = tuple(self._events), []
        err = ProviderStreamError(
            f"the provider reported an error inside the stream: {said}",
            path=path,
            hint=hint,
            provider_type=ptype,
            provider_message=pmessage,
            provider_code=pcode,
            pending=tuple(pending),
            released=tuple(released),
        )
        err.result = self._result("error", events)
        self._failed = err
        raise err

    def _note(self, text: str) -> None:
        self._notes.append(text)

    def _emit_text(self, text: str) -> None:
        if text:
            self._text.append(text)
            self._events.append(TextDelta(text))

    def _new_index(self) -> int:
        index = self._next_index
        self._next_index += 1
        return index

    def _reject(self, index: int, call_id: str | None, name: str | None, error: ToolCallError) -> None:
        self._errors.append(error)
        self._events.append(ToolCallRejected(index=index, id=call_id, name=name, error=error))

    def _fail(
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
        err = _error(cls, message, path=path, hint=hint, index=index, call_id=call_id, name=name)
        self._reject(index, call_id, name, err)

    def _unfinished(
        self,
        indexes: Sequence[int],
        reason: str | None,
        where: str,
        *,
        call_id: str | None = None,
        name: str | None = None,
    ) -> None:
        """Calls still open when the stream ended: never released."""
        if not indexes:
            return
        listed = ", ".join(f"tool_calls[{i}]" for i in indexes)
        if reason in _LENGTH_STOPS:
            released = sorted(c.index for c in self._calls)
            hint = "raise max_tokens (or shorten the context) and ask again; "
            if released:  # release="early": the truth is that some calls of this cut-off response are out
                hint += (
                    ", ".join(f"tool_calls[{i}]" for i in released)
                    + " had already been released before the cut (release='early') and may have run;"
                    " the pending calls were not executed"
                )
            else:
                hint += "nothing was executed"
            err = _error(
                ToolCallTruncatedError,
                f"{TRUNCATED_MESSAGE} (pending: {listed})",
                path=f"tool_calls[{indexes[0]}]",
                hint=hint,
                index=indexes[0],
                call_id=call_id,
                name=name,
                pending=indexes,
            )
        else:
            err = _error(
                ToolCallError,
                f"the stream ended (finish_reason={reason!r}) inside {listed}, {where}; the call was not released",
                path=f"tool_calls[{indexes[0]}]",
                hint="the call is unterminated: ask the model again",
                index=indexes[0],
                call_id=call_id,
                name=name,
                pending=indexes,
            )
        self._errors.append(err)

    def _complete(self, index: int, call_id: str | None, name: Any, arguments: Any, raw: str, src: str) -> None:
        """A call whose closing marker has been seen: release it if it names a known tool and validates."""
        cid = call_id if call_id is not None else self._make_id(index)
        if not isinstance(name, str) or not name.strip():
            self._fail(index, cid, None, "the tool call has no function name", path=src, hint="name a declared tool")
            return
        name = name.strip()
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools) or "(none)"
            self._fail(
                index,
                cid,
                name,
                f"unknown tool {name!r}",
                path=f"tool_calls[{index}].name",
                hint=f"call one of the declared tools: {known}",
            )
            return
        if not isinstance(arguments, dict):
            self._fail(
                index,
                cid,
                name,
                f"arguments must be a JSON object, got {json_type_name(arguments)}",
                path=f"tool_calls[{index}].arguments",
                hint='send the arguments as an object, e.g. {"city": "Paris"} or {}',
            )
            return
        try:
            errors = list(tool.validator.iter_errors(arguments))
        except Exception as exc:  # an unresolvable $ref and the like: the schema, not the call, is at fault
            self._fail(
                index,
                cid,
                name,
                f"the schema of {name!r} cannot be applied: {exc}",
                path=tool.path,
                hint="make the schema self-contained (local $ref only)",
            )
            return
        if errors:
            # In the order the model wrote the arguments: the first violation is the first one it will read.
            located = sorted(
                (
                    (_document_position(arguments, keys), n, keys, e)
                    for n, e in enumerate(errors)
                    for keys in [_violation_keys(e)]
                ),
                key=lambda item: (item[0], item[1]),
            )
            violations = [{"path": _arguments_path(index, keys), "message": e.message} for _, _, keys, e in located]
            best = located[0][3]
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            err = _error(
                ToolCallValidationError,
                f"arguments of {name!r} do not match its schema: {best.message}{more}",
                path=violations[0]["path"],
                hint="fix the value at this path and call the tool again",
                index=index,
                call_id=cid,
                name=name,
                violations=violations,
            )
            self._reject(index, cid, name, err)
            return
        earlier = next((c for c in (*self._calls, *self._held) if c.id == cid), None)
        if earlier is not None:
            # Two calls with one id: a tool result answers an id, so which call it answers is ambiguous. Refuse this
            # one; a held earlier one is withdrawn too (an early-released one is already out).
            hint = "every tool call of a response needs its own id; ask the model again"
            if earlier in self._held:
                self._held.remove(earlier)
                self._fail(
                    earlier.index,
                    cid,
                    earlier.name,
                    f"tool_calls[{index}] has the same id {cid!r}; neither is released",
                    path=f"tool_calls[{earlier.index}].id",
                    hint=hint,
                )
            self._fail(
                index,
                cid,
                name,
                f"the id {cid!r} was already used by tool_calls[{earlier.index}]",
                path=f"tool_calls[{index}].id",
                hint=hint,
            )
            return
        ready = ToolCallReady(index=index, id=cid, name=name, arguments=arguments, raw_arguments=raw)
        if self.release is Release.EARLY:
            self._calls.append(ready)
            self._events.append(ready)
        else:
            self._held.append(ready)


def _default_id(index: int) -> str:
    return f"call{index:05d}"


def _sort_index(error: ToolCallError) -> int:
    index = getattr(error, "index", None)
    return index if isinstance(index, int) else 1 << 30


class _NotJSON(ValueError):
    """Raised inside json.loads by the strict hooks: text json.loads accepts that RFC 8259 does not."""


def _refuse_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _NotJSON(f"duplicate object key {key!r}")
        out[key] = value
    return out


_CONSTANT_AT = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')
_SURROGATE = re.compile("[\ud800-\udfff]")


def _constant_offset(text: str) -> int | None:
    for m in _CONSTANT_AT.finditer(text):
        if m.group(1):
            return m.start(1)
    return None


def _lone_surrogate(value: Any) -> str | None:
    """The JSON path of the first string (or key) holding a lone surrogate, or of a non-finite float; iterative,
    so a value json.loads managed to build is walked without recursion."""
    stack: list[tuple[str, Any]] = [("$", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return f"a lone surrogate in the string at {path}"
        elif isinstance(node, float):
            if node != node or node in (float("inf"), float("-inf")):
                return f"a non-finite number ({node!r}) at {path}"
        elif isinstance(node, dict):
            for key, item in reversed(list(node.items())):
                if isinstance(key, str) and _SURROGATE.search(key):
                    return f"a lone surrogate in an object key at {path}"
                stack.append((f"{path}[{json.dumps(key)}]", item))
        elif isinstance(node, list | tuple):
            for k in range(len(node) - 1, -1, -1):
                stack.append((f"{path}[{k}]", node[k]))
    return None


def _choice(kind: Any, value: Any, noun: str, path: str) -> Any:
    """`kind(value)` for an enum `kind`, or a ToolCallError naming the values it takes."""
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(k.value for k in kind)
        raise ToolCallError(f"unknown {noun} {value!r}", path=path, hint=f"use one of: {known}") from None


def loads_object(text: str, *, unicode: bool = True) -> tuple[Any, str | None]:
    """Strict RFC 8259 json.loads, with the error as a message (naming the offset, key or path) instead of an
    exception: no NaN/Infinity, no duplicate object keys, no lone surrogate (escaped or not), no integer longer
    than Python converts (4,300 digits), no nesting deeper than the parser's recursion limit. Never raises.
    `unicode=False` (a whole stream event, whose text deltas are passed through) skips the surrogate check."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        return None, f"{exc.msg} at char {exc.pos}"
    except _NotJSON as exc:
        at = _constant_offset(text) if "JSON number" in str(exc) else None
        return None, f"{exc}" + (f" at char {at}" if at is not None else "") + " (RFC 8259 does not allow it)"
    except RecursionError:
        return None, "nested too deeply to parse"
    except ValueError as exc:  # int_max_str_digits: "Exceeds the limit (4300 digits) for integer string conversion"
        return None, f"a number too long to convert ({str(exc).split(';')[0]})"
    except MemoryError:
        return None, "too large to parse"
    problem = _lone_surrogate(value) if unicode else None
    if problem is not None:
        return None, f"{problem} (RFC 8259 text must be valid Unicode)"
    return value, None


def _dumps_arguments(value: Any) -> tuple[str, str | None]:
    """Canonical JSON of already-parsed arguments, or the problem that keeps them from being JSON."""
    problem = _lone_surrogate(value)
    if problem is not None:
        return "", problem
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False), None
    except (TypeError, ValueError, RecursionError) as exc:
        return "", f"not JSON-serialisable: {exc}"


# ---------------------------------------------------------------------------------------------------------------
# openai: chat.completion.chunk


@dataclass
class _OpenCall:
    index: int  # our position
    stream_index: int | None
    id: str | None = None
    name: str | None = None
    parts: list[str] = field(default_factory=list)


class _OpenAIStream:
    """Fragments are keyed by `index` (and `id` when sent). One call is open at a time; a fragment for another
    call means the stream has moved past the open one, which is then complete."""

    def __init__(self, asm: ToolCallAssembler, choice: int) -> None:
        self.asm = asm
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
        payload = _error_payload(chunk)
        if payload is not None:
            self.asm._provider_error(payload, f"chunks[{k}]")
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
                self.asm._emit_text(content)
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
                index = self.asm._new_index()
                self.asm._fail(
                    index,
                    fid,
                    name,
                    f"a fragment for stream index {sidx} arrived after the stream had moved past that call",
                    path=path,
                    hint="the server interleaved tool-call fragments; its calls cannot be assembled safely",
                )
                return
            call = self.open = _OpenCall(index=self.asm._new_index(), stream_index=sidx)
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
        cid = call.id if call.id is not None else self.asm._make_id(call.index)
        value, problem = loads_object(raw)
        if problem is not None:
            self.asm._fail(
                call.index,
                cid,
                call.name,
                f"arguments are not valid JSON: {problem}",
                path=f"tool_calls[{call.index}].arguments",
                hint='the model must send a complete JSON object, e.g. {"city": "Paris"}',
            )
            return
        self.asm._complete(call.index, cid, call.name, value, raw, f"tool_calls[{call.index}].name")

    def open_indexes(self) -> list[int]:
        return [] if self.open is None else [self.open.index]

    def finish(self, finish_reason: str | None) -> str | None:
        reason = finish_reason if finish_reason is not None else self.seen_finish
        call = self.open
        if call is None:
            return reason
        if reason in _NORMAL_STOPS:
            raw = "".join(call.parts)
            if _looks_cut_off(raw):
                # Arguments cut off mid-JSON under a "tool_calls"/"stop" finish: a server that rewrote "length"
                # (vLLM did in its streaming path) would look exactly like this. Never released, and neither is any
                # other call of this response (release="finish"): the response was cut off.
                self.open = None
                self.asm._cut_off = f"tool_calls[{call.index}] ends mid-JSON although finish_reason is {reason!r}"
                cid = call.id if call.id is not None else self.asm._make_id(call.index)
                self.asm._fail(
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
        self.asm._unfinished(
            [call.index], reason, "before the stream moved past the call", call_id=call.id, name=call.name
        )
        return reason


# ---------------------------------------------------------------------------------------------------------------
# Raw text: <tool_call> ... </tool_call> (hermes, qwen3_coder)

_TEXT, _BODY = 0, 1
_TOOL_CALL_OPEN = "<tool_call>"
_TOOL_CALL_CLOSE = "</tool_call>"


class _TaggedStream:
    """Text, then `<tool_call>` body `</tool_call>`, repeated. Subclasses parse the body."""

    def __init__(self, asm: ToolCallAssembler, choice: int) -> None:
        self.asm = asm
        self.state = _TEXT
        self.pending = ""  # a possible marker prefix, not yet classified
        self.index = -1
        self.parts: list[str] = []

    def feed(self, text: Any) -> None:
        t = self.pending + _text_delta(text, self.asm.format.value)
        self.pending = ""
        i = 0
        n = len(t)
        while i <= n:
            if self.state == _TEXT:
                j = t.find(_TOOL_CALL_OPEN, i)
                if j < 0:
                    safe, self.pending = _split_marker_prefix(t[i:], _TOOL_CALL_OPEN)
                    self.asm._emit_text(safe)
                    return
                self.asm._emit_text(t[i:j])
                i = j + len(_TOOL_CALL_OPEN)
                self.state = _BODY
                self.index = self.asm._new_index()
                self.parts = []
                self._start_body()
            else:
                j = t.find(_TOOL_CALL_CLOSE, i)
                if j < 0:
                    body, self.pending = _split_marker_prefix(t[i:], _TOOL_CALL_CLOSE)
                    self._body(body)
                    return
                self._body(t[i:j])
                i = j + len(_TOOL_CALL_CLOSE)
                if self._closes_here():
                    self.state = _TEXT
                    self._close("".join(self.parts))
                else:
                    self._body(_TOOL_CALL_CLOSE)

    def open_indexes(self) -> list[int]:
        return [self.index] if self.state == _BODY else []

    def _start_body(self) -> None:
        pass

    def _body(self, text: str) -> None:
        if text:
            self.parts.append(text)

    def _closes_here(self) -> bool:
        return True

    def _close(self, body: str) -> None:
        raise NotImplementedError

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _TEXT:
            self.asm._emit_text(self.pending)
            self.pending = ""
        else:
            self.asm._unfinished([self.index], finish_reason, f"before {_TOOL_CALL_CLOSE}")
        return finish_reason


class _HermesStream(_TaggedStream):
    """Body: one JSON object {"name": ..., "arguments": {...}}. `</tool_call>` inside a JSON string is text."""

    def _start_body(self) -> None:
        self.span = _JsonSpan()

    def _body(self, text: str) -> None:
        if text:
            self.parts.append(text)
            self.span.feed(text)

    def _closes_here(self) -> bool:
        return not self.span.in_string

    def _close(self, body: str) -> None:
        index = self.index
        obj, problem = loads_object(body)
        if problem is not None:
            self.asm._fail(
                index,
                None,
                None,
                f"the tool call is not valid JSON: {problem}",
                path=f"tool_calls[{index}]",
                hint='write <tool_call>{"name": ..., "arguments": {...}}</tool_call>',
            )
            return
        _complete_named_object(self.asm, index, obj, f"tool_calls[{index}]")


def _complete_named_object(asm: ToolCallAssembler, index: int, obj: Any, path: str, *, ids: bool = False) -> None:
    """{"name": ..., "arguments": {...} or "<json>"} (hermes; mistral before v11 also carries "id")."""
    cid = None
    if ids and isinstance(obj, dict) and isinstance(obj.get("id"), str):
        cid = obj["id"]
    if not isinstance(obj, dict):
        asm._fail(
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
        asm._fail(
            index,
            cid if cid is not None else asm._make_id(index),
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
        raw, problem = _dumps_arguments(args)
    if problem is not None:
        asm._fail(
            index,
            cid if cid is not None else asm._make_id(index),
            name if isinstance(name, str) else None,
            f"arguments are not valid JSON: {problem}",
            path=f"{path}.arguments",
            hint="send the arguments as a JSON object",
        )
        return
    asm._complete(index, cid, name, args, raw, f"{path}.name")


# Qwen3-Coder's XML-ish call. The template writes each value with `| string` (so Python's True/None) unless it is
# a mapping or a list (then `tojson`); the schema says which type to turn the text back into.
_FUNCTION_OPEN = re.compile(r"\s*<function=([^>\n]*)>")
_PARAMETER_OPEN = re.compile(r"<parameter=([^>\n]*)>")
_FUNCTION_CLOSE = "</function>"
_PARAMETER_CLOSE = "</parameter>"


class _Qwen3CoderStream(_TaggedStream):
    def _close(self, body: str) -> None:
        index = self.index
        path = f"tool_calls[{index}]"
        m = _FUNCTION_OPEN.match(body)
        if m is None:
            self.asm._fail(
                index,
                None,
                None,
                "expected <function=NAME> after <tool_call>",
                path=f"{path}.name",
                hint="write <tool_call><function=name><parameter=p>value</parameter></function></tool_call>",
            )
            return
        name = m.group(1).strip()
        rest = body[m.end() :]
        end = rest.rfind(_FUNCTION_CLOSE)
        if end >= 0:
            if rest[end + len(_FUNCTION_CLOSE) :].strip():
                self.asm._fail(
                    index,
                    None,
                    name,
                    "unexpected text after </function>",
                    path=path,
                    hint="close the call with </tool_call> right after </function>",
                )
                return
            rest = rest[:end]
        tool = self.asm._tools.get(name)
        properties = _properties(tool.schema) if tool is not None else {}
        args: dict[str, Any] = {}
        starts = list(_PARAMETER_OPEN.finditer(rest))
        if rest[: starts[0].start() if starts else len(rest)].strip():
            self.asm._fail(
                index, None, name, "unexpected text before the first <parameter=...>", path=path, hint="remove it"
            )
            return
        for k, p in enumerate(starts):
            pname = p.group(1).strip()
            stop = starts[k + 1].start() if k + 1 < len(starts) else len(rest)
            chunk = rest[p.end() : stop]
            close = chunk.find(_PARAMETER_CLOSE)
            if close >= 0:
                if chunk[close + len(_PARAMETER_CLOSE) :].strip():
                    self.asm._fail(
                        index,
                        None,
                        name,
                        f"unexpected text after </parameter> of {pname!r}",
                        path=_arguments_path(index, [pname]),
                        hint="write one <parameter=...>...</parameter> after another",
                    )
                    return
                chunk = chunk[:close]
            # Like vLLM's parser (and the template, which writes "\n" + value + "\n"): one newline on each side is
            # framing, the rest is the value.
            value = chunk.removeprefix("\n").removesuffix("\n")
            if pname in args:
                self.asm._fail(
                    index,
                    None,
                    name,
                    f"parameter {pname!r} is given twice",
                    path=_arguments_path(index, [pname]),
                    hint="give each parameter once",
                )
                return
            args[pname] = _coerce_parameter(value, properties.get(pname))
        raw, problem = _dumps_arguments(args)
        if problem is not None:
            self.asm._fail(
                index,
                None,
                name,
                f"arguments are not valid JSON: {problem}",
                path=f"tool_calls[{index}].arguments",
                hint="write each parameter value as valid Unicode text",
            )
            return
        self.asm._complete(index, None, name, args, raw, f"{path}.name")


def _properties(schema: Any) -> dict[str, Any]:
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
        return schema["properties"]
    return {}


def _schema_types(schema: Any) -> list[str]:
    """The JSON types a property schema allows: `type` (string or list), else the union of anyOf/oneOf branches."""
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or []:
            out += [k for k in _schema_types(branch) if k not in out]
    if not out and "enum" in schema:
        out = sorted({_json_kind(v) for v in schema["enum"]})
    if not out and "const" in schema:
        out = [_json_kind(schema["const"])]
    return out


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


_NOT_CONVERTED = object()


def _coerce_parameter(value: str, schema: Any) -> Any:
    """Turn a Qwen3-Coder parameter's text into the type its schema declares.

    A value that does not convert stays a string, so schema validation then names the parameter and says what
    was expected (vLLM instead degrades silently, e.g. a non-boolean becomes False). A parameter the schema does
    not type (or declare) stays a string, as in vLLM.
    """
    types = _schema_types(schema)
    if not types or types == ["string"]:
        return value
    text = value.strip()
    if ("null" in types or "string" not in types) and text.lower() in ("null", "none"):
        return None
    for kind in types:
        converted = _convert(text, kind)
        if converted is not _NOT_CONVERTED:
            return converted
    return value


def _convert(text: str, kind: str) -> Any:
    if kind == "boolean":
        lowered = text.lower()
        return True if lowered == "true" else False if lowered == "false" else _NOT_CONVERTED
    if kind in ("integer", "number"):
        number, problem = loads_object(text)
        if problem is not None:
            return _NOT_CONVERTED
        if isinstance(number, bool) or not isinstance(number, int | float):
            return _NOT_CONVERTED
        if kind == "integer" and isinstance(number, float) and not number.is_integer():
            return _NOT_CONVERTED
        return number
    if kind in ("object", "array"):
        want = dict if kind == "object" else list
        parsed, problem = loads_object(text)
        if problem is not None:
            try:
                json.loads(text)
            except json.JSONDecodeError:
                pass
            except (ValueError, RecursionError):
                return _NOT_CONVERTED
            else:
                return _NOT_CONVERTED  # JSON that strict RFC 8259 refuses (NaN, a duplicate key, a lone surrogate)
            # The template writes mappings with tojson, but models also write Python literals ({'a': 1}, True).
            try:
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return _NOT_CONVERTED
        return parsed if isinstance(parsed, want) else _NOT_CONVERTED
    return _NOT_CONVERTED


# ---------------------------------------------------------------------------------------------------------------
# Raw text: mistral

_TOOL_CALLS = "[TOOL_CALLS]"
_ARGS = "[ARGS]"
_CALL_ID = "[CALL_ID]"
_M_TEXT, _M_HEAD, _M_NAME, _M_CALL_ID, _M_ARGS_START, _M_ARGS, _M_ARRAY, _M_SKIP = range(8)
_NAME_END = re.compile(r"[{\[]")


class _MistralStream:
    """`[TOOL_CALLS]` then either a JSON array of {"name", "arguments", "id"?} objects (tokenizers before v11,
    e.g. mistral-nemo's Tekken v3) or `name[CALL_ID]id[ARGS]{...}` / `name[ARGS]{...}` per call (v11 / v13+).

    `[ARGS]` is optional: servers that decode without special tokens produce `name{...}`. Neither form has a
    closing marker, so the closing bracket of the JSON is the end of the call.
    """

    def __init__(self, asm: ToolCallAssembler, choice: int) -> None:
        self.asm = asm
        self.state = _M_TEXT
        self.pending = ""
        self.index = -1
        self.name_parts: list[str] = []
        self.id_parts: list[str] = []
        self.raw_parts: list[str] = []
        self.span = _JsonSpan()

    def feed(self, text: Any) -> None:
        t = self.pending + _text_delta(text, "mistral")
        self.pending = ""
        i = 0
        n = len(t)
        while i < n or self.state == _M_TEXT:
            state = self.state
            if state in (_M_TEXT, _M_SKIP):
                j = t.find(_TOOL_CALLS, i)
                if j < 0:
                    safe, self.pending = _split_marker_prefix(t[i:], _TOOL_CALLS)
                    if state == _M_TEXT:
                        self.asm._emit_text(safe)
                    return
                if state == _M_TEXT:
                    self.asm._emit_text(t[i:j])
                i = j + len(_TOOL_CALLS)
                self.state = _M_HEAD
                self.index = self.asm._new_index()
                self.name_parts, self.id_parts, self.raw_parts = [], [], []
            elif state == _M_HEAD:
                while i < n and t[i].isspace():
                    i += 1
                if i == n:
                    return
                self.span = _JsonSpan()
                if t[i] != "[":
                    self.state = _M_NAME
                    continue
                rest = t[i:]
                if rest.startswith(_ARGS) or rest.startswith(_CALL_ID):
                    self.state = _M_NAME  # a header without a name: reported when the call closes
                elif _ARGS.startswith(rest) or _CALL_ID.startswith(rest):
                    self.pending = rest  # "[" opens the array or [ARGS]; wait for the next character
                    return
                else:
                    self.state = _M_ARRAY
            elif state in (_M_NAME, _M_CALL_ID):
                parts = self.name_parts if state == _M_NAME else self.id_parts
                m = _NAME_END.search(t, i)
                if m is None:
                    parts.append(t[i:])
                    return
                j = m.start()
                parts.append(t[i:j])
                if t[j] == "{":
                    i = j
                    self.state = _M_ARGS
                    continue
                rest = t[j:]
                if rest.startswith(_ARGS):
                    i = j + len(_ARGS)
                    self.state = _M_ARGS_START
                elif state == _M_NAME and rest.startswith(_CALL_ID):
                    i = j + len(_CALL_ID)
                    self.state = _M_CALL_ID
                elif _ARGS.startswith(rest) or (state == _M_NAME and _CALL_ID.startswith(rest)):
                    self.pending = rest
                    return
                else:
                    i = j
                    self._malformed(f"unexpected {rest[:12]!r} in the tool call's header")
            elif state == _M_ARGS_START:
                while i < n and t[i].isspace():
                    i += 1
                if i == n:
                    return
                if t[i] == "{":
                    self.state = _M_ARGS
                else:
                    self._malformed(f"expected a JSON object after [ARGS], got {t[i : i + 12]!r}")
            else:  # _M_ARGS or _M_ARRAY
                end = self.span.feed(t, i)
                if end < 0:
                    self.raw_parts.append(t[i:])
                    return
                self.raw_parts.append(t[i:end])
                i = end
                self.state = _M_TEXT
                if state == _M_ARGS:
                    self._close_v11()
                else:
                    self._close_array()

    def _malformed(self, message: str) -> None:
        name = "".join(self.name_parts).strip() or None
        self.asm._fail(
            self.index,
            None,
            name,
            message,
            path=f"tool_calls[{self.index}]",
            hint="write [TOOL_CALLS]name[ARGS]{...} or [TOOL_CALLS][{...}]",
        )
        self.state = _M_SKIP

    def _close_v11(self) -> None:
        index = self.index
        raw = "".join(self.raw_parts)
        call_id = "".join(self.id_parts).strip() or None
        name = "".join(self.name_parts).strip()
        value, problem = loads_object(raw)
        if problem is not None:
            self.asm._fail(
                index,
                call_id,
                name or None,
                f"arguments are not valid JSON: {problem}",
                path=f"tool_calls[{index}].arguments",
                hint="send the arguments as one JSON object",
            )
            return
        self.asm._complete(index, call_id, name, value, raw, f"tool_calls[{index}].name")

    def _close_array(self) -> None:
        first = self.index
        raw = "".join(self.raw_parts)
        value, problem = loads_object(raw)
        if problem is not None or not isinstance(value, list):
            self.asm._fail(
                first,
                None,
                None,
                f"the tool calls are not a valid JSON array: {problem or 'got ' + json_type_name(value)}",
                path=f"tool_calls[{first}]",
                hint='write [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]',
            )
            return
        if not value:
            self.asm._fail(
                first,
                None,
                None,
                "an empty list of tool calls",
                path=f"tool_calls[{first}]",
                hint="ask the model again",
            )
            return
        for k, obj in enumerate(value):
            index = first if k == 0 else self.asm._new_index()
            _complete_named_object(self.asm, index, obj, f"tool_calls[{index}]", ids=True)

    def open_indexes(self) -> list[int]:
        if self.state in (_M_TEXT, _M_SKIP):
            return []
        if self.state == _M_ARRAY:
            return list(range(self.index, self.index + max(1, _array_items_opened("".join(self.raw_parts)))))
        return [self.index]

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _M_TEXT:
            self.asm._emit_text(self.pending)
        elif self.state != _M_SKIP:
            # In the array form, each object opened at depth 1 is one call.
            self.asm._unfinished(self.open_indexes(), finish_reason, "before its JSON closed")
        self.pending = ""
        return finish_reason


def _array_items_opened(raw: str) -> int:
    """How many objects a cut-off array had opened at depth 1 (once, at finish)."""
    depth = count = 0
    in_string = escaped = False
    for c in raw:
        if escaped:
            escaped = False
        elif in_string:
            if c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            count += c == "{" and depth == 1
            depth += 1
        elif c in "}]":
            depth -= 1
    return count


# ---------------------------------------------------------------------------------------------------------------
# anthropic: the Messages API stream


_EOL = re.compile(r"\r\n|\r|\n")


class _SSEReader:
    """Server-sent events as the HTML standard parses them, fed in pieces split anywhere (str, or bytes in UTF-8).

    Lines end at CRLF, LF or CR; `event:` names the event, `data:` lines are joined with LF, `:` starts a comment,
    a blank line dispatches. An event without its blank line when the stream ends is discarded, as the standard
    says (and reported in `leftover`)."""

    def __init__(self, max_size: int = 1 << 62) -> None:
        self.max_size = max_size  # cap on the pending line and on one event's data (characters)
        self.partial: list[str] = []  # the current line, not yet ended
        self.partial_size = 0
        self.data_size = 0
        self.events = 0  # events dispatched
        self.skip_lf = False  # the last piece ended in CR: a LF at the start of the next one belongs to it
        self.started = False
        self.event = ""
        self.data: list[str] = []
        self.decoder: Any = None
        self.fed = 0  # characters (or bytes) fed, for error paths

    def feed(self, piece: str | bytes | bytearray) -> list[tuple[str, str]]:
        if isinstance(piece, bytes | bytearray):
            if self.decoder is None:
                self.decoder = codecs.getincrementaldecoder("utf-8")("strict")
            try:
                text = self.decoder.decode(bytes(piece))
            except UnicodeDecodeError as exc:
                raise ToolCallError(
                    f"the stream is not valid UTF-8: {exc.reason}",
                    path=f"stream byte {self.fed + exc.start}",
                    hint="feed the response body as the server sent it (SSE is UTF-8)",
                ) from None
        else:
            text = piece
        self.fed += len(piece)
        out: list[tuple[str, str]] = []
        i = 0
        if text and self.skip_lf:
            self.skip_lf = False
            if text[0] == "\n":
                i = 1
        if not self.started and text:
            self.started = True
            if text[0] == "\ufeff":  # a byte-order mark at the start of the stream is not part of it
                i = max(i, 1)
        for m in _EOL.finditer(text, i):
            self._check(self.partial_size + m.start() - i, "line")
            line = "".join(self.partial) + text[i : m.start()] if self.partial else text[i : m.start()]
            self.partial, self.partial_size = [], 0
            self._line(line, out)
            i = m.end()
            if m.end() == len(text) and m.group() == "\r":
                self.skip_lf = True
        if i < len(text):
            self._check(self.partial_size + len(text) - i, "line")
            self.partial.append(text[i:])
            self.partial_size += len(text) - i
        return out

    def _check(self, size: int, what: str) -> None:
        if size > self.max_size:
            self.partial, self.partial_size, self.data, self.data_size = [], 0, [], 0
            raise ToolCallError(
                f"an SSE {what} longer than max_event_size={self.max_size} characters",
                path=f"events[{self.events}] (stream char {self.fed})",
                hint="the stream is not a sane SSE body (a missing newline?); raise max_event_size if it is real",
            )

    def _line(self, line: str, out: list[tuple[str, str]]) -> None:
        if not line:
            if self.data:
                out.append((self.event or "message", "\n".join(self.data)))
                self.events += 1
            self.event, self.data, self.data_size = "", [], 0
            return
        if line[0] == ":":
            return  # a comment (servers send them as keep-alives)
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self.event = value
        elif name == "data":
            self._check(self.data_size + len(value) + 1, "event's data")
            self.data.append(value)
            self.data_size += len(value) + 1
        # id, retry and unknown fields do not matter here

    @property
    def leftover(self) -> bool:
        return bool(self.partial or self.data or self.event)


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


class _AnthropicStream:
    """`message_start`, then per content block `content_block_start` / `content_block_delta`* /
    `content_block_stop`, then `message_delta` (with `stop_reason`) and `message_stop`; `ping` anywhere; `error`
    in-band. A `tool_use` block is a call, complete at its `content_block_stop` (seed 003 §2.5); with the default
    `release="finish"` it is released only once the message has ended normally.

    Fed either the raw SSE text (`event:`/`data:` lines, in pieces split anywhere, str or UTF-8 bytes) or the parsed
    events (dicts with `type`, or SDK event objects with `model_dump()`), never both in one stream."""

    def __init__(self, asm: ToolCallAssembler, choice: int) -> None:
        self.asm = asm
        self.sse = _SSEReader(asm.max_event_size)
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
                self.asm._provider_error(data, path)
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
            self.asm._provider_error(event.get("error", event), path)
        self._event(event, path)

    def _event(self, event: Mapping[str, Any], path: str) -> None:
        kind = event.get("type")
        if kind == "error":
            self.asm._provider_error(event.get("error"), path)
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
                if earlier in _NORMAL_STOPS:
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
            self.asm._note(f"{path}: an event of unknown type {kind!r} was skipped")

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
            b.call = self.asm._new_index()
            b.id = block.get("id") if isinstance(block.get("id"), str) else None
            b.name = block.get("name") if isinstance(block.get("name"), str) else None
            b.start_input = block.get("input")
        elif kind == "text" and isinstance(block.get("text"), str):
            self.asm._emit_text(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            self.asm._thinking.append(block["thinking"])
        elif btype in ("server_tool_use", "mcp_tool_use"):
            name = block.get("name")
            self.asm._note(
                f"content[{index}]: a {btype} block ({name!r}) runs on the provider's side; it is not a call"
                " for you to execute and is not released"
            )
        elif btype == "redacted_thinking":
            self.asm._note(f"content[{index}]: a redacted_thinking block (encrypted reasoning) is not text")
        else:
            self.asm._note(f"content[{index}]: a {btype} block is neither text nor a tool call; skipped")
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
            self.asm._note(f"{path}: a delta of unknown type {dtype!r} for content block {index} was skipped")
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
            self.asm._emit_text(value)
        elif block.kind == "thinking":
            self.asm._thinking.append(value)
        else:
            block.size += len(value)
            if block.size > self.asm.max_event_size:
                block.parts, block.size = [], 0
                raise ToolCallError(
                    f"the input of tool_use content block {index} is longer than max_event_size="
                    f"{self.asm.max_event_size} characters",
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
        cid = block.id if block.id is not None else self.asm._make_id(index)
        if not self.started:
            # Anthropic's documented flow starts with message_start (ping and error may come anywhere). A call
            # from a stream without it is from no known message (a stream fed from its middle, a spliced one).
            self.asm._fail(
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
            raw, problem = _dumps_arguments(value)
            if problem is not None:
                self._bad_json(block, cid, f"input is not valid JSON: {problem}")
                return
        else:
            value, problem = loads_object(raw)
            if problem is not None:
                if _looks_cut_off(raw):
                    # Input cut off mid-JSON: the output limit, most likely; the message's end says (finish).
                    self.cut.append((block, f"input is not valid JSON: {problem}"))
                    return
                self._bad_json(block, cid, f"input is not valid JSON: {problem}")
                return
        self.asm._complete(index, cid, block.name, value, raw, f"tool_calls[{index}].name")

    def _bad_json(self, block: _Block, cid: str, message: str) -> None:
        self.asm._fail(
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
            self.asm._note("the stream ended inside an SSE event (no blank line after it); it was discarded")
        if self.inconsistent is not None:
            # Refused in feed(); should the caller finish anyway, nothing is released: a non-normal reason if one
            # was given, else an unknown end.
            reason: str | None = self.stop_reason if self.stop_reason not in _NORMAL_STOPS else None
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
                self.asm._unfinished(
                    [block.call], reason, "before its content_block_stop", call_id=block.id, name=block.name
                )
        self.blocks = {}
        for block, problem in self.cut:
            cid = block.id if block.id is not None else self.asm._make_id(block.call)
            if reason in _LENGTH_STOPS:
                self.asm._unfinished([block.call], reason, "with its input cut off", call_id=cid, name=block.name)
            else:
                self._bad_json(block, cid, f"{problem} (it ends mid-JSON)")
        self.cut = []
        return reason


_STREAMS: dict[ToolCallFormat, Callable[[ToolCallAssembler, int], Any]] = {
    ToolCallFormat.OPENAI: _OpenAIStream,
    ToolCallFormat.HERMES: _HermesStream,
    ToolCallFormat.QWEN3_CODER: _Qwen3CoderStream,
    ToolCallFormat.MISTRAL: _MistralStream,
    ToolCallFormat.ANTHROPIC: _AnthropicStream,
}


def assemble(
    tools: Request | Iterable[Mapping[str, Any]] | None,
    format: ToolCallFormat | str,
    deltas: Iterable[Any],
    finish_reason: str | None = None,
    **options: Any,
) -> Result:
    """Feed a whole stream and finish it; the events are in the assembler's order (see `Result`)."""
    assembler = ToolCallAssembler(tools, format, **options)
    for delta in deltas:
        assembler.feed(delta)
    return assembler.finish(finish_reason)
