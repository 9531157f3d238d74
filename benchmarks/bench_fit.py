"""fit_context: the fast algorithm against the naive oracle, in one run, on a real tokenizer.

    python benchmarks/bench_fit.py [--messages 2000] [--budget 32768] [--vocab qwen2] [--history suffix|greedy]

A long history (mixed message sizes, a third of the turns with a tool call and its result) is fitted to the
budget with Qwen2.5's template. The naive oracle renders and tokenizes every candidate through the full pipeline;
the fast path renders once per candidate without the provenance pass and tokenizes run by run with a cache.
Both must give identical decisions and ids; the script checks, then prints the times and the ratio. `--history`
is the policy's history mode: "suffix" (the default, a contiguous most-recent history: the turns older than the
first one that does not fit are not tried) or "greedy" (the seed's loop: every turn is tried, the heavier case).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import ctxlock
import fetched
from ctxlock.budget._fit import BudgetPolicy, fit_context
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate

WORDS = "the quick brown fox jumps over the lazy dog 天空 为什么 是 蓝色 def return x = 1 Rayleigh 😀".split()  # noqa: SIM905


def _words(rng: random.Random, sizes: list[int]) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.choice(sizes)))


def history(n_messages: int, seed: int = 7) -> dict:
    rng = random.Random(seed)
    msgs: list[dict] = [{"role": "system", "content": "You are a helpful assistant. " * 5}]
    calls = 0
    while len(msgs) < n_messages:
        msgs.append(
            {"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.choice([5, 20, 80, 300])))}
        )
        if rng.random() < 0.33:
            cid = f"call{calls:05d}"
            calls += 1
            call = {"id": cid, "type": "function", "function": {"name": "search", "arguments": {"q": "sky"}}}
            msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": cid, "content": _words(rng, [50, 200, 600])})
        msgs.append(
            {"role": "assistant", "content": " ".join(rng.choice(WORDS) for _ in range(rng.choice([10, 60, 200])))}
        )
    msgs.append({"role": "user", "content": "So, why is the sky blue?"})
    return {"messages": msgs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--budget", type=int, default=32768)
    ap.add_argument("--vocab", default="qwen2")
    ap.add_argument("--fast-rounds", type=int, default=3)
    ap.add_argument("--history", choices=("suffix", "greedy"), default="suffix")
    args = ap.parse_args()
    model = ctxlock.load(str(fetched.hf_tokenizer_dir(args.vocab)))
    source = (fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text("utf-8")
    template = ChatTemplate(source, id="qwen2.5")
    request = parse_request(history(args.messages))
    policy = BudgetPolicy(max_input_tokens=args.budget, history=args.history)
    fast_times = []
    for _ in range(args.fast_rounds):  # the first round includes building the tokenizer's plain-text variant
        t0 = time.perf_counter()
        fast = fit_context(request, model, policy, chat_template=template)
        fast_times.append(time.perf_counter() - t0)
    t_fast = statistics.median(fast_times)
    t1 = time.perf_counter()
    naive = fit_context(request, model, policy, chat_template=template, naive=True)
    t_naive = time.perf_counter() - t1
    same = fast.decisions == naive.decisions and fast.ids == naive.ids
    kept = sum(1 for d in fast.decisions if d.kept)
    print(
        f"{len(request.messages)} messages, history {args.history}, {len(fast.decisions)} segments ({kept} kept), "
        f"{fast.input_tokens:,} / {args.budget:,} tokens; identical decisions and ids: {same}"
    )
    print(f"fast {t_fast:.2f} s (median of {len(fast_times)}), naive {t_naive:.2f} s, ratio {t_naive / t_fast:.1f}x")
    if not same:
        raise SystemExit("fast and naive differ")


if __name__ == "__main__":
    main()
