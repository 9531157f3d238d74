"""Offline resolution of models in the Hugging Face hub cache, on a fake but realistic cache layout."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctxlock.artifacts._hub import hub_cache_dir, is_hub_id, resolve_hub_model
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError, PathTraversalError

MAIN = "a" * 40
OTHER = "0123456789abcdef0123456789abcdef01234567"
ENV_VARS = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


def make_model(cache: Path, repo_id: str, *, commits: dict[str, dict[str, bytes]], refs: dict[str, str]) -> Path:
    """The layout huggingface_hub writes: blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>,
    refs/<name> holding the commit hash without a newline."""
    org, name = repo_id.split("/")
    root = cache / f"models--{org}--{name}"
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    for commit, files in commits.items():
        for rel, data in files.items():
            blob = root / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            link = root / "snapshots" / commit / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    for ref, commit in refs.items():
        path = root / "refs" / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(commit)
    return root


FILES = {
    "tokenizer.json": json.dumps({"version": "1.0"}).encode(),
    "tokenizer_config.json": b"{}",
    "chat_template.jinja": b"{{ messages }}",
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


@pytest.fixture
def cache(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    cache = tmp_path / "hub"
    clean_env.setenv("HF_HUB_CACHE", str(cache))
    make_model(
        cache,
        "Qwen/Qwen2.5-0.5B-Instruct",
        commits={MAIN: FILES, OTHER: {"tokenizer.json": b"{}"}},
        refs={"main": MAIN, "v1.0": OTHER, "refs/pr/1": OTHER},
    )
    return cache


# ----------------------------------------------------------------------------------------------- resolve


def test_resolves_main_snapshot(cache: Path) -> None:
    snap = resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct")
    assert snap == cache / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / MAIN
    # the files are symlinks into blobs/, and they resolve to the content
    tok = snap / "tokenizer.json"
    assert tok.is_symlink()
    assert tok.resolve().parent == (cache / "models--Qwen--Qwen2.5-0.5B-Instruct" / "blobs").resolve()
    assert json.loads(tok.read_text()) == {"version": "1.0"}
    assert sorted(p.name for p in snap.iterdir()) == sorted(FILES)


def test_revisions(cache: Path) -> None:
    root = cache / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots"
    assert resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct", revision="main") == root / MAIN
    assert resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct", revision="v1.0") == root / OTHER
    assert resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct", revision="refs/pr/1") == root / OTHER
    assert resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct", revision=OTHER) == root / OTHER  # a commit, directly


def test_ref_with_trailing_newline(cache: Path) -> None:
    (cache / "models--Qwen--Qwen2.5-0.5B-Instruct" / "refs" / "main").write_text(MAIN + "\n")
    assert resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct").name == MAIN


def test_explicit_cache_dir_wins(cache: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    make_model(other, "Qwen/Qwen2.5-0.5B-Instruct", commits={OTHER: FILES}, refs={"main": OTHER})
    assert resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct", cache_dir=other).name == OTHER


# ---------------------------------------------------------------------------------------------- not found


def test_missing_model(cache: Path) -> None:
    with pytest.raises(ArtifactNotFoundError) as exc:
        resolve_hub_model("meta-llama/Llama-3.1-8B-Instruct")
    err = exc.value
    looked = cache / "models--meta-llama--Llama-3.1-8B-Instruct"
    assert "not in the local Hugging Face cache" in err.message
    assert str(looked) in err.message and err.path == str(looked)
    assert "huggingface-cli download meta-llama/Llama-3.1-8B-Instruct" in err.hint
    assert "HF_HUB_CACHE" in err.hint


def test_missing_ref(cache: Path) -> None:
    with pytest.raises(ArtifactNotFoundError) as exc:
        resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct", revision="dev")
    ref = cache / "models--Qwen--Qwen2.5-0.5B-Instruct" / "refs" / "dev"
    assert exc.value.path == str(ref) and str(ref) in exc.value.message
    assert "not in the local Hugging Face cache" in exc.value.message


def test_no_refs_dir_at_all(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    clean_env.setenv("HF_HUB_CACHE", str(cache))
    make_model(cache, "org/only-commit", commits={MAIN: FILES}, refs={})
    with pytest.raises(ArtifactNotFoundError):
        resolve_hub_model("org/only-commit")
    assert resolve_hub_model("org/only-commit", revision=MAIN).name == MAIN


def test_missing_snapshot(cache: Path) -> None:
    missing = "f" * 40
    (cache / "models--Qwen--Qwen2.5-0.5B-Instruct" / "refs" / "stale").write_text(missing)
    for rev in ("stale", missing):
        with pytest.raises(ArtifactNotFoundError) as exc:
            resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct", revision=rev)
        snap = cache / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / missing
        assert exc.value.path == str(snap) and str(snap) in exc.value.message


def test_damaged_ref(cache: Path) -> None:
    (cache / "models--Qwen--Qwen2.5-0.5B-Instruct" / "refs" / "main").write_text("not-a-hash")
    with pytest.raises(ArtifactFormatError) as exc:
        resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct")
    assert exc.value.path.endswith("refs/main")


# --------------------------------------------------------------------------------------------- traversal


@pytest.mark.parametrize(
    "repo_id", ["../etc", "org/..", "../../x", "/abs/path", "org/../../x", "..\\x", "~/model", "./x", "C:/x"]
)
def test_traversal_is_refused(cache: Path, repo_id: str) -> None:
    with pytest.raises(PathTraversalError) as exc:
        resolve_hub_model(repo_id)
    assert exc.value.hint


@pytest.mark.parametrize("repo_id", ["", "justone", "a/b/c", "org/na--me", "org/a..b", "org/-x", "org/x.git", "o rg/x"])
def test_malformed_repo_ids(cache: Path, repo_id: str) -> None:
    with pytest.raises(ArtifactFormatError):
        resolve_hub_model(repo_id)


@pytest.mark.parametrize("revision", ["../../../etc", "/etc/passwd", "refs/../../x", "a//b", "", "x\\y"])
def test_traversal_in_revision_is_refused(cache: Path, revision: str) -> None:
    with pytest.raises(PathTraversalError):
        resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct", revision=revision)


# ---------------------------------------------------------------------------------------- env precedence


def test_precedence_of_environment_variables(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert hub_cache_dir() == home / ".cache" / "huggingface" / "hub"
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    clean_env.setenv("HF_HOME", str(tmp_path / "hf-home"))
    assert hub_cache_dir() == tmp_path / "hf-home" / "hub"
    clean_env.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    assert hub_cache_dir() == tmp_path / "legacy"
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    assert hub_cache_dir() == tmp_path / "hub-cache"
    clean_env.setenv("HF_HUB_CACHE", "")  # empty counts as unset
    assert hub_cache_dir() == tmp_path / "legacy"


def test_tilde_and_vars_are_expanded(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("HF_HOME", "~/hfhome")
    assert hub_cache_dir() == tmp_path / "home" / "hfhome" / "hub"
    clean_env.setenv("MY_CACHE_ROOT", str(tmp_path / "root"))
    clean_env.setenv("HF_HUB_CACHE", "$MY_CACHE_ROOT/hub")
    assert hub_cache_dir() == tmp_path / "root" / "hub"


@pytest.mark.parametrize("var", ["HF_HUB_CACHE", "HF_HOME", "default"])
def test_resolve_uses_the_environment(clean_env: pytest.MonkeyPatch, tmp_path: Path, var: str) -> None:
    if var == "HF_HUB_CACHE":
        cache = tmp_path / "a"
        clean_env.setenv("HF_HUB_CACHE", str(cache))
        clean_env.setenv("HF_HOME", str(tmp_path / "decoy"))
    elif var == "HF_HOME":
        clean_env.setenv("HF_HOME", str(tmp_path / "b"))
        cache = tmp_path / "b" / "hub"
    else:
        cache = tmp_path / "home" / ".cache" / "huggingface" / "hub"
    make_model(cache, "org/model", commits={MAIN: FILES}, refs={"main": MAIN})
    make_model(tmp_path / "decoy" / "hub", "org/model", commits={OTHER: FILES}, refs={"main": OTHER})
    assert resolve_hub_model("org/model") == cache / "models--org--model" / "snapshots" / MAIN


def test_never_imports_huggingface_hub(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from ctxlock.artifacts._hub import resolve_hub_model\n"
        "from ctxlock.errors import ArtifactNotFoundError\n"
        "try:\n"
        "    resolve_hub_model('org/model')\n"
        "except ArtifactNotFoundError:\n"
        "    pass\n"
        "assert 'huggingface_hub' not in sys.modules, 'huggingface_hub was imported'\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env["HF_HUB_CACHE"] = str(tmp_path / "empty")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


# ----------------------------------------------------------------------------------------------- is_hub_id


def test_is_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert is_hub_id("Qwen/Qwen2.5-7B-Instruct")
    assert is_hub_id("mistralai/Mistral-7B-Instruct-v0.3")
    assert not is_hub_id("mistral-nemo")  # a built-in name, no slash
    assert not is_hub_id("a/b/c")
    assert not is_hub_id("../x")
    assert not is_hub_id("/abs/x")
    assert not is_hub_id("./x")
    assert not is_hub_id("org/na--me")
    (tmp_path / "org" / "local").mkdir(parents=True)
    assert not is_hub_id("org/local")  # an existing local directory wins
    assert is_hub_id("org/remote")
