"""Reasoning apart from the answer, over ids, safe under streaming (docs/reasoning.md).

A reasoning model writes its chain of thought before the answer, between two tags: `<think>` ... `</think>`
(Qwen3, DeepSeek-R1 and V3.1+, GLM-4.5+, Kimi-K2-Thinking), `<seed:think>` ... `</seed:think>` (Seed-OSS),
`<mm:think>` ... `</mm:think>` (MiniMax-M3),
`[THINK]` ... `[/THINK]` (Magistral). gpt-oss writes Harmony channels instead: `analysis` is the reasoning,
`final` the answer (`format="harmony"`).

`ReasoningSplitter` reads the generated ids and emits `ReasoningDelta` and `ContentDelta` events:

- **Over ids, not text.** A tag counts only as the tag's own token id. The same characters written by the model as
  ordinary text (reasoning about HTML, say) stay text, as request text never becomes a control token on the way in.
  The tags themselves reach neither stream, so a partial tag cannot leak into the content.
- **Where the output starts.** When the chat template's generation prompt already opened the block (DeepSeek-R1,
  Qwen3.5, DeepSeek-V3.1 with thinking on: the prompt ends with `<think>`), the output holds only the closing tag
  and starts inside reasoning; when the prompt closed an empty block (Qwen3 with `enable_thinking=False`), it
  starts in the content. `start_from_prompt` reads that from the rendered prompt; when the prompt says neither,
  the family's own rule applies (`ReasoningFormat.starts`, listed in docs/reasoning.md).
- **Cut off inside reasoning.** A response that ends inside a block has no content (none is invented), and the
  result says so: `reasoning_complete` is False, and a length stop sets `cut_off`.
- **Chunking does not matter.** The ids between two tags are decoded as one run (`tokenizer.decode` of that run),
  so the split is the same however the ids arrive, and the same as `split_reasoning` on the whole list.

`split_reasoning_text` does the same on text (for output that is only available as text); there a tag is matched
by its characters, and the result says so in its notes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from ctxlock.errors import ReasoningError
from ctxlock.generation._decode import IncrementalDecoder
from ctxlock.generation._harmony import HarmonyParser
from ctxlock.tokenizer import Tokenizer

Mode = Literal["reasoning", "content"]

# The output limit, in OpenAI's, vLLM's, Anthropic's and Mistral's words (as for tool calls: docs/way-back.md).
LENGTH_STOPS = frozenset({"length", "max_tokens", "model_length", "model_context_window_exceeded"})


@dataclass(frozen=True)
class ReasoningFormat:
    """How one family marks its reasoning.

    `open` / `close`: the tags. `ends`: tokens that end the reasoning without a closing tag and belong to the
    content (Qwen3 may start a `<tool_call>` straight from its reasoning, Kimi a tool-call section). `starts`:
    where the output starts when the prompt does not say (see `start_from_prompt`): "reasoning" for families whose
    models think first unless told not to, "content" for those that think only when asked (the template then
    opens the block) or write the opening tag themselves."""

    name: str
    open: str
    close: str
    starts: Mode
    ends: tuple[str, ...] = ()
    models: str = ""


REASONING_FORMATS: Mapping[str, ReasoningFormat] = {
    f.name: f
    for f in (
        ReasoningFormat("qwen3", "<think>", "</think>", "reasoning", ("<tool_call>",), "Qwen3, Qwen3.5, QwQ"),
        ReasoningFormat("deepseek_r1", "<think>", "</think>", "reasoning", (), "DeepSeek-R1 and its distills"),
        ReasoningFormat("deepseek_v3", "<think>", "</think>", "content", (), "DeepSeek-V3.1, V3.2 (thinking=True)"),
        ReasoningFormat("glm45", "<think>", "</think>", "content", (), "GLM-4.5, 4.6, 4.7"),
        # Kimi thinks by default and may go straight from its reasoning to a tool-call section (vLLM's
        # vllm/reasoning/kimi_k2_reasoning_parser.py: an implicit start, and <|tool_calls_section_begin|> ends it).
        ReasoningFormat(
            "kimi_k2", "<think>", "</think>", "reasoning", ("<|tool_calls_section_begin|>",), "Kimi-K2-Thinking, K2.5"
        ),
        ReasoningFormat("seed_oss", "<seed:think>", "</seed:think>", "reasoning", (), "Seed-OSS"),
        # MiniMax-M3's template opens the block for thinking_mode "enabled", closes an empty one for "disabled" and
        # leaves it to the model otherwise ("adaptive", its default): the model writes <mm:think> itself when it
        # thinks (MiniMax-M3.jinja, in llama.cpp's models/templates/).
        ReasoningFormat("minimax_m3", "<mm:think>", "</mm:think>", "content", (), "MiniMax-M3"),
        ReasoningFormat("mistral", "[THINK]", "[/THINK]", "content", (), "Magistral"),
    )
}
HARMONY = "harmony"  # gpt-oss: Harmony channels (analysis is reasoning, final is content)


def reasoning_format(name: str | ReasoningFormat) -> ReasoningFormat:
    """The format named `name` (a key of `REASONING_FORMATS`), or `name` itself if it is a `ReasoningFormat`."""
    if isinstance(name, ReasoningFormat):
        return name
    found = REASONING_FORMATS.get(name) if isinstance(name, str) else None
    if found is None:
        known = ", ".join([*REASONING_FORMATS, HARMONY])
        raise ReasoningError(f"unknown reasoning format {name!r}", path="format", hint=f"use one of: {known}")
    return found


def start_from_prompt(fmt: str | ReasoningFormat, prompt: str) -> Mode | None:
    """Where the output of `prompt` (the rendered text, generation prompt included) starts: "reasoning" when the
    prompt's last tag opens a block, "content" when it closes one at the very end (an empty block written by the
    template: thinking off), None when the prompt says neither (the family's `starts` applies)."""
    f = reasoning_format(fmt)
    opened, closed = prompt.rfind(f.open), prompt.rfind(f.close)
    if opened > closed:
        return "reasoning"
    if closed >= 0 and not prompt[closed + len(f.close) :].strip():
        return "content"
    return None


# ---------------------------------------------------------------------------------------------------- events


@dataclass(frozen=True)
class ReasoningDelta:
    """Reasoning text, final (no later id changes it)."""

    text: str


@dataclass(frozen=True)
class ContentDelta:
    """Answer text, final."""

    text: str


ReasoningEvent = ReasoningDelta | ContentDelta


@dataclass(frozen=True)
class ReasoningResult:
    """The split of one response.

    `reasoning` is None when the response never entered reasoning ("" for an empty block); `content` is None when
    it has no answer text (a response cut off inside reasoning has none: nothing is invented). `reasoning_complete`
    is False when the response ended inside a block; `cut_off` when that end was the output limit. `notes` says
    what was dropped or assumed (a stray tag, the start taken from the family's rule, tags matched as text)."""

    reasoning: str | None
    content: str | None
    reasoning_complete: bool
    cut_off: bool
    finish_reason: str | None
    starts: Mode
    notes: tuple[str, ...] = ()
    events: tuple[ReasoningEvent, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, object]:
        return {
            "reasoning": self.reasoning,
            "content": self.content,
            "reasoning_complete": self.reasoning_complete,
            "cut_off": self.cut_off,
            "finish_reason": self.finish_reason,
            "starts": self.starts,
            "notes": list(self.notes),
        }


# ------------------------------------------------------------------------------------------------ the core


class _Split:
    """The state machine both entry points share: pieces in (text, or a tag), events out."""

    def __init__(self, fmt: ReasoningFormat, starts: Mode) -> None:
        self.fmt = fmt
        self.mode: Mode = starts
        self.fresh = True  # nothing written in the current block yet (a leading open tag is the template's own)
        self.entered = starts == "reasoning"
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.events: list[ReasoningEvent] = []
        self.notes: list[str] = []

    def text(self, text: str) -> None:
        if not text:
            return
        self.fresh = False
        if self.mode == "reasoning":
            self.reasoning.append(text)
            self.events.append(ReasoningDelta(text))
        else:
            self.content.append(text)
            self.events.append(ContentDelta(text))

    def tag(self, tag: str, where: str) -> None:
        f = self.fmt
        if tag == f.open:
            if self.mode == "content":
                self.mode, self.fresh, self.entered = "reasoning", True, True
            elif not self.fresh:
                self.notes.append(f"{where}: {f.open} inside reasoning dropped (blocks do not nest)")
            self.fresh = False
        elif tag == f.close:
            if self.mode == "reasoning":
                self.mode, self.fresh = "content", True
            else:
                # vLLM keeps a stray closing tag in the content (its base thinking parser's "multiple end tokens"
                # case); a tag is never answer text, so it is dropped here, and said.
                self.notes.append(f"{where}: {f.close} outside reasoning dropped (a tag is not answer text)")
        elif self.mode == "reasoning":  # an implicit end: the token starts the content
            self.mode = "content"
            self.notes.append(f"{where}: {tag} ended the reasoning without {f.close}")
            self.text(tag)
        else:
            self.text(tag)

    def result(self, finish_reason: str | None, starts: Mode, extra: Sequence[str] = ()) -> ReasoningResult:
        inside = self.mode == "reasoning"
        cut = inside and finish_reason in LENGTH_STOPS
        notes = [*extra, *self.notes]
        if inside:
            how = "hit the output limit" if cut else f"ended (finish_reason={finish_reason!r})"
            notes.append(
                f"the response {how} inside reasoning, before {self.fmt.close}: the reasoning is incomplete and"
                " there is no answer"
            )
        return ReasoningResult(
            reasoning="".join(self.reasoning) if self.entered else None,
            content="".join(self.content) or None,
            reasoning_complete=not inside,
            cut_off=cut,
            finish_reason=finish_reason,
            starts=starts,
            notes=tuple(notes),
            events=tuple(self.events),
        )


def _starts(fmt: ReasoningFormat, prompt: str | None, starts: Mode | None) -> tuple[Mode, list[str]]:
    if starts is not None:
        if starts not in ("reasoning", "content"):
            raise ReasoningError(
                f"starts must be 'reasoning' or 'content', got {starts!r}",
                path="starts",
                hint="or pass prompt= (the rendered prompt) to read it from the template",
            )
        return starts, []
    if prompt is not None:
        found = start_from_prompt(fmt, prompt)
        if found is not None:
            return found, []
        return fmt.starts, [f"the prompt neither opens nor closes {fmt.open}: starting in {fmt.starts} ({fmt.name})"]
    return fmt.starts, [f"no prompt given: starting in {fmt.starts}, the {fmt.name} family's rule"]


# ------------------------------------------------------------------------------------------- over ids


class ReasoningSplitter:
    """Generated ids in, `ReasoningDelta` / `ContentDelta` events out (see the module docstring).

    `format`: a key of `REASONING_FORMATS`, a `ReasoningFormat`, or "harmony" (gpt-oss). `prompt`: the rendered
    prompt, to read where the output starts (`start_from_prompt`); `starts` says it outright.
    `skip_special_tokens` applies to the other special tokens in the output (an end-of-turn token, for one), as in
    `tokenizer.decode`."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        format: str | ReasoningFormat,
        *,
        prompt: str | None = None,
        starts: Mode | None = None,
        skip_special_tokens: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._count = 0
        self._finished = False
        self._harmony: _HarmonySplit | None = None
        if format == HARMONY:
            self.format: ReasoningFormat | None = None
            self._harmony = _HarmonySplit(tokenizer)
            self.starts: Mode = "content"
            return
        fmt = reasoning_format(format)
        self.format = fmt
        self.starts, self._start_notes = _starts(fmt, prompt, starts)
        self._tags = _tag_ids(tokenizer, fmt)
        self._split = _Split(fmt, self.starts)
        self._decoder = IncrementalDecoder(tokenizer, skip_special_tokens=skip_special_tokens)

    def feed(self, ids: int | Iterable[int]) -> list[ReasoningEvent]:
        """Take the next id (or ids); return the events they complete."""
        if self._finished:
            raise ReasoningError("feed() after finish()", path="ids", hint="start a new ReasoningSplitter")
        for token in [ids] if isinstance(ids, int) else ids:
            self._push(token)
        return self._take()

    def finish(self, finish_reason: str | None = None) -> ReasoningResult:
        """End the stream; `finish_reason` is the response's own ("stop", "length", ...)."""
        if self._finished:
            raise ReasoningError("finish() called twice", path="ids", hint="start a new ReasoningSplitter")
        self._finished = True
        if self._harmony is not None:
            return self._harmony.finish(finish_reason)
        self._split.text(self._decoder.finish(errors="replace"))
        return self._split.result(finish_reason, self.starts, self._start_notes)

    def _push(self, token: int) -> None:
        index = self._count
        self._count += 1
        if self._harmony is not None:
            self._harmony.push(token)
            return
        tag = self._tags.get(token)
        if tag is None:
            self._split.text(self._decoder.push(token))
            return
        # The run before the tag ends here: decode it as a whole run (tokenizer.decode of those ids).
        self._split.text(self._decoder.finish(errors="replace"))
        self._decoder = IncrementalDecoder(self.tokenizer, skip_special_tokens=self.skip_special_tokens)
        self._split.tag(tag, f"ids[{index}]")

    def _take(self) -> list[ReasoningEvent]:
        source = self._harmony if self._harmony is not None else self._split
        out, source.events = source.events, []
        return out


def split_reasoning(
    tokenizer: Tokenizer,
    ids: Sequence[int],
    format: str | ReasoningFormat,
    *,
    finish_reason: str | None = None,
    prompt: str | None = None,
    starts: Mode | None = None,
    skip_special_tokens: bool = False,
) -> ReasoningResult:
    """The whole response at once: the same split as feeding `ids` to a `ReasoningSplitter` in any chunking."""
    splitter = ReasoningSplitter(
        tokenizer, format, prompt=prompt, starts=starts, skip_special_tokens=skip_special_tokens
    )
    events = splitter.feed(ids)
    result = splitter.finish(finish_reason)
    return _with_events(result, (*events, *result.events))


def _with_events(result: ReasoningResult, events: tuple[ReasoningEvent, ...]) -> ReasoningResult:
    return replace(result, events=events)


def _tag_ids(tokenizer: Tokenizer, fmt: ReasoningFormat) -> dict[int, str]:
    """The id of each tag; a tag that is not one token of this vocabulary cannot be told from text over ids."""
    tags: dict[int, str] = {}
    for tag in (fmt.open, fmt.close, *fmt.ends):
        token = tokenizer.token_to_id(tag)
        if token is None or tokenizer.decode([token]) != tag:
            raise ReasoningError(
                f"{tag!r} is not one token of this vocabulary, so the {fmt.name} format cannot find it in ids",
                path="format",
                hint="check the model's format; for output that only exists as text, use split_reasoning_text",
            )
        tags[token] = tag
    return tags


class _HarmonySplit:
    """gpt-oss: the analysis channel is the reasoning, the final channel the answer. A commentary message with a
    recipient is a tool call (parsed by the harmony tool-call format) and a commentary preamble without one is
    text for the user; both go to the content's notes rather than being dropped silently."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.parser = HarmonyParser(tokenizer, role="assistant", strict=False)
        self.events: list[ReasoningEvent] = []
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.entered = False
        self.notes: list[str] = []
        self._seen = 0  # messages already accounted for

    def push(self, token: int) -> None:
        p = self.parser
        p.process(token)
        delta = p.last_content_delta
        channel = p.current_channel
        if channel == "analysis":
            self.entered = True
        if delta:
            if channel == "analysis":
                self.reasoning.append(delta)
                self.events.append(ReasoningDelta(delta))
            elif channel == "final" or (channel == "commentary" and p.current_recipient is None):
                self.content.append(delta)
                self.events.append(ContentDelta(delta))
        self._note_messages()

    def _note_messages(self) -> None:
        for message in self.parser.messages[self._seen :]:
            if message.channel == "commentary" and message.recipient is not None:
                self.notes.append(
                    f"a tool call to {message.recipient} is not content (read it with the harmony format)"
                )
            elif message.channel == "commentary":
                self.notes.append("a commentary preamble is in the content (text the model meant for the user)")
        self._seen = len(self.parser.messages)

    def finish(self, finish_reason: str | None) -> ReasoningResult:
        p = self.parser
        inside = p.state == "content" and p.current_channel == "analysis"
        in_header = p.state == "header" and bool(p.tokens)
        if p.state != "header":
            p.process_eos()
        self._note_messages()
        cut = inside and finish_reason in LENGTH_STOPS
        notes = list(self.notes)
        if in_header:  # openai-harmony's parser refuses this end; the message had not started, so nothing is lost
            notes.append(f"the response ended inside a message header (finish_reason={finish_reason!r})")
        if inside:
            how = "hit the output limit" if cut else f"ended (finish_reason={finish_reason!r})"
            notes.append(f"the response {how} inside the analysis channel: the reasoning is incomplete")
        events, self.events = tuple(self.events), []
        return ReasoningResult(
            reasoning="".join(self.reasoning) if self.entered else None,
            content="".join(self.content) or None,
            reasoning_complete=not inside,
            cut_off=cut,
            finish_reason=finish_reason,
            starts="content",
            notes=tuple(notes),
            events=events,
        )


# ------------------------------------------------------------------------------------------- over text


def split_reasoning_text(
    text: str,
    format: str | ReasoningFormat,
    *,
    finish_reason: str | None = None,
    prompt: str | None = None,
    starts: Mode | None = None,
) -> ReasoningResult:
    """`split_reasoning` for output that only exists as text: a tag is matched by its characters, so a tag the
    model wrote as ordinary text counts too (the notes say so). Use the ids when you have them."""
    fmt = reasoning_format(format)
    mode, notes = _starts(fmt, prompt, starts)
    split = _Split(fmt, mode)
    tags = sorted({fmt.open, fmt.close, *fmt.ends}, key=len, reverse=True)
    i = 0
    while i < len(text):
        hits = [(text.find(t, i), t) for t in tags]
        found = [(at, t) for at, t in hits if at >= 0]
        if not found:
            split.text(text[i:])
            break
        at, tag = min(found, key=lambda h: (h[0], -len(h[1])))
        split.text(text[i:at])
        split.tag(tag, f"text[{at}]")
        i = at + len(tag)
    notes.append("tags matched as text: a tag the model wrote as ordinary characters counts as a tag")
    return split.result(finish_reason, mode, notes)
