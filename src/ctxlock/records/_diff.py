"""`diff(a, b)`: the first layer where two records diverge, the location inside it and the likely cause, walking
the layer comparers (compare.py) in the pipeline's order; and `comparable`, the record view replay compares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ctxlock.records._compare import Divergence, compare_layer, first_json_difference, pipeline_difference, short_digest
from ctxlock.records._format import LAYERS, ExecutionRecord

# The outcomes of a diff (`Diff.kind`), each with its own exit code on the command line (0, 1, 3).
IDENTICAL = "identical"
DIVERGED = "diverged"
SAME_IDS = "same_ids_different_tokenizer"  # the tokenizer layer differs, and the ids (and tensors) are equal


@dataclass(frozen=True)
class Diff:
    """`kind` is IDENTICAL, DIVERGED, or SAME_IDS (the tokenizer artifacts differ, the model input does not; the
    tokenizer difference is `first_divergence`). `ids` says whether the input ids are equal, whatever the layer;
    `fixture` is replay's book-fixture check (None for a plain diff)."""

    identical: bool
    first_divergence: Divergence | None
    notes: tuple[str, ...] = ()
    kind: str = ""
    ids: Mapping[str, Any] | None = None
    fixture: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", IDENTICAL if self.identical else DIVERGED)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "identical": self.identical,
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "ids": dict(self.ids) if self.ids is not None else None,
            "notes": list(self.notes),
        }
        if self.fixture is not None:
            out["fixture"] = dict(self.fixture)
        return out


def diff(a: ExecutionRecord | Mapping[str, Any], b: ExecutionRecord | Mapping[str, Any]) -> Diff:
    """Compare two records layer by layer; report the first layer that differs."""
    da = a.data if isinstance(a, ExecutionRecord) else dict(a)
    db = b.data if isinstance(b, ExecutionRecord) else dict(b)
    notes: list[str] = []
    if da.get("environment") != db.get("environment"):
        found = first_json_difference(da.get("environment"), db.get("environment"))
        if found:
            notes.append(f"environment differs at {found[0]}: {found[1]!r} vs {found[2]!r}")
    ea, eb = ((d.get("tokenizer") or {}).get("engine") for d in (da, db))
    if ea != eb:
        notes.append(f"tokenizer engine differs: {ea!r} vs {eb!r} (proven to give the same ids)")
    ra, rb = da["request"], db["request"]
    if ra.get("sha256") != rb.get("sha256"):
        sa, sb = short_digest(ra.get("sha256")), short_digest(rb.get("sha256"))
        notes.append(f"request bytes differ: sha256 {sa} vs {sb}")

    ids = _ids_summary(da, db)
    # The ids are compared first: a tokenizer-layer difference with equal ids is its own outcome, not a divergence
    # of what the model receives (the later layers are still compared: the tensors may differ).
    same_ids: Divergence | None = None
    for layer in LAYERS:
        found = compare_layer(layer, da, db)
        if found is None:
            continue
        if layer == "tokenizer" and ids["equal"]:
            same_ids = _same_ids(found, da, db, ids)
            continue
        if same_ids is not None:
            notes.append(same_ids.cause)
        return Diff(False, found, tuple(notes), kind=DIVERGED, ids=ids)
    if same_ids is not None:
        return Diff(False, same_ids, tuple(notes), kind=SAME_IDS, ids=ids)
    return Diff(True, None, tuple(notes), kind=IDENTICAL, ids=ids)


def _ids_summary(da: Mapping[str, Any], db: Mapping[str, Any]) -> dict[str, Any]:
    """{"equal", "a", "b", "first_difference"}: the id counts of both runs and the first index where they differ."""
    ia, ib = da.get("input_ids"), db.get("input_ids")
    na = len(ia) if isinstance(ia, list) else None
    nb = len(ib) if isinstance(ib, list) else None
    if na is None or nb is None:
        return {"equal": False, "a": na, "b": nb, "first_difference": None}
    first = next((k for k, (x, y) in enumerate(zip(ia, ib, strict=False)) if x != y), None)
    if first is None and na != nb:
        first = min(na, nb)
    return {"equal": first is None, "a": na, "b": nb, "first_difference": first}


def _same_ids(found: Divergence, da: Mapping[str, Any], db: Mapping[str, Any], ids: Mapping[str, Any]) -> Divergence:
    ka, kb = da.get("tokenizer") or {}, db.get("tokenizer") or {}
    cause = f"same ids ({ids['a']}/{ids['b']}), different tokenizer artifacts: "
    if (ka.get("sha256"), ka.get("format")) != (kb.get("sha256"), kb.get("format")):
        cause += (
            f"{ka.get('format')} sha256 {short_digest(ka.get('sha256'))} vs {kb.get('format')} sha256 "
            f"{short_digest(kb.get('sha256'))}"
        )
        cause += "; the model receives the same input ids for this request"
        pipeline = pipeline_difference(ka, kb)
        if pipeline is not None:
            cause += f", but {pipeline}, so other text may tokenize differently"
    else:
        cause += found.cause + "; the model receives the same input ids for this request"
        if pipeline_difference(ka, kb) is not None:
            cause += ", but other text may tokenize differently"
    return Divergence("tokenizer", found.location, found.a, found.b, cause)


def comparable(record: ExecutionRecord) -> dict[str, Any]:
    """The record without what names a place rather than a content (ids, origins, paths): used by replay."""
    d = record.data
    d["environment"] = None
    d["replay"]["model"] = None
    if d.get("template"):
        d["template"]["id"] = None
        d["template"]["origin"] = None
    return d
