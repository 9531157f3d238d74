"""`ctxlock render` and `ctxlock tokenize`, and the options other commands share (`ModelOpt`, `RequestArg`, ...).

The render flags become one `RenderOptions` (`render_options`): the command runs with it, and `--record` records
it (`RenderOptions.to_record`)."""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Iterator
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlock.artifacts import load_artifacts
from ctxlock.cli import images, output
from ctxlock.cli.files import check_scalar_values, decode_with_policy, read_json, read_request, store_dir, template_file
from ctxlock.cli.output import guarded, print_json, write_exact, write_ids
from ctxlock.errors import InputError, SamplerError, TokenizerError
from ctxlock.generation._sampler import SamplerConfig
from ctxlock.model._model import Model, Run, load
from ctxlock.outside._files import iter_lines, read_input, stdin_stream
from ctxlock.outside._json import SYNTAX_ERROR, Utf8Policy, loads_outside
from ctxlock.records import RunOptions
from ctxlock.records._store import Store
from ctxlock.records._wire import path_at, run_to_dict, run_warnings
from ctxlock.request import RESERVED_TEMPLATE_KWARGS, ToolArguments
from ctxlock.template._options import ContentFormat, InjectionPolicy, RenderOptions
from ctxlock.template._render import DEFAULT_LIMITS, ChatTemplate, RenderLimits, aware_clock

MODEL_HELP = (
    "A built-in model name (see `ctxlock models`), an HF model directory, a .gguf file, or org/name (or "
    "org/name@revision: a branch, tag or commit, which pins it) from the local HF hub cache."
)
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help=MODEL_HELP + " Default: the embedded mistral-nemo.",
    ),
]


class TokenizerPipeline(StrEnum):
    """`--tokenizer-pipeline`: how an HF directory's tokenizer is built."""

    CLASS = "class"
    FILE = "file"


TokenizerPipelineOpt = Annotated[
    TokenizerPipeline,
    typer.Option(
        "--tokenizer-pipeline",
        help="For an HF directory: 'class' builds the tokenizer the way its transformers class does (what "
        "AutoTokenizer loads), 'file' uses tokenizer.json's components as written. `ctxlock inspect` shows where "
        "they differ.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the human view.")]
RequestArg = Annotated[str, typer.Argument(help="Request JSON file, or - for stdin.")]
TEMPLATE_HELP = (
    "Use this chat template instead of the model's default: a name of the model's set (default, tool_use, extra "
    "for additional_chat_templates/extra.jinja) when it has no '/' and no '.', else a .jinja file (./NAME for a "
    "file without either)."
)
TemplateOpt = Annotated[str | None, typer.Option("--template", "-t", help=TEMPLATE_HELP)]
StoreOpt = Annotated[
    Path | None, typer.Option("--store", help="Record store directory (default: ~/.local/share/ctxlock).")
]

# `ctxlock render`'s render options (each becomes a field of RenderOptions).
VarOpt = Annotated[
    list[str],
    typer.Option("--var", help="Extra template variable NAME=JSON (repeatable), e.g. --var enable_thinking=false."),
]
NoGenerationPromptOpt = Annotated[
    bool, typer.Option("--no-generation-prompt", help="Do not open an assistant turn at the end.")
]
ContinueFinalMessageOpt = Annotated[
    bool, typer.Option("--continue-final-message", help="Leave the final message open, to be continued.")
]
InjectionOpt = Annotated[
    InjectionPolicy,
    typer.Option(
        "--injection",
        help="Control-token strings inside request text: `text` encodes them "
        "as plain text (safe default), `keep` lets them act as control tokens (what transformers, "
        "vLLM and llama.cpp do), `raise` rejects the request naming the JSON path.",
    ),
]
NowOpt = Annotated[
    str | None,
    typer.Option(
        "--now",
        help="The clock strftime_now reads, ISO 8601, with an offset (2026-01-02T03:04:05+09:00) or "
        "without (local time). Default: the local clock. Recorded with its zone either way.",
    ),
]
RenderSeedOpt = Annotated[
    str | None,
    typer.Option(
        "--render-seed",
        help="Seed of the template's random filter and lipsum (default 0, so renders repeat); `random` "
        "draws a fresh seed per run, as unseeded transformers would vary. Recorded either way.",
    ),
]
DialectOpt = Annotated[str | None, typer.Option("--dialect", help="openai or anthropic (default: detected).")]
Utf8Opt = Annotated[
    str,
    typer.Option("--utf8", help="Invalid UTF-8 in the request: strict (reject) or replace (U+FFFD, reported)."),
]
ToolArgumentsOpt = Annotated[
    ToolArguments,
    typer.Option(
        "--tool-arguments",
        help="Tool-call arguments sent as a JSON string: `parsed` renders the parsed object (vLLM, the "
        "default), `as-sent` renders the string byte for byte (transformers). Recorded.",
    ),
]
ContentFormatOpt = Annotated[
    ContentFormat,
    typer.Option(
        "--content-format",
        help="Content-part lists ([{type: text, text: ...}]): `auto` joins their text parts with a newline "
        "when the template reads content as a string (detected from its syntax tree, as vLLM does; a warning "
        "says so), `string` always joins them, `openai` passes the list as sent (transformers). Recorded.",
    ),
]
TemplateTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--template-timeout",
        min=0.001,
        help=f"Seconds a render may take, plus {DEFAULT_LIMITS.seconds_per_input_mchar:g} s per million "
        f"characters of request (default {DEFAULT_LIMITS.max_seconds:g}). Recorded.",
    ),
]
MaxRenderCharsOpt = Annotated[
    int | None,
    typer.Option(
        "--max-render-chars",
        min=1,
        help=f"Characters a render may output beyond {DEFAULT_LIMITS.output_per_input_char:g} per character of "
        f"request (default {DEFAULT_LIMITS.max_output_chars:,}); it also bounds any one string or list the "
        "template builds, and 4 times it everything the render builds. Recorded.",
    ),
]
RecordOpt = Annotated[
    bool, typer.Option("--record", help="Store an execution record (replayable, diffable) and print its id.")
]
SamplingOpt = Annotated[
    Path | None,
    typer.Option(
        "--sampling",
        help="A sampler config JSON (temperature, top_k, top_p, min_p, repetition_penalty, seed, order) "
        "that the output will be sampled with. It is validated and, with --record, stored in the record, "
        "where `ctxlock diff` compares it (processor order included) at the policy layer.",
    ),
]


def read_request_arg(source: str) -> bytes:
    return read_request(source)


def _jsonl_strings(utf8: str = "strict") -> Iterator[tuple[str, str, tuple[int, ...]]]:
    """(where, JSON string, replaced byte offsets) for stdin's lines, blank lines skipped. Lines end at LF only
    (the stream is read as bytes, so U+2028, U+0085 or a lone CR inside a line is part of it); each line is within
    the input cap and is decoded under the --utf8 policy, and a lone surrogate escape is treated alike."""
    for n, raw in iter_lines(stdin_stream(), label="stdin"):
        where = f"stdin line {n}"
        line, replaced = decode_with_policy(raw, label=where, utf8=utf8)
        if not line.strip():
            continue
        s = loads_outside(line, f"{where} $", error=InputError, utf8=Utf8Policy(utf8))
        if not isinstance(s, str):
            raise InputError("not a JSON string", path=where, hint="each --jsonl line is one JSON string")
        yield where, check_scalar_values(s, label=where, utf8=utf8), replaced


def _argv_text(text: str, utf8: str) -> tuple[str, tuple[int, ...]]:
    """--text as the bytes the shell passed: Python keeps an argv byte that is not UTF-8 as a lone surrogate
    (U+DC80..U+DCFF, PEP 383), which `os.fsencode` turns back into that byte before the UTF-8 policy applies."""
    try:
        data = os.fsencode(text)
    except UnicodeEncodeError:  # a surrogate the file system encoding cannot carry back
        return check_scalar_values(text, label="--text", utf8=utf8), ()
    return decode_with_policy(data, label="--text", utf8=utf8)


def parse_vars(items: list[str]) -> dict[str, Any]:
    """`--var NAME=JSON` values as template variables (a usage error names a bad one)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise typer.BadParameter(f"expected NAME=JSON, got {item!r}", param_hint="--var")
        if key in RESERVED_TEMPLATE_KWARGS:
            raise typer.BadParameter(_reserved_var(key), param_hint="--var")
        try:
            out[key] = loads_outside(raw, f"--var {key} $", error=InputError)
        except InputError as exc:
            why = "is not JSON" if exc.message.startswith(SYNTAX_ERROR) else f"is refused ({exc.message} at {exc.path})"
            raise typer.BadParameter(
                f"the value of {key} {why}: {raw!r} (quote strings: {key}='\"text\"')", param_hint="--var"
            ) from None
    return out


# Why a --var name is refused, by what the name is to transformers' apply_chat_template.
_CONVERSATION_VARS = {
    "messages": "the request's messages",
    "tools": "the request's tools",
    "documents": "the request's documents",
    "add_generation_prompt": "--no-generation-prompt",
    "continue_final_message": "--continue-final-message",
}
_UNSUPPORTED_ARGS = {
    "chat_template": "choose the template with --template FILE",
    "tokenize": "ctxlock always renders and tokenizes; `ctxlock tokenize` encodes raw text",
    "tokenizer": "choose the model with --model",
    "padding": "ctxlock never pads a single request; the Python API's encode_batch pads a batch",
    "truncation": "ctxlock never truncates a request; `ctxlock fit` drops whole turns to a token budget",
    "max_length": "`ctxlock fit --max-input-tokens N` fits the request to a token budget",
    "return_tensors": "`--json` prints input_ids, attention_mask and position_ids",
    "return_dict": "`--json` prints input_ids, attention_mask and position_ids",
    "return_assistant_tokens_mask": "assistant-token masks come from the Python API, encode(..., "
    "return_assistant_tokens_mask=True), for any template; `ctxlock inspect` says how a template's masks are found",
    "tokenizer_kwargs": "tokenizer options are not passed through; `ctxlock tokenize` has --add-special-tokens and "
    "--parse-special",
}


def _reserved_var(key: str) -> str:
    """Why --var cannot set `key` (one of request.RESERVED_TEMPLATE_KWARGS), and what to use instead."""
    if key in _CONVERSATION_VARS:
        return f"{key} is not a template variable: it comes from {_CONVERSATION_VARS[key]}"
    if key in _UNSUPPORTED_ARGS:
        return (
            f"{key} is an argument of transformers' apply_chat_template, not a template variable, and ctxlock has "
            f"no such option: {_UNSUPPORTED_ARGS[key]}"
        )
    if key.endswith("_token") or key == "additional_special_tokens":
        return f"{key} is not a template variable: the template gets it from the model's special tokens"
    return f"{key} is a name the template environment defines (a global or a jinja name); choose another name"


def _parse_now(now: str | None) -> datetime | None:
    """--now as an aware time: with its offset (2026-01-02T03:04:05+09:00, or Z), or, without one, local time."""
    if now is None:
        return None
    try:
        parsed = datetime.fromisoformat(now)
    except ValueError:
        raise typer.BadParameter(
            f"not an ISO 8601 time: {now!r} (for example 2026-01-02T03:04:05+09:00)", param_hint="--now"
        ) from None
    return aware_clock(parsed)


def _parse_seed(seed: str | None) -> int | None:
    """--render-seed: an integer, or `random` for a fresh one (drawn here, so the record holds it)."""
    if seed is None:
        return None
    if seed == "random":
        return secrets.randbits(63)
    try:
        value = int(seed)
    except ValueError:
        value = -1
    if not 0 <= value < 2**64:
        raise typer.BadParameter(
            f"expected an integer in [0, 2**64) or `random`, got {seed!r}", param_hint="--render-seed"
        )
    return value


def _read_sampling(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    data = read_json(path, option="--sampling", error=SamplerError)
    return SamplerConfig.from_dict(data).to_dict()


def _limits(timeout: float | None, max_chars: int | None) -> dict[str, Any] | None:
    """The render limits the options ask for, as the record keeps them (None: the defaults, not recorded)."""
    if timeout is None and max_chars is None:
        return None
    chosen = {"max_seconds": timeout, "max_output_chars": max_chars}
    return {**DEFAULT_LIMITS.to_dict(), **{k: v for k, v in chosen.items() if v is not None}}


_CONTROL_SGR = "1;97;45"  # bold white on magenta, as the legend shows it
_NEUTRALIZED_SGR = "1;4;31"  # bold red underline


def _show(model: Model, run: Run) -> None:
    from rich.markup import escape  # the human view only: --json never imports rich
    from rich.rule import Rule

    console = output.console
    r, t = run.rendered, run.tokenized
    ids = run.model_input.input_ids[0].tolist()
    console.print(
        Rule(f"[bold]{escape(model.id)}[/] · template [cyan]{escape(r.template.id)}[/] · special tokens: {r.policy}")
    )
    # The text exactly as rendered (never wrapped: a pipe gets the bytes), control tokens coloured on a terminal.
    marks = [(m.start, m.end, _CONTROL_SGR) for m in t.control]
    marks += [(m.start, m.end, _NEUTRALIZED_SGR) for m in t.neutralized]
    write_exact(r.text, marks)
    console.print(Rule(f"{len(ids)} tokens"))
    write_ids(ids)
    if t.neutralized:
        console.print(Rule("[bold red]injection neutralized[/]"))
        for m in t.neutralized:
            where = path_at(r, m.start) or f"offset {m.start}"
            console.print(
                f"[red]{escape(repr(r.text[m.start : m.end]))}[/] from {escape(where)} was encoded as plain text, "
                f"not as control id {m.id}"
            )
    console.print(Rule("digests"))
    console.print(f"template   {r.template.sha256}  ({escape(r.template.origin or r.template.id)})")
    console.print(f"tokenizer  {model.tokenizer.sha256}  ({model.tokenizer.format})")
    console.print(f"request    {run.request.source_sha256}  ({run.request.dialect}, utf8={run.request.utf8_policy})")
    read = "read by the template" if r.clock_used else "not read by the template"
    console.print(f"clock      {r.now}  ({escape(r.clock_zone)}, {read})")
    if r.draws:
        drawn = ", ".join(
            f"{d['what']} at line {d['line']}" + (f" -> {d['index']} of {d['choices']}" if "index" in d else "")
            for d in r.draws[:6]
        )
        console.print(f"random     seed {r.seed}: {len(r.draws)} draw(s): {escape(drawn)}")
    if model.hub is not None:
        pin = model.hub
        console.print(
            f"revision   {escape(pin.repo_id)}@{escape(pin.revision)} -> {pin.commit} (via {escape(pin.via)})"
        )
    for w in run_warnings(model, r, run.request):
        console.print(f"[bold yellow]warning[/]    {escape(w['message'])}  ({escape(str(w.get('path') or ''))})")
    console.print(
        "legend: [bold white on magenta] control token from the template [/]  "
        "[bold red underline]control-token string from the request, encoded as text[/]"
    )


def render_options(
    chosen: ChatTemplate | None,
    *,
    var: list[str] | None = None,
    no_generation_prompt: bool = False,
    continue_final_message: bool = False,
    injection: InjectionPolicy | str = InjectionPolicy.TEXT,
    now: str | None = None,
    render_seed: str | None = None,
    dialect: str | None = None,
    utf8: str = "strict",
    tool_arguments: ToolArguments | str = ToolArguments.PARSED,
    content_format: ContentFormat | str = ContentFormat.AUTO,
    template_timeout: float | None = None,
    max_render_chars: int | None = None,
    sampling: Path | None = None,
) -> tuple[RenderOptions, dict[str, Any] | None]:
    """`ctxlock render`'s flags as one RenderOptions (`chosen`: the --template file's template), and the
    --sampling config for the record. The flags are checked in the order the command always checked them:
    --now, --var, --sampling, --render-seed."""
    parsed_now = _parse_now(now)
    variables = parse_vars(var or [])
    sampler = _read_sampling(sampling)
    seed = _parse_seed(render_seed)
    limits = _limits(template_timeout, max_render_chars)
    options = RenderOptions(
        add_generation_prompt=not (no_generation_prompt or continue_final_message),
        continue_final_message=continue_final_message,
        chat_template_kwargs=variables or None,
        chat_template=chosen,
        injection=injection,
        now=parsed_now,
        dialect=dialect,
        utf8=utf8,
        tool_arguments=tool_arguments,
        content_format=content_format,
        limits=RenderLimits.from_dict(limits) if limits else None,
        seed=seed,
    )
    return options, sampler


def run_recorded(
    model: Model,
    data: bytes,
    options: RunOptions,
    chosen: ChatTemplate | None,
    store_path: Path | None,
    media: dict[str, bytes] | None = None,
) -> tuple[Any, str]:
    """Run with `options`, and store the record (with the template used, and any --media bytes) in the store at
    `store_path`; a failed run is recorded too, its id printed on stderr, and its error raised. Returns the run and
    the record id."""
    from ctxlock.records._replay import (  # start-up: only --record needs the replay module (and the store's)
        run_and_record,
        save,
    )

    result, rec, error = run_and_record(model, data, options, template=chosen, media=media)
    used = chosen or (result.rendered.template if result is not None else None)
    if used is None and model.templates is not None:
        used = model.templates.select(None)
    rid = save(Store(store_path), model, rec, used, media=media)
    if error is not None:
        print(f"record {rid}", file=sys.stderr)
        raise error
    return result, rid


def render(
    request: RequestArg = "-",
    model: ModelOpt = None,
    template: TemplateOpt = None,
    var: VarOpt = [],  # noqa: B006 (typer reads the default)
    no_generation_prompt: NoGenerationPromptOpt = False,
    continue_final_message: ContinueFinalMessageOpt = False,
    injection: InjectionOpt = InjectionPolicy.TEXT,
    now: NowOpt = None,
    render_seed: RenderSeedOpt = None,
    dialect: DialectOpt = None,
    utf8: Utf8Opt = "strict",
    tool_arguments: ToolArgumentsOpt = ToolArguments.PARSED,
    content_format: ContentFormatOpt = ContentFormat.AUTO,
    record: RecordOpt = False,
    sampling: SamplingOpt = None,
    store: StoreOpt = None,
    template_timeout: TemplateTimeoutOpt = None,
    max_render_chars: MaxRenderCharsOpt = None,
    tokenizer_pipeline: TokenizerPipelineOpt = TokenizerPipeline.CLASS,
    media: images.MediaOpt = [],  # noqa: B006 (typer reads the default)
    as_json: JsonOpt = False,
) -> None:
    """Render a chat request exactly as the model receives it: text, control tokens, ids, digests.

    For a model with an image processor (preprocessor_config.json), each image's placeholder is expanded to its
    tokens, shown as one `[image 0: N tokens, sha256 …]` block, with its span, resize steps and pixel digest.
    Inputs are regular files (or - for stdin) of at most $CTXLOCK_MAX_INPUT_BYTES (default 64 MiB)."""

    def go() -> tuple[Model, Any, str | None]:
        data = read_request_arg(request)
        media_map = images.read_media(media)
        store_path = store_dir(store) if record else None  # refused before the model loads and the run
        m = load(model, tokenizer_pipeline=TokenizerPipeline(tokenizer_pipeline).value)
        chosen = template_file(template)
        options, sampler = render_options(
            chosen,
            var=var,
            no_generation_prompt=no_generation_prompt,
            continue_final_message=continue_final_message,
            injection=injection,
            now=now,
            render_seed=render_seed,
            dialect=dialect,
            utf8=utf8,
            tool_arguments=tool_arguments,
            content_format=content_format,
            template_timeout=template_timeout,
            max_render_chars=max_render_chars,
            sampling=sampling,
        )
        with_images = images.wants_images(m, data, options)
        if record:
            from ctxlock.records._replay import image_options  # start-up: only --record needs the replay module

            extra = {"images": image_options(m, media_map)} if with_images else {}
            recorded = RunOptions(**options.to_record(), sampling=sampler, **extra)
            return m, *run_recorded(m, data, recorded, chosen, store_path, media_map)
        return m, (m.run_images(data, options, media=media_map) if with_images else m.run(data, options)), None

    m, result, rid = guarded(as_json, go)
    mm = result if images.is_multimodal(result) else None
    if mm is not None:
        result = Run(mm.request, mm.rendered, mm.tokenized, mm.model_input)
    if as_json:
        extra = {"multimodal": images.to_dict(mm)} if mm is not None else {}
        print_json({**run_to_dict(m, result), **extra, **({"record_id": rid} if rid else {})})
    elif mm is not None:
        images.show(m, mm)
    else:
        _show(m, result)
        if rid:
            output.console.print(f"record     {rid}  (ctxlock replay {rid[:12]})")


# `ctxlock tokenize`'s options.
TextOpt = Annotated[str | None, typer.Option("--text", help="The text to encode.")]
FileOpt = Annotated[
    Path | None,
    typer.Option("--file", help="Encode this file's bytes as UTF-8 text, exactly (CRLF stays CRLF)."),
]
JsonlOpt = Annotated[
    bool,
    typer.Option("--jsonl", help="Read stdin lines, each a JSON string; print one JSON id array per line."),
]
ParseSpecialOpt = Annotated[
    bool, typer.Option("--parse-special", help="Let special-token strings in the text become control ids.")
]
AddSpecialTokensOpt = Annotated[
    bool, typer.Option("--add-special-tokens", help="Apply the tokenizer's post-processor (BOS/EOS).")
]
TextUtf8Opt = Annotated[
    str,
    typer.Option(
        "--utf8",
        help="Invalid UTF-8 (in --file, --text or a --jsonl line) and lone surrogate escapes: strict "
        "(reject, naming the byte) or replace (U+FFFD, reported), as for requests.",
    ),
]
TruncateOpt = Annotated[
    bool,
    typer.Option(
        "--truncate",
        help="Apply the truncation section of the model's tokenizer.json (never applied otherwise; padding "
        "never is). The output says what was cut.",
    ),
]


def tokenize(
    model: ModelOpt = None,
    text: TextOpt = None,
    file: FileOpt = None,
    jsonl: JsonlOpt = False,
    parse_special: ParseSpecialOpt = False,
    add_special_tokens: AddSpecialTokensOpt = False,
    utf8: TextUtf8Opt = "strict",
    truncate: TruncateOpt = False,
    tokenizer_pipeline: TokenizerPipelineOpt = TokenizerPipeline.CLASS,
    as_json: JsonOpt = False,
) -> None:
    """Encode raw text with a model's tokenizer (no chat template). Special-token strings are text by default.

    The text is taken byte for byte: a --file is read in binary (CRLF stays CRLF, a BOM stays U+FEFF), and
    --jsonl lines end at LF only. --file is a regular file of at most $CTXLOCK_MAX_INPUT_BYTES (default
    64 MiB); so is each --jsonl line."""
    if sum(x is not None and x is not False for x in (text, file, jsonl)) != 1:
        raise typer.BadParameter("give exactly one of --text, --file, --jsonl")
    m, source, replaced = guarded(
        as_json, lambda: _tokenize_input(model, text, file, utf8, truncate, TokenizerPipeline(tokenizer_pipeline))
    )
    tok = m.tokenizer
    section = tok.truncation

    def encode(line: str) -> tuple[list[int], dict[str, Any] | None]:
        if truncate:
            return tok.encode_truncated(line, parse_special=parse_special, add_special_tokens=add_special_tokens)
        ids = tok.encode(line, parse_special=parse_special, add_special_tokens=add_special_tokens)
        return ids, None

    if jsonl:

        def lines() -> None:
            for where, line, line_replaced in _jsonl_strings(utf8):
                if line_replaced:
                    print(f"{where}: {_replaced_note(line_replaced)}", file=sys.stderr)
                sys.stdout.write(json.dumps(encode(line)[0]) + "\n")

        guarded(as_json, lines)
        return
    assert source is not None
    ids, cut = encode(source)
    # What happened to tokenizer.json's truncation section: applied (with what it dropped), or not applied.
    truncation = None if section is None else {"applied": truncate, "section": section, **(cut or {})}
    if as_json:
        print_json(
            {
                "ids": ids,
                "count": len(ids),
                "tokenizer": {"id": tok.id, "sha256": tok.sha256},
                "utf8_policy": utf8,
                "replaced_bytes": list(replaced),
                "truncation": truncation,
            }
        )
    else:
        _show_ids(tok, ids, replaced, cut, section)


def _tokenize_input(
    model: str | None, text: str | None, file: Path | None, utf8: str, truncate: bool, pipeline: TokenizerPipeline
) -> tuple[Model, str | None, tuple[int, ...]]:
    # The input is read before the model loads: a bad --file fails fast, and with --json as an error object.
    source, replaced = None, ()
    if file is not None:
        label = f"--file {file}"
        source, replaced = decode_with_policy(read_input(file, label=label), label=label, utf8=utf8)
    elif text is not None:
        source, replaced = _argv_text(text, utf8)
    else:
        decode_with_policy(b"", label="--utf8", utf8=utf8)  # an unknown policy fails before the model loads
    m = Model(load_artifacts(model, tokenizer_pipeline=pipeline.value))
    section = m.tokenizer.truncation
    if truncate and section is None:
        raise TokenizerError(
            "--truncate: the tokenizer has no truncation section",
            path=m.tokenizer.id,
            hint="only an HF tokenizer.json carries one; drop --truncate",
        )
    return m, source, replaced


def _show_ids(tok: Any, ids: list[int], replaced: tuple[int, ...], cut: dict[str, Any] | None, section: Any) -> None:
    from rich.text import Text

    console = output.console
    write_ids(ids, limit=len(ids))  # every id: they are what tokenize is asked for
    console.print(f"{len(ids)} tokens · {tok.id} · sha256 {tok.sha256[:16]}…")
    if replaced:
        console.print(Text(_replaced_note(replaced)))
    if cut is not None:
        console.print(
            f"truncated by tokenizer.json: {cut['ids_before']} → {cut['ids_after']} ids "
            f"(max_length {cut['max_length']}, {cut['direction']}, {cut['dropped']} dropped)"
        )
    elif section is not None:
        console.print(
            f"tokenizer.json's truncation (max_length {section.get('max_length')}) was not applied; "
            "--truncate applies it"
        )


def register(app: typer.Typer) -> None:
    app.command()(render)
    app.command()(tokenize)


def _replaced_note(replaced: tuple[int, ...]) -> str:
    shown = ", ".join(map(str, replaced[:8])) + (", …" if len(replaced) > 8 else "")
    return f"utf8=replace: {len(replaced)} invalid byte(s) read as U+FFFD, at byte offsets {shown}"
