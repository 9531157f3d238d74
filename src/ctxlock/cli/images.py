"""Images on the command line: `--media URL=FILE` (the bytes of an http(s) image URL; ctxlock never fetches), and
`ctxlock render`'s view of a multimodal run, each image shown as one `[image 0: 391 tokens, sha256 …]` block and
each video as one `[video 0: 56 tokens, 3 frames, grid (2, 8, 14)]` block."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ctxlock.cli import output
from ctxlock.cli.output import write_exact, write_ids
from ctxlock.errors import CtxlockError, InputError
from ctxlock.model._model import Model
from ctxlock.multimodal import image_refs, video_refs
from ctxlock.outside._files import read_input
from ctxlock.records._wire import run_warnings
from ctxlock.template._options import RenderOptions

if TYPE_CHECKING:
    from ctxlock.multimodal import MultimodalInput

MediaOpt = Annotated[
    list[str],
    typer.Option(
        "--media",
        help="URL=FILE: the bytes of an image the request names by an http(s) URL (repeatable). ctxlock never "
        "fetches a URL; a request's data: URLs and base64 sources need nothing.",
    ),
]


def read_media(items: list[str]) -> dict[str, bytes]:
    """{url: bytes} from --media URL=FILE items; the file is read under the input cap."""
    out: dict[str, bytes] = {}
    for item in items:
        url, sep, path = item.rpartition("=")
        if not sep or not url or not path:
            raise InputError(
                f"--media {item!r} is not URL=FILE", path="--media", hint="e.g. --media https://x/a.png=a.png"
            )
        if url in out:
            raise InputError(f"--media names {url!r} twice", path=f"--media {url}", hint="name each URL once")
        out[url] = read_input(path, label=f"--media {path}")
    return out


def is_multimodal(result: object) -> bool:
    """Whether a run's result is a `MultimodalInput` (`Model.run_images`): a text-only run never imports the image
    stage, so its module is looked up only if something loaded it."""
    expand = sys.modules.get("ctxlock.multimodal._expand")
    return expand is not None and isinstance(result, expand.MultimodalInput)


def wants_images(model: Model, data: bytes, options: RenderOptions) -> bool:
    """A model with an image processor and a request with images: the run goes through `run_images`. A request
    that does not parse is left to the run, which reports (and records) its error."""
    if model.artifacts.preprocessor is None:
        return False
    try:
        request = options.parse(data)
    except CtxlockError:
        return False
    try:
        return bool(image_refs(request) or video_refs(request))
    except CtxlockError:
        return True  # a video part ctxlock cannot read: the run reports (and records) its error


def block(mm: MultimodalInput, index: int) -> str:
    image = mm.images[index]
    return f"[image {index}: {image.n_tokens} tokens, sha256 {image.header.sha256[:16]}…]"


def video_block(mm: MultimodalInput, index: int) -> str:
    video = mm.videos[index]
    return f"[video {index}: {video.n_tokens} tokens, {len(video.frames)} frames, grid {video.plan.grid}]"


def text_with_blocks(mm: MultimodalInput) -> tuple[str, list[tuple[int, int, str]]]:
    """The expanded text with each image's (and video's) span replaced by its block, and the blocks' ranges."""
    parts: list[str] = []
    marks: list[tuple[int, int, str]] = []
    pos = 0
    spans = sorted([*mm.spans, *mm.video_spans], key=lambda s: s.start)
    for span in spans:
        parts.append(mm.text[pos : span.text_start])
        start = sum(map(len, parts))
        parts.append(block(mm, span.index) if span.kind == "image" else video_block(mm, span.index))
        marks.append((start, start + len(parts[-1]), "1;30;46"))
        pos = span.text_end
    parts.append(mm.text[pos:])
    return "".join(parts), marks


# each family's size parameters, in this order, those it has (Qwen2-VL, Pixtral, LLaVA)
_SHOWN = (
    "min_pixels",
    "max_pixels",
    "patch_size",
    "merge_size",
    "image_patch_size",
    "max_image_size",
    "spatial_merge_size",
    "shortest_edge",
    "crop_size",
)


def show(model: Model, mm: MultimodalInput) -> None:
    from rich.markup import escape  # the human view only: --json never imports rich
    from rich.rule import Rule

    console = output.console
    r = mm.rendered
    console.print(
        Rule(f"[bold]{escape(model.id)}[/] · template [cyan]{escape(r.template.id)}[/] · images: {escape(mm.family)}")
    )
    text, marks = text_with_blocks(mm)
    write_exact(text, marks)
    video_tokens = f", {sum(v.n_tokens for v in mm.videos)} video tokens" if mm.videos else ""
    console.print(Rule(f"{len(mm.ids)} tokens ({sum(im.n_tokens for im in mm.images)} image tokens{video_tokens})"))
    write_ids(list(mm.ids))
    if mm.images or not mm.videos:
        console.print(Rule("images"))
    for k, (image, span) in enumerate(zip(mm.images, mm.spans, strict=True)):
        h, plan = image.header, image.plan
        console.print(f"{escape(block(mm, k))}  {escape(span.path)}")
        console.print(
            f"  {h.format} {h.width}x{h.height} {h.mode}, {h.frames} frame(s), EXIF orientation {h.orientation}, "
            f"{image.origin}, sha256 {h.sha256}"
        )
        for step in plan.steps:
            console.print(f"  {step.name}: {step.size_in} -> {step.size_out} ({escape(step.why)})")
        console.print(f"  grid {plan.grid}, tokens [{span.start}, {span.end})")
        if image.pixels is not None and image.decoded is not None:
            console.print(
                f"  pixel_values {tuple(image.pixels.pixel_values.shape)} float32 sha256 {image.pixels.pixel_sha256}"
                f" ({escape(image.decoded.decoder)}, {image.decoded.orientation}, colour {image.decoded.colour})"
            )
    _show_videos(mm)
    params = dict(mm.params)
    shown = ", ".join(f"{k}={params[k]}" for k in _SHOWN if k in params)
    console.print(f"parameters {escape(shown)} (from {escape(str(params.get('source', params.get('reference'))))})")
    if "resample" in params:
        resample = params["resample"]
        named = f" (PIL {_PIL_FILTERS[resample]})" if isinstance(resample, int) and resample in _PIL_FILTERS else ""
        console.print(f"resample   {escape(str(resample))}{named}")
    if params.get("exact_vs_reference") is False:
        console.print(f"[yellow]not exact[/] pixel values against {escape(str(params.get('reference')))}: see resample")
    console.print(f"template   {r.template.sha256}  ({escape(r.template.origin or r.template.id)})")
    console.print(f"tokenizer  {model.tokenizer.sha256}  ({model.tokenizer.format})")
    for w in run_warnings(model, r, mm.request):  # the record's warnings: e.g. image_parts_normalized
        console.print(f"[bold yellow]warning[/]    {escape(w['message'])}  ({escape(str(w.get('path') or ''))})")


# PIL's resampling filter codes, as preprocessor configs give them (`resample: 3`)
_PIL_FILTERS = {0: "NEAREST", 1: "LANCZOS", 2: "BILINEAR", 3: "BICUBIC", 4: "BOX", 5: "HAMMING"}


def _show_videos(mm: MultimodalInput) -> None:
    from rich.markup import escape
    from rich.rule import Rule

    console = output.console
    if not mm.videos:
        return
    console.print(Rule("videos"))
    for k, (video, span) in enumerate(zip(mm.videos, mm.video_spans, strict=True)):
        console.print(f"{escape(video_block(mm, k))}  {escape(span.path)}")
        for f in video.frames:
            h = f.header
            console.print(f"  frame {f.ref.index}: {h.format} {h.width}x{h.height} {h.mode}, sha256 {h.sha256}")
        for step in video.plan.steps:
            console.print(f"  {step.name}: {step.size_in} -> {step.size_out} ({escape(step.why)})")
        console.print(f"  grid {video.plan.grid}, tokens [{span.start}, {span.end})")
        if video.pixels is not None:
            console.print(
                f"  pixel_values_videos {tuple(video.pixels.pixel_values.shape)} float32 sha256 "
                f"{video.pixels.pixel_sha256}"
            )


def to_dict(mm: MultimodalInput) -> dict[str, Any]:
    out = {
        **mm.to_json(),
        "expanded_text": mm.text,
        "input_ids": list(mm.ids),
        "image_grid_thw": mm.image_grid_thw.tolist(),
        "pixel_values_shape": list(mm.pixel_values.shape),
    }
    if mm.videos and mm.video_grid_thw is not None and mm.pixel_values_videos is not None:
        out["video_grid_thw"] = mm.video_grid_thw.tolist()
        out["pixel_values_videos_shape"] = list(mm.pixel_values_videos.shape)
    return out
