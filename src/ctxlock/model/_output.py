"""`Model.parse_output`: a completion of this model back into the assistant message (docs/parse.md).

What the model adds to `ctxlock.generation.parse_output`: the tokenizer, the formats read from its chat template
when none is named, the declared tools of the request the completion answers, and where the output starts (the
request's prompt rendered with this model's template: a template-opened `<think>`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ctxlock import generation  # its names load on first use: a model that never parses output never imports them
from ctxlock.request import Request

if TYPE_CHECKING:
    from ctxlock.generation import ParsedMessage
    from ctxlock.pipeline import Pipeline
    from ctxlock.template import Rendered

_NO_PROMPT = ("harmony", None)


def parse_model_output(
    model: Pipeline,
    output: str | Sequence[int],
    *,
    template: str | None,
    request: Request | None = None,
    tools: Iterable[Mapping[str, Any]] | None = None,
    tool_format: str | None = None,
    reasoning: str | None = None,
    finish_reason: str | None = "stop",
    starts: str | None = None,
) -> ParsedMessage:
    notes: list[str] = []
    if tool_format is None and reasoning is None and template is not None:
        tool_format, reasoning, note = generation.formats_for_template(template)
        notes.append(note.replace("the chat template", "the model's chat template", 1))
    prompt = None if request is None else model.render(request)
    parsed = generation.parse_output(
        output,
        tokenizer=model.tokenizer,
        tool_format=tool_format,
        reasoning=reasoning,
        tools=tools if tools is not None else request,
        finish_reason=finish_reason,
        prompt=prompt.text if prompt is not None and starts is None and reasoning not in _NO_PROMPT else None,
        end_tokens=_end_tokens(model),
        starts=starts,  # type: ignore[arg-type]  # checked by the splitter, which names the allowed values
    )
    parsed = replace(parsed, notes=(*notes, *parsed.notes))
    if request is None or prompt is None:
        return parsed
    return replace(parsed, round_trip=round_trip(model, request, prompt, parsed, output))


def _end_tokens(model: Pipeline) -> tuple[str, ...]:
    eos = model.special_tokens.get("eos_token")
    return (*generation.END_TOKENS, *([eos] if eos else []))


def round_trip(
    model: Pipeline, request: Request, prompt: Rendered, parsed: ParsedMessage, output: str | Sequence[int]
) -> dict[str, Any]:
    """Render the request with the parsed message appended (no generation prompt) and compare it with what the
    model saw and wrote: the prompt, then the output. `reproduces` when the render starts with exactly that text
    (and, for ids, those ids); else where the template's render first differs, with both sides."""
    body: dict[str, Any] = {"messages": [*request.template_messages(), parsed.to_openai()]}
    if request.tools is not None:
        body["tools"] = request.template_tools()
    if request.documents is not None:
        body["documents"] = request.template_documents()
    if request.chat_template_kwargs:
        body["chat_template_kwargs"] = dict(request.chat_template_kwargs)
    again = model.render(json.dumps(body, ensure_ascii=False).encode(), add_generation_prompt=False)
    said = output if isinstance(output, str) else model.tokenizer.decode(list(output))
    expected = prompt.text + said
    out: dict[str, Any] = {"reproduces": again.text.startswith(expected)}
    if out["reproduces"]:
        out["template_adds"] = again.text[len(expected) :]
    else:
        at = next((k for k, (a, b) in enumerate(zip(again.text, expected, strict=False)) if a != b), None)
        at = min(len(again.text), len(expected)) if at is None else at
        out["first_difference"] = {
            "offset_in_output": at - len(prompt.text),
            "model_wrote": expected[at : at + 80],
            "template_writes": again.text[at : at + 80],
        }
    if not isinstance(output, str):
        ids = [*model.tokenize(prompt).ids, *output]
        rendered_ids = list(model.tokenize(again).ids)
        out["ids_reproduce"] = rendered_ids[: len(ids)] == ids
        if not out["ids_reproduce"]:
            k = next(
                (k for k, (a, b) in enumerate(zip(rendered_ids, ids, strict=False)) if a != b),
                min(len(ids), len(rendered_ids)),
            )
            out["first_different_id"] = k - len(ids) + len(output)
    return out
