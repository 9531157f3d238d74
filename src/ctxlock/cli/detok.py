"""`ctxlock detok`: token ids -> the text pieces a streaming server would send, one per id."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Annotated, Any, BinaryIO

import typer

from ctxlock.cli.render import ModelOpt
from ctxlock.errors import CtxlockError, DecodeError, IncompleteDecodeError
from ctxlock.generation._decode import Detokenizer
from ctxlock.model._model import load
from ctxlock.outside._files import iter_lines, stdin_stream
from ctxlock.outside._json import loads_outside
from ctxlock.tokenizer import Tokenizer


def _ids(value: Any, where: str, size: int) -> list[int]:
    if not isinstance(value, list):
        raise DecodeError(f"expected a JSON array of token ids, got {type(value).__name__}", path=where)
    for k, i in enumerate(value):
        if isinstance(i, bool) or not isinstance(i, int):
            raise DecodeError(f"element {k} is {json.dumps(i)}, not an integer token id", path=f"{where}[{k}]")
        if not 0 <= i < size:
            raise DecodeError(
                f"token id {i} is not in the vocabulary",
                path=f"{where}[{k}]",
                hint=f"ids of this model are in [0, {size}); check --model",
            )
    return value


def _lines() -> Iterator[tuple[int, str]]:
    # Line by line, each capped: a stream without newlines (/dev/zero) is refused at the cap, not buffered whole.
    for n, raw in iter_lines(stdin_stream(), label="stdin"):
        try:
            yield n, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not UTF-8 ({exc.reason} at byte {exc.start})", path=f"stdin line {n}") from None


def _detokenizer(tok: Tokenizer, prompt: list[int], stop: list[str], skip: bool) -> Detokenizer:
    try:
        return Detokenizer(tok, prompt, stop=stop, skip_special_tokens=skip)
    except DecodeError as exc:  # a prompt that ends mid-character, an empty stop string
        path = (exc.path or "").replace("prompt_ids", "--prompt-ids", 1).replace("stop", "--stop", 1)
        raise type(exc)(exc.message, path=path, hint=exc.hint) from None


def _outcome(det: Detokenizer, ids: list[int], max_tokens: int | None) -> dict[str, Any]:
    """Why the text ended, as a server reports it: `stop` (with the stop string and the character offset where it
    starts), `length` (no stop matched and the ids reached --max-tokens), or None (no stop matched: the ids ran out,
    which a server reports as the model's own end of sequence)."""
    matched = det.matched
    if matched is not None:
        return {"finish_reason": "stop", "stop": {"string": matched.stop, "offset": matched.offset}}
    if max_tokens is not None and len(ids) >= max_tokens:
        return {"finish_reason": "length", "stop": None}
    return {"finish_reason": None, "stop": None}


def _outcome_line(where: str, outcome: dict[str, Any]) -> str:
    stop = outcome["stop"]
    if stop is not None:
        return f"{where}: stop string {stop['string']!r} matched at character {stop['offset']}: finish_reason stop"
    if outcome["finish_reason"] == "length":
        return f"{where}: no stop string matched; the ids reached --max-tokens: finish_reason length"
    return f"{where}: no stop string matched; the ids ran out: finish_reason none"


def _pieces(det: Detokenizer, ids: list[int], where: str) -> list[str]:
    try:
        pieces = [det.push(i) for i in ids]
        pieces.append(det.finish())
    except IncompleteDecodeError as exc:
        hint = "the ids were cut mid-character (for example by max_tokens); drop the trailing ids"
        raise IncompleteDecodeError(exc.message, path=f"{where}, {exc.path}", hint=hint) from None
    except DecodeError as exc:
        raise type(exc)(exc.message, path=f"{where}, {exc.path}", hint=exc.hint) from None
    return pieces


JsonlOpt = Annotated[
    bool,
    typer.Option(
        "--jsonl",
        help="Read stdin lines, each a JSON array of generated token ids; for each, print one JSON array: "
        'the piece each id emitted (often "" mid-character), then the piece finish() returned.',
    ),
]
IdsOpt = Annotated[str | None, typer.Option("--ids", help="One JSON array of token ids (instead of --jsonl).")]
PromptIdsOpt = Annotated[
    str | None,
    typer.Option(
        "--prompt-ids",
        help="JSON array of the prompt's ids: the first generated token then decodes as it does after the "
        "prompt (SentencePiece drops the leading space of a text's first token, not of a continuation).",
    ),
]
StopOpt = Annotated[
    list[str],
    typer.Option(
        "--stop",
        help="Stop string (repeatable). The text ends before the first one; no part of it is printed.",
    ),
]
SkipSpecialTokensOpt = Annotated[
    bool, typer.Option("--skip-special-tokens", help="Drop special tokens from the text, as decode does.")
]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        min=1,
        help="The generation's max_tokens: ids that reach it without a stop string end with finish_reason "
        "`length` (without it: none, the ids ran out).",
    ),
]
DetokJsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help='For each input, print one JSON object instead of the array: {"pieces", "text", '
        '"finish_reason" ("stop", "length" or null), "stop" ({"string", "offset"} or null)}; an error is one '
        'more line, {"error": {"type", "message", "path", "hint"}}.',
    ),
]


def register(app: typer.Typer) -> None:
    app.command()(detok)


def detok(
    model: ModelOpt = None,
    jsonl: JsonlOpt = False,
    ids: IdsOpt = None,
    prompt_ids: PromptIdsOpt = None,
    stop: StopOpt = [],  # noqa: B006 (typer reads the default)
    skip_special_tokens: SkipSpecialTokensOpt = False,
    max_tokens: MaxTokensOpt = None,
    as_json: DetokJsonOpt = False,
) -> None:
    """Decode token ids incrementally, as a streaming server does: only final text, cut at stop strings.

    Each input prints one JSON array of pieces (or, with --json, one object that also says why the text
    ended). With --stop, stderr also gets one line per input saying which stop string matched and where, or
    that none did, and the finish reason."""
    if (ids is None) == (not jsonl):
        raise typer.BadParameter("give exactly one of --jsonl or --ids")
    out = sys.stdout.buffer
    try:
        tok = load(model).tokenizer
        prompt = [] if prompt_ids is None else _json_ids(prompt_ids, "--prompt-ids", tok.vocab_size)
        if ids is not None:
            sources: Iterator[tuple[str, list[int]]] = iter([("--ids", _json_ids(ids, "--ids", tok.vocab_size))])
        else:
            sources = _stdin_ids(tok.vocab_size)
        _detokenizer(tok, prompt, stop, skip_special_tokens)  # check the prompt and the stops before any input
        for where, line_ids in sources:
            det = _detokenizer(tok, prompt, stop, skip_special_tokens)
            _write_line(out, det, line_ids, where, max_tokens=max_tokens, as_json=as_json, stop=stop)
    except CtxlockError as exc:
        if as_json:  # the error as one more JSON line: the output stays one JSON object per line
            out.write(json.dumps({"error": exc.to_dict()}, ensure_ascii=False).encode("utf-8") + b"\n")
            out.flush()
        raise


def _json_ids(text: str, option: str, size: int) -> list[int]:
    """The ids of a JSON-array option (--ids, --prompt-ids)."""
    return _ids(loads_outside(text, f"{option} $", error=DecodeError), option, size)


def _write_line(
    out: BinaryIO, det: Detokenizer, ids: list[int], where: str, *, max_tokens: int | None, as_json: bool, stop: list
) -> None:
    """One input's output line: the pieces (and, with --stop, the outcome on stderr), or with --json one object."""
    pieces = _pieces(det, ids, where)
    outcome = _outcome(det, ids, max_tokens)
    if as_json:
        line: Any = {"pieces": pieces, "text": "".join(pieces), **outcome}
    else:
        line = pieces
        if stop:
            print(_outcome_line(where, outcome), file=sys.stderr, flush=True)
    out.write(json.dumps(line, ensure_ascii=False).encode("utf-8") + b"\n")
    out.flush()


def _stdin_ids(size: int) -> Iterator[tuple[str, list[int]]]:
    for n, line in _lines():
        if not line.strip():
            continue
        where = f"stdin line {n}"
        try:
            value = loads_outside(line, f"{where} $", error=DecodeError)
        except DecodeError as exc:
            hint = exc.hint or "each line must be a JSON array of ids"
            raise DecodeError(exc.message, path=exc.path, hint=hint) from None
        yield where, _ids(value, where, size)
