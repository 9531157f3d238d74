"""`ctxlock view`: one record as a self-contained HTML page (token chips by provenance, digests), or two records
side by side with their first divergence."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ctxlock.cli.files import open_output
from ctxlock.cli.records import StoreOpt, open_store, record_at
from ctxlock.records import diff
from ctxlock.records._replay import materialized, record_values
from ctxlock.records._viewer import diff_page, record_page


def view(
    record: Annotated[str, typer.Argument(help="Record id (or unique prefix) or record file.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Write the page to this file.")],
    other: Annotated[
        str | None,
        typer.Argument(help="A second record: the page shows both side by side, the first divergence highlighted."),
    ] = None,
    store: StoreOpt = None,
) -> None:
    """Write a record as one HTML page with no external request: the rendered input as token chips coloured by
    provenance (template, system, user, assistant, tool, document, image), neutralized control-token strings
    outlined in red, each chip's id, bytes and request path on hover, tokens per part, budget decisions, digests.
    The tokens are placed with the record's own tokenizer, rebuilt from the store.

    With a second record (`ctxlock view A B -o diff.html`): both side by side, with `ctxlock diff`'s first divergence
    (layer, location, both values, cause) in a banner and the first token whose id differs outlined in both."""
    s = open_store(store)
    rec = record_at(record, s)
    if other is None:
        with record_values(rec), materialized(rec, s) as (model, _template):
            page = record_page(record, rec.data, model.tokenizer)
    else:
        rb = record_at(other, s, option="OTHER")
        with record_values(rec, rb):
            result = diff(rec, rb).to_dict()
            with materialized(rec, s) as (ma, _), materialized(rb, s) as (mb, _):
                page = diff_page([(record, rec.data, ma.tokenizer), (other, rb.data, mb.tokenizer)], result)
    with open_output(out, option="--out") as fh:
        fh.write(page.encode("utf-8"))


def register(app: typer.Typer) -> None:
    app.command("view")(view)
