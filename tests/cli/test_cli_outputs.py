"""Every file a command writes goes through one opener (`ctxlock.cli.files.open_output`): whatever is at the path, a
full device, a FIFO nobody reads, a directory, a socket, a missing parent, the command ends with one error line naming
the option and the path, exit status 1, never a traceback or a hang. Each command runs in this process
(`cli_runner.run_main`); the FIFO has no reader, so a regression hangs in open() rather than failing (the suite's
timeout catches it)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_runner import run_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "seed-sky-injection.json"
USAGE_LOG = ROOT / "examples" / "anthropic-usage-log.jsonl"
TRAJECTORY = {"messages": [{"role": "user", "content": "hi"}], "steps": [{"completion_ids": [1, 2]}]}


def _targets(root: Path) -> Iterator[tuple[str, Path]]:
    """(kind, path) of every kind of path a write must refuse."""
    root.mkdir()
    os.mkfifo(root / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock"))  # stays bound for the test's life (closed with the process)
    _SOCKETS.append(sock)
    yield "directory", root
    yield "fifo", root / "fifo"
    yield "socket", root / "sock"
    yield "missing parent", root / "no" / "such" / "out"
    if os.path.exists("/dev/full"):
        yield "full device", Path("/dev/full")


_SOCKETS: list[socket.socket] = []

# (argv with {} for the output path, the option named in the error)
COMMANDS: list[tuple[tuple[str, ...], str]] = [
    (("fit", "-m", "book", "--max-input-tokens", "100", str(EXAMPLE), "--emit-request", "{}"), "--emit-request"),
    (("trajectory", "{IN}", "-o", "{}"), "--out"),
    (("calibrate", str(USAGE_LOG), "--provider", "anthropic", "--out", "{}"), "--out"),
    (("records", "export", "--out", "{}"), "--out"),
]


@pytest.mark.parametrize(("argv", "option"), COMMANDS, ids=[c[0][0] for c in COMMANDS])
def test_every_unwritable_output_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...], option: str
) -> None:
    monkeypatch.setenv("CTXLOCK_DATA_DIR", str(tmp_path / "store"))
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(TRAJECTORY) + "\n", "utf-8")
    if argv[0] == "records":  # a store with one record to export
        code, _, err = run_main(["render", "-m", "book", "--record", str(EXAMPLE)])
        assert code == 0, err
    checked = []
    for kind, path in _targets(tmp_path / "out"):
        args = [a.replace("{IN}", str(source)).replace("{}", str(path)) for a in argv]
        code, _, err = run_main(args)
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1 and "Traceback" not in err, (kind, err)
        assert lines[0].startswith(f"error: InputError: {option} {path}: "), (kind, lines[0])
        checked.append(kind)
    assert {"directory", "fifo", "socket", "missing parent"} <= set(checked)
