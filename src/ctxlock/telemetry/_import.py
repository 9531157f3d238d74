"""Trace files -> sessions: OTLP JSON (what `ctxlock export --otel --out` writes, an OpenTelemetry Collector's file
exporter, any GenAI instrumentation) and Langfuse's observation exports. Hostile input: the strict JSON reader,
a cap on spans, every value's type checked, each error naming the file and the JSON path (docs/telemetry.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ctxlock.errors import CtxlockError, TelemetryError
from ctxlock.outside import SYNTAX_ERROR, loads_outside
from ctxlock.telemetry import _conventions as c

MAX_SPANS = 100_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Turn:
    """One request of a session, read from one span or observation.

    `source` says where the request came from: "ctxlock.request" (the exact request, whole), "gen_ai.input.messages"
    (rebuilt as an OpenAI chat request from the conventions' messages) or "langfuse" (the observation's `input`).
    `whole` is False when a part could not be carried over (`notes` says which)."""

    request: dict[str, Any]
    timestamp: str | None
    trace_id: str
    source: str
    where: str
    whole: bool = True
    usage: dict[str, Any] | None = None
    record: str | None = None
    notes: tuple[str, ...] = ()

    def session_line(self) -> dict[str, Any]:
        """The line of a `cache-report` session: {"request", "timestamp"[, "usage"]}."""
        out: dict[str, Any] = {"request": self.request, "timestamp": self.timestamp}
        if self.usage is not None:
            out["usage"] = self.usage
        return out


@dataclass(frozen=True)
class Imported:
    """What a trace file held: its format, the turns of the chosen trace in time order, the traces it holds, and
    the spans or observations that were not turns (with why)."""

    format: str
    turns: list[Turn]
    traces: list[str]
    skipped: list[str] = field(default_factory=list)


def read_traces(raw: bytes, name: str, *, trace: str | None = None) -> Imported:
    """The session in `raw` (the bytes of file `name`). A file holding several traces needs `trace` (a trace id)."""
    docs = _documents(raw, name)
    if docs and isinstance(docs[0][0], dict) and "resourceSpans" in docs[0][0]:
        fmt, turns, skipped = "otlp", *_otlp(docs)
    else:
        fmt, turns, skipped = "langfuse", *_langfuse(docs, name)
    traces = sorted({t.trace_id for t in turns})
    if trace is not None:
        turns = [t for t in turns if t.trace_id == trace]
        if not turns:
            raise TelemetryError(f"no turn of trace {trace!r}", path=name, hint="traces here: " + ", ".join(traces))
    elif len(traces) > 1:
        raise TelemetryError(
            f"holds {len(traces)} traces", path=name, hint="pass --trace ID, one of " + ", ".join(traces[:10])
        )
    if not turns:
        raise TelemetryError(
            "holds no chat span with messages",
            path=name,
            hint="export with --content (spans without message content cannot become requests)",
        )
    turns.sort(key=lambda t: t.timestamp or "")
    return Imported(fmt, turns, traces, skipped)


def _documents(raw: bytes, name: str) -> list[tuple[Any, str]]:
    """The file as one JSON document, or as JSON lines (a collector's file exporter, Langfuse's JSONL)."""
    try:
        return [(loads_outside(raw, f"{name} $", error=TelemetryError), f"{name} $")]
    except TelemetryError as exc:
        if not exc.message.startswith(SYNTAX_ERROR) or b"\n" not in raw.strip():
            raise
        whole = exc
    out = []
    for n, line in enumerate(raw.split(b"\n"), 1):
        if line.strip():
            try:
                out.append((loads_outside(line, f"{name}:{n} $", error=TelemetryError), f"{name}:{n} $"))
            except TelemetryError:
                if not out:
                    raise whole from None  # not JSON lines either: the whole document's error
                raise
    return out


def _list(value: Any, path: str, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TelemetryError(f"{what} must be an array", path=path)
    return value


def _obj(value: Any, path: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TelemetryError(f"{what} must be an object", path=path)
    return value


# -- OTLP JSON


def _otlp(docs: list[tuple[Any, str]]) -> tuple[list[Turn], list[str]]:
    turns: list[Turn] = []
    skipped: list[str] = []
    count = 0
    for doc, base in docs:
        doc = _obj(doc, base, "an OTLP JSON document")
        for i, rs in enumerate(_list(doc.get("resourceSpans"), f"{base}.resourceSpans", "resourceSpans")):
            rpath = f"{base}.resourceSpans[{i}]"
            for j, ss in enumerate(
                _list(_obj(rs, rpath, "a resourceSpans entry").get("scopeSpans"), rpath, "scopeSpans")
            ):
                spath = f"{rpath}.scopeSpans[{j}]"
                spans = _obj(ss, spath, "a scopeSpans entry").get("spans")
                for k, span in enumerate(_list(spans, f"{spath}.spans", "spans")):
                    count += 1
                    if count > MAX_SPANS:
                        raise TelemetryError(f"more than {MAX_SPANS:,} spans", path=base, hint="split the file")
                    turn = _span(_obj(span, f"{spath}.spans[{k}]", "a span"), f"{spath}.spans[{k}]")
                    if isinstance(turn, str):
                        skipped.append(turn)
                    else:
                        turns.append(turn)
    return turns, skipped


def _span(span: dict[str, Any], path: str) -> Turn | str:
    attrs = _attributes(span.get("attributes"), f"{path}.attributes")
    trace_id = span.get("traceId")
    if not isinstance(trace_id, str):
        raise TelemetryError("traceId must be a hex string", path=f"{path}.traceId")
    if attrs.get(c.OPERATION_NAME) != c.CHAT:
        return f"{path}: not a chat span ({c.OPERATION_NAME} {attrs.get(c.OPERATION_NAME)!r})"
    stamp = _nanos(span.get("startTimeUnixNano"), f"{path}.startTimeUnixNano")
    usage = _usage(attrs, path)
    record = _string(attrs, c.RECORD, path)
    exact = _string(attrs, c.REQUEST, path)
    if exact is not None:
        request = _obj(_nested(exact, f"{path}.attributes[{c.REQUEST}]"), f"{path}.attributes[{c.REQUEST}]", c.REQUEST)
        return Turn(request, stamp, trace_id, c.REQUEST, path, True, usage, record)
    if c.INPUT_MESSAGES not in attrs:
        return f"{path}: no {c.INPUT_MESSAGES} (exported without content)"
    request, notes = _rebuild(attrs, path)
    return Turn(request, stamp, trace_id, c.INPUT_MESSAGES, path, not notes, usage, record, tuple(notes))


def _attributes(value: Any, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n, kv in enumerate(_list(value, path, "attributes")):
        kv = _obj(kv, f"{path}[{n}]", "an attribute")
        key = kv.get("key")
        if not isinstance(key, str):
            raise TelemetryError("an attribute's key must be a string", path=f"{path}[{n}].key")
        out[key] = _value(kv.get("value"), f"{path}[{n}].value")
    return out


def _value(value: Any, path: str) -> Any:
    value = _obj(value, path, "an attribute value")
    if "stringValue" in value:
        if not isinstance(value["stringValue"], str):
            raise TelemetryError("stringValue must be a string", path=f"{path}.stringValue")
        return value["stringValue"]
    if "intValue" in value:
        return _int(value["intValue"], f"{path}.intValue")
    if "boolValue" in value:
        return value["boolValue"]
    if "doubleValue" in value:
        return value["doubleValue"]
    if "arrayValue" in value:
        inner = _obj(value["arrayValue"], f"{path}.arrayValue", "arrayValue")
        items = _list(inner.get("values"), f"{path}.arrayValue.values", "values")
        return [_value(v, f"{path}.arrayValue.values[{i}]") for i, v in enumerate(items)]
    return None  # kvlistValue, bytesValue, an empty value: nothing ctxlock reads


def _int(value: Any, path: str) -> int:
    # OTLP JSON writes 64-bit integers as decimal strings; a number is accepted too.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.lstrip("-").isdigit() and len(value) <= 20:
        return int(value)
    raise TelemetryError(f"not an integer: {str(value)[:40]!r}", path=path)


def _nanos(value: Any, path: str) -> str | None:
    """A span's time, as the ISO 8601 text a session line carries (microseconds, as the records keep it)."""
    if value is None:
        return None
    ns = _int(value, path)
    if not 0 <= ns < 2**63:
        raise TelemetryError("a time out of range", path=path)
    return (_EPOCH + timedelta(microseconds=ns // 1000)).isoformat()


def _string(attrs: dict[str, Any], key: str, path: str) -> str | None:
    value = attrs.get(key)
    if value is not None and not isinstance(value, str):
        raise TelemetryError(f"{key} must be a string", path=f"{path}.attributes[{key}]")
    return value


def _nested(text: str, path: str) -> Any:
    """A JSON value inside a string attribute, through the strict reader."""
    return loads_outside(text, f"{path} $", error=TelemetryError)


def _usage(attrs: dict[str, Any], path: str) -> dict[str, Any] | None:
    """A provider's usage, in Anthropic's shape, from the gen_ai.usage attributes; none when the figures are
    ctxlock's own (`ctxlock.usage.source`), which are not a provider's report. The conventions count cached tokens
    inside gen_ai.usage.input_tokens; an instrumentation whose input_tokens is below its cache figures counted
    them apart, and its input_tokens is taken as the uncached part."""
    if attrs.get(c.USAGE_SOURCE) == "ctxlock" or c.INPUT_TOKENS not in attrs:
        return None
    figures = {}
    for key in (c.INPUT_TOKENS, c.OUTPUT_TOKENS, c.CACHE_READ, c.CACHE_CREATION):
        value = attrs.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TelemetryError(f"{key} must be a count", path=f"{path}.attributes[{key}]")
        figures[key] = value
    read, write = figures[c.CACHE_READ], figures[c.CACHE_CREATION]
    total = figures[c.INPUT_TOKENS]
    return {
        "input_tokens": total - read - write if total >= read + write else total,
        "output_tokens": figures[c.OUTPUT_TOKENS],
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": write,
    }


def _rebuild(attrs: dict[str, Any], path: str) -> tuple[dict[str, Any], list[str]]:
    """An OpenAI chat request from the conventions' message attributes: text parts joined, tool calls and their
    responses as OpenAI writes them; any other part is left out and named in the notes."""
    notes: list[str] = []
    messages: list[dict[str, Any]] = []
    where = f"{path}.attributes[{c.SYSTEM_INSTRUCTIONS}]"
    if isinstance(attrs.get(c.SYSTEM_INSTRUCTIONS), str):
        parts = _list(_nested(attrs[c.SYSTEM_INSTRUCTIONS], where), where, c.SYSTEM_INSTRUCTIONS)
        messages.append({"role": "system", "content": _text(parts, where, notes)})
    where = f"{path}.attributes[{c.INPUT_MESSAGES}]"
    raw = attrs[c.INPUT_MESSAGES]
    if not isinstance(raw, str):
        raise TelemetryError(f"{c.INPUT_MESSAGES} must be a JSON string", path=where)
    for n, msg in enumerate(_list(_nested(raw, where), where, c.INPUT_MESSAGES)):
        messages += _openai_messages(_obj(msg, f"{where}[{n}]", "a message"), f"{where}[{n}]", notes)
    request: dict[str, Any] = {"messages": messages}
    if isinstance(attrs.get(c.TOOL_DEFINITIONS), str):
        where = f"{path}.attributes[{c.TOOL_DEFINITIONS}]"
        tools = _list(_nested(attrs[c.TOOL_DEFINITIONS], where), where, c.TOOL_DEFINITIONS)
        request["tools"] = [
            _openai_tool(_obj(t, f"{where}[{n}]", "a tool"), f"{where}[{n}]") for n, t in enumerate(tools)
        ]
    return request, notes


def _text(parts: list[Any], path: str, notes: list[str]) -> str:
    out = []
    for n, part in enumerate(parts):
        part = _obj(part, f"{path}[{n}]", "a part")
        if part.get("type") == "text" and isinstance(part.get("content"), str):
            out.append(part["content"])
        else:
            notes.append(f"{path}[{n}]: a {str(part.get('type'))[:40]!r} part left out")
    return "".join(out)


def _openai_messages(msg: dict[str, Any], path: str, notes: list[str]) -> list[dict[str, Any]]:
    role = msg.get("role")
    if not isinstance(role, str):
        raise TelemetryError("a message's role must be a string", path=f"{path}.role")
    parts = _list(msg.get("parts"), f"{path}.parts", "parts")
    texts, calls, out = [], [], []
    for n, part in enumerate(parts):
        part = _obj(part, f"{path}.parts[{n}]", "a part")
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("content"), str):
            texts.append(part)
        elif kind == "tool_call":
            args = part.get("arguments")
            arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            calls.append(
                {
                    "id": part.get("id"),
                    "type": "function",
                    "function": {"name": part.get("name"), "arguments": arguments},
                }
            )
        elif kind == "tool_call_response":
            response = part.get("response")
            content = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
            out.append({"role": "tool", "tool_call_id": part.get("id"), "content": content})
        else:
            notes.append(f"{path}.parts[{n}]: a {str(kind)[:40]!r} part left out")
    if texts or calls or not out:
        message: dict[str, Any] = {"role": role, "content": _text(texts, f"{path}.parts", notes)}
        if calls:
            message["tool_calls"] = calls
        if isinstance(msg.get("name"), str):
            message["name"] = msg["name"]
        out.insert(0, message)
    return out


def _openai_tool(tool: dict[str, Any], path: str) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str):
        raise TelemetryError("a tool's name must be a string", path=f"{path}.name")
    fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": fn}


# -- Langfuse


def _langfuse(docs: list[tuple[Any, str]], name: str) -> tuple[list[Turn], list[str]]:
    """Observations: the public API's list (`{"data": [...]}` or a bare array, camelCase) or the blob-storage export
    (JSON lines, snake_case). Read: `type` GENERATION, `input` (messages, or an object holding `messages` and
    `tools`; a string holding that JSON), the trace id and start time. Usage and output are not read."""
    rows: list[tuple[Any, str]] = []
    for doc, base in docs:
        if isinstance(doc, dict) and "data" in doc:
            rows += [(o, f"{base}.data[{i}]") for i, o in enumerate(_list(doc["data"], f"{base}.data", "data"))]
        elif isinstance(doc, list):
            rows += [(o, f"{base}[{i}]") for i, o in enumerate(doc)]
        elif isinstance(doc, dict):
            rows.append((doc, base))
        else:
            raise TelemetryError(
                "neither OTLP JSON (resourceSpans) nor Langfuse observations",
                path=base,
                hint="export traces as OTLP JSON, or Langfuse observations as JSON or JSON lines",
            )
    if len(rows) > MAX_SPANS:
        raise TelemetryError(f"more than {MAX_SPANS:,} observations", path=name, hint="split the file")
    turns, skipped = [], []
    for obs, path in rows:
        obs = _obj(obs, path, "an observation")
        if obs.get("type") != "GENERATION":
            skipped.append(f"{path}: not a GENERATION observation")
            continue
        turn = _observation(obs, path)
        if isinstance(turn, str):
            skipped.append(turn)
        else:
            turns.append(turn)
    return turns, skipped


def _observation(obs: dict[str, Any], path: str) -> Turn | str:
    trace_id = obs.get("traceId", obs.get("trace_id"))
    if not isinstance(trace_id, str):
        raise TelemetryError("an observation's trace id must be a string", path=f"{path}.traceId")
    value = obs.get("input")
    where = f"{path}.input"
    if isinstance(value, str):
        try:
            value = _nested(value, where)
        except CtxlockError:
            return f"{where}: plain text, not messages"
    if isinstance(value, dict) and "messages" in value:
        request = {k: value[k] for k in ("messages", "tools", "system") if k in value}
    elif isinstance(value, list):
        request = {"messages": value}
    else:
        return f"{where}: holds no messages"
    for n, msg in enumerate(_list(request["messages"], f"{where}.messages", "messages")):
        if not isinstance(_obj(msg, f"{where}.messages[{n}]", "a message").get("role"), str):
            raise TelemetryError("a message's role must be a string", path=f"{where}.messages[{n}].role")
    return Turn(request, _langfuse_time(obs, path), trace_id, "langfuse", path)


def _langfuse_time(obs: dict[str, Any], path: str) -> str | None:
    key = "startTime" if "startTime" in obs else "start_time"
    stamp = obs.get(key)
    if stamp is None:
        return None
    try:
        if not isinstance(stamp, str):
            raise ValueError
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        raise TelemetryError(f"not a time: {str(stamp)[:40]!r}", path=f"{path}.{key}") from None
    # The blob-storage export writes UTC without a zone (`2024-05-29 13:46:19.963000`).
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()
