"""Pinned real artifacts for ctxlock's tests: manifest, fetcher and accessors.

Nothing here is ever committed. Each artifact is a package on PyPI or on the npm registry, pinned by version and
by the sha256 of the file the registry serves. ``ensure_all()`` downloads what is missing with pip (``pip download
--no-deps``) or npm (``npm pack``), checks the sha256, and extracts the files the tests need into a cache
directory:

    <cache>/                                   $CTXLOCK_TEST_CACHE, default ~/.cache/ctxlock-test
      downloads/<archive>                      verified archives, kept so a damaged tree re-extracts offline
      llama-cpp-python-0.3.36/
        .ctxlock-complete.json                 marker, written last: archive sha256, sha256 + size of every file
        models/ggml-vocab-*.gguf               vocab-only GGUFs
        models/ggml-vocab-*.gguf.inp / .out    llama.cpp's tokenizer test vectors
        models/templates/*.jinja               real chat templates
      dashscope-2.0.2/
        .ctxlock-complete.json
        qwen.tiktoken                          Qwen BPE ranks, tiktoken format
      bpe-openai-0.1.4/
        .ctxlock-complete.json
        o200k_base.tiktoken                    OpenAI's o200k_base ranks (gpt-4o, gpt-oss), gunzipped
      hf-jinja-0.5.13/
        .ctxlock-complete.json
        package/                               @huggingface/jinja (transformers.js's Jinja engine), unpacked
      jest-sarif-1.0.0-beta.0/
        .ctxlock-complete.json
        sarif-2.1.0-rtm.5.json                 the SARIF 2.1.0 JSON schema, as @microsoft/jest-sarif ships it
      hf-from-gguf/transformers-<version>/<vocab>-<sha12 of gguf>/
        .ctxlock-complete.json                 tokenizer.json, tokenizer_config.json, chat_template.jinja (if any)
      hf-from-gguf/transformers-<version>/<vocab>-<sha12>.failed.json   a conversion transformers cannot do
      .locks/                                  flock files, one per artifact / conversion

A directory is built under a temporary name and renamed into place once complete, and an exclusive file
lock serializes concurrent fetches, so a killed or concurrent run never leaves a half tree that looks done.
Any failure (pip, checksum, extraction, conversion) raises ``ArtifactError`` with a message that says what
to do; nothing is skipped silently.

The tests import this module as ``artifacts`` (pytest puts ``tests/`` on ``sys.path``);
``scripts/fetch_artifacts.py`` is a thin CLI over it. It must not import ctxlock.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

__all__ = [
    "ARTIFACTS",
    "CACHE_ENV",
    "DASHSCOPE",
    "LLAMA_CPP_PYTHON",
    "MARKER",
    "VOCAB_TEST_SEPARATOR",
    "Artifact",
    "ArtifactError",
    "ChecksumError",
    "archive_path",
    "artifact_dir",
    "cache_dir",
    "check",
    "check_all",
    "ensure",
    "ensure_all",
    "gguf_names",
    "gguf_path",
    "hf_jinja_dir",
    "hf_tokenizer_dir",
    "llama_models_dir",
    "locked",
    "parse_vocab_vectors",
    "qwen_tiktoken_path",
    "remove_stale",
    "replace_dir",
    "sarif_schema_path",
    "sha256_file",
    "template_paths",
    "templates_dir",
    "vector_vocabs",
    "vocab_vectors",
]

CACHE_ENV = "CTXLOCK_TEST_CACHE"
DEFAULT_CACHE = "~/.cache/ctxlock-test"
MARKER = ".ctxlock-complete.json"
MARKER_VERSION = 1

# llama.cpp's tokenizer tests separate the cases of a .inp file with this line.
VOCAB_TEST_SEPARATOR = "\n__ggml_vocab_test__\n"


class ArtifactError(RuntimeError):
    """An artifact could not be fetched, verified, extracted or converted. The message says why."""


class ChecksumError(ArtifactError):
    """Bytes on disk or from the registry do not match the pinned sha256."""


@dataclasses.dataclass(frozen=True)
class Artifact:
    """One pinned registry file and the part of it the tests use."""

    name: str  # directory under the cache, "<project>-<version>"
    requirement: str  # what pip downloads, "project==version" (npm: what `npm pack` fetches, "package@version")
    filename: str  # the exact file pip (npm) saves
    sha256: str  # of that file, as served by the registry
    pip_args: tuple[str, ...]  # extra `pip download` flags
    members: str  # archive path (after the archive's top directory, for an sdist) to extract
    dest: str  # where `members` goes inside <cache>/<name>/
    tree_sha256: str  # digest of the extracted tree (see `_tree_digest`), computed once from the pinned archive
    required: tuple[str, ...]  # paths (relative to <cache>/<name>/) that must be there
    registry: str = "pypi"  # "pypi" (pip download) or "npm" (npm pack; the tarball's top directory is `package/`)


LLAMA_CPP_PYTHON = Artifact(
    name="llama-cpp-python-0.3.36",
    requirement="llama-cpp-python==0.3.36",
    filename="llama_cpp_python-0.3.36.tar.gz",
    sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    # Source distribution only. pip still prepares its metadata (an isolated build env with scikit-build-core,
    # a few seconds); --no-build-isolation fails because the backend is not installed here.
    pip_args=("--no-binary", ":all:"),
    members="vendor/llama.cpp/models/",
    dest="models/",
    # 121 files: 19 ggml-vocab-*.gguf, 15 .inp/.out pairs, 70 templates/*.jinja, templates/README.md, .editorconfig
    tree_sha256="d5bc62a7e8a895a636340bca85c7e2e99cbb63509f193d8bb6a46d258add8269",
    required=(
        "models/ggml-vocab-qwen2.gguf",
        "models/ggml-vocab-qwen2.gguf.inp",
        "models/ggml-vocab-qwen2.gguf.out",
        "models/ggml-vocab-llama-spm.gguf",
        "models/ggml-vocab-gemma-4.gguf",
        "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja",
        "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
    ),
)

DASHSCOPE = Artifact(
    name="dashscope-2.0.2",
    requirement="dashscope==2.0.2",
    filename="dashscope-2.0.2-py3-none-any.whl",
    sha256="0602d1800f7433bdb7953560986eaf5146454ed3988636c0a91963ba24e74258",
    pip_args=("--only-binary", ":all:"),
    members="dashscope/resources/qwen.tiktoken",
    dest="qwen.tiktoken",
    # one file: qwen.tiktoken, 2561218 bytes, sha256 b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186
    tree_sha256="8d1459e3c9119f0a2ea2120083163b7832eb1b5a8975ef971786ccf7d089b402",
    required=("qwen.tiktoken",),
)

BPE_OPENAI = Artifact(
    name="bpe-openai-0.1.4",
    requirement="bpe-openai==0.1.4",
    filename="bpe_openai-0.1.4-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    sha256="91dde48b7c27a155ec94563ef488d95267bd17e2e8db360aba299ca9819335ba",
    pip_args=("--only-binary", ":all:", "--platform", "manylinux2014_x86_64", "--python-version", "3.11"),
    members="bpe_openai/data/o200k_base.tiktoken.gz",
    dest="o200k_base.tiktoken",  # gunzipped: the file tiktoken and openai-harmony read
    # one file: o200k_base.tiktoken, 3613922 bytes,
    # sha256 446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d (the hash tiktoken's o200k_base
    # constructor expects, tiktoken_ext/openai_public.py)
    tree_sha256="6d9f50a2754a947dd2b67c7b902733f5de845df130b787e2a8aded4c6317d5fe",
    required=("o200k_base.tiktoken",),
)

# transformers.js's Jinja engine, for ctxlock lint's portability rule (tests/lint/test_engines.py). The sha256 is of
# the tarball the registry serves, whose sha512 is the registry's own integrity field
# (sha512-jM17MqFily1iyT/1LD3r5w8/CZiyapVB0+7vOw48PfVtzyKsXStmHE4jVTyDAD05Tqv3un1xrS9ILUU1ugQAYQ==).
HF_JINJA = Artifact(
    name="hf-jinja-0.5.13",
    requirement="@huggingface/jinja@0.5.13",
    filename="huggingface-jinja-0.5.13.tgz",
    sha256="f191fb8332ae4d5cdf73682ced93ccc58c25021cf338ae0795f7652985c2c0e1",
    pip_args=(),
    members="",
    dest="package/",
    # 27 files: package.json, README.md, LICENSE, tsconfig.json, dist/ (index.js, index.cjs, *.d.ts), src/*.ts
    tree_sha256="0005ad48676f6d126d188568d7238a60d3db46d4a89da4afccd982b0f9d8faf8",
    required=("package/package.json", "package/dist/index.js"),
    registry="npm",
)

# The SARIF 2.1.0 schema (OASIS sarif-schema-2.1.0, "rtm.5"), which ctxlock lint's SARIF output is validated
# against. Registry integrity:
# sha512-A1fOhPd6Ic5iDk4F9YPw1qNB4XF+7+IviR7xl8r2F6QzQkx5cpY9LsGk2rExiFIEcBbjpVnSmwWGBukASkiQ9A==.
SARIF_SCHEMA = Artifact(
    name="jest-sarif-1.0.0-beta.0",
    requirement="@microsoft/jest-sarif@1.0.0-beta.0",
    filename="microsoft-jest-sarif-1.0.0-beta.0.tgz",
    sha256="748e2c3d1a842e7bb258416685c7ea3a0da40005b72267b2052c2856d48ad102",
    pip_args=(),
    members="lib/schemas/sarif-2.1.0-rtm.5.json",
    dest="sarif-2.1.0-rtm.5.json",
    # one file: sarif-2.1.0-rtm.5.json
    tree_sha256="85d8e95229d348cf8f6e2504e616a499d9a0d0fa27f7cb82c1e851f23392ea56",
    required=("sarif-2.1.0-rtm.5.json",),
    registry="npm",
)

ARTIFACTS: tuple[Artifact, ...] = (LLAMA_CPP_PYTHON, DASHSCOPE, BPE_OPENAI, HF_JINJA, SARIF_SCHEMA)


# --------------------------------------------------------------------------------------------- paths


def cache_dir() -> Path:
    """The cache root: $CTXLOCK_TEST_CACHE, else ~/.cache/ctxlock-test. Read at every call."""
    raw = os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(raw).expanduser().absolute()


def artifact_dir(artifact: Artifact) -> Path:
    return cache_dir() / artifact.name


def llama_models_dir() -> Path:
    """``<cache>/llama-cpp-python-0.3.36/models`` (fetched on first use)."""
    return ensure(LLAMA_CPP_PYTHON) / "models"


def templates_dir() -> Path:
    return llama_models_dir() / "templates"


def template_paths() -> list[Path]:
    """Every ``templates/*.jinja`` of llama.cpp, sorted by name."""
    return sorted(templates_dir().glob("*.jinja"))


def gguf_path(name: str) -> Path:
    """``gguf_path("qwen2")`` -> ``.../models/ggml-vocab-qwen2.gguf``; raises ``FileNotFoundError`` if absent."""
    path = llama_models_dir() / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"no vocab {name!r}: {path} does not exist (known: {', '.join(gguf_names())})")
    return path


def gguf_names() -> list[str]:
    """All vocab names, e.g. ``["aquila", "baichuan", ..., "starcoder"]``."""
    return sorted(p.name[len("ggml-vocab-") : -len(".gguf")] for p in llama_models_dir().glob("ggml-vocab-*.gguf"))


def vector_vocabs() -> list[str]:
    """The vocab names that ship test vectors (both ``.gguf.inp`` and ``.gguf.out``)."""
    models = llama_models_dir()
    return [n for n in gguf_names() if (models / f"ggml-vocab-{n}.gguf.inp").is_file()]


def vocab_vectors(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's test vectors for one vocab: ``[(text, ids), ...]`` in file order."""
    base = gguf_path(name)
    inp = base.with_name(base.name + ".inp")
    out = base.with_name(base.name + ".out")
    try:
        return parse_vocab_vectors(inp.read_bytes(), out.read_bytes())
    except ValueError as exc:
        raise ValueError(f"{inp.name} / {out.name}: {exc}") from None


def parse_vocab_vectors(inp: bytes, out: bytes) -> list[tuple[str, list[int]]]:
    """Parse one ``.inp`` / ``.out`` pair (raw bytes: no newline translation, CR is content).

    llama.cpp's generator (convert_hf_to_gguf_update.py) writes every case followed by the separator, so
    the file ends with one; a few files (gemma-4) were written without the final one. Exactly one trailing
    separator is therefore dropped, if present, before splitting; an empty case stays an empty case. The
    ``.out`` file has one line per case, each id preceded by a space; an empty line is an empty case.
    """
    text = inp.decode("utf-8")
    text = text.removesuffix(VOCAB_TEST_SEPARATOR)
    cases = text.split(VOCAB_TEST_SEPARATOR)
    out_text = out.decode("utf-8")
    if not out_text.endswith("\n"):
        raise ValueError(".out does not end with a newline")
    lines = out_text[:-1].split("\n")
    if len(cases) != len(lines):
        raise ValueError(f"{len(cases)} input cases but {len(lines)} output lines")
    return [(case, [int(tok) for tok in line.split(" ") if tok]) for case, line in zip(cases, lines, strict=True)]


def o200k_base_path() -> Path:
    """``<cache>/bpe-openai-0.1.4/o200k_base.tiktoken``: OpenAI's o200k_base ranks (gpt-4o, gpt-oss)."""
    return ensure(BPE_OPENAI) / "o200k_base.tiktoken"


def hf_jinja_dir() -> Path:
    """``<cache>/hf-jinja-0.5.13/package``: the unpacked @huggingface/jinja package (package.json, dist/), what
    ``$CTXLOCK_HF_JINJA`` names for ctxlock lint."""
    return ensure(HF_JINJA) / "package"


def sarif_schema_path() -> Path:
    """``<cache>/jest-sarif-1.0.0-beta.0/sarif-2.1.0-rtm.5.json``: the SARIF 2.1.0 JSON schema."""
    return ensure(SARIF_SCHEMA) / "sarif-2.1.0-rtm.5.json"


def qwen_tiktoken_path() -> Path:
    """``<cache>/dashscope-2.0.2/qwen.tiktoken``."""
    return ensure(DASHSCOPE) / "qwen.tiktoken"


# ---------------------------------------------------------------------------------------- hashing


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tree_files(root: Path) -> dict[str, dict[str, object]]:
    """``{relative posix path: {"sha256", "size"}}`` for every regular file under root, except the marker."""
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != MARKER:
            rel = path.relative_to(root).as_posix()
            files[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return files


def _tree_digest(files: dict[str, dict[str, object]]) -> str:
    """sha256 over the sorted lines "<sha256>  <path>\\n" (the format of sha256sum)."""
    lines = "".join(f"{files[p]['sha256']}  {p}\n" for p in sorted(files))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------ verification


def _read_marker(directory: Path) -> dict | None:
    try:
        return json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _problems(artifact: Artifact, *, verify: bool) -> list[str]:
    """What is wrong with the cached tree of `artifact` (empty list: complete and, if verify, intact).

    Fast mode checks the marker against the pins and every listed file's presence and size; verify mode also
    re-hashes every file.
    """
    directory = artifact_dir(artifact)
    if not directory.is_dir():
        return [f"{directory} is missing"]
    marker = _read_marker(directory)
    if marker is None:
        return [f"{directory / MARKER} is missing or unreadable (incomplete fetch)"]
    problems = []
    if marker.get("marker_version") != MARKER_VERSION or marker.get("requirement") != artifact.requirement:
        problems.append(f"{directory / MARKER} describes {marker.get('requirement')!r}, not {artifact.requirement}")
    if marker.get("archive_sha256") != artifact.sha256:
        problems.append(f"{directory} was extracted from an archive with sha256 {marker.get('archive_sha256')}")
    files: dict = marker.get("files") or {}
    if _tree_digest(files) != artifact.tree_sha256:
        problems.append(f"{directory / MARKER} lists a file tree whose digest does not match the pinned one")
    for rel in artifact.required:
        if rel not in files:
            problems.append(f"{directory / rel} is not in the extracted tree")
    for rel, info in sorted(files.items()):
        path = directory / rel
        try:
            size = path.stat().st_size
        except OSError:
            problems.append(f"{path} is missing")
            continue
        if size != info["size"]:
            problems.append(f"{path} has {size} bytes, expected {info['size']}")
        elif verify and (actual := sha256_file(path)) != info["sha256"]:
            problems.append(f"{path} is corrupt: sha256 {actual}, expected {info['sha256']}")
    return problems


def check(artifact: Artifact) -> Path:
    """Verify a cached artifact without any network access; raise ``ChecksumError`` listing every problem."""
    problems = _problems(artifact, verify=True)
    if problems:
        raise ChecksumError(
            f"{artifact.requirement}: cached artifact is missing or damaged:\n  "
            + "\n  ".join(problems)
            + "\nRun `python scripts/fetch_artifacts.py` to fetch it again."
        )
    return artifact_dir(artifact)


def check_all() -> dict[str, Path]:
    """``check`` every artifact; raise one ``ChecksumError`` naming all problems."""
    errors, paths = [], {}
    for artifact in ARTIFACTS:
        try:
            paths[artifact.name] = check(artifact)
        except ChecksumError as exc:
            errors.append(str(exc))
    if errors:
        raise ChecksumError("\n".join(errors))
    return paths


# ----------------------------------------------------------------------------------------- fetching


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """An exclusive lock on <cache>/.locks/<name>, so concurrent test runs fetch (or build) each artifact once."""
    locks = cache_dir() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _log(message: str) -> None:
    print(f"[ctxlock-test artifacts] {message}", file=sys.stderr, flush=True)


def _pip_download(artifact: Artifact, dest: Path) -> Path:
    """``pip download --no-deps`` the pinned requirement into dest (empty); return the saved file."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
        *artifact.pip_args,
        "--dest",
        str(dest),
        artifact.requirement,
    ]
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ArtifactError(f"could not run pip to download {artifact.requirement}: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise ArtifactError(
            f"`{' '.join(cmd[2:])}` failed with exit code {proc.returncode}; the artifact {artifact.requirement} "
            f"could not be fetched from the package registry. Last lines of pip's output:\n{tail}"
        )
    saved = dest / artifact.filename
    if not saved.is_file():
        found = sorted(p.name for p in dest.iterdir())
        raise ArtifactError(f"pip downloaded {found} for {artifact.requirement}, expected {artifact.filename}")
    return saved


def _npm_pack(artifact: Artifact, dest: Path) -> Path:
    """``npm pack`` the pinned package into dest (empty); return the saved tarball. Nothing is installed and no
    package script runs."""
    npm = shutil.which("npm")
    if npm is None:
        raise ArtifactError(f"npm is not on PATH; it is needed to fetch {artifact.requirement} from the npm registry")
    cmd = [npm, "pack", artifact.requirement, "--pack-destination", str(dest), "--ignore-scripts", "--json"]
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false", "npm_config_audit": "false"}
    try:
        proc = subprocess.run(
            cmd, cwd=dest, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ArtifactError(f"could not run npm to fetch {artifact.requirement}: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise ArtifactError(
            f"`npm pack {artifact.requirement}` failed with exit code {proc.returncode}; the artifact could not be "
            f"fetched from the npm registry. Last lines of npm's output:\n{tail}"
        )
    saved = dest / artifact.filename
    if not saved.is_file():
        found = sorted(p.name for p in dest.iterdir())
        raise ArtifactError(f"npm saved {found} for {artifact.requirement}, expected {artifact.filename}")
    return saved


def _verify_archive(artifact: Artifact, path: Path, origin: str) -> None:
    actual = sha256_file(path)
    if actual != artifact.sha256:
        raise ChecksumError(
            f"checksum mismatch for {artifact.filename} ({origin}): sha256 {actual}, pinned {artifact.sha256}. "
            f"Refusing to use it: the file is damaged, or the registry serves different bytes for "
            f"{artifact.requirement} than when it was pinned in tests/fetched.py."
        )


def _archive(artifact: Artifact) -> Path:
    """The verified archive in <cache>/downloads, downloading it if needed (call with the artifact's lock)."""
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    cached = downloads / artifact.filename
    if cached.is_file():
        try:
            _verify_archive(artifact, cached, f"cached at {cached}")
            return cached
        except ChecksumError as exc:
            _log(f"{exc}\nDeleting it and downloading again.")
            cached.unlink()
    remove_stale(downloads, f".download-{artifact.name}-*")
    tool = "npm" if artifact.registry == "npm" else "pip"
    _log(f"downloading {artifact.requirement} with {tool} ...")
    with tempfile.TemporaryDirectory(prefix=f".download-{artifact.name}-", dir=downloads) as tmp:
        saved = _npm_pack(artifact, Path(tmp)) if tool == "npm" else _pip_download(artifact, Path(tmp))
        _verify_archive(artifact, saved, f"as downloaded by {tool} for {artifact.requirement}")
        os.replace(saved, cached)
    return cached


def archive_path(artifact: Artifact) -> Path:
    """The verified archive of ``artifact`` in ``<cache>/downloads``, downloaded again with pip when it is missing
    or damaged: for helpers that build from the archive itself (tests/llama_server.py builds llama-server)."""
    with locked(artifact.name):
        return _archive(artifact)


def _extract_sdist(artifact: Artifact, archive: Path, target: Path) -> None:
    """Extract ``<top>/<members>**`` of the sdist (or npm tarball, whose top is ``package/``) to
    ``target/<dest>``, stripping ``<top>/<members>``."""
    selected = []
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts
            rel = "/".join(parts[1:])
            if not (rel + "/").startswith(artifact.members) or len(rel) + 1 <= len(artifact.members):
                continue
            if not (member.isfile() or member.isdir()):
                raise ArtifactError(f"{archive.name}: unexpected non-regular member {member.name!r}")
            member = copy.copy(member)
            member.name = artifact.dest + rel[len(artifact.members) :]
            selected.append(member)
        if not any(m.isfile() for m in selected):
            raise ArtifactError(f"{archive.name} has no files under */{artifact.members}")
        # "data" rejects absolute paths, "..", links outside the target, device files and odd permissions.
        tar.extractall(target, members=selected, filter="data")


_MAX_GUNZIPPED = 64 << 20


def _extract_wheel_member(artifact: Artifact, archive: Path, target: Path) -> None:
    try:
        with zipfile.ZipFile(archive) as whl:
            data = whl.read(artifact.members)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ArtifactError(f"{archive.name}: cannot read {artifact.members}: {exc}") from exc
    if artifact.members.endswith(".gz") and not artifact.dest.endswith(".gz"):
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
                data = gz.read(_MAX_GUNZIPPED + 1)
        except (OSError, EOFError) as exc:
            raise ArtifactError(f"{archive.name}: {artifact.members} is not a valid gzip file: {exc}") from exc
        if len(data) > _MAX_GUNZIPPED:
            raise ArtifactError(f"{archive.name}: {artifact.members} unpacks to more than {_MAX_GUNZIPPED} bytes")
    dest = target / artifact.dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)


def remove_stale(parent: Path, pattern: str) -> None:
    """Remove leftovers of a killed run (tmp trees, trash). Call only while holding the matching lock."""
    for path in parent.glob(pattern):
        shutil.rmtree(path, ignore_errors=True)


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a complete tmp tree to final, discarding whatever stale tree was there."""
    tmp.chmod(0o755)  # mkdtemp makes it 0700
    if final.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".trash-{final.name}-", dir=final.parent))
        os.replace(final, trash / final.name)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, final)


def _build(artifact: Artifact) -> None:
    cache = cache_dir()
    remove_stale(cache, f".tmp-{artifact.name}-*")
    remove_stale(cache, f".trash-{artifact.name}-*")
    archive = _archive(artifact)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{artifact.name}-", dir=cache))
    try:
        _log(f"extracting {artifact.members or 'the package'} from {archive.name} ...")
        if artifact.filename.endswith(".whl"):
            _extract_wheel_member(artifact, archive, tmp)
        else:
            _extract_sdist(artifact, archive, tmp)
        files = _tree_files(tmp)
        digest = _tree_digest(files)
        if digest != artifact.tree_sha256:
            raise ChecksumError(
                f"{artifact.requirement}: the extracted tree has digest {digest}, pinned {artifact.tree_sha256} "
                f"(the archive checksum matched, so the extraction rules in tests/fetched.py changed)"
            )
        marker = {
            "marker_version": MARKER_VERSION,
            "requirement": artifact.requirement,
            "archive": artifact.filename,
            "archive_sha256": artifact.sha256,
            "tree_sha256": digest,
            "files": files,
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        replace_dir(tmp, cache / artifact.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_ENSURED: set[tuple[str, str]] = set()  # (cache dir, artifact name) already checked in this process


def ensure(artifact: Artifact, *, verify: bool = False) -> Path:
    """Return ``<cache>/<artifact.name>``, fetching and extracting it first if it is missing or damaged.

    Fast when complete: the marker is compared with the pins and every file's presence and size is checked
    (once per process and cache dir). ``verify=True`` re-hashes every file as well. A damaged tree is rebuilt
    from the verified archive in ``<cache>/downloads`` (downloaded again if that is damaged too).
    """
    key = (str(cache_dir()), artifact.name)
    if not verify and key in _ENSURED:
        return artifact_dir(artifact)
    if _problems(artifact, verify=verify):
        with locked(artifact.name):
            problems = _problems(artifact, verify=verify)
            if problems:
                if artifact_dir(artifact).exists():
                    _log(f"{artifact.requirement}: rebuilding the cached tree:\n  " + "\n  ".join(problems))
                _build(artifact)
                if problems := _problems(artifact, verify=True):
                    raise ChecksumError(f"{artifact.requirement}: fresh tree fails verification: {problems}")
    _ENSURED.add(key)
    return artifact_dir(artifact)


def ensure_all(*, verify: bool = False) -> dict[str, Path]:
    """Fetch every artifact of the manifest (if needed); return ``{artifact name: directory}``."""
    return {artifact.name: ensure(artifact, verify=verify) for artifact in ARTIFACTS}


# ------------------------------------------------------------------------- converted HF tokenizers

# A converter failure (unsupported architecture, a config field of the wrong type, ...) repeats on every run for
# the same transformers version and GGUF, so it is remembered next to the conversions (gemma-4 takes 30 s to
# fail). These are not: they depend on the machine, not on the inputs.
_TRANSIENT_FAILURES = (OSError, MemoryError)


def _transformers_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError as exc:
        raise ArtifactError("transformers is not installed; run `pip install -e '.[test]'`") from exc


_GGUF_SHA: dict[Path, str] = {}
# Bump when what a converted directory holds changes, so old conversions are not reused.
# e2: tokenizer.json is the effective backend pipeline transformers runs when it loads the saved directory.
_LAYOUT = "e2"


def hf_tokenizer_dir(vocab: str) -> Path:
    """A transformers tokenizer converted from ``ggml-vocab-<vocab>.gguf`` and saved with ``save_pretrained``.

    Converted once per machine into ``<cache>/hf-from-gguf/transformers-<version>/<vocab>-<sha12>/`` (about
    15 s each) and reused afterwards. The directory holds tokenizer.json, tokenizer_config.json and, when the
    GGUF embeds one, chat_template.jinja. Raises ``ArtifactError`` when transformers cannot convert the vocab.
    """
    gguf = gguf_path(vocab)
    if gguf not in _GGUF_SHA:
        _GGUF_SHA[gguf] = sha256_file(gguf)
    gguf_sha = _GGUF_SHA[gguf]
    version = _transformers_version()
    root = cache_dir() / "hf-from-gguf" / f"transformers-{version}"
    final = root / f"{vocab}-{gguf_sha[:12]}-{_LAYOUT}"
    failed = root / f"{vocab}-{gguf_sha[:12]}.failed.json"

    def done() -> Path | None:
        marker = _read_marker(final)
        files = (marker or {}).get("files") or []
        if marker and marker.get("gguf_sha256") == gguf_sha and files and all((final / f).is_file() for f in files):
            return final
        if failed.is_file():
            reason = json.loads(failed.read_text(encoding="utf-8"))["error"]
            raise ArtifactError(f"transformers {version} cannot convert {gguf.name} (cached result): {reason}")
        return None

    if (path := done()) is not None:
        return path
    root.mkdir(parents=True, exist_ok=True)
    with locked(f"hf-{vocab}"):
        if (path := done()) is not None:
            return path
        remove_stale(root, f".tmp-{vocab}-*")
        remove_stale(root, f".trash-{vocab}-*")
        _log(f"converting {gguf.name} with transformers {version} (once per machine) ...")
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        except _TRANSIENT_FAILURES as exc:
            raise ArtifactError(f"converting {gguf.name} with transformers {version} failed: {exc}") from exc
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            failed.write_text(json.dumps({"gguf_sha256": gguf_sha, "error": reason}) + "\n", encoding="utf-8")
            raise ArtifactError(f"transformers {version} cannot convert {gguf.name}: {reason}") from exc
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{vocab}-", dir=root))
        try:
            tokenizer.save_pretrained(str(tmp))
            # transformers 5 tokenizer classes rebuild parts of the pipeline in code (Qwen2Tokenizer adds an NFC
            # normalizer that the converted tokenizer.json lacks). The reference is what transformers runs, so the
            # file ctxlock reads is the backend transformers actually uses.
            # It is read back from the saved directory, since loading a directory is where the class rebuilds it.
            effective = AutoTokenizer.from_pretrained(str(tmp)).backend_tokenizer.to_str()
            (tmp / "tokenizer.json").write_text(effective, encoding="utf-8")
            again = AutoTokenizer.from_pretrained(str(tmp)).backend_tokenizer.to_str()
            if json.loads(again) != json.loads(effective):
                raise ArtifactError(f"transformers {version} does not load {gguf.name}'s tokenizer.json stably")
            files = sorted(p.name for p in tmp.iterdir())
            marker = {"gguf": gguf.name, "gguf_sha256": gguf_sha, "transformers": version, "files": files}
            (tmp / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
            replace_dir(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
