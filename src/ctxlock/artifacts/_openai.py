"""`openai:MODEL` model specs: an OpenAI model name mapped to its tiktoken encoding, loaded from the ranks file the
`bpe-openai` package ships (pinned by the sha256 tiktoken itself expects), with no chat template.

The name → encoding table is tiktoken's (`tiktoken/model.py`, tiktoken 0.14: `MODEL_TO_ENCODING` and
`MODEL_PREFIX_TO_ENCODING`), restricted to the chat models' two encodings ctxlock ships; a name under another
encoding (r50k_base, p50k_base: the retired completion models) or an unknown name is refused, naming the known ones.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ctxlock.artifacts._common import OPENAI_PREFIX, ModelArtifacts
from ctxlock.errors import ArtifactNotFoundError

MANIFEST_DIR = Path(__file__).resolve().parent / "openai"

# tiktoken 0.14, tiktoken/model.py: exact names first, then prefixes (a dated snapshot such as gpt-4o-2024-08-06).
_EXACT = {
    "o1": "o200k_base",
    "o3": "o200k_base",
    "o4-mini": "o200k_base",
    "gpt-5": "o200k_base",
    "gpt-4.1": "o200k_base",
    "gpt-4o": "o200k_base",
    "gpt-4": "cl100k_base",
    "gpt-3.5-turbo": "cl100k_base",
    "gpt-3.5": "cl100k_base",
    "gpt-35-turbo": "cl100k_base",
    "davinci-002": "cl100k_base",
    "babbage-002": "cl100k_base",
    "text-embedding-ada-002": "cl100k_base",
    "text-embedding-3-small": "cl100k_base",
    "text-embedding-3-large": "cl100k_base",
}
_PREFIXES = (
    ("o1-", "o200k_base"),
    ("o3-", "o200k_base"),
    ("o4-mini-", "o200k_base"),
    ("gpt-5", "o200k_base"),
    ("gpt-4.5-", "o200k_base"),
    ("gpt-4.1-", "o200k_base"),
    ("chatgpt-4o-", "o200k_base"),
    ("gpt-4o-", "o200k_base"),
    ("gpt-4-", "cl100k_base"),
    ("gpt-3.5-turbo-", "cl100k_base"),
    ("gpt-35-turbo-", "cl100k_base"),
    ("ft:gpt-4o", "o200k_base"),
    ("ft:gpt-4", "cl100k_base"),
    ("ft:gpt-3.5-turbo", "cl100k_base"),
    ("ft:davinci-002", "cl100k_base"),
    ("ft:babbage-002", "cl100k_base"),
)
ENCODINGS = ("o200k_base", "cl100k_base")


def openai_encoding(model: str) -> str:
    """The encoding of an OpenAI model name (`gpt-4o`, `gpt-4o-2024-08-06`, `openai:gpt-4o`), as tiktoken's
    `encoding_name_for_model` maps it; an encoding name itself is accepted too."""
    name = model.removeprefix(OPENAI_PREFIX)
    if name in ENCODINGS:
        return name
    found = _EXACT.get(name)
    if found is None:
        found = next((enc for prefix, enc in _PREFIXES if name.startswith(prefix)), None)
    if found is None:
        raise ArtifactNotFoundError(
            f"no OpenAI encoding known for model {name[:80]!r}",
            path=model[:200],
            hint="name an OpenAI chat model (gpt-4o, gpt-4.1, gpt-5, o3, o4-mini, gpt-4, gpt-3.5-turbo, or a dated "
            "snapshot of one) or an encoding: openai:o200k_base, openai:cl100k_base",
        )
    return found


def openai_manifest_dir(model: str) -> Path:
    """The packaged manifest directory of the model's encoding."""
    return MANIFEST_DIR / openai_encoding(model)


def as_openai_model(loaded: ModelArtifacts, spec: str) -> ModelArtifacts:
    """The encoding's artifacts, named for the model spec that asked for them."""
    name = spec.removeprefix(OPENAI_PREFIX)
    encoding = openai_encoding(spec)
    description = (
        f"OpenAI {name}: the {encoding} encoding (tiktoken's mapping), exact for text; OpenAI publishes no chat "
        "template, so `render` has none and `count --provider openai` counts the message framing by OpenAI's "
        "documented rule (docs/closed-providers.md)."
    )
    return dataclasses.replace(loaded, id=f"{OPENAI_PREFIX}{name}", description=description)
