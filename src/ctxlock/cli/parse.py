"""`ctxlock parse`: a completion (text or ids) -> the assistant message: reasoning, content, the tool calls that may
run and why the others may not (docs/parse.md)."""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlock.cli.output import guarded, print_json
from ctxlock.cli.render import ModelOpt
from ctxlock.cli.toolcalls import tools_from
from ctxlock.errors import ReasoningError
from ctxlock.generation import ParsedMessage
from ctxlock.generation._reasoning import HARMONY, REASONING_FORMATS
from ctxlock.model._model import Model, load
from ctxlock.outside._files import STDIN, decode_utf8, read_input
from ctxlock.outside._json import loads_outside
from ctxlock.request import parse_request


class Shape(StrEnum):
    """`--shape`: the message's form."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class Starts(StrEnum):
    REASONING = "reasoning"
    CONTENT = "content"


REASONING_NAMES = ", ".join([*REASONING_FORMATS, HARMONY])


def _output(source: str, ids: bool, model: Model) -> str | list[int]:
    label = "stdin" if source == STDIN else f"OUTPUT {source}"
    text = decode_utf8(read_input(source, label=label), label=label)
    if not ids:
        return text
    value = loads_outside(text, f"{label} $", error=ReasoningError)
    size = model.tokenizer.vocab_size
    if not isinstance(value, list):
        raise ReasoningError("--ids: expected a JSON array of token ids", path=f"{label} $")
    for k, i in enumerate(value):
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size:
            raise ReasoningError(
                f"element {k} is {i!r}, not a token id of this model", path=f"{label} $[{k}]", hint="check --model"
            )
    return value


def run(
    output: str,
    model_name: str | None,
    *,
    ids: bool,
    tool_format: str | None,
    reasoning: str | None,
    tools: Path | None,
    request_path: Path | None,
    finish_reason: str | None,
    starts: Starts | None,
) -> ParsedMessage:
    model = load(model_name)
    request = (
        None if request_path is None else parse_request(read_input(request_path, label=f"--request {request_path}"))
    )
    declared: Any = tools_from(tools) if tools is not None else None
    notes: list[str] = []
    if finish_reason is None:
        finish_reason = "stop"
        notes.append("no --finish-reason: the response is taken to have ended normally (stop)")
    parsed = model.parse_output(
        _output(output, ids, model),
        request=request,
        tools=declared,
        tool_format=tool_format,
        reasoning=reasoning,
        finish_reason=finish_reason,
        starts=None if starts is None else starts.value,
    )
    return replace(parsed, notes=(*parsed.notes, *notes))


def register(app: typer.Typer) -> None:
    @app.command()
    def parse(
        output: Annotated[
            str,
            typer.Argument(
                help="The completion: its text (special tokens kept), or - for stdin; with --ids, a JSON array of ids."
            ),
        ] = STDIN,
        model: ModelOpt = None,
        ids: Annotated[bool, typer.Option("--ids", help="OUTPUT is a JSON array of the model's token ids.")] = False,
        tool_format: Annotated[
            str | None,
            typer.Option(
                "--tool-format",
                "-f",
                help="How the model writes tool calls (hermes, qwen3_coder, mistral, harmony, ...: see "
                "`ctxlock toolcalls --help`). Default: read from the model's chat template.",
            ),
        ] = None,
        reasoning: Annotated[
            str | None,
            typer.Option(
                "--reasoning",
                "-r",
                help=f"How the model marks reasoning ({REASONING_NAMES}). Default: from the template.",
            ),
        ] = None,
        tools: Annotated[
            Path | None,
            typer.Option("--tools", help="JSON file: the declared tools (a call to any other is refused)."),
        ] = None,
        request: Annotated[
            Path | None,
            typer.Option(
                "--request",
                help="The request this completion answers: its tools are declared (unless --tools), and its prompt, "
                "rendered with the model's template, says whether the output starts inside reasoning.",
            ),
        ] = None,
        finish_reason: Annotated[
            str | None,
            typer.Option(
                "--finish-reason",
                help="How the response ended (stop, length, ...). Default stop, and the notes say so. Under length, "
                "no tool call is released and a response cut inside its reasoning has no content.",
            ),
        ] = None,
        starts: Annotated[
            Starts | None,
            typer.Option(
                "--starts", help="Where the output starts, when neither --request nor the family's rule fits."
            ),
        ] = None,
        shape: Annotated[
            Shape, typer.Option("--shape", help="The message's form: OpenAI's or Anthropic's.")
        ] = Shape.OPENAI,
    ) -> None:
        """Parse a completion back into the assistant message: reasoning split off, tool calls read and checked
        against the declared tools, the finish reason's consequences applied. Prints JSON: the message (OpenAI or
        Anthropic shape), the finish reason, the formats used, the calls not released and why, and notes on
        anything assumed. Exit status 1 when a call was not released."""
        parsed = guarded(
            True,
            lambda: run(
                output,
                model,
                ids=ids,
                tool_format=tool_format,
                reasoning=reasoning,
                tools=tools,
                request_path=request,
                finish_reason=finish_reason,
                starts=starts,
            ),
        )
        print_json(parsed.to_dict(shape.value))
        if parsed.errors:
            raise typer.Exit(1)
