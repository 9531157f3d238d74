"""Load a model's input artifacts: the tokenizer, the chat template(s) and the special-token variables.

A model spec is one of:
- a built-in name (`ctxlock models`): data directories shipped in `ctxlock/models/`;
- an HF model directory: `tokenizer.json` (or a slow `vocab.json` + `merges.txt`), `tokenizer_config.json`,
  `config.json`, `added_tokens.json`, `chat_template.jinja` (or an inline `chat_template`, or
  `additional_chat_templates/`), `special_tokens_map.json`. The tokenizer is the one `AutoTokenizer` loads: the
  class transformers picks and the pipeline it builds in code (`ctxlock.tokenizer.backends`), unless
  `tokenizer_pipeline="file"` asks for tokenizer.json's components as written;
- any directory with a `ctxlock.json` manifest (what the built-ins are).

Every file a config names must resolve inside the model directory, symlinks included, and be a regular file:
a directory, FIFO or device under an artifact's name is refused (a FIFO would block the read), and every model
JSON or template file is read through `ctxlock.outside` (capped at $CTXLOCK_MAX_ARTIFACT_BYTES). Whatever the
files hold, loading raises only ArtifactError subclasses (or a TemplateError for a template that does not
compile), never a bare KeyError, UnicodeError or OSError.

The package: `common` (ModelArtifacts, file checks, templates), `hf_dir` (HF directories), `manifest` (ctxlock.json
directories, through the backend `registry`), `gguf` (the GGUF reader), `gguf_bpe` / `gguf_spm` (the converters),
`gguf_load` (a GGUF file as a model), `hub` (the local HF hub cache). This module resolves a spec and caches loads.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ctxlock import caches
from ctxlock.artifacts._common import OPENAI_PREFIX, SPECIAL_TOKEN_NAMES, ModelArtifacts, inside, load_template_file
from ctxlock.artifacts._hf_dir import load_hf_dir
from ctxlock.core import lazy_exports
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError

if TYPE_CHECKING:
    from ctxlock.artifacts._gguf_load import GGUFTokenizer, load_gguf
    from ctxlock.artifacts._manifest import load_manifest_dir
    from ctxlock.artifacts._openai import openai_encoding

# The loaders of the other kinds of model (a GGUF file, a ctxlock.json directory, the hub cache, openai:NAME) are
# imported when a spec of their kind is loaded: a process that loads an HF directory never imports them.
_EXPORTS = {
    "GGUFTokenizer": "ctxlock.artifacts._gguf_load",
    "load_gguf": "ctxlock.artifacts._gguf_load",
    "load_manifest_dir": "ctxlock.artifacts._manifest",
    "openai_encoding": "ctxlock.artifacts._openai",
    "as_openai_model": "ctxlock.artifacts._openai",
    "openai_manifest_dir": "ctxlock.artifacts._openai",
    "is_hub_id": "ctxlock.artifacts._hub",
    "resolve_hub_revision": "ctxlock.artifacts._hub",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "models"
DEFAULT_MODEL = "mistral-nemo"
TOKENIZER_PIPELINES = ("class", "file")


def builtin_models() -> list[tuple[str, str]]:
    out = []
    for d in sorted(BUILTIN_DIR.iterdir()):
        manifest = d / "ctxlock.json"
        if manifest.is_file():
            out.append((d.name, json.loads(manifest.read_text("utf-8")).get("description", "")))
    return out


def _fingerprint(root: Path) -> tuple[tuple[str, int, int], ...]:
    try:
        return tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.iterdir()) if p.is_file())
    except OSError as exc:
        raise ArtifactFormatError(f"cannot list the model directory: {exc.strerror}", path=str(root)) from None


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


@caches.memoize("artifacts.hub_models", 32, scope="artifact")
def _load_hub_cached(
    snapshot: Path, repo_id: str, fingerprint: tuple[tuple[str, int, int], ...], tokenizer_pipeline: str = "class"
) -> ModelArtifacts:
    # Snapshot files are symlinks into the repo's blobs/: the repo directory is the containment boundary.
    return load_hf_dir(
        snapshot, boundary=snapshot.parent.parent, model_id=repo_id, tokenizer_pipeline=tokenizer_pipeline
    )


@caches.memoize("artifacts.models", 32, scope="artifact")
def _load_cached(
    root: Path, fingerprint: tuple[tuple[str, int, int], ...], tokenizer_pipeline: str = "class"
) -> ModelArtifacts:
    if root.is_file():
        return __getattr__("load_gguf")(root)  # the lazy table: a process that loads no GGUF never imports it
    if (root / "ctxlock.json").is_file():
        return __getattr__("load_manifest_dir")(root)
    return load_hf_dir(root, tokenizer_pipeline=tokenizer_pipeline)


def load_artifacts(spec: str | Path | None = None, *, tokenizer_pipeline: str = "class") -> ModelArtifacts:
    """Resolve a model spec (built-in name or directory) offline and load its artifacts.

    `tokenizer_pipeline` applies to HF directories: "class" (the default) builds the tokenizer the way the
    transformers class the directory names builds it, which is what `AutoTokenizer` loads; "file" keeps
    tokenizer.json's components as written. `describe()["tokenizer"]` says which was used and where they differ."""
    if tokenizer_pipeline not in TOKENIZER_PIPELINES:
        raise ValueError(f"tokenizer_pipeline must be one of {TOKENIZER_PIPELINES}, not {tokenizer_pipeline!r}")
    name = DEFAULT_MODEL if spec is None else str(spec)
    if name.startswith(OPENAI_PREFIX):
        as_openai_model, openai_manifest_dir = __getattr__("as_openai_model"), __getattr__("openai_manifest_dir")
        # openai:MODEL: the model's tiktoken encoding from the bpe-openai package, no chat template.
        root = openai_manifest_dir(name)
        return as_openai_model(_load_cached(root, _fingerprint(root), "class"), name)
    builtin = BUILTIN_DIR / name
    if "/" not in name and "\\" not in name and (builtin / "ctxlock.json").is_file():
        root = builtin
    else:
        root = Path(name).expanduser()
        try:
            exists = root.exists()
        except OSError as exc:  # ENAMETOOLONG and the like: not a path this machine can open
            exists = False
            if not __getattr__("is_hub_id")(name):
                raise ArtifactNotFoundError(
                    f"cannot look up {name[:80]!r}: {exc.strerror}", path=name[:200], hint="pass a shorter path"
                ) from None
        if not exists and __getattr__("is_hub_id")(name):
            # org/name[@revision]: the local HF hub cache, offline; never downloads. The artifacts carry how the
            # revision resolved (a rolling ref or a pinned commit), for the record.
            pin = __getattr__("resolve_hub_revision")(name)
            loaded = _load_hub_cached(pin.snapshot, pin.repo_id, _fingerprint(pin.snapshot), tokenizer_pipeline)
            return dataclasses.replace(loaded, hub=pin)
        if not exists:
            known = ", ".join(n for n, _ in builtin_models())
            raise ArtifactNotFoundError(
                f"no built-in model or directory named {name!r}",
                path=name,
                hint=f"built-in models: {known}; or pass an HF model directory, a .gguf file, or org/name from the "
                "local HF hub cache",
            )
        if not (root.is_file() or root.is_dir()):
            # /dev/null, a FIFO, a socket: there is nothing to load, and opening a FIFO would block.
            raise ArtifactFormatError(
                "a model is a directory or a GGUF file, and this is neither",
                path=name,
                hint="pass a model directory, a .gguf file or a built-in name",
            )
        if root.is_file():
            if not (root.suffix == ".gguf" or _is_gguf(root)):
                raise ArtifactFormatError(
                    "a model file must be a GGUF file",
                    path=name,
                    hint="pass a .gguf file, a model directory or a built-in name",
                )
            root = root.resolve()
            st = root.stat()
            return _load_cached(root, ((root.name, st.st_mtime_ns, st.st_size),))
    root = root.resolve()
    return _load_cached(root, _fingerprint(root), tokenizer_pipeline)


__all__ = [
    "BUILTIN_DIR",
    "DEFAULT_MODEL",
    "SPECIAL_TOKEN_NAMES",
    "TOKENIZER_PIPELINES",
    "GGUFTokenizer",
    "ModelArtifacts",
    "builtin_models",
    "inside",
    "load_artifacts",
    "load_gguf",
    "load_manifest_dir",
    "load_template_file",
    "openai_encoding",
]
