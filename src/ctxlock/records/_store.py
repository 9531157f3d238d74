"""The I/O edge of ctxlock: a SQLite store of execution records and a content-addressed artifact store.

    <root>/records.db                  SQLite (WAL): one row per record, the canonical bytes plus a few index columns
    <root>/artifacts/<aa>/<sha256>     immutable blobs (templates, tokenizer files), named by their content digest
    <root>/artifacts/.tmp/             where blobs are written before the atomic rename into place

Records are opaque here: a record is its canonical JSON bytes (one line, ending in "\\n") and its id is the sha256
of those bytes. The index columns (model, digests, token count, format) are passed in by ctxlock.records, never parsed
from the body, so this module does not depend on the record format.

The schema evolves by numbered migrations, as in simonw/llm: `m001_initial`, `m002_indexes`, ... run in order, each
once, in its own write transaction, and each applied name is recorded in `_migrations`.

The artifact blobs are `BlobStore`'s (blobs.py); `Store` puts and gets them under its own names (`put_artifact`, ...).

Root: `Store(root)`, else `$CTXLOCK_DATA_DIR`, else `$XDG_DATA_HOME/ctxlock`, else `~/.local/share/ctxlock`.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError, CtxlockError, RecordFormatError
from ctxlock.records._blobs import ArtifactStaging, BlobStore

__all__ = [
    "INDEX_FIELDS",
    "MAX_RECORD_BYTES",
    "MIGRATIONS",
    "ArtifactStaging",
    "BlobStore",
    "Store",
    "default_store_path",
    "max_record_bytes",
    "migrate",
]

# The index columns a record may carry; everything else about a record lives only in its body.
INDEX_FIELDS: tuple[str, ...] = ("format", "model", "template_sha256", "tokenizer_sha256", "input_tokens")

# How long a writer waits for another process's write transaction before giving up.
BUSY_TIMEOUT_S = 30.0

# The largest record (one canonical JSON line) the store keeps, a record file holds or an import line may be: a
# million-token run records well under 100 MB, and a bound keeps a hostile file or /dev/zero from exhausting memory.
# $CTXLOCK_MAX_RECORD_BYTES overrides it.
MAX_RECORD_BYTES = 256 << 20
MAX_RECORD_BYTES_ENV = "CTXLOCK_MAX_RECORD_BYTES"

# A record id prefix shorter than this is too likely to be ambiguous to be worth looking up (git uses 7).
MIN_PREFIX_LEN = 8

_HEX_PREFIX = re.compile(r"[0-9a-f]{1,64}")

# Connections a forked child inherited from its parent. They are kept referenced, never used or closed: closing
# one in the child could touch the parent's locks and WAL state (SQLite: "do not carry a connection across fork").
_INHERITED_CONNECTIONS: list[sqlite3.Connection] = []


def default_store_path() -> Path:
    """`$CTXLOCK_DATA_DIR`, else `$XDG_DATA_HOME/ctxlock`, else `~/.local/share/ctxlock` (empty variables are unset)."""
    if os.environ.get("CTXLOCK_DATA_DIR"):
        return Path(os.environ["CTXLOCK_DATA_DIR"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "ctxlock"


def byte_limit(env: str, default: int) -> int:
    """A size limit in bytes read from the environment variable `env` (a positive integer), else `default`."""
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise CtxlockError(
            f"not a positive number of bytes: {raw!r}",
            path=env,
            hint=f"set it to a byte count such as {default}, or unset it",
        )
    return value


def max_record_bytes() -> int:
    """The record size limit in bytes: `$CTXLOCK_MAX_RECORD_BYTES` if set, else MAX_RECORD_BYTES."""
    return byte_limit(MAX_RECORD_BYTES_ENV, MAX_RECORD_BYTES)


def _over_limit(limit: int, *, what: str, path: str) -> RecordFormatError:
    return RecordFormatError(
        f"{what} is longer than the {limit:,}-byte record limit",
        path=path,
        hint=f"a record is one line of canonical JSON; set {MAX_RECORD_BYTES_ENV} to allow bigger ones",
    )


# ---------------------------------------------------------------------------------------------- migrations

MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = []


def _migration(fn: Callable[[sqlite3.Connection], None]) -> Callable[[sqlite3.Connection], None]:
    MIGRATIONS.append(fn)
    return fn


@_migration
def m001_initial(db: sqlite3.Connection) -> None:
    db.execute(
        """CREATE TABLE records (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    format TEXT,
    model TEXT,
    template_sha256 TEXT,
    tokenizer_sha256 TEXT,
    input_tokens INTEGER,
    body BLOB NOT NULL
)"""
    )


@_migration
def m002_indexes(db: sqlite3.Connection) -> None:
    db.execute("CREATE INDEX idx_records_created_at ON records (created_at)")
    # (model, created_at) serves both `WHERE model = ?` and its newest-first order.
    db.execute("CREATE INDEX idx_records_model ON records (model, created_at)")


_MIGRATIONS_TABLE = """CREATE TABLE IF NOT EXISTS _migrations (
    name TEXT PRIMARY KEY,
    applied_at TEXT NOT NULL
)"""


def migrate(db: sqlite3.Connection) -> list[str]:
    """Apply the migrations `db` has not seen, in order; returns the names applied now.

    `db` must be in autocommit mode (`isolation_level=None`). Each migration runs in its own `BEGIN IMMEDIATE`
    transaction and re-checks `_migrations` after taking the write lock, so processes that open a fresh store at
    the same moment apply each migration exactly once.
    """
    has_table = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_migrations'").fetchall()
    done = {row[0] for row in db.execute("SELECT name FROM _migrations").fetchall()} if has_table else set()
    if all(fn.__name__ in done for fn in MIGRATIONS):
        return []  # the common case takes no write lock
    _in_write_transaction(db, lambda: db.execute(_MIGRATIONS_TABLE))
    applied: list[str] = []
    for fn in MIGRATIONS:
        if fn.__name__ in done:
            continue

        def apply(fn: Callable[[sqlite3.Connection], None] = fn) -> None:
            if db.execute("SELECT 1 FROM _migrations WHERE name = ?", (fn.__name__,)).fetchall():
                return  # another process applied it while we waited for the lock
            fn(db)
            db.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (fn.__name__, _utc_now()))
            applied.append(fn.__name__)

        _in_write_transaction(db, apply)
    return applied


def _in_write_transaction(db: sqlite3.Connection, body: Callable[[], object]) -> None:
    db.execute("BEGIN IMMEDIATE")
    try:
        body()
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _utc_now() -> str:
    # Fixed width (microseconds, +00:00), so text order is time order.
    return datetime.now(UTC).isoformat(timespec="microseconds")


# --------------------------------------------------------------------------------------------------- store


class Store:
    """Execution records in `<root>/records.db` and the artifacts they reference under `<root>/artifacts/`.

    Safe to use from many processes at once. The root and the schema are created on first use. Each thread gets
    its own SQLite connection, kept open until `close()` (or the end of a `with Store(...) as store:` block): a
    connection per operation would checkpoint and delete the WAL file at every close, about 5x slower per record.
    A child process after `fork` opens its own connections and leaves the parent's alone.
    """

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_store_path()
        self.db_path = self.root / "records.db"
        self.artifacts_dir = self.root / "artifacts"
        self.blobs = BlobStore(self.artifacts_dir)
        self._ready = False
        self._lock = threading.Lock()
        self._local = threading.local()
        self._connections: list[tuple[threading.Thread, sqlite3.Connection]] = []
        self._pid = os.getpid()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection this Store opened (in any thread). The Store stays usable and reconnects."""
        if self._pid != os.getpid():
            return
        with self._lock:
            connections, self._connections = self._connections, []
            self._local = threading.local()
        for _, db in connections:
            db.close()

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # ------------------------------------------------------------------------------------------- records

    def put_record(self, body: bytes, *, index: Mapping[str, str | int | None]) -> str:
        """Store a record's canonical bytes; returns its id, `sha256(body)`. Idempotent: the same bytes are one row."""
        body = _record_body(body, path="body")
        columns = _index_columns(index, path="index")
        record_id = hashlib.sha256(body).hexdigest()
        with self._write() as db:
            self._insert(db, record_id, body, columns)
        return record_id

    def get_record(self, record_id: str) -> bytes:
        """The canonical bytes of the record with this id, or with this unique id prefix (at least 8 hex chars)."""
        _, body = self._lookup(record_id)
        return body

    def list_records(self, *, limit: int = 50, model: str | None = None) -> list[dict]:
        """The newest `limit` records (optionally of one model), newest first: id, created_at and the index fields."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise CtxlockError(f"limit must be a non-negative int, got {limit!r}", path="limit")
        columns = ", ".join(("id", "created_at", *INDEX_FIELDS))
        sql = f"SELECT {columns} FROM records"
        params: list[object] = []
        if model is not None:
            sql += " WHERE model = ?"
            params.append(model)
        sql += " ORDER BY created_at DESC, rowid DESC LIMIT ?"
        params.append(limit)
        with self._connect() as db:
            cursor = db.execute(sql, params)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor]

    def export_records(self, ids: Iterable[str] | None, out: BinaryIO) -> int:
        """Write records as JSON lines (each record's canonical bytes, one per line); returns how many.

        `ids=None` exports every record, oldest first, so an import keeps their order. Otherwise every id (or unique
        prefix) is resolved before anything is written, so an unknown id writes nothing.
        """
        count = 0
        if ids is None:
            # One SELECT reads one snapshot, even while other processes write; closing the cursor ends it, so a
            # failed write to `out` leaves no read transaction open on this thread's connection.
            with (
                self._connect() as db,
                closing(db.execute("SELECT body FROM records ORDER BY created_at, rowid")) as rows,
            ):
                for (body,) in rows:
                    out.write(body)
                    count += 1
            return count
        if isinstance(ids, str):
            raise CtxlockError("ids must be a list of record ids, not one string", path="ids", hint="pass [record_id]")
        bodies: dict[str, bytes] = {}
        for record_id in ids:
            full_id, body = self._lookup(record_id)
            bodies.setdefault(full_id, body)
        for body in bodies.values():
            out.write(body)
            count += 1
        return count

    def import_records(self, source: BinaryIO, *, validate: Callable[[bytes], Mapping]) -> list[str]:
        """Import JSON lines written by `export_records`; returns the id of each line, in order.

        `validate(line)` parses and checks one record and returns its index fields; its error is re-raised with
        `path` naming the line (`line 3`). All lines are validated before the single write transaction that inserts
        them, so a corrupt or truncated line imports nothing. A line is read at most `max_record_bytes()` + 1 bytes
        at a time, so a line over the limit (or an endless one, /dev/zero) is a RecordFormatError, not a hang.
        """
        limit = max_record_bytes()
        rows: list[tuple[str, bytes, tuple[str | int | None, ...]]] = []
        number = 0
        while line := source.readline(limit + 1):
            number += 1
            where = f"line {number}"
            if len(line) > limit:
                raise _over_limit(limit, what="the line", path=where)
            if not line.strip():
                continue  # a blank line holds no record
            if not line.endswith(b"\n"):
                raise ArtifactFormatError(
                    "record is truncated: the last line has no trailing newline",
                    path=where,
                    hint="every exported record ends in a newline; re-export the file",
                )
            try:
                index = validate(line)
                body = _record_body(line, path="body")
                columns = _index_columns(index, path="index")
            except CtxlockError as exc:
                located = _at_line(exc, where)
                if located is exc:
                    raise
                raise located from exc
            except ValueError as exc:  # a validate callable that lets json.JSONDecodeError or similar escape
                raise ArtifactFormatError(f"invalid record: {exc}", path=where) from exc
            rows.append((hashlib.sha256(body).hexdigest(), body, columns))
        with self._write() as db:
            for record_id, body, columns in rows:
                self._insert(db, record_id, body, columns)
        return [record_id for record_id, _, _ in rows]

    def put_records(self, items: Iterable[tuple[bytes, Mapping[str, str | int | None]]]) -> list[str]:
        """Store several records (canonical bytes and index fields) in one write transaction: all or none."""
        rows = []
        for n, (body, index) in enumerate(items):
            body = _record_body(body, path=f"records[{n}]")
            rows.append((hashlib.sha256(body).hexdigest(), body, _index_columns(index, path=f"records[{n}].index")))
        with self._write() as db:
            for record_id, body, columns in rows:
                self._insert(db, record_id, body, columns)
        return [record_id for record_id, _, _ in rows]

    # ----------------------------------------------------------------------------------------- artifacts
    # The blobs live in `BlobStore` (blobs.py); these are the Store's names for them.

    def put_artifact(self, data: bytes) -> str:
        """Store a blob once under its sha256; returns the digest. A stored blob of the wrong size is replaced."""
        return self.blobs.put(data)

    def put_artifact_file(self, path: Path | str) -> str:
        """Store a file (GGUF files run to GBs) by hashing it while copying to a temporary file; returns the digest."""
        return self.blobs.put_file(path)

    def get_artifact_path(self, sha256: str) -> Path:
        """The path of a stored blob; its content is hashed on first use in this process to catch corruption."""
        return self.blobs.get_path(sha256)

    def has_artifact(self, sha256: str) -> bool:
        return self.blobs.has(sha256)

    def staging(self) -> AbstractContextManager[ArtifactStaging]:
        """Blobs copied in from a stream are held in temporary files and installed together when the block ends
        without an error; on an error none is installed and every temporary file is removed."""
        return self.blobs.staging()

    # ----------------------------------------------------------------------------------------- internals

    def _lookup(self, record_id: str) -> tuple[str, bytes]:
        prefix = record_id.lower() if isinstance(record_id, str) else ""
        if not _HEX_PREFIX.fullmatch(prefix):
            raise ArtifactFormatError(
                f"not a record id: {record_id!r}", path="record_id", hint="pass the sha256 hex id or a prefix of it"
            )
        if len(prefix) < MIN_PREFIX_LEN:
            raise ArtifactNotFoundError(
                f"record id prefix {prefix!r} is too short",
                path="record_id",
                hint=f"pass at least {MIN_PREFIX_LEN} hex characters of the id",
            )
        with self._connect() as db:
            if len(prefix) == 64:
                rows = db.execute("SELECT id, body FROM records WHERE id = ?", (prefix,)).fetchall()
            else:
                # A range scan on the primary key: hex ids starting with `prefix` sort in [prefix, prefix + "g").
                rows = db.execute(
                    "SELECT id, body FROM records WHERE id >= ? AND id < ? ORDER BY id LIMIT 3", (prefix, prefix + "g")
                ).fetchall()
        if not rows:
            raise ArtifactNotFoundError(
                f"no record with id {prefix}",
                path=str(self.db_path),
                hint="`ctxlock records list` shows the stored ids (Store.list_records() in Python)",
            )
        if len(rows) > 1:
            shown = ", ".join(row[0] for row in rows[:2]) + (", ..." if len(rows) > 2 else "")
            raise ArtifactNotFoundError(
                f"record id prefix {prefix} is ambiguous: it matches {shown}",
                path="record_id",
                hint="pass more characters of the id",
            )
        full_id, body = rows[0]
        if hashlib.sha256(body).hexdigest() != full_id:
            raise ArtifactFormatError(
                f"record {full_id} is corrupt: its body does not hash to its id",
                path=str(self.db_path),
                hint="re-import the record from an export",
            )
        return full_id, bytes(body)

    @staticmethod
    def _insert(db: sqlite3.Connection, record_id: str, body: bytes, columns: tuple[str | int | None, ...]) -> None:
        # created_at is taken after BEGIN IMMEDIATE holds the write lock, so it follows commit order.
        placeholders = ", ".join("?" * (3 + len(INDEX_FIELDS)))
        db.execute(
            f"INSERT OR IGNORE INTO records (id, created_at, body, {', '.join(INDEX_FIELDS)}) VALUES ({placeholders})",
            (record_id, _utc_now(), body, *columns),
        )

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection; the first one creates the root, switches to WAL and applies migrations."""
        if self._pid != os.getpid():
            # Forked: the parent's connections stay with the parent; this process opens its own.
            _INHERITED_CONNECTIONS.extend(db for _, db in self._connections)
            self._lock = threading.Lock()
            self._local = threading.local()
            self._connections = []
            self._pid = os.getpid()
        db = getattr(self._local, "db", None)
        if db is not None:
            return db
        with self._lock:
            # Close the connections of threads that have ended, so a server's short-lived threads do not pile up.
            alive = []
            for thread, old in self._connections:
                if thread.is_alive():
                    alive.append((thread, old))
                else:
                    old.close()
            self._connections = alive
            if not self._ready:
                try:
                    self.root.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise CtxlockError(
                        f"cannot create the store directory: {exc.strerror}", path=str(self.root)
                    ) from exc
            try:
                # Autocommit mode: transactions are our explicit BEGIN IMMEDIATE ... COMMIT. check_same_thread is
                # off only so that close() may close other threads' connections; each is used by one thread.
                db = sqlite3.connect(
                    self.db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
                )
            except sqlite3.Error as exc:
                raise self._error(exc) from exc
            try:
                # WAL + synchronous=FULL. WAL alone makes a kill -9 at any point lose no committed transaction and
                # corrupt nothing: COMMIT returns after the frames are in the WAL file, and recovery ignores a torn
                # tail. NORMAL would be enough for process crashes, but it skips the fsync at commit, so a power
                # loss or OS crash could roll back records after put_record returned. A record is written about
                # once per model call, so one fsync per commit (~4 ms) is noise, and "returned" means "on disk".
                db.execute("PRAGMA synchronous=FULL")
                if not self._ready:
                    _enable_wal(db)
                    migrate(db)
                    self._ready = True
            except BaseException as exc:
                db.close()
                if isinstance(exc, sqlite3.Error):
                    raise self._error(exc) from exc
                raise
            self._connections.append((threading.current_thread(), db))
        self._local.db = db
        return db

    def _error(self, exc: sqlite3.Error) -> CtxlockError:
        locked = isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
        return CtxlockError(
            f"record store error: {exc}",
            path=str(self.db_path),
            hint=f"another process held the write lock for over {BUSY_TIMEOUT_S:.0f} s; retry" if locked else None,
        )

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection; sqlite errors inside the block become ctxlock errors naming the database."""
        db = self._connection()
        try:
            yield db
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE takes the write lock up front (waiting up to the busy timeout),
        so a transaction never fails halfway with SQLITE_BUSY when it upgrades from reading to writing."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                # The connection outlives this call, so it must never be left inside a transaction.
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise


def _enable_wal(db: sqlite3.Connection) -> None:
    # journal_mode is stored in the database file; switching needs a moment with no other connection, so a
    # process racing another one on a fresh store retries until the busy timeout.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal":
                return
            if db.execute("PRAGMA journal_mode=WAL").fetchall()[0][0] == "wal":
                return
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise CtxlockError("cannot switch the record store to WAL mode", hint="is it on a network filesystem?")
        time.sleep(0.05)


def _record_body(body: object, *, path: str) -> bytes:
    if not isinstance(body, bytes | bytearray | memoryview):
        raise ArtifactFormatError(
            f"record body must be bytes, got {type(body).__name__}",
            path=path,
            hint="encode the canonical JSON as UTF-8",
        )
    body = bytes(body)
    limit = max_record_bytes()
    if len(body) > limit:
        # What the store keeps, an export writes and an import must read back.
        raise _over_limit(limit, what="the record", path=path)
    # Export writes one record per line, so a body must be exactly one line with its newline.
    if not body.endswith(b"\n") or body.count(b"\n") != 1:
        raise ArtifactFormatError(
            "record body must be one line of canonical JSON ending in a single newline",
            path=path,
            hint="serialize the record canonically (record.py) before storing it",
        )
    return body


def _index_columns(index: object, *, path: str) -> tuple[str | int | None, ...]:
    if not isinstance(index, Mapping):
        raise ArtifactFormatError(f"record index must be a mapping, got {type(index).__name__}", path=path)
    unknown = sorted(set(index) - set(INDEX_FIELDS))
    if unknown:
        raise ArtifactFormatError(
            f"unknown index field {unknown[0]!r}", path=f"{path}.{unknown[0]}", hint=f"use {', '.join(INDEX_FIELDS)}"
        )
    columns: list[str | int | None] = []
    for name in INDEX_FIELDS:
        value = index.get(name)
        expected = int if name == "input_tokens" else str
        if value is not None and (isinstance(value, bool) or not isinstance(value, expected)):
            raise ArtifactFormatError(
                f"index field {name!r} must be {expected.__name__} or None, got {type(value).__name__}",
                path=f"{path}.{name}",
            )
        columns.append(value)
    return tuple(columns)


def _at_line(exc: CtxlockError, where: str) -> CtxlockError:
    """The same error, with `path` prefixed by the line it came from."""
    path = f"{where}, {exc.path}" if exc.path else where
    try:
        return type(exc)(exc.message, path=path, hint=exc.hint)
    except TypeError:  # a subclass with its own constructor: annotate the original instead
        exc.path = path
        return exc
