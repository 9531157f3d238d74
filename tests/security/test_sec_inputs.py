"""Every command-line input that is not a usable file ends in one typed error line, fast and in bounded memory.

A catalogue: each subcommand's file-taking argument (request, --template, --sampling, --policy, --schema, --file,
record files, records import, --model, --store, --out, stdin) crossed with each kind of bad input (a directory, a
missing path, a path under a regular file, /dev/null, an unreadable regular file, an oversize file, a FIFO,
/dev/zero). Each case must exit with status 1 and print exactly one line, `error: <CtxlockError subclass>: ...`,
that names the input, with no traceback.

Most cases run the real `ctxlock.cli.main` in this process (CLI start-up is about 0.7 s a process). The kinds that
would hang or eat memory if the fix regressed (a FIFO blocks the open, /dev/zero is endless) run in one
subprocess per kind under RLIMIT_AS and a timeout, and a few real `python -m ctxlock` runs check the whole path,
the exit status and the peak RSS end to end.

"Unreadable" is /proc/self/mem: a regular file whose read at offset 0 fails with EIO even for root (chmod 000
does not stop root, which these tests run as).
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import ctxlock.errors
from ctxlock.cli import main

TESTS_DIR = Path(__file__).resolve().parent
SRC_DIR = Path(ctxlock.errors.__file__).resolve().parent.parent
MEMORY_CAP = 2 << 30  # RLIMIT_AS of every subprocess: unbounded reading dies here instead of swapping the machine
RSS_CEILING_KB = 1 << 20  # a refused input is refused before it is read: the CLI stays far below 1 GiB
MAX_INPUT_ENV = "CTXLOCK_MAX_INPUT_BYTES"  # the documented knob
SMALL_CAP = 2048  # CTXLOCK_MAX_INPUT_BYTES for the oversize cases
REQUEST = {"messages": [{"role": "user", "content": "天空为什么是蓝色？"}]}


# ------------------------------------------------------------------------------------------- running the CLI


@dataclass
class Outcome:
    code: int | None
    stdout: str
    stderr: str
    escaped: BaseException | None  # an exception main() let through: a traceback in a real run


def run_main(argv: list[str], stdin: io.BufferedIOBase | bytes = b"") -> Outcome:
    """`ctxlock.cli.main(argv)` in this process, with stdin, stdout and stderr swapped for in-memory streams."""
    raw_in = io.BytesIO(stdin) if isinstance(stdin, bytes) else stdin
    fake_in = io.TextIOWrapper(raw_in, encoding="utf-8")
    fake_out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    fake_err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = fake_in, fake_out, fake_err
    code: int | None = 0
    escaped: BaseException | None = None
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:
        escaped, code = exc, None
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    out = fake_out.buffer.getvalue().decode("utf-8", "replace")  # type: ignore[attr-defined]
    err = fake_err.buffer.getvalue().decode("utf-8", "replace")  # type: ignore[attr-defined]
    return Outcome(code, out, err, escaped)


def problems(outcome: Outcome, names: str) -> list[str]:
    """What is wrong with how a bad input ended; [] when it is one typed error line naming `names`."""
    if outcome.escaped is not None:
        return [f"traceback: {type(outcome.escaped).__name__}: {outcome.escaped}"[:300]]
    found = []
    if outcome.code != 1:
        found.append(f"exit status {outcome.code}, not 1")
    lines = outcome.stderr.strip().splitlines()
    if "Traceback" in outcome.stderr:
        found.append("traceback on stderr")
    if len(lines) != 1:
        found.append(f"{len(lines)} lines on stderr: {outcome.stderr[:300]!r}")
    elif not lines[0].startswith("error: "):
        found.append(f"not an error line: {lines[0][:200]!r}")
    else:
        kind = lines[0].split(":", 2)[1].strip()
        cls = getattr(ctxlock.errors, kind, None)
        if not (isinstance(cls, type) and issubclass(cls, ctxlock.errors.CtxlockError)):
            found.append(f"{kind} is not a CtxlockError")
        if names not in lines[0]:
            found.append(f"the line does not name {names!r}: {lines[0][:200]!r}")
    return found


# ------------------------------------------------------------------------------------------- the catalogue


@dataclass(frozen=True)
class Place:
    """Where the bad path goes: `argv` with `{}` for it, the kinds of bad input that apply. For stdin, `reads` is
    what the command expects there (request, jsonl or records) and `bad_utf8_names` what its error line names."""

    name: str
    argv: tuple[str, ...]
    kinds: tuple[str, ...]
    reads: str = ""
    bad_utf8_names: str = "stdin"


FILE_KINDS = ("directory", "missing", "under-a-file", "devnull", "unreadable", "oversize", "fifo", "devzero")
# A record argument that is not an existing file is looked up as an id: missing is a typed RecordNotFoundError.
RECORD_KINDS = ("directory", "missing", "devnull", "unreadable", "oversize", "fifo", "devzero")
MODEL_KINDS = ("directory", "missing", "under-a-file", "devnull", "regular", "fifo", "devzero")
STORE_KINDS = ("under-a-file", "devnull", "regular", "fifo", "devzero")  # a missing store is created
OUT_KINDS = ("directory", "under-a-file")  # an --out file is created; /dev/null is a fine place to write

PLACES = (
    Place("render REQUEST", ("render", "{}", "-m", "book"), FILE_KINDS),
    Place("render --template", ("render", "{req}", "-m", "book", "--template", "{}"), FILE_KINDS),
    Place("render --sampling", ("render", "{req}", "-m", "book", "--sampling", "{}"), FILE_KINDS),
    Place("render --model", ("render", "{req}", "-m", "{}"), MODEL_KINDS),
    Place("render --store", ("render", "{req}", "-m", "book", "--record", "--store", "{}"), STORE_KINDS),
    Place("tokenize --file", ("tokenize", "-m", "book", "--file", "{}"), FILE_KINDS),
    Place("tokenize --model", ("tokenize", "-m", "{}", "--text", "hi"), MODEL_KINDS),
    Place("fit REQUEST", ("fit", "{}", "-m", "book", "--max-input-tokens", "100"), FILE_KINDS),
    Place("fit --policy", ("fit", "{req}", "-m", "book", "--policy", "{}"), FILE_KINDS),
    Place("fit --template", ("fit", "{req}", "-m", "book", "--max-input-tokens", "100", "-t", "{}"), FILE_KINDS),
    Place("fit --model", ("fit", "{req}", "-m", "{}", "--max-input-tokens", "100"), MODEL_KINDS),
    Place("compact-plan REQUEST", ("compact-plan", "{}", "-m", "book", "--context-window", "100"), FILE_KINDS),
    Place(
        "compact-plan --template",
        ("compact-plan", "{req}", "-m", "book", "--context-window", "100", "-t", "{}"),
        FILE_KINDS,
    ),
    Place("compact-plan --model", ("compact-plan", "{req}", "-m", "{}", "--context-window", "100"), MODEL_KINDS),
    Place("constrain --schema", ("constrain", "--schema", "{}", "-m", "book"), FILE_KINDS),
    Place("constrain --model", ("constrain", "--schema", "{schema}", "-m", "{}"), MODEL_KINDS),
    Place("detok --model", ("detok", "-m", "{}", "--ids", "[1]"), MODEL_KINDS),
    Place("inspect --model", ("inspect", "-m", "{}"), MODEL_KINDS),
    Place("records list --store", ("records", "list", "--store", "{}"), STORE_KINDS),
    Place("records show RECORD", ("records", "show", "{}", "--store", "{store}"), RECORD_KINDS),
    Place("records export --out", ("records", "export", "--store", "{store}", "--out", "{}"), OUT_KINDS),
    Place("records import SOURCE", ("records", "import", "{}", "--store", "{store}"), FILE_KINDS),
    Place("records import --store", ("records", "import", "{record_lines}", "--store", "{}"), STORE_KINDS),
    Place("replay RECORD", ("replay", "{}", "--store", "{store}"), RECORD_KINDS),
    Place("diff A", ("diff", "{}", "{record}", "--store", "{store}"), RECORD_KINDS),
    Place("diff B", ("diff", "{record}", "{}", "--store", "{store}"), RECORD_KINDS),
    Place("diff --template", ("diff", "{record}", "--template", "{}", "--store", "{store}"), FILE_KINDS),
    Place("diff --model", ("diff", "{record}", "--model", "{}", "--store", "{store}"), MODEL_KINDS),
)

# Commands that read stdin: bad UTF-8 and oversize stdin in process, /dev/zero as stdin in a subprocess.
ALL_STDIN = ("badutf8", "oversize", "devzero")
STDIN_PLACES = (
    # The request parser reports bad UTF-8 itself, naming the byte offset (its utf8 policy decides).
    Place("render stdin", ("render", "-", "-m", "book"), ALL_STDIN, "request", "byte"),
    Place("fit stdin", ("fit", "-", "-m", "book", "--max-input-tokens", "100"), ALL_STDIN, "request", "byte"),
    Place(
        "compact-plan stdin", ("compact-plan", "-", "-m", "book", "--context-window", "9"), ALL_STDIN, "request", "byte"
    ),
    Place("tokenize --jsonl stdin", ("tokenize", "-m", "book", "--jsonl"), ALL_STDIN, "jsonl", "stdin line 1"),
    Place("detok --jsonl stdin", ("detok", "-m", "book", "--jsonl"), ALL_STDIN, "jsonl", "stdin line 1"),
    Place("records import stdin", ("records", "import", "-", "--store", "{store}"), ALL_STDIN, "records", "line 1"),
)
IN_PROCESS = ("directory", "missing", "under-a-file", "devnull", "unreadable", "oversize", "regular")
ISOLATED = ("fifo", "devzero")  # would block or never end on a regression: only in a bounded subprocess


def build_world(root: Path) -> dict[str, str]:
    """The good inputs around each bad one (a request, a schema, a store holding one record) and the bad paths."""
    root.mkdir(parents=True, exist_ok=True)
    req = root / "request.json"
    req.write_text(json.dumps(REQUEST, ensure_ascii=False), "utf-8")
    schema = root / "schema.json"
    schema.write_text('{"type": "boolean"}', "utf-8")
    store = root / "store"
    record_lines = root / "records.jsonl"
    if not record_lines.exists():
        stored = run_main(["render", str(req), "-m", "book", "--record", "--store", str(store), "--json"])
        assert stored.code == 0, stored
        rid = json.loads(stored.stdout)["record_id"]
        exported = run_main(["records", "export", "--store", str(store), "--out", str(record_lines)])
        assert exported.code == 0, exported
        (root / "record_id").write_text(rid)
        (root / "directory").mkdir()
        (root / "plain.txt").write_text("a regular file, not a model, a store or a directory\n")
        # Oversize inputs are valid JSON of each expected shape, so only the size can refuse them.
        padding = " " * (SMALL_CAP * 2)
        (root / "oversize.json").write_text(json.dumps(REQUEST) + padding, "utf-8")
        os.mkfifo(root / "fifo")
    return {
        "req": str(req),
        "schema": str(schema),
        "store": str(store),
        "record": (root / "record_id").read_text(),
        "record_lines": str(record_lines),
        "directory": str(root / "directory"),
        "missing": str(root / "missing.json"),
        "under-a-file": str(root / "plain.txt" / "x.json"),
        "devnull": "/dev/null",
        "unreadable": "/proc/self/mem",
        "oversize": str(root / "oversize.json"),
        "regular": str(root / "plain.txt"),
        "fifo": str(root / "fifo"),
        "devzero": "/dev/zero",
    }


def argv_for(place: Place, bad: str, world: dict[str, str]) -> list[str]:
    return [bad if a == "{}" else a.format(**world) for a in place.argv]


def file_cases(kinds: tuple[str, ...]) -> list[tuple[Place, str]]:
    return [(p, k) for p in PLACES for k in p.kinds if k in kinds]


def stdin_bytes(place: Place, kind: str, world: dict[str, str]) -> bytes:
    """Stdin that is valid for `place` but for one thing: a bad byte at offset 5, or its size (then it is valid
    input padded past SMALL_CAP, in one line, so a line cap and a stream cap both refuse it)."""
    good = {
        "request": json.dumps(REQUEST).encode(),
        "jsonl": b'"just a string"',
        "records": Path(world["record_lines"]).read_bytes().rstrip(b"\n"),
    }[place.reads]
    if kind == "badutf8":
        return good[:5] + b"\xff" + good[5:] + b"\n"
    return good + b" " * (SMALL_CAP * 2) + b"\n"


def run_case(place: Place, kind: str, world: dict[str, str], stdin: io.BufferedIOBase | None = None) -> list[str]:
    """Run one catalogue case; [] when it ended in one typed error line naming the bad input."""
    on_stdin = place in STDIN_PLACES
    bad = "-" if on_stdin else world[kind]
    if on_stdin and stdin is None:
        stdin = stdin_bytes(place, kind, world)
    names = (place.bad_utf8_names if kind == "badutf8" else "stdin") if on_stdin else bad
    os.environ[MAX_INPUT_ENV] = str(SMALL_CAP) if kind == "oversize" else ""
    try:
        outcome = run_main(argv_for(place, bad, world), b"" if stdin is None else stdin)
    finally:
        os.environ.pop(MAX_INPUT_ENV, None)
    return problems(outcome, names)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_world(tmp_path_factory.mktemp("inputs"))


@pytest.fixture(autouse=True)
def _own_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(base / "ctxlock-cache"))
    monkeypatch.setenv("CTXLOCK_DATA_DIR", str(base / "ctxlock-data"))
    monkeypatch.delenv(MAX_INPUT_ENV, raising=False)


@pytest.mark.parametrize(
    ("place", "kind"),
    [pytest.param(p, k, id=f"{p.name}-{k}") for p, k in file_cases(IN_PROCESS)],
)
def test_bad_file_argument_is_one_typed_line(place: Place, kind: str, world: dict[str, str]) -> None:
    assert run_case(place, kind, world) == []


@pytest.mark.parametrize(
    ("place", "kind"),
    [pytest.param(p, k, id=f"{p.name}-{k}") for p in STDIN_PLACES for k in p.kinds if k != "devzero"],
)
def test_bad_stdin_is_one_typed_line(place: Place, kind: str, world: dict[str, str]) -> None:
    """Bad UTF-8 on stdin is a typed error naming stdin (for --jsonl, the line); so is stdin over the cap."""
    assert run_case(place, kind, world) == []


# ------------------------------------------------------------------------------------------- bounded subprocesses


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _limit_memory_and_close_stdin() -> None:
    _limit_memory()
    os.close(0)  # started with `<&-`: Python's sys.stdin is then None


def run_bounded(
    args: list[str], *, stdin_path: str | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> tuple[int | None, str, str, int]:
    """Run a Python subprocess under RLIMIT_AS and a timeout; (status or None if killed, stdout, stderr, max RSS KB).

    The peak RSS is the child's own VmHWM (the high-water mark of its memory since exec), which a small wrapper
    writes to a file at exit: getrusage's and wait4's ru_maxrss carry the parent's resident size over fork and exec,
    and by the end of the suite pytest's process is gigabytes."""
    fd, hwm_file = tempfile.mkstemp(prefix="ctxlock-hwm-")
    os.close(fd)
    full_env = {**os.environ, "PYTHONPATH": str(SRC_DIR), "CTXLOCK_TEST_HWM_FILE": hwm_file, **(env or {})}
    args = ["-c", _HWM_WRAPPER, *args]
    closed = stdin_path == "closed"
    if closed:
        stdin_path = None
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full_env,
        preexec_fn=_limit_memory_and_close_stdin if closed else _limit_memory,
    )
    chunks: dict[str, bytes] = {}
    readers = [
        threading.Thread(target=lambda n=n, s=s: chunks.__setitem__(n, s.read()))
        for n, s in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for r in readers:
        r.start()
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        _, status, _ = os.wait4(proc.pid, 0)
    finally:
        killer.cancel()
        if stdin_path:
            stdin.close()  # type: ignore[union-attr]
    for r in readers:
        r.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    code = None if proc.returncode < 0 else proc.returncode
    out, err = chunks.get("out", b"").decode("utf-8", "replace"), chunks.get("err", b"").decode("utf-8", "replace")
    try:
        text = Path(hwm_file).read_text()
    finally:
        os.unlink(hwm_file)
    return code, out, err, int(text) if text else 0


# Runs `python -m MODULE ARGS` or `python -c CODE ARGS` (given after it), and at exit writes VmHWM (KB) to a file.
_HWM_WRAPPER = """
import atexit, os, runpy, sys
def _hwm():
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(os.environ["CTXLOCK_TEST_HWM_FILE"], "w") as out:
        out.write(kb)
atexit.register(_hwm)
flag, target, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
if flag == "-m":
    sys.argv = [target, *rest]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    sys.argv = ["-c", *rest]
    exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
"""


DRIVER = """
import json, sys
sys.path[:0] = [{tests!r}, {tests_parent!r}]
import test_sec_inputs as t
from pathlib import Path
world = t.build_world(Path({root!r}))
report = sys.__stdout__
for place, kind, stdin in t.isolated_cases({kind!r}):
    print(json.dumps({{"case": place.name + "-" + kind, "started": True}}), file=report, flush=True)
    found = t.run_case(place, kind, world, open(stdin, "rb") if stdin else None)
    print(json.dumps({{"case": place.name + "-" + kind, "problems": found}}), file=report, flush=True)
"""


def isolated_cases(kind: str) -> list[tuple[Place, str, str | None]]:
    cases: list[tuple[Place, str, str | None]] = [(p, k, None) for p, k in file_cases((kind,))]
    if kind == "devzero":
        cases += [(p, "devzero", "/dev/zero") for p in STDIN_PLACES]
    return cases


@pytest.mark.parametrize("kind", ISOLATED)
def test_fifo_and_dev_zero_end_fast_in_bounded_memory(kind: str, world: dict[str, str]) -> None:
    """Every place × a FIFO (opening one blocks until a writer comes) or /dev/zero (never ends), and /dev/zero as
    stdin: all in one subprocess under a 2 GiB address-space limit; each case must end in one typed error line."""
    root = Path(world["req"]).parent
    code = DRIVER.format(tests=str(TESTS_DIR), tests_parent=str(TESTS_DIR.parent), root=str(root), kind=kind)
    status, out, err, _ = run_bounded(["-c", code], timeout=120)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    finished = {e["case"]: e["problems"] for e in events if "problems" in e}
    started = [e["case"] for e in events if e.get("started")]
    assert status == 0, f"driver died or hung (status {status}) in {started[-1:] or 'start-up'}: {err[-800:]}"
    expected = [f"{p.name}-{k}" for p, k, _ in isolated_cases(kind)]
    assert sorted(finished) == sorted(expected)
    assert {case: found for case, found in finished.items() if found} == {}


# The end-to-end runs: the real entry point, the real exit status and the child's own peak RSS.
END_TO_END = (
    ("tokenize --file /dev/zero", ["tokenize", "-m", "book", "--file", "/dev/zero"], None, "/dev/zero"),
    ("records import /dev/zero", ["records", "import", "/dev/zero", "--store", "{store}"], None, "/dev/zero"),
    ("render FIFO", ["render", "{fifo}", "-m", "book"], None, "{fifo}"),
    ("inspect --model /dev/null", ["inspect", "-m", "/dev/null"], None, "/dev/null"),
    ("detok --jsonl < /dev/zero", ["detok", "-m", "book", "--jsonl"], "/dev/zero", "stdin line 1"),
    ("records export --out DIR", ["records", "export", "--store", "{store}", "--out", "{directory}"], None, "--out"),
    ("render with stdin closed", ["render", "-", "-m", "book"], "closed", "stdin"),
    ("tokenize --jsonl with stdin closed", ["tokenize", "-m", "book", "--jsonl"], "closed", "stdin"),
)


@pytest.mark.parametrize(("argv", "stdin", "names"), [pytest.param(*c[1:], id=c[0]) for c in END_TO_END])
def test_end_to_end_one_line_and_bounded_rss(
    argv: list[str], stdin: str | None, names: str, world: dict[str, str]
) -> None:
    args = [a.format(**world) for a in argv]
    t0 = time.monotonic()
    status, _, err, rss_kb = run_bounded(["-m", "ctxlock", *args], stdin_path=stdin)
    elapsed = time.monotonic() - t0
    assert status == 1, (status, err[-800:])
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and names.format(**world) in lines[0], err[-800:]
    assert rss_kb < RSS_CEILING_KB, f"peak RSS {rss_kb} KB"
    assert elapsed < 30


# ------------------------------------------------------------------------------------------- the cap itself


def test_the_cap_is_exact_and_configurable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of exactly the cap is read whole; one byte more is refused; a bad setting is a typed error."""
    from ctxlock.errors import InputError
    from ctxlock.outside._files import DEFAULT_MAX_INPUT_BYTES, max_input_bytes, read_input

    assert max_input_bytes() == DEFAULT_MAX_INPUT_BYTES == 64 * 1024 * 1024
    monkeypatch.setenv(MAX_INPUT_ENV, "100")
    at_cap, over = tmp_path / "a", tmp_path / "b"
    at_cap.write_bytes(b"x" * 100)
    over.write_bytes(b"x" * 101)
    assert read_input(at_cap) == b"x" * 100
    with pytest.raises(InputError, match="100-byte input limit") as exc:
        read_input(over, label="--file b")
    assert exc.value.path == "--file b" and MAX_INPUT_ENV in (exc.value.hint or "")
    monkeypatch.setenv(MAX_INPUT_ENV, "lots")
    with pytest.raises(InputError) as bad:
        read_input(at_cap)
    assert bad.value.path == MAX_INPUT_ENV


@pytest.mark.parametrize("name", ["nul\x00byte.json", "lone\ud800surrogate.json"])
def test_unusable_file_names_are_typed(name: str, tmp_path: Path) -> None:
    """A name no system call can take (only reachable from Python, not argv) is an InputError, not ValueError."""
    from ctxlock.errors import InputError
    from ctxlock.outside._files import read_input

    with pytest.raises(InputError) as exc:
        read_input(tmp_path / name, label="--file x")
    assert exc.value.path == "--file x"


def test_a_fifo_swapped_in_after_the_stat_is_refused_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stat says regular file, but the path is a FIFO when it is opened: the non-blocking open and the fstat of
    the opened descriptor refuse it instead of waiting for a writer."""
    import ctxlock.outside._files as inputs
    from ctxlock.errors import InputError

    fifo = tmp_path / "swapped"
    os.mkfifo(fifo)
    regular = os.stat(__file__)
    real_stat = os.stat
    monkeypatch.setattr(inputs.os, "stat", lambda p, *a, **k: regular if str(p) == str(fifo) else real_stat(p, *a, **k))
    done: list[BaseException] = []

    def read() -> None:
        try:
            inputs.read_input(fifo)
        except InputError as exc:
            done.append(exc)

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "read_input blocked on a FIFO"
    assert done and "FIFO" in str(done[0])
