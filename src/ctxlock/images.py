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

from ctxlock.errors import ImagePlacementError
from ctxlock.frozen import FrozenDict, thaw
from ctxlock.multimodal.base import ImageFamily
from ctxlock.multimodal.pipeline import ImageInput, stack_pixels
from ctxlock.request import Request
from ctxlock.template_values import Rendered
from ctxlock.tensors import ModelInput, _assemble_own
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

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "tokens": [self.start, self.end],
            "text": [self.text_start, self.text_end],
            "path": self.path,
        }


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
    added: AddedSpecialTokens = AddedSpecialTokens()  # in `ids`, not in `text`

    def span_map(self) -> dict[int, tuple[int, int]]:
        """{image index: (start, end)} token spans in `ids`."""
        return {s.index: (s.start, s.end) for s in self.spans}

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "params": thaw(self.params),
            "n_tokens": len(self.ids),
            "images": [im.to_json() for im in self.images],
            "spans": [s.to_json() for s in self.spans],
            "added_special_tokens": self.added.to_json(),
        }


def _placeholder_id(family: ImageFamily, tokenizer: Tokenizer) -> int:
    pid = tokenizer.token_to_id(family.template_placeholder)
    if pid is None or family.template_placeholder not in tokenizer.control_tokens:
        raise ImagePlacementError(
            f"the tokenizer has no control token {family.template_placeholder!r} for {family.name} images",
            path="images",
            hint="this model does not take images the way the family expects; use the model's own tokenizer",
        )
    return pid


def _in_request(rendered: Rendered, start: int, end: int) -> str | None:
    """The request path of a request span that overlaps [start, end), or None."""
    for s in rendered.request_spans:
        if s.start < end and start < s.end:
            return s.path
    return None


def expand(
    request: Request,
    rendered: Rendered,
    tokenized: Tokenized,
    tokenizer: Tokenizer,
    family: ImageFamily,
    images: tuple[ImageInput, ...],
) -> MultimodalInput:
    """Replace the template's placeholders by each image's tokens; the span map; the pixel tensors."""
    pid = _placeholder_id(family, tokenizer) if images else (tokenizer.token_to_id(family.template_placeholder) or -1)
    slots = [m for m in tokenized.control if m.id == pid]
    for m in slots:
        forged = _in_request(rendered, m.core_start, m.core_end)
        if forged is not None:
            raise ImagePlacementError(
                f"request text holds the image placeholder {family.template_placeholder!r} as a control token",
                path=forged,
                hint="image slots come only from image parts; render with injection='text' (the default)",
            )
    if len(slots) != len(images):
        raise _mismatch(family, len(slots), images)
    positions = [k for k, i in enumerate(tokenized.ids) if i == pid]
    if len(positions) != len(slots):
        raise ImagePlacementError(
            f"{len(positions)} placeholder ids but {len(slots)} placeholder tokens in the text",
            path="images",
            hint="the tokenizer merged the placeholder with its neighbours; report this template",
        )
    ids: list[int] = []
    text_parts: list[str] = []
    spans: list[ImageSpan] = []
    prev_tok = prev_chr = 0
    text = rendered.text
    for im, k, m in zip(images, positions, slots, strict=True):
        tokens = family.placeholders(im.plan)
        new_ids = [_token_id(tokenizer, t) for t in tokens]
        ids += tokenized.ids[prev_tok:k]
        text_parts.append(text[prev_chr : m.core_start])
        start, text_start = len(ids), sum(map(len, text_parts))
        ids += new_ids
        text_parts.append("".join(tokens))
        spans.append(ImageSpan(im.ref.index, start, len(ids), text_start, sum(map(len, text_parts)), im.ref.path))
        prev_tok, prev_chr = k + 1, m.core_end
    ids += tokenized.ids[prev_tok:]
    text_parts.append(text[prev_chr:])
    pixel_values, grids = stack_pixels(images)
    return MultimodalInput(
        request=request,
        rendered=rendered,
        tokenized=tokenized,
        text="".join(text_parts),
        ids=tuple(ids),
        model_input=_assemble_own(ids),
        family=family.name,
        params=family.params(),
        images=images,
        spans=tuple(spans),
        pixel_values=pixel_values,
        image_grid_thw=grids,
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
        model_input=_assemble_own(ids),
        spans=tuple(replace(s, start=s.start + shift, end=s.end + shift) for s in mm.spans),
        added=added,
    )
