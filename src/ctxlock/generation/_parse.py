"""A completion back into an assistant message (docs/parse.md): reasoning split off, tool calls read, the finish
reason's consequences applied.

`parse_output(output, ...)` takes the model's output (token ids with a tokenizer, or text with special tokens kept)
and returns a `ParsedMessage`: `content`, `reasoning`, the tool calls that may run, the calls that may not (with
why), the finish reason as a server reports it, and notes on everything assumed or dropped. `to_openai()` gives the
message in OpenAI's shape (`content`, `reasoning_content`, `tool_calls`), `to_anthropic()` in Anthropic's
(thinking, text and `tool_use` blocks, `stop_reason`).

The order is the models' own: the reasoning comes first and is split off (ctxlock.generation.ReasoningSplitter);
the calls are read from what remains (ctxlock.generation.toolcalls). A response cut off inside its reasoning has no
content and no calls; a call from a response cut off anywhere is never released (docs/way-back.md).

`formats_for_template(source)` names the formats a chat template writes (the tool-call format from a probe render,
the reasoning from its markers); `parse_output` uses it when given a template and no formats, and its notes say
what it chose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxlock.caches import memoize
from ctxlock.errors import CtxlockError, ReasoningError, ToolCallError
from ctxlock.generation._detect import tool_format_for_template
from ctxlock.generation._reasoning import (
    HARMONY,
    LENGTH_STOPS,
    Mode,
    ReasoningResult,
    reasoning_format,
    split_reasoning,
    split_reasoning_text,
)
from ctxlock.generation.toolcalls import PARSERS, ToolCallAssembler, ToolCallFormat, ToolCallReady
from ctxlock.request import Request
from ctxlock.tokenizer import Tokenizer

# End-of-turn tokens a completion may end with (the stop token a server includes or not): ChatML, Llama 3, GPT-2
# style, SentencePiece, DeepSeek, Gemma. They end the message; they are not part of it. Llama 3.1 ends a turn that
# calls a tool with `<|eom_id|>`, one of its stop tokens ("End of message",
# https://www.llama.com/docs/model-cards-and-prompt-formats/llama3_1/), as functionary v3.1's template writes it.
END_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "</s>",
    "<｜end▁of▁sentence｜>",
    "<end_of_turn>",
    "<|end_of_turn|>",
)
_NORMAL = frozenset({"stop", "tool_calls", "end_turn", "tool_use", "stop_sequence"})
_ANTHROPIC_STOP = {"tool_calls": "tool_use", "stop": "end_turn", "length": "max_tokens"}

# How a chat template marks reasoning, by the markers in its source, most specific first (the tool-call format is
# read from a render instead: ctxlock.generation._detect).
_REASONING_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|channel|>", "analysis"), HARMONY),
    (("<seed:think>",), "seed_oss"),
    (("<mm:think>",), "minimax_m3"),
    (("[THINK]",), "mistral"),
    # DeepSeek-V3.1 and later think only when the request's `thinking` says so (the template then opens the block);
    # R1 and its distills always think (https://huggingface.co/deepseek-ai/DeepSeek-V3.1, "Chat Template").
    (("<｜Assistant｜>", "<think>", "thinking is defined"), "deepseek_v3"),
    (("<｜Assistant｜>", "<think>"), "deepseek_r1"),
    (("<|im_start|>", "<think>"), "qwen3"),
    (("[gMASK]", "<think>"), "glm45"),
    (("<think>",), "qwen3"),
)


@memoize("generation.template_formats", 64, scope="artifact")
def formats_for_template(source: str) -> tuple[str | None, str | None, str]:
    """(tool-call format, reasoning format, a note) for a chat template's source. The tool-call format is read from
    what the template renders for a probe turn with two calls (ctxlock.generation._detect); the reasoning format
    from the markers in the source. None where the template writes nothing ctxlock reads; the note says what was
    found (a format ctxlock does not parse yet, a probe the template refused). Kept per source: the probes take up
    to 16 renders, and every trajectory (each row of `ctxlock batch --trajectories`) and parse asks again."""
    tool, note = tool_format_for_template(source)
    reasoning = next((fmt for marks, fmt in _REASONING_MARKERS if all(m in source for m in marks)), None)
    return tool, reasoning, f"formats read from the chat template: {note}; reasoning {reasoning}"


@dataclass(frozen=True)
class ParsedMessage:
    """One completion as an assistant message. `tool_calls` may run; `errors` are the calls that may not (each
    says why, and `ctxlock.generation.toolcalls.to_model` turns one into a tool result for the model)."""

    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCallReady, ...]
    errors: tuple[ToolCallError, ...]
    finish_reason: str | None
    output_finish_reason: str | None
    reasoning_complete: bool
    tool_format: str | None
    reasoning_format: str | None
    notes: tuple[str, ...] = ()
    reasoning_split: ReasoningResult | None = field(default=None, repr=False)
    # Given the request it answers (Model.parse_output): whether rendering the request with this message appended
    # reproduces the prompt and the output (ctxlock.model's round_trip says how it is compared).
    round_trip: Mapping[str, Any] | None = None

    def to_openai(self) -> dict[str, Any]:
        """The message in OpenAI's chat shape; `reasoning_content` as vLLM and DeepSeek's API name it."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return message

    def to_anthropic(self) -> dict[str, Any]:
        """The message in Anthropic's Messages shape: thinking, text and tool_use blocks, and the stop reason.
        A thinking block here carries no `signature` (only Anthropic's API can sign one)."""
        blocks: list[dict[str, Any]] = []
        if self.reasoning:
            blocks.append({"type": "thinking", "thinking": self.reasoning})
        if self.content:
            blocks.append({"type": "text", "text": self.content})
        blocks += [c.to_anthropic() for c in self.tool_calls]
        reason = _ANTHROPIC_STOP.get(self.finish_reason or "", self.finish_reason)
        return {"role": "assistant", "content": blocks, "stop_reason": reason}

    def to_dict(self, shape: str = "openai") -> dict[str, Any]:
        """The report `ctxlock parse --json` and `/v1/parse` give."""
        message = self.to_anthropic() if shape == "anthropic" else self.to_openai()
        return {
            "message": message,
            "finish_reason": self.finish_reason,
            "output_finish_reason": self.output_finish_reason,
            "reasoning_complete": self.reasoning_complete,
            "formats": {"tool_calls": self.tool_format, "reasoning": self.reasoning_format},
            "errors": [{"index": e.index, "call_id": e.call_id, **e.to_dict()} for e in self.errors],
            "notes": list(self.notes),
            **({} if self.round_trip is None else {"round_trip": dict(self.round_trip)}),
        }


def parse_output(
    output: str | Sequence[int],
    *,
    tokenizer: Tokenizer | None = None,
    tool_format: ToolCallFormat | str | None = None,
    reasoning: str | None = None,
    tools: Request | Iterable[Mapping[str, Any]] | None = None,
    finish_reason: str | None = "stop",
    prompt: str | None = None,
    starts: Mode | None = None,
    template: str | None = None,
    end_tokens: Sequence[str] = END_TOKENS,
) -> ParsedMessage:
    """`output`: token ids (with `tokenizer`) or text with special tokens kept. `tool_format` (a
    `ToolCallFormat`) and `reasoning` (a reasoning format, see ctxlock.generation.REASONING_FORMATS) say how the
    model writes; when both are None and `template` (the chat template's source) is given, they are read from it.
    `tools`: the declared tools (a call to any other is refused). `finish_reason`: how the response ended; None
    is an unknown end, and then no call is released. `prompt` (the rendered prompt) or `starts` says whether the
    output starts inside reasoning (a template-opened `<think>`). An end-of-turn token that ends the output
    (`end_tokens`: the model's stop tokens) ends the message and is not part of it; the notes say so."""
    notes: list[str] = []
    if tool_format is None and reasoning is None and template is not None:
        tool_format, reasoning, note = formats_for_template(template)
        notes.append(note)
    fmt = _tool_format(tool_format)
    ids = _ids(output, tokenizer)
    if fmt == ToolCallFormat.HARMONY or reasoning == HARMONY:
        return _harmony(output, ids, tokenizer, tools, finish_reason, notes)
    output, ids = _without_end_token(output, ids, tokenizer, end_tokens, notes)
    split: ReasoningResult | None = None
    text = output if isinstance(output, str) else _decode(tokenizer, ids)
    if reasoning is not None:
        reasoning_format(reasoning)  # an unknown name fails here, before any work
        split = (
            split_reasoning_text(output, reasoning, finish_reason=finish_reason, prompt=prompt, starts=starts)
            if isinstance(output, str)
            else split_reasoning(
                _need(tokenizer), ids, reasoning, finish_reason=finish_reason, prompt=prompt, starts=starts
            )
        )
        notes += split.notes
        text = split.content or ""
    return _with_calls(text, split, fmt, reasoning, tools, finish_reason, notes)


def _with_calls(
    text: str,
    split: ReasoningResult | None,
    fmt: ToolCallFormat | None,
    reasoning: str | None,
    tools: Request | Iterable[Mapping[str, Any]] | None,
    finish_reason: str | None,
    notes: list[str],
) -> ParsedMessage:
    complete = split is None or split.reasoning_complete
    if fmt is None:
        if finish_reason in _NORMAL:
            mapped: str | None = "stop"
        else:
            mapped = "length" if finish_reason in LENGTH_STOPS else finish_reason
        calls: tuple[ToolCallReady, ...] = ()
        errors: tuple[ToolCallError, ...] = ()
        content = text or None
    else:
        asm = ToolCallAssembler(tools, fmt)
        asm.feed(text)
        result = asm.finish(finish_reason)
        calls, errors, mapped, content = result.calls, result.errors, result.finish_reason, result.text or None
        notes += result.notes
    return ParsedMessage(
        content=content if complete else None,
        reasoning=split.reasoning if split is not None else None,
        tool_calls=calls,
        errors=errors,
        finish_reason=mapped,
        output_finish_reason=finish_reason,
        reasoning_complete=complete,
        tool_format=fmt.value if fmt is not None else None,
        reasoning_format=reasoning,
        notes=tuple(notes),
        reasoning_split=split,
    )


def _harmony(
    output: str | Sequence[int],
    ids: list[int],
    tokenizer: Tokenizer | None,
    tools: Request | Iterable[Mapping[str, Any]] | None,
    finish_reason: str | None,
    notes: list[str],
) -> ParsedMessage:
    """gpt-oss: one pass of the harmony format gives the analysis (reasoning), the text and the calls."""
    text = output if isinstance(output, str) else _decode(tokenizer, ids)
    asm = ToolCallAssembler(tools, ToolCallFormat.HARMONY)
    asm.feed(text)
    result = asm.finish(finish_reason)
    split = None
    complete = not _inside_analysis(text)
    if not isinstance(output, str):
        split = split_reasoning(_need(tokenizer), ids, HARMONY, finish_reason=finish_reason)
        complete = split.reasoning_complete
        notes += [n for n in split.notes if "not content" not in n and "preamble" not in n]
    elif not complete:
        how = "hit the output limit" if finish_reason in LENGTH_STOPS else f"ended (finish_reason={finish_reason!r})"
        notes.append(f"the response {how} inside the analysis channel: the reasoning is incomplete")
    return ParsedMessage(
        content=(result.text or None) if complete else None,
        reasoning=result.thinking or (split.reasoning if split is not None else None),
        tool_calls=result.calls,
        errors=result.errors,
        finish_reason=result.finish_reason,
        output_finish_reason=finish_reason,
        reasoning_complete=complete,
        tool_format=ToolCallFormat.HARMONY.value,
        reasoning_format=HARMONY,
        notes=(*notes, *result.notes),
        reasoning_split=split,
    )


def _without_end_token(
    output: str | Sequence[int], ids: list[int], tokenizer: Tokenizer | None, ends: Sequence[str], notes: list[str]
) -> tuple[str | Sequence[int], list[int]]:
    if isinstance(output, str):
        end = next((e for e in ends if e and output.endswith(e)), None)
        if end is None:
            return output, ids
        notes.append(f"the output ends with the end-of-turn token {end}: it ends the message and is not content")
        return output[: -len(end)], ids
    if ids and tokenizer is not None:
        last = tokenizer.id_to_token(ids[-1])
        if last is not None and last in ends:
            notes.append(f"the output ends with the end-of-turn token {last} (id {ids[-1]}): it ends the message")
            return ids[:-1], ids[:-1]
    return output, ids


def _inside_analysis(text: str) -> bool:
    """Whether Harmony text ends inside an analysis message (its last `<|message|>` opened one, no stop since)."""
    stops = ("<|end|>", "<|call|>", "<|return|>")
    opened = text.rfind("<|message|>")
    if opened < 0 or any(stop in text[opened:] for stop in stops):
        return False
    # The header runs from the message's <|start|>, or from the end of the message before it when the model left
    # <|start|> out: an analysis message that ended does not make the next one analysis.
    found = ((text.rfind(mark, 0, opened), mark) for mark in ("<|start|>", *stops))
    begin = max((at + len(mark) for at, mark in found if at >= 0), default=0)
    return "<|channel|>analysis" in text[begin:opened]


def _tool_format(value: ToolCallFormat | str | None) -> ToolCallFormat | None:
    if value is None or isinstance(value, ToolCallFormat):
        return value
    try:
        fmt = ToolCallFormat(value)
    except ValueError:
        known = ", ".join(f.value for f in ToolCallFormat if f in PARSERS and f.value not in ("openai", "anthropic"))
        raise ToolCallError(
            f"unknown tool-call format {value!r}", path="tool_format", hint=f"use one of: {known}"
        ) from None
    if fmt in (ToolCallFormat.OPENAI, ToolCallFormat.ANTHROPIC):
        raise ToolCallError(
            f"{fmt.value} is a provider's stream, not a model's output",
            path="tool_format",
            hint="ctxlock toolcalls reads provider streams; parse reads what the model itself wrote",
        )
    return fmt


def _ids(output: str | Sequence[int], tokenizer: Tokenizer | None) -> list[int]:
    if isinstance(output, str):
        return []
    ids = list(output)
    size = _need(tokenizer).vocab_size
    for k, i in enumerate(ids):
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size:
            raise ReasoningError(
                f"output[{k}] is {i!r}, not a token id of this vocabulary",
                path=f"output[{k}]",
                hint=f"ids of this model are in [0, {size}); check the model",
            )
    return ids


def _need(tokenizer: Tokenizer | None) -> Tokenizer:
    if tokenizer is None:
        raise ReasoningError("token ids need the model's tokenizer", path="tokenizer", hint="pass tokenizer= (or text)")
    return tokenizer


def _decode(tokenizer: Tokenizer | None, ids: list[int]) -> str:
    tok = _need(tokenizer)
    try:
        return tok.decode(ids)
    except CtxlockError:
        raise
    except Exception as exc:  # an id outside the vocabulary, in the backend's own words
        raise ReasoningError(f"the ids do not decode: {exc}", path="output", hint="check the model") from None
