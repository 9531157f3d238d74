"""No process may abort at exit.

A daemon thread that comes back from native code (fastokens' build, a probe encode) while the interpreter finalizes
is killed by a forced unwind, which the native frames turn into `FATAL: exception not rethrown` (exit code 134).
The scripts: load the Qwen2.5 HF directory, `encode` once, `.to_torch()` and exit without `warm_up()`; and
`encode_batch([...]).to_torch()` on the qwen2 GGUF. Each runs in fresh processes, two at a time: 6 times with the
background build started by the first encode (`CTXLOCK_FASTOKENS=eager`, the case that aborted: 45 of 50 runs did
before the fix, so 6 clean runs leave a chance near 1e-6 that the defect is back unseen), and twice each in the
default mode, with `CTXLOCK_FASTOKENS=sync` (built in the calling thread) and `=0` (never built). Every run must exit
0 with its output. Fresh interpreters are the point here (exit is what is tested), so these cannot run in-process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import ctxlock
import fetched

# "eager" starts the background build on the first encode (the default mode starts it only after 8M characters, so
# these short scripts would never build): the case that aborted. The default mode is run too.
RUNS = {"eager": 6, "1": 2, "sync": 2, "0": 2}

# The ctxlock under test (this worktree's, or another checkout's when PYTHONPATH points there).
SRC = str(Path(ctxlock.__file__).resolve().parents[1])

ENCODE_ONCE = """
import sys
import ctxlock
model = ctxlock.load(sys.argv[1])
tensors = model.encode({"messages": [{"role": "user", "content": "why is the sky blue?"}]}).to_torch()
print("ok", tensors["input_ids"].shape[1])
"""

ENCODE_BATCH = """
import sys
import ctxlock
model = ctxlock.load(sys.argv[1])
requests = [
    {"messages": [{"role": "user", "content": "why is the sky blue?"}]},
    {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "天空为什么是蓝色"}]},
]
tensors = model.encode_batch(requests).to_torch()
print("ok", tensors["input_ids"].shape[1])
"""


def _runs(script: str, model: str, mode: str) -> list[tuple[int, str, str]]:
    env = {**os.environ, "PYTHONPATH": SRC, "CTXLOCK_FASTOKENS": mode}

    def one(_: int) -> tuple[int, str, str]:
        proc = subprocess.run(
            [sys.executable, "-c", script, model], env=env, capture_output=True, text=True, timeout=300
        )
        return proc.returncode, proc.stdout, proc.stderr

    with ThreadPoolExecutor(2) as pool:  # two at a time: the machine has two cores
        return list(pool.map(one, range(RUNS[mode])))


@pytest.mark.parametrize("mode", ["eager", "1", "sync", "0"])
@pytest.mark.parametrize(
    ("script", "model"),
    [
        pytest.param(ENCODE_ONCE, "hf:qwen2", id="hf-dir-encode-to_torch"),
        pytest.param(ENCODE_BATCH, "gguf:qwen2", id="gguf-encode_batch-to_torch"),
    ],
)
def test_no_abort_at_exit(script: str, model: str, mode: str) -> None:
    kind, vocab = model.split(":")
    path = fetched.hf_tokenizer_dir(vocab) if kind == "hf" else fetched.gguf_path(vocab)
    results = _runs(script, str(path), mode)
    failed = [(rc, err.strip().splitlines()[-1:]) for rc, _, err in results if rc != 0]
    assert not failed, f"{len(failed)} of {RUNS[mode]} runs failed (CTXLOCK_FASTOKENS={mode}): {failed[:3]}"
    outputs = {out.split()[0] if out else "" for _, out, _ in results}
    assert outputs == {"ok"}, outputs
    # The same ids every run: the same shape printed by every process.
    assert len({out for _, out, _ in results}) == 1
