"""A loaded model's input pipeline: request -> template -> tokenizer -> tensors, in that order only."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .artifacts import ModelArtifacts, load_artifacts
from .errors import OptionError, TemplateNotFoundError
from .request import Dialect, Request, ToolArguments, Utf8Policy, clear_request_memo, parse_request
from .template import (
    DEFAULT_LIMITS,
    ChatTemplate,
    ContentFormat,
    Rendered,
    RenderLimits,
    SpecialTokenPolicy,
    TemplateSet,
    clear_request_caches,
    render,
)
from .tensors import (
    ModelInput,
    PaddingSide,
    TorchInput,
    _assemble_own,
    assemble_batch,
    check_return_tensors,
    tensors_as,
)
from .tokenizer import Tokenized, Tokenizer, encode_ids, encode_ids_batch, tokenize
from .tokenizer.prefix import clear_prefix_caches
from .tokenizer.runs import RUNS

RequestLike = Request | Mapping[str, Any] | str | bytes

# The keyword arguments each method takes (render's own, then what encode and encode_batch add).
RENDER_OPTIONS = (
    "add_generation_prompt",
    "continue_final_message",
    "tools",
    "documents",
    "chat_template_kwargs",
    "template",
    "special_tokens",
    "now",
    "dialect",
    "utf8",
    "tool_arguments",
    "content_format",
    "limits",
    "provenance",
    "seed",
)
ENCODE_OPTIONS = (*RENDER_OPTIONS, "return_tensors")
BATCH_OPTIONS = (*ENCODE_OPTIONS, "padding_side", "pad_to_multiple_of")

_FIT = (
    "ctxlock never cuts a conversation silently: fit it to a token budget with "
    "ctxlock.budget.fit_context(request, model, BudgetPolicy(max_input_tokens=N)) (CLI: ctxlock fit "
    "--max-input-tokens N), which keeps whole turns and lists what it dropped"
)
_PADDING = "padding is encode_batch's: encode_batch([...], padding_side='left'|'right', pad_to_multiple_of=N)"
# transformers' apply_chat_template / tokenizer options, and what to use in ctxlock instead.
_INSTEAD = {
    "truncation": _FIT,
    "max_length": _FIT,
    "padding": "encode_batch pads every row to the longest (padding_side=, pad_to_multiple_of=); "
    "encode returns one unpadded row",
    "padding_side": _PADDING,
    "pad_to_multiple_of": _PADDING,
    "return_assistant_tokens_mask": "not supported: ctxlock computes no assistant-token mask ({% generation %} "
    "renders its body unchanged); run(...).rendered.request_spans maps rendered text to the request paths "
    "(messages[i].content) it came from",
    "return_dict": "not needed: encode/encode_batch return a ModelInput, a mapping of input_ids, attention_mask "
    "and position_ids (what return_dict=True gives); render returns a Rendered (.text)",
    "tokenize": "render() is tokenize=False (Rendered.text); encode() is tokenize=True (a ModelInput of ids)",
    "return_tensors": "return_tensors is encode's and encode_batch's ('np' or 'pt'); "
    "run(...).model_input.as_tensors('pt') converts a run's",
    "chat_template": "pass template=: a name of the model's template set, or a ctxlock.ChatTemplate",
    "tokenizer_kwargs": "the rendered text is encoded as it is, with control tokens only from the template; "
    "model.tokenizer.encode(text, ...) takes the tokenizer's own options",
    "add_special_tokens": "the chat template writes BOS/EOS itself and ctxlock adds none to a rendered chat; "
    "model.tokenizer.encode(text, add_special_tokens=True) is for raw text",
    "return_attention_mask": "encode always returns attention_mask (and position_ids) in the ModelInput",
}


def check_options(options: Mapping[str, Any], accepted: Sequence[str], method: str) -> None:
    """Refuse a keyword argument `method` does not take with an OptionError naming it and saying what to use
    instead (a transformers option ctxlock does otherwise, or a close match for a typo)."""
    for name in options:
        if name in accepted:
            continue
        if name in _INSTEAD:
            hint = _INSTEAD[name]
        else:
            close = difflib.get_close_matches(name, accepted, n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]!r}? " if close else "") + f"{method} takes: {', '.join(accepted)}"
        raise OptionError(f"{method}() got an unexpected keyword argument {name!r}", path=name, hint=hint)


@dataclass(frozen=True)
class Run:
    """Everything one request went through: the values each stage produced."""

    request: Request
    rendered: Rendered
    tokenized: Tokenized
    model_input: ModelInput


class Model:
    """A model's input artifacts, and the pipeline that turns requests into exactly what the model receives."""

    def __init__(self, artifacts: ModelArtifacts) -> None:
        self.artifacts = artifacts

    def __repr__(self) -> str:
        return f"Model({self.id!r}, tokenizer={self.tokenizer.id!r})"

    @property
    def id(self) -> str:
        return self.artifacts.id

    @property
    def tokenizer(self) -> Tokenizer:
        return self.artifacts.tokenizer

    @property
    def templates(self) -> TemplateSet | None:
        return self.artifacts.templates

    @property
    def special_tokens(self) -> dict[str, str]:
        return dict(self.artifacts.special_tokens)

    @property
    def pad_id(self) -> int | None:
        return self.artifacts.pad_id

    @property
    def hub(self) -> Any:
        """How a hub model's revision resolved (`ctxlock.artifacts.hub.HubRevision`), or None for other models."""
        return self.artifacts.hub

    def parse(
        self,
        request: RequestLike,
        *,
        dialect: Dialect | str | None = None,
        utf8: Utf8Policy | str = "strict",
        tool_arguments: ToolArguments | str = ToolArguments.PARSED,
        **unknown: Any,
    ) -> Request:
        if unknown:
            check_options(unknown, ("dialect", "utf8", "tool_arguments"), "parse")
        if isinstance(request, Request):
            return request
        return parse_request(request, dialect=dialect, utf8=utf8, tool_arguments=tool_arguments)

    def render(
        self,
        request: RequestLike,
        *,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        template: str | ChatTemplate | None = None,
        special_tokens: SpecialTokenPolicy | str = SpecialTokenPolicy.TEXT,
        now: datetime | None = None,
        dialect: Dialect | str | None = None,
        utf8: Utf8Policy | str = "strict",
        tool_arguments: ToolArguments | str = ToolArguments.PARSED,
        content_format: ContentFormat | str = ContentFormat.AUTO,
        limits: RenderLimits = DEFAULT_LIMITS,
        provenance: bool | None = None,
        seed: int | None = None,
        **unknown: Any,
    ) -> Rendered:
        """Render with the model's chat template. Options carry transformers' names.

        Unlike transformers, `add_generation_prompt` defaults to True (what a model receives at inference),
        and to False when `continue_final_message` is set. `provenance` is accepted and ignored: provenance is kept
        per character in the one render (it once chose whether a second render located request strings).
        `seed` (default 0) seeds the template's `random` filter and `lipsum`; `now` may carry a UTC offset.
        `tool_arguments="as-sent"` renders string tool-call arguments as sent (transformers) instead of parsed (vLLM).
        `content_format` ("auto", "string", "openai") says whether content-part lists reach the template as sent
        ("openai", transformers) or with their text parts joined into one string ("string", vLLM's flattening);
        "auto" detects what the template reads from its syntax tree (see `ctxlock.template.content_format`).
        A keyword argument not listed here is an `OptionError` naming it and what to use instead.
        """
        if unknown:
            check_options(unknown, RENDER_OPTIONS, "render")
        req = self.parse(request, dialect=dialect, utf8=utf8, tool_arguments=tool_arguments)
        if isinstance(template, ChatTemplate):
            templates: TemplateSet | ChatTemplate = template
            name = None
        else:
            if self.templates is None:
                raise TemplateNotFoundError(
                    f"model {self.id!r} has no chat template",
                    path=self.artifacts.source,
                    hint="pass one with --template FILE (or template=ChatTemplate(...))",
                )
            templates, name = self.templates, template
        if add_generation_prompt is None:
            add_generation_prompt = not continue_final_message
        return render(
            req,
            templates,
            template_name=name,
            special_tokens=self.artifacts.special_tokens,
            control_tokens=self.tokenizer.control_tokens,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            documents=documents,
            chat_template_kwargs=chat_template_kwargs,
            policy=special_tokens,
            now=now,
            limits=limits,
            provenance=provenance,
            seed=seed,
            content_format=content_format,
        )

    def tokenize(self, rendered: Rendered) -> Tokenized:
        return tokenize(rendered, self.tokenizer)

    def run(self, request: RequestLike, **options: Any) -> Run:
        """Every stage's value for one request: the parsed Request, the Rendered text, the Tokenized ids and the
        ModelInput. Takes `render`'s options."""
        check_options(options, RENDER_OPTIONS, "run")
        dialect = options.pop("dialect", None)
        utf8 = options.pop("utf8", "strict")
        args = options.pop("tool_arguments", ToolArguments.PARSED)
        req = self.parse(request, dialect=dialect, utf8=utf8, tool_arguments=args)
        rendered = self.render(req, **options)
        tokenized = self.tokenize(rendered)
        return Run(req, rendered, tokenized, _assemble_own(tokenized.ids))

    def encode(
        self, request: RequestLike, *, return_tensors: str | None = None, **options: Any
    ) -> ModelInput | TorchInput:
        """Request -> ModelInput (batch of one): the ids, mask and positions the model receives; a read-only mapping
        like transformers' BatchEncoding. Takes `render`'s options, and `return_tensors` as transformers does:
        None or "np" (numpy int64, the ModelInput itself) or "pt" (a `TorchInput` of torch.long tensors).

        Only ids are returned, so they come from `encode_ids` (equal to `run(...).tokenized.ids`, without the list
        of control matches)."""
        check_options(options, ENCODE_OPTIONS, "encode")
        check_return_tensors(return_tensors)  # an unsupported value (or no torch) fails before any work
        dialect = options.pop("dialect", None)
        utf8 = options.pop("utf8", "strict")
        args = options.pop("tool_arguments", ToolArguments.PARSED)
        rendered = self.render(self.parse(request, dialect=dialect, utf8=utf8, tool_arguments=args), **options)
        return tensors_as(_assemble_own(encode_ids(rendered, self.tokenizer)), return_tensors)

    def encode_batch(
        self,
        requests: Sequence[RequestLike],
        *,
        padding_side: PaddingSide | str = PaddingSide.LEFT,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
        **options: Any,
    ) -> ModelInput | TorchInput:
        """Several requests padded into one batch; the pad id comes from the tokenizer config's pad_token.
        `return_tensors` as in `encode`."""
        check_options(options, BATCH_OPTIONS, "encode_batch")
        check_return_tensors(return_tensors)
        dialect = options.pop("dialect", None)
        utf8 = options.pop("utf8", "strict")
        args = options.pop("tool_arguments", ToolArguments.PARSED)
        rendered = (
            self.render(self.parse(r, dialect=dialect, utf8=utf8, tool_arguments=args), **options) for r in requests
        )
        rows = encode_ids_batch(rendered, self.tokenizer)
        batch = assemble_batch(
            rows, pad_id=self.pad_id, padding_side=padding_side, pad_to_multiple_of=pad_to_multiple_of
        )
        return tensors_as(batch, return_tensors)

    def warm_up(self, *, wait: bool = True) -> dict[str, str]:
        """Make the first `encode` as fast as the rest: choose the tokenizer's engine (the load-time equivalence
        check, cached on disk) and build the whole-text encoder; with `wait`, also build fastokens and check it against
        the exact path (about 2 s for a 150k vocabulary, about 1.2 s once an earlier process has left the check's
        verdict on disk; without `wait` the first encode starts that on a daemon thread, and tiktoken makes the calls
        meanwhile, with the same ids; an exiting interpreter waits for that thread). A server calls this once at
        start-up. Returns what `ctxlock inspect` prints about the engines."""
        tok = self.tokenizer
        whole = tok.whole_text
        if whole is not None and whole.accelerator is not None and wait:
            whole.accelerator.wait()
        return {"engine": tok.engine, "whole_text_engine": tok.whole_text_engine}


def clear_caches() -> None:
    """Empty every process-wide cache of ctxlock's fast paths: the token-run cache, each tokenizer's prefix cache,
    the request memo and the per-request template caches (compiled templates and loaded models stay). Results never
    depend on these caches; benchmarks call this so that each round starts cold."""
    RUNS.clear()
    clear_prefix_caches()
    clear_request_caches()
    clear_request_memo()


def load(model: str | None = None, *, tokenizer_pipeline: str = "class") -> Model:
    """Load a model by built-in name (`ctxlock models`), directory, .gguf file or org/name[@revision]; None is the
    embedded default. `tokenizer_pipeline` is for HF directories: "class" (what AutoTokenizer loads) or "file"
    (tokenizer.json's components as written; see `load_artifacts`)."""
    return Model(load_artifacts(model, tokenizer_pipeline=tokenizer_pipeline))
