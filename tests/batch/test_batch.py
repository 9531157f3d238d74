"""ctxlock batch: every row in exactly one shard or the errors file, shards equal to Model.encode, byte-identical
output for any --workers, resume after SIGKILL, the manifest's digests, Parquet input, the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from batch_tables import reference_table
from cli_runner import run_main
from ctxlock.batch._run import BatchOptions, Progress, plan_shards, read_shards, read_spec, run_batch
from ctxlock.errors import InputError
from ctxlock.training._masks import MaskOptions
from hypothesis_profiles import examples

SRC = Path(__file__).resolve().parents[2] / "src"


def _dataset(n: int, seed: int = 0) -> list[str]:
    """n JSONL lines, both dialects, about 2% bad: broken JSON, no assistant turn, an invalid role."""
    rnd = random.Random(seed)
    lines = []
    for i in range(n):
        if rnd.random() < 0.02:
            lines.append(rnd.choice(['{"messages": [', '{"messages":[{"role":"user","content":"hi"}]}', "", "[1]"]))
            continue
        msgs: list[dict[str, Any]] = []
        for t in range(rnd.randint(1, 3)):
            words = " ".join(
                rnd.choice(["alpha", "β", "日本", "🙂", "x<|im_end|>", "\n"]) for _ in range(rnd.randint(1, 20))
            )
            msgs += [
                {"role": "user", "content": f"q{i}.{t} {words}"},
                {"role": "assistant", "content": f"a{i}.{t} {words}"},
            ]
        row = {"system": "be brief", "messages": msgs, "max_tokens": 5} if i % 3 == 0 else {"messages": msgs}
        lines.append(json.dumps(row, ensure_ascii=False))
    return lines


def _write(tmp: Path, lines: list[str], name: str = "in.jsonl") -> Path:
    path = tmp / name
    path.write_text("".join(line + "\n" for line in lines), "utf-8")
    return path


def _tree(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def _rows(out: Path) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for path in sorted(out.glob("shard-*.parquet")):
        for r in pq.read_table(path).to_pylist():
            rows[r["row"]] = r
    return rows


def test_every_row_accounted_for_and_equal_to_encode(tmp_path: Path) -> None:
    model_dir = str(fetched.hf_tokenizer_dir("qwen2"))
    lines = _dataset(120, seed=1)
    source = _write(tmp_path, lines)
    manifest = run_batch(source, tmp_path / "out", BatchOptions(model=model_dir, shard_rows=40))
    rows = _rows(tmp_path / "out")
    errors = [json.loads(x) for x in (tmp_path / "out" / "errors.jsonl").read_text("utf-8").splitlines()]
    assert sorted([*rows, *(e["row"] for e in errors)]) == list(range(len(lines)))  # each row exactly once
    assert not set(rows) & {e["row"] for e in errors}
    assert errors and all(set(e) == {"row", "type", "path", "message"} for e in errors)
    model = ctxlock.load(model_dir)
    for n, row in rows.items():
        mi = model.encode(lines[n], return_assistant_tokens_mask=True)
        assert row["input_ids"] == mi["input_ids"][0].tolist()
        assert row["labels"] == np.where(mi["assistant_masks"][0] == 1, mi["input_ids"][0], -100).tolist()
        assert row["length"] == len(row["input_ids"])
        request = model.parse(lines[n])
        assert row["request_sha256"] == hashlib.sha256(request.to_json().encode()).hexdigest()
    assert manifest["rows"] == len(lines) and manifest["error_count"] == len(errors)
    assert manifest["token_count"] == sum(len(r["input_ids"]) for r in rows.values())


def test_manifest_digests(tmp_path: Path) -> None:
    source = _write(tmp_path, _dataset(50))
    out = tmp_path / "out"
    manifest = run_batch(source, out, BatchOptions(model="book", shard_rows=20))
    assert manifest == json.loads((out / "manifest.json").read_text("utf-8"))
    # The input's digest is over its 1 MiB blocks' sha256s (docs/batch.md): a 3-line check with hashlib.
    data = source.read_bytes()
    blocks = b"".join(hashlib.sha256(data[k : k + (1 << 20)]).digest() for k in range(0, len(data), 1 << 20))
    assert manifest["input"] == {
        "file": source.name,
        "bytes": len(data),
        "block_bytes": 1 << 20,
        "blocks_sha256": hashlib.sha256(blocks).hexdigest(),
    }
    assert manifest["errors"]["sha256"] == hashlib.sha256((out / "errors.jsonl").read_bytes()).hexdigest()
    model = ctxlock.load("book")
    assert manifest["tokenizer_sha256"] == model.tokenizer.sha256
    assert manifest["template_sha256"] == {"default": model.templates.templates[0].sha256}
    assert [s["rows"] for s in manifest["shards"]] == [[0, 20], [20, 40], [40, 50]]
    for shard in manifest["shards"]:
        data = (out / shard["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"]
        table = pq.read_table(out / shard["file"])
        assert table.num_rows == shard["row_count"]
        assert table.schema.field("input_ids").type == pa.list_(pa.int32())
        assert pq.ParquetFile(out / shard["file"]).metadata.row_group(0).column(0).compression == "ZSTD"


def test_byte_identical_for_any_workers(tmp_path: Path) -> None:
    source = _write(tmp_path, _dataset(90, seed=2))
    opts = BatchOptions(model="book", shard_rows=15)
    run_batch(source, tmp_path / "one", opts, workers=1)
    run_batch(source, tmp_path / "two", opts, workers=2)
    assert _tree(tmp_path / "one") == _tree(tmp_path / "two")


def test_resume_after_sigkill_ends_with_the_same_manifest(tmp_path: Path) -> None:
    source = _write(tmp_path, _dataset(400, seed=3))
    opts = BatchOptions(model="book", shard_rows=10)
    run_batch(source, tmp_path / "whole", opts)
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cmd = [sys.executable, "-m", "ctxlock", "batch", str(source), str(out), "-m", "book", "--shard-rows", "10"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "shard-00003.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists(), "the run finished before it was killed"
    kept_before = len(list(out.glob("shard-*.json")))
    seen: list[Progress] = []
    run_batch(source, out, opts, resume=True, on_progress=seen.append)
    assert seen[-1].shards_kept >= kept_before >= 4
    assert _tree(out) == _tree(tmp_path / "whole")


def test_resume_remakes_a_damaged_shard(tmp_path: Path) -> None:
    source = _write(tmp_path, _dataset(30))
    opts = BatchOptions(model="book", shard_rows=10)
    out = tmp_path / "out"
    run_batch(source, out, opts)
    whole = _tree(out)
    (out / "shard-00001.parquet").write_bytes(b"PAR1 damaged")
    (out / ".shard-00002.parquet.abc.tmp").write_bytes(b"half")
    seen: list[Progress] = []
    run_batch(source, out, opts, resume=True, on_progress=seen.append)
    assert seen[-1].shards_kept == 2 and _tree(out) == whole


def test_parquet_input_gives_the_same_shards(tmp_path: Path) -> None:
    lines = [x for x in _dataset(40, seed=4) if x.startswith("{")]
    source = _write(tmp_path, lines)
    pq.write_table(pa.table({"request": lines}), tmp_path / "in.parquet")
    opts = BatchOptions(model="book", shard_rows=25)
    run_batch(source, tmp_path / "a", opts)
    run_batch(tmp_path / "in.parquet", tmp_path / "b", opts)
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert {k: v for k, v in a.items() if k.endswith(".parquet")} == {
        k: v for k, v in b.items() if k.endswith(".parquet")
    }
    # Two workers each read their shard's rows (row groups of 7 rows: a shard starts inside one).
    pq.write_table(pa.table({"request": lines}), tmp_path / "in7.parquet", row_group_size=7)
    run_batch(tmp_path / "in7.parquet", tmp_path / "b2", opts, workers=2)
    b2 = _tree(tmp_path / "b2")
    assert {k: v for k, v in b2.items() if k.endswith(".parquet")} == {
        k: v for k, v in b.items() if k.endswith(".parquet")
    }
    columns = pa.Table.from_pylist([json.loads(x) for x in lines if "system" not in x])
    pq.write_table(columns, tmp_path / "columns.parquet")
    manifest = run_batch(tmp_path / "columns.parquet", tmp_path / "c", opts)
    assert manifest["rows"] == columns.num_rows


def test_messages_column(tmp_path: Path) -> None:
    """--messages-column: a Parquet column of another name read as the messages, in its place among the columns,
    so the rows are those of the same table with a `messages` column (the policy records the option); with
    either engine's workers (test_batch_ray.py). Refused: JSONL input, a missing column, a `messages` column beside
    it, and a URI with the local engine."""
    rows = [json.loads(x) for x in _dataset(30, seed=6) if x.startswith("{") and "system" not in x]
    rows = [r for r in rows if isinstance(r.get("messages"), list) and r["messages"]]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "messages.parquet", row_group_size=4)
    renamed = table.rename_columns(["conversation" if n == "messages" else n for n in table.column_names])
    pq.write_table(renamed, tmp_path / "conv.parquet", row_group_size=4)
    plain = run_batch(tmp_path / "messages.parquet", tmp_path / "a", BatchOptions(model="book", shard_rows=5))
    opts = BatchOptions(model="book", shard_rows=5, messages_column="conversation")
    conv = run_batch(tmp_path / "conv.parquet", tmp_path / "b", opts, workers=2)
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b") and plain["row_count"] == conv["row_count"] > 10
    assert conv["policy"]["messages_column"] == "conversation" and "messages_column" not in plain["policy"]
    assert [s["input_sha256"] for s in conv["shards"]] == [s["input_sha256"] for s in plain["shards"]]
    both = table.append_column("conversation", table.column("messages"))
    pq.write_table(both, tmp_path / "both.parquet")
    refused = {
        "is JSONL": _write(tmp_path, [json.dumps(r) for r in rows]),
        "has no column 'conversation'": tmp_path / "messages.parquet",
        "has both": tmp_path / "both.parquet",
    }
    for why, source in refused.items():
        with pytest.raises(InputError, match=why):
            run_batch(source, tmp_path / f"x{len(why)}", opts)
    with pytest.raises(InputError, match="the local engine reads and writes local paths"):
        run_batch(tmp_path / "conv.parquet", f"file://{tmp_path}/uri", opts)


def test_max_length_and_mask_options(tmp_path: Path) -> None:
    source = _write(tmp_path, _dataset(30, seed=5))
    manifest = run_batch(source, tmp_path / "a", BatchOptions(model="book", max_length=60, shard_rows=30))
    errors = [json.loads(x) for x in (tmp_path / "a" / "errors.jsonl").read_text("utf-8").splitlines()]
    assert any(e["type"] == "BudgetExceeded" for e in errors)
    assert all(r["length"] <= 60 for r in _rows(tmp_path / "a").values())
    last = run_batch(
        source, tmp_path / "b", BatchOptions(model="book", shard_rows=30, mask=MaskOptions(last_turn_only=True))
    )
    assert (
        last["trained_tokens"]
        < run_batch(source, tmp_path / "c", BatchOptions(model="book", shard_rows=30))["trained_tokens"]
    )
    assert manifest["policy"]["max_length"] == 60


def test_cli(tmp_path: Path) -> None:
    source = _write(tmp_path, _dataset(20))
    code, out, _ = run_main(["batch", str(source), str(tmp_path / "o"), "-m", "book", "--json"])
    assert code == 0 and json.loads(out)["rows"] == 20
    code, _, err = run_main(["batch", str(source), str(tmp_path / "o"), "-m", "book"])
    assert code == 1 and err.startswith("error:") and "--resume" in err and err.count("\n") == 1
    code, _, err = run_main(["batch", str(source), str(tmp_path / "p"), "-m", "book", "--workers", "0"])
    assert code == 1 and err.count("\n") == 1
    code, _, err = run_main(["batch", str(tmp_path / "missing.jsonl"), str(tmp_path / "q"), "-m", "book"])
    assert code == 1 and "no such input file" in err
    code, _, err = run_main(["batch", str(source), str(tmp_path / "r"), "--engine", "spark"])
    assert code == 1 and err.startswith("error:") and "'local' or 'ray'" in err and err.count("\n") == 1
    code, _, err = run_main(["batch", str(source), str(tmp_path / "r"), "--ray-address", "auto"])
    assert code == 1 and "--engine ray" in err and err.count("\n") == 1


@pytest.mark.parametrize("bad", [b"\xff\xfe", b'{"messages": "no"}'])
def test_hostile_rows_are_error_rows(tmp_path: Path, bad: bytes) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(bad + b"\n" + _dataset(1)[0].encode() + b"\n")
    manifest = run_batch(source, tmp_path / "o", BatchOptions(model="book"))
    assert manifest["error_count"] == 1 and manifest["row_count"] == 1


def test_pack(tmp_path: Path) -> None:
    source = _write(tmp_path, _dataset(60, seed=6))
    plain = run_batch(source, tmp_path / "a", BatchOptions(model="book", shard_rows=30))
    packed = run_batch(source, tmp_path / "b", BatchOptions(model="book", shard_rows=30, pack=256))
    rows = _rows(tmp_path / "a")
    seen: list[int] = []
    for path in sorted((tmp_path / "b").glob("shard-*.parquet")):
        for p in pq.read_table(path).to_pylist():
            assert p["length"] == sum(p["seq_lengths"]) == len(p["input_ids"]) == len(p["position_ids"]) <= 256
            at = 0
            for n, length in zip(p["rows"], p["seq_lengths"], strict=True):
                assert p["input_ids"][at : at + length] == rows[n]["input_ids"]
                assert p["labels"][at : at + length] == rows[n]["labels"]
                assert p["position_ids"][at : at + length] == list(range(length))
                at += length
            seen += p["rows"]
    too_long = [n for n, r in rows.items() if r["length"] > 256]
    assert sorted(seen + too_long) == sorted(rows)
    assert packed["error_count"] == plain["error_count"] + len(too_long)


def _long_chats(n: int, seed: int) -> list[str]:
    """n multi-turn chats of varied length (so some fit whole, some lose history, some are over even alone)."""
    rnd = random.Random(seed)
    lines = []
    for i in range(n):
        msgs: list[dict[str, Any]] = []
        for t in range(rnd.randint(1, 6)):
            size = rnd.choice([2, 5, 20, 80])
            msgs += [
                {
                    "role": "user",
                    "content": f"q{i}.{t} " + " ".join(rnd.choice(["alpha", "日本", "β"]) for _ in range(size)),
                },
                {"role": "assistant", "content": f"a{i}.{t} " + "ok " * rnd.randint(1, size)},
            ]
        row = {"messages": ([{"role": "system", "content": "be brief"}] if i % 4 == 0 else []) + msgs}
        lines.append(json.dumps(row, ensure_ascii=False))
    return lines


def test_max_length_fits_each_row(tmp_path: Path) -> None:
    """--max-length runs `fit_context` on a row over it: the shard holds the fitted ids and masks, the decisions are
    counted, a row whose required part alone is over it is an error row with the fit's error."""
    from ctxlock.budget._fit import BudgetPolicy, fit_context
    from ctxlock.errors import BudgetExceeded

    model_dir = str(fetched.hf_tokenizer_dir("qwen2"))
    lines = _long_chats(80, seed=8)
    source = _write(tmp_path, lines)
    limit = 200
    manifest = run_batch(source, tmp_path / "o", BatchOptions(model=model_dir, shard_rows=30, max_length=limit))
    rows = _rows(tmp_path / "o")
    errors = {e["row"]: e for e in map(json.loads, (tmp_path / "o" / "errors.jsonl").read_text("utf-8").splitlines())}
    model = ctxlock.load(model_dir)
    policy = BudgetPolicy(max_input_tokens=limit, generation_prefix="none")
    expect: dict[str, int] = {"rows_whole": 0, "rows_fitted": 0, "rows_over": 0}
    fitted_rows: dict[int, list[int]] = {}
    for n, line in enumerate(lines):
        request = model.parse(line)
        full = model.encode(line, return_assistant_tokens_mask=True)["input_ids"][0].tolist()
        if len(full) <= limit:
            expect["rows_whole"] += 1
            assert rows[n]["input_ids"] == full
            continue
        try:
            fitted = fit_context(request, model, policy, add_generation_prompt=False)
        except BudgetExceeded as exc:
            expect["rows_over"] += 1
            assert errors[n] == {"row": n, "type": "BudgetExceeded", "path": exc.path, "message": exc.message}
            continue
        expect["rows_fitted"] += 1
        fitted_rows[n] = list(fitted.kept_messages)
        mi = model.encode(fitted.request, return_assistant_tokens_mask=True)
        assert rows[n]["input_ids"] == list(fitted.ids) == mi["input_ids"][0].tolist()
        assert rows[n]["labels"] == np.where(mi["assistant_masks"][0] == 1, mi["input_ids"][0], -100).tolist()
        assert rows[n]["request_sha256"] == hashlib.sha256(request.to_json().encode()).hexdigest()
        for d in fitted.decisions:
            if d.kind != "generation":
                key = f"{d.kind} {'kept' if d.kept else 'dropped'}"
                expect[key] = expect.get(key, 0) + 1
    assert manifest["fit"] == dict(sorted(expect.items()))
    records = [json.loads(p.read_text("utf-8")) for p in sorted((tmp_path / "o").glob("shard-*.json"))]
    assert {f["row"]: f["kept_messages"] for r in records for f in r["fitted"]} == fitted_rows
    assert all("fitted" not in s for s in manifest["shards"])
    assert expect["rows_whole"] and expect["rows_fitted"] and expect["rows_over"] and expect["history dropped"]
    assert all(r["length"] <= limit for r in rows.values())
    assert sorted([*rows, *errors]) == list(range(len(lines)))


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=40),
    ending=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    final=st.booleans(),
    shard_rows=st.integers(1, 7),
)
def test_shard_specs_read_the_same_rows(
    tmp_path: Path, lines: list[bytes], ending: bytes, final: bool, shard_rows: int
) -> None:
    """`plan_shards` + `read_spec` (what the Ray engine reads) give exactly `read_shards`' rows (the local engine's),
    for any bytes: blank lines, CR, CRLF, invalid UTF-8, no final newline."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(ending.join(lines) + (ending if final and lines else b""))
    local = list(read_shards(path, shard_rows))
    specs = list(plan_shards(path, shard_rows))
    assert [read_spec(path, s) for s in specs] == local
    assert [s.index for s in specs] == list(range(len(local)))


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(0, 60), group=st.integers(1, 25), shard_rows=st.integers(1, 30))
def test_parquet_shard_specs_read_the_same_rows(tmp_path: Path, rows: int, group: int, shard_rows: int) -> None:
    """The same for Parquet input, over row-group sizes (a shard's read skips the row groups before it)."""
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"request": [f'{{"n": {n}}}' for n in range(rows)]}), path, row_group_size=group)
    local = list(read_shards(path, shard_rows))
    assert [read_spec(path, s) for s in plan_shards(path, shard_rows)] == local
    assert [n for shard in local for n, _ in shard] == list(range(rows))


# -- the shard's columns are built from numpy buffers, not pa.array (which imports pandas) -----------------------


_kept_rows = st.lists(
    st.tuples(
        st.integers(0, 2**40),
        st.text(min_size=0, max_size=70),
        st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=40),
    ),
    max_size=30,
)


@settings(max_examples=examples(60), deadline=None)
@given(rows=_kept_rows, pack=st.one_of(st.none(), st.integers(1, 120)))
def test_shard_columns_equal_pa_array_and_write_the_same_bytes(rows: list[Any], pack: int | None) -> None:
    from ctxlock.batch import _tables as tables

    kept = [
        (r, sha, np.array(ids, np.int32), np.where(np.array(ids) % 2 == 0, -100, ids).astype(np.int32), None)
        for r, sha, ids in rows
    ]
    if pack is not None:
        kept = [k for k in kept if len(k[2]) <= pack]
    ours = tables.table_of(kept) if pack is None else tables.packed_table(kept, pack)
    ref = reference_table(kept, pack)
    assert ours.schema.equals(ref.schema, check_metadata=True) and ours.equals(ref)
    assert tables.parquet_bytes(ours) == tables.parquet_bytes(ref)


def test_a_worker_does_not_import_pandas(tmp_path: Path) -> None:
    """A shard is encoded and written without pandas (pyarrow's `pa.array` imports it: ~0.5 s per worker)."""
    source = _write(tmp_path, _dataset(40))
    model = str(fetched.hf_tokenizer_dir("qwen2"))
    script = (
        "import sys; from pathlib import Path; from ctxlock.batch._run import BatchOptions, run_batch;"
        f"m = run_batch(Path({str(source)!r}), Path({str(tmp_path / 'out')!r}), BatchOptions(model={model!r},"
        " shard_rows=16, pack=4096)); print(m['row_count'], 'pandas' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(ctxlock.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    count, pandas = out.stdout.split()
    assert int(count) > 30 and pandas == "False"


def _children_cmdlines(pid: int) -> list[str]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return [Path(f"/proc/{k}/cmdline").read_bytes().replace(b"\0", b" ").decode() for k in kids]
    except OSError:
        return []


def test_cli_workers_are_forked_and_give_the_same_bytes(tmp_path: Path) -> None:
    """`ctxlock batch --workers 2` from a shell: the job's process has no other thread once the model is loaded,
    so its worker is forked (its command line is the job's, not multiprocessing's spawn_main), and the output is
    byte-identical to one worker's."""
    source = _write(tmp_path, _dataset(300, seed=6))
    model = str(fetched.hf_tokenizer_dir("qwen2"))
    run_batch(source, tmp_path / "one", BatchOptions(model=model, shard_rows=20), workers=1)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cmd = [sys.executable, "-m", "ctxlock", "batch", str(source), str(tmp_path / "two"), "-m", model]
    proc = subprocess.Popen(
        [*cmd, "--workers", "2", "--shard-rows", "20"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    seen: set[str] = set()
    while proc.poll() is None:
        seen.update(c for c in _children_cmdlines(proc.pid) if c)  # "" is a child that has just exited
        time.sleep(0.01)
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert seen and all("spawn_main" not in c and " batch " in c for c in seen), seen
    assert _tree(tmp_path / "one") == _tree(tmp_path / "two")


def test_workers_are_spawned_when_the_process_has_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job started from a process with another thread spawns its workers (a fork could copy a held lock): the
    same bytes."""
    import threading

    from ctxlock.batch import _run as batch

    methods: list[tuple[str, str]] = []
    real = batch.start_method
    monkeypatch.setattr(batch, "start_method", lambda: methods.append(real()) or methods[-1])
    source = _write(tmp_path, _dataset(60, seed=7))
    opts = BatchOptions(model="book", shard_rows=10)
    run_batch(source, tmp_path / "one", opts, workers=1)
    stop = threading.Event()
    holder = threading.Thread(target=stop.wait, name="holder", daemon=True)
    holder.start()
    try:
        run_batch(source, tmp_path / "two", opts, workers=2)
    finally:
        stop.set()
        holder.join()
    assert methods and methods[0][0] == "spawn" and "holder" in methods[0][1]
    assert _tree(tmp_path / "one") == _tree(tmp_path / "two")


def test_jsonl_that_starts_with_the_parquet_magic_is_jsonl(tmp_path: Path) -> None:
    """Found by hypothesis: a JSONL file whose first line starts with `PAR1` was taken for Parquet."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"PAR1\n" + json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode() + b"\n")
    manifest = run_batch(source, tmp_path / "o", BatchOptions(model="book", shard_rows=5))
    assert manifest["rows"] == 2 and manifest["error_count"] >= 1


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.9])
def test_damaged_parquet_is_one_input_error(tmp_path: Path, cut: float) -> None:
    """A file with Parquet's magic at both ends whose middle is damaged: one line naming the file, no traceback."""
    good = tmp_path / "good.parquet"
    rows = [json.dumps({"messages": [{"role": "user", "content": f"x{i}" * 50}]}) for i in range(400)]
    pq.write_table(pa.table({"request": rows}), good)
    data = bytearray(good.read_bytes())
    k = int(len(data) * cut)
    data[k : k + 64] = b"\xff" * 64
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(data))
    code, _, err = run_main(["batch", str(bad), str(tmp_path / "o"), "-m", "book"])
    assert code == 1 and "Traceback" not in err
    line = err.strip()
    assert line.startswith("error: ") and "\n" not in line and "bad.parquet" in line, line


def test_no_worker_outlives_a_sigkilled_job(tmp_path: Path) -> None:
    """SIGKILL of `ctxlock batch --workers 2` mid-run: the kernel takes its worker down too (PR_SET_PDEATHSIG); a
    forked worker would otherwise wait on its queue for ever (it holds that pipe's other end itself)."""
    source = _write(tmp_path, _dataset(3000, seed=8))
    model = str(fetched.hf_tokenizer_dir("qwen2"))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cmd = [sys.executable, "-m", "ctxlock", "batch", str(source), str(tmp_path / "o"), "-m", model, "--json"]
    proc = subprocess.Popen(
        [*cmd, "--workers", "2", "--shard-rows", "50"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    kids: list[str] = []
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        kids = [k for k in _children_cmdlines(proc.pid) if k]
        if kids and list((tmp_path / "o").glob("shard-*.json")):
            break
        time.sleep(0.01)
    pids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert pids and not (tmp_path / "o" / "manifest.json").exists(), "the job ended before the kill"
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not alive, f"workers outlived the job: {alive}"
