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

A model spec may name a revision: `org/name@revision`, a branch, a tag or a commit (`resolve_hub_revision`).
It is resolved as huggingface_hub's `try_to_load_from_cache` does: `refs/<revision>` if that file exists, else
`snapshots/<revision>` taken as a commit. Without a revision it is `main`. What a ref names is a rolling
reference: the hub moves a branch with every push (and a tag can be moved), so the same spec can load other files
tomorrow. A record made through a ref says so (`HubRevision.rolling`) and names the commit it resolved to, which
`org/name@<commit>` pins.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError, PathTraversalError
from ctxlock.outside import read_input

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


MAX_REVISION_CHARS = 255  # a git ref component, and what a file name in the cache can hold


def _check_revision(revision: str) -> None:
    if len(revision) > MAX_REVISION_CHARS:
        raise ArtifactFormatError(
            f"the revision is {len(revision):,} characters long, over {MAX_REVISION_CHARS}",
            path=f"revision {revision[:40]!r}…",
            hint="use a branch or tag name (main) or a 40-hex commit hash",
        )
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


@dataclass(frozen=True)
class HubRevision:
    """How a hub spec resolved: the repo, the revision asked for, the commit it named, and whether it went
    through a ref (a rolling reference that the hub can move) or named the commit itself."""

    repo_id: str
    revision: str  # as asked ("main" when the spec named none)
    commit: str  # the snapshot directory's name, a 40-hex commit hash
    via: str  # "refs/<revision>" or "snapshots/<commit>"
    snapshot: Path

    @property
    def rolling(self) -> bool:
        return self.via.startswith("refs/")

    @property
    def pinned_spec(self) -> str:
        return f"{self.repo_id}@{self.commit}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "resolved_via": self.via,
            "rolling": self.rolling,
        }

    def warning(self) -> str | None:
        """The warning a run through a rolling reference carries, or None for a pinned commit."""
        if not self.rolling:
            return None
        return (
            f"{self.repo_id} was resolved through {self.via}, a rolling reference the hub can move, to commit "
            f"{self.commit}: pin it with --model {self.pinned_spec}"
        )


def split_hub_spec(spec: str) -> tuple[str, str | None]:
    """`org/name@revision` -> ("org/name", "revision"); `org/name` -> ("org/name", None). A repo id cannot hold
    "@", so the first one separates the revision (which may hold "/": `refs/pr/1`)."""
    repo_id, sep, revision = spec.partition("@")
    return repo_id, (revision if sep else None)


def resolve_hub_model(repo_id: str, *, revision: str | None = None, cache_dir: Path | None = None) -> Path:
    """The snapshot directory of `repo_id` at `revision` (default `main`) in the local hub cache.

    See `resolve_hub_revision`, which also says how it was resolved."""
    return resolve_hub_revision(repo_id, revision=revision, cache_dir=cache_dir).snapshot


def resolve_hub_revision(repo_id: str, *, revision: str | None = None, cache_dir: Path | None = None) -> HubRevision:
    """Resolve `repo_id` at `revision` (default `main`) in the local hub cache, as huggingface_hub does offline:
    `refs/<revision>` when that file exists (a branch or tag; it holds a commit hash), else `snapshots/<revision>`
    taken as a commit. `repo_id` may carry the revision itself (`org/name@v1.0`).

    Raises `ArtifactNotFoundError` (model, ref or snapshot missing), `PathTraversalError` (a repo id or revision
    that would leave the cache) or `ArtifactFormatError` (a ref file that does not hold a commit hash, or a
    revision given twice).
    """
    if isinstance(repo_id, str) and "@" in repo_id:
        repo_id, spec_revision = split_hub_spec(repo_id)
        if revision is not None and spec_revision != revision:
            raise ArtifactFormatError(
                f"two revisions: {spec_revision!r} in the spec and {revision!r}",
                path=f"{repo_id}@{spec_revision}",
                hint="name the revision once",
            )
        revision = spec_revision
    org, name = _check_repo_id(repo_id)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else hub_cache_dir()
    model_dir = cache / f"models--{org}--{name}"
    if not model_dir.is_dir():
        raise _not_cached(f"model {repo_id}", model_dir, repo_id, cache)
    rev = "main" if revision is None else revision
    if not isinstance(rev, str):
        raise ArtifactFormatError("revision must be a string", path=f"revision {rev!r}")
    _check_revision(rev)
    ref = model_dir / "refs" / rev
    if ref.is_file():  # a directory (refs/pr/ holds refs/pr/1) is not this revision
        # A ref holds 40 hex digits: a few KiB is plenty, and a FIFO or device under its name is refused.
        data = read_input(ref, label=str(ref), limit=4096, env=None, error=ArtifactFormatError)
        commit = data.decode("utf-8", "replace").strip()
        if not _COMMIT_RE.fullmatch(commit):
            raise ArtifactFormatError(
                f"the ref file does not hold a 40-hex commit hash: {commit[:60]!r}",
                path=str(ref),
                hint="the cache entry is damaged; download the model again",
            )
        via = f"refs/{rev}"
    elif _COMMIT_RE.fullmatch(rev):
        commit, via = rev, f"snapshots/{rev}"
    else:
        # Not a ref in this cache, and not a full commit hash (an abbreviated one is not resolved offline).
        raise _not_cached(f"revision {rev!r} of {repo_id}", ref, repo_id, cache)
    snapshot = model_dir / "snapshots" / commit
    if not snapshot.is_dir():
        raise _not_cached(f"snapshot {commit} of {repo_id}", snapshot, repo_id, cache)
    return HubRevision(repo_id=repo_id, revision=rev, commit=commit, via=via, snapshot=snapshot)


def is_hub_id(spec: str) -> bool:
    """Whether a model spec looks like a hub repo id (`org/name`, optionally `@revision`) and is not an existing
    local path."""
    if not isinstance(spec, str):
        return False
    repo_id, _ = split_hub_spec(spec)
    if not _valid_shape(repo_id):
        return False
    try:
        return not Path(spec).expanduser().exists()
    except OSError:  # a name too long to be a path (ENAMETOOLONG) is not a local path
        return True


__all__ = [
    "HubRevision",
    "hub_cache_dir",
    "is_hub_id",
    "resolve_hub_model",
    "resolve_hub_revision",
    "split_hub_spec",
]
