"""`ToolCallAssembler`: the release rules on top of the wire-format parsers.

The assembler builds one parser for its format (`PARSERS`), feeds it, and is the `ToolCallSink` the parser reports
to (see `sink.py`): it validates each complete call against its tool's schema, refuses the invalid ones, holds the
valid ones until the stream ends normally (or releases them at once with `release="early"`), and maps the stream's
end to `Result.finish_reason`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ctxlock.errors import ProviderStreamError, ToolCallError, ToolCallTruncatedError, ToolCallValidationError
from ctxlock.generation.toolcalls._anthropic import AnthropicParser
from ctxlock.generation.toolcalls._apertus import ApertusParser
from ctxlock.generation.toolcalls._deepseek_v3 import DeepSeekV3Parser
from ctxlock.generation.toolcalls._deepseek_v4 import DeepSeekV4Parser
from ctxlock.generation.toolcalls._deepseek_v31 import DeepSeekV31Parser
from ctxlock.generation.toolcalls._deepseek_v32 import DeepSeekV32Parser
from ctxlock.generation.toolcalls._events import (
    DEFAULT_MAX_EVENT_SIZE,
    LENGTH_STOPS,
    NORMAL_STOPS,
    TRUNCATED_MESSAGE,
    Event,
    Release,
    Result,
    TextDelta,
    ToolCallFormat,
    ToolCallReady,
    ToolCallRejected,
    error_payload,
)
from ctxlock.generation.toolcalls._functionary_v3_1 import FunctionaryV31Parser
from ctxlock.generation.toolcalls._functionary_v3_2 import FunctionaryV32Parser
from ctxlock.generation.toolcalls._gemma4 import Gemma4Parser
from ctxlock.generation.toolcalls._gigachat3 import GigaChat3Parser
from ctxlock.generation.toolcalls._glm45 import Glm45Parser
from ctxlock.generation.toolcalls._granite import GraniteParser
from ctxlock.generation.toolcalls._harmony import HarmonyParser
from ctxlock.generation.toolcalls._hermes import HermesParser
from ctxlock.generation.toolcalls._hy_v3 import HyV3Parser
from ctxlock.generation.toolcalls._kimi_k2 import KimiK2Parser
from ctxlock.generation.toolcalls._kimi_k3 import KimiK3Parser
from ctxlock.generation.toolcalls._lfm2 import Lfm2Parser
from ctxlock.generation.toolcalls._llama3_json import Llama3JsonParser
from ctxlock.generation.toolcalls._minicpm5 import MiniCPM5Parser
from ctxlock.generation.toolcalls._minimax import MinimaxParser
from ctxlock.generation.toolcalls._minimax_m2 import MinimaxM2Parser
from ctxlock.generation.toolcalls._minimax_m3 import MinimaxM3Parser
from ctxlock.generation.toolcalls._mistral import MistralParser
from ctxlock.generation.toolcalls._nemotron_json import NemotronJsonParser
from ctxlock.generation.toolcalls._openai import OpenAIParser
from ctxlock.generation.toolcalls._pythonic import PythonicParser
from ctxlock.generation.toolcalls._qwen3_coder import Qwen3CoderParser
from ctxlock.generation.toolcalls._schemas import Tool, arguments_path, compile_tools, document_position, violation_keys
from ctxlock.generation.toolcalls._seed_oss import SeedOssParser
from ctxlock.generation.toolcalls._sink import FormatParser, ToolCallSink
from ctxlock.request import Request, json_type_name

# One parser per wire format: a new format is one module plus one line here (and its `ToolCallFormat` value).
PARSERS: dict[ToolCallFormat, Callable[[ToolCallSink, int], FormatParser]] = {
    ToolCallFormat.OPENAI: OpenAIParser,
    ToolCallFormat.HERMES: HermesParser,
    ToolCallFormat.QWEN3_CODER: Qwen3CoderParser,
    ToolCallFormat.MISTRAL: MistralParser,
    ToolCallFormat.ANTHROPIC: AnthropicParser,
    ToolCallFormat.HARMONY: HarmonyParser,
    ToolCallFormat.DEEPSEEK_V3: DeepSeekV3Parser,
    ToolCallFormat.DEEPSEEK_V31: DeepSeekV31Parser,
    ToolCallFormat.DEEPSEEK_V32: DeepSeekV32Parser,
    ToolCallFormat.KIMI_K2: KimiK2Parser,
    ToolCallFormat.LLAMA3_JSON: Llama3JsonParser,
    ToolCallFormat.PYTHONIC: PythonicParser,
    ToolCallFormat.GRANITE: GraniteParser,
    ToolCallFormat.MINIMAX_M2: MinimaxM2Parser,
    ToolCallFormat.GEMMA4: Gemma4Parser,
    ToolCallFormat.APERTUS: ApertusParser,
    ToolCallFormat.LFM2: Lfm2Parser,
    ToolCallFormat.GIGACHAT3: GigaChat3Parser,
    ToolCallFormat.NEMOTRON_JSON: NemotronJsonParser,
    ToolCallFormat.HY_V3: HyV3Parser,
    ToolCallFormat.MINIMAX_M3: MinimaxM3Parser,
    ToolCallFormat.KIMI_K3: KimiK3Parser,
    ToolCallFormat.QWEN3_XML: Qwen3CoderParser,
    ToolCallFormat.GLM45: Glm45Parser,
    ToolCallFormat.SEED_OSS: SeedOssParser,
    ToolCallFormat.MINICPM5: MiniCPM5Parser,
    ToolCallFormat.FUNCTIONARY_V3_1: FunctionaryV31Parser,
    ToolCallFormat.FUNCTIONARY_V3_2: FunctionaryV32Parser,
    ToolCallFormat.DEEPSEEK_V4: DeepSeekV4Parser,
    ToolCallFormat.MINIMAX: MinimaxParser,
}

# Every format but the two providers' streams reads the model's own text.
_RAW_FORMATS = frozenset(f.value for f in PARSERS if f not in (ToolCallFormat.OPENAI, ToolCallFormat.ANTHROPIC))
_ABNORMAL_HINTS = {
    "pause_turn": "send the response back as the assistant turn so the model can continue it",
    "refusal": "the model declined: rephrase the request rather than re-running the calls",
    "content_filter": "the provider's filter stopped the response: change the request",
}


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

    The assembler is also the `ToolCallSink` its format's parser reports to (`emit_text`, `complete`, `fail`, ...:
    see sink.py); those methods are the parsers' side of the protocol, not something a caller needs.
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
        self._tools = compile_tools(tools)
        self._id_for = make_id or _default_id
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
        self._stream: FormatParser = PARSERS[self.format](self, choice)

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
            payload = error_payload(delta)
            if payload is not None:
                self.provider_error(payload, "stream")
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
        if reason in NORMAL_STOPS and self._cut_off is None:
            for ready in held:
                self._calls.append(ready)
                self._events.append(ready)
        else:
            self._errors += [self._withheld(ready, reason) for ready in held]
            if self._calls:  # release="early": calls of this response were out before it ended badly
                listed = ", ".join(f"tool_calls[{c.index}]" for c in sorted(self._calls, key=lambda c: c.index))
                ended = self._cut_off or f"finish_reason={reason!r}"
                self.note(f"{listed} released early (release='early'), then the response ended abnormally ({ended})")
        events, self._events = tuple(self._events), []
        return self._result(reason, events)

    # -- internals

    def _result(self, reason: str | None, events: tuple[Event, ...]) -> Result:
        calls = tuple(sorted(self._calls, key=lambda c: c.index))
        errors = tuple(sorted(self._errors, key=lambda e: _sort_index(e)))
        if reason in NORMAL_STOPS:
            mapped: str | None = "tool_calls" if calls and not errors else "stop"
        elif reason in LENGTH_STOPS:
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
        """A complete, valid call of a stream that did not end normally: never released (the truncation rule:
        ctxlock.generation.toolcalls)."""
        what = f"tool call {ready.name!r} (tool_calls[{ready.index}]) was not executed"
        if self._cut_off is not None or reason in LENGTH_STOPS:
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
        ended = self._stream.ended or f"the stream ended with finish_reason={reason!r}"
        normal = ", ".join(sorted(NORMAL_STOPS))
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

    # -- the ToolCallSink side: what the format parsers report and ask (sink.py)

    def provider_error(self, payload: Any, path: str) -> None:
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

    def note(self, text: str) -> None:
        self._notes.append(text)

    def emit_text(self, text: str) -> None:
        if text:
            self._text.append(text)
            self._events.append(TextDelta(text))

    def emit_thinking(self, text: str) -> None:
        self._thinking.append(text)

    def new_index(self) -> int:
        index = self._next_index
        self._next_index += 1
        return index

    def make_id(self, index: int) -> str:
        return self._id_for(index)

    def tool_schema(self, name: str) -> Any:
        tool = self._tools.get(name)
        return tool.schema if tool is not None else None

    def mark_cut_off(self, why: str) -> None:
        self._cut_off = why

    def _reject(self, index: int, call_id: str | None, name: str | None, error: ToolCallError) -> None:
        self._errors.append(error)
        self._events.append(ToolCallRejected(index=index, id=call_id, name=name, error=error))

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
        err = _error(cls, message, path=path, hint=hint, index=index, call_id=call_id, name=name)
        self._reject(index, call_id, name, err)

    def unfinished(
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
        if reason in LENGTH_STOPS:
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

    def complete(self, index: int, call_id: str | None, name: Any, arguments: Any, raw: str, src: str) -> None:
        """A call whose closing marker has been seen: release it if it names a known tool and validates."""
        cid = call_id if call_id is not None else self.make_id(index)
        tool = self._known_tool(index, cid, name, src)
        if tool is None:
            return
        name = tool.name
        if not isinstance(arguments, dict):
            self.fail(
                index,
                cid,
                name,
                f"arguments must be a JSON object, got {json_type_name(arguments)}",
                path=f"tool_calls[{index}].arguments",
                hint='send the arguments as an object, e.g. {"city": "Paris"} or {}',
            )
            return
        if not self._validates(index, cid, tool, arguments) or self._duplicate_id(index, cid, name):
            return
        ready = ToolCallReady(index=index, id=cid, name=name, arguments=arguments, raw_arguments=raw)
        if self.release is Release.EARLY:
            self._calls.append(ready)
            self._events.append(ready)
        else:
            self._held.append(ready)

    def _known_tool(self, index: int, cid: str, name: Any, src: str) -> Tool | None:
        """The declared tool a call names, or None once the call is refused (no name, an unknown tool)."""
        if not isinstance(name, str) or not name.strip():
            self.fail(index, cid, None, "the tool call has no function name", path=src, hint="name a declared tool")
            return None
        name = name.strip()
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools) or "(none)"
            self.fail(
                index,
                cid,
                name,
                f"unknown tool {name!r}",
                path=f"tool_calls[{index}].name",
                hint=f"call one of the declared tools: {known}",
            )
        return tool

    def _validates(self, index: int, cid: str, tool: Tool, arguments: dict[str, Any]) -> bool:
        """Whether the arguments validate against the tool's schema; if not, the call is refused with every
        violation, in the order the model wrote the arguments (the first violation is the first it will read)."""
        name = tool.name
        try:
            errors = list(tool.validator.iter_errors(arguments))
        except Exception as exc:  # an unresolvable $ref and the like: the schema, not the call, is at fault
            self.fail(
                index,
                cid,
                name,
                f"the schema of {name!r} cannot be applied: {exc}",
                path=tool.path,
                hint="make the schema self-contained (local $ref only)",
            )
            return False
        if not errors:
            return True
        located = sorted(
            (
                (document_position(arguments, keys), n, keys, e)
                for n, e in enumerate(errors)
                for keys in [violation_keys(e)]
            ),
            key=lambda item: (item[0], item[1]),
        )
        violations = [{"path": arguments_path(index, keys), "message": e.message} for _, _, keys, e in located]
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
        return False

    def _duplicate_id(self, index: int, cid: str, name: str) -> bool:
        """Two calls with one id: a tool result answers an id, so which call it answers is ambiguous. Refuse this
        one; a held earlier one is withdrawn too (an early-released one is already out)."""
        earlier = next((c for c in (*self._calls, *self._held) if c.id == cid), None)
        if earlier is None:
            return False
        hint = "every tool call of a response needs its own id; ask the model again"
        if earlier in self._held:
            self._held.remove(earlier)
            self.fail(
                earlier.index,
                cid,
                earlier.name,
                f"tool_calls[{index}] has the same id {cid!r}; neither is released",
                path=f"tool_calls[{earlier.index}].id",
                hint=hint,
            )
        self.fail(
            index,
            cid,
            name,
            f"the id {cid!r} was already used by tool_calls[{earlier.index}]",
            path=f"tool_calls[{index}].id",
            hint=hint,
        )
        return True


def _default_id(index: int) -> str:
    return f"call{index:05d}"


def _sort_index(error: ToolCallError) -> int:
    index = getattr(error, "index", None)
    return index if isinstance(index, int) else 1 << 30


def _choice(kind: Any, value: Any, noun: str, path: str) -> Any:
    """`kind(value)` for an enum `kind`, or a ToolCallError naming the values it takes."""
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(k.value for k in kind)
        raise ToolCallError(f"unknown {noun} {value!r}", path=path, hint=f"use one of: {known}") from None


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
