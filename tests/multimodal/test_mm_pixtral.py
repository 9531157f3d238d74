"""Pixtral / Mistral images (ctxlock.multimodal._pixtral) against mistral-common 1.13's own image encoder.

Reference: `mistral_common.tokens.tokenizers.image.ImageEncoder` on `ImageChunk`s (tokens and the processed image),
and `MistralTokenizer.encode_chat_completion` on multi-turn requests (the images it returns, and the image tokens
in its ids). mistral-common resizes with OpenCV. ctxlock's default resizer, with OpenCV installed, is OpenCV itself
(`Resizer("opencv", ...)`): its pixels must be mistral-common's bit for bit, IPP on as the wheel ships it. The
portable fallback (`Resizer.portable()`, numpy) is OpenCV's portable algorithm: within 1e-5 with IPP off
(`cv2.ipp.setUseIPP(False)`), and within `PORTABLE_MAX_DIFF` with IPP on (README: "not exact").
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import cv2
import mistral_common
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mistral_common.protocol.instruct.chunk import ImageChunk, TextChunk
from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.image import ImageConfig, ImageEncoder, SpecialImageIDs
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from PIL import Image

import ctxlock
from ctxlock.errors import CtxlockError, ImageSizeError
from ctxlock.multimodal import _media as media
from ctxlock.multimodal._base import ImageFamily
from ctxlock.multimodal._pixtral import PixtralFamily, pixtral_grid
from ctxlock.multimodal._resample import PORTABLE_MAX_DIFF, Resizer, cubic_resize, opencv_resize
from hypothesis_profiles import examples
from mm_images import as_decoded, corpus, corpus_labels, make, reopen, to_bytes

pytestmark = pytest.mark.reference

TEKKEN = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
IDS = SpecialImageIDs(img=10, img_break=12, img_end=13)
# Pixtral-12B (tekken_240911.json's own image section) and a merged-patch setting (Mistral-Small-3.1 style).
CONFIGS = [(16, 1024, 1), (14, 1540, 2)]


@pytest.fixture
def no_ipp():
    before = cv2.ipp.useIPP()
    cv2.ipp.setUseIPP(False)
    yield
    cv2.ipp.setUseIPP(before)


def _mine(family: PixtralFamily, data: bytes) -> tuple[list[int], np.ndarray]:
    pre = family.preprocess(as_decoded(data))
    names = {family.img_token: IDS.img, family.img_break_token: IDS.img_break, family.img_end_token: IDS.img_end}
    return [names[t] for t in family.placeholders(pre.plan)], pre.pixel_values


@pytest.mark.parametrize(("patch", "max_size", "merge"), CONFIGS)
@pytest.mark.parametrize("label", corpus_labels())
def test_tokens_and_pixels_equal_image_encoder(label, patch, max_size, merge) -> None:
    """The default resizer (OpenCV, installed by the test extra) gives mistral-common's pixels exactly, IPP on."""
    assert cv2.ipp.useIPP()
    data = dict(corpus())[label]
    img = reopen(data)
    ref = ImageEncoder(ImageConfig(patch, max_size, merge), IDS)(ImageChunk(image=img))
    family = PixtralFamily(image_patch_size=patch, max_image_size=max_size, spatial_merge_size=merge)
    assert family.resizer.kind == "opencv" and family.params()["exact_vs_reference"] is True
    tokens, pixels = _mine(family, data)
    assert tokens == ref.tokens
    assert pixels.shape == ref.image.shape and pixels.dtype == np.float32
    assert np.array_equal(pixels, ref.image)  # bit for bit, so within 1e-5
    # the header-only plan is the one preprocessing used
    header = media.read_header(data)
    assert family.plan(header) == family.preprocess(as_decoded(data)).plan
    assert family.plan(header).n_tokens == len(ref.tokens)


@pytest.mark.parametrize(("patch", "max_size", "merge"), CONFIGS)
@pytest.mark.parametrize("label", corpus_labels())
def test_portable_resizer_equals_image_encoder_without_ipp(no_ipp, label, patch, max_size, merge) -> None:
    """The fallback without OpenCV: mistral-common's pixels within 1e-5 when OpenCV runs its own algorithm."""
    data = dict(corpus())[label]
    ref = ImageEncoder(ImageConfig(patch, max_size, merge), IDS)(ImageChunk(image=reopen(data)))
    family = PixtralFamily(
        image_patch_size=patch, max_image_size=max_size, spatial_merge_size=merge, resizer=Resizer.portable()
    )
    tokens, pixels = _mine(family, data)
    assert tokens == ref.tokens
    assert pixels.shape == ref.image.shape and pixels.dtype == np.float32
    assert np.abs(pixels - ref.image).max() <= 1e-5


def test_ipp_deviation_is_bounded() -> None:
    """With IPP on (the wheel's default), mistral-common's pixels are not OpenCV's own algorithm: the portable
    resizer's measured bound, which its params state."""
    assert cv2.ipp.useIPP()
    family = PixtralFamily(resizer=Resizer.portable())
    worst = 0.0
    for _, data in corpus(limit_pixels=1_100_000):
        ref = ImageEncoder(ImageConfig(16, 1024), IDS)(ImageChunk(image=reopen(data)))
        tokens, pixels = _mine(family, data)
        assert tokens == ref.tokens
        worst = max(worst, float(np.abs(pixels - ref.image).max()))
    assert 0 < worst <= PORTABLE_MAX_DIFF
    params = family.params()
    assert params["exact_vs_reference"] is False and params["resizer"] == "portable"
    assert f"not exact vs mistral-common: max |diff| <= {PORTABLE_MAX_DIFF:g}" in params["resample"]


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(1, 400), st.integers(1, 400), st.integers(1, 400), st.integers(1, 400), st.booleans())
def test_opencv_resizer_is_mistral_commons_call(h, w, nh, nw, as_uint8) -> None:
    """`opencv_resize` on uint8 pixels is `cv2.resize(np.array(rgb, dtype=np.float32), ...)`, bit for bit."""
    rng = np.random.default_rng(h * 7919 + w)
    rgb = rng.integers(0, 256, (h, w, 3)).astype(np.uint8)
    ref = cv2.resize(np.array(rgb, dtype=np.float32), (nw, nh), interpolation=cv2.INTER_CUBIC)
    out = opencv_resize(rgb if as_uint8 else rgb.astype(np.float32), nw, nh)
    assert out.shape == (nh, nw, 3) and out.dtype == np.float32
    assert np.array_equal(out, ref.reshape(nh, nw, 3))


def test_resizer_is_named_and_checked() -> None:
    detected = Resizer.detect()
    assert detected.kind == "opencv" and detected.version == f"opencv-python-headless {_dist_version()}"
    assert cv2.__version__.split(".")[:2] == _dist_version().split(".")[:2]
    assert "cv2.resize INTER_CUBIC" in detected.describe()
    with pytest.raises(ImageSizeError):
        PixtralFamily(resizer=Resizer("pillow", "13"))


def _dist_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("opencv-python-headless")


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 300), st.integers(1, 300))
def test_cubic_resize_is_opencv_without_ipp(h, w, nh, nw) -> None:
    rng = np.random.default_rng(h * 7919 + w)
    image = rng.integers(0, 256, (h, w, 3)).astype(np.float32)
    before = cv2.ipp.useIPP()
    cv2.ipp.setUseIPP(False)
    try:
        ref = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_CUBIC).reshape(nh, nw, 3)
    finally:
        cv2.ipp.setUseIPP(before)
    # 1e-5 after normalization (/255/std) is 6.6e-4 in pixel units
    assert np.abs(cubic_resize(image, nw, nh) - ref).max() <= 2e-4


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(1, 60_000), st.integers(1, 60_000), st.sampled_from(CONFIGS))
def test_grid_equals_mistral_common_for_any_size(w, h, config) -> None:
    """The header-only count is mistral-common's `_image_to_num_tokens` for any size (no pixels needed)."""
    patch, max_size, merge = config
    encoder = ImageEncoder(ImageConfig(patch, max_size, merge), IDS)
    cols, rows, _, _, _ = pixtral_grid(w, h, patch=patch, max_size=max_size, merge=merge)
    assert (cols, rows) == encoder._image_to_num_tokens(_Sized(w, h))


class _Sized:
    """Only `.size`, which is all `_image_to_num_tokens` reads: a 60,000-pixel side needs no allocation."""

    def __init__(self, w: int, h: int) -> None:
        self.size = (w, h)


def _multi_turn(images: list[Image.Image]) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        messages=[
            UserMessage(content=[TextChunk(text="What is in this picture?"), ImageChunk(image=images[0])]),
            AssistantMessage(content="A gradient with noise."),
            UserMessage(
                content=[
                    ImageChunk(image=images[1]),
                    TextChunk(text="And these two?"),
                    ImageChunk(image=images[2]),
                ]
            ),
        ]
    )


def _image_runs(tokens: list[int], ids: dict[str, int]) -> list[list[int]]:
    runs, current = [], []
    for t in tokens:
        if t in ids.values():
            current.append(t)
            if t == ids["[IMG_END]"]:
                runs.append(current)
                current = []
    return runs


def _corpus_turns(files: list[bytes]) -> ChatCompletionRequest:
    """Every file as an ImageChunk, three to a user turn, with assistant turns between."""
    messages: list = []
    for k in range(0, len(files), 3):
        chunks = [ImageChunk(image=reopen(f)) for f in files[k : k + 3]]
        messages.append(UserMessage(content=[TextChunk(text=f"Pictures {k}:"), *chunks]))
        messages.append(AssistantMessage(content=f"Seen {len(chunks)}."))
    return ChatCompletionRequest(messages=messages[:-1])


def test_encode_chat_completion_over_the_corpus_is_exact() -> None:
    """Multi-turn over the whole test set (1x1 .. 4000x3000, every mode, EXIF-rotated JPEGs), IPP on: the images
    `encode_chat_completion` returns are ctxlock's pixel values bit for bit, and its image token runs are ctxlock's."""
    tok = MistralTokenizer.from_file(str(TEKKEN))
    raw = tok.instruct_tokenizer.tokenizer
    files = [data for _, data in corpus()]
    out = tok.encode_chat_completion(_corpus_turns(files))
    cfg = raw.image
    family = PixtralFamily(image_patch_size=cfg.image_patch_size, max_image_size=cfg.max_image_size)
    ids = {s: raw.get_special_token(s) for s in ("[IMG]", "[IMG_BREAK]", "[IMG_END]")}
    runs = _image_runs(out.tokens, ids)
    assert len(runs) == len(out.images) == len(files)
    for data, run, ref_pixels in zip(files, runs, out.images, strict=True):
        pre = family.preprocess(as_decoded(data))
        assert [ids[t] for t in family.placeholders(pre.plan)] == run
        assert np.array_equal(pre.pixel_values, ref_pixels)


def test_encode_chat_completion_images_and_image_tokens() -> None:
    """Multi-turn: mistral-common's returned images equal ctxlock's pixel values, and every run of image tokens in
    its ids is, in order, exactly ctxlock's placeholders for that image (with the Tekken ids of [IMG] etc.)."""
    tok = MistralTokenizer.from_file(str(TEKKEN))
    raw = tok.instruct_tokenizer.tokenizer
    images = [make(640, 480, "RGB", 1), make(37, 1500, "RGBA", 2), make(1200, 1000, "P", 3)]
    out = tok.encode_chat_completion(_multi_turn(images))
    cfg = raw.image
    family = PixtralFamily(image_patch_size=cfg.image_patch_size, max_image_size=cfg.max_image_size)
    ids = {s: raw.get_special_token(s) for s in ("[IMG]", "[IMG_BREAK]", "[IMG_END]")}
    runs = _image_runs(out.tokens, ids)
    assert len(runs) == len(out.images) == 3
    for img, run, ref_pixels in zip(images, runs, out.images, strict=True):
        pre = family.preprocess(as_decoded(to_bytes(img)))
        assert [ids[t] for t in family.placeholders(pre.plan)] == run
        assert np.array_equal(pre.pixel_values, ref_pixels)


def test_family_keeps_the_interface() -> None:
    family = PixtralFamily()
    assert isinstance(family, ImageFamily)
    assert family.template_placeholder == "[IMG]"
    params = family.params()
    for key in ("image_patch_size", "max_image_size", "spatial_merge_size", "image_mean", "image_std", "resample"):
        assert key in params


@pytest.mark.parametrize(("w", "h"), [(0, 10), (10, 0), (0, 0), (1, 201), (40_000, 10)])
def test_bad_sizes_are_typed_errors(w, h) -> None:
    with pytest.raises(ImageSizeError) as info:
        PixtralFamily().plan_size(w, h)
    assert isinstance(info.value, CtxlockError) and info.value.hint


def test_bad_config_is_a_typed_error() -> None:
    with pytest.raises(ImageSizeError):
        PixtralFamily(image_patch_size=0)


def test_corrupt_bytes_never_reach_the_family() -> None:
    """A truncated PNG fails in Pillow before any family code runs (the media stage types that error)."""
    buf = io.BytesIO()
    make(64, 64).save(buf, format="PNG")
    with pytest.raises(OSError):
        Image.open(io.BytesIO(buf.getvalue()[:100])).load()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_run_images_on_the_default_mistral_model_equals_encode_chat_completion() -> None:
    """End to end: ctxlock's Mistral path (the generated template, the Tekken tokenizer, the Pixtral family from
    tekken_240911.json's image section) gives mistral-common's ids and images for a multi-turn request."""
    files = [
        to_bytes(make(640, 480, "RGB", 1)),
        to_bytes(make(37, 1500, "RGBA", 2)),
        to_bytes(make(1200, 1000, "P", 3)),
    ]
    images = [reopen(f) for f in files]
    tok = MistralTokenizer.from_file(str(TEKKEN))
    ref = tok.encode_chat_completion(_multi_turn(images))
    request = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this picture?"},
                    {"type": "image_url", "image_url": {"url": _data_url(files[0])}},
                ],
            },
            {"role": "assistant", "content": "A gradient with noise."},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": _data_url(files[1])}},
                    {"type": "text", "text": "And these two?"},
                    {"type": "image_url", "image_url": {"url": _data_url(files[2])}},
                ],
            },
        ]
    }
    model = ctxlock.load("mistral-nemo")
    assert isinstance(model.image_family, PixtralFamily)
    mm = model.run_images(request)
    assert list(mm.ids) == ref.tokens
    assert len(mm.images) == len(ref.images) == 3
    for im, theirs in zip(mm.images, ref.images, strict=True):
        assert np.array_equal(im.pixels.pixel_values, theirs)
    # the record's multimodal section names the resizer and its version
    params = mm.to_json()["params"]
    assert params["resizer"] == "opencv" and params["resizer_version"].startswith("opencv-python-headless ")
    assert params["exact_vs_reference"] is True
    img_end = ref.tokens.index(13) if 13 in ref.tokens else None
    assert img_end is not None and mm.span_map()[0][1] == img_end + 1
    # without the image stage the ids would hold bare [IMG] placeholders: run refuses
    with pytest.raises(CtxlockError):
        model.run(request)


# -- header-only counting: no hash, no decode (the digest is computed when a record or `count` asks for it) ------


@pytest.mark.fast_path
@pytest.mark.parametrize("label", corpus_labels())
def test_header_read_hashes_nothing_until_asked(label) -> None:
    """The fast path leaves the digest to first use; the reference path (CTXLOCK_FAST=0) computes it at once. The
    headers, plans and digests are equal either way, and equal to hashlib's."""
    import hashlib

    from ctxlock import settings

    data = dict(corpus())[label]
    family = PixtralFamily()
    with settings.fast_path():
        lazy = media.read_header(data)
        plan = family.plan(lazy)
        assert lazy.digest == ""  # counting read the header only
    with settings.reference_path():
        eager = media.read_header(data)
        assert eager.digest == hashlib.sha256(data).hexdigest()
        assert family.plan(eager) == plan
    assert lazy.sha256 == eager.sha256 == hashlib.sha256(data).hexdigest()
    assert lazy == eager and hash(lazy) == hash(eager)


@pytest.mark.fast_path
@pytest.mark.parametrize("fast", [True, False])
def test_decode_checks_the_bytes_it_is_given(fast) -> None:
    """decode skips the second hash only for the very bytes object the header was read from: an equal copy is
    hashed and accepted, other bytes refused, on both paths."""
    from ctxlock import settings
    from ctxlock.errors import ImageDecodeError

    data = to_bytes(make(64, 48, "RGB", 7))
    other = to_bytes(make(64, 48, "RGB", 8))
    with settings.fast_path() if fast else settings.reference_path():
        header = media.read_header(data)
        same = media.decode(data, header)
        copy = media.decode(bytes(bytearray(data)), header)
        assert np.array_equal(same.rgb, copy.rgb)
        with pytest.raises(ImageDecodeError):
            media.decode(other, header)


@pytest.mark.fast_path
def test_fast_and_reference_preprocessing_are_equal() -> None:
    """Pixtral end to end (header, decode, pixels) on both paths: the same plans, pixels and digests."""
    from ctxlock import settings

    family = PixtralFamily()
    for _, data in corpus(limit_pixels=1_100_000):
        with settings.fast_path():
            fast = family.preprocess(as_decoded(data))
        with settings.reference_path():
            ref = family.preprocess(as_decoded(data))
        assert fast.plan == ref.plan and np.array_equal(fast.pixel_values, ref.pixel_values)
        assert fast.pixel_sha256 == ref.pixel_sha256


def test_render_shows_the_resizer(tmp_path) -> None:
    """`ctxlock render` on a Pixtral request names the family's parameters and the resizer (it raised a KeyError on
    Qwen2-VL's parameter names before)."""
    from cli_runner import run_cli

    request = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What colour is this?"},
                    {"type": "image_url", "image_url": {"url": _data_url(to_bytes(make(64, 48, "RGB", 5)))}},
                ],
            }
        ]
    }
    path = tmp_path / "image-request.json"
    path.write_text(json.dumps(request), encoding="utf-8")
    done = run_cli("render", str(path))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "parameters image_patch_size=16, max_image_size=1024, spatial_merge_size=1" in done.stdout
    assert "resample   opencv-python-headless " in done.stdout
    assert "not exact" not in done.stdout


@pytest.mark.fast_path
def test_lazy_digest_is_of_the_bytes_read_not_of_a_later_mutation() -> None:
    """A mutable buffer given to read_header is copied: changing it afterwards changes neither the digest asked for
    later nor what decode accepts."""
    import hashlib

    from ctxlock import settings
    from ctxlock.errors import ImageDecodeError

    data = to_bytes(make(40, 30, "RGBA", 9))
    buf = bytearray(data)
    with settings.fast_path():
        header = media.read_header(buf)
        buf[-20:] = b"\x00" * 20
        assert header.sha256 == hashlib.sha256(data).hexdigest()
        with pytest.raises(ImageDecodeError):
            media.decode(bytes(buf), header)
        assert media.decode(data, header).size == (30, 40)
