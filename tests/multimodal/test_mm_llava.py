"""LLaVA-1.5 images (ctxlock.multimodal._llava) against transformers 5.24: `CLIPImageProcessorPil` pixel values
within 1e-5 over generated images, and `LlavaProcessor`'s expanded text and ids for a fixture model directory (the
Llama-2 SentencePiece vocabulary from the fetched llama.cpp artifacts, `<image>` added as id 32000, a LLaVA-1.5
chat template, LLaVA-1.5's preprocessor and processor configs written here)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, CLIPImageProcessorPil, LlavaProcessor

import ctxlock
import fetched as artifacts
import reference
from ctxlock.errors import CtxlockError, ImageSizeError
from ctxlock.multimodal import _media as media
from ctxlock.multimodal._base import ColourPolicy, ImageFamily, Orientation
from ctxlock.multimodal._llava import LlavaFamily, shortest_edge_size
from hypothesis_profiles import examples
from mm_images import as_decoded, corpus, corpus_labels, exif_rotated, make, reopen, to_bytes

pytestmark = pytest.mark.reference

LLAVA_PREPROCESSOR = {
    "crop_size": {"height": 336, "width": 336},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "CLIPImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "processor_class": "LlavaProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 336},
}
LLAVA_PROCESSOR = {
    "image_token": "<image>",
    "num_additional_image_tokens": 1,
    "patch_size": 14,
    "processor_class": "LlavaProcessor",
    "vision_feature_select_strategy": "default",
}
# LLaVA-1.5's chat template (the llava-hf conversion's shape): images first, then text, "USER: ... ASSISTANT:".
LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


@pytest.fixture(scope="module")
def clip336():
    return CLIPImageProcessorPil(
        **{k: v for k, v in LLAVA_PREPROCESSOR.items() if "class" not in k and "type" not in k}
    )


@pytest.mark.parametrize("label", corpus_labels())
def test_pixel_values_equal_clip_image_processor_pil(clip336, label) -> None:
    data = dict(corpus())[label]
    ref = clip336(images=reopen(data), return_tensors="np")["pixel_values"][0]
    # the image processor given a Pillow image: EXIF ignored, alpha composited onto white (as_decoded's policies)
    family = replace(
        LlavaFamily.from_configs(LLAVA_PREPROCESSOR, LLAVA_PROCESSOR),
        orientation=Orientation.IGNORE,
        colour=ColourPolicy.COMPOSITE_WHITE,
    )
    pre = family.preprocess(as_decoded(data))
    assert pre.pixel_values.shape == ref.shape == (3, 336, 336)
    assert pre.pixel_values.dtype == np.float32
    assert np.abs(pre.pixel_values - ref).max() <= 1e-5
    assert pre.plan.n_tokens == 576
    assert family.plan(media.read_header(data)) == pre.plan


@pytest.mark.parametrize("label", corpus_labels()[::5])
def test_class_defaults_224(label) -> None:
    data = dict(corpus())[label]
    ref = CLIPImageProcessorPil()(images=reopen(data), return_tensors="np")["pixel_values"][0]
    family = LlavaFamily(shortest_edge=224, crop_height=224, crop_width=224)
    pre = family.preprocess(as_decoded(data))
    assert np.abs(pre.pixel_values - ref).max() <= 1e-5
    assert pre.plan.n_tokens == 256


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(1, 5000), st.integers(1, 5000))
def test_resize_size_equals_transformers(h, w) -> None:
    from transformers.image_transforms import get_resize_output_image_size

    arr = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=(h, w, 3), strides=(0, 0, 0))
    ref = get_resize_output_image_size(arr, size=336, default_to_square=False, input_data_format="channels_last")
    assert shortest_edge_size(h, w, 336) == tuple(ref)


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("llava")
    tok = AutoTokenizer.from_pretrained(artifacts.hf_tokenizer_dir("llama-spm"))
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tok.save_pretrained(out)
    (out / "chat_template.jinja").write_text(LLAVA_TEMPLATE, encoding="utf-8")
    (out / "preprocessor_config.json").write_text(json.dumps(LLAVA_PREPROCESSOR), encoding="utf-8")
    (out / "processor_config.json").write_text(json.dumps(LLAVA_PROCESSOR), encoding="utf-8")
    return out


def _messages(urls: list[str], *, anthropic: bool = False) -> list[dict]:
    def image(url: str) -> dict:
        if anthropic:  # canonical: {"type": "image", "url": "data:..."}, the part type HF templates read
            media, data = url[len("data:") :].split(";base64,")
            return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
        return {"type": "image", "url": url}

    return [
        {"role": "user", "content": [image(urls[0]), {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A gradient."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "And these?"},
                image(urls[1]),
                image(urls[2]),
            ],
        },
    ]


def _files() -> tuple[list[bytes], list[str]]:
    """RGB PNG, RGBA PNG (alpha dropped by load_image), CMYK TIFF, an EXIF-rotated (6) JPEG, as data: URLs."""
    files = [
        to_bytes(make(640, 480, "RGB", 1)),
        to_bytes(make(300, 900, "RGBA", 2)),
        to_bytes(make(999, 1000, "CMYK", 3)),
        exif_rotated(500, 200, 6, seed=4),
    ]
    kinds = ["image/png", "image/png", "image/tiff", "image/jpeg"]
    return files, [f"data:{k};base64,{base64.b64encode(f).decode()}" for k, f in zip(kinds, files, strict=True)]


def _messages4(urls: list[str], form: str = "hf") -> list[dict]:
    """Four images over three user turns; `form`: "hf" ({"type": "image", "url": ...}, what HF templates read),
    "openai" (image_url) or "anthropic" (base64 source)."""
    messages = _messages(urls[:3], anthropic=form == "anthropic")
    image = _messages([urls[3]] * 3, anthropic=form == "anthropic")[0]["content"][0]
    messages += [
        {"role": "assistant", "content": [{"type": "text", "text": "Yes."}]},
        {"role": "user", "content": [image, {"type": "text", "text": "Turned?"}]},
    ]
    if form == "openai":
        for m in messages:
            m["content"] = [
                {"type": "image_url", "image_url": {"url": p["url"]}} if p["type"] == "image" else p
                for p in m["content"]
            ]
    return messages


def test_ids_equal_llava_processor_apply_chat_template(llava_dir) -> None:
    """The raw request through `LlavaProcessor.apply_chat_template(tokenize=True)` (transformers loads each data:
    URL with load_image: EXIF applied, convert("RGB")) and through `run_images`: the same ids, `<s>` included,
    the same span map and pixel values."""
    processor = LlavaProcessor.from_pretrained(llava_dir)
    assert processor.tokenizer.convert_tokens_to_ids("<image>") == 32000
    _, urls = _files()
    ref = processor.apply_chat_template(
        _messages4(urls), add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="np"
    )
    prompt = processor.apply_chat_template(_messages4(urls), add_generation_prompt=True)
    ids = ref["input_ids"][0].tolist()
    assert ids[0] == processor.tokenizer.bos_token_id == 1 and not prompt.startswith("<s>")

    model = ctxlock.load(str(llava_dir))
    assert isinstance(model.image_family, LlavaFamily)  # preprocessor_config.json: CLIPImageProcessor + LlavaProcessor
    # an Anthropic base64 source becomes the canonical {"type": "image"} part this template reads (so does an OpenAI
    # image_url part: test_raw_openai_request_equals_llava_processor)
    mm = model.run_images({"messages": _messages4(urls, "anthropic")}, add_generation_prompt=True)
    assert mm.rendered.text == prompt
    assert mm.text == prompt.replace("<image>", "<image>" * 576)  # LlavaProcessor's expanded text
    assert list(mm.ids) == ids  # <s> included
    assert mm.added.before == (1,) and mm.added.after == ()
    assert mm.to_json()["added_special_tokens"]["before"] == [1]
    starts = [k for k, t in enumerate(ids) if t == 32000 and ids[k - 1] != 32000]
    assert mm.span_map() == {i: (s, s + 576) for i, s in enumerate(starts)}
    assert mm.pixel_values.shape == ref["pixel_values"].shape == (4, 3, 336, 336)
    assert np.abs(mm.pixel_values - ref["pixel_values"]).max() <= 1e-5
    # header-only counting agrees with the ids (the added <s> counted as the template's)
    counts = model.count({"messages": _messages4(urls, "anthropic")}, add_generation_prompt=True)
    assert counts.total == len(ids)


def test_template_that_writes_bos_gets_no_second_one(llava_dir, tmp_path) -> None:
    """A template that writes `{{ bos_token }}` itself: the processor adds nothing (the prompt starts with it), nor
    does ctxlock."""
    out = tmp_path / "llava-bos"
    out.mkdir()
    for f in llava_dir.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    (out / "chat_template.jinja").write_text("{{ bos_token }}" + LLAVA_TEMPLATE, encoding="utf-8")
    processor = LlavaProcessor.from_pretrained(out)
    _, urls = _files()
    ref = processor.apply_chat_template(
        _messages4(urls), add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="np"
    )
    ids = ref["input_ids"][0].tolist()
    assert ids[0] == 1 and ids[1] != 1
    mm = ctxlock.load(str(out)).run_images({"messages": _messages4(urls, "anthropic")}, add_generation_prompt=True)
    assert list(mm.ids) == ids
    assert mm.added.before == () and "starts with '<s>'" in mm.added.rule


def test_family_keeps_the_interface() -> None:
    family = LlavaFamily()
    assert isinstance(family, ImageFamily)
    assert family.image_tokens() == 576 and family.template_placeholder == "<image>"
    assert family.params()["crop_size"] == (336, 336)


@pytest.mark.parametrize(("h", "w"), [(0, 5), (5, 0), (1, 201), (4000, 1)])
def test_bad_sizes_are_typed_errors(h, w) -> None:
    with pytest.raises(ImageSizeError) as info:
        LlavaFamily().plan_size(h, w)
    assert isinstance(info.value, CtxlockError) and info.value.hint


@pytest.mark.parametrize(
    ("pre", "proc"),
    [
        ({"do_center_crop": False}, {}),
        ({"size": {"height": 336, "width": 336}}, {}),
        ({"resample": 9}, {}),
        ({}, {"patch_size": 0}),
        ({}, {"vision_feature_select_strategy": "weird"}),
    ],
)
def test_bad_configs_are_typed_errors(pre, proc) -> None:
    with pytest.raises(ImageSizeError):
        LlavaFamily.from_configs(pre, proc)


def test_fit_counts_the_processors_bos(llava_dir) -> None:
    """fit_context on a LLaVA model counts the `<s>` run_images adds: its total is the fitted ids' length, images
    kept or dropped whole."""
    from ctxlock.budget._fit import BudgetPolicy, fit_context

    model = ctxlock.load(str(llava_dir))
    _, urls = _files()
    req = model.parse({"messages": _messages4(urls, "anthropic")})
    full = model.run_images(req, decode=False, add_generation_prompt=True)
    assert full.ids[0] == 1
    kept_images = set()
    for budget in (len(full.ids), len(full.ids) - 1, 1300):
        fitted = fit_context(req, model, BudgetPolicy(max_input_tokens=budget))
        assert fitted.input_tokens <= budget
        expanded = model.run_images(fitted.request, decode=False, add_generation_prompt=True)
        assert list(fitted.ids) == list(expanded.ids) and fitted.ids[0] == 1
        kept_images.add(len(expanded.images))
    assert 4 in kept_images and len(kept_images) > 1  # all kept at the full size, fewer below


def _openai_forms(urls: list[str], form: str) -> list[dict]:
    """`_messages4` as an OpenAI client sends it: `{"image_url": {"url"}}`, the URL-string form vLLM accepts, or
    with a `detail`."""
    messages = _messages4(urls, "openai")
    for m in messages:
        for p in m["content"]:
            if p["type"] == "image_url" and form == "string":
                p["image_url"] = p["image_url"]["url"]
            elif p["type"] == "image_url" and form == "detail":
                p["image_url"]["detail"] = "low"
    return messages


@pytest.mark.parametrize("form", ["object", "string", "detail"])
def test_raw_openai_request_equals_llava_processor(llava_dir, form) -> None:
    """A raw OpenAI request (image_url parts) to a LLaVA model: `LlavaProcessor.apply_chat_template` normalizes
    each image_url block to `{"type": "image", "url": ...}` before its template runs, so the template's
    `selectattr('type', 'equalto', 'image')` sees all four; ctxlock gives the template the same parts, hence the
    same text, ids, span map and pixel values."""
    processor = LlavaProcessor.from_pretrained(llava_dir)
    _, urls = _files()
    messages = _openai_forms(urls, form)
    kwargs = {"add_generation_prompt": True, "tokenize": True, "return_dict": True, "return_tensors": "np"}
    ref = processor.apply_chat_template(json.loads(json.dumps(messages)), **kwargs)
    prompt = processor.apply_chat_template(json.loads(json.dumps(messages)), add_generation_prompt=True)
    assert prompt.count("<image>") == 4
    mm = ctxlock.load(str(llava_dir)).run_images({"messages": messages}, add_generation_prompt=True)
    assert mm.rendered.text == prompt
    ids = ref["input_ids"][0].tolist()
    assert list(mm.ids) == ids
    starts = [k for k, t in enumerate(ids) if t == 32000 and ids[k - 1] != 32000]
    assert mm.span_map() == {i: (s, s + 576) for i, s in enumerate(starts)}
    assert np.abs(mm.pixel_values - ref["pixel_values"]).max() <= 1e-5
    suffix = "" if form == "string" else ".url"
    paths = ["messages[0].content[0]", "messages[2].content[1]", "messages[2].content[2]", "messages[4].content[0]"]
    assert [s.path for s in mm.spans] == [p + ".image_url" + suffix for p in paths]


def test_template_sees_the_parts_transformers_and_vllm_give(llava_dir, tmp_path) -> None:
    """What a template receives for an OpenAI image_url part: a template that prints each part's keys renders the
    same through ctxlock as through `LlavaProcessor.apply_chat_template` (`type,url`); and with vLLM's "openai"
    content format, which hands `{"type": "image"}`, the LLaVA template writes the same `<image>` lines."""
    from ctxlock.template._render import ChatTemplate

    keys = (
        "{% for m in messages %}{% for c in m['content'] %}{{ c|dictsort|map('first')|join(',') }};"
        "{% endfor %}{% endfor %}"
    )
    processor = LlavaProcessor.from_pretrained(llava_dir)
    _, urls = _files()
    for form in ("object", "string", "detail"):
        messages = _openai_forms(urls, form)
        ref = processor.apply_chat_template(json.loads(json.dumps(messages)), chat_template=keys)
        got = ctxlock.load(str(llava_dir)).render({"messages": messages}, chat_template=ChatTemplate(keys, id="keys"))
        image, text = "type,url;", "text,type;"
        assert got.text == ref == image + text * 3 + image * 2 + text + image + text
    warning = next(w for w in got.warnings if w["kind"] == "image_parts_normalized")
    assert warning["path"] == "messages[0].content[0], messages[2].content[1], messages[2].content[2] and 1 more"
    # a text-only model (no preprocessor_config.json): its reference is the tokenizer's apply_chat_template, which
    # passes the image_url part as sent, and so does ctxlock
    text_only = tmp_path / "llava-text-only"
    text_only.mkdir()
    for f in llava_dir.iterdir():
        if f.name not in ("preprocessor_config.json", "processor_config.json"):
            (text_only / f.name).write_bytes(f.read_bytes())
    messages = _openai_forms(urls, "object")
    tok = AutoTokenizer.from_pretrained(text_only)
    ref = tok.apply_chat_template(json.loads(json.dumps(messages)), chat_template=keys, tokenize=False)
    got = ctxlock.load(str(text_only)).render({"messages": messages}, chat_template=ChatTemplate(keys, id="keys"))
    assert got.text == ref and ref.startswith("image_url,type;text,type;")
    assert not any(w["kind"] == "image_parts_normalized" for w in got.warnings)
    vllm = [
        {**m, "content": [{"type": "image"} if p["type"] == "image_url" else p for p in m["content"]]}
        for m in _openai_forms(urls, "object")
    ]
    mm = ctxlock.load(str(llava_dir)).run_images({"messages": _openai_forms(urls, "object")}, decode=False)
    assert mm.rendered.text == reference.reference_render(LLAVA_TEMPLATE, vllm, add_generation_prompt=True)
