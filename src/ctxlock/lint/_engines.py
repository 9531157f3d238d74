"""One chat template rendered by three Jinja engines, for the portability rule of `ctxlock lint`.

- `jinja2`: the reference, ctxlock's own sandbox (`ctxlock.template.sandbox.render_source`): transformers'
  environment, in this process, bounded by its `RenderLimits`.
- `minijinja`: the engine of text-generation-inference and mistral.rs, through its Python binding (the `lint`
  extra: `pip install 'ctxlock[lint]'`), configured as those servers configure it (`_minijinja_worker.py` says how
  and where each one does it), in a child Python process.
- `hf-jinja`: `@huggingface/jinja`, the engine of transformers.js, run by Node.js (`node` on PATH) through
  `hf_jinja_runner.mjs`, as transformers.js runs it (`new Template(source).render(variables)`). The package is the
  directory named by `$CTXLOCK_HF_JINJA` (an unpacked `@huggingface/jinja`: the `package/` directory of
  `npm pack @huggingface/jinja@0.5.13`), else `node_modules/@huggingface/jinja` in the working directory or one of
  its parents (`npm install @huggingface/jinja@0.5.13`).

Every engine renders the same JSON variables, and `strftime_now` reads the same fixed clock (`CLOCK`) in each, so
their texts can be compared byte for byte (`compare`). An engine that is not installed answers
`available=False` with what to install; a child process is bounded (a deadline per render, a cap on what it
writes, an address-space cap for minijinja, a heap cap for node, minijinja's fuel) and started without a shell
and with a minimal environment, so a hostile template can neither hang the caller nor flood it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import jinja2

from ctxlock.errors import InputError, OptionError
from ctxlock.template.sandbox import RenderLimits, render_source

Engine = Literal["jinja2", "minijinja", "hf-jinja"]
ENGINES: tuple[Engine, ...] = ("jinja2", "minijinja", "hf-jinja")

HF_JINJA_ENV = "CTXLOCK_HF_JINJA"
HF_JINJA_VERSION = "0.5.13"  # the @huggingface/jinja ctxlock is tested with
MINIJINJA_HINT = "pip install 'ctxlock[lint]'"
HF_JINJA_HINT = (
    f"run `npm install @huggingface/jinja@{HF_JINJA_VERSION}` in the working directory, or set ${HF_JINJA_ENV} to "
    "the directory of an unpacked @huggingface/jinja package (its package.json and dist/)"
)

# The wall time every engine's `strftime_now` reads: a fixed instant, so that renders compare across engines and
# runs. Naive: transformers formats a naive local time, and node runs with TZ=UTC.
CLOCK = datetime(2026, 1, 2, 3, 4, 5)
MAX_OUTPUT_CHARS = 1_000_000  # characters of one render's text: a chat template's probe renders are kilobytes
MAX_MESSAGE = 2000  # characters of an engine's error message kept

_WORKER = Path(__file__).with_name("_minijinja_worker.py")
_RUNNER = Path(__file__).with_name("hf_jinja_runner.mjs")
_START_SECONDS = 20.0  # for a child to start and load its engine, on a loaded machine
_MINIJINJA_BYTES = 256 << 20  # address space of the minijinja worker (it starts in 17 MB)
_NODE_HEAP_MB = 256  # V8's old-space cap for the node runner
_FUEL_PER_SECOND = 20_000_000  # minijinja instructions per second of the deadline (it runs about 50 million a second)


@dataclass(frozen=True)
class EngineResult:
    """One render by one engine: `text`, or `error` (the engine's message, at most `MAX_MESSAGE` characters) with
    the template `line` the engine names, when it names one. `limited`: ctxlock's bound (deadline, output size,
    memory, fuel) stopped the render, not the engine itself. `construct`: the template text of what failed, where
    the engine points at it (minijinja's error range; for hf-jinja, the innermost syntax node that threw, in its own
    formatter's spelling, whose line is then found in the source: `locate`). `available` is False, with
    `why_unavailable`, when the engine is not installed (then neither text nor error). `version`: the engine's.
    `printed` (jinja2 only): for each piece of the text, (offset in the text, template line that printed it)."""

    engine: Engine
    text: str | None = None
    error: str | None = None
    line: int | None = None
    available: bool = True
    why_unavailable: str | None = None
    version: str | None = None
    limited: bool = False
    construct: str | None = None
    printed: tuple[tuple[int, int], ...] = ()

    def line_at(self, offset: int) -> int | None:
        """The template line that printed the character at `offset` of the text (the last piece, at or past the
        end); None when the engine does not say (every engine but jinja2) or printed nothing."""
        found = None
        for start, line in self.printed:
            if start > offset:
                break
            found = line
        return found


def render_with(engine: Engine, source: str, context: Mapping[str, Any], *, timeout_s: float) -> EngineResult:
    """`render_many` for one set of variables."""
    return render_many(engine, source, [context], timeout_s=timeout_s)[0]


def render_many(
    engine: Engine, source: str, contexts: Sequence[Mapping[str, Any]], *, timeout_s: float
) -> list[EngineResult]:
    """Render the chat template `source` once for each of `contexts` (its variables as JSON values: messages,
    tools, add_generation_prompt, bos_token, ...) in `engine`, configured as its peers configure it; one result
    per context, in order. The template is compiled once and, for the engines in a child process, one process
    renders them all (a node start costs about 60 ms); each render has `timeout_s` seconds."""
    if engine not in ENGINES:
        raise OptionError(f"unknown engine {engine!r}", path="engine", hint=f"one of {', '.join(ENGINES)}")
    if not timeout_s > 0:
        raise OptionError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}", path="timeout_s")
    if not contexts:
        return []
    jobs = [_plain(c) for c in contexts]
    if engine == "jinja2":
        return _jinja2(source, jobs, timeout_s)
    if os.name != "posix":  # the child's bounds: a process group to kill, non-blocking pipes, an address-space cap
        why = f"{engine} runs in a bounded child process, which ctxlock starts on POSIX systems only"
        return [EngineResult(engine, available=False, why_unavailable=why) for _ in jobs]
    if engine == "minijinja":
        return _minijinja(source, jobs, timeout_s)
    return _hf_jinja(source, jobs, timeout_s)


def _plain(context: Mapping[str, Any]) -> dict[str, Any]:
    """The variables as JSON values (a copy through JSON: what every engine receives is the same data); anything
    JSON would change (a number key, a tuple, NaN, an object) is refused."""
    hint = "give the template variables as JSON values: strings, numbers, booleans, null, lists, string-keyed objects"
    try:
        data: dict[str, Any] = json.loads(json.dumps(dict(context), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InputError(f"the template variables are not JSON values: {exc}", path="variables", hint=hint) from None
    if data != context or _has_tuple(context):
        raise InputError("the template variables are not all JSON values", path="variables", hint=hint)
    return data


def _has_tuple(value: Any) -> bool:
    if isinstance(value, tuple):
        return True
    if isinstance(value, Mapping):
        return any(_has_tuple(v) for v in value.values())
    return isinstance(value, list) and any(_has_tuple(v) for v in value)


# ---------------------------------------------------------------------------------------------------------------
# Comparing an engine's render with the reference's

Verdict = Literal["unavailable", "limited", "rejects", "accepts", "differs"]
_SNIPPET = 40  # characters of text shown on each side of a difference


@dataclass(frozen=True)
class Divergence:
    """How an engine's render departs from the reference's (jinja2's) for the same variables:
    - `unavailable`: the engine is not installed (`reference` and `got` empty, `message` says what to install);
    - `limited`: ctxlock's bound stopped one of the two renders, so they cannot be compared;
    - `rejects`: the reference renders, the engine fails (`got` is its error);
    - `accepts`: the reference fails (`reference` is its error), the engine renders;
    - `differs`: both render, the texts differ first at `offset` (of the reference's text); `reference` and `got`
      are the two texts from a little before that offset.
    `line` is the template line: the one the failing engine names (or where its `construct` is), or, for
    `differs`, the line that printed the reference's text at the difference (None when unknown); `construct` is the
    template text that failed, when the failing engine points at it."""

    engine: Engine
    verdict: Verdict
    line: int | None
    message: str
    offset: int | None = None
    reference: str = ""
    got: str = ""
    construct: str | None = None


def compare(reference: EngineResult, other: EngineResult) -> Divergence | None:
    """None when `other` renders what the reference renders (the same text, or a failure for both); else how it
    departs."""
    engine = other.engine
    if not other.available:
        return Divergence(engine, "unavailable", None, other.why_unavailable or f"{engine} is not available")
    if reference.limited or other.limited:
        which = reference if reference.limited else other
        why = f"{which.engine} went over ctxlock's bounds ({which.error}): the renders cannot be compared"
        return Divergence(engine, "limited", which.line, why, reference=reference.error or "", got=other.error or "")
    if reference.text is None and other.text is None:
        return None
    if reference.text is None:
        said = f"{reference.engine} fails ({reference.error}) where {engine} renders"
        return Divergence(engine, "accepts", reference.line, said, reference=reference.error or "", got="")
    if other.text is None:
        said = f"{engine} fails where {reference.engine} renders: {other.error}"
        if other.construct:
            said += f" (at `{other.construct}`)"
        return Divergence(engine, "rejects", other.line, said, got=other.error or "", construct=other.construct)
    if other.text == reference.text:
        return None
    a, b = reference.text, other.text
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    start = max(0, at - _SNIPPET // 2)
    line = reference.line_at(at)
    said = f"{engine} renders different text from character {at} on" + (f" (template line {line})" if line else "")
    return Divergence(
        engine, "differs", line, said, offset=at, reference=a[start : at + _SNIPPET], got=b[start : at + _SNIPPET]
    )


# ---------------------------------------------------------------------------------------------------------------
# jinja2, in this process


def _jinja2(source: str, contexts: list[dict[str, Any]], timeout_s: float) -> list[EngineResult]:
    limits = RenderLimits(max_seconds=timeout_s, max_output_chars=MAX_OUTPUT_CHARS, output_per_input_char=0.0)
    out = []
    for r in render_source(source, contexts, now=CLOCK, limits=limits):
        # ctxlock's bounds, or its refusal to print a memory address (jinja2 would print one)
        limited = r.error is not None and r.error.startswith(("limit:", "nondeterministic:"))
        out.append(
            EngineResult(
                "jinja2", r.text, r.error, r.line, version=jinja2.__version__, limited=limited, printed=r.printed
            )
        )
    return out


# ---------------------------------------------------------------------------------------------------------------
# minijinja and @huggingface/jinja, in a child process


def _minijinja(source: str, contexts: list[dict[str, Any]], timeout_s: float) -> list[EngineResult]:
    if importlib.util.find_spec("minijinja") is None:
        why = f"minijinja (the engine of TGI and mistral.rs) is not installed: {MINIJINJA_HINT}"
        return [EngineResult("minijinja", available=False, why_unavailable=why) for _ in contexts]
    argv = [sys.executable, "-I", "-X", "utf8", str(_WORKER)]
    job = {"fuel": max(1, int(_FUEL_PER_SECOND * timeout_s)), "max_bytes": _MINIJINJA_BYTES}
    return _in_child("minijinja", argv, {}, source, contexts, job, timeout_s)


def hf_jinja_dir(cwd: Path | None = None) -> Path | str:
    """The @huggingface/jinja package directory: `$CTXLOCK_HF_JINJA`, else `node_modules/@huggingface/jinja` in
    `cwd` (default: the working directory) or one of its parents; or why there is none, as a sentence."""
    named = os.environ.get(HF_JINJA_ENV)
    if named:
        path = Path(named).expanduser()
        if not (path / "package.json").is_file():
            return f"${HF_JINJA_ENV} is {named!r}, which is not a package directory (no package.json there)"
        return path.absolute()
    start = (cwd or Path.cwd()).absolute()
    for parent in (start, *start.parents):
        path = parent / "node_modules" / "@huggingface" / "jinja"
        if (path / "package.json").is_file():
            return path
    return f"the @huggingface/jinja package was not found (${HF_JINJA_ENV} is not set, and no node_modules has it)"


def _hf_jinja(source: str, contexts: list[dict[str, Any]], timeout_s: float) -> list[EngineResult]:
    node = shutil.which("node")
    package = hf_jinja_dir()
    if node is not None and not isinstance(package, str):
        argv = [node, f"--max-old-space-size={_NODE_HEAP_MB}", "--disallow-code-generation-from-strings", str(_RUNNER)]
        env = {HF_JINJA_ENV: str(package), "TZ": "UTC"}
        return _in_child("hf-jinja", argv, env, source, contexts, {}, timeout_s)
    why = f"{package}: {HF_JINJA_HINT}" if node is not None else "node (Node.js 18 or newer) is not on PATH"
    return [EngineResult("hf-jinja", available=False, why_unavailable=why) for _ in contexts]


def _in_child(
    engine: Engine,
    argv: list[str],
    env: dict[str, str],
    source: str,
    contexts: list[dict[str, Any]],
    extra: dict[str, Any],
    timeout_s: float,
) -> list[EngineResult]:
    """Every context rendered by the child `argv`; a child that dies or runs out of time costs the render in
    progress (an error), and a new child renders the rest."""
    results: list[EngineResult] = []
    while len(results) < len(contexts):
        todo = contexts[len(results) :]
        job = {"source": source, "contexts": todo, "now": CLOCK.isoformat(), "max_chars": MAX_OUTPUT_CHARS, **extra}
        session = _Session(engine, argv, env, timeout_s)
        try:
            answers = session.run(json.dumps(job).encode("ascii"), len(todo))  # ASCII: lone surrogates escaped
        finally:
            session.close()
        if session.fatal is not None:
            why = f"{engine} could not start: {session.fatal}"
            if engine == "hf-jinja":
                why += f" ({HF_JINJA_HINT})"
            return results + [EngineResult(engine, available=False, why_unavailable=why) for _ in todo]
        results += [_result(engine, a, session.version, source) for a in answers]
        if len(answers) < len(todo):  # the render in progress failed the child: it is an error, and the rest go on
            results.append(
                EngineResult(engine, error=session.failure, version=session.version, limited=session.limited)
            )
    return results


def _result(engine: Engine, answer: dict[str, Any], version: str | None, source: str) -> EngineResult:
    text = answer.get("text")
    if isinstance(text, str):
        return EngineResult(engine, text=text, version=version)
    error = str(answer.get("error"))[:MAX_MESSAGE]
    line = answer.get("line")
    line = line if isinstance(line, int) and not isinstance(line, bool) and line > 0 else None
    construct = answer.get("construct")
    construct = construct[:500] if isinstance(construct, str) and construct else None
    if line is None and construct is not None:
        line = locate(source, construct)
    limited = answer.get("phase") == "limit"
    return EngineResult(engine, error=error, line=line, version=version, limited=limited, construct=construct)


_QUOTES = str.maketrans("'", '"')


def locate(source: str, construct: str) -> int | None:
    """The line of `source` where the template text `construct` first appears, compared without whitespace and
    with either quote (an engine's formatter spells `x|length` as `x | length`, 'a' as "a"); failing that, where its
    last filter (`|name`) or its called name (`name(`) first appears; None when none does."""
    kept: list[str] = []
    lines: list[int] = []
    line = 1
    for ch in source:
        if ch == "\n":
            line += 1
        if not ch.isspace():
            kept.append(ch)
            lines.append(line)
    flat = "".join(kept).translate(_QUOTES)
    wanted = "".join(construct.split()).translate(_QUOTES)
    tries = [wanted]
    if "|" in wanted:
        tries.append("|" + wanted.rsplit("|", 1)[1].split("(", 1)[0])
    if "(" in wanted:
        tries.append(wanted.split("(", 1)[0] + "(")
    for piece in tries:
        at = flat.find(piece) if piece.strip("|(") else -1
        if at >= 0:
            return lines[at]
    return None


_MAX_LINE = MAX_OUTPUT_CHARS * 6 + 65_536  # bytes of one answer line (a text of MAX_OUTPUT_CHARS, JSON-escaped)
_STDERR_TAIL = 4096
_OUT_OF_MEMORY = (b"memory allocation of", b"heap out of memory", b"Reached heap limit", b"MemoryError")


class _Session:
    """One child process: the job written to its stdin, its answer lines read from stdout, each within its
    deadline and under the size cap; stderr's tail kept for the reason of a death."""

    def __init__(self, engine: Engine, argv: list[str], env: dict[str, str], timeout_s: float) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.version: str | None = None
        self.fatal: str | None = None  # the child could not load its engine
        self.failure = ""  # why the render in progress has no answer
        self.limited = False
        self._stderr = b""
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd="/",
                start_new_session=True,  # its own process group: killed whole
            )
        except OSError as exc:
            self.fatal = f"{argv[0]} cannot be run: {exc}"

    def run(self, job: bytes, count: int) -> list[dict[str, Any]]:
        """Up to `count` answers; fewer when the child failed the next render (`failure`, `limited`) or could not
        start (`fatal`)."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None or proc.stderr is None:
            return []
        answers: list[dict[str, Any]] = []
        pending, buffer = memoryview(job), b""
        selector = selectors.DefaultSelector()
        for stream, event in ((proc.stdin, selectors.EVENT_WRITE), (proc.stdout, selectors.EVENT_READ)):
            os.set_blocking(stream.fileno(), False)
            selector.register(stream, event)
        os.set_blocking(proc.stderr.fileno(), False)
        selector.register(proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + _START_SECONDS + self.timeout_s
        with selector:
            while len(answers) < count:
                wait = deadline - time.monotonic()
                if wait <= 0 and self.version is None:
                    self.fatal = f"it did not start within {_START_SECONDS + self.timeout_s:g} s"
                    return answers
                if wait <= 0:
                    return self._fail(answers, f"the render took more than {self.timeout_s:g} s", limited=True)
                events = selector.select(wait)
                for key, _mask in events:
                    if key.fileobj is proc.stdin:
                        pending = self._write(selector, proc.stdin, pending)
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if key.fileobj is proc.stderr:
                        self._stderr = (self._stderr + chunk)[-_STDERR_TAIL:]
                        if not chunk:
                            selector.unregister(proc.stderr)
                        continue
                    if not chunk:
                        return self._fail(answers, self._death(), limited=self._out_of_memory())
                    buffer += chunk
                    while b"\n" in buffer and len(answers) < count:
                        line, buffer = buffer.split(b"\n", 1)
                        if len(line) > _MAX_LINE:
                            return self._fail(answers, f"the engine wrote more than {_MAX_LINE:,} bytes", limited=True)
                        if not self._take(line, answers):
                            return answers
                        deadline = time.monotonic() + self.timeout_s
                    if len(buffer) > _MAX_LINE:
                        return self._fail(answers, f"the engine wrote more than {_MAX_LINE:,} bytes", limited=True)
        return answers

    @staticmethod
    def _write(selector: selectors.BaseSelector, stdin: Any, pending: memoryview) -> memoryview:
        try:
            sent = os.write(stdin.fileno(), pending[: 1 << 16])
        except BrokenPipeError:  # the child stopped reading: its death is read from stdout
            sent = len(pending)
        pending = pending[sent:]
        if not pending:
            selector.unregister(stdin)
            stdin.close()
        return pending

    def _take(self, line: bytes, answers: list[dict[str, Any]]) -> bool:
        """Read one answer line into `answers` (or the engine's version, or a fatal error); False when the
        session is over."""
        try:
            answer = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            answer = None
        if not isinstance(answer, dict):
            self.failure = f"the engine's runner wrote something that is not an answer: {line[:200]!r}"
            return False
        if "fatal" in answer:
            self.fatal = str(answer["fatal"])[:MAX_MESSAGE]
            return False
        if "engine" in answer and self.version is None:
            self.version = str(answer["engine"])[:100]
            return True
        if self.version is None:
            self.failure = "the engine's runner answered before it said its version"
            return False
        answers.append(answer)
        return True

    def _fail(self, answers: list[dict[str, Any]], why: str, *, limited: bool) -> list[dict[str, Any]]:
        if self.version is None and self.fatal is None and not limited:
            self.fatal = why  # the child died before it had loaded its engine
        self.failure, self.limited = why[:MAX_MESSAGE], limited
        return answers

    def _death(self) -> str:
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if self._proc.stderr is not None:
            with contextlib.suppress(OSError):  # what the child wrote before it died, if not read yet
                self._stderr = (self._stderr + (self._proc.stderr.read(_STDERR_TAIL) or b""))[-_STDERR_TAIL:]
        how = "ended" if code is None else f"ended with exit status {code}"
        if code is not None and code < 0:
            try:
                how = f"was ended by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was ended by signal {-code}"
        tail = [t for t in self._stderr.decode("utf-8", "replace").splitlines() if t.strip()][-6:]
        return f"the {self.engine} process {how}" + (": " + " | ".join(tail) if tail else "")

    def _out_of_memory(self) -> bool:
        return any(marker in self._stderr for marker in _OUT_OF_MEMORY)

    def close(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


__all__ = [
    "CLOCK",
    "ENGINES",
    "HF_JINJA_ENV",
    "HF_JINJA_HINT",
    "HF_JINJA_VERSION",
    "MAX_MESSAGE",
    "MAX_OUTPUT_CHARS",
    "MINIJINJA_HINT",
    "Divergence",
    "Engine",
    "EngineResult",
    "Verdict",
    "compare",
    "hf_jinja_dir",
    "locate",
    "render_many",
    "render_with",
]
