"""sandbox."""

from ctxlock.template.sandbox._env import DEFAULT_LIMITS

__all__ = [
    "DEFAULT_LIMITS",
]
