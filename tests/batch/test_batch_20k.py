"""The 20,000-row acceptance run of `ctxlock batch` (1% bad rows), on the local engine: no Ray here.

Its own module, so that `pytest -n 2 --dist loadfile` runs it on one worker while the Ray cluster's module
(test_batch_ray.py) runs on the other. The dataset is run once uninterrupted with --workers 1 (a module fixture) and
checked against Model.encode, and against a real `ctxlock batch --workers 2` process killed with SIGKILL mid-run
and then resumed with --workers 2. (The Ray engine's identity to the local one is held in test_batch_ray.py by the
hostile inputs and the fault test's rows; benchmarks/bench_ray_nodes.py checks it on these 20,000 rows.)
"""

from __future__ import annotations

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
import pytest
from test_batch import _rows, _tree

import ctxlock
import fetched
from ctxlock.batch._run import BatchOptions, Progress, run_batch
from ctxlock.errors import CtxlockError

SRC = Path(__file__).resolve().parents[2] / "src"
ROWS = 20_000


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
