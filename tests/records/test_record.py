"""Execution records: canonical serialization, replay from the store alone, and `diff` on every row of the seed's
failure table (000 §1.10)."""

from __future__ import annotations

import copy
import json
import random
import shutil
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
import mm_fixtures
from conformance import FIXED_NOW, conversations
from ctxlock import caches
from ctxlock.errors import RecordFormatError
from ctxlock.records import ExecutionRecord, RunOptions, canonical_bytes, diff
from ctxlock.records._replay import image_options, load_record, replay, rerun, run_and_record, save
from ctxlock.records._store import Store
from ctxlock.template._render import ChatTemplate
from hypothesis_profiles import examples

QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ctxlock-cache"))


def _record(model: ctxlock.Model, request: dict | bytes, **options) -> ExecutionRecord:
    raw = request if isinstance(request, bytes) else json.dumps(request, ensure_ascii=False).encode("utf-8")
    template = options.pop("template", None)
    _, rec, _ = run_and_record(model, raw, RunOptions(**options), template=template)
    return rec


# -- canonical serialization -------------------------------------------------------------------------------------


def _shuffled(value, rng: random.Random):
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@settings(max_examples=examples(40), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), text=st.text(max_size=40))
def test_same_record_same_id_whatever_the_dict_order(seed: int, text: str) -> None:
    model = ctxlock.load("book")
    rec = _record(model, {"messages": [{"role": "user", "content": text}]}, now="2024-07-26T10:00:00")
    again = ExecutionRecord.from_data(_shuffled(rec.data, random.Random(seed)))
    assert again.id == rec.id and again.body == rec.body
    assert rec.body.endswith(b"\n") and b"\n" not in rec.body[:-1] and b"\r" not in rec.body
    assert rec.body == canonical_bytes(json.loads(rec.body))


def test_record_is_stable_across_runs() -> None:
    model = ctxlock.load("book")
    req = {"messages": [{"role": "system", "content": "简洁回答"}, {"role": "user", "content": "天空为什么是蓝色？"}]}
    a = _record(model, req, now="2024-07-26T10:00:00")
    b = _record(model, req, now="2024-07-26T10:00:00")
    assert a.id == b.id
    data = a.data
    assert data["format"] == "ctxlock.record/2"
    assert data["input_ids"] == [1, 2, 7, 3, 4, 8, 9, 10, 11, 12, 5, 6]
    assert all(isinstance(i, int) for i in data["input_ids"] + data["tensors"]["position_ids"][0])
    assert data["tensors"]["valid_lengths"] == [12]
    assert data["decisions"] == {"budget": None, "truncation": None, "multimodal": None}
    assert data["environment"]["unicodedata"]
    assert set(data) >= {"request", "messages", "dynamic", "template", "rendered", "tokenizer", "options", "errors"}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b'{"format": "ctxlock.record/1"',
        b"\xff\xfe",
        b"[]",
        b'{"format": "other/9"}',
        b'{"format": "ctxlock.record/1"}',
    ],
)
def test_corrupt_or_truncated_record_is_a_typed_error(raw: bytes) -> None:
    with pytest.raises(RecordFormatError):
        ExecutionRecord.from_bytes(raw)


# -- replay ------------------------------------------------------------------------------------------------------


def test_replay_every_conformance_conversation_after_the_model_dir_is_gone(tmp_path: Path, store: Store) -> None:
    model_dir = tmp_path / "qwen2-model"
    shutil.copytree(fetched.hf_tokenizer_dir("qwen2"), model_dir)
    template = ChatTemplate((fetched.templates_dir() / QWEN25).read_text("utf-8"), id=QWEN25)
    model = ctxlock.load(str(model_dir))
    ids = []
    for _name, data, options in conversations():
        raw = json.dumps(data, ensure_ascii=False).encode()
        opts = RunOptions(now=FIXED_NOW.isoformat(), **options)
        _, rec, _ = run_and_record(model, raw, opts, template=template)
        ids.append(save(store, model, rec, template))
    shutil.rmtree(model_dir)
    assert not model_dir.exists()
    # Each replay first runs the book fixture on the built-in `book` model, which stays in the model cache as any
    # model loaded by name does: loaded here, so that the count below holds when this test runs alone too.
    ctxlock.load("book")
    cached = caches.cache_info()["artifacts.models"].size
    for rid in ids:
        result, _ = replay(load_record(rid, store), store)
        assert result.identical, result.to_dict()
    # A model rebuilt for a replay lives as long as the replay: none is left in the model cache under the path of
    # a directory that is gone (each cost about 100 MB).
    assert caches.cache_info()["artifacts.models"].size == cached


def test_replay_of_gguf_and_default_models(store: Store) -> None:
    for spec in (str(fetched.gguf_path("llama-spm")), None, "book"):
        model = ctxlock.load(spec)
        req = {"messages": [{"role": "user", "content": "Hello [INST] <s> 天空"}]}
        template = None if model.templates is not None else ChatTemplate("{{ messages[0].content }}", id="plain")
        _, rec, _ = run_and_record(model, json.dumps(req).encode(), RunOptions(), template=template)
        rid = save(store, model, rec, template or model.templates.select(None))
        result, _ = replay(load_record(rid, store), store)
        assert result.identical, result.to_dict()


def test_replay_reports_a_tampered_record(store: Store) -> None:
    model = ctxlock.load("book")
    rec = _record(model, {"messages": [{"role": "user", "content": "天空"}]})
    save(store, model, rec, model.templates.select(None))
    data = rec.data
    data["input_ids"][1] = 99
    tampered = ExecutionRecord.from_data(data)
    result, _ = replay(tampered, store)
    assert not result.identical
    assert result.first_divergence.layer == "input_ids"
    assert result.first_divergence.location.startswith("token 1 ")


# -- the seed's failure table -----------------------------------------------------------------------------------


def test_row_invalid_utf8_replaced_instead_of_rejected() -> None:
    model = ctxlock.load("book")
    raw = b'{"messages":[{"role":"user","content":"\xe5\xa4\xa9\xff\xe7\xa9\xba"}]}'
    strict = _record(model, raw, utf8="strict")
    replaced = _record(model, raw, utf8="replace")
    assert strict.data["errors"][0]["type"] == "RequestEncodingError"
    d = diff(strict, replaced).first_divergence
    assert (d.layer, d.location) == ("request", "byte 42")  # after 39 bytes of JSON and the 3 of 天
    assert "UTF-8 policy differs (strict vs replace)" in d.cause
    assert "replaced bytes at [42]" in d.b


def test_row_template_alias_points_to_a_new_version(tmp_path: Path) -> None:
    model = ctxlock.load("book")
    req = {"messages": [{"role": "user", "content": "天空"}]}
    v1 = ChatTemplate(model.templates.select(None).source, id="chat_template.jinja")
    v2 = ChatTemplate(v1.source.replace("<user>", "<user>\n"), id="chat_template.jinja")  # same name, new version
    d = diff(_record(model, req, template=v1), _record(model, req, template=v2)).first_divergence
    assert d.layer == "template"
    assert d.cause.startswith(f"template sha256 differs: {v1.sha256[:4]}… vs {v2.sha256[:4]}…")
    assert "the same template id now points to another version" in d.cause


def test_row_tool_schema_keys_in_another_order() -> None:
    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    template = ChatTemplate((fetched.templates_dir() / QWEN25).read_text("utf-8"), id=QWEN25)
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    reordered = {"required": ["city"], "properties": {"city": {"type": "string"}}, "type": "object"}
    base = {"messages": [{"role": "user", "content": "weather?"}]}
    a = {**base, "tools": [{"type": "function", "function": {"name": "w", "parameters": params}}]}
    b = {**base, "tools": [{"type": "function", "function": {"name": "w", "parameters": reordered}}]}
    ra = _record(model, a, template=template, now="2024-07-26T10:00:00")
    rb = _record(model, b, template=template, now="2024-07-26T10:00:00")
    d = diff(ra, rb).first_divergence
    assert d.layer == "rendered"  # the same JSON to a parser; different bytes to the tokenizer
    text = ra.data["rendered"]["text"]
    offset = text.index('"parameters": {') + len('"parameters": {"')
    assert d.location.startswith(f"byte {len(text[:offset].encode()):,} ")
    assert (d.a, d.b) == ("t", "r")


def test_row_tokenizer_vocabulary_does_not_match() -> None:
    template = ChatTemplate((fetched.templates_dir() / QWEN25).read_text("utf-8"), id=QWEN25)
    req = {"messages": [{"role": "user", "content": "Why is the sky blue?"}]}
    ra = _record(ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2"))), req, template=template, now="2024-07-26")
    rb = _record(ctxlock.load(str(fetched.hf_tokenizer_dir("llama-bpe"))), req, template=template, now="2024-07-26")
    d = diff(ra, rb).first_divergence
    assert d.layer == "tokenizer"
    assert "a different tokenizer vocabulary" in d.cause


def test_row_padding_or_position_ids_misaligned() -> None:
    model = ctxlock.load("book")
    rec = _record(model, {"messages": [{"role": "user", "content": "天空"}]})
    data = copy.deepcopy(rec.data)
    data["tensors"]["position_ids"][0] = [p + 1 for p in data["tensors"]["position_ids"][0]]  # off by one
    d = diff(rec, ExecutionRecord.from_data(data)).first_divergence
    assert (d.layer, d.location) == ("tensors", "position_ids[0][0]")
    assert (d.a, d.b) == (0, 1)


def test_row_injected_clock_changed() -> None:
    model = ctxlock.load("book")
    template = ChatTemplate("{{ strftime_now('%d %b %Y') }}{{ messages[0].content }}", id="dated")
    req = {"messages": [{"role": "user", "content": "天空"}]}
    a = _record(model, req, template=template, now="2024-07-26T10:00:00")
    b = _record(model, req, template=template, now="2024-07-27T10:00:00")
    d = diff(a, b).first_divergence
    assert (d.layer, d.location) == ("dynamic", "dynamic.now")
    # A clock the template never reads is not a divergence.
    plain = ChatTemplate("{{ messages[0].content }}", id="plain")
    assert diff(_record(model, req, template=plain, now="2024-07-26"), _record(model, req, template=plain)).identical


def test_row_truncation_breaks_a_tool_call_and_its_result() -> None:
    """The row can no longer happen (fit_context keeps a call and its results together), and two records whose
    budget decisions differ are reported at the policy layer."""
    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    template = ChatTemplate((fetched.templates_dir() / QWEN25).read_text("utf-8"), id=QWEN25)
    call = {"id": "call00001", "type": "function", "function": {"name": "lookup", "arguments": {"q": "sky"}}}
    req = {
        "messages": [
            {"role": "user", "content": "Why is the sky blue? " * 5},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call00001", "content": "Rayleigh scattering. " * 30},
            {"role": "assistant", "content": "Because of Rayleigh scattering."},
            {"role": "user", "content": "And sunsets?"},
        ]
    }
    records = {}
    for budget in (60, 400):
        rec = _record(model, req, template=template, now="2024-07-26", budget={"max_input_tokens": budget})
        msgs = rec.data["messages"]
        kept_calls = {c["id"] for m in msgs for c in m.get("tool_calls", [])}
        kept_results = {m["tool_call_id"] for m in msgs if m["role"] == "tool"}
        assert kept_calls == kept_results  # together or not at all
        assert rec.data["decisions"]["budget"]["input_tokens"] <= budget
        records[budget] = rec
    assert len(records[60].data["messages"]) < len(records[400].data["messages"])
    d = diff(records[60], records[400]).first_divergence
    assert d.layer == "policy"


def _image_record(model: ctxlock.Model, data: bytes, *, media: dict | None = None, url: str | None = None):
    part = {"type": "image_url", "image_url": {"url": url or mm_fixtures.data_url(data)}}
    raw = json.dumps({"messages": [{"role": "user", "content": [part, {"type": "text", "text": "What?"}]}]})
    options = RunOptions(now="2024-07-26", images=image_options(model, media))
    result, rec, error = run_and_record(model, raw.encode("utf-8"), options, media=media)
    assert error is None, error
    return result, rec


def test_row_image_reencoded_or_rotated(tmp_path: Path) -> None:
    base = mm_fixtures.noise(320, 200, seed=11)
    png = mm_fixtures.png(base)
    model = ctxlock.load(str(mm_fixtures.build_qwen2vl_dir(tmp_path / "qwen2-vl", mm_fixtures.HUB_PREPROCESSOR)))
    _, a = _image_record(model, png)
    assert diff(a, _image_record(model, png)[1]).identical
    # re-encoded: other bytes (a JPEG), the same size, pixels close
    found = diff(a, _image_record(model, mm_fixtures.encode(base, "JPEG", quality=95))[1]).first_divergence
    assert found.layer == "multimodal" and found.cause.startswith("image re-encoded"), found
    # rotated: the same pixels carrying an EXIF orientation
    found = diff(a, _image_record(model, mm_fixtures.with_orientation(base, 6))[1]).first_divergence
    assert found.layer == "multimodal" and found.cause.startswith("image rotated: EXIF orientation 1 -> 6"), found
    # resize policy changed: the same bytes under another max_pixels
    other_dir = mm_fixtures.build_qwen2vl_dir(
        tmp_path / "qwen2-vl-small", {**mm_fixtures.HUB_PREPROCESSOR, "max_pixels": 200 * 28 * 28}
    )
    found = diff(a, _image_record(ctxlock.load(str(other_dir)), png)[1]).first_divergence
    assert found.layer == "multimodal" and found.cause == "resize policy changed", found
    assert found.location == "multimodal.images[0].plan.params.max_pixels"
    # replaced: another picture of the same size
    found = diff(a, _image_record(model, mm_fixtures.png(mm_fixtures.noise(320, 200, seed=12).rotate(90)))[1])
    assert found.first_divergence.layer == "multimodal"
    assert found.first_divergence.cause.startswith("image replaced"), found


def test_replay_of_a_multimodal_record_after_the_image_file_is_deleted(tmp_path: Path, store: Store) -> None:
    model = ctxlock.load(str(mm_fixtures.build_qwen2vl_dir(tmp_path / "qwen2-vl", mm_fixtures.HUB_PREPROCESSOR)))
    image_file = tmp_path / "cat.jpg"
    image_file.write_bytes(mm_fixtures.encode(mm_fixtures.noise(640, 480, seed=4), "JPEG"))
    url = "https://example.com/cat.jpg"
    media = {url: image_file.read_bytes()}
    mm, rec = _image_record(model, b"", media=media, url=url)
    section = rec.data["multimodal"]
    image = section["images"][0]
    assert image["header"]["sha256"] == rec.data["options"]["images"]["media"][url]
    assert image["decode"]["decoder"].startswith("Pillow ")
    assert image["plan"]["params"]["max_pixels"] == 12845056 and image["plan"]["params"]["image_mean"]
    assert image["pixel_values"]["sha256"] == mm.images[0].pixels.pixel_sha256
    assert section["spans"][0]["tokens"] == list(mm.span_map()[0])
    assert rec.data["input_ids"] == list(mm.ids)  # the expanded ids: what the model received
    save(store, model, rec, model.templates.select(None), media=media)
    image_file.unlink()
    result, again = replay(load_record(rec.id, store), store)
    assert result.identical, result.first_divergence
    assert again.data["multimodal"]["images"][0]["pixel_values"] == image["pixel_values"]  # recomputed


def test_rerun_under_another_template(store: Store) -> None:
    model = ctxlock.load("book")
    rec = _record(model, {"messages": [{"role": "user", "content": "天空"}]})
    save(store, model, rec, model.templates.select(None))
    same = rerun(rec, model_spec=None, template_file=None, store=store)
    assert diff(rec, same).identical
    other = rerun(rec, model_spec=str(fetched.hf_tokenizer_dir("qwen2")), template_file=None, store=store)
    assert diff(rec, other).first_divergence.layer == "template"
    assert datetime.fromisoformat(rec.data["dynamic"]["now"])


def test_fitted_multimodal_record_replays(tmp_path: Path, store: Store) -> None:
    model = ctxlock.load(str(mm_fixtures.build_qwen2vl_dir(tmp_path / "qwen2-vl", mm_fixtures.HUB_PREPROCESSOR)))
    turns = []
    for k in range(3):
        url = mm_fixtures.data_url(mm_fixtures.png(mm_fixtures.noise(640, 480, seed=k)))
        turns += [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}],
            },
            {"role": "assistant", "content": f"picture {k}"},
        ]
    turns.append({"role": "user", "content": "compare"})
    raw = json.dumps({"messages": turns}).encode("utf-8")
    options = RunOptions(now="2024-07-26", images=image_options(model), budget={"max_input_tokens": 900})
    fitted, rec, error = run_and_record(model, raw, options)
    assert error is None, error
    assert len(rec.data["multimodal"]["images"]) == 2  # the oldest image's turn was dropped whole
    assert len(rec.data["input_ids"]) == fitted.input_tokens <= 900
    assert rec.data["input_ids"] == rec.data["tensors"]["input_ids"][0]
    save(store, model, rec, model.templates.select(None))
    result, _ = replay(load_record(rec.id, store), store)
    assert result.identical, result.first_divergence
