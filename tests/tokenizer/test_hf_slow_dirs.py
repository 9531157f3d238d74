"""Issue 15 item 1: slow-only HF directories (vocab.json + merges.txt, no tokenizer.json) load as transformers
builds them.

transformers 5 converts such a directory to a fast tokenizer in the class's own `__init__`. The directories are
written from the cached real vocabularies (the BPE pieces and merges of the converted GGUF), and the reference is
`AutoTokenizer.from_pretrained` on the same directory: the backend it builds, chat renders through
`apply_chat_template(tokenize=True)`, and plain encodes, on non-NFC and generated text. Today such a directory is
refused ("no tokenizer.json").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
from ctxlock.artifacts import load_artifacts
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError
from hf_dirs import NON_NFC, auto_tokenizer, build_dir, reference_chat_ids
from hypothesis_profiles import examples

pytestmark = pytest.mark.reference

# The classes whose transformers files include vocab.json + merges.txt, each with a vocabulary it is used with.
SLOW = {"Qwen2Tokenizer": "qwen2", "GPT2Tokenizer": "gpt-2", "GPTNeoXTokenizer": "gpt-neox"}


@pytest.fixture(scope="module")
def slow_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-slow")
    return {cls: build_dir(root / cls, vocab, cls, slow=True) for cls, vocab in SLOW.items()}


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "?"}]


@pytest.mark.parametrize("cls", list(SLOW))
def test_slow_dir_builds_the_backend_transformers_builds(cls: str, slow_dirs: dict[str, Path]) -> None:
    path = slow_dirs[cls]
    assert not (path / "tokenizer.json").exists()
    ours = json.loads(load_artifacts(path).tokenizer._json_text)
    assert ours == json.loads(auto_tokenizer(path).backend_tokenizer.to_str())


@pytest.mark.parametrize("cls", list(SLOW))
def test_slow_dir_chat_and_encode_match(cls: str, slow_dirs: dict[str, Path]) -> None:
    model, ref = ctxlock.load(str(slow_dirs[cls])), auto_tokenizer(slow_dirs[cls])
    for text in [*NON_NFC, "plain ascii, with 2024 digits"]:
        assert list(model.run({"messages": _chat(text)}).tokenized.ids) == reference_chat_ids(ref, _chat(text)), text
        assert model.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False), text
        assert model.tokenizer.encode(text, add_special_tokens=True) == ref.encode(text, add_special_tokens=True)
    desc = model.artifacts.describe()["tokenizer"]
    assert desc["tokenizer_class"] == cls and desc["pipeline"] == "class"
    assert {d["file"] for d in desc["class_disagreements"]} == {"(no tokenizer.json)"}


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(st.characters(codec="utf-8", categories=("L", "M", "N", "P", "S", "Zs")), max_size=30),
    cls=st.sampled_from(list(SLOW)),
)
def test_slow_dir_generated_text(text: str, cls: str, slow_dirs: dict[str, Path]) -> None:
    model, ref = ctxlock.load(str(slow_dirs[cls])), auto_tokenizer(slow_dirs[cls])
    assert model.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False)


def test_slow_dir_with_model_type_only(tmp_path: Path) -> None:
    """No tokenizer_class: config.json's model_type picks the class, as AutoTokenizer does."""
    path = build_dir(tmp_path / "d", "gpt-2", None, slow=True, model_config={"model_type": "gpt2"})
    ref, model = auto_tokenizer(path), ctxlock.load(str(path))
    assert type(ref).__name__ == "GPT2Tokenizer"
    assert model.artifacts.describe()["tokenizer"]["tokenizer_class"] == "GPT2Tokenizer"
    for text in NON_NFC:
        assert model.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False)


def test_slow_dir_added_tokens_json(tmp_path: Path) -> None:
    probe = build_dir(tmp_path / "probe", "qwen2", "Qwen2Tokenizer", slow=True)
    size = len(json.loads((probe / "vocab.json").read_text("utf-8")))
    added = {"<|endoftext|>": size, "<|im_start|>": size + 1, "<|im_end|>": size + 2}
    path = build_dir(
        tmp_path / "d",
        "qwen2",
        "Qwen2Tokenizer",
        slow=True,
        files={"added_tokens.json": json.dumps(added)},
        config={"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]},
    )
    ref, model = auto_tokenizer(path), ctxlock.load(str(path))
    text = "<|im_start|>user\nhé\u0301<|im_end|>\n"
    assert model.tokenizer.encode(text, parse_special=True) == ref.encode(text, add_special_tokens=False)
    assert ref.convert_tokens_to_ids("<|im_end|>") in model.tokenizer.encode(text, parse_special=True)


@pytest.mark.parametrize("cls", ["LlamaTokenizer", "Qwen3_5Tokenizer", "TokenizersBackend"])
def test_slow_dir_a_class_that_does_not_read_the_files_is_refused(cls: str, tmp_path: Path) -> None:
    """transformers 5.24 loads these with an empty vocabulary (or refuses): ctxlock refuses, naming the class."""
    path = build_dir(tmp_path / "d", "qwen2", cls, slow=True)
    with pytest.raises(ArtifactFormatError, match=f"{cls}.*does not read vocab.json"):
        load_artifacts(path)


def test_dir_without_any_tokenizer_file_names_what_it_looked_for(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ArtifactNotFoundError, match=r"neither tokenizer.json nor vocab.json with merges.txt"):
        load_artifacts(tmp_path)
