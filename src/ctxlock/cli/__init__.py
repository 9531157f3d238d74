"""The `ctxlock` command. One module per command group; errors become one clear message and a non-zero exit."""

from __future__ import annotations

import contextlib
import os
import re
import sys

import typer

from ..errors import CtxlockError
from . import budget as budget_cmds
from . import cachereport as cachereport_cmds
from . import clamp as clamp_cmds
from . import compaction as compaction_cmds
from . import constrain as constrain_cmds
from . import count as count_cmds
from . import detok as detok_cmds
from . import inspect as inspect_cmds
from . import records as records_cmds
from . import render as render_cmds
from . import toolcalls as toolcalls_cmds
from . import usage as usage_cmds
from .files import name_request_source
from .output import print_json

app = typer.Typer(
    name="ctxlock",
    help="What exactly did the model receive, and why? Render chat requests into exact, injection-proof model "
    "input, and show every control token, id and digest. Input files are regular files (or - for stdin) of at most "
    "$CTXLOCK_MAX_INPUT_BYTES bytes (default 64 MiB).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
render_cmds.register(app)
inspect_cmds.register(app)
records_cmds.register(app)
budget_cmds.register(app)
compaction_cmds.register(app)
detok_cmds.register(app)
constrain_cmds.register(app)
toolcalls_cmds.register(app)
usage_cmds.register(app)
count_cmds.register(app)
clamp_cmds.register(app)
cachereport_cmds.register(app)


# The exit statuses every command follows (the README's "Errors and exit statuses" lists them).
EXIT_OK = 0
EXIT_ERROR = 1  # a CtxlockError: a bad input, a failed check (diff: a layer diverged; toolcalls: a call not released)
EXIT_USAGE = 2  # the command line itself: an unknown option, a missing or malformed option value
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> None:
    """Run the command line (`argv`, default sys.argv[1:]) and exit with its status. Every failure is one line on
    stderr and never a traceback: a CtxlockError is `error: <Type>: <where>: <message> (<hint>)` and status 1; a
    usage error (unknown option, bad or missing value) is `error: usage: <message> (see `ctxlock CMD --help`)` and
    status 2, as POSIX utilities and click do."""
    try:
        # Without standalone mode, click returns (not raises) the code of a typer.Exit from a command.
        code = app(args=argv, prog_name="ctxlock", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except CtxlockError as exc:
        # Commands that print JSON have already printed the error object; this line is for humans.
        name_request_source(exc)
        print(one_line(f"error: {type(exc).__name__}: {exc}"), file=sys.stderr)
        sys.exit(EXIT_ERROR)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        # `ctxlock render ... | head`: the reader left; nothing more to say. Stop Python's flush at exit failing too.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (closed at exit)
        sys.exit(EXIT_ERROR)
    except Exception as exc:
        # click's family (typer vendors it in some versions): a usage error carries its exit code (2) and the
        # context of the command it belongs to; any other click exception (exit code 1) is an input error.
        exit_code = getattr(exc, "exit_code", None)
        format_message = getattr(exc, "format_message", None)
        if not (isinstance(exit_code, int) and callable(format_message)):
            raise
        ctx = getattr(exc, "ctx", None)
        # command_path starts with the program name as invoked (`ctxlock`, `__main__.py`): name it ctxlock.
        sub = (getattr(ctx, "command_path", None) or "").partition(" ")[2]
        command = f"ctxlock {sub}" if sub else "ctxlock"
        if exit_code == EXIT_USAGE:
            # No command at all: click has printed the help (no_args_is_help) and has no message of its own.
            message = format_message().strip() or "give a command"
            hint = f"see `{command} --help`"
            if "--json" in (sys.argv[1:] if argv is None else argv):
                print_json({"error": {"type": "UsageError", "message": message, "path": command, "hint": hint}})
            print(one_line(f"error: usage: {message} ({hint})"), file=sys.stderr)
        else:
            print(one_line(f"error: {format_message()}"), file=sys.stderr)
        sys.exit(exit_code)


def one_line(text: str) -> str:
    """An error line stays one line whatever a message quotes (a template's own message, a file name)."""
    return re.sub(r"[\r\n]+", " ", text)
