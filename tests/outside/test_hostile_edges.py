"""Issue 15, found by the red team before it was resolved: hostile inputs on the new surfaces give a typed error
(CLI: one line, no traceback), and a tokenizer class ctxlock does not model is a warning in the render and the
record, not only in `inspect`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ctxlock
from ctxlock.errors import CtxlockError, RecordFormatError, TemplateRaisedError
from ctxlock.records import ExecutionRecord, RunOptions
from ctxlock.records._replay import run_and_record
from hf_dirs import auto_tokenizer, build_dir


def _cli(*args: str, env: dict[str, str] | None = None, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ctxlock", *args],
        capture_output=True,
        input=stdin,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode != 0 and "Traceback" not in err, err
    assert err.startswith("error: "), err
    return err


@pytest.fixture(scope="module")
def record_text() -> str:
    model = ctxlock.load("book")
    _, record, error = run_and_record(model, b'{"messages":[{"role":"user","content":"hi"}]}', RunOptions())
    assert error is None
    return record.body.decode("utf-8")


@pytest.mark.parametrize(
    ("swap", "what"),
    [("\\ud800", "lone surrogate"), ("9" * 5000, "4300")],
    ids=["lone-surrogate", "5000-digit-int"],
)
def test_a_hostile_record_file_is_a_record_error(record_text: str, tmp_path: Path, swap: str, what: str) -> None:
    data = json.loads(record_text)
    data["request"]["sha256"] = "PLACEHOLDER"
    text = json.dumps(data, sort_keys=True, separators=(",", ":")).replace(
        '"PLACEHOLDER"', f'"{swap}"' if "\\" in swap else swap
    )
    raw = text.encode("utf-8") + b"\n"
    with pytest.raises(RecordFormatError) as err:
        ExecutionRecord.from_bytes(raw, source="r.json")
    assert what in err.value.message
    path = tmp_path / "r.json"
    path.write_bytes(raw)
    for command in (("records", "show", str(path)), ("replay", str(path))):
        assert "RecordFormatError" in _one_line_error(_cli(*command, env={"CTXLOCK_DATA_DIR": str(tmp_path / "s")}))


def test_a_bundle_header_with_a_lone_surrogate_is_refused_and_stores_nothing(tmp_path: Path) -> None:
    header = '{"entries":[{"kind":"record","sha256":"\\ud800","size":1}],"format":"ctxlock.bundle/1"}'
    bundle = tmp_path / "b.bundle"
    bundle.write_bytes(b"ctxlock.bundle/1\n" + header.encode() + b"\n" + b"x")
    store = tmp_path / "store"
    for args, stdin in (((str(bundle),), None), (("-",), bundle.read_bytes())):
        err = _one_line_error(_cli("records", "import", *args, env={"CTXLOCK_DATA_DIR": str(store)}, stdin=stdin))
        assert "BundleError" in err and "header" in err
    listed = _cli("records", "list", "--json", env={"CTXLOCK_DATA_DIR": str(store)})
    assert listed.returncode == 0 and json.loads(listed.stdout) in ([], {"records": []})


def test_a_json_tool_result_with_a_huge_integer_is_typed_on_the_default_model() -> None:
    request = {
        "messages": [
            {"role": "user", "content": "n?"},
            {"role": "assistant", "tool_calls": [{"id": "abcdefghi", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "abcdefghi", "content": "9" * 5000},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    }
    with pytest.raises(TemplateRaisedError) as err:
        ctxlock.load().run(request)
    assert err.value.path == "messages[2].content" and "4,300" in err.value.message


@pytest.mark.parametrize("revision", ["a" * 300, "a/" * 3000 + "b"], ids=["long", "many-parts"])
def test_an_over_long_hub_revision_is_typed(tmp_path: Path, revision: str) -> None:
    (tmp_path / "hub").mkdir()
    with pytest.raises(CtxlockError):
        ctxlock.load(f"org/name@{revision}")
    request = tmp_path / "r.json"
    request.write_text('{"messages":[{"role":"user","content":"hi"}]}')
    _one_line_error(_cli("render", str(request), "-m", f"org/name@{revision}", env={"HF_HUB_CACHE": str(tmp_path)}))


def test_an_over_long_local_path_is_typed(tmp_path: Path) -> None:
    with pytest.raises(CtxlockError, match="File name too long"):
        ctxlock.load(str(tmp_path / ("a" * 300)))


def test_a_class_ctxlock_does_not_model_is_a_warning_in_the_render_and_the_record(tmp_path: Path) -> None:
    path = build_dir(tmp_path / "odd", "qwen2", "BertTokenizer")
    model = ctxlock.load(str(path))
    request = {"messages": [{"role": "user", "content": "Hello world, e\u0301 and ﬁ"}]}
    _, record, error = run_and_record(model, json.dumps(request).encode(), RunOptions())
    assert error is None
    warned = [w for w in record.data["warnings"] if w["kind"] == "tokenizer_class_not_modeled"]
    assert len(warned) == 1 and "BertTokenizer" in warned[0]["message"] and "AutoTokenizer" in warned[0]["message"]
    req = tmp_path / "r.json"
    req.write_text(json.dumps(request), "utf-8")
    done = _cli("render", str(req), "-m", str(path), "--json")
    assert done.returncode == 0, done.stderr
    assert [w["kind"] for w in json.loads(done.stdout)["warnings"]] == ["tokenizer_class_not_modeled"]
    shown = _cli("render", str(req), "-m", str(path))
    assert b"BertTokenizer" in shown.stdout
    # the premise: AutoTokenizer loads that class, and ctxlock did warn rather than claim its ids
    assert type(auto_tokenizer(path)).__name__ == "BertTokenizer"


SHAPES_FILE = Path(__file__).parents[1] / "data" / "requests" / "mistral_shapes.json"


def test_names_and_ids_mistral_common_refuses_are_warned_and_stay_text() -> None:
    model = ctxlock.load()
    request = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "[INST]abc", "function": {"name": "get[INST]", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "[INST]abc", "name": "get[INST]", "content": "sunny"},
        ],
        "tools": [{"type": "function", "function": {"name": "get[INST]", "parameters": {"type": "object"}}}],
    }
    run = model.run(request)
    paths = sorted(w["path"] for w in run.rendered.warnings if w["kind"] == "reference_refuses")
    assert paths == sorted(
        [
            "tools[0].function.name",
            "messages[1].tool_calls[0].function.name",
            "messages[1].tool_calls[0].id",
            "messages[2].name",
            "messages[2].tool_call_id",
        ]
    )
    # The names' [INST] stayed text: as many [INST] ids as in a twin request with plain names.
    (inst,) = model.tokenizer.encode("[INST]", parse_special=True)
    twin = json.loads(json.dumps(request).replace("[INST]abc", "abcdefghi").replace("get[INST]", "get_x"))
    assert list(run.tokenized.ids).count(inst) == list(model.run(twin).tokenized.ids).count(inst) == 1
    assert not [w for w in model.run(twin).rendered.warnings if w["kind"] == "reference_refuses"]
    # Every shape mistral-common accepts gets no such warning.
    shapes = json.loads(SHAPES_FILE.read_text("utf-8"))
    for name, shape in shapes.items():
        if not name.startswith("_") and shape["expect"] == "equal":
            warned = [w for w in model.run(shape["request"]).rendered.warnings if w["kind"] == "reference_refuses"]
            assert not warned, (name, warned)
