"""The rows of a `ctxlock batch` shard: request -> (canonical digest, ids, assistant mask), one row after another.

`mask_rows(model, requests, options)` is the one entry point. Each row is exactly what
`Model.encode(request, return_assistant_tokens_mask=True, mask_options=options)`
gives (`add_generation_prompt` False): the
same ids, the same mask, the same notes, and the same error (a `CtxlockError`, given back in the row's place, not
raised) for a row that fails.

- **Reference path** (`CTXLOCK_FAST=0`): `model.parse`, then `masks.assistant_mask` (which renders, encodes with
  `tokenizer.encode_ids` and lays the tokens with `accounting.layout`).
- **Fast path**: the same parse and render (the render options checked and built once per call, not per row:
  `Model.render` then takes the `RenderOptions` as they are); the ids from the whole-text encoder *without its prefix
  cache* (`WholeText.encode_prepared` from byte 0, `cache=False`), and the lay from those ids alone
  (`tokenlay.whole_lay`), then `masks.mask_of` on that lay. The prefix cache is what makes `encode_ids` fast on a chat
  that grows turn by turn; a shard's rows are unrelated conversations that mostly share only the system prompt, so
  looking each one up among the cached texts and storing it there cost about five times the native encode itself
  (measured: 0.28 ms against 0.04 ms for a 500-token row). Why the ids are equal: `encode_ids` with a cache entry keeps
  the entry's ids up to a cut where the encoder's state is proved to restart, and encodes the rest natively; with no
  entry it encodes the whole text natively, which is what this path does (the prefix cache's own equality claim, tested
  in tests/tokenizer/test_prefix.py). When the whole-text encoder does not apply (request text at a control-token
  position under the `text` policy, a lone surrogate, a normalizing vocabulary) or `whole_lay` cannot lay the ids, the
  row takes the reference path's `encode_ids` and `accounting.layout_of`.
- **Stage by stage, `_CHUNK` rows at a time** (`_planned_rows`): every parse of the chunk, every render, the
  encodes, then each row's lay, mask and digest. Each row meets the same calls in the same order as row by row
  (`_planned_row`), so the same row or error; one stage's code and tables stay in the CPU's caches across the chunk,
  and the chunk's texts are encoded in one fastokens call once it is admitted (`WholeText.encode_many`: each text's
  ids are those of its own call), laid (`tokenlay.whole_lays`) and masked (`masks.masks_of`) at once. Measured on
  the benchmark's rows (`batch.shard_bytes`, 4,000 rows, 64 a chunk against 1): a fifth to a third less time a row.
  An error that is not a `CtxlockError` (a bug) is raised before the chunk's earlier rows are given.
- **fastokens, at once for a big shard**: the tokenizer starts building fastokens (about ten times tiktoken, and
  admitted only once it matched the exact path on the vocabulary) after `accel_start_after()` characters (8M) went
  through tiktoken, so that a short job does not pay for the build. A shard whose requests alone are that long
  (JSON bytes, about the rendered characters) pays for it, so `mask_rows` starts it then. The ids are the same.
  The mask's regions go through `_fastmask.region_mask` (inside `masks`).

tests/training/test_masks_batch.py proves the two paths equal (ids, masks, notes, errors) on the conformance
conversations and on generated rows (hypothesis).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctxlock.accounting import Layout, layout_of, whole_lay, whole_lays
from ctxlock.errors import CtxlockError
from ctxlock.pipeline import Pipeline
from ctxlock.settings import call_fast, fast_enabled
from ctxlock.template import RENDER_OPTIONS, RenderOptions, check_options
from ctxlock.tokenizer import accel_setting, accel_start_after, whole_text_encoder
from ctxlock.training import MaskOptions, assistant_mask, mask_of, masks_of

_RENDER = {"add_generation_prompt": False}
_PARSE = ("dialect", "utf8", "tool_arguments")  # the options `accounting.layout` passes to `Model.parse`
_CHUNK = 64  # rows the fast path takes stage by stage (`_planned_rows`)


@dataclass(frozen=True, slots=True)
class MaskedRow:
    """One row: the sha256 of its canonical request (`Request.to_json()`), its ids (int64), its assistant mask (0/1
    int64, one per id) and what the mask says a reader must know (`Mask.notes`)."""

    request_sha256: str
    ids: np.ndarray
    mask: np.ndarray
    notes: tuple[str, ...]


def mask_rows(
    model: Pipeline, requests: Iterable[Any], options: MaskOptions, **render_options: Any
) -> Iterator[MaskedRow | CtxlockError]:
    """Each request (what `Model.parse` takes) as a `MaskedRow`, or the `CtxlockError` it fails with, in order (the
    fast path reads and makes `_CHUNK` rows at a time: a shard is never held twice in memory). `render_options`:
    `Model.render`'s keywords (`add_generation_prompt` False unless given; `ctxlock batch` gives none). See the
    module docstring."""
    fast = fast_enabled()
    render = {**_RENDER, **render_options}
    plan = _plan(render) if fast else None
    if fast and isinstance(requests, Sequence):
        _start_accelerator(model.tokenizer, requests)
    if plan is not None:  # the fast paths are on: the rows' own checks need not read the environment
        for chunk in _chunks(requests):
            yield from call_fast(_planned_rows, model, chunk, options, plan)
        return
    for request in requests:
        try:
            yield (_fast_row if fast else _reference_row)(model, request, options, render)
        except CtxlockError as exc:
            yield exc


def _chunks(requests: Iterable[Any]) -> Iterator[list[Any]]:
    """The requests in lists of `_CHUNK`, in order (an iterator is read a chunk at a time)."""
    it = iter(requests)
    while chunk := list(itertools.islice(it, _CHUNK)):
        yield chunk


def _start_accelerator(tokenizer: Any, requests: Sequence[Any]) -> None:
    """Start building fastokens now (on its daemon thread) when these requests alone are as much text as the
    tokenizer would otherwise encode with tiktoken before starting it (`accel_start_after()`): a big shard pays
    for the build itself, so it need not encode its first 8M characters at tiktoken's speed first. Same ids."""
    whole = tokenizer.whole_text
    accelerator = None if whole is None else whole.accelerator
    if accelerator is None or accelerator.state != "not started" or accel_setting() == "0":
        return
    size, limit = 0, accel_start_after()  # read from the environment once, not once a row
    for r in requests:
        size += len(r) if isinstance(r, str | bytes) else len(str(r))
        if size >= limit:
            accelerator.start()
            return


def _digest(request: Any) -> str:
    return request.json_sha256()  # sha256 of `to_json()` as UTF-8


def _parse_options(render: dict[str, Any]) -> dict[str, Any]:
    return {k: render[k] for k in _PARSE if k in render}


def _reference_row(model: Pipeline, raw: Any, options: MaskOptions, render: dict[str, Any]) -> MaskedRow:
    request = model.parse(raw, **_parse_options(render))
    lay, mask = assistant_mask(model, request, options, **render)
    return MaskedRow(_digest(request), lay.ids, mask.mask, mask.notes)


def _fast_row(model: Pipeline, raw: Any, options: MaskOptions, render: dict[str, Any]) -> MaskedRow:
    if render.get("continue_final_message"):  # refused by assistant_mask, before any work
        return _reference_row(model, raw, options, render)
    check_options(render, RENDER_OPTIONS, "layout")
    request = model.parse(raw, **_parse_options(render))
    model.refuse_images(request)  # as `Model.encode` refuses a row whose images it would not expand
    rendered = model.render(request, **{k: v for k, v in render.items() if k not in _PARSE})
    lay = _lay(model.tokenizer, request, rendered)
    mask = mask_of(model, lay, options, **render)
    return MaskedRow(_digest(request), lay.ids, mask.mask, mask.notes)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What every row of one `mask_rows` call shares, made once: the render keywords, the parse keywords and the
    `RenderOptions` they make (what `Model.render` builds from its keywords on every call)."""

    render: dict[str, Any]
    parse: dict[str, Any]
    options: RenderOptions


def _plan(render: dict[str, Any]) -> _Plan | None:
    """The shared plan, or None where a row must take `_fast_row` (which checks the options, and refuses them, row
    by row, as `Model.encode` does): `continue_final_message`, or options `Model.render` refuses."""
    if render.get("continue_final_message"):
        return None
    try:
        check_options(render, RENDER_OPTIONS, "layout")
        options = RenderOptions.from_kwargs(
            {k: v for k, v in render.items() if k not in _PARSE}, accepted=RENDER_OPTIONS, method="render"
        )
    except Exception:  # whatever it is, each row meets it again on `_fast_row`, as it always did
        return None
    return _Plan(render, _parse_options(render), options)


def _planned_row(model: Pipeline, raw: Any, options: MaskOptions, plan: _Plan) -> MaskedRow:
    """`_fast_row` with the options checked and built once for the shard (`_plan`): the same calls, so the same row.
    (`_planned_rows` makes these calls stage by stage over a chunk of rows.)"""
    request = model.parse(raw, **plan.parse)
    model.refuse_images(request)
    rendered = model.render(request, plan.options)
    lay = _lay(model.tokenizer, request, rendered)
    mask = mask_of(model, lay, options, **plan.render)
    return MaskedRow(_digest(request), lay.ids, mask.mask, mask.notes)


def _planned_rows(
    model: Pipeline, raws: list[Any], options: MaskOptions, plan: _Plan
) -> list[MaskedRow | CtxlockError]:
    """`_planned_row` of each raw request, made stage by stage over the chunk (every parse, then every render, the
    encodes, the lays, then each mask and digest) rather than row by row: each row meets the same calls in the same
    order, so the same row or the same error (a `CtxlockError` stops its row at the stage it is raised in, as it
    does `_planned_row`). One stage's code and tables stay in the CPU's caches across the chunk, the encodes are
    one native call (`_lays`) and the provenance masks one pass (`masks.masks_of`)."""
    tokenizer = model.tokenizer
    rows: list[Any] = []
    for raw in raws:
        try:
            request = model.parse(raw, **plan.parse)
            model.refuse_images(request)
            rows.append(request)
        except CtxlockError as exc:
            rows.append(exc)
    rendered: list[Any] = []
    for request in rows:
        if isinstance(request, CtxlockError):
            rendered.append(request)
            continue
        try:
            rendered.append(model.render(request, plan.options))
        except CtxlockError as exc:
            rendered.append(exc)
    lays = _lays(tokenizer, rows, rendered)
    laid = [lay for lay in lays if not isinstance(lay, CtxlockError)]
    masks = iter(masks_of(model, laid, options, **plan.render))
    out: list[MaskedRow | CtxlockError] = []
    for request, lay in zip(rows, lays, strict=True):
        mask = lay if isinstance(lay, CtxlockError) else next(masks)
        if isinstance(mask, CtxlockError):
            out.append(mask)
            continue
        try:
            out.append(MaskedRow(_digest(request), lay.ids, mask.mask, mask.notes))
        except CtxlockError as exc:
            out.append(exc)
    return out


def _lays(tokenizer: Any, requests: list[Any], rendered: list[Any]) -> list[Layout | CtxlockError]:
    """`_lay` of each (request, rendered) pair (an error stays in its place), made for the chunk at once: the native
    encodes of every text the whole-text encoder takes in one call (`WholeText.encode_many`: the same ids as one
    call each), their lays over the joined texts (`tokenlay.whole_lays`: each text's own `whole_lay`) and their
    character offsets in one pass (`_offsets_many`). What `_lay` and `_lay_ids` give, row by row."""
    whole = None
    texts: list[str] = []
    datas: list[bytes] = []
    batched: list[int] = []  # the rows whose ids `encode_many` makes
    for k, r in enumerate(rendered):
        if isinstance(r, CtxlockError):
            continue
        w = whole_text_encoder(r, tokenizer)
        if w is None or (whole is not None and w is not whole):
            continue
        try:
            data = r.text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: `_lay` takes the run-by-run path
            continue
        whole = w
        texts.append(r.text)
        datas.append(data)
        batched.append(k)
    laid: dict[int, tuple[np.ndarray, np.ndarray | None, np.ndarray]] = {}  # row -> ids, bounds, offsets
    if whole is not None:
        encoded = whole.encode_many(texts, datas)
        ok = [j for j, ids in enumerate(encoded) if ids is not None]
        picked = [rendered[batched[j]] for j in ok], [encoded[j] for j in ok], [datas[j] for j in ok]
        bounds = whole_lays(tokenizer, *picked)
        offsets = _offsets_many([texts[j] for j in ok], picked[2])
        laid = {batched[j]: (encoded[j], b, o) for j, b, o in zip(ok, bounds, offsets, strict=True)}
    taken = set(batched)
    out: list[Layout | CtxlockError] = []
    for k, (request, r) in enumerate(zip(requests, rendered, strict=True)):
        if isinstance(r, CtxlockError):
            out.append(r)
            continue
        try:
            if k not in taken:  # not the chunk's whole-text encoder's: `_lay` decides
                out.append(_lay(tokenizer, request, r))
            elif k in laid and laid[k][1] is not None:
                ids, cum, offsets_k = laid[k]
                out.append(Layout(request, r, ids, None, offsets_k, cum[:-1], cum[1:], True, cum))
            else:  # not encoded (`encode_many` gave None) or not laid (`whole_lay` gave None): as `_lay_ids`
                out.append(layout_of(tokenizer, request, r))
        except CtxlockError as exc:
            out.append(exc)
    return out


def _lay(tokenizer: Any, request: Any, rendered: Any) -> Layout:
    """`accounting.layout_of(tokenizer, request, rendered)`, with the ids encoded without the prefix cache."""
    whole = whole_text_encoder(rendered, tokenizer)
    if whole is None:
        return layout_of(tokenizer, request, rendered)
    text = rendered.text
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: encode_ids takes the run-by-run path
        return layout_of(tokenizer, request, rendered)
    return _lay_ids(tokenizer, request, rendered, whole.encode_prepared(text, data, None, 0, 0, cache=False), data)


def _lay_ids(tokenizer: Any, request: Any, rendered: Any, ids: np.ndarray | None, data: bytes) -> Layout:
    """`_lay`'s end, from the whole-text encoder's ids (None: it could not encode the text) and the text's UTF-8."""
    text = rendered.text
    if ids is None:
        return layout_of(tokenizer, request, rendered)
    laid = whole_lay(tokenizer, rendered, ids, data)
    if laid is None:
        return layout_of(tokenizer, request, rendered)
    return Layout(request, rendered, ids, None, _offsets(text, data), laid[:-1], laid[1:], True, laid)


def _offsets_many(texts: list[str], datas: list[bytes]) -> list[np.ndarray]:
    """`[_offsets(t, d) for t, d in zip(texts, datas)]` in one pass over the texts' bytes joined, each followed by a
    NUL (its end's start): text k's `len(t) + 1` starts are the next ones, less the byte where its bytes begin."""
    if len(texts) < 2:
        return [_offsets(t, d) for t, d in zip(texts, datas, strict=True)]
    joined = b"\0".join(datas) + b"\0"
    starts = (np.frombuffer(joined, dtype=np.int8) >= -64).nonzero()[0].astype(np.int64, copy=False)
    out = []
    char = byte = 0
    for t, d in zip(texts, datas, strict=True):
        out.append(starts[char : char + len(t) + 1] - byte)
        char += len(t) + 1
        byte += len(d) + 1
    return out


def _offsets(text: str, data: bytes) -> np.ndarray:
    """offsets[i] = the UTF-8 byte offset of character i, offsets[len(text)] = len(data) (as `accounting` lays)."""
    if len(data) == len(text):  # ASCII
        return np.arange(len(text) + 1, dtype=np.int64)
    # A character starts at every byte that is not a continuation byte (0x80-0xBF: -128..-65 as int8); the NUL
    # appended is one more start, at len(data). One pass, and the array's own `nonzero` (no numpy wrapper).
    return (np.frombuffer(data + b"\0", dtype=np.int8) >= -64).nonzero()[0].astype(np.int64, copy=False)


__all__ = ["MaskedRow", "mask_rows"]
