"""Closed providers' token counts: exact where the provider publishes its encoding (OpenAI's text), documented where
it publishes a rule (message framing, images, PDFs, tool prompts), estimated elsewhere, each figure with a range
(docs/closed-providers.md)."""

from ctxlock.providers._calibrate import (
    HOLDOUT,
    Calibration,
    Residuals,
    fit,
    load_calibration,
    log_rows,
    read_calibration,
    residuals_of,
)
from ctxlock.providers._count import PRIOR, PROVIDERS, ProviderCountError, count_provider
from ctxlock.providers._images import anthropic_image, openai_image, openai_patches
from ctxlock.providers._values import BASES, KINDS, Basis, PartCount, ProviderCount

__all__ = [
    "BASES",
    "HOLDOUT",
    "KINDS",
    "PRIOR",
    "PROVIDERS",
    "Basis",
    "Calibration",
    "PartCount",
    "ProviderCount",
    "ProviderCountError",
    "Residuals",
    "anthropic_image",
    "count_provider",
    "fit",
    "load_calibration",
    "log_rows",
    "openai_image",
    "openai_patches",
    "read_calibration",
    "residuals_of",
]
