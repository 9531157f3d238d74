"""`lint`: every rule over one template, with one model's tokenizer and special tokens, on the probe corpus."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxlock.errors import CtxlockError, InputError, TemplateError
from ctxlock.lint._engines import Engine
from ctxlock.lint._findings import Finding, Report, Severity, Skipped
from ctxlock.lint._masks import training_mask
from ctxlock.lint._portability import OTHER_ENGINES, portability
from ctxlock.lint._rules import (
    RULES,
    Lint,
    content_format_rule,
    double_bos,
    history_rewrite,
    nondeterminism,
    reachable_raises,
    unread_arguments,
)
from ctxlock.lint._tree import arguments_read
from ctxlock.pipeline import Pipeline
from ctxlock.probes import Corpus, load_corpus, render_probes
from ctxlock.template import ChatTemplate, compile_template, parse_tree

RuleFn = Callable[[Lint], list[Finding]]
CHECKS: dict[str, RuleFn] = {
    "unread-argument": unread_arguments,
    "double-bos": double_bos,
    "history-rewrite": history_rewrite,
    "content-format": content_format_rule,
    "reachable-raise": reachable_raises,
    "render-error": reachable_raises,  # one pass over the renders finds both
    "nondeterminism": nondeterminism,
    "training-mask": training_mask,
}
# The rules that read probe renders: with none rendered they have nothing to check, and say so (`_unrendered`).
NEEDS_RENDERS = ("unread-argument", "double-bos", "history-rewrite", "nondeterminism", "training-mask", "portability")


def lint(
    model: Pipeline,
    template: ChatTemplate,
    *,
    corpus: Corpus | None = None,
    variables: Mapping[str, Any] | None = None,
    rules: Sequence[str] | None = None,
    engines: Sequence[Engine] = OTHER_ENGINES,
    extra: Mapping[str, RuleFn] | None = None,
) -> Report:
    """Lint `template` rendered with `model`'s tokenizer and special tokens over `corpus` (default: the shipped
    probes), passing `variables` (chat_template_kwargs) to every render. `rules` restricts the rules run (their
    ids, `RULES`; an unknown id is an `InputError`); `engines` are the engines the portability rule compares with
    jinja2 (none: the rule is skipped); `extra` adds rules of the caller's own (id -> check). A template that does
    not compile is one error finding; a rule that cannot run is listed in `skipped` with why."""
    checks = {**CHECKS, **(extra or {})}
    known = [*RULES, *(k for k in checks if k not in RULES)]
    unknown = [r for r in rules or () if r not in known]
    if unknown:
        raise InputError(f"no rule {unknown[0]!r}", path="rules", hint=f"rules: {', '.join(known)}")
    chosen = known if rules is None else [r for r in known if r in rules]
    try:
        tree = parse_tree(template)
        compile_template(template)  # what jinja parses Python may still refuse (a `{% break %}` in a macro)
    except TemplateError as exc:
        finding = Finding("syntax", Severity.ERROR, exc.message, line=_line(exc.path), hint=exc.hint or "")
        return Report(template.id, template.sha256, template.origin, model.id, (finding,))
    corpus = corpus if corpus is not None else load_corpus()
    ctx = Lint(
        model,
        template,
        tree,
        corpus,
        render_probes(model, corpus, template, variables=variables),
        dict(variables or {}),
    )
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    done: set[RuleFn] = set()
    for rule in chosen:
        try:
            if rule == "portability":
                found, missing = portability(ctx, engines)
                findings += found
                skipped += missing
                if not engines:
                    skipped.append(Skipped(rule, "no engine chosen to compare with jinja2"))
            elif rule in checks and checks[rule] not in done:
                done.add(checks[rule])
                findings += [f for f in checks[rule](ctx) if f.rule in chosen]
        except CtxlockError as exc:
            skipped.append(Skipped(rule, f"{type(exc).__name__}: {exc}"))
    skipped += [s for s in _unrendered(ctx, chosen) if s.rule not in {k.rule for k in skipped}]
    if rules is not None:
        findings = [f for f in findings if f.rule in rules]
    findings.sort(key=lambda f: (f.line or 0, -f.severity, f.rule))
    args = arguments_read(tree)
    notes = (f"the template takes: {', '.join(f'{k} (line {v})' for k, v in args.items())}",) if args else ()
    return Report(template.id, template.sha256, template.origin, model.id, tuple(findings), tuple(skipped), notes)


def _unrendered(ctx: Lint, chosen: Sequence[str]) -> list[Skipped]:
    """When no probe renders, the rules that read renders checked nothing: each is listed as not run, not passed."""
    if any(r.ok for r in ctx.renders):
        return []
    why = (
        f"none of the {len(ctx.renders)} probes renders (the render-error and reachable-raise findings say why): "
        "its checks of rendered text did not run"
    )
    return [Skipped(rule, why) for rule in chosen if rule in NEEDS_RENDERS]


def _line(path: str | None) -> int | None:
    if path and " line " in path:
        tail = path.rsplit(" line ", 1)[1]
        return int(tail) if tail.isdigit() else None
    return None


__all__ = ["CHECKS", "RULES", "lint"]
