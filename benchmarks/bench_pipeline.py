"""Request -> ids, ctxlock against transformers, in one process on the same artifacts, with identical ids.

    python benchmarks/bench_pipeline.py single    [--requests 300] [--rounds 3]
                                                   [--scale 0.25] [--batch [--batch-size N]]
    python benchmarks/bench_pipeline.py multiturn [--conversations 20] [--turns 20] [--rounds 3] [--scale 0.25]

`single`: a corpus of independent requests (mixed sizes, a third with tools; benchmarks/corpus.py), each
encoded once. `multiturn`: chats replayed turn by turn, each request holding the whole history, as a chat server
sees them. transformers runs `apply_chat_template(tokenize=True)`; ctxlock runs `Model.encode` (parse and validate,
render with injection marking, tokenize, tensors). Both use the Qwen2 vocabulary (transformers' conversion of
llama.cpp's GGUF, fetched by scripts/fetch_artifacts.py) and Qwen2.5's template.

Every round starts with `ctxlock.clear_caches()` (run cache, prefix cache, request memo, per-request template
caches), so `single` measures cold requests and `multiturn` measures what a server gains within one pass. The ids
of every request are compared before timing. ctxlock is also timed with `CTXLOCK_FAST=0` (the reference path:
`tokenizers` engine, no caches, provenance always). `--batch` also times `Model.encode_batch` (both cores: a worker
thread makes the native calls) and, for comparison, transformers' own batch form (`apply_chat_template` on a list
of conversations, tokenized by `tokenizers`' parallel `encode_batch`). The model is warmed up first, as a server
would at start-up (`Model.warm_up`: the engine check and fastokens built and checked); `CTXLOCK_FASTOKENS=0` keeps
tiktoken for the whole-text calls. Rounds are interleaved (each round times
every variant once), each ratio is the median of per-round ratios, and the per-round ratios are printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus
from timing import side_by_side

import ctxlock


def _once(fn) -> float:
    ctxlock.clear_caches()  # every run starts cold: run cache, prefix cache, request memo, template caches
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _interleaved(fns: dict[str, object], rounds: int) -> dict[str, list[float]]:
    """Time every function once per round, round after round, so that a slow spell of the (shared, noisy) machine
    hits all of them alike; ratios are then taken round by round."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(_once(fn))
    return samples


def _ratio(theirs: list[float], ours: list[float]) -> float:
    """The median over rounds of transformers' time / ctxlock's time in the same round."""
    return statistics.median(t / o for t, o in zip(theirs, ours, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["single", "multiturn"])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--conversations", type=int, default=20)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--scale",
        type=float,
        default=0.25,
        help="message length multiplier for the generated corpus (0.25: messages of ~5-400 words; 1: 4x longer)",
    )
    ap.add_argument("--batch", action="store_true", help="also time ctxlock's encode_batch")
    ap.add_argument("--batch-size", type=int, default=0, help="requests per encode_batch call (default: all at once)")
    ap.add_argument("--vocab", default="qwen2")
    ap.add_argument("--template", default="Qwen-Qwen2.5-7B-Instruct.jinja")
    args = ap.parse_args()

    model, template, hf, source = side_by_side(args.vocab, args.template)
    engines = model.warm_up()  # already warm: what it says about the engines

    if args.mode == "single":
        requests = corpus.single_shot(args.requests, scale=args.scale)
    else:
        requests = [
            r
            for c in range(args.conversations)
            for r in corpus.conversation(args.turns, seed=100 + c, scale=args.scale)
        ]

    def theirs_one(r: dict) -> list[int]:
        return hf.apply_chat_template(
            r["messages"],
            tools=r.get("tools"),
            chat_template=source,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )

    def ours_one(r: dict) -> list[int]:
        return model.encode(r, template=template).input_ids[0]

    # Identical ids on every request, with the fast paths on and off.
    ctxlock.clear_caches()
    tokens = 0
    for r in requests:
        expected = list(theirs_one(r))
        got = ours_one(r).tolist()
        if got != expected:
            raise SystemExit(f"ids differ from transformers on a request of {len(r['messages'])} messages")
        tokens += len(expected)
    engine = f"{engines['engine']}; whole text: {engines['whole_text_engine'].split(' (')[0] or 'refused'}"

    size = args.batch_size or len(requests)

    def batches() -> None:
        for i in range(0, len(requests), size):
            model.encode_batch(requests[i : i + size], template=template)

    def theirs_batches() -> list[list[int]]:
        # transformers' own batch form: one apply_chat_template call per chunk and tool set (it takes one `tools`
        # for the whole batch), which tokenizes the rendered texts with `tokenizers`' parallel encode_batch.
        out: list[list[int]] = []
        for i in range(0, len(requests), size):
            chunk = requests[i : i + size]
            for tools in {json.dumps(r.get("tools")) for r in chunk}:
                group = [r for r in chunk if json.dumps(r.get("tools")) == tools]
                out += hf.apply_chat_template(
                    [r["messages"] for r in group],
                    tools=group[0].get("tools"),
                    chat_template=source,
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                )
        return out

    fns: dict[str, object] = {
        "theirs": lambda: [theirs_one(r) for r in requests],
        "ours": lambda: [ours_one(r) for r in requests],
    }
    if args.batch:
        got = sorted(map(list, theirs_batches()))
        if got != sorted(list(theirs_one(r)) for r in requests):
            raise SystemExit("transformers' batch form gives other ids than one by one")
        fns["batch"] = batches
        fns["theirs_batch"] = theirs_batches
    times = _interleaved(fns, args.rounds)
    os.environ["CTXLOCK_FAST"] = "0"
    try:
        t_exact = statistics.median(_once(lambda: [ours_one(r) for r in requests]) for _ in range(args.rounds))
    finally:
        del os.environ["CTXLOCK_FAST"]
    med = {k: statistics.median(v) for k, v in times.items()}

    print(
        f"{args.mode}: {len(requests)} requests, {tokens:,} tokens (scale {args.scale:g}), identical ids on all; "
        f"engine {engine}"
    )
    print(f"transformers apply_chat_template(tokenize=True)  {med['theirs']:8.3f} s")
    ours = _ratio(times["theirs"], times["ours"])
    print(f"ctxlock Model.encode                             {med['ours']:8.3f} s   {ours:6.1f}x faster")
    if args.batch:
        label = f"ctxlock Model.encode_batch, {size} per call"
        batch = _ratio(times["theirs"], times["batch"])
        print(f"{label:49s}{med['batch']:8.3f} s   {batch:6.1f}x faster")
        label = f"transformers batched, {size} per call"
        vs = _ratio(times["theirs_batch"], times["batch"])
        print(f"{label:49s}{med['theirs_batch']:8.3f} s   (encode_batch {vs:.1f}x faster than it)")
    print(f"ctxlock Model.encode, CTXLOCK_FAST=0             {t_exact:8.3f} s   {med['theirs'] / t_exact:6.1f}x")
    for name, label in (("ours", "Model.encode"), ("batch", "Model.encode_batch")):
        if name in times:
            spread = sorted(t / o for t, o in zip(times["theirs"], times[name], strict=True))
            print(f"per-round ratios, {label} against transformers: {', '.join(f'{x:.1f}' for x in spread)}")
    print(f"(times: medians of {args.rounds} interleaved rounds; ratios: median of per-round ratios; caches cleared)")


if __name__ == "__main__":
    main()
