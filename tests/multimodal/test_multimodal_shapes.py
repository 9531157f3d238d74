"""The image part shapes clients send beside OpenAI's `image_url`: transformers' `{"type": "image", "image" | "url"
| "base64": ...}` (what its processors' apply_chat_template reads), and the Responses API's `input_image` (as vLLM
takes it in chat messages). Each gives the same input as `image_url`; the reference is transformers'
Qwen2VLProcessor (images only) with `Qwen2VLImageProcessorPil`."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, Qwen2VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

import ctxlock
import mm_fixtures as F
from ctxlock.errors import CtxlockError, ImageDecodeError, MediaSourceError, RequestValidationError
from hypothesis_profiles import examples


class ImageOnlyProcessor(Qwen2VLProcessor):
    """transformers' Qwen2VLProcessor without its video processor (its class needs torchvision, absent here)."""

    @classmethod
    def get_attributes(cls) -> list[str]:
        return ["image_processor", "tokenizer"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return F.build_qwen2vl_dir(tmp_path_factory.mktemp("shapes") / "qwen2-vl", F.HUB_PREPROCESSOR)


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


DATA = F.png(F.noise(300, 200, seed=3))
URL = F.data_url(DATA)
B64 = base64.b64encode(DATA).decode()


def ask(part: dict, role: str = "user") -> dict:
    return {"messages": [{"role": role, "content": [part, {"type": "text", "text": "What is this?"}]}]}


SHAPES = {
    "image_url": {"type": "image_url", "image_url": {"url": URL}},
    "image.image": {"type": "image", "image": URL},
    "image.url": {"type": "image", "url": URL},
    "image.base64": {"type": "image", "base64": B64},
    "input_image": {"type": "input_image", "image_url": URL, "detail": "high"},
}
SUFFIX = {
    "image_url": ".image_url.url",
    "image.image": ".image",
    "image.url": ".url",
    "image.base64": ".base64",
    "input_image": ".image_url",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_gives_transformers_input(model: ctxlock.Model, processor, shape: str) -> None:
    got = model.run_images(ask(SHAPES[shape]))
    hf_part = SHAPES[shape] if shape.startswith("image.") else {"type": "image", "url": URL}
    ref = processor.apply_chat_template(
        [ask(hf_part)["messages"][0]], tokenize=True, return_dict=True, add_generation_prompt=True, return_tensors="np"
    )
    assert list(got.ids) == ref["input_ids"][0].tolist()
    assert np.array_equal(got.image_grid_thw, ref["image_grid_thw"])
    assert np.abs(got.pixel_values - ref["pixel_values"]).max() <= 1e-5
    assert got.spans[0].path == "messages[0].content[0]" + SUFFIX[shape]
    assert got.images[0].header.sha256 == hashlib.sha256(DATA).hexdigest()


@pytest.mark.parametrize(
    ("part", "role", "error", "path", "message"),
    [
        ({"type": "input_image", "file_id": "file-abc"}, "user", RequestValidationError, ".file_id", "file store"),
        (
            {"type": "input_image", "image_url": URL, "detail": "max"},
            "user",
            RequestValidationError,
            ".detail",
            "detail",
        ),
        ({"type": "input_image", "image_url": {"url": URL}}, "user", RequestValidationError, ".image_url", ""),
        ({"type": "input_image"}, "user", RequestValidationError, ".image_url", "image_url"),
        ({"type": "image", "path": "/etc/passwd"}, "user", RequestValidationError, ".path", "local file"),
        ({"type": "image", "url": URL, "image": URL}, "user", RequestValidationError, "", "2 sources"),
        ({"type": "image"}, "user", RequestValidationError, "", "0 sources"),
        ({"type": "image", "image": 7}, "user", RequestValidationError, ".image", ""),
        ({"type": "image", "colour": "red", "url": URL}, "user", RequestValidationError, ".colour", ""),
        ({"type": "image", "url": URL}, "assistant", RequestValidationError, ".type", "cannot hold images"),
        ({"type": "input_image", "image_url": URL}, "system", RequestValidationError, ".type", "cannot hold images"),
        ({"type": "image", "image": "https://x.test/a.png"}, "user", MediaSourceError, ".image", "never fetches"),
        ({"type": "image", "base64": "not base64!"}, "user", MediaSourceError, ".base64", "base64"),
        (
            {"type": "image", "base64": base64.b64encode(b"GIF89a-trunc").decode()},
            "user",
            ImageDecodeError,
            ".base64",
            "",
        ),
    ],
)
def test_unusable_shapes_are_typed_errors_at_their_path(
    model: ctxlock.Model, part: dict, role: str, error: type, path: str, message: str
) -> None:
    with pytest.raises(error) as info:
        model.run_images(ask(part, role))
    assert isinstance(info.value, CtxlockError)
    assert info.value.path == "messages[0].content[0]" + path
    assert message in str(info.value)


def test_shapes_reach_the_template_as_image_parts(model: ctxlock.Model) -> None:
    # input_image becomes type "image" (as vLLM gives templates an image part), its keys kept; the others as sent
    req = model.parse(ask(SHAPES["input_image"]))
    assert dict(req.messages[0].content[0]) == {"type": "image", "image_url": URL, "detail": "high"}
    assert dict(model.parse(ask(SHAPES["image.base64"])).messages[0].content[0]) == SHAPES["image.base64"]


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(
        st.sampled_from(["type", "image", "url", "base64", "path", "image_url", "file_id", "detail", "x"]),
        st.one_of(st.text(max_size=8), st.integers(), st.none(), st.just(URL)),
        max_size=4,
    )
)
def test_hostile_image_parts_never_crash(model: ctxlock.Model, part: dict) -> None:
    part = {**part, "type": part.get("type") if part.get("type") in ("image", "input_image") else "image"}
    try:
        model.run_images(ask(part))
    except CtxlockError as e:
        assert e.path is not None and e.path.startswith("messages[0]")
