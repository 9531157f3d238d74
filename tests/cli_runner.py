"""Running the `ctxlock` command in tests, the two ways the CLI tests do it (one helper each, imported by name:
``from cli_runner import invoke, run_cli``).

- `run_cli(*args)`: as a user runs it, `python -m ctxlock ARGS` in a child process, so that exit statuses, stderr
  lines and the absence of tracebacks are the real ones. Output is decoded as UTF-8; ``NO_COLOR=1`` and a 200-column
  terminal make the human views stable (``columns=None`` leaves COLUMNS unset, as a pipe has it).
- `invoke(register, command, *args)`: one command group's `register(app)` on a fresh Typer app, run in this process
  through typer's CliRunner (fast, and the test can monkeypatch what the command calls).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

import typer
from click.testing import Result
from typer.testing import CliRunner


def run_cli(
    *args: str,
    stdin: bytes | str | None = None,
    env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    columns: str | None = "200",
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """`ctxlock ARGS` in a child process: (args, exit status, stdout, stderr), stdout and stderr as text.

    The child's environment is `base_env` (default: this process's), with ``NO_COLOR=1``, ``COLUMNS`` (unless
    `columns` is None) and `env` on top."""
    data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
    full = dict(os.environ if base_env is None else base_env)
    full["NO_COLOR"] = "1"
    if columns is None:
        full.pop("COLUMNS", None)
    else:
        full["COLUMNS"] = columns
    full.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "ctxlock", *args],
        input=data,
        capture_output=True,
        env=full,
        timeout=timeout,
        check=False,
    )
    out, err = proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def invoke(register: Callable[[typer.Typer], None], command: str, *args: str, stdin: str | None = None) -> Result:
    """`command ARGS` of the commands `register` adds, on a fresh Typer app, through typer's CliRunner."""
    app = typer.Typer(pretty_exceptions_enable=False)
    register(app)

    @app.callback()
    def _root() -> None:  # a group callback, so that typer keeps `command` as a named subcommand
        """ctxlock (test harness)"""

    return CliRunner().invoke(app, [command, *args], input=stdin)


def run_main(argv: list[str], stdin: bytes = b"") -> tuple[int, str, str]:
    """`ctxlock.cli.main(argv)` in this process: (exit status, stdout, stderr). An exception other than SystemExit
    escaping main is what the user would see as a traceback, so it fails the test with its traceback."""
    from ctxlock.cli import main

    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2))
    fake_stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    old_stdin = sys.stdin
    sys.stdin = fake_stdin
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdin = old_stdin
    return code, *(stream.buffer.getvalue().decode("utf-8") for stream in (out, err))  # type: ignore[attr-defined]


def ctxlock(*args: str, stdin: bytes | str | None = None) -> subprocess.CompletedProcess[str]:
    data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "ctxlock", *args], input=data, capture_output=True, env=env, timeout=120, check=False
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")
    )


def assert_clean_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def in_process_cli(monkeypatch: Any) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`ctxlock ARGS` as `run_cli` runs it (NO_COLOR=1, COLUMNS=200) but in this process (`run_main`: an exception
    escaping main fails the test), for tests that read the commands' output and exit status, not their process."""
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        code, out, err = run_main(list(args))
        return subprocess.CompletedProcess(list(args), code, out, err)

    return cli
