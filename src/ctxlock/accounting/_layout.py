"""Exact per-part token counts: which part of the request every token of `input_ids` came from (docs/accounting.md).

`count(model, request)` renders and tokenizes the request once, then attributes each token to exactly one part:

- `system`, `tools[i]`, `messages[j]`, `documents[k]`: the request's own parts, named by their JSON path in the
  request as it was sent (Anthropic's top-level `system` is `system`; an OpenAI system message is `messages[0]`);
- `generation_prompt`: what `add_generation_prompt` appended (the assistant header the model continues from);
- `template`: everything else the template wrote (role headers, separators, its own system prompt, tool
  instructions).

**The rule.** The rendered text's characters each have one owner: a request part where the template's output is
a request string (`Rendered.request_spans`, by exact provenance), the generation prompt where it is the appended
suffix, the template elsewhere. A token's bytes are found by replaying the tokenizer run by run (the template's
control tokens are their own ranges; each run between them is encoded on its own, as the tokenizer does) and
laying each token's bytes (`token_bytes`) over the run. A token belongs to the owner of most of its bytes; on a
tie, to the owner of its first byte of those tied. So the parts sum to `len(input_ids)` exactly.

When the bytes cannot be laid exactly (a normalizer that changes lengths, a vocabulary without per-token bytes),
the run's tokens are spread over the run in proportion to their byte lengths, and `Counts.exact_bytes` is False;
the parts still sum to the total, and the counts say so in their output.

**Marginal cost** (`marginal=True`): for each part, the total of the same request without that part, rendered
and tokenized in full, subtracted from the total (Anthropic's count_tokens: 14 → 403 tokens from one tool definition). A
part whose removal makes the request invalid (a tool result without its call) gets no marginal, with the reason.

**Unseen parts.** A request part the template never wrote (a `documents` list a template ignores, a `name`, a
reasoning field) leaves no byte in the rendered text: the model never sees it. `Counts.unseen` names each one by its
path, so `count`, `render` and `fit` can say so instead of reporting a silent 0.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxlock.accounting._tokenlay import Unaligned, assign_owners, spread, tally_segments, token_ranges, whole_lay
from ctxlock.caches import LRU, memoize
from ctxlock.errors import CtxlockError, RequestError
from ctxlock.outside import Utf8Policy, decode_bytes, loads_strict
from ctxlock.pipeline import Pipeline, RequestLike
from ctxlock.request import Request
from ctxlock.settings import fast_enabled
from ctxlock.template import RENDER_OPTIONS, Rendered, check_options
from ctxlock.tokenizer import ControlMatch, control_matches, encode_ids

if TYPE_CHECKING:
    from ctxlock.multimodal import ImageInput, MultimodalInput, VideoInput

TEMPLATE = "template"
GENERATION_PROMPT = "generation_prompt"
_TOP = re.compile(r"^(system|tools\[\d+\]|messages\[\d+\]|documents\[\d+\])")


@dataclass(frozen=True, slots=True)
class Part:
    """One part's tokens, and, when asked, its marginal cost (None with `marginal_note` when it has none)."""

    part: str
    tokens: int
    marginal: int | None = None
    marginal_note: str | None = None

    def to_dict(self, *, with_marginal: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"part": self.part, "tokens": self.tokens}
        if with_marginal:
            out["marginal"] = self.marginal
            if self.marginal_note:
                out["marginal_note"] = self.marginal_note
        return out


@dataclass(frozen=True, slots=True)
class Counts:
    """Where every token of one request's `input_ids` came from."""

    total: int
    parts: tuple[Part, ...]
    unseen: tuple[str, ...]  # request parts that left no byte in the rendered text
    exact_bytes: bool  # every token's bytes were laid exactly (else spread in proportion; see the module doc)
    provenance_exact: bool  # the render knew where every request character went (else `unseen` may be incomplete)
    marginal: bool = False
    notes: tuple[str, ...] = field(default=())
    source: RequestLike | None = field(default=None, repr=False, compare=False)  # the request as given
    # document blocks (Anthropic `document`): the provider counts them by its own rules, which ctxlock does not know
    provider_unknown: tuple[str, ...] = field(default=())
    # Each image's plan from its header alone (with_images): its tokens, resize steps, grid, span, digest.
    images: tuple[dict[str, Any], ...] = field(default=())

    @property
    def request_bytes(self) -> int:
        """The size of the request as sent (Pi (github.com/badlogic/pi-mono)'s maxRequestBytes): its bytes, or its
        compact JSON's (measured when read, so a count that never reports it does not serialize the request; a mapping
        changed since the count is measured as it is now). 0 for a parsed `Request`."""
        return _request_bytes(self.source) if self.source is not None else 0

    def tokens(self, part: str) -> int:
        return sum(p.tokens for p in self.parts if p.part == part)

    def to_dict(self) -> dict[str, Any]:
        return ({"images": list(self.images)} if self.images else {}) | {
            "total": self.total,
            "parts": [p.to_dict(with_marginal=self.marginal) for p in self.parts],
            "unseen": list(self.unseen),
            "request_bytes": self.request_bytes,
            "exact_bytes": self.exact_bytes,
            "provenance_exact": self.provenance_exact,
            "notes": list(self.notes),
            "provider_document_tokens": {path: "unknown" for path in self.provider_unknown},
        }


@dataclass(frozen=True, slots=True)
class _Pass:
    """One request through the pipeline, as counting needs it: the ids come from `encode_ids` (the fast whole-text
    path when it applies), the control tokens' positions from `control_matches`."""

    request: Request
    rendered: Rendered
    ids: np.ndarray
    control: tuple[ControlMatch, ...]


# -- owners of the rendered text's bytes -----------------------------------------------------------------------


def _char_to_byte(text: str, data: bytes) -> np.ndarray:
    """offsets[i] = the UTF-8 byte offset of character i (offsets[len(text)] = the byte length); `data` is the
    text's UTF-8 (with lone surrogates as three bytes each)."""
    if len(data) == len(text):  # ASCII
        return np.arange(len(text) + 1, dtype=np.int64)
    lead = np.flatnonzero((np.frombuffer(data, dtype=np.uint8) & 0xC0) != 0x80)  # where each character starts
    out = np.empty(len(lead) + 1, dtype=np.int64)
    out[:-1] = lead
    out[-1] = len(data)
    return out


@memoize("accounting.part_of", 4096, scope="artifact")
def part_of(path: str) -> str:
    """The request part a JSON path belongs to: `messages[3].content[0].text` -> `messages[3]`."""
    m = _TOP.match(path)
    return m.group(1) if m else path.split(".", 1)[0]


def _owners(run: _Pass, gen_start: int | None, offsets: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """The owner index of every byte of the rendered text, and the owners' names (0 = template)."""
    names = [TEMPLATE]
    index = {TEMPLATE: 0}
    owner = np.zeros(int(offsets[-1]), dtype=np.int32)
    if gen_start is not None:
        index[GENERATION_PROMPT] = len(names)
        names.append(GENERATION_PROMPT)
        owner[int(offsets[gen_start]) :] = index[GENERATION_PROMPT]
    for span in run.rendered.request_spans:
        name = part_of(span.path)
        if name not in index:
            index[name] = len(names)
            names.append(name)
        owner[int(offsets[span.start]) : int(offsets[span.end])] = index[name]
    return owner, names


def _segments(run: _Pass, gen_start: int | None, offsets: np.ndarray) -> tuple[list[int], list[int], list[str]]:
    """The owners of `_owners` as segments: byte breakpoints (0 first, the text's size last) and the owner of each
    segment between two, with the same names in the same order. Used when the non-empty request spans are in text
    order without overlap (every render ctxlock has met), where they give `_owners` byte for byte."""
    names = [TEMPLATE]
    index = {TEMPLATE: 0}
    if gen_start is not None:
        index[GENERATION_PROMPT] = len(names)
        names.append(GENERATION_PROMPT)
    span_owner: list[int] = []
    bounds: list[int] = []
    for span in run.rendered.request_spans:
        name = part_of(span.path)
        if name not in index:
            index[name] = len(names)
            names.append(name)
        if span.end > span.start:
            span_owner.append(index[name])
            bounds += (span.start, span.end)
    size = int(offsets[-1])
    gen = size if gen_start is None else int(offsets[gen_start])
    gen_owner = index.get(GENERATION_PROMPT, 0)
    at = offsets[np.array(bounds, dtype=np.int64)].tolist() if bounds else []
    points, owners = [0], []

    def fill(end: int) -> None:  # template bytes up to `end`, the generation prompt's from `gen` on
        start = points[-1]
        if start < gen < end:
            points.append(gen)
            owners.append(0)
        if end > points[-1]:
            points.append(end)
            owners.append(gen_owner if points[-2] >= gen else 0)

    for k, o in enumerate(span_owner):
        start, end = at[2 * k], at[2 * k + 1]
        if start < points[-1]:
            raise _Overlap
        fill(start)
        if not owners or owners[-1] != o or points[-1] != start:
            points.append(end)
            owners.append(o)
        else:
            points[-1] = end  # the same owner on: one segment
    fill(size)
    return points, owners, names


class _Overlap(Exception):
    """Request spans out of text order or overlapping: the per-byte owners (`_owners`) take over."""


# -- the generation prompt -------------------------------------------------------------------------------------


def _generation_start(model: Pipeline, req: Request, run: _Pass, options: Mapping[str, Any]) -> int | None:
    """Where the generation prompt starts in the rendered text: the text without it is a prefix of the text with
    it (every template ctxlock has met); None when no generation prompt was asked for or it added nothing.

    The reference renders the request again without the generation prompt. The fast path uses the template's
    generation suffix, probed once per template and options on two small conversations (one turn, three turns):
    when both give the same suffix and the text ends with it, outside every request string, that is where it
    starts; otherwise the request is rendered again."""
    if options.get("add_generation_prompt", True) is False or options.get("continue_final_message"):
        return None
    text = run.rendered.text
    if fast_enabled():
        suffix = _probed_suffix(model, run.rendered, options)
        if suffix and text.endswith(suffix):
            start = len(text) - len(suffix)
            if all(sp.end <= start for sp in reversed(run.rendered.request_spans)):
                return start
    without = model.render(req, **{**options, "add_generation_prompt": False}).text
    if len(without) < len(text) and text.startswith(without):
        return len(without)
    return None


_SUFFIXES: LRU[tuple[str, str, str], str] = LRU("accounting.generation_suffix", max_items=256, scope="artifact")
_PROBES = (
    ({"role": "user", "content": "x"},),
    ({"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}),
)


def _probed_suffix(model: Pipeline, rendered: Rendered, options: Mapping[str, Any]) -> str:
    """The text `add_generation_prompt` appends, when it is the same for both probe conversations; else ""."""
    # the template's source itself (its hash is kept by the string; no digest of it per call), the model, the options
    key: tuple[str, str, str] = (rendered.template.source, model.id, "")
    if options.keys() - {"template", "add_generation_prompt"}:
        rest = {k: v for k, v in options.items() if k not in ("template", "add_generation_prompt")}
        key = (key[0], key[1], json.dumps(rest, sort_keys=True, default=repr))
    hit = _SUFFIXES.get(key)
    if hit is not None:
        return hit
    found: set[str] = set()
    for messages in _PROBES:
        probe = {"messages": list(messages)}
        try:
            with_prompt = model.render(probe, **{**options, "add_generation_prompt": True}).text
            without = model.render(probe, **{**options, "add_generation_prompt": False}).text
        except CtxlockError:
            found.add("")
            continue
        found.add(with_prompt[len(without) :] if with_prompt.startswith(without) else "")
    suffix = found.pop() if len(found) == 1 else ""
    _SUFFIXES.put(key, suffix)
    return suffix


# -- unseen parts ----------------------------------------------------------------------------------------------


def _expected(req: Request) -> list[str]:
    """The source paths of every non-empty string the request carries that a template could write."""
    out: list[str] = []
    for m in req.messages:
        src, origins = m.source, m.origins
        mine: list[str] = []  # suffixes of this message's source path
        if isinstance(m.content, str):
            if m.content:
                mine.append(".content")
        elif m.content:
            texts = enumerate(m.content)
            mine += [f".content[{i}].text" for i, p in texts if p.get("type") == "text" and p.get("text")]
        calls = [call.source or f".tool_calls[{i}]" for i, call in enumerate(m.tool_calls or ())]
        if m.name:
            calls.append(".name")
        if m.reasoning_content:
            calls.append(".reasoning_content")
        for suffix in (*mine, *calls):
            if suffix[0] != ".":  # a tool call's own source path
                out.append(suffix)
            else:
                out.append(origins.get(suffix, src + suffix) if origins else src + suffix)
    out += [f"tools[{i}]" for i in range(len(req.tools or ()))]
    out += [f"documents[{i}]" for i in range(len(req.documents or ()))]
    out += [b["path"] for b in req.ignored]  # accepted, never model input (Anthropic redacted_thinking)
    return out


def _unseen(req: Request, run: _Pass) -> tuple[str, ...]:
    """The expected paths no span path equals or lies under."""
    paths = sorted({span.path for span in run.rendered.request_spans})
    return tuple(p for p in _expected(req) if not _written(paths, p))


def _written(paths: list[str], path: str) -> bool:
    """Whether `path` or a path under it (`path.x`, `path[i]`) is among the sorted `paths`: those starting with it
    are next to one another from where it would be inserted."""
    i = bisect.bisect_left(paths, path)
    n = len(path)
    while i < len(paths) and paths[i].startswith(path):
        if len(paths[i]) == n or paths[i][n] in ".[":
            return True
        i += 1
    return False


def unseen_parts(request: Request, rendered: Rendered) -> tuple[str, ...]:
    """The request parts a render never wrote (by their path in the request as sent): the model never sees them.
    Empty when the render's provenance is inexact (then nothing can be said either way)."""
    if not rendered.provenance_exact:
        return ()
    return _unseen(request, _Pass(request, rendered, np.zeros(0, dtype=np.int64), ()))


def unseen_warnings(request: Request, rendered: Rendered) -> list[dict[str, str]]:
    """`unseen_parts` as the warnings `render`, `fit` and records carry."""
    return [
        {
            "kind": "unseen",
            "message": f"the template wrote no byte of {path}: the model never sees it",
            "path": path,
        }
        for path in unseen_parts(request, rendered)
    ]


# -- counting --------------------------------------------------------------------------------------------------


def _request_bytes(request: RequestLike) -> int:
    if isinstance(request, bytes):
        return len(request)
    if isinstance(request, str):
        return len(request.encode("utf-8", "surrogatepass"))
    if isinstance(request, Request):
        return 0
    return len(json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


@memoize("accounting.part_order", 4096, scope="artifact")
def _order(name: str) -> tuple[int, int]:
    rank = {"template": 0, "system": 1, "tools": 2, "messages": 3, "documents": 4, "generation_prompt": 5}
    head = name.split("[", 1)[0]
    num = int(name[len(head) + 1 : -1]) if "[" in name else 0
    return rank.get(head, 6), num


def _tally(run: _Pass, gen: int | None, lay: Layout) -> tuple[list[int], list[str]]:
    """How many tokens each owner gets, and the owners' names: by segments (`_segments`, `tally_segments`) on the
    fast path, else each token's owner by each byte's (`_owners`, `assign_owners`, the reference)."""
    if fast_enabled() and lay.bounds is not None:
        try:
            points, seg_owner, names = _segments(run, gen, lay.offsets)
        except _Overlap:
            pass
        else:
            return tally_segments(points, seg_owner, lay.bounds, len(names)), names
    owner, names = _owners(run, gen, lay.offsets)
    assigned = assign_owners(owner, lay.starts, lay.ends)
    return np.bincount(assigned, minlength=len(names)).tolist(), names


@dataclass(frozen=True, slots=True)
class Layout:
    """One request's tokens laid over its rendered text: token t covers bytes [starts[t], ends[t]) of the text,
    and `offsets[c]` is the byte offset of character c."""

    request: Request
    rendered: Rendered
    ids: np.ndarray
    control: tuple[ControlMatch, ...] | None  # the control tokens' matches; None when the lay did not need them
    offsets: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    exact: bool
    bounds: np.ndarray | None = None  # [0, ends...]: the tokens' boundaries, when laid end to end (`whole_lay`)

    def tokens_before(self, char: int) -> int:
        """How many tokens lie wholly before character `char`: the token prefix that ends there."""
        return int(np.searchsorted(self.ends, self.offsets[char], side="right"))


def layout(model: Pipeline, request: RequestLike, **options: Any) -> Layout:
    """Render and encode a request (the ids of `encode`) and lay its tokens over the rendered text."""
    check_options(options, RENDER_OPTIONS, "layout")
    parse_options = {k: options[k] for k in ("dialect", "utf8", "tool_arguments") if k in options}
    render_options = {k: v for k, v in options.items() if k not in parse_options}
    req = model.parse(request, **parse_options)
    return layout_of(model.tokenizer, req, model.render(req, **render_options))


def layout_of(tokenizer: Any, request: Request, rendered: Rendered) -> Layout:
    """The lay of an already rendered request (a fitted or compacted one, a record's): its ids as the tokenizer
    stage gives them, each token's bytes over the text."""
    ids = encode_ids(rendered, tokenizer)
    data = rendered.text.encode("utf-8", "surrogatepass")  # a lone surrogate: three bytes, as tokenizers see it
    offsets = _char_to_byte(rendered.text, data)
    laid = whole_lay(tokenizer, rendered, ids, data)  # the fast path: from the ids alone
    if laid is not None:
        return Layout(request, rendered, ids, None, offsets, laid[:-1], laid[1:], True, laid)
    control = control_matches(rendered, tokenizer)
    try:
        starts, ends, exact = token_ranges(tokenizer, rendered.text, ids, control, offsets)
    except Unaligned:
        lay = spread(np.ones(len(ids), dtype=np.int64), int(offsets[-1]))
        starts, ends, exact = lay[:-1], lay[1:], False
    return Layout(request, rendered, ids, control, offsets, starts, ends, exact)


def count(model: Pipeline, request: RequestLike, *, marginal: bool = False, **options: Any) -> Counts:
    """Attribute every token of the request's `input_ids` to one part (see the module docstring). Takes `render`'s
    options. `marginal=True` also renders and tokenizes the request once without each part."""
    lay = layout(model, request, **options)
    render_options = {k: v for k, v in options.items() if k not in ("dialect", "utf8", "tool_arguments")}
    run = _Pass(lay.request, lay.rendered, lay.ids, lay.control or ())
    gen = _generation_start(model, run.request, run, render_options)
    exact = lay.exact
    tally, names = _tally(run, gen, lay)
    notes: list[str] = []
    if not exact:
        notes.append("token bytes were spread in proportion over some runs: per-part counts are approximate")
    if not run.rendered.provenance_exact:
        notes.append("the render's provenance is inexact: a request part may be counted as template, and unseen")
    parts = [Part(names[i], tally[i]) for i in range(len(names)) if tally[i] or names[i] == TEMPLATE]
    seen_parts = {p.part for p in parts}
    for name in names:  # a part with bytes but no token of its own (every token it touched went elsewhere)
        if name not in seen_parts:
            parts.append(Part(name, 0))
    parts.sort(key=lambda p: _order(p.part))
    documents = _document_blocks(run.request)
    notes += [f"{d}: a document block; the provider's own token count for it is unknown" for d in documents]
    total = len(run.ids)
    if marginal:
        parts = [_with_marginal(model, request, p, total, options) for p in parts]
    return Counts(
        total=total,
        parts=tuple(parts),
        unseen=_unseen(run.request, run),
        exact_bytes=exact,
        provenance_exact=run.rendered.provenance_exact,
        marginal=marginal,
        notes=tuple(notes),
        source=request,
        provider_unknown=documents,
    )


def runs(model: Pipeline, request: RequestLike, **options: Any) -> tuple[tuple[str, int], ...]:
    """The request's tokens in input order as runs of one owner: (part, tokens) for each stretch of consecutive
    tokens `count` attributes to the same part (the template's text between parts is its own `template` runs).
    The runs' tokens per part are `count`'s; their order is where the tokens sit, which a prompt cache needs."""
    lay = layout(model, request, **options)
    render_options = {k: v for k, v in options.items() if k not in ("dialect", "utf8", "tool_arguments")}
    run = _Pass(lay.request, lay.rendered, lay.ids, lay.control or ())
    gen = _generation_start(model, run.request, run, render_options)
    owner, names = _owners(run, gen, lay.offsets)
    assigned = assign_owners(owner, lay.starts, lay.ends).tolist()
    out: list[tuple[str, int]] = []
    for k in assigned:
        if out and out[-1][0] == names[k]:
            out[-1] = (names[k], out[-1][1] + 1)
        else:
            out.append((names[k], 1))
    return tuple(out)


def _document_blocks(request: Request) -> tuple[str, ...]:
    """The JSON paths of the request's document blocks (content parts of type "document")."""
    return tuple(
        m.path_of(f".content[{j}]")
        for m in request.messages
        if isinstance(m.content, tuple)
        for j, part in enumerate(m.content)
        if part.get("type") == "document"
    )


def with_images(counts: Counts, mm: MultimodalInput) -> Counts:
    """`counts` of the unexpanded render, with each image's placeholder expanded: the one placeholder token the
    template wrote (counted as the template's) becomes the image's tokens, owned by the message holding the image.
    The image counts come from the headers alone (`Model.run_images(decode=False)`)."""
    tally = {p.part: p.tokens for p in counts.parts}
    media = (*mm.images, *mm.videos)
    for image in media:
        tally[TEMPLATE] = tally.get(TEMPLATE, 0) - 1
        part = part_of(image.ref.path)
        tally[part] = tally.get(part, 0) + image.n_tokens
    added = len(mm.added.before) + len(mm.added.after)  # an HF processor's BOS/EOS: the template's share
    tally[TEMPLATE] = tally.get(TEMPLATE, 0) + added
    total = counts.total + added + sum(image.n_tokens - 1 for image in media)
    if total != len(mm.ids) or tally.get(TEMPLATE, 0) < 0:
        raise CtxlockError(
            f"the image counts do not add up: {total} tokens counted, {len(mm.ids)} expanded",
            path="images",
            hint="report this request and template",
        )
    images = sorted(
        tuple(
            {"index": s.index, "part": part_of(s.path), "path": s.path, "span": [s.start, s.end], **_image_plan(im)}
            for s, im in zip(mm.spans, mm.images, strict=True)
        )
        + tuple(
            {"index": s.index, "kind": "video", "part": part_of(s.path), "path": s.path, "span": [s.start, s.end]}
            | _video_plan(v)
            for s, v in zip(mm.video_spans, mm.videos, strict=True)
        ),
        key=lambda d: d["span"][0],
    )
    note = "image tokens are exact, from each image's header alone (nothing decoded)"
    parts = tuple(sorted((Part(k, v) for k, v in tally.items()), key=lambda p: _order(p.part)))
    return replace(counts, total=total, parts=parts, images=tuple(images), notes=(*counts.notes, note))


def _video_plan(video: VideoInput) -> dict[str, Any]:
    plan = video.plan.to_json()
    frames = [f.header.sha256 for f in video.frames]
    return {"tokens": video.n_tokens, "frames": frames, "grid": plan["grid"], "steps": plan["steps"]}


def _image_plan(image: ImageInput) -> dict[str, Any]:
    plan = image.plan.to_json()
    return {"tokens": image.n_tokens, "sha256": image.header.sha256, "grid": plan["grid"], "steps": plan["steps"]}


# -- marginal costs --------------------------------------------------------------------------------------------


def _raw(request: RequestLike) -> Any:
    if isinstance(request, bytes | str):  # the request as sent: the strict reader, as `count` read it
        data = request.encode("utf-8", "surrogatepass") if isinstance(request, str) else request
        text, _ = decode_bytes(data, Utf8Policy.REPLACE)
        return loads_strict(text, "request", Utf8Policy.REPLACE)
    if isinstance(request, Mapping):
        return json.loads(json.dumps(request))
    return None


def without(request: RequestLike, part: str) -> Any:
    """The request as sent, without one part: a copy of the JSON object with `system`, `tools[i]`, `messages[j]` or
    `documents[k]` removed (an emptied `tools` or `documents` list is removed with it)."""
    raw = _raw(request)
    if not isinstance(raw, dict):
        raise RequestError("a marginal cost needs the request as JSON, not a parsed Request", path="request")
    if part == "system":
        raw.pop("system", None)
        return raw
    m = re.fullmatch(r"(tools|messages|documents)\[(\d+)\]", part)
    if m is None:
        raise RequestError(f"no part {part!r} to remove", path=part)
    key, i = m.group(1), int(m.group(2))
    items = raw.get(key)
    if not isinstance(items, list) or i >= len(items):
        raise RequestError(f"no part {part!r} to remove", path=part)
    del items[i]
    if not items and key != "messages":
        raw.pop(key)
    return raw


def _with_marginal(model: Pipeline, request: RequestLike, p: Part, total: int, options: Mapping[str, Any]) -> Part:
    if p.part == TEMPLATE:
        return Part(p.part, p.tokens, None, "the template's own text is not a part of the request")
    try:
        if p.part == GENERATION_PROMPT:
            smaller = model.encode(request, **{**options, "add_generation_prompt": False})
        else:
            smaller = model.encode(without(request, p.part), **options)
    except CtxlockError as exc:
        return Part(p.part, p.tokens, None, f"the request without it does not render: {exc}")
    return Part(p.part, p.tokens, total - len(smaller["input_ids"][0]))


_PROVIDER_NAMES = {"anthropic": "Anthropic", "openai": "OpenAI"}


def count_format(counts: Counts, provider: str, *, counted_by: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The count in a provider's count-tokens response shape: Anthropic's `{"input_tokens": N}` or OpenAI's
    `{"object": "response.input_tokens", "input_tokens": N}`.

    `counted_by` (the model, tokenizer and template that counted) marks the count as another model's, standing in
    for the provider's: the shape then adds `"exact": false`, `counted_by` and a note, so that a model's count is
    never dressed as the provider's own number (`ctxlock count --format`; a served model answering for itself passes
    none). See docs/closed-providers.md."""
    if provider not in _PROVIDER_NAMES:
        raise RequestError(f"unknown count format {provider!r}", path="--format", hint="anthropic or openai")
    out: dict[str, Any] = {"object": "response.input_tokens"} if provider == "openai" else {}
    out["input_tokens"] = counts.total
    if counted_by is not None:
        out["exact"] = False
        out["counted_by"] = dict(counted_by)
        out["note"] = (
            f"{counted_by.get('model', 'the model')}'s input under its own template and tokenizer, not "
            f"{_PROVIDER_NAMES[provider]}'s count (its tokenizer is not public)"
        )
    if provider == "anthropic" and counts.provider_unknown:  # never a guess dressed as the provider's number
        out |= {"exact": False, "unknown": list(counts.provider_unknown)}
    return out


__all__ = [
    "GENERATION_PROMPT",
    "TEMPLATE",
    "Counts",
    "Layout",
    "Part",
    "assign_owners",
    "count",
    "count_format",
    "layout",
    "layout_of",
    "part_of",
    "unseen_parts",
    "unseen_warnings",
    "with_images",
    "without",
]
