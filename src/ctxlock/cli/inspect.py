"""`ctxlock inspect` and `ctxlock models`."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from ctxlock.artifacts import DEFAULT_MODEL, builtin_models, load_artifacts
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.render import JsonOpt, ModelOpt, TokenizerPipeline, TokenizerPipelineOpt
from ctxlock.model._model import Model
from ctxlock.template._render import role_markers
from ctxlock.training._masks import template_report


def _short(value: object, limit: int = 100) -> str:
    text = "none" if value is None else json.dumps(value, ensure_ascii=False)
    return escape(text if len(text) <= limit else text[: limit - 1] + "…")


def _hf_pipeline(tok: dict) -> None:
    """An HF directory's tokenizer class, the components where it and tokenizer.json disagree, and the file's
    truncation/padding sections."""
    if "tokenizer_class" in tok:
        used = "its pipeline" if tok["pipeline"] == "class" else "tokenizer.json as written (--tokenizer-pipeline file)"
        console.print(
            f"    class      {escape(str(tok['tokenizer_class']))} ({escape(str(tok['tokenizer_class_source']))}); "
            f"encodes with {used}"
        )
        for d in tok.get("class_disagreements") or []:
            lines = d.get("differences") or [f"file {_short(d['file'])}, class {_short(d['class'])}"]
            console.print(f"[yellow]    differs    {d['component']} (used: {d['used']}): {escape(lines[0])}[/]")
            for line in lines[1:4]:
                console.print(f"[yellow]               {escape(line)}[/]")
            if len(lines) > 4:
                console.print(f"[yellow]               … {len(lines) - 4} more (--json lists them)[/]")
        beyond = tok.get("added_beyond_file") or []
        if beyond:
            shown = ", ".join(f"{t['content']!r}={t['id']}" for t in beyond[:8]) + (" …" if len(beyond) > 8 else "")
            console.print(f"    added      {len(beyond)} tokens beyond tokenizer.json's own: {escape(shown)}")
        for note in tok.get("pipeline_notes") or []:
            console.print(f"[yellow]    note       {escape(note)}[/]")
    for name in ("truncation", "padding"):
        if tok.get(name) is not None:
            console.print(
                f"[yellow]    {name:<10} in tokenizer.json, not applied (transformers' apply_chat_template turns it "
                f"off): {_short(tok[name], 160)}[/]"
            )


def _add_role_markers(m: Model, info: dict[str, Any]) -> None:
    """Each template's role-marker verdict (`ctxlock.template.role_markers`) for this model's vocabulary."""
    if m.templates is None:
        return
    for entry, template in zip(info["templates"], m.templates.templates, strict=True):
        found = role_markers(template, special_tokens=m.special_tokens, control_tokens=m.tokenizer.control_tokens)
        entry["role_markers"] = {**found.to_dict(), "warning": found.warning(template)}


def _add_mask_reports(m: Model, info: dict[str, Any]) -> None:
    """Each template's assistant-mask check (`ctxlock.training.template_report`): provenance against sentinels."""
    if m.templates is None:
        return
    for entry, template in zip(info["templates"], m.templates.templates, strict=True):
        entry["assistant_masks"] = template_report(m, template).to_dict()


def _mask_line(report: dict[str, Any]) -> str:
    if report["source"] == "generation":
        return "           assistant masks from its {% generation %} blocks (transformers' rule)"
    if report["agree"]:
        n = sum(c["status"] == "agree" for c in report["checks"])
        return f"           assistant masks: provenance and sentinel re-renders agree ({n} probe conversations)"
    bad = next(c for c in report["checks"] if c["status"] not in ("agree", "error", "no-turns"))
    return (
        f"[yellow]reported[/]   assistant masks (template sha256 {report['sha256'][:12]}): {bad['status']} on the "
        f"{bad['conversation']} conversation at {escape(bad['path'])}: {escape(bad['detail'])}; masks come from "
        "provenance alone there"
    )


def special_tokens_added(tok: Any) -> dict[str, Any]:
    """What `add_special_tokens=True` (`tokenize --add-special-tokens`, transformers' default for `encode`) adds around
    a text, found by encoding one: `bos` the ids before it, `eos` the ids after it, each [id, piece]. Measured, not
    read from a config, so it is what this tokenizer does whatever the format (tokenizer.json's post-processor, the
    class's add_bos_token/add_eos_token, a GGUF's add_bos_token/add_eos_token, Tekken's BOS)."""
    probe = "a"
    plain = tok.encode(probe)
    full = tok.encode(probe, add_special_tokens=True)
    at = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), None)
    if at is None:  # the post-processor changed the text's own ids: report the whole difference
        return {"bos": [], "eos": [], "probe": probe, "plain": plain, "with_special_tokens": full}
    return {
        "bos": [[i, tok.id_to_token(i)] for i in full[:at]],
        "eos": [[i, tok.id_to_token(i)] for i in full[at + len(plain) :]],
    }


def _added_line(added: dict[str, Any]) -> str:
    def show(pairs: list[list[Any]]) -> str:
        return ", ".join(f"{piece!r} ({i})" for i, piece in pairs) if pairs else "nothing"

    if "probe" in added:
        return f"{added['probe']!r} encodes as {added['plain']} plain and {added['with_special_tokens']} with them"
    return f"BOS {show(added['bos'])} before the text, EOS {show(added['eos'])} after it"


def register(app: typer.Typer) -> None:
    app.command()(inspect)
    app.command()(models)


def inspect(
    model: ModelOpt = None,
    tokenizer_pipeline: TokenizerPipelineOpt = TokenizerPipeline.CLASS,
    as_json: JsonOpt = False,
) -> None:
    """Show what a model spec loads: artifact ids and digests, vocab size, the context window (and its source),
    special tokens, template features.

    For an HF directory: the transformers tokenizer class, where its pipeline and tokenizer.json disagree and
    which is used, and the file's truncation/padding sections (never applied)."""
    pipeline = TokenizerPipeline(tokenizer_pipeline).value
    m = guarded(as_json, lambda: Model(load_artifacts(model, tokenizer_pipeline=pipeline)))
    m.warm_up()  # the engine checks, and fastokens built and checked: report their verdicts, not "building"
    info = m.artifacts.describe()
    info["add_special_tokens"] = special_tokens_added(m.tokenizer)
    _add_role_markers(m, info)
    _add_mask_reports(m, info)
    if as_json:
        print_json(info)
        return
    console.print(f"[bold]{info['id']}[/]  {info['source']}")
    if info.get("hub"):
        pin = info["hub"]
        kind = "a rolling reference the hub can move" if pin["rolling"] else "a pinned commit"
        console.print(
            f"revision   {escape(pin['repo_id'])}@{escape(pin['revision'])} -> {pin['commit']} "
            f"(via {escape(pin['resolved_via'])}, {kind})"
        )
    if info["description"]:
        console.print(info["description"])
    _show_tokenizer(info)
    _show_capacity(info["capacity"])
    table = Table("variable", "content", "id", title="special-token variables")
    for k, v in info["special_tokens"].items():
        table.add_row(k, repr(v["content"]), str(v["id"]))
    console.print(table)
    _show_templates(info["templates"])


def _show_tokenizer(info: dict[str, Any]) -> None:
    """The tokenizer lines of `inspect`: format, digest, pipeline, engine, added and control tokens."""
    tok = info["tokenizer"]
    console.print(
        f"tokenizer  {tok['format']} · {tok.get('model')} · vocab {tok['vocab_size']:,} · sha256 {tok['sha256']}"
    )
    console.print(f"           normalizer {tok.get('normalizer')} · pre-tokenizer {tok.get('pre_tokenizer')}")
    _hf_pipeline(tok)
    if tok.get("engine"):
        # Which engine encodes text runs, and the check that chose it (or refused the fast one).
        console.print(f"           engine {tok['engine']}: {escape(str(tok.get('engine_reason')))}")
    if "whole_text" in tok:
        # Whether Model.encode may encode a rendered text in one native call, with prefix reuse across texts.
        taken = "one native call per text, prefix reuse" if tok["whole_text"] else "refused"
        console.print(f"       whole-text {taken}: {escape(str(tok.get('whole_text_reason')))}")
        if tok.get("whole_text_engine"):
            # Which library makes that native call: fastokens once it matched the exact path on the vocabulary.
            console.print(f"      native call {escape(str(tok['whole_text_engine']))}")
    console.print(
        f"           {info['added_tokens']} added tokens, {info['control_tokens']} treated as control; "
        f"pad id {info['pad_id']}"
    )
    console.print(
        "           add_special_tokens (tokenize --add-special-tokens) adds: "
        + escape(_added_line(info["add_special_tokens"]))
        + "; chat rendering adds none (the template writes its own)"
    )


def _show_capacity(cap: dict[str, Any]) -> None:
    """The window and output limit the files state, each with its source, and every conflict or ignored value."""
    window = "unknown" if cap["context_window"] is None else f"{cap['context_window']:,} from {cap['source']}"
    output = (
        "unknown" if cap["max_output_tokens"] is None else f"{cap['max_output_tokens']:,} from {cap['output_source']}"
    )
    console.print(f"capacity   window {escape(window)} · output limit {escape(output)}")
    for note in cap["notes"]:
        console.print(f"[yellow]           note {escape(note)}[/]")


def _show_templates(templates: list[dict[str, Any]]) -> None:
    """One block per template: id, digest, features, line endings, the role-marker verdict."""
    for t in templates:
        feats = ", ".join(k for k, v in t["features"].items() if v) or "none"
        console.print(f"template   {t['name']}: {t['id']} · sha256 {t['sha256']} · features: {feats}")
        if t.get("line_endings") in ("crlf", "cr", "mixed"):
            # Rendered as transformers reads the file (universal newlines): the source is not the file's bytes.
            console.print(
                f"           {t['line_endings'].upper()} line endings in the file (sha256 {t['file_sha256']}), "
                "read as LF as transformers reads it: the template sha256 is of the LF text"
            )
        markers = t["role_markers"]
        if not markers["checked"]:
            console.print(f"           role markers not checked: {escape(markers['reason'])}")
        elif markers["warning"]:
            w = markers["warning"]
            console.print(f"[bold yellow]warning[/]    {escape(w['message'])}  ({escape(w['path'])})")
        else:
            console.print("           role markers are control tokens at every turn boundary")
        if "assistant_masks" in t:
            console.print(_mask_line(t["assistant_masks"]))
    if not templates:
        console.print("template   none (pass --template FILE to render)")


def models(as_json: JsonOpt = False) -> None:
    """List the built-in models (the default is used when --model is omitted)."""
    rows = builtin_models()
    if as_json:
        print_json([{"name": n, "description": d, "default": n == DEFAULT_MODEL} for n, d in rows])
        return
    table = Table("name", "description")
    for n, d in rows:
        table.add_row(n + (" (default)" if n == DEFAULT_MODEL else ""), d)
    console.print(table)
