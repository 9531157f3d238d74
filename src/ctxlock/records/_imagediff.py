"""The `multimodal` layer of `diff`: how two runs' images differ, named by cause.

"image rotated" when an image's EXIF orientation differs; "image re-encoded" when its bytes differ but its size is
the same and its decoded pixels are close (the 8x8 fingerprints differ by at most `CLOSE` on average, of 255);
"image replaced" when the pixels are not close; "resize policy changed" when only the family's parameters differ;
"decoder changed" when only the decoder (Pillow's version) does; then the pixel digests and the spans.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CLOSE = 6.0  # mean absolute difference of the fingerprints, out of 255, under which pixels are "close"


def _first_key_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    for key in [*a, *(k for k in b if k not in a)]:
        if a.get(key) != b.get(key):
            return key
    return None


def _closeness(a: Sequence[int] | None, b: Sequence[int] | None) -> float | None:
    if not a or not b or len(a) != len(b):
        return None
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


def _bytes_cause(ia: Mapping[str, Any], ib: Mapping[str, Any]) -> str:
    ha, hb = ia.get("header") or {}, ib.get("header") or {}
    if ha.get("orientation") != hb.get("orientation"):
        return (
            f"image rotated: EXIF orientation {ha.get('orientation')} -> {hb.get('orientation')} "
            f"(the image reaches the model as {(ia.get('plan') or {}).get('image_size')} -> "
            f"{(ib.get('plan') or {}).get('image_size')})"
        )
    same_size = (ha.get("width"), ha.get("height")) == (hb.get("width"), hb.get("height"))
    close = _closeness((ia.get("decode") or {}).get("fingerprint"), (ib.get("decode") or {}).get("fingerprint"))
    if same_size and close is not None and close <= CLOSE:
        return (
            f"image re-encoded: other bytes ({ha.get('format')} -> {hb.get('format')}), the same size, pixels close "
            f"(mean difference {close:.1f}/255)"
        )
    if not same_size:
        return f"image replaced: {ha.get('width')}x{ha.get('height')} -> {hb.get('width')}x{hb.get('height')}"
    return "image replaced: the same size, other pixels" + (f" (mean difference {close:.1f}/255)" if close else "")


def compare_images(ma: Mapping[str, Any] | None, mb: Mapping[str, Any] | None) -> tuple[str, Any, Any, str] | None:
    """(location, a, b, cause) of the first difference of two `multimodal` sections, or None."""
    if ma is None or mb is None:
        if ma is mb:
            return None
        return "multimodal", ma is not None, mb is not None, "one run had images and the other did not"
    a_images, b_images = ma.get("images") or [], mb.get("images") or []
    if len(a_images) != len(b_images):
        return "multimodal.images", len(a_images), len(b_images), "an image was added or removed"
    for k, (ia, ib) in enumerate(zip(a_images, b_images, strict=True)):
        where = f"multimodal.images[{k}]"
        ha, hb = ia.get("header") or {}, ib.get("header") or {}
        if ha.get("sha256") != hb.get("sha256"):
            return f"{where}.header.sha256", ha.get("sha256"), hb.get("sha256"), _bytes_cause(ia, ib)
        pa, pb = (ia.get("plan") or {}).get("params") or {}, (ib.get("plan") or {}).get("params") or {}
        key = _first_key_difference(pa, pb)
        if key is not None:
            return f"{where}.plan.params.{key}", pa.get(key), pb.get(key), "resize policy changed"
        da, db = ia.get("decode") or {}, ib.get("decode") or {}
        if da.get("decoder") != db.get("decoder"):
            return f"{where}.decode.decoder", da.get("decoder"), db.get("decoder"), "decoder changed"
        if ia.get("plan") != ib.get("plan"):
            return f"{where}.plan", ia.get("plan"), ib.get("plan"), "the same image and parameters gave another plan"
        va, vb = ia.get("pixel_values") or {}, ib.get("pixel_values") or {}
        if va.get("sha256") != vb.get("sha256"):
            return (
                f"{where}.pixel_values.sha256",
                va.get("sha256"),
                vb.get("sha256"),
                "pixel values differ with the same bytes, parameters and decoder",
            )
        if ia != ib:
            key = _first_key_difference(ia, ib) or "?"
            return f"{where}.{key}", ia.get(key), ib.get(key), "the image's record differs"
    if ma.get("spans") != mb.get("spans"):
        return "multimodal.spans", ma.get("spans"), mb.get("spans"), "the images' placeholder spans moved"
    key = _first_key_difference(ma, mb)
    if key is not None:
        return f"multimodal.{key}", ma.get(key), mb.get(key), "the image stage differs"
    return None


def _mask_part(part: Any) -> Any:
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        masked = {**image, "url": "<image>"} if isinstance(image, Mapping) else "<image>"
        return {**part, "image_url": masked}
    if kind == "image":  # Anthropic's canonical url, transformers' image/url/base64, input_image's image_url
        return {**part, **{k: "<image>" for k in ("url", "image", "base64", "image_url") if k in part}}
    if kind == "video":  # a list of frames, or one URL holding them
        return {**part, **{k: "<video>" for k in ("video", "video_url") if k in part}}
    return part


def mask_images(messages: Any) -> Any:
    """Messages with every image part's URL replaced by "<image>": when both runs recorded their images, the
    `multimodal` layer compares the bytes (and names the cause), not the request and messages layers."""
    if not isinstance(messages, list):
        return messages
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, list):
            m = {**m, "content": [_mask_part(p) for p in content]}
        out.append(m)
    return out
