"""Hostile input to the closed-provider counts, `ctxlock calibrate` and `import --otel`: every failure a typed error
naming the input, every count's ranges consistent, no zero for a real image, no hang on a FIFO, and a fit that is
degenerate or absurd refused instead of written (docs/closed-providers.md, docs/telemetry.md)."""

from __future__ import annotations

import base64
import json
import math
import os
import struct
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_runner import run_main
from ctxlock.errors import CalibrationError, CtxlockError, TelemetryError
from ctxlock.providers import (
    anthropic_image,
    count_provider,
    fit,
    load_calibration,
    log_rows,
    openai_image,
    openai_patches,
    read_calibration,
)
from ctxlock.telemetry import read_traces

MODEL = "claude-sonnet-4-5"
SIDES = st.integers(min_value=1, max_value=2**31 - 1)
IMAGE_MODELS = ("gpt-4o", "gpt-4o-mini", "gpt-4.1-mini", "gpt-4.1-nano", "o4-mini", "gpt-5", "o3", "gpt-unknown")


# -- images


@settings(max_examples=150, deadline=None)
@given(w=SIDES | st.integers(1, 5000), h=SIDES | st.integers(1, 5000), model=st.sampled_from(IMAGE_MODELS))
def test_a_real_image_never_costs_nothing(w: int, h: int, model: str) -> None:
    for detail in ("low", "high", "auto"):
        it = openai_image(model, w, h, detail)
        assert 0 < it.low <= it.tokens <= it.high, (model, w, h, detail, it)
    assert 1 <= openai_patches(w, h) <= 1536
    it = anthropic_image(w, h)
    assert 1 <= it.low <= it.tokens <= it.high, (w, h, it)
    # A count without the image's bytes spans every size: a known size's range lies inside it.
    for model in IMAGE_MODELS:
        for detail in ("low", "high", "auto"):
            known, unknown = openai_image(model, w, h, detail), openai_image(model, 0, 0, detail)
            assert unknown.low <= known.low and known.high <= unknown.high, (model, w, h, detail)
    unknown = anthropic_image(0, 0)
    assert unknown.low <= it.low and it.high <= unknown.high


def test_extreme_aspect_ratios_cost_at_least_a_patch_per_side() -> None:
    # 100000 x 1 covers 3125 patches; scaled to 1536 at most, a 1 px side still needs one row of patches.
    for w, h in ((100000, 1), (1, 100000), (2**31 - 1, 1), (50000, 3)):
        n = openai_patches(w, h)
        assert 0 < n <= 1536, (w, h, n)
        assert openai_image("gpt-4.1-mini", w, h, "auto").tokens == math.ceil(n * 1.62 - 1e-9)


# -- calibration files


def _cal(**fields: object) -> dict:
    base: dict = {
        "format": "ctxlock-calibration/1",
        "provider": "anthropic",
        "model": MODEL,
        "factors": {"text": 1.1, "framing": 1.5},
        "unfitted": [],
        "fitted_on": 40,
        "held_back": {"requests": 10, "mean_abs_pct": 1.0, "p95_pct": 2.0, "max_pct": 3.0},
    }
    base.update(fields)
    return base


FORGED = [
    {"unfitted": "text"},
    {"unfitted": [1, 2]},
    {"provider": {"a": 1}},
    {"provider": "bard"},
    {"model": ""},
    {"model": 5},
    {"factors": {"text": True}},
    {"factors": {"text": -1}},
    {"factors": {"text": 1e7}},
    {"fitted_on": "12"},
    {"fitted_on": -5},
    {"fitted_on": 1.5},
    {"fitted_on": 10**30},
    {"held_back": {"requests": 1e300, "mean_abs_pct": 1, "p95_pct": 2, "max_pct": 3}},
    {"held_back": {"requests": "2", "mean_abs_pct": 1, "p95_pct": 2, "max_pct": 3}},
    {"held_back": {"requests": 2, "mean_abs_pct": "1", "p95_pct": 2, "max_pct": 3}},
    {"held_back": {"requests": 2, "mean_abs_pct": 1, "p95_pct": -2, "max_pct": 3}},
    {"held_back": {"requests": 2, "mean_abs_pct": 1, "p95_pct": 1e308, "max_pct": 3}},
    {"held_back": [1, 2]},
]


@pytest.mark.parametrize("fields", FORGED, ids=[next(iter(f)) + str(i) for i, f in enumerate(FORGED)])
def test_a_forged_calibration_file_is_refused_naming_the_field(fields: dict) -> None:
    with pytest.raises(CalibrationError) as info:
        read_calibration(json.dumps(_cal(**fields)).encode(), "cal.json")
    assert (info.value.path or "").startswith("cal.json") and info.value.hint


def test_a_non_finite_or_huge_number_in_a_calibration_file_is_a_typed_error() -> None:
    for literal in (b"NaN", b"Infinity", b"1e999", b"9" * 5000):
        raw = json.dumps(_cal(fitted_on=0)).encode().replace(b'"fitted_on": 0', b'"fitted_on": ' + literal)
        with pytest.raises(CalibrationError):
            read_calibration(raw, "cal.json")


@settings(max_examples=60, deadline=None)
@given(p95=st.floats(min_value=0, max_value=10_000), factor=st.floats(min_value=0.05, max_value=20))
def test_a_calibrated_range_never_goes_below_zero(p95: float, factor: float) -> None:
    held = {"requests": 10, "mean_abs_pct": 1.0, "p95_pct": p95, "max_pct": p95}
    cal = read_calibration(json.dumps(_cal(held_back=held, factors={"text": factor})).encode(), "cal.json")
    counted = count_provider(
        {"messages": [{"role": "user", "content": "a few words of text"}]},
        provider="anthropic",
        model=MODEL,
        calibration=cal,
    )
    for p in counted.parts:
        assert 0 <= p.low <= p.tokens <= p.high, p
    assert (counted.low, counted.high) == (sum(p.low for p in counted.parts), sum(p.high for p in counted.parts))


def test_a_calibration_file_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "cal.fifo"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_calibration(fifo)
            outcome.append(None)
        except BaseException as e:  # handed to the test thread
            outcome.append(e)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # unblock the reader so the test process can end
        with open(fifo, "wb"):
            pass
        reader.join(5)
        pytest.fail("load_calibration blocked on a FIFO")
    assert isinstance(outcome[0], CalibrationError) and "FIFO" in str(outcome[0])
    for path in (tmp_path, Path("/dev/zero"), tmp_path / "missing.json"):
        with pytest.raises(CalibrationError) as info:
            load_calibration(path)
        assert info.value.path == str(path)
    status, _, stderr = run_main(
        ["count", "-", "--provider", "anthropic", "--model", MODEL, "--calibration", str(fifo)],
        stdin=b'{"messages": [{"role": "user", "content": "hi"}]}',
    )
    assert status == 1 and stderr.count("\n") == 1 and "FIFO" in stderr


# -- usage logs


def _line(text: str, reported: int) -> bytes:
    request = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    return json.dumps({"request": request, "usage": {"input_tokens": reported, "output_tokens": 1}}).encode()


def _fit(lines: list[bytes]) -> object:
    rows, model = log_rows(
        [(f"log.jsonl:{i}", line) for i, line in enumerate(lines, 1)], provider="anthropic", model=None
    )
    cal = fit(rows, provider="anthropic", model=model)
    return read_calibration(cal.file_bytes(), "cal.json")  # what calibrate writes reads back


def test_a_line_reporting_zero_input_tokens_is_refused_naming_it() -> None:
    lines = [_line("hello world " * i, 10 + 3 * i) for i in range(1, 13)]
    lines[6] = _line("hello", 0)
    with pytest.raises(CalibrationError) as info:
        _fit(lines)
    assert (info.value.path or "").startswith("log.jsonl:7 $.usage")


@pytest.mark.parametrize("reported", [10**12, 10**300, 10**4000], ids=["1e12", "1e300", "1e4000"])
def test_an_absurd_reported_count_is_refused_naming_the_line(reported: int) -> None:
    lines = [_line("hello world " * i, 10 + 3 * i) for i in range(1, 13)]
    lines[3] = _line("hello", reported)
    with pytest.raises(CalibrationError) as info:
        _fit(lines)
    assert (info.value.path or "").startswith("log.jsonl:4 $.usage")


@pytest.mark.parametrize(
    "lines",
    [
        # every request the same: the kinds cannot be told apart
        [_line("x", 12)] * 12,
        # the provider reports far less than ctxlock's fixed parts: a kind's factor would be clipped to 0
        [_line("hello world " * i, 1) for i in range(1, 13)],
        # far more: factors of millions
        [_line("hello world " * (i % 3 + 1) + "x" * i, 10**9 + i) for i in range(1, 13)],
    ],
    ids=["collinear", "below", "above"],
)
def test_a_degenerate_fit_is_refused_before_a_file_is_written(lines: list[bytes], tmp_path: Path) -> None:
    with pytest.raises(CalibrationError) as info:
        _fit(lines)
    assert info.value.hint
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"\n".join(lines))
    out = tmp_path / "cal.json"
    status, _, stderr = run_main(["calibrate", str(log), "--provider", "anthropic", "--out", str(out)])
    assert status == 1 and stderr.count("\n") == 1 and "CalibrationError" in stderr
    assert not out.exists()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    reported=st.lists(st.integers(min_value=-5, max_value=2**70), min_size=10, max_size=14),
    words=st.lists(st.integers(min_value=0, max_value=40), min_size=14, max_size=14),
)
def test_any_reported_counts_give_a_sane_file_or_a_typed_error(reported: list[int], words: list[int]) -> None:
    lines = [_line("word " * w, r) for w, r in zip(words, reported, strict=False)]
    try:
        cal = _fit(lines)
    except CtxlockError as e:
        assert isinstance(e, CalibrationError)
        return
    assert all(math.isfinite(v) and 0 < v < 1e6 for v in cal.factors.values())  # type: ignore[attr-defined]


# -- count --provider CLI


def test_an_unknown_format_with_a_provider_is_refused() -> None:
    request = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
    status, stdout, _ = run_main(["count", "-", "--provider", "openai", "--format", "xml"], stdin=request)
    # --format asks for JSON: the error is JSON on stdout, as the model path gives it (`guarded`).
    assert status == 1 and json.loads(stdout)["error"]["type"] == "OptionError" and "xml" in stdout


# -- import --otel


def _span(start: object = "1", **attrs: dict) -> dict:
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}])
    base = {"gen_ai.operation.name": {"stringValue": "chat"}, "gen_ai.input.messages": {"stringValue": messages}}
    base.update(attrs)
    span = {
        "traceId": "ab",
        "startTimeUnixNano": start,
        "attributes": [{"key": k, "value": v} for k, v in base.items()],
    }
    return {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}


@pytest.mark.parametrize("bad", ["--5", "-", "+5", "0x10", "5 ", "１２", "-" * 20 + "1"])
def test_a_malformed_otlp_integer_is_a_telemetry_error(bad: str) -> None:
    for doc in (_span(start=bad), _span(**{"gen_ai.usage.input_tokens": {"intValue": bad}})):
        with pytest.raises(TelemetryError) as info:
            read_traces(json.dumps(doc).encode(), "t.json")
        assert (info.value.path or "").startswith("t.json $.resourceSpans[0]")


def test_langfuse_turns_with_time_zones_are_in_time_order() -> None:
    # 10:00 at +05:00 is 05:00 UTC: before 06:00 UTC, though it sorts after it as text.
    stamps = ["2024-01-01T06:00:00+00:00", "2024-01-01T10:00:00+05:00", "2024-01-01T04:30:00-02:00"]
    obs = [
        {"type": "GENERATION", "traceId": "t", "startTime": s, "input": [{"role": "user", "content": str(i)}]}
        for i, s in enumerate(stamps)
    ]
    turns = read_traces(json.dumps(obs).encode(), "lf.json").turns
    assert [t.request["messages"][0]["content"] for t in turns] == ["1", "0", "2"]
    assert turns[0].timestamp == "2024-01-01T05:00:00+00:00"
    for stamp in ("0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"):
        obs[0]["startTime"] = stamp
        try:
            read_traces(json.dumps(obs).encode(), "lf.json")
        except TelemetryError as e:
            assert e.path == "lf.json $[0].startTime"


def test_a_tool_call_part_with_the_wrong_types_is_a_telemetry_error() -> None:
    for part in ({"type": "tool_call", "name": 5, "id": "c1"}, {"type": "tool_call", "name": "f", "id": [1]}):
        messages = json.dumps([{"role": "assistant", "parts": [part]}])
        doc = _span(**{"gen_ai.input.messages": {"stringValue": messages}})
        with pytest.raises(TelemetryError) as info:
            read_traces(json.dumps(doc).encode(), "t.json")
        assert "parts[0]" in (info.value.path or "")


# -- any request: the count's invariants


def _png(w: int, h: int) -> str:
    """A PNG's signature, IHDR, an empty IDAT and IEND (CRCs right): its size is read from the header alone."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    head = (
        chunk(b"IHDR", struct.pack(">II5B", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b""))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + head).decode()


_WORDS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
_PROP = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["string", "integer", "array"]),
        "description": _WORDS,
        "enum": st.lists(st.one_of(_WORDS, st.integers(), st.none(), st.booleans()), max_size=3),
    },
)
_TOOL = st.builds(
    lambda name, desc, props: {
        "type": "function",
        "function": {"name": name, "description": desc, "parameters": {"type": "object", "properties": props}},
    },
    st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
    _WORDS,
    st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), _PROP, max_size=3),
)
_PART = st.one_of(
    _WORDS.map(lambda t: {"type": "text", "text": t}),
    st.builds(
        lambda wh, d: {"type": "image_url", "image_url": {"url": _png(*wh), **({"detail": d} if d else {})}},
        # ctxlock refuses a header over 89 M pixels (a decompression bomb) before any rule applies
        st.tuples(st.integers(1, 9000), st.integers(1, 9000)) | st.sampled_from([(100_000, 1), (1, 100_000), (1, 1)]),
        st.sampled_from([None, "low", "high", "auto"]),
    ),
    st.just({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}),
)
_MESSAGE = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, _WORDS),
    st.builds(lambda p: {"role": "user", "content": p}, st.lists(_PART, min_size=1, max_size=3)),
    st.builds(
        lambda t, n: {"role": "assistant", "content": t, "name": n},
        _WORDS,
        st.from_regex(r"[A-Za-z0-9_-]{1,8}", fullmatch=True),
    ),
    st.builds(
        lambda args: {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps(args)}}],
        },
        st.dictionaries(_WORDS, _WORDS, max_size=2),
    ),
)
_REQUEST = st.builds(
    lambda system, messages, tools: {
        "messages": ([{"role": "system", "content": system}] if system is not None else []) + messages,
        **({"tools": tools} if tools else {}),
    },
    st.none() | _WORDS,
    st.lists(_MESSAGE, min_size=1, max_size=4),
    st.lists(_TOOL, max_size=2),
)


@settings(max_examples=30, deadline=None)
@given(request=_REQUEST, provider=st.sampled_from(["openai:gpt-4o", "openai:gpt-4.1-mini", "anthropic:" + MODEL]))
def test_every_count_is_labelled_and_its_ranges_add_up(request: dict, provider: str) -> None:
    name, model = provider.split(":", 1)
    try:
        counted = count_provider(request, provider=name, model=model)
    except CtxlockError as e:  # the request parser's refusals (a tool call that is not an answered one, ...)
        assert e.path is not None
        return
    for p in counted.parts:
        assert p.basis in ("exact", "documented", "estimated") and p.method, p
        assert 0 <= p.low <= p.tokens <= p.high, p
        assert p.basis != "exact" or p.low == p.tokens == p.high, p
        if p.kind == "image":
            assert p.tokens > 0, p
    data = counted.to_dict()
    assert data["input_tokens"] == sum(p["tokens"] for p in data["parts"])
    assert data["range"] == [sum(p["range"][0] for p in data["parts"]), sum(p["range"][1] for p in data["parts"])]
    assert data["by_basis"] == {
        b: sum(p["tokens"] for p in data["parts"] if p["basis"] == b) for b in ("exact", "documented", "estimated")
    }
    unfetched = [
        f"messages[{i}].content[{j}]"
        for i, m in enumerate(request["messages"])
        if isinstance(m.get("content"), list)
        for j, part in enumerate(m["content"])
        if part.get("type") == "image_url" and part["image_url"]["url"].startswith("https:")
    ]
    for path in unfetched:  # an image without its bytes: named in the notes, its part estimated over the rule's range
        assert any(note.startswith(path) for note in counted.notes), (path, counted.notes)
        assert next(p for p in counted.parts if p.part == path).basis == "estimated"


def test_calibrate_out_that_is_a_fifo_or_a_full_device_is_one_error_line(tmp_path: Path) -> None:
    log = Path(__file__).parents[2] / "examples" / "anthropic-usage-log.jsonl"
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)  # opening it to write would wait for a reader forever
    for out in (Path("/dev/full"), tmp_path, fifo):
        status, _, stderr = run_main(["calibrate", str(log), "--provider", "anthropic", "--out", str(out)])
        assert status == 1 and stderr.count("\n") == 1 and f"--out {out}" in stderr, stderr


def test_an_estimated_part_the_calibration_did_not_fit_is_named() -> None:
    lines = [_line("hello world " * i + "x" * (i % 4), 9 + round(3.3 * i)) for i in range(1, 13)]  # text only
    cal = _fit(lines)
    tool = {"name": "f", "description": "d", "input_schema": {"type": "object"}}
    request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    counted = count_provider(request, provider="anthropic", model=MODEL, calibration=cal)
    tools = next(p for p in counted.parts if p.part == "tools[0]")
    assert "calibrated" not in tools.method
    assert any(n.startswith("tools[0]: not calibrated") for n in counted.notes), counted.notes
    assert all("not calibrated" not in n for n in counted.notes if n.startswith("messages["))


def test_an_unknown_trace_among_many_is_a_short_error_line() -> None:
    obs = [
        {"type": "GENERATION", "traceId": f"trace-{i:05}", "input": [{"role": "user", "content": "hi"}]}
        for i in range(3000)
    ]
    with pytest.raises(TelemetryError) as info:
        read_traces(json.dumps(obs).encode(), "lf.json", trace="x" * 10_000)
    assert len(str(info.value)) < 600 and "2,990 more" in str(info.value)


def test_control_characters_from_the_request_do_not_reach_the_terminal(tmp_path: Path) -> None:
    request = {
        "model": "claude-x\x1b]0;pwned\x07\x9b",
        "messages": [{"role": "user", "content": "hi"}],
        "documents": [{"title": "t\x1b[2J", "text": "x"}],
    }
    status, stdout, _ = run_main(["count", "-", "--provider", "anthropic"], stdin=json.dumps(request).encode())
    assert status == 0 and not any(ch in stdout for ch in "\x1b\x07\x9b"), stdout
    assert "claude-x\\x1b]0;pwned\\x07\\x9b" in stdout
    status, stdout, _ = run_main(
        ["count", "-", "--provider", "anthropic", "--json"], stdin=json.dumps(request).encode()
    )
    assert json.loads(stdout)["model"] == request["model"]  # --json is exact
    log = tmp_path / "log.jsonl"
    lines = [json.loads(_line("hello world " * i + "x" * (i % 4), 9 + round(3.3 * i))) for i in range(1, 13)]
    log.write_text(
        "".join(json.dumps({**o, "request": {**o["request"], "model": request["model"]}}) + "\n" for o in lines)
    )
    status, stdout, stderr = run_main(["calibrate", str(log), "--provider", "anthropic", "--out", str(tmp_path / "c")])
    assert status == 0 and "\x1b" not in stdout and "\\x1b" in stdout, stderr


@pytest.mark.parametrize(
    ("request_", "usage", "provider", "path"),
    [
        (
            {"model": MODEL, "messages": [{"role": 5, "content": "x"}]},
            {"input_tokens": 5},
            "anthropic",
            "$.request.messages[0].role",
        ),
        (
            {"model": "claude", "messages": [{"role": "user", "content": "x"}]},
            {"input_tokens": 5},
            "openai",
            "$.request.model",
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
            {"input_tokens": -5},
            "anthropic",
            "$.usage.input_tokens",
        ),
    ],
    ids=["request", "model", "usage"],
)
def test_a_bad_log_line_names_the_json_path_from_the_lines_root(
    request_: dict, usage: dict, provider: str, path: str
) -> None:
    line = json.dumps({"request": request_, "usage": usage}).encode()
    with pytest.raises(CalibrationError) as info:
        log_rows([("log.jsonl:3", line)], provider=provider, model=None)
    assert info.value.path == f"log.jsonl:3 {path}"


def test_a_responses_input_image_keeps_its_detail() -> None:
    url = _png(1024, 1024)
    for detail, tokens in (("low", 85), ("high", 765)):
        part = {"type": "input_image", "image_url": url, "detail": detail}
        counted = count_provider({"messages": [{"role": "user", "content": [part]}]}, provider="openai", model="gpt-4o")
        image = next(p for p in counted.parts if p.kind == "image")
        assert (image.tokens, image.low, image.high) == (tokens, tokens, tokens) and f"detail {detail}" in image.method
