"""`ctxlock bill`: a session's dollars per request part.

The acceptance, on generated sessions (hypothesis): `bill`'s totals are `usage`'s priced totals on the same usages,
to the Decimal, turn by turn and over the session, and each turn's parts add up to its total exactly, state by
state. Then the buster's charge on a session whose timestamp at the top busts the cache, genai-prices as a second
source (a disagreement named with both figures and which was used; nothing fetched), and OpenAI's prompt_cache_key
and prompt_cache_retention in the cache report (https://platform.openai.com/docs/guides/prompt-caching)."""

from __future__ import annotations

import json
import socket
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_runner import invoke
from ctxlock.cli import bill as bill_cmds
from ctxlock.cli import usage as usage_cmds
from ctxlock.economics import PriceTable, bill_session
from ctxlock.economics._bill import INPUT_STATES, apportion_dollars, apportion_tokens
from ctxlock.economics._promptcache import TurnData, session_report
from ctxlock.economics._session import read_session
from ctxlock.model._model import load
from hypothesis_profiles import examples

ROOT = Path(__file__).resolve().parents[2]
PRICES = ROOT / "tests" / "data" / "usage" / "prices.json"
FIXED = "You are the support assistant of a hardware shop. Answer precisely and cite the order number. " * 30


def _request(t: int, *, stamp: bool = False) -> dict[str, Any]:
    system = (f"Current time: 2026-12-01 09:{t:02d}\n" if stamp else "") + FIXED
    chat: list[dict[str, Any]] = []
    for k in range(t + 1):
        chat.append({"role": "user", "content": f"Is item {k * 7} in stock?"})
        if k < t:
            chat.append({"role": "assistant", "content": f"Item {k * 7}: {k + 3} left."})
    tool = {"type": "function", "function": {"name": "stock", "description": "Stock.", "parameters": {}}}
    return {"model": "claude-sonnet-4-5", "messages": [{"role": "system", "content": system}, *chat], "tools": [tool]}


def _usage(draw: Any) -> dict[str, Any]:
    big = draw(st.booleans())  # over 200k prompt tokens: the long-context tier
    scale = 60_000 if big else 2_000
    read, five, hour, inp = (draw(st.integers(0, scale)) for _ in range(4))
    if draw(st.booleans()):  # OpenAI's shape: cached tokens inside the prompt, reasoning inside the completion
        completion = draw(st.integers(0, 5_000))
        return {
            "prompt_tokens": read + inp + 4 * scale,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": read},
            "completion_tokens_details": {"reasoning_tokens": draw(st.integers(0, completion))},
        }
    return {
        "input_tokens": inp,
        "output_tokens": draw(st.integers(0, 5_000)),
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": five + hour,
        "cache_creation": {"ephemeral_5m_input_tokens": five, "ephemeral_1h_input_tokens": hour},
    }


@st.composite
def sessions(draw: Any) -> tuple[str, list[dict[str, Any]]]:
    """A provider's layout (anthropic, openai: the proxy's estimate; vllm: the model's exact count) and turns
    with Anthropic usage objects (reads, 5-minute and 1-hour writes) or OpenAI ones (reads, reasoning), sometimes
    over the 200k tier."""
    n = draw(st.integers(1, 3))
    provider = draw(st.sampled_from(["anthropic", "openai", "vllm"]))
    return provider, [{"request": _request(t), "usage": _usage(draw)} for t in range(n)]


def _write(tmp: Path, lines: list[dict[str, Any]], name: str = "s.jsonl") -> Path:
    path = tmp / name
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@settings(max_examples=examples(8), deadline=None)
@given(drawn=sessions())
def test_bill_totals_are_usage_totals_and_parts_add_up(
    tmp_path_factory: Any, drawn: tuple[str, list[dict[str, Any]]]
) -> None:
    provider, lines = drawn
    tmp = tmp_path_factory.mktemp("bill")
    session = _write(tmp, lines)
    usages = _write(tmp, [x["usage"] for x in lines], "u.jsonl")
    args = ["--prices", str(PRICES), "--price-model", "claude-sonnet-4-5", "--json", "--no-compare"]
    got = _json(invoke(bill_cmds.register, "bill", str(session), "--provider", provider, *args))["sessions"][0]
    want = _json(invoke(usage_cmds.register, "usage", str(usages), "--prices", str(PRICES), "--model",
                        "claude-sonnet-4-5", "--json"))  # fmt: skip
    assert Decimal(got["total"]) == Decimal(want["sum"]["cost"]["total"])
    for turn, row in zip(got["turns"], want["usages"], strict=True):
        assert turn["figures"] == "reported usage"
        assert Decimal(turn["total"]) == Decimal(row["cost"]["total"])
        assert turn["tier"] == row["cost"].get("tier")
        parts = turn["parts"]
        assert sum(Decimal(p["total"]) for p in parts) == Decimal(turn["total"])
        for state, dollars in turn["dollars"].items():  # state by state, dollars and tokens
            assert sum(Decimal(p["dollars"].get(state, "0")) for p in parts) == Decimal(dollars)
            assert sum(p["tokens"].get(state, 0) for p in parts) == turn["tokens"][state]
        u = row
        assert turn["tokens"]["read"] == u["cache_read"] and turn["tokens"]["uncached"] == u["input"]
        assert turn["tokens"]["written"] + turn["tokens"]["written_1h"] == u["cache_write"]
        assert turn["tokens"]["reasoning"] == (u["reasoning"] or 0)
        assert turn["tokens"]["output"] + turn["tokens"]["reasoning"] == u["output"]


@settings(max_examples=examples(100), deadline=None)
@given(
    cents=st.integers(0, 10**9),
    exp=st.integers(-16, 0),
    weights=st.lists(st.fractions(min_value=0, max_value=1000), min_size=1, max_size=12),
)
def test_apportioning_adds_up_exactly(cents: int, exp: int, weights: list[Fraction]) -> None:
    total = Decimal(cents).scaleb(exp)
    shares = apportion_dollars(total, weights)
    assert sum(shares, Decimal(0)) == total
    assert all(s >= 0 for s in shares)
    if sum(weights):  # a share never strays a quantum from its exact proportion
        quantum = Decimal(1).scaleb(min(exp, -12))
        for s, w in zip(shares, weights, strict=True):
            exact = Fraction(total) * w / sum(weights)
            assert abs(Fraction(s) - exact) < Fraction(quantum)
    tokens = apportion_tokens(cents, weights)
    assert sum(tokens) == cents


def test_the_buster_is_charged_what_it_cost(tmp_path: Path) -> None:
    """A timestamp at the top of the system prompt: turn 1 reads nothing, so the earlier prompt's tokens that
    OpenAI would have read (1,024 then 128-token steps) are billed in full; the system prompt is charged the
    difference with their cache-read price."""
    prompts = [1500, 1600]
    lines = [
        {"request": _request(t, stamp=True), "usage": {"prompt_tokens": p, "completion_tokens": 10}}
        for t, p in enumerate(prompts)
    ]
    table = PriceTable.parse(PRICES.read_bytes(), str(PRICES))
    session = read_session("".join(json.dumps(x) + "\n" for x in lines), "s")
    bill = bill_session(load(None), session, "openai", options={}, table=table, price_model="o3-mini-2025-01-31",
                        compare_sources=False)  # fmt: skip
    turn = bill.turns[1]
    assert turn.buster is not None and turn.buster.part == "messages[0]"
    lost = 1024 + (1500 - 1024) // 128 * 128  # what OpenAI would have read of the earlier 1,500 tokens
    assert turn.buster.tokens == lost
    input_price, read_price = Decimal("1.1e-06"), Decimal("5.5e-07")
    assert turn.buster.charged == input_price * lost
    assert turn.buster.as_reads == read_price * lost
    assert turn.buster.cost == (input_price - read_price) * lost
    system = next(p for p in turn.parts if p.part == "messages[0]")
    assert system.buster == turn.buster.cost
    assert sum(p.total for p in turn.parts) == turn.total  # the charge is inside the parts, never added


def test_genai_prices_disagreement_is_named_and_nothing_is_fetched(tmp_path: Path, monkeypatch: Any) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)  # a guard: genai-prices must read its bundled data
    mine = tmp_path / "prices.json"
    mine.write_text(json.dumps({"gpt-4o": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1e-05,
                                           "cache_read_input_token_cost": 1.25e-06}}))  # fmt: skip
    usage = {"prompt_tokens": 2000, "completion_tokens": 100, "prompt_tokens_details": {"cached_tokens": 1024}}
    request = {**_request(0), "model": "gpt-4o"}
    session = _write(tmp_path, [{"request": request, "usage": usage}])
    got = _json(invoke(bill_cmds.register, "bill", str(session), "--provider", "openai", "--prices", str(mine),
                       "--json"))["sessions"][0]  # fmt: skip
    assert got["prices"]["name"] == str(mine)
    assert got["compared_with"]["name"] == "genai-prices 0.2.3 (bundled data)"
    (d,) = got["disagreements"]
    # gpt-4o's input in genai-prices 0.2.3 is $2.5 per million: 976 uncached tokens at $3 vs $2.5
    assert d["model"] == "gpt-4o" and d["used"] == str(mine)
    assert d["prices_per_million"] == {"input": ["3", "2.5"]}
    assert Decimal(d["total_used"]) == Decimal(976) * Decimal("3e-6") + 1024 * Decimal("1.25e-6") + 100 * Decimal(
        "1e-5"
    )
    assert Decimal(d["total_other"]) == Decimal(976) * Decimal("2.5e-6") + 1024 * Decimal("1.25e-6") + 100 * Decimal(
        "1e-5"
    )
    assert Decimal(got["total"]) == Decimal(d["total_used"])
    human = invoke(bill_cmds.register, "bill", str(session), "--provider", "openai", "--prices", str(mine))
    assert f"prices disagree for gpt-4o: {mine} (used) $0.005208 vs genai-prices 0.2.3 (bundled data) $0.00472" in (
        " ".join(human.output.split())
    )
    other = _json(invoke(bill_cmds.register, "bill", str(session), "--provider", "openai", "--prices", str(mine),
                         "--price-source", "genai-prices", "--json"))["sessions"][0]  # fmt: skip
    assert Decimal(other["total"]) == Decimal(d["total_other"])
    assert other["disagreements"][0]["used"].startswith("genai-prices")
    alone = _json(invoke(bill_cmds.register, "bill", str(session), "--provider", "openai", "--json"))["sessions"][0]
    assert alone["prices"]["name"].startswith("genai-prices") and alone["compared_with"] is None
    assert alone["total"] == other["total"]


# -- OpenAI's prompt_cache_key and prompt_cache_retention in the cache report -----------------------------------

PREFIX = np.arange(2000, dtype=np.int64)


def _turn(raw: dict[str, Any], extra: int, at: float | None = None) -> TurnData:
    ids = np.concatenate([PREFIX, np.arange(10_000 + extra * 100, 10_000 + extra * 100 + 50, dtype=np.int64)])
    return TurnData(ids, "", (), raw, at=at)


def test_prompt_cache_key_separates_caches() -> None:
    """Requests with different keys are routed apart: the second key's first turn reads nothing even though
    its prefix is the first key's; the same key reads it."""
    turns = [
        _turn({"prompt_cache_key": "a"}, 0),
        _turn({"prompt_cache_key": "b"}, 1),
        _turn({"prompt_cache_key": "a"}, 2),
        _turn({"prompt_cache_key": "b"}, 3),
        _turn({}, 4),  # no key: its own cache
    ]
    reads = [t.split.cache_read for t in session_report(turns, "openai")]
    assert reads == [0, 0, 1920, 1920, 0]  # 2,000 shared tokens: 1,024 + 7 x 128


def test_prompt_cache_retention_against_timestamps() -> None:
    """in_memory: the report's --ttl (300 s); "24h": a prefix kept 24 hours. Two hours apart, only the
    extended retention still reads; 25 hours apart, neither does."""
    hour = 3600.0
    for retention, gap, read in (("in_memory", 2 * hour, 0), ("24h", 2 * hour, 1920), ("24h", 25 * hour, 0)):
        raw = {"prompt_cache_retention": retention}
        turns = [_turn(raw, 0, at=0.0), _turn(raw, 1, at=gap)]
        assert session_report(turns, "openai")[1].split.cache_read == read, (retention, gap)


def test_retention_without_timestamps_is_said(tmp_path: Path) -> None:
    lines = [{"request": {**_request(t), "prompt_cache_retention": "24h"}} for t in range(2)]
    session = read_session("".join(json.dumps(x) + "\n" for x in lines), "s")
    from ctxlock.economics._session import cache_report

    run = cache_report(load(None), session, "openai", options={})
    assert run.notes == (
        "prompt_cache_retention (24h) not checked: 2 of 2 turns carry no timestamp, so no cached prefix expires",
    )
    assert run.to_dict()["notes"] == list(run.notes)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"prompt_cache_retention": "1h"}, "prompt_cache_retention '1h' is not one OpenAI documents"),
        ({"prompt_cache_key": 7}, "prompt_cache_key must be a string, got 7"),
    ],
)
def test_cache_options_are_checked(raw: dict[str, Any], message: str) -> None:
    from ctxlock.errors import UsageError

    with pytest.raises(UsageError, match=message) as err:
        session_report([_turn(raw, 0)], "openai")
    assert err.value.path is not None and err.value.path.startswith("turn 0 $.prompt_cache_")


def test_states_are_in_prompt_order() -> None:
    assert INPUT_STATES == ("read", "written_1h", "written", "uncached")


def test_count_prices_each_part_as_uncached_input() -> None:
    from ctxlock.cli import count as count_cmds

    request = str(ROOT / "examples" / "tools-and-documents.json")
    args = ["--prices", str(PRICES), "--price-model", "claude-sonnet-4-5", "--json"]
    got = _json(invoke(count_cmds.register, "count", request, *args))
    price = Decimal("3e-06")
    assert {p["part"]: Decimal(p["total"]) for p in got["bill"]["parts"]} == {
        p["part"]: p["tokens"] * price for p in got["parts"] if p["tokens"]
    }
    assert Decimal(got["bill"]["total"]) == got["total"] * price
    missing = invoke(count_cmds.register, "count", request, "--prices", str(PRICES), "--json")
    assert missing.exit_code != 0 and "the request names no model" in missing.output


def test_a_closed_providers_count_becomes_parts_in_cache_order() -> None:
    """`ctxlock.providers.count_provider(...).parts` (any part, tokens, basis) folded into top-level parts in the
    provider's prefix order, each with its weakest basis; the message framing last."""
    from ctxlock.economics._bill import PartTokens, provider_parts

    counted = [
        PartTokens("messages[1].content[1]", 85, "documented"),
        PartTokens("framing", 10, "documented"),
        PartTokens("messages[1]", 5, "exact"),
        PartTokens("messages[0]", 4, "exact"),
        PartTokens("tools[0]", 30, "estimated"),
        PartTokens("system", 7, "exact"),
        PartTokens("tool_framing", 12, "estimated"),
    ]
    assert provider_parts(counted) == [
        PartTokens("tool_framing", 12, "estimated"),
        PartTokens("tools[0]", 30, "estimated"),
        PartTokens("system", 7, "exact"),
        PartTokens("messages[0]", 4, "exact"),
        PartTokens("messages[1]", 90, "documented"),
        PartTokens("framing", 10, "documented"),
    ]


def test_closed_provider_parts_come_from_ctxlock_providers(tmp_path: Path) -> None:
    """--provider openai: each turn's parts are `count_provider`'s (the text exact under gpt-4o's published
    encoding, the framing by the documented rule), and when the model has no known encoding, the cache report's
    proxy layout, saying why."""
    from ctxlock.providers import count_provider

    usage = {"prompt_tokens": 2000, "completion_tokens": 100, "prompt_tokens_details": {"cached_tokens": 1024}}
    request = {**_request(0), "model": "gpt-4o"}
    session = _write(tmp_path, [{"request": request, "usage": usage}])
    mine = tmp_path / "p.json"
    mine.write_text(json.dumps({"gpt-4o": {"input_cost_per_token": 2.5e-06, "output_cost_per_token": 1e-05,
                                           "cache_read_input_token_cost": 1.25e-06}}))  # fmt: skip
    args = ["--provider", "openai", "--prices", str(mine), "--no-compare", "--json"]
    got = _json(invoke(bill_cmds.register, "bill", str(session), *args))["sessions"][0]
    assert got["layout"].startswith("ctxlock.providers (openai: o200k_base")
    counted = count_provider(request, provider="openai", model="gpt-4o")
    (turn,) = got["turns"]
    assert turn["layout_tokens"] == counted.total
    bases = {p["part"]: p["basis"] for p in turn["parts"]}
    assert bases["messages[0]"] == "exact" and bases["framing"] == "documented" and bases["tools[0]"] == "estimated"
    assert sum(Decimal(p["total"]) for p in turn["parts"]) == Decimal(turn["total"])
    other = _write(tmp_path, [{"request": {**request, "model": "no-such-model"}, "usage": usage}], "o.jsonl")
    mine.write_text(json.dumps({"no-such-model": {"input_cost_per_token": 1e-06, "output_cost_per_token": 1e-06,
                                                  "cache_read_input_token_cost": 1e-07}}))  # fmt: skip
    fallback = _json(invoke(bill_cmds.register, "bill", str(other), *args))["sessions"][0]
    assert fallback["layout"].startswith("the proxy layout: ctxlock.providers cannot count turn 0 (")
    assert "over the provider's layout" in fallback["layout"]
