"""Native BPE engines on the Qwen2 vocabulary, each in a fresh process: load time, first pass, second pass, and
whether its ids equal `tokenizers`' (the reference) on every text.

    python benchmarks/bench_engines.py [--rounds 3] [--python PATH]

Why it exists (issue 16 item 1): ctxlock's fresh-process first pass is bounded by the native engine that is
available at once. fastokens is about ten times faster than tiktoken once built, but building it takes about 1.2 s
of CPU and it has no serialized form, so a fresh process runs its first pass on tiktoken. This benchmark measures
the engines on the package registries that could take that place: what each costs to load in a new process (from
its own serialized form when it has one) and how fast its first pass is. The texts are the message contents and
tool lists of the single-shot corpus (benchmarks/corpus.py, 300 requests), encoded one by one without special
tokens, as the whole-text engine encodes rendered text between control tokens.

Engines that are not installed are reported as such (only `tokenizers`, `tiktoken` and `fastokens` are ctxlock's
dependencies; the others were measured in a scratch venv: `python3.11 -m venv /tmp/venv-eng &&
/tmp/venv-eng/bin/pip install kitoken gigatoken splintr-rs tiktoken tokenizers fastokens numpy`, then
`--python /tmp/venv-eng/bin/python`). Every round of every engine is a new process; medians are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# One round, in its own process: argv = engine, tokenizer.json path, texts path, work dir.
ROUND = r"""
import json, sys, time, os
engine, tok_json, texts_path, work = sys.argv[1:5]
texts = json.load(open(texts_path))
t0 = time.perf_counter()
if engine == "tokenizers":
    import tokenizers
    tok = tokenizers.Tokenizer.from_file(tok_json)
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids
elif engine == "tiktoken":
    import base64, tiktoken
    data = json.load(open(tok_json, encoding="utf-8"))
    # The GPT-2 byte-to-unicode map, inverted: vocabulary strings back to bytes.
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    unbyte = {chr(c): b for b, c in zip(bs, cs)}
    ranks = {bytes(unbyte[ch] for ch in tokstr): i for tokstr, i in data["model"]["vocab"].items()}
    pat = data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    t0 = time.perf_counter()  # the rank table as ctxlock keeps it on disk: its load is not tiktoken's cost
    tok = tiktoken.Encoding("qwen2", pat_str=pat, mergeable_ranks=ranks, special_tokens={})
    enc = tok.encode_ordinary
elif engine == "fastokens":
    import fastokens
    tok = fastokens.Tokenizer.from_file(tok_json)
    enc = lambda s: list(tok.encode(s, add_special_tokens=False).ids)
elif engine == "kitoken":
    import kitoken
    tok = kitoken.Kitoken.from_file(os.path.join(work, "qwen2.kitoken"))  # its own serialized form
    enc = lambda s: list(tok.encode(s))
elif engine == "gigatoken":
    import gigatoken
    tok = gigatoken.Tokenizer.from_json(open(tok_json, encoding="utf-8").read())
    enc = lambda s: tok.encode(s).tolist()
elif engine == "splintr":
    import splintr
    tok = splintr.from_json(tok_json)
    enc = lambda s: list(tok.encode(s))
t1 = time.perf_counter()
first = [enc(s) for s in texts]
t2 = time.perf_counter()
second = [enc(s) for s in texts]
t3 = time.perf_counter()
result = {"load": t1 - t0, "first": t2 - t1, "second": t3 - t2, "ids": first}
json.dump(result, open(os.path.join(work, engine + ".json"), "w"))
"""

ENGINES = ("tokenizers", "tiktoken", "fastokens", "kitoken", "gigatoken", "splintr")


def _texts() -> list[str]:
    import corpus

    out: list[str] = []
    for r in corpus.single_shot(300, scale=0.25):
        out += [m["content"] for m in r.get("messages", []) if isinstance(m.get("content"), str)]
        if r.get("tools"):
            out.append(json.dumps(r["tools"], ensure_ascii=False))
    return out


def _installed(python: str, engine: str) -> bool:
    module = {"splintr": "splintr"}.get(engine, engine)
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False).returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="the interpreter whose packages are measured")
    args = ap.parse_args()

    import fetched

    tok_json = str(fetched.hf_tokenizer_dir("qwen2") / "tokenizer.json")
    texts = _texts()
    with tempfile.TemporaryDirectory() as work:
        texts_path = str(Path(work) / "texts.json")
        Path(texts_path).write_text(json.dumps(texts), "utf-8")
        if _installed(args.python, "kitoken"):  # kitoken's serialized form, made once (not timed)
            make = (
                f"import kitoken; kitoken.Kitoken.from_tokenizers_file({tok_json!r})"
                f".to_file({work!r} + '/qwen2.kitoken')"
            )
            subprocess.run([args.python, "-c", make], check=True)
        reference = None
        print(f"{len(texts)} texts, {sum(map(len, texts)):,} characters; medians of {args.rounds} fresh processes")
        print(f"{'engine':<11} {'load (s)':>9} {'first pass (s)':>15} {'second pass (s)':>16}  ids")
        for engine in ENGINES:
            if not _installed(args.python, engine):
                print(f"{engine:<11} not installed in {args.python}")
                continue
            runs = []
            for _ in range(args.rounds):
                subprocess.run([args.python, "-c", ROUND, engine, tok_json, texts_path, work], check=True)
                runs.append(json.loads((Path(work) / f"{engine}.json").read_text("utf-8")))
            if reference is None:
                reference = runs[0]["ids"]  # tokenizers goes first: the reference
            same = all(r["ids"] == reference for r in runs)
            load, first, second = (statistics.median(r[k] for r in runs) for k in ("load", "first", "second"))
            print(
                f"{engine:<11} {load:9.3f} {first:15.3f} {second:16.3f}  "
                f"{'equal to tokenizers' if same else 'DIFFER from tokenizers'}"
            )


if __name__ == "__main__":
    main()
