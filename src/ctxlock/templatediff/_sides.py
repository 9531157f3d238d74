"""The two sides of a template diff, from what the user names: a template file, a model directory, a GGUF file, a
built-in model name or an `org/name@rev` hub spec.

A model side renders with its own template(s) and tokenizer. A template file has no tokenizer of its own: it is
rendered with the tokenizer (and special tokens) of `--model M` when given, else of the other side when that is a
model, else of the embedded default model; the side says which (`Side.tokenizer_from`)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxlock.artifacts import DEFAULT_MODEL, load_template_file
from ctxlock.errors import CtxlockError, InputError, TemplateNotFoundError
from ctxlock.model import load
from ctxlock.pipeline import Pipeline
from ctxlock.template import ChatTemplate

# A spec with one of these endings is a template file, even when it is not there (so a typo is "no such template
# file", not "no such model").
TEMPLATE_SUFFIXES = (".jinja", ".jinja2", ".j2", ".tmpl", ".txt")
_GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Side:
    """One side of the diff: what the user named (`spec`), whether it is a template file or a model, the model whose
    tokenizer (and special tokens) it renders with, its template (None: the model's own set, as transformers selects
    from it) and where its tokenizer came from."""

    name: str  # "A" or "B"
    spec: str
    kind: str  # "template" or "model"
    model: Pipeline
    template: ChatTemplate | None
    tokenizer_from: str  # "its own", "--model M", "B's model", "the embedded default mistral-nemo"

    def to_dict(self) -> dict[str, Any]:
        tok = self.model.tokenizer
        return {
            "spec": self.spec,
            "kind": self.kind,
            "model": self.model.id,
            "tokenizer": {"id": tok.id, "sha256": tok.sha256, "from": self.tokenizer_from},
        }


def spec_kind(spec: str) -> str:
    """ "template" for a template file (a regular file that is not GGUF, or a missing path ending in .jinja or the
    like), "model" for anything else (a directory, a GGUF file, a built-in name, a hub spec). Nothing but the first
    four bytes of a regular file is read; a FIFO or a device is never opened (the template loader refuses it)."""
    try:
        mode = os.stat(spec).st_mode
    except (OSError, ValueError):
        return "template" if spec.lower().endswith(TEMPLATE_SUFFIXES) else "model"
    if stat.S_ISDIR(mode):
        return "model"
    if not stat.S_ISREG(mode):
        return "template"
    try:
        with open(spec, "rb") as fh:
            return "model" if fh.read(4) == _GGUF_MAGIC else "template"
    except OSError:
        return "template"  # unreadable: the template loader names it


def _named(side: str, spec: str, exc: CtxlockError) -> CtxlockError:
    """The error with the side in front of where it happened (`B templates/x.jinja line 3: ...`)."""
    where = exc.path or spec
    exc.path = where if where.startswith(f"{side} ") else f"{side} {where}"
    exc.args = (str(exc),)
    return exc


def _pipeline(spec: str) -> Pipeline:
    """`ctxlock.model.load(spec)`, as the features see a model (`ctxlock.pipeline.Pipeline`)."""
    return load(spec)


def _load_model(side: str, spec: str) -> Pipeline:
    try:
        m = load(spec)
    except CtxlockError as exc:
        raise _named(side, spec, exc) from None
    if m.templates is None:
        raise TemplateNotFoundError(
            "the model has no chat template",
            path=f"{side} {spec}",
            hint="compare a template file instead: a .jinja file renders with the other side's tokenizer",
        )
    return m


def _load_template(side: str, spec: str) -> ChatTemplate:
    try:
        return load_template_file(Path(spec))
    except CtxlockError as exc:
        raise _named(side, spec, exc) from None


def load_sides(a: str, b: str, *, model: str | None = None) -> tuple[Side, Side]:
    """Both sides of `ctxlock diff-template A B [--model M]`, loaded. `model` is the tokenizer of a template-file
    side (it is refused when neither side is a template file: a model side renders with its own)."""
    if not a or not b:
        raise InputError("a side is empty", path="A" if not a else "B", hint="name a template file or a model")
    kinds = {"A": spec_kind(a), "B": spec_kind(b)}
    specs = {"A": a, "B": b}
    if model is not None and "template" not in kinds.values():
        raise InputError(
            "--model gives a template file its tokenizer, and A and B are both models",
            path="--model",
            hint="drop --model: each model renders with its own tokenizer",
        )
    models: dict[str, Pipeline] = {n: _load_model(n, s) for n, s in specs.items() if kinds[n] == "model"}
    templates = {n: _load_template(n, s) for n, s in specs.items() if kinds[n] == "template"}
    shared: Pipeline | None = None
    if templates:
        if model is not None:
            try:
                shared = _pipeline(model)
            except CtxlockError as exc:
                raise _named("--model", model, exc) from None
        elif not models:
            shared = _pipeline(DEFAULT_MODEL)
    sides = []
    for n in ("A", "B"):
        other = "B" if n == "A" else "A"
        if kinds[n] == "model":
            sides.append(Side(n, specs[n], "model", models[n], None, "its own"))
            continue
        if shared is not None:
            origin = f"--model {model}" if model is not None else f"the embedded default {DEFAULT_MODEL}"
            sides.append(Side(n, specs[n], "template", shared, templates[n], origin))
        else:
            sides.append(Side(n, specs[n], "template", models[other], templates[n], f"{other}'s model"))
    return sides[0], sides[1]
