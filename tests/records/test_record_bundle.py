"""Issue 15 item 8: records travel. `records export --bundle` writes one file with a record and every artifact it
replays from; `records import` checks every digest (a bundle is hostile input); `replay` then works on a machine
that never had the model directory, after the book-fixture check (docs/records.md)."""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import os
import shutil
import subprocess
import tempfile
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import ctxlock.errors
import ctxlock.records._replay
import fetched
from cli_runner import run_cli
from ctxlock.errors import ArtifactNotFoundError
from ctxlock.records import ExecutionRecord, RunOptions, canonical_bytes
from ctxlock.records._replay import load_record, replay, run_and_record, save
from ctxlock.records._store import Store
from ctxlock.template._render import ChatTemplate
from hypothesis_profiles import examples

NOW = "2024-07-26T10:00:00"
QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
REQUEST = {
    "messages": [
        {"role": "system", "content": "简洁回答"},
        {"role": "user", "content": "Why is the sky blue? 天空为什么是蓝色？"},
    ]
}
SEED_IDS = [1, 2, 7, 3, 4, 8, 9, 10, 11, 12, 5, 6]
MAGIC = b"ctxlock.bundle/1\n"  # the documented first line of a bundle


def bundles() -> types.ModuleType:
    """`ctxlock.records._bundle`, imported per test: where it is missing, each test fails on its own."""
    return importlib.import_module("ctxlock.records._bundle")


def cli(*args: str, data_dir: Path, home: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """ctxlock in a child process whose only data is `data_dir` (a fresh store) and `home`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CTXLOCK_", "XDG_", "HF_")) or k in ("CTXLOCK_TEST_CACHE",)
    }
    own = {"CTXLOCK_DATA_DIR": str(data_dir), "HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return run_cli(*args, stdin=stdin, base_env=env, env=own, timeout=300)


def _model_dir(kind: str, where: Path) -> tuple[Path, list[str]]:
    """A model the test owns (deleted later): an HF directory with its own template, or a lone GGUF file."""
    if kind == "hf-dir":
        target = where / "my-model"
        shutil.copytree(fetched.hf_tokenizer_dir("qwen2"), target)
        return target, []
    target = where / "vocab.gguf"
    shutil.copyfile(fetched.gguf_path("qwen2"), target)
    template = where / "chat_template.jinja"
    shutil.copyfile(fetched.templates_dir() / QWEN25, template)
    return target, ["--template", str(template)]


@pytest.mark.parametrize("kind", ["hf-dir", "gguf"])
def test_a_bundle_replays_on_a_machine_that_never_had_the_model(tmp_path: Path, kind: str) -> None:
    origin, elsewhere = tmp_path / "origin", tmp_path / "elsewhere"
    for d in (origin, elsewhere):
        d.mkdir()
    model, extra = _model_dir(kind, origin)
    request = origin / "chat.json"
    request.write_text(json.dumps(REQUEST, ensure_ascii=False), encoding="utf-8")
    store_a = origin / "store"
    made = cli(
        "render", str(request), "--model", str(model), *extra, "--record", "--now", NOW, "--json",
        data_dir=store_a, home=origin,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    rid = json.loads(made.stdout)["record_id"]
    n_ids = len(json.loads(made.stdout)["input_ids"])

    bundle = elsewhere / "travel.bundle"
    out = cli("records", "export", "--bundle", rid[:12], "-o", str(bundle), data_dir=store_a, home=origin)
    assert out.returncode == 0, out.stderr
    assert "exported 1 record(s) and 2 artifact(s)" in out.stderr  # the template and the tokenizer file
    assert bundle.read_bytes().startswith(MAGIC)

    shutil.rmtree(origin)  # the model directory, the template, the store and the request: all gone
    store_b = elsewhere / "fresh-store"
    if kind == "hf-dir":
        imported = cli("records", "import", str(bundle), data_dir=store_b, home=elsewhere)
    else:  # through stdin
        imported = cli("records", "import", "-", data_dir=store_b, home=elsewhere, stdin=bundle.read_bytes())
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.split() == [rid]

    as_json = cli("replay", rid, "--json", data_dir=store_b, home=elsewhere)
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    result = json.loads(as_json.stdout)
    assert result["kind"] == "identical" and result["identical"] is True
    assert result["ids"] == {"equal": True, "a": n_ids, "b": n_ids, "first_difference": None}
    assert result["fixture"] == {"name": "book", "ok": True, "expected": SEED_IDS, "ids": SEED_IDS}
    if kind == "hf-dir":
        human = cli("replay", rid[:12], data_dir=store_b, home=elsewhere)
        assert human.returncode == 0, human.stdout + human.stderr
        lines = human.stdout.splitlines()
        assert lines[0].startswith("fixture  book: 12 ids as expected")  # checked before comparing
        assert lines[1] == "identical: recorded and replayed agree on every layer"
        assert lines[2].strip() == f"ids     equal ({n_ids}/{n_ids})"


def test_a_plain_export_says_which_artifact_is_missing_and_which_commands_bring_it(tmp_path: Path) -> None:
    model, _ = _model_dir("hf-dir", tmp_path)
    store_a, store_b = tmp_path / "a", tmp_path / "b"
    req = tmp_path / "chat.json"
    req.write_text(json.dumps(REQUEST), encoding="utf-8")
    made = cli("render", str(req), "--model", str(model), "--record", "--json", data_dir=store_a, home=tmp_path)
    rid = json.loads(made.stdout)["record_id"]
    lines = cli("records", "export", rid, data_dir=store_a, home=tmp_path).stdout.encode()
    assert cli("records", "import", "-", data_dir=store_b, home=tmp_path, stdin=lines).returncode == 0
    failed = cli("replay", rid, data_dir=store_b, home=tmp_path)
    assert failed.returncode == 1
    assert failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr
    assert "ArtifactNotFoundError" in failed.stderr
    assert f"record {rid[:12]} replays from its" in failed.stderr
    assert f"ctxlock records export --bundle {rid[:12]} -o FILE" in failed.stderr
    assert "ctxlock records import FILE" in failed.stderr
    assert "put_artifact" not in failed.stderr  # a Python function is not something a user can run


# ------------------------------------------------------------------------------------------------ library level


@pytest.fixture(scope="module")
def origin() -> tuple[Store, ExecutionRecord]:
    """A store with one real record (HF tokenizer.json + template) made from a model directory that is gone."""
    root = Path(tempfile.mkdtemp(prefix="ctxlock-bundle-test-"))
    model_dir = root / "model"
    shutil.copytree(fetched.hf_tokenizer_dir("qwen2"), model_dir)
    model = ctxlock.load(str(model_dir))
    template = ChatTemplate((fetched.templates_dir() / QWEN25).read_text("utf-8"), id=QWEN25)
    _, record, error = run_and_record(model, json.dumps(REQUEST).encode(), RunOptions(now=NOW), template=template)
    assert error is None
    store = Store(root / "store")
    save(store, model, record, template)
    shutil.rmtree(model_dir)
    yield store, record
    store.close()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def bundle(origin: tuple[Store, ExecutionRecord]) -> bytes:
    store, record = origin
    buf = io.BytesIO()
    summary = bundles().write_bundle(store, [record.id], buf)
    assert summary.records == (record.id,) and len(summary.artifacts) == 2 and summary.size == len(buf.getvalue())
    return buf.getvalue()


def _split(raw: bytes) -> tuple[dict, list[bytes]]:
    """(header, the bytes of each entry)."""
    rest = raw[len(MAGIC) :]
    line, _, body = rest.partition(b"\n")
    header = json.loads(line)
    parts, pos = [], 0
    for entry in header["entries"]:
        parts.append(body[pos : pos + entry["size"]])
        pos += entry["size"]
    return header, parts


def _join(header: dict, parts: list[bytes]) -> bytes:
    return MAGIC + canonical_bytes(header) + b"".join(parts)


def _contents(root: Path) -> list[str]:
    """Every file under the store's artifact directory, and every record: what an import may have left."""
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []
    return files


def _refused(raw: bytes, *, stream: bool = False) -> ctxlock.errors.CtxlockError:
    """Import `raw` into a fresh store; it must be a BundleError that leaves nothing behind."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        source = io.BytesIO(raw)
        with pytest.raises(ctxlock.errors.BundleError) as info:
            bundles().import_bundle(store, source, label="b.bundle", size=None if stream else len(raw))
        assert store.list_records() == []
        assert _contents(store.artifacts_dir) == []
        store.close()
    return info.value


def test_import_checks_and_stores_everything_and_replay_is_identical(
    origin: tuple[Store, ExecutionRecord], bundle: bytes, tmp_path: Path
) -> None:
    _, record = origin
    for stream in (False, True):
        store = Store(tmp_path / f"fresh-{stream}")
        ids = bundles().import_bundle(store, io.BytesIO(bundle), label="b", size=None if stream else len(bundle))
        assert ids == [record.id]
        result, _ = replay(load_record(record.id, store), store)
        assert result.kind == "identical", result.to_dict()
        assert result.fixture["ids"] == SEED_IDS
        assert _contents(store.artifacts_dir / ".tmp") == []  # staged files were renamed into place, none left
        store.close()


def test_export_of_a_record_whose_artifacts_are_missing_writes_nothing(
    origin: tuple[Store, ExecutionRecord], tmp_path: Path
) -> None:
    _, record = origin
    bare = Store(tmp_path / "bare")
    bare.put_record(record.body, index=record.index())
    with pytest.raises(ArtifactNotFoundError) as info:
        bundles().prepare_bundle(bare, [record.id[:12]])
    assert f"record {record.id[:12]} uses" in info.value.message
    out = tmp_path / "b.bundle"
    p = cli("records", "export", "--bundle", record.id, "-o", str(out), data_dir=bare.root, home=tmp_path)
    assert p.returncode == 1 and "ArtifactNotFoundError" in p.stderr and not out.exists()


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_truncated_or_altered_bundle_is_refused_and_leaves_nothing(bundle: bytes, data: st.DataObject) -> None:
    how = data.draw(st.sampled_from(["truncate", "flip", "append"]))
    if how == "truncate":
        raw = bundle[: data.draw(st.integers(0, len(bundle) - 1))]
    elif how == "flip":
        i = data.draw(st.integers(0, len(bundle) - 1))
        raw = bundle[:i] + bytes([bundle[i] ^ data.draw(st.integers(1, 255))]) + bundle[i + 1 :]
    else:
        raw = bundle + data.draw(st.binary(min_size=1, max_size=64))
    stream = data.draw(st.booleans())
    err = _refused(raw, stream=stream)
    assert err.path and err.path.startswith("b.bundle")


_HEADER_ATTACKS = {
    "changed digest": lambda h, p: (h["entries"][2].update(sha256="0" * 64), p),
    "changed size": lambda h, p: (h["entries"][1].update(size=h["entries"][1]["size"] + 1), p),
    "traversal name": lambda h, p: (h["entries"][2].update(name="../../../etc/passwd"), p),
    "symlink entry": lambda h, p: (h["entries"][2].update(kind="symlink"), p),
    "link target": lambda h, p: (h["entries"][2].update(linkname="/etc/shadow"), p),
    "mode": lambda h, p: (h["entries"][2].update(mode=0o4755), p),
    "extra entry": lambda h, p: (
        h["entries"].append({"kind": "artifact", "sha256": hashlib.sha256(b"#!/bin/sh\n").hexdigest(), "size": 10}),
        p.append(b"#!/bin/sh\n"),
    ),
    "missing entry": lambda h, p: (h["entries"].pop(), p.pop()),
    "repeated entry": lambda h, p: (h["entries"].append(dict(h["entries"][1])), p.append(p[1])),
    "record after artifacts": lambda h, p: (h["entries"].append(h["entries"].pop(0)), p.append(p.pop(0))),
    "no record": lambda h, p: (h["entries"].pop(0), p.pop(0)),
    "negative size": lambda h, p: (h["entries"][1].update(size=-1), p),
    "boolean size": lambda h, p: (h["entries"][1].update(size=True), p),
    "uppercase digest": lambda h, p: (h["entries"][1].update(sha256=h["entries"][1]["sha256"].upper()), p),
    "unknown format": lambda h, p: (h.update(format="ctxlock.bundle/9"), p),
    "extra header key": lambda h, p: (h.update(run="rm -rf ~"), p),
    "oversize declared": lambda h, p: (h["entries"][2].update(size=1 << 50), p),
    "oversize record": lambda h, p: (h["entries"][0].update(size=(256 << 20) + 1), p),
}


@pytest.mark.parametrize("attack", sorted(_HEADER_ATTACKS))
@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_every_header_lie_is_a_bundle_error_naming_where(bundle: bytes, attack: str, stream: bool) -> None:
    header, parts = _split(bundle)
    _HEADER_ATTACKS[attack](header, parts)
    err = _refused(_join(header, parts), stream=stream)
    assert err.path.startswith("b.bundle")
    if attack in ("changed digest", "extra entry"):
        assert "entry" in err.path  # the entry it is about, by index, kind and digest


def test_a_non_canonical_header_is_refused(bundle: bytes) -> None:
    # A duplicate key: JSON parsers keep the last one silently, so two readers could see two bundles.
    line = bundle[len(MAGIC) :].split(b"\n", 1)[0]
    forged = line[:-1] + b',"format":"ctxlock.bundle/1"}'
    raw = bundle.replace(line, forged, 1)
    assert 'duplicate key "format"' in _refused(raw).message  # the strict reader refuses it before any other check


@pytest.mark.parametrize("name", ["../../.bashrc", "/etc/cron.d/x", "..", "a/b", "ctxlock.json", "x\x00y"])
def test_a_correctly_hashed_record_with_a_hostile_file_name_is_refused(bundle: bytes, name: str) -> None:
    header, parts = _split(bundle)
    data = json.loads(parts[0])
    (old,) = data["replay"]["files"]
    data["replay"]["files"] = {name: data["replay"]["files"][old]}
    data["replay"]["tokenizer"]["file"] = name
    body = canonical_bytes(data)
    parts[0] = body
    header["entries"][0].update(sha256=hashlib.sha256(body).hexdigest(), size=len(body))
    err = _refused(_join(header, parts))
    assert "entry 0 (record" in err.path and "bad file name" in err.message


def test_a_bundle_over_the_size_cap_is_refused_before_anything_is_read(
    bundle: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXLOCK_MAX_BUNDLE_BYTES", str(len(bundle) - 1))
    assert "bundle limit" in _refused(bundle).message
    assert "bundle limit" in _refused(bundle, stream=True).message


def test_cli_refuses_a_tampered_bundle_in_one_line_naming_the_entry(bundle: bytes, tmp_path: Path) -> None:
    header, parts = _split(bundle)
    parts[2] = parts[2][:-1] + bytes([parts[2][-1] ^ 1])  # one bit of the tokenizer file
    path = tmp_path / "tampered.bundle"
    path.write_bytes(_join(header, parts))
    store = tmp_path / "store"
    p = cli("records", "import", str(path), data_dir=store, home=tmp_path)
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert "BundleError" in p.stderr and f"entry 2 (artifact {header['entries'][2]['sha256'][:12]}" in p.stderr
    assert "hash to" in p.stderr
    assert _contents(store / "artifacts") == []


# ---------------------------------------------------------------------------------------------------- fixture


def test_replay_stops_before_comparing_when_the_seed_fixture_fails(
    origin: tuple[Store, ExecutionRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, record = origin
    # As if this installation's book tokenizer gave other ids: replay must not go on to compare anything.
    monkeypatch.setattr(ctxlock.records._replay, "BOOK_FIXTURE_IDS", (1, 2, 7, 3, 4, 8, 9, 10, 11, 13, 5, 6))
    compared: list[object] = []
    monkeypatch.setattr(ctxlock.records._replay, "diff", lambda *a: compared.append(a))
    with pytest.raises(ctxlock.errors.FixtureCheckError) as info:
        replay(load_record(record.id, store), store)
    assert compared == []
    assert "book fixture" in info.value.message and info.value.hint
