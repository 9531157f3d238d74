"""Issue 16 item 1 (the CLI's start-up): `ctxlock CMD` imports only CMD's module.

`ctxlock.cli.COMMANDS` names, per command module, the commands it registers; `main` builds an application with the
one module of the command it runs. These tests hold the table to what the modules really register, and check in a
fresh process that running a command leaves the other command modules (and what only they need) unimported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer

import ctxlock
from ctxlock import cli

SRC = str(Path(ctxlock.__file__).resolve().parents[1])
ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str]) -> int:
    """`ctxlock.cli.main(argv)` in this process: its exit status (main returns normally on success)."""
    try:
        cli.main(argv)
    except SystemExit as exit_:
        return exit_.code or 0
    return 0


def _names(app: typer.Typer) -> set[str]:
    names = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    return names | {g.name for g in app.registered_groups}


@pytest.mark.parametrize("module", list(cli.COMMANDS))
def test_the_table_names_what_each_module_registers(module: str) -> None:
    assert _names(cli.build_app((module,))) == set(cli.COMMANDS[module])


def test_the_whole_application_has_every_command_once() -> None:
    every = [name for names in cli.COMMANDS.values() for name in names]
    assert len(every) == len(set(every))
    assert _names(cli.app) == set(every)
    # Every module of the package that registers commands is in the table.
    modules = {p.stem for p in Path(cli.__file__).parent.glob("*.py") if "def register(" in p.read_text("utf-8")}
    assert modules == set(cli.COMMANDS)


@pytest.mark.parametrize("command", [n for names in cli.COMMANDS.values() for n in names])
def test_each_command_runs_from_its_own_module(command: str, capfd: pytest.CaptureFixture[str]) -> None:
    assert _run([command, "--help"]) == 0
    assert "Usage: ctxlock " + command in capfd.readouterr().out.replace("\n", " ")


def test_a_single_command_module_is_still_a_group() -> None:
    # A lone command must still be called by its name (typer would otherwise run it without one).
    assert _run(["count", "--help"]) == 0
    assert _run(["examples/seed-sky-injection.json"]) == 2


def test_render_imports_no_other_command_module() -> None:
    code = (
        "import sys, json\n"
        "from ctxlock.cli import main\n"
        "try:\n"
        "    main(['render', 'examples/seed-sky-injection.json', '--json'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('ctxlock'))), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert json.loads(proc.stdout)["text"]
    loaded = set(json.loads(proc.stderr.strip().splitlines()[-1]))
    others = {f"ctxlock.cli.{m}" for m in cli.COMMANDS if m != "render"}
    assert not loaded & others, sorted(loaded & others)
    assert "ctxlock.cli.render" in loaded
    assert "ctxlock.economics._promptcache" not in loaded and "ctxlock.generation._constrain" not in loaded
