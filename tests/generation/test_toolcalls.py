"""Streaming tool-call assembly (ctxlock.generation.toolcalls): a call is released only whole and valid.

Recorded streams (tests/data/streams/*.json) are real renders of an assistant tool-call message, cut into the
text deltas a streaming detokenizer produces token by token:
- hermes: Qwen2.5's and Hermes-2-Pro's chat templates, tokenized with llama.cpp's qwen2 / llama-bpe vocabs;
- qwen3_coder: Qwen3-Coder's template, tokenized with the qwen35 vocab;
- mistral: mistral-common's own encoder (mistral-nemo's Tekken v3: the JSON-array form; InstructTokenizerV11 and
  V13 over the same Tekken with [ARGS]/[CALL_ID] at ranks 32/33, as in the v11+ files).
Those vocabs predate <tool_call> as a single token, so the markers arrive split over 3-4 tokens: a harder
stream than the real model's. `test_recorded_streams_are_what_the_sources_produce` re-derives every recording.
openai streams (*.jsonl, one chunk a line) are synthesized in OpenAI's wire shape.

Every stream is also fed split at every character index, one character at a time, and in random chunkings.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fetched
from ctxlock.errors import CtxlockError, ToolCallError, ToolCallTruncatedError, ToolCallValidationError
from ctxlock.generation.toolcalls import (
    TRUNCATED_MESSAGE,
    Result,
    TextDelta,
    ToolCallAssembler,
    ToolCallReady,
    ToolCallRejected,
    assemble,
    to_model,
)
from ctxlock.request import parse_request
from hypothesis_profiles import examples

STREAMS = Path(__file__).parents[1] / "data" / "streams"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather and forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "metric": {"type": "boolean"},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {
                    "type": "object",
                    "properties": {"lang": {"type": "string"}, "year": {"type": "integer"}},
                    "additionalProperties": False,
                },
                "tags": {"type": "array", "items": {"type": "string"}},
                "limit": {"type": "integer"},
                "min_score": {"type": "number"},
                "exact": {"type": "boolean"},
                "cursor": {"type": ["string", "null"]},
            },
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER, SEARCH]

MARKERS = {"hermes": "<tool_call>", "qwen3_coder": "<tool_call>", "mistral": "[TOOL_CALLS]"}


# ---------------------------------------------------------------------------------------------------------------
# Recording: how the fixtures were made (and are re-derived by the tests)


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }


PARIS = {"city": "Paris", "days": 3}
ZURICH = {"city": 'Zürich "HB" \\ 天气 🌧', "metric": True}
SEARCH_ARGS = {
    "query": 'line one\nline two <b>not a tag</b> {[("',
    "filters": {"lang": "de", "year": 2024},
    "tags": ["a", "b"],
    "limit": 5,
    "min_score": 0.5,
    "exact": False,
    "cursor": None,
}

RECORDINGS: dict[str, dict[str, Any]] = {
    "hermes_qwen25_parallel": {
        "format": "hermes",
        "template": "Qwen-Qwen2.5-7B-Instruct.jinja",
        "vocab": "qwen2",
        "message": {
            "role": "assistant",
            "content": "Let me check both cities.",
            "tool_calls": [_call("x", "get_weather", PARIS), _call("y", "get_weather", ZURICH)],
        },
    },
    "hermes_hermes2pro_three": {
        "format": "hermes",
        "template": "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        "vocab": "llama-bpe",
        # Its json_to_python_type macro recurses without end on a type list: the prompt gets the simple tool only
        # (the assistant turn, which is what is recorded, does not depend on the tools).
        "prompt_tools": ["get_weather"],
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                _call("x", "get_weather", PARIS),
                _call("y", "search_docs", {"query": "rain </tool_call> gear", "limit": 2}),
                _call("z", "get_weather", ZURICH),
            ],
        },
    },
    "qwen3_coder_parallel": {
        "format": "qwen3_coder",
        "template": "Qwen3-Coder.jinja",
        "vocab": "qwen35",
        "message": {
            "role": "assistant",
            "content": "Looking it up.",
            "tool_calls": [_call("x", "get_weather", ZURICH), _call("y", "search_docs", SEARCH_ARGS)],
        },
    },
    "mistral_nemo_v3_parallel": {
        "format": "mistral",
        "instruct": "v3",
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("a1b2c3d4e", "get_weather", PARIS), _call("f5g6h7i8j", "get_weather", ZURICH)],
        },
    },
    "mistral_v11_call_ids": {
        "format": "mistral",
        "instruct": "v11",
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("a1b2c3d4e", "get_weather", ZURICH), _call("f5g6h7i8j", "search_docs", SEARCH_ARGS)],
        },
    },
    "mistral_v13_three": {
        "format": "mistral",
        "instruct": "v13",
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                _call("a1b2c3d4e", "get_weather", PARIS),
                _call("f5g6h7i8j", "search_docs", {"query": '{[nested]} \\u0000 "quoted"'}),
                _call("k9l0m1n2o", "get_weather", ZURICH),
            ],
        },
    },
}


def _incremental_deltas(decode, ids: list[int]) -> list[str]:
    """The text deltas a streaming detokenizer sends: decode the prefix, hold a delta while it ends mid-character."""
    deltas: list[str] = []
    previous = ""
    for k in range(1, len(ids) + 1):
        text = decode(ids[:k])
        if text.endswith("\ufffd"):
            continue
        assert text.startswith(previous)
        if len(text) > len(previous):
            deltas.append(text[len(previous) :])
        previous = text
    return deltas


def _record_template(spec: dict[str, Any]) -> tuple[str, list[int], list[str]]:
    from ctxlock.artifacts import load_artifacts, load_template_file
    from ctxlock.template._render import render

    template = load_template_file(fetched.templates_dir() / spec["template"])
    user = {"role": "user", "content": "Weather in Paris and Zürich, and search the docs?"}
    tools = [t for t in TOOLS if t["function"]["name"] in spec.get("prompt_tools", ["get_weather", "search_docs"])]
    full = render(
        parse_request(json.dumps({"messages": [user, spec["message"]], "tools": tools}).encode()),
        template,
        add_generation_prompt=False,
    ).text
    prompt = render(parse_request(json.dumps({"messages": [user], "tools": tools}).encode()), template).text
    assert full.startswith(prompt)
    text = full[len(prompt) : full.rindex("<|im_end|>")]  # <|im_end|> is the stop token, never streamed as text
    tokenizer = load_artifacts(fetched.gguf_path(spec["vocab"])).tokenizer
    ids = tokenizer.encode(text, parse_special=True)
    return text, ids, _incremental_deltas(tokenizer.decode, ids)


def _mistral_instruct(version: str, tmp: Path):
    import mistral_common
    from mistral_common.tokens.tokenizers.instruct import (
        InstructTokenizerV3,
        InstructTokenizerV11,
        InstructTokenizerV13,
    )
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    source = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"  # mistral-nemo's Tekken v3
    if version == "v3":
        return InstructTokenizerV3(Tekkenizer.from_file(source))
    # The v11+ Tekken files list [ARGS] and [CALL_ID] at ranks 32 and 33; the v3 file predates them.
    data = json.loads(source.read_text(encoding="utf-8"))
    data["config"]["version"] = version
    data["special_tokens"] = [
        *(dict(t) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS),
        *({"rank": r, "token_str": f"<SPECIAL_{r}>", "is_control": True} for r in range(20, 32)),
        {"rank": 32, "token_str": "[ARGS]", "is_control": True},
        {"rank": 33, "token_str": "[CALL_ID]", "is_control": True},
    ]
    path = tmp / f"tekken_{version}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    cls = {"v11": InstructTokenizerV11, "v13": InstructTokenizerV13}[version]
    return cls(Tekkenizer.from_file(path))


def _record_mistral(spec: dict[str, Any], tmp: Path) -> tuple[str, list[int], list[str]]:
    from mistral_common.protocol.instruct.messages import AssistantMessage
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

    instruct = _mistral_instruct(spec["instruct"], tmp)
    tekken = instruct.tokenizer
    ids = instruct.encode_assistant_message(AssistantMessage(**spec["message"]), False)
    assert ids[-1] == tekken.eos_id
    ids = ids[:-1]  # </s> is the stop token, never streamed as text

    def decode(prefix: list[int]) -> str:
        return tekken.decode(prefix, special_token_policy=SpecialTokenPolicy.KEEP)

    return decode(ids), ids, _incremental_deltas(decode, ids)


def _call_spans(fmt: str, text: str, n_calls: int) -> list[tuple[int, int]]:
    """(start of the opening marker, end of the closing marker) of each call in a rendered message."""
    if fmt in ("hermes", "qwen3_coder"):
        opens = [m.start() for m in re.finditer("<tool_call>", text)]
        closes = [m.end() for m in re.finditer("</tool_call>\n?(?=<tool_call>|$)", text)]
        closes = [c - 1 if text[c - 1] == "\n" else c for c in closes]
        return list(zip(opens, closes, strict=True))
    opens = [m.start() for m in re.finditer(re.escape("[TOOL_CALLS]"), text)]
    if len(opens) == 1 and n_calls > 1:  # the JSON-array form: one span, closed by its "]"
        return [(opens[0], len(text))] * n_calls
    return list(zip(opens, [*opens[1:], len(text)], strict=True))


def record(name: str, tmp: Path) -> dict[str, Any]:
    spec = RECORDINGS[name]
    fmt = spec["format"]
    text, ids, deltas = _record_mistral(spec, tmp) if fmt == "mistral" else _record_template(spec)
    assert "".join(deltas) == text
    calls = spec["message"]["tool_calls"]
    spans = _call_spans(fmt, text, len(calls))
    outside, pos = [], 0
    for start, close in sorted(set(spans)):
        outside.append(text[pos:start])
        pos = close
    outside.append(text[pos:])
    with_ids = fmt == "mistral" and spec["instruct"] in ("v3", "v11")
    return {
        "name": name,
        "format": fmt,
        "source": {k: v for k, v in spec.items() if k not in ("format", "message")},
        "tools": TOOLS,
        "message": spec["message"],
        "text": text,
        "token_ids": ids,
        "deltas": deltas,
        "finish_reason": "stop",
        "expected": {
            "text": "".join(outside),
            "calls": [
                {
                    "index": k,
                    "id": c["id"] if with_ids else f"call{k:05d}",
                    "name": c["function"]["name"],
                    "arguments": json.loads(c["function"]["arguments"]),
                    "start": spans[k][0],
                    "close": spans[k][1],
                }
                for k, c in enumerate(calls)
            ],
        },
    }


def synthesize_openai(calls: list[dict[str, Any]], content: str, finish: str, *, piece: int = 7) -> list[dict]:
    """Chunks in OpenAI's streaming shape: role, content pieces, then per call a header fragment (id, type, name,
    empty arguments) and argument pieces; a finish chunk; and an include_usage chunk with no choices."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-ctxlock",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "synthetic",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": content[k : k + piece]}) for k in range(0, len(content), piece)]
    for i, c in enumerate(calls):
        head = {"index": i, "id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": ""}}
        out.append(chunk({"tool_calls": [head]}))
        raw = c["raw"]
        for k in range(0, len(raw), piece):
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": raw[k : k + piece]}}]}))
    if finish:
        out.append(chunk({}, finish))
    out.append({"id": "chatcmpl-ctxlock", "object": "chat.completion.chunk", "choices": [], "usage": {}})
    return out


OPENAI_CALLS = [
    {"id": "call_Ab1", "name": "get_weather", "raw": json.dumps(PARIS)},
    {"id": "call_Cd2", "name": "search_docs", "raw": json.dumps(SEARCH_ARGS, ensure_ascii=False)},
    {"id": "call_Ef3", "name": "get_weather", "raw": json.dumps(ZURICH, ensure_ascii=False)},
]


def _truncated(chunks: list[dict], keep: int, finish: str) -> list[dict]:
    """The first `keep` chunks, then a finish chunk: a stream cut off inside the last call's arguments."""
    out = chunks[:keep]
    out.append(dict(chunks[0], choices=[{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]))
    return out


def synthesize_openai_fixtures() -> dict[str, list[dict]]:
    full = synthesize_openai(OPENAI_CALLS, "I'll look those up.", "tool_calls")
    cut = (
        next(
            k
            for k, c in enumerate(full)
            if c["choices"]
            and "tool_calls" in c["choices"][0]["delta"]
            and c["choices"][0]["delta"]["tool_calls"][0]["index"] == 1
        )
        + 4
    )
    return {
        "openai_three_parallel": full,
        "openai_length_mid_arguments": _truncated(full, cut, "length"),
        # vLLM's streaming handler reported a max_tokens stop as "tool_calls" once a tool delta had gone out.
        "openai_length_reported_as_tool_calls": _truncated(full, cut, "tool_calls"),
    }


def _load_jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (STREAMS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


RECORDED = {name: json.loads((STREAMS / f"{name}.json").read_text(encoding="utf-8")) for name in RECORDINGS}


# ---------------------------------------------------------------------------------------------------------------
# Running a stream


def run(fmt: str, deltas: list[Any], finish: str | None = "stop", tools=TOOLS, **kw) -> tuple[list, Result]:
    """Feed `deltas`; return [(characters or chunks fed so far, event)] (None = released by finish) and the Result."""
    asm = ToolCallAssembler(tools, fmt, **kw)
    log: list[tuple[int | None, Any]] = []
    fed = 0
    for d in deltas:
        fed += len(d) if isinstance(d, str) else 1
        log += [(fed, e) for e in asm.feed(d)]
    result = asm.finish(finish)
    log += [(None, e) for e in result.events]
    return log, result


def check_raw(fx: dict[str, Any], chunks: list[str]) -> None:
    """Everything the acceptance asks of one raw-text stream in one chunking, in both release modes."""
    assert "".join(chunks) == fx["text"]
    early = _check_raw(fx, chunks, "early")
    log, result = run(fx["format"], chunks, fx["finish_reason"])
    # The default releases nothing from feed(): every call comes from finish(), after the normal end.
    assert [e for fed, e in log if isinstance(e, ToolCallReady)] == [
        e for fed, e in log if fed is None and isinstance(e, ToolCallReady)
    ]
    assert result.calls == early.calls and result.text == early.text and result.errors == ()
    assert result.finish_reason == "tool_calls"


def _check_raw(fx: dict[str, Any], chunks: list[str], release: str) -> Result:
    log, result = run(fx["format"], chunks, fx["finish_reason"], release=release)
    expected = fx["expected"]
    boundaries = []
    fed = 0
    for c in chunks:
        fed += len(c)
        boundaries.append(fed)
    for fed_at, event in log:
        if isinstance(event, ToolCallReady):
            close = expected["calls"][event.index]["close"]
            # Never before its closing marker was fed, and no later than the delta that completed it.
            assert fed_at is not None and fed_at >= close, (event.index, fed_at, close)
            assert fed_at == next(b for b in boundaries if b >= close)
        assert not isinstance(event, ToolCallRejected), event.error
    assert [(c.index, c.id, c.name, c.arguments) for c in result.calls] == [
        (c["index"], c["id"], c["name"], c["arguments"]) for c in expected["calls"]
    ]
    assert "".join(e.text for _, e in log if isinstance(e, TextDelta)) == expected["text"] == result.text
    assert result.errors == ()
    assert result.finish_reason == "tool_calls"
    return result


def openai_from(fx: dict[str, Any]) -> list[dict[str, Any]]:
    calls = [
        {"id": c["id"], "name": c["name"], "raw": json.dumps(c["arguments"], ensure_ascii=False)}
        for c in fx["expected"]["calls"]
    ]
    return synthesize_openai(calls, fx["expected"]["text"], "tool_calls")


def check_openai(chunks: list[dict], calls: list[dict[str, Any]], text: str) -> Result:
    early = _check_openai(chunks, calls, text, "early")
    log, result = run("openai", chunks, None)
    assert all(fed is None for fed, e in log if isinstance(e, ToolCallReady))  # the default: only from finish()
    assert result.calls == early.calls and result.text == early.text and result.finish_reason == "tool_calls"
    return result


def _check_openai(chunks: list[dict], calls: list[dict[str, Any]], text: str, release: str) -> Result:
    log, result = run("openai", chunks, None, release=release)
    firsts = {}
    for k, ch in enumerate(chunks, start=1):
        for frag in (ch["choices"][0]["delta"].get("tool_calls") or []) if ch["choices"] else []:
            firsts.setdefault(frag["index"], k)
    for fed_at, event in log:
        if isinstance(event, ToolCallReady):
            # Released exactly when the stream moves on to the next call, or by finish for the last one.
            assert fed_at == firsts.get(event.index + 1), (event.index, fed_at)
        assert not isinstance(event, ToolCallRejected), event.error
    assert [(c.index, c.id, c.name, c.arguments) for c in result.calls] == [
        (k, c["id"], c["name"], json.loads(c["raw"])) for k, c in enumerate(calls)
    ]
    assert [c.raw_arguments for c in result.calls] == [c["raw"] for c in calls]
    assert result.text == text
    assert result.finish_reason == "tool_calls" and result.ok
    return result


# ---------------------------------------------------------------------------------------------------------------
# The recordings


@pytest.mark.reference
def test_recorded_streams_are_what_the_sources_produce(tmp_path: Path) -> None:
    for name in RECORDINGS:
        assert record(name, tmp_path) == RECORDED[name], f"{name}.json is stale: re-record it"
    for name, chunks in synthesize_openai_fixtures().items():
        assert _load_jsonl(name) == chunks, name


def test_recordings_cover_every_format_and_real_marker_splits() -> None:
    assert {fx["format"] for fx in RECORDED.values()} == {"hermes", "qwen3_coder", "mistral"}
    for fx in RECORDED.values():
        marker = MARKERS[fx["format"]]
        assert len(fx["expected"]["calls"]) >= 2
        # In the recordings the markers are not single deltas: the stream splits them.
        if fx["format"] != "mistral":
            assert marker not in fx["deltas"]
    nemo = RECORDED["mistral_nemo_v3_parallel"]["text"]
    assert nemo.startswith('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}')
    assert "[CALL_ID]a1b2c3d4e[ARGS]" in RECORDED["mistral_v11_call_ids"]["text"]
    assert "[TOOL_CALLS]search_docs[ARGS]{" in RECORDED["mistral_v13_three"]["text"]


@pytest.mark.parametrize("name", list(RECORDINGS))
def test_recorded_stream_delta_by_delta(name: str) -> None:
    check_raw(RECORDED[name], RECORDED[name]["deltas"])


@pytest.mark.parametrize("name", list(RECORDINGS))
def test_recorded_stream_split_at_every_index(name: str) -> None:
    fx = RECORDED[name]
    text = fx["text"]
    for s in range(len(text) + 1):
        check_raw(fx, [text[:s], text[s:]])
    check_raw(fx, list(text))  # one character at a time


@pytest.mark.parametrize("name", list(RECORDINGS))
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_recorded_stream_random_chunkings(name: str, data: st.DataObject) -> None:
    fx = RECORDED[name]
    text = fx["text"]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=40)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    check_raw(fx, chunks)


@pytest.mark.parametrize("name", list(RECORDINGS))
def test_the_same_calls_as_openai_chunks(name: str) -> None:
    fx = RECORDED[name]
    chunks = openai_from(fx)
    calls = [
        {"id": c["id"], "name": c["name"], "raw": json.dumps(c["arguments"], ensure_ascii=False)}
        for c in fx["expected"]["calls"]
    ]
    check_openai(chunks, calls, fx["expected"]["text"])


@pytest.mark.parametrize("name", list(RECORDINGS))
def test_length_anywhere_releases_nothing_pending(name: str) -> None:
    fx = RECORDED[name]
    text, calls = fx["text"], fx["expected"]["calls"]
    marker = MARKERS[fx["format"]]
    for cut in range(len(text) + 1):
        pending = [c["index"] for c in calls if c["start"] + len(marker) <= cut < c["close"]]
        closed = [c["index"] for c in calls if c["close"] <= cut]
        # The default: nothing at all from a cut-off response, each complete call answered as not executed.
        log, result = run(fx["format"], [text[:cut]], "length")
        assert result.calls == () and not any(isinstance(e, ToolCallReady) for _, e in log)
        assert result.finish_reason == "length" == result.stream_finish_reason
        assert all(type(e) is ToolCallTruncatedError and "nothing was executed" in e.hint for e in result.errors)
        withheld = [e for e in result.errors if "was not executed" in e.message]
        assert [e.index for e in withheld] == closed
        cut_errors = [e for e in result.errors if e not in withheld]
        # release="early": calls that closed before the cut were handed out from feed(), and the hint says so.
        log, early = run(fx["format"], [text[:cut]], "length", release="early")
        assert [c.index for c in early.calls] == closed
        assert early.finish_reason == "length" == early.stream_finish_reason
        assert not any(isinstance(e, ToolCallReady) for fed, e in log if fed is None)
        for errors in (cut_errors, list(early.errors)):
            if pending:
                (err,) = errors
                assert type(err) is ToolCallTruncatedError
                assert err.message.startswith(TRUNCATED_MESSAGE)
                assert f"tool_calls[{pending[0]}]" in err.message and err.path == f"tool_calls[{pending[0]}]"
                # The JSON-array form names the objects it had opened so far (at least the first).
                assert err.pending[0] == pending[0] and set(err.pending) <= set(pending)
            else:
                assert errors == []
        if pending and closed:
            assert "nothing was executed" not in early.errors[0].hint and "may have run" in early.errors[0].hint


# ---------------------------------------------------------------------------------------------------------------
# openai chunks


def test_openai_three_parallel_fixture() -> None:
    chunks = _load_jsonl("openai_three_parallel")
    result = check_openai(chunks, OPENAI_CALLS, "I'll look those up.")
    assert [c.id for c in result.calls] == ["call_Ab1", "call_Cd2", "call_Ef3"]
    assert result.to_message()["tool_calls"][1] == {
        "id": "call_Cd2",
        "type": "function",
        "function": {"name": "search_docs", "arguments": OPENAI_CALLS[1]["raw"]},
    }


def test_openai_arguments_split_at_every_index() -> None:
    for call in OPENAI_CALLS:
        raw = call["raw"]
        for s in range(len(raw) + 1):
            pieces = [p for p in (raw[:s], raw[s:]) if p]
            chunks = synthesize_openai([dict(call, raw="")], "", "tool_calls")
            frags = [
                {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": p}}]}}]}
                for p in pieces
            ]
            chunks = chunks[:2] + frags + chunks[2:]
            check_openai(chunks, [call], "")
        # every character its own fragment
        chunks = synthesize_openai([call], "", "tool_calls", piece=1)
        check_openai(chunks, [call], "")


@settings(max_examples=examples(60), deadline=None)
@given(data=st.data())
def test_openai_random_fragmentations(data: st.DataObject) -> None:
    chunks = synthesize_openai([], "I'll look those up.", "")[:-1]
    for i, call in enumerate(OPENAI_CALLS):
        raw = call["raw"]
        cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12)))
        pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
        # the header fragment may already carry the first piece of the arguments
        head = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": pieces[0]},
        }
        chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [head]}}]})
        chunks += [
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": p}}]}}]}
            for p in pieces[1:]
        ]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    check_openai(chunks, OPENAI_CALLS, "I'll look those up.")


def test_openai_length_mid_arguments() -> None:
    log, result = run("openai", _load_jsonl("openai_length_mid_arguments"), None)
    assert result.stream_finish_reason == "length" == result.finish_reason
    assert result.calls == () and not any(isinstance(e, ToolCallReady) for _, e in log)
    held, err = result.errors  # call 0 was complete (the stream had moved past it) but is not released
    assert type(held) is ToolCallTruncatedError and held.path == "tool_calls[0]" and held.call_id == "call_Ab1"
    assert type(err) is ToolCallTruncatedError and err.path == "tool_calls[1]"
    assert err.message == f"{TRUNCATED_MESSAGE} (pending: tool_calls[1])"
    log, early = run("openai", _load_jsonl("openai_length_mid_arguments"), None, release="early")
    assert [c.index for c in early.calls] == [0]  # released from feed() when the stream moved past it
    assert not any(isinstance(e, ToolCallReady) for fed, e in log if fed is None)


def test_a_truncated_call_can_be_answered_by_id() -> None:
    _, result = run("openai", _load_jsonl("openai_length_mid_arguments"), None)
    assert to_model(result.errors[0])["tool_call_id"] == "call_Ab1"  # the withheld complete call
    message = to_model(result.errors[1])
    assert message["tool_call_id"] == "call_Cd2" and message["name"] == "search_docs"
    body = json.loads(message["content"])
    assert body["type"] == "ToolCallTruncatedError" and body["path"] == "tool_calls[1]"
    assert body["message"].startswith(TRUNCATED_MESSAGE)


def test_openai_length_reported_as_tool_calls_is_caught() -> None:
    """vLLM's streaming path once rewrote a max_tokens stop to "tool_calls": the arguments end mid-JSON."""
    _, result = run("openai", _load_jsonl("openai_length_reported_as_tool_calls"), None)
    assert result.stream_finish_reason == "tool_calls"
    assert result.finish_reason == "stop"  # not "tool_calls": there is a failed call
    # The response was cut off whatever its finish reason says: call 0 is not released either.
    assert result.calls == ()
    held, err = result.errors
    assert isinstance(held, ToolCallTruncatedError) and held.path == "tool_calls[0]"
    assert "ends mid-JSON" in held.message
    assert isinstance(err, ToolCallTruncatedError) and err.path == "tool_calls[1].arguments"
    assert TRUNCATED_MESSAGE in err.message
    _, early = run("openai", _load_jsonl("openai_length_reported_as_tool_calls"), None, release="early")
    assert [c.index for c in early.calls] == [0] and len(early.errors) == 1


def test_openai_finish_reasons() -> None:
    chunks = synthesize_openai(OPENAI_CALLS[:1], "", "")
    for reason, released, mapped in [
        ("tool_calls", 1, "tool_calls"),
        ("stop", 1, "tool_calls"),
        ("length", 0, "length"),
        ("content_filter", 0, "content_filter"),
    ]:
        _, result = run("openai", chunks, reason)
        assert len(result.calls) == released and result.finish_reason == mapped, reason
        assert result.ok == bool(released)
    _, result = run("openai", synthesize_openai([], "just text", "stop"), None)
    assert result.finish_reason == "stop" and result.text == "just text" and result.ok
    # The finish chunk's reason is the default; an explicit one wins.
    _, result = run("openai", synthesize_openai(OPENAI_CALLS[:1], "", "length"), None)
    assert result.finish_reason == "length" and not result.calls


def test_openai_reused_index_with_new_id_is_a_new_call() -> None:
    frag = lambda cid, name, args: {  # noqa: E731
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "id": cid, "function": {"name": name, "arguments": args}}]},
            }
        ]
    }
    chunks = [frag("c1", "get_weather", '{"city": "Oslo"}'), frag("c2", "get_weather", '{"city": "Rome"}')]
    _, result = run("openai", chunks, "tool_calls")
    assert [(c.index, c.id, c.arguments["city"]) for c in result.calls] == [(0, "c1", "Oslo"), (1, "c2", "Rome")]


def test_openai_interleaved_fragments_are_an_error() -> None:
    def frag(i: int, args: str, **extra: Any) -> dict:
        return {
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": args}, **extra}]}}]
        }

    chunks = [
        frag(0, '{"city": ', id="a", type="function", function={"name": "get_weather", "arguments": '{"city": '}),
        frag(1, '{"city": "Rome"}', id="b", function={"name": "get_weather", "arguments": '{"city": "Rome"}'}),
        frag(0, '"Oslo"}'),
        frag(0, " "),
    ]
    _, result = run("openai", chunks, "tool_calls")
    assert [c.id for c in result.calls] == ["b"]
    assert [e.path for e in result.errors] == ["tool_calls[0].arguments", "chunks[2].choices[0].delta.tool_calls[0]"]
    assert "not valid JSON" in result.errors[0].message
    assert "moved past" in result.errors[1].message


def test_openai_other_choices_usage_chunks_and_sdk_objects() -> None:
    class Chunk:  # the openai SDK's ChatCompletionChunk has model_dump()
        def __init__(self, data: dict) -> None:
            self.data = data

        def model_dump(self, exclude_none: bool = False) -> dict:
            return self.data

    chunks = synthesize_openai(OPENAI_CALLS[:1], "hi", "tool_calls")
    other = {"choices": [{"index": 1, "delta": {"content": "other choice"}}]}
    _, result = run("openai", [Chunk(c) for c in chunks[:2]] + [other] + chunks[2:], None)
    assert result.text == "hi" and [c.id for c in result.calls] == ["call_Ab1"]


@pytest.mark.parametrize(
    ("chunk", "path"),
    [
        ("not a chunk", "chunks[0]"),
        ({"choices": {"index": 0}}, "chunks[0].choices"),
        (
            {"choices": [{"delta": {"tool_calls": [{"function": {}}]}}]},
            "chunks[0].choices[0].delta.tool_calls[0].index",
        ),
        ({"choices": [{"delta": {"tool_calls": [{"index": "0"}]}}]}, "chunks[0].choices[0].delta.tool_calls[0]"),
    ],
)
def test_openai_malformed_chunks_raise_with_a_path(chunk: Any, path: str) -> None:
    with pytest.raises(ToolCallError) as info:
        ToolCallAssembler(TOOLS, "openai").feed(chunk)
    assert info.value.path == path


# ---------------------------------------------------------------------------------------------------------------
# Errors the model can cause


def test_validation_error_names_the_field_and_goes_back_to_the_model() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": 7, "days": 99}}\n</tool_call>'
    log, result = run("hermes", list(text))
    assert result.calls == () and result.finish_reason == "stop"
    (err,) = result.errors
    assert type(err) is ToolCallValidationError and isinstance(err, CtxlockError)
    assert err.path == "tool_calls[0].arguments.city"
    assert "7 is not of type 'string'" in err.message and "(and 1 more)" in err.message
    assert [v["path"] for v in err.violations] == ["tool_calls[0].arguments.city", "tool_calls[0].arguments.days"]
    assert "99 is greater than the maximum of 14" in err.violations[1]["message"]
    (rejected,) = [e for _, e in log if isinstance(e, ToolCallRejected)]
    assert rejected.index == 0 and rejected.id == "call00000" and rejected.error is err
    message = to_model(err)
    assert message["role"] == "tool" and message["tool_call_id"] == "call00000" and message["name"] == "get_weather"
    body = json.loads(message["content"])
    assert body["type"] == "ToolCallValidationError" and body["path"] == "tool_calls[0].arguments.city"
    assert body["violations"] == list(err.violations)


@pytest.mark.parametrize(
    ("fmt", "text", "path", "needle"),
    [
        (
            "hermes",
            '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>',
            "tool_calls[0].arguments.city",
            "'city' is a required property",
        ),
        (
            "hermes",
            '<tool_call>{"name": "get_weather", "arguments": {"city": "x", "wind": 1}}</tool_call>',
            "tool_calls[0].arguments.wind",
            "'wind' was unexpected",
        ),
        (
            "qwen3_coder",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
            "<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
            "tool_calls[0].arguments.days",
            "'three' is not of type 'integer'",
        ),
        (
            "qwen3_coder",
            "<tool_call>\n<function=search_docs>\n<parameter=query>\nq\n</parameter>\n"
            '<parameter=filters>\n{"lang": 5}\n</parameter>\n</function>\n</tool_call>',
            "tool_calls[0].arguments.filters.lang",
            "5 is not of type 'string'",
        ),
        (
            "mistral",
            '[TOOL_CALLS]get_weather[ARGS]{"city": ["Oslo"]}',
            "tool_calls[0].arguments.city",
            "['Oslo'] is not of type 'string'",
        ),
        (
            "mistral",
            '[TOOL_CALLS][{"name": "search_docs", "arguments": {"query": "q", "tags": [1]}}]',
            "tool_calls[0].arguments.tags[0]",
            "1 is not of type 'string'",
        ),
    ],
)
def test_validation_errors_in_every_format(fmt: str, text: str, path: str, needle: str) -> None:
    _, result = run(fmt, list(text))
    (err,) = result.errors
    assert type(err) is ToolCallValidationError and err.path == path and needle in err.message
    assert result.calls == () and result.finish_reason == "stop"


@pytest.mark.parametrize(
    ("fmt", "text", "path", "needle"),
    [
        (
            "hermes",
            '<tool_call>{"name": "launch", "arguments": {}}</tool_call>',
            "tool_calls[0].name",
            "unknown tool 'launch'",
        ),
        (
            "hermes",
            '<tool_call>{"name": "get_weather", "arguments": {"city": "x"}</tool_call>',
            "tool_calls[0]",
            "not valid JSON",
        ),
        ("hermes", '<tool_call>{"name": "get_weather"}</tool_call>', "tool_calls[0].arguments", 'no "arguments"'),
        (
            "hermes",
            '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
            "tool_calls[0].arguments",
            "must be a JSON object",
        ),
        (
            "qwen3_coder",
            "<tool_call>\n<parameter=city>\nx\n</parameter>\n</tool_call>",
            "tool_calls[0].name",
            "expected <function=NAME>",
        ),
        (
            "qwen3_coder",
            "<tool_call>\n<function=nope>\n</function>\n</tool_call>",
            "tool_calls[0].name",
            "unknown tool 'nope'",
        ),
        ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "x",}', "tool_calls[0].arguments", "not valid JSON"),
        ("mistral", "[TOOL_CALLS]get_weather[ARGS]42", "tool_calls[0]", "expected a JSON object after [ARGS]"),
        (
            "mistral",
            '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "x"}}, 7]',
            "tool_calls[1]",
            "must be a JSON object",
        ),
    ],
)
def test_call_errors_name_their_path(fmt: str, text: str, path: str, needle: str) -> None:
    _, result = run(fmt, list(text))
    err = result.errors[-1]
    assert type(err) is ToolCallError and err.path == path and needle in err.message, (err.path, err.message)
    assert result.finish_reason == "stop"


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("hermes", 'ok <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'),
        ("hermes", 'ok <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_'),
        ("qwen3_coder", "ok <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"),
        ("mistral", 'ok [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"'),
        ("mistral", 'ok [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "x"'),
        ("mistral", "ok [TOOL_CALLS]get_wea"),
    ],
)
def test_unterminated_call_at_stop_is_an_error_never_a_release(fmt: str, text: str) -> None:
    for chunks in ([text], list(text)):
        log, result = run(fmt, chunks, "stop")
        assert result.calls == () and not any(isinstance(e, ToolCallReady) for _, e in log)
        (err,) = result.errors
        assert type(err) is ToolCallError and err.path == "tool_calls[0]"
        assert "finish_reason='stop'" in err.message and "not released" in err.message
        assert result.text == "ok " and result.finish_reason == "stop"
        _, truncated = run(fmt, chunks, "length")
        assert type(truncated.errors[0]) is ToolCallTruncatedError and truncated.finish_reason == "length"
    if text.endswith('{"name": "x"'):
        assert truncated.errors[0].pending == (0, 1)  # both objects the array had opened


def test_one_bad_call_does_not_hold_back_the_good_ones() -> None:
    text = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": {"city": 1}}</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "C"}}</tool_call>'
    )
    for release, order in [
        ("early", ["ToolCallReady", "ToolCallRejected", "ToolCallReady"]),
        ("finish", ["ToolCallRejected", "ToolCallReady", "ToolCallReady"]),  # rejected at once, released at the end
    ]:
        log, result = run("hermes", list(text), release=release)
        assert [(c.index, c.id) for c in result.calls] == [(0, "call00000"), (2, "call00002")]
        assert [e.path for e in result.errors] == ["tool_calls[1].arguments.city"]
        assert result.finish_reason == "stop"  # a call failed: not "tool_calls"
        assert [type(e).__name__ for _, e in log] == order


# ---------------------------------------------------------------------------------------------------------------
# Text outside calls


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "mistral"])
def test_text_is_released_as_soon_as_it_cannot_be_a_marker(fmt: str) -> None:
    marker = MARKERS[fmt]
    text = f"a{marker[:-1]}b {marker[:3]}<{marker[0]}{marker[:5]}x 天气 🌧 {marker[:2]}"
    emitted = ""
    asm = ToolCallAssembler(TOOLS, fmt)
    for k, ch in enumerate(text, start=1):
        emitted += "".join(e.text for e in asm.feed(ch))
        fed = text[:k]
        held = next(fed[j:] for j in range(len(fed) + 1) if marker.startswith(fed[j:]))  # longest marker prefix
        assert emitted == fed[: len(fed) - len(held)]
    result = asm.finish("stop")
    assert emitted + "".join(e.text for e in result.events) == text == result.text
    assert result.calls == () and result.ok and result.finish_reason == "stop"


def test_hermes_close_marker_inside_a_json_string_is_text() -> None:
    fx = RECORDED["hermes_hermes2pro_three"]
    assert fx["expected"]["calls"][1]["arguments"]["query"] == "rain </tool_call> gear"
    text = '<tool_call>{"name": "search_docs", "arguments": {"query": "a \\" </tool_call> b"}}</tool_call>'
    for s in range(len(text) + 1):
        _, result = run("hermes", [text[:s], text[s:]])
        assert [c.arguments for c in result.calls] == [{"query": 'a " </tool_call> b'}]


# ---------------------------------------------------------------------------------------------------------------
# qwen3_coder: parameter text -> schema type


INVALID = object()


@pytest.mark.parametrize(
    ("schema", "text", "value"),
    [
        ({"type": "string"}, "42", "42"),
        ({"type": "string"}, "null", "null"),
        ({"type": "integer"}, "42", 42),
        ({"type": "integer"}, " 42 ", 42),
        ({"type": "integer"}, "4.5", INVALID),  # stays text, so validation names it
        ({"type": "number"}, "4.5", 4.5),
        ({"type": "number"}, "-1e3", -1000.0),
        ({"type": "boolean"}, "True", True),
        ({"type": "boolean"}, "false", False),
        ({"type": "boolean"}, "yes", INVALID),
        ({"type": "object"}, '{"a": [1, 2]}', {"a": [1, 2]}),
        ({"type": "object"}, "{'a': True}", {"a": True}),  # a Python literal, as models sometimes write
        ({"type": "array"}, '[1, "x"]', [1, "x"]),
        ({"type": "array"}, '{"a": 1}', INVALID),
        ({"type": ["integer", "null"]}, "None", None),
        ({"type": ["string", "null"]}, "null", None),
        ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "7", 7),
        ({"enum": [1, 2]}, "2", 2),
        ({}, '{"untyped": 1}', '{"untyped": 1}'),
        (None, "undeclared", "undeclared"),
    ],
)
def test_qwen3_coder_parameter_conversion(schema: Any, text: str, value: Any) -> None:
    props = {} if schema is None else {"p": schema}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": props}}}
    stream = f"<tool_call>\n<function=f>\n<parameter=p>\n{text}\n</parameter>\n</function>\n</tool_call>"
    result = assemble([tool], "qwen3_coder", [stream], "stop")
    if value is INVALID:
        (err,) = result.errors
        assert type(err) is ToolCallValidationError and err.path == "tool_calls[0].arguments.p"
        assert f"{text!r} is not of type" in err.message
        return
    (call,) = result.calls
    assert call.arguments == {"p": value} and type(call.arguments["p"]) is type(value)


def test_qwen3_coder_tolerates_missing_parameter_close() -> None:
    stream = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</function>\n</tool_call>"
    )
    (call,) = assemble(TOOLS, "qwen3_coder", [stream], "stop").calls
    assert call.arguments == {"city": "Oslo", "days": 2}


# ---------------------------------------------------------------------------------------------------------------
# Tools


def test_tools_from_a_parsed_request() -> None:
    request = parse_request(json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}).encode())
    assert ToolCallAssembler(request, "hermes").tool_names == ("get_weather", "search_docs")
    assert ToolCallAssembler(request.tools, "hermes").tool_names == ("get_weather", "search_docs")  # FrozenDicts
    anthropic = {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
    }
    asm = ToolCallAssembler(parse_request(json.dumps(anthropic).encode()), "mistral")
    assert asm.tool_names == ("get_weather",)


@pytest.mark.parametrize(
    ("tools", "path"),
    [
        (
            [WEATHER, {"type": "function", "function": {"name": "bad", "parameters": {"type": "objx"}}}],
            "tools[1].function.parameters.type",
        ),
        (
            [{"type": "function", "function": {"name": "bad", "parameters": {"properties": {"a": {"minimum": "0"}}}}}],
            "tools[0].function.parameters.properties.a.minimum",
        ),
        (
            [{"type": "function", "function": {"name": "bad", "parameters": {"$schema": "https://example.com/x"}}}],
            "tools[0].function.parameters.$schema",
        ),
        ([{"type": "function", "function": {"name": "bad", "parameters": []}}], "tools[0].function.parameters"),
        ([WEATHER, WEATHER], "tools[1].function.name"),
        ([{"type": "retrieval"}], "tools[0]"),
        ({"type": "function"}, "tools"),
    ],
)
def test_bad_tools_are_rejected_at_construction(tools: Any, path: str) -> None:
    with pytest.raises(ToolCallError) as info:
        ToolCallAssembler(tools, "openai")
    assert info.value.path == path


def test_schema_dialect_follows_dollar_schema() -> None:
    # Draft 4's boolean exclusiveMaximum is a schema error under 2020-12, the default.
    params = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3, "exclusiveMaximum": True}}}
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", **params}
    with pytest.raises(ToolCallError) as info:
        ToolCallAssembler([{"type": "function", "function": {"name": "f", "parameters": params}}], "hermes")
    assert info.value.path == "tools[0].function.parameters.properties.n.exclusiveMaximum"
    tool = {"type": "function", "function": {"name": "f", "parameters": draft4}}
    result = assemble([tool], "hermes", ['<tool_call>{"name": "f", "arguments": {"n": 3}}</tool_call>'], "stop")
    assert result.errors[0].path == "tool_calls[0].arguments.n"
    assert "less than" in result.errors[0].message or "maximum" in result.errors[0].message


def test_unknown_format_and_misuse() -> None:
    with pytest.raises(ToolCallError) as info:
        ToolCallAssembler(TOOLS, "smoke_signals")
    assert info.value.path == "format"
    asm = ToolCallAssembler(TOOLS, "hermes")
    with pytest.raises(ToolCallError):
        asm.feed({"not": "text"})
    asm.finish("stop")
    with pytest.raises(ToolCallError):
        asm.feed("late")
    with pytest.raises(ToolCallError):
        asm.finish("stop")


def test_custom_ids() -> None:
    text = RECORDED["hermes_qwen25_parallel"]["text"]
    result = assemble(TOOLS, "hermes", [text], "stop", make_id=lambda i: f"turn3_{i}")
    assert [c.id for c in result.calls] == ["turn3_0", "turn3_1"]


# ---------------------------------------------------------------------------------------------------------------
# Cost


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "mistral", "openai", "anthropic", "harmony"])
def test_cost_is_linear_in_stream_length(fmt: str) -> None:
    """A 2 MB argument in 16-character deltas: re-scanning the buffer per delta would take minutes, not seconds."""
    big = 'x\\"{[' * 400_000
    if fmt == "hermes":
        stream = '<tool_call>{"name": "search_docs", "arguments": {"query": "' + big + '"}}</tool_call>'
    elif fmt == "qwen3_coder":
        stream = (
            "<tool_call>\n<function=search_docs>\n<parameter=query>\n"
            + big
            + "\n</parameter>\n</function>\n</tool_call>"
        )
    elif fmt == "mistral":
        stream = '[TOOL_CALLS]search_docs[ARGS]{"query": "' + big + '"}'
    elif fmt == "harmony":
        stream = (
            '<|channel|>commentary to=functions.search_docs <|constrain|>json<|message|>{"query": "'
            + big
            + '"}<|call|>'
        )
    else:
        stream = json.dumps({"query": big})
    if fmt == "anthropic":  # the SSE body: input_json_delta events of 64 characters, the body fed 16 at a time
        events = [
            {"type": "message_start", "message": {"id": "m"}},
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "t", "name": "search_docs", "input": {}},
            },
            *(
                {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": p}}
                for p in (stream[k : k + 64] for k in range(0, len(stream), 64))
            ),
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
            {"type": "message_stop"},
        ]
        stream = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    pieces = [stream[k : k + 16] for k in range(0, len(stream), 16)]
    if fmt == "openai":
        head = {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c",
                                "type": "function",
                                "function": {"name": "search_docs", "arguments": ""},
                            }
                        ]
                    },
                }
            ]
        }
        pieces = [head] + [
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": p}}]}}]}
            for p in pieces
        ]
    start = time.thread_time()
    result = assemble(TOOLS, fmt, pieces, None if fmt == "anthropic" else "stop")
    elapsed = time.thread_time() - start
    (call,) = result.calls
    expected = json.loads(f'"{big}"') if fmt in ("hermes", "mistral", "harmony") else big
    assert call.arguments["query"] == expected
    assert elapsed < 20, elapsed
