"""The `ctxlock` command. One module per command group; errors become one clear message and a non-zero exit."""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import re
import sys

import typer

from ctxlock.cli.files import name_request_source
from ctxlock.cli.output import print_json
from ctxlock.errors import CtxlockError

HELP = (
    "What exactly did the model receive, and why? Render chat requests into exact, injection-proof model "
    "input, and show every control token, id and digest. Input files are regular files (or - for stdin) of at most "
    "$CTXLOCK_MAX_INPUT_BYTES bytes (default 64 MiB)."
)

# The command modules of `ctxlock.cli`, in `ctxlock --help` order, with the commands each registers
# (tests/cli/test_cli_lazy.py checks this table against what the modules register). `main` imports only the module of
# the command it runs: the others' imports (the cache report's, the decoder's, ...) are start-up time a user of one
# command should not pay.
COMMANDS: dict[str, tuple[str, ...]] = {
    "render": ("render", "tokenize"),
    "inspect": ("inspect", "models"),
    "lint": ("lint",),
    "records": ("records", "replay", "diff"),
    "budget": ("fit",),
    "compaction": ("compact-plan",),
    "detok": ("detok",),
    "constrain": ("constrain",),
    "toolcalls": ("toolcalls",),
    "parse": ("parse",),
    "usage": ("usage",),
    "count": ("count",),
    "calibrate": ("calibrate",),
    "cachereport": ("cache-report",),
    "cache": ("cache",),
    "bill": ("bill",),
    "clamp": ("clamp",),
    "explain": ("explain",),
    "batch": ("batch",),
    "trajectory": ("trajectory",),
    "serve": ("serve",),
    "probe": ("probe",),
    "view": ("view",),
    "difftemplate": ("diff-template",),
    "telemetry": ("export", "import"),
}


def build_app(modules: tuple[str, ...] | None = None) -> typer.Typer:
    """The typer application with the commands of `modules` (keys of COMMANDS; None: all of them)."""
    built = typer.Typer(
        name="ctxlock",
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @built.callback()
    def _group() -> None:
        # A callback keeps the application a group even when it holds one command (typer would otherwise run a
        # lone command without its name).
        pass

    for name in COMMANDS if modules is None else modules:
        # Command modules are imported here, on demand: `main` imports only the one it runs.
        importlib.import_module(f"{__name__}.{name}").register(built)
    return built


def _module_of(argv: list[str]) -> str | None:
    """The module of the command `argv` runs, or None (no command, `--help`, an unknown name: every command)."""
    if not argv:
        return None
    for module, names in COMMANDS.items():
        if argv[0] in names:
            return module
    return None


_FULL: list[typer.Typer] = []


def __getattr__(name: str) -> typer.Typer:
    # `ctxlock.cli.app`: the whole application (for typer's CliRunner and `--help`), built on first access.
    if name == "app":
        if not _FULL:
            _FULL.append(build_app())
        return _FULL[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The exit statuses every command follows (the README's "Errors and exit statuses" lists them).
EXIT_OK = 0
EXIT_ERROR = 1  # a CtxlockError: a bad input, a failed check (diff: a layer diverged; toolcalls: a call not released)
EXIT_USAGE = 2  # the command line itself: an unknown option, a missing or malformed option value
EXIT_INTERRUPTED = 130
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT})


def main(argv: list[str] | None = None) -> None:
    """Run the command line (`argv`, default sys.argv[1:]) and exit with its status. Every failure is one line on
    stderr and never a traceback: a CtxlockError is `error: <Type>: <where>: <message> (<hint>)` and status 1; a
    usage error (unknown option, bad or missing value) is `error: usage: <message> (see `ctxlock CMD --help`)` and
    status 2, as POSIX utilities and click do."""
    try:
        # Without standalone mode, click returns (not raises) the code of a typer.Exit from a command.
        args = sys.argv[1:] if argv is None else list(argv)
        module = _module_of(args)
        code = build_app(None if module is None else (module,))(args=args, prog_name="ctxlock", standalone_mode=False)
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
    except OSError as exc:
        # stdout on a full disk or a failed device (`ctxlock ... --json > /dev/full`): one line, not a traceback.
        # Any other OSError reaching here is a bug: shown as Python shows it.
        if exc.errno not in _WRITE_ERRNOS:
            raise
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (closed at exit)
        print(one_line(f"error: cannot write the output: {exc.strerror} (free space or redirect it)"), file=sys.stderr)
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
