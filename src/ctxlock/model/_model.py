"""A loaded model's input pipeline: request -> template -> tokenizer -> tensors, in that order only."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

# accounting, training and multimodal export their names lazily: a model that only encodes text never imports them
# (tests/project/test_imports.py).
from ctxlock import accounting, caches, training
from ctxlock import multimodal as mm_stage
from ctxlock.artifacts import ModelArtifacts, load_artifacts
from ctxlock.errors import ImagePlacementError, OptionError, TemplateNotFoundError
from ctxlock.model._output import parse_model_output
from ctxlock.pipeline import RequestLike
from ctxlock.request import Dialect, Request, ToolArguments, Utf8Policy, parse_request
from ctxlock.template import (
    BATCH_OPTIONS,
    ENCODE_OPTIONS,
    RENDER_OPTIONS,
    ChatTemplate,
    Rendered,
    RenderKwargs,
    RenderOptions,
    TemplateSet,
    check_options,
    render,
    render_options,
)
from ctxlock.tensors import (
    ModelInput,
    PaddingSide,
    TorchInput,
    assemble_batch,
    assemble_own,
    check_return_tensors,
    tensors_as,
)
from ctxlock.tokenizer import Tokenized, Tokenizer, encode_ids, encode_ids_batch, tokenize

if TYPE_CHECKING:
    from ctxlock.economics import Capacity
    from ctxlock.generation import ParsedMessage
    from ctxlock.multimodal import ImageFamily, MultimodalInput, StageOptions


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
    def capacity(self) -> Capacity:
        """The context window and output limit the model's files state, each with its source ("unknown" when none
        does), every value found and every conflict (see `ctxlock.economics`)."""
        return self.artifacts.capacity

    @property
    def hub(self) -> Any:
        """How a hub model's revision resolved (`ctxlock.artifacts.HubRevision`), or None for other models."""
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

    def parse_output(
        self,
        output: str | Sequence[int],
        *,
        request: RequestLike | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_format: str | None = None,
        reasoning: str | None = None,
        finish_reason: str | None = "stop",
        starts: str | None = None,
    ) -> ParsedMessage:
        """A completion of this model (its ids, or its text with special tokens kept) back into the assistant
        message: reasoning split off, tool calls read and checked against the declared tools (`tools`, else the
        `request`'s), the finish reason's consequences applied. The formats default to what the chat template
        writes; the request's prompt says whether the output starts inside reasoning (docs/parse.md)."""
        parsed_request = None if request is None else self.parse(request)
        template = None
        if self.templates is not None:
            template = self.templates.select(has_tools=bool(parsed_request is not None and parsed_request.tools)).source
        return parse_model_output(
            self,
            output,
            template=template,
            request=parsed_request,
            tools=tools,
            tool_format=tool_format,
            reasoning=reasoning,
            finish_reason=finish_reason,
            starts=starts,
        )

    def render(
        self, request: RequestLike, options: RenderOptions | None = None, **kwargs: Unpack[RenderKwargs]
    ) -> Rendered:
        """Render with the model's chat template: `options` (a `RenderOptions`), or its fields as keyword
        arguments (over `options` when both are given), with transformers' names.

        Unlike transformers, `add_generation_prompt` defaults to True (what a model receives at inference),
        and to False when `continue_final_message` is set. `injection` ("text", "keep", "raise") is the policy for
        control-token strings in request text. `provenance` is accepted and ignored: provenance is kept per
        character in the one render (it once chose whether a second render located request strings).
        `seed` (default 0) seeds the template's `random` filter and `lipsum`; `now` may carry a UTC offset.
        `tool_arguments="as-sent"` renders string tool-call arguments as sent (transformers) instead of parsed (vLLM).
        `content_format` ("auto", "string", "openai") says whether content-part lists reach the template as sent
        ("openai", transformers) or with their text parts joined into one string ("string", vLLM's flattening);
        "auto" detects what the template reads from its syntax tree (see `ctxlock.template.content_format`).
        A keyword argument not listed here is an `OptionError` naming it and what to use instead.
        """
        opts = render_options(options, kwargs, RENDER_OPTIONS, "render")
        return self._render(opts.parse(request), opts)

    def _render(self, request: Request, opts: RenderOptions) -> Rendered:
        if isinstance(opts.chat_template, ChatTemplate):
            templates: TemplateSet | ChatTemplate = opts.chat_template
        elif self.templates is None:
            raise TemplateNotFoundError(
                f"model {self.id!r} has no chat template",
                path=self.artifacts.source,
                hint="pass one with --template FILE (or chat_template=ChatTemplate(...))",
            )
        else:
            templates = self.templates
        # A model with an image processor renders as its HF processor does: image_url parts become image parts.
        request, rewritten = (
            mm_stage.processor_image_parts(request) if self.artifacts.preprocessor is not None else (request, ())
        )
        rendered = render(
            request,
            templates,
            opts,
            special_tokens=self.artifacts.special_tokens,
            control_tokens=self.tokenizer.control_tokens,
        )
        if rewritten:
            warnings = (*rendered.warnings, mm_stage.processor_parts_warning(rewritten))
            rendered = dataclasses.replace(rendered, warnings=warnings)
        return rendered

    @property
    def image_family(self) -> ImageFamily | None:
        """The image family the model directory's preprocessor_config.json names (None: no image processor)."""
        return mm_stage.family_for(
            self.artifacts.preprocessor, path=f"{self.artifacts.source}/preprocessor_config.json"
        )

    def run_images(
        self,
        request: RequestLike,
        options: RenderOptions | None = None,
        *,
        media: Mapping[str, bytes] | None = None,
        family: ImageFamily | None = None,
        images: StageOptions | None = None,
        decode: bool = True,
        **kwargs: Unpack[RenderKwargs],
    ) -> MultimodalInput:
        """A request with images (and videos, as lists of frames), as a multimodal model receives it: the render,
        each template placeholder expanded to its image's or video's tokens, the span maps {index: [start, end)}
        (`span_map()`, `video_span_map()`), and `pixel_values` / `pixel_values_videos` with their grids.

        `media` maps http(s) URLs to their bytes (ctxlock never fetches); `family` overrides the one the model's
        preprocessor_config.json names; `images` holds the pixel cap and the animation policy; `decode=False`
        stops at the headers (exact placeholder counts, no pixels). Takes `render`'s options."""
        opts = render_options(options, kwargs, RENDER_OPTIONS, "run_images")
        req = opts.parse(request)
        fam = family or self.image_family
        if fam is None:
            refs = _media_paths(req)
            raise ImagePlacementError(
                f"model {self.id!r} has no image processor (no preprocessor_config.json)",
                path=refs[0] if refs else "images",
                hint="this is a text-only model; pass family= to name the image processor",
            )
        stage = images or mm_stage.StageOptions()
        found = (mm_stage.process_images if decode else mm_stage.plan_images)(req, fam, media, stage)
        videos = (mm_stage.process_videos if decode else mm_stage.plan_videos)(req, fam, media, stage)
        rendered = self._render(req, opts)
        mm = mm_stage.expand(req, rendered, self.tokenize(rendered), self.tokenizer, fam, found, videos)
        # what the family's HF processor adds in its tokenize step (LLaVA's <s>); nothing for the others
        return mm_stage.with_processor_special_tokens(
            mm, fam, self.tokenizer, self.artifacts.special_tokens.get("bos_token")
        )

    def refuse_images(self, request: Request) -> None:
        """`ImagePlacementError` for a request with images or videos when this model expands them (an image
        processor, or a Tekken image section): the ids of `encode`, the assistant masks and `ctxlock batch` rows
        would hold unexpanded placeholders. A model with an image processor never gets them (vllm#16191)."""
        if self.artifacts.preprocessor is not None and (refs := _media_paths(request)):
            raise ImagePlacementError(
                "the request holds images or videos and this model expands them: the ids would hold unexpanded "
                "placeholders",
                path=refs[0],
                hint="use Model.run_images (or `ctxlock render`), which expands them and returns the span map; "
                "assistant masks and `ctxlock batch` rows take no images",
            )

    def tokenize(self, rendered: Rendered) -> Tokenized:
        return tokenize(rendered, self.tokenizer)

    def run(self, request: RequestLike, options: RenderOptions | None = None, **kwargs: Unpack[RenderKwargs]) -> Run:
        """Every stage's value for one request: the parsed Request, the Rendered text, the Tokenized ids and the
        ModelInput. Takes `render`'s options."""
        opts = render_options(options, kwargs, RENDER_OPTIONS, "run")
        req = opts.parse(request)
        self.refuse_images(req)
        rendered = self._render(req, opts)
        tokenized = self.tokenize(rendered)
        return Run(req, rendered, tokenized, assemble_own(tokenized.ids))

    def encode(
        self,
        request: RequestLike,
        options: RenderOptions | None = None,
        *,
        return_tensors: str | None = None,
        return_assistant_tokens_mask: bool = False,
        mask_options: training.MaskOptions | None = None,
        **kwargs: Unpack[RenderKwargs],
    ) -> ModelInput | TorchInput:
        """Request -> ModelInput (batch of one): the ids, mask and positions the model receives; a read-only mapping
        like transformers' BatchEncoding. Takes `render`'s options, and `return_tensors` as transformers does:
        None or "np" (numpy int64, the ModelInput itself) or "pt" (a `TorchInput` of torch.long tensors).

        Only ids are returned, so they come from `encode_ids` (equal to `run(...).tokenized.ids`, without the list
        of control matches).

        `return_assistant_tokens_mask=True` adds `assistant_masks` (1 on the tokens a model is trained on; the rule and
        `mask_options` are in `ctxlock.training`); `add_generation_prompt` then defaults to False, as for training."""
        if return_assistant_tokens_mask:
            check_return_tensors(return_tensors)
            return tensors_as(self._encode_masked(request, options, mask_options, kwargs), return_tensors)
        opts = render_options(options, kwargs, ENCODE_OPTIONS, "encode")
        check_return_tensors(return_tensors)  # an unsupported value (or no torch) fails before any work
        req = opts.parse(request)
        self.refuse_images(req)
        rendered = self._render(req, opts)
        return tensors_as(assemble_own(encode_ids(rendered, self.tokenizer)), return_tensors)

    def _encode_masked(
        self, request: RequestLike, options: Any, mask_options: training.MaskOptions | None, kwargs: Any
    ) -> ModelInput:
        if options is not None:
            raise OptionError(
                "return_assistant_tokens_mask takes render options as keyword arguments, not a RenderOptions",
                path="options",
                hint="pass add_generation_prompt=..., chat_template=..., ... as keywords",
            )
        check_options(kwargs, RENDER_OPTIONS, "encode")
        lay, mask = training.assistant_mask(self, request, mask_options, **{"add_generation_prompt": False, **kwargs})
        for note in mask.notes:  # not exact, or nothing found to train at a turn's end: never silent
            warnings.warn(f"assistant mask: {note}", stacklevel=3)
        return assemble_own(lay.ids).with_assistant_masks(mask.mask.reshape(1, -1))

    def encode_batch(
        self,
        requests: Sequence[RequestLike],
        options: RenderOptions | None = None,
        *,
        padding_side: PaddingSide | str = PaddingSide.LEFT,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
        **kwargs: Unpack[RenderKwargs],
    ) -> ModelInput | TorchInput:
        """Several requests padded into one batch; the pad id comes from the tokenizer config's pad_token.
        `return_tensors` as in `encode`."""
        opts = render_options(options, kwargs, BATCH_OPTIONS, "encode_batch")
        check_return_tensors(return_tensors)
        rendered = (self._render(opts.parse(r), opts) for r in requests)
        rows = encode_ids_batch(rendered, self.tokenizer)
        batch = assemble_batch(
            rows, pad_id=self.pad_id, padding_side=padding_side, pad_to_multiple_of=pad_to_multiple_of
        )
        return tensors_as(batch, return_tensors)

    def count(
        self,
        request: RequestLike,
        options: RenderOptions | None = None,
        *,
        marginal: bool = False,
        media: Mapping[str, bytes] | None = None,
        **kwargs: Unpack[RenderKwargs],
    ) -> accounting.Counts:
        """Every token of the request's `input_ids` attributed to one part (`template`, `system`, `tools[i]`,
        `messages[j]`, `documents[k]`, `generation_prompt`), the parts summing to the total; `marginal=True` also
        gives each part's marginal cost; `unseen` names the parts the template never wrote. Takes `render`'s
        options (see `ctxlock.accounting`). For a model with an image processor, each image's tokens are counted
        exactly from its header alone and owned by its message (`Counts.images` shows the resize steps); `media`
        gives the bytes of http(s) image URLs, as in `run_images`. Takes the render options as `encode` does: a
        `RenderOptions`, its fields as keywords (over it when both are given), or both."""
        options = {**(options.to_kwargs() if options is not None else {}), **kwargs}
        if self.artifacts.preprocessor is None:
            return accounting.count(self, request, marginal=marginal, **options)
        parse_keys = ("dialect", "utf8", "tool_arguments")
        req = self.parse(request, **{k: v for k, v in options.items() if k in parse_keys})
        if not _media_paths(req):
            return accounting.count(self, request, marginal=marginal, **options)
        # Images: the unexpanded render's counts, each placeholder then expanded from the image's header alone.
        render_kwargs = {k: v for k, v in options.items() if k not in parse_keys}
        counts = accounting.count(self, request, **options)
        counts = accounting.with_images(counts, self.run_images(req, decode=False, media=media, **render_kwargs))
        if marginal:
            note = "marginal costs are not computed for a request with images"
            counts = dataclasses.replace(counts, notes=(*counts.notes, note))
        return counts

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


def clear_caches(scope: caches.Scope | None = None) -> None:
    """Empty every registered in-process cache of ctxlock (`ctxlock.caches`): results never depend on them. With
    `scope="request"`, only the caches of values derived from requests (token runs, prefixes, the request memo,
    converted messages and tools), keeping compiled templates and loaded vocabularies: what the benchmarks call
    before each cold round. `scope="artifact"` empties only the latter."""
    caches.clear_caches(scope)


def load(model: str | None = None, *, tokenizer_pipeline: str = "class") -> Model:
    """Load a model by built-in name (`ctxlock models`), directory, .gguf file or org/name[@revision]; None is the
    embedded default. `tokenizer_pipeline` is for HF directories: "class" (what AutoTokenizer loads) or "file"
    (tokenizer.json's components as written; see `load_artifacts`)."""
    return Model(load_artifacts(model, tokenizer_pipeline=tokenizer_pipeline))


def _media_paths(request: Request) -> list[str]:
    """The JSON paths of the request's images and videos, in order of the messages."""
    found = [(r.message, r.path) for r in mm_stage.image_refs(request)] + [
        (v.message, v.path) for v in mm_stage.video_refs(request)
    ]
    return [p for _, p in sorted(found, key=lambda x: x[0])]
