"""Execution records: everything that shaped one model input, kept to replay it anywhere and diff it to the first
diverging layer; canonical serialization, the record store, bundles, the viewer and replay.

An `ExecutionRecord` holds every versioned thing that shaped one model input, in the pipeline's order:

    request -> policy -> messages -> dynamic -> template -> rendered -> tokenizer -> input_ids -> tensors

plus the options the caller chose, the errors met, the environment, and what replay needs to rebuild the model
(`replay`: a tokenizer manifest and the digests of the files it names, kept in the artifact store).

Serialization is canonical: keys sorted, no whitespace, UTF-8, LF-terminated, no NaN; ids are integers. The
record id is the sha256 of those bytes, so the same record always has the same id, whatever dict order built it.
Key order inside the request is data (a template may render tool schemas in the order the client sent them): the
request's exact bytes are kept (base64) for replay, while the comparable views are order-insensitive, so a
different key order shows up where it matters, in the rendered bytes (docs/records.md).

`diff(a, b)` names the first layer where two records diverge, the location inside it, and the likely cause.

A record is data, never a set of instructions: its `replay` section names the files replay writes into a fresh
private directory, so every name is checked when a record is parsed (`check_replay`). A name is one plain file name
of a flat model directory (see `check_file_name`), not `ctxlock.json` or `chat_template.jinja` (replay writes those
itself), every digest is 64 lowercase hex digits, and the tokenizer manifest holds only the keys its format's
`replay_spec()` writes, naming exactly the files listed.

The package: `format` (canonical bytes, `ExecutionRecord`, the checks of `replay`), `build` (`build_record`,
`RunOptions`), `compare` (one comparer per layer, `COMPARERS`) and `diff` (`diff`, `Diff`, `comparable`).
"""

from __future__ import annotations

from ctxlock.records._build import RunOptions, build_record, environment, model_warnings
from ctxlock.records._compare import COMPARERS, NOT_COMPARED, Comparer, Divergence
from ctxlock.records._diff import DIVERGED, IDENTICAL, SAME_IDS, Diff, comparable, diff
from ctxlock.records._format import (
    LAYERS,
    MAX_FILE_NAME_BYTES,
    MAX_REPLAY_FILES,
    READABLE_FORMATS,
    RECORD_FORMAT,
    REPLAY_MANIFEST,
    REPLAY_TEMPLATE,
    ExecutionRecord,
    canonical_bytes,
    check_file_name,
    check_replay,
)
from ctxlock.records._store import Store

__all__ = [
    "COMPARERS",
    "DIVERGED",
    "IDENTICAL",
    "LAYERS",
    "MAX_FILE_NAME_BYTES",
    "MAX_REPLAY_FILES",
    "NOT_COMPARED",
    "READABLE_FORMATS",
    "RECORD_FORMAT",
    "REPLAY_MANIFEST",
    "REPLAY_TEMPLATE",
    "SAME_IDS",
    "Comparer",
    "Diff",
    "Divergence",
    "ExecutionRecord",
    "RunOptions",
    "Store",
    "build_record",
    "canonical_bytes",
    "check_file_name",
    "check_replay",
    "comparable",
    "diff",
    "environment",
    "model_warnings",
]
