"""Cache busters of closed providers, named exactly by bytes.

Anthropic's and OpenAI's tokenizers are not public, so a token prefix computed with another model's tokenizer is
an estimate. Where the prefix breaks is not: both providers cache an exact prefix of the request in their order,
tools, then system, then messages. `canonical_bytes` serializes a canonical request (`ctxlock.request.Request`, the
same bytes whichever dialect it came in) in that order, one part per line (each tool, then each message, system
first), as JSON with the keys in the order they were sent, and keeps the byte range and request path (as sent) of
every value and key. `byte_buster` finds the first byte where a request stops extending the one before and names
it: tools reordered, a key order changed (`schema key order` inside tools), or a string that changed, by its path
and character, with both sides' text.

`provider_layout` lays each turn out in tokens in the same order, for the report's token figures: each part's bytes
(cut at the end of every block a `cache_control` mark may name) counted with a proxy tokenizer, never through a
model's chat template, whose layout is the model's, not the provider's (see docs/closed-providers.md).

Not in the bytes: `cache_control` marks (kept beside the request, `Request.cache_control`), the top-level keys
that are not part of the prompt (model, max_tokens, tool_choice, thinking: `Request.extra`), and documents.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ctxlock.accounting import part_of
from ctxlock.core import thaw
from ctxlock.economics._promptcache import Breakpoint, Buster, Split, TurnReport, turn_cost
from ctxlock.economics._usage import PriceTable, Usage
from ctxlock.request import Dialect, Message, Request, join_path
from ctxlock.tokenizer import Tokenizer

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
class Part:
    """One line of the serialization: a tool or a message, its bytes [start, end) (the newline excluded), the
    JSON value written, and how its paths read as sent (`base` for a tool; `message` maps canonical suffixes)."""

    start: int
    end: int
    value: Any
    base: str
    message: Message | None = None


@dataclass(frozen=True)
class CanonicalBytes:
    data: bytes
    starts: tuple[int, ...]  # where each part begins: each tool, then each message, in byte order
    entries: tuple[tuple[Any, str, Message | None], ...]  # each part's value, base path and message
    tools: tuple[str, ...]  # tool names, in order
    tools_end: int  # where the tools end and the messages begin
    tool_texts: tuple[str, ...]  # each tool's JSON with sorted keys (the same tool whatever its key order)

    def part_at(self, offset: int) -> Part | None:
        """The part whose bytes (or whose newline) hold `offset`."""
        k = bisect.bisect_right(self.starts, offset) - 1
        if k < 0:
            return None
        end = (self.starts[k + 1] if k + 1 < len(self.starts) else len(self.data)) - 1  # before its newline
        value, base, message = self.entries[k]
        return Part(self.starts[k], end, value, base, message) if offset <= end else None


def _dumps(value: Any) -> bytes:
    """The bytes `_Writer` writes for `value`: compact JSON, keys in order, non-ASCII as UTF-8."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


class _Writer:
    """`_dumps`, keeping the byte range and path of every value and key: used only on the part where two requests
    differ."""

    def __init__(self, start: int) -> None:
        self.out = bytearray()
        self.at = start
        self.nodes: list[Node] = []

    def value(self, value: Any, path: str) -> None:
        start = self.at + len(self.out)
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
            self.nodes[at] = Node(start, self.at + len(self.out), path, keys=tuple(str(k) for k in value))
        elif isinstance(value, list | tuple):
            at = len(self.nodes)
            self.nodes.append(Node(start, start, path))
            self.out += b"["
            for i, v in enumerate(value):
                if i:
                    self.out += b","
                self.value(v, f"{path}[{i}]")
            self.out += b"]"
            self.nodes[at] = Node(start, self.at + len(self.out), path)
        else:
            text = json.dumps(value)
            self.out += text.encode()
            self.nodes.append(Node(start, self.at + len(self.out), path, text=text))

    def _string(self, s: str, path: str, *, is_key: bool) -> None:
        encoded = json.dumps(s, ensure_ascii=False).encode("utf-8", "surrogatepass")
        self.out += b'"'
        start = self.at + len(self.out)
        self.out += encoded[1:-1]
        self.nodes.append(Node(start, self.at + len(self.out), path, text=s, is_key=is_key))
        self.out += b'"'


def part_nodes(part: Part) -> list[Node]:
    """Every value and key of a part, with its bytes in the whole serialization and its path as sent."""
    w = _Writer(part.start)
    w.value(part.value, part.base if part.message is None else "")
    m = part.message
    if m is None:
        return w.nodes
    out = []
    for n in w.nodes:
        out.append(replace(n, path=_sent_path(m, n.path) if n.path else m.source))
        if n.text is not None and not n.is_key and n.path:
            out.extend(_piece_nodes(m, n))
    return out


def _piece_nodes(m: Message, n: Node) -> list[Node]:
    """A string the dialect joined from several blocks (an Anthropic `system` of text blocks, joined with nothing as
    vLLM and llama.cpp do): one node per block after the string's own, named by the block's path as sent
    (`Message.origins` `.content@START`), so that a breakpoint on a block ends where the block's bytes end and a
    change inside it is named by it."""
    prefix = f"{n.path}@"
    starts = sorted((int(k[len(prefix) :]), v) for k, v in m.origins.items() if k.startswith(prefix))
    if not starts:
        return []
    text = n.text or ""
    ends = [c for c, _ in starts[1:]] + [len(text)]
    return [
        Node(n.start + _escaped_len(text[:c]), n.start + _escaped_len(text[:e]), path, text=text[c:e])
        for (c, path), e in zip(starts, ends, strict=True)
    ]


def _escaped_len(text: str) -> int:
    """The bytes `_Writer` writes for the characters of `text` inside a string (escapes as written)."""
    return len(json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8", "surrogatepass"))


def _tool_body(request: Request, tool: Mapping[str, Any], k: int) -> tuple[Any, str]:
    """A tool as sent: an Anthropic tool is {name, description, input_schema}; an OpenAI one {type, function}."""
    fn = thaw(tool["function"])
    if request.dialect is Dialect.ANTHROPIC:
        return {("input_schema" if key == "parameters" else key): v for key, v in fn.items()}, _tool_base(request, k)
    return fn, _tool_base(request, k)


def _tool_base(request: Request, k: int) -> str:
    return f"tools[{k}]" if request.dialect is Dialect.ANTHROPIC else f"tools[{k}].function"


def _sent_path(m: Message, suffix: str) -> str:
    """The path as sent of a canonical field of `m` (Anthropic blocks are reshaped: `Message.origins`)."""
    probe = suffix
    while probe:
        if probe in m.origins:
            return m.origins[probe] + suffix[len(probe) :]
        cut = max(probe.rfind("."), probe.rfind("["))
        probe = probe[:cut] if cut > 0 else ""
    return f"{m.source}{suffix}"


def canonical_bytes(request: Request, memo: dict[Any, Any] | None = None) -> CanonicalBytes:
    """The request's bytes in the provider's prefix order, and where each part is. `memo` (a dict the caller keeps
    for one session) reuses the bytes of a tool, or of a message in the same place in the turn before, already
    serialized."""
    memo = {} if memo is None else memo
    chunks: list[bytes] = []
    entries: list[tuple[Any, str, Message | None]] = []
    names, texts = [], []
    for k, tool in enumerate(request.tools or ()):
        key = (tool, request.dialect)
        if key not in memo:
            body, _ = _tool_body(request, tool, k)
            memo[key] = (body, _dumps(body), json.dumps(body, sort_keys=True, ensure_ascii=False))
        body, data, text = memo[key]
        entries.append((body, _tool_base(request, k), None))
        chunks.append(data)
        names.append(str(tool["function"].get("name", "?")))
        texts.append(text)
    # The turn before's messages, by position: a session's turn repeats them, and comparing in place is cheaper
    # than hashing each (a Message's hash is computed once per object, and every turn is parsed anew).
    before_msgs, before = memo.get("messages", ((), ()))
    done = []
    for i, m in enumerate(request.messages):
        if i < len(before_msgs) and (before_msgs[i] is m or before_msgs[i] == m):
            hit = before[i]
        else:
            value = m.to_template()
            hit = (value, _dumps(value))
        done.append(hit)
        entries.append((hit[0], m.source, m))
        chunks.append(hit[1])
    memo["messages"] = (request.messages, done)
    starts, pos = [], 0
    for c in chunks:
        starts.append(pos)
        pos += len(c) + 1
    tools_end = starts[len(names)] if len(starts) > len(names) else pos
    data = b"\n".join(chunks) + (b"\n" if chunks else b"")
    return CanonicalBytes(data, tuple(starts), tuple(entries), tuple(names), tools_end, tuple(texts))


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


def _containing(nodes: list[Node], offset: int) -> list[Node]:
    """Every node whose bytes hold `offset`, outermost first."""
    return [n for n in nodes if n.start <= offset < n.end or (n.start == n.end == offset)]


def _by_path(nodes: list[Node], path: str, *, is_key: bool = False) -> Node | None:
    return next((n for n in nodes if n.path == path and n.is_key == is_key), None)


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
    # Every byte before d is the same, so the part holding d starts at the same place in both: only it is walked.
    pa, pb = a.part_at(d), b.part_at(d)
    na = part_nodes(pa) if pa is not None else []
    nb = part_nodes(pb) if pb is not None else []
    for node in reversed(_containing(nb, d)):
        if node.keys is None:
            continue
        other = _by_path(na, node.path)
        if other is not None and other.keys != node.keys and sorted(other.keys or ()) == sorted(node.keys):
            kind = "schema key order" if node.path.startswith("tools[") else "key order"
            return Buster(
                kind, node.path, f"{node.path} key order: {list(other.keys or ())} vs {list(node.keys)} ({at})"
            )
    return _content_buster(a, b, na, nb, d, at)


def _content_buster(a: CanonicalBytes, b: CanonicalBytes, na: list[Node], nb: list[Node], d: int, at: str) -> Buster:
    # The innermost string, number or literal whose bytes (or whose end: a value cut short) hold the difference.
    leaf = next((n for n in reversed(nb) if n.text is not None and n.start <= d <= n.end), None)
    old = _by_path(na, leaf.path, is_key=leaf.is_key) if leaf is not None else None
    if leaf is None or old is None or not (old.start <= d <= old.end) or old.start != leaf.start:
        here = _containing(nb, d) or _containing(na, d)
        path = here[-1].path if here else ("tools" if d < b.tools_end else "messages")
        before, after = _snippet(a.data, d), _snippet(b.data, d)
        return Buster("content", path, f"{path} (structure): {before!r} vs {after!r} ({at})")
    c = _char_at(leaf, d)
    what = "key " if leaf.is_key else ""
    before, after = (old.text or "")[c : c + _SNIPPET], (leaf.text or "")[c : c + _SNIPPET]
    return Buster("content", leaf.path, f"{what}{leaf.path} char {c}: {before!r} vs {after!r} ({at})")


# -- the provider's layout in tokens -----------------------------------------------------------------------------

# The blocks a `cache_control` mark can name (`request.anthropic.cache_breakpoints`): a tool, a system block, a
# message's content block. A breakpoint caches the prefix up to the end of its block's last byte.
_BLOCK = re.compile(r"(tools\[\d+\]|system\[\d+\]|messages\[\d+\]\.content\[\d+\])(?=$|[.\[])")


@dataclass(frozen=True)
class ProviderTokens:
    """One turn laid out in the provider's prefix order (`ORDER`), in a proxy tokenizer's tokens: the ids, and
    where each block a `cache_control` mark may name ends (its request path as sent -> tokens before its end)."""

    ids: np.ndarray
    block_ends: dict[str, int]
    parts: tuple[tuple[str, int], ...] = ()  # each part (`tools[0]`, `system`, `messages[3]`) and its tokens, in order

    def breakpoints(self, request: Request) -> tuple[Breakpoint, ...]:
        """The request's `cache_control` breakpoints in these tokens, in the provider's order. A mark on what the
        bytes leave out (a document block) has none, as a block the template never wrote had none before."""
        out = []
        for mark in request.cache_control:
            end = self.block_ends.get(str(mark.get("path")))
            if mark.get("type") == "ephemeral" and end is not None:
                out.append(Breakpoint(end, "1h" if mark.get("ttl") == "1h" else "5m"))
        return tuple(out)


def _part_tokens(part: Part, raw: bytes, tokenizer: Tokenizer, cut: bool) -> tuple[np.ndarray, dict[str, int]]:
    """A part's bytes (its newline included) in tokens, cut at the end of every block a mark may name (Anthropic)
    so that a breakpoint ends on a token boundary whether or not this turn marks it: the same bytes give the same
    tokens on every turn."""
    ends: dict[str, int] = {}
    if cut:
        for node in part_nodes(part):
            m = _BLOCK.match(node.path)
            if m is not None:
                ends[m.group(1)] = max(ends.get(m.group(1), 0), node.end - part.start)
    points = sorted({0, *ends.values(), len(raw)})
    pieces = [raw[a:b].decode("utf-8", "replace") for a, b in itertools.pairwise(points)]
    encoded = tokenizer.encode_text_batch(pieces, [False] * len(pieces))
    before = dict(zip(points[1:], np.cumsum([len(e) for e in encoded]).tolist(), strict=True))
    ids = np.fromiter((i for e in encoded for i in e), dtype=np.int64)
    return ids, {path: int(before[end]) for path, end in ends.items()}


def provider_layout(
    doc: CanonicalBytes, request: Request, tokenizer: Tokenizer, memo: dict[Any, Any]
) -> ProviderTokens:
    """The turn's canonical bytes (`canonical_bytes`: tools, then system, then messages) in `tokenizer`'s tokens,
    part by part. Only lengths come from the tokenizer; the order is the provider's, whatever model's tokenizer
    it is. `memo` (one per session) keeps each part's tokens for the turns that repeat it."""
    ids: list[np.ndarray] = []
    ends: dict[str, int] = {}
    parts: list[tuple[str, int]] = []
    pos = 0
    cut = request.dialect is Dialect.ANTHROPIC
    for start in doc.starts:
        part = doc.part_at(start)
        assert part is not None  # every start begins a part
        raw = doc.data[start : part.end + 1]
        key = ("tokens", raw, part.base, cut)
        if key not in memo:
            memo[key] = _part_tokens(part, raw, tokenizer, cut)
        part_ids, part_ends = memo[key]
        ends.update({path: pos + n for path, n in part_ends.items()})
        ids.append(part_ids)
        parts.append((part_of(part.base), len(part_ids)))
        pos += len(part_ids)
    return ProviderTokens(np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64), ends, tuple(parts))


# -- the report's figures for a closed provider ------------------------------------------------------------------


def estimate_label(proxy: str) -> str:
    """How a closed provider's estimated figure says where it comes from: the proxy tokenizer and the layout."""
    return f"estimate: the {proxy} tokenizer over the provider's layout ({ORDER}); the provider's is not public"


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
    docs: Sequence[CanonicalBytes] | None = None,
) -> list[ClosedTurn]:
    """Each turn of a closed provider's report with its buster named by bytes, and its figures: the reported
    usage's when given (input, cache read and write, and the cost from them), else the estimate from the `proxy`
    tokenizer (its name) over the provider's layout (`provider_layout`). `docs`: the requests' canonical bytes,
    when the caller has them."""
    out = []
    if docs is None:
        memo: dict[Any, Any] = {}  # one session's serialized messages and tools, reused from turn to turn
        docs = [canonical_bytes(r, memo) for r in requests]
    estimate = estimate_label(proxy)
    for i, (report, usage) in enumerate(zip(reports, usages, strict=True)):
        buster = byte_buster(docs[i - 1], docs[i]) if i else None
        r = replace(report, buster=buster)
        if usage is None:
            out.append(ClosedTurn(r, estimate))
            continue
        split = Split(usage.cache_read, usage.cache_write, usage.cache_write_1h, usage.input)
        cost, plain = (None, None)
        if table is not None and price_model is not None:
            cost, plain = turn_cost(split, usage.output, table, price_model)
        r = replace(r, input_tokens=split.total, split=split, cost=cost, cost_uncached=plain)
        out.append(ClosedTurn(r, f"reported usage (the common prefix is an {estimate})", predicted=report.split))
    return out


__all__ = [
    "ORDER",
    "CanonicalBytes",
    "ClosedTurn",
    "Node",
    "Part",
    "ProviderTokens",
    "byte_buster",
    "canonical_bytes",
    "closed_turns",
    "estimate_label",
    "first_difference",
    "part_nodes",
    "provider_layout",
]
