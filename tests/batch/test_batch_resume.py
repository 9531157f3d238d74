"""`ctxlock batch --resume` treats what it finds in the output directory as data from outside (docs/batch.md).

A catalogue of hostile and stale shard records and files (a record naming /etc/hostname, ../other/shard.parquet
with a matching digest, /dev/zero; a FIFO, a symlink to /dev/zero, a directory; edited row counts, a forged
footer; changed input rows, options, model and template), and a hypothesis strategy mutating records (fields,
types, paths, digests, counts) and files. Each resume either makes the touched shards again, saying why, and ends
with exactly the files a fresh run writes, or refuses with one typed error; it never lists a shard it did not
verify. The FIFO and device cases also run through the CLI in a subprocess (its timeout only a guard against a
hang), which also measures the resume's peak memory against a fresh run's.
"""

from __future__ import annotations

import faulthandler
import hashlib
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fetched
from cli_runner import run_main
from ctxlock.batch._output import json_bytes
from ctxlock.batch._run import BatchOptions, Progress, run_batch
from ctxlock.caches import clear_caches
from ctxlock.errors import CtxlockError, InputError
from hypothesis_profiles import examples

SRC = Path(__file__).resolve().parents[2] / "src"
OPTS = BatchOptions(model="book", shard_rows=4)
SHARDS = 6


def _lines(fixed: dict[int, str] | None = None) -> list[str]:
    """24 rows (shards of 4): two error rows (broken JSON, nothing to train on)."""
    lines = []
    for i in range(24):
        msgs = [{"role": "user", "content": f"question {i} " * (1 + i % 3)}, {"role": "assistant", "content": f"a{i}"}]
        lines.append(json.dumps({"messages": msgs}))
    lines[5] = '{"messages": ['
    lines[14] = json.dumps({"messages": [{"role": "user", "content": "no reply"}]})
    for k, v in (fixed or {}).items():
        lines[k] = v
    return lines


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(x + "\n" for x in lines), "utf-8")
    return path


def _tree(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture(autouse=True)
def _hang_guard() -> Any:
    """A guard, not a timed assertion: a test still running after two minutes (a FIFO opened for reading waits for
    a writer forever; /dev/zero never ends) fails with TimeoutError instead of stopping the suite; one stuck in C
    (hashing /dev/zero) ends the process after three, with every thread's traceback."""

    def stop(signum: int, frame: Any) -> None:
        raise TimeoutError("the resume hung (a FIFO or a device read?)")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(120)
    faulthandler.dump_traceback_later(180, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One finished run (copied by each case) and its files."""
    root = tmp_path_factory.mktemp("resume")
    source = _write(root / "in.jsonl", _lines())
    out = root / "done"
    manifest = run_batch(source, out, OPTS)
    assert len(manifest["shards"]) == SHARDS
    return {"root": root, "source": source, "out": out, "tree": _tree(out), "manifest": manifest}


def _copy(made: dict[str, Any], dest: Path) -> tuple[Path, Path]:
    """The finished run copied to `dest`, its manifest gone (a killed run), and its own copy of the input."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / "out"
    shutil.copytree(made["out"], out)
    (out / "manifest.json").unlink()
    source = dest / "in.jsonl"
    shutil.copyfile(made["source"], source)
    return source, out


def _record(out: Path, k: int) -> dict[str, Any]:
    return json.loads((out / f"shard-{k:05d}.json").read_text("utf-8"))


def _set_record(out: Path, k: int, record: Any) -> None:
    (out / f"shard-{k:05d}.json").write_text(json.dumps(record), "utf-8")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _blocks_sha(path: Path) -> str:
    """The manifest's input digest: sha256 over the sha256s of the file's 1 MiB blocks (docs/batch.md)."""
    data = path.read_bytes()
    return hashlib.sha256(
        b"".join(hashlib.sha256(data[k : k + (1 << 20)]).digest() for k in range(0, len(data), 1 << 20))
    ).hexdigest()


def _replace(path: Path, make: Callable[[Path], None]) -> None:
    path.unlink()
    make(path)


def _forged_footer(out: Path, k: int, **changes: Any) -> None:
    """Shard k rewritten with its footer's record changed, and its JSON record to match (a consistent forgery)."""
    path = out / f"shard-{k:05d}.parquet"
    table = pq.read_table(path)
    record = {key: v for key, v in _record(out, k).items() if key != "sha256"} | changes
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, table.schema) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata({"ctxlock.shard": json.dumps(record, sort_keys=True)})
    path.write_bytes(sink.getvalue())
    (out / f"shard-{k:05d}.json").write_bytes(json_bytes({**record, "sha256": _sha(path)}))  # as ctxlock writes it


def _elsewhere(out: Path, k: int) -> None:
    """Record k names ../other/shard.parquet, a copy of its own file there (so the digest matches)."""
    other = out.parent / "other"
    other.mkdir()
    shutil.copyfile(out / f"shard-{k:05d}.parquet", other / "shard.parquet")
    (out / f"shard-{k:05d}.parquet").unlink()
    _set_record(out, k, _record(out, k) | {"file": "../other/shard.parquet", "sha256": _sha(other / "shard.parquet")})


def _hostname(out: Path, k: int) -> None:
    host = Path("/etc/hostname")
    _set_record(out, k, _record(out, k) | {"file": str(host), "sha256": _sha(host)})


def _edit(out: Path, k: int, **changes: Any) -> None:
    _set_record(out, k, _record(out, k) | changes)


# Each case: (what it does to shard 2 of a finished run, a word the reason for making it again must hold).
CATALOGUE: dict[str, tuple[Callable[[Path], None], str]] = {
    "record names /etc/hostname, its digest": (lambda o: _hostname(o, 2), "sha256"),
    "record names ../other/shard.parquet, digest matching": (lambda o: _elsewhere(o, 2), "missing"),
    "record names /dev/zero": (lambda o: _edit(o, 2, file="/dev/zero"), "differs"),
    "record names a FIFO": (lambda o: (os.mkfifo(o.parent / "fifo"), _edit(o, 2, file="../fifo")), "differs"),
    "parquet is a symlink to /dev/zero": (
        lambda o: _replace(o / "shard-00002.parquet", lambda p: p.symlink_to("/dev/zero")),
        "symbolic link",
    ),
    "parquet is a FIFO": (lambda o: _replace(o / "shard-00002.parquet", os.mkfifo), "FIFO"),
    "parquet is a symlink to a copy of itself": (
        lambda o: (
            shutil.copyfile(o / "shard-00002.parquet", o.parent / "copy.parquet"),
            _replace(o / "shard-00002.parquet", lambda p: p.symlink_to(o.parent / "copy.parquet")),
        ),
        "symbolic link",
    ),
    "record is a symlink to /dev/zero": (
        lambda o: _replace(o / "shard-00002.json", lambda p: p.symlink_to("/dev/zero")),
        "symbolic link",
    ),
    "record is a FIFO": (lambda o: _replace(o / "shard-00002.json", os.mkfifo), "FIFO"),
    "record over the size bound (sparse)": (
        lambda o: os.truncate(o / "shard-00002.json", (64 << 20) + 10),
        "MiB",
    ),
    "record nested 100,000 deep": (lambda o: (o / "shard-00002.json").write_text("[" * 100_000), "JSON"),
    "record with a 5,000-digit integer": (lambda o: (o / "shard-00002.json").write_text("9" * 5000), "JSON"),
    "record with a lone surrogate": (
        lambda o: (o / "shard-00002.json").write_text('{"file": "\\ud800"}'),
        "JSON",
    ),
    "record is a list": (lambda o: (o / "shard-00002.json").write_text("[]"), "object"),
    "record's row count edited to 1,004": (lambda o: _edit(o, 2, row_count=1004), "differs"),
    "row count forged in the footer and the record": (lambda o: _forged_footer(o, 2, row_count=1004), "1,004"),
    "row range forged in both": (lambda o: _forged_footer(o, 2, rows=[0, 4]), "covers rows"),
    "error rows forged in both": (
        lambda o: _forged_footer(
            o, 2, error_count=1, row_count=3, errors=[{"row": 99, "type": "X", "path": None, "message": "m"}]
        ),
        "error rows",
    ),
    "input sha256 forged in both": (lambda o: _forged_footer(o, 2, input_sha256="0" * 64), "input rows changed"),
    "job forged in both": (lambda o: _forged_footer(o, 2, job={"model": "x"}), "job"),
    "another shard's files": (
        lambda o: [shutil.copyfile(o / f"shard-00003.{e}", o / f"shard-00002.{e}") for e in ("json", "parquet")],
        "not shard 2's",
    ),
    "parquet truncated": (lambda o: (o / "shard-00002.parquet").write_bytes(b"PAR1 short"), "sha256"),
    "parquet missing": (lambda o: (o / "shard-00002.parquet").unlink(), "missing"),
    "record missing": (lambda o: (o / "shard-00002.json").unlink(), "missing"),
}


@pytest.mark.parametrize("case", sorted(CATALOGUE))
def test_a_hostile_shard_is_made_again_and_said(made: dict[str, Any], tmp_path: Path, case: str) -> None:
    mutate, word = CATALOGUE[case]
    source, out = _copy(made, tmp_path)
    mutate(out)
    seen: list[Progress] = []
    manifest = run_batch(source, out, OPTS, resume=True, on_progress=seen.append)
    assert set(seen[-1].remade) == {2} and word in seen[-1].remade[2], seen[-1].remade
    assert seen[-1].shards_kept == SHARDS - 1
    assert manifest == made["manifest"] and _tree(out) == made["tree"]


def test_changed_input_rows_remake_exactly_their_shards(made: dict[str, Any], tmp_path: Path) -> None:
    """A user fixes the two bad rows (5 and 14) and resumes: shards 1 and 3 are made again, the others kept, and
    the manifest's input sha256 is the fixed input's, over its rows."""
    source, out = _copy(made, tmp_path)
    good = json.dumps({"messages": [{"role": "user", "content": "fixed"}, {"role": "assistant", "content": "ok"}]})
    _write(source, _lines({5: good, 14: good}))
    seen: list[Progress] = []
    manifest = run_batch(source, out, OPTS, resume=True, on_progress=seen.append)
    assert seen[-1].remade == {1: "its input rows changed", 3: "its input rows changed"}
    assert manifest["error_count"] == 0 and manifest["input"]["blocks_sha256"] == _blocks_sha(source)
    fresh = run_batch(source, tmp_path / "fresh", OPTS)
    assert manifest == fresh and _tree(out) == _tree(tmp_path / "fresh")


@pytest.mark.parametrize("rows", [10, 30])
def test_a_shorter_or_longer_input(made: dict[str, Any], tmp_path: Path, rows: int) -> None:
    """Fewer rows: the shards beyond the input are removed (a reader of shard-*.parquet never meets them) and the
    last one is made again; more rows: the new shards are made."""
    source, out = _copy(made, tmp_path)
    lines = (_lines() * 2)[:rows]
    _write(source, lines)
    seen: list[Progress] = []
    manifest = run_batch(source, out, OPTS, resume=True, on_progress=seen.append)
    fresh = run_batch(source, tmp_path / "fresh", OPTS)
    assert manifest == fresh and _tree(out) == _tree(tmp_path / "fresh")
    if rows == 10:
        assert seen[-1].remade == {2: "its record covers rows [8, 12), not this input's [8, 10)"}
        assert seen[-1].removed == [f"shard-0000{k}.{e}" for k in (3, 4, 5) for e in ("json", "parquet")]
    else:
        assert seen[-1].remade == {} and seen[-1].shards_kept == SHARDS


@pytest.mark.parametrize(
    ("opts", "reason"),
    [
        (BatchOptions(model="book", shard_rows=4, max_length=64), "other options"),
        (BatchOptions(model="mistral-nemo", shard_rows=4), "another model ('book', now 'mistral-nemo')"),
    ],
)
def test_other_options_or_model_remake_every_shard(
    made: dict[str, Any], tmp_path: Path, opts: BatchOptions, reason: str
) -> None:
    source, out = _copy(made, tmp_path)
    seen: list[Progress] = []
    manifest = run_batch(source, out, opts, resume=True, on_progress=seen.append)
    assert seen[-1].shards_kept == 0 and all(reason in r for r in seen[-1].remade.values())
    assert sorted(seen[-1].remade) == list(range(SHARDS))
    assert manifest == run_batch(source, tmp_path / "fresh", opts)


def test_another_template_remakes_every_shard(tmp_path: Path) -> None:
    """The same model directory with its chat template edited: every shard is made again, and the reason says so."""
    model_dir = tmp_path / "model"
    shutil.copytree(fetched.hf_tokenizer_dir("qwen2"), model_dir)
    source = _write(tmp_path / "in.jsonl", _lines()[:8])
    opts = BatchOptions(model=str(model_dir), shard_rows=4)
    run_batch(source, tmp_path / "out", opts)
    template = model_dir / "chat_template.jinja"
    template.write_text(template.read_text("utf-8").replace("<|im_start|>", "<|im_start|> ", 1), "utf-8")
    clear_caches("artifact")  # as a new process (the CLI) loads it: this one keeps loaded models by their path
    seen: list[Progress] = []
    run_batch(source, tmp_path / "out", opts, resume=True, on_progress=seen.append)
    assert seen[-1].remade == {0: "it was made with another template", 1: "it was made with another template"}


def test_a_directory_in_a_shard_s_place_is_refused(made: dict[str, Any], tmp_path: Path) -> None:
    """What a resume cannot replace (a directory at a shard's name) is one typed error, on the CLI one line."""
    source, out = _copy(made, tmp_path)
    (out / "shard-00002.parquet").unlink()
    (out / "shard-00002.parquet").mkdir()
    with pytest.raises(InputError, match=r"shard-00002\.parquet"):
        run_batch(source, out, OPTS, resume=True)
    assert not (out / "manifest.json").exists()
    argv = ["batch", str(source), str(out), "-m", "book", "--shard-rows", "4", "--resume", "--json"]
    code, stdout, err = run_main(argv)
    assert code == 1 and err.startswith("error: InputError:") and err.count("\n") == 1, err
    assert json.loads(stdout)["error"]["type"] == "InputError"
    assert not (out / "manifest.json").exists()


def test_workers_two_and_many_hostile_shards_at_once(made: dict[str, Any], tmp_path: Path) -> None:
    """The pool engine meets the same checks (the parent checks; the workers make the shards again)."""
    source, out = _copy(made, tmp_path)
    for k, name in enumerate(sorted(CATALOGUE)[:SHARDS]):
        mutated = tmp_path / f"m{k}"
        _, mout = _copy(made, mutated)
        CATALOGUE[name][0](mout)
        for e in ("json", "parquet"):  # shard 2 of that copy becomes shard k here, renamed as a hostile user would
            src, dst = mout / f"shard-00002.{e}", out / f"shard-{k:05d}.{e}"
            if os.path.lexists(src):
                dst.unlink(missing_ok=True)
                os.rename(src, dst)
    seen: list[Progress] = []
    manifest = run_batch(source, out, OPTS, resume=True, on_progress=seen.append, workers=2)
    assert manifest == made["manifest"] and _tree(out) == made["tree"]
    assert 2 in seen[-1].remade and len(seen[-1].remade) >= SHARDS - 1


# -- generated: records and files mutated -----------------------------------------------------------------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.sampled_from(["/dev/zero", "../other/shard.parquet", "/etc/hostname", "shard-00001.parquet", "", "0" * 64])
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_FIELDS = st.sampled_from(
    [
        "index",
        "file",
        "job",
        "rows",
        "input_sha256",
        "row_count",
        "error_count",
        "token_count",
        "trained_tokens",
        "sequence_count",
        "notes",
        "errors",
        "sha256",
        "extra",
    ]
)


@st.composite
def _mutation(draw: st.DrawFn) -> Callable[[Path], None]:
    """One change to shard 1 of a finished run: a record field set, deleted or counted up; the record's bytes
    replaced; its digest pointed at another file; the Parquet file replaced by another shard's, garbage, a link."""
    kind = draw(st.sampled_from(["set", "delete", "bump", "bytes", "digest", "parquet"]))
    field = draw(_FIELDS)
    value = draw(_JSON)
    junk = draw(st.binary(max_size=64))
    target = draw(st.sampled_from(["/dev/zero", "/etc/hostname", "shard-00000.parquet", "../x"]))

    def apply(out: Path) -> None:
        record = _record(out, 1)
        if kind == "set":
            _set_record(out, 1, record | {field: value})
        elif kind == "delete":
            record.pop(field, None)
            _set_record(out, 1, record)
        elif kind == "bump":
            _set_record(out, 1, record | {field: record[field] + 1 if type(record.get(field)) is int else 1})
        elif kind == "bytes":
            (out / "shard-00001.json").write_bytes(junk)
        elif kind == "digest":
            _set_record(out, 1, record | {"sha256": _sha(out / "shard-00000.parquet")})
        else:
            _replace(
                out / "shard-00001.parquet",
                lambda p: p.symlink_to(target) if target != "../x" else p.write_bytes(junk + b"PAR1"),
            )

    return apply


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=_mutation())
def test_generated_mutations_are_made_again(made: dict[str, Any], tmp_path_factory: Any, mutation: Any) -> None:
    """Whatever a record or file says, the resume ends with a fresh run's files, or (a no-op change) keeps it."""
    source, out = _copy(made, tmp_path_factory.mktemp("gen"))
    mutation(out)
    seen: list[Progress] = []
    try:
        manifest = run_batch(source, out, OPTS, resume=True, on_progress=seen.append)
    except CtxlockError as exc:  # a refusal must be one typed error, and leave no manifest
        assert isinstance(exc, InputError) and not (out / "manifest.json").exists()
        return
    assert manifest == made["manifest"] and _tree(out) == made["tree"]
    assert set(seen[-1].remade) <= {1} and seen[-1].shards_kept >= SHARDS - 1


# -- the CLI, in a subprocess: the hang and memory cases ---------------------------------------------------------


# The CLI, with the process's own peak RSS (KiB) printed last on stderr when it exits.
_MEASURED = (
    "import atexit, resource, sys\n"
    "atexit.register(lambda: print('maxrss', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr))\n"
    "from ctxlock.cli import main\n"
    "main(sys.argv[1:])\n"
)


def _address_space_guard() -> None:
    """The child's address space capped at 8 GiB: a guard for the machine (a read of /dev/zero), not the measure."""
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def _cli(args: list[str]) -> tuple[int, str, int]:
    """`ctxlock batch ...` in a subprocess (the timeout only guards against a hang): its exit status, its stderr
    and its peak RSS in KiB."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cmd = [sys.executable, "-c", _MEASURED, "batch", *args, "-m", "book", "--shard-rows", "4"]
    done = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=120, check=False, preexec_fn=_address_space_guard
    )
    *lines, last = done.stderr.splitlines()
    assert last.startswith("maxrss "), done.stderr
    return done.returncode, "".join(line + "\n" for line in lines), int(last.split()[1])


def test_cli_resume_over_fifos_devices_and_links(made: dict[str, Any], tmp_path: Path) -> None:
    """The cases that hung or ended in a MemoryError traceback: exit 0, one note line naming each shard made again,
    the fresh run's files, and no more memory than a fresh run plus the record bound."""
    code, err, fresh_rss = _cli([str(made["source"]), str(tmp_path / "fresh")])
    assert code == 0, err
    source, out = _copy(made, tmp_path / "h")
    _replace(out / "shard-00000.parquet", lambda p: p.symlink_to("/dev/zero"))
    _replace(out / "shard-00001.parquet", os.mkfifo)
    _replace(out / "shard-00002.json", lambda p: p.symlink_to("/dev/zero"))
    _edit(out, 3, file="/dev/zero")
    os.truncate(out / "shard-00004.json", (64 << 20) + 10)
    code, err, rss = _cli([str(source), str(out), "--resume"])
    assert code == 0 and "Traceback" not in err, err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "kept 1 of 6 shards" in notes[0] and "made 5 started shards again" in notes[0]
    assert _tree(out) == _tree(tmp_path / "fresh")
    assert rss <= fresh_rss + (64 + 96) * 1024, (rss, fresh_rss)
