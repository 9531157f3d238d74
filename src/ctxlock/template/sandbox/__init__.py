"""The Jinja sandbox templates run in: transformers' environment (its filters, `raise_exception`,
`{% generation %}`), bounded in size, time, output and memory per render (`RenderLimits`). `render_source` renders
a template source with plain variables, every failure as a value (`SourceRender`)."""

from ctxlock.template.sandbox._env import DEFAULT_LIMITS
from ctxlock.template.sandbox._limits import RenderLimits
from ctxlock.template.sandbox._source import SourceRender, render_source

__all__ = [
    "DEFAULT_LIMITS",
    "RenderLimits",
    "SourceRender",
    "render_source",
]
