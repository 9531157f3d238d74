"""Recording and replay, at the I/O edge: records and the artifacts they name go into a Store; replay rebuilds the
model from the store alone (so it works after the original model directory has changed or gone), re-runs the
whole pipeline from the request's original bytes, and compares every layer.

A record comes from anywhere (a file, an import), so replay treats it as data: its file names are checked first
(`record.check_replay`), and the model is rebuilt in a fresh private directory (mkdtemp: mode 0700, a new name)
where each file is created new, never opened through or in place of an existing path, then removed afterwards."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ctxlock.artifacts import load_manifest_dir, load_template_file
from ctxlock.budget import BudgetPolicy, CompactionPlan, apply_compaction, fit_context
from ctxlock.core import thaw
from ctxlock.errors import (
    ArtifactNotFoundError,
    CtxlockError,
    FixtureCheckError,
    RecordError,
    RecordFormatError,
    RecordNotFoundError,
    TemplateNotFoundError,
)
from ctxlock.model import Model, Run, load
from ctxlock.multimodal import AnimationPolicy, StageOptions, family_for
from ctxlock.records import (
    REPLAY_MANIFEST,
    REPLAY_TEMPLATE,
    Diff,
    ExecutionRecord,
    RunOptions,
    build_record,
    check_replay,
    comparable,
    diff,
)
from ctxlock.records._store import Store, max_record_bytes
from ctxlock.template import ChatTemplate, RenderOptions


def run_and_record(
    model: Model,
    request_bytes: bytes,
    options: RunOptions,
    *,
    template: ChatTemplate | None = None,
    media: Mapping[str, bytes] | None = None,
) -> tuple[Any | None, ExecutionRecord, CtxlockError | None]:
    """Run the pipeline and build its record; a CtxlockError is recorded too (and returned, not raised).

    `options` is what the record keeps; the run reads them as `RenderOptions` (`template`, a ChatTemplate given
    beside the record, wins over the recorded template name). With `options.images` (see `image_options`) the run
    goes through `Model.run_images`, `media` giving the bytes of the request's http(s) image URLs."""
    render = RenderOptions.from_record(options.to_dict(), template=template)
    try:
        if options.budget:
            return _fit_and_record(model, request_bytes, options, render, media)
        if options.compaction:
            return _compact_and_record(model, request_bytes, options, render)
        if options.images is not None:
            return _images_and_record(model, request_bytes, options, render, media)
        run = model.run(request_bytes, render)
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


def image_options(
    model: Model, media: Mapping[str, bytes] | None = None, stage: StageOptions | None = None
) -> dict[str, Any]:
    """`RunOptions.images` for a run with images: the model's preprocessor config (replay rebuilds the family from
    it), the stage options, and the sha256 of each supplied URL's bytes (`save` keeps the bytes in the store)."""
    stage = stage or StageOptions()
    pre = model.artifacts.preprocessor
    return {
        "preprocessor_config": thaw(pre) if pre is not None else None,
        **stage.to_json(),
        "media": {url: hashlib.sha256(data).hexdigest() for url, data in (media or {}).items()},
    }


def _images_and_record(
    model: Model,
    request_bytes: bytes,
    options: RunOptions,
    render: RenderOptions,
    media: Mapping[str, bytes] | None,
) -> tuple[Any, ExecutionRecord, None]:
    family, stage = _image_stage(options)
    mm = model.run_images(request_bytes, render, media=media, family=family, images=stage)
    run = Run(mm.request, mm.rendered, mm.tokenized, mm.model_input)
    record = build_record(model=model, request_bytes=request_bytes, options=options, run=run, multimodal=mm)
    return mm, record, None


def _image_stage(options: RunOptions) -> tuple[Any, StageOptions]:
    """The family (from the recorded preprocessor config; None: the model's own) and the stage options."""
    spec = options.images or {}
    config = spec.get("preprocessor_config")
    family = family_for(config, path="record:options.images.preprocessor_config") if config else None
    stage = StageOptions(
        max_pixels=int(spec.get("max_pixels", StageOptions.max_pixels)),
        animation=AnimationPolicy(spec.get("animation", AnimationPolicy.FIRST_FRAME.value)),
        max_frames=int(spec.get("max_frames", StageOptions.max_frames)),
        max_video_pixels=int(spec.get("max_video_pixels", StageOptions.max_video_pixels)),
        max_decode_bytes=int(spec["max_decode_bytes"]) if spec.get("max_decode_bytes") is not None else None,
    )
    return family, stage


def recorded_media(options: RunOptions, store: Store) -> dict[str, bytes]:
    """The supplied image bytes a record names, from the store's artifacts (the original files may be gone)."""
    out: dict[str, bytes] = {}
    for url, sha in ((options.images or {}).get("media") or {}).items():
        out[url] = _artifact_bytes(store, sha, f"image {url}")
    return out


def _artifact_bytes(store: Store, sha256: str, role: str) -> bytes:
    if not store.has_artifact(sha256):
        raise ArtifactNotFoundError(
            f"the store has no artifact {sha256[:12]} ({role})",
            path=f"artifact {sha256}",
            hint="the record was saved without its image bytes; record it again with --media",
        )
    return store.get_artifact_path(sha256).read_bytes()


def _fit_and_record(
    model: Model,
    request_bytes: bytes,
    options: RunOptions,
    render: RenderOptions,
    media: Mapping[str, bytes] | None = None,
) -> tuple[Any, ExecutionRecord, None]:
    original = render.parse(request_bytes)
    policy = BudgetPolicy.from_dict(options.budget or {})
    family, stage = _image_stage(options) if options.images is not None else (None, StageOptions())
    kwargs = render.to_kwargs(parse=False)
    fitted = fit_context(original, model, policy, media=media, image_family=family, **kwargs)
    tokenized = model.tokenize(fitted.rendered)
    run = Run(fitted.request, fitted.rendered, tokenized, fitted.model_input)
    multimodal = None
    if options.images is not None:  # the fitted request's images, as the model receives them
        multimodal = model.run_images(fitted.request, render, media=media, family=family, images=stage)
    record = build_record(
        model=model,
        request_bytes=request_bytes,
        options=options,
        run=run,
        original=original,
        decisions=fitted.to_dict(),
        multimodal=multimodal,
    )
    return fitted, record, None


def compaction_decision(plan: CompactionPlan, summary: str, turn_prefix_summary: str | None) -> dict[str, Any]:
    """What a compacted run's record logs in `decisions.compaction`: the cut and what the summary replaced."""
    return {
        "first_kept_index": plan.first_kept_index,
        "messages_summarized": [*plan.messages_to_summarize, *plan.turn_prefix_to_summarize],
        "split_turn": plan.split_turn,
        "summary_sha256": hashlib.sha256(summary.encode("utf-8", "surrogatepass")).hexdigest(),
        "turn_prefix_summary_sha256": None
        if turn_prefix_summary is None
        else hashlib.sha256(turn_prefix_summary.encode("utf-8", "surrogatepass")).hexdigest(),
    }


def _compact_and_record(
    model: Model, request_bytes: bytes, options: RunOptions, render: RenderOptions
) -> tuple[Any, ExecutionRecord, None]:
    """The run of the compacted request (system + summary + kept messages), recorded with the request as received:
    the originals stay in the record's `request` section (docs/budgets.md)."""
    spec = options.compaction or {}
    original = render.parse(request_bytes)
    plan = CompactionPlan.from_dict(spec.get("plan") or {})
    summary, prefix = spec.get("summary"), spec.get("turn_prefix_summary")
    if not isinstance(summary, str) or not (prefix is None or isinstance(prefix, str)):
        raise RecordFormatError("options.compaction.summary must be a string", path="record:options.compaction")
    compacted = apply_compaction(original, plan, summary, turn_prefix_summary=prefix)
    run = model.run(compacted, render)
    record = build_record(
        model=model,
        request_bytes=request_bytes,
        options=options,
        run=run,
        original=original,
        compaction=compaction_decision(plan, summary, prefix),
    )
    return run, record, None


def save(
    store: Store,
    model: Model,
    record: ExecutionRecord,
    template: ChatTemplate | None,
    media: Mapping[str, bytes] | None = None,
) -> str:
    """Put the record and every artifact it needs for replay into the store (the supplied image bytes too);
    return the record id."""
    for data in (media or {}).values():
        store.put_artifact(data)
    _, files = model.tokenizer.replay_spec()
    for content in files.values():
        if isinstance(content, bytes):
            store.put_artifact(content)
        else:
            store.put_artifact_file(Path(content))
    if template is not None:
        store.put_artifact(template.source.encode("utf-8"))
    return store.put_record(record.body, index=record.index())


_RECORD_ID = re.compile(r"[0-9a-fA-F]{8,64}")
# Create only: fail on an existing name (O_EXCL), a symlink included (O_NOFOLLOW, where the platform has it).
_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)


def load_record(spec: str, store: Store) -> ExecutionRecord:
    """A record from a file path, or from the store by id or unique id prefix."""
    path = Path(spec)
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # no such file, or a name no file can have (NUL, too long)
        st = None
    # Something at that path that is not a regular file is an error, unless the spec reads as a record id.
    if st is not None and (stat.S_ISREG(st.st_mode) or not _RECORD_ID.fullmatch(spec)):
        return ExecutionRecord.from_bytes(read_record_file(path), source=str(path))
    try:
        body = store.get_record(spec)
    except CtxlockError as exc:
        if isinstance(exc, RecordNotFoundError):
            raise
        raise RecordNotFoundError(exc.message, path=exc.path or spec, hint=exc.hint) from None
    return ExecutionRecord.from_bytes(body, source=f"record {spec}")


def read_record_file(path: Path) -> bytes:
    """The bytes of a record file: a regular file (not a directory, FIFO or device) of at most max_record_bytes()."""
    limit = max_record_bytes()
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below like any non-regular file.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise RecordFormatError(f"cannot open the record file: {exc.strerror}", path=str(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordFormatError(
                "not a regular file (a directory, FIFO or device)",
                path=str(path),
                hint="pass a record file written by `records export` or `records show`, or a record id",
            )
        raw = b"" if st.st_size > limit else _read_at_most(fd, limit + 1)
    finally:
        os.close(fd)
    if st.st_size > limit or len(raw) > limit:
        raise RecordFormatError(
            f"the record file is longer than the {limit:,}-byte record limit",
            path=str(path),
            hint="set CTXLOCK_MAX_RECORD_BYTES to allow bigger records",
        )
    return raw


def _read_at_most(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0 and (chunk := os.read(fd, min(size, 1 << 20))):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


@contextmanager
def materialized(record: ExecutionRecord, store: Store) -> Iterator[tuple[Model, ChatTemplate | None]]:
    """Rebuild the recorded model in a temporary directory from the store's copies of its artifacts.

    The record is checked again here (an ExecutionRecord can be built from raw bytes without parsing), and every
    file goes into a fresh mkdtemp directory, created new: nothing outside it is written, followed or replaced."""
    source = f"record {record.id[:12]}"
    try:
        data = record.data
    except ValueError:
        raise RecordFormatError("not a JSON record", path=source, hint="parse records with from_bytes") from None
    rp = data.get("replay") if isinstance(data, dict) else None
    check_replay(rp, source=source)
    recorded_tokenizer, recorded_template = (
        data.get(k) if isinstance(data.get(k), dict) else {} for k in ("tokenizer", "template")
    )
    tmp = Path(tempfile.mkdtemp(prefix="ctxlock-replay-"))
    try:
        for name, sha in rp["files"].items():
            _place(_artifact(store, record, sha, f"tokenizer file {name}"), tmp / name)
        manifest: dict[str, Any] = {
            "description": f"replay of record {record.id[:12]} (model {rp.get('model')})",
            "tokenizer": rp["tokenizer"],
            "special_tokens": special if isinstance(special := recorded_tokenizer.get("special_tokens"), dict) else {},
        }
        template = None
        if rp["template_sha256"]:
            _place(_artifact(store, record, rp["template_sha256"], "template"), tmp / REPLAY_TEMPLATE)
            manifest["template"] = REPLAY_TEMPLATE
        _create(tmp / REPLAY_MANIFEST, json.dumps(manifest, ensure_ascii=False).encode("utf-8"))
        # Not through load_artifacts: its cache is keyed by the directory, which is gone after this replay; each
        # replay kept a dead model there (about 100 MB for a Qwen vocabulary, up to 32 of them).
        model = Model(load_manifest_dir(tmp))
        if rp["template_sha256"]:
            template_id = recorded_template.get("id")
            template = load_template_file(
                tmp / REPLAY_TEMPLATE, id=template_id if isinstance(template_id, str) else None
            )
        yield model, template
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _artifact(store: Store, record: ExecutionRecord, sha256: str, role: str) -> Path:
    """The stored blob of one artifact the record names; a missing one says which, and the commands that bring it."""
    try:
        return store.get_artifact_path(sha256)
    except ArtifactNotFoundError as exc:
        raise ArtifactNotFoundError(
            f"record {record.id[:12]} replays from its {role} (sha256 {sha256[:12]}…), which is not in this store",
            path=exc.path,
            hint=f"on the machine that made the record, run `ctxlock records export --bundle {record.id[:12]} -o "
            "FILE`; then `ctxlock records import FILE` here",
        ) from None


def _place(blob: Path, target: Path) -> None:
    """Put a stored blob at `target`, a name that must not exist yet: a hard link (no copy of a GB GGUF) when the
    filesystem allows one, else a copy into a file created new. An existing name is an error, never overwritten."""
    try:
        os.link(blob, target)  # never follows or replaces `target`: EEXIST if anything is there
        return
    except FileExistsError:
        raise _exists(target) from None
    except OSError:
        pass  # another filesystem (EXDEV), or one without hard links: copy instead
    with blob.open("rb") as src:
        _create(target, src)


def _create(target: Path, content: bytes | Any) -> None:
    try:
        fd = os.open(target, _CREATE_NEW, 0o600)
    except FileExistsError:
        raise _exists(target) from None
    except OSError as exc:
        raise RecordError(f"cannot write the replay file: {exc.strerror}", path=str(target)) from None
    with os.fdopen(fd, "wb") as out:
        if isinstance(content, bytes):
            out.write(content)
        else:
            shutil.copyfileobj(content, out, 1 << 20)


def _exists(target: Path) -> RecordError:
    return RecordError(
        "the replay directory already holds this name; nothing was overwritten",
        path=str(target),
        hint="another process is writing into the private replay directory; replay again",
    )


def recorded_request(record: ExecutionRecord) -> tuple[bytes, RunOptions]:
    """The request bytes a record ran and the options it ran with (its recorded clock pinned), as replay reads them."""
    return _recorded_options(record)


def _recorded_options(record: ExecutionRecord) -> tuple[bytes, RunOptions]:
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


# The book fixture (docs/records.md): the book tokenizer's one expected answer, asserted before any replay compares
# anything.
BOOK_FIXTURE_REQUEST = {
    "messages": [{"role": "system", "content": "简洁回答"}, {"role": "user", "content": "天空为什么是蓝色？"}]
}
BOOK_FIXTURE_TEXT = "<bos><system>简洁回答</system><user>天空为什么是蓝色？</user><assistant>"
BOOK_FIXTURE_IDS = (1, 2, 7, 3, 4, 8, 9, 10, 11, 12, 5, 6)


def check_book_fixture() -> dict[str, Any]:
    """Run the book fixture (the built-in `book` model) and assert its rendered text and ids.

    Returns what it checked; a different answer is a FixtureCheckError: this installation does not tokenize the way
    the fixture fixes it, so nothing a replay here compares could be trusted."""
    model = load("book")
    run = model.run(json.dumps(BOOK_FIXTURE_REQUEST, ensure_ascii=False).encode("utf-8"))
    ids = list(run.tokenized.ids)
    if run.rendered.text != BOOK_FIXTURE_TEXT or ids != list(BOOK_FIXTURE_IDS):
        got = "rendered text" if run.rendered.text != BOOK_FIXTURE_TEXT else "ids"
        raise FixtureCheckError(
            f"the book fixture gave other {got}: ids {ids}, expected {list(BOOK_FIXTURE_IDS)}; nothing was compared",
            path="fixture book",
            hint="this installation's book model or tokenizer is altered: reinstall ctxlock and run "
            "tests/tokenizer/test_book_fixture.py",
        )
    return {
        "name": "book",
        "ok": True,
        "expected": list(BOOK_FIXTURE_IDS),
        "ids": ids,
    }


@contextmanager
def record_values(*records: ExecutionRecord) -> Iterator[None]:
    """Turn a Python error raised while using the values of imported records (a field of the wrong type, a missing
    key: a record can be imported from a file, and import checks its form, not every field) into a
    RecordFormatError naming the records; a CtxlockError passes as it is."""
    try:
        yield
    except CtxlockError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        ids = ", ".join(r.id[:12] for r in records)
        raise RecordFormatError(
            f"a value in the record cannot be used ({type(exc).__name__}: {exc})",
            path=f"record {ids}",
            hint="the record was altered or was not written by ctxlock; export it again from the store that "
            "recorded it",
        ) from None


def replay(record: ExecutionRecord, store: Store) -> tuple[Diff, ExecutionRecord]:
    """Check the seed fixture, re-run the recorded request on the recorded artifacts, compare every layer with the
    record. The fixture's result is in `Diff.fixture`; a failed fixture is a FixtureCheckError, raised first."""
    fixture = check_book_fixture()
    with record_values(record):
        raw, options = _recorded_options(record)
        media = recorded_media(options, store)
        with materialized(record, store) as (model, template):
            _, again, _ = run_and_record(model, raw, options, template=template, media=media)
        original = _restore_options(record, comparable(record))
        replayed = _restore_options(record, comparable(again))
        if "content_format" not in (record.data.get("options") or {}):
            # A record from before the option: it rendered content-part lists as sent and logged no such decision.
            (replayed.get("decisions") or {}).pop("content_format", None)
        result = diff(original, replayed)
    return dataclasses.replace(result, fixture=fixture), again


def _restore_options(record: ExecutionRecord, data: dict[str, Any]) -> dict[str, Any]:
    # Replay pins the clock the original run read; the options then differ only in that recorded fact.
    data["options"] = dict(data["options"], now=None)
    return data


def rerun(
    record: ExecutionRecord,
    *,
    model_spec: str | None,
    template_file: Path | None,
    store: Store,
    template_name: str | None = None,
) -> ExecutionRecord:
    """Run a recorded request again under other artifacts (another model, a template file, or a template of the
    model's set by name)."""
    raw, options = _recorded_options(record)
    media = recorded_media(options, store)
    template = load_template_file(template_file) if template_file is not None else None
    if model_spec is not None:
        model = load(model_spec)
        template = _named(model, template_name) or template
        _, again, _ = run_and_record(model, raw, options, template=template, media=media)
        return again
    with materialized(record, store) as (model, recorded_template):
        try:
            template = _named(model, template_name) or template or recorded_template
        except TemplateNotFoundError as exc:
            exc.hint = "the record keeps only the template it used: name the model too (--model / model_spec)"
            exc.args = (str(exc),)
            raise
        _, again, _ = run_and_record(model, raw, options, template=template, media=media)
        return again


def _named(model: Model, name: str | None) -> ChatTemplate | None:
    """The model's template `name` (TemplateNotFoundError naming the ones it has), or None without a name."""
    if name is None:
        return None
    if model.templates is None:
        raise TemplateNotFoundError(
            f"no chat template named {name!r}: the model has no template set", path="template", hint="pass a file"
        )
    return model.templates.select(name)


__all__ = [
    "BOOK_FIXTURE_IDS",
    "check_book_fixture",
    "compaction_decision",
    "image_options",
    "load_record",
    "materialized",
    "read_record_file",
    "recorded_media",
    "recorded_request",
    "replay",
    "rerun",
    "run_and_record",
    "save",
]
