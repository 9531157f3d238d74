"""The record format: canonical bytes, `ExecutionRecord`, and the checks a record passes before anything is written
from it (the file names and digests of its `replay` section, its tokenizer manifest)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ctxlock.core import thaw
from ctxlock.errors import RecordFormatError
from ctxlock.outside import SYNTAX_ERROR, loads_outside

RECORD_FORMAT = "ctxlock.record/2"
# Format 2 adds: `model` (the spec's id, source and hub revision), `warnings`, the clock's zone and the render
# seed with the template's draws in `dynamic` (in place of the always-empty `random_ids`), and the template file's
# byte digest and line endings. A format-1 record is still read (its missing parts are null).
# Optional parts added within format 2, absent from records that do not need them (older records load unchanged):
# `compaction` (`compact-plan --record`: the plan, the cut, the summary's digest, usage and `compaction_end`, with
# its own `version`), `options.compaction` and `decisions.compaction` (a compacted run, replayed from them).
READABLE_FORMATS = ("ctxlock.record/1", RECORD_FORMAT)
# A record holds parts of a request (its canonical form, extra fields, messages) a level or two below where the
# request has them: a record may nest this many levels deeper than a request (docs/outside-json.md).
RECORD_DEPTH_ALLOWANCE = 8
# The context policy decides which messages the template sees, so its layer comes right after the request.
LAYERS = (
    "request",
    "policy",
    "messages",
    "dynamic",
    "template",
    "rendered",
    "tokenizer",
    "multimodal",
    "input_ids",
    "tensors",
)
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


def file_name_problem(name: Any) -> str | None:
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
    problem = file_name_problem(name)
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
            data = loads_outside(raw, f"{source} $", error=RecordFormatError, depth_allowance=RECORD_DEPTH_ALLOWANCE)
        except RecordFormatError as exc:
            if exc.message.startswith(SYNTAX_ERROR):
                message = f"not a complete JSON record: {exc.message.removeprefix(SYNTAX_ERROR)}"
                raise RecordFormatError(
                    message, path=exc.path, hint="the record file is truncated or corrupt; export it again"
                ) from None
            raise RecordFormatError(exc.message, path=exc.path, hint=exc.hint or _BAD_RECORD) from None
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
