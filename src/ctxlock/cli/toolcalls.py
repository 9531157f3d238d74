"""`ctxlock toolcalls`: a recorded stream -> the tool calls that may be executed, and why the others may not."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlock.cli.files import read_json
from ctxlock.cli.output import guarded, print_json
from ctxlock.errors import ToolCallError
from ctxlock.generation.toolcalls import Release, Result, ToolCallAssembler, ToolCallFormat, loads_object
from ctxlock.outside._files import STDIN, decode_utf8, read_input
from ctxlock.request import Request, parse_request


def tools_from(path: Path | None) -> list[Any] | Request:
    """The tool list: OpenAI's (`{"type": "function", "function": {...}}`) or Anthropic's (`{"name", "input_schema"}`),
    or a whole request (OpenAI or Anthropic), whose tools are used."""
    if path is None:
        return []
    data = read_json(path, option="--tools", error=ToolCallError)
    if isinstance(data, dict) and "messages" in data:
        return parse_request(read_input(path, label=f"--tools {path}"))
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        data = data["tools"]
    if not isinstance(data, list):
        raise ToolCallError(
            "expected a tool list", path=f"--tools {path}", hint='pass [{"type": "function", ...}, ...] or a request'
        )
    return [_openai_tool(t) for t in data]


def _openai_tool(tool: Any) -> Any:
    if isinstance(tool, dict) and "input_schema" in tool and "function" not in tool:  # an Anthropic tool
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if "description" in tool:
            function["description"] = tool["description"]
        return {"type": "function", "function": function}
    return tool


def _openai_chunks(text: str, label: str) -> list[Any]:
    """JSON lines, one chunk each, or the SSE body itself (`data: {...}` lines, `data: [DONE]`)."""
    chunks: list[Any] = []
    for n, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip() or line.startswith(":") or line.startswith(("event:", "id:", "retry:")):
            continue
        if line.startswith("data:"):
            line = line[5:].removeprefix(" ")
            if line.strip() == "[DONE]":
                continue
        chunk, problem = loads_object(line, unicode=False)
        if problem is not None:
            raise ToolCallError(
                f"not JSON: {problem}", path=f"{label} line {n}", hint="one chunk per line (JSONL) or the SSE body"
            )
        chunks.append(chunk)
    return chunks


def _report(result: Result, release: Release) -> dict[str, Any]:
    return {
        "release": release.value,
        "finish_reason": result.finish_reason,
        "stream_finish_reason": result.stream_finish_reason,
        "calls": [{"index": c.index, **c.to_openai()} for c in result.calls],
        "errors": [{"index": e.index, "call_id": e.call_id, **e.to_dict()} for e in result.errors],
        "text": result.text,
        "thinking": result.thinking,
        "notes": list(result.notes),
    }


def register(app: typer.Typer) -> None:
    @app.command()
    def toolcalls(
        stream: Annotated[
            str,
            typer.Argument(
                help="The recorded stream, or - for stdin: for anthropic the response body (SSE); for openai one "
                "chunk per line or the SSE body; for the other formats the model's text (special tokens kept)."
            ),
        ] = STDIN,
        format: Annotated[
            ToolCallFormat, typer.Option("--format", "-f", help="How the model writes its calls.")
        ] = ToolCallFormat.OPENAI,
        tools: Annotated[
            Path | None,
            typer.Option(
                "--tools",
                help="JSON file: a tool list (OpenAI's or Anthropic's form), or a whole request whose tools are used.",
            ),
        ] = None,
        finish_reason: Annotated[
            str | None,
            typer.Option(
                "--finish-reason",
                help="How the stream ended. openai and anthropic streams say it themselves; a text stream without "
                "one has an unknown end, and then no call is released.",
            ),
        ] = None,
        release: Annotated[
            Release,
            typer.Option(
                "--release",
                help="finish (default): calls only after a normal end (stop, tool_calls, end_turn, tool_use, "
                "stop_sequence). early: each call as soon as it is complete, even from a response that was then "
                "cut off at the output limit (it may already have run).",
            ),
        ] = Release.FINISH,
    ) -> None:
        """Assemble the tool calls of a recorded stream: print (JSON) the calls safe to execute, the calls that are
        not and why, the text and the finish reason. Exit status 1 when any call was not released; a provider
        error inside the stream (HTTP 200, then {"error": ...} or event: error) is an error line."""

        def run() -> Result:
            label = "stdin" if stream == STDIN else f"STREAM {stream}"
            data = read_input(stream, label=label)
            asm = ToolCallAssembler(tools_from(tools), format, release=release)
            if format is ToolCallFormat.ANTHROPIC:
                asm.feed(data)
            elif format is ToolCallFormat.OPENAI:
                for chunk in _openai_chunks(decode_utf8(data, label=label), label):
                    asm.feed(chunk)
            else:
                asm.feed(decode_utf8(data, label=label))
            return asm.finish(finish_reason)

        result = guarded(True, run)
        print_json(_report(result, release))
        if not result.ok:
            raise typer.Exit(1)
