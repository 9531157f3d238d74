"""Models in the local Hugging Face hub cache, resolved offline.

`resolve_hub_model("org/name")` finds the snapshot directory that huggingface_hub would use for that repo and
revision, without downloading anything and without importing huggingface_hub. The cache layout is
huggingface_hub's:

    <cache>/models--org--name/
        refs/main                      a commit hash (40 hex digits), no newline
        snapshots/<commit>/<file>      symlinks into ../../blobs/<etag>
        blobs/<etag>

The cache root follows huggingface_hub's own precedence (`huggingface_hub.constants`):
`$HF_HUB_CACHE`, else the legacy `$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else
`$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`; `~` and `$VAR` in the values are expanded.
One difference: a variable set to the empty string counts as unset here (huggingface_hub would use the
current directory).

Snapshot files are symlinks into `blobs/`, outside the snapshot directory: a containment check that resolves
symlinks must treat the model root (`models--org--name/`) as the boundary for blobs, or check the path before
resolving the link, not the resolved target against the snapshot directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from ..errors import ArtifactFormatError, ArtifactNotFoundError, PathTraversalError
from ..inputs import read_input

# huggingface_hub's validate_repo_id: word characters, "-" and ".", starting and ending with a word character,
# at most 96 characters, no "--" and no "..".
_NAME_RE = re.compile(r"\w(?:[\w.-]{0,94}\w)?")
_COMMIT_RE = re.compile(r"[0-9a-f]{40}")


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    if not value:
        return None
    return Path(os.path.expandvars(value)).expanduser()


def hub_cache_dir() -> Path:
    """The hub cache root, read from the environment at every call (see the module docstring for the order)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        path = _env_path(name)
        if path is not None:
            return path
    home = _env_path("HF_HOME")
    if home is None:
        xdg = _env_path("XDG_CACHE_HOME")
        home = (xdg if xdg is not None else Path("~/.cache").expanduser()) / "huggingface"
    return home / "hub"


def _valid_shape(repo_id: str) -> bool:
    parts = repo_id.split("/")
    return (
        len(parts) == 2
        and all(_NAME_RE.fullmatch(p) for p in parts)
        and "--" not in repo_id
        and ".." not in repo_id
        and not repo_id.endswith(".git")
    )


def _check_repo_id(repo_id: str) -> tuple[str, str]:
    if not isinstance(repo_id, str) or not repo_id:
        raise ArtifactFormatError("a hub repo id must be a non-empty 'org/name' string", path=str(repo_id))
    if (
        repo_id.startswith(("/", "\\", "~"))
        or re.match(r"[A-Za-z]:", repo_id)
        or "\\" in repo_id
        or "\x00" in repo_id
        or any(part in ("..", ".") for part in repo_id.split("/"))
    ):
        raise PathTraversalError(
            f"{repo_id!r} is not a hub repo id: it is an absolute path or climbs out with '..'",
            path=repo_id,
            hint="a hub repo id has the form org/name",
        )
    if not _valid_shape(repo_id):
        raise ArtifactFormatError(
            f"{repo_id!r} is not a hub repo id of the form org/name",
            path=repo_id,
            hint="use the id shown on the model's hub page, for example Qwen/Qwen2.5-7B-Instruct",
        )
    org, name = repo_id.split("/")
    return org, name


def _check_revision(revision: str) -> None:
    p = PurePosixPath(revision)
    if (
        not revision
        or p.is_absolute()
        or "\\" in revision
        or "\x00" in revision
        or any(part in ("..", ".", "") for part in revision.split("/"))
    ):
        raise PathTraversalError(
            f"revision {revision!r} is not a branch, tag or commit name",
            path=f"revision {revision!r}",
            hint="use a branch or tag name (main) or a 40-hex commit hash",
        )


def _not_cached(what: str, looked: Path, repo_id: str, cache: Path) -> ArtifactNotFoundError:
    return ArtifactNotFoundError(
        f"{what} is not in the local Hugging Face cache (looked in {looked})",
        path=str(looked),
        hint=(
            f"ctxlock never downloads: run `huggingface-cli download {repo_id}` on a machine with network access "
            f"and copy the cache here, or set HF_HUB_CACHE to the cache that has it (now {cache})"
        ),
    )


def resolve_hub_model(repo_id: str, *, revision: str | None = None, cache_dir: Path | None = None) -> Path:
    """The snapshot directory of `repo_id` at `revision` (default `main`) in the local hub cache.

    A 40-hex revision is a commit and names the snapshot directly; anything else is looked up in `refs/`.
    Raises `ArtifactNotFoundError` (model, ref or snapshot missing), `PathTraversalError` (a repo id or revision
    that would leave the cache) or `ArtifactFormatError` (a ref file that does not hold a commit hash).
    """
    org, name = _check_repo_id(repo_id)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else hub_cache_dir()
    model_dir = cache / f"models--{org}--{name}"
    if not model_dir.is_dir():
        raise _not_cached(f"model {repo_id}", model_dir, repo_id, cache)
    rev = "main" if revision is None else revision
    if not isinstance(rev, str):
        raise ArtifactFormatError("revision must be a string", path=f"revision {rev!r}")
    _check_revision(rev)
    if _COMMIT_RE.fullmatch(rev):
        commit = rev
    else:
        ref = model_dir / "refs" / rev
        if not ref.is_file():  # missing, or a directory (refs/pr/ holds refs/pr/1): not this revision
            raise _not_cached(f"revision {rev!r} of {repo_id}", ref, repo_id, cache)
        # A ref holds 40 hex digits: a few KiB is plenty, and a FIFO or device under its name is refused.
        data = read_input(ref, label=str(ref), limit=4096, env=None, error=ArtifactFormatError)
        commit = data.decode("utf-8", "replace").strip()
        if not _COMMIT_RE.fullmatch(commit):
            raise ArtifactFormatError(
                f"the ref file does not hold a 40-hex commit hash: {commit[:60]!r}",
                path=str(ref),
                hint="the cache entry is damaged; download the model again",
            )
    snapshot = model_dir / "snapshots" / commit
    if not snapshot.is_dir():
        raise _not_cached(f"snapshot {commit} of {repo_id}", snapshot, repo_id, cache)
    return snapshot


def is_hub_id(spec: str) -> bool:
    """Whether a model spec looks like a hub repo id (`org/name`) and is not an existing local path."""
    if not isinstance(spec, str):
        return False
    if not _valid_shape(spec):
        return False
    return not Path(spec).expanduser().exists()


__all__ = ["hub_cache_dir", "is_hub_id", "resolve_hub_model"]
