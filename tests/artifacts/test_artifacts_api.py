"""`ctxlock.artifacts`: every load path (built-in name, HF directory, GGUF file, ctxlock.json manifest of each
format, hub cache is covered by tests/artifacts/test_hub.py), what a load returns, containment, and the load caches."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import fetched
from ctxlock import caches
from ctxlock.artifacts import (
    BUILTIN_DIR,
    DEFAULT_MODEL,
    GGUFTokenizer,
    ModelArtifacts,
    builtin_models,
    inside,
    load_artifacts,
    load_gguf,
    load_template_file,
)
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError, PathTraversalError
from ctxlock.tokenizer.backends._book import BookTokenizer
from ctxlock.tokenizer.backends._hf import HFTokenizer
from ctxlock.tokenizer.backends._sentencepiece import SentencePieceTokenizer
from ctxlock.tokenizer.backends._tekken import TekkenTokenizer
from ctxlock.tokenizer.backends._tiktoken_file import TiktokenTokenizer

MISTRAL_DATA = Path(__import__("mistral_common").__file__).resolve().parent / "data"


def test_builtin_models() -> None:
    names = dict(builtin_models())
    assert set(names) == {"book", "gpt-oss", "mistral-nemo"} and all(names.values())
    assert DEFAULT_MODEL == "mistral-nemo" and (BUILTIN_DIR / DEFAULT_MODEL / "ctxlock.json").is_file()


def test_the_default_model_is_mistral_nemo_with_its_generated_template() -> None:
    m = load_artifacts()
    assert isinstance(m, ModelArtifacts)
    assert m.id == "mistral-nemo" and isinstance(m.tokenizer, TekkenTokenizer)
    assert m.templates is not None and m.templates.names == ("default",)
    assert m.templates.templates[0].origin.startswith("mistral_common ")
    assert m.special_tokens["bos_token"] == "<s>"
    assert load_artifacts("mistral-nemo") is m  # cached: same directory, same files


def test_the_book_model() -> None:
    m = load_artifacts("book")
    assert isinstance(m.tokenizer, BookTokenizer) and m.tokenizer.id == "book"
    ids = m.tokenizer.encode(
        "<bos><system>简洁回答</system><user>天空为什么是蓝色？</user><assistant>", parse_special=True
    )
    assert ids == [1, 2, 7, 3, 4, 8, 9, 10, 11, 12, 5, 6]
    desc = m.describe()
    assert desc["tokenizer"]["format"] == "book" and desc["control_tokens"] == len(m.tokenizer.control_tokens)


def test_an_hf_directory() -> None:
    path = fetched.hf_tokenizer_dir("qwen2")
    m = load_artifacts(path)
    assert isinstance(m.tokenizer, HFTokenizer) and type(m.tokenizer) is HFTokenizer
    assert m.id == path.name and m.source == str(path.resolve())
    assert m.templates is not None and m.templates.names == ("default",)
    desc = m.tokenizer.describe()
    assert desc["tokenizer_class"] and desc["pipeline"] == "class" and len(desc["file_sha256"]) == 64
    assert m.pad_id == (
        m.tokenizer.token_to_id(m.special_tokens["pad_token"]) if "pad_token" in m.special_tokens else None
    )
    as_file = load_artifacts(path, tokenizer_pipeline="file")
    assert as_file.tokenizer.describe()["pipeline"] == "file"
    with pytest.raises(ValueError):
        load_artifacts(path, tokenizer_pipeline="both")


def test_a_gguf_file() -> None:
    path = fetched.gguf_path("llama-bpe")
    m = load_artifacts(path)
    assert isinstance(m.tokenizer, GGUFTokenizer) and m.tokenizer.format == "gguf"
    assert m.id == path.name and m.tokenizer.id == path.name
    assert m.tokenizer.replay_spec() == ({"format": "gguf", "file": path.name}, {path.name: path.resolve()})
    desc = m.tokenizer.describe()
    assert desc["gguf_model"] == "gpt2" and desc["architecture"]
    direct = load_gguf(path.resolve())
    assert direct.tokenizer.sha256 == m.tokenizer.sha256
    assert direct.tokenizer.encode("Hello world") == m.tokenizer.encode("Hello world")


def _manifest_dir(tmp_path: Path, tokenizer: dict, **extra: object) -> Path:
    (tmp_path / "ctxlock.json").write_text(json.dumps({"tokenizer": tokenizer, **extra}), "utf-8")
    return tmp_path


def test_manifests_of_every_file_format(tmp_path: Path) -> None:
    gguf = fetched.gguf_path("llama-bpe")
    shutil.copyfile(gguf, tmp_path / "m.gguf")
    shutil.copyfile(fetched.qwen_tiktoken_path(), tmp_path / "qwen.tiktoken")
    shutil.copyfile(MISTRAL_DATA / "mistral_instruct_tokenizer_240323.model.v3", tmp_path / "t.model.v3")
    cases = {
        "gguf": ({"format": "gguf", "file": "m.gguf"}, GGUFTokenizer),
        "tiktoken": ({"format": "tiktoken", "file": "qwen.tiktoken", "preset": "qwen"}, TiktokenTokenizer),
        "sentencepiece": ({"format": "sentencepiece", "file": "t.model.v3"}, SentencePieceTokenizer),
        "tekken": (
            {"format": "tekken", "package": "mistral_common", "resource": "data/tekken_240911.json"},
            TekkenTokenizer,
        ),
    }
    for name, (spec, cls) in cases.items():
        root = tmp_path / name
        root.mkdir()
        for f in ("m.gguf", "qwen.tiktoken", "t.model.v3"):
            os.link(tmp_path / f, root / f)  # a symlink out of the directory would be refused
        template = root / "t.jinja"
        template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}", "utf-8")
        m = load_artifacts(_manifest_dir(root, spec, template="t.jinja", special_tokens={"eos_token": "</s>"}))
        assert type(m.tokenizer) is cls, name
        assert m.templates is not None and m.templates.templates[0].id == f"{name}/t.jinja"
        assert m.special_tokens == {"eos_token": "</s>"}
        assert m.tokenizer.replay_spec()[0]["format"] == name


@pytest.mark.parametrize(
    ("tokenizer", "error", "where"),
    [
        ({"format": "tiktoken", "file": "absent.tiktoken", "preset": "qwen"}, ArtifactNotFoundError, "tokenizer.file"),
        ({"format": "tiktoken", "file": "../outside", "preset": "qwen"}, PathTraversalError, "tokenizer.file"),
        ({"format": "sentencepiece", "file": ""}, ArtifactFormatError, "tokenizer.file"),
        ({"format": "book", "vocab": ["a"], "control": [], "unk": "b"}, ArtifactFormatError, "tokenizer.unk"),
        ({"format": "book", "vocab": "ab", "control": [], "unk": "a"}, ArtifactFormatError, "tokenizer.vocab"),
        (
            {"format": "tekken", "package": "no-such-package!", "resource": "x"},
            ArtifactFormatError,
            "tokenizer.package",
        ),
        ({"file": "x"}, ArtifactFormatError, "tokenizer"),
    ],
)
def test_manifest_errors_name_the_key(tmp_path: Path, tokenizer: dict, error: type, where: str) -> None:
    root = tmp_path / "model"
    root.mkdir()
    with pytest.raises(error) as info:
        load_artifacts(_manifest_dir(root, tokenizer))
    assert info.value.path == f"{root / 'ctxlock.json'}:{where}"


def test_specs_that_are_not_models(tmp_path: Path) -> None:
    with pytest.raises(ArtifactNotFoundError) as info:
        load_artifacts(str(tmp_path / "nothing-here"))
    assert "built-in models: book, gpt-oss, mistral-nemo" in (info.value.hint or "")
    text = tmp_path / "notes.txt"
    text.write_text("hi", "utf-8")
    with pytest.raises(ArtifactFormatError):
        load_artifacts(text)


def test_inside_refuses_escapes(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}", "utf-8")
    assert inside(tmp_path, "a.json", field="f", config=tmp_path / "c.json") == (tmp_path / "a.json").resolve()
    (tmp_path / "link.json").symlink_to("/etc/hostname")
    with pytest.raises(PathTraversalError) as info:
        inside(tmp_path, "link.json", field="f", config=tmp_path / "c.json")
    assert info.value.path == f"{tmp_path / 'c.json'}:f"


def test_load_template_file_keeps_the_file_digest(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_bytes(b"{{ messages[0].content }}\r\n")
    t = load_template_file(path)
    assert t.id == "t.jinja" and t.line_endings and len(t.file_sha256) == 64


def test_loads_are_registered_caches_and_clear_with_the_artifact_scope() -> None:
    first = load_artifacts("book")
    info = caches.cache_info()
    assert info["artifacts.models"].scope == "artifact" and info["artifacts.models"].size >= 1
    assert "artifacts.hub_models" in info
    caches.clear_caches("artifact")
    assert caches.cache_info()["artifacts.models"].size == 0
    again = load_artifacts("book")
    assert again is not first and again.tokenizer.sha256 == first.tokenizer.sha256
