"""`count` (every token attributed to one request part) against `encode` of the same requests, in one process.

    python benchmarks/bench_count.py [--requests 300] [--rounds 5] [--scale 0.25] [--marginal 20]

The single-shot corpus (benchmarks/corpus.py: mixed sizes, a third with tools) on the Qwen2 vocabulary and
Qwen2.5's template, warmed up as a server would be. Each round clears the request caches, then times `encode` over
every request and `count` over every request, alternating which goes first; the ratio is the median of the
per-round ratios (the issue's bound: count at most 1.3x encode). `--marginal N` also times `count(marginal=True)`
on the first N requests, against N encodes (each part's marginal is one more full render and tokenization).
Before timing, every count's total is checked against len(input_ids) and its parts against the total.
Also printed: the same ratio on a fresh process's first pass (no warm-up, nothing timed before), which is what a
command-line user gets.
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


def _pass(fn, requests) -> float:
    t0 = time.perf_counter()
    for r in requests:
        fn(r)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--marginal", type=int, default=20, help="requests timed with marginal=True (0: none)")
    ap.add_argument("--first-pass", action="store_true", help=argparse.SUPPRESS)  # one fresh-process round
    ap.add_argument("--count-first", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    import ctxlock
    from ctxlock.accounting import count

    requests = corpus.single_shot(args.requests, scale=args.scale)
    if args.first_pass:
        import fetched
        from ctxlock.template import ChatTemplate

        model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
        template = ChatTemplate((fetched.templates_dir() / TEMPLATE).read_text("utf-8"), id=TEMPLATE)
        order = [
            ("encode", lambda r: model.encode(r, template=template)),
            ("count", lambda r: count(model, r, template=template)),
        ]
        if "--count-first" in sys.argv:
            order.reverse()
        times = {name: _pass(fn, requests) for name, fn in order}
        print(f"{times['encode']:.4f} {times['count']:.4f}")
        return

    model, template, _, _ = timing.side_by_side("qwen2", TEMPLATE)
    for r in requests:  # correctness first
        c = count(model, r, template=template)
        n = len(model.encode(r, template=template)["input_ids"][0])
        assert c.total == n and sum(p.tokens for p in c.parts) == n
    ratios, enc_times, cnt_times = [], [], []
    for k in range(args.rounds):
        ctxlock.clear_caches()
        pair = [
            ("encode", lambda r: model.encode(r, template=template)),
            ("count", lambda r: count(model, r, template=template)),
        ]
        if k % 2:
            pair.reverse()
        got = {}
        for name, fn in pair:
            ctxlock.clear_caches()
            got[name] = _pass(fn, requests)
        enc_times.append(got["encode"])
        cnt_times.append(got["count"])
        ratios.append(got["count"] / got["encode"])
    print(f"{len(requests)} requests, {args.rounds} rounds (warm model, request caches cleared per pass)")
    print(f"  encode {statistics.median(enc_times):.3f} s   count {statistics.median(cnt_times):.3f} s")
    print(f"  count / encode: {statistics.median(ratios):.2f}x (rounds {', '.join(f'{r:.2f}' for r in ratios)})")

    if args.marginal:
        subset = requests[: args.marginal]
        ctxlock.clear_caches()
        t_enc = _pass(lambda r: model.encode(r, template=template), subset)
        ctxlock.clear_caches()
        t_marg = _pass(lambda r: count(model, r, template=template, marginal=True), subset)
        parts = sum(len(count(model, r, template=template).parts) for r in subset)
        print(
            f"  marginal: {len(subset)} requests ({parts} parts) in {t_marg:.3f} s, {t_marg / t_enc:.1f}x their encode "
            f"({t_enc:.3f} s): about one encode per part"
        )

    fresh = []
    for k in range(3):
        cmd = [sys.executable, __file__, "--first-pass", "--requests", str(args.requests), "--scale", str(args.scale)]
        if k % 2:
            cmd.append("--count-first")
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
        fresh.append(float(out[1]) / float(out[0]))
    print(
        f"  fresh process, first pass, no warm-up: count / encode {statistics.median(fresh):.2f}x "
        f"(rounds {', '.join(f'{r:.2f}' for r in fresh)})"
    )


if __name__ == "__main__":
    main()
