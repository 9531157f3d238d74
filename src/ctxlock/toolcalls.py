"""Streaming tool-call assembly: a call is released whole and valid, or not at all.

A model streams a tool call a few characters at a time; the first delta is half a JSON object (seed 003 §2.2/2.5).
`ToolCallAssembler` consumes the stream and emits events:

- `TextDelta` for text outside calls, as soon as it cannot be the start of a call marker (only a possible prefix
  of the marker, at most `len(marker) - 1` characters, is held back);
- `ToolCallReady` once a call is complete (its closing marker has been seen) and its arguments are a JSON object
  that validates against the tool's JSON Schema;
- `ToolCallRejected` once a call is complete but cannot be released (unknown tool, malformed JSON, invalid
  arguments); its `error` can go back to the model as a tool result (`to_model`).

`finish(finish_reason)` ends the stream and returns a `Result`. A call still open at the end is never released:
with `finish_reason="length"` it is a `ToolCallTruncatedError`, otherwise an unterminated `ToolCallError`.

When is a call complete?

| format        | the call is complete when ...                                                              |
|---------------|---------------------------------------------------------------------------------------------|
| `hermes`      | `</tool_call>` is seen outside a JSON string                                                |
| `qwen3_coder` | `</tool_call>` is seen                                                                      |
| `mistral`     | the JSON value after the name (v11+: `[TOOL_CALLS]name[ARGS]{...}`) or the JSON array (before |
|               | v11: `[TOOL_CALLS][{...}, ...]`) closes; the closing bracket is the marker                  |
| `openai`      | a fragment for another call arrives (the stream moved past it), or `finish("tool_calls")` / |
|               | `finish("stop")`; and in both cases its concatenated arguments parse as one JSON object     |

The `Result.finish_reason` is `"tool_calls"` only when the stream ended with `"stop"` or `"tool_calls"`, at least
one call was released and no call failed; a `"stop"`/`"tool_calls"` stream that does not meet that is `"stop"`;
any other reason (`"length"`, `"content_filter"`, ...) is kept as it was. So `"length"` is never hidden behind
`"tool_calls"` (vLLM's streaming handler used to do exactly that: vllm-project/vllm issue 53269).
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import jsonschema
import jsonschema.exceptions
from jsonschema.validators import validator_for

from ctxlock.errors import ToolCallError, ToolCallTruncatedError, ToolCallValidationError
from ctxlock.frozen import thaw
from ctxlock.request import Request, join_path, json_type_name

__all__ = [
    "Event",
    "Result",
    "TextDelta",
    "ToolCallAssembler",
    "ToolCallFormat",
    "ToolCallReady",
    "ToolCallRejected",
    "assemble",
    "to_model",
]

TRUNCATED_MESSAGE = (
    "the response hit the output token limit, so tool call arguments may be truncated; re-issue the call"
)


class ToolCallFormat(StrEnum):
    """How the model writes its calls: OpenAI streaming chunks, or one of the raw-text conventions."""

    OPENAI = "openai"  # chat.completion.chunk dicts with delta.tool_calls fragments
    HERMES = "hermes"  # Hermes 2 Pro / Qwen2.5: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
    QWEN3_CODER = "qwen3_coder"  # Qwen3-Coder / Qwen3.5: <tool_call><function=f><parameter=p>v</parameter>...
    MISTRAL = "mistral"  # [TOOL_CALLS]name[ARGS]{...} (v11+) or [TOOL_CALLS][{"name": ..., ...}] (before v11)


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
    try:
        return _checked_validator(key)
    except _UnknownDialect as exc:
        raise ToolCallError(
            f"unknown $schema {exc.args[0]!r}",
            path=f"{path}.$schema",
            hint="use a JSON Schema draft jsonschema knows (draft 4, 6, 7, 2019-09, 2020-12) or omit $schema",
        ) from None
    except jsonschema.exceptions.SchemaError as exc:
        where = path + exc.json_path[1:] if exc.json_path.startswith("$") else path
        draft = validator_for(schema, default=jsonschema.Draft202012Validator).__name__.removesuffix("Validator")
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
    if isinstance(schema, dict) and "$schema" in schema and validator_for(schema, default=None) is None:
        raise _UnknownDialect(schema["$schema"])
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
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


_NORMAL_STOPS = frozenset({"stop", "tool_calls"})


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
    """

    def __init__(
        self,
        tools: Request | Iterable[Mapping[str, Any]] | None,
        format: ToolCallFormat | str,
        *,
        make_id: Callable[[int], str] | None = None,
        choice: int = 0,
    ) -> None:
        try:
            self.format = ToolCallFormat(format)
        except ValueError:
            known = ", ".join(f.value for f in ToolCallFormat)
            raise ToolCallError(
                f"unknown tool-call format {format!r}", path="format", hint=f"use one of: {known}"
            ) from None
        self._tools = _compile_tools(tools)
        self._make_id = make_id or _default_id
        self._events: list[Event] = []
        self._text: list[str] = []
        self._calls: list[ToolCallReady] = []
        self._errors: list[ToolCallError] = []
        self._next_index = 0
        self._finished = False
        self._stream = _STREAMS[self.format](self, choice)

    # -- public

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def feed(self, delta: Any) -> list[Event]:
        """Consume one delta (text for raw formats, a chunk for openai); return the events it released."""
        if self._finished:
            raise ToolCallError("feed() after finish()", path="stream", hint="create a new ToolCallAssembler")
        self._stream.feed(delta)
        out, self._events = self._events, []
        return out

    def finish(self, finish_reason: str | None = None) -> Result:
        """End the stream. `finish_reason` is the stream's own (for openai it defaults to the last chunk's)."""
        if self._finished:
            raise ToolCallError("finish() called twice", path="stream", hint="create a new ToolCallAssembler")
        self._finished = True
        reason = self._stream.finish(finish_reason)
        events, self._events = tuple(self._events), []
        calls = tuple(sorted(self._calls, key=lambda c: c.index))
        errors = tuple(sorted(self._errors, key=lambda e: _sort_index(e)))
        if reason in _NORMAL_STOPS:
            mapped: str | None = "tool_calls" if calls and not errors else "stop"
        else:
            mapped = reason
        return Result(
            calls=calls,
            errors=errors,
            text="".join(self._text),
            finish_reason=mapped,
            stream_finish_reason=reason,
            events=events,
        )

    # -- used by the format streams

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
        if reason == "length":
            err = _error(
                ToolCallTruncatedError,
                f"{TRUNCATED_MESSAGE} (pending: {listed})",
                path=f"tool_calls[{indexes[0]}]",
                hint="raise max_tokens (or shorten the context) and ask again; nothing was executed",
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
        ready = ToolCallReady(index=index, id=cid, name=name, arguments=arguments, raw_arguments=raw)
        self._calls.append(ready)
        self._events.append(ready)


def _default_id(index: int) -> str:
    return f"call{index:05d}"


def _sort_index(error: ToolCallError) -> int:
    index = getattr(error, "index", None)
    return index if isinstance(index, int) else 1 << 30


def _loads_object(text: str) -> tuple[Any, str | None]:
    """json.loads, with the error as a message naming the character offset instead of an exception."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"{exc.msg} at char {exc.pos}"


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
        value, problem = _loads_object(raw)
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

    def finish(self, finish_reason: str | None) -> str | None:
        reason = finish_reason if finish_reason is not None else self.seen_finish
        call = self.open
        if call is None:
            return reason
        if reason in _NORMAL_STOPS:
            raw = "".join(call.parts)
            if _looks_cut_off(raw):
                # Arguments cut off mid-JSON under a "tool_calls"/"stop" finish: a server that rewrote "length"
                # (vLLM did in its streaming path) would look exactly like this. Never released.
                self.open = None
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
        obj, problem = _loads_object(body)
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
        args, problem = _loads_object(args)
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
    else:
        raw = json.dumps(args, ensure_ascii=False)
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
        self.asm._complete(index, None, name, args, json.dumps(args, ensure_ascii=False), f"{path}.name")


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
        try:
            number = json.loads(text)
        except json.JSONDecodeError:
            return _NOT_CONVERTED
        if isinstance(number, bool) or not isinstance(number, int | float):
            return _NOT_CONVERTED
        if kind == "integer" and isinstance(number, float) and not number.is_integer():
            return _NOT_CONVERTED
        return number
    if kind in ("object", "array"):
        want = dict if kind == "object" else list
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
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
        value, problem = _loads_object(raw)
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
        value, problem = _loads_object(raw)
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

    def finish(self, finish_reason: str | None) -> str | None:
        if self.state == _M_TEXT:
            self.asm._emit_text(self.pending)
        elif self.state != _M_SKIP:
            pending = [self.index]
            if self.state == _M_ARRAY:  # each object opened at depth 1 is one call of the array
                opened = _array_items_opened("".join(self.raw_parts))
                pending = list(range(self.index, self.index + max(1, opened)))
            self.asm._unfinished(pending, finish_reason, "before its JSON closed")
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


_STREAMS: dict[ToolCallFormat, Callable[[ToolCallAssembler, int], Any]] = {
    ToolCallFormat.OPENAI: _OpenAIStream,
    ToolCallFormat.HERMES: _HermesStream,
    ToolCallFormat.QWEN3_CODER: _Qwen3CoderStream,
    ToolCallFormat.MISTRAL: _MistralStream,
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
