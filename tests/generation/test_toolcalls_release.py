"""No tool call from a cut-off response (issue 15 item 10; seed 001's truncation rule, seed 003 §5).

Pi refuses every tool call of a response that hit the output limit ("Tool call ... was not executed"). By default
the assembler hands out `ToolCallReady` only from `finish()`, and only when the stream ended normally; every call
of a response that ended otherwise is answered as not executed. Early release is an explicit option, and its
error hints then say which calls were already out.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_toolcalls import MARKERS, RECORDED, TOOLS, _load_jsonl

from ctxlock.errors import ToolCallError, ToolCallTruncatedError
from ctxlock.generation.toolcalls import ToolCallAssembler, ToolCallReady, to_model
from hypothesis_profiles import examples

NAMES = sorted(RECORDED)


def run(fmt: str, chunks: list[Any], finish: str | None, **kw: Any) -> tuple[list[Any], list[Any], Any]:
    """Feed `chunks`; return the events feed() released, the events finish() released, and the Result."""
    asm = ToolCallAssembler(TOOLS, fmt, **kw)
    fed = [e for c in chunks for e in asm.feed(c)]
    result = asm.finish(finish)
    return fed, list(result.events), result


@pytest.mark.parametrize("name", NAMES)
def test_a_length_stop_anywhere_releases_no_call(name: str) -> None:
    fx = RECORDED[name]
    text, calls = fx["text"], fx["expected"]["calls"]
    marker = MARKERS[fx["format"]]
    for cut in range(len(text) + 1):
        fed, finished, result = run(fx["format"], [text[:cut]], "length")
        assert not any(isinstance(e, ToolCallReady) for e in fed + finished), cut
        assert result.calls == () and result.finish_reason == "length"
        closed = [c for c in calls if c["close"] <= cut]
        held = [e for e in result.errors if "was not executed" in e.message]
        assert [(e.index, e.call_id, e.tool_name) for e in held] == [(c["index"], c["id"], c["name"]) for c in closed]
        pending = [c for c in calls if c["start"] + len(marker) <= cut < c["close"]]
        assert len(result.errors) == len(closed) + bool(pending)
        for err in result.errors:
            assert type(err) is ToolCallTruncatedError and "nothing was executed" in err.hint


def test_openai_calls_the_stream_moved_past_are_not_released_at_length() -> None:
    fed, finished, result = run("openai", _load_jsonl("openai_length_mid_arguments"), None)
    assert not any(isinstance(e, ToolCallReady) for e in fed + finished)
    assert result.calls == () and result.stream_finish_reason == "length"
    held, cut = result.errors
    assert (held.index, held.call_id, type(held)) == (0, "call_Ab1", ToolCallTruncatedError)
    assert (cut.index, cut.call_id, cut.pending) == (1, "call_Cd2", (1,))
    assert "nothing was executed" in held.hint and "nothing was executed" in cut.hint


def test_a_length_stop_reported_as_tool_calls_releases_no_call() -> None:
    """vLLM once rewrote a max_tokens stop to "tool_calls": the last call's arguments end mid-JSON, so the
    response was cut off, and call 0 (complete) is not released either."""
    _, _, result = run("openai", _load_jsonl("openai_length_reported_as_tool_calls"), None)
    assert result.calls == ()
    assert [(e.index, type(e)) for e in result.errors] == [(0, ToolCallTruncatedError), (1, ToolCallTruncatedError)]
    assert "ends mid-JSON although finish_reason is 'tool_calls'" in result.errors[0].message


@pytest.mark.parametrize("name", NAMES)
def test_feed_never_releases_by_default(name: str) -> None:
    fx = RECORDED[name]
    fed, finished, result = run(fx["format"], fx["deltas"], fx["finish_reason"])
    assert not any(isinstance(e, ToolCallReady) for e in fed)
    assert [e.index for e in finished if isinstance(e, ToolCallReady)] == [c["index"] for c in fx["expected"]["calls"]]
    assert result.finish_reason == "tool_calls" and result.ok


@pytest.mark.parametrize("reason", ["content_filter", "error", None, "something_new", "max_tokens", "model_length"])
@pytest.mark.parametrize("fmt", ["hermes", "openai"])
def test_every_end_but_a_normal_one_withholds(fmt: str, reason: str | None) -> None:
    if fmt == "openai":
        chunks: list[Any] = _load_jsonl("openai_three_parallel")[:-2]  # without the finish chunk
    else:
        chunks = [RECORDED["hermes_qwen25_parallel"]["text"]]
    fed, finished, result = run(fmt, chunks, reason)
    assert result.calls == () and not any(isinstance(e, ToolCallReady) for e in fed + finished)
    held = [e for e in result.errors if "was not executed" in e.message]
    assert [e.index for e in held] == [0, 1]  # complete calls; openai's call 2 is still open: its own error
    assert len(result.errors) == (3 if fmt == "openai" else 2)
    for err in held:
        assert "nothing was executed" in err.hint
        if reason in ("max_tokens", "model_length"):
            assert type(err) is ToolCallTruncatedError and result.finish_reason == "length"
        else:
            assert type(err) is ToolCallError and f"finish_reason={reason!r}" in err.message
    if reason is None:
        assert "pass the stream's finish reason to finish()" in held[0].hint


def test_a_withheld_call_is_answered_like_pi_does() -> None:
    _, _, result = run("openai", _load_jsonl("openai_length_mid_arguments"), None)
    message = to_model(result.errors[0])
    assert message["role"] == "tool" and message["tool_call_id"] == "call_Ab1" and message["name"] == "get_weather"
    body = json.loads(message["content"])
    assert body["type"] == "ToolCallTruncatedError"
    assert "'get_weather' (tool_calls[0]) was not executed" in body["message"]
    assert "output token limit" in body["message"]


def test_early_release_is_explicit_and_says_what_ran() -> None:
    fx = RECORDED["hermes_hermes2pro_three"]
    calls = fx["expected"]["calls"]
    cut = calls[1]["start"] + 20  # call 0 is complete, call 1 is open
    fed, _, result = run("hermes", [fx["text"][:cut]], "length", release="early")
    assert [e.index for e in fed if isinstance(e, ToolCallReady)] == [0]
    assert [c.index for c in result.calls] == [0] and result.finish_reason == "length"
    (err,) = result.errors
    assert type(err) is ToolCallTruncatedError and err.pending == (1,)
    assert "nothing was executed" not in err.hint
    assert "tool_calls[0] had already been released before the cut (release='early') and may have run" in err.hint
    assert any("released early" in note and "finish_reason='length'" in note for note in result.notes)
    # The same stream under the default: nothing out, every hint true.
    fed, _, result = run("hermes", [fx["text"][:cut]], "length")
    assert result.calls == () and all("nothing was executed" in e.hint for e in result.errors)


def test_release_mode_is_checked() -> None:
    with pytest.raises(ToolCallError) as info:
        ToolCallAssembler(TOOLS, "hermes", release="sometimes")
    assert info.value.path == "release" and "early" in info.value.hint


@settings(max_examples=examples(80), deadline=None)
@given(
    name=st.sampled_from(NAMES),
    data=st.data(),
    reason=st.sampled_from(["stop", "tool_calls", "length", "content_filter", None, "error"]),
    early=st.booleans(),
)
def test_calls_are_released_only_after_a_normal_end(name: str, data: st.DataObject, reason: Any, early: bool) -> None:
    fx = RECORDED[name]
    text = fx["text"]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=20)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    fed, finished, result = run(fx["format"], chunks, reason, release="early" if early else "finish")
    normal = reason in ("stop", "tool_calls")
    expected = [c["index"] for c in fx["expected"]["calls"]]
    assert [c.index for c in result.calls] == (expected if normal or early else [])
    assert [e.index for e in fed + finished if isinstance(e, ToolCallReady)] == [c.index for c in result.calls]
    if not early:
        assert not any(isinstance(e, ToolCallReady) for e in fed)
        if not normal:
            assert [e.index for e in result.errors] == expected
