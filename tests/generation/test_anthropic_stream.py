"""The anthropic stream format (issue 15 item 12): Messages API server-sent events, split anywhere.

The recordings (tests/data/streams/anthropic_*.sse, written by tests/anthropic_streams.py in the documented wire
format) are fed as text split at every character index, one character at a time, as parsed event dicts, and in
random chunkings. The same response with each block in two deltas (COMPACT: every kind of event, every multi-byte
character, under half the length) is split at every byte index as UTF-8, at every index with CRLF and CR line ends,
and cut at every index: each of those costs a time quadratic in the stream's length. A tool_use block is a call only
after its content_block_stop (seed 003 §2.5), and, by default, only once the message ended normally (item 10).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import anthropic_streams as A
from ctxlock.errors import ToolCallError, ToolCallTruncatedError
from ctxlock.generation.toolcalls import (
    TRUNCATED_MESSAGE,
    Result,
    TextDelta,
    ToolCallAssembler,
    ToolCallReady,
    assemble,
)
from hypothesis_profiles import examples

STREAMS = Path(__file__).parents[1] / "data" / "streams"
MODES = (("finish",), ("early",))  # split at every index: the two release modes on alternate indexes
FULL = (STREAMS / "anthropic_thinking_text_two_tools.sse").read_bytes().decode("utf-8")
COMPACT = A.sse(A.events(halves=True))
CUT = (STREAMS / "anthropic_max_tokens_mid_input.sse").read_bytes().decode("utf-8")


def run(chunks: list[Any], finish: str | None = None, **kw: Any) -> tuple[list[tuple[int | None, Any]], Result]:
    """Feed `chunks`; return [(characters, bytes or events fed so far, event)] (None = from finish) and the Result."""
    asm = ToolCallAssembler(A.TOOLS, "anthropic", **kw)
    log: list[tuple[int | None, Any]] = []
    fed = 0
    for c in chunks:
        fed += len(c) if isinstance(c, str | bytes) else 1
        log += [(fed, e) for e in asm.feed(c)]
    result = asm.finish(finish)
    log += [(None, e) for e in result.events]
    return log, result


def check_full(chunks: list[Any], ends: list[int], modes: tuple[str, ...] = ("finish", "early")) -> None:
    """The whole recording in one chunking: both calls, the text and the thinking, in each release mode.
    `ends[k]`: where (in the units fed) call k's content_block_stop event ends."""
    for release in modes:
        log, result = run(chunks, release=release)
        assert [(c.index, c.id, c.name, c.arguments) for c in result.calls] == [
            (k, c["id"], c["name"], c["arguments"]) for k, c in enumerate(A.CALLS)
        ]
        assert [c.raw_arguments for c in result.calls] == [
            json.dumps(c["arguments"], ensure_ascii=False) for c in A.CALLS
        ]
        assert result.text == A.TEXT == "".join(e.text for _, e in log if isinstance(e, TextDelta))
        assert result.thinking == A.THINKING and A.THINKING not in result.text
        assert result.errors == () and result.notes == ()
        assert result.stream_finish_reason == "tool_use" and result.finish_reason == "tool_calls"
        ready = [(fed, e) for fed, e in log if isinstance(e, ToolCallReady)]
        if release == "finish":
            assert all(fed is None for fed, _ in ready)  # only from finish(), after message_stop
        else:
            boundaries = []
            total = 0
            for c in chunks:
                total += len(c) if isinstance(c, str | bytes) else 1
                boundaries.append(total)
            for fed, e in ready:
                # Released by the delta that completed its content_block_stop event, never before.
                assert fed == next(b for b in boundaries if b >= ends[e.index]), (e.index, fed, ends)


def test_the_recordings_are_what_the_generator_writes() -> None:
    for name, text in A.fixtures().items():
        assert (STREAMS / f"{name}.sse").read_bytes() == text.encode("utf-8"), f"{name}.sse is stale"
    # The documented shape: every event is `event: <type>` + `data: {..."type": <type>...}` + a blank line.
    for text in (FULL, CUT):
        for block in text.split("\n\n")[:-1]:
            head, data = block.split("\n")
            assert head.startswith("event: ") and data.startswith("data: ")
            assert json.loads(data.removeprefix("data: "))["type"] == head.removeprefix("event: ")
    assert "signature_delta" in FULL and '"partial_json":""' in FULL and "event: ping" in FULL


def test_whole_stream_and_every_event_alone() -> None:
    ends = A.block_stop_ends(FULL)
    check_full([FULL], [len(FULL)] * 2)
    events = FULL.split("\n\n")[:-1]
    check_full([e + "\n\n" for e in events], ends)


def test_split_at_every_character_index() -> None:
    ends = A.block_stop_ends(FULL)
    for s in range(len(FULL) + 1):
        check_full([FULL[:s], FULL[s:]], ends, MODES[s % 2])
    check_full(list(FULL), ends)  # one character at a time


def test_the_compact_stream_has_every_kind_of_event() -> None:
    kinds = {(e["type"], e.get("delta", {}).get("type")) for e in A.events()}
    compact = A.events(halves=True)
    assert {(e["type"], e.get("delta", {}).get("type")) for e in compact} == kinds
    assert sum(e.get("delta", {}).get("type") == "thinking_delta" for e in compact) == 2
    assert sum(e.get("delta", {}).get("type") == "text_delta" for e in compact) == 2
    assert sum(e.get("delta", {}).get("type") == "input_json_delta" for e in compact) == 2 * 3  # "" and two halves
    assert all(c in COMPACT for c in "ü天气🌧") and len(COMPACT) < len(FULL) / 1.9


def test_split_at_every_byte_index() -> None:
    for stream in (COMPACT, FULL):
        data = stream.encode("utf-8")
        assert len(data) > len(stream)  # multi-byte characters (ü, 天气, 🌧) get split
        ends = [len(stream[:e].encode("utf-8")) for e in A.block_stop_ends(stream)]
        if stream is COMPACT:
            for s in range(len(data) + 1):
                check_full([data[:s], data[s:]], ends, MODES[s % 2])
        check_full([data[k : k + 1] for k in range(len(data))], ends)


def test_crlf_and_cr_line_ends_split_everywhere() -> None:
    for eol in ("\r\n", "\r"):
        text = COMPACT.replace("\n", eol)
        # The CR of the blank line ends it: the event is dispatched without waiting for the LF after it.
        ends = [len(COMPACT[:e].replace("\n", eol)) - (eol == "\r\n") for e in A.block_stop_ends(COMPACT)]
        for s in range(len(text) + 1):
            check_full([text[:s], text[s:]], ends, MODES[s % 2])


def test_parsed_event_dicts_and_sdk_objects() -> None:
    evs = A.events()
    ends = []
    tool_blocks = {
        e["index"] for e in evs if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
    }
    for k, e in enumerate(evs, start=1):
        if e["type"] == "content_block_stop" and e["index"] in tool_blocks:
            ends.append(k)
    check_full(evs, ends)

    class Event:  # the anthropic SDK's RawMessageStreamEvent models have model_dump()
        def __init__(self, data: dict) -> None:
            self.data = data

        def model_dump(self) -> dict:
            return self.data

    check_full([Event(e) for e in evs], ends)


@settings(max_examples=examples(60), deadline=None)
@given(data=st.data())
def test_random_chunkings_of_text_and_bytes(data: st.DataObject) -> None:
    as_bytes = data.draw(st.booleans())
    stream: str | bytes = FULL.encode("utf-8") if as_bytes else FULL
    ends = A.block_stop_ends(FULL)
    if as_bytes:
        ends = [len(FULL[:e].encode("utf-8")) for e in ends]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=60)))
    check_full([stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)], ends)


def test_a_prefix_releases_only_what_its_end_allows() -> None:
    """Cut the response anywhere: by default nothing without message_stop; early, the calls whose block stopped."""
    ends = A.block_stop_ends(COMPACT)
    complete = A.message_stop_end(COMPACT)
    for cut in range(len(COMPACT) + 1):
        _, result = run([COMPACT[:cut]])
        if cut >= complete:
            assert len(result.calls) == 2 and result.ok
            continue
        assert result.calls == ()
        assert result.stream_finish_reason is None
        stopped = [k for k, e in enumerate(ends) if e <= cut]
        held = [e for e in result.errors if "was not executed" in e.message]
        assert [e.index for e in held] == stopped
        assert all("without message_stop" in e.message and "nothing was executed" in e.hint for e in held)
        _, early = run([COMPACT[:cut]], release="early")
        assert [c.index for c in early.calls] == stopped


def test_max_tokens_releases_nothing() -> None:
    _, result = run([CUT])
    assert result.stream_finish_reason == "max_tokens" and result.finish_reason == "length"
    assert result.calls == ()
    held, cut = result.errors
    # call 0 was complete (its block stopped) but the message hit max_tokens: not executed, like Pi.
    assert type(held) is ToolCallTruncatedError and held.call_id == A.CALLS[0]["id"] and held.path == "tool_calls[0]"
    assert "was not executed" in held.message and "nothing was executed" in held.hint
    # call 1 stopped with its input cut mid-JSON: truncated, never a JSON error to send back.
    assert type(cut) is ToolCallTruncatedError and cut.message.startswith(TRUNCATED_MESSAGE)
    assert cut.pending == (1,) and cut.call_id == A.CALLS[1]["id"] and "nothing was executed" in cut.hint
    _, early = run([CUT], release="early")
    assert [c.index for c in early.calls] == [0]
    (err,) = early.errors
    assert "may have run" in err.hint and "nothing was executed" not in err.hint
    assert any("released early" in n for n in early.notes)


@pytest.mark.parametrize(
    ("reason", "released", "mapped"),
    [
        ("tool_use", True, "tool_calls"),
        ("end_turn", True, "tool_calls"),
        ("stop_sequence", True, "tool_calls"),
        ("max_tokens", False, "length"),
        ("model_context_window_exceeded", False, "length"),
        ("pause_turn", False, "pause_turn"),
        ("refusal", False, "refusal"),
    ],
)
def test_stop_reasons(reason: str, released: bool, mapped: str) -> None:
    _, result = run([A.sse(A.events(reason))])
    assert bool(result.calls) is released and result.finish_reason == mapped
    assert result.stream_finish_reason == reason
    if not released:
        assert len(result.errors) == 2 and all("was not executed" in e.message for e in result.errors)
        expected = ToolCallTruncatedError if mapped == "length" else ToolCallError
        assert all(type(e) is expected for e in result.errors)
        if reason == "pause_turn":
            assert "send the response back as the assistant turn" in result.errors[0].hint
    # An explicit finish reason wins over the stream's own.
    _, forced = run([A.sse(A.events(reason))], "max_tokens")
    assert forced.calls == () and forced.finish_reason == "length"


def test_other_blocks_are_reported_not_released() -> None:
    evs = [
        {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": []}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "redacted_thinking", "data": "EmwKAhgB"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"query": "x"}'},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        },
        {"type": "content_block_stop", "index": 2},
        {"type": "content_block_start", "index": 3, "content_block": {"type": "text", "text": "Found it"}},
        {"type": "content_block_delta", "index": 3, "delta": {"type": "citations_delta", "citation": {}}},
        {"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": "."}},
        {"type": "content_block_stop", "index": 3},
        {"type": "surprise_event"},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
        {"type": "message_stop"},
    ]
    _, result = run(evs)
    assert result.calls == () and result.ok and result.text == "Found it." and result.finish_reason == "stop"
    notes = "\n".join(result.notes)
    assert "redacted_thinking" in notes and "server_tool_use" in notes and "'web_search'" in notes
    assert "web_search_tool_result" in notes and "'surprise_event'" in notes


def test_a_tool_without_input_and_validation() -> None:
    evs = A.events()
    # no input_json_delta with content at all: the input is content_block_start's {}
    bare = [
        {"type": "message_start", "message": {"id": "m"}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t", "name": "ping", "input": {}},
        },
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": ""}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
        {"type": "message_stop"},
    ]
    ping = {"type": "function", "function": {"name": "ping"}}
    result = assemble([ping], "anthropic", bare)
    assert [(c.id, c.arguments, c.raw_arguments) for c in result.calls] == [("t", {}, "{}")]
    assert result.calls[0].to_anthropic() == {"type": "tool_use", "id": "t", "name": "ping", "input": {}}
    # Invalid arguments are rejected with the path into the input, whatever the release mode.
    block = next(
        e["index"]
        for e in evs
        if e["type"] == "content_block_start" and e["content_block"].get("name") == "get_weather"
    )
    pieces = [e for e in evs if e["type"] == "content_block_delta" and e["index"] == block]
    bad = [e for e in evs if e not in pieces[1:]]
    bad[bad.index(pieces[0])] = dict(
        pieces[0], delta={"type": "input_json_delta", "partial_json": '{"city": "Rome", "metric": 1}'}
    )
    _, result = run([A.sse(bad)])
    assert [c.index for c in result.calls] == [1]
    (err,) = result.errors
    assert err.path == "tool_calls[0].arguments.metric" and err.call_id == A.CALLS[0]["id"]


@pytest.mark.parametrize(
    ("chunks", "path", "needle"),
    [
        (['event: ping\ndata: {"type":"ping"\n\n'], "events[0].data", "not a JSON object"),
        (['event: ping\ndata: {"type":"message_stop"}\n\n'], "events[0].type", "carries data of type"),
        (
            [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}],
            "events[0].index",
            "not started",
        ),
        (
            [
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{"}},
            ],
            "events[1].delta.type",
            "input_json_delta for a text block",
        ),
        (
            [
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ],
            "events[1].index",
            "started twice",
        ),
        ([{"type": "message_stop"}, {"type": "message_delta", "delta": {}}], "events[1].type", "after message_stop"),
        ([{"type": "ping"}, "event: ping\n"], "events[1]", "then a str"),
        ([b"data: \xff\n\n"], "stream byte 6", "not valid UTF-8"),
        ([42], "events[0]", "got int"),
    ],
)
def test_malformed_streams_raise_with_a_path(chunks: list[Any], path: str, needle: str) -> None:
    asm = ToolCallAssembler(A.TOOLS, "anthropic")
    with pytest.raises(ToolCallError) as info:
        for c in chunks:
            asm.feed(c)
    assert info.value.path == path and needle in info.value.message


def test_sse_details() -> None:
    """Comments, `data:` without a space, a byte-order mark, and an event left without its blank line."""
    text = "\ufeff: keep-alive\n" + FULL.replace("data: ", "data:", 3)
    _, result = run([text])
    assert len(result.calls) == 2 and result.ok
    _, result = run([FULL[:-1]])  # message_stop never dispatched: the stream did not end
    assert result.calls == () and result.stream_finish_reason is None
    assert any("inside an SSE event" in n for n in result.notes)
