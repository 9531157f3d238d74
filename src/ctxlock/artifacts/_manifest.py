"""A directory with a `ctxlock.json` manifest (what the built-in models are): the tokenizer entry is loaded by the
backend its `format` names (`registry`), the template is a file or mistral-common's generator, and the special
tokens are listed.

    {"description": "...",
     "tokenizer": {"format": "tekken", "package": "mistral_common", "resource": "data/tekken_240911.json"},
     "template": {"generator": "mistral_common.convert_tokenizer_to_chat_template"},
     "special_tokens": {"bos_token": "<s>"}}
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ctxlock.artifacts._common import (
    ModelArtifacts,
    finish,
    inside,
    load_template_file,
    present,
    read_json,
    read_text,
    regular,
    special_token,
)
from ctxlock.artifacts._registry import backend, formats_hint
from ctxlock.core import freeze
from ctxlock.economics import capacity_from_files
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError
from ctxlock.outside import file_sha256, load_cached, store_cached
from ctxlock.template import ChatTemplate, TemplateSet, compile_template, patch_template
from ctxlock.tokenizer import Tokenizer


@dataclass(frozen=True)
class _Files:
    """`ManifestFiles` for one manifest: every name is checked against the model directory."""

    root: Path
    spec: Mapping[str, Any]
    manifest: Path

    def file(self, *, packaged: bool = False) -> Path:
        path = (
            resource_or_file(self.root, self.spec, self.manifest)
            if packaged
            else inside(self.root, self.spec.get("file", ""), field="tokenizer.file", config=self.manifest)
        )
        return regular(path, f"{self.manifest}:tokenizer.file")

    def text(self) -> tuple[Path, str]:
        path = inside(self.root, self.spec.get("file", ""), field="tokenizer.file", config=self.manifest)
        return path, read_text(path)


def load_manifest_dir(root: Path) -> ModelArtifacts:
    manifest_path = root / "ctxlock.json"
    manifest = read_json(manifest_path)
    if not isinstance(manifest, dict):
        raise ArtifactFormatError("a ctxlock.json manifest holds a JSON object", path=str(manifest_path))
    model_id = root.name
    spec = manifest.get("tokenizer")
    if not isinstance(spec, dict) or "format" not in spec:
        raise ArtifactFormatError("manifest needs a tokenizer object with a format", path=f"{manifest_path}:tokenizer")
    fmt = spec["format"]
    cls = backend(fmt)
    if cls is None:
        raise ArtifactFormatError(
            f"unknown tokenizer format {fmt!r}", path=f"{manifest_path}:tokenizer.format", hint=formats_hint()
        )
    tokenizer: Tokenizer = cls.from_manifest(spec, _Files(root, spec, manifest_path), model_id)
    templates, image = _manifest_templates(root, manifest, spec, manifest_path, model_id)
    raw_special = manifest.get("special_tokens") or {}
    if not isinstance(raw_special, dict):
        raise ArtifactFormatError("special_tokens must be an object", path=f"{manifest_path}:special_tokens")
    special = {
        k: special_token(v, f"{manifest_path}:special_tokens.{k}") for k, v in raw_special.items() if isinstance(v, str)
    }
    description = manifest.get("description", "")
    if not isinstance(description, str):
        raise ArtifactFormatError("description must be a string", path=f"{manifest_path}:description")
    params_path = inside(root, "params.json", field="params.json", config=manifest_path)
    params = read_json(params_path) if present(params_path) else None
    cap = capacity_from_files(params=params if isinstance(params, dict) else None)
    done = finish(model_id, str(root), tokenizer, templates, special, description, cap)
    if image is None:
        return done
    # mistral-common's image encoder settings, as the image stage reads a preprocessor config (multimodal.registry)
    config = {
        "image_processor_type": "MistralCommonImageEncoder",
        "source": f"{spec.get('resource') or spec.get('file')}:image",
        **image,
    }
    return replace(done, preprocessor=freeze(config))


def _manifest_templates(
    root: Path, manifest: Mapping[str, Any], spec: Mapping[str, Any], manifest_path: Path, model_id: str
) -> tuple[TemplateSet | None, dict[str, Any] | None]:
    """The templates, and the tokenizer's image section when mistral-common's generator is asked for."""
    template_spec = manifest.get("template")
    if isinstance(template_spec, str):
        path = inside(root, template_spec, field="template", config=manifest_path)
        return TemplateSet.single(load_template_file(path, id=f"{model_id}/{Path(template_spec).name}")), None
    if (
        isinstance(template_spec, dict)
        and template_spec.get("generator") == "mistral_common.convert_tokenizer_to_chat_template"
    ):
        template, image = _mistral_generated_template(resource_or_file(root, spec, manifest_path), model_id)
        return TemplateSet.single(template), image
    if template_spec is not None:
        raise ArtifactFormatError("template must be a file name or a known generator", path=f"{manifest_path}:template")
    return None, None


def resource_or_file(root: Path, spec: Mapping[str, Any], manifest_path: Path) -> Path:
    if "package" in spec:
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
            extra = spec.get("extra")
            raise ArtifactNotFoundError(
                f"package {spec['package']!r} is not installed",
                path=f"{manifest_path}:tokenizer.package",
                hint=f"pip install 'ctxlock[{extra}]'" if isinstance(extra, str) and extra.isidentifier() else None,
            )
        base = Path(next(iter(found.submodule_search_locations)))
        return inside(base, spec.get("resource"), field="tokenizer.resource", config=manifest_path)
    return inside(root, spec.get("file", ""), field="tokenizer.file", config=manifest_path)


def _image_section(tokenizer_file: Path) -> dict[str, Any] | None:
    """A Tekken file's `image` object (patch size, max image size, spatial merge), or None."""
    if tokenizer_file.suffix != ".json":
        return None
    image = read_json(tokenizer_file).get("image")
    return dict(image) if isinstance(image, dict) else None


def _mistral_generated_template(tokenizer_file: Path, model_id: str) -> tuple[ChatTemplate, dict[str, Any] | None]:
    # The vendor's own generator, so the template is the one mistral-common stands behind for this tokenizer.
    import mistral_common  # heavy: imported when a manifest asks for the generated template

    # Generating builds mistral-common's tokenizer (about 1.5 s): cache the source by file digest and version.
    # With it, the tokenizer file's image section (Tekken's `image`: mistral-common's ImageConfig), or None.
    kind = f"mistral-template-mistral-common-{mistral_common.__version__}-image"
    sha = file_sha256(tokenizer_file)
    cached = load_cached(kind, sha)
    if cached is not None:
        source, image = cached["source"], cached.get("image")
    else:
        from mistral_common.integrations.chat_templates.chat_templates import convert_tokenizer_to_chat_template

        source = convert_tokenizer_to_chat_template(tokenizer_file)
        image = _image_section(tokenizer_file)
        store_cached(kind, sha, {"source": source, "image": image})
    origin = f"mistral_common {mistral_common.__version__} template_generator({tokenizer_file.name})"
    # Patched where the generated template and mistral-common's encode_chat_completion disagree (ctxlock.template).
    template = ChatTemplate(
        patch_template(source, origin=origin, images=image is not None),
        id=f"{model_id}/generated",
        origin=f"{origin} + ctxlock.mistral shapes",
    )
    compile_template(template)
    return template, image


__all__ = ["load_manifest_dir", "resource_or_file"]
