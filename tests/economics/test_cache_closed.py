"""`cache-report` for closed providers (Anthropic, OpenAI: no public tokenizer), and over stored records.

The buster is found on the canonical request's bytes in the provider's prefix order (tools → system → messages):
on generated sessions of 32 turns, in both dialects, each buster (a timestamp at the top of the system prompt, tools
reordered, schema key order) is named exactly, with the byte it starts at checked to be the first difference of the
two serializations and the character checked against the two strings themselves; hypothesis edits strings of any
characters (quotes, escapes, astral, control). Token figures come from the reported usage where a turn has one,
else the proxy tokenizer's, labelled as estimates. Then the same report from record ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from cli_runner import invoke
from ctxlock.cli import cachereport as cachereport_cmds
from ctxlock.cli.render import run_recorded
from ctxlock.economics._promptcache import session_report
from ctxlock.economics._promptcache_bytes import (
    ORDER,
    byte_buster,
    canonical_bytes,
    closed_turns,
    estimate_label,
    first_difference,
    part_nodes,
    provider_layout,
)
from ctxlock.economics._session import build_turns
from ctxlock.records import RunOptions
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate
from hypothesis_profiles import examples

TURNS = 32
FIXED = "You are the support assistant of a hardware shop. Answer precisely and cite the order number. " * 4
SEARCH = {
    "name": "search",
    "description": "Search.",
    "parameters": {"type": "object", "properties": {}, "required": []},
}
WEATHER = {"name": "weather", "description": "Weather.", "parameters": {"type": "object", "properties": {}}}


def _tool(fn: dict[str, Any], dialect: str) -> dict[str, Any]:
    if dialect == "anthropic":
        return {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}
    return {"type": "function", "function": fn}


def _request(t: int, kind: str, dialect: str) -> dict[str, Any]:
    system = f"Current time: 2026-12-01 09:{t:02d}\n{FIXED}" if kind == "timestamp" else FIXED
    tools = [SEARCH, WEATHER]
    if kind == "tools-order" and t % 2:
        tools = [WEATHER, SEARCH]
    if kind == "key-order" and t % 2:
        p = SEARCH["parameters"]
        tools = [{**SEARCH, "parameters": {"required": p["required"], "type": p["type"], "properties": {}}}, WEATHER]
    chat: list[dict[str, Any]] = []
    for k in range(t + 1):
        chat.append({"role": "user", "content": f"Is item {k * 7} in stock?"})
        if k < t:
            chat.append({"role": "assistant", "content": f"Item {k * 7}: {k + 3} left."})
    if dialect == "anthropic":
        system_blocks = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
        return {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": system_blocks, "messages": chat,
                "tools": [_tool(x, dialect) for x in tools]}  # fmt: skip
    return {"messages": [{"role": "system", "content": system}, *chat], "tools": [_tool(x, dialect) for x in tools]}


def _busters(kind: str, dialect: str) -> list[Any]:
    requests = [parse_request(_request(t, kind, dialect)) for t in range(TURNS)]
    return [None] + [byte_buster(requests[t - 1], requests[t]) for t in range(1, TURNS)]


def _first_char(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _check_byte(prev: dict[str, Any], cur: dict[str, Any], message: str) -> None:
    """The byte a message names is the first difference of the two serializations."""
    a, b = canonical_bytes(parse_request(prev)).data, canonical_bytes(parse_request(cur)).data
    d = int(message.rsplit("(byte ", 1)[1].split(" ", 1)[0])
    assert a[:d] == b[:d] and a[d : d + 1] != b[d : d + 1]
    assert message.endswith(f"(byte {d} of the canonical request ({ORDER}))")


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_clean_session_has_no_buster(dialect: str) -> None:
    assert _busters("clean", dialect) == [None] * TURNS


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_timestamp_at_the_top_of_the_system_prompt(dialect: str) -> None:
    path = "system[0].text" if dialect == "anthropic" else "messages[0].content"
    for t, b in enumerate(_busters("timestamp", dialect)[1:], 1):
        old = _request(t - 1, "timestamp", dialect)
        new = _request(t, "timestamp", dialect)
        sa = f"Current time: 2026-12-01 09:{t - 1:02d}\n{FIXED}"
        sb = f"Current time: 2026-12-01 09:{t:02d}\n{FIXED}"
        c = _first_char(sa, sb)
        assert c in (28, 29)
        assert b is not None and (b.kind, b.path) == ("content", path)
        assert b.message.startswith(f"{path} char {c}: {sa[c : c + 24]!r} vs {sb[c : c + 24]!r} (byte ")
        _check_byte(old, new, b.message)


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_tools_reordered(dialect: str) -> None:
    for t, b in enumerate(_busters("tools-order", dialect)[1:], 1):
        order = ("[search, weather] vs [weather, search]", "[weather, search] vs [search, weather]")[1 - t % 2]
        assert b is not None and b.kind == "tools reordered"
        assert b.message.startswith(f"tools reordered: {order} (byte ")
        _check_byte(_request(t - 1, "tools-order", dialect), _request(t, "tools-order", dialect), b.message)


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_schema_key_order(dialect: str) -> None:
    path = "tools[0].input_schema" if dialect == "anthropic" else "tools[0].function.parameters"
    sent, moved = "['type', 'properties', 'required']", "['required', 'type', 'properties']"
    for t, b in enumerate(_busters("key-order", dialect)[1:], 1):
        assert b is not None and (b.kind, b.path) == ("schema key order", path)
        sides = (moved, sent) if t % 2 == 0 else (sent, moved)
        assert b.message.startswith(f"{path} key order: {sides[0]} vs {sides[1]} (byte ")
        _check_byte(_request(t - 1, "key-order", dialect), _request(t, "key-order", dialect), b.message)


TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)


@settings(max_examples=examples(300), deadline=None)
@given(head=TEXT, old=TEXT, new=TEXT, tail=TEXT)
def test_any_changed_string_is_named_by_its_character(head: str, old: str, new: str, tail: str) -> None:
    a, b = head + old + tail, head + new + tail
    req = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": a}]}
    cur = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": b}]}
    buster = byte_buster(parse_request(req), parse_request(cur))
    if a == b:
        assert buster is None
        return
    c = _first_char(a, b)
    assert buster is not None and buster.path == "messages[1].content"
    assert buster.message.startswith(f"messages[1].content char {c}: {a[c : c + 24]!r} vs {b[c : c + 24]!r} (byte ")
    _check_byte(req, cur, buster.message)


def test_first_difference_across_blocks() -> None:
    a = bytes(10000)
    assert first_difference(a, a) == 10000
    assert first_difference(a, a[:5000] + b"x" + a[5001:]) == 5000
    assert first_difference(a, a + b"x") == 10000


# -- figures: the reported usage, else the proxy's estimate --------------------------------------------------------


def _template() -> ChatTemplate:
    return ChatTemplate((fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text("utf-8"), id="qwen2.5")


def test_reported_usage_gives_the_figures() -> None:
    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    session = [(_request(t, "clean", "anthropic"), None, 60.0 * t) for t in range(4)]
    usage = {"input_tokens": 12, "output_tokens": 5, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 40}
    session[2] = (session[2][0], usage, session[2][2])
    turns = build_turns(model, session, {"chat_template": _template()})
    reports = session_report(turns, "anthropic", minimum=64)
    closed = closed_turns(reports, [parse_request(r) for r, _, _ in session], [t.usage for t in turns], model.id)
    assert [c.figures.split(":")[0] for c in closed] == [
        "estimate",
        "estimate",
        "reported usage (the common prefix is an estimate",
        "estimate",
    ]
    reported = closed[2].to_dict()
    assert (reported["input_tokens"], reported["cache_read"], reported["cache_write"], reported["uncached"]) == (
        952,
        900,
        40,
        12,
    )
    assert reported["predicted_estimate"]["cache_read"] == reports[2].split.cache_read
    assert closed[0].to_dict()["figures"] == estimate_label(model.id)
    assert "predicted_estimate" not in closed[0].to_dict()


def test_cli_closed_provider(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    path.write_text("".join(json.dumps(_request(t, "timestamp", "anthropic")) + "\n" for t in range(TURNS)))
    model, template = (
        str(fetched.hf_tokenizer_dir("qwen2")),
        str(fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"),
    )
    out = invoke(cachereport_cmds.register, "cache-report", str(path), "--model", model, "-t", template,
                 "--provider", "anthropic", "--min-prefix", "64", "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["busted_turns"] == list(range(1, TURNS))
    assert all(
        t["buster"]["path"] == "system[0].text" and "(byte " in t["buster"]["message"] for t in data["turns"][1:]
    )
    assert data["estimate"].startswith(f"busters are exact (the canonical request's bytes, {ORDER})")
    assert all(t["figures"].startswith("estimate: ") for t in data["turns"])


# -- over stored records ----------------------------------------------------------------------------------------


def test_cache_report_from_record_ids(tmp_path: Path) -> None:
    model_dir = str(fetched.hf_tokenizer_dir("qwen2"))
    model, template = ctxlock.load(model_dir), _template()
    store = tmp_path / "store"
    requests = [_request(t, "tools-order", "openai") for t in range(6)]
    ids = [run_recorded(model, json.dumps(r).encode(), RunOptions(), template, store)[1] for r in requests]
    session = tmp_path / "session.jsonl"
    session.write_text("".join(json.dumps(r) + "\n" for r in requests))
    (tmp_path / "ids.txt").write_text("# the session, in turn order\n" + "\n".join(ids[2:]) + "\n\n")
    tpl = str(fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja")
    common = ("--model", model_dir, "-t", tpl, "--provider", "vllm", "--json")

    def report(*args: str) -> dict[str, Any]:
        out = invoke(cachereport_cmds.register, "cache-report", *args, *common)
        assert out.exit_code == 0, out.output
        return json.loads(out.output)

    from_jsonl = report(str(session))
    # ids on the command line (one as a unique prefix), and the rest from a text file of ids
    from_records = report(ids[0], ids[1][:12], f"@{tmp_path / 'ids.txt'}", "--records", "--store", str(store))
    assert from_records == from_jsonl
    assert from_records["busted_turns"] == [1, 2, 3, 4, 5]
    two = invoke(cachereport_cmds.register, "cache-report", str(session), str(session), *common)
    assert two.exit_code == 1 and json.loads(two.output)["error"]["path"] == "SESSION"
    missing = invoke(cachereport_cmds.register, "cache-report", "0" * 64, "--records", "--store", str(store), *common)
    assert missing.exit_code == 1 and json.loads(missing.output)["error"]["type"] == "RecordNotFoundError"


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=examples(200), deadline=None)
@given(args=st.dictionaries(TEXT, JSON, max_size=4), content=TEXT)
def test_the_walk_writes_the_same_bytes(args: dict[str, Any], content: str) -> None:
    """Every part's values and keys, walked, lie exactly over the bytes the report compares (tool-call arguments of
    any JSON, in both dialects' shapes)."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps(args)}}
    req = parse_request({
        "messages": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
        "tools": [_tool({**SEARCH, "parameters": {"type": "object", "properties": args}}, "openai")],
    })  # fmt: skip
    doc = canonical_bytes(req)
    for start in doc.starts:
        part = doc.part_at(start)
        assert part is not None
        nodes = part_nodes(part)
        assert nodes[0].start == part.start and nodes[0].end == part.end
        for n in (n for n in nodes if n.text is not None):
            written = doc.data[n.start : n.end]
            if doc.data[n.start - 1 : n.start] == b'"':  # a string (a value or a key): its JSON escape
                assert written == json.dumps(n.text, ensure_ascii=False)[1:-1].encode("utf-8", "surrogatepass")
            else:  # a number or a literal
                assert written == n.text.encode() and json.loads(written) == json.loads(n.text)


# -- figures in the provider's layout, whatever the proxy model's template ----------------------------------------


def _after_the_breakpoint(t: int, tools: bool) -> dict[str, Any]:
    """Anthropic's documented layout: a long fixed system block with a breakpoint, then a block that changes every
    turn (after the breakpoint), then the chat."""
    chat: list[dict[str, Any]] = []
    for k in range(t + 1):
        chat.append({"role": "user", "content": f"Is item {k * 7} in stock?"})
        if k < t:
            chat.append({"role": "assistant", "content": f"Item {k * 7}: {k + 3} left."})
    system = [
        {"type": "text", "text": FIXED * 30, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": f"Current time: 2026-12-01 09:{t:02d}"},
    ]
    out = {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": system, "messages": chat}
    return out | ({"tools": [_tool(SEARCH, "anthropic"), _tool(WEATHER, "anthropic")]} if tools else {})


@pytest.mark.parametrize("tools", [False, True])
def test_closed_figures_are_laid_out_in_the_providers_order(tmp_path: Path, tools: bool) -> None:
    """With the default model (mistral-nemo, whose template moves the system prompt to the last user turn) the
    reads are the ones a ChatML proxy reports: the breakpoint prefix on every turn after the first, within the two
    tokenizers' difference; and the output, --json and each turn name the proxy tokenizer."""
    path = tmp_path / "session.jsonl"
    path.write_text("".join(json.dumps(_after_the_breakpoint(t, tools)) + "\n" for t in range(6)))
    runs = {}
    for name, model in (("nemo", []), ("chatml", ["--model", str(fetched.hf_tokenizer_dir("qwen2"))])):
        out = invoke(cachereport_cmds.register, "cache-report", str(path), *model, "--provider", "anthropic", "--json")
        assert out.exit_code == 0, out.output
        runs[name] = json.loads(out.output)
    nemo, chatml = runs["nemo"], runs["chatml"]
    for run in (nemo, chatml):
        first, *rest = run["turns"]
        assert first["cache_read"] == 0 and first["cache_write"] > 1024
        assert all((t["cache_read"], t["cache_write"]) == (first["cache_write"], 0) for t in rest)
        assert run["busted_turns"] == [1, 2, 3, 4, 5]
        assert all(t["buster"]["path"] == "system[1].text" for t in rest)
        assert all(t["figures"] == estimate_label(run["proxy_tokenizer"]) for t in run["turns"])
    assert abs(nemo["cache_read"] - chatml["cache_read"]) < 0.1 * chatml["cache_read"]
    assert nemo["proxy_tokenizer"] == "mistral-nemo/tekken"
    assert "proxy tokenizer mistral-nemo/tekken" in nemo["estimate"] and nemo["layout"].startswith(f"provider: {ORDER}")
    human = invoke(cachereport_cmds.register, "cache-report", str(path), "--provider", "anthropic")
    assert human.exit_code == 0 and "proxy tokenizer mistral-nemo/tekken" in " ".join(human.output.split())


@settings(max_examples=examples(60), deadline=None)
@given(
    system=st.lists(TEXT, min_size=1, max_size=3),
    chat=st.lists(TEXT, min_size=1, max_size=4),
    extra=TEXT,
    marks=st.sets(st.integers(0, 6), max_size=3),
)
def test_the_provider_layout_extends_as_the_bytes_do(system: list[str], chat: list[str], extra: str, marks: set[int]):
    """Whatever the text and wherever the marks: a turn that appends a message extends the turn before in tokens as
    it does in bytes, and a block ends at the same token on both turns whether or not a turn marks it."""
    tok = ctxlock.load().tokenizer

    def request(n: int, marked: set[int]) -> Any:
        blocks = [{"type": "text", "text": t or "."} for t in system]
        msgs = [{"role": ("user", "assistant")[k % 2], "content": [{"type": "text", "text": t or "."}]}
                for k, t in enumerate([*chat, extra][:n])]  # fmt: skip
        for k, block in enumerate([*blocks, *(m["content"][0] for m in msgs)]):
            if k in marked:
                block["cache_control"] = {"type": "ephemeral"}
        return parse_request({"model": "m", "max_tokens": 1, "system": blocks, "messages": msgs})

    memo: dict[Any, Any] = {}
    one, two = request(len(chat), marks), request(len(chat) + 1, {k + 1 for k in marks})
    lay_one = provider_layout(canonical_bytes(one), one, tok, memo)
    lay_two = provider_layout(canonical_bytes(two), two, tok, {})
    assert lay_two.ids[: len(lay_one.ids)].tolist() == lay_one.ids.tolist()
    assert {p: e for p, e in lay_two.block_ends.items() if p in lay_one.block_ends} == lay_one.block_ends
    assert len(lay_one.block_ends) == len(system) + len(chat)
    for b in lay_one.breakpoints(one):
        assert 0 < b.end <= len(lay_one.ids)
