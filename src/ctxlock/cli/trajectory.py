"""`ctxlock trajectory`: token-in/token-out trajectories for multi-turn RL from a JSONL file (docs/trajectories.md).

Each input line is a request (its messages are the prompt) and `steps`: completions (the engine's ids, optional
log-probs) alternating with new messages. Each output line (`--json` or `-o`) is the trajectory's JSON form: ids,
loss mask, provenance, log-probs, steps and forks. Without them, one summary per line and each fork, on stdout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from ctxlock.cli.files import open_output, template_file
from ctxlock.cli.output import guarded
from ctxlock.cli.render import ModelOpt, TemplateOpt
from ctxlock.errors import TrajectoryError
from ctxlock.model import load
from ctxlock.outside import read_input
from ctxlock.trajectory import TrajectoryResult, build_line, read_line

_SHOWN = 60  # characters of each side of a fork in the human view (--json has them whole)


def run(source: str, model_name: str | None, template: str | None) -> list[tuple[int, TrajectoryResult]]:
    label = "stdin" if source == "-" else source
    data = read_input(source, label=f"IN {label}", error=TrajectoryError)
    model = load(model_name)
    options: dict[str, Any] = {}
    chosen = template_file(template)
    if chosen is not None:
        options["chat_template"] = chosen
    out = []
    for n, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{label}:{n}"
        out.append((n, build_line(model, read_line(raw, where), where, **options)))
    if not out:
        raise TrajectoryError("no trajectory line in the input", path=f"IN {label}", hint="one JSON object a line")
    return out


def _summary(n: int, r: TrajectoryResult) -> list[str]:
    trained = int(r.loss_mask.sum())
    given = int((~np.isnan(r.logprobs)).sum())
    head = (
        f"line {n}: {len(r.ids)} tokens, {trained} trained (the engine's), {given} with log-probs, "
        f"{len(r.steps) - 1} steps, {len(r.forks)} fork(s) from the canonical render ({len(r.canonical_ids)} tokens)"
    )
    lines = [head]
    for s in r.steps:
        if s.kind == "messages" and s.how == "located":
            lines.append(f"  step {s.index}: delta located (the template rewrites the turn before it)")
    for f in r.forks:
        lines.append(
            f"  fork at step {f.step} ({f.part}), {f.cause}: trajectory tokens {list(f.trajectory_tokens)} "
            f"{_short(f.trajectory_text)}, canonical tokens {list(f.canonical_tokens)} {_short(f.canonical_text)}; "
            f"the trainer uses the {f.used}'s"
        )
    lines += [f"  note: {note}" for note in r.notes]
    return lines


def _write(out: Path, results: list[tuple[int, TrajectoryResult]]) -> None:
    """The JSON lines to `out`; a failed write (a full disk, /dev/full) is one error line, as a failed open is."""
    with open_output(out, option="--out") as f:
        for _, r in results:
            f.write(json.dumps(r.to_dict(), ensure_ascii=False).encode("utf-8") + b"\n")


def _short(text: str) -> str:
    shown = json.dumps(text[:_SHOWN], ensure_ascii=False)
    return shown + (f" (+{len(text) - _SHOWN} chars)" if len(text) > _SHOWN else "")


def register(app: typer.Typer) -> None:
    @app.command()
    def trajectory(
        source: Annotated[
            str,
            typer.Argument(
                metavar="IN.jsonl",
                help="JSONL, one trajectory a line: a request (its messages are the prompt; tools, "
                "chat_template_kwargs as in any request) and `steps`, alternating {completion_ids, logprobs?, "
                "finish_reason?} and {messages}, starting with a completion. - for stdin.",
            ),
        ],
        model: ModelOpt = None,
        template: TemplateOpt = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="One JSON object a line on stdout: the trajectory's JSON form.")
        ] = False,
        out: Annotated[
            Path | None,
            typer.Option("--out", "-o", help="Write the JSON lines to this file; the summary still goes to stdout."),
        ] = None,
    ) -> None:
        """Token-in/token-out trajectories for multi-turn RL: the prompt's ids, each completion's ids as the engine
        returned them (loss mask 1, log-probs kept), and for each new tool or user turn only the template's delta.
        Every place where the canonical render of the whole conversation gives other ids is a fork, named with its
        step, its spans, both sides and its cause (retokenization, rerender, history-rewrite, other)."""
        results = guarded(as_json, lambda: run(source, model, template))
        if out is not None:
            guarded(as_json, lambda: _write(out, results))
        if as_json:
            for _, r in results:
                typer.echo(json.dumps(r.to_dict(), ensure_ascii=False))
            return
        for n, r in results:
            for line in _summary(n, r):
                typer.echo(line)
        if out is not None:
            typer.echo(f"wrote {len(results)} trajectory line(s) to {out}")


__all__ = ["register", "run"]
