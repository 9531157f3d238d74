"""Chat template stage: a canonical `Request` rendered by the model's Jinja template in a sandbox, with
provenance for every character, so request text never becomes a control token (`ChatTemplate`, `Rendered`,
`RenderOptions`, `InjectionPolicy`). The sandbox is `ctxlock.template.sandbox`; the Mistral request shapes,
role markers, documents and template variables are private modules here."""

from ctxlock.template._ast import parse_tree
from ctxlock.template._mistral import patch_template
from ctxlock.template._options import (
    BATCH_OPTIONS,
    ENCODE_OPTIONS,
    RENDER_OPTIONS,
    RenderKwargs,
    RenderOptions,
    check_options,
    render_options,
)
from ctxlock.template._render import (
    ChatTemplate,
    InjectionPolicy,
    Rendered,
    Span,
    TemplateSet,
    aware_clock,
    compile_template,
    content_format,
    render,
    template_from_file_text,
)

__all__ = [
    "BATCH_OPTIONS",
    "ENCODE_OPTIONS",
    "RENDER_OPTIONS",
    "ChatTemplate",
    "InjectionPolicy",
    "RenderKwargs",
    "RenderOptions",
    "Rendered",
    "Span",
    "TemplateSet",
    "aware_clock",
    "check_options",
    "compile_template",
    "content_format",
    "parse_tree",
    "patch_template",
    "render",
    "render_options",
    "template_from_file_text",
]
