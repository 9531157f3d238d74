"""`ctxlock batch` against HF `datasets.map` with `apply_chat_template` on the same conversations, in one run.

    python benchmarks/bench_batch.py [--rows 10000] [--shard-rows 5000] [--repeat 2] [--skip-fresh]

The data: generated conversations (1 to 3 turns, mixed scripts, 1% bad rows) as JSONL. The model: the Qwen2
vocabulary as transformers converts llama.cpp's GGUF, with its own chat template (tests/fetched.py).

- ctxlock: `run_batch` (ids, provenance assistant masks, labels, Parquet shards, manifest), `--workers 1` (in this
  process: the first job loads the model, the timed ones reuse it) and `--workers 2` (spawned processes: every job
  starts its workers and loads the model in each, so that figure always includes start-up). Tokens are the shards'.
- peers, on the same rows (bad rows left out, as they cannot be parsed): `datasets.Dataset.from_list(rows).map(fn)`
  with fn = `apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=...)`:
  with masks on the generation-tagged Qwen2.5 template of tests/tagged.py (transformers needs `{% generation %}`
  tags; on the model's own, untagged template it returns all-zero masks), and without masks on the model's own
  template; `datasets.map(..., num_proc=2)` with masks; and the plain loop of the same call (no Arrow), both ways.
- warm: the median of `--repeat` timed runs, after one untimed run of each. fresh: one run in a new process
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
    from ctxlock.batch import BatchOptions, run_batch

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
    """One job in this new process, timed from here (before the imports it needs): JSON on stdout."""
    t0 = time.perf_counter()
    if kind == "ctxlock":
        _, tokens, _ = _ctxlock(source, 1, shard_rows)
    else:
        tok, tagged_source = _hf()
        _, tokens = _datasets_map(_good(source.read_text("utf-8").splitlines()), tok, tagged_source, True)
    print(json.dumps({"seconds": time.perf_counter() - t0, "tokens": tokens}))


def _fresh(kind: str, source: Path, shard_rows: int) -> tuple[float, int]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, __file__, "--child", kind, "--source", str(source), "--shard-rows", str(shard_rows)]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout.splitlines()[-1])
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--shard-rows", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-fresh", action="store_true", help="no fresh-process first pass")
    ap.add_argument("--child", choices=["ctxlock", "datasets"], help=argparse.SUPPRESS)
    ap.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.source, args.shard_rows)
        return

    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    lines = _rows(args.rows)
    rows = _good(lines)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.jsonl"
        source.write_text("".join(x + "\n" for x in lines), "utf-8")
        print(f"{args.rows:,} rows ({args.rows - len(rows)} bad), shards of {args.shard_rows}, Qwen2 vocabulary")
        print(f"warm, median of {args.repeat}:")
        manifests: list[dict] = []

        def job(workers: int) -> Any:
            def run() -> tuple[float, int]:
                seconds, tokens, manifest = _ctxlock(source, workers, args.shard_rows)
                manifests.append(manifest)
                return seconds, tokens

            return run

        c1 = _line("ctxlock batch --workers 1 (ids + masks + labels + Parquet)", *_median(job(1), args.repeat, job(1)))
        rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        c2 = _line("ctxlock batch --workers 2 (spawn + model load each job)", *_median(job(2), args.repeat))
        rss_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # before the fresh children
        if not args.skip_fresh:
            print("fresh process, first pass (imports and model/tokenizer load included):")
            fc = _line("ctxlock batch --workers 1", *_fresh("ctxlock", source, args.shard_rows))
            fd = _line("datasets.map(apply_chat_template, masks, tagged)", *_fresh("datasets", source, args.shard_rows))
            print(f"  ratio ctxlock / datasets.map (masks): {fc / fd:.2f}x")
        print("warm again, median of", args.repeat)
    assert all(m == manifests[0] for m in manifests), "workers 1 and 2 gave different manifests"
    tok, tagged_source = _hf()
    peers = [
        ("datasets.map, masks (tagged Qwen2.5 template)", _datasets_map, (tagged_source, True)),
        ("datasets.map, no masks (the model's own template)", _datasets_map, (None, False)),
        ("datasets.map num_proc=2, masks (tagged)", _datasets_map, (tagged_source, True, 2)),
        ("loop of apply_chat_template, masks (tagged)", _loop, (tagged_source, True)),
        ("loop of apply_chat_template, no masks", _loop, (None, False)),
    ]
    rates = []
    for name, fn, extra in peers:
        warm = (lambda f=fn, e=extra: f(rows[:20], tok, *e[:2])) if fn is _loop or len(extra) == 2 else None
        rates.append(_line(name, *_median(lambda f=fn, e=extra: f(rows, tok, *e), args.repeat, warm)))
    dm, dn, d2, lm, ln = rates
    print("ratios (tokens/s):")
    print(f"  ctxlock 1 worker / datasets.map masks: {c1 / dm:.2f}x   / datasets.map no masks: {c1 / dn:.2f}x")
    print(f"  ctxlock 2 workers / datasets.map masks: {c2 / dm:.2f}x   / datasets.map num_proc=2 masks: {c2 / d2:.2f}x")
    print(f"  ctxlock 1 worker / loop masks: {c1 / lm:.2f}x   / loop no masks: {c1 / ln:.2f}x")
    print(f"  scaling 1 -> 2 workers: {c2 / c1:.2f}x   manifests equal: True")
    print(f"peak RSS: {rss_self:,.0f} MiB this process (workers 1), {rss_child:,.0f} MiB largest worker (workers 2)")
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
