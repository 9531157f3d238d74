"""The runner of the examples in README.md and docs/*.md (wired by the repository's root conftest.py, with sybil).

- ```python blocks run in order, one namespace per page (sybil's PythonCodeBlockParser); a block written with
  `>>>` prompts is a doctest whose output is checked (ELLIPSIS and NORMALIZE_WHITESPACE on: `...` elides).
- ```console blocks: a line starting with `$ ` is a shell command (a line ending in `\\` continues it); the lines
  after it, up to the next `$ ` or the block's end, are what it prints, stdout then stderr, as a terminal shows them
  (NO_COLOR=1, COLUMNS=100). `...` alone on a line matches any number of lines; inside a line it matches any text.
  A last line `[exit N]` is the exit status; without one the command must exit 0. Commands run in bash with the
  repository as the working directory, this checkout's `src` first on PYTHONPATH, the `ctxlock` of this Python
  first on PATH, and `$TMP` a fresh directory per page.
- `<!-- not-run: REASON -->` right before a ```console block documents a command the suite cannot run (an install,
  `make test` itself); the reason is required (tests/project/test_docs_site.py counts them).
- ```json, ```toml, ```jinja, ```text blocks are data, shown, not run.

This module must not import ctxlock (the commands run it).
"""

from __future__ import annotations

import contextlib
import doctest
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown import PythonCodeBlockParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN = re.compile(r"<!--\s*not-run:(?P<reason>[^>]*)-->\s*$")
ELIDED_LINE = "..."
HEREDOC = re.compile(r"<<-?\s*'?(?P<end>\w+)'?\s*$")
TIMEOUT_S = 120


@dataclass(frozen=True)
class Command:
    line: int  # 1-based line of the `$ ` in the page
    text: str  # the command, continuation lines joined as the shell joins them
    expected: tuple[str, ...]  # the output lines shown, without the exit line
    status: int


def parse_console(source: str, first_line: int = 1) -> list[Command]:
    """The commands of a console block and the output each shows."""
    commands: list[Command] = []
    lines = source.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise ValueError(f"line {first_line + i}: a console block starts each command with '$ ': {lines[i]!r}")
        start = i
        parts = [lines[i][2:]]
        while parts[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            parts.append(lines[i])
        if heredoc := HEREDOC.search(parts[-1]):  # `<<'EOF'`: the lines up to EOF are the command's input
            while i + 1 < len(lines) and lines[i] != heredoc.group("end"):
                i += 1
                parts.append(lines[i])
        i += 1
        out: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            out.append(lines[i])
            i += 1
        status = 0
        if out and (m := re.fullmatch(r"\[exit (\d+)\]", out[-1])):
            status = int(m.group(1))
            out.pop()
        commands.append(Command(first_line + start, "\n".join(parts), tuple(out), status))
    return commands


def output_matches(expected: Iterable[str], actual: str) -> bool:
    """Whether ACTUAL (the command's output) is EXPECTED, with `...` elisions and trailing spaces ignored."""
    pattern = []
    for line in expected:
        line = line.rstrip()
        if line == ELIDED_LINE:
            pattern.append(r"(?:[^\n]*\n)*?")
        else:
            pattern.append(".*?".join(re.escape(piece) for piece in line.split("...")) + r"\n")
    text = "".join(f"{line.rstrip()}\n" for line in actual.rstrip("\n").splitlines()) if actual.strip() else ""
    return re.fullmatch("".join(pattern), text) is not None


def environment(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORCE_COLOR", "CLICOLOR"))}
    env.update(
        NO_COLOR="1",
        COLUMNS="100",
        TERM="dumb",
        TMP=str(tmp),
        CTXLOCK_DATA_DIR=str(tmp / "store"),  # the default record store: the page's own
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    return env


def run_command(command: Command, tmp: Path) -> tuple[int, str]:
    # Each command runs in its own bash; the variables a page's commands set (`RID=$(...)`) carry to the next ones
    # through $TMP/.vars, as if one shell ran the page.
    script = (
        f"set -a; if [ -f {tmp}/.vars ]; then source {tmp}/.vars; fi; true; {command.text}\n"
        f"__status=$?; export -p > {tmp}/.vars 2>/dev/null; exit $__status"
    )
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env=environment(tmp),
        capture_output=True,
        text=True,
        errors="replace",  # `head -c N` may cut a character in two
        timeout=TIMEOUT_S,
    )
    return proc.returncode, shown(proc.stdout + proc.stderr, tmp)


def shown(output: str, tmp: Path) -> str:
    """OUTPUT as a page shows it: `$TMP` for the page's temporary directory, `...` for this checkout's path (a built-in
    model's files are named by where ctxlock is installed) and `~` for the home directory."""
    output = output.replace(str(tmp), "$TMP").replace(f"{ROOT}/", ".../")
    home = str(Path.home())
    return output.replace(f"{home}/", "~/") if home != "/" else output


def page_tmp(namespace: dict[str, Any]) -> Path:
    if "TMP" not in namespace:
        namespace["TMP"] = Path(tempfile.mkdtemp(prefix="ctxlock-docs-"))
    return namespace["TMP"]


def evaluate_console(example: Example) -> str | None:
    tmp = page_tmp(example.namespace)
    for command in example.parsed:
        status, output = run_command(command, tmp)
        if status != command.status or not output_matches(command.expected, output):
            shown = "\n".join(command.expected)
            return (
                f"{example.path}:{command.line}: `$ {command.text}` exited {status} (shown: {command.status}); "
                f"its output differs from the page's.\n--- shown\n{shown}\n--- printed\n{output}"
            )
    return None


def evaluate_not_run(example: Example) -> str | None:
    reason = example.parsed
    return None if reason.strip() else f"{example.path}: a not-run block needs a reason"


def not_run_reason(document: Document, region: Region) -> str | None:
    """The reason of a `<!-- not-run: ... -->` line right before the block holding REGION, if there is one."""
    text = document.text
    line = text.rfind("\n", 0, region.start) + 1  # a block's region starts on its fence line (perhaps indented)
    fence = line if text[line:].lstrip(" \t>").startswith("```") else text.rfind("```", 0, region.start)
    before = text[: text.rfind("\n", 0, fence) + 1].rstrip("\n").rsplit("\n", 1)[-1]
    marker = NOT_RUN.search(before)
    return None if marker is None else marker.group("reason").strip()


class NotRunPython:
    """sybil's Python parser, except for blocks marked not-run (their reason is checked and listed instead)."""

    def __init__(self) -> None:
        self.parser = PythonCodeBlockParser(doctest_optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in self.parser(document):
            reason = not_run_reason(document, region)
            if reason is not None:
                region.parsed = reason
                region.evaluator = evaluate_not_run
            yield region


class ConsoleParser:
    def __init__(self) -> None:
        self.lexer = FencedCodeBlockLexer(language="console", mapping={"source": "source"})

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in self.lexer(document):
            reason = not_run_reason(document, region)
            if reason is not None:
                region.parsed = reason
                region.evaluator = evaluate_not_run
            else:
                line = document.text.count("\n", 0, region.start) + 1
                region.parsed = parse_console(str(region.lexemes["source"]), line + 1)
                region.evaluator = evaluate_console
            yield region


def setup(namespace: dict[str, Any]) -> None:
    os.chdir(ROOT)
    page_tmp(namespace)


def teardown(namespace: dict[str, Any]) -> None:
    tmp = namespace.get("TMP")
    if tmp is not None:
        # A page that starts a server in the background writes its pid to $TMP/NAME.pid and stops it itself; one
        # that failed half-way may not have: whatever is still running is stopped here.
        for pidfile in Path(tmp).glob("*.pid"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
        shutil.rmtree(tmp, ignore_errors=True)


def sybil() -> Sybil:
    return Sybil(
        parsers=[
            NotRunPython(),
            ConsoleParser(),
        ],
        path=str(ROOT),
        patterns=["README.md", "docs/*.md", "docs/*/*.md"],
        setup=setup,
        teardown=teardown,
    )
