"""Qwen3-VL images: the Qwen3.5 chat template among llama.cpp's templates, Qwen3-VL's preprocessor values, against
transformers' `Qwen3VLProcessor` (images only: its video processor class needs torchvision, not installed) with
`Qwen2VLImageProcessorPil`, the image processor Qwen3-VL uses without torchvision."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

import ctxlock
import mm_fixtures as F
from ctxlock.errors import ImagePlacementError
from ctxlock.multimodal._qwen2vl import Qwen2VL
from ctxlock.multimodal._qwen3vl import Qwen3VL
from ctxlock.multimodal._registry import family_for


class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
    """transformers' Qwen3VLProcessor without its video processor (torchvision): the image path is its own code."""

    @classmethod
    def get_attributes(cls) -> list[str]:
        return ["image_processor", "tokenizer"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("q3") / "qwen3-vl"
    return F.build_qwen2vl_dir(target, F.QWEN3VL_PREPROCESSOR, template=F.qwen35_template(), vocab="qwen35")


@pytest.fixture(scope="module")
def model(model_dir: Path) -> ctxlock.Model:
    return ctxlock.load(str(model_dir))


@pytest.fixture(scope="module")
def processor(model_dir: Path) -> ImageOnlyQwen3VLProcessor:
    config = {k: v for k, v in F.QWEN3VL_PREPROCESSOR.items() if k not in ("image_processor_type", "processor_class")}
    return ImageOnlyQwen3VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(**config),
        tokenizer=AutoTokenizer.from_pretrained(model_dir),
        chat_template=F.qwen35_template(),
    )


def test_family_is_selected_from_the_preprocessor_config(model: ctxlock.Model) -> None:
    family = model.image_family
    assert isinstance(family, Qwen3VL) and family.name == "qwen3-vl"
    assert (family.patch_size, family.merge_size, family.factor) == (16, 2, 32)
    assert family.image_mean == (0.5, 0.5, 0.5) and (family.min_pixels, family.max_pixels) == (65536, 16777216)
    # the same image processor class under Qwen2-VL's processor stays Qwen2-VL
    qwen2 = family_for({**F.QWEN3VL_PREPROCESSOR, "processor_class": "Qwen2VLProcessor"})
    assert type(qwen2) is Qwen2VL and qwen2.patch_size == 16
    # keys the file leaves out keep Qwen3-VL's values
    bare = family_for({"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen3VLProcessor"})
    assert bare.params() == Qwen3VL(source="preprocessor_config.json").params()


@pytest.mark.parametrize(
    "sizes",
    [[(640, 480)], [(1, 1), (4000, 3000)], [(3000, 4000), (333, 77), (128, 128)]],
)
def test_images_match_qwen3vl_processor(model: ctxlock.Model, processor, sizes: list[tuple[int, int]]) -> None:
    urls = [F.data_url(F.png(F.noise(w, h, seed=k))) for k, (w, h) in enumerate(sizes)]
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": "Compare."}]
    got = model.run_images({"messages": [{"role": "user", "content": content}]})
    hf = [{"type": "image", "url": u} for u in urls] + [{"type": "text", "text": "Compare."}]
    ref = processor.apply_chat_template(
        [{"role": "user", "content": hf}],
        tokenize=True,
        return_dict=True,
        add_generation_prompt=True,
        return_tensors="np",
    )
    assert list(got.ids) == ref["input_ids"][0].tolist()
    assert np.array_equal(got.image_grid_thw, ref["image_grid_thw"])
    assert got.pixel_values.shape == ref["pixel_values"].shape
    assert np.abs(got.pixel_values - ref["pixel_values"]).max() <= 1e-5
    for span, grid in zip(got.spans, ref["image_grid_thw"], strict=True):
        assert span.end - span.start == int(np.prod(grid)) // 4
    assert model.count({"messages": [{"role": "user", "content": content}]}).total == len(got.ids)


def test_qwen3vl_video_is_refused_with_its_reason(model: ctxlock.Model) -> None:
    frames = [F.data_url(F.png(F.noise(64, 64, seed=k))) for k in range(2)]
    with pytest.raises(ImagePlacementError, match="timestamp") as info:
        model.run_images({"messages": [{"role": "user", "content": [{"type": "video", "video": frames}]}]})
    assert info.value.path == "messages[0].content[0]"
