"""One execution record as a self-contained HTML page (no script or style from elsewhere, no external request): the
rendered input as token chips coloured by provenance, neutralized control-token strings marked, each chip's id,
bytes and request path on hover, the layer summary and the digests. Shared by `GET /records/{id}/view` and
`ctxlock view`; and two records side by side with their first divergence (`GET /diff/{a}/{b}/view`, `ctxlock view
A B`)."""

from __future__ import annotations

import html
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ctxlock.errors import RequestValidationError
from ctxlock.records import COMPARERS, LAYERS
from ctxlock.tokenizer import Tokenizer

# No script, no request: only the inline style may load.
CSP = "default-src 'none'; style-src 'unsafe-inline'"

# Provenance classes: the template's own text, or the request part the span came from.
COLOURS = {
    "template": "#e8e8e8",
    "system": "#ffe9b3",
    "user": "#cfe8ff",
    "assistant": "#d7f5d0",
    "tool": "#f3d9ff",
    "document": "#ffd6d6",
    "image": "#d0d0ff",
    "control": "#7b2d8b",
}


class _Inexact(Exception):
    """The vocabulary's pieces do not spell the rendered text byte for byte."""


_NOT_CONTINUATION = bytes(b for b in range(256) if (b & 0xC0) != 0x80)


def _spans(data: bytes, ids: Sequence[int], pieces: Sequence[bytes]) -> Iterator[tuple[int, int]]:
    """Each token's [start, end) character span in the text whose UTF-8 is `data`, one at a time (nothing kept);
    raises `_Inexact` when the pieces do not spell `data`. A character is counted at its first byte: byte-level BPE
    splits some characters across tokens, and a token holding only later bytes of one gets an empty span."""
    pos = chars = 0
    sizes: dict[int, tuple[bytes, int, int]] = {}  # id -> (piece, its bytes, its characters), once per distinct id
    for i in ids:
        known = sizes.get(i)
        if known is None:
            if not 0 <= i < len(pieces):
                raise _Inexact
            piece = pieces[i]
            known = sizes[i] = (piece, len(piece), len(piece) - len(piece.translate(None, _NOT_CONTINUATION)))
        piece, size, count = known
        if not data.startswith(piece, pos):
            raise _Inexact
        yield chars, chars + count
        pos, chars = pos + size, chars + count
    if pos != len(data):
        raise _Inexact


def token_offsets(text: str, ids: list[int], tokenizer: Tokenizer) -> list[tuple[int, int]] | None:
    """Each token's [start, end) character span in `text`, from the vocabulary's byte pieces; None when the pieces
    do not spell the text byte for byte (a normalizing tokenizer): then no chip is given a provenance it lacks."""
    try:
        return list(_spans(text.encode("utf-8"), ids, tokenizer.token_bytes().pieces))
    except _Inexact:
        return None


def _kind(path: str, messages: list[Any]) -> str:
    if path.startswith("tools"):
        return "tool"
    if path.startswith("documents"):
        return "document"
    if path.startswith("system"):
        return "system"
    if path.startswith("messages["):
        try:
            role = messages[int(path[9 : path.index("]")])].get("role", "user")
        except (ValueError, IndexError, AttributeError):
            return "user"
        if ".image" in path or "image_url" in path:
            return "image"
        return role if role in COLOURS else ("tool" if role in ("tool", "ipython") else "user")
    return "template"


def _path_finder(spans: list[Any]) -> Callable[[int], str]:
    """The request path of the span holding character `s` (the first listed, as a linear search would find it).
    When the spans are sorted and disjoint (what a render gives) and `s` only grows (the tokens in order), a cursor
    walks them once: a long record costs one step per token."""
    ordered = all(spans[k][1] <= spans[k + 1][0] for k in range(len(spans) - 1))
    cursor = [0, -1]  # the span index, the last s

    def find(s: int) -> str:
        if not ordered:
            return next((p for a, b, p in spans if a <= s < b), "")
        if s < cursor[1]:
            cursor[0] = 0
        cursor[1] = s
        j = cursor[0]
        while j < len(spans) and spans[j][1] <= s:
            j += 1
        cursor[0] = j
        return spans[j][2] if j < len(spans) and spans[j][0] <= s else ""

    return find


@dataclass
class Page:
    """One page of a record's token chips: the chips of tokens [lo, hi), whether their provenance is exact, the
    tokens per request part over the whole record, and the record's token count."""

    items: list[dict[str, Any]]
    exact: bool
    counts: dict[str, int]
    total: int
    lo: int
    hi: int


def chip_page(data: dict[str, Any], tokenizer: Tokenizer, lo: int = 0, hi: int | None = None) -> Page:
    """The chips of tokens [lo, hi) (each: id, text, bytes, class, request path, neutralized) and the counts per
    part over all tokens, walking the ids once and keeping only the page's chips: memory is the page's, not the
    record's."""
    rendered = data.get("rendered") or {}
    text, ids = rendered.get("text", ""), data.get("input_ids") or []
    hi = len(ids) if hi is None else min(hi, len(ids))
    pieces = tokenizer.token_bytes().pieces
    try:
        return _chip_walk(data, ids, pieces, _spans(text.encode("utf-8"), ids, pieces), lo, hi, exact=True)
    except _Inexact:
        return _chip_walk(data, ids, pieces, itertools.repeat((0, 0), len(ids)), lo, hi, exact=False)


def _chip_walk(
    data: dict[str, Any],
    ids: Sequence[int],
    pieces: Sequence[bytes],
    offsets: Iterable[tuple[int, int]],
    lo: int,
    hi: int,
    *,
    exact: bool,
) -> Page:
    rendered = data.get("rendered") or {}
    text = rendered.get("text", "")
    path_of = _path_finder(list(rendered.get("request_spans") or []))
    control = {(s, e) for s, e, _ in rendered.get("control_tokens") or []}
    neutral = [(n[0], n[1]) for n in rendered.get("neutralized") or []]  # [start, end, control id]
    messages = (data.get("request") or {}).get("canonical", {}).get("messages") or []
    out: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    kinds: dict[str, str] = {}  # path -> its kind, once per path
    for k, (s, e) in enumerate(offsets):  # the offsets first: their end raises _Inexact when the text has more
        i = ids[k]
        path = path_of(s) if exact else ""
        kind = kinds.get(path)
        if kind is None:
            kind = kinds[path] = _kind(path, messages)
        if control and (s, e) in control:
            kind = "control"
        key = path or kind
        counts[key] = counts.get(key, 0) + 1
        if not lo <= k < hi:
            continue
        piece = pieces[i] if 0 <= i < len(pieces) else b""
        out.append(
            {
                "id": i,
                "text": text[s:e] if exact else piece.decode("utf-8", "replace"),
                "bytes": piece.hex(" "),
                "kind": kind,
                "path": path,
                "neutralized": exact and any(a < e and s < b for a, b in neutral),
            }
        )
    return Page(out, exact, counts, len(ids), lo, max(lo, hi))


def chips(data: dict[str, Any], tokenizer: Tokenizer) -> tuple[list[dict[str, Any]], bool]:
    """One chip per input id: id, text, bytes, class, request path, neutralized; and whether provenance is exact."""
    page = chip_page(data, tokenizer)
    return page.items, page.exact


def page_bounds(total: int, page: int, page_tokens: int | None) -> tuple[int, int, int]:
    """Tokens [lo, hi) of 1-based `page` and the number of pages (`page_tokens` None: one page of all of them).
    A page past the last is a RequestValidationError."""
    if page_tokens is None:
        return 0, total, 1
    pages = max(1, -(-total // page_tokens))
    if not 1 <= page <= pages:
        raise RequestValidationError(f"?page is 1..{pages} ({total} tokens, {page_tokens} a page)", path="?page")
    return (page - 1) * page_tokens, min(total, page * page_tokens), pages


def _pager(page: int, pages: int, lo: int, hi: int, total: int, extra: str = "") -> str:
    if pages == 1:
        return ""
    links = []
    if page > 1:
        links.append(f'<a rel="prev" href="?page={page - 1}{extra}">previous</a>')
    if page < pages:
        links.append(f'<a rel="next" href="?page={page + 1}{extra}">next</a>')
    return (
        f'<p class="pager" data-page="{page}" data-pages="{pages}">tokens {lo + 1}–{hi} of {total} '
        f"(page {page} of {pages}) {' · '.join(links)}</p>"
    )


def _chip_spans(items: list[dict[str, Any]], mark: int | None = None) -> str:
    """The chips' HTML; the chip at index `mark` (the first divergent token of a diff) gets the class `diverge`."""
    esc = html.escape
    spans = []
    for k, c in enumerate(items):
        cls = f"chip k-{c['kind']}" + (" neutralized" if c["neutralized"] else "") + (" diverge" if k == mark else "")
        title = f"id {c['id']} | bytes {c['bytes']} | {c['path'] or c['kind']}"
        spans.append(
            f'<span class="{cls}" data-id="{c["id"]}" data-path="{esc(c["path"])}" title="{esc(title)}">'
            f"{esc(c['text'] or '·').replace(chr(10), '&#8629;<br>')}</span>"
        )
    return "".join(spans)


def _style() -> str:
    colours = "".join(f".k-{k}{{background:{v}}}" for k, v in COLOURS.items())
    return (
        "body{font:14px system-ui,sans-serif;margin:1.5em}.chip{font-family:monospace;border:1px solid #bbb;"
        "border-radius:3px;padding:0 1px;margin:1px;white-space:pre-wrap}.k-control{color:#fff}"
        ".neutralized{outline:2px solid #d00;text-decoration:underline wavy #d00}" + colours + "table{border-collapse:"
        "collapse}td{border:1px solid #ccc;padding:2px 6px}.note{color:#a00}"
        ".diverge{outline:3px solid #f60;box-shadow:0 0 0 4px #fc6}.cols{display:flex;gap:1em}.cols>div{flex:1;"
        "min-width:0}#divergence{border:2px solid #f60;background:#fff4e6;padding:.5em 1em}"
    )


def _head(title: str) -> str:
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_style()}</style></head>\n"
    )


def _section(value: Any) -> str:
    if value is None:
        return "absent"
    if isinstance(value, dict):
        sha = value.get("sha256")
        return f"sha256 {sha[:12]}…" if isinstance(sha, str) else f"{len(value)} fields"
    if isinstance(value, list):
        return f"{len(value)} items"
    return str(value)


def layer_summary(data: dict[str, Any]) -> list[tuple[str, str]]:
    """One row per layer of the record, in the pipeline's order (`record.LAYERS`): the record sections its comparer
    reads (what `ctxlock diff` compares for it), each with its digest, or its size when it has none."""
    rows = []
    for layer in LAYERS:
        reads = COMPARERS[layer].reads
        rows.append((layer, "; ".join(f"{name}: {_section(data.get(name))}" for name in reads)))
    return rows


def record_page(
    record_id: str, data: dict[str, Any], tokenizer: Tokenizer, *, page: int = 1, page_tokens: int | None = None
) -> str:
    """The HTML page of one record (one string: inline style, no script from elsewhere). With `page_tokens`, only
    that many token chips are built (page `page`, 1-based; links to the others): what one page costs is bounded
    whatever the record's length. The tokens per part count the whole record."""
    total = len(data.get("input_ids") or [])
    lo, hi, pages = page_bounds(total, page, page_tokens)
    got = chip_page(data, tokenizer, lo, hi)
    items, exact, counts = got.items, got.exact, got.counts
    rendered = data.get("rendered") or {}
    esc = html.escape
    rows = "".join(f"<tr><td>{esc(k)}</td><td>{v}</td></tr>" for k, v in counts.items())
    digests = {
        "request": (data.get("request") or {}).get("sha256"),
        "template": (data.get("template") or {}).get("sha256"),
        "rendered": rendered.get("sha256"),
        "tokenizer": ((data.get("replay") or {}).get("files") or {}),
    }
    note = "" if exact else "<p class=note>token spans not exact for this tokenizer: chips carry no provenance</p>"
    budget = json.dumps((data.get("decisions") or {}).get("budget"), ensure_ascii=False)
    layers = "".join(
        f'<tr data-layer="{esc(k)}"><td>{esc(k)}</td><td>{esc(v)}</td></tr>' for k, v in layer_summary(data)
    )
    return f"""{_head(f"ctxlock record {record_id[:12]}")}<body><h1>record {esc(record_id)}</h1>
<p>model {esc(str((data.get("model") or {}).get("id")))} · {total} tokens</p>{note}
{_pager(page, pages, lo, hi, total)}<div id="tokens">{_chip_spans(items)}</div>
<h2>tokens per part</h2><table id="parts">{rows}</table>
<h2>budget decisions</h2><pre>{esc(budget)}</pre>
<h2>layers</h2><table id="layers">{layers}</table>
<h2>digests</h2><pre>{esc(json.dumps(digests, indent=2))}</pre>
</body></html>
"""


def _short(value: Any, limit: int = 400) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


def diff_page(
    sides: list[tuple[str, dict[str, Any], Tokenizer]],
    result: dict[str, Any],
    *,
    page: int | None = None,
    page_tokens: int | None = None,
) -> str:
    """Two records side by side (`sides`: [(id, record data, its tokenizer)] for a and b) and `result`, the
    `diff(a, b).to_dict()` of the record module: the first divergence's layer, location, values and cause in a
    banner, and the first token whose id differs outlined in both columns (none when the ids are equal). With
    `page_tokens`, each column shows the same window of that many tokens: page `page`, by default the one holding
    the first differing token."""
    esc = html.escape
    first = (result.get("ids") or {}).get("first_difference")
    div = result.get("first_divergence")
    if div is None:
        banner = (
            f'<div id="divergence" data-layer="" data-kind="{esc(result["kind"])}"><b>identical</b>: no layer differs'
        )
    else:
        banner = (
            f'<div id="divergence" data-layer="{esc(div["layer"])}" data-kind="{esc(result["kind"])}">'
            f'<b>first divergence: layer <span class="layer">{esc(div["layer"])}</span></b> at '
            f"<code>{esc(str(div['location']))}</code><br>cause: <span class=cause>{esc(str(div['cause']))}</span>"
            f"<br>a: <code>{esc(_short(div['a']))}</code><br>b: <code>{esc(_short(div['b']))}</code>"
        )
    if first is not None:
        banner += f"<br>first differing token: index {first}"
    notes = "".join(f"<li>{esc(n)}</li>" for n in result.get("notes") or [])
    banner += (f"<ul>{notes}</ul>" if notes else "") + "</div>"
    total = max(len(d.get("input_ids") or []) for _, d, _ in sides)
    if page is None:
        page = 1 if page_tokens is None or first is None else first // page_tokens + 1
    lo, hi, pages = page_bounds(total, page, page_tokens)
    mark = first - lo if first is not None and lo <= first < hi else None
    cols = []
    for side, (rid, data, tokenizer) in zip("ab", sides, strict=True):
        got = chip_page(data, tokenizer, lo, hi)
        note = "" if got.exact else "<p class=note>token spans not exact for this tokenizer: no provenance</p>"
        cols.append(
            f'<div id="side-{side}"><h2>{side}: record {esc(rid[:16])}</h2>'
            f"<p>model {esc(str((data.get('model') or {}).get('id')))} · {got.total} tokens</p>{note}"
            f'<div class="tokens">{_chip_spans(got.items, mark)}</div></div>'
        )
    banner += _pager(page, pages, lo, hi, total)
    (ia, _, _), (ib, _, _) = sides
    return f"""{_head(f"ctxlock diff {ia[:8]} {ib[:8]}")}<body><h1>diff {esc(ia[:16])} → {esc(ib[:16])}</h1>
{banner}
<div class="cols">{"".join(cols)}</div>
</body></html>
"""
