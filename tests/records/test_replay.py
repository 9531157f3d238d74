"""`ctxlock.records._replay`: a real record, saved to a store, replays from the store alone to identical ids, whatever
options it was made with (the record's `options` are read back as `RenderOptions`); `rerun` runs it again under
another template; the seed fixture is checked first."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import ctxlock
from ctxlock.records import IDENTICAL, ExecutionRecord, RunOptions
from ctxlock.records._replay import (
    BOOK_FIXTURE_IDS,
    check_book_fixture,
    load_record,
    replay,
    rerun,
    run_and_record,
    save,
)
from ctxlock.records._store import Store
from ctxlock.template._options import RenderOptions
from ctxlock.template._render import DEFAULT_LIMITS, ChatTemplate

NOW = "2026-01-02T03:04:05+09:00"
REQUEST = {
    "messages": [
        {"role": "system", "content": "简洁回答"},
        {"role": "user", "content": "天空为什么是蓝色？"},
        {"role": "assistant", "content": "简洁回答"},
        {"role": "user", "content": "天空"},
    ]
}
RAW = json.dumps(REQUEST, ensure_ascii=False).encode("utf-8")


@pytest.fixture(scope="module")
def book() -> ctxlock.Model:
    return ctxlock.load("book")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "store")
    yield s
    s.close()


def _record(model: ctxlock.Model, store: Store, options: RunOptions) -> tuple[ExecutionRecord, list[int]]:
    result, record, error = run_and_record(model, RAW, options)
    assert error is None
    rendered = result.rendered
    rid = save(store, model, record, rendered.template)
    assert rid == record.id
    ids = list(result.model_input.input_ids[0].tolist())
    return load_record(rid[:12], store), ids


@pytest.mark.parametrize(
    "options",
    [
        RunOptions(now=NOW),
        RunOptions(now=NOW, render_seed=5, special_tokens="keep", utf8="replace", dialect="openai"),
        RunOptions(now=NOW, add_generation_prompt=False, chat_template_kwargs={"mode": "x"}),
        RunOptions(now=NOW, limits={**DEFAULT_LIMITS.to_dict(), "max_seconds": 3.0}, content_format="string"),
        RunOptions(),  # the wall clock: recorded in `dynamic.now`, and replay reads it back
    ],
    ids=["plain", "policy", "no-prompt", "limits", "wall-clock"],
)
def test_a_record_replays_to_identical_ids(book: ctxlock.Model, store: Store, options: RunOptions) -> None:
    record, ids = _record(book, store, options)
    result, again = replay(record, store)
    assert result.kind == IDENTICAL and result.identical, result.to_dict()
    assert result.ids is not None and result.ids["equal"]
    assert again.data["input_ids"] == record.data["input_ids"]
    assert result.fixture is not None and result.fixture["ids"] == list(BOOK_FIXTURE_IDS)
    assert record.data["options"] == options.to_dict()
    # What replay ran with is what the record says.
    ran = RenderOptions.from_record(record.data["options"])
    expected = {k: v for k, v in options.to_dict().items() if k not in ("budget", "sampling")}
    assert ran.to_record() == {"limits": None, **expected}
    assert list(book.encode(RAW, ran).input_ids[0]) == ids


def test_a_fitted_record_replays(book: ctxlock.Model, store: Store) -> None:
    options = RunOptions(now=NOW, budget={"max_input_tokens": 9})
    fitted, record, error = run_and_record(book, RAW, options)
    assert error is None and fitted.input_tokens <= 9
    save(store, book, record, fitted.rendered.template)
    result, _ = replay(load_record(record.id, store), store)
    assert result.identical, result.to_dict()


def test_rerun_under_another_template(book: ctxlock.Model, store: Store, tmp_path: Path) -> None:
    record, _ = _record(book, store, RunOptions(now=NOW))
    other = tmp_path / "other.jinja"
    other.write_text("{% for m in messages %}<user>{{ m.content }}</user>{% endfor %}", "utf-8")
    again = rerun(record, model_spec=None, template_file=other, store=store)
    assert again.data["options"] == record.data["options"]
    assert again.data["input_ids"] != record.data["input_ids"]
    same = rerun(record, model_spec=None, template_file=None, store=store)
    assert same.data["input_ids"] == record.data["input_ids"]


def test_a_failed_run_is_recorded(book: ctxlock.Model) -> None:
    raw = json.dumps({"messages": [{"role": "user", "content": "<bos>"}]}).encode()
    result, record, error = run_and_record(book, raw, RunOptions(now=NOW, special_tokens="raise"))
    assert result is None and isinstance(error, ctxlock.CtxlockError)
    assert record.data["errors"] and record.data["options"]["special_tokens"] == "raise"


def test_the_seed_fixture() -> None:
    assert check_book_fixture()["ids"] == list(BOOK_FIXTURE_IDS)


def test_a_template_given_beside_the_record_wins(book: ctxlock.Model) -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", id="plain")
    run, _, error = run_and_record(book, RAW, RunOptions(now=NOW, template_name="nope"), template=template)
    assert error is None and run.rendered.template == template
