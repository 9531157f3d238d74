"""Where an image's bytes come from: a `data:` URL in the request, or bytes the caller supplied for a URL.

ctxlock never fetches. Both dialects' image parts reach here in the canonical request: OpenAI `image_url` parts
(kept as sent: `{"type": "image_url", "image_url": {"url": ...}}` or a URL string; `processor_image_parts` makes
them `{"type": "image", "url"}` for the template of a model with an image processor), Responses-style `input_image`
parts (canonical `{"type": "image", "image_url": <url>}`), transformers-style `{"type": "image", "image" | "url" |
"base64": ...}` parts, and Anthropic `image` blocks (canonical `{"type": "image", "url": "data:<media
type>;base64,<data>"}` for a base64 source, the URL for a url source). An http(s) URL is an error at its JSON path
unless `media` maps that exact URL to its bytes.

A video is a list of frames, each an image source: `{"type": "video", "video": [<url>, ...]}` (transformers' and
qwen-vl-utils' frame list), or vLLM's `data:video/jpeg;base64,<frame>,<frame>,...` in a `video` or `video_url`
part (canonical `{"type": "video", "video_url": ...}`). A video file (mp4, webm...) is refused: ctxlock decodes
no container and samples no frames.
"""

from __future__ import annotations

import binascii
import dataclasses
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from ctxlock.core import FrozenDict, freeze
from ctxlock.errors import MediaSourceError, MediaTypeError
from ctxlock.request import Request


@dataclass(frozen=True)
class ImageRef:
    """One image part of a request, in the order the parts appear (message by message, part by part)."""

    index: int  # 0-based, over the whole request
    path: str  # the JSON path of the URL as the client sent it
    url: str
    message: int  # the index of the canonical message holding it

    @property
    def kind(self) -> str:
        """ "data", "http" (http or https) or "other"."""
        if self.url[:5].lower() == "data:":
            return "data"
        if re.match(r"(?i)https?://", self.url):
            return "http"
        return "other"


@dataclass(frozen=True, eq=False)
class ImageBytes:
    """An image's bytes and the media type its source declared (None: a supplied URL's bytes declare none)."""

    ref: ImageRef
    data: bytes
    declared_type: str | None
    origin: str  # "data-url" or "supplied"


@dataclass(frozen=True)
class VideoRef:
    """One video part: its frames in order, each an image source (`ImageRef.index` is the frame's number)."""

    index: int  # 0-based, over the request's videos
    path: str  # the JSON path of the part
    frames: tuple[ImageRef, ...]
    message: int

    @property
    def url(self) -> str:
        """A key for the whole video (its frame URLs), stable when the request is rebuilt (the budget's)."""
        return "video:" + "\n".join(f.url for f in self.frames)


def image_url(part: FrozenDict) -> tuple[str, str] | None:
    """(url, suffix of its JSON path within the part) for an image part, or None for any other part. A `base64`
    value (transformers' raw base64 string) becomes a data: URL with no media type (the bytes name it)."""
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        if isinstance(image, str):
            return image, ".image_url"
        if isinstance(image, Mapping) and isinstance(image.get("url"), str):
            return image["url"], ".image_url.url"
    if kind == "image":
        for key in ("url", "image", "image_url"):
            if isinstance(part.get(key), str):
                return part[key], f".{key}"
        if isinstance(part.get("base64"), str):
            return f"data:;base64,{part['base64']}", ".base64"
    return None


def video_frames(part: FrozenDict) -> list[tuple[str, str]] | None:
    """[(frame url, suffix of its JSON path)] for a video part, or None for any other part."""
    if part.get("type") != "video":
        return None
    for key in ("video", "video_url", "url"):
        value = part.get(key)
        if isinstance(value, Mapping):
            value, suffix = value.get("url"), f".{key}.url"
        else:
            suffix = f".{key}"
        if isinstance(value, list | tuple):
            return [(u, f"{suffix}[{k}]") for k, u in enumerate(value)]
        if isinstance(value, str):
            return [(u, suffix) for u in _frame_list(value, suffix)]
    return []


def _frame_list(url: str, suffix: str) -> list[str]:
    """vLLM's `data:video/jpeg;base64,<frame>,<frame>,...`: one data: URL per frame. Anything else is a video
    file, which ctxlock does not decode (the path is completed by the caller)."""
    m = _DATA.fullmatch(url)
    if m is not None and m[1].replace(" ", "").lower() == "video/jpeg;base64":
        return [f"data:image/jpeg;base64,{chunk}" for chunk in m[2].split(",")]
    kind = m[1].split(";")[0] if m is not None else url.split(":")[0] + " URL"
    raise MediaTypeError(
        f"a video given as one {kind or 'data: URL'}: ctxlock decodes no video container and samples no frames",
        path=suffix,
        hint='send the frames: {"type": "video", "video": ["data:image/png;base64,...", ...]} or '
        '"data:video/jpeg;base64,<frame>,<frame>,..."',
    )


def processor_image_parts(request: Request) -> tuple[Request, tuple[str, ...]]:
    """The request as an HF processor's template sees it: each OpenAI `image_url` part (object or URL-string form)
    becomes `{"type": "image", "url": <url>}`, what `ProcessorMixin.apply_chat_template` makes of it before its
    template runs (transformers 5), and what vLLM's "openai" content format hands a template (`{"type": "image"}`,
    without the URL). So a template that only tests `type == "image"` (LLaVA's) sees every image. `detail` is
    dropped, as both references drop it. Only for a model with an image processor: a text-only model's reference
    is the tokenizer's `apply_chat_template`, which passes the part as sent. Returns the request (the same object
    when nothing changed) and the JSON paths of the parts rewritten; each URL keeps its path as sent (origins)."""
    messages, rewritten = [], []
    for m in request.messages:
        content = m.content
        if isinstance(content, tuple) and any(p.get("type") == "image_url" for p in content):
            parts, origins = [], dict(m.origins)
            for j, part in enumerate(content):
                found = image_url(part) if part.get("type") == "image_url" else None
                if found is None:
                    parts.append(part)
                    continue
                url, suffix = found
                origins[f".content[{j}].url"] = m.path_of(f".content[{j}]{suffix}")
                rewritten.append(m.path_of(f".content[{j}]"))
                parts.append(freeze({"type": "image", "url": url}))
            m = dataclasses.replace(m, content=tuple(parts), origins=FrozenDict(origins))
        messages.append(m)
    if not rewritten:
        return request, ()
    return dataclasses.replace(request, messages=tuple(messages)), tuple(rewritten)


def processor_parts_warning(rewritten: tuple[str, ...]) -> FrozenDict:
    """What `processor_image_parts` did, for `Rendered.warnings` (and the record)."""
    shown = ", ".join(rewritten[:3]) + (f" and {len(rewritten) - 3} more" if len(rewritten) > 3 else "")
    return freeze(
        {
            "kind": "image_parts_normalized",
            "message": f"{len(rewritten)} OpenAI image_url part(s) reached the template as "
            '{"type": "image", "url": ...}, as transformers\' processor gives them (vLLM gives {"type": "image"}); '
            "detail is dropped, as both drop it",
            "path": shown,
        }
    )


def image_refs(request: Request) -> tuple[ImageRef, ...]:
    return tuple(_walk(request))


def video_refs(request: Request) -> tuple[VideoRef, ...]:
    """Every video part, in order; a video part without frames, or with a frame that is not a string, is an
    error at its JSON path."""
    out: list[VideoRef] = []
    for i, m in enumerate(request.messages):
        for j, part in enumerate(() if isinstance(m.content, str) or m.content is None else m.content):
            base = m.path_of(f".content[{j}]")
            try:
                found = video_frames(part)
            except MediaTypeError as e:
                e.path = base + (e.path or "")
                e.args = (str(e),)
                raise
            if found is None:
                continue
            if not found or not all(isinstance(u, str) for u, _ in found):
                raise MediaSourceError(
                    "a video part without a list of frame URLs",
                    path=base,
                    hint='send {"type": "video", "video": ["data:image/png;base64,...", ...]}',
                )
            frames = tuple(
                ImageRef(index=k, path=f"{base}{suffix}", url=u, message=i) for k, (u, suffix) in enumerate(found)
            )
            out.append(VideoRef(index=len(out), path=base, frames=frames, message=i))
    return tuple(out)


def _walk(request: Request) -> Iterator[ImageRef]:
    n = 0
    for i, m in enumerate(request.messages):
        if isinstance(m.content, str) or m.content is None:
            continue
        for j, part in enumerate(m.content):
            found = image_url(part)
            if found is None:
                continue
            url, suffix = found
            yield ImageRef(index=n, path=m.path_of(f".content[{j}]{suffix}"), url=url, message=i)
            n += 1


_DATA = re.compile(r"(?is)data:([^,]*?),(.*)")


def parse_data_url(url: str, path: str) -> tuple[str | None, bytes]:
    """(media type or None, bytes) of a `data:` URL; base64 is decoded strictly (RFC 4648 alphabet, padding)."""
    m = _DATA.fullmatch(url)
    if m is None:
        raise MediaSourceError("a data: URL without a comma", path=path, hint="use data:<media type>;base64,<data>")
    meta, payload = m[1], m[2]
    params = [p.strip() for p in meta.split(";")]
    media_type = params[0].lower() or None
    if "base64" in (p.lower() for p in params[1:]):
        try:
            data = binascii.a2b_base64(re.sub(r"\s+", "", payload), strict_mode=True)
        except (binascii.Error, ValueError) as e:
            raise MediaSourceError(
                f"the data: URL's base64 is invalid: {e}", path=path, hint="send standard base64 with its padding"
            ) from None
    else:
        data = unquote_to_bytes(payload)
    if not data:
        raise MediaSourceError("the data: URL holds no bytes", path=path, hint="send the image's bytes")
    return media_type, data


def resolve(ref: ImageRef, media: Mapping[str, bytes] | None = None) -> ImageBytes:
    """The bytes of one image: decoded from its data: URL, or `media[url]` for any other URL. Never fetched."""
    if ref.kind == "data":
        declared, data = parse_data_url(ref.url, ref.path)
        return ImageBytes(ref, data, declared, "data-url")
    supplied = (media or {}).get(ref.url)
    if supplied is not None:
        if not isinstance(supplied, bytes | bytearray | memoryview):
            raise MediaSourceError(f"the bytes supplied for {ref.url!r} are a {type(supplied).__name__}", path=ref.path)
        return ImageBytes(ref, bytes(supplied), None, "supplied")
    shown = ref.url if len(ref.url) <= 80 else ref.url[:77] + "..."
    raise MediaSourceError(
        f"ctxlock never fetches URLs, and no bytes were supplied for {shown!r}",
        path=ref.path,
        hint="send the image as a data: URL (or a base64 source), or supply its bytes: media={url: bytes} in the "
        "API, --media URL=FILE on the command line",
    )
