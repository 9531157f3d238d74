"""The template's image placeholders expanded to each image's tokens, with the span map.

After the render and the tokenizer, each placeholder the *template* wrote (a control token, e.g. Qwen2-VL's
`<|image_pad|>` between `<|vision_start|>` and `<|vision_end|>`) is replaced by the family's tokens for the image
at the same position (`family.placeholders(plan)`, e.g. N copies of `<|image_pad|>`), in the ids and in the text.
The result maps each image index to its token span [start, end) and its text span. Images pair with placeholders
one to one, in order; anything else is an `ImagePlacementError`, as is a placeholder string that came from
request text (it never becomes an image slot, whatever the special-token policy).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ctxlock.core import FrozenDict, thaw
from ctxlock.errors import ImagePlacementError
from ctxlock.multimodal._base import ImageFamily
from ctxlock.multimodal._pipeline import ImageInput, VideoInput, stack_pixels, stack_videos
from ctxlock.request import Request
from ctxlock.template import Rendered
from ctxlock.tensors import ModelInput, assemble_own
from ctxlock.tokenizer import Tokenized, Tokenizer


@dataclass(frozen=True)
class ImageSpan:
    """Where image `index` sits in the expanded input: tokens [start, end), characters [text_start, text_end)."""

    index: int
    start: int
    end: int
    text_start: int
    text_end: int
    path: str  # the JSON path of the image part
    kind: str = "image"  # or "video"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "tokens": [self.start, self.end],
            "text": [self.text_start, self.text_end],
            "path": self.path,
        } | ({"kind": self.kind} if self.kind != "image" else {})


# transformers' ProcessorMixin.apply_chat_template(tokenize=True), processing_utils.py (5.24)
PROCESSOR_RULE = (
    "the HF processor tokenizes the rendered prompt with add_special_tokens=True unless the prompt starts with the "
    "tokenizer's bos_token (ProcessorMixin.apply_chat_template, tokenize=True)"
)


@dataclass(frozen=True)
class AddedSpecialTokens:
    """Ids added around the expanded prompt's own ids, outside `text` (the HF processor's tokenize step adds them:
    LLaVA's `<s>`). Empty for a family whose reference adds none (mistral-common's template writes its BOS)."""

    before: tuple[int, ...] = ()
    after: tuple[int, ...] = ()
    rule: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"before": list(self.before), "after": list(self.after), "rule": self.rule}


@dataclass(frozen=True, eq=False)
class MultimodalInput:
    """What a multimodal model receives: the expanded ids and text, each image's span, and the pixel tensors."""

    request: Request
    rendered: Rendered
    tokenized: Tokenized  # the rendered text's ids, before the expansion
    text: str  # the rendered text with every placeholder expanded
    ids: tuple[int, ...]
    model_input: ModelInput
    family: str
    params: FrozenDict  # the family's parameters
    images: tuple[ImageInput, ...]
    spans: tuple[ImageSpan, ...]
    pixel_values: np.ndarray  # concatenated over the images, as the HF processor returns them (empty: header only)
    image_grid_thw: np.ndarray
    videos: tuple[VideoInput, ...] = ()
    video_spans: tuple[ImageSpan, ...] = ()
    pixel_values_videos: np.ndarray | None = None  # concatenated over the videos (empty: header only)
    video_grid_thw: np.ndarray | None = None
    added: AddedSpecialTokens = AddedSpecialTokens()  # in `ids`, not in `text`

    def span_map(self) -> dict[int, tuple[int, int]]:
        """{image index: (start, end)} token spans in `ids`."""
        return {s.index: (s.start, s.end) for s in self.spans}

    def video_span_map(self) -> dict[int, tuple[int, int]]:
        """{video index: (start, end)} token spans in `ids`."""
        return {s.index: (s.start, s.end) for s in self.video_spans}

    def to_json(self) -> dict[str, Any]:
        out = {
            "family": self.family,
            "params": thaw(self.params),
            "n_tokens": len(self.ids),
            "images": [im.to_json() for im in self.images],
            "spans": [s.to_json() for s in self.spans],
            "added_special_tokens": self.added.to_json(),
        }
        if self.videos:
            out["videos"] = [v.to_json() for v in self.videos]
            out["video_spans"] = [s.to_json() for s in self.video_spans]
        return out


def _placeholder_id(placeholder: str, family: ImageFamily, tokenizer: Tokenizer, what: str = "images") -> int:
    pid = tokenizer.token_to_id(placeholder)
    if pid is None or placeholder not in tokenizer.control_tokens:
        raise ImagePlacementError(
            f"the tokenizer has no control token {placeholder!r} for {family.name} {what}",
            path=what,
            hint=f"this model does not take {what} the way the family expects; use the model's own tokenizer",
        )
    return pid


def _in_request(rendered: Rendered, start: int, end: int) -> str | None:
    """The request path of a request span that overlaps [start, end), or None."""
    for s in rendered.request_spans:
        if s.start < end and start < s.end:
            return s.path
    return None


def _slots(
    rendered: Rendered, tokenized: Tokenized, pid: int, placeholder: str, what: str = "image"
) -> tuple[list[int], list[Any]]:
    """(token positions, control matches) of the template's placeholders `pid`; one from request text is an error."""
    slots = [m for m in tokenized.control if m.id == pid]
    for m in slots:
        forged = _in_request(rendered, m.core_start, m.core_end)
        if forged is not None:
            raise ImagePlacementError(
                f"request text holds the {what} placeholder {placeholder!r} as a control token",
                path=forged,
                hint="image and video slots come only from their parts; render with injection='text' (the default)",
            )
    positions = [k for k, i in enumerate(tokenized.ids) if i == pid]
    if len(positions) != len(slots):
        raise ImagePlacementError(
            f"{len(positions)} placeholder ids but {len(slots)} placeholder tokens in the text",
            path="images",
            hint="the tokenizer merged the placeholder with its neighbours; report this template",
        )
    return positions, slots


def expand(
    request: Request,
    rendered: Rendered,
    tokenized: Tokenized,
    tokenizer: Tokenizer,
    family: ImageFamily,
    images: tuple[ImageInput, ...],
    videos: tuple[VideoInput, ...] = (),
) -> MultimodalInput:
    """Replace the template's placeholders by each image's (and video's) tokens; the span maps; the tensors."""
    ph = family.template_placeholder
    pid = _placeholder_id(ph, family, tokenizer) if images else (tokenizer.token_to_id(ph) or -1)
    positions, slots = _slots(rendered, tokenized, pid, ph)
    if len(slots) != len(images):
        raise _mismatch(family, len(slots), images)
    events = [
        (k, m, family.placeholders(im.plan), im.ref.index, im.ref.path, "image")
        for im, k, m in zip(images, positions, slots, strict=True)
    ]
    vph: str | None = getattr(family, "video_placeholder", None)
    if videos or (vph and tokenizer.token_to_id(vph) is not None):
        if vph is None:  # videos, and a family that takes none (`Model.run_images` refuses them when it plans them)
            raise ImagePlacementError(
                f"the {family.name} image family takes no video",
                path=videos[0].ref.path,
                hint="send the frames as images, or use a model that takes video (Qwen2-VL, Qwen2.5-VL)",
            )
        vid = _placeholder_id(vph, family, tokenizer, "videos") if videos else _token_id(tokenizer, vph)
        vpos, vslots = _slots(rendered, tokenized, vid, vph, "video")
        if len(vslots) != len(videos):
            raise _video_mismatch(vph, len(vslots), videos)
        events += [
            (k, m, family.video_placeholders(v.plan), v.ref.index, v.ref.path, "video")  # type: ignore[attr-defined]
            for v, k, m in zip(videos, vpos, vslots, strict=True)
        ]
    ids: list[int] = []
    text_parts: list[str] = []
    spans: list[ImageSpan] = []
    prev_tok = prev_chr = 0
    text = rendered.text
    for k, m, tokens, index, path, kind in sorted(events, key=lambda e: e[0]):
        new_ids = [_token_id(tokenizer, t) for t in tokens]
        ids += tokenized.ids[prev_tok:k]
        text_parts.append(text[prev_chr : m.core_start])
        start, text_start = len(ids), sum(map(len, text_parts))
        ids += new_ids
        text_parts.append("".join(tokens))
        spans.append(ImageSpan(index, start, len(ids), text_start, sum(map(len, text_parts)), path, kind))
        prev_tok, prev_chr = k + 1, m.core_end
    ids += tokenized.ids[prev_tok:]
    text_parts.append(text[prev_chr:])
    pixel_values, grids = stack_pixels(images)
    video_values, video_grids = stack_videos(videos)
    return MultimodalInput(
        request=request,
        rendered=rendered,
        tokenized=tokenized,
        text="".join(text_parts),
        ids=tuple(ids),
        model_input=assemble_own(ids),
        family=family.name,
        params=family.params(),
        images=images,
        spans=tuple(s for s in spans if s.kind == "image"),
        pixel_values=pixel_values,
        image_grid_thw=grids,
        videos=videos,
        video_spans=tuple(s for s in spans if s.kind == "video"),
        pixel_values_videos=video_values,
        video_grid_thw=video_grids,
    )


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    tid = tokenizer.token_to_id(token)
    if tid is None:
        raise ImagePlacementError(f"the tokenizer has no token {token!r}", path="images")
    return tid


def _mismatch(family: ImageFamily, n_slots: int, images: tuple[ImageInput, ...]) -> ImagePlacementError:
    if n_slots == 0:
        return ImagePlacementError(
            f"the template wrote no image placeholder ({family.template_placeholder!r}) for "
            f"{len(images)} image(s): it does not take images",
            path=images[0].ref.path if images else "images",
            hint="send this request to a model whose template renders image parts, or remove the images",
        )
    if n_slots < len(images):
        return ImagePlacementError(
            f"{len(images)} images but the template wrote {n_slots} placeholder(s)",
            path=images[n_slots].ref.path,
            hint="the template drops some image parts (e.g. outside user messages); remove them",
        )
    return ImagePlacementError(
        f"the template wrote {n_slots} image placeholders for {len(images)} image(s)",
        path="images",
        hint="every placeholder needs its image; the template adds placeholders of its own",
    )


def _video_mismatch(placeholder: str, n_slots: int, videos: tuple[VideoInput, ...]) -> ImagePlacementError:
    if n_slots < len(videos):
        return ImagePlacementError(
            f"{len(videos)} video(s) but the template wrote {n_slots} video placeholder(s) ({placeholder!r})",
            path=videos[n_slots].ref.path,
            hint="send videos to a model whose template renders video parts, in user messages",
        )
    return ImagePlacementError(
        f"the template wrote {n_slots} video placeholders for {len(videos)} video(s)",
        path="videos",
        hint="every video placeholder needs its video; the template adds placeholders of its own",
    )


def special_affixes(tokenizer: Tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids `add_special_tokens=True` puts before and after a text, measured by encoding one (whatever the
    format: a tokenizer.json post-processor, add_bos_token, a GGUF's flags)."""
    plain = tokenizer.encode("a")
    full = tokenizer.encode("a", add_special_tokens=True)
    at = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), None)
    if at is None:
        raise ImagePlacementError(
            f"add_special_tokens=True changes a text's own ids ({plain} -> {full}): ctxlock cannot add them around "
            "an expanded prompt",
            path="images",
            hint="report this tokenizer; the HF processor's ids are not reproducible here",
        )
    return tuple(full[:at]), tuple(full[at + len(plain) :])


def processor_special_tokens(
    family: ImageFamily, tokenizer: Tokenizer, bos_token: str | None, prompt: str
) -> AddedSpecialTokens:
    """What the family's reference processor adds around the ids of the rendered `prompt` (`PROCESSOR_RULE`): for
    LLaVA, `<s>` unless the prompt starts with `bos_token`; nothing for a family whose reference adds none."""
    if not getattr(family, "processor_adds_special_tokens", False):
        return AddedSpecialTokens()
    if bos_token and prompt.startswith(bos_token):
        return AddedSpecialTokens(rule=f"{PROCESSOR_RULE}: it starts with {bos_token!r}")
    before, after = special_affixes(tokenizer)
    if not before and not after:
        return AddedSpecialTokens(rule=f"{PROCESSOR_RULE}: this tokenizer adds none")
    return AddedSpecialTokens(before, after, PROCESSOR_RULE)


def with_processor_special_tokens(
    mm: MultimodalInput, family: ImageFamily, tokenizer: Tokenizer, bos_token: str | None
) -> MultimodalInput:
    """`mm` with the ids the family's HF processor adds in its tokenize step (`processor_special_tokens`):
    LlavaProcessor's ids begin with `<s>` because LLaVA-1.5's template does not write it. The spans shift by what
    is added before; `text` is the processor's prompt, unchanged."""
    added = processor_special_tokens(family, tokenizer, bos_token, mm.rendered.text)
    if not added.before and not added.after:
        return replace(mm, added=added)
    ids = [*added.before, *mm.ids, *added.after]
    shift = len(added.before)
    return replace(
        mm,
        ids=tuple(ids),
        model_input=assemble_own(ids),
        spans=tuple(replace(s, start=s.start + shift, end=s.end + shift) for s in mm.spans),
        video_spans=tuple(replace(s, start=s.start + shift, end=s.end + shift) for s in mm.video_spans),
        added=added,
    )
