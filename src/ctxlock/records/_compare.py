"""One comparer per layer of a record: where two records first differ inside that layer, and the likely cause.

`COMPARERS` maps each layer (in `LAYERS`, the pipeline's order) to a `Comparer`: the record sections it reads and a
function `(a, b) -> Divergence | None` over two records' parsed data. `diff` (diff.py) walks them in order. The
sections no comparer reads are `NOT_COMPARED`, each with the reason; a test checks that the two cover every
section `build_record` writes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ctxlock.records._imagediff import compare_images, mask_images


@dataclass(frozen=True)
class Divergence:
    layer: str
    location: str
    a: Any
    b: Any
    cause: str

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "location": self.location, "a": self.a, "b": self.b, "cause": self.cause}


@dataclass(frozen=True)
class Comparer:
    """How one layer is compared: the record sections it reads, and the function that compares them."""

    layer: str
    reads: tuple[str, ...]
    compare: Callable[[Mapping[str, Any], Mapping[str, Any]], Divergence | None]


def short_digest(sha: Any) -> str:
    return f"{sha[:4]}…" if isinstance(sha, str) else repr(sha)


def first_json_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first path where two JSON values differ, comparing objects by key (order-insensitive)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return sub, a.get(key, "<absent>"), b.get(key, "<absent>")
            found = first_json_difference(a[key], b[key], sub)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_json_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path}[{min(len(a), len(b))}]", f"length {len(a)}", f"length {len(b)}"
        return None
    if type(a) is not type(b) or a != b:
        return path or "$", a, b
    return None


def _text_location(a: str, b: str) -> tuple[str, str, str, str]:
    """Byte offset of the first difference in UTF-8, with context, and the differing pieces."""
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    offset = len(a[:i].encode("utf-8"))
    # The smallest edit after which the texts agree again (for 8 characters), plus one shared character,
    # so that a changed line ending reads '\n' vs '\r\n' rather than '' vs '\r'.
    cause_a, cause_b = a[i : i + 1], b[i : i + 1]
    for total in range(1, 9):
        hit = next(
            (
                (ka, total - ka)
                for ka in range(total + 1)
                if a[i + ka : i + ka + 8] == b[i + total - ka : i + total - ka + 8]
            ),
            None,
        )
        if hit:
            ka, kb = hit
            cause_a, cause_b = a[i : i + ka + 1], b[i : i + kb + 1]
            break
    context = a[max(0, i - 20) : i]
    location = f"byte {offset:,} (character {i:,}), after {context!r}: {a[i : i + 12]!r} vs {b[i : i + 12]!r}"
    return location, cause_a, cause_b, f"{offset:,}"


def _table(k: Mapping[str, Any]) -> tuple[Any, ...]:
    """What two tokenizers of one vocabulary share, whatever their file format: the vocabulary size and the special
    tokens (a GGUF lists only those as added tokens; an HF directory saved from it lists its padding pieces too)."""
    added = k.get("added_tokens") if isinstance(k.get("added_tokens"), list) else []
    special = sorted(tuple(t[:2]) for t in added if isinstance(t, list) and len(t) == 3 and t[2] is True)
    return k.get("vocab_size"), special


def _pipeline_of(k: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    # A record made before `pipeline` was recorded has only the component types: compare like with like.
    if isinstance(k.get("pipeline"), dict) and isinstance(other.get("pipeline"), dict):
        return k["pipeline"]
    return {"normalizer": k.get("normalizer"), "pre_tokenizer": k.get("pre_tokenizer")}


def _component(value: Any) -> str:
    """A normalizer or pre-tokenizer in a few words: `none`, `NFC`, `Sequence[Prepend, Replace]`."""
    if value is None:
        return "none"
    if isinstance(value, dict):
        kind = str(value.get("type"))
        inner = value.get("normalizers") or value.get("pretokenizers")
        if kind == "Sequence" and isinstance(inner, list):
            return f"Sequence[{', '.join(_component(x) for x in inner)}]"
        return kind
    return str(value)


# Settings that change the offsets a tokenizer reports, never its ids (tokenizers' ByteLevel `trim_offsets`).
_OFFSETS_ONLY = frozenset({"trim_offsets"})


def _ids_relevant(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _ids_relevant(v) for k, v in value.items() if k not in _OFFSETS_ONLY}
    if isinstance(value, list):
        return [_ids_relevant(v) for v in value]
    return value


def pipeline_difference(ka: Mapping[str, Any], kb: Mapping[str, Any]) -> str | None:
    """'the normalizer differs: NFC vs none', or None when the recorded normalizer and pre-tokenizer agree (on every
    setting that can change an id)."""
    pa, pb = _pipeline_of(ka, kb), _pipeline_of(kb, ka)
    for part, name in (("normalizer", "normalizer"), ("pre_tokenizer", "pre-tokenizer")):
        x, y = _ids_relevant(pa.get(part)), _ids_relevant(pb.get(part))
        if x == y:
            continue
        sx, sy = _component(x), _component(y)
        if sx == sy:
            found = first_json_difference(x, y)
            where = f" (at {found[0]})" if found and found[0] != "$" else ""
            return f"the {name} differs in its settings{where}: {sx} in both, configured differently"
        return f"the {name} differs: {sx} vs {sy}"
    return None


def _errors_at(d: Mapping[str, Any], kinds: tuple[str, ...]) -> dict[str, Any] | None:
    return next((e for e in d.get("errors") or [] if e.get("type") in kinds), None)


_REQUEST_ERRORS = ("RequestEncodingError", "RequestJSONError", "RequestValidationError")


def _compare_request(da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    """The request as decoded: the UTF-8 policy's outcome, a rejection, then the canonical request."""
    ra, rb = da["request"], db["request"]
    ea, eb = _errors_at(da, _REQUEST_ERRORS), _errors_at(db, _REQUEST_ERRORS)
    if (ra["utf8_policy"], ra["replaced_bytes"]) != (rb["utf8_policy"], rb["replaced_bytes"]) or (ea is None) != (
        eb is None
    ):

        def state(r: Mapping[str, Any], e: Mapping[str, Any] | None) -> str:
            if e is not None:
                return f"{r['utf8_policy']}: rejected ({e['type']} at {e.get('path')})"
            if r["replaced_bytes"]:
                return f"{r['utf8_policy']}: replaced bytes at {r['replaced_bytes']}"
            return f"{r['utf8_policy']}: decoded cleanly"

        replaced = ra["replaced_bytes"] or rb["replaced_bytes"] or ["?"]
        where = ea.get("path") if ea else eb.get("path") if eb else f"byte {replaced[0]}"
        return Divergence(
            "request",
            str(where),
            state(ra, ea),
            state(rb, eb),
            f"the UTF-8 policy differs ({ra['utf8_policy']} vs {rb['utf8_policy']}): the same bytes became "
            "different strings (or none)",
        )
    if ea != eb:
        where = str((ea or eb or {}).get("path"))
        return Divergence("request", where, ea, eb, "the request was rejected differently")
    ca, cb = ra.get("canonical"), rb.get("canonical")
    if _both_have_images(da, db) and isinstance(ca, Mapping) and isinstance(cb, Mapping):
        ca, cb = dict(ca, messages=mask_images(ca.get("messages"))), dict(cb, messages=mask_images(cb.get("messages")))
    found = first_json_difference(ca, cb)
    if found:
        return Divergence("request", found[0], found[1], found[2], f"the canonical request differs at {found[0]}")
    return None


def _both_have_images(da: Mapping[str, Any], db: Mapping[str, Any]) -> bool:
    return isinstance(da.get("multimodal"), Mapping) and isinstance(db.get("multimodal"), Mapping)


def _compare_policy(da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    """The context policy's decisions (budget, truncation, content format), then the sampler config."""
    found = first_json_difference(da.get("decisions"), db.get("decisions"))
    if found:
        where = f"decisions.{found[0]}"
        return Divergence("policy", where, found[1], found[2], "a context-policy decision differs")
    sa = (da.get("options") or {}).get("sampling")
    sb = (db.get("options") or {}).get("sampling")
    found = first_json_difference(sa, sb)
    if found:
        what = "the sampler's processor order" if found[0].startswith("order") else "the sampler config"
        where = "options.sampling" + ("" if found[0] == "$" else f".{found[0]}")
        return Divergence("policy", where, found[1], found[2], f"{what} differs")
    return None


def _compare_messages(da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    """The messages the template sees (after the context policy); image bytes are the multimodal layer's."""
    ma, mb = da.get("messages"), db.get("messages")
    if _both_have_images(da, db):
        ma, mb = mask_images(ma), mask_images(mb)
    found = first_json_difference(ma, mb)
    if found:
        return Divergence(
            "messages", f"messages{found[0]}", found[1], found[2], "the messages the template sees differ"
        )
    return None


def _compare_dynamic(da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    """What was injected besides the messages: the clock (when the template read it), kwargs, tools, ..."""
    xa, xb = da.get("dynamic") or {}, db.get("dynamic") or {}
    clock_matters = xa.get("clock_used") or xb.get("clock_used")
    if clock_matters and xa.get("now") != xb.get("now"):
        return Divergence(
            "dynamic",
            "dynamic.now",
            xa.get("now"),
            xb.get("now"),
            f"the injected clock changed ({xa.get('now')} vs {xb.get('now')}) and the template reads it (strftime_now)",
        )
    for key in ("chat_template_kwargs", "tools", "documents", "random", "random_ids"):
        found = first_json_difference(xa.get(key), xb.get(key))
        if found:
            path = f"dynamic.{key}" + (f".{found[0]}" if found[0] != "$" else "")
            return Divergence("dynamic", path, found[1], found[2], f"the injected {key} differ")
    return None


def _compare_template(da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    """The template's digest, then its variables (special-token variables belong to the tokenizer layer)."""
    ta, tb = da.get("template") or {}, db.get("template") or {}
    if ta.get("sha256") != tb.get("sha256"):
        same_id = ta.get("id") == tb.get("id")
        return Divergence(
            "template",
            f"template {ta.get('id')!r}" + ("" if same_id else f" vs {tb.get('id')!r}"),
            ta.get("sha256"),
            tb.get("sha256"),
            f"template sha256 differs: {short_digest(ta.get('sha256'))} vs {short_digest(tb.get('sha256'))}"
            + ("; the same template id now points to another version" if same_id else ""),
        )
    # Special-token variables come with the tokenizer config and are compared at the tokenizer layer; if they
    # changed the text, the rendered layer (before it) says so first.
    special = set((da.get("tokenizer") or {}).get("special_tokens") or {}) | set(
        (db.get("tokenizer") or {}).get("special_tokens") or {}
    )
    va = {k: v for k, v in (ta.get("variables") or {}).items() if k not in special}
    vb = {k: v for k, v in (tb.get("variables") or {}).items() if k not in special}
    found = first_json_difference(va, vb)
    if found:
        return Divergence("template", f"variables.{found[0]}", found[1], found[2], "a template variable differs")
    return None


def _compare_rendered(da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    """The rendered text: the byte offset of the first difference and the smallest differing piece."""
    xa, xb = (da.get("rendered") or {}).get("text"), (db.get("rendered") or {}).get("text")
    if xa == xb:
        return None
    if xa is None or xb is None:
        return Divergence("rendered", "text", xa, xb, "only one run rendered")
    location, ca, cb, offset = _text_location(xa, xb)
    return Divergence("rendered", location, ca, cb, f"rendered bytes first differ at offset {offset}: {ca!r} vs {cb!r}")


def _compare_tokenizer(da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    """The tokenizer's artifacts: its digest and format, its normalizer and pre-tokenizer, its special tokens."""
    ka, kb = da.get("tokenizer") or {}, db.get("tokenizer") or {}
    pipeline = pipeline_difference(ka, kb)
    where = f"tokenizer ({ka.get('format')} vs {kb.get('format')})"
    digests = f"sha256 {short_digest(ka.get('sha256'))} vs {short_digest(kb.get('sha256'))}"
    same_table = _table(ka) == _table(kb)
    if (ka.get("sha256"), ka.get("format")) != (kb.get("sha256"), kb.get("format")):
        if pipeline is not None and same_table:
            # The same vocabulary size and special tokens: the normalizer (or pre-tokenizer) is the likely cause.
            cause = f"{pipeline} (tokenizer {digests}, the same vocabulary size and special tokens)"
        else:
            cause = f"a different tokenizer vocabulary: {digests}; the same ids would mean different text"
            cause += f"; also, {pipeline}" if pipeline is not None else ""
        return Divergence("tokenizer", where, ka.get("sha256"), kb.get("sha256"), cause)
    if pipeline is not None:
        return Divergence(
            "tokenizer",
            f"{where}: pipeline",
            _pipeline_of(ka, kb),
            _pipeline_of(kb, ka),
            f"the same tokenizer file ({digests}), but {pipeline}: ctxlock built it differently (compare the "
            "environments' ctxlock versions)",
        )
    found = first_json_difference(ka.get("special_tokens"), kb.get("special_tokens"))
    if found:
        return Divergence("tokenizer", f"special_tokens.{found[0]}", found[1], found[2], "special tokens differ")
    return None


def _compare_input_ids(da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    """The ids: the first index where they differ, with the pieces."""
    ia, ib = da.get("input_ids"), db.get("input_ids")
    if ia == ib:
        return None
    if ia is None or ib is None:
        return Divergence("input_ids", "input_ids", ia, ib, "only one run produced ids")
    i = next((k for k, (x, y) in enumerate(zip(ia, ib, strict=False)) if x != y), min(len(ia), len(ib)))
    pa, pb = (da.get("tokens") or [None] * len(ia)), (db.get("tokens") or [None] * len(ib))
    piece_a = pa[i] if i < len(pa) else None
    piece_b = pb[i] if i < len(pb) else None
    return Divergence(
        "input_ids",
        f"token {i} of {len(ia)} vs {len(ib)}",
        {"id": ia[i] if i < len(ia) else None, "piece": piece_a},
        {"id": ib[i] if i < len(ib) else None, "piece": piece_b},
        f"ids first differ at token {i}: {piece_a!r} vs {piece_b!r}",
    )


def _compare_tensors(da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    """The tensors the ids reach the model as (padding, positions, attention mask)."""
    found = first_json_difference(da.get("tensors"), db.get("tensors"))
    if found:
        return Divergence(
            "tensors",
            found[0],
            found[1],
            found[2],
            f"the same ids reach the model with different {found[0].split('[')[0]}: padding or positions "
            "are misaligned",
        )
    return None


def _compare_multimodal(da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    """The image stage: each image's bytes, orientation, parameters, decoder, plan, pixel digest; the spans."""
    found = compare_images(da.get("multimodal"), db.get("multimodal"))
    if found:
        return Divergence("multimodal", *found)
    return None


# Each layer's comparer, in LAYERS order (the pipeline's): `diff` reports the first layer whose comparer finds a
# difference. `reads` names the record sections the comparer reads (tests/records/test_record_compare.py checks
# coverage).
COMPARERS: dict[str, Comparer] = {
    c.layer: c
    for c in (
        Comparer("request", ("request", "errors"), _compare_request),
        Comparer("policy", ("decisions", "options"), _compare_policy),
        Comparer("messages", ("messages",), _compare_messages),
        Comparer("dynamic", ("dynamic",), _compare_dynamic),
        Comparer("template", ("template", "tokenizer"), _compare_template),
        Comparer("rendered", ("rendered",), _compare_rendered),
        Comparer("tokenizer", ("tokenizer",), _compare_tokenizer),
        Comparer("multimodal", ("multimodal",), _compare_multimodal),
        Comparer("input_ids", ("input_ids", "tokens"), _compare_input_ids),
        Comparer("tensors", ("tensors",), _compare_tensors),
    )
}

# The record sections no comparer reads, and why: they say where or how a run happened, not what the model received.
NOT_COMPARED = {
    "format": "the record format: a format-1 record's missing parts read as null",
    "environment": "the Python and library versions: reported as a note by diff, never a divergence",
    "replay": "where replay finds the artifacts (their digests are compared in the template and tokenizer layers)",
    "warnings": "what the run had to say (a rolling hub revision, an unmodeled tokenizer class)",
    "model": "the model's id, source and hub revision: names, not content",
}


def compare_layer(layer: str, da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    """The first difference of two records' parsed data within `layer`, or None."""
    return COMPARERS[layer].compare(da, db)
