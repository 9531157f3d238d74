"""Exact per-part token counts: which part of the request every token of `input_ids` came from (seed 001).

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
and tokenized in full, subtracted from the total (seed 001's "14 → 403 from one tool definition"). A part whose
removal makes the request invalid (a tool result without its call) gets no marginal, with the reason.

**Unseen parts.** A request part the template never wrote (a `documents` list a template ignores, a `name`, a
reasoning field) leaves no byte in the rendered text: the model never sees it. `Counts.unseen` names each one by its
path, so `count`, `render` and `fit` can say so instead of reporting a silent 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .caches import LRU
from .errors import CtxlockError, RequestError
from .options import RENDER_OPTIONS, check_options
from .request import Request
from .settings import cache_root, fast_enabled
from .template import Rendered
from .tokenizer import ControlMatch, control_matches, encode_ids
from .tokenizer.runs import run_encoder
from .tokenizer.token_bytes import token_bytes

RequestLike = Request | Mapping[str, Any] | str | bytes


class Model(Protocol):
    """What counting needs of a model: `ctxlock.Model` is one (its `count` method calls `count` here). A protocol,
    so that this stage sits below the facade in the layer order."""

    @property
    def id(self) -> str: ...
    @property
    def tokenizer(self) -> Any: ...
    def parse(self, request: Any, **options: Any) -> Request: ...
    def render(self, request: Any, *args: Any, **options: Any) -> Rendered: ...
    def encode(self, request: Any, *args: Any, **options: Any) -> Any: ...


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
    request_bytes: int  # the size of the request as sent (Pi's maxRequestBytes), or of its compact JSON
    exact_bytes: bool  # every token's bytes were laid exactly (else spread in proportion; see the module doc)
    provenance_exact: bool  # the render knew where every request character went (else `unseen` may be incomplete)
    marginal: bool = False
    notes: tuple[str, ...] = field(default=())

    def tokens(self, part: str) -> int:
        return sum(p.tokens for p in self.parts if p.part == part)

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "parts": [p.to_dict(with_marginal=self.marginal) for p in self.parts],
            "unseen": list(self.unseen),
            "request_bytes": self.request_bytes,
            "exact_bytes": self.exact_bytes,
            "provenance_exact": self.provenance_exact,
            "notes": list(self.notes),
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


def _char_to_byte(text: str) -> np.ndarray:
    """offsets[i] = the UTF-8 byte offset of character i (offsets[len(text)] = the byte length)."""
    n = len(text)
    if text.isascii():
        return np.arange(n + 1, dtype=np.int64)
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    widths = 1 + (cps >= 0x80).astype(np.int64) + (cps >= 0x800) + (cps >= 0x10000)
    out = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(widths, out=out[1:])
    return out


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


# -- token byte ranges -----------------------------------------------------------------------------------------

_PIECES: LRU[str, Any] = LRU("accounting.token_bytes", max_items=8, scope="artifact")


class _Pieces:
    """A vocabulary's bytes per id, built on first use, and their lengths as an array (one lookup per id, in
    numpy). The lengths are all the one-pass lay needs, so they are kept on disk by the tokenizer's digest
    (`<cache>/token-lengths/`): a later process lays tokens without building the vocabulary's bytes (about 4 s
    for a 150k-token `tokenizer.json`). A missing, unreadable or mismatched file counts as absent."""

    __slots__ = ("_pieces", "lengths", "tokenizer")

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._pieces: tuple[bytes, ...] | None = None
        path = _lengths_path(tokenizer.sha256)
        lengths = None
        with contextlib.suppress(OSError, ValueError):
            lengths = np.load(path, allow_pickle=False)
        if lengths is None or lengths.dtype != np.int64 or lengths.shape != (tokenizer.vocab_size,):
            lengths = np.fromiter((len(b) for b in self.pieces), dtype=np.int64, count=len(self.pieces))
            _store_lengths(path, lengths)
        self.lengths = lengths

    @property
    def pieces(self) -> tuple[bytes, ...]:
        if self._pieces is None:
            self._pieces = token_bytes(self.tokenizer).pieces
        return self._pieces

    def __getitem__(self, i: int) -> bytes:
        return self.pieces[i]


_LENGTHS_VERSION = "1"


def _lengths_path(sha256: str) -> Path:
    return cache_root() / "token-lengths" / f"{sha256}-{_LENGTHS_VERSION}.npy"


def _store_lengths(path: Path, lengths: np.ndarray) -> None:
    """Write atomically; a cache that cannot be written is not an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npy", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, lengths, allow_pickle=False)
        os.replace(tmp, path)
    except OSError:
        return


def _pieces(model: Model) -> Any:
    tok = model.tokenizer
    hit = _PIECES.get(tok.sha256)
    if hit is None:
        try:
            hit = _Pieces(tok)
        except CtxlockError:
            hit = False  # no per-token bytes (WordPiece): spread in proportion
        _PIECES.put(tok.sha256, hit)
    return hit


def _token_ranges(model: Model, run: _Pass, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Each token's [start, end) in the rendered text's bytes, and whether every run was laid exactly: in one pass
    over the ids when their bytes spell the text between the control tokens (byte-level BPE, tiktoken, Tekken),
    else run by run (`_replay_runs`, the reference path: `CTXLOCK_FAST=0` takes it always)."""
    pieces = _pieces(model)
    if pieces is not False and fast_enabled():
        laid = _walk(run, offsets, pieces)
        if laid is not None:
            return laid[0], laid[1], True
    return _replay_runs(model, run, offsets, pieces)


def _walk(run: _Pass, offsets: np.ndarray, pieces: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Lay every token's bytes end to end, each control token over its own match (which may be longer than its
    content: lstrip/rstrip take whitespace), without encoding anything again. None when the bytes do not line up
    with the text (a normalizer, a dummy prefix): the run-by-run replay then takes over.

    The k-th control token's match starts at byte s_k of the text; laid end to end, the tokens before it cover
    s_k - shift_k bytes, where shift_k sums (match length - content length) over the control tokens before it. So
    its position is where the cumulative lengths reach s_k - shift_k, and its id must be there."""
    ids = np.asarray(run.ids, dtype=np.int64)
    n = len(ids)
    lengths = pieces.lengths[ids]
    cum = np.concatenate(([0], np.cumsum(lengths)))
    if run.control:
        starts = offsets[[m.start for m in run.control]]
        ends = offsets[[m.end for m in run.control]]
        control_ids = np.fromiter((m.id for m in run.control), dtype=np.int64, count=len(run.control))
        extra = (ends - starts) - pieces.lengths[control_ids]
        shifts = np.concatenate(([0], np.cumsum(extra)))
        pos = np.searchsorted(cum, starts - shifts[:-1], side="left")
        if pos.max() >= n or not (ids[pos] == control_ids).all() or (np.diff(pos) <= 0).any():
            return None  # an empty token before a control token, or bytes that do not line up
        if not (cum[pos] == starts - shifts[:-1]).all():
            return None
        # the shift in force at each position: control k's extra applies from the token after it
        delta = np.zeros(n + 1, dtype=np.int64)
        np.add.at(delta, pos + 1, extra)
        delta = np.cumsum(delta)
        total_shift = int(shifts[-1])
    else:
        delta = np.zeros(n + 1, dtype=np.int64)
        total_shift = 0
    if cum[n] + total_shift != offsets[-1]:
        return None
    # a token ends where the next begins: a control token's end is its match's end
    return cum[:-1] + delta[:-1], cum[1:] + delta[1:]


def _replay_runs(model: Model, run: _Pass, offsets: np.ndarray, pieces: Any) -> tuple[np.ndarray, np.ndarray, bool]:
    text, ids = run.rendered.text, run.ids
    encode = run_encoder(model.tokenizer)
    starts = np.zeros(len(ids), dtype=np.int64)
    ends = np.zeros(len(ids), dtype=np.int64)
    k, pos, exact = 0, 0, True
    for m in [*run.control, None]:
        stop = len(text) if m is None else m.start
        if stop > pos:
            run_ids = encode(text[pos:stop], pos == 0)
            n = len(run_ids)
            if tuple(ids[k : k + n].tolist()) != tuple(run_ids):
                raise _Unaligned
            lay = _lay(run_ids, pieces, text[pos:stop])
            exact &= lay[1]
            base = offsets[pos]
            starts[k : k + n] = base + lay[0][:-1]
            ends[k : k + n] = base + lay[0][1:]
            k += n
        if m is not None:
            starts[k], ends[k] = offsets[m.start], offsets[m.end]
            k += 1
            pos = m.end
    if k != len(ids):
        raise _Unaligned
    return starts, ends, exact


class _Unaligned(Exception):
    """The run-by-run replay does not give the tokenized ids: fall back to spreading the whole text."""


def _lay(run_ids: Sequence[int], pieces: Any, run_text: str) -> tuple[np.ndarray, bool]:
    """Cumulative byte offsets of a run's tokens within the run (n + 1 values), and whether they are exact.

    The tokens' bytes are laid over the run as they are; or over the run without SentencePiece's dummy-prefix space;
    or over the run's Unicode normalization (NFC, NFKC, NFD, NFKD: what normalizers such as Qwen2's NFC do), mapped
    back to the run's own bytes one normalization chunk at a time (a starter and the marks that follow it)."""
    size = len(run_text.encode("utf-8", "surrogatepass"))
    if pieces is False:
        return _spread(np.ones(len(run_ids), dtype=np.int64), size), False
    lengths = pieces.lengths[np.asarray(run_ids, dtype=np.int64)]
    laid = _lay_over(lengths, run_ids, pieces, run_text, size)
    if laid is not None:
        return laid, True
    for form in ("NFC", "NFKC", "NFD", "NFKD"):
        chunks = _chunks(run_text, form)
        if chunks is None:
            continue
        normalized = sum(n for _, n in chunks)
        laid = _lay_over(lengths.copy(), run_ids, pieces, None, normalized)
        if laid is not None:
            return _map_back(laid, chunks), True
    return _spread(lengths, size), False


def _lay_over(
    lengths: np.ndarray, run_ids: Sequence[int], pieces: Any, run_text: str | None, size: int
) -> np.ndarray | None:
    total = int(lengths.sum())
    if total == size:
        return np.concatenate(([0], np.cumsum(lengths)))
    extra = total - size
    # SentencePiece's dummy prefix: one space the text does not have, in front of the run's first token.
    starts_with_space = run_text is not None and run_text.startswith(" ")
    if (
        len(run_ids)
        and 0 < extra <= lengths[0]
        and pieces[run_ids[0]][:extra] == b" " * extra
        and not starts_with_space
    ):
        lengths[0] -= extra
        return np.concatenate(([0], np.cumsum(lengths)))
    return None


def _chunks(text: str, form: str) -> list[tuple[int, int]] | None:
    """(bytes in the text, bytes once normalized) per normalization chunk, or None when the form changes nothing or
    the chunks do not normalize independently."""
    whole = unicodedata.normalize(form, text)
    if whole == text:
        return None
    chunks: list[tuple[int, int]] = []
    pieces: list[str] = []
    start = 0
    for i in range(1, len(text) + 1):
        if i == len(text) or unicodedata.combining(text[i]) == 0:
            chunk = text[start:i]
            norm = unicodedata.normalize(form, chunk)
            pieces.append(norm)
            chunks.append((len(chunk.encode("utf-8", "surrogatepass")), len(norm.encode("utf-8", "surrogatepass"))))
            start = i
    return chunks if "".join(pieces) == whole else None


def _map_back(laid: np.ndarray, chunks: list[tuple[int, int]]) -> np.ndarray:
    """Offsets in the normalized bytes -> offsets in the original bytes: a boundary inside a chunk's normalized
    bytes moves to the end of that chunk's original bytes (a chunk is one character and its marks)."""
    orig = np.concatenate(([0], np.cumsum([c[0] for c in chunks])))
    norm = np.concatenate(([0], np.cumsum([c[1] for c in chunks])))
    k = np.searchsorted(norm, laid, side="left")
    return orig[np.minimum(k, len(orig) - 1)]


def _spread(lengths: np.ndarray, size: int) -> np.ndarray:
    weights = np.maximum(lengths, 1).astype(np.float64)
    cum = np.concatenate(([0.0], np.cumsum(weights)))
    return np.floor(cum / cum[-1] * size + 0.5).astype(np.int64)


def assign_owners(owner: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The owner of most of each token's bytes; ties to the owner met first. A token with no bytes (a control
    token that consumed nothing, an empty piece) takes the owner of the byte it sits at."""
    n = len(starts)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    size = len(owner)
    at = np.clip(starts, 0, max(size - 1, 0))
    result = owner[at] if size else np.zeros(n, dtype=np.int32)
    if size == 0:
        return result
    change = np.flatnonzero(np.diff(owner)) + 1  # byte offsets where the owner changes
    # a token is mixed when a change point falls strictly inside it
    first_after = np.searchsorted(change, starts, side="right")
    mixed = np.flatnonzero((first_after < len(change)) & (change[np.minimum(first_after, len(change) - 1)] < ends))
    for t in mixed.tolist():
        tally: dict[int, int] = {}  # insertion order is the order met
        for v in owner[starts[t] : ends[t]].tolist():
            tally[v] = tally.get(v, 0) + 1
        result[t] = max(tally, key=tally.__getitem__)  # max keeps the first of equal counts
    return result


# -- the generation prompt -------------------------------------------------------------------------------------


def _generation_start(model: Model, req: Request, run: _Pass, options: Mapping[str, Any]) -> int | None:
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
        last = max((sp.end for sp in run.rendered.request_spans), default=0)
        if suffix and text.endswith(suffix) and last <= len(text) - len(suffix):
            return len(text) - len(suffix)
    without = model.render(req, **{**options, "add_generation_prompt": False}).text
    if len(without) < len(text) and text.startswith(without):
        return len(without)
    return None


_SUFFIXES: LRU[str, str] = LRU("accounting.generation_suffix", max_items=256, scope="artifact")
_PROBES = (
    ({"role": "user", "content": "x"},),
    ({"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}),
)


def _probed_suffix(model: Model, rendered: Rendered, options: Mapping[str, Any]) -> str:
    """The text `add_generation_prompt` appends, when it is the same for both probe conversations; else ""."""
    rest = {k: v for k, v in options.items() if k not in ("template", "add_generation_prompt")}
    key = json.dumps([rendered.template.sha256, model.id, rest], sort_keys=True, default=repr)
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

        def origin(suffix: str, src: str = src, origins: Any = origins) -> str:
            return origins.get(suffix, f"{src}{suffix}")

        if isinstance(m.content, str):
            if m.content:
                out.append(origin(".content"))
        elif m.content:
            for i, p in enumerate(m.content):
                if p.get("type") == "text" and p.get("text"):
                    out.append(origin(f".content[{i}].text"))
        for i, call in enumerate(m.tool_calls or ()):
            out.append(call.source or origin(f".tool_calls[{i}]"))
        if m.name:
            out.append(origin(".name"))
        if m.reasoning_content:
            out.append(origin(".reasoning_content"))
    out += [f"tools[{i}]" for i in range(len(req.tools or ()))]
    out += [f"documents[{i}]" for i in range(len(req.documents or ()))]
    return out


def _unseen(req: Request, run: _Pass) -> tuple[str, ...]:
    """The expected paths no span path equals or lies under."""
    written: set[str] = set()
    for span in run.rendered.request_spans:
        path = span.path
        if path in written:
            continue
        written.add(path)
        for k, ch in enumerate(path):
            if ch in ".[":
                written.add(path[:k])
    return tuple(p for p in _expected(req) if p not in written)


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


def _order(name: str) -> tuple[int, int]:
    rank = {"template": 0, "system": 1, "tools": 2, "messages": 3, "documents": 4, "generation_prompt": 5}
    head = name.split("[", 1)[0]
    num = int(name[len(head) + 1 : -1]) if "[" in name else 0
    return rank.get(head, 6), num


@dataclass(frozen=True, slots=True)
class Layout:
    """One request's tokens laid over its rendered text: token t covers bytes [starts[t], ends[t]) of the text,
    and `offsets[c]` is the byte offset of character c."""

    request: Request
    rendered: Rendered
    ids: np.ndarray
    control: tuple[ControlMatch, ...]
    offsets: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    exact: bool

    def tokens_before(self, char: int) -> int:
        """How many tokens lie wholly before character `char`: the token prefix that ends there."""
        return int(np.searchsorted(self.ends, self.offsets[char], side="right"))


def layout(model: Model, request: RequestLike, **options: Any) -> Layout:
    """Render and encode a request (the ids of `encode`) and lay its tokens over the rendered text."""
    check_options(options, RENDER_OPTIONS, "layout")
    parse_options = {k: options[k] for k in ("dialect", "utf8", "tool_arguments") if k in options}
    render_options = {k: v for k, v in options.items() if k not in parse_options}
    req = model.parse(request, **parse_options)
    rendered = model.render(req, **render_options)
    run = _Pass(req, rendered, encode_ids(rendered, model.tokenizer), control_matches(rendered, model.tokenizer))
    offsets = _char_to_byte(rendered.text)
    try:
        starts, ends, exact = _token_ranges(model, run, offsets)
    except _Unaligned:
        lay = _spread(np.ones(len(run.ids), dtype=np.int64), int(offsets[-1]))
        starts, ends, exact = lay[:-1], lay[1:], False
    return Layout(req, rendered, run.ids, run.control, offsets, starts, ends, exact)


def count(model: Model, request: RequestLike, *, marginal: bool = False, **options: Any) -> Counts:
    """Attribute every token of the request's `input_ids` to one part (see the module docstring). Takes `render`'s
    options. `marginal=True` also renders and tokenizes the request once without each part."""
    lay = layout(model, request, **options)
    render_options = {k: v for k, v in options.items() if k not in ("dialect", "utf8", "tool_arguments")}
    run = _Pass(lay.request, lay.rendered, lay.ids, lay.control)
    gen = _generation_start(model, run.request, run, render_options)
    owner, names = _owners(run, gen, lay.offsets)
    starts, ends, exact = lay.starts, lay.ends, lay.exact
    notes: list[str] = []
    if not exact:
        notes.append("token bytes were spread in proportion over some runs: per-part counts are approximate")
    if not run.rendered.provenance_exact:
        notes.append("the render's provenance is inexact: a request part may be counted as template, and unseen")
    assigned = assign_owners(owner, starts, ends)
    tally = np.bincount(assigned, minlength=len(names))
    parts = [Part(names[i], int(tally[i])) for i in range(len(names)) if tally[i] or names[i] == TEMPLATE]
    seen_parts = {p.part for p in parts}
    for name in names:  # a part with bytes but no token of its own (every token it touched went elsewhere)
        if name not in seen_parts:
            parts.append(Part(name, 0))
    parts.sort(key=lambda p: _order(p.part))
    total = len(run.ids)
    if marginal:
        parts = [_with_marginal(model, request, p, total, options) for p in parts]
    return Counts(
        total=total,
        parts=tuple(parts),
        unseen=_unseen(run.request, run),
        request_bytes=_request_bytes(request),
        exact_bytes=exact,
        provenance_exact=run.rendered.provenance_exact,
        marginal=marginal,
        notes=tuple(notes),
    )


# -- marginal costs --------------------------------------------------------------------------------------------


def _raw(request: RequestLike) -> Any:
    if isinstance(request, bytes | str):
        return json.loads(request)
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


def _with_marginal(model: Model, request: RequestLike, p: Part, total: int, options: Mapping[str, Any]) -> Part:
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


def count_format(counts: Counts, provider: str) -> dict[str, Any]:
    """The count in a provider's count-tokens response shape: Anthropic's `{"input_tokens": N}` or OpenAI's
    `{"object": "response.input_tokens", "input_tokens": N}`."""
    if provider == "anthropic":
        return {"input_tokens": counts.total}
    if provider == "openai":
        return {"object": "response.input_tokens", "input_tokens": counts.total}
    raise RequestError(f"unknown count format {provider!r}", path="--format", hint="anthropic or openai")


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
    "part_of",
    "unseen_parts",
    "unseen_warnings",
    "without",
]
