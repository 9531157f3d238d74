"""The providers' published image rules on their own documented examples, images in real requests (a real PNG
header, an unfetched URL), and every figure of a closed provider's count labelled, with a range."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from ctxlock.providers import anthropic_image, count_provider, openai_image, openai_patches


def _png(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize(
    ("model", "size", "detail", "tokens"),
    [
        # https://platform.openai.com/docs/guides/images-vision#calculating-costs: the tile examples
        ("gpt-4o", (1024, 1024), "high", 765),
        ("gpt-4o", (2048, 4096), "high", 1105),
        ("gpt-4o", (4096, 8192), "low", 85),
        ("gpt-4o-mini", (1024, 1024), "low", 2833),
        ("gpt-5", (1024, 1024), "high", 70 + 4 * 140),
        ("o3", (512, 512), "high", 75 + 150),
        # the patch examples: 1024 x 1024 is 1024 patches; 1800 x 2400 scales to 1452
        ("gpt-4.1-mini", (1024, 1024), "auto", 1659),
        ("o4-mini", (1800, 2400), "high", 2498),
    ],
)
def test_openai_rules_give_the_documented_figures(model: str, size: tuple[int, int], detail: str, tokens: int) -> None:
    assert openai_image(model, *size, detail).tokens == tokens


def test_patches_scale_down_as_documented() -> None:
    assert openai_patches(1024, 1024) == 1024
    assert openai_patches(1800, 2400) == 1452
    assert openai_patches(10000, 10000) <= 1536


def test_anthropic_rule() -> None:
    # https://docs.anthropic.com/en/docs/build-with-claude/vision: 1092 x 1092 is about 1,590 tokens
    assert anthropic_image(1092, 1092).tokens == 1590
    assert anthropic_image(200, 200).tokens == 54
    big = anthropic_image(4000, 3000)
    assert big.low <= 1600 <= big.high and big.high <= 1639


def test_images_in_requests_are_read_from_their_headers() -> None:
    request = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": _png(1024, 1024), "detail": "high"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                ],
            }
        ]
    }
    counted = count_provider(request, provider="openai", model="gpt-4o")
    parts = {p.part: p for p in counted.parts}
    assert (parts["messages[0].content[1]"].tokens, parts["messages[0].content[1]"].basis) == (765, "documented")
    unknown = parts["messages[0].content[2]"]
    assert unknown.basis == "estimated" and unknown.low == 85 and unknown.tokens == unknown.high == 85 + 8 * 170
    assert any("without its bytes" in n for n in counted.notes)
    anthropic = count_provider(request, provider="anthropic", model="claude-sonnet-4-5")
    a = {p.part: p for p in anthropic.parts}
    assert a["messages[0].content[1]"].tokens == 1399  # 1024 x 1024 / 750, under both caps


def test_every_figure_is_labelled_with_a_range() -> None:
    request = {
        "model": "claude-sonnet-4-5",
        "system": "You are terse.",
        "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "max_tokens": 10,
    }
    for provider, model in (("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4-5")):
        counted = count_provider(request, provider=provider, model=model)
        for p in counted.parts:
            assert p.basis in ("exact", "documented", "estimated") and p.method
            assert p.low <= p.tokens <= p.high
            assert (p.low == p.high) == (p.basis == "exact" or p.low == p.high)
        assert counted.low <= counted.total <= counted.high
        assert counted.to_dict()["range"] == [counted.low, counted.high]
    anthropic = count_provider(request, provider="anthropic", model="claude-sonnet-4-5")
    framing = {p.part: p for p in anthropic.parts}["tool_framing"]
    assert (framing.tokens, framing.basis) == (346, "documented")  # Anthropic's published tool-use prompt
    assert not anthropic.exact_tokenizer and "proxy" in anthropic.tokenizer
