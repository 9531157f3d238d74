"""Which image family a model directory's `preprocessor_config.json` names.

A family module registers its `image_processor_type` names here (transformers' class names, with and without the
`Fast`/`Pil` suffixes), and a constructor from the config's values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ctxlock.errors import MediaError
from ctxlock.multimodal._base import ImageFamily
from ctxlock.multimodal._llava import LlavaFamily
from ctxlock.multimodal._pixtral import PixtralFamily
from ctxlock.multimodal._qwen2vl import Qwen2VL
from ctxlock.multimodal._qwen3vl import Qwen3VL

_Builder = Callable[[Mapping[str, Any]], ImageFamily]


def _llava(config: Mapping[str, Any]) -> ImageFamily:
    """A CLIP image processor is LLaVA's only when the checkpoint says so (`processor_class: LlavaProcessor`): CLIP
    preprocessing alone does not say how many placeholders an image takes. The processor's values (`patch_size`,
    `vision_feature_select_strategy`, `num_additional_image_tokens`, `image_token`) are read from the same mapping
    when present, else LLaVA-1.5's."""
    if config.get("processor_class") != "LlavaProcessor":
        raise MediaError(
            f"a CLIPImageProcessor with processor_class {config.get('processor_class')!r}: ctxlock knows it only "
            "as LLaVA's (processor_class LlavaProcessor)",
            path="preprocessor_config.json:processor_class",
            hint="pass family= to name the image family",
        )
    return LlavaFamily.from_configs(config, config)


def _qwen_vl(config: Mapping[str, Any]) -> ImageFamily:
    """Qwen3-VL checkpoints name Qwen2-VL's image processor class; `processor_class` tells them apart."""
    if config.get("processor_class") in ("Qwen3VLProcessor", "Qwen3VLMoeProcessor"):
        return Qwen3VL.from_preprocessor_config(config)
    return Qwen2VL.from_preprocessor_config(config)


FAMILIES: dict[str, _Builder] = {
    "Qwen2VLImageProcessor": _qwen_vl,
    "CLIPImageProcessor": _llava,
    # not a transformers class: a Tekken tokenizer's `image` section (mistral-common's image encoder), which the
    # artifacts layer passes under this name (artifacts/manifest.py)
    "MistralCommonImageEncoder": PixtralFamily.from_config,
}


def _base_name(name: str) -> str:
    for suffix in ("Fast", "Pil"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def family_for(config: Mapping[str, Any] | None, *, path: str | None = None) -> ImageFamily | None:
    """The family a preprocessor config names, built from its values; None without a config. An unknown image
    processor type is an error (never a guess)."""
    if config is None:
        return None
    name = config.get("image_processor_type")
    if not isinstance(name, str):
        raise MediaError(
            "preprocessor_config.json names no image_processor_type",
            path=path,
            hint=f"ctxlock knows: {', '.join(sorted(FAMILIES))}",
        )
    builder = FAMILIES.get(_base_name(name))
    if builder is None:
        raise MediaError(
            f"image processor {name!r} is not one ctxlock implements",
            path=path,
            hint=f"ctxlock knows: {', '.join(sorted(FAMILIES))}",
        )
    return builder(config)
