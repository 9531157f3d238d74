"""JSON-Schema token masks on a real vocabulary: vocabulary conversion, schema compile and per-token mask time.

    python benchmarks/bench_mask.py [--vocab qwen2] [--samples 50] [--max-tokens 128] [--rounds 5] [--seed 0]

- vocabulary: ctxlock's tokenizer -> per-token bytes (`token_bytes`) -> llguidance's LLTokenizer (token trie), with
  an empty cache, median of `--rounds`; llguidance reading the same vocabulary from a tokenizer.json itself
  (transformers' conversion of the GGUF) is timed alongside for context;
- compile: JSON Schema -> llguidance grammar -> matcher, vocabulary cached, median of `--rounds`; the first mask
  (where llguidance builds its lexer lazily) is reported on its own;
- mask: every step of `--samples` seeded samples per schema (i.i.d. uniform random logits, ctxlock's Sampler,
  as `ctxlock constrain` does), median and p99 per token; the sampler's own time per token too.
Every completed sample is validated with jsonschema; the script fails if one does not validate.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from timing import median_seconds

import ctxlock.generation._constrain as constrain_mod
import fetched
from ctxlock.artifacts import load_artifacts
from ctxlock.cli.constrain import generate
from ctxlock.generation._constrain import JsonSchemaMask, default_eos_id, guidance_vocab
from ctxlock.generation._sampler import SamplerConfig
from ctxlock.tokenizer._token_bytes import token_bytes

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = sorted((ROOT / "tests" / "data" / "schemas").glob("*.json"))


def main() -> None:
    import jsonschema
    import llguidance

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", default="qwen2", help="ggml-vocab name (default qwen2, 151,936 tokens)")
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    arts = load_artifacts(fetched.gguf_path(args.vocab))
    tok = arts.tokenizer
    eos = default_eos_id(tok, arts.special_tokens)

    def convert() -> None:
        constrain_mod._vocabs.clear()  # an empty cache: the full conversion
        guidance_vocab(tok, eos)

    t_convert = median_seconds(convert, args.rounds)
    t_bytes = median_seconds(lambda: token_bytes(tok), args.rounds)
    hf_json = fetched.hf_tokenizer_dir(args.vocab) / "tokenizer.json"
    t_llg_own = median_seconds(lambda: llguidance.LLTokenizer(str(hf_json)), args.rounds)
    vocab = guidance_vocab(tok, eos)[0]

    print(
        f"# {args.vocab}: {vocab.vocab_size:,} tokens ({len(vocab.token_bytes.special)} control), EOS {eos}; "
        f"llguidance {llguidance.__version__}, numpy {np.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}"
    )
    print(
        f"vocabulary conversion (median of {args.rounds}): {t_convert:.3f} s, of which token bytes "
        f"{t_bytes:.3f} s; llguidance reading tokenizer.json itself: {t_llg_own:.3f} s"
    )
    print()
    print(
        "| schema | compile (ms) | first mask (ms) | mask median (µs) | mask p99 (µs) | sampler median (µs) "
        "| tokens/sample (median) | stop |"
    )
    print("|---|---|---|---|---|---|---|---|")
    config = SamplerConfig(seed=args.seed)
    all_masks: list[float] = []
    failures = 0
    for path in SCHEMAS:
        schema = json.loads(path.read_text("utf-8"))
        compiles, firsts = [], []
        for _ in range(args.rounds):
            m = JsonSchemaMask(tok, schema, eos_id=eos)
            compiles.append(m.compile_seconds)
            t0 = time.perf_counter()
            m.mask()
            firsts.append(time.perf_counter() - t0)
        m = JsonSchemaMask(tok, schema, eos_id=eos)
        cls = jsonschema.validators.validator_for(schema)
        validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        results = list(
            generate(m, config, samples=args.samples, seed=args.seed, max_tokens=args.max_tokens, validator=validator)
        )
        stops = [r for r in results if r.finish_reason == "stop"]
        failures += sum(not r.valid for r in stops)
        masks = list(m.mask_seconds)
        all_masks.extend(masks)
        sampler = [t for r in results for t in r.sample_seconds]
        print(
            f"| {path.stem} | {statistics.median(compiles) * 1e3:.2f} | {statistics.median(firsts) * 1e3:.2f} "
            f"| {statistics.median(masks) * 1e6:.0f} | {np.percentile(masks, 99) * 1e6:.0f} "
            f"| {statistics.median(sampler) * 1e6:.0f} | {statistics.median(len(r.ids) for r in results):g} "
            f"| {len(stops)}/{len(results)} |"
        )
    print(
        f"| **all** ({len(all_masks):,} masks) | | | {statistics.median(all_masks) * 1e6:.0f} "
        f"| {np.percentile(all_masks, 99) * 1e6:.0f} | | | |"
    )
    if failures:
        raise SystemExit(f"{failures} completed sample(s) do not validate")


if __name__ == "__main__":
    main()
