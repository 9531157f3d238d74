"""ctxlock.economics._usage: provider usage objects normalized, their invariants enforced, summed and priced in Decimal.

The objects in tests/data/usage/ follow each provider's documented shapes; every expected value below is worked
out by hand in the comment beside it."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from ctxlock.cli import app
from ctxlock.economics._usage import PriceTable, Usage, parse_usage, price_usage, read_usage, sum_usage
from ctxlock.errors import PriceError, UsageError

DATA = Path(__file__).parents[1] / "data" / "usage"


def _load(name: str) -> list[Usage]:
    return read_usage((DATA / name).read_text("utf-8"), name)


def _prices() -> PriceTable:
    return PriceTable.parse((DATA / "prices.json").read_bytes(), "prices.json")


def _fields(u: Usage) -> tuple:
    return (u.input, u.cache_read, u.cache_write, u.cache_write_1h, u.output, u.reasoning, u.total_tokens)


# -- normalization ---------------------------------------------------------------------------------------------


def test_openai_chat_cached_tokens_are_inside_prompt_tokens() -> None:
    (u,) = _load("openai-chat.json")
    # prompt 1117 includes 1024 cached: 93 at full price; completion 1046 includes 832 reasoning.
    assert _fields(u) == (93, 1024, 0, 0, 1046, 832, 2163)
    assert u.prompt_tokens == 1117 and u.source == "openai-chat" and u.model == "o3-mini-2025-01-31"


def test_openai_responses() -> None:
    (u,) = _load("openai-responses.json")
    # input 2300 includes 2048 cached; output 1186 includes 1024 reasoning; total 3486.
    assert _fields(u) == (252, 2048, 0, 0, 1186, 1024, 3486)
    assert u.source == "openai-responses"


def test_anthropic_input_excludes_the_cache_and_the_ttl_split_is_kept() -> None:
    (u,) = _load("anthropic-message.json")
    # input_tokens 21 is the uncached part; total input = 21 + 0 read + 188086 written, 86 of them for 1 hour.
    assert _fields(u) == (21, 0, 188086, 86, 393, None, 21 + 188086 + 393)
    assert u.prompt_tokens == 188107


def test_anthropic_stream_message_delta_is_cumulative() -> None:
    (u,) = _load("anthropic-stream.jsonl")
    # message_start says output 1, message_delta says 15 (cumulative): 15, not 16.
    assert _fields(u) == (25, 2048, 0, 0, 15, None, 25 + 2048 + 15)
    assert u.source == "anthropic-stream" and u.model == "claude-sonnet-4-5"


def test_anthropic_stream_of_two_messages() -> None:
    lines = (DATA / "anthropic-stream.jsonl").read_text("utf-8")
    assert [u.output for u in read_usage(lines + lines, "two")] == [15, 15]


def test_gemini_thoughts_are_output_and_cached_is_inside_the_prompt() -> None:
    (u,) = _load("gemini.json")
    # prompt 4023 includes 4000 cached; output = 612 candidates + 1212 thoughts; total 5847 as reported.
    assert _fields(u) == (23, 4000, 0, 0, 1824, 1212, 5847)
    assert u.model == "gemini-2.5-pro"


def test_pi_event_stream_counts_each_message_once() -> None:
    usages = _load("pi-events.jsonl")
    # message 1: three cumulative snapshots, the last (message_end) counts: 100 in, 9 out.
    # message 2: one snapshot, with the provider's own cost. Then the compaction's summary call.
    assert [(u.input, u.output, u.cache_read, u.source) for u in usages] == [
        (100, 9, 0, "pi"),
        (20, 3, 109, "pi"),
        (150000, 1200, 0, "pi-compaction"),
    ]
    assert usages[0].cost is None  # Pi's own estimate (totalFromProvider absent) is not presented as a bill
    assert usages[1].cost is not None and usages[1].cost.total_from_provider
    assert usages[1].cost.total == Decimal("0.0001377") and usages[1].reasoning == 2


def test_mixed_formats_sum_without_double_counting() -> None:
    usages = [u for name in ("openai-chat.json", "anthropic-message.json", "gemini.json") for u in _load(name)]
    total = sum_usage(usages)
    # every input-side token once: 1117 (OpenAI prompt) + 188107 (Anthropic) + 4023 (Gemini prompt).
    assert total.prompt_tokens == 1117 + 188107 + 4023
    assert total.cache_read == 1024 + 0 + 4000
    assert total.output == 1046 + 393 + 1824
    assert total.reasoning == 832 + 1212  # Anthropic reports none: summed over those that do
    assert total.total_tokens == sum(u.total_tokens for u in usages) and total.calls == 3
    assert total.model is None  # three models


# -- invariants ------------------------------------------------------------------------------------------------

BROKEN = [
    ({"prompt_tokens": 10, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 11}}, "cached_tokens"),
    ({"prompt_tokens": 10, "completion_tokens": 1, "completion_tokens_details": {"reasoning_tokens": 2}}, "reasoning"),
    ({"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 12}, "total_tokens"),
    ({"input_tokens": 5, "output_tokens": 1, "input_tokens_details": {"cached_tokens": 6}}, "cached_tokens"),
    ({"input_tokens": 5, "output_tokens": 1, "total_tokens": 5, "output_tokens_details": {}}, "total_tokens"),
    (
        {"input_tokens": 1, "cache_creation_input_tokens": 10, "cache_creation": {"ephemeral_5m_input_tokens": 3}},
        "cache_creation",
    ),
    ({"promptTokenCount": 5, "cachedContentTokenCount": 6, "candidatesTokenCount": 1}, "cachedContentTokenCount"),
    (
        {"promptTokenCount": 5, "candidatesTokenCount": 1, "thoughtsTokenCount": 2, "totalTokenCount": 6},
        "totalTokenCount",
    ),
    ({"input": 5, "output": 1, "reasoning": 2, "totalTokens": 6}, "reasoning"),
    ({"input": 5, "output": 1, "cacheWrite": 1, "cacheWrite1h": 2, "totalTokens": 7}, "cacheWrite1h"),
    ({"input": 5, "output": 1, "cacheRead": 3, "totalTokens": 6}, "totalTokens"),
    ({"prompt_tokens": -1}, "prompt_tokens"),
    ({"prompt_tokens": True}, "prompt_tokens"),
    ({"prompt_tokens": 1.5}, "prompt_tokens"),
    ({"tokens": 5}, "$"),
]


@pytest.mark.parametrize(("obj", "field"), BROKEN)
def test_every_broken_invariant_is_a_typed_error_naming_the_field(obj: dict, field: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_usage({"usage": obj} if field != "$" else obj)
    assert field in (err.value.path or ""), err.value


def test_a_message_delta_without_its_start_is_an_error() -> None:
    text = '{"type": "message_start", "message": {}}\n'
    assert read_usage(text, "ok")[0].total_tokens == 0
    with pytest.raises(UsageError, match="message_start"):
        read_usage('{"type": "message_delta", "usage": {"output_tokens": 3}}\n{"type": "message_stop"}', "x")


def test_bad_json_names_the_line() -> None:
    with pytest.raises(UsageError) as err:
        read_usage('{"usage": {"prompt_tokens": 1}}\n{"usage": \n', "f.jsonl")
    assert (err.value.path or "").startswith("f.jsonl:2")


@given(
    prompt=st.integers(0, 10**9),
    cached_frac=st.floats(0, 1),
    completion=st.integers(0, 10**7),
    reasoning_frac=st.floats(0, 1),
)
def test_openai_normalization_keeps_every_token(
    prompt: int, cached_frac: float, completion: int, reasoning_frac: float
) -> None:
    cached, reasoning = int(prompt * cached_frac), int(completion * reasoning_frac)
    u = parse_usage(
        {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        }
    )
    assert u.prompt_tokens == prompt and u.input + u.cache_read == prompt and u.cache_read == cached
    assert u.total_tokens == prompt + completion and u.reasoning == reasoning <= u.output


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)), max_size=20))
def test_sum_is_field_wise(parts: list[tuple[int, int, int]]) -> None:
    usages = [Usage(input=a, output=b, cache_read=c) for a, b, c in parts]
    total = sum_usage(usages)
    assert total.total_tokens == sum(a + b + c for a, b, c in parts) and total.calls == len(parts)


# -- prices ----------------------------------------------------------------------------------------------------


def test_openai_cost_by_hand() -> None:
    (u,) = _load("openai-chat.json")
    cost = price_usage(u, _prices())
    # 93 × 1.1e-6 = 0.0001023; 1024 cached × 5.5e-7 = 0.0005632; 1046 × 4.4e-6 = 0.0046024.
    assert (cost.input, cost.cache_read, cost.output) == (
        Decimal("0.0001023"),
        Decimal("0.0005632"),
        Decimal("0.0046024"),
    )
    assert cost.total == Decimal("0.0052679") and cost.cache_write == 0
    assert not cost.total_from_provider and cost.price_entry == "o3-mini-2025-01-31"
    assert cost.table_sha256 == _prices().sha256 and len(cost.table_sha256) == 64


def test_anthropic_cost_5m_and_1h_writes() -> None:
    (u,) = _load("anthropic-message.json")
    cost = price_usage(u, _prices())
    # 21 × 3e-6 = 0.000063; 188000 × 3.75e-6 = 0.705 and 86 × 6e-6 = 0.000516; 393 × 1.5e-5 = 0.005895.
    assert cost.cache_write == Decimal("0.705516")
    assert cost.total == Decimal("0.711474") and cost.tier is None


def test_long_context_tier_applies_above_the_threshold() -> None:
    (u,) = _load("anthropic-message.json")
    over = Usage(**{**{f: getattr(u, f) for f in Usage.__dataclass_fields__}, "cache_read": 20000})
    cost = price_usage(over, _prices())
    # prompt side 208107 > 200k: 21 × 6e-6 = 0.000126; 20000 × 6e-7 = 0.012; 188000 × 7.5e-6 = 1.41;
    # 86 × 6e-6 = 0.000516 (no 1-hour tier price: the base one); 393 × 2.25e-5 = 0.0088425.
    assert cost.tier == "above_200k_tokens"
    assert cost.total == Decimal("1.4314845")


def test_gemini_cost_with_reasoning_price_and_provider_prefix() -> None:
    (u,) = _load("gemini.json")
    cost = price_usage(u, _prices())  # "gemini-2.5-pro" finds "gemini/gemini-2.5-pro"
    # 23 × 1.25e-6 = 0.00002875; 4000 × 3.1e-7 = 0.00124; (612 × 1e-5) + (1212 × 1e-5) = 0.01824.
    assert cost.price_entry == "gemini/gemini-2.5-pro"
    assert cost.total == Decimal("0.01950875")


def test_toml_table_prices_the_same(tmp_path: Path) -> None:
    toml = (
        '["o3-mini-2025-01-31"]\ninput_cost_per_million = 1.10\noutput_cost_per_million = 4.40\n'
        "cache_read_input_cost_per_million = 0.55\n"
    )
    table = PriceTable.parse(toml.encode(), "prices.toml")
    (u,) = _load("openai-chat.json")
    assert price_usage(u, table).total == price_usage(u, _prices()).total == Decimal("0.0052679")


def test_missing_price_and_unknown_model_are_errors() -> None:
    (u,) = _load("anthropic-message.json")
    table = PriceTable.parse(b'{"claude-sonnet-4-5": {"input_cost_per_token": 3e-06}}', "t.json")
    with pytest.raises(PriceError, match="output"):
        price_usage(u, table)
    with pytest.raises(PriceError, match="no price for model") as err:
        price_usage(u, _prices(), "claude-sonet-4-5")
    assert "claude-sonnet-4-5" in (err.value.hint or "")
    with pytest.raises(PriceError):
        PriceTable.parse(b"[1, 2]", "bad.json")
    with pytest.raises(PriceError):
        PriceTable.parse(b'{"m": {"input_cost_per_token": "cheap"}}', "bad.json")


def test_openrouter_style_provider_cost_is_kept() -> None:
    u = parse_usage({"model": "x", "usage": {"prompt_tokens": 10, "completion_tokens": 2, "cost": 0.0012}})
    assert u.cost is not None and u.cost.total == Decimal("0.0012") and u.cost.total_from_provider


# -- the command -----------------------------------------------------------------------------------------------


def test_cli_usage_json_sums_and_prices() -> None:
    files = [str(DATA / n) for n in ("openai-chat.json", "anthropic-stream.jsonl", "gemini.json")]
    result = CliRunner().invoke(app, ["usage", *files, "--prices", str(DATA / "prices.json"), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [u["source"] for u in out["usages"]] == ["openai-chat", "anthropic-stream", "gemini"]
    # 25 × 3e-6 + 2048 × 3e-7 + 15 × 1.5e-5 = 0.000075 + 0.0006144 + 0.000225 = 0.0009144
    assert out["usages"][1]["cost"]["total"] == "0.0009144"
    assert Decimal(out["sum"]["cost"]["total"]) == Decimal("0.0052679") + Decimal("0.0009144") + Decimal("0.01950875")
    assert out["sum"]["total_tokens"] == 2163 + (25 + 2048 + 15) + 5847
    assert out["prices"]["sha256"] == _prices().sha256


def test_cli_usage_human_view_and_errors(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["usage", str(DATA / "pi-events.jsonl")])
    assert result.exit_code == 0, result.output
    assert "pi-compaction" in result.output and "0.0001377 (provider)" in result.output
    assert "sum of 3" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}}')
    result = CliRunner().invoke(app, ["usage", str(bad), "--json"])
    assert result.exit_code != 0
    assert json.loads(result.output)["error"]["type"] == "UsageError"
