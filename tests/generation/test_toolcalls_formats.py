"""The wire-format parsers (ctxlock.generation.toolcalls.<format>) through the public emitter protocol, `ToolCallSink`.

Each parser is built from `PARSERS` on a sink that exposes exactly the protocol's members and forwards them to a
real `ToolCallAssembler`, logging each call. Fed the recorded model outputs the other tool-call tests use, one
character (or chunk) at a time, every parser must report each expected call once, through `complete`, at the
character that completes it, and nothing but the protocol: the assembler's own result then holds the calls.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_toolcalls import MARKERS, OPENAI_CALLS, RECORDED, TOOLS, _load_jsonl

import anthropic_streams as A
from ctxlock.generation.toolcalls import PARSERS, FormatParser, ToolCallAssembler, ToolCallFormat, ToolCallSink

SINK_MEMBERS = (
    "emit_text",
    "emit_thinking",
    "note",
    "new_index",
    "make_id",
    "tool_schema",
    "complete",
    "fail",
    "unfinished",
    "provider_error",
    "mark_cut_off",
)


class LoggingSink:
    """The protocol's members and nothing else, forwarded to a real assembler; `log` holds (fed, member, args)."""

    def __init__(self, assembler: ToolCallAssembler) -> None:
        self.assembler = assembler
        self.fed = 0
        self.log: list[tuple[int, str, tuple[Any, ...]]] = []
        for member in SINK_MEMBERS:
            setattr(self, member, self._forward(member))

    def _forward(self, member: str) -> Any:
        target = getattr(self.assembler, member)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.log.append((self.fed, member, args))
            return target(*args, **kwargs)

        return call

    @property
    def format(self) -> ToolCallFormat:
        return self.assembler.format

    @property
    def max_event_size(self) -> int:
        return self.assembler.max_event_size

    def calls(self, member: str) -> list[tuple[int, tuple[Any, ...]]]:
        return [(fed, args) for fed, name, args in self.log if name == member]


def drive(fmt: str, tools: Any, deltas: list[Any], finish: str | None) -> tuple[LoggingSink, Any]:
    """Feed `deltas` to the format's parser on a LoggingSink; return the sink and the assembler's Result."""
    sink = LoggingSink(ToolCallAssembler(tools, fmt))
    assert isinstance(sink, ToolCallSink)
    parser: FormatParser = PARSERS[ToolCallFormat(fmt)](sink, 0)
    for delta in deltas:
        sink.fed += len(delta) if isinstance(delta, str | bytes) else 1
        parser.feed(delta)
    reason = parser.finish(finish)
    # The assembler's own parser was never fed: what it holds came through the protocol only.
    return sink, sink.assembler.finish(reason)


def test_every_format_has_a_parser_and_the_assembler_is_a_sink() -> None:
    assert set(PARSERS) == set(ToolCallFormat)
    for fmt in ToolCallFormat:
        assembler = ToolCallAssembler(TOOLS, fmt)
        assert isinstance(assembler, ToolCallSink)
        assert all(callable(getattr(assembler, m)) for m in SINK_MEMBERS)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_raw_text_parsers_report_each_recorded_call_when_it_closes(name: str) -> None:
    fx = RECORDED[name]
    expected = fx["expected"]
    sink, result = drive(fx["format"], fx["tools"], list(fx["text"]), fx["finish_reason"])
    completes = sink.calls("complete")
    assert [(args[0], args[2]) for _, args in completes] == [(c["index"], c["name"]) for c in expected["calls"]]
    # Reported at the character that completes the call (its closing marker or bracket), not before.
    assert [fed for fed, _ in completes] == [c["close"] for c in expected["calls"]]
    assert [args[3] for _, args in completes] == [c["arguments"] for c in expected["calls"]]
    assert sink.calls("fail") == [] and sink.calls("unfinished") == []
    assert len(sink.calls("new_index")) == len(completes)
    assert "".join(args[0] for _, args in sink.calls("emit_text")) == expected["text"] == result.text
    assert [(c.index, c.id, c.name, c.arguments) for c in result.calls] == [
        (c["index"], c["id"], c["name"], c["arguments"]) for c in expected["calls"]
    ]
    assert result.errors == () and result.finish_reason == "tool_calls"
    assert all(MARKERS[fx["format"]] not in args[0] for _, args in sink.calls("emit_text"))


def test_openai_parser_reports_the_recorded_calls() -> None:
    chunks = _load_jsonl("openai_three_parallel")
    sink, result = drive("openai", TOOLS, chunks, None)
    completes = sink.calls("complete")
    assert [(args[1], args[2], args[4]) for _, args in completes] == [
        (c["id"], c["name"], c["raw"]) for c in OPENAI_CALLS
    ]
    assert [args[3] for _, args in completes] == [json.loads(c["raw"]) for c in OPENAI_CALLS]
    # A call is complete when the stream moves past it: the next call's first fragment, or the finish.
    assert [fed for fed, _ in completes][:2] == [fed for fed, _ in sink.calls("new_index")][1:]
    assert completes[-1][0] == len(chunks)
    assert "".join(args[0] for _, args in sink.calls("emit_text")) == "I'll look those up." == result.text
    assert [c.id for c in result.calls] == ["call_Ab1", "call_Cd2", "call_Ef3"]
    assert result.finish_reason == "tool_calls" and result.errors == ()


def test_anthropic_parser_reports_text_thinking_and_calls_through_the_sink() -> None:
    body = A.fixtures()["anthropic_thinking_text_two_tools"]
    sink, result = drive("anthropic", A.TOOLS, list(body), None)
    completes = sink.calls("complete")
    assert [(args[0], args[1], args[2], args[3]) for _, args in completes] == [
        (k, c["id"], c["name"], c["arguments"]) for k, c in enumerate(A.CALLS)
    ]
    assert "".join(args[0] for _, args in sink.calls("emit_text")) == A.TEXT == result.text
    assert "".join(args[0] for _, args in sink.calls("emit_thinking")) == A.THINKING == result.thinking
    assert sink.calls("note") == [] and sink.calls("fail") == []
    assert result.stream_finish_reason == "tool_use" and result.finish_reason == "tool_calls"
    assert [c.name for c in result.calls] == [c["name"] for c in A.CALLS]


def test_a_cut_off_stream_reaches_the_sink_as_unfinished_or_cut_off() -> None:
    fx = RECORDED["hermes_qwen25_parallel"]
    last = fx["expected"]["calls"][-1]
    sink, result = drive("hermes", fx["tools"], [fx["text"][: last["close"] - 1]], "length")
    ((_, (indexes, reason, _where)),) = sink.calls("unfinished")
    assert indexes == [last["index"]] and reason == "length"
    assert result.calls == () and result.finish_reason == "length"
    # openai: arguments that end mid-JSON under finish_reason="tool_calls" are a cut the finish reason hides.
    sink, result = drive("openai", TOOLS, _load_jsonl("openai_length_reported_as_tool_calls"), None)
    assert len(sink.calls("mark_cut_off")) == 1 and result.calls == ()
