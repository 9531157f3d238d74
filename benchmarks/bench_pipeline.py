"""Request -> ids, ctxlock against transformers, in one process on the same artifacts, with identical ids.

    python benchmarks/bench_pipeline.py single    [--requests 300] [--rounds 3]
                                                   [--scale 0.25] [--batch [--batch-size N]]
    python benchmarks/bench_pipeline.py multiturn [--conversations 20] [--turns 20] [--rounds 3] [--scale 0.25]
    python benchmarks/bench_pipeline.py single|multiturn --fresh-process [--rounds 5] [--passes 3]

`single`: a corpus of independent requests (mixed sizes, a third with tools; benchmarks/corpus.py), each
encoded once. `multiturn`: chats replayed turn by turn, each request holding the whole history, as a chat server
sees them. transformers runs `apply_chat_template(tokenize=True)`; ctxlock runs `Model.encode` (parse and validate,
render with injection marking, tokenize, tensors). Both use the Qwen2 vocabulary (transformers' conversion of
llama.cpp's GGUF, fetched by scripts/fetch_artifacts.py) and Qwen2.5's template.

Every round starts with `ctxlock.clear_caches("request")` (run cache, prefix cache, request memo, per-request
template caches; compiled templates and loaded vocabularies stay), so `single` measures cold requests and
`multiturn` measures what a server gains within one pass. The ids of every request are compared before timing.
ctxlock is also timed with `CTXLOCK_FAST=0` (the reference path: `tokenizers` engine, no caches, provenance
always). `--batch` also times `Model.encode_batch` (both cores: a worker
thread makes the native calls) and, for comparison, transformers' own batch form (`apply_chat_template` on a list
of conversations, tokenized by `tokenizers`' parallel `encode_batch`). The model is warmed up first, as a server
would at start-up (`Model.warm_up`: the engine check and fastokens built and checked); `CTXLOCK_FASTOKENS=0` keeps
tiktoken for the whole-text calls. Rounds are interleaved (each round times
every variant once), each ratio is the median of per-round ratios, and the per-round ratios are printed too.

`--fresh-process` measures what a user gets instead: every round is a new Python process that imports and loads
both sides (no `warm_up()`, nothing built beforehand but what earlier processes left in the on-disk caches) and times
each side's first pass over the workload, then `--passes - 1` more passes of ctxlock (caches cleared before each,
as above), so the figures show when the background build of fastokens takes over. Both sides run in the same
process, one after the other; the side that goes first alternates between rounds. The ids of every request of the
first passes are compared after timing. Printed: the medians of the import-and-load times and of the first passes,
and the ratios (median of per-round ratios) of the first passes (wall time, and the process's CPU time, all threads
counted, which a busy machine disturbs less) and of load plus first pass.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus

# ctxlock is imported inside the functions: a --fresh-process round times its import.


_CPU: dict[str, list[float]] = {}  # the process's CPU time (all threads) of each timed run, by variant


def _once(fn, name: str | None = None) -> float:
    import ctxlock

    ctxlock.clear_caches("request")  # every run starts cold: run cache, prefix cache, request memo, template caches
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if name is not None:
        _CPU.setdefault(name, []).append(cpu)
    return wall


def _interleaved(fns: dict[str, object], rounds: int) -> dict[str, list[float]]:
    """Time every function once per round, round after round, so that a slow spell of the (shared, noisy) machine
    hits all of them alike; ratios are then taken round by round."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(_once(fn, name))
    return samples


def _ratio(theirs: list[float], ours: list[float]) -> float:
    """The median over rounds of transformers' time / ctxlock's time in the same round."""
    return statistics.median(t / o for t, o in zip(theirs, ours, strict=True))


def _requests(args: argparse.Namespace) -> list[dict]:
    if args.mode == "single":
        return corpus.single_shot(args.requests, scale=args.scale)
    return [
        r for c in range(args.conversations) for r in corpus.conversation(args.turns, seed=100 + c, scale=args.scale)
    ]


def _fresh_round(args: argparse.Namespace, theirs_first: bool) -> dict:
    """One round of --fresh-process, in this (new) process: both sides imported, loaded and timed on a first pass."""
    import fetched

    requests = _requests(args)
    tok_dir = fetched.hf_tokenizer_dir(args.vocab)
    source = (fetched.templates_dir() / args.template).read_text("utf-8")
    out: dict = {}

    def ours() -> None:
        t0 = time.perf_counter()
        import ctxlock
        from ctxlock.template._render import ChatTemplate

        model = ctxlock.load(str(fetched.gguf_path(args.vocab) if args.load == "gguf" else tok_dir))
        template = ChatTemplate(source, id=args.template)
        t1, c1 = time.perf_counter(), time.process_time()
        ids = [model.encode(r, chat_template=template).input_ids[0] for r in requests]
        t2, c2 = time.perf_counter(), time.process_time()
        out["ours_load"], out["ours_first"], out["ours_first_cpu"] = t1 - t0, t2 - t1, c2 - c1
        out["ours_ids"] = ids
        out["engine_after_first"] = model.tokenizer.whole_text_engine
        later = []
        for _ in range(args.passes - 1):
            later.append(_once(lambda: [model.encode(r, chat_template=template) for r in requests]))
        out["ours_later"] = later
        out["engine_after_last"] = model.tokenizer.whole_text_engine

    def theirs() -> None:
        t0 = time.perf_counter()
        import reference

        hf = reference.reference_tokenizer(tok_dir)
        t1, c1 = time.perf_counter(), time.process_time()
        ids = [
            hf.apply_chat_template(
                r["messages"],
                tools=r.get("tools"),
                chat_template=source,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            for r in requests
        ]
        t2, c2 = time.perf_counter(), time.process_time()
        out["theirs_load"], out["theirs_first"], out["theirs_first_cpu"] = t1 - t0, t2 - t1, c2 - c1
        out["theirs_ids"] = ids

    for side in (theirs, ours) if theirs_first else (ours, theirs):
        side()
    mine, reference_ids = out.pop("ours_ids"), out.pop("theirs_ids")
    out["identical"] = len(mine) == len(reference_ids) and all(
        a.tolist() == list(b) for a, b in zip(mine, reference_ids, strict=True)
    )
    out["tokens"] = sum(len(b) for b in reference_ids)
    out["requests"] = len(requests)
    out["theirs_went_first"] = theirs_first
    return out


def fresh_process(args: argparse.Namespace) -> None:
    """--fresh-process: every round in a new interpreter (see the module docstring)."""
    rounds = []
    for i in range(args.rounds):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--round-in-this-process", str(i % 2)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"round {i} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if not result["identical"]:
            raise SystemExit(f"round {i}: ids differ from transformers")
        rounds.append(result)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    first = [r["theirs_first"] / r["ours_first"] for r in rounds]
    total = [(r["theirs_load"] + r["theirs_first"]) / (r["ours_load"] + r["ours_first"]) for r in rounds]
    r0 = rounds[0]
    print(
        f"{args.mode}, fresh process per round, no warm_up(): {r0['requests']} requests, {r0['tokens']:,} tokens "
        f"(scale {args.scale:g}), identical ids on all"
    )
    print(f"transformers: import + load {med('theirs_load'):6.3f} s, first pass {med('theirs_first'):6.3f} s")
    print(f"ctxlock:      import + load {med('ours_load'):6.3f} s, first pass {med('ours_first'):6.3f} s")
    print(
        f"first pass: ctxlock {statistics.median(first):.1f}x faster (per round: "
        f"{', '.join(f'{x:.1f}' for x in sorted(first))})"
    )
    cpu = [r["theirs_first_cpu"] / r["ours_first_cpu"] for r in rounds]
    print(
        f"first pass in CPU time (the process's, all threads; steadier on a busy machine): transformers "
        f"{med('theirs_first_cpu'):.3f} s, ctxlock {med('ours_first_cpu'):.3f} s, "
        f"ctxlock {statistics.median(cpu):.1f}x "
        f"(per round: {', '.join(f'{x:.1f}' for x in sorted(cpu))})"
    )
    print(
        f"import + load + first pass: ctxlock {statistics.median(total):.1f}x faster (per round: "
        f"{', '.join(f'{x:.1f}' for x in sorted(total))})"
    )
    for k in range(args.passes - 1):
        times = [r["ours_later"][k] for r in rounds]
        ratios = [r["theirs_first"] / r["ours_later"][k] for r in rounds]
        print(
            f"ctxlock pass {k + 2} (caches cleared): {statistics.median(times):6.3f} s, "
            f"{statistics.median(ratios):.1f}x transformers' first pass"
        )
    engines = sorted({r["engine_after_first"].split(":")[0] for r in rounds})
    print(f"whole-text engine after the first pass: {'; '.join(engines)}")
    engines = sorted({r["engine_after_last"].split(":")[0] for r in rounds})
    print(f"after the last pass: {'; '.join(engines)}")
    print(f"(medians of {args.rounds} processes; ratios: median of per-round ratios; the first side alternates)")


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
    ap.add_argument(
        "--load",
        choices=["dir", "gguf"],
        default="dir",
        help="what ctxlock loads: the HF directory transformers converted (default) or llama.cpp's GGUF file itself",
    )
    ap.add_argument(
        "--fresh-process",
        action="store_true",
        help="time first passes in new processes, without warm_up(), both sides side by side (see above)",
    )
    ap.add_argument(
        "--passes", type=int, default=3, help="--fresh-process: ctxlock passes per process, the first included"
    )
    ap.add_argument("--round-in-this-process", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.round_in_this_process is not None:
        print(json.dumps(_fresh_round(args, theirs_first=bool(args.round_in_this_process))))
        return
    if args.fresh_process:
        fresh_process(args)
        return

    from timing import side_by_side

    import ctxlock

    model, template, hf, source = side_by_side(args.vocab, args.template, load=args.load)
    engines = model.warm_up()  # already warm: what it says about the engines

    requests = _requests(args)

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
        return model.encode(r, chat_template=template).input_ids[0]

    # Identical ids on every request, with the fast paths on and off.
    ctxlock.clear_caches("request")
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
            model.encode_batch(requests[i : i + size], chat_template=template)

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
        f"ctxlock loads the {'GGUF file' if args.load == 'gguf' else 'HF directory'}; engine {engine}"
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
    cpu = sorted(t / o for t, o in zip(_CPU["theirs"], _CPU["ours"], strict=True))
    print(
        f"in CPU time (the process's, all threads; steadier on a busy machine): transformers "
        f"{statistics.median(_CPU['theirs']):.3f} s, ctxlock {statistics.median(_CPU['ours']):.3f} s, "
        f"ctxlock {statistics.median(cpu):.1f}x (per round: {', '.join(f'{x:.1f}' for x in cpu)})"
    )
    for name, label in (("ours", "Model.encode"), ("batch", "Model.encode_batch")):
        if name in times:
            spread = sorted(t / o for t, o in zip(times["theirs"], times[name], strict=True))
            print(f"per-round ratios, {label} against transformers: {', '.join(f'{x:.1f}' for x in spread)}")
    print(f"(times: medians of {args.rounds} interleaved rounds; ratios: median of per-round ratios; caches cleared)")


if __name__ == "__main__":
    main()
