"""The record and artifact store: schema and migrations, record round trips, real concurrent writers, kill -9.

Concurrency and crash tests run real Python processes (tests/store_helpers/store_worker.py) against a real
SQLite file; nothing is mocked.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import multiprocessing
import os
import queue
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError, CtxlockError
from ctxlock.records._store import MIGRATIONS, Store, default_store_path, m001_initial, migrate
from hypothesis_profiles import examples
from store_helpers.store_worker import make_artifact, make_record, record_index

WORKER = Path(__file__).resolve().parents[1] / "store_helpers" / "store_worker.py"


class RecordFormatError(CtxlockError):
    """What record.py's validator raises, as far as these tests are concerned."""


def validate(line: bytes) -> dict:
    """A stand-in for record.py's validator: parse one line, require "format", return the index fields."""
    try:
        obj = json.loads(line)
    except UnicodeDecodeError as exc:
        raise RecordFormatError(f"not UTF-8: {exc.reason}", path=f"byte {exc.start}") from exc
    except ValueError as exc:
        raise RecordFormatError(f"not JSON: {exc.msg}", path=f"$ (char {exc.pos})") from exc
    if not isinstance(obj, dict) or "format" not in obj:
        raise RecordFormatError("missing key 'format'", path="$.format", hint="is this a ctxlock record?")
    return {"format": obj["format"], "model": obj.get("model"), "input_tokens": obj.get("input_tokens")}


def put(store: Store, tag: str, n: int) -> str:
    body = make_record(tag, n)
    return store.put_record(body, index=record_index(body))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "store") as s:
        yield s


def run_worker(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def integrity(db_path: Path) -> list[tuple]:
    with closing(sqlite3.connect(db_path)) as db:
        return db.execute("PRAGMA integrity_check").fetchall()


def blobs(store: Store) -> list[Path]:
    return sorted(p for p in store.artifacts_dir.rglob("*") if p.is_file() and ".tmp" not in p.parts)


# ------------------------------------------------------------------------------------------ schema

EXPECTED_SCHEMA = """\
CREATE TABLE _migrations (
    name TEXT PRIMARY KEY,
    applied_at TEXT NOT NULL
)
CREATE TABLE records (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    format TEXT,
    model TEXT,
    template_sha256 TEXT,
    tokenizer_sha256 TEXT,
    input_tokens INTEGER,
    body BLOB NOT NULL
)
CREATE INDEX idx_records_created_at ON records (created_at)
CREATE INDEX idx_records_model ON records (model, created_at)"""


def schema(db_path: Path) -> str:
    with closing(sqlite3.connect(db_path)) as db:
        rows = db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid").fetchall()
    return "\n".join(sql for (sql,) in rows)


def applied_migrations(db_path: Path) -> list[str]:
    with closing(sqlite3.connect(db_path)) as db:
        return [name for (name,) in db.execute("SELECT name FROM _migrations ORDER BY rowid")]


def test_schema_after_migrations(store: Store) -> None:
    store.list_records()  # first use creates the database
    assert schema(store.db_path) == EXPECTED_SCHEMA
    assert applied_migrations(store.db_path) == ["m001_initial", "m002_indexes"]
    assert [fn.__name__ for fn in MIGRATIONS] == ["m001_initial", "m002_indexes"]


def test_migrations_are_idempotent(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with Store(root) as first:
        record_id = put(first, "a", 1)
    with Store(root) as second:
        assert second.get_record(record_id) == make_record("a", 1)
    with closing(sqlite3.connect(root / "records.db", isolation_level=None)) as db:
        assert migrate(db) == []
    assert schema(root / "records.db") == EXPECTED_SCHEMA
    assert applied_migrations(root / "records.db") == ["m001_initial", "m002_indexes"]


def test_upgrade_applies_only_pending_migrations(tmp_path: Path) -> None:
    # A store written by a version that knew only m001: opening it applies m002 and keeps the data.
    root = tmp_path / "store"
    root.mkdir()
    with closing(sqlite3.connect(root / "records.db", isolation_level=None)) as db:
        db.execute("CREATE TABLE _migrations (\n    name TEXT PRIMARY KEY,\n    applied_at TEXT NOT NULL\n)")
        m001_initial(db)
        db.execute("INSERT INTO _migrations VALUES ('m001_initial', '2025-01-01T00:00:00.000000+00:00')")
        body = make_record("old", 0)
        db.execute(
            "INSERT INTO records (id, created_at, body) VALUES (?, '2025-01-01T00:00:00.000000+00:00', ?)",
            (hashlib.sha256(body).hexdigest(), body),
        )
    with Store(root) as store:
        assert store.get_record(hashlib.sha256(body).hexdigest()) == body
    assert schema(root / "records.db") == EXPECTED_SCHEMA
    assert applied_migrations(root / "records.db") == ["m001_initial", "m002_indexes"]


def test_pragmas(store: Store) -> None:
    store.list_records()
    db = store._connection()
    assert db.execute("PRAGMA journal_mode").fetchall() == [("wal",)]
    assert db.execute("PRAGMA synchronous").fetchall() == [(2,)]  # FULL
    assert db.execute("PRAGMA busy_timeout").fetchall() == [(30000,)]


def test_default_store_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CTXLOCK_DATA_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_store_path() == tmp_path / "explicit"
    monkeypatch.setenv("CTXLOCK_DATA_DIR", "")
    assert default_store_path() == tmp_path / "xdg" / "ctxlock"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store_path() == tmp_path / "home" / ".local" / "share" / "ctxlock"
    assert Store().root == default_store_path()
    assert not (tmp_path / "home").exists()  # created on first use, not on construction


# ------------------------------------------------------------------------------------------ records


def test_put_get_list(store: Store) -> None:
    body = make_record("a", 7)
    index = {"model": "qwen2", "template_sha256": "t" * 64, "tokenizer_sha256": "k" * 64, "input_tokens": 12}
    record_id = store.put_record(body, index={**index, "format": "ctxlock.record/1"})
    assert record_id == hashlib.sha256(body).hexdigest()
    assert store.get_record(record_id) == body
    assert store.get_record(record_id[:8]) == body
    assert store.get_record(record_id[:20].upper()) == body
    [row] = store.list_records()
    assert row == {"id": record_id, "created_at": row["created_at"], "format": "ctxlock.record/1", **index}
    assert row["created_at"].endswith("+00:00")


def test_put_is_idempotent(store: Store) -> None:
    first = put(store, "a", 1)
    [before] = store.list_records()
    assert put(store, "a", 1) == first
    assert store.list_records() == [before]  # no second row, and the first keeps its created_at


def test_list_newest_first_limit_and_model(store: Store) -> None:
    ids = [put(store, "a" if n % 2 else "b", n) for n in range(10)]
    assert [r["id"] for r in store.list_records()] == ids[::-1]
    assert [r["id"] for r in store.list_records(limit=3)] == ids[::-1][:3]
    assert [r["id"] for r in store.list_records(model="model-a")] == ids[1::2][::-1]
    assert store.list_records(model="nope") == []
    assert store.list_records(limit=0) == []
    with pytest.raises(CtxlockError, match="limit"):
        store.list_records(limit=-1)


def test_lookup_errors(store: Store) -> None:
    record_id = put(store, "a", 1)
    missing = "0" * 64 if not record_id.startswith("0") else "f" * 64
    with pytest.raises(ArtifactNotFoundError, match="no record with id"):
        store.get_record(missing)
    with pytest.raises(ArtifactNotFoundError, match="no record with id"):
        store.get_record(missing[:8])
    with pytest.raises(ArtifactNotFoundError, match="too short") as short:
        store.get_record(record_id[:7])
    assert "at least 8 hex characters" in str(short.value)
    with pytest.raises(ArtifactFormatError, match="not a record id"):
        store.get_record("not-hex!")
    with pytest.raises(ArtifactFormatError, match="not a record id"):
        store.get_record(record_id + "0")  # 65 characters


def colliding_records() -> tuple[bytes, bytes]:
    """Two record bodies whose ids share their first 8 hex digits (a birthday search, ~80k hashes)."""
    seen: dict[str, bytes] = {}
    for n in range(10_000_000):
        body = make_record("collide", n)
        prefix = hashlib.sha256(body).hexdigest()[:8]
        if prefix in seen:
            return seen[prefix], body
        seen[prefix] = body
    raise AssertionError("no collision")


def test_ambiguous_prefix(store: Store) -> None:
    a, b = colliding_records()
    id_a, id_b = store.put_record(a, index={}), store.put_record(b, index={})
    assert id_a[:8] == id_b[:8] and id_a != id_b
    with pytest.raises(ArtifactNotFoundError, match="ambiguous") as err:
        store.get_record(id_a[:8])
    assert id_a in str(err.value) and id_b in str(err.value)
    assert "more characters" in str(err.value)
    shared = next(i for i, (x, y) in enumerate(zip(id_a, id_b, strict=True)) if x != y)
    assert store.get_record(id_a[: shared + 1]) == a
    assert store.get_record(id_b) == b


@pytest.mark.parametrize(
    ("body", "index", "message"),
    [
        ("text", {}, "must be bytes"),
        (b'{"a":1}', {}, "single newline"),
        (b'{"a":\n1}\n', {}, "single newline"),
        (b'{"a":1}\n', {"colour": "red"}, "unknown index field 'colour'"),
        (b'{"a":1}\n', {"input_tokens": "12"}, "'input_tokens' must be int"),
        (b'{"a":1}\n', {"input_tokens": True}, "'input_tokens' must be int"),
        (b'{"a":1}\n', {"model": 3}, "'model' must be str"),
    ],
)
def test_put_record_rejects(store: Store, body: object, index: dict, message: str) -> None:
    with pytest.raises(ArtifactFormatError, match=message):
        store.put_record(body, index=index)  # type: ignore[arg-type]
    assert store.list_records() == []


def test_export_import_round_trip(tmp_path: Path) -> None:
    with Store(tmp_path / "a") as a, Store(tmp_path / "b") as b:
        ids = [put(a, f"w{n % 3}", n) for n in range(30)]
        exported = io.BytesIO()
        assert a.export_records(None, exported) == 30
        assert exported.getvalue() == b"".join(make_record(f"w{n % 3}", n) for n in range(30))

        assert b.import_records(io.BytesIO(exported.getvalue()), validate=validate) == ids
        again = io.BytesIO()
        assert b.export_records(None, again) == 30
        assert again.getvalue() == exported.getvalue()
        for record_id in ids:
            assert b.get_record(record_id) == a.get_record(record_id)
        strip = [{k: v for k, v in row.items() if k != "created_at"} for row in a.list_records(limit=100)]
        assert [{k: v for k, v in row.items() if k != "created_at"} for row in b.list_records(limit=100)] == strip

        # Importing the same lines again adds nothing.
        assert b.import_records(io.BytesIO(exported.getvalue()), validate=validate) == ids
        assert len(b.list_records(limit=100)) == 30


def test_export_selected_ids(store: Store) -> None:
    ids = [put(store, "a", n) for n in range(5)]
    out = io.BytesIO()
    assert store.export_records([ids[3], ids[1][:10], ids[3]], out) == 2
    assert out.getvalue() == make_record("a", 3) + make_record("a", 1)
    out = io.BytesIO()
    with pytest.raises(ArtifactNotFoundError):
        store.export_records([ids[0], "ab" * 32], out)
    assert out.getvalue() == b""  # an unknown id writes nothing


@pytest.mark.parametrize(
    ("lines", "line_no", "message"),
    [
        # a record cut in the middle, followed by more records
        ([make_record("x", 0), make_record("x", 1)[:25] + b"\n", make_record("x", 2)], 2, "not JSON"),
        # the file cut in the middle of its last record
        ([make_record("x", 0), make_record("x", 1), make_record("x", 2)[:-9]], 3, "truncated"),
        # the file cut just before the last newline: valid JSON, but not the record's canonical bytes
        ([make_record("x", 0), make_record("x", 1)[:-1]], 2, "truncated"),
        # JSON, but not a record
        ([make_record("x", 0), b"\n", b'{"model":"m"}\n'], 3, "missing key 'format'"),
        # bytes that are not UTF-8
        ([make_record("x", 0), b'{"format":"\xff"}\n'], 2, "not UTF-8"),
    ],
)
def test_import_rejects_bad_line_and_imports_nothing(
    store: Store, lines: list[bytes], line_no: int, message: str
) -> None:
    with pytest.raises(CtxlockError, match=message) as err:
        store.import_records(io.BytesIO(b"".join(lines)), validate=validate)
    assert err.value.path is not None and err.value.path.split(",")[0] == f"line {line_no}"
    assert f"line {line_no}" in str(err.value)
    assert store.list_records() == []


def test_import_keeps_the_validators_error_type(store: Store) -> None:
    source = io.BytesIO(make_record("x", 0) + b'{"model":"m"}\n')
    with pytest.raises(RecordFormatError) as err:
        store.import_records(source, validate=validate)
    assert err.value.path == "line 2, $.format"
    assert err.value.hint == "is this a ctxlock record?"
    assert isinstance(err.value.__cause__, RecordFormatError)


def test_import_wraps_a_plain_value_error(store: Store) -> None:
    with pytest.raises(ArtifactFormatError) as err:
        store.import_records(io.BytesIO(b"{oops}\n"), validate=lambda line: json.loads(line))
    assert err.value.path == "line 1"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(st.characters(exclude_categories=("Cs",))),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=4), min_size=1, max_size=6))
def test_round_trip_property(objs: list[dict]) -> None:
    bodies = [
        json.dumps({**obj, "format": "ctxlock.record/1"}, sort_keys=True, ensure_ascii=False).encode() + b"\n"
        for obj in objs
    ]
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "a") as a, Store(Path(tmp) / "b") as b:
        ids = [a.put_record(body, index={"format": "ctxlock.record/1"}) for body in bodies]
        assert [a.get_record(i) for i in ids] == bodies
        exported = io.BytesIO()
        assert a.export_records(None, exported) == len(set(ids))
        assert sorted(set(b.import_records(io.BytesIO(exported.getvalue()), validate=validate))) == sorted(set(ids))
        again = io.BytesIO()
        b.export_records(None, again)
        assert again.getvalue() == exported.getvalue()


# --------------------------------------------------------------------------------- real processes


def test_two_processes_write_500_records_each(tmp_path: Path) -> None:
    root = tmp_path / "store"  # fresh: both workers race to create it and apply the migrations
    # A 1 ms pause after each put stands for the model call between records. Without it, a writer in a tight loop
    # re-takes the write lock microseconds after its commit, while SQLite's busy handler makes the other poll at
    # growing intervals: nothing is lost, but the writes run one process after the other instead of interleaving.
    workers = [run_worker("batch", str(root), tag, "500", "0.001", stdin=subprocess.PIPE) for tag in ("p", "q")]
    for proc in workers:
        assert proc.stdout.readline() == "ready\n"
    for proc in workers:  # release them together
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in workers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out == "done 500\n"
    with Store(root) as store:
        rows = store.list_records(limit=5000)
        assert len(rows) == 1000
        # The writers really overlapped: their records interleave in commit order.
        tags = [row["model"] for row in rows]
        assert sum(a != b for a, b in itertools.pairwise(tags)) > 10
        expected = {hashlib.sha256(make_record(t, n)).hexdigest(): make_record(t, n) for t in "pq" for n in range(500)}
        assert {row["id"] for row in rows} == set(expected)
        for record_id, body in expected.items():
            assert store.get_record(record_id) == body
    assert applied_migrations(root / "records.db") == ["m001_initial", "m002_indexes"]
    assert integrity(root / "records.db") == [("ok",)]


def read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def test_kill_9_loses_no_committed_record(tmp_path: Path) -> None:
    root = tmp_path / "store"
    rng = random.Random(9)
    started = time.monotonic()
    total_records = 0
    for round_no in range(20):
        proc = run_worker("loop", str(root), f"k{round_no}")
        lines: queue.Queue = queue.Queue()
        reader = threading.Thread(target=read_lines, args=(proc.stdout, lines), daemon=True)
        reader.start()
        try:
            assert lines.get(timeout=30) == "ready\n", proc.stderr.read()
            time.sleep(rng.uniform(0.05, 0.5))
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        reader.join(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        printed = []
        while (line := lines.get()) is not None:
            printed.append(line)

        # Only whole lines count: the kill may land in the middle of a print.
        committed = [line.split() for line in printed if line.endswith("\n")]
        assert integrity(root / "records.db") == [("ok",)]
        with Store(root) as store:
            for kind, digest, n in committed:
                if kind == "R":
                    assert store.get_record(digest) == make_record(f"k{round_no}", int(n))
                    total_records += 1
                else:
                    assert store.get_artifact_path(digest).read_bytes() == make_artifact(f"k{round_no}", int(n))
            assert len(store.list_records(limit=10**6)) >= total_records
    assert total_records > 20  # the writers did get to write between kills
    assert time.monotonic() - started < 60


# ---------------------------------------------------------------------------------------- artifacts


def test_put_artifact_once(store: Store) -> None:
    data = b"{{ messages }}"
    sha = store.put_artifact(data)
    assert sha == hashlib.sha256(data).hexdigest()
    assert store.put_artifact(bytearray(data)) == sha
    assert blobs(store) == [store.artifacts_dir / sha[:2] / sha]
    assert store.has_artifact(sha) and store.has_artifact(sha.upper())
    assert store.get_artifact_path(sha).read_bytes() == data
    assert list((store.artifacts_dir / ".tmp").iterdir()) == []


def test_put_artifact_file_streams_a_large_file(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "model.gguf"
    digest = hashlib.sha256()
    with src.open("wb") as fh:
        for _ in range(20):
            chunk = os.urandom(1 << 20)
            digest.update(chunk)
            fh.write(chunk)
    tracemalloc.start()
    try:
        sha = store.put_artifact_file(src)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sha == digest.hexdigest()
    assert peak < 4 << 20, f"put_artifact_file held {peak} bytes for a 20 MiB file"
    blob = store.get_artifact_path(sha)
    assert blob.stat().st_size == 20 << 20
    assert store.put_artifact_file(src) == sha
    assert blobs(store) == [blob]
    assert list((store.artifacts_dir / ".tmp").iterdir()) == []


def test_put_artifact_file_errors(store: Store, tmp_path: Path) -> None:
    with pytest.raises(ArtifactNotFoundError) as err:
        store.put_artifact_file(tmp_path / "missing.gguf")
    assert err.value.path == str(tmp_path / "missing.gguf")
    with pytest.raises(ArtifactFormatError, match="directory"):
        store.put_artifact_file(tmp_path)


def corrupt(blob: Path) -> None:
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))


def test_corrupt_blob_is_detected(store: Store) -> None:
    sha = store.put_artifact(b"tokenizer " * 1000)
    blob = store.artifacts_dir / sha[:2] / sha
    corrupt(blob)
    with pytest.raises(ArtifactFormatError, match="corrupt") as err:
        store.get_artifact_path(sha)
    assert err.value.path == str(blob)
    assert "store the artifact again" in str(err.value)


def test_blob_corrupted_after_verification_is_detected(store: Store) -> None:
    sha = store.put_artifact(b"template " * 1000)
    blob = store.get_artifact_path(sha)  # verified once
    assert store.get_artifact_path(sha) == blob
    corrupt(blob)
    os.utime(blob, ns=(1, 1))  # a rewrite changes mtime; pin it so the test does not depend on clock granularity
    with pytest.raises(ArtifactFormatError, match="corrupt"):
        store.get_artifact_path(sha)


def test_put_artifact_replaces_a_blob_of_the_wrong_size(store: Store) -> None:
    data = b"chat template"
    sha = store.put_artifact(data)
    blob = store.artifacts_dir / sha[:2] / sha
    blob.chmod(0o644)
    blob.write_bytes(data[:4])
    assert store.put_artifact(data) == sha
    assert store.get_artifact_path(sha).read_bytes() == data


def test_stale_temporary_blobs_are_removed(store: Store) -> None:
    # A writer killed between its copy and its rename leaves a temporary file; the next writer removes old ones.
    tmp_dir = store.artifacts_dir / ".tmp"
    tmp_dir.mkdir(parents=True)
    stale, fresh = tmp_dir / "blob-stale", tmp_dir / "blob-fresh"
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"in progress")
    os.utime(stale, (time.time() - 2 * 3600,) * 2)
    store.put_artifact(b"data")
    assert sorted(tmp_dir.iterdir()) == [fresh]


def test_threads_and_close(store: Store) -> None:
    ids = [put(store, "main", 0)]

    def write(n: int) -> None:
        ids.append(put(store, "thread", n))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r["id"] for r in store.list_records()}) == 9
    late = threading.Thread(target=write, args=(8,))
    late.start()
    late.join()
    # Opening a connection closes those of threads that have ended: only the main thread's and the last are left.
    assert {thread for thread, _ in store._connections} == {threading.main_thread(), late}
    store.close()
    assert store._connections == []
    assert sorted(r["id"] for r in store.list_records()) == sorted(ids)  # usable again after close()


def test_store_shared_across_fork(store: Store) -> None:
    first = put(store, "parent", 0)  # the parent has an open connection when it forks
    child = multiprocessing.get_context("fork").Process(target=lambda: (put(store, "child", 1), store.close()))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert store.get_record(first) == make_record("parent", 0)
    assert store.get_record(hashlib.sha256(make_record("child", 1)).hexdigest()) == make_record("child", 1)
    assert put(store, "parent", 2)
    assert integrity(store.db_path) == [("ok",)]


def test_artifact_lookup_errors(store: Store) -> None:
    with pytest.raises(ArtifactNotFoundError, match="not in the store"):
        store.get_artifact_path("ab" * 32)
    assert not store.has_artifact("ab" * 32)
    with pytest.raises(ArtifactFormatError, match="not a sha256"):
        store.get_artifact_path("abc")
    with pytest.raises(ArtifactFormatError, match="not a sha256"):
        store.has_artifact("../" * 20)


def test_concurrent_puts_of_one_blob(tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(8 << 20))
    root = tmp_path / "store"
    workers = [run_worker("artifact", str(root), str(src), "3", stdin=subprocess.PIPE) for _ in range(3)]
    for proc in workers:
        assert proc.stdout.readline() == "ready\n"
    for proc in workers:  # release them together
        proc.stdin.write("go\n")
        proc.stdin.flush()
    expected = hashlib.sha256(src.read_bytes()).hexdigest()
    for proc in workers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out == f"A {expected}\n"
    with Store(root) as store:
        assert blobs(store) == [store.artifacts_dir / expected[:2] / expected]
        assert store.get_artifact_path(expected).read_bytes() == src.read_bytes()
        assert list((store.artifacts_dir / ".tmp").iterdir()) == []
