"""ctxlock batch on a real two-node Ray cluster.

The module starts its own cluster with `ray start` (a head and a second node started together, 1 CPU each, bounded
memory and object store, token authentication, its own temporary directory and ports), joins it as the driver
(`ray.init(address=...)`), and tears it down after, even on failure: each node's processes are in their own session,
killed by pid, and the test checks none is left. The Ray engine must write the local engine's shards and manifest
byte for byte, on inputs with bad rows (broken JSON, blank lines, invalid UTF-8, CRLF, no final newline, lines
longer than a 1 MiB block), Parquet input, --pack and --max-length, --trajectories, and a --resume that finishes
another engine's run. A driver in a mount namespace where the input and the output directory are hidden (tmpfs)
runs a job to completion: the workers read and write. Last, the fault test kills a worker process mid-job, then the
second node while it runs a shard; the output is still the undisturbed run's, byte for byte. The 20,000-row
acceptance run is test_batch_20k.py's (no Ray: under `pytest -n 2 --dist loadfile` it runs beside this module).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from test_batch import _dataset, _long_chats, _tree
from test_batch_20k import _conversations

from cli_runner import run_main
from ctxlock.batch._dist import Place, make_shard, read_place
from ctxlock.batch._ray import ray_engine
from ctxlock.batch._run import BatchOptions, Progress, job_of, run_batch
from ctxlock.errors import InputError
from ray_nodes import free_port, kill_session, session_pids

SRC = Path(__file__).resolve().parents[2] / "src"
EXAMPLES = SRC.parent / "examples"
RAY = Path(sys.executable).parent / "ray"
# Per node: 1 CPU, 2 GB of Ray's memory resource, a 100 MB object store (the job puts only records there).
# No log monitor (the driver takes no worker logs): a process less per node.
NODE = [
    "--num-cpus=1",
    "--memory=2000000000",
    "--object-store-memory=100000000",
    "--disable-usage-stats",
    "--include-log-monitor=false",
]
# A lost node is declared dead after about 1.5 s of failed health checks (Ray's default is about 15 s).
HEALTH = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}


@dataclass
class Cluster:
    """A local Ray cluster started by `ray start`: `address` (the head's GCS), each node's session."""

    address: str = ""
    env: dict[str, str] = field(default_factory=dict)
    head: int = 0
    worker: int = 0
    temp: str = ""

    def launch(self, *args: str) -> subprocess.Popen[bytes]:
        """`ray start ...` in a new session: the daemons it starts and their workers stay in it (its id: the pid)."""
        return subprocess.Popen(
            [str(RAY), "start", *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def started(self, proc: subprocess.Popen[bytes]) -> int:
        """The session id of a `ray start` that returned 0; else its node killed and its output raised."""
        out, _ = proc.communicate(timeout=90)
        if proc.returncode:
            self.kill_node(proc.pid)
            raise RuntimeError(f"ray start failed: {out[-3000:].decode(errors='replace')}")
        return proc.pid

    def kill_node(self, sid: int) -> None:
        """SIGKILL every process of the node's session (by pid), until none is left (10 s at most)."""
        kill_session(sid)

    def busy_worker(self, *sids: int) -> int | None:
        """A worker process of these nodes (their sessions; default both) running a task: its title is `ray::_call`
        (the engine's one remote function) while it runs one, `ray::IDLE` between tasks."""
        for sid in sids or (self.worker, self.head):
            for pid in session_pids(sid):
                if _running_a_task(pid):
                    return pid
        return None

    def freeze_node(self, sid: int) -> list[int]:
        """SIGSTOP every process of the node's session: until killed or continued, none of them changes (no task
        ends, no title changes)."""
        pids = session_pids(sid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pids


def _running_a_task(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::_call")
    except OSError:
        return False


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[Cluster]:
    temp = tempfile.mkdtemp(prefix="ctxr-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    # Token authentication, with Ray's own token file (~/.ray/auth_token, made by the head when missing): the GCS
    # listens on every interface (https://docs.ray.io/en/latest/ray-security/token-auth.html).
    token = {"RAY_AUTH_MODE": "token"}
    env = {**os.environ, **token, "PYTHONPATH": str(SRC), "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    c = Cluster(address=f"127.0.0.1:{port}", env=env, temp=temp)
    saved = {k: os.environ.get(k) for k in token}
    try:
        # Both nodes start at once: the second one's `ray start` retries its connection until the head's GCS
        # answers (ray._private.node.Node._init_gcs_client).
        head = c.launch(
            "--head",
            f"--port={port}",
            f"--temp-dir={temp}",
            "--include-dashboard=false",
            # No autoscaler monitor (the cluster is fixed): an interpreter importing Ray at start, for nothing.
            "--no-monitor",
            f"--dashboard-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--system-config={json.dumps(HEALTH)}",
            *NODE,
        )
        second = c.launch(
            f"--address={c.address}", f"--temp-dir={temp}", f"--dashboard-agent-listen-port={free_port()}", *NODE
        )
        c.head, c.worker = head.pid, second.pid  # torn down below even when a start fails
        c.started(head)
        c.started(second)
        os.environ.update(token)
        # Ray reads RAY_AUTH_MODE once per process, when its config is first made (`ray.init` of an explicit address
        # never turns token auth on by itself): read it again, as Ray's own `_enable_token_auth` does.
        ray._raylet.Config.initialize("")
        ray.init(address=c.address, log_to_driver=False, logging_level="WARNING")
        assert [n["Resources"].get("CPU") for n in ray.nodes() if n["Alive"]] == [1.0, 1.0]
        yield c
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        ray._raylet.Config.initialize("")
        left = []
        for sid in (c.worker, c.head):
            if sid:
                c.kill_node(sid)
                left += session_pids(sid)
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"Ray processes left: {left}"


def _hostile(tmp: Path) -> Path:
    """JSONL with every kind of bad line, CRLF endings, no newline after the last line, and two long lines (JSON
    whitespace) so that the file spans three 1 MiB blocks and shards start in later blocks."""
    lines = [x.encode() for x in _dataset(70, seed=11)]
    lines[3] = b""
    lines[10] = b"\xff\xfe{"
    lines[20] = lines[21] + b"\r"
    lines[30] = b'{"messages": "no"}'
    lines[40] = lines[40][:-1] + b" " * 1_500_000 + b"}"
    lines[50] = lines[50][:-1] + b" " * 900_000 + b"}"
    path = tmp / "in.jsonl"
    path.write_bytes(b"\n".join(lines))
    return path


@pytest.mark.parametrize(("options", "uri"), [({}, False), ({"pack": 300, "max_length": 120}, True)])
def test_ray_writes_the_local_engines_bytes(tmp_path: Path, options: dict[str, Any], uri: bool) -> None:
    """Local paths, or `file://` URIs for the input and the output (read and written through pyarrow.fs in the
    workers: the code path of s3:// and gs://), scanned one 1 MiB block per task: shards whose first row starts in
    the second and third blocks, rows longer than a block. The error rows stay in the shard records: what a shard
    task sends back has none (the commit task reads them from the record files)."""
    source = _hostile(tmp_path)
    opts = BatchOptions(model="book", shard_rows=7, **options)
    local = run_batch(source, tmp_path / "local", opts)
    where = f"file://{source}" if uri else str(source)
    to = f"file://{tmp_path}/ray" if uri else str(tmp_path / "ray")
    on_ray = run_batch(where, to, opts, engine=ray_engine(workers=2, chunk_blocks=1))
    assert on_ray == local and local["rows"] == 70 and local["error_count"] >= 4
    assert local["input"]["bytes"] > 2 << 20 and len(local["shards"]) == 10
    assert _tree(tmp_path / "ray") == _tree(tmp_path / "local")
    errors = [json.loads(x) for x in (tmp_path / "ray" / "errors.jsonl").read_text("utf-8").splitlines()]
    assert {3, 10, 30} <= {e["row"] for e in errors}
    # Shard 1 (rows 7 to 13, row 10 broken) as its task sends it back on a resume: counts and digests, no rows.
    with mock.patch.dict(os.environ):  # a shard task caps the tokenizer threads in its process's environment
        sent, kept, _ = make_shard(where, Place(1, 7, 14, 0, 7), False, to, opts, job_of(opts))
    whole = json.loads((tmp_path / "ray" / "shard-00001.json").read_text("utf-8"))
    assert kept and whole["errors"] and sent["error_count"] == len(whole["errors"]) and "errors" not in sent
    assert sent["record_sha256"] == hashlib.sha256((tmp_path / "ray" / "shard-00001.json").read_bytes()).hexdigest()


def test_cli_engine_ray(tmp_path: Path) -> None:
    """`ctxlock batch --engine ray` joins the Ray this process runs (the module's cluster) and writes the same."""
    source = _hostile(tmp_path)
    base = ["batch", str(source), "-m", "book", "--shard-rows", "20", "--json"]
    code, out, _ = run_main([*base[:2], str(tmp_path / "ray"), *base[2:], "--engine", "ray", "--workers", "2"])
    assert code == 0 and json.loads(out)["rows"] == 70
    assert run_main([*base[:2], str(tmp_path / "local"), *base[2:]])[0] == 0
    assert _tree(tmp_path / "ray") == _tree(tmp_path / "local")


def test_ray_trajectories_are_the_local_engines_bytes(tmp_path: Path) -> None:
    """--trajectories (docs/trajectories.md) on the cluster: the weather trajectory of examples/, a broken line, a
    blank line and the trajectory again (no final newline), in shards of 2 rows: the Ray engine's files are the
    local engine's, byte for byte, forks and error rows included."""
    line = (EXAMPLES / "weather-trajectory.jsonl").read_bytes().rstrip(b"\n")
    source = tmp_path / "traj.jsonl"
    source.write_bytes(b"\n".join([line, b'{"messages": [', b"", line]))
    opts = BatchOptions(shard_rows=2, trajectories=True)
    local = run_batch(source, tmp_path / "local", opts)
    on_ray = run_batch(source, tmp_path / "ray", opts, engine=ray_engine(workers=2))
    assert on_ray == local and (local["rows"], local["row_count"], local["error_count"]) == (4, 2, 2)
    assert local["policy"]["trajectories"] and all(sum(s["forks"].values()) for s in local["shards"])
    assert _tree(tmp_path / "ray") == _tree(tmp_path / "local")


def test_ray_reads_parquet_and_fits_like_local(tmp_path: Path) -> None:
    """Parquet whose messages are in a column of another name (--messages-column), row groups of 7 rows (a shard
    starts inside one), --max-length fitting rows: the workers read it through pyarrow.fs (`file://`)."""
    table = pa.Table.from_pylist([json.loads(x) for x in _long_chats(45, seed=12)])
    pq.write_table(table.rename_columns(["conversation"]), tmp_path / "in.parquet", row_group_size=7)
    opts = BatchOptions(model="book", shard_rows=10, max_length=200, messages_column="conversation")
    local = run_batch(tmp_path / "in.parquet", tmp_path / "local", opts)
    on_ray = run_batch(f"file://{tmp_path}/in.parquet", tmp_path / "ray", opts, engine=ray_engine(workers=2))
    assert on_ray == local and local["fit"]["rows_fitted"] and local["fit"]["rows_over"]
    assert local["policy"]["messages_column"] == "conversation" and local["row_count"] > 20
    assert _tree(tmp_path / "ray") == _tree(tmp_path / "local")
    with pytest.raises(InputError, match="has no column 'messages_'"):
        run_batch(
            tmp_path / "in.parquet", tmp_path / "x", replace(opts, messages_column="messages_"), engine=ray_engine()
        )


def test_ray_resumes_a_local_run(tmp_path: Path) -> None:
    source = _hostile(tmp_path)
    opts = BatchOptions(model="book", shard_rows=10)
    run_batch(source, tmp_path / "whole", opts)
    out = tmp_path / "out"
    run_batch(source, out, opts)
    for name in ("shard-00001.json", "shard-00004.parquet", "manifest.json", "errors.jsonl"):
        (out / name).unlink()
    (out / "shard-00005.parquet").write_bytes(b"PAR1 damaged")
    # Records are data: a shard file that is a link to /dev/zero, a record whose row count was edited.
    (out / "shard-00002.parquet").unlink()
    (out / "shard-00002.parquet").symlink_to("/dev/zero")
    record = json.loads((out / "shard-00003.json").read_text("utf-8"))
    (out / "shard-00003.json").write_text(json.dumps({**record, "row_count": 1004}), "utf-8")
    seen: list[Progress] = []
    run_batch(source, out, opts, resume=True, on_progress=seen.append, engine=ray_engine(workers=2))
    assert seen[-1].shards_kept == 2 and seen[-1].shards_done == 7 and sorted(seen[-1].remade) == [1, 2, 3, 4, 5]
    assert _tree(out) == _tree(tmp_path / "whole")


def test_resumes_across_engines_on_a_uri_output(tmp_path: Path) -> None:
    """A Ray run into a `file://` output that lost its manifest and two shards (as a killed driver leaves it),
    finished by the local engine; then, on that output, a Ray resume through pyarrow.fs after a shard was damaged,
    a record was removed and a stale temporary file was left: each time the files of an uninterrupted run."""
    source = _hostile(tmp_path)
    opts = BatchOptions(model="book", shard_rows=10)
    out, uri = tmp_path / "out", f"file://{tmp_path}/out"
    run_batch(f"file://{source}", uri, opts, engine=ray_engine(workers=2, chunk_blocks=1))
    for name in ("shard-00002.json", "shard-00006.parquet", "manifest.json", "errors.jsonl"):
        (out / name).unlink()
    seen: list[Progress] = []
    run_batch(source, out, opts, resume=True, on_progress=seen.append)
    assert seen[-1].shards_kept == 5 and sorted(seen[-1].remade) == [2, 6]
    whole = _tree(run_batch(source, tmp_path / "whole", opts) and tmp_path / "whole")
    assert _tree(out) == whole
    (out / "manifest.json").unlink()
    (out / "shard-00003.json").unlink()
    (out / "shard-00005.parquet").write_bytes(b"PAR1 damaged")
    (out / ".shard-00001.parquet.0123.tmp").write_bytes(b"half")
    seen.clear()
    run_batch(str(source), uri, opts, resume=True, on_progress=seen.append, engine=ray_engine(workers=2))
    assert seen[-1].shards_kept == 5 and sorted(seen[-1].remade) == [3, 5], seen[-1].remade
    assert _tree(out) == whole


def test_a_resume_with_other_options_remakes_the_shards(tmp_path: Path) -> None:
    source = _hostile(tmp_path)
    out = tmp_path / "out"
    run_batch(source, out, BatchOptions(model="book", shard_rows=10))
    (out / "manifest.json").unlink()
    seen: list[Progress] = []
    opts = BatchOptions(model="book", shard_rows=10, max_length=50)
    run_batch(source, out, opts, resume=True, on_progress=seen.append)
    assert seen[-1].shards_kept == 0
    run_batch(source, tmp_path / "fresh", opts)
    assert _tree(out) == _tree(tmp_path / "fresh")


def test_why_the_dataset_is_shards_not_read_json_rows(tmp_path: Path) -> None:
    """The engine's dataset is the job's shards, each task reading its rows itself, rather than Ray Data's readers'
    rows (docs/batch-ray.md). `ray.data.read_json` fails the whole read on one bad line (the job makes it an error
    row at its number), skips a blank line, and reads well-formed requests into one inferred schema, so a message
    gets keys the user never sent (`"tool_calls": None` on every message of a request without tool calls), which
    changes what a template sees (`is defined`) and the request's digest. `read_json(lines=True)` (pandas' reader)
    fails on the bad line too, adds keys as well, and drops a blank line (every later row's number shifts).
    `read_text(drop_empty_lines=False)` keeps the lines as text, but splits them with `str.splitlines`, so a request
    with an unescaped U+2028 in a string (valid JSON) becomes two rows, and one invalid UTF-8 byte fails the whole
    read."""
    plain = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    tools = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
        ]
    }
    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps(plain) + "\n\n" + json.dumps(tools) + "\n", "utf-8")
    rows = ray.data.read_json(str(path)).take_all()
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps(plain).encode() + b'\n{"messages": [\n' + json.dumps(tools).encode() + b"\n")
    for lines in (False, True):
        with pytest.raises(Exception) as failed:  # Ray wraps pyarrow's ArrowInvalid, pandas' ValueError
            ray.data.read_json(str(bad), lines=lines).take_all()
        assert any(x in str(failed.value) for x in ("JSON", "ArrowInvalid", "ValueError")), failed.value
    assert len(rows) == 2  # three lines, the blank one skipped
    first = next(r for r in rows if r["messages"][0]["content"] == "hi")
    assert "tool_calls" in first["messages"][0] and "tool_calls" not in plain["messages"][0]
    by_pandas = ray.data.read_json(str(path), lines=True).take_all()
    assert len(by_pandas) == 2  # three lines, the blank one dropped
    second = next(r for r in by_pandas if r["messages"][0]["content"] == "weather?")
    assert "tool_calls" in second["messages"][0] and "tool_calls" not in tools["messages"][0]
    # ctxlock's reader gives the line's bytes as they are (`batch.read_place`): the parsed request has no such key
    assert b"tool_calls" not in read_place(str(path), Place(0, 0, 1), parquet=False)[0][1]
    separator = tmp_path / "u2028.jsonl"
    separator.write_text('{"messages": [{"role": "user", "content": "a\u2028b"}]}\n' + json.dumps(plain), "utf-8")
    texts = ray.data.read_text(str(separator), drop_empty_lines=False).take_all()
    assert len(texts) == 3 and len(read_place(str(separator), Place(0, 0, 2), parquet=False)) == 2
    undecodable = tmp_path / "undecodable.jsonl"
    undecodable.write_bytes(json.dumps(plain).encode() + b"\n\xff\xfe{\n")
    with pytest.raises(Exception, match=r"UnicodeDecodeError|codec can.t decode"):
        ray.data.read_text(str(undecodable), drop_empty_lines=False).take_all()


# -- the driver sees neither the input nor the output; faults --------------------------------------------------

_DRIVER = """
import json, os, sys
from ctxlock.batch._dist import Place, make_shard, read_place
from ctxlock.batch._ray import ray_engine
from ctxlock.batch._run import BatchOptions, run_batch
source, out, address = sys.argv[1:4]
hidden = os.path.dirname(source)
assert not os.path.exists(source) and os.listdir(hidden) == [], os.listdir(hidden)
engine = ray_engine(address, workers=2, chunk_blocks=1)
manifest = run_batch(source, out, BatchOptions(model="book", shard_rows=7), engine=engine)
assert os.listdir(hidden) == [], os.listdir(hidden)  # the driver wrote nothing where the output is
print(json.dumps(manifest))
"""


def _private_mounts(scratch: Path) -> list[str]:
    """The `unshare` command line whose child may mount a tmpfs that no other process sees: as root, a mount
    namespace (`--mount`); else a user namespace too (`--map-root-user`: no privilege needed where the kernel allows
    unprivileged user namespaces, https://man7.org/linux/man-pages/man7/user_namespaces.7.html). Each is tried on
    `scratch`; when none works the test fails, naming what the machine lacks (never a skip)."""
    if shutil.which("unshare") is None:
        pytest.fail("this test needs unshare(1) (util-linux) to hide the input from the driver; install it")
    private = ["--mount", "--propagation", "private"]
    ways = ([["unshare", *private]] if os.geteuid() == 0 else []) + [["unshare", "--map-root-user", *private]]
    tried = []
    for way in ways:
        probe = subprocess.run(
            [*way, "mount", "-t", "tmpfs", "tmpfs", str(scratch)], capture_output=True, text=True, timeout=30
        )
        if probe.returncode == 0:
            return way
        tried.append(f"`{' '.join(way)} mount -t tmpfs ...`: {' '.join(probe.stderr.split())[-300:]}")
    knobs = ["/proc/sys/user/max_user_namespaces", "/proc/sys/kernel/unprivileged_userns_clone"]
    knobs += ["/proc/sys/kernel/apparmor_restrict_unprivileged_userns"]
    found = {k: Path(k).read_text().strip() for k in knobs if Path(k).exists()}
    pytest.fail(
        f"cannot mount a tmpfs in a private mount namespace (uid {os.geteuid()}): {'; '.join(tried)}. "
        "The machine lacks root or unprivileged user namespaces (max_user_namespaces > 0, "
        f"unprivileged_userns_clone = 1, no AppArmor or seccomp rule against them; here: {found})"
    )


def test_the_driver_needs_neither_input_nor_output(cluster: Cluster, tmp_path: Path) -> None:
    """The driver runs in its own mount namespace (`unshare --mount`, in a user namespace of its own when not root)
    with a tmpfs over the directory that holds the input and the output directory: it cannot read the one nor write
    the other, yet the job completes, and the output the cluster's workers wrote (seen from outside) is the local
    engine's, byte for byte."""
    (tmp_path / "scratch").mkdir()
    unshare = _private_mounts(tmp_path / "scratch")
    data = tmp_path / "data"
    data.mkdir()
    source = _hostile(data)
    local = run_batch(source, tmp_path / "local", BatchOptions(model="book", shard_rows=7))
    out = data / "ray"
    script = f'mount -t tmpfs tmpfs "{data}" && exec "{sys.executable}" -c "$0" "$@"'
    cmd = [*unshare, "sh", "-c", script, _DRIVER, str(source), str(out)]
    proc = subprocess.run([*cmd, cluster.address], env=cluster.env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == local
    assert _tree(out) == _tree(tmp_path / "local")


def test_a_worker_process_then_a_node_killed_mid_job(cluster: Cluster, tmp_path: Path) -> None:
    """While the job runs: SIGKILL a worker process of the head running a shard task, then the whole second node
    (its raylet and everything it started) while one of its workers runs a shard task (waited for, 60 s at most). Ray
    runs the lost tasks again on what is left; the output has no half shard and no temporary file, and is the
    undisturbed local run's, byte for byte. Last in the module: the cluster has one node after it."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(x + "\n" for x in _conversations(1200, seed=5)), "utf-8")
    opts = BatchOptions(model="book", shard_rows=30)
    local = run_batch(source, tmp_path / "local", opts)
    out = tmp_path / "ray"
    events: dict[str, Any] = {}

    def records() -> int:
        return len(list(out.glob("shard-*.json"))) if out.is_dir() else 0

    def faults() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "worker" not in events:
            # A worker of the head: the second node's worker is the next fault's, and a second node whose only
            # worker is being started again can sit out the whole shard loop on a loaded machine.
            if records() >= 2 and (pid := cluster.busy_worker(cluster.head)) is not None:
                os.kill(pid, signal.SIGKILL)
                events["worker"] = (pid, records())
            time.sleep(0.005)
        # The second node dies while one of its workers runs a task: a busy worker seen there, the node frozen
        # (SIGSTOP), the worker still busy, then every process of the node killed; else the node goes on.
        while time.monotonic() < deadline and "node" not in events:
            if records() >= 10 and (pid := cluster.busy_worker(cluster.worker)) is not None:
                frozen = cluster.freeze_node(cluster.worker)
                if _running_a_task(pid) and records() < 40:  # a shard's task, not the commit's
                    cluster.kill_node(cluster.worker)
                    events["node"] = (pid, records(), (out / "manifest.json").exists())
                    break
                for stopped in frozen:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(stopped, signal.SIGCONT)
            time.sleep(0.005)

    killer = threading.Thread(target=faults)
    killer.start()
    try:
        manifest = run_batch(source, out, opts, engine=ray_engine(cluster.address, workers=2))
    finally:
        killer.join()
    # Both faults hit before the commit. The node was killed while a worker of its ran a task, and before the 40th
    # shard's record was written (counted after the kill): the driver was still in its shard loop (the scans before
    # it had returned, the check after it had not begun), so that task was a shard's.
    assert "worker" in events and "node" in events and events["node"][2] is False, events
    assert events["node"][1] < 40 == len(local["shards"]), events
    # the job can finish on the head before the GCS's health checks declare the killed node dead (on a loaded
    # machine well past their 1.5 s): wait for that verdict, bounded, rather than read it once
    deadline = time.monotonic() + 60
    while [n["Alive"] for n in ray.nodes()].count(False) != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [n["Alive"] for n in ray.nodes()].count(False) == 1, ray.nodes()
    assert manifest == local and _tree(out) == _tree(tmp_path / "local")
