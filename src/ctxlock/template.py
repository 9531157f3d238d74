"""Template stage: canonical Request -> Rendered (text + provenance), with transformers' chat-template semantics.

The environment (`ctxlock.sandbox`) mirrors `transformers.apply_chat_template`. Messages reach the template as
transformers passes them: None-valued keys dropped and reasoning aliased as `thinking` / `reasoning_content`.

What ctxlock adds:
- limits: a render is bounded in wall time, source size, output size and everything it builds, because a template
  from a GGUF file or the Hub is untrusted code (`RenderLimits`, `ctxlock.sandbox`);
- an injected clock: `strftime_now` reads `now`, which is recorded, so a render can be replayed;
- provenance, per character: every request string reaches the template as a `taint.Tainted` string, equal to the
  plain string in every way a template can observe, which carries which of its characters came from the request
  through every operation the template applies (concatenation, slicing, `strip`, `replace`, `split`, filters,
  `format`, ...). The rendered text comes back with those ranges (`Rendered.request_spans`); the ones that a
  control-token string touches are `Rendered.untrusted`, so that a control id is emitted only where every one of
  its characters came from the template's own text (or the tokenizer config's special tokens). Where a template
  mixes request text with a control token of its own in an operation whose output cannot be mapped back, and a
  control token comes out of it, the render is refused (`ControlTokenError`) unless the policy is `keep`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import jinja2

from . import mistral, taint
from .caches import memoize, register
from .errors import (
    ContentFormatError,
    ControlTokenError,
    CtxlockError,
    TemplateDeterminismError,
    TemplateError,
    TemplateLimitError,
    TemplateNotFoundError,
    TemplateRaisedError,
    TemplateRuntimeError,
    TemplateSecurityError,
    TemplateSyntaxError,
)
from .frozen import FrozenDict, freeze, thaw
from .request import Dialect, Message, Request, join_path, parse_request
from .sandbox import (
    DEFAULT_LIMITS,
    Limit,
    Nondeterministic,
    Raised,
    RenderLimits,
    compile_source,
    new_environment,
    render_limited,
    template_line,
    time_limit,
    where,
)
from .trie import longest_first


class SpecialTokenPolicy(StrEnum):
    """What to do with control-token strings that come from request text."""

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


@dataclass(frozen=True)
class TemplateFeatures:
    tools: bool
    documents: bool
    thinking: bool
    generation_prompt: bool
    clock: bool
    raises: bool

    def to_dict(self) -> dict[str, bool]:
        return {k: getattr(self, k) for k in ("tools", "documents", "thinking", "generation_prompt", "clock", "raises")}


@dataclass(frozen=True)
class ChatTemplate:
    """One chat template source, identified by content digest.

    `sha256` is the digest of `source`, the text that is compiled and rendered. A template read from a file is
    read as transformers reads `chat_template.jinja` (text mode: CRLF and lone CR become LF), so for a file with
    CRLF line endings the source differs from the file's bytes: `file_sha256` is the digest of those bytes and
    `line_endings` says what the file had ("lf", "crlf", "cr", "mixed" or "none"). Both are empty for a template
    that is not a file of its own (a tokenizer config's string, a GGUF key, a generated source)."""

    source: str
    id: str  # human name, e.g. "Qwen-Qwen2.5-7B-Instruct.jinja" or "book/default"
    origin: str = ""  # where it came from: a file path, "tokenizer_config.json:chat_template", a generator
    file_sha256: str = ""  # sha256 of the file's bytes, when the template was read from a file
    line_endings: str = ""  # the file's line endings, when it was read from a file

    @property
    def sha256(self) -> str:
        return _sha256(self.source)

    @property
    def features(self) -> TemplateFeatures:
        return _features(self.source)

    @property
    def translated_newlines(self) -> bool:
        """Whether the file had CR line endings that were read as LF (the rendered source is not the bytes)."""
        return self.line_endings in ("crlf", "cr", "mixed")

    def to_dict(self) -> dict[str, str]:
        out = {"id": self.id, "sha256": self.sha256, "origin": self.origin}
        if self.file_sha256:
            out["file_sha256"] = self.file_sha256
            out["line_endings"] = self.line_endings
        return out


def line_endings(text: str) -> str:
    """The line endings of a file's text: "lf", "crlf", "cr", "mixed" (more than one kind) or "none"."""
    crlf = text.count("\r\n")
    cr = text.count("\r") - crlf
    lf = text.count("\n") - crlf
    kinds = [name for name, n in (("lf", lf), ("crlf", crlf), ("cr", cr)) if n]
    if not kinds:
        return "none"
    return kinds[0] if len(kinds) == 1 else "mixed"


def template_from_file_text(text: str, *, id: str, origin: str, file_sha256: str) -> ChatTemplate:
    """A template file's decoded text as transformers reads it: `open(path, encoding="utf-8").read()` is text mode
    with universal newlines, so CRLF and a lone CR are read as LF (jinja's trim_blocks and lstrip_blocks then see
    the same lines transformers' do). The file's own digest and line endings are kept."""
    source = text.replace("\r\n", "\n").replace("\r", "\n")
    return ChatTemplate(source, id=id, origin=origin, file_sha256=file_sha256, line_endings=line_endings(text))


@dataclass(frozen=True)
class TemplateSet:
    """A model's templates: one `default`, or several by name (HF dict templates: `default`, `tool_use`, ...)."""

    templates: tuple[ChatTemplate, ...]
    names: tuple[str, ...]

    @classmethod
    def single(cls, template: ChatTemplate) -> TemplateSet:
        return cls((template,), ("default",))

    def select(self, name: str | None = None, *, has_tools: bool = False) -> ChatTemplate:
        """transformers' `get_chat_template`: an explicit name, else `tool_use` when tools are given, else `default`."""
        by_name = dict(zip(self.names, self.templates, strict=True))
        if name is not None:
            if name in by_name:
                return by_name[name]
            raise TemplateNotFoundError(
                f"no chat template named {name!r}",
                path="template",
                hint=f"available: {', '.join(sorted(by_name))}",
            )
        if has_tools and "tool_use" in by_name:
            return by_name["tool_use"]
        if "default" in by_name:
            return by_name["default"]
        raise TemplateNotFoundError(
            "this model has several chat templates and none is named 'default'",
            path="template",
            hint=f"choose one of {', '.join(sorted(by_name))}",
        )


@dataclass(frozen=True)
class Span:
    """A half-open character range [start, end) of the rendered text, with the request path it came from."""

    start: int
    end: int
    path: str = ""


@dataclass(frozen=True)
class Rendered:
    """The template stage's output: the exact text the tokenizer will read, and where each part came from."""

    text: str
    template: ChatTemplate
    variables: FrozenDict  # everything the template saw besides messages/tools/documents
    now: str  # the clock strftime_now read (ISO 8601 with its UTC offset), recorded even when it was not read
    clock_used: bool  # whether the template called strftime_now
    request_spans: tuple[Span, ...]  # ranges of `text` that are request strings
    provenance_exact: bool  # every request-derived character is known (False: see `taint`, an unmapped operation)
    untrusted: tuple[Span, ...]  # request-derived ranges that a control-token string touches: no control id there
    policy: SpecialTokenPolicy
    clock_zone: str = ""  # the zone of `now`: a name ("JST", "UTC") or "UTC+09:00" for a fixed offset
    seed: int = 0  # the seed of the render's random generator (the `random` filter, `lipsum`)
    draws: tuple[FrozenDict, ...] = ()  # what the template drew from it, in order: what, line, choice
    warnings: tuple[FrozenDict, ...] = ()  # things the render did that a reader must know (see `role_markers`)
    # How content-part lists reached the template: "" when no message had one (nothing to decide), else "string"
    # (text parts joined) or "openai" (as sent); `content_format_detected` is what the template's syntax tree says
    # (`content_format(source)`, whatever the option), `flattened` the JSON paths of the contents that were joined.
    content_format: str = ""
    flattened: tuple[str, ...] = ()
    content_format_detected: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "template": self.template.to_dict(),
            "now": self.now,
            "clock_zone": self.clock_zone,
            "clock_used": self.clock_used,
            "seed": self.seed,
            "draws": [thaw(d) for d in self.draws],
            "warnings": [thaw(w) for w in self.warnings],
            "content_format": self.content_format,
            "content_format_detected": self.content_format_detected,
            "flattened": list(self.flattened),
            "request_spans": [[s.start, s.end, s.path] for s in self.request_spans],
            "provenance_exact": self.provenance_exact,
        }


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


@memoize("template.features", 256, scope="artifact")
def _features(source: str) -> TemplateFeatures:
    return TemplateFeatures(
        tools="tools" in source,
        documents="documents" in source,
        thinking=any(k in source for k in ("reasoning_content", "thinking", "<think>", "[THINK]", "enable_thinking")),
        generation_prompt="add_generation_prompt" in source,
        clock="strftime_now" in source,
        raises="raise_exception" in source,
    )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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
            return ContentFormat.OPENAI if _reads_parts(tree) else ContentFormat.STRING
    except (jinja2.exceptions.TemplateError, Limit, RecursionError, MemoryError):
        return ContentFormat.OPENAI


def _base(node: Any) -> Any:
    """The expression a value comes from, through filters, tests and slices (`x|selectattr(...)`, `x[1:]`)."""
    while True:
        wrapped = isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)) and node.node is not None
        if not (wrapped or (isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice))):
            return node
        node = node.node


def _is_name(node: Any, names: set[str]) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.name in names


def _key(node: Any) -> Any:
    """The constant key of `x.key` or `x['key']`, else None."""
    if isinstance(node, jinja2.nodes.Getattr):
        return node.attr
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const):
        return node.arg.value
    return None


def _reads_parts(tree: jinja2.nodes.Template) -> bool:
    """Whether the template reads content parts: it loops over a message's content. A message is a loop variable over
    `messages` (or an alias, a slice, a filtered list) or `messages[i]`; content is `m.content`, `m['content']`,
    `m.get('content')`, a variable set from one, or a macro parameter some call passes one to."""
    name_of = jinja2.nodes.Name
    assigns = [(a.target.name, a.node) for a in tree.find_all(jinja2.nodes.Assign) if isinstance(a.target, name_of)]
    loops = list(tree.find_all(jinja2.nodes.For))
    macros = {m.name: [a.name for a in m.args] for m in tree.find_all(jinja2.nodes.Macro)}
    calls = [c for c in tree.find_all(jinja2.nodes.Call) if isinstance(c.node, name_of) and c.node.name in macros]
    lists, items, contents = {"messages"}, set(), set()

    def is_item(node: Any) -> bool:  # a message: a loop variable over the list, or the list indexed
        node = _base(node)
        if _is_name(node, items):
            return True
        return (
            isinstance(node, jinja2.nodes.Getitem)
            and not isinstance(node.arg, jinja2.nodes.Slice)
            and _is_name(_base(node.node), lists)
        )

    def is_content(node: Any) -> bool:
        node = _base(node)
        if isinstance(node, (jinja2.nodes.Or, jinja2.nodes.And)):
            return is_content(node.left) or is_content(node.right)
        if isinstance(node, jinja2.nodes.CondExpr):
            return is_content(node.expr1) or (node.expr2 is not None and is_content(node.expr2))
        if _is_name(node, contents):
            return True
        if (  # m.get('content'), m.get('content', '')
            isinstance(node, jinja2.nodes.Call)
            and isinstance(node.node, jinja2.nodes.Getattr)
            and node.node.attr == "get"
            and node.args
            and isinstance(node.args[0], jinja2.nodes.Const)
            and node.args[0].value == "content"
        ):
            return is_item(node.node.node)
        return _key(node) == "content" and is_item(node.node)

    size = -1
    while size != len(lists) + len(items) + len(contents):  # aliases of aliases: a fixpoint
        size = len(lists) + len(items) + len(contents)
        for name, value in assigns:
            if _is_name(_base(value), lists):
                lists.add(name)
            elif is_content(value):
                contents.add(name)
            elif is_item(value):
                items.add(name)
        for loop in loops:
            if isinstance(loop.target, name_of) and _is_name(_base(loop.iter), lists):
                items.add(loop.target.name)
        for call in calls:
            params = macros[call.node.name]
            passed = list(zip(params, call.args, strict=False))
            passed += [(k.key, k.value) for k in call.kwargs if k.key in params]
            for param, value in passed:
                if is_content(value):
                    contents.add(param)
                elif is_item(value):
                    items.add(param)
    if any(is_content(loop.iter) for loop in loops):
        return True
    # Parts read without a loop: a part taken by index (`content[0].text`, `content[0]['text']`, `content|first`) or
    # the parts mapped or filtered by a part's key (`content|map(attribute='text')`, `content|selectattr('type',
    # ...)`); a joined string would give such a template one character, or nothing, in place of the text.
    for node in tree.find_all(jinja2.nodes.Getattr):
        if node.attr in _PART_KEYS and _part_of_content(node.node, is_content):
            return True
    for node in tree.find_all(jinja2.nodes.Getitem):
        key = node.arg.value if isinstance(node.arg, jinja2.nodes.Const) else None
        if key in _PART_KEYS and _part_of_content(node.node, is_content):
            return True
    for node in tree.find_all(jinja2.nodes.Filter):
        by_key = node.name in ("map", "selectattr", "rejectattr", "groupby", "sort", "unique") and any(
            isinstance(a, jinja2.nodes.Const) and a.value in _PART_KEYS
            for a in [*node.args, *(k.value for k in node.kwargs)]
        )
        if by_key and node.node is not None and is_content(node.node):
            return True
    return False


_PART_KEYS = frozenset({"type", "text", "image", "image_url", "input_audio", "video", "file", "thinking"})


def _part_of_content(node: Any, is_content: Any) -> bool:
    """Whether `node` is one part of a message's content: `content[i]` (not a slice) or `content|first|last`."""
    if isinstance(node, jinja2.nodes.Getitem) and not isinstance(node.arg, jinja2.nodes.Slice):
        return bool(is_content(node.node))
    if isinstance(node, jinja2.nodes.Filter) and node.name in ("first", "last") and node.node is not None:
        return bool(is_content(node.node))
    return False


def _run(
    template: ChatTemplate,
    context: dict[str, Any],
    limits: RenderLimits,
    checker: taint.Checker,
    seed: int = 0,
    draws: list | None = None,
) -> tuple[str, list[taint.SpanT]]:
    """Render once; map every failure to a typed TemplateError that names the template line."""
    compiled = _compile_named(template, limits)
    try:
        return render_limited(compiled, context, limits, checker, seed=seed, draws=draws)
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


# ---------------------------------------------------------------------------------------------------------------
# What templates see: request strings as Tainted strings, with their JSON paths


def _tainted(value: Any, path: str, *, keys: bool = True) -> Any:
    """Plain JSON data with every string (and key) a Tainted string carrying its JSON path."""
    if isinstance(value, str):
        return taint.leaf(value, path)
    if isinstance(value, Mapping):
        return {
            (taint.leaf(k, join_path(path, k)) if keys and isinstance(k, str) else k): _tainted(
                v, join_path(path, k) if isinstance(k, str) else f"{path}[{k}]"
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_tainted(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def _template_messages(request: Request) -> list[dict[str, Any]]:
    return [_template_message(m, m.source) for m in request.messages]


@memoize("template.message", 8192)
def _template_message(message: Message, source: str) -> dict[str, Any]:
    """A message as templates see it. Memoized (per message and its place in the request): the sandbox is
    immutable, so a template cannot change the dict, and a long chat re-rendered turn after turn (or candidate after
    candidate) converts each message once. The role is a validated structural value and stays a plain string."""
    origins = message.origins

    def path(suffix: str) -> str:
        return origins.get(suffix) or f"{source}{suffix}"

    m: dict[str, Any] = {}
    for key, value in message.to_template().items():
        if key == "role":
            m[key] = value
        elif key == "content" and isinstance(value, list):
            m[key] = [
                {k: _tainted(v, path(f".content[{j}].{k}")) for k, v in part.items()} for j, part in enumerate(value)
            ]
        elif key == "tool_calls":
            m[key] = [_tool_call(tc, path(f".tool_calls[{k}]")) for k, tc in enumerate(value)]
        else:
            m[key] = _tainted(value, path(f".{key}"))
    # transformers' _alias_reasoning_fields: reasoning is visible as `thinking` (gpt-oss) and `reasoning_content`.
    reasoning = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
    if reasoning is not None:
        m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    return m


def _tool_call(tc: dict[str, Any], path: str) -> dict[str, Any]:
    out = {k: _tainted(v, join_path(path, k)) for k, v in tc.items() if k != "function"}
    fn = tc["function"]
    out["function"] = {
        "name": _tainted(fn["name"], f"{path}.function.name"),
        "arguments": _tainted(fn["arguments"], f"{path}.function.arguments"),
    }
    return out


@memoize("template.tools", 256)
def _template_tools(tools: tuple[Any, ...], dialect: Dialect) -> tuple[dict[str, Any], ...]:
    """A request's tools as templates see them, converted once per distinct tool list: the sandbox is immutable, so
    templates cannot change the shared dicts, and a chat sends the same tools every turn."""
    out = []
    for k, tool in enumerate(tools):
        plain = thaw(tool)
        t: dict[str, Any] = {}
        for key, value in plain.items():
            if key == "function" and isinstance(value, dict):
                fn_path = f"tools[{k}]" if dialect is Dialect.ANTHROPIC else f"tools[{k}].function"
                t[key] = {
                    fk: _tainted(
                        fv,
                        join_path(
                            fn_path, "input_schema" if dialect is Dialect.ANTHROPIC and fk == "parameters" else fk
                        ),
                    )
                    for fk, fv in value.items()
                }
            else:
                t[key] = _tainted(value, join_path(f"tools[{k}]", key))
        out.append(t)
    return tuple(out)


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def render(
    request: Request,
    templates: TemplateSet | ChatTemplate,
    *,
    template_name: str | None = None,
    special_tokens: Mapping[str, str] | None = None,
    control_tokens: Iterable[str] = (),
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    policy: SpecialTokenPolicy | str = SpecialTokenPolicy.TEXT,
    now: datetime | None = None,
    limits: RenderLimits = DEFAULT_LIMITS,
    provenance: bool | None = True,
    seed: int | None = None,
    check_roles: bool = True,
    content_format: ContentFormat | str = ContentFormat.AUTO,
) -> Rendered:
    """Render a request with a chat template, as transformers' `apply_chat_template(tokenize=False)` would.

    `special_tokens` are the template variables from the tokenizer config (`bos_token`, `eos_token`, ...).
    `control_tokens` are the vocabulary's added/special token strings: request text may never become one.
    `tools`/`documents`/`chat_template_kwargs` given here (by the caller, trusted) are added to those of the request.
    Provenance is tracked in the one render, per character, whatever `provenance` says (kept for compatibility: it
    once chose whether a second render located request strings).

    The clock is timezone-aware: `now` (default: the local wall clock, with the local zone; a naive `now` is taken
    as local time) is recorded with its offset, and `strftime_now` formats its wall time without a zone, as
    transformers' `datetime.now().strftime(fmt)` does on a machine in that zone at that instant. `seed` (default 0)
    seeds the one random generator a template can draw from (jinja's `random` filter and `lipsum`), so the same
    inputs give the same text; the draws are listed in `Rendered.draws`.

    With `check_roles` (the default), a template whose role markers are plain text for this vocabulary (see
    `role_markers`) is reported in `Rendered.warnings`, with the template line.

    `content_format` says how content-part lists reach the template (`ContentFormat`): with "auto" (the default),
    a template that reads content as a string (`content_format(source)`) gets each all-text list joined with "\n"
    (vLLM's flattening; transformers passes the list, which such a template cannot read), said in
    `Rendered.warnings` and `Rendered.flattened`; a non-text part (an image) is then a `ContentFormatError`.
    """
    del provenance
    fmt_option = _content_format_option(content_format)
    policy = SpecialTokenPolicy(policy)
    if continue_final_message and add_generation_prompt:
        raise TemplateError(
            "continue_final_message and add_generation_prompt are not compatible",
            path="options",
            hint="use continue_final_message to extend the last message, add_generation_prompt to start a new one",
        )
    req_tools = None if request.tools is None else list(_template_tools(request.tools, request.dialect))
    all_tools = (req_tools or []) + list(tools or []) if (req_tools or tools) else None
    req_docs = request.template_documents()
    if req_docs is not None:
        req_docs = [_tainted(d, f"documents[{k}]") for k, d in enumerate(req_docs)]
    all_docs = (req_docs or []) + list(documents or []) if (req_docs or documents) else None
    template = (
        templates if isinstance(templates, ChatTemplate) else templates.select(template_name, has_tools=bool(all_tools))
    )
    clock = aware_clock(now)
    seed = 0 if seed is None else _check_seed(seed)
    request_kwargs = (
        {k: _tainted(v, join_path("chat_template_kwargs", k)) for k, v in request.chat_template_kwargs.items()}
        if request.chat_template_kwargs
        else {}
    )
    # Precedence: the caller's kwargs (an operator's --var) over the request's, over the tokenizer's special tokens.
    variables: dict[str, Any] = {
        **dict(special_tokens or {}),
        **request_kwargs,
        **dict(chat_template_kwargs or {}),
        "add_generation_prompt": add_generation_prompt,
    }
    tokens = _token_set(control_tokens if isinstance(control_tokens, frozenset) else frozenset(control_tokens))

    if policy is SpecialTokenPolicy.RAISE and tokens.regex is not None:
        for path, s in request.strings():
            m = tokens.regex.search(s)
            if m:
                raise ControlTokenError(
                    f"request string contains the control token {m.group(0)!r} at character {m.start()}",
                    path=path,
                    hint="remove it, or render with special_tokens='text' to encode it as plain text",
                )

    clock_calls: list[str] = []

    wall = clock.replace(tzinfo=None)  # transformers formats a naive local time: %z and %Z are empty

    def strftime_now(fmt: str) -> str:
        clock_calls.append(fmt)
        return taint.derived(wall.strftime(fmt), (fmt,), "strftime_now()")

    messages = _template_messages(request)
    fmt, detected, flattened = _resolve_content_format(template, request, fmt_option)
    if flattened:
        messages = _flatten_contents(messages, request)
    if mistral.is_patched(template.source):  # mistral-common's request shapes (ctxlock.mistral)
        messages, all_tools = mistral.adapt(messages, [m.source for m in request.messages], all_tools)
    msgs = _tag_final_message(messages, template) if continue_final_message else messages
    context = {
        **variables,
        "messages": msgs,
        "tools": all_tools,
        "documents": all_docs,
        "strftime_now": strftime_now,
    }
    checker = taint.Checker(tokens.search, where, tokens)
    draws: list[dict[str, Any]] = []
    try:
        text, spans = _run(template, context, limits, checker, seed, draws)
    except (TemplateRuntimeError, TemplateRaisedError) as exc:
        if fmt != ContentFormat.OPENAI:
            raise
        raise type(exc)(exc.message, path=exc.path, hint=_parts_hint(exc.hint, request)) from None
    if continue_final_message:
        text, spans = _cut_at_continue_tag(text, spans, messages)

    untrusted: list[Span] = []
    for (s, e, path, note), at, end in _touched(text, spans, tokens):
        if policy is SpecialTokenPolicy.KEEP:
            continue
        token = text[at:end]
        if note:
            raise ControlTokenError(
                f"the control token {token!r} at rendered offset {at} came out of {note}, which mixed request text "
                "with the template's own control tokens: ctxlock cannot prove which characters are whose",
                path=path or f"rendered text offset {at}",
                hint="use another template, or special_tokens='keep' if you trust this request",
            )
        if policy is SpecialTokenPolicy.RAISE:
            raise ControlTokenError(
                f"the control token {token!r} at rendered offset {at} would be made of request text "
                "(the template reshaped it)",
                path=path or f"rendered text offset {at}",
                hint="remove it, or render with special_tokens='text' to encode it as plain text",
            )
        untrusted.append(Span(s, e, path))

    return Rendered(
        text=text,
        template=template,
        variables=freeze({k: v for k, v in {**variables, "continue_final_message": continue_final_message}.items()}),
        now=clock.isoformat(),
        clock_used=bool(clock_calls),
        request_spans=tuple(Span(s, e, p) for s, e, p, note in spans),
        provenance_exact=not any(note for *_, note in spans),
        untrusted=tuple(untrusted),
        policy=policy,
        clock_zone=clock.tzname() or "",
        seed=seed,
        draws=tuple(freeze(d) for d in draws),
        warnings=(_role_warnings(template, special_tokens, tokens, limits) if check_roles else ())
        + _reference_warnings(template, request, continue_final_message)
        + _flatten_warning(flattened, fmt_option),
        content_format=str(fmt),
        flattened=flattened,
        content_format_detected=str(detected),
    )


def _content_format_option(value: Any) -> ContentFormat:
    try:
        return ContentFormat(value)
    except ValueError:
        raise TemplateError(
            f"unknown content format {value!r}",
            path="content_format",
            hint="use 'auto' (detect from the template), 'string' (join text parts) or 'openai' (parts as sent)",
        ) from None


def _content_path(message: Message) -> str:
    """The JSON path of a message's content list (an Anthropic system list is `system` itself)."""
    first = message.origins.get(".content[0].text")
    if first is not None:
        return re.sub(r"\[\d+\]\.text$", "", first)
    return message.path_of(".content")


def _resolve_content_format(
    template: ChatTemplate, request: Request, option: ContentFormat
) -> tuple[str, str, tuple[str, ...]]:
    """The content format used and the one detected ("" both when no message holds a list: nothing is parsed), and
    the paths of the contents to join."""
    with_parts = [m for m in request.messages if isinstance(m.content, tuple)]
    if not with_parts:
        return "", "", ()
    detected = content_format(template.source)
    fmt = detected if option is ContentFormat.AUTO else option
    if fmt is ContentFormat.OPENAI:
        return fmt, detected, ()
    for m in with_parts:
        for j, part in enumerate(m.content):  # type: ignore[arg-type]
            if part.get("type") != "text":
                where = next((m.origins[k] for k in m.origins if k.startswith(f".content[{j}].")), None)
                raise ContentFormatError(
                    f"a content part of type {part.get('type')!r} cannot be joined into the string content this "
                    "template reads (its content format is 'string'); ctxlock never drops a part silently",
                    path=re.sub(r"\.(source|url|image_url)$", "", where) if where else f"{m.source}.content[{j}]",
                    hint="send text only, use a template that reads content parts, or content_format='openai' "
                    "(--content-format openai) to pass the parts as sent, as transformers does",
                )
    return fmt, detected, tuple(_content_path(m) for m in with_parts)


def _flatten_contents(messages: list[dict[str, Any]], request: Request) -> list[dict[str, Any]]:
    """Each content list joined into one string: its text parts with "\n" between them (vLLM's flattening), the
    provenance of every character kept. The newlines between parts belong to the request too (their path is the
    content list's): the joined string is one request string, so no character of it, however many empty parts
    a client sends, counts as the template's own text where a control token is matched. Only called once every
    part is known to be text."""
    out = []
    for m, message in zip(messages, request.messages, strict=True):
        content = m.get("content")
        if isinstance(message.content, tuple) and isinstance(content, list):
            sep = taint.leaf("\n", _content_path(message))
            m = {**m, "content": taint.join(sep, [part["text"] for part in content])}
        out.append(m)
    return out


def _flatten_warning(flattened: tuple[str, ...], option: ContentFormat) -> tuple[FrozenDict, ...]:
    if not flattened:
        return ()
    why = (
        "content_format='string' was asked"
        if option is ContentFormat.STRING
        else "the template reads message content as a string (detected from its syntax tree)"
    )
    shown = ", ".join(flattened[:3]) + (f" and {len(flattened) - 3} more" if len(flattened) > 3 else "")
    return (
        freeze(
            {
                "kind": "content_parts_joined",
                "message": f"{why}, so the text parts of {len(flattened)} message content(s) were joined with "
                '"\\n" into one string, as vLLM does; transformers passes the list as sent, which this template '
                "cannot read (to pass it as sent: content_format='openai', --content-format openai)",
                "path": shown,
            }
        ),
    )


def _parts_hint(hint: str | None, request: Request) -> str:
    """A failed render's hint, plus the content format option when the request holds content-part lists."""
    with_parts = [_content_path(m) for m in request.messages if isinstance(m.content, tuple)]
    if not with_parts:
        return hint or ""
    extra = (
        f"{with_parts[0]} is a list of content parts, which this template may read as a string: "
        "content_format='string' (--content-format string) joins their text parts"
    )
    return f"{hint}; {extra}" if hint else extra


def _reference_warnings(template: ChatTemplate, request: Any, continue_final_message: bool) -> tuple[FrozenDict, ...]:
    """What the render did that the reference would have refused (README, "Differences from the references")."""
    if not mistral.is_patched(template.source) or not request.messages:
        return ()
    out = [
        freeze({"kind": "reference_refuses", "message": message, "path": path})
        for path, message in mistral.refused_names(request)
    ]
    last = request.messages[-1]
    if last.role == "assistant" and not continue_final_message:
        out.append(
            freeze(
                {
                    "kind": "reference_refuses",
                    "message": "the request ends with an assistant message: ctxlock renders it as the template does, "
                    "where mistral-common's encode_chat_completion refuses it; pass continue_final_message to "
                    "continue it (mistral-common's prefix: true)",
                    "path": last.source,
                }
            )
        )
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------------
# Role markers: does the template separate turns with control tokens, or with text a user can type?

# The probe conversations, tried in turn (a template may refuse a system turn); each content is a sentinel word.
ROLE_PROBES: tuple[tuple[tuple[str, str], ...], ...] = (
    (
        ("system", "QZXPROBEALPHA"),
        ("user", "QZXPROBEBRAVO"),
        ("assistant", "QZXPROBECHARLIE"),
        ("user", "QZXPROBEDELTA"),
    ),
    (("user", "QZXPROBEBRAVO"), ("assistant", "QZXPROBECHARLIE"), ("user", "QZXPROBEDELTA")),
)


@dataclass(frozen=True)
class RoleMarkers:
    """What a probe render found between turns. `plain` lists each turn boundary whose text holds no control token
    of the vocabulary, as (boundary, text the template wrote there, template line or None). `checked` is False
    when the template renders no probe conversation (it raised on both), with the reason."""

    checked: bool
    plain: tuple[tuple[str, str, int | None], ...] = ()
    reason: str = ""

    @property
    def forgeable(self) -> bool:
        return bool(self.plain)

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "plain_text": [{"boundary": b, "text": t, "line": line} for b, t, line in self.plain],
            "reason": self.reason,
        }

    def warning(self, template: ChatTemplate) -> dict[str, Any] | None:
        if not self.plain:
            return None
        # Named first: the boundary a user forges to write the assistant's reply, then the others.
        order = ("user→assistant", "user→generation prompt", "assistant→user")
        boundary, text, line = min(self.plain, key=lambda p: order.index(p[0]) if p[0] in order else len(order))
        others = f" (and {len(self.plain) - 1} more boundary)" if len(self.plain) > 1 else ""
        return {
            "kind": "plain_text_role_markers",
            "message": f"the template's role markers are plain text, not control tokens: at the {boundary} boundary "
            f"it writes {text!r}{others}, which any message can contain, so a user can forge a turn and no "
            "special-token policy can stop it",
            "path": f"{template.id} line {line}" if line else template.id,
        }


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
    # Looked up on every render: keyed by values that hash fast (the special tokens as a tuple of pairs).
    key = (template, tuple((special_tokens or {}).items()), tokens, limits)
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
                special_tokens=special_tokens,
                control_tokens=tokens.tokens,
                now=datetime(2026, 1, 1).astimezone(),
                limits=limits,
                check_roles=False,
            ).text
        except CtxlockError as exc:  # the template refuses this conversation (or is over the limits on it)
            reason = f"the template renders no probe conversation: {exc}"
            continue
        plain = tuple(
            (name, between, _line_of(between, template.source))
            for name, between in role_boundaries(text, probe)
            if tokens.regex is None or not tokens.regex.search(between)
        )
        return RoleMarkers(True, plain)
    return RoleMarkers(False, reason=reason)


def role_boundaries(text: str, probe: tuple[tuple[str, str], ...]) -> Iterator[tuple[str, str]]:
    """(boundary name, text between two turns) for a probe render: from the end of each sentinel to the next
    one, and from the last one to the end (the generation prompt). Turns the template dropped are skipped, and a
    system turn folded into the first user turn (Mistral's templates join them with a blank line, no marker) is
    not a boundary: it has no role marker to forge."""
    found = sorted((text.find(content), len(content), role) for role, content in probe if content in text)
    for k, (start, size, role) in enumerate(found):
        end = start + size
        if k + 1 < len(found):
            between, name = text[end : found[k + 1][0]], f"{role}→{found[k + 1][2]}"
        else:
            between, name = text[end:], f"{role}→generation prompt"
        if role == "system" and not re.search(r"\w", between):
            continue
        yield name, between


def _line_of(marker: str, source: str) -> int | None:
    """The template line that writes a marker: the first line holding its stripped text, else its longest word,
    else its longest run of punctuation (`:` of `{{ role }}: `, where the role name comes from a variable)."""
    candidates = [
        marker.strip(),
        *sorted(re.findall(r"[^\W\d_]{2,}", marker), key=len, reverse=True),
        *sorted(re.findall(r"[^\w\s]+", marker), key=len, reverse=True),
    ]
    for c in candidates:
        if c and (at := source.find(c)) >= 0:
            return source.count("\n", 0, at) + 1
    return None


def aware_clock(now: datetime | None) -> datetime:
    """The render clock, timezone-aware: the local wall clock with the local zone when `now` is None, a naive
    `now` taken as local time (Python's `astimezone()`), an aware one as given."""
    if now is None:
        return datetime.now().astimezone()
    return now if now.tzinfo is not None and now.utcoffset() is not None else now.astimezone()


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise TemplateError(
            f"the render seed must be an integer in [0, 2**64), not {seed!r}",
            path="seed",
            hint="pass an integer (the default is 0)",
        )
    return seed


def _tag_final_message(msgs: list[dict[str, Any]], template: ChatTemplate) -> list[dict[str, Any]]:
    # transformers' continue_final_message: tag the last message's content, render, then cut at the tag.
    if not msgs:
        raise TemplateError("continue_final_message is set but the conversation is empty!")
    last = dict(msgs[-1])
    content = last.get("content")
    if content is None:
        raise TemplateError('continue_final_message is set but the final message has no "content" to continue!')
    if "content" not in template.source:
        raise TemplateError(
            'continue_final_message is set to "content" but this is not an accepted field in the chat_template'
        )
    if isinstance(content, list):
        parts = [dict(x) if isinstance(x, dict) else x for x in content]
        for part in reversed(parts):
            if isinstance(part, dict) and "text" in part:
                part["text"] = part["text"] + _CONTINUE_TAG
                break
        else:
            raise TemplateError(
                "continue_final_message is set but we could not find any text to continue in the final message!"
            )
        last["content"] = parts
    else:
        last["content"] = content + _CONTINUE_TAG
    return [*msgs[:-1], last]


def _final_text(messages: list[dict[str, Any]]) -> str:
    content = messages[-1].get("content")
    if isinstance(content, list):
        for part in reversed(content):
            if isinstance(part, dict) and "text" in part:
                return part["text"]
        return ""
    return content or ""


def _cut_at_continue_tag(
    text: str, spans: list[taint.SpanT], messages: list[dict[str, Any]]
) -> tuple[str, list[taint.SpanT]]:
    final = _final_text(messages).strip()
    tag = _CONTINUE_TAG.strip()
    if final not in text or tag not in text:
        raise TemplateError(
            "continue_final_message is set but the final message does not appear in the chat after applying the "
            "chat template! This can happen if the chat template deletes portions of the final message. Please "
            "verify the chat template and final message in your chat to ensure they are compatible."
            f"Final message to continue: {final}\nRendered chat:\n{text}"
        )
    loc = text.rindex(tag)
    cut = text[:loc] if text[loc : loc + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:loc].rstrip()
    return cut, taint.cut(tuple(spans), 0, len(cut))


__all__ = [
    "DEFAULT_LIMITS",
    "ROLE_PROBES",
    "ChatTemplate",
    "ContentFormat",
    "RenderLimits",
    "Rendered",
    "RoleMarkers",
    "Span",
    "SpecialTokenPolicy",
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
