"""Ray nodes on loopback, for the tests and benchmarks that start a real cluster (`tests/batch/test_batch_ray.py`,
`benchmarks/bench_ray_nodes.py`): each `ray start` runs in a session of its own, and a node is torn down by killing
every process of its session by pid (never `ray stop`, which would stop other Ray processes on the machine)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes in session `sid` (a node's daemons and its workers, which have process groups of
    their own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[3]) == sid and stat[0] != "Z":
                found.append(int(entry.name))
    return found


def kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (by pid), until none is left (10 s at most)."""
    deadline = time.monotonic() + 10
    while (pids := session_pids(sid)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
