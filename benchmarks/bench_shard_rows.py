"""`batch.shard_bytes` per row: what one `ctxlock batch` worker spends on a row, without the job around it.

    PYTHONPATH=src python benchmarks/bench_shard_rows.py [--rows 4000] [--passes 3] [--hf]

The rows are `bench_batch.py`'s (generated conversations, 1% bad), the model its Qwen2 vocabulary with fastokens
built and admitted first (`CTXLOCK_FASTOKENS=sync`), so the figure is a warm worker's. One untimed pass of 500 rows,
then `--passes` passes over `--rows` rows: the best and the median in µs a row (parse, render, encode, lay, mask,
digest, labels, the Parquet bytes). To compare two commits, run it with `PYTHONPATH` pointing at each tree's `src`,
alternated. `--hf` also times transformers' `apply_chat_template(..., return_assistant_tokens_mask=True)` on the
same rows in a plain loop (the generation-tagged Qwen2.5 template, as `bench_batch.py`'s peer), its best and median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
os.environ.setdefault("CTXLOCK_FASTOKENS", "sync")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--hf", action="store_true", help="also time the apply_chat_template loop")
    args = parser.parse_args()

    import bench_batch

    from ctxlock.batch import _run as batch

    raws = [line.encode() for line in bench_batch._rows(args.rows)]
    opts = batch.BatchOptions(model=bench_batch._model_dir(), shard_rows=args.rows)
    batch.shard_bytes(0, list(enumerate(raws[:500])), opts)  # untimed: model load, fastokens build and check
    times = []
    for _ in range(args.passes):
        t0 = time.perf_counter()
        batch.shard_bytes(0, list(enumerate(raws)), opts)
        times.append((time.perf_counter() - t0) / len(raws) * 1e6)
    print(f"ctxlock {batch.__file__}")
    print(f"  shard_bytes: best {min(times):.0f} µs a row, median {statistics.median(times):.0f} ({len(raws):,} rows)")
    if args.hf:
        tok, tagged_source = bench_batch._hf()
        rows = bench_batch._good([r.decode() for r in raws])
        fn = bench_batch._apply(tok, tagged_source, True)
        fn({"messages": rows[0]["messages"]})
        hf = []
        for _ in range(args.passes):
            t0 = time.perf_counter()
            for row in rows:
                fn({"messages": row["messages"]})
            hf.append((time.perf_counter() - t0) / len(rows) * 1e6)
        print(f"  apply_chat_template loop, masks: best {min(hf):.0f} µs a row, median {statistics.median(hf):.0f}")
        print(f"  ratio (medians): {statistics.median(hf) / statistics.median(times):.2f}x")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
