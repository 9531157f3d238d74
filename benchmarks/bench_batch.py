"""`ctxlock batch` against transformers' `apply_chat_template` on the same conversations, and 1 against 2 workers.

    python benchmarks/bench_batch.py [--rows 2000] [--shard-rows 250]

The data: generated conversations (1 to 3 turns, mixed scripts, 1% bad rows) as JSONL. The model: the Qwen2
vocabulary as transformers converts llama.cpp's GGUF, with its own chat template (tests/fetched.py).

- ctxlock: `run_batch` with `--workers 1` and `--workers 2` (spawned processes), each a fresh job into an empty
  directory, so the figure includes starting the workers and loading the model in each. Tokens are the shards'.
  Peak RSS: of this process (workers 1) and the largest worker (workers 2, `RUSAGE_CHILDREN`).
- transformers: one process, a loop of `apply_chat_template(tokenize=True, return_dict=True)` over the same rows
  (bad rows skipped), with the model's template (it has no `{% generation %}` tags, so no mask: transformers would
  return zeros), and again with `return_assistant_tokens_mask=True` on the generation-tagged Qwen2.5 template of
  tests/tagged.py. `datasets` is not installed here: `datasets.map` over the same call adds Arrow writes to this
  loop, so the loop is the faster side of that comparison.
Printed: tokens/s for each, the ratios, the 1 -> 2 worker scaling, and the output digests (equal for 1 and 2).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


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


def _ctxlock(source: Path, model_dir: str, workers: int, shard_rows: int) -> tuple[float, dict]:
    from ctxlock.batch import BatchOptions, run_batch

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        manifest = run_batch(
            source, Path(tmp) / "out", BatchOptions(model=model_dir, shard_rows=shard_rows), workers=workers
        )
        return time.perf_counter() - t0, manifest


def _transformers(lines: list[str], tok, template: str | None, masks: bool) -> tuple[float, int]:
    t0 = time.perf_counter()
    tokens = 0
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        out = tok.apply_chat_template(
            copy.deepcopy(data["messages"]),
            chat_template=template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=masks,
        )
        tokens += len(out["input_ids"])
    return time.perf_counter() - t0, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--shard-rows", type=int, default=250)
    args = ap.parse_args()

    import fetched
    import reference
    import tagged

    model_dir = str(fetched.hf_tokenizer_dir("qwen2"))
    lines = _rows(args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.jsonl"
        source.write_text("".join(x + "\n" for x in lines), "utf-8")
        t1, m1 = _ctxlock(source, model_dir, 1, args.shard_rows)
        rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t2, m2 = _ctxlock(source, model_dir, 2, args.shard_rows)
        rss_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert m1 == m2, "workers 1 and 2 gave different manifests"
    tok = reference.reference_tokenizer(model_dir)
    th, hf_tokens = _transformers(lines, tok, None, False)
    tagged_source = tagged.tagged_source("Qwen-Qwen2.5-7B-Instruct.jinja")
    tm, hf_mask_tokens = _transformers(lines, tok, tagged_source, True)

    n = m1["token_count"]
    print(f"{args.rows:,} rows ({m1['error_count']} error rows), {n:,} tokens, shards of {args.shard_rows}")
    print(
        f"ctxlock batch, 1 worker : {t1:7.2f} s  {n / t1:>10,.0f} tokens/s  peak RSS {rss_self:,.0f} MiB (this process)"
    )
    print(
        f"ctxlock batch, 2 workers: {t2:7.2f} s  {n / t2:>10,.0f} tokens/s  RSS {rss_child:,.0f} MiB (largest worker)"
    )
    print(f"  scaling 1 -> 2 workers: {t1 / t2:.2f}x   manifests equal: {m1 == m2}")
    print(f"transformers, no mask   : {th:7.2f} s  {hf_tokens / th:>10,.0f} tokens/s")
    print(f"transformers, masks (tagged Qwen2.5): {tm:7.2f} s  {hf_mask_tokens / tm:>10,.0f} tokens/s")
    print(f"ctxlock (1 worker, with masks) / transformers (no mask): {(n / t1) / (hf_tokens / th):.2f}x")
    print(f"ctxlock (1 worker, with masks) / transformers (masks):   {(n / t1) / (hf_mask_tokens / tm):.2f}x")


if __name__ == "__main__":
    main()
