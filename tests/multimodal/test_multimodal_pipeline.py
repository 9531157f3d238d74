"""Requests with images through the whole pipeline, against transformers' Qwen2VLProcessor.apply_chat_template.

The model directory is the Qwen2-VL fixture (tests/mm_fixtures.py): the real qwen2 vocabulary with Qwen's token
names restored, Qwen2-VL's published chat template and the hub's preprocessor_config.json.
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from transformers import AutoTokenizer, Qwen2VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

import ctxlock
import mm_fixtures as F
from ctxlock.errors import (
    ContentFormatError,
    ImageDecodeError,
    ImagePlacementError,
    ImageSizeError,
    MediaError,
    MediaSourceError,
    MediaTypeError,
)
from ctxlock.multimodal._pipeline import StageOptions
from ctxlock.multimodal._qwen2vl import Qwen2VL
from hypothesis_profiles import examples

pytestmark = pytest.mark.reference

PAD, START, END = 151655, 151652, 151653


class ImageOnlyProcessor(Qwen2VLProcessor):
    """transformers' Qwen2VLProcessor without its video processor, whose class needs torchvision (absent here):
    everything about images is the class's own code."""

    @classmethod
    def get_attributes(cls) -> list[str]:
        return ["image_processor", "tokenizer"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return F.build_qwen2vl_dir(tmp_path_factory.mktemp("mm") / "qwen2-vl", F.HUB_PREPROCESSOR)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> ctxlock.Model:
    return ctxlock.load(str(model_dir))


@pytest.fixture(scope="module")
def processor(model_dir: Path) -> ImageOnlyProcessor:
    config = {k: v for k, v in F.HUB_PREPROCESSOR.items() if k not in ("image_processor_type", "processor_class")}
    return ImageOnlyProcessor(
        image_processor=Qwen2VLImageProcessorPil(**config),
        tokenizer=AutoTokenizer.from_pretrained(model_dir),
        chat_template=F.QWEN2VL_TEMPLATE,
    )


def openai_image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def hf_messages(messages: list[dict]) -> list[dict]:
    """The same conversation as transformers' processor takes it: {"type": "image", "url": ...} parts."""
    out = []
    for m in messages:
        if isinstance(m["content"], str):
            out.append(m)
            continue
        parts = [_hf_part(p) if p["type"] == "image_url" else p for p in m["content"]]
        out.append({**m, "content": parts})
    return out


def _hf_part(part: dict) -> dict:
    image = part["image_url"]
    return {"type": "image", "url": image if isinstance(image, str) else image["url"]}


def reference(processor: ImageOnlyProcessor, messages: list[dict]):
    out = processor.apply_chat_template(
        hf_messages(messages), tokenize=True, return_dict=True, add_generation_prompt=True, return_tensors="np"
    )
    text = processor.apply_chat_template(hf_messages(messages), tokenize=False, add_generation_prompt=True)
    return out, text


def expected_text(text: str, grids: np.ndarray) -> str:
    pieces = text.split("<|image_pad|>")
    assert len(pieces) == len(grids) + 1
    out = pieces[0]
    for grid, rest in zip(grids, pieces[1:], strict=True):
        out += "<|image_pad|>" * (int(np.prod(grid)) // 4) + rest
    return out


def conversation(images: list[bytes]) -> list[dict]:
    turns: list[dict] = [{"role": "system", "content": "You describe pictures."}]
    for k, data in enumerate(images):
        turns.append({"role": "user", "content": [openai_image(F.data_url(data)), {"type": "text", "text": f"#{k}?"}]})
        turns.append({"role": "assistant", "content": f"Picture {k} shows noise."})
    turns.append({"role": "user", "content": [{"type": "text", "text": "Compare them."}]})
    return turns


def check_parity(model: ctxlock.Model, processor: ImageOnlyProcessor, messages: list[dict]) -> ctxlock.Model:
    ref, ref_text = reference(processor, messages)
    got = model.run_images({"messages": messages})
    assert list(got.ids) == ref["input_ids"][0].tolist()
    assert got.model_input["input_ids"][0].tolist() == list(got.ids)
    assert got.text == expected_text(ref_text, ref["image_grid_thw"])
    assert np.array_equal(got.image_grid_thw, ref["image_grid_thw"])
    assert got.pixel_values.shape == ref["pixel_values"].shape
    assert np.abs(got.pixel_values - ref["pixel_values"]).max() <= 1e-5
    return got


def test_one_image_matches_apply_chat_template(model: ctxlock.Model, processor: ImageOnlyProcessor) -> None:
    data = F.png(F.noise(640, 480))
    got = check_parity(model, processor, [{"role": "user", "content": [openai_image(F.data_url(data))]}])
    ((start, end),) = got.span_map().values()
    assert end - start == got.images[0].n_tokens == 391
    assert got.ids[start - 1] == START and got.ids[end] == END
    assert set(got.ids[start:end]) == {PAD}
    assert got.text[got.spans[0].text_start : got.spans[0].text_end] == "<|image_pad|>" * 391


def test_multi_turn_mixed_images_match(model: ctxlock.Model, processor: ImageOnlyProcessor) -> None:
    images = [
        F.png(F.noise(1, 1)),
        F.encode(F.noise(1200, 300, seed=2), "JPEG"),
        F.with_orientation(F.noise(300, 100, seed=3), 6),
        F.png(F.noise(64, 64, mode="RGBA", seed=4)),
        F.png(F.noise(90, 90, mode="P", seed=5)),
    ]
    got = check_parity(model, processor, conversation(images))
    spans = sorted(got.span_map().values())
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))
    assert [s.path for s in got.spans] == [f"messages[{1 + 2 * k}].content[0].image_url.url" for k in range(5)]


def test_anthropic_and_openai_dialects_give_the_same_input(model: ctxlock.Model) -> None:
    data = F.encode(F.noise(333, 222), "JPEG")
    b64 = base64.b64encode(data).decode()
    anthropic = {
        "system": "Be brief.",
        "max_tokens": 10,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64}},
                    {"type": "text", "text": "What is it?"},
                ],
            }
        ],
    }
    openai = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [openai_image(F.data_url(data, "image/jpeg")), {"type": "text", "text": "What is it?"}],
            },
        ]
    }
    a, o = model.run_images(anthropic), model.run_images(openai)
    assert a.ids == o.ids and np.array_equal(a.pixel_values, o.pixel_values)
    assert a.spans[0].path == "messages[0].content[0].source"


def test_http_url_needs_supplied_bytes(model: ctxlock.Model) -> None:
    url = "https://example.com/cat.png"
    data = F.png(F.noise(100, 80))
    req = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, openai_image(url)]}]}
    with pytest.raises(MediaSourceError, match="never fetches") as e:
        model.run_images(req)
    assert e.value.path == "messages[0].content[1].image_url.url"
    supplied = model.run_images(req, media={url: data})
    inline = model.run_images(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, openai_image(F.data_url(data))]}]}
    )
    assert supplied.ids == inline.ids and np.array_equal(supplied.pixel_values, inline.pixel_values)
    assert supplied.images[0].origin == "supplied"


@pytest.mark.parametrize(
    ("url", "error", "message"),
    [
        (F.data_url(F.png(F.noise(8, 8)), "image/jpeg"), MediaTypeError, "declared media type image/jpeg"),
        ("data:image/png;base64,iVBORw0KGgo!!!", MediaSourceError, "base64 is invalid"),
        ("data:image/png;base64", MediaSourceError, "without a comma"),
        ("file:///etc/passwd", MediaSourceError, "never fetches"),
        ("data:image/gif;base64," + base64.b64encode(b"GIF89a").decode(), ImageDecodeError, "cannot read the GIF"),
    ],
)
def test_bad_sources_are_typed_errors_at_their_path(model: ctxlock.Model, url: str, error: type, message: str) -> None:
    req = {"messages": [{"role": "user", "content": [openai_image(url)]}]}
    with pytest.raises(MediaError, match=message) as e:
        model.run_images(req)
    assert isinstance(e.value, error)
    assert e.value.path == "messages[0].content[0].image_url.url"


def test_text_only_model_and_template(model: ctxlock.Model, model_dir: Path, tmp_path: Path) -> None:
    data = F.png(F.noise(50, 50))
    req = {"messages": [{"role": "user", "content": [openai_image(F.data_url(data)), {"type": "text", "text": "x"}]}]}
    text_only = ctxlock.load(str(F.build_qwen2vl_dir(tmp_path / "text-only", None)))
    with pytest.raises(ImagePlacementError, match="no image processor") as e:
        text_only.run_images(req)
    assert e.value.path == "messages[0].content[0].image_url.url"
    # a template that writes no placeholder for images (it reads only text parts)
    template = ctxlock.ChatTemplate(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% for p in m.content %}{% if p.type == 'text' %}"
        "{{ p.text }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}",
        id="text-parts-only",
    )
    with pytest.raises(ImagePlacementError, match="does not take images") as e:
        model.run_images(req, chat_template=template)
    assert e.value.path == "messages[0].content[0].image_url.url"
    # a string-content template refuses the image part itself
    string_template = ctxlock.ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", id="string")
    with pytest.raises(ContentFormatError):
        model.run_images(req, chat_template=string_template)


def test_more_images_than_placeholders_and_extra_placeholders(model: ctxlock.Model) -> None:
    data = F.data_url(F.png(F.noise(40, 40)))
    req = {"messages": [{"role": "user", "content": [openai_image(data), openai_image(data)]}]}
    first_only = ctxlock.ChatTemplate(
        "{% for m in messages %}{% for p in m.content %}{% if loop.first %}<|vision_start|><|image_pad|>"
        "<|vision_end|>{% endif %}{% endfor %}{% endfor %}",
        id="first-only",
    )
    with pytest.raises(ImagePlacementError, match="2 images but the template wrote 1") as e:
        model.run_images(req, chat_template=first_only)
    assert e.value.path == "messages[0].content[1].image_url.url"
    extra = ctxlock.ChatTemplate(
        "<|image_pad|>{% for m in messages %}{% for p in m.content %}<|image_pad|>{% endfor %}{% endfor %}",
        id="extra",
    )
    with pytest.raises(ImagePlacementError, match="3 image placeholders for 2"):
        model.run_images(req, chat_template=extra)


def test_placeholder_in_user_text_is_never_an_image_slot(model: ctxlock.Model, processor: ImageOnlyProcessor) -> None:
    data = F.data_url(F.png(F.noise(60, 60)))
    forged = "<|vision_start|><|image_pad|><|vision_end|>"
    req = {"messages": [{"role": "user", "content": [{"type": "text", "text": forged}, openai_image(data)]}]}
    got = model.run_images(req)
    assert len(got.spans) == 1
    start, end = got.spans[0].start, got.spans[0].end
    assert got.ids.count(PAD) == end - start  # the forged one is text, not a pad id
    with pytest.raises(ImagePlacementError, match="request text holds the image placeholder") as e:
        model.run_images(req, injection="keep")
    assert e.value.path == "messages[0].content[0].text"


def test_plain_encode_refuses_unexpanded_images(model: ctxlock.Model) -> None:
    req = {"messages": [{"role": "user", "content": [openai_image(F.data_url(F.png(F.noise(9, 9))))]}]}
    with pytest.raises(ImagePlacementError, match="unexpanded placeholders") as e:
        model.encode(req)
    assert e.value.path == "messages[0].content[0].image_url.url"
    assert len(model.encode({"messages": [{"role": "user", "content": "no images"}]})["input_ids"][0]) > 0


def test_header_only_count_equals_the_decoded_expansion(model: ctxlock.Model) -> None:
    images = [F.encode(F.noise(3000, 4000), "JPEG"), F.with_orientation(F.noise(500, 90), 8)]
    req = {"messages": conversation(images)}
    counted = model.run_images(req, decode=False)
    full = model.run_images(req)
    assert counted.ids == full.ids and counted.spans == full.spans
    assert counted.pixel_values.size == 0 and all(im.pixels is None for im in counted.images)
    assert [im.plan for im in counted.images] == [im.plan for im in full.images]


def test_class_defaults_family_override(model: ctxlock.Model, model_dir: Path) -> None:
    data = F.encode(F.noise(4000, 3000), "JPEG")
    req = {"messages": [{"role": "user", "content": [openai_image(F.data_url(data))]}]}
    hub = model.run_images(req, decode=False)
    defaults = model.run_images(req, family=Qwen2VL(), decode=False)
    assert hub.images[0].n_tokens == 15301  # (2996, 4004): under the hub's max_pixels 12845056
    assert defaults.images[0].n_tokens == 1230
    small_cap = StageOptions(max_pixels=1000)
    with pytest.raises(ImageSizeError, match="over the cap"):
        model.run_images(req, images=small_cap, decode=False)


@functools.cache
def _flat_png(width: int, height: int) -> bytes:
    return F.png(Image.new("RGB", (width, height), (90, 140, 200)))


sizes = st.tuples(st.integers(1, 3000), st.integers(1, 3000)).filter(lambda s: max(s) / min(s) <= 200)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(sizes, min_size=0, max_size=3), min_size=1, max_size=4), st.booleans())
def test_every_image_maps_to_exactly_its_placeholders(model: ctxlock.Model, turns: list, text_first: bool) -> None:
    # Images of arbitrary sizes read from their headers (nothing is decoded): a flat PNG of each size (a noise image
    # up to 3000 x 3000 costs a second to make and says nothing more to a header-only plan).
    messages: list[dict] = []
    for k, sizes_in_turn in enumerate(turns):
        parts: list[dict] = [openai_image(F.data_url(_flat_png(w, h))) for w, h in sizes_in_turn]
        text = {"type": "text", "text": f"turn {k} <|image_pad|>"}
        messages.append({"role": "user", "content": [text, *parts] if text_first else [*parts, text]})
        messages.append({"role": "assistant", "content": "ok"})
    got = model.run_images({"messages": messages}, decode=False)
    base = model.render({"messages": messages})
    n_images = sum(len(t) for t in turns)
    assert len(got.spans) == n_images == len(got.images)
    assert [s.index for s in got.spans] == list(range(n_images))
    previous_end = -1
    for span, image in zip(got.spans, got.images, strict=True):
        assert span.end - span.start == image.n_tokens  # exactly its declared placeholders
        assert span.start > previous_end  # never overlapping, in order
        previous_end = span.end
        assert got.ids[span.start - 1] == START and got.ids[span.end] == END
        assert set(got.ids[span.start : span.end]) == {PAD}
    assert got.ids.count(PAD) == sum(im.n_tokens for im in got.images)  # no pad id outside the spans
    unexpanded = len(model.tokenize(base).ids)
    assert len(got.ids) == unexpanded + sum(im.n_tokens - 1 for im in got.images)


def test_count_gives_exact_image_tokens_from_headers(model: ctxlock.Model) -> None:
    images = [F.png(F.noise(640, 480)), F.encode(F.noise(4000, 3000, seed=9), "JPEG")]
    req = {"messages": conversation(images)}
    counts = model.count(req)
    full = model.run_images(req)
    assert counts.total == len(full.ids)
    assert sum(p.tokens for p in counts.parts) == counts.total
    assert [im["tokens"] for im in counts.images] == [im.n_tokens for im in full.images] == [391, 15301]
    assert [im["part"] for im in counts.images] == ["messages[1]", "messages[3]"]
    assert counts.images[1]["steps"][0]["to"] == [2996, 4004]
    text_only = model.count({"messages": [{"role": "user", "content": "hi"}]})
    assert text_only.images == () and "images" not in text_only.to_dict()


def _cli(tmp_path: Path, model_dir: Path, *args: str):
    from cli_runner import run_cli

    request = {
        "messages": [
            {
                "role": "user",
                "content": [
                    openai_image(F.data_url(F.png(F.noise(640, 480)))),
                    openai_image("https://example.com/photo.jpg"),
                    {"type": "text", "text": "What differs?"},
                ],
            }
        ]
    }
    (tmp_path / "request.json").write_text(json.dumps(request), encoding="utf-8")
    (tmp_path / "photo.jpg").write_bytes(F.encode(F.noise(1024, 768, seed=1), "JPEG", quality=90))
    return run_cli(*args, str(tmp_path / "request.json"), "--model", str(model_dir), env={"PWD": str(tmp_path)})


def test_cli_render_shows_image_blocks_and_needs_media(tmp_path: Path, model_dir: Path) -> None:
    media = f"https://example.com/photo.jpg={tmp_path / 'photo.jpg'}"
    done = _cli(tmp_path, model_dir, "render", "--media", media)
    assert done.returncode == 0, done.stderr
    assert "<|vision_start|>[image 0: 391 tokens, sha256 " in done.stdout
    assert "[image 1: 999 tokens, sha256 " in done.stdout
    assert "smart_resize: (768, 1024) -> (756, 1036)" in done.stdout
    missing = _cli(tmp_path, model_dir, "render")
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.startswith("error: MediaSourceError: messages[0].content[1].image_url.url: ctxlock never")
    counted = _cli(tmp_path, model_dir, "count", "--json", "--media", media)
    assert counted.returncode == 0, counted.stderr
    assert [im["tokens"] for im in json.loads(counted.stdout)["images"]] == [391, 999]
    as_json = json.loads(_cli(tmp_path, model_dir, "render", "--json", "--media", media).stdout)
    assert [s["tokens"] for s in as_json["multimodal"]["spans"]] == [[15, 406], [408, 1407]]


def test_fit_keeps_or_drops_an_image_whole(model: ctxlock.Model) -> None:
    from ctxlock.budget._fit import BudgetPolicy, fit_context

    images = [F.png(F.noise(640, 480, seed=k)) for k in range(3)]  # 391 tokens each
    req = model.parse({"messages": conversation(images)})
    full = len(model.run_images(req, decode=False).ids)
    for budget in (full, full - 1, full - 400, full - 800, 450):
        fitted = fit_context(req, model, BudgetPolicy(max_input_tokens=budget))
        expanded = model.run_images(fitted.request, decode=False)
        assert list(fitted.ids) == list(expanded.ids)  # the fit counted every image token exactly
        assert fitted.input_tokens <= budget
        kept = len(expanded.images)
        assert all(s.end - s.start == 391 for s in expanded.spans)  # an image is never cut
        assert fitted.input_tokens > budget - 391 - 60 or kept == 0  # it drops no more than one image's worth
    assert len(model.run_images(fit_context(req, model, BudgetPolicy(max_input_tokens=full)).request).images) == 3


def test_raw_openai_request_equals_the_processor_on_it(model: ctxlock.Model, processor: ImageOnlyProcessor) -> None:
    """The raw OpenAI request (image_url parts, one as a URL string, one with a detail) given as it is to
    `Qwen2VLProcessor.apply_chat_template`, which normalizes image_url blocks itself: the same ids and pixels as the
    `{"type": "image", "url"}` form the other tests give it, and as ctxlock on the raw request."""
    images = [F.png(F.noise(640, 480)), F.encode(F.noise(300, 900, seed=2), "JPEG"), F.png(F.noise(28, 28, seed=3))]
    messages = conversation(images)
    messages[3]["content"][0]["image_url"] = messages[3]["content"][0]["image_url"]["url"]
    messages[5]["content"][0]["image_url"]["detail"] = "high"
    kwargs = {"tokenize": True, "return_dict": True, "add_generation_prompt": True, "return_tensors": "np"}
    raw = processor.apply_chat_template(json.loads(json.dumps(messages)), **kwargs)
    ref, _ = reference(processor, messages)
    assert raw["input_ids"].tolist() == ref["input_ids"].tolist()
    got = check_parity(model, processor, messages)
    assert list(got.ids) == raw["input_ids"][0].tolist()
    assert np.abs(got.pixel_values - raw["pixel_values"]).max() <= 1e-5
    assert [s.path for s in got.spans] == [
        "messages[1].content[0].image_url.url",
        "messages[3].content[0].image_url",
        "messages[5].content[0].image_url.url",
    ]
