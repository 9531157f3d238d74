"""The template stage's values: a chat template (`ChatTemplate`, identified by content digest), a model's set of
them (`TemplateSet`), and what a render gives (`Rendered`, with `Span`s of request text). Below `ctxlock.template`,
which compiles and renders them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ctxlock.caches import memoize
from ctxlock.core import FrozenDict, thaw
from ctxlock.errors import TemplateNotFoundError
from ctxlock.template._options import InjectionPolicy


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
        # Computed once per template object (frozen: `source` cannot change), not on every render that asks for it.
        cached = self.__dict__.get("_sha256")
        if cached is None:
            cached = _sha256(self.source)
            object.__setattr__(self, "_sha256", cached)
        return cached

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
    policy: InjectionPolicy
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
    # The `{% generation %}` blocks' [start, end) in `text`, in the order rendered (transformers' AssistantTracker
    # spans; empty for a template without the tag). `ctxlock.training` uses them.
    generation_spans: tuple[tuple[int, int], ...] = ()

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


__all__ = [
    "ChatTemplate",
    "Rendered",
    "Span",
    "TemplateFeatures",
    "TemplateSet",
    "line_endings",
    "template_from_file_text",
]
