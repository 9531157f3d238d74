"""Hostile input to `ctxlock trajectory` and `ctxlock batch --trajectories` found by generated cases: log-probs past
a float's range, long repeated tool output (the alignment of the forks bounded), a full disk under --out and stdout,
a --messages-column that holds no lists, file:// URIs with a host and inputs that are no regular files."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ctxlock
from cli_runner import run_main
from ctxlock.batch import BatchOptions, run_batch
from ctxlock.errors import TrajectoryError
from ctxlock.trajectory import _forks, build_line, read_line

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "weather-trajectory.jsonl"
HI = {"messages": [{"role": "user", "content": "hi"}], "steps": [{"completion_ids": [1, 2]}]}


def _example() -> dict[str, Any]:
    return json.loads(EXAMPLE.read_text("utf-8"))


@pytest.mark.parametrize("value", [10**400, -(10**400)], ids=["1e400", "-1e400"])
def test_logprobs_past_a_floats_range_are_errors_naming_the_path(value: int) -> None:
    line = {**HI, "steps": [{"completion_ids": [1, 2], "logprobs": [-0.5, value]}]}
    with pytest.raises(TrajectoryError) as exc:
        build_line(ctxlock.load(), read_line(json.dumps(line), "x:1"), "x:1")
    assert exc.value.path == "x:1 $.steps[0].logprobs[1]"
    assert "(401 chars)" in exc.value.message or "(402 chars)" in exc.value.message  # the value cut, not 400 digits


def _forks_of(r: Any) -> list[tuple[str, tuple[int, int], tuple[int, int]]]:
    return [(f.cause, f.trajectory_tokens, f.canonical_tokens) for f in r.forks]


def test_repeated_tool_output_is_aligned_in_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool's output of one repeated character: the exact alignment is quadratic (minutes at 100,000 "x"). Past
    MAX_ALIGN_WORK the shared head and tail are kept as they are: on the example the forks are the exact ones."""
    model = ctxlock.load()
    line = _example()
    line["steps"][1]["messages"][0]["content"] = "x" * 3000
    exact = build_line(model, line, "x:1")
    assert not any("bounded time" in n for n in exact.notes)
    monkeypatch.setattr(_forks, "MAX_ALIGN_WORK", 0)
    bounded = build_line(model, line, "x:1")
    assert _forks_of(bounded) == _forks_of(exact) and [f.cause for f in exact.forks] == [
        "history-rewrite",
        "retokenization",
    ]
    assert any("bounded time" in n for n in bounded.notes)
    monkeypatch.undo()
    line["steps"][1]["messages"][0]["content"] = "x" * 100_000  # was about 4 minutes; now under a second
    big = build_line(model, line, "x:1")
    assert [f.cause for f in big.forks] == ["history-rewrite", "retokenization"]
    assert any("bounded time" in n for n in big.notes)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_is_one_error_line(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(HI) + "\n")
    code, _, err = run_main(["trajectory", str(source), "-o", "/dev/full"])
    assert code == 1 and err.startswith("error: InputError: --out /dev/full: cannot write: ") and err.count("\n") == 1
    # stdout on a full device (`ctxlock trajectory IN --json > /dev/full`)
    from ctxlock.cli import main

    stderr = io.StringIO()
    full = open("/dev/full", "w")  # noqa: SIM115 (closed below: its close fails as its writes did)
    old, sys.stdout = sys.stdout, full
    try:
        with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exc:
            main(["trajectory", str(source), "--json"])
    finally:
        sys.stdout = old
        with contextlib.suppress(OSError):
            full.close()
    assert exc.value.code == 1 and stderr.getvalue().startswith("error: cannot write the output: ")


def test_batch_rows_past_a_floats_range_are_error_rows(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    bad = {**HI, "steps": [{"completion_ids": [1, 2], "logprobs": [-(10**400), None]}]}
    source.write_text(json.dumps(HI) + "\n" + json.dumps(bad) + "\n")
    run_batch(source, tmp_path / "out", BatchOptions(trajectories=True))
    errors = [json.loads(x) for x in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [(e["row"], e["path"]) for e in errors] == [(1, "row 1 $.steps[0].logprobs[0]")]


def test_batch_refuses_a_messages_column_of_no_lists_and_file_uris_with_a_host(tmp_path: Path) -> None:
    table = pa.table({"conv": [[{"role": "user", "content": "hi"}]], "n": [1], "steps": [HI["steps"]]})
    pq.write_table(table, tmp_path / "in.parquet")
    code, _, err = run_main(["batch", str(tmp_path / "in.parquet"), str(tmp_path / "o"), "--messages-column", "n"])
    assert code == 1 and "column 'n' holds int64, not messages" in err
    for args in (["file://tmp/in.jsonl", str(tmp_path / "o")], [str(tmp_path / "in.parquet"), "file://out/x"]):
        code, _, err = run_main(["batch", *args, "--trajectories"])
        assert code == 1 and "a file URI's path starts at its third slash" in err, err
    assert not os.path.exists("/x")
    os.mkfifo(tmp_path / "fifo.jsonl")
    code, _, err = run_main(["batch", f"file://{tmp_path}/fifo.jsonl", str(tmp_path / "o"), "--trajectories"])
    assert code == 1 and "not a regular file" in err
