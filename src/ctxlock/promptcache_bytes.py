"""Cache busters of closed providers, named exactly by bytes.

Anthropic's and OpenAI's tokenizers are not public, so a token prefix computed with another model's tokenizer is
an estimate. Where the prefix breaks is not: both providers cache an exact prefix of the request in their order,
tools, then system, then messages. `canonical_bytes` serializes a canonical request (`ctxlock.request.Request`, the
same bytes whichever dialect it came in) in that order, one part per line (each tool, then each message, system
first), as JSON with the keys in the order they were sent, and keeps the byte range and request path (as sent) of
every value and key. `byte_buster` finds the first byte where a request stops extending the one before and names
it: tools reordered, a key order changed (`schema key order` inside tools), or a string that changed, by its path
and character, with both sides' text.

Not in the bytes: `cache_control` marks (kept beside the request, `Request.cache_control`), the top-level keys
that are not part of the prompt (model, max_tokens, tool_choice, thinking: `Request.extra`), and documents.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .promptcache import Buster, Split, TurnReport, turn_cost
from .request import Dialect, Message, Request, join_path
from .usage import PriceTable, Usage

ORDER = "tools → system → messages"
_SNIPPET = 24


@dataclass(frozen=True, slots=True)
class Node:
    """A value (or an object key) in the serialized request: its bytes [start, end), its request path, its text
    (a string's characters; a number's, a literal's JSON), and for an object, its keys in order."""

    start: int
    end: int
    path: str
    text: str | None = None
    keys: tuple[str, ...] | None = None
    is_key: bool = False


@dataclass(frozen=True)
class CanonicalBytes:
    data: bytes
    nodes: tuple[Node, ...]  # every value and key, in byte order (a container before what it holds)
    tools: tuple[str, ...]  # tool names, in order
    tools_end: int  # where the tools end and the messages begin
    tool_texts: tuple[str, ...]  # each tool's JSON with sorted keys (the same tool whatever its key order)


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()
        self.nodes: list[Node] = []

    def value(self, value: Any, path: str) -> None:
        start = len(self.out)
        if isinstance(value, str):
            self._string(value, path, is_key=False)
        elif isinstance(value, Mapping):
            at = len(self.nodes)
            self.nodes.append(Node(start, start, path))
            self.out += b"{"
            for i, (k, v) in enumerate(value.items()):
                if i:
                    self.out += b","
                sub = join_path(path, str(k))
                self._string(str(k), sub, is_key=True)
                self.out += b":"
                self.value(v, sub)
            self.out += b"}"
            self.nodes[at] = Node(start, len(self.out), path, keys=tuple(str(k) for k in value))
        elif isinstance(value, list | tuple):
            at = len(self.nodes)
            self.nodes.append(Node(start, start, path))
            self.out += b"["
            for i, v in enumerate(value):
                if i:
                    self.out += b","
                self.value(v, f"{path}[{i}]")
            self.out += b"]"
            self.nodes[at] = Node(start, len(self.out), path)
        else:
            text = json.dumps(value)
            self.out += text.encode()
            self.nodes.append(Node(start, len(self.out), path, text=text))

    def _string(self, s: str, path: str, *, is_key: bool) -> None:
        encoded = json.dumps(s, ensure_ascii=False).encode("utf-8", "surrogatepass")
        self.out += b'"'
        start = len(self.out)
        self.out += encoded[1:-1]
        self.nodes.append(Node(start, len(self.out), path, text=s, is_key=is_key))
        self.out += b'"'


def _tool_body(request: Request, tool: Mapping[str, Any], k: int) -> tuple[Any, str]:
    """A tool as sent: an Anthropic tool is {name, description, input_schema}; an OpenAI one {type, function}."""
    fn = tool["function"]
    if request.dialect is Dialect.ANTHROPIC:
        return {("input_schema" if key == "parameters" else key): v for key, v in fn.items()}, f"tools[{k}]"
    return fn, f"tools[{k}].function"


def _sent_path(m: Message, suffix: str) -> str:
    """The path as sent of a canonical field of `m` (Anthropic blocks are reshaped: `Message.origins`)."""
    probe = suffix
    while probe:
        if probe in m.origins:
            return m.origins[probe] + suffix[len(probe) :]
        cut = max(probe.rfind("."), probe.rfind("["))
        probe = probe[:cut] if cut > 0 else ""
    return f"{m.source}{suffix}"


def canonical_bytes(request: Request) -> CanonicalBytes:
    """The request's bytes in the provider's prefix order, with every value's path."""
    w = _Writer()
    names, texts = [], []
    for k, tool in enumerate(request.tools or ()):
        body, path = _tool_body(request, tool, k)
        w.value(body, path)
        w.out += b"\n"
        names.append(str(tool["function"].get("name", "?")))
        texts.append(json.dumps(body, sort_keys=True, ensure_ascii=False, default=str))
    tools_end = len(w.out)
    for m in request.messages:
        start = len(w.nodes)
        w.value(m.to_template(), "")
        w.out += b"\n"
        w.nodes[start:] = [replace(n, path=_sent_path(m, n.path) if n.path else m.source) for n in w.nodes[start:]]
    return CanonicalBytes(bytes(w.out), tuple(w.nodes), tuple(names), tools_end, tuple(texts))


def first_difference(a: bytes, b: bytes) -> int:
    """The first byte at which `a` and `b` differ (the shorter length when one is a prefix of the other)."""
    n = min(len(a), len(b))
    lo = 0
    step = 4096
    while lo < n and a[lo : lo + step] == b[lo : lo + step]:
        lo += step
    hi = min(lo + step, n)
    return next((i for i in range(lo, hi) if a[i] != b[i]), hi)


def _char_at(node: Node, offset: int) -> int:
    """The character of a string node at byte `offset` of the serialized request (escapes counted as written)."""
    pos, text = node.start, node.text or ""
    for i, ch in enumerate(text):
        pos += len(json.dumps(ch, ensure_ascii=False)[1:-1].encode("utf-8", "surrogatepass"))
        if pos > offset:
            return i
    return len(text)


def _containing(doc: CanonicalBytes, offset: int) -> list[Node]:
    """Every node whose bytes hold `offset`, outermost first."""
    return [n for n in doc.nodes if n.start <= offset < n.end or (n.start == n.end == offset)]


def _by_path(doc: CanonicalBytes, path: str, *, is_key: bool = False) -> Node | None:
    return next((n for n in doc.nodes if n.path == path and n.is_key == is_key), None)


def _snippet(data: bytes, offset: int) -> str:
    return data[offset : offset + _SNIPPET].decode("utf-8", "replace")


def byte_buster(prev: Request | CanonicalBytes, cur: Request | CanonicalBytes) -> Buster | None:
    """Why `cur` does not extend `prev`, found on their canonical bytes in the provider's prefix order (None when
    prev's bytes are a prefix of cur's): tools reordered, a key order changed, or a changed value by its path and
    character with both sides' text."""
    a = prev if isinstance(prev, CanonicalBytes) else canonical_bytes(prev)
    b = cur if isinstance(cur, CanonicalBytes) else canonical_bytes(cur)
    d = first_difference(a.data, b.data)
    if d == len(a.data):
        return None
    at = f"byte {d} of the canonical request ({ORDER})"
    in_tools = d < max(a.tools_end, b.tools_end)
    if in_tools and a.tools != b.tools and sorted(a.tool_texts) == sorted(b.tool_texts):
        return Buster(
            "tools reordered", "tools", f"tools reordered: [{', '.join(a.tools)}] vs [{', '.join(b.tools)}] ({at})"
        )
    for node in reversed(_containing(b, d)):
        if node.keys is None:
            continue
        other = _by_path(a, node.path)
        if other is not None and other.keys != node.keys and sorted(other.keys or ()) == sorted(node.keys):
            kind = "schema key order" if node.path.startswith("tools[") else "key order"
            return Buster(
                kind, node.path, f"{node.path} key order: {list(other.keys or ())} vs {list(node.keys)} ({at})"
            )
    return _content_buster(a, b, d, at)


def _content_buster(a: CanonicalBytes, b: CanonicalBytes, d: int, at: str) -> Buster:
    # The innermost string, number or literal whose bytes (or whose end: a value cut short) hold the difference.
    leaf = next((n for n in reversed(b.nodes) if n.text is not None and n.start <= d <= n.end), None)
    old = _by_path(a, leaf.path, is_key=leaf.is_key) if leaf is not None else None
    if leaf is None or old is None or not (old.start <= d <= old.end) or old.start != leaf.start:
        here = _containing(b, d) or _containing(a, d)
        path = here[-1].path if here else ("tools" if d < b.tools_end else "messages")
        before, after = _snippet(a.data, d), _snippet(b.data, d)
        return Buster("content", path, f"{path} (structure): {before!r} vs {after!r} ({at})")
    c = _char_at(leaf, d) if leaf.text is not None and leaf.keys is None else 0
    what = "key " if leaf.is_key else ""
    before, after = (old.text or "")[c : c + _SNIPPET], (leaf.text or "")[c : c + _SNIPPET]
    return Buster("content", leaf.path, f"{what}{leaf.path} char {c}: {before!r} vs {after!r} ({at})")


# -- the report's figures for a closed provider ------------------------------------------------------------------


@dataclass(frozen=True)
class ClosedTurn:
    """A closed provider's turn: the report with the buster found by bytes and, when the provider reported usage,
    its token figures; otherwise the proxy tokenizer's, labelled as estimates (`figures`). `predicted` keeps the
    proxy's split when reported figures replaced it."""

    report: TurnReport
    figures: str
    predicted: Split | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {**self.report.to_dict(), "figures": self.figures}
        if self.predicted is not None:
            p = self.predicted
            out["predicted_estimate"] = {
                "cache_read": p.cache_read,
                "cache_write": p.cache_write,
                "cache_write_1h": p.cache_write_1h,
                "uncached": p.uncached,
            }
        return out


def closed_turns(
    reports: Sequence[TurnReport],
    requests: Sequence[Request],
    usages: Sequence[Usage | None],
    proxy: str,
    *,
    table: PriceTable | None = None,
    price_model: str | None = None,
) -> list[ClosedTurn]:
    """Each turn of a closed provider's report with its buster named by bytes, and its figures: the reported
    usage's when given (input, cache read and write, and the cost from them), else the estimate from `proxy`'s
    tokenizer."""
    out = []
    docs = [canonical_bytes(r) for r in requests]
    for i, (report, usage) in enumerate(zip(reports, usages, strict=True)):
        buster = byte_buster(docs[i - 1], docs[i]) if i else None
        r = replace(report, buster=buster)
        if usage is None:
            out.append(ClosedTurn(r, f"estimate: {proxy}'s tokenizer (the provider's is not public)"))
            continue
        split = Split(usage.cache_read, usage.cache_write, usage.cache_write_1h, usage.input)
        cost, plain = (None, None)
        if table is not None and price_model is not None:
            cost, plain = turn_cost(split, usage.output, table, price_model)
        r = replace(r, input_tokens=split.total, split=split, cost=cost, cost_uncached=plain)
        out.append(ClosedTurn(r, "reported usage (the common prefix is an estimate)", predicted=report.split))
    return out


__all__ = ["ORDER", "CanonicalBytes", "ClosedTurn", "Node", "byte_buster", "canonical_bytes", "closed_turns"]
