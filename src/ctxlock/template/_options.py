"""The caller's choices for one render, as one frozen value: `RenderOptions`.

Every way into the pipeline builds the same value: the Python API's keyword arguments (transformers' names,
`model.encode(request, add_generation_prompt=True)`, checked here: an unknown name is an `OptionError` saying what
to use instead), the CLI's flags, and a record's `options` (replay). The stages then read its fields:
`RenderOptions.parse` reads the request with the parse options (dialect, UTF-8 policy, tool-call arguments), and
`template.render` takes the value itself.

    keyword arguments --from_kwargs--+
    CLI flags (cli/render.py) -------+--> RenderOptions --parse--> Request --template.render--> Rendered
    record options --from_record-----+        |
                                              +--to_record--> the record's `options` (byte for byte as before)

The value is hashable and compares by content: tools, documents and template variables are frozen (`freeze`),
and the enums (`InjectionPolicy`, `ContentFormat`, the request's `Dialect`, `Utf8Policy`, `ToolArguments`)
are StrEnums, equal to their strings. A value that names no member is kept as given, so that the stage that
reads it refuses it with the error it always gave.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypedDict

from ctxlock.core import FrozenDict, freeze, thaw
from ctxlock.errors import OptionError
from ctxlock.request import Dialect, Request, ToolArguments, Utf8Policy, parse_request
from ctxlock.template.sandbox._env import DEFAULT_LIMITS, RenderLimits


class InjectionPolicy(StrEnum):
    """What to do with control-token strings that come from request text (the injection policy)."""

    TEXT = "text"  # default: encode them as plain text, never as control ids
    KEEP = "keep"  # reference behaviour (transformers, vLLM, llama.cpp): unsafe, must be asked for
    RAISE = "raise"  # reject the request, naming the JSON path


class ContentFormat(StrEnum):
    """How content-part lists (`"content": [{"type": "text", "text": ...}]`) reach the template.

    `openai`: as sent, a list of parts (transformers' behaviour); `string`: the text parts joined with "\n" into
    one string (vLLM's flattening for templates that read content as a string); `auto`: whichever the template's
    syntax tree says it reads (`content_format(source)`)."""

    AUTO = "auto"
    STRING = "string"
    OPENAI = "openai"


class RenderKwargs(TypedDict, total=False):
    """The keyword form of `RenderOptions` that `Model.render`, `run`, `encode` and `encode_batch` take
    (transformers' names where transformers has the option)."""

    add_generation_prompt: bool | None
    continue_final_message: bool
    tools: list[dict[str, Any]] | None
    documents: list[dict[str, Any]] | None
    chat_template_kwargs: Mapping[str, Any] | None
    chat_template: Any  # a template name of the model's set, or a ChatTemplate (transformers' name)
    injection: InjectionPolicy | str
    now: datetime | None
    dialect: Dialect | str | None
    utf8: Utf8Policy | str
    tool_arguments: ToolArguments | str
    content_format: ContentFormat | str
    limits: RenderLimits
    provenance: bool | None  # accepted and ignored (provenance is always kept)
    seed: int | None


# The names each Model method takes, in the order its OptionError lists them.
RENDER_OPTIONS = (
    "add_generation_prompt",
    "continue_final_message",
    "tools",
    "documents",
    "chat_template_kwargs",
    "chat_template",
    "injection",
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
PARSE_OPTIONS = ("dialect", "utf8", "tool_arguments")

_FIT = (
    "ctxlock never cuts a conversation silently: fit it to a token budget with "
    "ctxlock.fit_context(request, model, ctxlock.BudgetPolicy(max_input_tokens=N)) (CLI: ctxlock fit "
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
    "return_assistant_mask": "the option is encode(..., return_assistant_tokens_mask=True) (transformers' name), "
    "which adds assistant_masks to the ModelInput: from the template's {% generation %} blocks as transformers does, "
    "and from provenance for a template without them (ctxlock.training; options in mask_options=MaskOptions(...))",
    "return_assistant_tokens_mask": "return_assistant_tokens_mask is encode's: encode(..., "
    "return_assistant_tokens_mask=True) adds assistant_masks to the ModelInput (ctxlock.training)",
    "special_tokens": "the injection policy is injection= ('text', 'keep' or 'raise'; the CLI's --injection)",
    "return_dict": "not needed: encode/encode_batch return a ModelInput, a mapping of input_ids, attention_mask "
    "and position_ids (what return_dict=True gives); render returns a Rendered (.text)",
    "tokenize": "render() is tokenize=False (Rendered.text); encode() is tokenize=True (a ModelInput of ids)",
    "return_tensors": "return_tensors is encode's and encode_batch's ('np' or 'pt'); "
    "run(...).model_input.as_tensors('pt') converts a run's",
    "template": "the option is chat_template= (transformers' name): a name of the model's template set, or a "
    "ctxlock.ChatTemplate",
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


def _member(enum: type[StrEnum], value: Any) -> Any:
    """`value` as a member of `enum`, or as given when it names none (the stage reading it says why)."""
    if isinstance(value, enum):
        return value
    try:
        return enum(value)
    except (ValueError, TypeError):
        return value


@dataclass(frozen=True)
class RenderOptions:
    """What the caller chose for one render (and for reading its request). Every field has the default
    `Model.render` has; `template.render` reads the render fields, `parse` the parse fields.

    `add_generation_prompt=None` is True unless `continue_final_message` is set (`generation_prompt`).
    `chat_template` (transformers' name) is a name of the model's template set or a `ChatTemplate` (typed Any:
    `ChatTemplate` is defined in `_render.py`, which imports this module). `injection` is the policy for
    control-token strings in request text (the CLI's `--injection`). `limits=None` is `DEFAULT_LIMITS`, and is not
    recorded; a value, even equal to the defaults, is (as `--template-timeout` asks). Tools, documents and template
    variables are stored frozen and reach the template as fresh plain values (`thaw`).

    The clock is timezone-aware: `now` (default: the local wall clock, with the local zone; a naive `now` is taken
    as local time) is recorded with its offset, and `strftime_now` formats its wall time without a zone, as
    transformers' `datetime.now().strftime(fmt)` does on a machine in that zone at that instant. `seed` (default
    0) seeds the one random generator a template can draw from (jinja's `random` filter and `lipsum`), so the same
    inputs give the same text. `content_format` says how content-part lists reach the template (`ContentFormat`):
    with "auto", a template that reads content as a string gets each all-text list joined with "\n" (vLLM's
    flattening; transformers passes the list, which such a template cannot read)."""

    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    tools: tuple[FrozenDict, ...] | None = None
    documents: tuple[FrozenDict, ...] | None = None
    chat_template_kwargs: FrozenDict | None = None
    chat_template: Any = None
    injection: InjectionPolicy = InjectionPolicy.TEXT
    now: datetime | None = None
    dialect: Dialect | None = None
    utf8: Utf8Policy = Utf8Policy.STRICT
    tool_arguments: ToolArguments = ToolArguments.PARSED
    content_format: ContentFormat = ContentFormat.AUTO
    limits: RenderLimits | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        # Built on every keyword call of a Model method: the common case (members, nothing to freeze) is checks only.
        set_ = object.__setattr__
        if self.tools is not None or self.documents is not None or self.chat_template_kwargs is not None:
            for name in ("tools", "documents", "chat_template_kwargs"):
                value = getattr(self, name)
                if value is not None and not isinstance(value, FrozenDict | tuple):
                    value = freeze(value)
                # An empty list or mapping renders as None does (nothing added): one value for both.
                set_(self, name, None if isinstance(value, FrozenDict | tuple) and not value else value)
        if type(self.injection) is not InjectionPolicy:
            set_(self, "injection", _member(InjectionPolicy, self.injection))
        if type(self.content_format) is not ContentFormat:
            set_(self, "content_format", _member(ContentFormat, self.content_format))
        if type(self.utf8) is not Utf8Policy:
            set_(self, "utf8", _member(Utf8Policy, self.utf8))
        if type(self.tool_arguments) is not ToolArguments:
            set_(self, "tool_arguments", _member(ToolArguments, self.tool_arguments))
        if self.dialect is not None and type(self.dialect) is not Dialect:
            set_(self, "dialect", _member(Dialect, self.dialect))

    # -- what the stages read

    @property
    def generation_prompt(self) -> bool:
        """`add_generation_prompt` resolved: True unless `continue_final_message` is set, when not given."""
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        return self.add_generation_prompt

    @property
    def render_limits(self) -> RenderLimits:
        return DEFAULT_LIMITS if self.limits is None else self.limits

    @property
    def template_name(self) -> str | None:
        """The template chosen by name (None: chosen by the model's set, or given as a ChatTemplate)."""
        return self.chat_template if isinstance(self.chat_template, str) else None

    def template_variables(self) -> dict[str, Any]:
        """The caller's template variables (`chat_template_kwargs`, the CLI's `--var`), as fresh plain values."""
        return thaw(self.chat_template_kwargs) if self.chat_template_kwargs else {}

    def parse(self, request: Request | Mapping[str, Any] | str | bytes) -> Request:
        """The request read with these parse options (a Request is taken as it is)."""
        if isinstance(request, Request):
            return request
        return parse_request(request, dialect=self.dialect, utf8=self.utf8, tool_arguments=self.tool_arguments)

    def replace(self, **changes: Any) -> RenderOptions:
        return dataclasses.replace(self, **changes)

    # -- the keyword form (the Python API)

    @classmethod
    def from_kwargs(
        cls,
        kwargs: Mapping[str, Any],
        *,
        base: RenderOptions | None = None,
        accepted: Sequence[str] = RENDER_OPTIONS,
        method: str = "render",
    ) -> RenderOptions:
        """The options `Model.<method>(..., **kwargs)` asks for, over `base` (default: all defaults). A name not in
        `accepted` is an OptionError; `provenance` is accepted and ignored."""
        if not kwargs:
            return _DEFAULT if base is None else base
        check_options(kwargs, accepted, method)
        changes = dict(kwargs)
        changes.pop("provenance", None)
        return cls(**changes) if base is None else dataclasses.replace(base, **changes)

    def to_kwargs(self, *, parse: bool = True) -> dict[str, Any]:
        """The keyword arguments `Model.render` (and `budget.fit_context`) takes for these options: the fields that
        differ from the defaults, plain (tools, documents and variables thawed); without the parse options when
        `parse` is False (for a request already parsed)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (not parse and f.name in PARSE_OPTIONS) or value is getattr(_DEFAULT, f.name):
                continue
            if value is None or value != getattr(_DEFAULT, f.name):
                out[f.name] = thaw(value) if isinstance(value, FrozenDict | tuple) else value
        return out

    # -- the recorded form (ctxlock.records.RunOptions, whose fields these are)

    @classmethod
    def from_record(cls, options: Mapping[str, Any], *, template: Any = None) -> RenderOptions:
        """The options a record's `options` (`RunOptions.to_dict()`) ran with; `template` (a ChatTemplate given
        with the record) wins over the recorded `template_name`."""
        now = options.get("now")
        limits = options.get("limits")
        kwargs = options.get("chat_template_kwargs")
        return cls(
            add_generation_prompt=options.get("add_generation_prompt"),
            continue_final_message=options.get("continue_final_message", False),
            chat_template_kwargs=kwargs if kwargs else None,
            chat_template=template if template is not None else options.get("template_name"),
            injection=options.get("special_tokens", InjectionPolicy.TEXT),
            now=datetime.fromisoformat(now) if now else None,
            dialect=options.get("dialect"),
            utf8=options.get("utf8", Utf8Policy.STRICT),
            tool_arguments=options.get("tool_arguments") or ToolArguments.PARSED,
            content_format=options.get("content_format") or ContentFormat.AUTO,
            limits=RenderLimits.from_dict(limits) if limits else None,
            seed=options.get("render_seed"),
        )

    def to_record(self) -> dict[str, Any]:
        """The fields of `RunOptions` these options fill, as the record keeps them (strings, ISO clock, limits
        only when set). Tools and documents given by the caller are not recorded (the CLI has no such option)."""
        return {
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
            "chat_template_kwargs": self.template_variables() or None,
            "special_tokens": str(self.injection),
            "now": self.now.isoformat() if self.now is not None else None,
            "dialect": str(self.dialect) if self.dialect is not None else None,
            "utf8": str(self.utf8),
            "tool_arguments": str(self.tool_arguments),
            "template_name": self.template_name,
            "render_seed": self.seed,
            "content_format": str(self.content_format),
            "limits": self.limits.to_dict() if self.limits is not None else None,
        }


_DEFAULT = RenderOptions()


def render_options(
    options: RenderOptions | None, kwargs: Mapping[str, Any], accepted: Sequence[str], method: str
) -> RenderOptions:
    """What a Model method runs with: `options` (or the defaults) with the keyword arguments over it."""
    if options is not None and not isinstance(options, RenderOptions):
        raise TypeError(f"{method}() takes options as a RenderOptions, not {type(options).__name__}")
    return RenderOptions.from_kwargs(kwargs, base=options, accepted=accepted, method=method)


__all__ = [
    "BATCH_OPTIONS",
    "ENCODE_OPTIONS",
    "PARSE_OPTIONS",
    "RENDER_OPTIONS",
    "ContentFormat",
    "InjectionPolicy",
    "RenderKwargs",
    "RenderOptions",
    "check_options",
    "render_options",
]
