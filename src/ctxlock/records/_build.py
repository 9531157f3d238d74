"""`build_record`: the record of one run (or of a failed one), section by section, and the options it records."""

from __future__ import annotations

import base64
import hashlib
import json
import platform
import sys
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ctxlock.accounting import unseen_warnings
from ctxlock.core import thaw
from ctxlock.errors import CtxlockError
from ctxlock.records._format import RECORD_FORMAT, ExecutionRecord, file_name_problem

# The name build_record gives a tokenizer file whose own name breaks the rule (the name is not part of its identity).
_FALLBACK_NAMES = {
    "gguf": "model.gguf",
    "tekken": "tekken.json",
    "tiktoken": "tokenizer.tiktoken",
    "sentencepiece": "tokenizer.model",
    "hf-tokenizers": "tokenizer.json",
}


def _safe_replay_spec(manifest: Mapping[str, Any], files: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The backend's replay spec, with a file whose own name breaks the rule (a GGUF saved as `模型.gguf`) renamed,
    so that every record ctxlock writes is one it will read back."""
    manifest, renamed = dict(manifest), {}
    for name, content in files.items():
        if file_name_problem(name) is not None:
            new = _FALLBACK_NAMES.get(str(manifest.get("format")), "tokenizer.bin")
            if manifest.get("file") == name:
                manifest["file"] = new
            name = new
        renamed[name] = content
    return manifest, renamed


def environment() -> dict[str, str]:
    # importlib.metadata costs ~15 ms to import: only a record being built pays it, not every `ctxlock render`.
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "absent"

    return {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": platform.platform(),
        "ctxlock": ver("ctxlock"),
        "tokenizers": ver("tokenizers"),
        "jinja2": ver("jinja2"),
        "tiktoken": ver("tiktoken"),
        "mistral_common": ver("mistral-common"),
        "unicodedata": unicodedata.unidata_version,
    }


@dataclass(frozen=True)
class RunOptions:
    """What the caller chose for one run; recorded so that replay runs the same way."""

    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    chat_template_kwargs: Mapping[str, Any] | None = None
    special_tokens: str = "text"
    now: str | None = None  # ISO 8601, or None: the wall clock at render time (recorded in `dynamic.now`)
    dialect: str | None = None
    utf8: str = "strict"
    tool_arguments: str = "parsed"  # string tool-call arguments: "parsed" (vLLM) or "as-sent" (transformers)
    template_name: str | None = None
    budget: Mapping[str, Any] | None = None  # a BudgetPolicy as a dict: the run was fitted with fit_context
    sampling: Mapping[str, Any] | None = None  # a SamplerConfig as a dict (processors and their order, seed)
    render_seed: int | None = None  # the template's random seed (None: 0), recorded in `dynamic.random.seed`
    content_format: str = "auto"  # content-part lists: "auto" (detected), "string" (text parts joined) or "openai"
    limits: Mapping[str, Any] | None = None  # RenderLimits.to_dict() when the caller changed them (None: defaults)
    # A compaction applied before the run: {"plan": CompactionPlan.to_dict(), "summary", "turn_prefix_summary"}.
    compaction: Mapping[str, Any] | None = None
    # A run with images (Model.run_images): {"preprocessor_config": {...}, "max_pixels": n, "animation": policy,
    # "media": {url: sha256 of the supplied bytes, kept in the store}}. None: a text run.
    images: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        # `limits`, `compaction` and `images` only when set: a run without them keeps the record it always had.
        extra = {"compaction": thaw(self.compaction)} if self.compaction else {}
        return (
            extra
            | ({"limits": dict(self.limits)} if self.limits else {})
            | ({"images": thaw(self.images)} if self.images else {})
            | {
                "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message,
                "chat_template_kwargs": dict(self.chat_template_kwargs) if self.chat_template_kwargs else None,
                "special_tokens": self.special_tokens,
                "now": self.now,
                "dialect": self.dialect,
                "utf8": self.utf8,
                "tool_arguments": self.tool_arguments,
                "template_name": self.template_name,
                "budget": dict(self.budget) if self.budget else None,
                "sampling": dict(self.sampling) if self.sampling else None,
                "render_seed": self.render_seed,
                "content_format": self.content_format,
            }
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunOptions:
        # A record made before `content_format` existed rendered content-part lists as sent: it replays that way.
        legacy = {} if "content_format" in d else {"content_format": "openai"}
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d}, **legacy)


def _hf_pipeline_fields(desc: Mapping[str, Any]) -> dict[str, Any]:
    if "tokenizer_class" not in desc and desc.get("truncation") is None and desc.get("padding") is None:
        return {}
    out: dict[str, Any] = {}
    if "tokenizer_class" in desc:
        out.update(
            tokenizer_class=desc.get("tokenizer_class"),
            tokenizer_pipeline=desc.get("pipeline"),  # "class" or "file" (the load option)
            class_overrides=sorted({d["component"] for d in desc.get("class_disagreements") or []}),
            file_sha256=desc.get("file_sha256"),
        )
    if isinstance(desc.get("built_from"), Mapping):  # no tokenizer.json: the slow files and how they were built
        out["built_from"] = dict(desc["built_from"])
    if desc.get("truncation") is not None or desc.get("padding") is not None:
        out["ignored_sections"] = {"truncation": desc.get("truncation"), "padding": desc.get("padding")}
    return out


def build_record(
    *,
    model: Any,
    request_bytes: bytes,
    options: RunOptions,
    run: Any | None = None,
    error: CtxlockError | None = None,
    template: Any | None = None,
    original: Any | None = None,
    decisions: Mapping[str, Any] | None = None,
    compaction: Mapping[str, Any] | None = None,
    multimodal: Any | None = None,
) -> ExecutionRecord:
    """Assemble the record of one run (or of a failed one: `run` None and `error` set). `original` is the request
    as received when the run saw a fitted or compacted one; `decisions` the budget's log; `compaction` the
    compaction decision (what was summarized, where the cut is), logged beside it in `decisions`; `multimodal` a
    run's `MultimodalInput` (its images, spans and expanded ids: what the model received)."""
    tok = model.tokenizer
    manifest, files = _safe_replay_spec(*tok.replay_spec())
    data: dict[str, Any] = {
        "format": RECORD_FORMAT,
        "request": {
            "bytes_b64": base64.b64encode(request_bytes).decode("ascii"),
            "sha256": hashlib.sha256(request_bytes).hexdigest(),
            "dialect": None,
            "utf8_policy": options.utf8,
            "replaced_bytes": [],
            "canonical": None,
            "extra": None,
        },
        "messages": None,
        "dynamic": None,
        "template": None,
        "rendered": None,
        "tokenizer": _tokenizer_section(model),
        "input_ids": None,
        "multimodal": None,
        "decisions": {"budget": None, "truncation": None, "multimodal": None},
        "tensors": None,
        "options": options.to_dict(),
        "errors": [error.to_dict()] if error is not None else [],
        "warnings": model_warnings(model),
        "model": _model_section(model),
        "environment": environment(),
        "replay": {
            "model": model.id,
            "tokenizer": manifest,
            "files": {name: _digest(content) for name, content in files.items()},
            "template_sha256": None,
        },
    }
    if template is not None:
        data["template"] = {**_template_section(template), "variables": None}
        data["replay"]["template_sha256"] = template.sha256
    if run is not None:
        _add_run(data, model, options, run, original, decisions)
        if compaction is not None:
            data["decisions"]["compaction"] = thaw(compaction)
    if multimodal is not None:
        _add_multimodal(data, model, multimodal)
    return ExecutionRecord.from_data(data)


def _add_multimodal(data: dict[str, Any], model: Any, mm: Any) -> None:
    """The image stage's values (every image's digest, decoder, policies, parameters, plan, pixel digest, span),
    and the expanded ids and tensors in place of the rendered text's: the input the model received."""
    data["multimodal"] = mm.to_json()
    data["input_ids"] = list(mm.ids)
    data["tokens"] = [model.tokenizer.id_to_token(i) for i in mm.ids]
    data["tensors"] = mm.model_input.to_dict()


def _tokenizer_section(model: Any) -> dict[str, Any]:
    tok = model.tokenizer
    tok_desc = tok.describe()
    return {
        "format": tok.format,
        "sha256": tok.sha256,
        "model": tok_desc.get("model"),
        "normalizer": tok_desc.get("normalizer"),
        "pre_tokenizer": tok_desc.get("pre_tokenizer"),
        # The normalizer and pre-tokenizer themselves (their settings too), so that diff can name one that differs.
        "pipeline": _pipeline_identity(tok, tok_desc),
        # Which engine encoded the runs (tiktoken fast path or `tokenizers`), and why: part of the identity.
        "engine": tok_desc.get("engine"),
        # HF directories: the transformers class whose pipeline was followed ("class") or the file as written
        # ("file"), the components where the two differ, and the digest of the file itself (sha256 above is
        # the pipeline that encoded). The file's truncation/padding are recorded as never applied.
        **_hf_pipeline_fields(tok_desc),
        "vocab_size": tok.vocab_size,
        "special_tokens": dict(model.special_tokens),
        "added_tokens": [[t.content, t.id, t.special] for t in sorted(tok.added_tokens, key=lambda t: t.id)],
    }


def _add_run(
    data: dict[str, Any],
    model: Any,
    options: RunOptions,
    run: Any,
    original: Any | None,
    decisions: Mapping[str, Any] | None,
) -> None:
    """Fill the sections a completed run has: the request as parsed, messages, dynamic values, template, text, ids."""
    req, rendered, tokenized, mi = run.request, run.rendered, run.tokenized, run.model_input
    if decisions is not None:
        data["decisions"]["budget"] = dict(decisions)
    source = original if original is not None else req
    data["request"].update(
        dialect=str(source.dialect),
        utf8_policy=str(source.utf8_policy),
        replaced_bytes=list(source.replaced_bytes),
        canonical=json.loads(source.to_json()),
        extra=thaw(source.extra),
    )
    if source.cache_control:  # Anthropic prompt-caching breakpoints: never rendered, kept for cache economics
        data["request"]["cache_control"] = [thaw(c) for c in source.cache_control]
    data["messages"] = req.template_messages()
    variables = thaw(rendered.variables)
    data["dynamic"] = _dynamic_section(model, req, rendered, variables)
    data["warnings"] += [thaw(w) for w in rendered.warnings] + unseen_warnings(req, rendered)
    if rendered.content_format:  # some message held a content-part list: how it reached the template
        data["decisions"]["content_format"] = {
            "option": options.content_format,
            "detected": rendered.content_format_detected,
            "used": rendered.content_format,
            "flattened": list(rendered.flattened),
        }
    t = rendered.template
    data["template"] = {**_template_section(t), "variables": variables}
    data["replay"]["template_sha256"] = t.sha256
    data["rendered"] = {
        "text": rendered.text,
        "sha256": hashlib.sha256(rendered.text.encode("utf-8")).hexdigest(),
        "request_spans": [[s.start, s.end, s.path] for s in rendered.request_spans],
        "provenance_exact": rendered.provenance_exact,
        "control_tokens": [[m.start, m.end, m.id] for m in tokenized.control],
        "neutralized": [[m.start, m.end, m.id] for m in tokenized.neutralized],
        "policy": str(rendered.policy),
    }
    data["input_ids"] = list(tokenized.ids)
    data["tokens"] = [model.tokenizer.id_to_token(i) for i in tokenized.ids]
    data["tensors"] = mi.to_dict()


def _dynamic_section(model: Any, req: Any, rendered: Any, variables: Mapping[str, Any]) -> dict[str, Any]:
    """What the run injected besides the messages: the clock, the template kwargs, tools, documents, randomness."""
    return {
        "now": rendered.now,
        "clock_used": rendered.clock_used,
        "chat_template_kwargs": {
            k: v
            for k, v in variables.items()
            if k not in model.special_tokens and k not in ("add_generation_prompt", "continue_final_message")
        },
        "tools": req.template_tools(),
        "documents": req.template_documents(),
        "clock_zone": rendered.clock_zone or None,
        # The template's one random generator: its seed and every draw (what, template line, choice), so that
        # replay, given the seed, draws the same.
        "random": {"seed": rendered.seed, "draws": [thaw(d) for d in rendered.draws]},
    }


def _model_section(model: Any) -> dict[str, Any]:
    hub = getattr(model.artifacts, "hub", None)
    return {"id": model.id, "source": model.artifacts.source, "hub": hub.to_dict() if hub is not None else None}


def model_warnings(model: Any) -> list[dict[str, Any]]:
    """What a run on this model must say whatever the request: a rolling hub revision, and an HF tokenizer whose
    ids may differ from AutoTokenizer's (a class ctxlock does not model)."""
    out: list[dict[str, Any]] = []
    hub = getattr(model.artifacts, "hub", None)
    message = hub.warning() if hub is not None else None
    if message is not None:
        out.append({"kind": "rolling_revision", "message": message, "path": f"model {hub.repo_id}@{hub.revision}"})
    tok = model.artifacts.describe().get("tokenizer") or {}
    for note in tok.get("pipeline_departures") or ():
        out.append({"kind": "tokenizer_class_not_modeled", "message": note, "path": str(tok.get("id") or "tokenizer")})
    return out


def _template_section(t: Any) -> dict[str, Any]:
    # `sha256` is of the rendered source; a template read from a file also has the digest of the file's bytes and
    # its line endings (a CRLF file is read as LF, as transformers reads it). Both are null for other templates.
    return {
        "id": t.id,
        "sha256": t.sha256,
        "origin": t.origin,
        "file_sha256": getattr(t, "file_sha256", "") or None,
        "line_endings": getattr(t, "line_endings", "") or None,
    }


def _pipeline_identity(tok: Any, desc: Mapping[str, Any]) -> dict[str, Any]:
    """{"normalizer", "pre_tokenizer"}: their JSON where the backend has one (`tokenizers`), else as described."""
    pipeline = tok.pipeline
    if callable(pipeline):
        return dict(pipeline())
    return {"normalizer": desc.get("normalizer"), "pre_tokenizer": desc.get("pre_tokenizer")}


def _digest(content: Any) -> str:
    if isinstance(content, bytes):
        return hashlib.sha256(content).hexdigest()
    h = hashlib.sha256()
    with open(content, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
