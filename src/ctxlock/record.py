"""Record stage: the minimum reproduction package of seed 000 §1.11, canonical serialization, and diff.

An `ExecutionRecord` holds every versioned thing that shaped one model input, in the pipeline's order:

    request -> policy -> messages -> dynamic -> template -> rendered -> tokenizer -> input_ids -> tensors

plus the options the caller chose, the errors met, the environment, and what replay needs to rebuild the model
(`replay`: a tokenizer manifest and the digests of the files it names, kept in the artifact store).

Serialization is canonical: keys sorted, no whitespace, UTF-8, LF-terminated, no NaN; ids are integers. The
record id is the sha256 of those bytes, so the same record always has the same id, whatever dict order built it.
Key order inside the request is data (a template may render tool schemas in the order the client sent them): the
request's exact bytes are kept (base64) for replay, while the comparable views are order-insensitive, so a
different key order shows up where it matters, in the rendered bytes (seed 000 §1.4).

`diff(a, b)` names the first layer where two records diverge, the location inside it, and the likely cause.

A record is data, never a set of instructions: its `replay` section names the files replay writes into a fresh
private directory, so every name is checked when a record is parsed (`check_replay`). A name is one plain file name
of a flat model directory (see `check_file_name`), not `ctxlock.json` or `chat_template.jinja` (replay writes those
itself), every digest is 64 lowercase hex digits, and the tokenizer manifest holds only the keys its format's
`replay_spec()` writes, naming exactly the files listed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import platform
import re
import sys
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from .errors import CtxlockError, RecordFormatError
from .frozen import thaw

RECORD_FORMAT = "ctxlock.record/2"
# Format 2 adds: `model` (the spec's id, source and hub revision), `warnings`, the clock's zone and the render
# seed with the template's draws in `dynamic` (in place of the always-empty `random_ids`), and the template file's
# byte digest and line endings. A format-1 record is still read (its missing parts are null).
READABLE_FORMATS = ("ctxlock.record/1", RECORD_FORMAT)
# The context policy decides which messages the template sees, so its layer comes right after the request.
LAYERS = ("request", "policy", "messages", "dynamic", "template", "rendered", "tokenizer", "input_ids", "tensors")
_SECTIONS = (
    "format",
    "request",
    "messages",
    "dynamic",
    "template",
    "rendered",
    "tokenizer",
    "input_ids",
    "decisions",
    "tensors",
    "options",
    "errors",
    "environment",
    "replay",
)


# The two files replay writes itself next to the recorded ones; a record may not name them.
REPLAY_MANIFEST = "ctxlock.json"
REPLAY_TEMPLATE = "chat_template.jinja"

# The file-name rule: one path component of portable ASCII (no separator, drive, NUL or look-alike), starting with a
# letter, digit or underscore (so never `.`, `..` or a hidden file), not ending in a dot or space (Windows drops
# them), at most 255 bytes (the usual NAME_MAX). Every name the tokenizer backends record passes it (tokenizer.json,
# tokenizer.model.v3, tekken_240911.json, qwen.tiktoken, ggml-vocab-llama-spm.gguf, "Llama 3 8B (1).gguf").
MAX_FILE_NAME_BYTES = 255
_FILE_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.+\-@=,~ ()\[\]]*[A-Za-z0-9_+\-@=,~()\[\]])?")
_FILE_NAME_CHARS = "letters, digits, spaces and _ . + - @ = , ~ ( ) [ ]"
# Windows opens a device, not a file, for these names (with any extension).
_WINDOWS_DEVICE = re.compile(r"(con|prn|aux|nul|com[0-9]|lpt[0-9]|conin\$|conout\$)(\..*)?", re.IGNORECASE)
# Each backend's replay_spec() writes one file at most; a record naming dozens was not written by ctxlock.
MAX_REPLAY_FILES = 16
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The keys each format's replay_spec() writes: anything else (a `package` resource, a `preset`) would make replay
# read something other than the stored artifacts.
_TOKENIZER_KEYS: dict[str, frozenset[str]] = {
    "book": frozenset({"format", "vocab", "control", "unk"}),
    "hf-tokenizers": frozenset({"format", "file"}),
    "gguf": frozenset({"format", "file"}),
    "tekken": frozenset({"format", "file"}),
    "tiktoken": frozenset({"format", "file", "pattern", "special_tokens", "normalizer"}),
    "sentencepiece": frozenset({"format", "file", "control"}),
}
_REPLAY_KEYS = frozenset({"model", "tokenizer", "files", "template_sha256"})
# The name build_record gives a tokenizer file whose own name breaks the rule (the name is not part of its identity).
_FALLBACK_NAMES = {
    "gguf": "model.gguf",
    "tekken": "tekken.json",
    "tiktoken": "tokenizer.tiktoken",
    "sentencepiece": "tokenizer.model",
    "hf-tokenizers": "tokenizer.json",
}
_BAD_RECORD = "the record was altered or was not written by ctxlock; export it again from the store that recorded it"


def canonical_bytes(value: Any) -> bytes:
    """The one byte form of a JSON value: sorted keys, compact, UTF-8, LF-terminated, NaN refused."""
    try:
        text = json.dumps(thaw(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise RecordFormatError(f"a record cannot hold {exc}", path="record") from None
    except RecursionError:
        raise RecordFormatError("a record nests too deeply to serialize", path="record") from None
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecordFormatError(
            f"a record cannot hold a lone surrogate ({text[exc.start : exc.end]!r} at character {exc.start}): it is "
            "not UTF-8",
            path="record",
            hint="records hold UTF-8 text; this one was not written by ctxlock",
        ) from None


def _shown(name: str) -> str:
    """A name as one line of ASCII (escapes show look-alikes and control characters), cut when very long."""
    text = json.dumps(name)
    return text if len(text) <= 160 else text[:120] + "…" + f" ({len(name.encode('utf-8', 'surrogatepass'))} bytes)"


def _file_name_problem(name: Any) -> str | None:
    """Why `name` is not a plain file name of a model directory, or None when it is one."""
    if not isinstance(name, str):
        return f"a file name is a string, not {type(name).__name__}"
    if not name:
        return "the name is empty"
    if "\x00" in name:
        return "it holds a NUL character"
    if name in (".", ".."):
        return "it names a directory, not a file"
    if "/" in name or "\\" in name:
        return "it holds a path separator; a record names files of one flat directory"
    if ":" in name:
        return "it holds a drive or stream separator (:)"
    odd = next((c for c in name if not c.isascii() or not c.isprintable()), None)
    if odd is not None:
        return f"it holds U+{ord(odd):04X}, outside the portable ASCII file-name characters"
    if len(name.encode("ascii")) > MAX_FILE_NAME_BYTES:
        return f"it is {len(name)} bytes long, over the {MAX_FILE_NAME_BYTES}-byte limit of a file name"
    if name.startswith("."):
        return "it starts with a dot (a hidden file, or a relative path)"
    if not _FILE_NAME.fullmatch(name):
        return f"a file name uses {_FILE_NAME_CHARS}, and does not end in a dot or space"
    if _WINDOWS_DEVICE.fullmatch(name):
        return "it is a Windows device name"
    if name.lower() in (REPLAY_MANIFEST, REPLAY_TEMPLATE):
        return f"replay writes {name.lower()} itself"
    return None


def check_file_name(name: Any, *, path: str) -> str:
    """`name` if it is one plain file name a model directory can hold, else a RecordFormatError naming `path`."""
    problem = _file_name_problem(name)
    if problem is not None:
        shown = _shown(name) if isinstance(name, str) else repr(type(name).__name__)
        raise RecordFormatError(f"bad file name {shown}: {problem}", path=path, hint=_BAD_RECORD)
    return name


def _check_sha256(value: Any, *, path: str) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        shown = _shown(value) if isinstance(value, str) else type(value).__name__
        raise RecordFormatError(f"not a sha256 digest (64 lowercase hex digits): {shown}", path=path, hint=_BAD_RECORD)
    return value


def _check_strings(value: Any, *, path: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecordFormatError("must be a list of strings", path=path, hint=_BAD_RECORD)
    return value


def check_replay(replay: Any, *, source: str = "record") -> None:
    """Check a record's `replay` section before anything is written from it (see the module docstring)."""
    where = f"{source}:replay"
    if not isinstance(replay, dict):
        raise RecordFormatError("the replay section must be an object", path=where, hint=_BAD_RECORD)
    unknown = sorted(set(replay) - _REPLAY_KEYS)
    missing = sorted(_REPLAY_KEYS - set(replay))
    if unknown or missing:
        what = f"unknown key {unknown[0]!r}" if unknown else f"missing key {missing[0]!r}"
        raise RecordFormatError(f"the replay section has a {what}", path=where, hint=f"it holds {sorted(_REPLAY_KEYS)}")
    if replay["model"] is not None and not isinstance(replay["model"], str):
        raise RecordFormatError("must be a string or null", path=f"{where}.model", hint=_BAD_RECORD)
    if replay["template_sha256"] is not None:
        _check_sha256(replay["template_sha256"], path=f"{where}.template_sha256")
    files = replay["files"]
    if not isinstance(files, dict):
        raise RecordFormatError("must be an object of file name -> sha256", path=f"{where}.files", hint=_BAD_RECORD)
    if len(files) > MAX_REPLAY_FILES:
        raise RecordFormatError(
            f"names {len(files)} files; a tokenizer needs at most {MAX_REPLAY_FILES}",
            path=f"{where}.files",
            hint=_BAD_RECORD,
        )
    folded: dict[str, str] = {}
    for name, sha in files.items():
        at = f"{where}.files[{_shown(name)}]"
        check_file_name(name, path=at)
        _check_sha256(sha, path=at)
        # On a case-insensitive filesystem (macOS, Windows) two such names are one file.
        other = folded.setdefault(name.lower(), name)
        if other != name:
            raise RecordFormatError(
                f"names the same file as {_shown(other)} on a case-insensitive disk", path=at, hint=_BAD_RECORD
            )
    _check_tokenizer_manifest(replay["tokenizer"], files, where=f"{where}.tokenizer")


def _check_tokenizer_manifest(spec: Any, files: Mapping[str, str], *, where: str) -> None:
    if not isinstance(spec, dict):
        raise RecordFormatError("the tokenizer manifest must be an object", path=where, hint=_BAD_RECORD)
    fmt = spec.get("format")
    if not isinstance(fmt, str) or fmt not in _TOKENIZER_KEYS:
        raise RecordFormatError(
            f"unknown tokenizer format {fmt!r}", path=f"{where}.format", hint=f"replay knows {sorted(_TOKENIZER_KEYS)}"
        )
    unknown = sorted(set(spec) - _TOKENIZER_KEYS[fmt])
    if unknown:
        raise RecordFormatError(
            f"a recorded {fmt} manifest has no key {unknown[0]!r}",
            path=f"{where}.{unknown[0]}",
            hint=f"replay reads only the stored artifacts; a {fmt} manifest holds {sorted(_TOKENIZER_KEYS[fmt])}",
        )
    named: set[str] = set()
    if "file" in _TOKENIZER_KEYS[fmt]:
        named.add(check_file_name(spec.get("file"), path=f"{where}.file"))
    if named != set(files):
        extra = sorted(set(files) - named)
        lacking = sorted(named - set(files))
        what = f"lists {_shown(extra[0])}, which its tokenizer does not read" if extra else ""
        what = what or f"lacks {_shown(lacking[0])}, which its tokenizer reads"
        raise RecordFormatError(f"replay.files {what}", path=f"{where}.file", hint=_BAD_RECORD)
    if fmt == "book":
        vocab = _check_strings(spec.get("vocab"), path=f"{where}.vocab")
        known = set(vocab)
        if not all(c in known for c in _check_strings(spec.get("control"), path=f"{where}.control")):
            raise RecordFormatError("every control token must be in the vocab", path=f"{where}.control")
        if not isinstance(spec.get("unk"), str) or spec["unk"] not in known:
            raise RecordFormatError("the unk token must be in the vocab", path=f"{where}.unk")
    elif fmt == "sentencepiece" and "control" in spec:
        _check_strings(spec["control"], path=f"{where}.control")
    elif fmt == "tiktoken":
        if not isinstance(spec.get("pattern"), str):
            raise RecordFormatError("the split pattern must be a string", path=f"{where}.pattern")
        specials = spec.get("special_tokens", {})
        if not isinstance(specials, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in specials.values()
        ):
            raise RecordFormatError("special_tokens must map strings to ids", path=f"{where}.special_tokens")
        if spec.get("normalizer") is not None and not isinstance(spec["normalizer"], str):
            raise RecordFormatError("normalizer must be a string or null", path=f"{where}.normalizer")


def _safe_replay_spec(manifest: Mapping[str, Any], files: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The backend's replay spec, with a file whose own name breaks the rule (a GGUF saved as `模型.gguf`) renamed,
    so that every record ctxlock writes is one it will read back."""
    manifest, renamed = dict(manifest), {}
    for name, content in files.items():
        if _file_name_problem(name) is not None:
            new = _FALLBACK_NAMES.get(str(manifest.get("format")), "tokenizer.bin")
            if manifest.get("file") == name:
                manifest["file"] = new
            name = new
        renamed[name] = content
    return manifest, renamed


@dataclass(frozen=True)
class ExecutionRecord:
    """A record is its canonical bytes; `data` is the parsed view."""

    body: bytes = field(repr=False)

    @property
    def id(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    @property
    def data(self) -> dict[str, Any]:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"ExecutionRecord({self.id[:12]}…, {len(self.body):,} bytes)"

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ExecutionRecord:
        """A record from its parsed form; its replay section, when there is one, is checked as in `from_bytes`."""
        if "replay" in data:
            check_replay(data["replay"])
        return cls(canonical_bytes(data))

    @classmethod
    def from_bytes(cls, raw: bytes, *, source: str = "record") -> ExecutionRecord:
        """Parse and check a record from a file or the store; anything corrupt is a RecordFormatError."""
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise RecordFormatError(
                f"not UTF-8 at byte {exc.start}", path=source, hint="the record file is corrupt"
            ) from None
        except json.JSONDecodeError as exc:
            raise RecordFormatError(
                f"not a complete JSON record: {exc.msg} at byte {exc.pos}",
                path=source,
                hint="the record file is truncated or corrupt; export it again",
            ) from None
        except RecursionError:
            raise RecordFormatError("the JSON nests too deeply to be a record", path=source, hint=_BAD_RECORD) from None
        except ValueError as exc:  # an integer of more than 4,300 digits: Python refuses to convert it
            raise RecordFormatError(f"not a record: {exc}", path=source, hint=_BAD_RECORD) from None
        if not isinstance(data, dict):
            raise RecordFormatError("a record is a JSON object", path=source)
        if data.get("format") not in READABLE_FORMATS:
            raise RecordFormatError(
                f"unknown record format {data.get('format')!r}",
                path=f"{source}:format",
                hint=f"this ctxlock reads {' and '.join(READABLE_FORMATS)}",
            )
        missing = [s for s in _SECTIONS if s not in data]
        if missing:
            raise RecordFormatError(f"record lacks {', '.join(missing)}", path=source)
        for section in ("request", "options"):
            if not isinstance(data[section], dict):
                raise RecordFormatError(f"the {section} section must be an object", path=f"{source}:{section}")
        check_replay(data["replay"], source=source)
        return cls(canonical_bytes(data))

    def index(self) -> dict[str, Any]:
        """The fields a store indexes records by."""
        d = self.data
        ids = d.get("input_ids")

        def field(section: str, key: str) -> Any:  # a section that is not an object indexes as unknown
            value = d.get(section)
            return value.get(key) if isinstance(value, dict) else None

        return {
            "format": d["format"],
            "model": field("replay", "model"),
            "template_sha256": field("template", "sha256"),
            "tokenizer_sha256": field("tokenizer", "sha256"),
            "input_tokens": len(ids) if isinstance(ids, list) else None,
        }


def environment() -> dict[str, str]:
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

    def to_dict(self) -> dict[str, Any]:
        # `limits` only when set: a run with the default limits keeps the record it always had.
        return ({"limits": dict(self.limits)} if self.limits else {}) | {
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
) -> ExecutionRecord:
    """Assemble the record of one run (or of a failed one: `run` None and `error` set). `original` is the request
    as received when the run saw a fitted one; `decisions` the budget's log."""
    tok = model.tokenizer
    manifest, files = _safe_replay_spec(*tok.replay_spec())
    tok_desc = tok.describe()
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
        "tokenizer": {
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
        },
        "input_ids": None,
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
    if run is None:
        return ExecutionRecord.from_data(data)

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
    data["messages"] = req.template_messages()
    variables = thaw(rendered.variables)
    data["dynamic"] = {
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
    data["warnings"] += [thaw(w) for w in rendered.warnings]
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
    data["tokens"] = [tok.id_to_token(i) for i in tokenized.ids]
    data["tensors"] = mi.to_dict()
    return ExecutionRecord.from_data(data)


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


# ---------------------------------------------------------------------------------------------------------------
# diff


@dataclass(frozen=True)
class Divergence:
    layer: str
    location: str
    a: Any
    b: Any
    cause: str

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "location": self.location, "a": self.a, "b": self.b, "cause": self.cause}


# The outcomes of a diff (`Diff.kind`), each with its own exit code on the command line (0, 1, 3).
IDENTICAL = "identical"
DIVERGED = "diverged"
SAME_IDS = "same_ids_different_tokenizer"  # the tokenizer layer differs, and the ids (and tensors) are equal


@dataclass(frozen=True)
class Diff:
    """`kind` is IDENTICAL, DIVERGED, or SAME_IDS (the tokenizer artifacts differ, the model input does not; the
    tokenizer difference is `first_divergence`). `ids` says whether the input ids are equal, whatever the layer;
    `fixture` is replay's seed 000 §1.6 check (None for a plain diff)."""

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


def _short(sha: Any) -> str:
    return f"{sha[:4]}…" if isinstance(sha, str) else repr(sha)


def _first_json_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first path where two JSON values differ, comparing objects by key (order-insensitive)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return sub, a.get(key, "<absent>"), b.get(key, "<absent>")
            found = _first_json_difference(a[key], b[key], sub)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = _first_json_difference(x, y, f"{path}[{i}]")
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


def diff(a: ExecutionRecord | Mapping[str, Any], b: ExecutionRecord | Mapping[str, Any]) -> Diff:
    """Compare two records layer by layer; report the first layer that differs."""
    da = a.data if isinstance(a, ExecutionRecord) else dict(a)
    db = b.data if isinstance(b, ExecutionRecord) else dict(b)
    notes: list[str] = []
    if da.get("environment") != db.get("environment"):
        found = _first_json_difference(da.get("environment"), db.get("environment"))
        if found:
            notes.append(f"environment differs at {found[0]}: {found[1]!r} vs {found[2]!r}")
    ea, eb = ((d.get("tokenizer") or {}).get("engine") for d in (da, db))
    if ea != eb:
        notes.append(f"tokenizer engine differs: {ea!r} vs {eb!r} (proven to give the same ids)")
    ra, rb = da["request"], db["request"]
    if ra.get("sha256") != rb.get("sha256"):
        notes.append(f"request bytes differ: sha256 {_short(ra.get('sha256'))} vs {_short(rb.get('sha256'))}")

    ids = _ids_summary(da, db)
    # The ids are compared first: a tokenizer-layer difference with equal ids is its own outcome, not a divergence
    # of what the model receives (the later layers are still compared: the tensors may differ).
    same_ids: Divergence | None = None
    for layer in LAYERS:
        found = _compare_layer(layer, da, db)
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


def _pipeline_difference(ka: Mapping[str, Any], kb: Mapping[str, Any]) -> str | None:
    """'the normalizer differs: NFC vs none', or None when the recorded normalizer and pre-tokenizer agree (on every
    setting that can change an id)."""
    pa, pb = _pipeline_of(ka, kb), _pipeline_of(kb, ka)
    for part, name in (("normalizer", "normalizer"), ("pre_tokenizer", "pre-tokenizer")):
        x, y = _ids_relevant(pa.get(part)), _ids_relevant(pb.get(part))
        if x == y:
            continue
        sx, sy = _component(x), _component(y)
        if sx == sy:
            found = _first_json_difference(x, y)
            where = f" (at {found[0]})" if found and found[0] != "$" else ""
            return f"the {name} differs in its settings{where}: {sx} in both, configured differently"
        return f"the {name} differs: {sx} vs {sy}"
    return None


def _same_ids(found: Divergence, da: Mapping[str, Any], db: Mapping[str, Any], ids: Mapping[str, Any]) -> Divergence:
    ka, kb = da.get("tokenizer") or {}, db.get("tokenizer") or {}
    cause = f"same ids ({ids['a']}/{ids['b']}), different tokenizer artifacts: "
    if (ka.get("sha256"), ka.get("format")) != (kb.get("sha256"), kb.get("format")):
        cause += (
            f"{ka.get('format')} sha256 {_short(ka.get('sha256'))} vs {kb.get('format')} sha256 "
            f"{_short(kb.get('sha256'))}"
        )
        cause += "; the model receives the same input ids for this request"
        pipeline = _pipeline_difference(ka, kb)
        if pipeline is not None:
            cause += f", but {pipeline}, so other text may tokenize differently"
    else:
        cause += found.cause + "; the model receives the same input ids for this request"
        if _pipeline_difference(ka, kb) is not None:
            cause += ", but other text may tokenize differently"
    return Divergence("tokenizer", found.location, found.a, found.b, cause)


def _errors_at(d: Mapping[str, Any], kinds: tuple[str, ...]) -> dict[str, Any] | None:
    return next((e for e in d.get("errors") or [] if e.get("type") in kinds), None)


_REQUEST_ERRORS = ("RequestEncodingError", "RequestJSONError", "RequestValidationError")


def _compare_layer(layer: str, da: Mapping[str, Any], db: Mapping[str, Any]) -> Divergence | None:
    if layer == "request":
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
        found = _first_json_difference(ra.get("canonical"), rb.get("canonical"))
        if found:
            return Divergence("request", found[0], found[1], found[2], f"the canonical request differs at {found[0]}")
        return None
    if layer == "messages":
        found = _first_json_difference(da.get("messages"), db.get("messages"))
        if found:
            return Divergence(
                "messages", f"messages{found[0]}", found[1], found[2], "the messages the template sees differ"
            )
        return None
    if layer == "dynamic":
        xa, xb = da.get("dynamic") or {}, db.get("dynamic") or {}
        clock_matters = xa.get("clock_used") or xb.get("clock_used")
        if clock_matters and xa.get("now") != xb.get("now"):
            return Divergence(
                "dynamic",
                "dynamic.now",
                xa.get("now"),
                xb.get("now"),
                f"the injected clock changed ({xa.get('now')} vs {xb.get('now')}) and the template reads it "
                "(strftime_now)",
            )
        for key in ("chat_template_kwargs", "tools", "documents", "random", "random_ids"):
            found = _first_json_difference(xa.get(key), xb.get(key))
            if found:
                path = f"dynamic.{key}" + (f".{found[0]}" if found[0] != "$" else "")
                return Divergence("dynamic", path, found[1], found[2], f"the injected {key} differ")
        return None
    if layer == "template":
        ta, tb = da.get("template") or {}, db.get("template") or {}
        if ta.get("sha256") != tb.get("sha256"):
            same_id = ta.get("id") == tb.get("id")
            return Divergence(
                "template",
                f"template {ta.get('id')!r}" + ("" if same_id else f" vs {tb.get('id')!r}"),
                ta.get("sha256"),
                tb.get("sha256"),
                f"template sha256 differs: {_short(ta.get('sha256'))} vs {_short(tb.get('sha256'))}"
                + ("; the same template id now points to another version" if same_id else ""),
            )
        # Special-token variables come with the tokenizer config and are compared at the tokenizer layer; if they
        # changed the text, the rendered layer (before it) says so first.
        special = set((da.get("tokenizer") or {}).get("special_tokens") or {}) | set(
            (db.get("tokenizer") or {}).get("special_tokens") or {}
        )
        va = {k: v for k, v in (ta.get("variables") or {}).items() if k not in special}
        vb = {k: v for k, v in (tb.get("variables") or {}).items() if k not in special}
        found = _first_json_difference(va, vb)
        if found:
            return Divergence("template", f"variables.{found[0]}", found[1], found[2], "a template variable differs")
        return None
    if layer == "rendered":
        xa, xb = (da.get("rendered") or {}).get("text"), (db.get("rendered") or {}).get("text")
        if xa == xb:
            return None
        if xa is None or xb is None:
            return Divergence("rendered", "text", xa, xb, "only one run rendered")
        location, ca, cb, offset = _text_location(xa, xb)
        return Divergence(
            "rendered", location, ca, cb, f"rendered bytes first differ at offset {offset}: {ca!r} vs {cb!r}"
        )
    if layer == "tokenizer":
        ka, kb = da.get("tokenizer") or {}, db.get("tokenizer") or {}
        pipeline = _pipeline_difference(ka, kb)
        where = f"tokenizer ({ka.get('format')} vs {kb.get('format')})"
        digests = f"sha256 {_short(ka.get('sha256'))} vs {_short(kb.get('sha256'))}"
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
        found = _first_json_difference(ka.get("special_tokens"), kb.get("special_tokens"))
        if found:
            return Divergence("tokenizer", f"special_tokens.{found[0]}", found[1], found[2], "special tokens differ")
        return None
    if layer == "input_ids":
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
    if layer == "policy":
        found = _first_json_difference(da.get("decisions"), db.get("decisions"))
        if found:
            where = f"decisions.{found[0]}"
            return Divergence("policy", where, found[1], found[2], "a context-policy decision differs")
        sa = (da.get("options") or {}).get("sampling")
        sb = (db.get("options") or {}).get("sampling")
        found = _first_json_difference(sa, sb)
        if found:
            what = "the sampler's processor order" if found[0].startswith("order") else "the sampler config"
            where = "options.sampling" + ("" if found[0] == "$" else f".{found[0]}")
            return Divergence("policy", where, found[1], found[2], f"{what} differs")
        return None
    if layer == "tensors":
        found = _first_json_difference(da.get("tensors"), db.get("tensors"))
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
    raise AssertionError(layer)


def comparable(record: ExecutionRecord) -> dict[str, Any]:
    """The record without what names a place rather than a content (ids, origins, paths): used by replay."""
    d = record.data
    d["environment"] = None
    d["replay"]["model"] = None
    if d.get("template"):
        d["template"]["id"] = None
        d["template"]["origin"] = None
    return d
