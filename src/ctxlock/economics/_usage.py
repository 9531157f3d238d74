"""Provider usage objects, normalized: one `Usage` value whatever the provider, with the fields of Pi
(github.com/badlogic/pi-mono)'s `Usage` (packages/ai/src/types.ts).

| field | meaning |
|---|---|
| `input` | input tokens read at the full price: not from the cache, not written to it |
| `output` | output tokens, reasoning included (reasoning is a subset of output, never added to it) |
| `cache_read` | input tokens read back from the provider's prompt cache |
| `cache_write` | input tokens written to the cache by this request (`cache_write_1h` is the part kept for an hour) |
| `reasoning` | the part of `output` the provider reports as reasoning/thinking; None where it reports none |
| `total_tokens` | input + output + cache_read + cache_write |

How each provider's fields map (each provider's own documentation is the reference):

- **OpenAI Chat Completions** `usage`: `prompt_tokens` includes `prompt_tokens_details.cached_tokens`, so
  input = prompt − cached, cache_read = cached; output = `completion_tokens`, which includes
  `completion_tokens_details.reasoning_tokens`. OpenAI's automatic caching reports no writes: cache_write = 0.
  Counting cached tokens on top of `prompt_tokens` is the double count of litellm#9812.
- **OpenAI Responses** `usage`: the same with `input_tokens`, `input_tokens_details.cached_tokens`,
  `output_tokens`, `output_tokens_details.reasoning_tokens`.
- **Anthropic Messages** `usage`: `input_tokens` is already only the uncached part; total input = input +
  `cache_read_input_tokens` + `cache_creation_input_tokens`; `cache_creation.ephemeral_5m_input_tokens` and
  `ephemeral_1h_input_tokens` split the write by TTL. Streaming: `message_start` carries `message.usage`, and each
  `message_delta` carries *cumulative* counts (its `output_tokens` replaces the earlier one, never adds to it).
  Anthropic reports no separate thinking count: reasoning = None.
- **Gemini** `usageMetadata`: `promptTokenCount` includes `cachedContentTokenCount`; `thoughtsTokenCount` is *not*
  in `candidatesTokenCount` (llm-gemini#75 left it out), so output = candidates + thoughts, reasoning = thoughts;
  `toolUsePromptTokenCount` is input.
- **Pi** `Usage` (`input`, `output`, `cacheRead`, `cacheWrite`, `cacheWrite1h`, `reasoning`, `totalTokens`,
  `cost{…, totalFromProvider}`): already these fields.

Each format's invariants are checked, and a violation is a `UsageError` naming the field: reasoning ⊂ output;
cache_write_1h ⊂ cache_write; cached ⊂ prompt (OpenAI, Gemini); the TTL split sums to the write (Anthropic); a
reported total equals the sum of its parts. Costs come from a price table (`PriceTable`): user data, never
constants, in Decimal arithmetic, and each cost names its price entry and the table's sha256.
"""

# size: one format's code together: the five providers' readers, the usage-file reader, and the price table with
# its per-token prices (`unit_prices`, which `price_usage` and the bill share so the two cannot disagree).

from __future__ import annotations

import difflib
import hashlib
import itertools
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from ctxlock.errors import PriceError, UsageError
from ctxlock.outside import loads_outside

Format = Literal["auto", "openai-chat", "openai-responses", "anthropic", "gemini", "pi"]
FORMATS: tuple[str, ...] = ("auto", "openai-chat", "openai-responses", "anthropic", "gemini", "pi")


@dataclass(frozen=True, slots=True)
class Cost:
    """A cost in the price table's currency. A part is None when it is unknown (a provider that reports only a
    total). `total_from_provider` says whether `total` is the provider's own figure or ctxlock's estimate."""

    total: Decimal
    total_from_provider: bool
    input: Decimal | None = None
    output: Decimal | None = None
    cache_read: Decimal | None = None
    cache_write: Decimal | None = None
    price_entry: str | None = None  # the price table's key the estimate used
    table_sha256: str | None = None  # the sha256 of the price table's bytes
    tier: str | None = None  # "above_200k_tokens" when a long-context price applied

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            part: None if (v := getattr(self, part)) is None else _plain(v)
            for part in ("input", "output", "cache_read", "cache_write", "total")
        }
        out["total_from_provider"] = self.total_from_provider
        if self.price_entry is not None:
            out["price_entry"] = self.price_entry
            out["table_sha256"] = self.table_sha256
        if self.tier is not None:
            out["tier"] = self.tier
        return out


def _plain(value: Decimal) -> str:
    """A Decimal in plain notation without trailing zeros: 0.0052679, never 5.2679E-3 or 0.00526790."""
    return format(value.normalize(), "f") if value else "0"


@dataclass(frozen=True, slots=True)
class Usage:
    """One normalized usage: see the module docstring for the fields. `source` is the format it was read from
    ("sum" for a sum of several), `calls` how many usage objects it covers, `model` the model the response named."""

    input: int
    output: int
    cache_read: int = 0
    cache_write: int = 0
    cache_write_1h: int = 0
    reasoning: int | None = None
    source: str = "pi"
    calls: int = 1
    model: str | None = None
    cost: Cost | None = None  # the provider's own figure when it gave one, else an estimate once priced
    where: str | None = field(default=None, compare=False)  # the input it came from (file:line), for messages

    @property
    def total_tokens(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write

    @property
    def prompt_tokens(self) -> int:
        """Every input-side token, cached or not: what a context window holds."""
        return self.input + self.cache_read + self.cache_write

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "input": self.input,
            "output": self.output,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
            "cache_write_1h": self.cache_write_1h,
            "reasoning": self.reasoning,
            "total_tokens": self.total_tokens,
            "source": self.source,
            "calls": self.calls,
            "model": self.model,
        }
        out["cost"] = None if self.cost is None else self.cost.to_dict()
        return out


# -- reading one usage object -----------------------------------------------------------------------------------


def _count(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> int:
    value = obj.get(key)
    if value is None:
        if required:
            raise UsageError(f"missing {key!r}", path=path, hint="pass the provider's usage object as it was sent")
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"{key} must be a non-negative integer, got {value!r}", path=f"{path}.{key}")
    return value


def _details(obj: Mapping[str, Any], key: str, path: str) -> tuple[Mapping[str, Any], str]:
    value = obj.get(key)
    if value is None:
        return {}, f"{path}.{key}"
    if not isinstance(value, Mapping):
        raise UsageError(f"{key} must be an object, got {type(value).__name__}", path=f"{path}.{key}")
    return value, f"{path}.{key}"


def _subset(part: int, part_name: str, whole: int, whole_name: str, path: str) -> None:
    if part > whole:
        raise UsageError(
            f"{part_name} ({part}) is more than {whole_name} ({whole}), which includes it",
            path=f"{path}.{part_name}",
            hint="the usage object is inconsistent; check that the fields were not summed from several responses",
        )


def _total(reported: Any, expected: int, name: str, parts: str, path: str) -> None:
    if reported is None:
        return
    if isinstance(reported, bool) or not isinstance(reported, int) or reported != expected:
        raise UsageError(
            f"{name} is {reported!r}, but {parts} is {expected}",
            path=f"{path}.{name}",
            hint="a total must be the sum of its parts; was a field added twice?",
        )


def _openai_chat(u: Mapping[str, Any], path: str) -> Usage:
    prompt = _count(u, "prompt_tokens", path, required=True)
    completion = _count(u, "completion_tokens", path)
    pd, pd_path = _details(u, "prompt_tokens_details", path)
    cd, cd_path = _details(u, "completion_tokens_details", path)
    cached = _count(pd, "cached_tokens", pd_path)
    reasoning = _count(cd, "reasoning_tokens", cd_path) if "reasoning_tokens" in cd else None
    _subset(cached, "cached_tokens", prompt, "prompt_tokens", pd_path)
    if reasoning is not None:
        _subset(reasoning, "reasoning_tokens", completion, "completion_tokens", cd_path)
    _total(u.get("total_tokens"), prompt + completion, "total_tokens", "prompt_tokens + completion_tokens", path)
    return Usage(input=prompt - cached, output=completion, cache_read=cached, reasoning=reasoning, source="openai-chat")


def _openai_responses(u: Mapping[str, Any], path: str) -> Usage:
    inp = _count(u, "input_tokens", path, required=True)
    out = _count(u, "output_tokens", path)
    idt, id_path = _details(u, "input_tokens_details", path)
    odt, od_path = _details(u, "output_tokens_details", path)
    cached = _count(idt, "cached_tokens", id_path)
    reasoning = _count(odt, "reasoning_tokens", od_path) if "reasoning_tokens" in odt else None
    _subset(cached, "cached_tokens", inp, "input_tokens", id_path)
    if reasoning is not None:
        _subset(reasoning, "reasoning_tokens", out, "output_tokens", od_path)
    _total(u.get("total_tokens"), inp + out, "total_tokens", "input_tokens + output_tokens", path)
    return Usage(input=inp - cached, output=out, cache_read=cached, reasoning=reasoning, source="openai-responses")


def _anthropic(u: Mapping[str, Any], path: str, *, source: str = "anthropic") -> Usage:
    inp = _count(u, "input_tokens", path)
    out = _count(u, "output_tokens", path)
    read = _count(u, "cache_read_input_tokens", path)
    write = _count(u, "cache_creation_input_tokens", path)
    split, split_path = _details(u, "cache_creation", path)
    five = _count(split, "ephemeral_5m_input_tokens", split_path)
    hour = _count(split, "ephemeral_1h_input_tokens", split_path)
    if split and five + hour != write:
        raise UsageError(
            f"the TTL split ({five} for 5 minutes + {hour} for 1 hour) is not cache_creation_input_tokens ({write})",
            path=split_path,
            hint="cache_creation splits the cache write by TTL and must sum to it",
        )
    return Usage(input=inp, output=out, cache_read=read, cache_write=write, cache_write_1h=hour, source=source)


def _gemini(u: Mapping[str, Any], path: str) -> Usage:
    prompt = _count(u, "promptTokenCount", path)
    candidates = _count(u, "candidatesTokenCount", path)
    thoughts = _count(u, "thoughtsTokenCount", path)
    cached = _count(u, "cachedContentTokenCount", path)
    tool_prompt = _count(u, "toolUsePromptTokenCount", path)
    _subset(cached, "cachedContentTokenCount", prompt, "promptTokenCount", path)
    _total(
        u.get("totalTokenCount"),
        prompt + candidates + thoughts + tool_prompt,
        "totalTokenCount",
        "promptTokenCount + candidatesTokenCount + thoughtsTokenCount + toolUsePromptTokenCount",
        path,
    )
    return Usage(
        input=prompt - cached + tool_prompt,
        output=candidates + thoughts,
        cache_read=cached,
        reasoning=thoughts if "thoughtsTokenCount" in u else None,
        source="gemini",
    )


def _pi(u: Mapping[str, Any], path: str) -> Usage:
    inp = _count(u, "input", path, required=True)
    out = _count(u, "output", path)
    read = _count(u, "cacheRead", path)
    write = _count(u, "cacheWrite", path)
    hour = _count(u, "cacheWrite1h", path)
    reasoning = _count(u, "reasoning", path) if "reasoning" in u else None
    if reasoning is not None:
        _subset(reasoning, "reasoning", out, "output", path)
    _subset(hour, "cacheWrite1h", write, "cacheWrite", path)
    _total(
        u.get("totalTokens"), inp + out + read + write, "totalTokens", "input + output + cacheRead + cacheWrite", path
    )
    cost = _pi_cost(u.get("cost"), f"{path}.cost")
    return Usage(
        input=inp, output=out, cache_read=read, cache_write=write, cache_write_1h=hour, reasoning=reasoning, cost=cost
    )


def _number(value: Any, path: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise UsageError(f"a cost must be a number, got {value!r}", path=path)
    try:
        out = Decimal(str(value))
    except InvalidOperation:
        raise UsageError(f"a cost must be a number, got {value!r}", path=path) from None
    if not out.is_finite() or out < 0:
        raise UsageError(f"a cost must be a finite non-negative number, got {value!r}", path=path)
    return out


def _pi_cost(cost: Any, path: str) -> Cost | None:
    """Pi's cost block is kept only when it says the provider reported it: otherwise it is Pi's own estimate from
    Pi's price catalogue, which ctxlock does not present as a bill."""
    if not isinstance(cost, Mapping) or cost.get("totalFromProvider") is not True:
        return None
    parts = {k: _number(cost[k], f"{path}.{k}") if k in cost else None for k in ("input", "output", "cacheRead")}
    return Cost(
        total=_number(cost.get("total"), f"{path}.total"),
        total_from_provider=True,
        input=parts["input"],
        output=parts["output"],
        cache_read=parts["cacheRead"],
        cache_write=_number(cost["cacheWrite"], f"{path}.cacheWrite") if "cacheWrite" in cost else None,
    )


_READERS = {
    "openai-chat": _openai_chat,
    "openai-responses": _openai_responses,
    "anthropic": _anthropic,
    "gemini": _gemini,
    "pi": _pi,
}


def detect_format(u: Mapping[str, Any]) -> str | None:
    """The format of a bare usage object by its keys, or None. `{"input_tokens", "output_tokens"}` alone is
    Anthropic's shape (the Responses API always sends `total_tokens` and the details)."""
    if "prompt_tokens" in u or "completion_tokens" in u:
        return "openai-chat"
    if "promptTokenCount" in u or "candidatesTokenCount" in u or "totalTokenCount" in u:
        return "gemini"
    if "cacheRead" in u or "totalTokens" in u or ("input" in u and "output" in u):
        return "pi"
    if "input_tokens" in u or "output_tokens" in u:
        if "cache_creation_input_tokens" in u or "cache_read_input_tokens" in u or "cache_creation" in u:
            return "anthropic"
        if "total_tokens" in u or "input_tokens_details" in u or "output_tokens_details" in u:
            return "openai-responses"
        return "anthropic"
    return None


def _unwrap(obj: Mapping[str, Any], path: str) -> tuple[Mapping[str, Any], str, str | None, Any]:
    """A response object's usage (`usage`, `usageMetadata`, a Pi or Anthropic event's), its path, the model the
    response names, and a provider-reported cost (OpenRouter's `usage.cost`)."""
    model = obj.get("model") or obj.get("modelVersion")
    if isinstance(obj.get("message"), Mapping) and "usage" in obj["message"]:  # an event carrying a message
        msg = obj["message"]
        return msg["usage"], f"{path}.message.usage", msg.get("model") or model, None
    for key in ("usage", "usageMetadata"):
        inner = obj.get(key)
        if isinstance(inner, Mapping):
            return inner, f"{path}.{key}", model if isinstance(model, str) else None, inner.get("cost")
    return obj, path, model if isinstance(model, str) else None, None


def parse_usage(obj: Any, *, format: Format = "auto", path: str = "$") -> Usage:
    """One provider usage object, or a response holding one (`usage`, `usageMetadata`), normalized. `format`
    names the provider's shape; "auto" detects it from the keys. Raises `UsageError` naming the field."""
    if not isinstance(obj, Mapping):
        raise UsageError(f"a usage object must be a JSON object, got {type(obj).__name__}", path=path)
    inner, inner_path, model, provider_cost = _unwrap(obj, path)
    fmt = format if format != "auto" else detect_format(inner)
    if fmt is None or fmt not in _READERS:
        raise UsageError(
            "not a usage object of a known provider format",
            path=inner_path,
            hint="pass --format openai-chat|openai-responses|anthropic|gemini|pi, or the provider's response as sent",
        )
    usage = _READERS[fmt](inner, inner_path)
    if provider_cost is not None and usage.cost is None and not isinstance(provider_cost, Mapping):
        usage = replace(usage, cost=Cost(total=_number(provider_cost, f"{inner_path}.cost"), total_from_provider=True))
    return replace(usage, model=model if isinstance(model, str) else None)


# -- streams and files ------------------------------------------------------------------------------------------


def _anthropic_stream(events: Iterable[tuple[Mapping[str, Any], str]]) -> Iterator[Usage]:
    """Anthropic's SSE events: a `message_start` opens a message; its `message_delta`s carry cumulative counts,
    which replace (never add to) the ones before."""
    current: dict[str, Any] | None = None
    model: str | None = None
    where = "$"
    for event, path in events:
        kind = event.get("type")
        if kind == "message_start":
            if current is not None:
                yield replace(_anthropic(current, where, source="anthropic-stream"), model=model)
            message = event.get("message") if isinstance(event.get("message"), Mapping) else {}
            current = dict(message.get("usage") or {})
            model = message.get("model") if isinstance(message.get("model"), str) else None
            where = f"{path}.message.usage"
        elif kind == "message_delta" and isinstance(event.get("usage"), Mapping):
            if current is None:
                raise UsageError("a message_delta before any message_start", path=path, hint="pass the whole stream")
            current.update({k: v for k, v in event["usage"].items() if v is not None})
            where = f"{path}.usage"
    if current is not None:
        yield replace(_anthropic(current, where, source="anthropic-stream"), model=model)


def _pi_events(events: Iterable[tuple[Mapping[str, Any], str]]) -> Iterator[Usage]:
    """Pi's JSON event stream: each assistant message's usage is cumulative across its `message_update`s, so the
    last snapshot before the next message counts, once; a `compaction_end` adds the summary call's usage."""
    last: tuple[Mapping[str, Any], str] | None = None
    for event, path in events:
        kind = event.get("type")
        if kind in ("message_start", "turn_end", "agent_end", "compaction_start", "compaction_end") and last:
            yield _pi(last[0], last[1])  # the message before ended: its last snapshot counts
            last = None
        if kind in ("message_start", "message_update", "message_end"):
            for holder, hpath in ((event, path), (event.get("message"), f"{path}.message")):
                if isinstance(holder, Mapping) and isinstance(holder.get("usage"), Mapping):
                    last = (holder["usage"], f"{hpath}.usage")
            if kind == "message_end" and last is not None:
                yield _pi(last[0], last[1])
                last = None
        elif kind == "compaction_end":
            result = event.get("result")
            if isinstance(result, Mapping) and isinstance(result.get("usage"), Mapping) and result["usage"]:
                yield replace(_pi(result["usage"], f"{path}.result.usage"), source="pi-compaction")
    if last is not None:
        yield _pi(last[0], last[1])


# What one JSON value of a usage file may cost: a line of JSONL, and a whole-file document (an array, or one
# pretty-printed object). Parsed JSON takes several times its text in memory (docs/closed-providers.md), so a file
# is read one line at a time and each value is bounded before it is parsed.
MAX_OBJECT_BYTES = 4 << 20
MAX_DOCUMENT_BYTES = 16 << 20


def _lines(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(line number, start, end) of each line that is not blank, without copying the file."""
    pos, n = 0, 0
    while pos < len(data):
        end, n = data.find(b"\n", pos), n + 1
        end = len(data) if end < 0 else end
        if data[pos:end].strip():
            yield n, pos, end
        pos = end + 1


def _line(data: bytes, name: str, n: int, start: int, end: int) -> Any:
    if end - start > MAX_OBJECT_BYTES:
        raise UsageError(
            f"a line of {end - start:,} bytes: more than the {MAX_OBJECT_BYTES:,} one usage object may take",
            path=f"{name}:{n}",
            hint="pass the provider's usage objects or responses, one per line",
        )
    return loads_outside(data[start:end], f"{name}:{n} $", error=UsageError, at=start)


def _objects(data: bytes, name: str) -> Iterator[tuple[Any, str]]:
    """The JSON values of a file, one at a time: one per line (JSONL; a line holding an array gives its elements),
    or, when the first line is not a whole value, one document (an object, or an array of them) of at most
    MAX_DOCUMENT_BYTES."""
    lines = _lines(data)
    first = next(lines, None)
    if first is None:
        raise UsageError("holds no usage object", path=name, hint="pass usage objects, one per line")
    try:
        head = _line(data, name, *first)
    except UsageError as line_error:  # a document over several lines (or one long line): read whole, if it may be
        if len(data) > MAX_DOCUMENT_BYTES:
            raise
        try:
            whole = loads_outside(data.strip(), f"{name} $", error=UsageError)
        except UsageError:
            raise line_error from None
        yield from (
            [(v, f"{name} $[{i}]") for i, v in enumerate(whole)] if isinstance(whole, list) else [(whole, f"{name} $")]
        )
        return
    values = itertools.chain([(first[0], head)], ((line[0], _line(data, name, *line)) for line in lines))
    for n, value in values:
        if isinstance(value, list):
            yield from ((v, f"{name}:{n} $[{i}]") for i, v in enumerate(value))
        else:
            yield value, f"{name}:{n} $"


_ANTHROPIC_EVENTS = {"message_start", "message_delta", "message_stop", "content_block_start", "content_block_delta"}
_ANTHROPIC_EVENTS |= {"content_block_stop", "ping"}
_PI_EVENTS = {"message_update", "message_end", "compaction_end", "compaction_start", "turn_start", "turn_end"}
_PI_EVENTS |= {"agent_start", "agent_end", "tool_execution_start", "tool_execution_end"}


def read_usage(data: bytes | str, name: str, *, format: Format = "auto") -> list[Usage]:
    """Every usage in a file: see `iter_usage`."""
    return list(iter_usage(data, name, format=format))


def iter_usage(data: bytes | str, name: str, *, format: Format = "auto") -> Iterator[Usage]:
    """Every usage in a file, one at a time: usage or response objects (one document, an array, or one per line),
    Anthropic's stream events, or a Pi JSON event stream (`message_update` … `compaction_end`). Each value's
    `where` names the file and line it came from. The file is read twice, one value at a time: once to tell which
    of these it is, once to read it; no more than one parsed value is held at once."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    items = events = 0
    kinds: set[str] = set()
    for o, _ in _objects(raw, name):
        items += 1
        if not (isinstance(o, Mapping) and isinstance(o.get("type"), str)):
            break  # not an event stream: plain usage objects
        events += 1
        kinds.add(o["type"])
    stream = events and events == items
    if stream and kinds & _PI_EVENTS and not kinds & {"message_delta"}:
        yield from (replace(u, where=name) for u in _pi_events(_objects(raw, name)))
    elif stream and kinds <= _ANTHROPIC_EVENTS and kinds & {"message_start", "message_delta"}:
        yield from (replace(u, where=name) for u in _anthropic_stream(_objects(raw, name)))
    else:
        yield from (replace(parse_usage(o, format=format, path=p), where=p) for o, p in _objects(raw, name))


def sum_usage(usages: Iterable[Usage]) -> Usage:
    """The field-wise sum: each usage is already normalized, so mixing formats counts nothing twice. Reasoning
    sums the usages that report it (None when none does); a cost sums only when every usage has one, and is the
    provider's only when every part was."""
    items = list(usages)
    if not items:
        return Usage(input=0, output=0, source="sum", calls=0)
    reasoning = [u.reasoning for u in items if u.reasoning is not None]
    costs = [u.cost for u in items if u.cost is not None]
    cost = None
    if costs and len(costs) == len(items):
        cost = Cost(
            total=sum((c.total for c in costs), Decimal(0)),
            total_from_provider=all(c.total_from_provider for c in costs),
            **{part: _sum_part(costs, part) for part in ("input", "output", "cache_read", "cache_write")},
        )
    models = {u.model for u in items}
    return Usage(
        input=sum(u.input for u in items),
        output=sum(u.output for u in items),
        cache_read=sum(u.cache_read for u in items),
        cache_write=sum(u.cache_write for u in items),
        cache_write_1h=sum(u.cache_write_1h for u in items),
        reasoning=sum(reasoning) if reasoning else None,
        source="sum",
        calls=sum(u.calls for u in items),
        model=models.pop() if len(models) == 1 else None,
        cost=cost,
    )


def _sum_part(costs: Sequence[Cost], part: str) -> Decimal | None:
    values = [getattr(c, part) for c in costs]
    return None if any(v is None for v in values) else sum(values, Decimal(0))


# -- prices -----------------------------------------------------------------------------------------------------

# LiteLLM's field names (model_prices_and_context_window.json), per token. A table may also use them per million
# tokens with the suffix `_per_million` in place of `_per_token` / `_cost` (e.g. `input_cost_per_million`).
_PRICE_FIELDS = {
    "input": "input_cost_per_token",
    "output": "output_cost_per_token",
    "reasoning": "output_cost_per_reasoning_token",
    "cache_read": "cache_read_input_token_cost",
    "cache_write": "cache_creation_input_token_cost",
    "cache_write_1h": "cache_creation_input_token_cost_above_1hr",
}
_TIER = re.compile(r"^(?P<base>.+)_above_(?P<n>\d+)k_tokens$")
_MILLION = Decimal(1_000_000)


@dataclass(frozen=True, slots=True)
class Price:
    """One model's prices per token, and its long-context tiers: {threshold: prices above it}."""

    name: str
    per_token: Mapping[str, Decimal]
    tiers: tuple[tuple[int, Mapping[str, Decimal]], ...] = ()
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_tokens: int | None = None  # LiteLLM's legacy field: the output limit where max_output_tokens is absent


@dataclass(frozen=True, slots=True)
class PriceTable:
    """A price table read from JSON (LiteLLM's `model_prices_and_context_window.json` format) or TOML (the same
    keys, one table per model). Numbers are read as Decimal, never as binary floats."""

    entries: Mapping[str, Price]
    sha256: str
    name: str

    @classmethod
    def parse(cls, data: bytes, name: str) -> PriceTable:
        if not name.endswith(".toml"):  # JSON through the strict reader, its floats as Decimal
            raw = loads_outside(data, name, error=PriceError, parse_float=Decimal)
        else:
            try:
                raw = tomllib.loads(data.decode("utf-8"), parse_float=Decimal)
            except (UnicodeDecodeError, ValueError, RecursionError, tomllib.TOMLDecodeError) as exc:
                raise PriceError(
                    f"not a price table: {exc}", path=name, hint="pass LiteLLM's JSON or a TOML table"
                ) from None
        if not isinstance(raw, Mapping):
            raise PriceError("a price table maps model names to their prices", path=name)
        entries = {}
        for model, spec in raw.items():
            if model == "sample_spec" or not isinstance(spec, Mapping):
                continue
            entries[model] = _price(model, spec, f"{name} {model}")
        if not entries:
            raise PriceError("has no model entry", path=name, hint="each key is a model name mapping to its prices")
        return cls(entries, hashlib.sha256(data).hexdigest(), name)

    def lookup(self, model: str) -> Price:
        """The entry for `model`: its exact name, else without a `provider/` prefix, else with one."""
        if model in self.entries:
            return self.entries[model]
        bare = model.split("/", 1)[-1]
        for key in (bare, *(k for k in self.entries if k.split("/", 1)[-1] == bare)):
            if key in self.entries:
                return self.entries[key]
        close = difflib.get_close_matches(model, list(self.entries), n=3)
        raise PriceError(
            f"no price for model {model!r}",
            path=self.name,
            hint=f"did you mean {', '.join(close)}?" if close else "add its entry to the table, or pass --model NAME",
        )


def _per_token(spec: Mapping[str, Any], key: str, path: str) -> Decimal | None:
    million = key.replace("_per_token", "_per_million").replace("_token_cost", "_cost_per_million")
    for k, scale in ((key, Decimal(1)), (million, _MILLION)):
        if k in spec and spec[k] is not None:
            value = spec[k]
            if isinstance(value, bool) or not isinstance(value, int | Decimal | float):
                raise PriceError(f"{k} must be a number, got {value!r}", path=f"{path}.{k}")
            price = Decimal(str(value)) / scale
            if price < 0 or not price.is_finite():
                raise PriceError(f"{k} must be a finite non-negative number", path=f"{path}.{k}")
            return price
    return None


def _price(model: str, spec: Mapping[str, Any], path: str) -> Price:
    base = {kind: p for kind, key in _PRICE_FIELDS.items() if (p := _per_token(spec, key, path)) is not None}
    thresholds = sorted({int(m["n"]) * 1000 for k in spec if (m := _TIER.match(k))})
    tiers = []
    for n in thresholds:
        above = {
            kind: p
            for kind, key in _PRICE_FIELDS.items()
            if (p := _per_token(spec, f"{key}_above_{n // 1000}k_tokens", path)) is not None
        }
        tiers.append((n, above))
    limits = {k: spec.get(k) for k in ("max_input_tokens", "max_output_tokens", "max_tokens")}
    return Price(
        model,
        base,
        tuple(tiers),
        *(v if isinstance(v, int) and not isinstance(v, bool) else None for v in limits.values()),
    )


def unit_prices(
    usage: Usage, table: PriceTable, model: str | None = None
) -> tuple[Price, dict[str, Decimal], str | None]:
    """The entry `usage` is priced by, its prices per token for this usage (a long-context tier's in place of the
    base ones when the prompt side is over the tier's threshold), and the tier's name (None: the base prices)."""
    name = model or usage.model
    if not name:
        raise PriceError("the usage names no model", path=usage.where, hint="pass --model NAME")
    entry = table.lookup(name)
    prices = dict(entry.per_token)
    tier = None
    for threshold, above in entry.tiers:
        if usage.prompt_tokens > threshold:
            prices.update(above)
            tier = f"above_{threshold // 1000}k_tokens"
    return entry, prices, tier


def price_usage(usage: Usage, table: PriceTable, model: str | None = None) -> Cost:
    """The estimated cost of `usage` under `table`'s entry for `model` (default: the model the response named).

    input, cache reads and cache writes each at their own price (1-hour writes at the 1-hour price); output at the
    output price, with the reasoning part at `output_cost_per_reasoning_token` where the entry has one. When the
    prompt side (input + cache read + cache write) is over a tier's threshold (`*_above_200k_tokens`), every price
    the tier gives replaces the base one, as the providers bill long contexts. A kind of token that was used but
    has no price is a `PriceError`, never a silent zero."""
    entry, prices, tier = unit_prices(usage, table, model)

    def need(kind: str, tokens: int) -> Decimal:
        if tokens == 0:
            return Decimal(0)
        if kind not in prices:
            raise PriceError(
                f"{tokens} {kind.replace('_', ' ')} tokens, and entry {entry.name!r} has no {_PRICE_FIELDS[kind]}",
                path=table.name,
                hint="add the price to the table",
            )
        return prices[kind] * tokens

    reasoning = usage.reasoning or 0
    if "reasoning" in prices and reasoning:
        output = need("output", usage.output - reasoning) + prices["reasoning"] * reasoning
    else:
        output = need("output", usage.output)
    write = need("cache_write", usage.cache_write - usage.cache_write_1h) + need("cache_write_1h", usage.cache_write_1h)
    parts = {"input": need("input", usage.input), "cache_read": need("cache_read", usage.cache_read)}
    return Cost(
        total=parts["input"] + output + parts["cache_read"] + write,
        total_from_provider=False,
        input=parts["input"],
        output=output,
        cache_read=parts["cache_read"],
        cache_write=write,
        price_entry=entry.name,
        table_sha256=table.sha256,
        tier=tier,
    )


__all__ = [
    "FORMATS",
    "Cost",
    "Price",
    "PriceTable",
    "Usage",
    "detect_format",
    "parse_usage",
    "price_usage",
    "read_usage",
    "sum_usage",
    "unit_prices",
]
