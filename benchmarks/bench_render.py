"""ctxlock vs transformers, side by side in one process on the same artifacts: request -> ids.

    python benchmarks/bench_render.py [--vocab qwen2] [--template Qwen-Qwen2.5-7B-Instruct.jinja] [--rounds 30]

Both sides get the same canonical messages and template, and the same tokenizer (transformers' conversion of
llama.cpp's ggml-vocab GGUF, fetched by scripts/fetch_artifacts.py). transformers runs
`apply_chat_template(tokenize=True)`; ctxlock runs `Model.encode` (parse, render with injection marking and, when
the ids could depend on it, the provenance pass; tokenize; tensors). Prints per-conversation medians and the ratio
ctxlock / transformers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from timing import median_seconds, side_by_side

import ctxlock
from conformance import conversations
from ctxlock.request import parse_request


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", default="qwen2")
    ap.add_argument("--template", default="Qwen-Qwen2.5-7B-Instruct.jinja")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument(
        "--cold",
        action="store_true",
        help="clear ctxlock's caches (runs, prefixes, request memo) before every call: nothing is ever reused",
    )
    args = ap.parse_args()

    model, template, hf, source = side_by_side(args.vocab, args.template)

    ratios = []
    print(f"{'conversation':40s} {'ctxlock ms':>11s} {'transformers ms':>16s} {'ratio':>7s}")
    for name, data, options in conversations():
        request = parse_request(data)
        messages, tools = request.template_messages(), request.template_tools()
        try:
            expected = hf.apply_chat_template(
                messages, tools=tools, chat_template=source, tokenize=True, return_dict=False, **options
            )
        except Exception:
            continue
        assert model.encode(request, chat_template=template, **options).input_ids[0].tolist() == list(expected)

        def ours_once(r=data, o=options):
            if args.cold:
                ctxlock.clear_caches("request")
            return model.encode(r, chat_template=template, **o)

        ours = median_seconds(
            ours_once,
            args.rounds,
            warmup=True,  # compiled template, tokenizer variants
        )
        theirs = median_seconds(
            lambda m=messages, t=tools, o=options: hf.apply_chat_template(
                m, tools=t, chat_template=source, tokenize=True, return_dict=False, **o
            ),
            args.rounds,
            warmup=True,
        )
        ratios.append(ours / theirs)
        print(f"{name:40s} {ours * 1e3:11.2f} {theirs * 1e3:16.2f} {ours / theirs:7.2f}")
    print(f"\nmedian ratio ctxlock/transformers over {len(ratios)} conversations: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
