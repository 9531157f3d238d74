"""`ctxlock calibrate` on a generated log whose per-kind factors are known: it recovers them, and the residuals it
reports are those of its factors on the held-back lines (every 5th), recomputed here. A calibrated count carries
the file's sha256; a calibration for another model is refused; hostile log lines are typed errors naming the line."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_runner import run_main
from ctxlock.errors import CalibrationError
from ctxlock.providers import count_provider, load_calibration, log_rows

MODEL = "claude-sonnet-4-5"
TRUE = {"text": 1.18, "tool": 0.91, "framing": 1.6, "tool_call": 1.3}
WORDS = [
    "the",
    "cache",
    "of",
    "a",
    "model",
    "reads",
    "every",
    "token",
    "before",
    "it",
    "writes",
    "any",
    "new",
    "one",
    "and",
    "bills",
    "them",
    "all",
]


def _request(rng: random.Random) -> dict:
    tools = [
        {
            "name": f"tool_{t}",
            "description": " ".join(rng.choices(WORDS, k=rng.randint(3, 30))),
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
        for t in range(rng.randint(0, 3))
    ]
    messages = []
    for turn in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(2, 120)))})
        if turn % 2 and tools:
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": f"t{turn}",
                            "name": tools[0]["name"],
                            "input": {"q": "x" * rng.randint(1, 40)},
                        }
                    ],
                }
            )
            messages.append(
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{turn}", "content": "ok"}]}
            )
        else:
            messages.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 60)))})
    messages.append({"role": "user", "content": "and now?"})
    request = {"model": MODEL, "max_tokens": 64, "messages": messages}
    if tools:
        request["tools"] = tools
    if rng.random() < 0.7:
        request["system"] = " ".join(rng.choices(WORDS, k=rng.randint(1, 80)))
    return request


def _log(tmp_path: Path, n: int = 60, noise: float = 0.01) -> Path:
    rng = random.Random(7)
    lines = []
    for _ in range(n):
        request = _request(rng)
        counted = count_provider(request, provider="anthropic", model=MODEL)
        reported = sum(p.tokens * TRUE[p.kind] if p.basis == "estimated" else p.tokens for p in counted.parts)
        reported = round(reported * (1 + rng.uniform(-noise, noise)))
        lines.append(json.dumps({"request": request, "usage": {"input_tokens": reported, "output_tokens": 9}}))
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_calibrate_recovers_the_factors_and_reports_the_held_back_residuals(tmp_path: Path) -> None:
    log = _log(tmp_path)
    out = tmp_path / "cal.json"
    status, stdout, stderr = run_main(["calibrate", str(log), "--provider", "anthropic", "--out", str(out), "--json"])
    assert status == 0, stderr
    shown = json.loads(stdout)
    raw = out.read_bytes()
    assert shown["sha256"] == hashlib.sha256(raw).hexdigest()
    cal = load_calibration(out)
    for kind, factor in TRUE.items():
        assert abs(cal.factors[kind] - factor) / factor < 0.05, (kind, cal.factors[kind])
    assert cal.fitted_on == 48 and cal.residuals.requests == 12
    # The residuals, recomputed here from the log's held-back lines (the 5th, 10th, ...) and the file's factors.
    lines = log.read_text().splitlines()
    errors = []
    for i, line in enumerate(lines):
        if (i + 1) % 5:
            continue
        obj = json.loads(line)
        counted = cal.apply(count_provider(obj["request"], provider="anthropic", model=MODEL))
        fixed = sum(p.tokens for p in counted.parts if p.basis != "estimated")
        unrounded = fixed + sum(
            q.tokens * cal.factors[q.kind]
            for q in count_provider(obj["request"], provider="anthropic", model=MODEL).parts
            if q.basis == "estimated"
        )
        reported = obj["usage"]["input_tokens"]
        errors.append(abs(unrounded - reported) / reported * 100)
    assert abs(cal.residuals.mean_abs_pct - float(np.mean(errors))) < 0.001
    assert abs(cal.residuals.p95_pct - float(np.percentile(errors, 95))) < 0.001
    assert abs(cal.residuals.max_pct - max(errors)) < 0.001
    assert 0 < cal.residuals.p95_pct < 2.5  # the log's noise is ±1%

    # A count with the calibration: scaled, its range the measured error, and the file named by its sha256.
    request_file = tmp_path / "req.json"
    request_file.write_text(json.dumps(json.loads(lines[0])["request"]))
    status, stdout, _ = run_main(
        ["count", str(request_file), "--provider", "anthropic", "--calibration", str(out), "--json"]
    )
    data = json.loads(stdout)
    assert data["calibration"]["sha256"] == shown["sha256"]
    estimated = [p for p in data["parts"] if p["basis"] == "estimated"]
    assert estimated and all("calibrated" in p["method"] for p in estimated)
    text_part = next(p for p in estimated if p["kind"] == "text" and p["tokens"] > 20)
    lo, hi = text_part["range"]
    assert hi - lo <= 2 * text_part["tokens"] * cal.residuals.p95_pct / 100 + 2


def test_a_calibration_for_another_model_is_refused(tmp_path: Path) -> None:
    log = _log(tmp_path, n=10)
    out = tmp_path / "cal.json"
    assert run_main(["calibrate", str(log), "--provider", "anthropic", "--out", str(out)])[0] == 0
    request_file = tmp_path / "req.json"
    request_file.write_text(json.dumps({"model": "claude-opus-4-1", "messages": [{"role": "user", "content": "hi"}]}))
    status, _, stderr = run_main(["count", str(request_file), "--provider", "anthropic", "--calibration", str(out)])
    assert status == 1 and stderr.count("\n") == 1 and "CalibrationError" in stderr
    assert "claude-sonnet-4-5" in stderr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    line=st.one_of(
        st.binary(max_size=60),
        st.text(max_size=60).map(str.encode),
        st.recursive(
            st.none() | st.integers() | st.text(max_size=8),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
            max_leaves=8,
        ).map(lambda v: json.dumps({"request": v, "usage": v}).encode()),
    )
)
def test_hostile_log_lines_are_typed_errors_naming_the_line(line: bytes) -> None:
    good = json.dumps(
        {
            "request": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            "usage": {"input_tokens": 9, "output_tokens": 1},
        }
    ).encode()
    try:
        log_rows([("log.jsonl:1", good), ("log.jsonl:2", line)], provider="anthropic", model=None)
    except CalibrationError as e:
        assert (e.path or "").startswith("log.jsonl:2"), e.path


def test_a_calibrated_bill_names_the_calibration(tmp_path: Path) -> None:
    log = _log(tmp_path, n=10)
    out = tmp_path / "cal.json"
    assert run_main(["calibrate", str(log), "--provider", "anthropic", "--out", str(out)])[0] == 0
    session = tmp_path / "session.jsonl"
    session.write_text("\n".join(log.read_text().splitlines()[:2]) + "\n")
    args = ["bill", str(session), "--provider", "anthropic", "--prices", "examples/prices.json", "--json"]
    status, stdout, stderr = run_main([*args, "--calibration", str(out)])
    assert status == 0, stderr
    assert hashlib.sha256(out.read_bytes()).hexdigest() in stdout
    status, _, stderr = run_main(["bill", str(session), "--provider", "vllm", "--calibration", str(out)])
    assert status == 1 and "--calibration" in stderr
