"""The Jinja sandbox templates run in: transformers' environment (its filters, `raise_exception`,
`{% generation %}`), bounded in size, time, output and memory per render (`RenderLimits`)."""

from ctxlock.template.sandbox._env import DEFAULT_LIMITS

__all__ = [
    "DEFAULT_LIMITS",
]
