"""The training-mask rule: a template without `{% generation %}` tags (transformers' `return_assistant_tokens_mask`
then has nothing to go on), or with tags whose mask disagrees with ctxlock's provenance mask (docs/training.md)."""

from __future__ import annotations

import numpy as np
from jinja2 import nodes

from ctxlock.errors import CtxlockError
from ctxlock.lint._findings import Finding, Severity
from ctxlock.lint._rules import Lint
from ctxlock.probes import PROBE_NOW, Probe
from ctxlock.training import MaskOptions, assistant_mask


def generation_lines(tree: nodes.Template) -> list[int]:
    """The lines of the template's `{% generation %}` blocks, from its syntax tree (the sandbox parses one as a call
    block of its generation extension): not the tag's text in a string or a raw block, and with any whitespace
    control (`{%+ generation -%}`)."""
    return sorted(
        n.lineno
        for n in tree.find_all(nodes.CallBlock)
        if isinstance(n.call, nodes.Call)
        and isinstance(n.call.node, nodes.ExtensionAttribute)
        and n.call.node.name == "_body"
        and n.call.node.identifier.endswith("._GenerationTag")
    )


def training_probes(lint: Lint) -> list[Probe]:
    """The probes that are training rows: whole turns (no generation prompt, nothing to continue) with an assistant."""
    return [
        p
        for p in lint.corpus
        if not p.add_generation_prompt
        and not p.continue_final_message
        and any(m.get("role") == "assistant" for m in p.request.get("messages") or [])
    ]


def mask(lint: Lint, probe: Probe, source: str) -> tuple[tuple[int, ...], np.ndarray]:
    """The ids and ctxlock's mask of `probe` with this template, by `source` ("generation" or "provenance")."""
    lay, m = assistant_mask(
        lint.model,
        dict(probe.request),
        MaskOptions(source=source),
        chat_template=lint.template,
        add_generation_prompt=False,
        now=PROBE_NOW,
        seed=0,
    )
    return tuple(int(i) for i in lay.ids), m.mask


def training_mask(lint: Lint) -> list[Finding]:
    lines = generation_lines(lint.tree)
    tagged = bool(lines)
    probes = training_probes(lint)
    if not tagged:
        return [
            Finding(
                "training-mask",
                Severity.NOTE,
                "no {% generation %} tags: transformers' return_assistant_tokens_mask has nothing to mark (an all-zero "
                "mask, with a warning); ctxlock masks by provenance",
                hint="`ctxlock lint --fix FILE` writes a tagged template that renders the same and masks as ctxlock",
                data={"tagged": False},
            )
        ]
    out = []
    for probe in probes:
        try:
            (ids, by_tags), (_, by_source) = mask(lint, probe, "generation"), mask(lint, probe, "provenance")
        except CtxlockError as exc:
            out.append(
                Finding(
                    "training-mask",
                    Severity.WARNING,
                    f"the masks of probe {probe.name} could not be compared: {exc.message}",
                    probe=probe.name,
                )
            )
            continue
        if by_tags.shape != by_source.shape or not np.array_equal(by_tags, by_source):
            diff = np.flatnonzero(by_tags.ravel() != by_source.ravel())
            first = int(diff[0]) if diff.size else 0
            shown = ", ".join(_token(lint, ids, int(i), bool(by_tags.ravel()[i])) for i in diff[:4])
            out.append(
                Finding(
                    "training-mask",
                    Severity.WARNING,
                    f"the {{% generation %}} tags train {int(by_tags.sum())} tokens of probe {probe.name} where "
                    f"ctxlock's provenance trains {int(by_source.sum())}: {diff.size} token(s) differ, first at "
                    f"token {first} ({shown})",
                    line=lines[0],
                    probe=probe.name,
                    hint="a model trained with these tags learns other tokens than the assistant wrote; "
                    "`ctxlock lint --fix FILE` writes tags that agree",
                    data={"tagged": True, "first_token": first, "tokens_differ": int(diff.size)},
                )
            )
    return out


def _token(lint: Lint, ids: tuple[int, ...], i: int, by_tags: bool) -> str:
    piece = lint.model.tokenizer.decode([ids[i]]) if i < len(ids) else ""
    return f"{piece!r} trained by the {'tags' if by_tags else 'provenance'} only"
