"""The tokenizer seam: every registered backend implements the whole `Tokenizer` protocol and declares its optional
capabilities (`TokenizerBase`), a manifest entry from `replay_spec` rebuilds the same tokenizer through the
registry, and no module in src/ probes a tokenizer with `getattr`/`hasattr`."""

from __future__ import annotations

import ast
import inspect
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import ctxlock
import fetched
from ctxlock.artifacts import load_artifacts
from ctxlock.artifacts._registry import BACKENDS, backend
from ctxlock.errors import ArtifactFormatError
from ctxlock.tokenizer import PieceView, TokenBytes, Tokenizer, TokenizerBase
from ctxlock.tokenizer.backends._sentencepiece import SentencePieceTokenizer
from ctxlock.tokenizer.backends._tiktoken_file import TIKTOKEN_PRESETS, TiktokenTokenizer

SRC = Path(ctxlock.__file__).resolve().parent
MISTRAL_DATA = Path(__import__("mistral_common").__file__).resolve().parent / "data"

# Members every backend defines itself (not inherited from TokenizerBase's "not here" defaults).
REQUIRED = (
    "vocab_size",
    "added_tokens",
    "control_tokens",
    "encode",
    "decode",
    "token_to_id",
    "id_to_token",
    "encode_matched",
    "encode_text",
    "token_bytes",
    "decode_pieces",
    "describe",
    "replay_spec",
    "from_manifest",
)
# Members of the protocol; each is declared on TokenizerBase or defined by every backend.
PROTOCOL = (
    *REQUIRED,
    "id",
    "format",
    "sha256",
    "source",
    "eos_id",
    "engine",
    "whole_text",
    "whole_text_engine",
    "truncation",
    "split_controls",
    "encode_text_batch",
    "pipeline",
)


def _instances() -> dict[str, Tokenizer]:
    qwen = fetched.qwen_tiktoken_path()
    return {
        "book": load_artifacts("book").tokenizer,
        "tekken": load_artifacts("mistral-nemo").tokenizer,
        "tiktoken": TiktokenTokenizer(qwen, **TIKTOKEN_PRESETS["qwen"], id="qwen.tiktoken"),
        "sentencepiece": SentencePieceTokenizer(
            MISTRAL_DATA / "mistral_instruct_tokenizer_240323.model.v3", id="mistral-v3"
        ),
        "gguf": load_artifacts(fetched.gguf_path("llama-bpe")).tokenizer,
        "hf-tokenizers": load_artifacts(fetched.hf_tokenizer_dir("qwen2")).tokenizer,
    }


@pytest.fixture(scope="module")
def instances() -> dict[str, Tokenizer]:
    return _instances()


def test_registry_maps_each_format_to_a_backend_class() -> None:
    assert sorted(BACKENDS) == ["book", "gguf", "hf-tokenizers", "sentencepiece", "tekken", "tiktoken"]
    for fmt, cls in BACKENDS.items():
        assert backend(fmt) is cls
        assert issubclass(cls, TokenizerBase)
        assert cls.format == fmt, f"{cls.__name__}.format is {cls.format!r}, registered as {fmt!r}"
    assert backend("nope") is None
    assert backend(["hf-tokenizers"]) is None  # type: ignore[arg-type]  # a manifest may hold anything


@pytest.mark.parametrize("fmt", sorted(BACKENDS))
def test_every_backend_defines_the_required_members(fmt: str) -> None:
    cls = BACKENDS[fmt]
    for name in REQUIRED:
        owner = next(c for c in cls.__mro__ if name in c.__dict__)
        assert owner is not TokenizerBase and owner is not object, f"{cls.__name__} inherits {name} from {owner}"
    for name in PROTOCOL:
        assert any(name in c.__dict__ or name in getattr(c, "__annotations__", {}) for c in cls.__mro__), name


def test_the_protocol_lists_every_member_the_base_declares() -> None:
    declared = {n for n in vars(TokenizerBase) if not n.startswith("_")} | set(TokenizerBase.__annotations__)
    assert declared <= set(PROTOCOL)
    protocol_members = {n for n in vars(Tokenizer) if not n.startswith("_")} | set(Tokenizer.__annotations__)
    assert set(PROTOCOL) - {"from_manifest"} <= protocol_members


@pytest.mark.parametrize("fmt", sorted(BACKENDS))
def test_each_instance_implements_the_protocol_and_its_capabilities(instances, fmt: str) -> None:
    tok = instances[fmt]
    assert type(tok) is BACKENDS[fmt]
    assert isinstance(tok, Tokenizer)
    assert tok.format == fmt and tok.id and len(tok.sha256) == 64
    assert isinstance(tok.engine, str) and isinstance(tok.whole_text_engine, str)
    assert tok.eos_id is None or 0 <= tok.eos_id < tok.vocab_size
    assert tok.truncation is None or isinstance(tok.truncation, dict)
    assert set(tok.pipeline()) == {"normalizer", "pre_tokenizer"}
    text = "Hello, world: 天空 ok"
    split = tok.split_controls(text)
    assert split is None or split == []  # no control token in the text
    assert tok.encode_text_batch([text, "x y"], [True, False]) == [
        tok.encode_text(text, at_start=True),
        tok.encode_text("x y", at_start=False),
    ]
    whole = tok.whole_text
    if whole is not None:
        assert [int(i) for i in whole.encode(text, cache=False)] == tok.encode(text, parse_special=True)


@pytest.mark.parametrize("fmt", sorted(BACKENDS))
def test_token_bytes_and_decode_pieces_agree_with_decode(instances, fmt: str) -> None:
    tok = instances[fmt]
    table = tok.token_bytes()
    assert isinstance(table, TokenBytes) and len(table) == tok.vocab_size
    view = tok.decode_pieces(skip_special_tokens=False)
    assert isinstance(view, PieceView)
    text = "天空为什么" if fmt == "book" else "The sky is blue, 天空 — naïve café!"
    ids = tok.encode(text)
    # SentencePiece's decode drops the dummy prefix's space at the start of the text: compare without it.
    decoded = tok.decode(ids).removeprefix(" ")
    assert table.join(ids).decode("utf-8").removeprefix(" ") == decoded
    pieces = [view.lookup(i) for i in ids]
    assert all(p is not None for p in pieces)
    assert b"".join(p[0] for p in pieces if p is not None).decode("utf-8").removeprefix(" ") == decoded
    for t in tok.added_tokens:
        if t.control:
            assert t.id in table.special


@pytest.mark.parametrize("fmt", sorted(BACKENDS))
def test_replay_spec_rebuilds_the_same_tokenizer_through_the_registry(instances, tmp_path: Path, fmt: str) -> None:
    tok = instances[fmt]
    spec, files = tok.replay_spec()
    assert spec["format"] == fmt
    for name, content in files.items():
        if isinstance(content, Path):
            shutil.copyfile(content, tmp_path / name)
        else:
            (tmp_path / name).write_bytes(content)
    (tmp_path / "ctxlock.json").write_text(json.dumps({"tokenizer": spec}), "utf-8")
    again = load_artifacts(tmp_path).tokenizer
    assert type(again) is type(tok)
    assert again.sha256 == tok.sha256
    text = "<bos><user>天空为什么</user>" if fmt == "book" else "Hello <s> world, 天空!"
    assert again.encode(text, parse_special=True) == tok.encode(text, parse_special=True)


def test_an_unknown_format_names_the_registered_ones(tmp_path: Path) -> None:
    (tmp_path / "ctxlock.json").write_text(json.dumps({"tokenizer": {"format": "wordpiece"}}), "utf-8")
    with pytest.raises(ArtifactFormatError) as info:
        load_artifacts(tmp_path)
    assert info.value.path == f"{tmp_path / 'ctxlock.json'}:tokenizer.format"
    assert info.value.hint == "use book, tekken, tiktoken, sentencepiece, gguf or hf-tokenizers"


# ----------------------------------------------------------------------------- no probing of tokenizers


def _probes(path: Path) -> list[str]:
    """`getattr(x, ...)` / `hasattr(x, ...)` calls whose object's source names a tokenizer."""
    tree = ast.parse(path.read_text("utf-8"))
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and node.args
        ):
            target = ast.unparse(node.args[0])
            if "tok" in target.lower():
                found.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_probes_a_tokenizer_with_getattr() -> None:
    probes = [p for f in sorted(SRC.rglob("*.py")) for p in _probes(f)]
    assert probes == []


def test_the_probe_scan_finds_a_probe(tmp_path: Path) -> None:
    sample = SRC / "_probe_sample.py"  # the scan reports paths relative to src/
    try:
        sample.write_text("def f(tokenizer):\n    return getattr(tokenizer, 'whole_text', None)\n", "utf-8")
        assert _probes(sample) == ["ctxlock/_probe_sample.py:2: getattr(tokenizer, 'whole_text', None)"]
    finally:
        sample.unlink()


def test_backends_need_no_private_attributes_of_each_other() -> None:
    # decode, constrain and the token bytes see a tokenizer only through the protocol: no backend module is
    # imported there, and no private attribute of a tokenizer is read.
    for module in ("generation/_decode.py", "generation/_constrain.py", "tokenizer/_token_bytes.py"):
        text = (SRC / module).read_text("utf-8")
        for backend_module in ("tokenizer.backends", "_hf", "_tekken", "_sentencepiece", "_book"):
            assert backend_module not in text, (module, backend_module)
        for private in ("._data", "._enc", "._sp", "._json_text"):
            assert private not in text, (module, private)


def _signature(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_from_manifest_has_one_signature() -> None:
    for cls in BACKENDS.values():
        assert _signature(cls.from_manifest) == ["spec", "files", "model_id"], cls
