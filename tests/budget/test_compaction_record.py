"""`compact-plan --record` (issue 18, "Record compaction"; acceptance 6): the plan, the cut, the summary's digest, the
summary call's usage and Pi's `compaction_end` event in the record's `compaction` section; firstKeptEntryId is the
id the caller gave; the originals stay in the record; the compacted run replays; `records show` shows it readably.
Real tokenizer and template (Qwen2's vocabulary, Qwen2.5's template)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import fetched
from cli_runner import invoke, run_cli
from ctxlock.budget._compaction import SUMMARY_PREFIX, SUMMARY_SUFFIX, CompactionPlan, compaction_event
from ctxlock.cli.compaction import register as register_compaction
from ctxlock.cli.explain import register as register_explain
from ctxlock.cli.records import register as register_records
from ctxlock.economics._usage import parse_usage
from ctxlock.records import ExecutionRecord, RunOptions
from ctxlock.records._replay import load_record, replay
from ctxlock.records._store import Store

QWEN_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega"]
SUMMARY = "The user shared src/greet.ts (greet returns 'Hello, ' + name); later turns discussed tests."
ANTHROPIC_USAGE = {
    "id": "msg_01",
    "type": "message",
    "model": "claude-sonnet-4-5",
    "usage": {
        "input_tokens": 2100,
        "output_tokens": 60,
        "cache_read_input_tokens": 300,
        "cache_creation_input_tokens": 0,
    },
}


def filler(n: int, seed: int) -> str:
    return " ".join(WORDS[(i * 7 + seed) % len(WORDS)] for i in range(n))


def chat(ids: bool = True, turns: int = 8) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding assistant."}]
    msgs.append({"role": "user", "content": "Here is src/greet.ts: export const greet = (n) => 'Hello, ' + n;"})
    for t in range(turns):
        msgs.append({"role": "assistant" if t % 2 == 0 else "user", "content": filler(120, t)})
    msgs.append({"role": "user", "content": "What does greet return?"})
    if ids:
        for k, m in enumerate(msgs):
            m["id"] = f"entry-{k:03d}"
    return {"messages": msgs}


@pytest.fixture(scope="module")
def paths() -> tuple[str, str]:
    return str(fetched.hf_tokenizer_dir("qwen2")), str(fetched.templates_dir() / QWEN_TEMPLATE)


def plan_args(paths: tuple[str, str], request: Path, *extra: str) -> list[str]:
    model_dir, template = paths
    return [
        "-m", model_dir, "-t", template, "--context-window", "1100", "--reserve-tokens", "200",
        "--keep-recent-tokens", "500", "--summary-tokens", "25", *extra, str(request),
    ]  # fmt: skip


def write(path: Path, value: Any) -> Path:
    path.write_text(value if isinstance(value, str) else json.dumps(value), "utf-8")
    return path


def recorded(paths: tuple[str, str], tmp_path: Path, *extra: str, ids: bool = True) -> tuple[dict, dict]:
    req = write(tmp_path / "chat.json", chat(ids=ids))
    store = tmp_path / "store"
    result = invoke(
        register_compaction, "compact-plan", *plan_args(paths, req, "--record", "--store", str(store), "--json", *extra)
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    rec = load_record(out["record_id"], Store(store))
    return out, rec.data


def test_the_record_holds_plan_cut_digest_usage_and_event(paths: tuple[str, str], tmp_path: Path) -> None:
    summary = write(tmp_path / "summary.txt", SUMMARY)
    usage = write(tmp_path / "usage.json", ANTHROPIC_USAGE)
    out, data = recorded(paths, tmp_path, "--summary", str(summary), "--summary-usage", str(usage))
    c = data["compaction"]
    cut = out["first_kept_index"]
    # firstKeptEntryId is the caller's id, everywhere it appears.
    assert out["first_kept_entry_id"] == c["cut"]["first_kept_entry_id"] == f"entry-{cut:03d}"
    assert c["cut"]["first_kept_entry_id_source"] == "caller" and not c["notes"]
    assert c["event"]["result"]["firstKeptEntryId"] == f"entry-{cut:03d}"
    assert [s["entry_id"] for s in c["summarized"]] == [f"entry-{k:03d}" for k in out["messages_to_summarize"]]
    # The plan, as compact-plan printed it.
    assert c["plan"] == {k: out[k] for k in c["plan"]} and c["reason"] == "threshold" and c["applied"]
    # The summary's digest; the usage, normalized and in Pi's shape in the event.
    assert c["summary"]["sha256"] == hashlib.sha256(SUMMARY.encode()).hexdigest()
    assert c["usage"]["input"] == 2100 and c["usage"]["cache_read"] == 300 and c["usage"]["source"] == "anthropic"
    pi = c["event"]["result"]["usage"]
    assert pi == {"input": 2100, "output": 60, "cacheRead": 300, "cacheWrite": 0, "totalTokens": 2460}
    assert c["event"] == compaction_event(
        CompactionPlan.from_dict(c["plan"]),
        reason="threshold",
        summary=SUMMARY,
        first_kept_entry_id=f"entry-{cut:03d}",
        usage=parse_usage(ANTHROPIC_USAGE),
    )
    # The originals are kept: the request as received, ids and all its messages.
    originals = data["request"]["canonical"]["messages"]
    assert len(originals) == len(chat()["messages"]) and originals[1]["content"].startswith("Here is src/greet.ts")
    # The record's run is the compacted request: system + summary + kept messages, counted exactly.
    assert f"{SUMMARY_PREFIX}{SUMMARY}{SUMMARY_SUFFIX}" in data["rendered"]["text"]
    assert "src/greet.ts:" not in data["rendered"]["text"]
    assert len(data["input_ids"]) == c["tokens_after"] < c["plan"]["tokens_before"]
    assert data["decisions"]["compaction"]["messages_summarized"] == out["messages_to_summarize"]


def test_a_compaction_record_replays(paths: tuple[str, str], tmp_path: Path) -> None:
    summary = write(tmp_path / "summary.txt", SUMMARY)
    out, _ = recorded(paths, tmp_path, "--summary", str(summary))
    store = Store(tmp_path / "store")
    result, _ = replay(load_record(out["record_id"], store), store)
    assert result.identical, result.to_dict()


def test_without_ids_the_json_path_is_said(paths: tuple[str, str], tmp_path: Path) -> None:
    summary = write(tmp_path / "summary.txt", SUMMARY)
    out, data = recorded(paths, tmp_path, "--summary", str(summary), ids=False)
    c = data["compaction"]
    path = f"messages[{out['first_kept_index']}]"
    assert c["cut"]["first_kept_entry_id"] == path and c["cut"]["first_kept_entry_id_source"] == "json_path"
    assert any("carries no id" in n for n in c["notes"])
    assert c["event"]["result"]["firstKeptEntryId"] == path
    assert all(s["entry_id"] is None for s in c["summarized"])


def test_a_plan_without_summary_is_recorded_as_planned(paths: tuple[str, str], tmp_path: Path) -> None:
    out, data = recorded(paths, tmp_path, "--reason", "manual")
    c = data["compaction"]
    assert not c["applied"] and c["event"] is None and c["summary"] is None and c["tokens_after"] is None
    assert c["reason"] == "manual"
    assert len(data["input_ids"]) == out["tokens_before"]  # the run is the request as given
    assert "compaction" not in data["options"]  # nothing to replay but the request itself
    # explain names the plan, and does not call it a drop: the model still received the text.
    result = invoke(
        register_explain, "explain", "--find", "src/greet.ts", out["record_id"], "--store", str(tmp_path / "store"),
        "--json",
    )  # fmt: skip
    dropped = json.loads(result.output)["causes"][2]
    assert dropped["verdict"] == "no" and any("planned, not applied" in e for e in dropped["evidence"])


def test_records_show_is_readable(paths: tuple[str, str], tmp_path: Path) -> None:
    summary = write(tmp_path / "summary.txt", SUMMARY)
    usage = write(tmp_path / "usage.json", ANTHROPIC_USAGE)
    out, data = recorded(paths, tmp_path, "--summary", str(summary), "--summary-usage", str(usage))
    store = str(tmp_path / "store")
    proc = run_cli("records", "show", out["record_id"][:12], "--store", store)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    cut = out["first_kept_index"]
    assert text.startswith(f"compaction record {out['record_id'][:12]}")
    assert "reason          threshold · applied" in text
    assert f"firstKeptEntryId entry-{cut:03d} (the caller's id)" in text
    assert f"{out['tokens_before']:,} before → {data['compaction']['tokens_after']:,} after (exact)" in text
    assert "Here is src/greet.ts" in text  # the summarized originals, from the record
    assert hashlib.sha256(SUMMARY.encode()).hexdigest() in text and "input 2,100" in text
    assert '"type": "compaction_end"' in text
    as_json = invoke(register_records, "records", "show", out["record_id"], "--store", store, "--json")
    assert json.loads(as_json.output)["compaction"] == data["compaction"]


def test_old_records_are_unchanged(paths: tuple[str, str], tmp_path: Path) -> None:
    # A run without compaction records the options it always recorded (no `compaction` key), and its record has no
    # compaction section and shows as JSON, as before.
    assert "compaction" not in RunOptions().to_dict()
    assert RunOptions.from_dict(RunOptions().to_dict()) == RunOptions()
    model_dir, template = paths
    req = write(tmp_path / "chat.json", chat(ids=False))
    store = str(tmp_path / "store")
    proc = run_cli("render", "-m", model_dir, "-t", template, "--record", "--store", store, "--json", str(req))
    rid = json.loads(proc.stdout)["record_id"]
    shown = json.loads(run_cli("records", "show", rid, "--store", store).stdout)
    assert "compaction" not in shown and "compaction" not in shown["options"]
    assert "compaction" not in shown["decisions"]
    assert ExecutionRecord.from_bytes(json.dumps(shown).encode()).data == shown


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        ("bad-id", "BudgetError: messages[2].id: an entry id must be a non-empty string"),
        ("bad-usage", "UsageError"),
        ("usage-without-summary", "needs --summary"),
        ("bad-reason", "unknown reason 'sometimes'"),
        ("split-without-prefix", "needs the summary of turn_prefix_to_summarize"),
    ],
)
def test_bad_inputs_are_one_line(paths: tuple[str, str], tmp_path: Path, setup: str, needle: str) -> None:
    body = chat()
    extra: list[str] = ["--record", "--store", str(tmp_path / "store")]
    summary = write(tmp_path / "summary.txt", SUMMARY)
    if setup == "bad-id":
        body["messages"][2]["id"] = 7
    elif setup == "bad-usage":
        extra += ["--summary", str(summary), "--summary-usage", str(write(tmp_path / "u.json", {"usage": {"x": 1}}))]
    elif setup == "usage-without-summary":
        extra += ["--summary-usage", str(write(tmp_path / "u.json", ANTHROPIC_USAGE))]
    elif setup == "bad-reason":
        extra += ["--reason", "sometimes"]
    else:  # one long turn: the cut falls inside it
        body = {
            "messages": [
                {"role": "user", "content": "go"},
                *({"role": "assistant" if k % 2 else "user", "content": filler(150, k)} for k in range(1, 2)),
                *(
                    m
                    for k in range(6)
                    for m in (
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                            ],
                        },
                        {"role": "tool", "tool_call_id": f"c{k}", "content": filler(120, k)},
                    )
                ),
            ]
        }
        extra += ["--summary", str(summary)]
    req = write(tmp_path / "chat.json", body)
    proc = run_cli("compact-plan", *plan_args(paths, req, *extra))
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert needle in lines[0], lines[0]
    assert not (tmp_path / "store" / "records.db").exists() or setup == "split-without-prefix"
