"""Load a model's input artifacts: the tokenizer, the chat template(s) and the special-token variables.

A model spec is one of:
- a built-in name (`ctxlock models`): data directories shipped in `ctxlock/models/`;
- an HF model directory: `tokenizer.json` (or a slow `vocab.json` + `merges.txt`), `tokenizer_config.json`,
  `config.json`, `added_tokens.json`, `chat_template.jinja` (or an inline `chat_template`, or
  `additional_chat_templates/`), `special_tokens_map.json`. The tokenizer is the one `AutoTokenizer` loads: the
  class transformers picks and the pipeline it builds in code (`ctxlock.tokenizer.hf_classes`), unless
  `tokenizer_pipeline="file"` asks for tokenizer.json's components as written;
- any directory with a `ctxlock.json` manifest (what the built-ins are).

Every file a config names must resolve inside the model directory, symlinks included, and be a regular file:
a directory, FIFO or device under an artifact's name is refused (a FIFO would block the read), and every model
JSON or template file is read through `ctxlock.inputs` (capped at $CTXLOCK_MAX_ARTIFACT_BYTES). Whatever the
files hold, loading raises only ArtifactError subclasses (or a TemplateError for a template that does not
compile), never a bare KeyError, UnicodeError or OSError.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .. import diskcache
from ..errors import ArtifactFormatError, ArtifactNotFoundError, PathTraversalError
from ..frozen import FrozenDict, freeze
from ..inputs import decode_utf8, read_artifact
from ..template import ChatTemplate, TemplateSet, compile_template, template_from_file_text
from ..tokenizer import Tokenizer

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "models"
DEFAULT_MODEL = "mistral-nemo"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# JSON escapes can spell a lone surrogate, which no tokenizer vocabulary holds and UTF-8 cannot encode.
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class ModelArtifacts:
    id: str
    source: str
    tokenizer: Tokenizer
    templates: TemplateSet | None
    special_tokens: FrozenDict  # template variables: bos_token, eos_token, ...
    pad_id: int | None
    description: str = ""
    hub: Any = None  # a hub.HubRevision when the model came from the HF hub cache (`org/name[@revision]`)

    def describe(self) -> dict[str, Any]:
        templates = []
        if self.templates is not None:
            for name, t in zip(self.templates.names, self.templates.templates, strict=True):
                templates.append({"name": name, **t.to_dict(), "features": t.features.to_dict()})
        return {
            "id": self.id,
            "source": self.source,
            "description": self.description,
            "tokenizer": self.tokenizer.describe(),
            "special_tokens": {
                k: {"content": v, "id": self.tokenizer.token_to_id(v)} for k, v in self.special_tokens.items()
            },
            "added_tokens": len(self.tokenizer.added_tokens),
            "control_tokens": len(self.tokenizer.control_tokens),
            "pad_id": self.pad_id,
            "templates": templates,
            **({"hub": self.hub.to_dict()} if self.hub is not None else {}),
        }


def builtin_models() -> list[tuple[str, str]]:
    out = []
    for d in sorted(BUILTIN_DIR.iterdir()):
        manifest = d / "ctxlock.json"
        if manifest.is_file():
            out.append((d.name, json.loads(manifest.read_text("utf-8")).get("description", "")))
    return out


def inside(root: Path, relative: str, *, field: str, config: Path, boundary: Path | None = None) -> Path:
    """Resolve a path a config names, refusing anything outside the model directory.

    The name itself must stay inside `root`, and the file it resolves to (symlinks followed) inside `boundary`
    (default: `root`). A HF hub snapshot links its files to `../../blobs/`, so there the boundary is the repo.
    """
    if not isinstance(relative, str) or not relative or "\x00" in relative or _SURROGATE.search(relative):
        raise ArtifactFormatError(f"{field} must be a non-empty relative path", path=f"{config}:{field}")
    try:
        root = root.resolve()
        limit = (boundary or root).resolve()
        named = Path(os.path.normpath(root / relative))
        target = (root / relative).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a name too long for the file system
        raise ArtifactFormatError(f"{field} cannot be resolved: {exc}", path=f"{config}:{field}") from None
    if not named.is_relative_to(root) or not target.is_relative_to(limit):
        raise PathTraversalError(
            f"{field} points outside the model directory: {relative!r} resolves to {target}",
            path=f"{config}:{field}",
            hint=f"keep every file a config names inside {root}",
        )
    return target


def _read_text(path: Path) -> str:
    """A model file's text: a regular UTF-8 file within the artifact cap, or a typed error naming it."""
    data = read_artifact(path, missing=ArtifactNotFoundError, error=ArtifactFormatError)
    return decode_utf8(data, label=str(path), error=ArtifactFormatError)


def _read_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, an over-long integer, deep nesting
        raise ArtifactFormatError(f"not valid JSON: {exc}", path=str(path)) from None


def _present(path: Path) -> bool:
    """Whether a standard artifact file is there: True for a regular file, False for nothing (or a dangling link),
    and an error for a directory, FIFO or device under that name, which would otherwise be silently skipped."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ArtifactFormatError(f"cannot read: {exc.strerror}", path=str(path)) from None
    if not stat.S_ISREG(mode):
        raise ArtifactFormatError(
            "is not a regular file", path=str(path), hint="remove it or replace it with the file it names"
        )
    return True


def _regular(path: Path, where: str) -> Path:
    """A tokenizer file a manifest names, which its loader reads itself: it must exist and be a regular file."""
    if not _present(path):
        raise ArtifactNotFoundError(f"missing file {path.name}", path=where)
    return path


def _special_token(value: str, where: str) -> str:
    if _SURROGATE.search(value):
        raise ArtifactFormatError(
            "a special token holds a lone surrogate, which is not a character",
            path=where,
            hint="escape characters outside the BMP as a surrogate pair",
        )
    return value


def _token_content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def load_template_file(path: str | Path, *, id: str | None = None) -> ChatTemplate:
    p = Path(path)
    data = read_artifact(p, missing=ArtifactNotFoundError, error=ArtifactFormatError)
    text = decode_utf8(data, label=str(p), error=ArtifactFormatError)
    # Read as transformers reads chat_template.jinja (universal newlines); the digest of the bytes is kept too.
    template = template_from_file_text(
        text, id=id or p.name, origin=str(p), file_sha256=hashlib.sha256(data).hexdigest()
    )
    compile_template(template)
    return template


def _templates_from_config(value: Any, *, where: str, model_id: str) -> TemplateSet | None:
    if value is None:
        return None
    if isinstance(value, str):
        t = ChatTemplate(value, id=f"{model_id}/default", origin=where)
        compile_template(t)
        return TemplateSet.single(t)
    if isinstance(value, list):
        names, templates = [], []
        for i, item in enumerate(value):
            if not (
                isinstance(item, Mapping)
                and isinstance(item.get("name"), str)
                and isinstance(item.get("template"), str)
            ):
                raise ArtifactFormatError("a chat_template list holds {name, template} objects", path=f"{where}[{i}]")
            t = ChatTemplate(item["template"], id=f"{model_id}/{item['name']}", origin=f"{where}[{i}]")
            compile_template(t)
            names.append(item["name"])
            templates.append(t)
        return TemplateSet(tuple(templates), tuple(names))
    raise ArtifactFormatError("chat_template must be a string or a list of {name, template}", path=where)


TOKENIZER_PIPELINES = ("class", "file")


def _load_hf_dir(
    root: Path, *, boundary: Path | None = None, model_id: str | None = None, tokenizer_pipeline: str = "class"
) -> ModelArtifacts:
    from ..tokenizer.hf import HFTokenizer

    model_id = model_id or root.name

    def local(name: str) -> Path:
        # Even the standard file names are checked: a symlink may point out of the directory.
        return inside(root, name, field=name, config=root, boundary=boundary)

    for name in (
        "tokenizer_config.json",
        "tokenizer.json",
        "chat_template.jinja",
        "chat_template.json",
        "special_tokens_map.json",
        "config.json",
        "added_tokens.json",
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
    ):
        local(name)  # refuse escaping symlinks before reading anything
    config_path = local("tokenizer_config.json")
    config = _read_json(config_path) if _present(config_path) else {}
    if not isinstance(config, dict):
        raise ArtifactFormatError("tokenizer_config.json must hold a JSON object", path=str(config_path))
    # config.json (the model's) matters only for its model_type and tokenizer_class, as in AutoTokenizer.
    model_config_path = local("config.json")
    model_config = _read_json(model_config_path) if _present(model_config_path) else {}
    if not isinstance(model_config, dict):
        raise ArtifactFormatError("config.json must hold a JSON object", path=str(model_config_path))
    added_path = local("added_tokens.json")
    added_json = _read_json(added_path) if _present(added_path) else None
    if added_json is not None and not (
        isinstance(added_json, dict)
        and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in added_json.items())
    ):
        raise ArtifactFormatError("added_tokens.json maps token strings to ids", path=str(added_path))
    stm_path = local("special_tokens_map.json")
    stm = _read_json(stm_path) if _present(stm_path) else {}
    tok_path = (
        inside(root, config["tokenizer_file"], field="tokenizer_file", config=config_path)
        if config.get("tokenizer_file")
        else local("tokenizer.json")
    )
    file_text: str | None = None
    slow: tuple[Path, Path] | None = None
    spm_raw: bytes | None = None
    if _present(tok_path):
        file_text = _read_text(tok_path)
        source, file_sha = tok_path, hashlib.sha256(file_text.encode("utf-8")).hexdigest()
    elif _present(local("vocab.json")) and _present(local("merges.txt")):
        # A slow-only BPE directory: transformers builds the fast tokenizer from the two files.
        slow = (local("vocab.json"), local("merges.txt"))
        source, file_sha = slow[0], _slow_digest(*slow)
    elif _present(local("tokenizer.model")):
        # A SentencePiece-only directory: transformers builds the fast tokenizer from the .model's pieces.
        spm_raw = read_artifact(local("tokenizer.model"), missing=ArtifactNotFoundError, error=ArtifactFormatError)
        source, file_sha = local("tokenizer.model"), hashlib.sha256(spm_raw).hexdigest()
    else:
        raise ArtifactNotFoundError(
            "no tokenizer in the model directory: neither tokenizer.json nor vocab.json with merges.txt",
            path=str(tok_path),
            hint="ctxlock reads HF tokenizer files here; export them with transformers' save_pretrained",
        )
    pipeline = _hf_pipeline(
        file_text,
        slow,
        file_sha,
        source,
        config=config,
        model_config=model_config,
        added_json=added_json,
        stm=stm if isinstance(stm, dict) else None,
        mode=tokenizer_pipeline,
        spm_raw=spm_raw,
    )
    tokenizer = HFTokenizer(
        pipeline.json_text,
        id=f"{model_id}/{source.name}",
        source=str(source),
        description={**pipeline.describe(), "file_sha256": file_sha, **_built_from(slow, spm_raw, pipeline)},
    )
    # Template precedence follows transformers: chat_template.jinja, then chat_template.json, then the config.
    templates: TemplateSet | None = None
    jinja = local("chat_template.jinja")
    if _present(jinja):
        templates = TemplateSet.single(load_template_file(jinja, id=f"{model_id}/chat_template.jinja"))
    elif _present(local("chat_template.json")):
        data = _read_json(local("chat_template.json"))
        templates = _templates_from_config(
            data.get("chat_template") if isinstance(data, dict) else None,
            where=str(root / "chat_template.json"),
            model_id=model_id,
        )
    else:
        templates = _templates_from_config(
            config.get("chat_template"), where=f"{config_path}:chat_template", model_id=model_id
        )
    extra_dir = root / "additional_chat_templates"
    if extra_dir.is_dir():
        names = list(templates.names) if templates else []
        items = list(templates.templates) if templates else []
        for f in sorted(extra_dir.glob("*.jinja")):
            names.append(f.stem)
            path = local(f"additional_chat_templates/{f.name}")
            items.append(load_template_file(path, id=f"{model_id}/{f.stem}"))
        templates = TemplateSet(tuple(items), tuple(names))

    special: dict[str, str] = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = _token_content(config.get(name))
        where = f"{config_path}:{name}"
        if value is None and isinstance(stm, dict):
            value, where = _token_content(stm.get(name)), f"{stm_path}:{name}"
        if value is not None:
            special[name] = _special_token(value, where)
    if file_text is None:
        # Built from slow files, the class's own defaults (LlamaTokenizer's "<s>", ...) are the tokenizer's special
        # tokens when the config names none: transformers gives them to the template as bos_token, ...
        for name, value in pipeline.special_tokens:
            if name in SPECIAL_TOKEN_NAMES and name not in special:
                special[name] = _special_token(value, f"{source.name} ({pipeline.tokenizer_class} default)")
    return _finish(model_id, str(root), tokenizer, templates, special, description="HF model directory")


def _hf_pipeline(
    file_text: str | None,
    slow: tuple[Path, Path] | None,
    file_sha: str,
    source: Path,
    *,
    config: dict[str, Any],
    model_config: dict[str, Any],
    added_json: Any,
    stm: dict[str, Any] | None,
    mode: str,
    spm_raw: bytes | None = None,
) -> Any:
    """The tokenizer transformers builds for these files (`hf_classes.build_pipeline`), cached by the digest of
    everything it reads (a 150k vocabulary takes seconds to rebuild)."""
    import tokenizers

    from ..tokenizer.hf_classes import PIPELINE_VERSION, Pipeline, build_pipeline

    key = hashlib.sha256(
        json.dumps(
            [
                *(PIPELINE_VERSION, tokenizers.__version__, file_sha, slow is not None, spm_raw is not None, mode),
                *(config, added_json, stm, {k: model_config.get(k) for k in ("model_type", "tokenizer_class")}),
            ],
            sort_keys=True,
            default=str,  # ASCII: a config value may hold a lone surrogate (then refused below, with its key)
        ).encode("ascii")
    ).hexdigest()
    cached = diskcache.load("hf-pipeline", key)
    if cached is not None and isinstance(cached.get("pipeline"), dict):
        fields = dict(cached["pipeline"])
        if fields.get("json_text") is None and file_text is not None:
            fields["json_text"] = file_text
        try:
            return Pipeline.from_dict(fields)
        except (KeyError, TypeError, ValueError):
            pass  # a cache entry of another layout: build again
    spm_specials: list[dict[str, Any]] | None = None
    if file_text is not None:
        file_data = _tokenizer_json(file_text, source)
    elif spm_raw is not None:
        from ..tokenizer.hf_classes import spm_bpe
        from ..tokenizer.sentencepiece import read_model_info

        file_data, spm_specials = spm_bpe(read_model_info(spm_raw, source=str(source)).pieces)
    else:
        file_data = _slow_bpe(*slow)  # type: ignore[misc]
    try:
        pipeline = build_pipeline(
            file_data,
            config=config,
            model_config=model_config,
            file_text=file_text,
            added_tokens_json=added_json,
            special_tokens_map=stm,
            has_tokenizer_file=file_text is not None,
            pipeline=mode,
            source=str(source),
            spm_specials=spm_specials,
        )
    except ArtifactFormatError:
        raise
    except Exception as exc:  # tokenizers raises bare Exceptions on components it cannot read
        raise ArtifactFormatError(
            f"not a valid tokenizer.json: {exc}", path=str(source), hint="re-export it with tokenizers/transformers"
        ) from None
    stored = pipeline.to_dict()
    if not pipeline.changed:
        stored["json_text"] = None  # the file itself: not stored twice
    with contextlib.suppress(UnicodeError, ValueError):  # not cacheable as UTF-8 JSON: built again next time
        diskcache.store("hf-pipeline", key, {"pipeline": stored})
    return pipeline


def _tokenizer_json(text: str, path: Path) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ArtifactFormatError(f"not a valid tokenizer.json: {exc}", path=str(path)) from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ArtifactFormatError("not a valid tokenizer.json: no model object", path=str(path))
    if not isinstance(data.get("added_tokens", []), list) or not all(
        isinstance(t, dict) and isinstance(t.get("content"), str) and isinstance(t.get("id"), int)
        for t in data.get("added_tokens", [])
    ):
        raise ArtifactFormatError(
            "not a valid tokenizer.json: added_tokens holds {id, content} objects", path=str(path)
        )
    return data


def _built_from(slow: tuple[Path, Path] | None, spm_raw: bytes | None, pipeline: Any) -> dict[str, Any]:
    """For a directory without tokenizer.json, which files the tokenizer was built from and how (for the record)."""
    if spm_raw is not None:
        from ..tokenizer.hf_classes import SPM_NOTE

        return {"built_from": {"files": ["tokenizer.model"], "class": pipeline.tokenizer_class, "how": SPM_NOTE}}
    if slow is not None:
        how = "the class's __init__ over the vocabulary and merges as written (transformers 5.24)"
        return {"built_from": {"files": ["vocab.json", "merges.txt"], "class": pipeline.tokenizer_class, "how": how}}
    return {}


def _slow_digest(vocab_path: Path, merges_path: Path) -> str:
    """The digest of a vocab.json + merges.txt pair: sha256 over the two files' own sha256 digests."""
    digest = hashlib.sha256()
    for path in (vocab_path, merges_path):
        digest.update(
            hashlib.sha256(read_artifact(path, missing=ArtifactNotFoundError, error=ArtifactFormatError)).digest()
        )
    return digest.hexdigest()


def _slow_bpe(vocab_path: Path, merges_path: Path) -> dict[str, Any]:
    """The tokenizer.json-shaped data of a vocab.json + merges.txt pair (as `tokenizers` reads the pair: a first
    line `#version...` is skipped, every other line is two space-separated pieces)."""
    vocab_text, merges_text = _read_text(vocab_path), _read_text(merges_path)
    try:
        vocab = json.loads(vocab_text)
    except (ValueError, RecursionError) as exc:
        raise ArtifactFormatError(f"not valid JSON: {exc}", path=str(vocab_path)) from None
    if not isinstance(vocab, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in vocab.items()
    ):
        raise ArtifactFormatError("vocab.json maps token strings to ids", path=str(vocab_path))
    merges: list[list[str]] = []
    for n, line in enumerate(merges_text.split("\n"), 1):
        line = line.removesuffix("\r")
        if (n == 1 and line.startswith("#version")) or not line:
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ArtifactFormatError(
                f"line {n} is not two space-separated pieces", path=str(merges_path), hint="one merge per line: 'a b'"
            )
        merges.append(parts)
    from ..tokenizer.hf_classes import bare_bpe

    return bare_bpe(vocab, merges)


def _finish(
    model_id: str,
    source: str,
    tokenizer: Tokenizer,
    templates: TemplateSet | None,
    special: Mapping[str, str],
    description: str,
) -> ModelArtifacts:
    pad = special.get("pad_token")
    pad_id = tokenizer.token_to_id(pad) if pad is not None else None
    return ModelArtifacts(
        id=model_id,
        source=source,
        tokenizer=tokenizer,
        templates=templates,
        special_tokens=freeze(dict(special)),
        pad_id=pad_id,
        description=description,
    )


def _load_manifest_dir(root: Path) -> ModelArtifacts:
    manifest_path = root / "ctxlock.json"
    manifest = _read_json(manifest_path)
    if not isinstance(manifest, dict):
        raise ArtifactFormatError("a ctxlock.json manifest holds a JSON object", path=str(manifest_path))
    model_id = root.name
    spec = manifest.get("tokenizer")
    if not isinstance(spec, dict) or "format" not in spec:
        raise ArtifactFormatError("manifest needs a tokenizer object with a format", path=f"{manifest_path}:tokenizer")
    fmt = spec["format"]
    file_field = f"{manifest_path}:tokenizer.file"
    tokenizer: Tokenizer
    if fmt == "book":
        from ..tokenizer.book import BookTokenizer

        vocab, control, unk = _book_spec(spec, f"{manifest_path}:tokenizer")
        tokenizer = BookTokenizer(vocab, control=control, unk=unk, id=model_id)
    elif fmt == "tekken":
        from ..tokenizer.tekken import TekkenTokenizer

        path = _regular(_resource_or_file(root, spec, manifest_path), file_field)
        tokenizer = TekkenTokenizer(path, id=f"{model_id}/tekken")
    elif fmt == "hf-tokenizers":
        from ..tokenizer.hf import HFTokenizer

        path = inside(root, spec.get("file", ""), field="tokenizer.file", config=manifest_path)
        tokenizer = HFTokenizer(_read_text(path), id=f"{model_id}/{path.name}", source=str(path))
    elif fmt == "gguf":
        path = _regular(inside(root, spec.get("file", ""), field="tokenizer.file", config=manifest_path), file_field)
        tokenizer = _load_gguf(path).tokenizer
    elif fmt == "tiktoken":
        from ..tokenizer.tiktoken_file import from_manifest as tiktoken_from_manifest

        path = _regular(inside(root, spec.get("file", ""), field="tokenizer.file", config=manifest_path), file_field)
        tokenizer = tiktoken_from_manifest(spec, path, f"{model_id}/{path.name}", manifest=manifest_path)
    elif fmt == "sentencepiece":
        from ..tokenizer.sentencepiece import from_manifest as sentencepiece_from_manifest

        path = _regular(_resource_or_file(root, spec, manifest_path), file_field)
        tokenizer = sentencepiece_from_manifest(spec, path, f"{model_id}/{path.name}", manifest=manifest_path)
    else:
        raise ArtifactFormatError(
            f"unknown tokenizer format {fmt!r}",
            path=f"{manifest_path}:tokenizer.format",
            hint="use book, tekken, tiktoken, sentencepiece, gguf or hf-tokenizers",
        )

    template_spec = manifest.get("template")
    templates: TemplateSet | None = None
    if isinstance(template_spec, str):
        path = inside(root, template_spec, field="template", config=manifest_path)
        templates = TemplateSet.single(load_template_file(path, id=f"{model_id}/{Path(template_spec).name}"))
    elif (
        isinstance(template_spec, dict)
        and template_spec.get("generator") == "mistral_common.convert_tokenizer_to_chat_template"
    ):
        templates = TemplateSet.single(
            _mistral_generated_template(_resource_or_file(root, spec, manifest_path), model_id)
        )
    elif template_spec is not None:
        raise ArtifactFormatError("template must be a file name or a known generator", path=f"{manifest_path}:template")
    raw_special = manifest.get("special_tokens") or {}
    if not isinstance(raw_special, dict):
        raise ArtifactFormatError("special_tokens must be an object", path=f"{manifest_path}:special_tokens")
    special = {
        k: _special_token(v, f"{manifest_path}:special_tokens.{k}")
        for k, v in raw_special.items()
        if isinstance(v, str)
    }
    description = manifest.get("description", "")
    if not isinstance(description, str):
        raise ArtifactFormatError("description must be a string", path=f"{manifest_path}:description")
    return _finish(model_id, str(root), tokenizer, templates, special, description)


def _book_spec(spec: Mapping[str, Any], where: str) -> tuple[list[str], list[str], str]:
    """The book tokenizer's vocab, control and unk, checked: lists of strings, and unk one of the vocab."""

    def strings(key: str) -> list[str]:
        value = spec.get(key)
        if not isinstance(value, list) or not all(isinstance(t, str) and t and not _SURROGATE.search(t) for t in value):
            raise ArtifactFormatError(f"{key} must be a list of non-empty strings", path=f"{where}.{key}")
        return value

    vocab, control, unk = strings("vocab"), strings("control"), spec.get("unk")
    if not isinstance(unk, str) or unk not in vocab:
        raise ArtifactFormatError("unk must be one of the vocab's strings", path=f"{where}.unk")
    return vocab, control, unk


def _resource_or_file(root: Path, spec: Mapping[str, Any], manifest_path: Path) -> Path:
    if "package" in spec:
        import importlib.util

        package = spec["package"]
        if not isinstance(package, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", package):
            raise ArtifactFormatError(
                "package must be a Python package name", path=f"{manifest_path}:tokenizer.package"
            )
        try:
            found = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            found = None
        if found is None or not found.submodule_search_locations:
            raise ArtifactNotFoundError(
                f"package {spec['package']!r} is not installed", path=f"{manifest_path}:tokenizer.package"
            )
        base = Path(next(iter(found.submodule_search_locations)))
        return inside(base, spec.get("resource"), field="tokenizer.resource", config=manifest_path)
    return inside(root, spec.get("file", ""), field="tokenizer.file", config=manifest_path)


def _mistral_generated_template(tokenizer_file: Path, model_id: str) -> ChatTemplate:
    # The vendor's own generator, so the template is the one mistral-common stands behind for this tokenizer.
    import mistral_common

    from ..mistral import patch_template

    # Generating builds mistral-common's tokenizer (about 1.5 s): cache the source by file digest and version.
    kind = f"mistral-template-mistral-common-{mistral_common.__version__}"
    sha = diskcache.file_sha256(tokenizer_file)
    cached = diskcache.load(kind, sha)
    if cached is not None:
        source = cached["source"]
    else:
        from mistral_common.integrations.chat_templates.chat_templates import convert_tokenizer_to_chat_template

        source = convert_tokenizer_to_chat_template(tokenizer_file)
        diskcache.store(kind, sha, {"source": source})
    origin = f"mistral_common {mistral_common.__version__} template_generator({tokenizer_file.name})"
    # Patched where the generated template and mistral-common's encode_chat_completion disagree (ctxlock.mistral).
    template = ChatTemplate(
        patch_template(source, origin=origin),
        id=f"{model_id}/generated",
        origin=f"{origin} + ctxlock.mistral shapes",
    )
    compile_template(template)
    return template


def _fingerprint(root: Path) -> tuple[tuple[str, int, int], ...]:
    try:
        return tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.iterdir()) if p.is_file())
    except OSError as exc:
        raise ArtifactFormatError(f"cannot list the model directory: {exc.strerror}", path=str(root)) from None


def _load_gguf(path: Path) -> ModelArtifacts:
    """A GGUF file: its vocabulary converted natively (cached by sha256) and its embedded chat template(s)."""
    from ..tokenizer.hf import HFTokenizer
    from .gguf import conversion, read_vocab

    sha = diskcache.file_sha256(path)
    data = diskcache.load("gguf", sha)
    if data is None:
        data = conversion(read_vocab(path))
        diskcache.store("gguf", sha, data)
    tokenizer = HFTokenizer(
        data["tokenizer_json"],
        id=path.name,
        source=str(path),
        sha256=sha,
        format="gguf",
        description={
            "gguf_model": data["model"],
            "gguf_pre": data["pre"],
            "architecture": data["architecture"],
            "add_bos": data["add_bos"],
            "add_eos": data["add_eos"],
        },
    )
    templates = None
    if data["chat_templates"]:
        # The embedded template is untrusted like any other: compiled and rendered in the same limited sandbox.
        names, items = [], []
        for name, source in data["chat_templates"].items():
            key = "tokenizer.chat_template" if name == "default" else f"tokenizer.chat_template.{name}"
            template = ChatTemplate(source, id=f"{path.name}/{name}", origin=f"{path}:{key}")
            compile_template(template)
            names.append(name)
            items.append(template)
        templates = TemplateSet(tuple(items), tuple(names))
    return _finish(path.name, str(path), tokenizer, templates, data["special_tokens"], "GGUF file")


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


@lru_cache(maxsize=32)
def _load_hub_cached(
    snapshot: Path, repo_id: str, fingerprint: tuple[tuple[str, int, int], ...], tokenizer_pipeline: str = "class"
) -> ModelArtifacts:
    # Snapshot files are symlinks into the repo's blobs/: the repo directory is the containment boundary.
    return _load_hf_dir(
        snapshot, boundary=snapshot.parent.parent, model_id=repo_id, tokenizer_pipeline=tokenizer_pipeline
    )


@lru_cache(maxsize=32)
def _load_cached(
    root: Path, fingerprint: tuple[tuple[str, int, int], ...], tokenizer_pipeline: str = "class"
) -> ModelArtifacts:
    if root.is_file():
        return _load_gguf(root)
    if (root / "ctxlock.json").is_file():
        return _load_manifest_dir(root)
    return _load_hf_dir(root, tokenizer_pipeline=tokenizer_pipeline)


def load_artifacts(spec: str | Path | None = None, *, tokenizer_pipeline: str = "class") -> ModelArtifacts:
    """Resolve a model spec (built-in name or directory) offline and load its artifacts.

    `tokenizer_pipeline` applies to HF directories: "class" (the default) builds the tokenizer the way the
    transformers class the directory names builds it, which is what `AutoTokenizer` loads; "file" keeps
    tokenizer.json's components as written. `describe()["tokenizer"]` says which was used and where they differ."""
    if tokenizer_pipeline not in TOKENIZER_PIPELINES:
        raise ValueError(f"tokenizer_pipeline must be one of {TOKENIZER_PIPELINES}, not {tokenizer_pipeline!r}")
    name = DEFAULT_MODEL if spec is None else str(spec)
    builtin = BUILTIN_DIR / name
    if "/" not in name and "\\" not in name and (builtin / "ctxlock.json").is_file():
        root = builtin
    else:
        root = Path(name).expanduser()
        from .hub import is_hub_id, resolve_hub_revision

        try:
            exists = root.exists()
        except OSError as exc:  # ENAMETOOLONG and the like: not a path this machine can open
            exists = False
            if not is_hub_id(name):
                raise ArtifactNotFoundError(
                    f"cannot look up {name[:80]!r}: {exc.strerror}", path=name[:200], hint="pass a shorter path"
                ) from None
        if not exists and is_hub_id(name):
            # org/name[@revision]: the local HF hub cache, offline; never downloads. The artifacts carry how the
            # revision resolved (a rolling ref or a pinned commit), for the record.
            pin = resolve_hub_revision(name)
            loaded = _load_hub_cached(pin.snapshot, pin.repo_id, _fingerprint(pin.snapshot), tokenizer_pipeline)
            return dataclasses.replace(loaded, hub=pin)
        if not exists:
            known = ", ".join(n for n, _ in builtin_models())
            raise ArtifactNotFoundError(
                f"no built-in model or directory named {name!r}",
                path=name,
                hint=f"built-in models: {known}; or pass an HF model directory, a .gguf file, or org/name from the "
                "local HF hub cache",
            )
        if not (root.is_file() or root.is_dir()):
            # /dev/null, a FIFO, a socket: there is nothing to load, and opening a FIFO would block.
            raise ArtifactFormatError(
                "a model is a directory or a GGUF file, and this is neither",
                path=name,
                hint="pass a model directory, a .gguf file or a built-in name",
            )
        if root.is_file():
            if not (root.suffix == ".gguf" or _is_gguf(root)):
                raise ArtifactFormatError(
                    "a model file must be a GGUF file",
                    path=name,
                    hint="pass a .gguf file, a model directory or a built-in name",
                )
            root = root.resolve()
            st = root.stat()
            return _load_cached(root, ((root.name, st.st_mtime_ns, st.st_size),))
    root = root.resolve()
    return _load_cached(root, _fingerprint(root), tokenizer_pipeline)
