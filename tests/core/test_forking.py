"""ctxlock.core._forking: a job's workers are forked only when no thread of the job's process can be caught mid-state.

Each case runs in a fresh interpreter (the test process itself has threads of its own, or may have)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fetched

SRC = Path(__file__).resolve().parents[2] / "src"


def _method(code: str) -> tuple[str, str]:
    script = textwrap.dedent(code) + "\nfrom ctxlock.core._forking import start_method\nprint(repr(start_method()))\n"
    # Without the thread caps a batch worker sets (a test that ran a shard in this process leaves them behind): with
    # RAYON_NUM_THREADS=1, tokenizers starts no pool to find.
    caps = ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS")
    env = {**{k: v for k, v in os.environ.items() if k not in caps}, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_a_process_with_no_other_thread_forks() -> None:
    assert _method("import sys") == ("fork", "no thread but this one")


def test_openblas_and_jemalloc_threads_allow_a_fork() -> None:
    """numpy's OpenBLAS pool (joined by its own fork handler) and pyarrow's jemalloc background thread (quiesced
    and reset by jemalloc's fork handlers) are the two native threads allowed for."""
    method, why = _method("import numpy, pyarrow; numpy.ones((64, 64)) @ numpy.ones((64, 64))")
    assert method == "fork" and "jemalloc_bg_thd" in why


def test_a_python_thread_means_spawn() -> None:
    method, why = _method(
        """
        import threading
        stop = threading.Event()
        threading.Thread(target=stop.wait, name="holder", daemon=True).start()
        """
    )
    assert (method, why) == ("spawn", "this process runs other Python threads (holder)")


def test_a_native_pool_means_spawn() -> None:
    """tokenizers' rayon pool (native threads Python does not know of) rules a fork out."""
    path = fetched.hf_tokenizer_dir("qwen2") / "tokenizer.json"
    method, why = _method(
        f"""
        import tokenizers
        tokenizers.Tokenizer.from_file({str(path)!r}).encode_batch(["hello world"] * 64)
        """
    )
    assert method == "spawn" and why.startswith("this process runs other native threads")


def test_the_throwaway_fork_leaves_no_child() -> None:
    """The probe's child is reaped (no zombie), and OpenBLAS's pool stays joined after it."""
    script = (
        "import numpy, os; numpy.ones((64, 64)) @ numpy.ones((64, 64));"
        "from ctxlock.core._forking import start_method; print(start_method()[0]);"
        "pid = os.getpid(); print(open(f'/proc/{pid}/task/{pid}/children').read().split(),"
        " len(os.listdir('/proc/self/task')))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["fork", "[] 1"]


def test_one_encode_thread_when_a_worker() -> None:
    """`CTXLOCK_ENCODE_THREADS=1` (a batch worker's policy): a long chat is encoded without the second thread that
    otherwise takes its second half (`ctxlock-half`), with the same ids."""
    model = fetched.hf_tokenizer_dir("qwen2")
    script = textwrap.dedent(
        f"""
        import json, threading, ctxlock
        m = ctxlock.load({str(model)!r})
        turns = [{{"role": r, "content": f"turn {{i}} " + "words and more words " * 40}}
                 for i, r in zip(range(12), ["user", "assistant"] * 6)]
        ids = m.encode({{"messages": turns}})["input_ids"][0].tolist()
        halves = sorted(t.name for t in threading.enumerate() if t.name.startswith("ctxlock-half"))
        print(json.dumps([len(ids), hash(tuple(ids)), halves]))
        """
    )
    results = []
    for value in (None, "1"):
        env = {**os.environ, "PYTHONPATH": str(SRC), "CTXLOCK_FASTOKENS": "0"}
        env.pop("CTXLOCK_ENCODE_THREADS", None)
        if value is not None:
            env["CTXLOCK_ENCODE_THREADS"] = value
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    (n0, h0, two), (n1, h1, one) = results
    assert (n0, h0) == (n1, h1) and n0 > 1000
    assert two == ["ctxlock-half_0"] and one == []
