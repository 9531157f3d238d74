"""The layer comparers of ctxlock.records (`COMPARERS`): one per layer, and together they read every section a record
has (or `NOT_COMPARED` says why a section is not compared)."""

from __future__ import annotations

import copy
import json

import pytest

import ctxlock
from ctxlock.errors import CtxlockError
from ctxlock.records import COMPARERS, LAYERS, NOT_COMPARED, ExecutionRecord, RunOptions, build_record, diff
from ctxlock.records._replay import run_and_record

REQUEST = {"messages": [{"role": "system", "content": "简洁回答"}, {"role": "user", "content": "天空为什么是蓝色？"}]}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ctxlock-cache"))


@pytest.fixture(scope="module")
def model() -> ctxlock.Model:
    return ctxlock.load("book")


def _run_record(model: ctxlock.Model) -> ExecutionRecord:
    raw = json.dumps(REQUEST, ensure_ascii=False).encode("utf-8")
    _, rec, _ = run_and_record(model, raw, RunOptions(now="2024-07-26T10:00:00"))
    return rec


def test_every_layer_has_one_comparer_in_pipeline_order() -> None:
    assert tuple(COMPARERS) == LAYERS
    assert all(COMPARERS[layer].layer == layer for layer in LAYERS)


def test_the_comparers_cover_every_section_build_record_writes(model: ctxlock.Model) -> None:
    read = {section for c in COMPARERS.values() for section in c.reads}
    assert not read & set(NOT_COMPARED)
    ran = _run_record(model)
    failed = build_record(
        model=model,
        request_bytes=b"{",
        options=RunOptions(),
        error=CtxlockError("not JSON", path="request"),
    )
    covered = read | set(NOT_COMPARED)
    assert set(ran.data) == covered, sorted(set(ran.data) ^ covered)
    assert set(failed.data) <= covered, sorted(set(failed.data) - covered)  # a failed run has no `tokens`


def test_each_comparer_reports_its_own_layer(model: ctxlock.Model) -> None:
    """A change inside one section a comparer reads is found by that comparer, and diff names its layer."""
    base = _run_record(model).data
    changes = {
        "request": lambda d: d["request"]["canonical"]["messages"][1].update(content="why?"),
        "policy": lambda d: d["decisions"].update(truncation={"dropped": 1}),
        "messages": lambda d: d["messages"][1].update(content="why?"),
        "dynamic": lambda d: d["dynamic"].update(tools=[{"type": "function"}]),
        "template": lambda d: d["template"].update(sha256="0" * 64),
        "rendered": lambda d: d["rendered"].update(text=d["rendered"]["text"] + "!"),
        "tokenizer": lambda d: d["tokenizer"].update(special_tokens={"bos_token": "<x>"}),
        "multimodal": lambda d: d.update(multimodal={"family": "qwen2-vl", "images": [], "spans": []}),
        "input_ids": lambda d: d["input_ids"].append(0),
        "tensors": lambda d: d["tensors"].update(padding="left"),
    }
    assert set(changes) == set(LAYERS)
    for layer, change in changes.items():
        other = copy.deepcopy(base)
        change(other)
        assert COMPARERS[layer].compare(base, other) is not None, layer
        assert COMPARERS[layer].compare(base, base) is None, layer
        found = diff(base, other)
        assert found.first_divergence is not None and found.first_divergence.layer == layer, (layer, found)
