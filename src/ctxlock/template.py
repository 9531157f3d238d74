"""Template stage: canonical Request -> Rendered (text + provenance), with transformers' chat-template semantics.

The environment mirrors `transformers.apply_chat_template`: jinja2's ImmutableSandboxedEnvironment with
`trim_blocks`, `lstrip_blocks` and `loopcontrols`, a `tojson` that does not HTML-escape, `raise_exception`,
`strftime_now`, a `dict` without attribute tricks, a `namespace` that refuses underscore names, and the
`{% generation %}` tag. Messages reach the template as transformers passes them: None-valued keys dropped and
reasoning aliased as `thinking` / `reasoning_content`.

What ctxlock adds:
- limits: a render is bounded in wall time, output size and the size of `*` / `**` results, because a template
  from a GGUF file or the Hub is untrusted code;
- an injected clock: `strftime_now` reads `now`, which is recorded, so a render can be replayed;
- provenance: which character ranges of the output came from request strings (`Rendered.request_spans`), and
  which ranges must never become control tokens (`Rendered.untrusted`), found with marker characters that the
  tokenizer stage never sees.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import lru_cache
from types import CodeType, FrameType
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils

from .errors import (
    ControlTokenError,
    TemplateError,
    TemplateLimitError,
    TemplateNotFoundError,
    TemplateRaisedError,
    TemplateRuntimeError,
    TemplateSecurityError,
    TemplateSyntaxError,
)
from .frozen import FrozenDict, freeze, thaw
from .request import Message, Request
from .trie import longest_first


class SpecialTokenPolicy(StrEnum):
    """What to do with control-token strings found inside request strings."""

    TEXT = "text"  # default: encode them as plain text, never as control ids
    KEEP = "keep"  # reference behaviour (transformers, vLLM, llama.cpp): unsafe, must be asked for
    RAISE = "raise"  # reject the request, naming the JSON path


@dataclass(frozen=True)
class RenderLimits:
    """Bounds on one render. Real templates need milliseconds and kilobytes; the defaults leave wide room."""

    max_seconds: float = 5.0
    max_output_chars: int = 8_000_000


DEFAULT_LIMITS = RenderLimits()


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
    """One chat template source, identified by content digest."""

    source: str
    id: str  # human name, e.g. "Qwen-Qwen2.5-7B-Instruct.jinja" or "book/default"
    origin: str = ""  # where it came from: a file path, "tokenizer_config.json:chat_template", a generator

    @property
    def sha256(self) -> str:
        return _sha256(self.source)

    @property
    def features(self) -> TemplateFeatures:
        return _features(self.source)

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "sha256": self.sha256, "origin": self.origin}


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
    now: str  # the clock strftime_now read (ISO 8601), recorded even when the template did not read it
    clock_used: bool  # whether the template called strftime_now
    request_spans: tuple[Span, ...]  # ranges of `text` that are request strings
    provenance_exact: bool  # request_spans are exact (False: the template reshaped request strings)
    untrusted: tuple[Span, ...]  # ranges where no control token may be matched (zero width: a break)
    policy: SpecialTokenPolicy

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "template": self.template.to_dict(),
            "now": self.now,
            "clock_used": self.clock_used,
            "request_spans": [[s.start, s.end, s.path] for s in self.request_spans],
            "provenance_exact": self.provenance_exact,
        }


# ---------------------------------------------------------------------------------------------------------------
# The environment


class _Raised(jinja2.exceptions.TemplateError):
    """raise_exception() from inside a template; carries the template's own message."""


class _Limit(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _GenerationTag(jinja2.ext.Extension):
    # transformers' AssistantTracker: `{% generation %}...{% endgeneration %}` renders its body unchanged.
    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _TemplateDict:
    # transformers exposes `dict` without attribute access to the real type.
    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    # Same rule as transformers: no underscore-prefixed attributes on a namespace.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for key in attrs:
            _TemplateNamespace._check(key)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False):
    # Matches transformers' tojson: no HTML escaping, and the json.dumps options exposed.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: Any) -> None:
    raise _Raised(message)


_DICT_ATTRIBUTES = frozenset(dir(dict))
_LOOP_ATTRIBUTES = frozenset(
    {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0", "previtem", "nextitem"}
)


class _LimitedEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The HF sandbox plus size checks on `*` and `**`, whose results are built in C where no trace can stop them."""

    intercepted_binops = frozenset({"*", "**"})
    max_output_chars = DEFAULT_LIMITS.max_output_chars

    def getattr(self, obj: Any, attribute: str) -> Any:
        # `message.role` on a plain dict: the sandbox's own path (getattr fails, then obj[attribute]) gives the same
        # value or the same Undefined; dict methods (`items`, `update`, ...) still go through the sandbox checks.
        if type(obj) is dict and type(attribute) is str and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        if type(obj) is jinja2.runtime.LoopContext and attribute in _LOOP_ATTRIBUTES:
            # Public read-only properties of jinja's own loop object: the sandbox would allow each of them.
            return getattr(obj, attribute)
        return super().getattr(obj, attribute)

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > self.max_output_chars:
                    raise _Limit(f"'*' would build a sequence of {len(seq) * n:,} items")
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 4096:
            raise _Limit(f"'**' with exponent {right:,} is over the limit")
        return super().call_binop(context, operator, left, right)


@lru_cache(maxsize=256)
def _compile(source: str) -> jinja2.Template:
    env = _LimitedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        return _from_bytecode_cache(env, source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise TemplateSyntaxError(
            exc.message or str(exc),
            path=f"template line {exc.lineno}",
            hint="the chat template does not compile; fix it or choose another with --template",
        ) from None


# Bump when _compile's environment changes (options, extensions, filters that the compiler inlines): the bytecode
# cache is keyed by the template source only, so a new environment needs a new directory.
_BYTECODE_VERSION = 2


def _from_bytecode_cache(env: jinja2.Environment, source: str) -> jinja2.Template:
    """`env.from_string(source)`, with the compiled module kept on disk (jinja2's FileSystemBytecodeCache, under
    the ctxlock cache, one directory per jinja2 version and environment version): a large template (mistral-common's
    generated one) then loads in milliseconds instead of a tenth of a second. The code object is the one
    `from_string` would compile (same source, same `<template>` file name); an unreadable cache compiles anew."""
    from .artifacts.conversion_cache import cache_root

    try:
        directory = cache_root() / "jinja" / f"{jinja2.__version__}-{_BYTECODE_VERSION}"
        directory.mkdir(parents=True, exist_ok=True)
        cache = jinja2.FileSystemBytecodeCache(str(directory))
        # Keyed by the source's digest (jinja2 keys a bucket by name and file name only): one file per template, so
        # two models used in turn do not overwrite each other's entry. jinja2 checks the source's checksum as well.
        key = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
        bucket = cache.get_bucket(env, "<template>", key, source)
    except OSError:
        return env.from_string(source)
    code = bucket.code
    if code is None:
        code = env.compile(source)
        bucket.code = code
        with suppress(OSError):  # a read-only cache: compile every time
            cache.set_bucket(bucket)
    return env.template_class.from_code(env, code, env.make_globals(None), None)


def compile_template(template: ChatTemplate) -> None:
    """Compile now, so a syntax error surfaces at load time rather than at the first request."""
    _compile(template.source)


@lru_cache(maxsize=256)
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
# Limits: wall time via an interval timer (SIGALRM) on the main thread, or a line tracer on the template's own
# frames elsewhere; output size while streaming.


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.ticks = 0
        self.armed = True

    def expired(self) -> _Limit:
        return _Limit(f"render took longer than {self.seconds:g} s")

    def local(self, frame: FrameType, event: str, arg: Any) -> Callable | None:
        self.ticks += 1
        if self.ticks & 0xFF == 0 and time.monotonic() > self.deadline:
            raise self.expired()
        return self.local

    def global_(self, frame: FrameType, event: str, arg: Any) -> Callable | None:
        # Only the compiled template's code is traced; jinja's runtime and our filters run untraced at full speed.
        code: CodeType = frame.f_code
        if code.co_filename == "<template>":
            return self.local
        return None

    def on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            raise self.expired()


def _alarm_free() -> bool:
    """SIGALRM is ours to use: main thread, no handler installed by the host, no interval timer running."""
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN)
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )


@contextmanager
def _time_limit(seconds: float, *, tracer: bool | None = None) -> Iterator[_Deadline]:
    """Stop a render that runs past `seconds`. On the main thread an interval timer raises from the signal handler,
    which costs nothing per template line; the timer keeps firing every 50 ms after the deadline, so an exception
    swallowed by a broad `except` inside jinja is raised again. Elsewhere (worker threads, or a host that owns
    SIGALRM) a line tracer on the template's own frames checks the clock every 256 lines."""
    deadline = _Deadline(seconds)
    if tracer is None:
        tracer = not _alarm_free()
    if tracer:
        previous_trace = sys.gettrace()
        sys.settrace(deadline.global_)
        try:
            yield deadline
        finally:
            sys.settrace(previous_trace)
        return
    previous = signal.signal(signal.SIGALRM, deadline.on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    try:
        yield deadline
    finally:
        deadline.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _render_limited(
    compiled: jinja2.Template, context: dict[str, Any], limits: RenderLimits, *, tracer: bool | None = None
) -> str:
    chunks: list[str] = []
    size = 0
    limit = limits.max_output_chars
    append = chunks.append
    # The clock is the timer's or the tracer's job (both see every template frame); here only the size is counted.
    with _time_limit(limits.max_seconds, tracer=tracer):
        for chunk in compiled.generate(**context):
            size += len(chunk)
            if size > limit:
                raise _Limit(f"output exceeded {limit:,} characters")
            append(chunk)
    return "".join(chunks)


def _template_line(compiled: jinja2.Template, tb: Any) -> int | None:
    # jinja rewrites the traceback on the way out of generate(): template frames already carry template lines.
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _run(template: ChatTemplate, context: dict[str, Any], limits: RenderLimits) -> str:
    """Render once; map every failure to a typed TemplateError that names the template line."""
    compiled = _compile(template.source)
    env = compiled.environment
    assert isinstance(env, _LimitedEnvironment)
    env.max_output_chars = limits.max_output_chars
    try:
        return _render_limited(compiled, context, limits)
    except _Raised as exc:
        line = _template_line(compiled, exc.__traceback__)
        raise TemplateRaisedError(
            str(exc.message if exc.message is not None else exc),
            path=f"{template.id} line {line}" if line else template.id,
            hint="the template rejected this conversation",
        ) from None
    except _Limit as exc:
        raise TemplateLimitError(
            exc.message,
            path=template.id,
            hint="the template is over ctxlock's render limits; it may be hostile, or raise the limits explicitly",
        ) from None
    except RecursionError:
        raise TemplateLimitError(
            "render recursed too deeply", path=template.id, hint="the template recurses without bound"
        ) from None
    except jinja2.exceptions.SecurityError as exc:
        line = _template_line(compiled, exc.__traceback__)
        raise TemplateSecurityError(
            str(exc),
            path=f"{template.id} line {line}" if line else template.id,
            hint="the sandbox refused an unsafe operation; do not use this template",
        ) from None
    except TemplateError:
        raise
    except Exception as exc:
        # UndefinedError, TypeError, OverflowError (range too big), ...: the template failed on this input.
        line = _template_line(compiled, exc.__traceback__)
        raise TemplateRuntimeError(
            str(exc),
            path=f"{template.id} line {line}" if line else template.id,
            hint=f"{type(exc).__name__} while rendering; the template does not accept this conversation",
        ) from None


# ---------------------------------------------------------------------------------------------------------------
# Markers: characters that the template carries through untouched and that ctxlock removes afterwards.
# They are printable (Python's repr keeps printable characters as they are, templates that print dicts would
# otherwise turn them into escapes) and chosen per render from a block that the request and template don't use.

_MARKER_POOL = [chr(c) for c in range(0x4DC0, 0x4E00)]  # Yijing hexagram symbols: printable, no case, no width


_MARKER_RANGE = re.compile("[\u4dc0-\u4dff]")


@lru_cache(maxsize=256)
def _markers_in(text: str) -> frozenset[str]:
    return frozenset(_MARKER_RANGE.findall(text))


def _pick_markers(n: int, avoid: Iterable[str]) -> list[str]:
    used: set[str] = set()
    for text in avoid:
        if _MARKER_RANGE.search(text):
            used |= _markers_in(text)
    free = [m for m in _MARKER_POOL if m not in used]
    if len(free) < n:
        raise TemplateError(
            "the request and template use every marker character ctxlock could use",
            hint="render with special_tokens='keep' if you trust the request",
        )
    return free[:n]


@dataclass(frozen=True, eq=False)  # hashed by identity: it is a cache key, and hashing a Pattern is slow
class _TokenSet:
    """The control-token strings, with what marking needs precomputed: a longest-first regex, and the proper
    prefixes and suffixes by which two adjacent request strings could join into a token."""

    regex: re.Pattern[str] | None
    prefixes: frozenset[str]  # proper prefixes of tokens: a string ending in one could join a neighbour
    suffixes: frozenset[str]  # proper suffixes of tokens: a string starting with one could join a neighbour
    longest: int
    tokens: tuple[str, ...] = ()
    heads: tuple[str, ...] = ()  # the tokens' first two characters: a string holding none of them holds no token
    joined: str = ""  # the tokens joined by NUL ("" if one holds a NUL): a NUL-free string is in a token iff in this
    firsts: tuple[str, ...] = ()  # the tokens' first characters: every prefix starts with one
    lasts: tuple[str, ...] = ()  # the tokens' last characters: every suffix ends with one


@lru_cache(maxsize=64)
def _token_set(all_tokens: frozenset[str]) -> _TokenSet:
    tokens = sorted(t for t in all_tokens if t and not t.isspace())
    if not tokens:
        return _TokenSet(None, frozenset(), frozenset(), 0)
    prefixes = frozenset(t[:k] for t in tokens for k in range(1, len(t)))
    suffixes = frozenset(t[k:] for t in tokens for k in range(1, len(t)))
    return _TokenSet(
        regex=longest_first(tokens),
        prefixes=prefixes,
        suffixes=suffixes,
        longest=max(map(len, tokens)),
        tokens=tuple(tokens),
        heads=tuple(sorted({t[:2] for t in tokens})),
        joined="" if any("\0" in t for t in tokens) else "\0".join(tokens),
        firsts=tuple(sorted({t[0] for t in tokens})),
        lasts=tuple(sorted({t[-1] for t in tokens})),
    )


def _joins_after(s: str, tokens: _TokenSet) -> bool:
    """Whether `s` ends in a proper prefix of a token (so it could join the string rendered after it). A prefix
    starts with a token's first character: only the places in the last `longest` characters where one occurs are
    looked up, found by C-level `str.find` (usually none)."""
    tail = s[-tokens.longest :]
    for f in tokens.firsts:
        i = tail.find(f)
        while i >= 0:
            if tail[i:] in tokens.prefixes:
                return True
            i = tail.find(f, i + 1)
    return False


def _joins_before(s: str, tokens: _TokenSet) -> bool:
    """Whether `s` starts with a proper suffix of a token (so it could join the string rendered before it)."""
    head = s[: tokens.longest]
    for last in tokens.lasts:
        j = head.find(last)
        while j >= 0:
            if head[: j + 1] in tokens.suffixes:
                return True
            j = head.find(last, j + 1)
    return False


@lru_cache(maxsize=1 << 16)  # a conversation re-rendered (fit_context, batches) re-marks the same strings
def _mark_string(s: str, tokens: _TokenSet, o: str, c: str, b: str) -> str:
    """Wrap each control-token occurrence in O..C; put a break B at an end that could join into a token."""
    if tokens.regex is None or not s:
        return s
    # `in` is a C-level substring search: most strings contain no token's first two characters, and skip the regex.
    found = any(h in s for h in tokens.heads) and tokens.regex.search(s)
    out = tokens.regex.sub(lambda m: f"{o}{m.group(0)}{c}", s) if found else s
    # A string ending in the first part of a token (or starting with the last part) could form one together
    # with its neighbour (two content parts rendered back to back): keep them apart with a break.
    if _joins_after(out, tokens):
        out = out + b
    if _joins_before(out, tokens):
        out = b + out
    return out


def _walk_strings(value: Any, fn: Callable[[str], str], *, keys: bool) -> Any:
    """Apply fn to every string (and, with keys=True, every key) of plain JSON data. Roles are validated structural
    values and stay as they are. With keys=False the values of "type" keys are left alone too: templates compare
    them (`part.type == 'text'`), so wrapping them would change the template's flow."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        return {
            (fn(k) if keys and isinstance(k, str) else k): (
                v if (k == "role" or (k == "type" and not keys)) else _walk_strings(v, fn, keys=keys)
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_walk_strings(v, fn, keys=keys) for v in value]
    return value


def _string_would_mark(s: str, tokens: _TokenSet) -> bool:
    """Whether `_mark_string` would change `s` (a token inside it, or an end that could join into one), decided
    without building the marked string."""
    if tokens.regex is None or not s:
        return False
    if any(h in s for h in tokens.heads) and tokens.regex.search(s):
        return True
    return _joins_after(s, tokens) or _joins_before(s, tokens)


def _would_mark(value: Any, tokens: _TokenSet) -> bool:
    """Whether `_walk_strings(value, mark, keys=True)` would change anything: the same walk, without building."""
    if isinstance(value, str):
        return _string_would_mark(value, tokens)
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str) and _string_would_mark(k, tokens):
                return True
            if k != "role" and _would_mark(v, tokens):
                return True
        return False
    if isinstance(value, (list, tuple)):
        return any(_would_mark(v, tokens) for v in value)
    return False


def _scan(value: Any, tokens: _TokenSet, hiding: set[str], hide: bool = True) -> bool:
    """One walk for both questions the render asks of request data: whether marking would change it (the return
    value; as `_would_mark`) and which of its strings could hide inside a control token (added to `hiding`; as
    `_hiding_strings`, which skips the values of "type" keys)."""
    if isinstance(value, str):
        if hide and _is_infix(value, tokens):
            hiding.add(value)
        return _string_would_mark(value, tokens)
    mark = False
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str) and not mark and _string_would_mark(k, tokens):
                mark = True
            if k != "role" and _scan(v, tokens, hiding, hide and k != "type"):
                mark = True
    elif isinstance(value, (list, tuple)):
        for v in value:
            if _scan(v, tokens, hiding, hide):
                mark = True
    return mark


@lru_cache(maxsize=1 << 14)
def _message_scan(message: Message, tokens: _TokenSet) -> tuple[bool, frozenset[str]]:
    """(would marking change this message, its strings that could hide inside a control token), once per message."""
    hiding: set[str] = set()
    mark = _scan(_template_message(message), tokens, hiding)
    return mark, frozenset(hiding)


def _is_infix(s: str, tokens: _TokenSet) -> bool:
    """Whether `s` is a non-empty substring of a control token: a request string equal to one could sit strictly
    inside that token, and nowhere else. One C-level search in the NUL-joined tokens."""
    if not s or len(s) > tokens.longest:
        return False
    if tokens.joined:
        return "\0" not in s and s in tokens.joined
    return any(s in t for t in tokens.tokens)


def _hiding_strings(value: Any, tokens: _TokenSet, out: set[str]) -> None:
    """Collect the strings the provenance pass would wrap (values only; not roles, not `type` values) that are
    substrings of a control token: the one case where provenance, not marking, tells a forged token from a trusted
    one."""
    if isinstance(value, str):
        if _is_infix(value, tokens):
            out.add(value)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            if k not in ("role", "type"):
                _hiding_strings(v, tokens, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _hiding_strings(v, tokens, out)


@lru_cache(maxsize=256)
def _template_tools(tools: tuple[Any, ...]) -> tuple[dict[str, Any], ...]:
    """A request's tools as templates see them (`Request.template_tools`), converted once per distinct tool list:
    the sandbox is immutable, so templates cannot change the shared dicts, and a chat sends the same tools every
    turn."""
    return tuple(thaw(t) for t in tools)


@lru_cache(maxsize=256)
def _tools_scan(tools: tuple[Any, ...], tokens: _TokenSet) -> tuple[bool, frozenset[str]]:
    """`_message_scan` for a request's tool list, once per distinct list."""
    hiding: set[str] = set()
    mark = _scan(list(_template_tools(tools)), tokens, hiding)
    return mark, frozenset(hiding)


def _provenance_needed(hiding: set[str], tokens: _TokenSet, text: str) -> bool:
    """Whether a hiding string could be inside a control-token match of `text`: only if a control token that
    contains it occurs in the text at all (a match is an occurrence). A tool enum value "f" is a substring of
    "<|endoftext|>", but a chat that never spells "<|endoftext|>" has no match for it to hide in."""
    return any(s in t and t in text for s in hiding for t in tokens.tokens)


def _strip_markers(text: str, markers: str) -> tuple[str, list[tuple[int, str]]]:
    """Remove marker characters; return the clean text and (position in clean text, marker) pairs."""
    # Some templates JSON-encode request strings with ensure_ascii=True, which turns markers into \\u4dxx escapes.
    for m in markers:
        esc = f"\\u{ord(m):04x}"
        if esc in text:
            text = text.replace(esc, m)
    found: list[tuple[int, str]] = []
    pieces: list[str] = []
    last = 0
    for m in re.finditer(f"[{re.escape(markers)}]", text):
        pieces.append(text[last : m.start()])
        found.append((m.start() - len(found), m.group(0)))
        last = m.end()
    if not found:
        return text, found
    pieces.append(text[last:])
    return "".join(pieces), found


# ---------------------------------------------------------------------------------------------------------------
# Rendering


def _template_messages(request: Request) -> list[dict[str, Any]]:
    return [_template_message(m) for m in request.messages]


@lru_cache(maxsize=8192)
def _template_message(message: Message) -> dict[str, Any]:
    """A message as templates see it. Memoized: the sandbox is immutable, so a template cannot change the dict, and
    a long chat re-rendered turn after turn (or candidate after candidate) converts each message once."""
    m = message.to_template()
    # transformers' _alias_reasoning_fields: reasoning is visible as `thinking` (gpt-oss) and `reasoning_content`.
    reasoning = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
    if reasoning is not None:
        m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    return m


def clear_request_caches() -> None:
    """Forget what was memoized per request value (converted messages and tools, marking decisions), keeping
    compiled templates: `ctxlock.clear_caches` uses it so that benchmarks start each round cold."""
    for cached in (
        _markers_in,
        _mark_string,
        _message_scan,
        _template_tools,
        _tools_scan,
        _template_message,
    ):
        cached.cache_clear()


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class _NoProvenance(Exception):
    pass


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
) -> Rendered:
    """Render a request with a chat template, as transformers' `apply_chat_template(tokenize=False)` would.

    `special_tokens` are the template variables from the tokenizer config (`bos_token`, `eos_token`, ...).
    `control_tokens` are the vocabulary's added/special token strings: a request string may never become one.
    `tools`/`documents`/`chat_template_kwargs` given here (by the caller, trusted) are added to those of the request.
    `provenance=False` skips the second render that locates request strings (request_spans stay empty): control-
    token strings and token fragments in request strings are marked either way. The one case marking cannot see is
    a request string that is itself a substring of a control token ("im_st"), which the template could place
    strictly inside one; `provenance=None` renders the second pass exactly when a request holds such a string, so
    the ids are always those of `provenance=True`.
    """
    policy = SpecialTokenPolicy(policy)
    if continue_final_message and add_generation_prompt:
        raise TemplateError(
            "continue_final_message and add_generation_prompt are not compatible",
            path="options",
            hint="use continue_final_message to extend the last message, add_generation_prompt to start a new one",
        )
    req_tools = None if request.tools is None else list(_template_tools(request.tools))
    all_tools = (req_tools or []) + list(tools or []) if (req_tools or tools) else None
    req_docs = request.template_documents()
    all_docs = (req_docs or []) + list(documents or []) if (req_docs or documents) else None
    template = (
        templates if isinstance(templates, ChatTemplate) else templates.select(template_name, has_tools=bool(all_tools))
    )
    clock = now if now is not None else datetime.now()
    request_kwargs = dict(request.chat_template_kwargs.items()) if request.chat_template_kwargs else {}
    # Precedence: the caller's kwargs (an operator's --var) over the request's, over the tokenizer's special tokens.
    variables: dict[str, Any] = {
        **dict(special_tokens or {}),
        **request_kwargs,
        **dict(chat_template_kwargs or {}),
        "add_generation_prompt": add_generation_prompt,
    }
    tokens = _token_set(control_tokens if isinstance(control_tokens, frozenset) else frozenset(control_tokens))
    tokens_re = tokens.regex

    if policy is SpecialTokenPolicy.RAISE and tokens_re is not None:
        for path, s in request.strings():
            m = tokens_re.search(s)
            if m:
                raise ControlTokenError(
                    f"request string contains the control token {m.group(0)!r} at character {m.start()}",
                    path=path,
                    hint="remove it, or render with special_tokens='text' to encode it as plain text",
                )

    clock_calls: list[str] = []

    def strftime_now(fmt: str) -> str:
        clock_calls.append(fmt)
        return clock.strftime(fmt)

    messages = _template_messages(request)
    n_req_tools = len(req_tools or [])

    def context_for(mark: Callable[[str], str] | None, keys: bool) -> dict[str, Any]:
        msgs, tls, docs, kw = messages, all_tools, all_docs, variables
        if mark is not None:
            msgs = _walk_strings(messages, mark, keys=keys)
            # Only request-supplied tools, documents and kwargs are marked; the caller's own are trusted.
            tls = (
                None
                if all_tools is None
                else [_walk_strings(t, mark, keys=keys) for t in all_tools[:n_req_tools]] + all_tools[n_req_tools:]
            )
            docs = None if all_docs is None else [_walk_strings(d, mark, keys=keys) for d in all_docs]
            kw = {
                **variables,
                **{
                    k: _walk_strings(v, mark, keys=keys)
                    for k, v in request_kwargs.items()
                    if k not in (chat_template_kwargs or {})
                },
            }
        msgs = list(msgs)  # shared memoized dicts: the immutable sandbox keeps templates from changing them
        if continue_final_message:
            msgs = _tag_final_message(msgs, template)
        return {
            **kw,
            "messages": msgs,
            "tools": tls,
            "documents": docs,
            "strftime_now": strftime_now,
        }

    marking = not (policy is SpecialTokenPolicy.KEEP or tokens_re is None)
    hiding: set[str] = set()
    if marking:
        # One cached walk per message (and per tool list): would the marking walk below change anything (if not, it
        # is skipped: the text is the same without it), and which request strings are substrings of a control token
        # (e.g. "im_st"), the one case where marking cannot see a string sitting strictly inside a token.
        scans = [_message_scan(m, tokens) for m in request.messages]
        if request.tools is not None:
            scans.append(_tools_scan(request.tools, tokens))
        own_kwargs = {k: v for k, v in request_kwargs.items() if k not in (chat_template_kwargs or {})}
        marking = (
            any(mark for mark, _ in scans) or _would_mark(all_docs or [], tokens) or _would_mark(own_kwargs, tokens)
        )
        if provenance is None:
            for _, strings in scans:
                hiding |= strings
            _hiding_strings([all_docs or [], request_kwargs], tokens, hiding)
    if provenance is None:
        # Only when the ids could depend on it: under `keep` they never do; otherwise only when a hiding string was
        # found above, and then only if a token containing it occurs in the text (decided after pass 1).
        provenance = bool(hiding)

    def markers() -> tuple[str, ...]:
        return tuple(_pick_markers(5, [template.source, *(s for _, s in request.strings())]))

    o = c = b = p = q = ""  # no pass that needs them runs: no markers
    if marking:
        o, c, b, p, q = markers()

    # 1. The text. Under TEXT/RAISE, control-token strings inside request strings are marked.
    if not marking:
        raw = _run(template, context_for(None, False), limits)
        text, found = raw, []
    else:
        raw = _run(template, context_for(lambda s: _mark_string(s, tokens, o, c, b), True), limits)
        text, found = _strip_markers(raw, o + c + b)
    if continue_final_message:
        text, found = _cut_at_continue_tag(text, found, messages)
    untrusted = _untrusted_from_markers(found, len(text), o, c)

    # 2. Provenance: render again with every request string wrapped in P..Q. When the clean text is the same,
    # the wrapped ranges are exact; when the template reshaped request strings (strip, slicing), they are not.
    def wrap(s: str) -> str:
        inner = _mark_string(s, tokens, o, c, b) if marking else s
        return f"{p}{inner}{q}" if s else s

    spans: tuple[Span, ...] = ()
    exact = False
    try:
        if not provenance or (hiding and not _provenance_needed(hiding, tokens, text)):
            raise _NoProvenance
        if not marking:
            o, c, b, p, q = markers()
        raw2 = _run(template, context_for(wrap, False), limits)
        text2, found2 = _strip_markers(raw2, o + c + b + p + q)
        if continue_final_message:
            text2, found2 = _cut_at_continue_tag(text2, found2, messages)
        if text2 == text:
            spans, exact = _spans_from_wrappers(found2, p, q, text, request)
    except (TemplateError, _NoProvenance):
        pass  # the template treats wrapped strings differently (e.g. equality tests); provenance stays inexact
    if exact:
        untrusted = untrusted + spans

    return Rendered(
        text=text,
        template=template,
        variables=freeze({k: v for k, v in {**variables, "continue_final_message": continue_final_message}.items()}),
        now=clock.isoformat(),
        clock_used=bool(clock_calls),
        request_spans=spans,
        provenance_exact=exact,
        untrusted=tuple(sorted(set(untrusted), key=lambda s: (s.start, s.end))),
        policy=policy,
    )


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
    text: str, found: list[tuple[int, str]], messages: list[dict[str, Any]]
) -> tuple[str, list[tuple[int, str]]]:
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
    return cut, [(pos, m) for pos, m in found if pos <= len(cut)]


def _untrusted_from_markers(found: list[tuple[int, str]], n: int, o: str, c: str) -> tuple[Span, ...]:
    """O..C pairs cover a token that came from a request string. A lone O or C (a template sliced the string)
    distrusts the characters on both sides, and any marker is a break no match may cross."""
    spans: list[Span] = []
    open_at: int | None = None
    for pos, m in found:
        if m == o:
            if open_at is not None:
                spans.append(Span(max(0, open_at - 1), min(n, open_at + 1)))
            open_at = pos
        elif m == c:
            if open_at is not None:
                spans.append(Span(open_at, pos))
                open_at = None
            else:
                spans.append(Span(max(0, pos - 1), min(n, pos + 1)))
        spans.append(Span(pos, pos))
    if open_at is not None:
        spans.append(Span(max(0, open_at - 1), min(n, open_at + 1)))
    return tuple(spans)


def _spans_from_wrappers(
    found: list[tuple[int, str]], p: str, q: str, text: str, request: Request
) -> tuple[tuple[Span, ...], bool]:
    # Wrappers say where request strings are, not which one; name each span by the first unused request string
    # with the same text (the order of request.strings() follows the request, as templates mostly do).
    paths: dict[str, list[str]] = {}
    for path, s in request.strings():
        paths.setdefault(s, []).append(path)
    spans: list[Span] = []
    stack: list[int] = []
    for pos, m in found:
        if m == p:
            stack.append(pos)
        elif m == q:
            if not stack:
                return (), False
            start = stack.pop()
            if not stack and pos > start:
                candidates = paths.get(text[start:pos])
                spans.append(Span(start, pos, candidates.pop(0) if candidates else ""))
    if stack:
        return (), False
    return tuple(spans), True


__all__ = [
    "DEFAULT_LIMITS",
    "ChatTemplate",
    "RenderLimits",
    "Rendered",
    "Span",
    "SpecialTokenPolicy",
    "TemplateFeatures",
    "TemplateSet",
    "compile_template",
    "render",
]
