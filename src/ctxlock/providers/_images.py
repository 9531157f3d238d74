"""The providers' published image rules: tokens from an image's width and height alone.

OpenAI (https://platform.openai.com/docs/guides/images-vision#calculating-costs):

- tile models: `detail: "low"` costs the base tokens; `high` scales the image to fit a 2048 x 2048 square, then
  (when its shortest side is over 768) so that the shortest side is 768, and costs base + tile tokens per 512 px
  tile covering it. 1024 x 1024 at high detail on gpt-4o: 85 + 4 x 170 = 765; 2048 x 4096: 85 + 6 x 170 = 1105.
- patch models: 32 x 32 px patches covering the image, at most 1536 (a larger image is scaled down, then scaled
  again so that one side is a whole number of patches), times the model's multiplier. 1800 x 2400: 1452 patches.

Anthropic (https://docs.anthropic.com/en/docs/build-with-claude/vision#calculate-image-costs): tokens = width x
height / 750, after an image whose long edge is over 1568 px, or which is over about 1,600 tokens, is scaled down
preserving its aspect ratio. "About": the published maximum sizes per aspect ratio give 1,590 to 1,639 tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# (model prefix, base tokens, tokens per tile): the longest matching prefix wins.
_TILES: tuple[tuple[str, int, int], ...] = (
    ("gpt-5-chat-latest", 70, 140),
    ("gpt-5", 70, 140),
    ("gpt-4o-mini", 2833, 5667),
    ("gpt-4o", 85, 170),
    ("chatgpt-4o", 85, 170),
    ("gpt-4.1", 85, 170),
    ("gpt-4.5", 85, 170),
    ("gpt-4-turbo", 85, 170),
    ("o1", 75, 150),
    ("o3", 75, 150),
    ("computer-use-preview", 65, 129),
)
# (model prefix, multiplier) of the patch models.
_PATCHES: tuple[tuple[str, float], ...] = (
    ("gpt-5-mini", 1.62),
    ("gpt-5-nano", 2.46),
    ("gpt-4.1-mini", 1.62),
    ("gpt-4.1-nano", 2.46),
    ("o4-mini", 1.72),
)
PATCH = 32
MAX_PATCHES = 1536


@dataclass(frozen=True, slots=True)
class ImageTokens:
    tokens: int
    low: int
    high: int
    rule: str
    known_model: bool


def _longest(prefixes: tuple[tuple[Any, ...], ...], model: str) -> tuple[Any, ...] | None:
    name = model.removeprefix("ft:")
    found = [p for p in prefixes if name.startswith(p[0])]
    return max(found, key=lambda p: len(p[0]), default=None)


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)  # 1056.0000000001 / 32 is 33 patches, not 34


def openai_patches(width: int, height: int) -> int:
    """The patch count of OpenAI's patch rule, after its downscale."""
    raw = _ceil(width / PATCH) * _ceil(height / PATCH)
    if raw <= MAX_PATCHES:
        return raw
    r = math.sqrt(PATCH * PATCH * MAX_PATCHES / (width * height))
    w, h = width * r / PATCH, height * r / PATCH
    r *= min(math.floor(w) / w, math.floor(h) / h)
    return min(MAX_PATCHES, _ceil(width * r / PATCH) * _ceil(height * r / PATCH))


def openai_tiles(width: int, height: int) -> tuple[int, int, int]:
    """(tiles, width, height) of OpenAI's high-detail tile rule."""
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        s = 2048 / max(w, h)
        w, h = w * s, h * s
    if min(w, h) > 768:
        s = 768 / min(w, h)
        w, h = w * s, h * s
    return _ceil(w / 512) * _ceil(h / 512), round(w), round(h)


def openai_image(model: str, width: int, height: int, detail: str) -> ImageTokens:
    """An image's tokens by OpenAI's rule for `model`; a 0 x 0 size (the bytes were not supplied) gives the rule's
    whole range, its point the most it can cost (a pre-call check should not undercount)."""
    patch = _longest(_PATCHES, model)
    if width <= 0 or height <= 0:
        if patch is not None:
            top = _ceil(MAX_PATCHES * float(patch[1]))
            return ImageTokens(top, 1, top, "size unknown (no bytes): 1 to 1536 patches", True)
        tile = _longest(_TILES, model)
        base, per = (int(tile[1]), int(tile[2])) if tile is not None else (85, 170)
        top = base if detail == "low" else base + 8 * per  # 768 x 2048 after the rule: 2 x 4 tiles at most
        return ImageTokens(top, base, top, f"size unknown (no bytes): {base} to {top} tokens", tile is not None)
    if patch is not None:
        mult = float(patch[1])
        n = openai_patches(width, height)
        tokens = _ceil(n * mult)
        rule = f"{n} patches of 32 px x {mult} ({patch[0]}; OpenAI's patch rule; `detail` does not apply)"
        return ImageTokens(tokens, math.floor(n * mult), tokens, rule, True)
    tile = _longest(_TILES, model)
    known = tile is not None
    base, per = (int(tile[1]), int(tile[2])) if tile is not None else (85, 170)
    who = tile[0] if tile is not None else "gpt-4o's figures: the model is not in OpenAI's table"
    if detail == "low":
        return ImageTokens(base, base, base, f"detail low: {base} base tokens ({who})", known)
    tiles, w, h = openai_tiles(width, height)
    high = base + per * tiles
    if detail == "high":
        return ImageTokens(high, high, high, f"detail high: {base} + {tiles} tiles x {per} at {w}x{h} ({who})", known)
    # "auto" (or absent): OpenAI picks low or high itself and does not say which; the point is high, the range both.
    rule = f"detail {detail}: OpenAI chooses; high is {base} + {tiles} tiles x {per} at {w}x{h}, low {base} ({who})"
    return ImageTokens(high, base, high, rule, known)


ANTHROPIC_LONG_EDGE = 1568
ANTHROPIC_MAX_TOKENS = 1600


def anthropic_image(width: int, height: int) -> ImageTokens:
    if width <= 0 or height <= 0:
        return ImageTokens(1639, 1, 1639, "size unknown (no bytes): up to about 1,600 tokens (Anthropic)", True)
    scale = min(1.0, ANTHROPIC_LONG_EDGE / max(width, height), math.sqrt(ANTHROPIC_MAX_TOKENS * 750 / (width * height)))
    w, h = width * scale, height * scale
    exact = w * h / 750
    tokens = _ceil(exact)
    by_tokens = math.sqrt(ANTHROPIC_MAX_TOKENS * 750 / (width * height))
    if scale < 1.0:
        rule = f"{width}x{height} scaled to about {round(w)}x{round(h)}, then width x height / 750 (Anthropic's rule)"
        if scale == by_tokens:  # the "about 1,600 tokens" cap binds: Anthropic's own maximum sizes span this
            return ImageTokens(tokens, min(tokens, 1590), max(tokens, 1639), rule, True)
        return ImageTokens(tokens, math.floor(exact), tokens, rule, True)
    return ImageTokens(tokens, math.floor(exact), tokens, f"{width}x{height}: width x height / 750 (Anthropic)", True)
