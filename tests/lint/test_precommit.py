"""The `ctxlock-lint` pre-commit hook (.pre-commit-hooks.yaml), run by pre-commit as a user's repository runs it.

A temporary git repository holds a template that does not compile and one that does, and a .pre-commit-config.yaml
whose `repo:` is a git clone of this repository at HEAD (the committed tree: pre-commit installs a hook from a
revision, never from a working tree). `pre-commit run --all-files` fails naming the bad template's finding (exit
status 1), passes once only the good one is left, and fails again on a template that cannot be read (not UTF-8: an
error, exit status 2).

What it costs: pre-commit builds a virtualenv and pip-installs ctxlock from the clone (its dependencies: numpy,
tokenizers, mistral-common, ...). Measured on 2 cores: 51 s the first time on a machine (downloads), 31 s with pip's
files at hand, 13-20 s from the wheelhouse below, 3 s when the environment exists. So everything lives in the test
cache (`fetched.cache_dir()/pre-commit`), at stable paths:

- `home/`: PRE_COMMIT_HOME, whose environment is reused for as long as HEAD does not change;
- `ctxlock.git`: the clone of HEAD (one commit deep), the `repo:` of the config, the same for every checkout;
- `wheels-<pyproject digest>/`: ctxlock's dependencies and build requirements as wheels, built once per
  pyproject.toml with pip; pre-commit's pip installs from it alone (PIP_NO_INDEX), without the network;
- `consumer/`: the user's repository, rewritten each run, so that `pre-commit gc` keeps the environment of HEAD and
  drops those of earlier revisions (each ~300 MB).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import fetched

ROOT = Path(__file__).resolve().parents[2]
PRE_COMMIT = Path(sys.executable).with_name("pre-commit")
BAD = "{% for m in messages %}\n{{ m['content'] }\n{% endfor %}\n"  # line 2 does not close its {{
GOOD = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
IDENTITY = ["-c", "user.name=ctxlock tests", "-c", "user.email=tests@ctxlock.invalid", "-c", "commit.gpgsign=false"]


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise fetched.ArtifactError(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Another test run on the machine waits for this one's pre-commit directories."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _clone_head(base: Path) -> tuple[Path, str]:
    """`base/ctxlock.git`, holding this checkout's HEAD (one commit deep) at refs/heads/head; and that commit."""
    head = _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).strip()
    clone = base / "ctxlock.git"
    if not (clone / "HEAD").is_file():
        _run(["git", "init", "--quiet", "--bare", str(clone)])
    _run(["git", "-C", str(clone), "fetch", "--quiet", "--depth=1", ROOT.as_uri(), "+HEAD:refs/heads/head"])
    assert _run(["git", "-C", str(clone), "rev-parse", "head"]).strip() == head
    return clone, head


def _wheelhouse(base: Path, clone: Path, head: str) -> Path:
    """`base/wheels-<sha12 of pyproject.toml>`: every wheel `pip install .` of ctxlock needs, built once with pip."""
    pyproject = _run(["git", "-C", str(clone), "show", f"{head}:pyproject.toml"])
    wheels = base / f"wheels-{hashlib.sha256(pyproject.encode('utf-8')).hexdigest()[:12]}"
    if wheels.is_dir():
        return wheels
    for stale in base.glob("wheels-*"):
        shutil.rmtree(stale)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        source, built = Path(tmp) / "src", Path(tmp) / "wheels"
        _run(["git", "clone", "--quiet", str(clone), str(source), "--branch", "head"])
        pip = [sys.executable, "-m", "pip", "--quiet", "--no-input"]
        _run([*pip, "wheel", "--wheel-dir", str(built), str(source)])
        _run([*pip, "download", "--dest", str(built), "setuptools>=77", "wheel"])  # [build-system] requires
        for own in built.glob("ctxlock-*.whl"):
            own.unlink()  # pre-commit builds ctxlock from the clone
        os.replace(built, wheels)
    return wheels


def _consumer(base: Path, clone: Path, head: str) -> Path:
    """`base/consumer`: a fresh git repository with bad.jinja, good.jinja, a README and the hook's config."""
    repo = base / "consumer"
    shutil.rmtree(repo, ignore_errors=True)
    (repo / "templates").mkdir(parents=True)
    (repo / "templates" / "bad.jinja").write_text(BAD, "utf-8")
    (repo / "templates" / "good.jinja").write_text(GOOD, "utf-8")
    (repo / "README.md").write_text("{{ not a template }\n", "utf-8")  # not .jinja: not linted
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {clone}\n    rev: {head}\n    hooks:\n      - id: ctxlock-lint\n", "utf-8"
    )
    _run(["git", "init", "--quiet", str(repo)])
    _commit(repo, "templates and the hook")
    return repo


def _commit(repo: Path, message: str) -> None:
    _run(["git", *IDENTITY, "-C", str(repo), "add", "--all"])
    _run(["git", *IDENTITY, "-C", str(repo), "commit", "--quiet", "--no-verify", "-m", message])


@pytest.fixture(scope="module")
def precommit() -> Iterator[tuple[Path, dict[str, str]]]:
    """(the consumer repository, the environment pre-commit runs in), the cache's pre-commit directories locked."""
    base = fetched.cache_dir() / "pre-commit"
    with _locked(fetched.cache_dir() / ".locks" / "pre-commit.lock"):
        clone, head = _clone_head(base)
        wheels = _wheelhouse(base, clone, head)
        repo = _consumer(base, clone, head)
        env = {
            **os.environ,
            "PRE_COMMIT_HOME": str(base / "home"),
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(wheels),
            "NO_COLOR": "1",
            "COLUMNS": "200",
        }
        for name in ("VIRTUAL_ENV", "PYTHONPATH"):  # the hook runs the ctxlock installed in its environment
            env.pop(name, None)
        yield repo, env
        _run([str(PRE_COMMIT), "gc"], cwd=repo, env=env)  # the environments of other revisions


def _pre_commit(repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PRE_COMMIT), "run", "--all-files", "--color", "never"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_the_hook_fails_on_a_bad_template_and_passes_on_a_good_one(precommit: tuple[Path, dict[str, str]]) -> None:
    repo, env = precommit
    failed = _pre_commit(repo, env)
    out = failed.stdout + failed.stderr
    assert failed.returncode == 1, out
    assert "ctxlock lint (chat templates)" in out and "Failed" in out
    assert "templates/bad.jinja" in out and "templates/good.jinja" in out and "README.md" not in out
    # the finding: its severity, line and rule, and the parser's message
    assert "error   line 2    syntax  unexpected '}'" in out, out
    assert "Traceback" not in out

    (repo / "templates" / "bad.jinja").unlink()
    _commit(repo, "only the good template")
    passed = _pre_commit(repo, env)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "ctxlock lint (chat templates)" in passed.stdout and "Passed" in passed.stdout

    (repo / "templates" / "latin1.jinja").write_bytes(b"{{ 'caf\xe9' }}\n")  # lint's error status 2, not a finding's 1
    _commit(repo, "a template that is not UTF-8")
    broken = _pre_commit(repo, env)
    out = broken.stdout + broken.stderr
    assert broken.returncode == 1 and "Failed" in out and "- exit code: 2" in out, out
    assert "error: ArtifactFormatError: " in out and "latin1.jinja" in out and "Traceback" not in out


def test_the_hook_manifest_is_valid() -> None:
    proc = subprocess.run(
        [str(PRE_COMMIT), "validate-manifest", str(ROOT / ".pre-commit-hooks.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
