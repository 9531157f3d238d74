"""A real llama.cpp ``llama-server`` on loopback, for the tests that compare a live server with ctxlock.

- ``llama_server_binary()``: ``llama-server`` built from the llama.cpp sources vendored in the pinned
  llama-cpp-python sdist (``fetched.LLAMA_CPP_PYTHON``, the archive the templates and vocabularies come from),
  once per cache::

      <cache>/llama-server-0.3.36-<key>/      key: 12 hex of sha256 over the archive's sha256, the CMake flags
                                              and the target
        bin/llama-server
        build.log                             CMake's configure and build output
        .ctxlock-complete.json                marker, written last: archive sha256, flags, the binary's sha256
                                              and size, build seconds, `llama-server --version`
      llama-server-0.3.36-<key>.build.log     the last build's log, kept when a build fails

  The build runs under an exclusive lock, in a temporary directory renamed into place when complete; a missing,
  partial or damaged cache is built again, and a failed build raises ``fetched.ArtifactError`` with the log's
  tail. It needs cmake, Ninja and a C++17 compiler; about 7 minutes of CPU time (docs/testing.md).
- ``tiny_gguf(vocab, path, chat_template=...)``: a model GGUF of a few MB around a real vocabulary (every
  ``tokenizer.*`` key of ``fetched.gguf_path(vocab)``), one ``llama`` layer of deterministic random weights:
  what llama.cpp needs to load and serve a model whose tokenizer and template are real.
- ``LlamaServer(gguf)``: the server on a free 127.0.0.1 port, as a context manager that gives the base URL.

It may import ``fetched`` but not ctxlock.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any

import fetched

__all__ = [
    "BUILD_TARGET",
    "CMAKE_FLAGS",
    "SERVER_ARGS",
    "VOCAB_TEMPLATE",
    "LlamaServer",
    "LlamaServerError",
    "build_dir",
    "llama_server_binary",
    "post_json",
    "running",
    "tiny_gguf",
]

SOURCE = fetched.LLAMA_CPP_PYTHON
VENDORED = "vendor/llama.cpp/"  # inside the sdist's top directory
# Not part of the build (CMake never reads them): the vocab GGUFs and templates (in the cache already), the docs.
SKIPPED = ("models/", "docs/", "media/")
BUILD_TARGET = "llama-server"
BUILD_JOBS = 2
# Configure flags (`cmake -S src -B build ...`). Building the one target compiles only what llama-server links
# (ggml, llama, llama-common, mtmd, cpp-httplib, the server): 206 steps.
CMAKE_FLAGS: tuple[str, ...] = (
    "-G",
    "Ninja",
    "-DCMAKE_BUILD_TYPE=Release",
    # -O1 instead of Release's -O3: the build is mostly C++ template code (nlohmann::json), and the tests run
    # the tokenizer and the template engine on a tiny model, where speed does not matter.
    "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG",
    "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    # No web UI, and no download of a prebuilt one at build time (tools/ui/CMakeLists.txt, scripts/ui-assets.cmake).
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    # Plain x86-64 (no AVX/AVX2/FMA/F16C/BMI2/SSE4.2): GGML_NATIVE=OFF alone still turns those on
    # (ggml/CMakeLists.txt), so a cache copied to an older CPU would crash; ignored on other architectures.
    "-DGGML_NATIVE=OFF",
    "-DGGML_SSE42=OFF",
    "-DGGML_AVX=OFF",
    "-DGGML_AVX2=OFF",
    "-DGGML_FMA=OFF",
    "-DGGML_F16C=OFF",
    "-DGGML_BMI2=OFF",
    "-DGGML_OPENMP=OFF",
    "-DGGML_LLAMAFILE=OFF",
)
# Environment variables that change what CMake builds without changing the flags above (CMake reads them at the
# first configure), so they are not passed on.
_BUILD_ENV_DROPPED = ("CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CMAKE_GENERATOR", "CMAKE_BUILD_TYPE")
MARKER = fetched.MARKER
MARKER_VERSION = 1
_BUILD_TIMEOUT = 3 * 3600
_LOG_TAIL = 40


class LlamaServerError(RuntimeError):
    """llama-server did not start, or answered with an error. The message has the server's log tail."""


def _log(message: str) -> None:
    print(f"[ctxlock-test llama-server] {message}", file=sys.stderr, flush=True)


def _tail(path: Path, lines: int = _LOG_TAIL) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            data = handle.read()
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


# ------------------------------------------------------------------------------------------------ the binary


def _key() -> str:
    blob = json.dumps({"archive_sha256": SOURCE.sha256, "flags": CMAKE_FLAGS, "target": BUILD_TARGET})
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_dir() -> Path:
    """``<cache>/llama-server-<version>-<key>``, where the binary is cached (whether built yet or not)."""
    version = SOURCE.requirement.split("==")[1]
    return fetched.cache_dir() / f"llama-server-{version}-{_key()}"


def _problems(final: Path) -> list[str]:
    """What is wrong with a cached build (empty: it is complete and intact). Hashes the binary (15 MB)."""
    try:
        marker = json.loads((final / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [f"{final} is not built yet" if not final.exists() else f"{final / MARKER} is missing"]
    except (OSError, ValueError) as exc:
        return [f"{final / MARKER} is unreadable: {exc}"]
    expected = {
        "marker_version": MARKER_VERSION,
        "archive_sha256": SOURCE.sha256,
        "cmake_flags": list(CMAKE_FLAGS),
        "target": BUILD_TARGET,
    }
    problems = [f"marker {k} is {marker.get(k)!r}, expected {v!r}" for k, v in expected.items() if marker.get(k) != v]
    binary = final / "bin" / BUILD_TARGET
    if not binary.is_file():
        return [*problems, f"{binary} is missing"]
    if binary.stat().st_size != marker.get("binary_size"):
        problems.append(f"{binary} has {binary.stat().st_size} bytes, expected {marker.get('binary_size')}")
    elif (actual := fetched.sha256_file(binary)) != marker.get("binary_sha256"):
        problems.append(f"{binary} is corrupt: sha256 {actual}, expected {marker.get('binary_sha256')}")
    elif not os.access(binary, os.X_OK):
        problems.append(f"{binary} is not executable")
    return problems


_CHECKED: set[Path] = set()  # cache dirs verified in this process


def llama_server_binary() -> Path:
    """The cached ``llama-server``, built first if the cache has none (or a damaged one); see the module doc."""
    final = build_dir()
    if final in _CHECKED:
        return final / "bin" / BUILD_TARGET
    if _problems(final):
        final.parent.mkdir(parents=True, exist_ok=True)
        with fetched.locked(final.name):
            problems = _problems(final)
            if problems:
                if final.exists():
                    _log(f"rebuilding {final.name}:\n  " + "\n  ".join(problems))
                _build(final)
                if problems := _problems(final):
                    raise fetched.ArtifactError(f"the fresh llama-server build fails verification: {problems}")
    _CHECKED.add(final)
    return final / "bin" / BUILD_TARGET


def _extract_llama_cpp(archive: Path, target: Path) -> None:
    """Extract ``<top>/vendor/llama.cpp/**`` (less SKIPPED) to ``target``; regular files and directories only."""
    selected = []
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            rel = "/".join(PurePosixPath(member.name).parts[1:])
            if not rel.startswith(VENDORED):
                continue
            rel = rel[len(VENDORED) :]
            if not rel or any((rel + "/").startswith(s) for s in SKIPPED):
                continue
            if not (member.isfile() or member.isdir()):
                raise fetched.ArtifactError(f"{archive.name}: unexpected non-regular member {member.name!r}")
            member.name = rel
            selected.append(member)
        if not any(m.name == "CMakeLists.txt" for m in selected):
            raise fetched.ArtifactError(f"{archive.name} has no {VENDORED}CMakeLists.txt")
        # "data" refuses absolute paths, "..", links and device files, and drops odd permission bits.
        tar.extractall(target, members=selected, filter="data")


def _run(cmd: Sequence[str], log: Any, log_path: Path, env: Mapping[str, str]) -> None:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=_BUILD_TIMEOUT
        )
    except FileNotFoundError as exc:
        raise fetched.ArtifactError(
            f"cannot build llama-server: {cmd[0]} is not installed ({exc}); it needs cmake, ninja and a C++17 "
            f"compiler (Debian: apt-get install cmake ninja-build g++)"
        ) from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise fetched.ArtifactError(f"`{' '.join(cmd)}` failed: {exc}; the log is {log_path}") from exc
    if proc.returncode != 0:
        log.flush()
        raise fetched.ArtifactError(
            f"building llama-server failed: `{' '.join(cmd)}` exited with {proc.returncode}. "
            f"The log is {log_path}; its last lines:\n{_tail(log_path)}"
        )


def _build(final: Path) -> None:
    cache = final.parent
    fetched.remove_stale(cache, f".tmp-{final.name}-*")
    fetched.remove_stale(cache, f".trash-{final.name}-*")
    archive = fetched.archive_path(SOURCE)
    log_path = cache / f"{final.name}.build.log"
    env = {k: v for k, v in os.environ.items() if k not in _BUILD_ENV_DROPPED}
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=cache))
    try:
        src, build, out = tmp / "src", tmp / "build", tmp / "out"
        _log(f"extracting {VENDORED} from {archive.name} ...")
        _extract_llama_cpp(archive, src)
        _log(f"building {BUILD_TARGET} (7 min of CPU time, 4 on 2 free cores; once per cache); log: {log_path}")
        start = time.monotonic()
        with open(log_path, "w", encoding="utf-8") as log:
            _run(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS], log, log_path, env)
            _run(["cmake", "--build", str(build), "--target", BUILD_TARGET, "-j", str(BUILD_JOBS)], log, log_path, env)
        seconds = round(time.monotonic() - start, 1)
        binary = out / "bin" / BUILD_TARGET
        binary.parent.mkdir(parents=True)
        shutil.copy2(build / "bin" / BUILD_TARGET, binary)
        shutil.copy2(log_path, out / "build.log")
        marker = {
            "marker_version": MARKER_VERSION,
            "archive": SOURCE.filename,
            "archive_sha256": SOURCE.sha256,
            "cmake_flags": list(CMAKE_FLAGS),
            "target": BUILD_TARGET,
            "binary_sha256": fetched.sha256_file(binary),
            "binary_size": binary.stat().st_size,
            "build_seconds": seconds,
            "version": _version(binary),
        }
        (out / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
        fetched.replace_dir(out, final)
        _log(f"built {final / 'bin' / BUILD_TARGET} in {seconds} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _version(binary: Path) -> str:
    """``llama-server --version`` (also proves the fresh binary runs)."""
    try:
        proc = subprocess.run(
            [str(binary), "--version"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise fetched.ArtifactError(f"the freshly built {binary} does not run: {exc}") from exc
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or "version" not in text:
        raise fetched.ArtifactError(f"the freshly built {binary} --version exited with {proc.returncode}: {text}")
    return text


# ------------------------------------------------------------------------------------------------ a tiny model


class _VocabTemplate(enum.Enum):
    KEEP = "keep"


# `tiny_gguf(..., chat_template=VOCAB_TEMPLATE)` keeps the vocab GGUF's own tokenizer.chat_template (if it has one).
VOCAB_TEMPLATE = _VocabTemplate.KEEP

# The smallest model llama.cpp loads: one `llama` layer (src/models/llama.cpp: without output.weight the token
# embeddings are used). The vocabulary's embedding table is nearly all of the file: 64 x n_vocab f16 values.
_N_EMBD, _N_HEAD, _N_FF, _N_CTX, _SEED = 64, 4, 128, 512, 1234


# GGUF value types (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): numpy dtype of each scalar type.
_GGUF_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8"}
_GGUF_SCALARS[12] = "<f8"
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _tokenizer_keys(source: Path) -> list[tuple[str, int, Any, int | None]]:
    """``(key, type, value, array element type)`` of every ``tokenizer.*`` key of a GGUF file, strings as bytes (a
    token need not be UTF-8). gguf's GGUFReader takes 15 s on a 150k vocabulary (a numpy view per string); the
    format is simple enough to read here (the vocab GGUFs are pinned and checked by tests/fetched.py)."""
    import numpy as np

    data = source.read_bytes()
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise fetched.ArtifactError(f"{source}: truncated GGUF header at byte {pos}")
        pos += n
        return data[pos - n : pos]

    def u32() -> int:
        return int.from_bytes(take(4), "little")

    def u64() -> int:
        return int.from_bytes(take(8), "little")

    def scalar(vtype: int) -> Any:
        if vtype == _GGUF_STRING:
            return take(u64())
        if vtype not in _GGUF_SCALARS:
            raise fetched.ArtifactError(f"{source}: GGUF value type {vtype} at byte {pos} is not a scalar")
        dtype = np.dtype(_GGUF_SCALARS[vtype])
        value = np.frombuffer(take(dtype.itemsize), dtype)[0].item()
        return bool(value) if vtype == 7 else value

    if take(4) != b"GGUF" or u32() not in (2, 3):
        raise fetched.ArtifactError(f"{source} is not a GGUF v2/v3 file")
    u64()  # tensor count
    found: list[tuple[str, int, Any, int | None]] = []
    for _ in range(u64()):
        key = take(u64()).decode("utf-8")
        vtype = u32()
        if vtype != _GGUF_ARRAY:
            found.append((key, vtype, scalar(vtype), None))
            continue
        sub, count = u32(), u64()
        if sub == _GGUF_STRING:
            value: Any = [take(u64()) for _ in range(count)]
        elif sub in _GGUF_SCALARS:
            dtype = np.dtype(_GGUF_SCALARS[sub])
            value = np.frombuffer(take(dtype.itemsize * count), dtype).tolist()
        else:
            raise fetched.ArtifactError(f"{source}: {key} is an array of GGUF type {sub}, not copied")
        found.append((key, vtype, value, sub))
    return [k for k in found if k[0].startswith("tokenizer.")]


def tiny_gguf(vocab: str, path: Path, *, chat_template: str | _VocabTemplate | None) -> Path:
    """Write a model GGUF to ``path``: the real vocabulary of ``fetched.gguf_path(vocab)`` (every ``tokenizer.*``
    key) and one ``llama`` layer of random weights (numpy seed 1234: the same bytes every time), n_embd 64, 4 heads,
    feed-forward 128, context 512, f16 matrices. ``chat_template``: the template text to embed, ``None`` for no
    template, ``VOCAB_TEMPLATE`` for the vocab's own. About 20 MB for a 150k vocabulary. Returns ``path``."""
    import numpy as np
    from gguf import GGUFValueType, GGUFWriter, LlamaFileType

    source = fetched.gguf_path(vocab)
    keys = _tokenizer_keys(source)
    n_vocab = next((len(value) for key, _, value, _ in keys if key == "tokenizer.ggml.tokens"), 0)
    if not n_vocab:
        raise fetched.ArtifactError(f"{source} has no tokenizer.ggml.tokens")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    writer = GGUFWriter(str(tmp), "llama")
    writer.add_name(f"ctxlock-tiny-{vocab}")
    writer.add_context_length(_N_CTX)
    writer.add_embedding_length(_N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(_N_FF)
    writer.add_head_count(_N_HEAD)
    writer.add_head_count_kv(_N_HEAD)
    writer.add_rope_dimension_count(_N_EMBD // _N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    for key, vtype, value, sub in keys:
        if key != "tokenizer.chat_template" or chat_template is VOCAB_TEMPLATE:
            writer.add_key_value(key, value, GGUFValueType(vtype), None if sub is None else GGUFValueType(sub))
    if isinstance(chat_template, str):
        writer.add_chat_template(chat_template)

    rng = np.random.default_rng(_SEED)

    def weights(*shape: int) -> Any:  # numpy shape (rows, cols) is ggml's {cols, rows}
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(_N_EMBD, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weights(n_vocab, _N_EMBD))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("blk.0.attn_norm.weight", ones)
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        writer.add_tensor(f"blk.0.{name}.weight", weights(_N_EMBD, _N_EMBD))
    writer.add_tensor("blk.0.ffn_norm.weight", ones)
    writer.add_tensor("blk.0.ffn_gate.weight", weights(_N_FF, _N_EMBD))
    writer.add_tensor("blk.0.ffn_up.weight", weights(_N_FF, _N_EMBD))
    writer.add_tensor("blk.0.ffn_down.weight", weights(_N_EMBD, _N_FF))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(tmp, path)
    return path


# ------------------------------------------------------------------------------------------------ the server

# Always passed (tools/server/README.md, `llama-server --help`): the Jinja engine, a context of 512, one thread,
# one slot, no warmup run, no prompt cache, no web UI, no network, no fitting to device memory.
SERVER_ARGS: tuple[str, ...] = (
    "--jinja",
    "-c",
    "512",
    "-t",
    "1",
    "-np",
    "1",
    "--no-warmup",
    "--cache-ram",
    "0",
    "--no-webui",
    "--offline",
    "--fit",
    "off",
    "--log-colors",
    "off",
)
# llama-server reads most options from LLAMA_ARG_* variables (common/arg.cpp) and switches to Vertex AI's routes
# and port under AIP_MODE (tools/server/server-http.cpp): none of that may come from the test's environment.
_ENV_PREFIXES = ("LLAMA_", "AIP_")
_LISTENING = re.compile(rb"listening on (http://127\.0\.0\.1:\d+)")
_MAX_ANSWER = 64 << 20


def post_json(url: str, route: str, body: Mapping[str, Any], *, timeout: float = 60) -> Any:
    """POST ``body`` as JSON to ``url + route``; the decoded answer. An HTTP error raises ``LlamaServerError``
    with the status and the server's error body."""
    request = urllib.request.Request(
        url + route, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            data = answer.read(_MAX_ANSWER + 1)
    except urllib.error.HTTPError as exc:
        detail = exc.read(64 * 1024).decode("utf-8", "replace")
        raise LlamaServerError(f"POST {route} answered {exc.code}: {detail}") from None
    if len(data) > _MAX_ANSWER:
        raise LlamaServerError(f"POST {route}: the answer is over {_MAX_ANSWER} bytes")
    return json.loads(data)


def _health(url: str) -> int | None:
    """GET /health's status code, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


class LlamaServer:
    """``llama-server -m <gguf>`` on a free 127.0.0.1 port (``--port 0``: the port it binds is read from its log, so
    no other process can take it in between), with ``SERVER_ARGS``, ``--chat-template-file`` if given, and
    ``args``. ``with LlamaServer(gguf) as url:`` waits until ``GET /health`` answers 200 (at most ``timeout``
    seconds), gives the base URL, and stops the server at exit (SIGTERM, then SIGKILL after 10 s). Its stdout and
    stderr go to ``log`` (a temporary file unless given); a server that exits or does not become healthy raises
    ``LlamaServerError`` with the log's tail."""

    def __init__(
        self,
        model: Path,
        *,
        chat_template_file: Path | None = None,
        args: Sequence[str] = (),
        binary: Path | None = None,
        log: Path | None = None,
        timeout: float = 120,
    ) -> None:
        self.model = model
        self.chat_template_file = chat_template_file
        self.args = tuple(args)
        self.binary = binary
        self.timeout = timeout
        self._own_log = log is None  # removed at stop, unless the server failed
        if log is None:
            handle, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(handle)
            log = Path(name)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.start_seconds = 0.0

    def command(self) -> list[str]:
        binary = self.binary or llama_server_binary()
        cmd = [str(binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", "0", *SERVER_ARGS]
        if self.chat_template_file is not None:
            cmd += ["--chat-template-file", str(self.chat_template_file)]
        return [*cmd, *self.args]

    def __enter__(self) -> str:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> str:
        cmd = self.command()
        env = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIXES)}
        began = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = began + self.timeout
        while not self.url:
            self._check_alive(cmd)
            with open(self.log, "rb") as handle:
                found = _LISTENING.search(handle.read(1 << 20))
            if found:
                self.url = found.group(1).decode()
            elif time.monotonic() > deadline:
                self._fail(cmd, f"did not report its port within {self.timeout} s")
            else:
                time.sleep(0.05)
        while (status := _health(self.url)) != 200:
            self._check_alive(cmd)
            if time.monotonic() > deadline:
                self._fail(cmd, f"GET /health answered {status}, not 200, within {self.timeout} s")
            time.sleep(0.05)
        self.start_seconds = time.monotonic() - began
        return self.url

    def _check_alive(self, cmd: Sequence[str]) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            self._fail(cmd, f"exited with status {self.proc.returncode}")

    def _fail(self, cmd: Sequence[str], what: str) -> None:
        self._own_log = False  # the message names it
        raise LlamaServerError(f"llama-server {what}.\nCommand: {' '.join(cmd)}\nLog {self.log}:\n{_tail(self.log)}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._own_log:
            with contextlib.suppress(OSError):
                self.log.unlink()

    def log_tail(self, lines: int = _LOG_TAIL) -> str:
        return _tail(self.log, lines)


@contextlib.contextmanager
def running(model: Path, **kwargs: Any) -> Iterator[LlamaServer]:
    """``LlamaServer(model, **kwargs)`` started, the object itself (``.url``, ``.log_tail()``, ``.start_seconds``)."""
    server = LlamaServer(model, **kwargs)
    with server:
        yield server
