"""An HF model directory: `tokenizer.json` (or a slow `vocab.json` + `merges.txt`, or only a SentencePiece
`tokenizer.model`), `tokenizer_config.json`, `config.json`, `added_tokens.json`, `chat_template.jinja` (or
`chat_template.json`, or an inline `chat_template`, and `additional_chat_templates/`), `special_tokens_map.json`.

The tokenizer is the one `AutoTokenizer` loads: the class transformers picks and the pipeline it builds in code
(`ctxlock.tokenizer.backends`), unless `tokenizer_pipeline="file"` asks for tokenizer.json's components as
written. Template precedence and the special-token variables follow transformers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ctxlock.artifacts._common import (
    ModelArtifacts,
    finish,
    inside,
    load_template_file,
    parse_json,
    present,
    read_json,
    read_text,
    special_token,
    templates_from_config,
)
from ctxlock.core import freeze
from ctxlock.economics import capacity_from_files
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError
from ctxlock.outside import decode_utf8, load_cached, read_artifact, store_cached
from ctxlock.template import TemplateSet
from ctxlock.tokenizer import backends
from ctxlock.tokenizer.backends import (
    PIPELINE_VERSION,
    SPM_NOTE,
    HFTokenizer,
    Pipeline,
    bare_bpe,
    build_pipeline,
    spm_bpe,
)

_STANDARD_FILES = (
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
    "params.json",
    "preprocessor_config.json",
)


@dataclass(frozen=True)
class _Dir:
    """A model directory being loaded: where it is, what its files may resolve to, and its id."""

    root: Path
    boundary: Path | None
    model_id: str

    def local(self, name: str) -> Path:
        # Even the standard file names are checked: a symlink may point out of the directory.
        return inside(self.root, name, field=name, config=self.root, boundary=self.boundary)


@dataclass(frozen=True)
class _Configs:
    config: dict[str, Any]  # tokenizer_config.json
    config_path: Path
    model_config: dict[str, Any]  # config.json: only its model_type and tokenizer_class matter, as in AutoTokenizer
    added_json: Any  # added_tokens.json
    stm: Any  # special_tokens_map.json (None: no such file)
    stm_path: Path


@dataclass(frozen=True)
class _Source:
    """The file(s) the tokenizer is built from: tokenizer.json's text, a slow pair, or a SentencePiece model."""

    path: Path
    sha256: str
    file_text: str | None = None
    slow: tuple[Path, Path] | None = None
    spm_raw: bytes | None = None


def load_hf_dir(
    root: Path, *, boundary: Path | None = None, model_id: str | None = None, tokenizer_pipeline: str = "class"
) -> ModelArtifacts:
    d = _Dir(root, boundary, model_id or root.name)
    for name in _STANDARD_FILES:
        d.local(name)  # refuse escaping symlinks before reading anything
    configs = _read_configs(d)
    source = _tokenizer_source(d, configs)
    pipeline = _hf_pipeline(
        source.file_text,
        source.slow,
        source.sha256,
        source.path,
        config=configs.config,
        model_config=configs.model_config,
        added_json=configs.added_json,
        stm=configs.stm,
        mode=tokenizer_pipeline,
        spm_raw=source.spm_raw,
    )
    tokenizer = HFTokenizer(
        pipeline.json_text,
        id=f"{d.model_id}/{source.path.name}",
        source=str(source.path),
        # the file's digest is the text's when the pipeline kept the file as written (identity first, then equality)
        text_sha256=source.sha256 if source.file_text is not None and pipeline.json_text == source.file_text else None,
        description={
            **pipeline.describe(),
            "file_sha256": source.sha256,
            **_built_from(source.slow, source.spm_raw, pipeline),
        },
    )
    templates = _templates(d, configs)
    special = _special_tokens(configs, source, pipeline)
    cap = capacity_from_files(
        config=configs.model_config, tokenizer_config=configs.config, params=_params(d.local("params.json"))
    )
    done = finish(d.model_id, str(root), tokenizer, templates, special, "HF model directory", cap)
    pre_path = d.local("preprocessor_config.json")
    if not present(pre_path):
        return done
    pre = read_json(pre_path)
    if not isinstance(pre, dict):
        raise ArtifactFormatError("preprocessor_config.json must hold a JSON object", path=str(pre_path))
    return replace(done, preprocessor=freeze(pre))


def _params(path: Path) -> dict[str, Any] | None:
    """Mistral's params.json (its `max_seq_len` is a window), when the directory has one."""
    if not present(path):
        return None
    data = read_json(path)
    if not isinstance(data, dict):
        raise ArtifactFormatError("params.json must hold a JSON object", path=str(path))
    return data


def _read_configs(d: _Dir) -> _Configs:
    config_path = d.local("tokenizer_config.json")
    config = read_json(config_path) if present(config_path) else {}
    if not isinstance(config, dict):
        raise ArtifactFormatError("tokenizer_config.json must hold a JSON object", path=str(config_path))
    # config.json (the model's): its model_type and tokenizer_class, as in AutoTokenizer, and its window (capacity).
    model_config_path = d.local("config.json")
    model_config = read_json(model_config_path) if present(model_config_path) else {}
    if not isinstance(model_config, dict):
        raise ArtifactFormatError("config.json must hold a JSON object", path=str(model_config_path))
    added_path = d.local("added_tokens.json")
    added_json = read_json(added_path) if present(added_path) else None
    if added_json is not None and not (
        isinstance(added_json, dict)
        and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in added_json.items())
    ):
        raise ArtifactFormatError("added_tokens.json maps token strings to ids", path=str(added_path))
    stm_path = d.local("special_tokens_map.json")
    stm = read_json(stm_path) if present(stm_path) else None
    return _Configs(config, config_path, model_config, added_json, stm, stm_path)


def _tokenizer_source(d: _Dir, configs: _Configs) -> _Source:
    config = configs.config
    tok_path = (
        inside(d.root, config["tokenizer_file"], field="tokenizer_file", config=configs.config_path)
        if config.get("tokenizer_file")
        else d.local("tokenizer.json")
    )
    if present(tok_path):
        # The bytes' digest is the text's: a strict UTF-8 decode is lossless, so the text encodes back to them.
        raw = read_artifact(tok_path, missing=ArtifactNotFoundError, error=ArtifactFormatError)
        file_text = decode_utf8(raw, label=str(tok_path), error=ArtifactFormatError)
        return _Source(tok_path, hashlib.sha256(raw).hexdigest(), file_text=file_text)
    if present(d.local("vocab.json")) and present(d.local("merges.txt")):
        # A slow-only BPE directory: transformers builds the fast tokenizer from the two files.
        slow = (d.local("vocab.json"), d.local("merges.txt"))
        return _Source(slow[0], _slow_digest(*slow), slow=slow)
    if present(d.local("tokenizer.model")):
        # A SentencePiece-only directory: transformers builds the fast tokenizer from the .model's pieces.
        spm_raw = read_artifact(d.local("tokenizer.model"), missing=ArtifactNotFoundError, error=ArtifactFormatError)
        return _Source(d.local("tokenizer.model"), hashlib.sha256(spm_raw).hexdigest(), spm_raw=spm_raw)
    raise ArtifactNotFoundError(
        "no tokenizer in the model directory: neither tokenizer.json nor vocab.json with merges.txt",
        path=str(tok_path),
        hint="ctxlock reads HF tokenizer files here; export them with transformers' save_pretrained",
    )


def _templates(d: _Dir, configs: _Configs) -> TemplateSet | None:
    """Template precedence follows transformers: chat_template.jinja, then chat_template.json, then the config;
    `additional_chat_templates/*.jinja` are added under their names."""
    templates: TemplateSet | None = None
    jinja = d.local("chat_template.jinja")
    if present(jinja):
        templates = TemplateSet.single(load_template_file(jinja, id=f"{d.model_id}/chat_template.jinja"))
    elif present(d.local("chat_template.json")):
        data = read_json(d.local("chat_template.json"))
        templates = templates_from_config(
            data.get("chat_template") if isinstance(data, dict) else None,
            where=str(d.root / "chat_template.json"),
            model_id=d.model_id,
        )
    else:
        templates = templates_from_config(
            configs.config.get("chat_template"), where=f"{configs.config_path}:chat_template", model_id=d.model_id
        )
    extra_dir = d.root / "additional_chat_templates"
    if extra_dir.is_dir():
        names = list(templates.names) if templates else []
        items = list(templates.templates) if templates else []
        for f in sorted(extra_dir.glob("*.jinja")):
            names.append(f.stem)
            path = d.local(f"additional_chat_templates/{f.name}")
            items.append(load_template_file(path, id=f"{d.model_id}/{f.stem}"))
        templates = TemplateSet(tuple(items), tuple(names))
    return templates


def _special_tokens(configs: _Configs, source: _Source, pipeline: Pipeline) -> dict[str, str]:
    """The template variables bos_token, eos_token, ... (and a model's own `image_token`, ...): the named special
    tokens the tokenizer class ends up with, which transformers passes to the template as its `special_tokens_map`.
    `ctxlock.tokenizer.backends` finds them in transformers' order of sources: tokenizer_config.json, and when
    it has no `added_tokens_decoder`, special_tokens_map.json over it; then the class's defaults."""
    where = configs.stm_path if configs.stm is not None else configs.config_path
    return {name: special_token(value, f"{where}:{name}") for name, value in pipeline.special_tokens}


def _hf_pipeline(
    file_text: str | None,
    slow: tuple[Path, Path] | None,
    file_sha: str,
    source: Path,
    *,
    config: dict[str, Any],
    model_config: dict[str, Any],
    added_json: Any,
    stm: Any,
    mode: str,
    spm_raw: bytes | None = None,
) -> Any:
    """The tokenizer transformers builds for these files (`hf_classes.build_pipeline`), cached by the digest of
    everything it reads (a 150k vocabulary takes seconds to rebuild)."""
    import tokenizers  # heavy: imported when a directory is first loaded

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
    cached = load_cached("hf-pipeline", key)
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
        # SentencePiece's reader, a lazy export of the backends: imported for a .model only
        file_data, spm_specials = spm_bpe(backends.read_model_info(spm_raw, source=str(source)).pieces)
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
        store_cached("hf-pipeline", key, {"pipeline": stored})
    return pipeline


def _tokenizer_json(text: str, path: Path) -> dict[str, Any]:
    data = parse_json(text, path, "tokenizer.json")
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
    vocab_text, merges_text = read_text(vocab_path), read_text(merges_path)
    vocab = parse_json(vocab_text, vocab_path)
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
    return bare_bpe(vocab, merges)


__all__ = ["load_hf_dir"]
