"""The `ctxlock` command. One module per command group; errors become one clear message and a non-zero exit."""

from __future__ import annotations

import sys

import typer

from ..errors import CtxlockError
from . import budget as budget_cmds
from . import compaction as compaction_cmds
from . import constrain as constrain_cmds
from . import detok as detok_cmds
from . import inspect as inspect_cmds
from . import records as records_cmds
from . import render as render_cmds
from . import toolcalls as toolcalls_cmds

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


def main(argv: list[str] | None = None) -> None:
    """Run the command line (`argv`, default sys.argv[1:]) and exit with its status: a CtxlockError is one line
    `error: <Type>: <path>: <message> (<hint>)` on stderr and status 1, a usage error click's message and status 2."""
    try:
        # Without standalone mode, click returns (not raises) the code of a typer.Exit from a command.
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except CtxlockError as exc:
        # Commands that print JSON have already printed the error object; this line is for humans.
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        # Usage errors (typer.BadParameter and the rest of click's family, which typer vendors) show themselves.
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            sys.exit(exc.exit_code)
        raise
