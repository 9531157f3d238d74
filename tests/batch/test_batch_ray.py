"""ctxlock batch on Ray Data, and the 20,000-row acceptance run (issue 21, acceptance 2).

One local Ray cluster for the module (`ray.init(num_cpus=2)`). The Ray engine must write the local engine's shards
and manifest byte for byte, on inputs with bad rows (broken JSON, blank lines, invalid UTF-8, CRLF, no final
newline), Parquet input, --pack and --max-length, and a --resume that finishes another engine's run. The 20,000-row
dataset (1% bad rows) is run once uninterrupted with --workers 1 (a module fixture) and checked against
Model.encode, the Ray engine, and a real `ctxlock batch --workers 2` process killed with SIGKILL mid-run and then
resumed with --workers 2.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from test_batch import _dataset, _long_chats, _rows, _tree

import ctxlock
import fetched
from cli_runner import run_main
from ctxlock.batch._ray import ray_engine
from ctxlock.batch._run import BatchOptions, Progress, run_batch
from ctxlock.errors import CtxlockError

SRC = Path(__file__).resolve().parents[2] / "src"
ROWS = 20_000


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _hostile(tmp: Path) -> Path:
    """JSONL with every kind of bad line, CRLF endings, and no newline after the last line."""
    lines = [x.encode() for x in _dataset(70, seed=11)]
    lines[3] = b""
    lines[10] = b"\xff\xfe{"
    lines[20] = lines[21] + b"\r"
    lines[30] = b'{"messages": "no"}'
    path = tmp / "in.jsonl"
    path.write_bytes(b"\n".join(lines))
    return path


@pytest.mark.parametrize("options", [{}, {"pack": 300, "max_length": 120}])
def test_ray_writes_the_local_engines_bytes(tmp_path: Path, options: dict[str, Any]) -> None:
    source = _hostile(tmp_path)
    opts = BatchOptions(model="book", shard_rows=16, **options)
    local = run_batch(source, tmp_path / "local", opts)
    on_ray = run_batch(source, tmp_path / "ray", opts, engine=ray_engine(workers=2))
    assert on_ray == local and local["rows"] == 70 and local["error_count"] >= 4
    assert _tree(tmp_path / "ray") == _tree(tmp_path / "local")
    errors = [json.loads(x) for x in (tmp_path / "ray" / "errors.jsonl").read_text("utf-8").splitlines()]
    assert {3, 10, 30} <= {e["row"] for e in errors}


def test_cli_engine_ray(tmp_path: Path) -> None:
    """`ctxlock batch --engine ray` joins the Ray this process runs (the module's cluster) and writes the same."""
    source = _hostile(tmp_path)
    base = ["batch", str(source), "-m", "book", "--shard-rows", "20", "--json"]
    code, out, _ = run_main([*base[:2], str(tmp_path / "ray"), *base[2:], "--engine", "ray", "--workers", "2"])
    assert code == 0 and json.loads(out)["rows"] == 70
    assert run_main([*base[:2], str(tmp_path / "local"), *base[2:]])[0] == 0
    assert _tree(tmp_path / "ray") == _tree(tmp_path / "local")


def test_ray_reads_parquet_and_fits_like_local(tmp_path: Path) -> None:
    model_dir = str(fetched.hf_tokenizer_dir("qwen2"))
    lines = _long_chats(45, seed=12)
    pq.write_table(pa.table({"request": lines}), tmp_path / "in.parquet", row_group_size=7)
    opts = BatchOptions(model=model_dir, shard_rows=10, max_length=200)
    local = run_batch(tmp_path / "in.parquet", tmp_path / "local", opts, workers=2)
    on_ray = run_batch(tmp_path / "in.parquet", tmp_path / "ray", opts, engine=ray_engine(workers=2))
    assert on_ray == local and local["fit"]["rows_fitted"] and local["fit"]["rows_over"]
    assert _tree(tmp_path / "ray") == _tree(tmp_path / "local")


def test_ray_resumes_a_local_run(tmp_path: Path) -> None:
    source = _hostile(tmp_path)
    opts = BatchOptions(model="book", shard_rows=10)
    run_batch(source, tmp_path / "whole", opts)
    out = tmp_path / "out"
    run_batch(source, out, opts)
    for name in ("shard-00001.json", "shard-00004.parquet", "manifest.json", "errors.jsonl"):
        (out / name).unlink()
    (out / "shard-00005.parquet").write_bytes(b"PAR1 damaged")
    # Records are data: a shard file that is a link to /dev/zero, a record whose row count was edited.
    (out / "shard-00002.parquet").unlink()
    (out / "shard-00002.parquet").symlink_to("/dev/zero")
    record = json.loads((out / "shard-00003.json").read_text("utf-8"))
    (out / "shard-00003.json").write_text(json.dumps({**record, "row_count": 1004}), "utf-8")
    seen: list[Progress] = []
    run_batch(source, out, opts, resume=True, on_progress=seen.append, engine=ray_engine(workers=2))
    assert seen[-1].shards_kept == 2 and seen[-1].shards_done == 7 and sorted(seen[-1].remade) == [1, 2, 3, 4, 5]
    assert _tree(out) == _tree(tmp_path / "whole")


def test_a_resume_with_other_options_remakes_the_shards(tmp_path: Path) -> None:
    source = _hostile(tmp_path)
    out = tmp_path / "out"
    run_batch(source, out, BatchOptions(model="book", shard_rows=10))
    (out / "manifest.json").unlink()
    seen: list[Progress] = []
    opts = BatchOptions(model="book", shard_rows=10, max_length=50)
    run_batch(source, out, opts, resume=True, on_progress=seen.append)
    assert seen[-1].shards_kept == 0
    run_batch(source, tmp_path / "fresh", opts)
    assert _tree(out) == _tree(tmp_path / "fresh")


# -- 20,000 rows ------------------------------------------------------------------------------------------------


def _conversations(n: int, seed: int) -> list[str]:
    """n JSONL lines, exactly 1% bad (every 100th from row 37: broken JSON, blank, no assistant turn, not an
    object), the rest 1 to 3 turns of mixed scripts, both dialects."""
    rnd = random.Random(seed)
    words = ["alpha", "beta", "données", "日本語", "🙂", "print(x)", "42", "\n", "<|im_end|>"]
    bad = ['{"messages": [', "", '{"messages":[{"role":"user","content":"hi"}]}', "[1]"]
    out = []
    for i in range(n):
        if i % 100 == 37:
            out.append(bad[i // 100 % 4])
            continue
        msgs: list[dict[str, Any]] = []
        for t in range(rnd.randint(1, 3)):
            q = " ".join(rnd.choice(words) for _ in range(rnd.randint(1, 12)))
            a = " ".join(rnd.choice(words) for _ in range(rnd.randint(1, 20)))
            msgs += [{"role": "user", "content": f"{i}.{t} {q}"}, {"role": "assistant", "content": a}]
        row = {"system": "be brief", "messages": msgs, "max_tokens": 9} if i % 5 == 0 else {"messages": msgs}
        out.append(json.dumps(row, ensure_ascii=False))
    return out


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The 20,000-row input and one uninterrupted local run of it (workers 1), shared by the tests below."""
    tmp = tmp_path_factory.mktemp("big")
    lines = _conversations(ROWS, seed=21)
    source = tmp / "in.jsonl"
    source.write_text("".join(x + "\n" for x in lines), "utf-8")
    model = str(fetched.hf_tokenizer_dir("qwen2"))
    opts = BatchOptions(model=model, shard_rows=1000)
    manifest = run_batch(source, tmp / "whole", opts)
    return {"lines": lines, "source": source, "model": model, "opts": opts, "out": tmp / "whole", "manifest": manifest}


def test_20k_every_row_accounted_for_and_equal_to_encode(big: dict[str, Any]) -> None:
    lines, out, manifest = big["lines"], big["out"], big["manifest"]
    rows = _rows(out)
    errors = {e["row"]: e for e in map(json.loads, (out / "errors.jsonl").read_text("utf-8").splitlines())}
    assert sorted([*rows, *errors]) == list(range(ROWS)) and not set(rows) & set(errors)
    assert len(errors) == ROWS // 100 == manifest["error_count"] and manifest["rows"] == ROWS
    assert manifest["token_count"] == sum(r["length"] for r in rows.values())
    model = ctxlock.load(big["model"])
    for n in [*range(0, ROWS, 97), *errors]:
        try:
            mi = model.encode(lines[n], return_assistant_tokens_mask=True)
        except CtxlockError as exc:
            assert errors[n] == {"row": n, "type": type(exc).__name__, "path": exc.path, "message": exc.message}
            continue
        assert rows[n]["input_ids"] == mi["input_ids"][0].tolist()
        assert rows[n]["labels"] == np.where(mi["assistant_masks"][0] == 1, mi["input_ids"][0], -100).tolist()


def test_20k_byte_identical_on_ray(big: dict[str, Any], tmp_path: Path) -> None:
    manifest = run_batch(big["source"], tmp_path / "ray", big["opts"], engine=ray_engine(workers=2))
    assert manifest == big["manifest"]
    assert _tree(tmp_path / "ray") == _tree(big["out"])


def test_20k_two_workers_killed_and_resumed(big: dict[str, Any], tmp_path: Path) -> None:
    """A real `ctxlock batch --workers 2` killed with SIGKILL (its whole process group: the parent and its workers,
    as a crash would) after five shards, then `--resume` with --workers 2: the files of the uninterrupted
    --workers 1 run, byte for byte (so this is also the workers 1 / 2 identity on 20,000 rows)."""
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "ctxlock", "batch", str(big["source"]), str(out), "-m", big["model"]]
    cmd += ["--shard-rows", "1000", "--workers", "2", "--json"]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 150
    # Two workers finish shards out of order (shard 4 can land before shard 3), so wait for five records, not for
    # the fifth name.
    while len(list(out.glob("shard-*.json"))) < 5 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists(), "the run finished before it was killed"
    kept_before = len(list(out.glob("shard-*.json")))
    seen: list[Progress] = []
    manifest = run_batch(big["source"], out, big["opts"], workers=2, resume=True, on_progress=seen.append)
    assert seen[-1].shards_kept >= kept_before >= 5 and seen[-1].shards_done == ROWS // 1000
    assert manifest == big["manifest"]
    assert _tree(out) == _tree(big["out"])


def test_why_the_dataset_is_shards_not_read_json_rows(tmp_path: Path) -> None:
    """The engine's dataset is the job's shards, each actor reading its rows itself, rather than
    `ray.data.read_json`'s rows, for two reasons shown here: read_json fails the whole read on one bad line (the
    job makes it an error row at its number), and it reads well-formed requests into one inferred schema, so a
    message gets keys the user never sent (`"tool_calls": None` on every message of a request without tool calls),
    which changes what a template sees (`is defined`) and the request's digest."""
    with pytest.raises(Exception) as failed:  # Ray wraps pyarrow's ArrowInvalid in its own task errors
        ray.data.read_json(str(_hostile(tmp_path))).take_all()
    assert "JSON" in str(failed.value) or "ArrowInvalid" in str(failed.value), failed.value
    plain = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    tools = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
        ]
    }
    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps(plain) + "\n" + json.dumps(tools) + "\n", "utf-8")
    rows = ray.data.read_json(str(path)).take_all()
    first = next(r for r in rows if r["messages"][0]["content"] == "hi")
    assert "tool_calls" in first["messages"][0] and "tool_calls" not in plain["messages"][0]
    # the local engine reads the line as it is: the parsed request has no such key
    opts = BatchOptions(model="book", shard_rows=4)
    assert run_batch(path, tmp_path / "o", opts)["rows"] == 2
