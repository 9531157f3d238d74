"""`ctxlock diff-template A B`: two chat templates compared by what they render for the probe corpus
(docs/template-diff.md). Exit 0: no behavioural difference; 1: differences; 2: an error (as diff(1) and cmp(1))."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ctxlock.cli import one_line
from ctxlock.cli.files import name_request_source
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.render import JsonOpt, VarOpt, render_options
from ctxlock.errors import CtxlockError
from ctxlock.probes import ProbeError, Verdict, load_corpus
from ctxlock.templatediff import CapabilityDiff, ProbeDiff, Side, TemplateDiff, diff_templates, load_sides

EXIT_SAME = 0
EXIT_DIFFERENT = 1
EXIT_TROUBLE = 2
EXCERPT_WIDTH = 16  # characters of each text shown on each side of where it parts

SIDE_HELP = (
    "A template file (.jinja), an HF model directory, a .gguf file, a built-in model name, or org/name (or "
    "org/name@revision) from the local HF hub cache."
)


def _run(a: str, b: str, model: str | None, probes: list[Path], only: list[str], var: list[str]) -> TemplateDiff:
    options, _ = render_options(None, var=var)
    corpus = load_corpus(probes, only=only)
    side_a, side_b = load_sides(a, b, model=model)
    # --only narrows the run to the probes named: the mask check, on conversations of its own, is left out too.
    return diff_templates(side_a, side_b, corpus, variables=options.chat_template_kwargs, masks=not only)


def register(app: typer.Typer) -> None:
    app.command("diff-template")(diff_template)


def diff_template(
    a: Annotated[str, typer.Argument(metavar="A", help="The old side. " + SIDE_HELP)],
    b: Annotated[str, typer.Argument(metavar="B", help="The new side. " + SIDE_HELP)],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="The tokenizer (and special tokens) a template file renders with: a built-in name, an HF model "
            "directory, a .gguf file, or org/name (org/name@revision). Default: the other side's model when it is "
            "one, else the embedded mistral-nemo. A model side always renders with its own.",
        ),
    ] = None,
    probes: Annotated[
        list[Path],
        typer.Option(
            "--probes",
            help='A JSON file of probes ({"probes": [{"name", "request", ...}]}) added to the shipped corpus; '
            "one with a shipped probe's name replaces it. Repeatable.",
        ),
    ] = [],  # noqa: B006 (typer reads the default)
    only: Annotated[list[str], typer.Option("--only", help="Compare only the probe of this name (repeatable).")] = [],  # noqa: B006 (typer reads the default)
    var: VarOpt = [],  # noqa: B006 (typer reads the default)
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 when the sides differ too (errors still exit 2).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Compare two chat templates by behaviour, not by their Jinja text: every probe conversation of the corpus
    (`--probes` adds yours) is rendered by A and by B at a fixed clock and seed, and the report names each probe
    that renders differently with its first diverging token (both tokens, and each text around it), an error on one
    side against a render on the other, and the capabilities that changed (system turn, tools, tool calls and
    results, reasoning, content parts and format, names, documents, continuation, generation prompt, the
    assistant-mask verdict). When A and B tokenize differently (other tokenizer digests) the texts are compared and
    each side's ids reported (--json), not compared token for token.

    Exit status: 0 when nothing differs, 1 when a probe renders differently or a capability changed (0 with the
    option --exit-zero), 2 for an error (a bad file, a side that does not load, a bad probe file), with one line
    on stderr."""
    try:
        result = guarded(as_json, lambda: _run(a, b, model, probes, only, var))
    except CtxlockError as exc:
        name_request_source(exc)
        print(one_line(f"error: {type(exc).__name__}: {exc}"), file=sys.stderr)
        raise typer.Exit(EXIT_TROUBLE) from None
    if as_json:
        print_json(result.to_dict())
    else:
        _show(result)
    raise typer.Exit(EXIT_SAME if result.identical or exit_zero else EXIT_DIFFERENT)


# -- the human view ---------------------------------------------------------------------------------------------


def _quoted(text: str) -> str:
    """A text excerpt on one line, quoted, with newlines and other controls escaped (JSON's way)."""
    return escape(json.dumps(text, ensure_ascii=False))


def _side_line(side: Side, templates: list[dict[str, Any]]) -> str:
    shown = ", ".join(f"{escape(t['id'])} (sha256 {t['sha256'][:12]})" for t in templates) or "no template rendered"
    what = "template file" if side.kind == "template" else f"model {escape(side.model.id)}"
    return f"[bold]{side.name}[/]  {what}: {shown}"


def _borrowed(diff: TemplateDiff) -> str:
    """Which model each template-file side renders with (a template file has no tokenizer of its own)."""
    by: dict[str, list[str]] = {}
    for side in (diff.a, diff.b):
        if side.kind == "template":
            by.setdefault(side.tokenizer_from, []).append(side.name)
    return "".join(
        f"; {' and '.join(names)} (template file{'s' if len(names) > 1 else ''}) "
        f"render{'' if len(names) > 1 else 's'} with {origin}"
        for origin, names in by.items()
    )


def _tokenizer_lines(diff: TemplateDiff) -> list[str]:
    ta, tb = diff.a.model.tokenizer, diff.b.model.tokenizer
    borrowed = escape(_borrowed(diff))
    if diff.ids_comparable:
        return [
            f"tokenizer  {escape(ta.id)} (sha256 {ta.sha256[:12]}) for both{borrowed}: ids compared token for token"
        ]
    return [
        f"tokenizer  A: {escape(ta.id)} (sha256 {ta.sha256[:12]}), B: {escape(tb.id)} (sha256 {tb.sha256[:12]})"
        + borrowed,
        "[yellow]ids not comparable token for token[/] (other tokenizers): the texts are compared, and --json "
        "reports each side's ids",
    ]


def _error(err: ProbeError) -> str:
    where = f" at line {err.line}" if err.line is not None else ""
    verb = "refuses" if err.raised else "fails"
    return f"{verb}: {err.type}{where}: {one_line(err.message)}"


def _probe_line(p: ProbeDiff) -> str:
    head = f"[red]differs[/]  {escape(p.probe.name):<24} "
    ea, eb = p.a.error, p.b.error
    if ea is not None and eb is not None:
        return head + escape(f"A {_error(ea)}; B {_error(eb)}")
    if ea is not None:
        return head + escape(f"A {_error(ea)}; B renders ({len(p.b.ids or ())} tokens)")
    if eb is not None:
        return head + escape(f"A renders ({len(p.a.ids or ())} tokens); B {_error(eb)}")
    if p.divergence is not None:
        lead = escape(p.divergence.describe())
    else:
        same_ids = " (the ids are the same)" if p.ids_comparable else ""
        lead = f"character {p.text_index}{same_ids}; A {len(p.a.ids or ())} tokens, B {len(p.b.ids or ())} tokens"
    pair = p.excerpts(EXCERPT_WIDTH)
    return head + lead + ("" if pair is None else f"  A {_quoted(pair[0])}  B {_quoted(pair[1])}")


def _noteworthy(v: Verdict) -> bool:
    """Whether a verdict's detail is news: an error, a refusal, a mask cross-check that does not agree."""
    return v.verdict in ("refused", "error", "not probed") or (
        v.capability == "mask" and not v.verdict.endswith(": agree")
    )


def _capability_line(c: CapabilityDiff) -> str:
    detail = "; ".join(
        f"{side}: {v.detail}" + (f" (line {v.line})" if v.line is not None else "")
        for side, v in (("A", c.a), ("B", c.b))
        if v.detail and _noteworthy(v)
    )
    tail = f"  [dim]{escape(one_line(detail))}[/]" if detail else ""
    return f"  {c.capability:<22} {escape(c.a.verdict)} → {escape(c.b.verdict)}{tail}"


def _show(diff: TemplateDiff) -> None:
    templates = diff.to_dict()
    console.print(_side_line(diff.a, templates["a"]["templates"]))
    console.print(_side_line(diff.b, templates["b"]["templates"]))
    for line in _tokenizer_lines(diff):
        console.print(line)
    extra = [s for s in diff.corpus.sources if s != "ctxlock"]
    sources = "ctxlock's corpus" + "".join(f", {escape(s)}" for s in extra)
    variables = f"; variables {escape(', '.join(sorted(diff.variables)))}" if diff.variables else ""
    console.print(f"probes     {len(diff.corpus)} ({sources}){variables}")
    console.print()
    for p in diff.differing:
        console.print(_probe_line(p))
    same = [p.probe.name for p in diff.probes if not p.differs]
    if same:
        console.print(f"[green]same[/]     {len(same)} probe(s): {escape(', '.join(same))}")
    if diff.changed:
        console.print()
        console.print("[bold]capabilities that changed[/] (A → B)")
        for c in diff.changed:
            console.print(_capability_line(c))
    console.print()
    console.print(_summary(diff))


def _summary(diff: TemplateDiff) -> str:
    if diff.identical:
        what = "ids" if diff.ids_comparable else "text"
        n = len(diff.probes)
        return f"[bold green]no behavioural difference[/]: {n} probes render the same {what}, no capability changed"
    n, c = len(diff.differing), len(diff.changed)
    return (
        f"[bold red]{n} of {len(diff.probes)} probes render differently[/]; "
        f"{c} capabilit{'y' if c == 1 else 'ies'} changed"
    )
