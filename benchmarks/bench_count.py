"""`count` (every token attributed to one request part) against `encode` of the same requests, in one process.

    python benchmarks/bench_count.py [--requests 300] [--rounds 7] [--scale 0.25] [--marginal 20] [--fresh 3]

The single-shot corpus (benchmarks/corpus.py: mixed sizes, a third with tools) on the Qwen2 vocabulary and
Qwen2.5's template, warmed up as a server would be. Each round times `encode` and `count` of every request, call by
call, interleaved (ABBA order, so both see the same moments of a shared, noisy machine), with the request caches
emptied before every call (`clear_caches("request")`: the parse memo, the prefix-reuse encoder, the run caches; the
compiled template and the loaded vocabulary stay); the ratio is the median of the per-round ratios, in CPU time
(`time.process_time`, steadier than wall time on a shared machine; both are printed). The issue's bound: count at
most 1.3x encode. `--marginal N` also times `count(marginal=True)` on the first N requests, against N encodes and N
counts (each part's marginal is one more full render and tokenization).
Before timing, every count's total is checked against len(input_ids) and its parts against the total.

Also printed: the fresh-process first pass, what a command-line user gets. `--fresh K` pairs of processes, each
loading the model and making one pass over the requests with nothing warmed up or timed before (the load is not
timed): one pass of `encode`, one of `count`, in alternating order; the ratio is the median over the pairs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus
import timing

TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"


def _pass(fn, requests) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one pass."""
    c0, t0 = time.process_time(), time.perf_counter()
    for r in requests:
        fn(r)
    return time.process_time() - c0, time.perf_counter() - t0


def _interleaved(first, second, requests, *, flip: bool) -> tuple[tuple[float, float], tuple[float, float]]:
    """(CPU, wall) seconds of `first` and of `second` over the requests, timed call by call and interleaved (ABBA
    order), the request caches emptied before every call: both see the same moments of a noisy machine."""
    import ctxlock

    totals = [[0.0, 0.0], [0.0, 0.0]]
    for i, r in enumerate(requests):
        order = (0, 1) if (i % 2 == 0) != flip else (1, 0)
        for which in order:
            fn = first if which == 0 else second
            ctxlock.clear_caches("request")
            c0, t0 = time.process_time(), time.perf_counter()
            fn(r)
            totals[which][0] += time.process_time() - c0
            totals[which][1] += time.perf_counter() - t0
    return (totals[0][0], totals[0][1]), (totals[1][0], totals[1][1])


def _fresh(which: str, args) -> tuple[float, float]:
    cmd = [
        sys.executable,
        __file__,
        "--first-pass",
        which,
        "--requests",
        str(args.requests),
        "--scale",
        str(args.scale),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--marginal", type=int, default=20, help="requests timed with marginal=True (0: none)")
    ap.add_argument("--fresh", type=int, default=3, help="pairs of fresh processes (0: none)")
    ap.add_argument("--first-pass", choices=["encode", "count"], help=argparse.SUPPRESS)  # one fresh-process pass
    args = ap.parse_args()

    import ctxlock
    from ctxlock.accounting._layout import count

    requests = corpus.single_shot(args.requests, scale=args.scale)
    if args.first_pass:
        import fetched
        from ctxlock.template._render import ChatTemplate

        model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
        template = ChatTemplate((fetched.templates_dir() / TEMPLATE).read_text("utf-8"), id=TEMPLATE)
        if args.first_pass == "encode":
            cpu, wall = _pass(lambda r: model.encode(r, chat_template=template), requests)
        else:
            cpu, wall = _pass(lambda r: count(model, r, chat_template=template), requests)
        print(f"{cpu:.4f} {wall:.4f}")
        return

    model, template, _, _ = timing.side_by_side("qwen2", TEMPLATE)
    for r in requests:  # correctness first
        c = count(model, r, chat_template=template)
        n = len(model.encode(r, chat_template=template)["input_ids"][0])
        assert c.total == n and sum(p.tokens for p in c.parts) == n
    ratios, walls, enc_times, cnt_times = [], [], [], []
    for k in range(args.rounds):
        got = _interleaved(
            lambda r: model.encode(r, chat_template=template),
            lambda r: count(model, r, chat_template=template),
            requests,
            flip=bool(k % 2),
        )
        enc_times.append(got[0][0])
        cnt_times.append(got[1][0])
        ratios.append(got[1][0] / got[0][0])
        walls.append(got[1][1] / got[0][1])
    print(f"{len(requests)} requests, {args.rounds} rounds (warm model, request caches emptied before each call)")
    print(
        f"  encode {statistics.median(enc_times):.3f} s   count {statistics.median(cnt_times):.3f} s  (CPU, per round)"
    )
    print(
        f"  count / encode, warm: {statistics.median(ratios):.2f}x CPU (rounds {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    print(
        f"                        {statistics.median(walls):.2f}x wall (rounds {', '.join(f'{r:.2f}' for r in walls)})"
    )

    if args.marginal:
        subset = requests[: args.marginal]
        ctxlock.clear_caches("request")
        t_enc = _pass(lambda r: model.encode(r, chat_template=template), subset)[0]
        ctxlock.clear_caches("request")
        t_cnt = _pass(lambda r: count(model, r, chat_template=template), subset)[0]
        ctxlock.clear_caches("request")
        t_marg = _pass(lambda r: count(model, r, chat_template=template, marginal=True), subset)[0]
        parts = sum(len(count(model, r, chat_template=template).parts) for r in subset)
        print(
            f"  marginal: {len(subset)} requests ({parts} parts) in {t_marg:.3f} s CPU, {t_marg / t_enc:.1f}x their "
            f"encode ({t_enc:.3f} s), {t_marg / t_cnt:.1f}x their count ({t_cnt:.3f} s), "
            f"{t_marg / t_enc / (parts / len(subset)):.2f} encodes per part"
        )

    fresh, fresh_wall = [], []
    for k in range(args.fresh):
        order = ["encode", "count"] if k % 2 == 0 else ["count", "encode"]
        got = {which: _fresh(which, args) for which in order}
        fresh.append(got["count"][0] / got["encode"][0])
        fresh_wall.append(got["count"][1] / got["encode"][1])
    if fresh:
        print(
            f"  fresh process, first pass, no warm-up: count / encode {statistics.median(fresh):.2f}x CPU "
            f"(pairs {', '.join(f'{r:.2f}' for r in fresh)}), {statistics.median(fresh_wall):.2f}x wall "
            f"(pairs {', '.join(f'{r:.2f}' for r in fresh_wall)})"
        )


if __name__ == "__main__":
    main()
