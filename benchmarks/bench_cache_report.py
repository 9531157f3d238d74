"""`cache-report` on a long session against the naive method, in one process, with identical figures.

    python benchmarks/bench_cache_report.py [--turns 200] [--provider vllm|openai] [--rounds 3] [--fresh 3]

The session is a support chat (a fixed ~520-token system prompt, two tools, one question and one answer per turn),
replayed turn by turn as a chat server receives it: every request holds the whole history. ctxlock's report
encodes each request through the prefix-reusing encoder (only the new turn's bytes reach the tokenizer) and finds
the longest earlier prefix by chained 16-token block hashes. The naive method tokenizes every request from scratch
(the reference path, no caches) and compares its ids with every earlier request's, token by token. Both give each
turn's common prefix and cache split; the script checks they are identical, then prints both times and the ratio.

`--rounds R` repeats that in this process (every cache emptied before each report; the model loaded and warmed up
once), and `--fresh K` runs it once in each of K new processes whose ctxlock cache directory is new and empty
(`CTXLOCK_CACHE_DIR`): a machine's first run, with nothing on disk from an earlier one. The ratios are medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import ctxlock
import fetched
from ctxlock.economics._promptcache import cached_split, session_report
from ctxlock.economics._session import build_turns
from ctxlock.settings import reference_path
from ctxlock.template._render import ChatTemplate

TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"
FIXED = (
    "You are the support assistant of a hardware shop. Answer precisely, cite the order number when the customer "
    "gives one, never invent stock levels, and ask one question at a time when something is missing. "
) * 12
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
    for name in ("search", "weather")
]


def session(turns: int) -> list[tuple[dict, None, float]]:
    out = []
    msgs: list[dict] = [{"role": "system", "content": FIXED}]
    for t in range(turns):
        msgs.append(
            {"role": "user", "content": f"Question {t}: is item {t * 7} in stock, and what about its spare parts?"}
        )
        out.append(({"messages": list(msgs), "tools": TOOLS}, None, 10.0 * t))
        msgs.append(
            {
                "role": "assistant",
                "content": f"Item {t * 7} is in stock with {t % 9 + 1} left; spares ship in {t % 4 + 2} days.",
            }
        )
    return out


def naive(model: ctxlock.Model, template: ChatTemplate, sess: list, provider: str) -> list[tuple[int, object]]:
    out = []
    earlier: list[list[int]] = []
    with reference_path():
        for request, _, _ in sess:
            ids = model.encode(request, chat_template=template)["input_ids"][0].tolist()
            common = 0
            for prev in earlier:
                n = 0
                for a, b in zip(ids, prev, strict=False):
                    if a != b:
                        break
                    n += 1
                common = max(common, n)
            earlier.append(ids)
            out.append((common, cached_split(provider, len(ids), common)))  # type: ignore[arg-type]
    return out


def one_run(model: ctxlock.Model, template: ChatTemplate, sess: list, provider: str) -> tuple[float, float]:
    """(ctxlock's seconds, the naive method's seconds) on one session, after checking the figures are identical."""
    ctxlock.clear_caches()  # every cache starts empty (the model stays loaded)
    t0 = time.perf_counter()
    reports = session_report(build_turns(model, sess, {"template": template}), provider, ttl=None)  # type: ignore[arg-type]
    ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    reference = naive(model, template, sess, provider)
    slow = time.perf_counter() - t0
    assert [(r.common_prefix, r.split) for r in reports] == reference, "the two methods disagree"
    return ours, slow


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--provider", default="vllm", choices=["vllm", "openai"])
    ap.add_argument("--rounds", type=int, default=3, help="runs in this process")
    ap.add_argument("--fresh", type=int, default=3, help="runs in new processes with an empty cache directory")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    model.warm_up()
    template = ChatTemplate((fetched.templates_dir() / TEMPLATE).read_text("utf-8"), id=TEMPLATE)
    sess = session(args.turns)
    if args.child:
        ours, slow = one_run(model, template, sess, args.provider)
        print(f"{ours:.4f} {slow:.4f}")
        return
    runs = [one_run(model, template, sess, args.provider) for _ in range(args.rounds)]
    tokens = sum(len(model.encode(r, chat_template=template)["input_ids"][0]) for r, _, _ in sess)
    print(f"{args.turns} turns, {tokens:,} input tokens in all ({args.provider}); identical figures")
    if runs:
        ratios = [slow / ours for ours, slow in runs]
        print(
            f"  this process: cache-report {statistics.median(o for o, _ in runs):.3f} s   naive "
            f"{statistics.median(s for _, s in runs):.3f} s   ratio {statistics.median(ratios):.1f}x "
            f"(runs {', '.join(f'{r:.1f}' for r in ratios)})"
        )
    fresh = []
    for _ in range(args.fresh):
        with tempfile.TemporaryDirectory() as empty:
            env = {**os.environ, "CTXLOCK_CACHE_DIR": empty}
            cmd = [sys.executable, __file__, "--child", "--turns", str(args.turns), "--provider", args.provider]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout.split()
        fresh.append((float(out[0]), float(out[1])))
    if fresh:
        ratios = [slow / ours for ours, slow in fresh]
        print(
            f"  new process, empty cache directory: cache-report {statistics.median(o for o, _ in fresh):.3f} s   "
            f"naive {statistics.median(s for _, s in fresh):.3f} s   ratio {statistics.median(ratios):.1f}x "
            f"(runs {', '.join(f'{r:.1f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()
