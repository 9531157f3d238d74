"""Videos given as lists of frames (Qwen2-VL / Qwen2.5-VL), and the image part shapes transformers, vLLM and the
Responses API send.

The pixel reference: transformers' Qwen2VLVideoProcessor needs torchvision, which is not installed, so each frame
goes through transformers' `Qwen2VLImageProcessorPil` with the video processor's pixel range (an image is one
frame over the temporal patch), and the frames are interleaved over the temporal patch (padded by repeating the
last) as the video processor's `patchify` lays them out. The text reference: the processor's chat template (its
`apply_chat_template(tokenize=False)`), each `<|video_pad|>` expanded to grid_t*grid_h*grid_w/merge^2 copies as
its `replace_video_token` does, encoded by transformers' tokenizer.
"""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_multimodal_media import bomb_png
from transformers import AutoTokenizer
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

import ctxlock
import mm_fixtures as F
from ctxlock.errors import (
    ImagePlacementError,
    ImageSizeError,
    MediaSourceError,
    MediaTypeError,
    RequestValidationError,
)
from ctxlock.multimodal._pipeline import StageOptions
from ctxlock.multimodal._qwen2vl import VIDEO_MAX_PIXELS, VIDEO_MIN_PIXELS, Qwen2VL
from hypothesis_profiles import examples


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return F.build_qwen2vl_dir(tmp_path_factory.mktemp("mmv") / "qwen2-vl", F.HUB_PREPROCESSOR)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> ctxlock.Model:
    return ctxlock.load(str(model_dir))


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir: Path):
    return AutoTokenizer.from_pretrained(model_dir)


def frames(n: int, width: int, height: int, seed: int = 0) -> list[str]:
    return [F.data_url(F.png(F.noise(width, height, seed=seed + k))) for k in range(n)]


def video(urls: list[str]) -> dict:
    return {"type": "video", "video": urls}


def reference_pixels(urls: list[str], min_pixels: int, max_pixels: int) -> tuple[np.ndarray, list[int]]:
    """pixel_values_videos and the grid, from transformers' PIL image processor frame by frame."""
    from transformers.image_utils import load_image

    proc = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    per_frame = []
    grid = None
    for url in urls:
        out = proc(load_image(url), return_tensors="np")
        grid = out["image_grid_thw"][0].tolist()
        rows = out["pixel_values"].reshape(-1, 3, 2, 14, 14)
        assert np.array_equal(rows[:, :, 0], rows[:, :, 1])  # an image is one frame over the temporal patch
        per_frame.append(rows[:, :, 0])
    if len(per_frame) % 2:
        per_frame.append(per_frame[-1])  # padded by repeating the last frame
    groups = [
        np.stack(per_frame[g : g + 2], axis=2).reshape(len(per_frame[0]), -1) for g in range(0, len(per_frame), 2)
    ]
    assert grid is not None
    return np.concatenate(groups), [len(groups), grid[1], grid[2]]


def expected_ids(hf_tokenizer, messages: list[dict], grids: list[list[int]]) -> tuple[str, list[int]]:
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pieces = text.split("<|video_pad|>")
    assert len(pieces) == len(grids) + 1
    out = pieces[0]
    for grid, rest in zip(grids, pieces[1:], strict=True):
        out += "<|video_pad|>" * (int(np.prod(grid)) // 4) + rest
    return out, hf_tokenizer(out, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(("n", "size"), [(1, (64, 48)), (2, (320, 240)), (3, (200, 120)), (5, (90, 300))])
def test_video_matches_the_reference(model: ctxlock.Model, hf_tokenizer, n: int, size: tuple[int, int]) -> None:
    urls = frames(n, *size, seed=n)
    messages = [{"role": "user", "content": [video(urls), {"type": "text", "text": "What happens?"}]}]
    got = model.run_images({"messages": messages})
    ref, grid = reference_pixels(urls, F.HUB_PREPROCESSOR["min_pixels"], F.HUB_PREPROCESSOR["max_pixels"])
    assert got.video_grid_thw.tolist() == [grid]
    assert grid[0] == (n + 1) // 2
    assert got.pixel_values_videos.shape == ref.shape
    assert np.abs(got.pixel_values_videos - ref).max() <= 1e-5
    text, ids = expected_ids(hf_tokenizer, messages, [grid])
    assert got.text == text
    assert list(got.ids) == ids
    ((start, end),) = got.video_span_map().values()
    assert end - start == int(np.prod(grid)) // 4
    assert set(got.ids[start:end]) == {151656} and got.ids[start - 1] == 151652 and got.ids[end] == 151653


def test_video_class_defaults_use_the_video_processors_pixel_range(model: ctxlock.Model) -> None:
    # Without a preprocessor config value, the video processor's own defaults apply (not the image processor's).
    family = Qwen2VL()
    assert (family.video_min_pixels, family.video_max_pixels) == (VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS)
    urls = frames(2, 1200, 900)
    got = model.run_images({"messages": [{"role": "user", "content": [video(urls)]}]}, family=family)
    ref, grid = reference_pixels(urls, VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS)
    assert got.video_grid_thw.tolist() == [grid]
    assert np.abs(got.pixel_values_videos - ref).max() <= 1e-5
    # the hub config's values reach the video too (transformers' video processor falls back to that file)
    hub = Qwen2VL.from_preprocessor_config(F.HUB_PREPROCESSOR)
    assert (hub.video_min_pixels, hub.video_max_pixels) == (3136, 12845056)


def test_images_and_videos_interleaved(model: ctxlock.Model, hf_tokenizer) -> None:
    img = F.data_url(F.png(F.noise(300, 200, seed=9)))
    v0, v1 = frames(4, 120, 90, seed=1), frames(3, 90, 120, seed=7)
    messages = [
        {"role": "user", "content": [video(v0), {"type": "image_url", "image_url": {"url": img}}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "and"}, video(v1)]},
    ]
    got = model.run_images({"messages": messages})
    assert [s.index for s in got.video_spans] == [0, 1] and len(got.spans) == 1
    assert got.video_spans[0].end < got.spans[0].start < got.video_spans[1].start
    for span, vid in zip(got.video_spans, got.videos, strict=True):
        assert span.end - span.start == vid.n_tokens
        assert got.ids[span.start : span.end] == (151656,) * vid.n_tokens
    assert got.pixel_values_videos.shape[0] == sum(int(np.prod(g)) for g in got.video_grid_thw)
    counted = model.count({"messages": messages})
    assert counted.total == len(got.ids)
    assert [i.get("kind", "image") for i in counted.images] == ["video", "image", "video"]


def test_header_only_plan_equals_the_decoded_one(model: ctxlock.Model) -> None:
    req = {"messages": [{"role": "user", "content": [video(frames(5, 333, 222))]}]}
    planned = model.run_images(req, decode=False)
    decoded = model.run_images(req)
    assert planned.ids == decoded.ids
    assert planned.videos[0].plan == decoded.videos[0].plan
    assert planned.pixel_values_videos.shape == (0, 0)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 7), h=st.integers(1, 4000), w=st.integers(1, 4000))
def test_plan_invariants(n: int, h: int, w: int) -> None:
    family = Qwen2VL.from_preprocessor_config(F.HUB_PREPROCESSOR)
    if max(h, w) / min(h, w) > 200:
        with pytest.raises(ImageSizeError):
            family.plan_video([(h, w)] * n)
        return
    plan = family.plan_video([(h, w)] * n)
    gt, gh, gw = plan.grid
    assert gt == -(-n // 2) and plan.n_tokens * 4 == gt * gh * gw
    assert plan.resized[0] % 28 == 0 and plan.resized[1] % 28 == 0
    assert family.plan_size(h, w).grid[1:] == plan.grid[1:]  # the same pixel range: the image's spatial grid


def test_vllm_jpeg_frame_list_and_video_url(model: ctxlock.Model) -> None:
    jpegs = [F.encode(F.noise(112, 84, seed=k), "JPEG", quality=90) for k in range(3)]
    url = "data:video/jpeg;base64," + ",".join(base64.b64encode(j).decode() for j in jpegs)
    as_list = [F.data_url(j, "image/jpeg") for j in jpegs]
    a = model.run_images(
        {"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}]}]}
    )
    b = model.run_images({"messages": [{"role": "user", "content": [{"type": "video", "video": url}]}]})
    c = model.run_images({"messages": [{"role": "user", "content": [video(as_list)]}]})
    assert a.ids == b.ids == c.ids
    assert np.array_equal(a.pixel_values_videos, c.pixel_values_videos)
    assert [f.header.sha256 for f in a.videos[0].frames] == [f.header.sha256 for f in c.videos[0].frames]
    assert a.videos[0].frames[1].ref.path == "messages[0].content[0].video_url.url"


@pytest.mark.parametrize(
    ("part", "error", "path", "message"),
    [
        (
            {"type": "video", "video": "data:video/mp4;base64,AAAA"},
            MediaTypeError,
            "messages[0].content[0].video",
            "container",
        ),
        (
            {"type": "video_url", "video_url": {"url": "https://x.test/v.mp4"}},
            MediaTypeError,
            "messages[0].content[0].video_url.url",
            "container",
        ),
        (
            {"type": "video", "video": ["https://x.test/f0.png"]},
            MediaSourceError,
            "messages[0].content[0].video[0]",
            "never fetches",
        ),
        ({"type": "video", "video": []}, RequestValidationError, "messages[0].content[0].video", "without frames"),
        (
            {"type": "video", "video": ["data:image/png;base64,AAAA", 3]},
            RequestValidationError,
            "messages[0].content[0].video[1]",
            "",
        ),
        (
            {"type": "video", "video": ["data:image/png;base64,iVBORw0KGgo="]},
            Exception,
            "messages[0].content[0].video[0]",
            "",
        ),
    ],
)
def test_bad_videos_are_typed_errors_at_their_path(
    model: ctxlock.Model, part: dict, error: type, path: str, message: str
) -> None:
    with pytest.raises(error) as info:
        model.run_images({"messages": [{"role": "user", "content": [part]}]})
    assert info.value.path == path
    assert message in str(info.value)
    assert isinstance(info.value, ctxlock.errors.CtxlockError)


def test_frames_of_different_sizes_too_many_frames_and_bombs(model: ctxlock.Model) -> None:
    mixed = frames(1, 100, 80) + frames(1, 80, 100)
    with pytest.raises(ImageSizeError, match="frame 1 is 80x100") as info:
        model.run_images({"messages": [{"role": "user", "content": [video(mixed)]}]})
    assert info.value.path == "messages[0].content[0]"
    # the frame cap is checked before any frame is read: these "frames" are not even images
    many = {"messages": [{"role": "user", "content": [video(["data:image/png;base64,AAAA"] * 9)]}]}
    with pytest.raises(ImageSizeError, match="9 frames is over the cap of 8"):
        model.run_images(many, images=StageOptions(max_frames=8))
    # the frames' pixels together are capped from their headers: nothing is decoded
    big = {"messages": [{"role": "user", "content": [video(frames(3, 100, 100))]}]}
    with pytest.raises(ImageSizeError, match="30,000 pixels, over the cap of 29,999") as info:
        model.run_images(big, images=StageOptions(max_video_pixels=29_999))
    assert info.value.path == "messages[0].content[0]"
    assert len(model.run_images(big, images=StageOptions(max_video_pixels=30_000)).videos) == 1
    assert StageOptions(max_video_pixels=30_000).to_json()["max_video_pixels"] == 30_000
    bomb = F.data_url(bomb_png(12000))  # a frame over the pixel cap is refused from its header
    with pytest.raises(ImageSizeError) as info:
        model.run_images({"messages": [{"role": "user", "content": [video([bomb])]}]}, decode=False)
    assert info.value.path == "messages[0].content[0].video[0]"


def test_video_refused_where_it_cannot_go(model: ctxlock.Model, tmp_path: Path) -> None:
    with pytest.raises(RequestValidationError, match="cannot hold videos"):
        model.parse({"messages": [{"role": "assistant", "content": [video(frames(1, 50, 50))]}]})
    req = {"messages": [{"role": "user", "content": [video(frames(2, 56, 56))]}]}
    with pytest.raises(ImagePlacementError, match="unexpanded"):
        model.encode(req)
    from ctxlock.multimodal._llava import LlavaFamily

    with pytest.raises(ImagePlacementError, match="takes no video") as info:
        model.run_images(req, family=LlavaFamily())
    assert info.value.path == "messages[0].content[0]"
    # a template that renders no video part: the video has no slot, never dropped silently
    no_video = F.QWEN2VL_TEMPLATE.replace("<|vision_start|><|video_pad|><|vision_end|>", "")
    other = ctxlock.load(str(F.build_qwen2vl_dir(tmp_path / "nv", F.HUB_PREPROCESSOR, template=no_video)))
    with pytest.raises(ImagePlacementError, match="1 video") as info:
        other.run_images(req)
    assert info.value.path == "messages[0].content[0]"


def test_expand_refuses_videos_for_a_family_that_takes_none(model: ctxlock.Model) -> None:
    # `expand` called directly with videos and an image-only family: the family's refusal at the video's path (it
    # used to look up a None placeholder: "no control token None", or a TypeError / AttributeError in the tokenizer)
    from ctxlock.multimodal import expand
    from ctxlock.multimodal._llava import LlavaFamily

    mm = model.run_images({"messages": [{"role": "user", "content": [video(frames(2, 56, 56))]}]}, decode=False)
    with pytest.raises(ImagePlacementError, match="the llava image family takes no video") as info:
        expand(mm.request, mm.rendered, mm.tokenized, model.tokenizer, LlavaFamily(), (), mm.videos)
    assert info.value.path == "messages[0].content[0]"


def test_fit_keeps_or_drops_a_video_whole(model: ctxlock.Model) -> None:
    from ctxlock.budget._fit import BudgetPolicy, fit_context

    turns: list[dict] = []
    for k in range(3):
        turns.append(
            {"role": "user", "content": [video(frames(4, 224, 168, seed=10 * k)), {"type": "text", "text": f"#{k}"}]}
        )
        turns.append({"role": "assistant", "content": f"clip {k}"})
    turns.append({"role": "user", "content": "Compare."})
    req = model.parse({"messages": turns})
    full_mm = model.run_images(req, decode=False)
    per = full_mm.videos[0].n_tokens
    full = len(full_mm.ids)
    for budget in (full, full - 1, full - per - 20, 200):
        fitted = fit_context(req, model, BudgetPolicy(max_input_tokens=budget))
        expanded = model.run_images(fitted.request, decode=False)
        assert list(fitted.ids) == list(expanded.ids)
        assert fitted.input_tokens <= budget
        assert all(s.end - s.start == per for s in expanded.video_spans)  # a video is never cut


def test_record_keeps_each_frames_digest(model: ctxlock.Model) -> None:
    urls = frames(3, 100, 70)
    mm = model.run_images({"messages": [{"role": "user", "content": [video(urls)]}]})
    data = json.loads(json.dumps(mm.to_json()))
    (v,) = data["videos"]
    assert [f["header"]["sha256"] for f in v["frames"]] == [
        __import__("hashlib").sha256(base64.b64decode(u.split(",", 1)[1])).hexdigest() for u in urls
    ]
    assert v["plan"]["grid"] == mm.video_grid_thw[0].tolist()
    assert v["pixel_values"]["shape"] == list(mm.pixel_values_videos.shape)
    assert data["video_spans"][0]["kind"] == "video"
    assert v["plan"]["params"]["video"]["frame_sampling"].startswith("none")


def test_video_record_replays_after_the_frame_files_are_deleted(tmp_path: Path, model: ctxlock.Model) -> None:
    from ctxlock.records import RunOptions, diff
    from ctxlock.records._replay import image_options, load_record, replay, run_and_record, save
    from ctxlock.records._store import Store

    store = Store(tmp_path / "store")
    files = []
    for k in range(3):
        files.append(tmp_path / f"f{k}.png")
        files[-1].write_bytes(F.png(F.noise(160, 120, seed=k)))
    urls = [f"https://example.com/f{k}.png" for k in range(3)]
    media = {u: f.read_bytes() for u, f in zip(urls, files, strict=True)}
    raw = json.dumps({"messages": [{"role": "user", "content": [video(urls), {"type": "text", "text": "?"}]}]})
    options = RunOptions(now="2024-07-26", images=image_options(model, media, StageOptions(max_frames=5)))
    mm, rec, error = run_and_record(model, raw.encode(), options, media=media)
    assert error is None, error
    (v,) = rec.data["multimodal"]["videos"]
    assert [f["header"]["sha256"] for f in v["frames"]] == [rec.data["options"]["images"]["media"][u] for u in urls]
    assert rec.data["options"]["images"]["max_frames"] == 5
    assert rec.data["input_ids"] == list(mm.ids)
    save(store, model, rec, model.templates.select(None), media=media)
    for f in files:
        f.unlink()
    result, again = replay(load_record(rec.id, store), store)
    assert result.identical, result.first_divergence
    assert again.data["multimodal"]["videos"][0]["pixel_values"] == v["pixel_values"]  # recomputed
    # another frame: the multimodal layer names it
    other = {**media, urls[1]: F.png(F.noise(160, 120, seed=99))}
    _, rec2, _ = run_and_record(
        model,
        raw.encode(),
        RunOptions(now="2024-07-26", images=image_options(model, other, StageOptions(max_frames=5))),
        media=other,
    )
    found = diff(rec, rec2).first_divergence
    assert found.layer == "multimodal" and found.location.startswith("multimodal.videos"), found
    # frames inline as data: URLs: the multimodal layer names the change, not the messages layer
    inline = [F.data_url(d) for d in media.values()]
    runs = []
    for frames_ in (inline, [inline[0], F.data_url(other[urls[1]]), inline[2]]):
        body = json.dumps({"messages": [{"role": "user", "content": [video(frames_)]}]}).encode()
        runs.append(run_and_record(model, body, RunOptions(now="2024-07-26", images=image_options(model)))[1])
    found = diff(*runs).first_divergence
    assert found.layer == "multimodal", found


def test_transformers_video_url_key_and_refused_sources(model: ctxlock.Model) -> None:
    urls = frames(2, 112, 112)
    by_url = model.run_images({"messages": [{"role": "user", "content": [{"type": "video", "url": urls}]}]})
    assert by_url.ids == model.run_images({"messages": [{"role": "user", "content": [video(urls)]}]}).ids
    assert by_url.videos[0].frames[1].ref.path == "messages[0].content[0].url[1]"
    for part, path, message in [
        ({"type": "video", "path": "/tmp/clip.mp4"}, ".path", "local file"),
        ({"type": "video", "video": urls, "url": urls}, "", "2 sources"),
        ({"type": "video_url", "video_url": {"url": urls[0], "fps": 2}}, ".video_url.fps", "fps"),
    ]:
        with pytest.raises(RequestValidationError, match=message) as info:
            model.parse({"messages": [{"role": "user", "content": [part]}]})
        assert info.value.path == "messages[0].content[0]" + path


def test_frame_urls_are_request_strings() -> None:
    # every string that can reach a template is checked for control tokens: the frame URLs too
    from ctxlock.request import parse_request

    req = parse_request(
        {
            "messages": [
                {"role": "user", "content": [video(["data:,a", "data:,<|im_start|>"])]},
                {"role": "user", "content": [{"type": "image", "base64": "QUJD"}]},
            ]
        }
    )
    found = dict(req.strings())
    assert found["messages[0].content[0].video[1]"] == "data:,<|im_start|>"
    assert found["messages[1].content[0].base64"] == "QUJD"


_ITEM = st.one_of(
    st.tuples(st.just("image"), st.integers(1, 3), st.integers(28, 300), st.integers(28, 300)),
    st.tuples(st.just("video"), st.integers(1, 5), st.integers(28, 300), st.integers(28, 300)),
    st.tuples(st.just("text"), st.integers(0, 0), st.integers(0, 0), st.integers(0, 0)),
)
_PNGS: dict[tuple[int, int, int], str] = {}


def _url(w: int, h: int, seed: int) -> str:
    key = (w, h, seed)
    if key not in _PNGS:
        _PNGS[key] = F.data_url(F.png(F.noise(w, h, seed=seed)))
    return _PNGS[key]


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(st.lists(_ITEM, min_size=1, max_size=4), min_size=1, max_size=3))
def test_every_image_and_video_maps_to_exactly_its_placeholders(model: ctxlock.Model, turns: list) -> None:
    messages: list[dict] = []
    order: list[str] = []
    for t, items in enumerate(turns):
        content = []
        for kind, n, w, h in items:
            if kind == "text":
                content.append({"type": "text", "text": f"turn {t}"})
            elif kind == "image":
                content.append({"type": "image", "image": _url(w, h, n)})
                order.append("image")
            else:
                content.append(video([_url(w, h, k) for k in range(n)]))
                order.append("video")
        messages += [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}]
    mm = model.run_images({"messages": messages}, decode=False)
    spans = sorted([*mm.spans, *mm.video_spans], key=lambda s: s.start)
    assert [s.kind for s in spans] == order  # in request order, neither lost nor crossed
    assert [s.index for s in mm.spans] == list(range(len(mm.spans)))
    assert [s.index for s in mm.video_spans] == list(range(len(mm.video_spans)))
    for a, b in itertools.pairwise(spans):
        assert a.end < b.start
    inputs = {("image", i.ref.index): i.n_tokens for i in mm.images} | {
        ("video", v.ref.index): v.n_tokens for v in mm.videos
    }
    for s in spans:
        pad = 151655 if s.kind == "image" else 151656
        assert mm.ids[s.start : s.end] == (pad,) * inputs[(s.kind, s.index)]
        assert mm.ids[s.start - 1] == 151652 and mm.ids[s.end] == 151653
        assert mm.text[s.text_start : s.text_end] == ("<|image_pad|>" if pad == 151655 else "<|video_pad|>") * (
            s.end - s.start
        )
    assert len(mm.ids) == len(mm.tokenized.ids) + sum(n - 1 for n in inputs.values())


def test_cli_render_and_count_show_videos(tmp_path: Path, model_dir: Path) -> None:
    from cli_runner import run_cli

    (tmp_path / "f0.png").write_bytes(F.png(F.noise(320, 240, seed=0)))
    (tmp_path / "f1.png").write_bytes(F.png(F.noise(320, 240, seed=1)))
    urls = ["https://example.com/f0.png", "https://example.com/f1.png"]
    request = {"messages": [{"role": "user", "content": [video(urls), {"type": "text", "text": "What moves?"}]}]}
    (tmp_path / "video.json").write_text(json.dumps(request), encoding="utf-8")
    media = [a for k in range(2) for a in ("--media", f"{urls[k]}={tmp_path / f'f{k}.png'}")]
    common = (str(tmp_path / "video.json"), "--model", str(model_dir), *media)
    shown = run_cli("render", *common, env={"PWD": str(tmp_path), "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "[video 0: 99 tokens, 2 frames, grid (1, 18, 22)]" in shown.stdout
    assert "pixel_values_videos (396, 1176)" in shown.stdout
    as_json = json.loads(run_cli("render", *common, "--json", env={"PWD": str(tmp_path)}).stdout)
    assert as_json["multimodal"]["video_spans"][0]["tokens"] == [15, 114]
    assert as_json["multimodal"]["video_grid_thw"] == [[1, 18, 22]]
    counted = run_cli("count", *common, env={"PWD": str(tmp_path), "COLUMNS": "200"})
    assert "video 0  99 tokens in messages[0]" in counted.stdout, counted.stdout + counted.stderr
    refused = run_cli("render", str(tmp_path / "video.json"), "--model", str(model_dir), env={"PWD": str(tmp_path)})
    assert refused.returncode == 1 and refused.stderr.startswith(
        "error: MediaSourceError: messages[0].content[0].video[0]"
    )


def test_qwen35_template_renders_video_parts(tmp_path: Path) -> None:
    # The Qwen3.5 template's render_content writes <|video_pad|> for `'video' in item or item.type == 'video'`: a
    # video_url part reaches it as type "video"; the ids are those of the template rendered by transformers.
    directory = F.build_qwen2vl_dir(tmp_path / "q35", F.HUB_PREPROCESSOR, template=F.qwen35_template())
    model = ctxlock.load(str(directory))
    jpegs = [F.encode(F.noise(112, 84, seed=k), "JPEG", quality=90) for k in range(2)]
    url = "data:video/jpeg;base64," + ",".join(base64.b64encode(j).decode() for j in jpegs)
    messages = [
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "?"}]}
    ]
    got = model.run_images({"messages": messages})
    tok = AutoTokenizer.from_pretrained(directory)
    hf_messages = [{"role": "user", "content": [{"type": "video", "video": url}, {"type": "text", "text": "?"}]}]
    text, ids = expected_ids(tok, hf_messages, got.video_grid_thw.tolist())
    assert got.text == text and list(got.ids) == ids
    assert len(got.video_spans) == 1


_HOSTILE_URL = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "data:video/jpeg;base64,",
            "data:video/jpeg;base64,,,",
            "data:video/jpeg;base64,/9j/,AAAA",
            "data:video/webm;base64,AAAA",
            "data:image/png;base64,iVBORw0KGgo=",
            "ftp://x/y",
            "data:,",
        ]
    ),
)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["video", "video_url"]),
    key=st.sampled_from(["video", "video_url", "url", "path", "x"]),
    value=st.one_of(
        _HOSTILE_URL,
        st.lists(_HOSTILE_URL, max_size=3),
        st.dictionaries(st.sampled_from(["url", "fps"]), _HOSTILE_URL, max_size=2),
        st.integers(),
        st.none(),
    ),
)
def test_hostile_video_parts_are_typed_errors(model: ctxlock.Model, kind: str, key: str, value: object) -> None:
    try:
        model.run_images({"messages": [{"role": "user", "content": [{"type": kind, key: value}]}]})
    except ctxlock.errors.CtxlockError as e:
        assert e.path is not None and e.path.startswith("messages[0].content[0]"), e
