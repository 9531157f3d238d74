"""Record bundles: one file that carries records and every artifact they name (templates, tokenizer files), so that a
record replays on a machine that never had its model directory. `ctxlock records export --bundle` writes one and
`ctxlock records import` reads one (it tells a bundle from JSON lines by the first line).

Format `ctxlock.bundle/1`:

    ctxlock.bundle/1\\n                                   the magic line
    {"entries":[...],"format":"ctxlock.bundle/1"}\\n       the header: one line of canonical JSON
    <bytes of entry 0><bytes of entry 1>...               each entry's bytes, in header order; nothing after

An entry is `{"kind": "record" | "artifact", "sha256": <64 hex>, "size": <bytes>}`. The records come first (a
record's sha256 is its id), then each artifact they name, once. An entry has no name, mode or link: a bundle holds
content only, so importing one writes rows and content-addressed blobs, never a path the bundle chose.

A bundle comes from anywhere, so import treats it as hostile data and checks everything before it stores anything:
the header is canonical JSON of exactly the keys above, within `MAX_HEADER_BYTES` and `MAX_ENTRIES`; the sizes add
up to the file's size and stay under `max_bundle_bytes()` ($CTXLOCK_MAX_BUNDLE_BYTES); every entry's bytes hash to
its declared sha256; every record parses and passes `record.check_replay` (the file names replay will write), and is
canonical; the artifacts are exactly the ones the records name, none missing and none extra. Artifacts are copied
into temporary files while hashed and installed only when every entry checked out; the records are then inserted in
one transaction. Any failure is a `BundleError` that names the entry, and leaves the store as it was. Nothing in a
bundle is run: import does not render, tokenize or replay.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from ctxlock.errors import ArtifactNotFoundError, BundleError, CtxlockError, RecordFormatError
from ctxlock.outside import loads_outside
from ctxlock.records import ExecutionRecord, canonical_bytes
from ctxlock.records._store import Store, byte_limit, max_record_bytes

__all__ = [
    "BUNDLE_FORMAT",
    "MAGIC",
    "MAX_BUNDLE_BYTES",
    "MAX_ENTRIES",
    "MAX_HEADER_BYTES",
    "BundlePlan",
    "BundleSummary",
    "import_bundle",
    "is_bundle",
    "max_bundle_bytes",
    "needed_artifacts",
    "prepare_bundle",
    "write_bundle",
]

BUNDLE_FORMAT = "ctxlock.bundle/1"
MAGIC = (BUNDLE_FORMAT + "\n").encode("ascii")
# A header entry takes about 110 bytes: 100,000 entries fit well inside 16 MiB.
MAX_HEADER_BYTES = 16 << 20
MAX_ENTRIES = 100_000
# A bundle carries whole tokenizer files, and a GGUF can be a whole model of tens of GB.
MAX_BUNDLE_BYTES = 64 << 30
MAX_BUNDLE_BYTES_ENV = "CTXLOCK_MAX_BUNDLE_BYTES"

_SHA256 = re.compile(r"[0-9a-f]{64}")
_ENTRY_KEYS = frozenset({"kind", "sha256", "size"})
_CHUNK = 1 << 20


def max_bundle_bytes() -> int:
    """The bundle size limit in bytes: `$CTXLOCK_MAX_BUNDLE_BYTES` if set, else MAX_BUNDLE_BYTES (64 GiB)."""
    return byte_limit(MAX_BUNDLE_BYTES_ENV, MAX_BUNDLE_BYTES)


def is_bundle(prefix: bytes) -> bool:
    """Whether a file that starts with `prefix` (its first len(MAGIC) bytes) is a bundle."""
    return prefix == MAGIC


@dataclass(frozen=True)
class BundleSummary:
    records: tuple[str, ...]
    artifacts: tuple[str, ...]
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"records": list(self.records), "artifacts": list(self.artifacts), "size": self.size}


def needed_artifacts(record: ExecutionRecord) -> dict[str, str]:
    """sha256 -> what the record uses it as (`template`, `file tokenizer.json`): every artifact replay reads."""
    rp = record.data["replay"]
    out: dict[str, str] = {}
    if rp.get("template_sha256"):
        out[rp["template_sha256"]] = "template"
    for name, sha in rp["files"].items():
        out.setdefault(sha, f"file {name}")
    return out


# ------------------------------------------------------------------------------------------------------ export


def _bodies(store: Store, ids: Iterable[str] | None) -> list[bytes]:
    if ids is not None and isinstance(ids, str):
        raise CtxlockError("ids must be a list of record ids, not one string", path="ids", hint="pass [record_id]")
    buf = io.BytesIO()
    store.export_records(None if ids is None else list(ids), buf)
    return buf.getvalue().splitlines(keepends=True)


@dataclass(frozen=True)
class BundlePlan:
    """What a bundle will hold, resolved and checked against the store before a byte of it is written."""

    records: tuple[ExecutionRecord, ...]
    artifacts: tuple[tuple[str, str, int], ...]  # (sha256, blob path, size)

    def write(self, out: BinaryIO) -> BundleSummary:
        entries = [{"kind": "record", "sha256": rec.id, "size": len(rec.body)} for rec in self.records]
        entries += [{"kind": "artifact", "sha256": sha, "size": size} for sha, _, size in self.artifacts]
        header = canonical_bytes({"format": BUNDLE_FORMAT, "entries": entries})
        out.write(MAGIC)
        out.write(header)
        total = len(MAGIC) + len(header)
        for rec in self.records:
            out.write(rec.body)
            total += len(rec.body)
        for _, path, size in self.artifacts:
            copied = 0
            with open(path, "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    out.write(chunk)
                    copied += len(chunk)
            if copied != size:
                raise BundleError(f"the artifact changed size while it was written ({size} then {copied})", path=path)
            total += size
        return BundleSummary(tuple(rec.id for rec in self.records), tuple(a[0] for a in self.artifacts), total)


def prepare_bundle(store: Store, ids: Iterable[str] | None) -> BundlePlan:
    """The records (all of them for `ids=None`, else each id or unique prefix) and every artifact they name, each
    artifact found in the store and checked against its digest: a record whose artifacts are missing is an error
    here, before anything is written."""
    records = [ExecutionRecord.from_bytes(body, source=f"record {_sha(body)[:12]}") for body in _bodies(store, ids)]
    artifacts: dict[str, tuple[str, str, int]] = {}
    for rec in records:
        for sha, role in needed_artifacts(rec).items():
            if sha in artifacts:
                continue
            try:
                path = store.get_artifact_path(sha)
            except ArtifactNotFoundError as exc:
                raise ArtifactNotFoundError(
                    f"record {rec.id[:12]} uses {role} (sha256 {sha[:12]}…), which this store does not hold",
                    path=exc.path,
                    hint="bundle the record from the store that recorded it (`ctxlock render --record` stores the "
                    "template and tokenizer files next to the record)",
                ) from None
            artifacts[sha] = (sha, str(path), path.stat().st_size)
    return BundlePlan(tuple(records), tuple(artifacts.values()))


def write_bundle(store: Store, ids: Iterable[str] | None, out: BinaryIO) -> BundleSummary:
    """`prepare_bundle(store, ids).write(out)`: one file with the records and every artifact they name."""
    return prepare_bundle(store, ids).write(out)


# ------------------------------------------------------------------------------------------------------ import


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_exact(source: BinaryIO, size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left > 0 and (chunk := source.read(min(left, _CHUNK))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


_NOT_A_BUNDLE = "export it again with `ctxlock records export --bundle ID -o FILE`"
_TAMPERED = "the bundle was altered or damaged in transit; export it again from the store that recorded it"


def _entry_label(label: str, n: int, entry: Mapping[str, Any]) -> str:
    return f"{label} entry {n} ({entry['kind']} {entry['sha256'][:12]}…)"


def _parse_header(line: bytes, *, label: str) -> list[dict[str, Any]]:
    where = f"{label} header"
    try:
        header = loads_outside(line, f"{where} $", error=BundleError)
    except BundleError as exc:
        raise BundleError(f"the header is not one line of JSON: {exc.message}", path=exc.path, hint=_TAMPERED) from None
    if not isinstance(header, dict) or set(header) != {"format", "entries"}:
        raise BundleError('the header must be {"format", "entries"} and nothing else', path=where, hint=_TAMPERED)
    if header["format"] != BUNDLE_FORMAT:
        raise BundleError(
            f"unknown bundle format {header['format']!r}", path=where, hint=f"this ctxlock reads {BUNDLE_FORMAT}"
        )
    try:
        canonical = canonical_bytes(header)
    except RecordFormatError:
        canonical = b""
    if canonical != line:
        # Refuses duplicate keys (JSON keeps the last one silently) and any other second spelling of a header.
        raise BundleError("the header is not canonical JSON", path=where, hint=_TAMPERED)
    entries = header["entries"]
    if not isinstance(entries, list) or not entries:
        raise BundleError("the header lists no entries", path=where, hint=_TAMPERED)
    if len(entries) > MAX_ENTRIES:
        raise BundleError(f"the header lists {len(entries):,} entries, over the {MAX_ENTRIES:,} limit", path=where)
    seen: dict[tuple[str, str], int] = {}
    in_artifacts = False
    for n, entry in enumerate(entries):
        at = f"{label} entry {n}"
        if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
            raise BundleError(
                "an entry is exactly {kind, sha256, size}: a bundle entry has no name, path, mode or link",
                path=at,
                hint=_TAMPERED,
            )
        kind, sha, size = entry["kind"], entry["sha256"], entry["size"]
        if kind not in ("record", "artifact"):
            raise BundleError(f"unknown entry kind {kind!r}", path=at, hint="an entry is a record or an artifact")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise BundleError("sha256 must be 64 lowercase hex digits", path=at, hint=_TAMPERED)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise BundleError("size must be a non-negative integer", path=at, hint=_TAMPERED)
        if kind == "artifact":
            in_artifacts = True
        elif in_artifacts:
            raise BundleError("a record entry after the artifacts: records come first", path=at, hint=_TAMPERED)
        if kind == "record" and size > max_record_bytes():
            raise BundleError(
                f"declares a {size:,}-byte record, over the {max_record_bytes():,}-byte record limit",
                path=_entry_label(label, n, entry),
                hint="set CTXLOCK_MAX_RECORD_BYTES to allow bigger records",
            )
        other = seen.setdefault((kind, sha), n)
        if other != n:
            raise BundleError(f"repeats entry {other}", path=_entry_label(label, n, entry), hint=_TAMPERED)
    if entries[0]["kind"] != "record":
        raise BundleError("the bundle holds no record", path=where, hint=_NOT_A_BUNDLE)
    return entries


def import_bundle(store: Store, source: BinaryIO, *, label: str = "bundle", size: int | None = None) -> list[str]:
    """Check a bundle (see the module docstring) and store its records and artifacts; returns the record ids.

    `size` is the bundle's length when known (a regular file): it must equal what the header declares."""
    entries = _read_header(source, label=label, size=size)
    records, needed = _read_records(source, entries, label=label)
    artifacts = _carried_artifacts(entries, needed, label=label)
    with store.staging() as staged:
        for n, entry in artifacts:
            at = _entry_label(label, n, entry)
            actual, got = staged.add(source, entry["size"], entry["sha256"])
            if got < entry["size"]:
                raise BundleError(f"truncated: {got:,} of {entry['size']:,} bytes", path=at, hint=_TAMPERED)
            if actual != entry["sha256"]:
                raise BundleError(
                    f"its bytes hash to {actual[:12]}…, not to its declared sha256", path=at, hint=_TAMPERED
                )
        if source.read(1):
            raise BundleError("bytes follow the last entry", path=label, hint=_TAMPERED)
    return store.put_records((rec.body, rec.index()) for rec in records)


def _read_header(source: BinaryIO, *, label: str, size: int | None) -> list[dict[str, Any]]:
    """The magic line and the header's entries, with the sizes checked against the limit and the file's size."""
    limit = max_bundle_bytes()
    if size is not None and size > limit:
        raise BundleError(
            f"the bundle is {size:,} bytes, over the {limit:,}-byte bundle limit",
            path=label,
            hint=f"set {MAX_BUNDLE_BYTES_ENV} to allow bigger bundles",
        )
    if not is_bundle(_read_exact(source, len(MAGIC))):
        raise BundleError(
            f"not a ctxlock bundle: it does not start with {BUNDLE_FORMAT!r}", path=label, hint=_NOT_A_BUNDLE
        )
    line = source.readline(MAX_HEADER_BYTES + 1)
    if len(line) > MAX_HEADER_BYTES:
        raise BundleError(
            f"the header is longer than {MAX_HEADER_BYTES:,} bytes", path=f"{label} header", hint=_TAMPERED
        )
    if not line.endswith(b"\n"):
        raise BundleError("the bundle ends inside its header", path=f"{label} header", hint=_TAMPERED)
    entries = _parse_header(line, label=label)
    declared = len(MAGIC) + len(line) + sum(e["size"] for e in entries)
    if declared > limit:
        raise BundleError(
            f"the header declares {declared:,} bytes, over the {limit:,}-byte bundle limit",
            path=f"{label} header",
            hint=f"set {MAX_BUNDLE_BYTES_ENV} to allow bigger bundles",
        )
    if size is not None and size != declared:
        what = "truncated" if size < declared else "followed by bytes no entry declares"
        raise BundleError(
            f"the bundle is {size:,} bytes and its header declares {declared:,}: it is {what}",
            path=label,
            hint=_TAMPERED,
        )
    return entries


def _read_records(
    source: BinaryIO, entries: list[dict[str, Any]], *, label: str
) -> tuple[list[ExecutionRecord], dict[str, tuple[str, str]]]:
    """The record entries (they come first), each checked, and what their artifacts are: sha256 -> (record id,
    what the record uses it as)."""
    records: list[ExecutionRecord] = []
    needed: dict[str, tuple[str, str]] = {}
    for n, entry in enumerate(entries):
        if entry["kind"] != "record":
            break
        at = _entry_label(label, n, entry)
        body = _read_exact(source, entry["size"])
        if len(body) < entry["size"]:
            raise BundleError(f"truncated: {len(body):,} of {entry['size']:,} bytes", path=at, hint=_TAMPERED)
        if _sha(body) != entry["sha256"]:
            raise BundleError(
                f"its bytes hash to {_sha(body)[:12]}…, not to its declared sha256", path=at, hint=_TAMPERED
            )
        try:
            rec = ExecutionRecord.from_bytes(body, source=at)
        except RecordFormatError as exc:
            raise BundleError(exc.message, path=exc.path or at, hint=exc.hint) from None
        if rec.body != body:
            raise BundleError("the record is not in canonical form", path=at, hint=_TAMPERED)
        records.append(rec)
        for sha, role in needed_artifacts(rec).items():
            needed.setdefault(sha, (rec.id, role))
    return records, needed


def _carried_artifacts(
    entries: list[dict[str, Any]], needed: Mapping[str, tuple[str, str]], *, label: str
) -> list[tuple[int, dict[str, Any]]]:
    """The artifact entries, once they are known to be exactly the ones the records name."""
    artifacts = [(n, e) for n, e in enumerate(entries) if e["kind"] == "artifact"]
    carried = {e["sha256"] for _, e in artifacts}
    for n, entry in artifacts:
        if entry["sha256"] not in needed:
            raise BundleError(
                "an artifact no record in the bundle names: a bundle carries only what its records replay from",
                path=_entry_label(label, n, entry),
                hint=_TAMPERED,
            )
    for sha, (rid, role) in needed.items():
        if sha not in carried:
            raise BundleError(
                f"record {rid[:12]} uses {role} (sha256 {sha[:12]}…) and the bundle does not carry it",
                path=label,
                hint=_NOT_A_BUNDLE,
            )
    return artifacts
