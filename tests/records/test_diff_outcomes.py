"""Issue 15 item 9: `diff` compares the ids first. Two records of one request, one made from an HF directory and one
from the GGUF of the same vocabulary, with identical ids, are "same ids, different tokenizer artifacts" (its own
outcome, JSON kind and exit code), never "a different vocabulary"; a differing normalizer is named as the cause."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from cli_runner import run_cli
from ctxlock.records import ExecutionRecord, RunOptions, diff
from ctxlock.records._replay import run_and_record, save
from ctxlock.records._store import Store
from ctxlock.template._render import ChatTemplate
from hypothesis_profiles import examples

NOW = "2024-07-26T10:00:00"
# The documented outcomes (`Diff.kind`, the `kind` of `diff --json`).
SAME_IDS = "same_ids_different_tokenizer"
DIVERGED = "diverged"
QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
]


def _request(text: str) -> dict:
    return {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": text},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, light rain"},
        ],
        "tools": TOOLS,
    }


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate((fetched.templates_dir() / QWEN25).read_text("utf-8"), id=QWEN25)


@pytest.fixture(scope="module")
def hf() -> ctxlock.Model:
    """The HF directory transformers saved from the qwen2 GGUF vocabulary."""
    return ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))


@pytest.fixture(scope="module")
def gguf() -> ctxlock.Model:
    """The GGUF itself: the same vocabulary, another artifact (NFC normalizer)."""
    return ctxlock.load(str(fetched.gguf_path("qwen2")))


@pytest.fixture(scope="module")
def bare() -> ctxlock.Model:
    """The same HF directory with `"normalizer": null` written in tokenizer.json and no tokenizer class (so the file
    is what runs): the same vocabulary, without the NFC step."""
    root = Path(tempfile.mkdtemp(prefix="ctxlock-diff-test-"))
    target = root / "qwen2-no-normalizer"
    shutil.copytree(fetched.hf_tokenizer_dir("qwen2"), target)
    data = json.loads((target / "tokenizer.json").read_text("utf-8"))
    data["normalizer"] = None
    (target / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    config = json.loads((target / "tokenizer_config.json").read_text("utf-8"))
    config.pop("tokenizer_class", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    model = ctxlock.load(str(target))
    model.tokenizer.encode("warm")  # build the engine before the directory goes
    yield model
    shutil.rmtree(root, ignore_errors=True)


def _record(model: ctxlock.Model, text: str, template: ChatTemplate) -> ExecutionRecord:
    raw = json.dumps(_request(text), ensure_ascii=False).encode("utf-8")
    _, rec, error = run_and_record(model, raw, RunOptions(now=NOW), template=template)
    assert error is None, error
    return rec


ASCII = "What is the weather in Paris today? Answer in one short sentence, please."


def test_hf_directory_and_gguf_of_one_vocabulary_are_same_ids_not_another_vocabulary(
    hf: ctxlock.Model, gguf: ctxlock.Model, template: ChatTemplate
) -> None:
    ra, rb = _record(hf, ASCII, template), _record(gguf, ASCII, template)
    ids = ra.data["input_ids"]
    assert ids == rb.data["input_ids"] and len(ids) > 200  # the premise, measured: one answer from both artifacts
    assert ra.data["tokenizer"]["sha256"] != rb.data["tokenizer"]["sha256"]
    for a, b in ((ra, rb), (rb, ra)):
        result = diff(a, b)
        assert result.kind == SAME_IDS and not result.identical
        assert result.ids == {"equal": True, "a": len(ids), "b": len(ids), "first_difference": None}
        d = result.first_divergence
        assert d.layer == "tokenizer"
        assert d.cause.startswith(f"same ids ({len(ids)}/{len(ids)}), different tokenizer artifacts: ")
        assert "vocabulary" not in d.cause and "would mean different text" not in d.cause
        assert "the model receives the same input ids" in d.cause
        out = result.to_dict()
        assert out["kind"] == "same_ids_different_tokenizer" and out["ids"]["equal"] is True
    # Both record the normalizer and pre-tokenizer they ran, and here those agree on every id-relevant setting.
    assert ra.data["tokenizer"]["pipeline"]["normalizer"] == rb.data["tokenizer"]["pipeline"]["normalizer"]
    assert "differs" not in diff(ra, rb).first_divergence.cause


def test_cli_gives_same_ids_its_own_exit_code_and_json_kind(
    hf: ctxlock.Model, gguf: ctxlock.Model, template: ChatTemplate, tmp_path: Path
) -> None:
    store = Store(tmp_path / "store")
    ra, rb = _record(hf, ASCII, template), _record(gguf, ASCII, template)
    a, b = save(store, hf, ra, template), save(store, gguf, rb, template)
    store.close()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env={"CTXLOCK_DATA_DIR": str(store.root)})

    human = run("diff", a, b)
    assert human.returncode == 3, human.stdout + human.stderr
    lines = human.stdout.splitlines()
    n = len(ra.data["input_ids"])
    assert lines[0] == "same ids, different tokenizer artifacts at layer tokenizer"
    assert lines[1].strip() == f"ids     equal ({n}/{n})"
    assert "a different tokenizer vocabulary" not in human.stdout
    as_json = run("diff", a, b, "--json")
    assert as_json.returncode == 3
    assert json.loads(as_json.stdout)["kind"] == "same_ids_different_tokenizer"
    # The other outcomes keep their codes: identical 0, diverged 1.
    assert run("diff", a, a).returncode == 0
    other = save(Store(store.root), hf, _record(hf, ASCII + " Thanks!", template), template)
    diverged = run("diff", a, other, "--json")
    assert diverged.returncode == 1 and json.loads(diverged.stdout)["kind"] == "diverged"


NON_NFC = "e\u0301 \u1100\u1161\u11a8 A\u030a \u2126 \ufb01"  # é decomposed, Hangul jamo, Å, Ω (ohm), ﬁ


def test_a_differing_normalizer_is_named_as_the_cause_when_the_ids_differ(
    bare: ctxlock.Model, gguf: ctxlock.Model, template: ChatTemplate
) -> None:
    ra, rb = _record(bare, NON_NFC, template), _record(gguf, NON_NFC, template)
    assert ra.data["input_ids"] != rb.data["input_ids"]
    result = diff(ra, rb)
    assert result.kind == DIVERGED
    assert result.ids["equal"] is False and result.ids["first_difference"] is not None
    d = result.first_divergence
    assert d.layer == "tokenizer"
    assert d.cause.startswith("the normalizer differs: none vs NFC"), d.cause
    assert "vocabulary" not in d.cause.split("(", 1)[0]
    assert diff(rb, ra).first_divergence.cause.startswith("the normalizer differs: NFC vs none")


def test_a_differing_normalizer_is_named_when_the_ids_happen_to_be_equal(
    bare: ctxlock.Model, gguf: ctxlock.Model, template: ChatTemplate
) -> None:
    ra, rb = _record(bare, ASCII, template), _record(gguf, ASCII, template)
    assert ra.data["input_ids"] == rb.data["input_ids"]
    result = diff(ra, rb)
    assert result.kind == SAME_IDS
    assert "but the normalizer differs: none vs NFC, so other text may tokenize differently" in (
        result.first_divergence.cause
    )


def test_records_without_a_recorded_pipeline_still_name_the_normalizer(
    bare: ctxlock.Model, gguf: ctxlock.Model, template: ChatTemplate
) -> None:
    # A record made before the pipeline was recorded carries only the component types.
    old = []
    for model in (bare, gguf):
        data = _record(model, NON_NFC, template).data
        del data["tokenizer"]["pipeline"]
        old.append(data)
    assert diff(*old).first_divergence.cause.startswith("the normalizer differs: none vs NFC")


def test_equal_ids_with_other_tensors_is_a_divergence_at_tensors_noting_the_same_ids(
    hf: ctxlock.Model, gguf: ctxlock.Model, template: ChatTemplate
) -> None:
    ra = _record(hf, ASCII, template)
    b = copy.deepcopy(_record(gguf, ASCII, template).data)
    b["tensors"]["position_ids"][0][-1] += 1  # misaligned positions: the model input is not the same
    result = diff(ra, b)
    assert result.kind == DIVERGED and result.first_divergence.layer == "tensors"
    assert any(note.startswith("same ids (") for note in result.notes)


def test_the_same_tokenizer_file_built_with_another_normalizer_is_named(
    hf: ctxlock.Model, template: ChatTemplate
) -> None:
    # As from a ctxlock version that builds this file's pipeline differently (transformers class semantics).
    ra = _record(hf, ASCII, template)
    b = copy.deepcopy(ra.data)
    b["tokenizer"]["pipeline"]["normalizer"] = None
    result = diff(ra, b)
    assert result.kind == SAME_IDS
    cause = result.first_divergence.cause
    assert "the same tokenizer file" in cause and "the normalizer differs: NFC vs none" in cause


_PIECES = st.sampled_from(["a", "e", " ", "e\u0301", "\u00e9", "A\u030a", "\u2126", "\ufb01", "\u1100\u1161", "z."])


@settings(max_examples=examples(25), deadline=None)
@given(st.lists(_PIECES, min_size=1, max_size=8).map("".join))
def test_the_outcome_follows_the_ids(bare: ctxlock.Model, gguf: ctxlock.Model, template: ChatTemplate, text: str):
    ra, rb = _record(bare, text, template), _record(gguf, text, template)
    ia, ib = ra.data["input_ids"], rb.data["input_ids"]
    result = diff(ra, rb)
    assert result.ids["equal"] == (ia == ib)
    assert result.kind == (SAME_IDS if ia == ib else DIVERGED)
    assert result.first_divergence.layer == "tokenizer"
    assert "the normalizer differs: none vs NFC" in result.first_divergence.cause
    if ia != ib:
        i = result.ids["first_difference"]
        assert ia[:i] == ib[:i] and (i == min(len(ia), len(ib)) or ia[i] != ib[i])
