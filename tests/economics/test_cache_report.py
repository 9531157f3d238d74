"""`ctxlock cache-report`: generated sessions of 30+ turns, each with one known buster (or none), on a real
tokenizer (Qwen2) and real templates (Qwen2.5, Qwen3). The report must name the right buster on every turn, and the
seed's case (a fixed system prompt with a changing timestamp before it, against after it) must show the
1.25x-write-every-turn, never-0.1x-read pattern, which `--fix` removes."""

from __future__ import annotations

import itertools
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import ctxlock
import fetched
from ctxlock.cli import app
from ctxlock.economics._promptcache import session_report
from ctxlock.economics._session import build_turns, fixed_session, read_session
from ctxlock.economics._usage import PriceTable
from ctxlock.template._render import ChatTemplate

TURNS = 32
PRICES = Path(__file__).parents[1] / "data" / "usage" / "prices.json"
FIXED = (
    "You are the support assistant of a hardware shop. Answer precisely, cite the order number when the customer "
    "gives one, never invent stock levels, and ask one question at a time when something is missing. "
) * 12  # about 520 tokens with Qwen2's vocabulary

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather now in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the shop's catalogue.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


def _template(name: str) -> ChatTemplate:
    return ChatTemplate((fetched.templates_dir() / name).read_text("utf-8"), id=name)


def _model() -> ctxlock.Model:
    return ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))


def _chat(turn: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for k in range(turn + 1):
        msgs.append({"role": "user", "content": f"Question {k}: is item {k * 7} in stock?"})
        if k < turn:
            msgs.append({"role": "assistant", "content": f"Item {k * 7} is in stock: {k + 3} left."})
    return msgs


def _session(kind: str) -> list[tuple[dict[str, Any], Any, float | None]]:
    out = []
    for t in range(TURNS):
        system = FIXED
        tools = [SEARCH, WEATHER]
        if kind == "timestamp":
            system = f"Current time: 2026-12-01 09:{t:02d}\n" + FIXED
        elif kind == "tools-order" and t % 2:
            tools = [WEATHER, SEARCH]
        elif kind == "key-order" and t % 2:
            params = SEARCH["function"]["parameters"]
            reordered = {"required": params["required"], "type": params["type"], "properties": params["properties"]}
            tools = [{**SEARCH, "function": {**SEARCH["function"], "parameters": reordered}}, WEATHER]
        request = {"messages": [{"role": "system", "content": system}, *_chat(t)], "tools": tools}
        out.append((request, None, 60.0 * t))
    return out


def _report(kind: str, provider: str = "vllm") -> list[Any]:
    turns = build_turns(_model(), _session(kind), {"chat_template": _template("Qwen-Qwen2.5-7B-Instruct.jinja")})
    return session_report(turns, provider)  # type: ignore[arg-type]


def test_clean_session_has_no_buster_and_reads_its_history() -> None:
    reports = _report("clean")
    assert [r.buster for r in reports] == [None] * TURNS
    for prev, cur in itertools.pairwise(reports):
        # each turn shares the whole previous request but its generation prompt
        assert cur.common_prefix >= prev.input_tokens - 3
        assert cur.split.cache_read == cur.common_prefix // 16 * 16


def test_timestamp_at_the_top_of_the_system_prompt() -> None:
    reports = _report("timestamp")
    for r in reports[1:]:
        assert r.buster is not None and r.buster.kind == "content"
        assert r.buster.path == "messages[0].content"
        # "Current time: 2026-12-01 09:0" is shared; the minute's last digit differs (or the tens, at 09 -> 10)
        assert "messages[0].content char 2" in r.buster.message
        assert r.common_prefix < 40 and r.split.cache_read < 40


@pytest.mark.parametrize("provider", ["vllm", "openai"])
def test_tools_reordered(provider: str) -> None:
    reports = _report("tools-order", provider)
    for r in reports[1:]:
        assert r.buster is not None and r.buster.kind == "tools reordered", r.buster
        assert r.buster.message in (
            "tools reordered: [search, weather] vs [weather, search]",
            "tools reordered: [weather, search] vs [search, weather]",
        )


def test_schema_key_order() -> None:
    reports = _report("key-order")
    for r in reports[1:]:
        assert r.buster is not None and r.buster.kind == "schema key order", r.buster
        assert r.buster.path == "tools[0].function.parameters"
        assert r.buster.message.startswith("tools[0].function.parameters key order: ")


def test_a_template_that_rewrites_an_earlier_turn() -> None:
    """Qwen3's template keeps an assistant turn's reasoning only while it is after the last user message: once the
    user speaks again, the earlier turn renders without its <think> block, and the next request stops extending."""
    session = []
    for t in range(TURNS):
        msgs: list[dict[str, Any]] = [{"role": "system", "content": FIXED}]
        for k in range(t + 1):
            msgs.append({"role": "user", "content": f"Question {k}?"})
            msgs.append({"role": "assistant", "content": f"Answer {k}.", "reasoning_content": f"thinking {k}"})
        session.append(({"messages": msgs}, None, None))
    turns = build_turns(_model(), session, {"chat_template": _template("Qwen-Qwen3-0.6B.jinja")})
    reports = session_report(turns, "vllm")
    for r in reports[1:]:
        assert r.buster is not None and r.buster.kind == "template rewrite", r.buster
        assert r.buster.path == f"messages[{2 * r.index}]"
        assert "differently once it is no longer the last turn" in r.buster.message


def _anthropic_session(where: str) -> list[tuple[dict[str, Any], Any, float | None]]:
    out = []
    for t in range(TURNS):
        stamp = {"type": "text", "text": f"Current time: 2026-12-01 09:{t:02d}"}
        fixed = {"type": "text", "text": FIXED, "cache_control": {"type": "ephemeral"}}
        system = [stamp, fixed] if where == "before" else [fixed, stamp]
        messages = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in _chat(t)]
        out.append(
            ({"model": "claude-sonnet-4-5", "max_tokens": 64, "system": system, "messages": messages}, None, 60.0 * t)
        )
    return out


def _costs(session: list[Any]) -> tuple[list[Any], Decimal, Decimal]:
    table = PriceTable.parse(PRICES.read_bytes(), "prices.json")
    turns = build_turns(_model(), session, {"chat_template": _template("Qwen-Qwen2.5-7B-Instruct.jinja")})
    reports = session_report(turns, "anthropic", table=table, price_model="claude-sonnet-4-5", minimum=400)
    return reports, sum((r.cost for r in reports), Decimal(0)), sum((r.cost_uncached for r in reports), Decimal(0))


def test_the_seeds_timestamp_before_against_after_the_cached_prompt() -> None:
    before, cost_before, plain = _costs(_anthropic_session("before"))
    after, cost_after, _ = _costs(_anthropic_session("after"))
    # before: the breakpoint's prefix holds the timestamp, so every turn writes it (1.25x) and none reads it
    assert all(r.split.cache_write > 400 and r.split.cache_read == 0 for r in before)
    assert all(r.buster is not None and r.buster.path == "system[0].text" for r in before[1:])
    # after: written once, then read (0.1x) on every turn
    assert after[0].split.cache_write > 400 and all(r.split.cache_read > 400 for r in after[1:])
    assert cost_before > plain > cost_after  # busting costs more than not caching at all
    assert cost_before / cost_after > Decimal("1.5")
    # the fixed prompt alone: written at 1.25x on every turn, against written once and then read at 0.1x
    write, read = Decimal("3.75e-6"), Decimal("3e-7")  # the table's 5-minute write and read prices
    prompt_before = sum(r.split.cache_write * write for r in before)
    prompt_after = after[0].split.cache_write * write + sum(r.split.cache_read * read for r in after[1:])
    assert prompt_before / prompt_after > 7
    # --fix moves the changing block after the breakpoint: the cost comes down to the clean session's
    fixed, cost_fixed, _ = _costs(fixed_session(_anthropic_session("before")))
    assert all(r.split.cache_read > 400 for r in fixed[1:])
    assert abs(cost_fixed - cost_after) / cost_after < Decimal("0.05")


def test_cli_cache_report(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    lines = [
        json.dumps({"request": r, "timestamp": f"2026-12-01T09:{t:02d}:00Z"})
        for t, (r, _, _) in enumerate(_session("tools-order"))
    ]
    path.write_text("\n".join(lines) + "\n")
    template = str(fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja")
    model = str(fetched.hf_tokenizer_dir("qwen2"))
    args = ["cache-report", str(path), "--model", model, "-t", template, "--provider", "openai", "--json", "--fix"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["busted_turns"] == list(range(1, TURNS))
    assert data["fixed"]["busted_turns"] == []
    assert data["fixed"]["cache_read"] > data["cache_read"]
    assert "estimates" in data["estimate"]
    human = CliRunner().invoke(app, args[:-2])
    assert "tools reordered: [search, weather] vs [weather, search]" in human.output


def test_read_session_errors() -> None:
    with pytest.raises(ctxlock.CtxlockError, match=r"s\.jsonl:2"):
        read_session('{"messages": []}\n{bad\n', "s.jsonl")
    with pytest.raises(ctxlock.CtxlockError, match="not a time"):
        read_session('{"request": {"messages": []}, "timestamp": "yesterday"}\n', "s.jsonl")


def test_cache_control_survives_into_the_request_and_the_record() -> None:
    from ctxlock.records import RunOptions
    from ctxlock.records._replay import run_and_record

    request = _anthropic_session("after")[3][0]
    request["tools"] = [
        {"name": "search", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    ]
    model = _model()
    parsed = model.parse(request)
    assert [dict(c) for c in parsed.cache_control] == [
        {"path": "tools[0]", "type": "ephemeral", "ttl": "1h"},
        {"path": "system[0]", "type": "ephemeral", "ttl": "5m"},
    ]
    raw = json.dumps(request).encode()
    _, record, error = run_and_record(model, raw, RunOptions(), template=_template("Qwen-Qwen2.5-7B-Instruct.jinja"))
    assert error is None
    assert record.data["request"]["cache_control"] == [dict(c) for c in parsed.cache_control]
    # the breakpoints the report uses are those of the canonical request
    (turn,) = build_turns(
        model, [(request, None, None)], {"chat_template": _template("Qwen-Qwen2.5-7B-Instruct.jinja")}
    )
    # Qwen2.5's template writes the system prompt before the tools: the 1-hour breakpoint (the tool) ends later
    assert [b.ttl for b in turn.breakpoints] == ["1h", "5m"]
    assert 0 < turn.breakpoints[1].end < turn.breakpoints[0].end < len(turn.ids)
