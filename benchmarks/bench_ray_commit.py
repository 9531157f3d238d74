"""The Ray engine's commit step (`ctxlock.batch._dist.commit`) over N shard records: seconds, on this filesystem.

    python benchmarks/bench_ray_commit.py [--shards 10000] [--errors-per-shard 0] [--rounds 3]

The commit is one task that reads every shard's record file, one after another (each checked against the sha256
its shard task sent back), and writes `errors.jsonl` and `manifest.json` from them (docs/batch-ray.md, "Throughput
for N nodes"). No Ray here: the function the task runs, timed in this process. The records are synthetic: one
real record (a 2-row job of the `book` model), copied N times with its index and rows changed to shards of 10,000
rows, each with `--errors-per-shard` error rows (100 is 1% bad rows); beside each record an empty Parquet file, so
that the directory holds 2N files as a job's does. Printed: each round's seconds, the median, per shard, the sizes
written, the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SHARD_ROWS = 10_000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--errors-per-shard", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from ctxlock.batch._dist import commit, slim
    from ctxlock.batch._output import json_bytes
    from ctxlock.batch._run import BatchOptions, run_batch

    work = Path(tempfile.mkdtemp(prefix="ctxr-commit-"))
    try:
        source = work / "in.jsonl"
        source.write_text(
            '{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello."}]}\n{"messages": [\n',
            "utf-8",
        )
        opts = BatchOptions(model="book", shard_rows=2)
        manifest = run_batch(source, work / "real", opts)
        real = json.loads((work / "real" / "shard-00000.json").read_text("utf-8"))
        error = real["errors"][0]
        out = work / "out"
        out.mkdir()
        records = []
        for i in range(args.shards):
            first = i * SHARD_ROWS
            record = {
                **real,
                "index": i,
                "file": f"shard-{i:05d}.parquet",
                "rows": [first, first + SHARD_ROWS],
                "errors": [{**error, "row": first + k} for k in range(args.errors_per_shard)],
                "error_count": args.errors_per_shard,
                "row_count": SHARD_ROWS - args.errors_per_shard,
            }
            (out / f"shard-{i:05d}.json").write_bytes(json_bytes(record))
            (out / f"shard-{i:05d}.parquet").write_bytes(b"")
            records.append(slim(record))  # what the shard task sends back to the driver
        record_bytes = sum(p.stat().st_size for p in out.glob("shard-*.json"))
        seconds = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            commit(manifest["input"], str(out), opts, records, False)
            seconds.append(time.perf_counter() - t0)
        median = statistics.median(seconds)
        summary = {
            "shards": args.shards,
            "errors_per_shard": args.errors_per_shard,
            "record_bytes": record_bytes,
            "manifest_bytes": (out / "manifest.json").stat().st_size,
            "errors_bytes": (out / "errors.jsonl").stat().st_size,
            "seconds": [round(s, 3) for s in seconds],
            "median_s": round(median, 3),
            "ms_per_shard": round(1000 * median / args.shards, 3),
            "cpus": os.cpu_count(),
            "load_1min": os.getloadavg()[0],
        }
        print(json.dumps(summary, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
