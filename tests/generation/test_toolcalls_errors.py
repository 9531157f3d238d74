"""In-band stream errors (issue 15 item 11; seed 003 §2.5: "HTTP 200 is already sent").

A stream can fail after its status line: an OpenAI chunk `{"error": {...}}` (vLLM's older flat
`{"object": "error", ...}`), Anthropic's `event: error`. The assembler ends the stream with a
`ProviderStreamError` carrying the provider's type and message, and releases nothing still pending, in every
format it supports.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_toolcalls import RECORDED, TOOLS, _load_jsonl

import anthropic_streams as A
from ctxlock.errors import CtxlockError, ProviderStreamError, ToolCallError
from ctxlock.generation.toolcalls import ToolCallAssembler, ToolCallReady

OPENAI_ERROR = {
    "error": {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "param": None,
        "code": None,
    }
}
VLLM_FLAT_ERROR = {"object": "error", "message": "Engine loop has died", "type": "InternalServerError", "code": 500}
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
OVERLOADED_SSE = f"event: error\ndata: {json.dumps(OVERLOADED)}\n\n"


def feed_until_error(asm: ToolCallAssembler, chunks: list[Any]) -> tuple[list[Any], ProviderStreamError]:
    released: list[Any] = []
    with pytest.raises(ProviderStreamError) as info:
        for c in chunks:
            released += asm.feed(c)
    return released, info.value


def check_ended(asm: ToolCallAssembler, err: ProviderStreamError) -> None:
    """The stream is over: finish() raises the same error, feed() refuses; the error is ctxlock's, with a path."""
    assert isinstance(err, ToolCallError) and isinstance(err, CtxlockError) and err.path
    with pytest.raises(ProviderStreamError) as again:
        asm.finish("stop")
    assert again.value is err
    with pytest.raises(ToolCallError) as late:
        asm.feed("x")
    assert "provider error" in late.value.message
    body = err.to_dict()
    assert body["type"] == "ProviderStreamError" and body["provider"]["message"] == err.provider_message


@pytest.mark.parametrize("payload", [OPENAI_ERROR, VLLM_FLAT_ERROR])
def test_openai_error_chunk_mid_arguments(payload: dict) -> None:
    chunks = _load_jsonl("openai_three_parallel")
    second = next(k for k, c in enumerate(chunks) if c["choices"] and "call_Cd2" in json.dumps(c))
    asm = ToolCallAssembler(TOOLS, "openai")
    released, err = feed_until_error(asm, [*chunks[: second + 3], payload, *chunks[second + 3 :]])
    assert not any(isinstance(e, ToolCallReady) for e in released)
    # call 0 was complete (held until a normal end), call 1 was open: neither is released.
    assert err.pending == (0, 1) and err.released == ()
    inner = payload.get("error", payload)
    assert err.provider_message == inner["message"] and err.provider_type == inner["type"]
    assert err.path == f"chunks[{second + 3}]"
    assert inner["message"] in err.message and "nothing was executed" in err.hint
    assert err.result.calls == () and err.result.text == "I'll look those up."
    check_ended(asm, err)


def test_openai_error_chunk_with_early_release_says_what_was_out() -> None:
    chunks = _load_jsonl("openai_three_parallel")
    second = next(k for k, c in enumerate(chunks) if c["choices"] and "call_Cd2" in json.dumps(c))
    asm = ToolCallAssembler(TOOLS, "openai", release="early")
    released, err = feed_until_error(asm, [*chunks[: second + 3], OPENAI_ERROR])
    assert [e.index for e in released if isinstance(e, ToolCallReady)] == [0]
    assert err.released == (0,) and err.pending == (1,)
    assert "tool_calls[0] had already been released (release='early') and may have run" in err.hint
    assert "nothing was executed" not in err.hint


def test_a_call_completed_by_the_erroring_feed_was_never_delivered() -> None:
    """release="early": a call completed in the same feed() that then meets the error never reached the caller
    (feed raised instead of returning it), so it is pending, not "may have run"."""
    evs = A.events()
    stop = next(k for k, e in enumerate(evs) if e["type"] == "content_block_stop" and e["index"] == 2)
    body = A.sse(evs[: stop + 1]) + OVERLOADED_SSE
    asm = ToolCallAssembler(A.TOOLS, "anthropic", release="early")
    _, err = feed_until_error(asm, [body])
    assert err.released == () and err.pending == (0,) and "nothing was executed" in err.hint
    assert err.result.calls == () and not any(isinstance(e, ToolCallReady) for e in err.result.events)
    asm = ToolCallAssembler(A.TOOLS, "anthropic", release="early")
    (ready,) = [e for e in asm.feed(A.sse(evs[: stop + 1])) if isinstance(e, ToolCallReady)]
    _, err = feed_until_error(asm, [OVERLOADED_SSE])
    assert err.released == (0,) and "may have run" in err.hint and err.result.calls == (ready,)


def test_anthropic_error_event_in_sse_text_split_anywhere() -> None:
    full = A.sse(A.events())
    at = full.index('event: content_block_stop\ndata: {"type":"content_block_stop","index":2}')
    stream = full[:at] + OVERLOADED_SSE + full[at:]
    end = at + len(OVERLOADED_SSE)
    for s in range(len(stream) + 1):
        asm = ToolCallAssembler(A.TOOLS, "anthropic")
        pieces = [stream[:s], stream[s:]]
        fed = 0
        with pytest.raises(ProviderStreamError) as info:
            for p in pieces:
                fed += len(p)
                assert not any(isinstance(e, ToolCallReady) for e in asm.feed(p))
        assert fed >= end  # raised by the piece that completed the error event, not before
        err = info.value
        assert (err.provider_type, err.provider_message) == ("overloaded_error", "Overloaded")
        assert err.pending == (0,) and err.result.calls == () and err.result.thinking == A.THINKING
        assert "send the request again later" in err.hint


def test_anthropic_error_event_as_dicts_and_bytes() -> None:
    evs = A.events()
    cut = next(k for k, e in enumerate(evs) if e["type"] == "message_delta")  # both tool_use blocks stopped
    asm = ToolCallAssembler(A.TOOLS, "anthropic")
    _, err = feed_until_error(asm, [*evs[:cut], OVERLOADED])
    assert err.pending == (0, 1) and err.path == f"events[{cut}]"  # complete, but the message never ended
    check_ended(asm, err)
    asm = ToolCallAssembler(A.TOOLS, "anthropic")
    _, err = feed_until_error(asm, [A.sse(evs[:cut]).encode("utf-8"), OVERLOADED_SSE.encode("utf-8")])
    assert err.provider_type == "overloaded_error" and err.pending == (0, 1)
    # An error event whose data is not the documented JSON is still an error.
    asm = ToolCallAssembler(A.TOOLS, "anthropic")
    _, err = feed_until_error(asm, ["event: error\ndata: upstream connect error\n\n"])
    assert err.provider_message == "upstream connect error" and err.provider_type is None


@pytest.mark.parametrize("name", ["hermes_qwen25_parallel", "qwen3_coder_parallel", "mistral_v11_call_ids"])
def test_raw_text_formats_take_the_error_object(name: str) -> None:
    fx = RECORDED[name]
    calls = fx["expected"]["calls"]
    inside = calls[1]["start"] + 15  # call 0 complete, call 1 open
    asm = ToolCallAssembler(TOOLS, fx["format"])
    released, err = feed_until_error(asm, [fx["text"][:inside], OPENAI_ERROR])
    assert not any(isinstance(e, ToolCallReady) for e in released)
    assert err.pending == (0, 1) and err.path == "stream" and err.provider_type == "server_error"
    check_ended(asm, err)
    # Anything else that is not text is still refused.
    with pytest.raises(ToolCallError) as info:
        ToolCallAssembler(TOOLS, fx["format"]).feed({"choices": []})
    assert not isinstance(info.value, ProviderStreamError)


def test_an_error_before_anything_and_an_odd_payload() -> None:
    asm = ToolCallAssembler(TOOLS, "openai")
    _, err = feed_until_error(asm, [{"error": "rate limited"}])
    assert err.provider_message == "rate limited" and err.pending == () and "nothing was executed" in err.hint
    asm = ToolCallAssembler(TOOLS, "openai")
    _, err = feed_until_error(asm, [{"error": {"message": {"detail": "x"}, "code": 503, "type": "rate_limit_error"}}])
    assert err.provider_message == '{"detail": "x"}' and err.provider_code == 503
    assert err.hint.endswith("send the request again later")
