"""What every loader of the artifacts package shares: `ModelArtifacts`, the containment check for the files a config
names (`inside`), reading model files as typed errors, chat templates from files and configs, and `finish`, which
assembles a model's artifacts.

Every file a config names must resolve inside the model directory, symlinks included, and be a regular file:
a directory, FIFO or device under an artifact's name is refused (a FIFO would block the read), and every model
JSON or template file is read through `ctxlock.outside` (capped at $CTXLOCK_MAX_ARTIFACT_BYTES).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxlock.core import FrozenDict, freeze
from ctxlock.economics import Capacity
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError, PathTraversalError
from ctxlock.outside import SYNTAX_ERROR, decode_utf8, loads_outside, read_artifact
from ctxlock.template import ChatTemplate, TemplateSet, compile_template, template_from_file_text
from ctxlock.tokenizer import Tokenizer

# `openai:MODEL`: a closed model's tiktoken encoding (`artifacts._openai`), no chat template.
OPENAI_PREFIX = "openai:"

NO_CAPACITY = Capacity()  # nothing stated: window and output limit unknown
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# JSON escapes can spell a lone surrogate, which no tokenizer vocabulary holds and UTF-8 cannot encode.
SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class ModelArtifacts:
    id: str
    source: str
    tokenizer: Tokenizer
    templates: TemplateSet | None
    special_tokens: FrozenDict  # template variables: bos_token, eos_token, ...
    pad_id: int | None
    description: str = ""
    hub: Any = None  # a hub.HubRevision when the model came from the HF hub cache (`org/name[@revision]`)
    capacity: Capacity = NO_CAPACITY  # the context window and output limit the files state (`ctxlock.economics`)
    # The model directory's preprocessor_config.json (image processor parameters), when it has one.
    preprocessor: FrozenDict | None = None

    def describe(self) -> dict[str, Any]:
        templates = []
        if self.templates is not None:
            for name, t in zip(self.templates.names, self.templates.templates, strict=True):
                templates.append({"name": name, **t.to_dict(), "features": t.features.to_dict()})
        return {
            "id": self.id,
            "source": self.source,
            "description": self.description,
            "tokenizer": self.tokenizer.describe(),
            "special_tokens": {
                k: {"content": v, "id": self.tokenizer.token_to_id(v)} for k, v in self.special_tokens.items()
            },
            "added_tokens": len(self.tokenizer.added_tokens),
            "control_tokens": len(self.tokenizer.control_tokens),
            "pad_id": self.pad_id,
            "templates": templates,
            "capacity": self.capacity.to_dict(),
            **({"hub": self.hub.to_dict()} if self.hub is not None else {}),
            **({"preprocessor_config": dict(self.preprocessor)} if self.preprocessor is not None else {}),
        }


def inside(root: Path, relative: str, *, field: str, config: Path, boundary: Path | None = None) -> Path:
    """Resolve a path a config names, refusing anything outside the model directory.

    The name itself must stay inside `root`, and the file it resolves to (symlinks followed) inside `boundary`
    (default: `root`). A HF hub snapshot links its files to `../../blobs/`, so there the boundary is the repo.
    """
    if not isinstance(relative, str) or not relative or "\x00" in relative or SURROGATE.search(relative):
        raise ArtifactFormatError(f"{field} must be a non-empty relative path", path=f"{config}:{field}")
    try:
        root = root.resolve()
        limit = (boundary or root).resolve()
        named = Path(os.path.normpath(root / relative))
        target = (root / relative).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a name too long for the file system
        raise ArtifactFormatError(f"{field} cannot be resolved: {exc}", path=f"{config}:{field}") from None
    if not named.is_relative_to(root) or not target.is_relative_to(limit):
        raise PathTraversalError(
            f"{field} points outside the model directory: {relative!r} resolves to {target}",
            path=f"{config}:{field}",
            hint=f"keep every file a config names inside {root}",
        )
    return target


def read_text(path: Path) -> str:
    """A model file's text: a regular UTF-8 file within the artifact cap, or a typed error naming it."""
    data = read_artifact(path, missing=ArtifactNotFoundError, error=ArtifactFormatError)
    return decode_utf8(data, label=str(path), error=ArtifactFormatError)


def read_json(path: Path) -> Any:
    """A model file's JSON, through the strict reader under the artifact bounds (`parse_json`)."""
    return parse_json(read_text(path), path)


def parse_json(text: str, path: Path, what: str = "JSON") -> Any:
    """A model file's JSON text through the strict reader (docs/outside-json.md): nesting past MAX_JSON_DEPTH,
    integers past Python's 4,300 digits, NaN/Infinity and lone surrogates are an ArtifactFormatError naming the file
    and the JSON path; a duplicate key keeps its last value, as transformers' json.load and tokenizers' serde_json
    maps read it, so that no file the references load is refused."""
    try:
        return loads_outside(text, f"{path} $", error=ArtifactFormatError, last_key_wins=True)
    except ArtifactFormatError as exc:
        message = exc.message.removeprefix(SYNTAX_ERROR)
        hint = exc.hint or "re-export the file as JSON"
        raise ArtifactFormatError(f"not valid {what}: {message}", path=exc.path, hint=hint) from None


def present(path: Path) -> bool:
    """Whether a standard artifact file is there: True for a regular file, False for nothing (or a dangling link),
    and an error for a directory, FIFO or device under that name, which would otherwise be silently skipped."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ArtifactFormatError(f"cannot read: {exc.strerror}", path=str(path)) from None
    if not stat.S_ISREG(mode):
        raise ArtifactFormatError(
            "is not a regular file", path=str(path), hint="remove it or replace it with the file it names"
        )
    return True


def regular(path: Path, where: str) -> Path:
    """A tokenizer file a manifest names, which its loader reads itself: it must exist and be a regular file."""
    if not present(path):
        raise ArtifactNotFoundError(f"missing file {path.name}", path=where)
    return path


def special_token(value: str, where: str) -> str:
    if SURROGATE.search(value):
        raise ArtifactFormatError(
            "a special token holds a lone surrogate, which is not a character",
            path=where,
            hint="escape characters outside the BMP as a surrogate pair",
        )
    return value


def token_content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def load_template_file(path: str | Path, *, id: str | None = None) -> ChatTemplate:
    p = Path(path)
    data = read_artifact(p, missing=ArtifactNotFoundError, error=ArtifactFormatError)
    text = decode_utf8(data, label=str(p), error=ArtifactFormatError)
    # Read as transformers reads chat_template.jinja (universal newlines); the digest of the bytes is kept too.
    template = template_from_file_text(
        text, id=id or p.name, origin=str(p), file_sha256=hashlib.sha256(data).hexdigest()
    )
    compile_template(template)
    return template


def templates_from_config(value: Any, *, where: str, model_id: str) -> TemplateSet | None:
    if value is None:
        return None
    if isinstance(value, str):
        t = ChatTemplate(value, id=f"{model_id}/default", origin=where)
        compile_template(t)
        return TemplateSet.single(t)
    if isinstance(value, list):
        names, templates = [], []
        for i, item in enumerate(value):
            if not (
                isinstance(item, Mapping)
                and isinstance(item.get("name"), str)
                and isinstance(item.get("template"), str)
            ):
                raise ArtifactFormatError("a chat_template list holds {name, template} objects", path=f"{where}[{i}]")
            t = ChatTemplate(item["template"], id=f"{model_id}/{item['name']}", origin=f"{where}[{i}]")
            compile_template(t)
            names.append(item["name"])
            templates.append(t)
        return TemplateSet(tuple(templates), tuple(names))
    raise ArtifactFormatError("chat_template must be a string or a list of {name, template}", path=where)


def finish(
    model_id: str,
    source: str,
    tokenizer: Tokenizer,
    templates: TemplateSet | None,
    special: Mapping[str, str],
    description: str,
    capacity: Capacity | None = None,
) -> ModelArtifacts:
    pad = special.get("pad_token")
    pad_id = tokenizer.token_to_id(pad) if pad is not None else None
    return ModelArtifacts(
        id=model_id,
        source=source,
        tokenizer=tokenizer,
        templates=templates,
        special_tokens=freeze(dict(special)),
        pad_id=pad_id,
        description=description,
        capacity=capacity or NO_CAPACITY,
    )


__all__ = [
    "SPECIAL_TOKEN_NAMES",
    "SURROGATE",
    "ModelArtifacts",
    "finish",
    "inside",
    "load_template_file",
    "parse_json",
    "present",
    "read_json",
    "read_text",
    "regular",
    "special_token",
    "templates_from_config",
    "token_content",
]
