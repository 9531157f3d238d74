"""Load a model's input artifacts: the tokenizer, the chat template(s) and the special-token variables.

A model spec is one of:
- a built-in name (`ctxlock models`): data directories shipped in `ctxlock/models/`;
- an HF model directory: `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` (or an inline
  `chat_template`, or `additional_chat_templates/`), `special_tokens_map.json`;
- any directory with a `ctxlock.json` manifest (what the built-ins are).

Every file a config names must resolve inside the model directory, symlinks included.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import ArtifactFormatError, ArtifactNotFoundError, PathTraversalError
from ..frozen import FrozenDict, freeze
from ..template import ChatTemplate, TemplateSet, compile_template
from ..tokenizer import Tokenizer

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "models"
DEFAULT_MODEL = "mistral-nemo"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True)
class ModelArtifacts:
    id: str
    source: str
    tokenizer: Tokenizer
    templates: TemplateSet | None
    special_tokens: FrozenDict  # template variables: bos_token, eos_token, ...
    pad_id: int | None
    description: str = ""

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
    if not isinstance(relative, str) or not relative:
        raise ArtifactFormatError(f"{field} must be a non-empty relative path", path=f"{config}:{field}")
    root = root.resolve()
    limit = (boundary or root).resolve()
    named = Path(os.path.normpath(root / relative))
    target = (root / relative).resolve()
    if not named.is_relative_to(root) or not target.is_relative_to(limit):
        raise PathTraversalError(
            f"{field} points outside the model directory: {relative!r} resolves to {target}",
            path=f"{config}:{field}",
            hint=f"keep every file a config names inside {root}",
        )
    return target


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ArtifactNotFoundError(f"missing file {path.name}", path=str(path)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactFormatError(f"not valid JSON: {exc}", path=str(path)) from None


def _token_content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def load_template_file(path: str | Path, *, id: str | None = None) -> ChatTemplate:
    p = Path(path)
    try:
        source = p.read_text("utf-8")
    except FileNotFoundError:
        raise ArtifactNotFoundError(
            "template file not found", path=str(p), hint="pass an existing .jinja file to --template"
        ) from None
    except UnicodeDecodeError as exc:
        raise ArtifactFormatError(f"template is not UTF-8: {exc}", path=str(p)) from None
    template = ChatTemplate(source=source, id=id or p.name, origin=str(p))
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


def _load_hf_dir(root: Path, *, boundary: Path | None = None, model_id: str | None = None) -> ModelArtifacts:
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
    ):
        local(name)  # refuse escaping symlinks before reading anything
    config_path = local("tokenizer_config.json")
    config = _read_json(config_path) if config_path.is_file() else {}
    if not isinstance(config, dict):
        raise ArtifactFormatError("tokenizer_config.json must hold a JSON object", path=str(config_path))
    tok_path = (
        inside(root, config["tokenizer_file"], field="tokenizer_file", config=config_path)
        if config.get("tokenizer_file")
        else local("tokenizer.json")
    )
    if not tok_path.is_file():
        raise ArtifactNotFoundError(
            "no tokenizer.json in the model directory",
            path=str(tok_path),
            hint="ctxlock reads HF fast-tokenizer files here; export one with transformers' save_pretrained",
        )
    tokenizer = HFTokenizer(tok_path.read_text("utf-8"), id=f"{model_id}/{tok_path.name}", source=str(tok_path))

    # Template precedence follows transformers: chat_template.jinja, then chat_template.json, then the config.
    templates: TemplateSet | None = None
    jinja = local("chat_template.jinja")
    if jinja.is_file():
        templates = TemplateSet.single(load_template_file(jinja, id=f"{model_id}/chat_template.jinja"))
    elif local("chat_template.json").is_file():
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
    stm_path = local("special_tokens_map.json")
    stm = _read_json(stm_path) if stm_path.is_file() else {}
    for name in SPECIAL_TOKEN_NAMES:
        value = _token_content(config.get(name)) or _token_content(stm.get(name) if isinstance(stm, dict) else None)
        if value is not None:
            special[name] = value
    return _finish(model_id, str(root), tokenizer, templates, special, description="HF model directory")


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
    model_id = root.name
    spec = manifest.get("tokenizer")
    if not isinstance(spec, dict) or "format" not in spec:
        raise ArtifactFormatError("manifest needs a tokenizer object with a format", path=f"{manifest_path}:tokenizer")
    fmt = spec["format"]
    tokenizer: Tokenizer
    if fmt == "book":
        from ..tokenizer.book import BookTokenizer

        tokenizer = BookTokenizer(spec["vocab"], control=spec["control"], unk=spec["unk"], id=model_id)
    elif fmt == "tekken":
        from ..tokenizer.tekken import TekkenTokenizer

        tokenizer = TekkenTokenizer(_resource_or_file(root, spec, manifest_path), id=f"{model_id}/tekken")
    elif fmt == "hf-tokenizers":
        from ..tokenizer.hf import HFTokenizer

        path = inside(root, spec.get("file", ""), field="tokenizer.file", config=manifest_path)
        tokenizer = HFTokenizer(path.read_text("utf-8"), id=f"{model_id}/{path.name}", source=str(path))
    elif fmt == "gguf":
        path = inside(root, spec.get("file", ""), field="tokenizer.file", config=manifest_path)
        tokenizer = _load_gguf(path).tokenizer
    elif fmt == "tiktoken":
        from ..tokenizer.tiktoken_file import from_manifest as tiktoken_from_manifest

        path = inside(root, spec.get("file", ""), field="tokenizer.file", config=manifest_path)
        tokenizer = tiktoken_from_manifest(spec, path, f"{model_id}/{path.name}", manifest=manifest_path)
    elif fmt == "sentencepiece":
        from ..tokenizer.sentencepiece import from_manifest as sentencepiece_from_manifest

        path = _resource_or_file(root, spec, manifest_path)
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
    special = {k: v for k, v in (manifest.get("special_tokens") or {}).items() if isinstance(v, str)}
    return _finish(model_id, str(root), tokenizer, templates, special, manifest.get("description", ""))


def _resource_or_file(root: Path, spec: Mapping[str, Any], manifest_path: Path) -> Path:
    if "package" in spec:
        import importlib.util

        found = importlib.util.find_spec(spec["package"])
        if found is None or not found.submodule_search_locations:
            raise ArtifactNotFoundError(
                f"package {spec['package']!r} is not installed", path=f"{manifest_path}:tokenizer.package"
            )
        base = Path(next(iter(found.submodule_search_locations)))
        return inside(base, spec["resource"], field="tokenizer.resource", config=manifest_path)
    return inside(root, spec.get("file", ""), field="tokenizer.file", config=manifest_path)


def _mistral_generated_template(tokenizer_file: Path, model_id: str) -> ChatTemplate:
    # The vendor's own generator, so the template is the one mistral-common stands behind for this tokenizer.
    import mistral_common

    from . import conversion_cache

    # Generating builds mistral-common's tokenizer (about 1.5 s): cache the source by file digest and version.
    kind = f"mistral-template-mistral-common-{mistral_common.__version__}"
    sha = conversion_cache.file_sha256(tokenizer_file)
    cached = conversion_cache.load(kind, sha)
    if cached is not None:
        source = cached["source"]
    else:
        from mistral_common.integrations.chat_templates.chat_templates import convert_tokenizer_to_chat_template

        source = convert_tokenizer_to_chat_template(tokenizer_file)
        conversion_cache.store(kind, sha, {"source": source})
    template = ChatTemplate(
        source,
        id=f"{model_id}/generated",
        origin=f"mistral_common {mistral_common.__version__} template_generator({tokenizer_file.name})",
    )
    compile_template(template)
    return template


def _fingerprint(root: Path) -> tuple[tuple[str, int, int], ...]:
    return tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.iterdir()) if p.is_file())


def _load_gguf(path: Path) -> ModelArtifacts:
    """A GGUF file: its vocabulary converted natively (cached by sha256) and its embedded chat template(s)."""
    from ..tokenizer.hf import HFTokenizer
    from . import conversion_cache
    from .gguf import conversion, read_vocab

    sha = conversion_cache.file_sha256(path)
    data = conversion_cache.load("gguf", sha)
    if data is None:
        data = conversion(read_vocab(path))
        conversion_cache.store("gguf", sha, data)
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
def _load_hub_cached(snapshot: Path, repo_id: str, fingerprint: tuple[tuple[str, int, int], ...]) -> ModelArtifacts:
    # Snapshot files are symlinks into the repo's blobs/: the repo directory is the containment boundary.
    return _load_hf_dir(snapshot, boundary=snapshot.parent.parent, model_id=repo_id)


@lru_cache(maxsize=32)
def _load_cached(root: Path, fingerprint: tuple[tuple[str, int, int], ...]) -> ModelArtifacts:
    if root.is_file():
        return _load_gguf(root)
    if (root / "ctxlock.json").is_file():
        return _load_manifest_dir(root)
    return _load_hf_dir(root)


def load_artifacts(spec: str | Path | None = None) -> ModelArtifacts:
    """Resolve a model spec (built-in name or directory) offline and load its artifacts."""
    name = DEFAULT_MODEL if spec is None else str(spec)
    builtin = BUILTIN_DIR / name
    if "/" not in name and "\\" not in name and (builtin / "ctxlock.json").is_file():
        root = builtin
    else:
        root = Path(name).expanduser()
        from .hub import is_hub_id, resolve_hub_model

        if not root.exists() and is_hub_id(name):
            # org/name: the local HF hub cache, offline; never downloads.
            snapshot = resolve_hub_model(name)
            return _load_hub_cached(snapshot, name, _fingerprint(snapshot))
        if not root.exists():
            known = ", ".join(n for n, _ in builtin_models())
            raise ArtifactNotFoundError(
                f"no built-in model or directory named {name!r}",
                path=name,
                hint=f"built-in models: {known}; or pass an HF model directory, a .gguf file, or org/name from the "
                "local HF hub cache",
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
    return _load_cached(root, _fingerprint(root))
