"""How a job starts its worker processes: `fork` when no other thread can be caught holding a lock, else `spawn`.

A forked child starts at once with everything its parent had loaded (ctxlock's imports, the model, the tokenizer):
no interpreter start-up, no imports, no model load (about 1.2 s of CPU a worker with `spawn`, measured, and up to
2 s when two start together on a 2-core machine). But a fork copies only the calling thread: a lock another thread
held at that instant stays held in the child for ever (the fork-after-threads deadlock). So `fork` is chosen only
when, at the OS level (`/proc/self/task`), this process has no thread but the calling one.

Two kinds of native thread are allowed for, because their libraries make them safe across a fork:
- numpy's OpenBLAS keeps an idle pool, and its `pthread_atfork` handler joins that pool before every fork (it
  starts again at the next matrix product). A throwaway fork (the child exits at once, `os._exit`) lets that
  handler run; the count is taken after it.
- jemalloc's background thread (`jemalloc_bg_thd`, started by pyarrow's import): jemalloc's own fork handlers take
  every lock it has, the background threads' included, before the fork, and reset the background-thread state in
  the child.
Any other thread (a Python thread, a Rust pool, the tokenizer's helpers) keeps the workers spawned. The caller forks
at once after the check, before it starts a thread of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading

FORK = "fork"
SPAWN = "spawn"
# Native threads whose library makes a fork safe (module docstring), by the name the kernel shows.
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})


def other_threads() -> list[str] | None:
    """The names of this process's threads besides the calling one, as the kernel lists them (Linux); None where
    they cannot be read."""
    me = str(threading.get_native_id())
    try:
        names = []
        for tid in os.listdir("/proc/self/task"):
            if tid != me:
                with open(f"/proc/self/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
                    names.append(f.read().strip())
        return names
    except OSError:
        return None


def start_method() -> tuple[str, str]:
    """`(method, why)`: "fork" when this process has no thread a fork could catch mid-state (module docstring),
    else "spawn" with the reason."""
    if not sys.platform.startswith("linux"):
        return SPAWN, f"fork is used on Linux only (this is {sys.platform})"
    if threading.active_count() > 1:
        names = ", ".join(sorted(t.name for t in threading.enumerate() if t is not threading.current_thread()))
        return SPAWN, f"this process runs other Python threads ({names})"
    if other_threads():
        _flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover  (the throwaway child exits at once: async-signal-safe)
            os._exit(0)
        os.waitpid(pid, 0)
    others = other_threads()
    if others is None:
        return SPAWN, "/proc/self/task cannot be read"
    unsafe = [n for n in others if n not in FORK_SAFE_THREADS]
    if unsafe:
        return SPAWN, f"this process runs other native threads ({', '.join(sorted(unsafe))})"
    _flush()  # the caller's fork must not copy unwritten output into the child
    return FORK, "no thread but this one" + (f" and {', '.join(sorted(others))}" if others else "")


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """In a worker process: have the kernel send `sig` to it when the process that started it dies, even by
    SIGKILL (Linux `PR_SET_PDEATHSIG`), so that no worker outlives its job; exit at once if that parent (pid
    `parent`) is already gone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(0)
