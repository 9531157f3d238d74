"""Recording and replay, at the I/O edge: records and the artifacts they name go into a Store; replay rebuilds the
model from the store alone (so it works after the original model directory has changed or gone), re-runs the
whole pipeline from the request's original bytes, and compares every layer."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from .artifacts import load_artifacts, load_template_file
from .errors import CtxlockError, RecordFormatError, RecordNotFoundError
from .model import Model, load
from .record import Diff, ExecutionRecord, RunOptions, build_record, comparable, diff
from .store import Store
from .template import ChatTemplate


def run_and_record(
    model: Model,
    request_bytes: bytes,
    options: RunOptions,
    *,
    template: ChatTemplate | None = None,
) -> tuple[Any | None, ExecutionRecord, CtxlockError | None]:
    """Run the pipeline and build its record; a CtxlockError is recorded too (and returned, not raised)."""
    kwargs: dict[str, Any] = {
        "add_generation_prompt": options.add_generation_prompt,
        "continue_final_message": options.continue_final_message,
        "chat_template_kwargs": dict(options.chat_template_kwargs) if options.chat_template_kwargs else None,
        "special_tokens": options.special_tokens,
        "now": datetime.fromisoformat(options.now) if options.now else None,
        "dialect": options.dialect,
        "utf8": options.utf8,
        "template": template if template is not None else options.template_name,
    }
    try:
        if options.budget:
            return _fit_and_record(model, request_bytes, options, kwargs)
        run = model.run(request_bytes, **kwargs)
    except CtxlockError as exc:
        chosen = template
        if chosen is None and model.templates is not None:
            try:
                chosen = model.templates.select(options.template_name)
            except CtxlockError:
                chosen = None
        record = build_record(model=model, request_bytes=request_bytes, options=options, error=exc, template=chosen)
        return None, record, exc
    return run, build_record(model=model, request_bytes=request_bytes, options=options, run=run), None


def _fit_and_record(
    model: Model, request_bytes: bytes, options: RunOptions, kwargs: dict[str, Any]
) -> tuple[Any, ExecutionRecord, None]:
    from .budget import BudgetPolicy, fit_context
    from .model import Run

    dialect, utf8 = kwargs.pop("dialect"), kwargs.pop("utf8")
    original = model.parse(request_bytes, dialect=dialect, utf8=utf8)
    fitted = fit_context(original, model, BudgetPolicy.from_dict(options.budget or {}), **kwargs)
    tokenized = model.tokenize(fitted.rendered)
    run = Run(fitted.request, fitted.rendered, tokenized, fitted.model_input)
    record = build_record(
        model=model,
        request_bytes=request_bytes,
        options=options,
        run=run,
        original=original,
        decisions=fitted.to_dict(),
    )
    return fitted, record, None


def save(store: Store, model: Model, record: ExecutionRecord, template: ChatTemplate | None) -> str:
    """Put the record and every artifact it needs for replay into the store; return the record id."""
    _, files = model.tokenizer.replay_spec()
    for content in files.values():
        if isinstance(content, bytes):
            store.put_artifact(content)
        else:
            store.put_artifact_file(Path(content))
    if template is not None:
        store.put_artifact(template.source.encode("utf-8"))
    return store.put_record(record.body, index=record.index())


def load_record(spec: str, store: Store) -> ExecutionRecord:
    """A record from a file path, or from the store by id or unique id prefix."""
    path = Path(spec)
    if path.is_file():
        return ExecutionRecord.from_bytes(path.read_bytes(), source=str(path))
    try:
        body = store.get_record(spec)
    except CtxlockError as exc:
        if isinstance(exc, RecordNotFoundError):
            raise
        raise RecordNotFoundError(exc.message, path=exc.path or spec, hint=exc.hint) from None
    return ExecutionRecord.from_bytes(body, source=f"record {spec}")


@contextmanager
def materialized(record: ExecutionRecord, store: Store) -> Iterator[tuple[Model, ChatTemplate | None]]:
    """Rebuild the recorded model in a temporary directory from the store's copies of its artifacts."""
    data = record.data
    rp = data["replay"]
    tmp = Path(tempfile.mkdtemp(prefix="ctxlock-replay-"))
    try:
        for name, sha in rp["files"].items():
            blob = store.get_artifact_path(sha)
            try:
                os.link(blob, tmp / name)  # a hard link is a regular file inside the directory: no copy for GGUF
            except OSError:
                shutil.copyfile(blob, tmp / name)
        manifest: dict[str, Any] = {
            "description": f"replay of record {record.id[:12]} (model {rp.get('model')})",
            "tokenizer": rp["tokenizer"],
            "special_tokens": (data.get("tokenizer") or {}).get("special_tokens") or {},
        }
        template = None
        if rp.get("template_sha256"):
            shutil.copyfile(store.get_artifact_path(rp["template_sha256"]), tmp / "chat_template.jinja")
            manifest["template"] = "chat_template.jinja"
        (tmp / "ctxlock.json").write_text(json.dumps(manifest, ensure_ascii=False), "utf-8")
        model = Model(load_artifacts(tmp))
        if rp.get("template_sha256"):
            template = load_template_file(tmp / "chat_template.jinja", id=(data.get("template") or {}).get("id"))
        yield model, template
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _recorded_options(record: ExecutionRecord) -> tuple[bytes, RunOptions]:
    import base64

    data = record.data
    try:
        raw = base64.b64decode(data["request"]["bytes_b64"], validate=True)
    except (ValueError, KeyError, TypeError):
        raise RecordFormatError("request.bytes_b64 is not valid base64", path="record:request.bytes_b64") from None
    options = RunOptions.from_dict(data["options"])
    # The wall clock of the original run is part of the record: replay reads the same clock.
    now = (data.get("dynamic") or {}).get("now")
    if now and not options.now:
        options = RunOptions.from_dict({**options.to_dict(), "now": now})
    return raw, options


def replay(record: ExecutionRecord, store: Store) -> tuple[Diff, ExecutionRecord]:
    """Re-run the recorded request on the recorded artifacts; compare every layer with the record."""
    raw, options = _recorded_options(record)
    with materialized(record, store) as (model, template):
        _, again, _ = run_and_record(model, raw, options, template=template)
    original = _restore_options(record, comparable(record))
    return diff(original, _restore_options(record, comparable(again))), again


def _restore_options(record: ExecutionRecord, data: dict[str, Any]) -> dict[str, Any]:
    # Replay pins the clock the original run read; the options then differ only in that recorded fact.
    data["options"] = dict(data["options"], now=None)
    return data


def rerun(
    record: ExecutionRecord, *, model_spec: str | None, template_file: Path | None, store: Store
) -> ExecutionRecord:
    """Run a recorded request again under other artifacts (another model and/or template)."""
    raw, options = _recorded_options(record)
    template = load_template_file(template_file) if template_file is not None else None
    if model_spec is not None:
        model = load(model_spec)
        _, again, _ = run_and_record(model, raw, options, template=template)
        return again
    with materialized(record, store) as (model, recorded_template):
        _, again, _ = run_and_record(model, raw, options, template=template or recorded_template)
        return again


__all__ = ["load_record", "materialized", "replay", "rerun", "run_and_record", "save"]
