"""`render --record`, `replay`, `diff` and `records …` as a user runs them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cli_runner import run_cli

NOW = "2024-07-26T10:00:00"
BOOK = {"messages": [{"role": "system", "content": "简洁回答"}, {"role": "user", "content": "天空为什么是蓝色？"}]}


def run(*args: str, store: Path, stdin: bytes | str | None = None) -> subprocess.CompletedProcess[str]:
    """`ctxlock ARGS` in a child process whose record store is `store`."""
    return run_cli(*args, stdin=stdin, env={"CTXLOCK_DATA_DIR": str(store)})


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


def _record(store: Path, request: dict, *extra: str) -> str:
    p = run(
        "render",
        "--model",
        "book",
        "--record",
        "--json",
        "--now",
        NOW,
        *extra,
        "-",
        store=store,
        stdin=json.dumps(request),
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["record_id"]


def test_render_record_replay_and_records_commands(store: Path, tmp_path: Path) -> None:
    rid = _record(store, BOOK)
    assert len(rid) == 64
    human = run("render", "--model", "book", "--record", "--now", NOW, "-", store=store, stdin=json.dumps(BOOK))
    assert f"record     {rid}" in human.stdout  # the same run (same clock), the same record

    ok = run("replay", rid[:12], store=store)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "identical" in ok.stdout

    listed = json.loads(run("records", "list", "--json", store=store).stdout)
    assert [r["id"] for r in listed] == [rid]
    shown = json.loads(run("records", "show", rid, store=store).stdout)
    assert shown["input_ids"] == [1, 2, 7, 3, 4, 8, 9, 10, 11, 12, 5, 6]

    exported = tmp_path / "records.jsonl"
    assert run("records", "export", "--out", str(exported), store=store).returncode == 0
    other = tmp_path / "other-store"
    imported = run("records", "import", str(exported), store=other)
    assert imported.returncode == 0 and imported.stdout.split() == [rid]
    # The record file itself replays too, given a store that has its artifacts.
    (tmp_path / "one.json").write_bytes(exported.read_bytes())
    assert run("replay", str(tmp_path / "one.json"), store=store).returncode == 0


def test_diff_json_names_the_layer(store: Path, tmp_path: Path) -> None:
    a = _record(store, BOOK)
    changed = {"messages": [BOOK["messages"][0], {"role": "user", "content": "天空为什么是蓝色?"}]}
    b = _record(store, changed)
    p = run("diff", a, b, "--json", store=store)
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert out["identical"] is False
    assert set(out["first_divergence"]) == {"layer", "location", "a", "b", "cause"}
    assert out["first_divergence"]["layer"] == "request"
    assert out["first_divergence"]["location"] == "messages[1].content"
    same = run("diff", a, a, "--json", store=store)
    assert same.returncode == 0 and json.loads(same.stdout)["identical"] is True

    template = tmp_path / "v2.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", "utf-8")
    rerun = run("diff", a, "--template", str(template), "--json", store=store)
    assert json.loads(rerun.stdout)["first_divergence"]["layer"] == "template"
    human = run("diff", a, "--template", str(template), store=store)
    assert "first divergence at layer template" in human.stdout and "template sha256 differs" in human.stdout


def test_error_runs_are_recorded_too(store: Path) -> None:
    raw = b'{"messages":[{"role":"user","content":"\xe5\xa4\xa9\xff"}]}'
    bad = run("render", "--model", "book", "--record", "-", store=store, stdin=raw)
    assert bad.returncode == 1 and "RequestEncodingError" in bad.stderr and "record " in bad.stderr
    strict_id = bad.stderr.split("record ", 1)[1].split()[0]
    good = run("render", "--model", "book", "--record", "--utf8", "replace", "--json", "-", store=store, stdin=raw)
    replace_id = json.loads(good.stdout)["record_id"]
    d = json.loads(run("diff", strict_id, replace_id, "--json", store=store).stdout)["first_divergence"]
    assert d["layer"] == "request" and d["location"] == "byte 42"
    assert run("replay", strict_id, store=store).returncode == 0  # the rejection itself replays identically


def test_corrupt_record_files_and_unknown_ids(store: Path, tmp_path: Path) -> None:
    rid = _record(store, BOOK)
    body = run("records", "show", rid, store=store).stdout
    truncated = tmp_path / "truncated.json"
    truncated.write_text(body[: len(body) // 2], "utf-8")
    p = run("replay", str(truncated), store=store)
    assert p.returncode == 1 and "RecordFormatError" in p.stderr and "Traceback" not in p.stderr
    bad_lines = tmp_path / "bad.jsonl"
    bad_lines.write_text(json.dumps(json.loads(body)) + "\n" + "{not json\n", "utf-8")
    p = run("records", "import", str(bad_lines), store=tmp_path / "fresh")
    assert p.returncode == 1 and "line 2" in p.stderr and "Traceback" not in p.stderr
    p = run("replay", "0123456789abcdef", store=store)
    assert p.returncode == 1 and "Traceback" not in p.stderr


def test_sampler_order_is_recorded_and_diffed_at_the_policy_layer(store: Path, tmp_path: Path) -> None:
    first = tmp_path / "a.json"
    first.write_text(json.dumps({"temperature": 0.7, "top_k": 40, "top_p": 0.9, "seed": 3}), "utf-8")
    second = tmp_path / "b.json"
    order = ["repetition_penalty", "top_k", "top_p", "min_p", "temperature"]  # temperature last, as llama.cpp
    second.write_text(json.dumps({"temperature": 0.7, "top_k": 40, "top_p": 0.9, "seed": 3, "order": order}), "utf-8")
    a = _record(store, BOOK, "--sampling", str(first))
    b = _record(store, BOOK, "--sampling", str(second))
    shown = json.loads(run("records", "show", a, store=store).stdout)
    assert shown["options"]["sampling"]["order"][:2] == ["repetition_penalty", "temperature"]
    p = run("diff", a, b, "--json", store=store)
    assert p.returncode == 1
    div = json.loads(p.stdout)["first_divergence"]
    assert div["layer"] == "policy"
    assert div["location"].startswith("options.sampling.order")
    assert "processor order" in div["cause"]
    assert run("replay", b, store=store).returncode == 0  # the sampling config survives replay

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"top_k": 5, "order": ["temperature"]}), "utf-8")
    p = run("render", "--model", "book", "--sampling", str(bad), "-", store=store, stdin=json.dumps(BOOK))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "SamplerError" in p.stderr and "top_k is set but not in the processor order" in p.stderr
