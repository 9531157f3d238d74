"""`ctxlock batch`: 1 against 2 local workers, the Ray engine against the local one, and peak RSS per process.

    python benchmarks/bench_batch_workers.py [--rows 20000] [--shard-rows 1000] [--engines local1,local2,ray2]
        [--repeat 3]

Each job is a fresh `python -m ctxlock batch IN OUT -m <qwen2> --workers N [--engine ray]` process into an empty
directory, so its wall time includes Python's start, the imports, starting the workers (or Ray) and loading the
model in each; the jobs run one after another on the same input (the generator of tests/batch/test_batch_20k.py: 1 to 3
turns, mixed scripts, 1% bad rows). While a job runs, this script reads `/proc/<pid>/status` of the job and every
process under it every 0.1 s: each one's peak RSS (`VmHWM`), and the largest worker's RSS when a quarter, half,
three quarters and all of the job's time had passed (a flat line: memory does not grow with the input).
The engines run in `--repeat` rounds (each round all of them, one after another), so that each round's ratios
are taken within the same minutes of a shared machine. Printed: per job, wall time, CPU time (user + sys of the job
and of the workers it waited for), tokens/s,
steady-state rows/s (the rows of the shards after the first, over the time between the first and the last shard's
record: start-up left out), the processes' peak RSS; then the 1 -> 2 worker scaling, Ray's time against the local
engine's at the same worker count (medians over the rounds, each round's figure beside), and whether all outputs
are byte-identical (they must be).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
SRC = Path(__file__).resolve().parents[1] / "src"


def _tree(pid: int) -> list[int]:
    """`pid` and every process under it (by /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


def _status(pid: int) -> tuple[str, int, int] | None:
    """(name, VmRSS MiB, VmHWM MiB) of a live process."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    values = {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}
    if "VmHWM" not in values:
        return None
    return cmd[:60], int(values["VmRSS"].split()[0]) // 1024, int(values["VmHWM"].split()[0]) // 1024


def _job(source: Path, model: str, workers: int, engine: str, shard_rows: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="bench-batch-")) / "out"
    cmd = [sys.executable, "-m", "ctxlock", "batch", str(source), str(out), "-m", model]
    cmd += ["--workers", str(workers), "--engine", engine, "--shard-rows", str(shard_rows), "--json"]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    peak: dict[int, tuple[str, int]] = {}
    timeline: list[tuple[float, int]] = []  # (seconds, the largest non-driver process's RSS)
    while proc.poll() is None:
        rss_now = 0
        for pid in _tree(proc.pid):
            st = _status(pid)
            if st is None:
                continue
            peak[pid] = (st[0], max(st[2], peak.get(pid, ("", 0))[1]))
            if pid != proc.pid and _is_worker(st[0]):
                rss_now = max(rss_now, st[1])
        timeline.append((time.perf_counter() - t0, rss_now))
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the job and the processes it waited for
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    stdout = proc.stdout.read() if proc.stdout else b""
    if proc.returncode != 0:
        raise SystemExit(f"job failed: {' '.join(cmd)}")
    manifest = json.loads(stdout)
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(out.iterdir()))).hexdigest()
    # Steady state: the rows of the shards finished after the first one, over the time between the first and the
    # last shard's record (their mtimes): start-up (imports, workers, model loads, Ray) left out.
    done = sorted((p.stat().st_mtime, json.loads(p.read_text())) for p in out.glob("shard-*.json"))
    span = done[-1][0] - done[0][0]
    later = sum(r["rows"][1] - r["rows"][0] for _, r in done[1:])
    steady = later / span if len(done) > 1 and span > 0 else float("nan")
    return {
        "cpu": cpu,
        "steady": steady,
        "wall": wall,
        "manifest": manifest,
        "peak": peak,
        "timeline": timeline,
        "digest": digest,
        "pid": proc.pid,
    }


def _is_worker(cmd: str) -> bool:
    """A process under the job that encodes: spawned (multiprocessing's command line), forked (the job's own
    command line, `ctxlock batch`), or a Ray actor."""
    return "multiprocessing" in cmd or cmd.startswith("ray::") or "spawn_main" in cmd or "ctxlock batch" in cmd


def _quarters(timeline: list[tuple[float, int]], wall: float) -> str:
    marks = []
    for q in (0.25, 0.5, 0.75, 0.98):
        before = [rss for t, rss in timeline if t <= q * wall]
        marks.append(f"{before[-1] if before else 0}")
    return " / ".join(marks) + " MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--shard-rows", type=int, default=1000)
    ap.add_argument("--engines", default="local1,local2,ray2")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of all the engines, one after another")
    args = ap.parse_args()

    from test_batch_20k import _conversations

    import fetched

    model = str(fetched.hf_tokenizer_dir("qwen2"))
    names = args.engines.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.jsonl"
        source.write_text("".join(x + "\n" for x in _conversations(args.rows, seed=21)), "utf-8")
        print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
        rounds: list[dict[str, dict]] = []
        for k in range(args.repeat):
            print(f"round {k + 1}:")
            results = {}
            for name in names:
                engine, workers = name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")) :])
                results[name] = r = _job(source, model, workers, engine, args.shard_rows)
                _report(name, r)
            rounds.append(results)
        print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    _summary(names, rounds)


def _report(name: str, r: dict) -> None:
    m = r["manifest"]
    print(
        f"  {name:7s} {r['wall']:7.2f} s  {m['token_count'] / r['wall']:>9,.0f} tokens/s  "
        f"{m['rows'] / r['wall']:>7,.0f} rows/s  ({m['rows']:,} rows, {m['token_count']:,} tokens); "
        f"steady state {r['steady']:,.0f} rows/s; load {os.getloadavg()[0]:.2f}"
    )
    driver = r["peak"].get(r["pid"], ("", 0))[1]
    workers_peak = sorted((v[1] for p, v in r["peak"].items() if p != r["pid"] and _is_worker(v[0])))
    print(f"          CPU time (user + sys) of the job and its workers: {r['cpu']:.2f} s")
    print(f"          peak RSS: the command's process {driver} MiB; workers {workers_peak} MiB")
    if workers_peak:
        print(f"          largest worker's RSS at 1/4, 1/2, 3/4, end: {_quarters(r['timeline'], r['wall'])}")


def _summary(names: list[str], rounds: list[dict[str, dict]]) -> None:
    """Medians over the rounds, and the per-round ratios (each taken within one round)."""
    med = statistics.median
    print(f"median of {len(rounds)} rounds:")
    for name in names:
        walls = [r[name]["wall"] for r in rounds]
        cpus = [r[name]["cpu"] for r in rounds]
        print(f"  {name:7s} wall {med(walls):.2f} s {_fmt(walls)}  CPU {med(cpus):.2f} s {_fmt(cpus)}")
    if "local1" in names and "local2" in names:
        wall = [r["local1"]["wall"] / r["local2"]["wall"] for r in rounds]
        steady = [r["local2"]["steady"] / r["local1"]["steady"] for r in rounds]
        cpu = [r["local2"]["cpu"] / r["local1"]["cpu"] for r in rounds]
        print(f"  scaling local 1 -> 2 workers: {med(wall):.2f}x wall {_fmt(wall)} (fresh processes)")
        print(f"    steady state {med(steady):.2f}x {_fmt(steady)}")
        print(f"    CPU time 2 workers / 1: {med(cpu):.2f}x {_fmt(cpu)}")
    if "local2" in names and "ray2" in names:
        ray = [r["ray2"]["wall"] / r["local2"]["wall"] for r in rounds]
        print(f"  ray (2 actors) / local (2 workers): {med(ray):.2f}x the wall time {_fmt(ray)}")
    digests = {r[name]["digest"] for r in rounds for name in names}
    print(f"outputs byte-identical: {len(digests) == 1}")


def _fmt(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.2f}" for v in values) + ")"


if __name__ == "__main__":
    main()
