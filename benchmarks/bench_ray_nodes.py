"""`ctxlock batch --engine ray` on one node, then two (1 CPU each), on the same input: rows per second.

    python benchmarks/bench_ray_nodes.py [--rows 20000] [--shard-rows 1000] [--rounds 2]

A local cluster on this machine, as tests/batch/test_batch_ray.py starts it: `ray start --head` (1 CPU, 2 GB of
Ray memory, a 100 MB object store, its own temporary directory and ports, token authentication), the job run
`--rounds` times from this process as the driver; then a second node joins (`ray start --address`, the same
limits) and the job runs again. Each round writes into an empty directory and its output is checked byte for
byte against the first round's. The first round on a node count pays for starting the workers and loading the
model in each (a worker process keeps it for the next task); the last is reported as the warm figure. The cluster
is torn down by pid at the end (each node's processes are in their own session), even on failure.

The input is tests/batch/test_batch_20k.py's 20,000-row conversations (1% bad rows) and the Qwen2 tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "batch"))
from ray_nodes import free_port, kill_session  # noqa: E402 (tests/ray_nodes.py, on the path above)

NODE = ["--num-cpus=1", "--memory=2000000000", "--object-store-memory=100000000", "--disable-usage-stats"]


def _start(env: dict[str, str], *args: str) -> int:
    ray = Path(sys.executable).parent / "ray"
    proc = subprocess.Popen(
        [str(ray), "start", *args, *NODE],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out, _ = proc.communicate(timeout=90)
    if proc.returncode:
        kill_session(proc.pid)
        raise RuntimeError(out.decode(errors="replace")[-3000:])
    return proc.pid


def _tree(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--shard-rows", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    os.environ["RAY_AUTH_MODE"] = "token"  # before Ray reads its config (the cluster below uses token auth)
    import ray
    from test_batch_20k import _conversations

    import fetched
    from ctxlock.batch._ray import ray_engine
    from ctxlock.batch._run import BatchOptions, run_batch

    work = Path(tempfile.mkdtemp(prefix="ctxr-bench-", dir="/tmp"))
    source = work / "in.jsonl"
    source.write_text("".join(x + "\n" for x in _conversations(args.rows, seed=21)), "utf-8")
    opts = BatchOptions(model=str(fetched.hf_tokenizer_dir("qwen2")), shard_rows=args.shard_rows)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    sessions: list[int] = []
    results: dict[int, list[float]] = {}
    first: dict[str, bytes] | None = None
    try:
        head_args = [f"--port={port}", f"--temp-dir={work / 'ray'}", "--include-dashboard=false"]
        head_args += [f"--dashboard-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}"]
        sessions.append(_start(env, "--head", *head_args))
        ray.init(address=f"127.0.0.1:{port}", log_to_driver=False, logging_level="WARNING")
        for nodes in (1, 2):
            if nodes == 2:
                agent = f"--dashboard-agent-listen-port={free_port()}"
                sessions.append(_start(env, f"--address=127.0.0.1:{port}", f"--temp-dir={work / 'ray'}", agent))
                while sum(n["Alive"] for n in ray.nodes()) < 2:
                    time.sleep(0.1)
            for k in range(args.rounds):
                out = work / f"out-{nodes}-{k}"
                t0 = time.perf_counter()
                manifest = run_batch(source, out, opts, engine=ray_engine(workers=nodes))
                seconds = time.perf_counter() - t0
                results.setdefault(nodes, []).append(seconds)
                tree = _tree(out)
                first = first or tree
                assert tree == first, "the output differs between runs"
                print(
                    f"{nodes} node(s), round {k + 1}: {seconds:.2f} s, {manifest['rows'] / seconds:,.0f} rows/s, "
                    f"{manifest['token_count'] / seconds:,.0f} tokens/s",
                    flush=True,
                )
                shutil.rmtree(out)
    finally:
        ray.shutdown()
        for sid in reversed(sessions):
            kill_session(sid)
        shutil.rmtree(work, ignore_errors=True)
    one, two = results[1][-1], results[2][-1]
    summary = {
        "rows": args.rows,
        "shard_rows": args.shard_rows,
        "cpus": os.cpu_count(),
        "load_1min": os.getloadavg()[0],
        "seconds": {str(n): [round(s, 2) for s in v] for n, v in results.items()},
        "rows_per_s_warm": {"1": round(args.rows / one), "2": round(args.rows / two)},
        "speedup_warm": round(one / two, 2),
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
