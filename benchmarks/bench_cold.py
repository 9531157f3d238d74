"""Whole processes, the way users meet ctxlock: a script, a CLI call, a CI job, a worker that has just started.

    python benchmarks/bench_cold.py [--rounds 5] [--only single,multiturn,render]

Every figure is a new Python process, started, run and reaped, timed from outside (wall time, and the child's own
CPU time, user + system, from `os.wait4`, which a busy machine disturbs less). ctxlock and transformers run in
turn, A B A B ..., the side that goes first alternating, and each ratio printed is the median over rounds of
transformers' time / ctxlock's time in the same round, so a slow spell of the machine hits both alike.

Workloads, each a whole process doing import + load + the requests + exit, on Qwen2.5's template and the Qwen2
vocabulary as transformers converts llama.cpp's GGUF (an HF directory: tokenizer.json, tokenizer_config.json;
fetched by scripts/fetch_artifacts.py):

- `single-N` (N = 1, 10, 300): the first N requests of benchmarks/corpus.py's single-shot corpus, each encoded once
  (ctxlock: `ctxlock.load(dir).encode(request, chat_template=...)`; transformers:
  `AutoTokenizer.from_pretrained(dir).apply_chat_template(..., tokenize=True)`);
- `multiturn`: 20 chats x 20 turns replayed turn by turn, each request holding the whole history;
- `render`: `ctxlock render REQUEST -m DIR -t TEMPLATE --json` of one request, against a transformers script that
  renders and tokenizes the same request and prints its ids; ctxlock with its on-disk cache warm, and again on
  the first run after a cache clear (each run gets an empty `CTXLOCK_CACHE_DIR`).

The requests are written once to a JSON file that both sides read (generating them is not timed). Before anything
is timed, the ids of every request of every workload are compared between ctxlock and transformers (the check
runs in one process per side, like the timed ones), and `ctxlock render --json`'s ids too; one difference stops
the benchmark. ctxlock's on-disk cache is warmed by one untimed process first (the warm figures are what every
process after the first gets); `render-cold` measures the first one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# The child side: as little as possible runs before the timed work (the child is the whole process).
_CHILD_CTXLOCK = """
import json, sys
requests = json.load(open(sys.argv[1]))
src = open(sys.argv[3], encoding="utf-8").read()
import ctxlock
model = ctxlock.load(sys.argv[2])
template = ctxlock.ChatTemplate(src, id="template")
ids = [model.encode(r, chat_template=template).input_ids[0] for r in requests]
if len(sys.argv) > 4:
    json.dump([i.tolist() for i in ids], open(sys.argv[4], "w"))
"""

_CHILD_TRANSFORMERS = """
import json, sys
requests = json.load(open(sys.argv[1]))
src = open(sys.argv[3], encoding="utf-8").read()
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[2])
ids = [
    list(tok.apply_chat_template(r["messages"], tools=r.get("tools"), chat_template=src, add_generation_prompt=True,
                                 tokenize=True, return_dict=False))
    for r in requests
]
if len(sys.argv) > 4:
    json.dump(ids, open(sys.argv[4], "w"))
"""


def _run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child: user + system) of one whole process; its output is discarded."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}):\n{err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def _env(cache: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if cache is not None:
        env["CTXLOCK_CACHE_DIR"] = cache
    return env


def _paired(ours: object, theirs: object, rounds: int) -> dict[str, list[float]]:
    """Both commands `rounds` times in turn, the first alternating; each a function giving (wall, cpu)."""
    out: dict[str, list[float]] = {"ours_wall": [], "ours_cpu": [], "theirs_wall": [], "theirs_cpu": []}
    for i in range(rounds):
        order = (("ours", ours), ("theirs", theirs)) if i % 2 == 0 else (("theirs", theirs), ("ours", ours))
        for name, fn in order:
            wall, cpu = fn()  # type: ignore[operator]
            out[f"{name}_wall"].append(wall)
            out[f"{name}_cpu"].append(cpu)
    return out


def _ratios(s: dict[str, list[float]], kind: str) -> list[float]:
    return sorted(t / o for t, o in zip(s[f"theirs_{kind}"], s[f"ours_{kind}"], strict=True))


def _report(label: str, s: dict[str, list[float]]) -> dict[str, object]:
    med = {k: statistics.median(v) for k, v in s.items()}
    wall, cpu = _ratios(s, "wall"), _ratios(s, "cpu")
    print(
        f"{label:24s} transformers {med['theirs_wall']:6.3f} s ({med['theirs_cpu']:.3f} cpu)   "
        f"ctxlock {med['ours_wall']:6.3f} s ({med['ours_cpu']:.3f} cpu)   "
        f"{statistics.median(wall):5.1f}x wall [{', '.join(f'{x:.1f}' for x in wall)}]   "
        f"{statistics.median(cpu):5.1f}x cpu",
        flush=True,
    )
    return {
        "label": label,
        **{f"median_{k}": v for k, v in med.items()},
        "ratio_wall": statistics.median(wall),
        "ratio_cpu": statistics.median(cpu),
        "ratios_wall": wall,
        "ratios_cpu": cpu,
    }


def _workloads(only: set[str]) -> dict[str, list[dict]]:
    sys.path.insert(0, str(HERE))
    import corpus

    single = corpus.single_shot(300)
    out: dict[str, list[dict]] = {}
    if "single" in only:
        out |= {f"single-{n}": single[:n] for n in (1, 10, 300)}
    if "multiturn" in only:
        out["multiturn"] = [r for c in range(20) for r in corpus.conversation(20, seed=100 + c)]
    if "render" in only:
        out["render"] = single[:1]
    return out


def _check(name: str, path: Path, tok_dir: str, template: str, work: Path, env: dict[str, str]) -> int:
    """The ids of every request, ctxlock's and transformers', each side in a process of its own: equal, or exit."""
    got: dict[str, list] = {}
    for side, code in (("ctxlock", _CHILD_CTXLOCK), ("transformers", _CHILD_TRANSFORMERS)):
        out = work / f"{name}.{side}.ids.json"
        _run([sys.executable, "-c", code, str(path), tok_dir, template, str(out)], env)
        got[side] = json.loads(out.read_text())
    if got["ctxlock"] != got["transformers"]:
        bad = next(i for i, (a, b) in enumerate(zip(got["ctxlock"], got["transformers"], strict=True)) if a != b)
        raise SystemExit(f"{name}: ids differ from transformers on request {bad}")
    return sum(map(len, got["transformers"]))


def _check_render(path: Path, tok_dir: str, template: str, work: Path, env: dict[str, str]) -> None:
    """`ctxlock render --json`'s ids for the request equal transformers'."""
    request = work / "render-request.json"
    request.write_text(json.dumps(json.loads(path.read_text())[0]))
    cmd = [sys.executable, "-m", "ctxlock", "render", str(request), "-m", tok_dir, "-t", template, "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    ours = json.loads(proc.stdout)["input_ids"]
    theirs_out = work / "render.transformers.ids.json"
    _run([sys.executable, "-c", _CHILD_TRANSFORMERS, str(path), tok_dir, template, str(theirs_out)], env)
    expected = json.loads(theirs_out.read_text())[0]
    if ours != expected:
        raise SystemExit("render: ctxlock render --json's ids differ from transformers'")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="paired runs of each workload (default 5)")
    ap.add_argument("--only", default="single,multiturn,render", help="comma-separated: single, multiturn, render")
    ap.add_argument("--vocab", default="qwen2")
    ap.add_argument("--template", default="Qwen-Qwen2.5-7B-Instruct.jinja")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = ap.parse_args()
    only = set(args.only.split(","))

    sys.path.insert(0, str(ROOT / "tests"))
    import fetched

    tok_dir = str(fetched.hf_tokenizer_dir(args.vocab))
    template = str(fetched.templates_dir() / args.template)
    env = _env()
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="ctxlock-bench-cold-") as tmp:
        work = Path(tmp)
        files: dict[str, Path] = {}
        for name, requests in _workloads(only).items():
            files[name] = work / f"{name}.json"
            files[name].write_text(json.dumps(requests))
        # Identical ids first (this also leaves ctxlock's on-disk cache warm, as every process after the first finds
        # it), then the timed runs.
        for name, path in files.items():
            tokens = _check(name, path, tok_dir, template, work, env)
            print(f"{name}: {len(json.loads(path.read_text()))} requests, {tokens:,} tokens, identical ids", flush=True)
        if "render" in files:
            _check_render(files["render"], tok_dir, template, work, env)
            print("render: ctxlock render --json gives transformers' ids", flush=True)
        load = os.getloadavg()
        print(f"load average before timing: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cpus)")
        for name, path in files.items():
            if name == "render":
                continue

            def ours(p: Path = path) -> tuple[float, float]:
                return _run([sys.executable, "-c", _CHILD_CTXLOCK, str(p), tok_dir, template], env)

            def theirs(p: Path = path) -> tuple[float, float]:
                return _run([sys.executable, "-c", _CHILD_TRANSFORMERS, str(p), tok_dir, template], env)

            results.append(_report(name, _paired(ours, theirs, args.rounds)))
        if "render" in files:
            request = work / "render-request.json"
            cli = [sys.executable, "-m", "ctxlock", "render", str(request), "-m", tok_dir, "-t", template, "--json"]

            def render_warm() -> tuple[float, float]:
                return _run(cli, env)

            def render_cold() -> tuple[float, float]:
                with tempfile.TemporaryDirectory(prefix="ctxlock-cache-", dir=work) as cache:
                    return _run(cli, _env(cache))

            def theirs_one() -> tuple[float, float]:
                return _run([sys.executable, "-c", _CHILD_TRANSFORMERS, str(files["render"]), tok_dir, template], env)

            results.append(_report("render (cache warm)", _paired(render_warm, theirs_one, args.rounds)))
            results.append(_report("render (cache cleared)", _paired(render_cold, theirs_one, args.rounds)))
        load = os.getloadavg()
        print(f"load average after timing: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(
        f"(whole processes: medians of {args.rounds} paired runs, ctxlock and transformers in turn, the first "
        "alternating; ratios: median of per-round transformers/ctxlock, per-round ratios in brackets)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
