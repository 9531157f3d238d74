"""`ctxlock lint`: chat templates checked against the failures templates ship with, before they are served or
trained on (docs/template-checks.md). Exit 0: no finding reaches --fail-on; 1: one does (or --fix cannot tag the
template); 2: an error (a bad file, a model that does not load, a bad probe file, an output that cannot be written),
so CI can tell a finding from a broken run: as `diff-template` does, and linters such as ty
(https://docs.astral.sh/ty/reference/exit-codes) and SQLFluff
(https://docs.sqlfluff.com/en/3.1.1/production/cli_use.html)."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from enum import StrEnum
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape

from ctxlock.artifacts import load_artifacts
from ctxlock.cli import one_line
from ctxlock.cli.files import check_template_file, name_request_source, open_output
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.render import MODEL_HELP, VarOpt, parse_vars
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError, CtxlockError, InputError
from ctxlock.lint import OTHER_ENGINES, RULES, Engine, Report, Severity, TagResult, lint, tag_generation, to_sarif
from ctxlock.model import Model
from ctxlock.outside import decode_utf8, read_artifact
from ctxlock.probes import load_corpus
from ctxlock.template import ChatTemplate, template_from_file_text

HELP = (
    "Check chat templates before they ship: arguments the template never reads, a double BOS, history it rewrites "
    "(prompt caching, multi-turn RL), the content format, raises ordinary requests reach, clock and random reads, "
    "training masks, each finding with its template line. TARGET is a .jinja file (rendered with --model's "
    "tokenizer and special tokens) or a model (every template of its set). Exit status: 0 when no finding reaches "
    "--fail-on, 1 when one does (or --fix cannot tag the template), 2 on an error (a bad file or option, a model "
    "that does not load, an output that cannot be written), with one line on stderr."
)
EXIT_CLEAN = 0
EXIT_FINDINGS = 1  # a finding at or over --fail-on, or a --fix that cannot be made
EXIT_ERROR = 2  # the run could not be made: a bad input or option, an output that cannot be written


T = TypeVar("T")


class FailOn(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"
    NEVER = "never"


TargetsArg = Annotated[
    list[str],
    typer.Argument(help="Template files (.jinja) or models: " + MODEL_HELP, show_default=False),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="The model whose tokenizer and special tokens render a template file (default: the embedded "
        "mistral-nemo). Not used for a TARGET that is a model.",
    ),
]
ProbesOpt = Annotated[
    list[Path],
    typer.Option("--probes", help="A probe file (JSON, docs/template-checks.md) to add to the shipped corpus."),
]
RuleOpt = Annotated[list[str], typer.Option("--rule", help="Run only this rule (repeatable); default: all.")]
FailOnOpt = Annotated[
    FailOn, typer.Option("--fail-on", help="The least severity that makes the exit status 1.", case_sensitive=False)
]
SarifOpt = Annotated[
    str | None,
    typer.Option("--sarif", help="Also write the findings as SARIF 2.1.0 to this file (- for stdout, alone)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the human view.")]
FixOpt = Annotated[
    Path | None,
    typer.Option(
        "--fix",
        help="Write the template with {% generation %} tags added (its own replaced) to this file: checked to render "
        "the same text on every probe and to train exactly ctxlock's provenance tokens; exit 1 when it cannot be "
        "made, with the reason.",
    ),
]
EngineOpt = Annotated[
    list[str],
    typer.Option(
        "--engine",
        help="The engines the portability rule compares with jinja2 (repeatable): minijinja (the `lint` extra) and "
        "hf-jinja (@huggingface/jinja under node, found by $CTXLOCK_HF_JINJA or node_modules); 'none' for neither. "
        "Default: both; one not installed is reported as not run.",
    ),
]


def _version() -> str:
    try:
        return version("ctxlock")
    except PackageNotFoundError:
        return "0"


def _targets(targets: list[str], model: str | None) -> list[tuple[Model, ChatTemplate]]:
    """Each TARGET as (model, template): a template file with --model, or each template of a model's set."""
    out: list[tuple[Model, ChatTemplate]] = []
    paired: Model | None = None
    for target in targets:
        path = Path(target)
        if path.suffix == ".jinja" or (path.is_file() and path.suffix not in (".gguf", ".json")):
            check_template_file(target, option="TARGET")
            if paired is None:
                paired = Model(load_artifacts(model))
            out.append((paired, _template_file(path)))
            continue
        m = Model(load_artifacts(target))
        if m.templates is None:
            raise InputError(f"model {m.id!r} has no chat template", path=target, hint="lint a .jinja file instead")
        out += [(m, t) for t in m.templates.templates]
    return out


def _template_file(path: Path) -> ChatTemplate:
    """A template file read as `load_template_file` reads it, without compiling it: a template that does not compile
    is lint's `syntax` finding, with its line, not an error that stops the run."""
    data = read_artifact(path, missing=ArtifactNotFoundError, error=ArtifactFormatError)
    text = decode_utf8(data, label=str(path), error=ArtifactFormatError)
    return template_from_file_text(text, id=path.name, origin=str(path), file_sha256=hashlib.sha256(data).hexdigest())


def _show(report: Report) -> None:
    counts = report.counts()
    summary = ", ".join(f"{n} {k}{'s' if n != 1 else ''}" for k, n in counts.items())
    console.print(
        f"[bold]{escape(report.origin or report.template_id)}[/] · {report.template_sha256[:12]} · model "
        f"{escape(report.model)} · {summary}"
    )
    colour = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.NOTE: "cyan"}
    for f in report.findings:
        where = f"line {f.line}" if f.line is not None else "template"
        console.print(
            f"  [{colour[f.severity]}]{f.severity.label:<7}[/] {where:<9} [bold]{f.rule}[/]  {escape(f.message)}",
            soft_wrap=True,
        )
        if f.hint:
            console.print(f"  {'':<7} {'':<9} [dim]{escape(f.hint)}[/]", soft_wrap=True)
    for s in report.skipped:
        console.print(f"  [yellow]not run[/] {s.rule}: {escape(s.reason)}", soft_wrap=True)
    for note in report.notes:
        console.print(f"  [dim]{escape(note)}[/]", soft_wrap=True)


def lint_cmd(
    targets: TargetsArg,
    model: ModelOpt = None,
    var: VarOpt = [],  # noqa: B006 (typer reads the default)
    probes: ProbesOpt = [],  # noqa: B006
    rule: RuleOpt = [],  # noqa: B006
    fail_on: FailOnOpt = FailOn.ERROR,
    sarif: SarifOpt = None,
    engine: EngineOpt = [],  # noqa: B006
    fix: FixOpt = None,
    as_json: JsonOpt = False,
) -> None:
    unknown = [r for r in rule if r not in RULES]
    if unknown:
        raise typer.BadParameter(f"no rule {unknown[0]!r} (rules: {', '.join(RULES)})", param_hint="--rule")
    if sarif == "-" and as_json:
        raise typer.BadParameter("--sarif - and --json both write to stdout: choose one", param_hint="--sarif")
    variables = parse_vars(var)
    engines = _engines(engine)

    fixed: list[TagResult] = []

    def go() -> list[Report]:
        corpus = load_corpus(probes or None)
        pairs = _targets(targets, model)
        if fix is not None:
            if len(pairs) != 1:
                raise InputError(
                    f"--fix writes one template, and the targets hold {len(pairs)}",
                    path="--fix",
                    hint="give one template file, or a model with one template",
                )
            fixed.append(tag_generation(pairs[0][0], pairs[0][1], corpus.probes, variables=variables))
        return [lint(m, t, corpus=corpus, variables=variables, rules=rule or None, engines=engines) for m, t in pairs]

    reports = _or_exit(as_json, go)
    if fixed and fixed[0].source is not None and fix is not None:
        tagged = fixed[0].source
        _or_exit(as_json, lambda: _write_text(fix, tagged))
    if sarif is not None:
        log = to_sarif(reports, list(RULES.values()), _version())
        if sarif == "-":
            print_json(log)
        else:
            _or_exit(as_json, lambda: _write_sarif(Path(sarif), log))
    if as_json:
        out: dict[str, Any] = {"reports": [r.to_dict() for r in reports]}
        if fixed:
            out["fix"] = {**fixed[0].to_dict(), "written": str(fix) if fixed[0].applies else None}
        print_json(out)
    elif sarif != "-":
        for r in reports:
            _show(r)
        if fixed:
            _show_fix(fixed[0], fix)
    status = _status(reports, fail_on)
    raise typer.Exit(EXIT_FINDINGS if fixed and not fixed[0].applies else status)


def _or_exit(as_json: bool, fn: Callable[[], T]) -> T:
    """`fn()`; a CtxlockError is one line on stderr (and the error object with --json) and exit status 2."""
    try:
        return guarded(as_json, fn)
    except CtxlockError as exc:
        name_request_source(exc)
        print(one_line(f"error: {type(exc).__name__}: {exc}"), file=sys.stderr)
        raise typer.Exit(EXIT_ERROR) from None


def _show_fix(result: TagResult, path: Path | None) -> None:
    if not result.applies:
        console.print(f"[red]--fix: no tagged template written[/]: {escape(result.reason)}", soft_wrap=True)
        return
    rows = len(result.checked)
    console.print(
        f"--fix: wrote {escape(str(path))}: {{% generation %}} tags that render the same text on all {rows} probe "
        "rows and train exactly ctxlock's provenance tokens",
        soft_wrap=True,
    )


def _write_text(path: Path, text: str) -> None:
    _write_file(path, text.encode("utf-8"), "--fix")


def _write_file(path: Path, data: bytes, option: str) -> None:
    """`data` to the file `path`: a FIFO, a socket, an open or a write that fails is `open_output`'s one error line."""
    with open_output(path, option=option) as fh:
        fh.write(data)


def _engines(names: list[str]) -> tuple[Engine, ...]:
    if not names:
        return OTHER_ENGINES
    if names == ["none"]:
        return ()
    chosen: list[Engine] = []
    for name in names:
        match = next((e for e in OTHER_ENGINES if e == name), None)
        if match is None:
            raise typer.BadParameter(
                f"no engine {name!r} (engines: {', '.join(OTHER_ENGINES)}, or none alone)", param_hint="--engine"
            )
        chosen.append(match)
    return tuple(chosen)


def _write_sarif(path: Path, log: dict[str, Any]) -> None:
    """The SARIF log to a file; one that cannot be written (a directory, a missing parent) is one error line."""
    _write_file(path, (json.dumps(log, indent=2) + "\n").encode("utf-8"), "--sarif")


def _status(reports: list[Report], fail_on: FailOn) -> int:
    if fail_on is FailOn.NEVER:
        return EXIT_CLEAN
    least = Severity.named(fail_on.value)
    worst: list[Any] = [r.worst() for r in reports if r.worst() is not None]
    return EXIT_FINDINGS if any(w >= least for w in worst) else EXIT_CLEAN


def register(app: typer.Typer) -> None:
    app.command("lint", help=HELP)(lint_cmd)
