"""`ctxlock batch` against HF `datasets.map` with `apply_chat_template` on the same conversations, in one run.

    python benchmarks/bench_batch.py [--rows 10000] [--shard-rows 5000] [--repeat 3] [--skip-fresh] [--peers map,...]

The data: generated conversations (1 to 3 turns, mixed scripts, 1% bad rows) as JSONL. The model: the Qwen2
vocabulary as transformers converts llama.cpp's GGUF, with its own chat template (tests/fetched.py).

- ctxlock: `run_batch` (ids, provenance assistant masks, labels, Parquet shards, manifest), `--workers 1` (in this
  process: the first job loads the model, the timed ones reuse it) and `--workers 2` as a user runs it: a new
  process for every job, timed from before its imports (interpreter start-up excluded), which loads the model and
  then forks its worker (`ctxlock.core._forking`; the line "worker start" says which way it went), so that figure
  always includes start-up. Tokens are the shards'.
- peers, on the same rows (bad rows left out, as they cannot be parsed): `datasets.Dataset.from_list(rows).map(fn)`
  with fn = `apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=...)`:
  with masks on the generation-tagged Qwen2.5 template of tests/tagged.py (transformers needs `{% generation %}`
  tags; on the model's own, untagged template it returns all-zero masks), and without masks on the model's own
  template; `datasets.map(..., num_proc=2)` with masks; and the plain loop of the same call (no Arrow), both ways.
- warm: the headline sides (ctxlock with 1 and 2 workers, `datasets.map` with masks) run in interleaved rounds,
  after one untimed round, so that each round's ratios are taken within the same minute of a shared machine; the
  median of `--repeat` rounds, and the median of the per-round ratios. The other peers (`--peers`): the median of
  `--repeat` runs after them. fresh: one run in a new process
  (`--child`), timed from before its imports to the end (interpreter start-up excluded), model or tokenizer load
  included: what a user's one-off job costs.
Printed: tokens/s for each, the ratios, the 1 -> 2 worker scaling, peak RSS, the load average before and after.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
TAGGED = "Qwen-Qwen2.5-7B-Instruct.jinja"


def _rows(n: int, seed: int = 0) -> list[str]:
    rnd = random.Random(seed)
    words = ["alpha", "beta", "données", "日本語", "текст", "🙂", "print(x)", "42", "\n"]
    out = []
    for i in range(n):
        if rnd.random() < 0.01:
            out.append('{"messages": [')
            continue
        msgs = []
        for t in range(rnd.randint(1, 3)):
            q = " ".join(rnd.choice(words) for _ in range(rnd.randint(5, 60)))
            a = " ".join(rnd.choice(words) for _ in range(rnd.randint(10, 200)))
            msgs += [{"role": "user", "content": f"{i}.{t} {q}"}, {"role": "assistant", "content": a}]
        out.append(json.dumps({"messages": msgs}, ensure_ascii=False))
    return out


def _good(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _model_dir() -> str:
    import fetched

    return str(fetched.hf_tokenizer_dir("qwen2"))


# -- the sides ------------------------------------------------------------------------------------------------------


def _ctxlock(source: Path, workers: int, shard_rows: int) -> tuple[float, int, dict]:
    from ctxlock.batch._run import BatchOptions, run_batch

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        manifest = run_batch(
            source, Path(tmp) / "out", BatchOptions(model=_model_dir(), shard_rows=shard_rows), workers=workers
        )
        return time.perf_counter() - t0, manifest["token_count"], manifest


def _apply(tok: Any, template: str | None, masks: bool):
    def fn(example: dict[str, Any]) -> dict[str, Any]:
        out = tok.apply_chat_template(
            example["messages"],
            chat_template=template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=masks,
        )
        return dict(out)

    return fn


def _datasets_map(rows: list[dict], tok: Any, template: str | None, masks: bool, procs: int | None = None):
    import datasets

    t0 = time.perf_counter()
    mapped = datasets.Dataset.from_list(rows).map(
        _apply(tok, template, masks), remove_columns=["messages"], num_proc=procs
    )
    seconds = time.perf_counter() - t0
    return seconds, sum(len(x) for x in mapped["input_ids"])


def _loop(rows: list[dict], tok: Any, template: str | None, masks: bool) -> tuple[float, int]:
    fn = _apply(tok, template, masks)
    t0 = time.perf_counter()
    tokens = sum(len(fn({"messages": copy.deepcopy(r["messages"])})["input_ids"]) for r in rows)
    return time.perf_counter() - t0, tokens


def _hf() -> tuple[Any, str]:
    import datasets

    import reference
    import tagged

    datasets.disable_progress_bars()
    return reference.reference_tokenizer(_model_dir()), tagged.tagged_source(TAGGED)


# -- fresh processes ------------------------------------------------------------------------------------------------


def _child(kind: str, source: Path, shard_rows: int) -> None:
    """One job in this new process, timed from here (before the imports it needs): JSON on stdout. `ctxlock2` runs
    `--workers 2` and says how its worker was started (`ctxlock.core._forking`)."""
    t0 = time.perf_counter()
    if kind.startswith("ctxlock"):
        import ctxlock.batch._run

        started: list[tuple[str, str]] = []
        method = ctxlock.batch._run.start_method
        ctxlock.batch._run.start_method = lambda: started.append(method()) or started[-1]  # observed, not changed
        _, tokens, manifest = _ctxlock(source, 2 if kind == "ctxlock2" else 1, shard_rows)
        extra = {"manifest": manifest, "start": started[0] if started else None}
    else:
        tok, tagged_source = _hf()
        _, tokens = _datasets_map(_good(source.read_text("utf-8").splitlines()), tok, tagged_source, True)
        extra = {}
    print(json.dumps({"seconds": time.perf_counter() - t0, "tokens": tokens, **extra}))


def _fresh_run(kind: str, source: Path, shard_rows: int) -> dict[str, Any]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, __file__, "--child", kind, "--source", str(source), "--shard-rows", str(shard_rows)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout.splitlines()[-1])


def _fresh(kind: str, source: Path, shard_rows: int) -> tuple[float, int]:
    out = _fresh_run(kind, source, shard_rows)
    return out["seconds"], out["tokens"]


# -- the run --------------------------------------------------------------------------------------------------------


def _median(fn: Any, repeat: int, warm: Any = None) -> tuple[float, int]:
    if warm is not None:
        warm()  # untimed
    runs = [fn() for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), runs[0][1]


def _line(name: str, seconds: float, tokens: int) -> float:
    rate = tokens / seconds
    print(f"  {name:<58} {seconds:7.2f} s  {tokens:>10,} tok  {rate:>10,.0f} tok/s")
    return rate


PEERS = {
    "map": ("datasets.map, masks (tagged Qwen2.5 template)", "map", True, True, None),
    "map-nomask": ("datasets.map, no masks (the model's own template)", "map", False, False, None),
    "map2": ("datasets.map num_proc=2, masks (tagged)", "map", True, True, 2),
    "loop": ("loop of apply_chat_template, masks (tagged)", "loop", True, True, None),
    "loop-nomask": ("loop of apply_chat_template, no masks", "loop", False, False, None),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--shard-rows", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-fresh", action="store_true", help="no fresh-process first pass")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"the other peers to time, of: {','.join(PEERS)}")
    ap.add_argument("--child", choices=["ctxlock", "ctxlock2", "datasets"], help=argparse.SUPPRESS)
    ap.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.source, args.shard_rows)
        return

    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    lines = _rows(args.rows)
    rows = _good(lines)
    tok, tagged_source = _hf()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.jsonl"
        source.write_text("".join(x + "\n" for x in lines), "utf-8")
        print(f"{args.rows:,} rows ({args.rows - len(rows)} bad), shards of {args.shard_rows}, Qwen2 vocabulary")
        c1, c2, manifests = _rounds(source, rows, tok, tagged_source, args.shard_rows, args.repeat)
        rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rss_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # before the fresh children
        if not args.skip_fresh:
            print("fresh process, first pass (imports and model/tokenizer load included):")
            fc = _line("ctxlock batch --workers 1", *_fresh("ctxlock", source, args.shard_rows))
            fd = _line("datasets.map(apply_chat_template, masks, tagged)", *_fresh("datasets", source, args.shard_rows))
            print(f"  ratio ctxlock / datasets.map (masks): {fc / fd:.2f}x")
            print(
                f"  ratio ctxlock --workers 2 (the rounds' new processes, median) / this datasets.map: {c2 / fd:.2f}x"
            )
    assert all(m == manifests[0] for m in manifests), "workers 1 and 2 gave different manifests"
    names = [n for n in args.peers.split(",") if n and n != "map"]
    if names:
        print(f"the other peers, warm, median of {args.repeat}:")
    for name in names:
        label, kind, tagged, masks, procs = PEERS[name]
        fn = _datasets_map if kind == "map" else _loop
        extra = (tagged_source if tagged else None, masks, *([procs] if procs else []))
        rate = _line(label, *_median(lambda f=fn, e=extra: f(rows, tok, *e), args.repeat))
        print(f"    ctxlock 1 worker / this: {c1 / rate:.2f}x   2 workers / this: {c2 / rate:.2f}x")
    print(
        f"peak RSS: {rss_self:,.0f} MiB this process (workers 1, the peers' data), {rss_child:,.0f} MiB largest worker"
    )
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


def _rounds(source: Path, rows: list[dict], tok: Any, tagged_source: str, shard_rows: int, repeat: int) -> Any:
    """The headline, interleaved so each ratio is taken within one minute of a shared machine: one untimed round,
    then `repeat` rounds of (ctxlock --workers 1, datasets.map with masks, ctxlock --workers 2). Printed: each
    side's median and the median of the per-round ratios. Returns ctxlock's tokens/s (1, 2 workers), the manifests."""
    manifests: list[dict] = []

    starts: list[Any] = []

    def ctx(workers: int) -> tuple[float, int]:
        if workers == 1:
            seconds, tokens, manifest = _ctxlock(source, workers, shard_rows)
        else:  # as a user runs it: a new process (imports and model load timed), its worker forked or spawned
            out = _fresh_run("ctxlock2", source, shard_rows)
            seconds, tokens, manifest = out["seconds"], out["tokens"], out["manifest"]
            starts.append(out["start"])
        manifests.append(manifest)
        return seconds, tokens

    def dmap() -> tuple[float, int]:
        return _datasets_map(rows, tok, tagged_source, True)

    ctx(1), dmap()  # untimed: the model, the tokenizer and the template loaded in this process
    print(f"warm, interleaved rounds (ctxlock 1 worker, datasets.map masks, ctxlock 2 workers), median of {repeat}:")
    runs = []
    for k in range(repeat):
        runs.append((ctx(1), dmap(), ctx(2)))
        print(f"  round {k + 1}: " + ", ".join(f"{s:.2f} s" for s, _ in runs[-1]) + f"  load {os.getloadavg()[0]:.2f}")
    medians = [statistics.median(r[i][0] for r in runs) for i in range(3)]
    names = ("ctxlock batch --workers 1 (ids + masks + labels + Parquet)", "datasets.map, masks (tagged Qwen2.5)")
    names += ("ctxlock batch --workers 2, a new process each (imports, load)",)
    c1, _, c2 = (_line(n, m, runs[0][i][1]) for i, (n, m) in enumerate(zip(names, medians, strict=True)))
    ratio = [(r[0][1] / r[0][0]) / (r[1][1] / r[1][0]) for r in runs]
    ratio2 = [(r[2][1] / r[2][0]) / (r[1][1] / r[1][0]) for r in runs]
    scale = [r[0][0] / r[2][0] for r in runs]
    print("ratios (tokens/s; median of the per-round ratios, and the rounds'):")
    print(f"  ctxlock 1 worker / datasets.map masks: {statistics.median(ratio):.2f}x  {_fmt(ratio)}")
    print(f"  ctxlock 2 workers / datasets.map masks: {statistics.median(ratio2):.2f}x  {_fmt(ratio2)}")
    print(f"  scaling 1 -> 2 workers: {statistics.median(scale):.2f}x  {_fmt(scale)}   manifests equal: asserted")
    print(f"  the 2-worker jobs' worker start: {sorted({tuple(x) if x else None for x in starts})}")
    return c1, c2, manifests


def _fmt(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.2f}" for v in values) + ")"


if __name__ == "__main__":
    main()
