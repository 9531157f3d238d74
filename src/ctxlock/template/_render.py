"""Template stage: canonical Request -> Rendered (text + provenance), with transformers' chat-template semantics.

The environment (`ctxlock.template.sandbox`) mirrors `transformers.apply_chat_template`. Messages reach the template as
transformers passes them: None-valued keys dropped and reasoning aliased as `thinking` / `reasoning_content`.

What ctxlock adds:
- limits: a render is bounded in wall time, source size, output size and everything it builds, because a template
  from a GGUF file or the Hub is untrusted code (`RenderLimits`, `ctxlock.template.sandbox._env`);
- an injected clock: `strftime_now` reads `now`, which is recorded, so a render can be replayed;
- provenance, per character: every request string reaches the template as a `taint.Tainted` string, equal to the
  plain string in every way a template can observe, which carries which of its characters came from the request
  through every operation the template applies (concatenation, slicing, `strip`, `replace`, `split`, filters,
  `format`, ...). The rendered text comes back with those ranges (`Rendered.request_spans`); the ones that a
  control-token string touches are `Rendered.untrusted`, so that a control id is emitted only where every one of
  its characters came from the template's own text (or the tokenizer config's special tokens). Where a template
  mixes request text with a control token of its own in an operation whose output cannot be mapped back, and a
  control token comes out of it, the render is refused (`ControlTokenError`) unless the policy is `keep`.

What the caller chose is one `ctxlock.template.RenderOptions`. What a render takes from the template set, the options
and the vocabulary alone (the checked options, the template chosen and compiled, the variables, the control-token
set) is a plan made once per such key (`_plan`; anew for every render on the reference path, `CTXLOCK_FAST=0`), so a
batch's rows pay only for their own request. The stage's values are in `template_values`, the syntax-tree
analysis in `template_ast`, what a template sees (tainted messages and tools, joined content parts, the continuation
tag, the variables) in `template_inputs`, and the role-marker probe's parts in `template_roles`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2

from ctxlock.caches import memoize, register
from ctxlock.core import FrozenDict, freeze, longest_first
from ctxlock.errors import (
    ContentFormatError,
    ControlTokenError,
    CtxlockError,
    TemplateDeterminismError,
    TemplateError,
    TemplateLimitError,
    TemplateRaisedError,
    TemplateRuntimeError,
    TemplateSecurityError,
    TemplateSyntaxError,
)
from ctxlock.request import Request, parse_request
from ctxlock.settings import fast_enabled
from ctxlock.template import _mistral as mistral
from ctxlock.template import _taint as taint
from ctxlock.template._ast import reads_parts
from ctxlock.template._documents import pull_documents
from ctxlock.template._inputs import (
    check_seed,
    content_format_option,
    content_path,
    cut_at_continue_tag,
    flatten_contents,
    flatten_warning,
    keyword_options,
    parts_hint,
    reference_warnings,
    refuse_control_tokens,
    select_template,
    strftime_now_of,
    tag_final_message,
    template_messages,
    template_variables,
    tools_and_documents,
)
from ctxlock.template._options import ContentFormat, InjectionPolicy, RenderOptions
from ctxlock.template._roles import ROLE_PROBES, RoleMarkers, line_of, role_boundaries
from ctxlock.template._values import (
    ChatTemplate,
    Rendered,
    Span,
    TemplateFeatures,
    TemplateSet,
    line_endings,
    template_from_file_text,
)
from ctxlock.template.sandbox._env import (
    DEFAULT_LIMITS,
    Limit,
    Nondeterministic,
    Raised,
    RenderLimits,
    compile_source,
    new_environment,
    render_limited,
    template_globals,
    template_line,
    time_limit,
    where,
)

# ---------------------------------------------------------------------------------------------------------------
# Compiling and running


@memoize("template.compiled", 256, scope="artifact")
def _compile(source: str, limits: RenderLimits = DEFAULT_LIMITS) -> jinja2.Template:
    try:
        return compile_source(source, limits)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise TemplateSyntaxError(
            exc.message or str(exc),
            path=f"template line {exc.lineno}",
            hint="the chat template does not compile; fix it or choose another with --template",
        ) from None
    except Limit as exc:
        raise TemplateLimitError(
            exc.message, path="template", hint="the template is over ctxlock's compile limits; it may be hostile"
        ) from None
    except RecursionError:
        raise TemplateLimitError(
            "the template nests too deeply to compile", path="template", hint="it may be hostile"
        ) from None


def _compile_limits(limits: RenderLimits) -> RenderLimits:
    # Compiled templates are cached by source; only the limits that bound compiling are part of the key.
    if limits.max_seconds == DEFAULT_LIMITS.max_seconds and limits.max_source_chars == DEFAULT_LIMITS.max_source_chars:
        return DEFAULT_LIMITS
    return RenderLimits(max_seconds=limits.max_seconds, max_source_chars=limits.max_source_chars)


def compile_template(template: ChatTemplate, limits: RenderLimits = DEFAULT_LIMITS) -> None:
    """Compile now, so a syntax error (or a hostile source) surfaces at load time rather than at the first request."""
    _compile_named(template, limits)


def _compile_named(template: ChatTemplate, limits: RenderLimits) -> jinja2.Template:
    """`_compile` (cached by source, so its errors say `template`), with errors that name this template's file."""
    try:
        return _compile(template.source, _compile_limits(limits))
    except (TemplateSyntaxError, TemplateLimitError) as exc:
        where = template.origin or template.id
        path = exc.path or "template"
        raise type(exc)(exc.message, path=where + path.removeprefix("template"), hint=exc.hint) from None


# ---------------------------------------------------------------------------------------------------------------
# Content format: does the template read a message's content as a list of parts, or as a string?


@memoize("template.content_format", 256, scope="artifact")
def content_format(source: str) -> ContentFormat:
    """What a template reads a message's content as, from its syntax tree (never by rendering it): `openai` when it
    loops over a message's content (`{% for part in message['content'] %}`; through a filter such as `selectattr`,
    a slice, a variable set from it or a macro parameter it is passed to; for a message reached by looping over
    `messages` or an alias of it, or by indexing it), or reads a part's key without a loop (`content[0].text`,
    `(content|first)['type']`, `content|map(attribute='text')`, `content|selectattr('type', ...)`), else
    `string`. Templates that read parts also print a string content as is (they test `content is string` first),
    so `openai` is the safe answer when in doubt; a source that does not parse, or not within the compile limits,
    is `openai` too (its render fails on its own, unchanged). vLLM's `--chat-template-content-format auto` follows
    the same idea (with the loop alone)."""
    if len(source) > DEFAULT_LIMITS.max_source_chars:
        return ContentFormat.OPENAI
    try:
        with time_limit(DEFAULT_LIMITS.max_seconds, every_frame=True):  # an untrusted source: bounded like a compile
            tree = new_environment().parse(source)
            return ContentFormat.OPENAI if reads_parts(tree) else ContentFormat.STRING
    except (jinja2.exceptions.TemplateError, Limit, RecursionError, MemoryError):
        return ContentFormat.OPENAI


def _run(
    template: ChatTemplate,
    context: dict[str, Any],
    limits: RenderLimits,
    checker: taint.Checker,
    seed: int = 0,
    draws: list[dict[str, Any]] | None = None,
    generation: list[tuple[int, int]] | None = None,
    prepared: tuple[jinja2.Template, dict[str, Any]] | None = None,
) -> tuple[str, list[taint.SpanT]]:
    """Render once (`prepared`: the template compiled with `limits` and its globals, when the caller has them); map
    every failure to a typed TemplateError that names the template line."""
    compiled, names = prepared if prepared is not None else (_compile_named(template, limits), None)
    try:
        return render_limited(
            compiled, context, limits, checker, seed=seed, draws=draws, generation=generation, template_globals=names
        )
    except Nondeterministic as exc:
        raise TemplateDeterminismError(
            exc.message,
            path=f"{template.id} line {exc.line}" if exc.line else template.id,
            hint="the text would differ from run to run; the template prints an object, not a value: fix it or "
            "choose another with --template",
        ) from None
    except Raised as exc:
        line = template_line(exc.__traceback__)
        raise TemplateRaisedError(
            str(exc.message if exc.message is not None else exc),
            path=f"{template.id} line {line}" if line else template.id,
            hint="the template rejected this conversation",
        ) from None
    except Limit as exc:
        line = template_line(exc.__traceback__)
        raise TemplateLimitError(
            exc.message,
            path=f"{template.id} line {line}" if line else template.id,
            hint="the template went over ctxlock's render limits, which grow with the size of the request: it may be "
            "hostile, or need more; raise them with `ctxlock render --template-timeout S --max-render-chars N` "
            "(RenderLimits in Python)",
        ) from None
    except (RecursionError, MemoryError, OverflowError) as exc:
        # OverflowError: a number too big for what it is used as (a range over the sandbox's limit, a repeat count
        # past the address space).
        what = {RecursionError: "recursed too deeply", MemoryError: "ran out of memory"}.get(type(exc), str(exc))
        raise TemplateLimitError(f"render {what}", path=template.id, hint="the template may be hostile") from None
    except jinja2.exceptions.SecurityError as exc:
        line = template_line(exc.__traceback__)
        raise TemplateSecurityError(
            str(exc),
            path=f"{template.id} line {line}" if line else template.id,
            hint="the sandbox refused an unsafe operation; do not use this template",
        ) from None
    except TemplateError:
        raise
    except Exception as exc:
        # UndefinedError, TypeError, OverflowError (range too big), ...: the template failed on this input.
        line = template_line(exc.__traceback__)
        raise TemplateRuntimeError(
            str(exc),
            path=f"{template.id} line {line}" if line else template.id,
            hint=f"{type(exc).__name__} while rendering; the template does not accept this conversation",
        ) from None


# ---------------------------------------------------------------------------------------------------------------
# Control tokens


@dataclass(frozen=True, eq=False)  # hashed by identity: it is a cache key, and hashing a Pattern is slow
class _TokenSet:
    """The control-token strings, with a longest-first regex and the characters a match can start with."""

    regex: Any  # re.Pattern[str] | None
    tokens: tuple[str, ...] = ()
    firsts: tuple[str, ...] = ()
    longest: int = 0

    def search(self, s: str) -> bool:
        return self.regex is not None and any(f in s for f in self.firsts) and self.regex.search(s) is not None


@memoize("template.token_set", 64, scope="artifact")
def _token_set(all_tokens: frozenset[str]) -> _TokenSet:
    tokens = sorted(t for t in all_tokens if t and not t.isspace())
    if not tokens:
        return _TokenSet(None)
    return _TokenSet(
        regex=longest_first(tokens),
        tokens=tuple(tokens),
        firsts=tuple(sorted({t[0] for t in tokens})),
        longest=max(map(len, tokens)),
    )


def _touched(text: str, spans: list[taint.SpanT], tokens: _TokenSet) -> list[tuple[taint.SpanT, int, int]]:
    """The request-derived spans that some control-token occurrence in `text` shares a character with, each with
    that occurrence. Every start position a token could have is tried (not one left-to-right scan), so no choice of
    matches by the tokenizer can hide one."""
    if tokens.regex is None or not spans:
        return []
    out: list[tuple[taint.SpanT, int, int]] = []
    match = tokens.regex.match
    back = tokens.longest - 1
    for sp in spans:
        s, e = sp[0], sp[1]
        lo = max(0, s - back)
        hit = None
        for f in tokens.firsts:
            i = text.find(f, lo, e)
            while i >= 0 and hit is None:
                m = match(text, i)
                if m is not None and m.end() > s:
                    hit = (i, m.end())
                i = text.find(f, i + 1, e)
            if hit is not None:
                break
        if hit is not None:
            out.append((sp, hit[0], hit[1]))
    return out


def _template_inputs(
    request: Request, template: ChatTemplate, fmt_option: Any, all_tools: Any, all_docs: Any
) -> tuple[list[dict[str, Any]], Any, Any, tuple[str, str, tuple[str, ...]]]:
    """The messages, tools and documents the template sees: document blocks pulled out (to `documents` where the
    template takes them), content parts flattened for a string-content template, mistral-common's shapes; and the
    content format (chosen, detected, and the paths of the contents flattened)."""
    messages = template_messages(request)
    flattened: tuple[str, ...]
    if not any([isinstance(m.content, tuple) for m in request.messages]):  # no part lists: no documents, none to join
        fmt, detected, flattened = "", "", ()
    else:
        messages, block_docs = pull_documents(messages, request, takes_documents=template.features.documents)
        all_docs = (all_docs or []) + block_docs if block_docs else all_docs
        fmt, detected, flattened = _resolve_content_format(template, request, fmt_option)
    if flattened:
        messages = flatten_contents(messages, request)
    if mistral.is_patched(template.source):  # mistral-common's request shapes (ctxlock.template)
        images = mistral.takes_images(template.source)
        messages, all_tools = mistral.adapt(messages, [m.source for m in request.messages], all_tools, images=images)
    return messages, all_tools, all_docs, (fmt, detected, flattened)


def render(
    request: Request,
    templates: TemplateSet | ChatTemplate,
    options: RenderOptions | None = None,
    *,
    special_tokens: Mapping[str, str] | None = None,
    control_tokens: Iterable[str] = (),
    check_roles: bool = True,
    **keywords: Any,
) -> Rendered:
    """Render a request with a chat template, as transformers' `apply_chat_template(tokenize=False)` would.

    `options` (`RenderOptions`) is what the caller chose: generation prompt, continuation, tools, documents and
    template variables (added to the request's; the caller is trusted), the injection policy, the clock (`now`;
    `strftime_now` formats its wall time, and it is recorded with its offset), the seed of the template's one
    random generator (draws listed in `Rendered.draws`), the content format and the limits. The keyword form
    (`add_generation_prompt=`, `policy=` for the injection policy, `template_name=`, `now=`, `limits=`, ...) is
    accepted too. `special_tokens` are the template variables from the tokenizer config (`bos_token`, ...);
    `control_tokens` the vocabulary's added/special token strings, which request text may never become.
    Provenance is tracked per character. With `check_roles`, a template whose role markers are plain text for this
    vocabulary (`role_markers`) is reported in `Rendered.warnings`. Content-part lists reach a template that reads
    content as a string (`content_format(source)`, option "auto") joined with "\n" (vLLM's flattening), said in
    `Rendered.warnings` and `Rendered.flattened`; a non-text part is then a `ContentFormatError`.
    """
    opts = keyword_options(options, keywords, _DEFAULT_OPTIONS) if keywords else options or _DEFAULT_OPTIONS
    all_tools, all_docs = tools_and_documents(request, opts)
    plan = _plan(templates, opts, special_tokens, control_tokens, has_tools=bool(all_tools))
    template, tokens, policy, cfm = plan.template, plan.tokens, plan.policy, plan.cfm
    clock = aware_clock(opts.now)
    if request.chat_template_kwargs:
        variables = template_variables(request, special_tokens, opts, plan.agp)
        frozen_variables = freeze({**variables, "continue_final_message": cfm})
    else:
        variables, frozen_variables = plan.variables, plan.frozen_variables
    if policy is InjectionPolicy.RAISE and tokens.regex is not None:
        refuse_control_tokens(request, tokens.regex)

    strftime_now, clock_calls = strftime_now_of(clock)
    messages, all_tools, all_docs, (fmt, detected, flattened) = _template_inputs(
        request, template, plan.fmt_option, all_tools, all_docs
    )
    msgs = tag_final_message(messages, template.source) if cfm else messages
    context = {**variables, "messages": msgs, "tools": all_tools, "documents": all_docs, "strftime_now": strftime_now}
    draws: list[dict[str, Any]] = []
    gen: list[tuple[int, int]] = []  # the {% generation %} blocks' spans
    text, spans = _run_reporting_parts(plan, context, opts.render_limits, draws, fmt, request, gen)
    if cfm:
        text, spans = cut_at_continue_tag(text, spans, messages)
        gen = [(min(s, len(text)), min(e, len(text))) for s, e in gen]
    return Rendered(
        text=text,
        template=template,
        variables=frozen_variables,
        now=clock.isoformat(),
        clock_used=bool(clock_calls),
        request_spans=tuple([Span(s, e, p) for s, e, p, _ in spans]),
        provenance_exact=not any([sp[3] for sp in spans]),
        untrusted=_untrusted(text, spans, tokens, policy),
        policy=policy,
        clock_zone=clock.tzname() or "",
        seed=plan.seed,
        draws=tuple(freeze(d) for d in draws),
        warnings=(plan.role_warnings(special_tokens, opts.render_limits) if check_roles else ())
        + reference_warnings(template.source, request, cfm)
        + flatten_warning(flattened, plan.fmt_option),
        content_format=str(fmt),
        flattened=flattened,
        content_format_detected=str(detected),
        generation_spans=tuple(gen),
    )


# ---------------------------------------------------------------------------------------------------------------
# A render's plan: what it takes from everything but the request


@dataclass(frozen=True, eq=False)
class _Plan:
    """What `render` takes from the template set, the options, the special tokens, the control tokens and whether
    the request has tools, and not from the request: made by `_make_plan` with the steps `render` takes, in the same
    order (so an option it refuses is the same error at the same point), once per such key (`_plan`)."""

    templates: Any  # the TemplateSet or ChatTemplate given, and `opts.chat_template`: a hit must hold these objects
    opts_template: Any
    fmt_option: ContentFormat
    policy: InjectionPolicy
    agp: Any
    cfm: bool
    template: ChatTemplate
    seed: int
    variables: dict[str, Any]  # for a request without chat_template_kwargs (read, never changed: the sandbox is
    frozen_variables: FrozenDict  # immutable), and `Rendered.variables` for one
    tokens: _TokenSet
    checker: taint.Checker
    # the jinja2 Template and its globals, once a render has compiled it (where `_run` did)
    prepared: list[tuple[jinja2.Template, dict[str, Any]]]
    warned: list[tuple[FrozenDict, ...]]  # the role-marker warnings, once a render has asked for them

    def role_warnings(self, special_tokens: Any, limits: RenderLimits) -> tuple[FrozenDict, ...]:
        if not self.warned:
            self.warned.append(_role_warnings(self.template, special_tokens, self.tokens, limits))
        return self.warned[0]


def _make_plan(
    templates: TemplateSet | ChatTemplate,
    opts: RenderOptions,
    special_tokens: Mapping[str, str] | None,
    tokens: _TokenSet,
    has_tools: bool,
) -> _Plan:
    fmt_option = content_format_option(opts.content_format)
    policy = InjectionPolicy(opts.injection)
    agp, cfm = opts.generation_prompt, opts.continue_final_message
    if cfm and agp:
        raise TemplateError(
            "continue_final_message and add_generation_prompt are not compatible",
            path="options",
            hint="use continue_final_message to extend the last message, add_generation_prompt to start a new one",
        )
    template = select_template(templates, opts, has_tools=has_tools)
    aware_clock(opts.now)  # what it refuses, refused here as before; `render` reads the clock itself
    seed = 0 if opts.seed is None else check_seed(opts.seed)
    variables = template_variables(None, special_tokens, opts, agp)
    return _Plan(
        templates=templates,
        opts_template=opts.chat_template,
        fmt_option=fmt_option,
        policy=policy,
        agp=agp,
        cfm=cfm,
        template=template,
        seed=seed,
        variables=variables,
        frozen_variables=freeze({**variables, "continue_final_message": cfm}),
        tokens=tokens,
        checker=taint.Checker(tokens.search, where, tokens),
        prepared=[],
        warned=[],
    )


_PLANS: dict[tuple[Any, ...], _Plan] = {}
# The plan used last, with the very objects it was asked for (immutable ones only): a batch's rows find it by
# identity, without hashing the options and the template set every row.
_LastPlan = tuple[TemplateSet | ChatTemplate, RenderOptions, Mapping[str, str] | None, Iterable[str], bool, _Plan]
_LAST: list[_LastPlan] = []


def _clear_plans() -> None:
    _PLANS.clear()
    _LAST.clear()


register("template.render_plans", size=_PLANS.__len__, clear=_clear_plans, scope="artifact")


def _plan(
    templates: TemplateSet | ChatTemplate,
    opts: RenderOptions,
    special_tokens: Mapping[str, str] | None,
    control_tokens: Iterable[str],
    *,
    has_tools: bool,
) -> _Plan:
    """The render's plan, kept by the values it is made from (a batch renders every row with one plan). A hit must
    hold the very template objects given (a template equal to another is still another object in `Rendered`). The
    reference path (`CTXLOCK_FAST=0`) makes it anew for every render."""
    if not fast_enabled():
        return _make_plan(templates, opts, special_tokens, _tokens(control_tokens), has_tools)
    try:
        t, o, st, ct, tools, last = _LAST[0]
    except IndexError:
        pass
    else:
        if t is templates and o is opts and st is special_tokens and ct is control_tokens and tools is has_tools:
            return last
    tokens = _tokens(control_tokens)
    named = (
        special_tokens if special_tokens is None or type(special_tokens) is FrozenDict else (*special_tokens.items(),)
    )
    key = (templates, opts, named, tokens, has_tools)
    try:
        hit = _PLANS.get(key)
    except TypeError:  # an unhashable value (a special token given as a dict): made for this render only
        return _make_plan(templates, opts, special_tokens, tokens, has_tools)
    if (
        hit is not None
        and hit.templates is templates
        and (hit.opts_template is opts.chat_template or not isinstance(opts.chat_template, ChatTemplate))
    ):
        plan = hit
    else:
        plan = _make_plan(templates, opts, special_tokens, tokens, has_tools)
        if len(_PLANS) >= 64:
            _PLANS.clear()
        _PLANS[key] = plan
    if type(control_tokens) is frozenset and (special_tokens is None or type(special_tokens) is FrozenDict):
        _LAST[:] = [(templates, opts, special_tokens, control_tokens, has_tools, plan)]
    return plan


def _tokens(control_tokens: Iterable[str]) -> _TokenSet:
    return _token_set(control_tokens if isinstance(control_tokens, frozenset) else frozenset(control_tokens))


_DEFAULT_OPTIONS = RenderOptions()


def _run_reporting_parts(
    plan: _Plan,
    context: dict[str, Any],
    limits: RenderLimits,
    draws: list[dict[str, Any]],
    fmt: str,
    request: Request,
    generation: list[tuple[int, int]] | None = None,
) -> tuple[str, list[taint.SpanT]]:
    """`_run`, with the content format option added to the hint of a failure on content-part lists."""
    if not plan.prepared:  # compiled here, after the request's own checks (a failure is not kept: raised each time)
        compiled = _compile_named(plan.template, limits)
        plan.prepared.append((compiled, template_globals(compiled)))
    try:
        return _run(plan.template, context, limits, plan.checker, plan.seed, draws, generation, plan.prepared[0])
    except (TemplateRuntimeError, TemplateRaisedError) as exc:
        if fmt != ContentFormat.OPENAI:
            raise
        raise type(exc)(exc.message, path=exc.path, hint=parts_hint(exc.hint, request)) from None


def _untrusted(text: str, spans: list[taint.SpanT], tokens: _TokenSet, policy: InjectionPolicy) -> tuple[Span, ...]:
    """The request-derived spans a control-token string touches (no control id there); under `raise`, or where
    an operation mixed request text with a control token of the template's own, the render is refused instead."""
    untrusted: list[Span] = []
    for (s, e, path, note), at, end in _touched(text, spans, tokens):
        if policy is InjectionPolicy.KEEP:
            continue
        token = text[at:end]
        if note:
            raise ControlTokenError(
                f"the control token {token!r} at rendered offset {at} came out of {note}, which mixed request text "
                "with the template's own control tokens: ctxlock cannot prove which characters are whose",
                path=path or f"rendered text offset {at}",
                hint="use another template, or injection='keep' if you trust this request",
            )
        if policy is InjectionPolicy.RAISE:
            raise ControlTokenError(
                f"the control token {token!r} at rendered offset {at} would be made of request text "
                "(the template reshaped it)",
                path=path or f"rendered text offset {at}",
                hint="remove it, or render with injection='text' to encode it as plain text",
            )
        untrusted.append(Span(s, e, path))
    return tuple(untrusted)


def _resolve_content_format(
    template: ChatTemplate, request: Request, option: ContentFormat
) -> tuple[str, str, tuple[str, ...]]:
    """The content format used and the one detected ("" both when no message holds a list: nothing is parsed), and
    the paths of the contents to join."""
    with_parts = [(m, m.content) for m in request.messages if isinstance(m.content, tuple)]
    if not with_parts:
        return "", "", ()
    detected = content_format(template.source)
    fmt = detected if option is ContentFormat.AUTO else option
    if fmt is ContentFormat.OPENAI:
        return fmt, detected, ()
    for m, parts in with_parts:
        for j, part in enumerate(parts):
            if part.get("type") not in ("text", "document"):  # documents left the messages (template_documents)
                where = next((m.origins[k] for k in m.origins if k.startswith(f".content[{j}].")), None)
                part_path = re.sub(r"(\.image_url)?\.url$|\.(source|image_url)$", "", where) if where else None
                raise ContentFormatError(
                    f"a content part of type {part.get('type')!r} cannot be joined into the string content this "
                    "template reads (its content format is 'string'); ctxlock never drops a part silently",
                    path=part_path or f"{m.source}.content[{j}]",
                    hint="send text only, use a template that reads content parts, or content_format='openai' "
                    "(--content-format openai) to pass the parts as sent, as transformers does",
                )
    return fmt, detected, tuple(content_path(m) for m, _ in with_parts)


# ---------------------------------------------------------------------------------------------------------------
# Role markers: does the template separate turns with control tokens, or with text a user can type?


# The probe conversations, tried in turn (a template may refuse a system turn); each content is a sentinel word.
def role_markers(
    template: ChatTemplate, *, special_tokens: Mapping[str, str] | None = None, control_tokens: Iterable[str] = ()
) -> RoleMarkers:
    """Render a probe conversation (system, user, assistant, user, with a generation prompt; without the system
    turn if the template refuses it) whose contents are sentinel words, and look at the text between consecutive
    turns and after the last one: the template's own role markers. A boundary with no control token of the
    vocabulary in it is plain text (`User:`, `### Assistant:`, `[INST]` where that is not a control token), so
    request text can spell the same boundary. The verdict is cached per template and vocabulary."""
    tokens = _token_set(control_tokens if isinstance(control_tokens, frozenset) else frozenset(control_tokens))
    return _role_markers(template, freeze(dict(special_tokens or {})), tokens)


_ROLE_WARNINGS: dict[tuple[Any, ...], tuple[FrozenDict, ...]] = {}
register("template.role_warnings", size=_ROLE_WARNINGS.__len__, clear=_ROLE_WARNINGS.clear, scope="artifact")


def _role_warnings(
    template: ChatTemplate, special_tokens: Any, tokens: _TokenSet, limits: RenderLimits
) -> tuple[FrozenDict, ...]:
    # Looked up on every render: keyed by values that hash fast (a model's special tokens are one FrozenDict, whose
    # hash is kept and which a lookup finds by identity; any other mapping as a tuple of pairs).
    named = special_tokens if type(special_tokens) is FrozenDict else tuple((special_tokens or {}).items())
    key = (template, named, tokens, limits)
    hit = _ROLE_WARNINGS.get(key)
    if hit is None:
        found = _role_markers(template, freeze(dict(special_tokens or {})), tokens, limits).warning(template)
        hit = (freeze(found),) if found else ()
        if len(_ROLE_WARNINGS) >= 256:
            _ROLE_WARNINGS.clear()
        _ROLE_WARNINGS[key] = hit
    return hit


@memoize("template.role_markers", 256, scope="artifact")
def _role_markers(
    template: ChatTemplate, special_tokens: FrozenDict, tokens: _TokenSet, limits: RenderLimits = DEFAULT_LIMITS
) -> RoleMarkers:
    reason = ""
    for probe in ROLE_PROBES:
        request = parse_request({"messages": [{"role": r, "content": c} for r, c in probe]})
        try:
            text = render(
                request,
                template,
                RenderOptions(now=datetime(2026, 1, 1).astimezone(), limits=limits),
                special_tokens=special_tokens,
                control_tokens=tokens.tokens,
                check_roles=False,
            ).text
        except CtxlockError as exc:  # the template refuses this conversation (or is over the limits on it)
            reason = f"the template renders no probe conversation: {exc}"
            continue
        plain = tuple(
            (name, between, line_of(between, template.source))
            for name, between in role_boundaries(text, probe)
            if tokens.regex is None or not tokens.regex.search(between)
        )
        return RoleMarkers(True, plain)
    return RoleMarkers(False, reason=reason)


def aware_clock(now: datetime | None) -> datetime:
    """The render clock, timezone-aware: the local wall clock with the local zone when `now` is None, a naive
    `now` taken as local time (Python's `astimezone()`), an aware one as given."""
    if now is None:
        return datetime.now().astimezone()
    return now if now.tzinfo is not None and now.utcoffset() is not None else now.astimezone()


__all__ = [
    "DEFAULT_LIMITS",
    "ROLE_PROBES",
    "ChatTemplate",
    "ContentFormat",
    "InjectionPolicy",
    "RenderLimits",
    "RenderOptions",
    "Rendered",
    "RoleMarkers",
    "Span",
    "TemplateFeatures",
    "TemplateSet",
    "aware_clock",
    "compile_template",
    "content_format",
    "line_endings",
    "render",
    "role_boundaries",
    "role_markers",
    "template_from_file_text",
]
