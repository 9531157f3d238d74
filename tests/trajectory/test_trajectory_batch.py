"""`ctxlock batch --trajectories` (docs/batch.md, "Trajectories"): every line in a shard or in errors.jsonl, the
same bytes for one worker and two, a JSONL input and a Parquet `request` column, `--resume`, and each row's values
those of the Python API (`ctxlock.trajectory.build_line`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ctxlock
from ctxlock.batch import BatchOptions, run_batch
from ctxlock.errors import InputError
from ctxlock.trajectory import PARTS, build_line, read_line

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "weather-trajectory.jsonl"
HI = {
    "messages": [{"role": "user", "content": "Hi"}],
    "steps": [
        {"completion_ids": [22177, 1046, 2], "logprobs": [-0.1, None, -0.3]},
        {"messages": [{"role": "user", "content": "Bye"}]},
    ],
}
BAD_ID = {"messages": [{"role": "user", "content": "hi"}], "steps": [{"completion_ids": [1, 10**9]}]}
OPTS = BatchOptions(shard_rows=2, trajectories=True)


def _lines() -> list[bytes]:
    return [EXAMPLE.read_bytes().strip(), json.dumps(BAD_ID).encode(), b"{not json", json.dumps(HI).encode()]


def _tree(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("trajectory-batch")
    source = tmp / "in.jsonl"
    source.write_bytes(b"".join(line + b"\n" for line in _lines()))
    run_batch(source, tmp / "one", OPTS, workers=1)
    run_batch(source, tmp / "two", OPTS, workers=2)
    return tmp


def test_workers_give_the_same_bytes_and_bad_lines_are_error_rows(jobs: Path) -> None:
    one = _tree(jobs / "one")
    assert one == _tree(jobs / "two")
    assert sorted(one) == [
        "errors.jsonl",
        "manifest.json",
        "shard-00000.json",
        "shard-00000.parquet",
        "shard-00001.json",
        "shard-00001.parquet",
    ]
    errors = [json.loads(line) for line in one["errors.jsonl"].splitlines()]
    assert [(e["row"], e["type"], e["path"]) for e in errors] == [
        (1, "TrajectoryError", "row 1 $.steps[0].completion_ids[1]"),
        (2, "TrajectoryError", "row 2 column 2"),
    ]
    manifest = json.loads(one["manifest.json"])
    assert manifest["policy"]["trajectories"] is True and manifest["policy"]["trajectory_parts"] == list(PARTS)
    assert (manifest["rows"], manifest["row_count"], manifest["error_count"]) == (4, 2, 2)
    assert [s["forks"]["retokenization"] for s in manifest["shards"]] == [1, 0]
    assert [s["forks"]["history-rewrite"] for s in manifest["shards"]] == [1, 0]


def test_rows_are_the_python_apis(jobs: Path) -> None:
    table = pa.concat_tables(pq.read_table(jobs / "one" / f"shard-0000{k}.parquet") for k in (0, 1))
    model = ctxlock.load()
    assert table.column("row").to_pylist() == [0, 3]
    manifest = json.loads((jobs / "one" / "manifest.json").read_bytes())
    assert manifest["token_count"] == sum(table.column("length").to_pylist())
    for got, line in zip(table.to_pylist(), [_lines()[0], _lines()[3]], strict=True):
        r = build_line(model, read_line(line, "x"), "x")
        assert got["input_ids"] == r.ids.tolist() and got["length"] == len(r.ids)
        assert got["loss_mask"] == r.loss_mask.tolist()
        assert got["labels"] == [i if m else -100 for i, m in zip(r.ids.tolist(), r.loss_mask.tolist(), strict=True)]
        assert got["step"] == r.step.tolist() and got["part"] == r.part.tolist()
        assert [None if math.isnan(x) else x for x in got["logprobs"]] == r.to_dict()["logprobs"]
        assert json.loads(got["forks"]) == [f.to_dict() for f in r.forks]
        assert json.loads(got["steps"]) == [s.to_dict() for s in r.steps]
        assert json.loads(got["notes"]) == list(r.notes)
    assert sum(np.asarray(m).sum() for m in table.column("loss_mask").to_pylist()) == manifest["trained_tokens"]


def test_each_log_prob_is_the_given_one_at_its_token(jobs: Path) -> None:
    """A row's `logprobs` (float64) hold each log-prob the line gives, exactly, at its completion token (a null is
    NaN), and NaN at every other token: the example's first completion gives them (some null), its second none;
    the other line gives [-0.1, null, -0.3]."""
    table = pa.concat_tables(pq.read_table(jobs / "one" / f"shard-0000{k}.parquet") for k in (0, 1))
    assert table.schema.field("logprobs").type == pa.list_(pa.float64())
    for got, line in zip(table.to_pylist(), [_lines()[0], _lines()[3]], strict=True):
        given = [step.get("logprobs") for step in json.loads(line)["steps"] if "completion_ids" in step]
        spans = [s["tokens"] for s in json.loads(got["steps"]) if s["kind"] == "completion"]
        expected = np.full(got["length"], np.nan)
        for (start, end), probs in zip(spans, given, strict=True):
            if probs is not None:
                expected[start:end] = [np.nan if p is None else p for p in probs]
        np.testing.assert_array_equal(np.asarray(got["logprobs"], dtype=np.float64), expected)
        assert 0 < int(np.sum(~np.isnan(expected))) < sum(end - start for start, end in spans)


def test_parquet_request_column_and_resume(jobs: Path) -> None:
    """The same lines as a Parquet `request` column make the same shard files; a resume keeps every shard."""
    source = jobs / "in.parquet"
    pq.write_table(pa.table({"request": [line.decode() for line in _lines()]}), source)
    run_batch(source, jobs / "pq", OPTS)
    jsonl, parquet = _tree(jobs / "one"), _tree(jobs / "pq")
    assert all(jsonl[k] == parquet[k] for k in jsonl if k.startswith("shard-"))
    seen = []
    again = run_batch(jobs / "in.jsonl", jobs / "one", OPTS, resume=True, on_progress=seen.append)
    assert seen[-1].shards_kept == 2 and not seen[-1].remade
    assert _tree(jobs / "one") == _tree(jobs / "two") and again["row_count"] == 2


def test_options_that_cut_or_remask_are_refused() -> None:
    for extra in ({"pack": 64}, {"max_length": 64}):
        with pytest.raises(InputError, match="keeps each trajectory whole"):
            BatchOptions(trajectories=True, **extra)  # type: ignore[arg-type]
