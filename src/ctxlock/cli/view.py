"""`ctxlock view`: one record as a self-contained HTML page (token chips by provenance, digests)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..replay import materialized, record_values
from ..viewer import record_page
from .files import open_output
from .records import StoreOpt, open_store, record_at


def view(
    record: Annotated[str, typer.Argument(help="Record id (or unique prefix) or record file.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Write the page to this file.")],
    store: StoreOpt = None,
) -> None:
    """Write a record as one HTML page with no external request: the rendered input as token chips coloured by
    provenance (template, system, user, assistant, tool, document, image), neutralized control-token strings
    outlined in red, each chip's id, bytes and request path on hover, tokens per part, budget decisions, digests.
    The tokens are placed with the record's own tokenizer, rebuilt from the store."""
    s = open_store(store)
    rec = record_at(record, s)
    with record_values(rec), materialized(rec, s) as (model, _template):
        page = record_page(record, rec.data, model.tokenizer)
    with open_output(out, option="--out") as fh:
        fh.write(page.encode("utf-8"))


def register(app: typer.Typer) -> None:
    app.command("view")(view)
