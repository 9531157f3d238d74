"""mkdocs hooks: the reference pages generated from the code at every build, so they cannot go stale.

- reference/cli.md: every command, argument and option of the typer app (`ctxlock.cli.build_app`), with its help;
- reference/errors.md: the exception tree of `ctxlock.errors`, each class with its parent and docstring;
- reference/api.md: every name of `ctxlock.__all__`, rendered by mkdocstrings from its docstring.

mkdocs loads this file by path (`hooks:` in mkdocs.yml); https://www.mkdocs.org/user-guide/configuration/#hooks
"""

from __future__ import annotations

import inspect
from typing import Any

import click
import typer
from mkdocs.structure.files import File, Files

# The public API, grouped as the guides teach it; tests/test_docs_site.py checks it covers ctxlock.__all__.
API_GROUPS: dict[str, tuple[str, ...]] = {
    "Loading and running": ("load", "Model", "Run", "Pipeline", "clear_caches", "__version__"),
    "Requests and options": (
        "Request",
        "parse_request",
        "RenderOptions",
        "InjectionPolicy",
        "ChatTemplate",
        "StageOptions",
    ),
    "Outputs": ("Rendered", "Tokenized", "ModelInput"),
    "Budgets": ("BudgetPolicy", "fit_context"),
    "Training data": ("MaskOptions",),
    "The way back": (
        "IncrementalDecoder",
        "StopMatcher",
        "stream_text",
        "ToolCallAssembler",
        "JsonSchemaMask",
        "Sampler",
    ),
    "Usage and cost": ("Usage", "parse_usage", "PriceTable"),
    "Records": ("Store",),
    "Errors": ("CtxlockError",),
}


def on_files(files: Files, config: Any) -> Files:
    for uri, text in (
        ("reference/cli.md", cli_page()),
        ("reference/errors.md", errors_page()),
        ("reference/api.md", api_page()),
    ):
        files.append(File.generated(config, uri, content=text))
    return files


# ------------------------------------------------------------------------------------------------------- CLI


def cli_page() -> str:
    from ctxlock.cli import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, build_app

    root = typer.main.get_command(build_app())
    out = [
        "# Command line\n",
        "Generated from the `ctxlock` application at build time: every command, argument and option, with the help "
        "`ctxlock COMMAND --help` prints. The guides show them at work; [Render and inspect](../render.md) has the "
        "conventions every command follows.\n",
        f"Exit statuses: `{EXIT_OK}` success; `{EXIT_ERROR}` a ctxlock error (a bad input, a failed check), printed as "
        "one line `error: <Type>: <where>: <message> (<hint>)`; "
        f"`{EXIT_USAGE}` the command line itself; `{EXIT_INTERRUPTED}` interrupted. The error types are on "
        "[Errors](errors.md).\n",
        "| command | what it does |",
        "|---|---|",
    ]
    commands = all_commands(root, "ctxlock")
    for name, cmd in commands:
        out.append(f"| [`{name}`](#{_anchor(name)}) | {_first_line(cmd)} |")
    out.append("")
    for name, cmd in commands:
        out.append(_command_section(name, cmd))
    return "\n".join(out) + "\n"


def all_commands(group: click.Group, prefix: str) -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name in group.list_commands(click.Context(group)):
        cmd = group.get_command(click.Context(group), name)
        if cmd is None or cmd.hidden:
            continue
        full = f"{prefix} {name}"
        if isinstance(cmd, click.Group):
            found.append((full, cmd))
            found.extend(all_commands(cmd, full))
        else:
            found.append((full, cmd))
    return found


def _anchor(name: str) -> str:
    return name.replace(" ", "-")


def _first_line(cmd: click.Command) -> str:
    return _cell((cmd.help or cmd.short_help or "").strip().split("\n\n")[0].replace("\n", " "))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _command_section(name: str, cmd: click.Command) -> str:
    lines = [f"## `{name}` {{#{_anchor(name)}}}\n"]
    usage = " ".join(cmd.collect_usage_pieces(click.Context(cmd)))
    lines.append(f"```text\n{name} {usage}\n```\n")
    if cmd.help:
        lines.append(inspect.cleandoc(cmd.help).replace("\b\n", "") + "\n")
    params = [p for p in cmd.params if not getattr(p, "hidden", False)]
    if params:
        lines += ["| argument or option | type | default | help |", "|---|---|---|---|"]
        for p in params:
            lines.append(_param_row(p))
        lines.append("")
    return "\n".join(lines)


def _param_row(p: click.Parameter) -> str:
    names = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
    if isinstance(p, click.Argument):
        names = f"`{p.human_readable_name}`" + ("" if p.required else " (optional)")
    if isinstance(p, click.Option) and p.is_flag:
        kind = "flag"
    else:
        kind = _cell(p.type.name if not isinstance(p.type, click.Choice) else " \\| ".join(p.type.choices))
    default = p.default
    shown = "" if default in (None, False, (), []) or callable(default) else f"`{default}`"
    helptext = _cell(" ".join((getattr(p, "help", None) or "").split()))
    return f"| {names} | {kind} | {shown} | {helptext} |"


# ---------------------------------------------------------------------------------------------------- errors


def errors_page() -> str:
    import ctxlock.errors as errors

    root = errors.CtxlockError
    out = [
        "# Errors\n",
        "Generated from `ctxlock.errors` at build time. Every exception ctxlock raises is a `CtxlockError`; each "
        "carries `path` (where the input went wrong: a JSON path, a byte offset, a template line, a file) and `hint` "
        "(what to do). The CLI prints one line, `error: <Type>: <path>: <message> (<hint>)`, and exits 1 "
        "(`--json`: the same as a JSON object); `ctxlock serve` answers JSON `{type, message, path, hint}` with a "
        "4xx status.\n",
        "```text",
        _tree(root, ""),
        "```\n",
    ]
    for cls in _walk(root):
        parent = cls.__mro__[1].__name__ if cls is not root else "Exception"
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        out.append(f"## `{cls.__name__}`\n")
        out.append(f"*subclass of* `{bases if cls is not root else parent}`\n")
        out.append(inspect.cleandoc(cls.__doc__ or "") + "\n")
    return "\n".join(out)


def _children(cls: type) -> list[type]:
    import ctxlock.errors as errors

    return [c for c in cls.__subclasses__() if c.__module__ == errors.__name__]


def _walk(cls: type) -> list[type]:
    out = [cls]
    for child in _children(cls):
        out += _walk(child)
    return out


def _tree(cls: type, indent: str) -> str:
    lines = [cls.__name__] if not indent else []
    kids = _children(cls)
    for i, child in enumerate(kids):
        last = i == len(kids) - 1
        lines.append(f"{indent}{'└── ' if last else '├── '}{child.__name__}")
        sub = _tree(child, indent + ("    " if last else "│   "))
        if sub:
            lines.append(sub)
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------- API


def api_page() -> str:
    import ctxlock

    out = [
        "# Python API\n",
        "Everything below is importable from `ctxlock` (`ctxlock.__all__`); generated from the docstrings at build "
        "time. The errors are in `ctxlock.errors` ([Errors](errors.md)).\n",
        "```python\nimport ctxlock\n\nmodel = ctxlock.load()  # the embedded default, Mistral Nemo's Tekken\n"
        'run = model.run(b\'{"messages": [{"role": "user", "content": "Hi"}]}\')\n```\n',
    ]
    for group, names in API_GROUPS.items():
        out.append(f"## {group}\n")
        for name in names:
            if name == "__version__":
                out.append("### `__version__`\n\nThe version of this installation, a string.\n")
                continue
            # mkdocstrings reads the source statically: it is pointed at the module that defines the name
            # (`ctxlock` exports lazily, PEP 562), and titles it with the public name.
            where = getattr(ctxlock, name).__module__
            out.append(f"::: {where}.{name}\n    options:\n      heading_level: 3\n      heading: ctxlock.{name}\n")
    return "\n".join(out)
