"""A Qwen2-VL model directory built from real artifacts, and generated images.

The tokenizer is llama.cpp's qwen2 vocabulary (converted by transformers, `fetched.hf_tokenizer_dir("qwen2")`),
whose added tokens 151646-151664 are named `[PADn]` there; Qwen2.5's published tokenizer config names them, and
the fixture restores those names (151646-151656, all special, as Qwen2-VL's tokenizer has them). The chat
template is the one published with Qwen2-VL-7B-Instruct (tokenizer_config.json), and preprocessor_config.json
holds the hub's values (max_pixels 12845056, where the class default is 1003520).
"""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

import fetched

QWEN2VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)

# Qwen2.5's tokenizer_config.json names for ids 151646-151656 (all special there).
QWEN_NAMES = {
    151646: "<|object_ref_start|>",
    151647: "<|object_ref_end|>",
    151648: "<|box_start|>",
    151649: "<|box_end|>",
    151650: "<|quad_start|>",
    151651: "<|quad_end|>",
    151652: "<|vision_start|>",
    151653: "<|vision_end|>",
    151654: "<|vision_pad|>",
    151655: "<|image_pad|>",
    151656: "<|video_pad|>",
}

HUB_PREPROCESSOR = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
}


QWEN3VL_PREPROCESSOR = {  # Qwen3-VL checkpoints' preprocessor_config.json values
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "processor_class": "Qwen3VLProcessor",
}


def qwen35_template() -> str:
    """The Qwen3.5 chat template among llama.cpp's templates (it renders image and video parts)."""
    return (fetched.templates_dir() / "Qwen3.5-4B.jinja").read_text(encoding="utf-8")


def build_qwen2vl_dir(
    target: Path, preprocessor: dict | None = None, *, template: str = QWEN2VL_TEMPLATE, vocab: str = "qwen2"
) -> Path:
    """A Qwen-VL model directory: llama.cpp's `vocab` vocabulary ("qwen2", or "qwen35" for Qwen3-VL) with the
    vision tokens named, the template, and preprocessor_config.json."""
    source = fetched.hf_tokenizer_dir(vocab)
    target.mkdir(parents=True, exist_ok=True)
    tok = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]  # the GGUF's vocabulary lists the added tokens too, under the same names
    for tid, name in QWEN_NAMES.items():
        assert vocab.pop(f"[PAD{tid}]") == tid
        vocab[name] = tid
    for entry in tok["added_tokens"]:
        if entry["id"] in QWEN_NAMES:
            entry["content"] = QWEN_NAMES[entry["id"]]
            entry["special"] = True
    (target / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.update(
        {
            "chat_template": template,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "bos_token": None,
            "model_max_length": 32768,
        }
    )
    config.pop("is_local", None)
    config.pop("local_files_only", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    if preprocessor is not None:
        (target / "preprocessor_config.json").write_text(json.dumps(preprocessor), encoding="utf-8")
    return target


def copy_dir(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def png(image: Image.Image, **save: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG", **save)
    return buf.getvalue()


def encode(image: Image.Image, fmt: str, **save: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **save)
    return buf.getvalue()


def data_url(data: bytes, media_type: str | None = None) -> str:
    if media_type is None:
        media_type = {b"\xff\xd8": "image/jpeg", b"GI": "image/gif"}.get(data[:2], "image/png")
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """A generated image of the mode: smooth gradients plus noise, so resampling has something to do."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([(xx * 255 // max(width, 1)), (yy * 255 // max(height, 1)), ((xx + yy) * 7) % 256], axis=-1)
    rgb = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
    img = Image.fromarray(rgb, "RGB")
    if mode == "RGB":
        return img
    if mode == "RGBA":
        alpha = rng.integers(0, 256, (height, width), dtype=np.uint8)
        return Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    if mode == "I;16":
        return Image.fromarray((base[..., 0].astype(np.uint32) * 257).astype(np.uint16))
    if mode == "P":
        pal = img.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
        pal.info["transparency"] = 3
        return pal
    return img.convert(mode)


def with_orientation(image: Image.Image, orientation: int) -> bytes:
    """A JPEG carrying an EXIF orientation tag."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(image.convert("RGB"), "JPEG", exif=exif.tobytes(), quality=95)
