"""Issue 15 item 1: an HF directory gives what `AutoTokenizer.from_pretrained` gives, tokenizer class included.

transformers 5 classes rebuild the normalizer, pre-tokenizer, decoder and BPE options in code whatever
tokenizer.json says (Qwen2Tokenizer always sets NFC). The directories are built from the cached real
vocabularies (`hf_dirs`), and the reference is AutoTokenizer on the same directory: through
`apply_chat_template(tokenize=True)` on raw requests, and through plain encode, on non-NFC text.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
from ctxlock.artifacts import load_artifacts
from hf_dirs import CLASS_VOCABS, NON_NFC, auto_tokenizer, build_dir, reference_chat_ids
from hypothesis_profiles import examples

pytestmark = pytest.mark.reference
# Tests run class by class (tests/conftest.py), and only the current class's reference is kept: eight
# transformers tokenizers with their ctxlock models held together were 2 GB.
RUN_BY = "cls"


def _null_normalizer(data: dict[str, Any]) -> None:
    data["normalizer"] = None


@pytest.fixture(scope="module")
def class_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-classes")
    out = {}
    for cls, vocab in CLASS_VOCABS.items():
        # The qwen2 vocabulary as a fine-tuned checkpoint often ships it: no normalizer in the file.
        edit = _null_normalizer if vocab == "qwen2" else None
        out[cls] = build_dir(root / cls, vocab, cls, edit=edit)
    return out


class _References(dict):
    """AutoTokenizer for one class at a time, loaded on first use; moving to another class lets the previous one go,
    with the ctxlock models loaded for it."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        super().__init__()
        self.dirs = dirs

    def __missing__(self, cls: str) -> Any:
        if self:
            self.clear()
            ctxlock.clear_caches()
            gc.collect()
        self[cls] = auto_tokenizer(self.dirs[cls])
        return self[cls]


@pytest.fixture(scope="module")
def references(class_dirs: dict[str, Path]) -> dict[str, Any]:
    return _References(class_dirs)


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


def test_issue_repro_qwen2_null_normalizer_gets_the_class_nfc(class_dirs: dict[str, Path], references: Any) -> None:
    """The issue's figures: e+U+0301, Hangul jamo, and Å Ω ﬁ through a chat render, ctxlock against AutoTokenizer."""
    path, ref = class_dirs["Qwen2Tokenizer"], references["Qwen2Tokenizer"]
    model = ctxlock.load(str(path))
    file_only = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    for text in NON_NFC[:3]:
        expected = reference_chat_ids(ref, [{"role": "user", "content": text}])
        got = list(model.run({"messages": [{"role": "user", "content": text}]}).tokenized.ids)
        assert got == expected, text
        # and the file as written really does encode it differently (the class is what makes them equal)
        assert file_only.encode(text).ids != ref.encode(text, add_special_tokens=False)
    desc = model.artifacts.describe()["tokenizer"]
    assert desc["tokenizer_class"] == "Qwen2Tokenizer" and desc["pipeline"] == "class"
    normalizer = [d for d in desc["class_disagreements"] if d["component"] == "normalizer"]
    assert normalizer == [
        {
            "component": "normalizer",
            "file": None,
            "class": {"type": "NFC"},
            "used": "class",
            "differences": ['(whole): file null, class {"type": "NFC"}'],
        }
    ]
    assert desc["normalizer"] == "NFC"


@pytest.mark.parametrize("cls", list(CLASS_VOCABS))
def test_pipeline_is_the_backend_transformers_builds(cls: str, class_dirs: dict[str, Path], references: Any) -> None:
    """Component by component (model options, normalizer, pre-tokenizer, decoder, post-processor, added tokens)."""
    ours = json.loads(load_artifacts(class_dirs[cls]).tokenizer._json_text)
    theirs = json.loads(references[cls].backend_tokenizer.to_str())
    assert ours == theirs


@pytest.mark.parametrize("cls", list(CLASS_VOCABS))
def test_chat_and_plain_encode_match_on_non_nfc_text(cls: str, class_dirs: dict[str, Path], references: Any) -> None:
    model, ref = ctxlock.load(str(class_dirs[cls])), references[cls]
    for text in NON_NFC:
        assert list(model.run({"messages": _chat(text)}).tokenized.ids) == reference_chat_ids(ref, _chat(text)), text
        for special in (False, True):
            assert model.tokenizer.encode(text, add_special_tokens=special) == ref.encode(
                text, add_special_tokens=special
            ), (text, special)


# Any characters (combining marks, compatibility forms, digits, spaces, controls), mixed with the issue's cases.
_UNICODE = st.lists(
    st.text(st.characters(codec="utf-8", categories=("L", "M", "N", "P", "S", "Zs", "Cc")), max_size=12)
    | st.sampled_from(NON_NFC),
    max_size=4,
).map("".join)


@pytest.mark.parametrize("cls", list(CLASS_VOCABS))
@settings(max_examples=examples(5), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_UNICODE)
def test_generated_unicode_matches_autotokenizer(
    text: str, cls: str, class_dirs: dict[str, Path], references: Any
) -> None:
    model, ref = ctxlock.load(str(class_dirs[cls])), references[cls]
    assert model.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False)
    assert list(model.run({"messages": _chat(text)}).tokenized.ids) == reference_chat_ids(ref, _chat(text))


def test_file_as_written_is_an_option(class_dirs: dict[str, Path]) -> None:
    path = class_dirs["Qwen2Tokenizer"]
    arts = load_artifacts(path, tokenizer_pipeline="file")
    as_written = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    for text in NON_NFC:
        assert arts.tokenizer.encode(text) == as_written.encode(text, add_special_tokens=False).ids
    desc = arts.describe()["tokenizer"]
    assert desc["pipeline"] == "file" and desc["normalizer"] is None
    assert {d["component"]: d["used"] for d in desc["class_disagreements"]}["normalizer"] == "file"
    with pytest.raises(ValueError, match="tokenizer_pipeline"):
        load_artifacts(path, tokenizer_pipeline="neither")


def test_record_says_which_pipeline_was_used(class_dirs: dict[str, Path]) -> None:
    from ctxlock.records import RunOptions, build_record

    model = ctxlock.load(str(class_dirs["Qwen2Tokenizer"]))
    run = model.run({"messages": _chat(NON_NFC[0])})
    rec = build_record(model=model, request_bytes=b"{}", options=RunOptions(), run=run).data["tokenizer"]
    assert rec["tokenizer_class"] == "Qwen2Tokenizer" and rec["tokenizer_pipeline"] == "class"
    assert rec["normalizer"] == "NFC" and "normalizer" in rec["class_overrides"]
    assert rec["file_sha256"] != rec["sha256"]  # what was encoded with is not the file: both digests are kept


def test_model_type_from_config_json_when_tokenizer_class_is_missing(tmp_path: Path) -> None:
    path = build_dir(tmp_path / "d", "qwen2", None, edit=_null_normalizer, model_config={"model_type": "qwen2"})
    ref = auto_tokenizer(path)
    model = ctxlock.load(str(path))
    assert type(ref).__name__ == "Qwen2Tokenizer"
    desc = model.artifacts.describe()["tokenizer"]
    assert desc["tokenizer_class"] == "Qwen2Tokenizer" and "model_type" in desc["tokenizer_class_source"]
    for text in NON_NFC:
        assert list(model.run({"messages": _chat(text)}).tokenized.ids) == reference_chat_ids(ref, _chat(text))


def test_byte_level_file_under_llama_tokenizer_is_loaded_as_written(tmp_path: Path) -> None:
    """transformers' own correction: LlamaTokenizer declared on a ByteLevel (Llama 3) file uses the generic backend."""
    path = build_dir(tmp_path / "d", "llama-bpe", "LlamaTokenizer")
    ref = auto_tokenizer(path)
    model = ctxlock.load(str(path))
    assert model.artifacts.describe()["tokenizer"]["tokenizer_class"] == "TokenizersBackend"
    for text in NON_NFC:
        assert model.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False)


def test_added_tokens_decoder_in_tokenizer_config_is_loaded(tmp_path: Path) -> None:
    """A token the config declares and tokenizer.json lacks is an added token in transformers, and here."""
    vocab_size = len(json.loads(load_artifacts(build_dir(tmp_path / "probe", "qwen2", "Qwen2Tokenizer")).tokenizer
                                 ._json_text)["model"]["vocab"])  # fmt: skip
    extra = {
        str(vocab_size + 400): {"content": "<tool_x>", "special": True, "lstrip": False, "rstrip": False,
                                "normalized": False, "single_word": False},
        str(vocab_size + 401): {"content": "<note>", "special": False, "lstrip": False, "rstrip": False,
                                "normalized": True, "single_word": False},
    }  # fmt: skip
    path = build_dir(tmp_path / "d", "qwen2", "Qwen2Tokenizer", config={"added_tokens_decoder": extra})
    ref, model = auto_tokenizer(path), ctxlock.load(str(path))
    text = "call <tool_x> with a <note> here"
    assert model.tokenizer.encode(text, parse_special=True) == ref.encode(text, add_special_tokens=False)
    assert ref.convert_tokens_to_ids("<tool_x>") in model.tokenizer.encode(text, parse_special=True)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "fine"}]
    assert list(model.run({"messages": messages}).tokenized.ids) == reference_chat_ids(ref, messages)
    beyond = model.artifacts.describe()["tokenizer"]["added_beyond_file"]
    assert {t["content"] for t in beyond} >= {"<tool_x>", "<note>"}


def test_added_tokens_json_is_loaded(tmp_path: Path) -> None:
    probe = load_artifacts(build_dir(tmp_path / "probe", "gpt-2", "GPT2Tokenizer")).tokenizer
    size = probe.vocab_size
    path = build_dir(
        tmp_path / "d", "gpt-2", "GPT2Tokenizer", files={"added_tokens.json": json.dumps({"<|sep|>": size})}
    )
    ref, model = auto_tokenizer(path), ctxlock.load(str(path))
    text = "a<|sep|>b <|sep|> c"
    assert ref.convert_tokens_to_ids("<|sep|>") == size
    assert model.tokenizer.encode(text, parse_special=True) == ref.encode(text, add_special_tokens=False)


def test_mistral_model_type_over_a_declared_llama_tokenizer_loads_the_file(tmp_path: Path) -> None:
    """transformers' routing: model_type mistral (MistralCommonBackend without tekken.json) loads the generic
    backend even though the config declares LlamaTokenizer, so the file's own pipeline is the reference."""
    path = build_dir(tmp_path / "d", "llama-spm", "LlamaTokenizer", model_config={"model_type": "mistral"})
    ref, model = auto_tokenizer(path), ctxlock.load(str(path))
    assert type(ref).__name__ == "TokenizersBackend"
    desc = model.artifacts.describe()["tokenizer"]
    assert desc["tokenizer_class"] == "TokenizersBackend" and desc["class_disagreements"] == []
    for text in NON_NFC:
        assert model.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False)
        assert list(model.run({"messages": _chat(text)}).tokenized.ids) == reference_chat_ids(ref, _chat(text))


def test_render_takes_the_file_as_written_and_the_record_replays_it(
    class_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """`ctxlock render --tokenizer-pipeline file|class --record`: the two give other ids on non-NFC text, each
    record says which it used, and each replays to identical from the store alone."""
    import subprocess
    import sys

    request = tmp_path / "r.json"
    request.write_text(json.dumps({"messages": _chat(NON_NFC[0])}), "utf-8")
    env = {**__import__("os").environ, "CTXLOCK_DATA_DIR": str(tmp_path / "store")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ctxlock", *args], capture_output=True, text=True, env=env)

    out: dict[str, Any] = {}
    for mode in ("class", "file"):
        done = cli("render", str(request), "--model", str(class_dirs["Qwen2Tokenizer"]), "--tokenizer-pipeline", mode)
        assert done.returncode == 0, done.stderr
        rendered = cli(
            "render", str(request), "--model", str(class_dirs["Qwen2Tokenizer"]), "--tokenizer-pipeline", mode,
            "--record", "--json",
        )  # fmt: skip
        assert rendered.returncode == 0, rendered.stderr
        out[mode] = json.loads(rendered.stdout)
        replayed = cli("replay", out[mode]["record_id"])
        assert replayed.returncode == 0 and "identical" in replayed.stdout, replayed.stdout + replayed.stderr
    assert out["class"]["input_ids"] != out["file"]["input_ids"]
    model = ctxlock.load(str(class_dirs["Qwen2Tokenizer"]))
    assert out["class"]["input_ids"] == list(model.run({"messages": _chat(NON_NFC[0])}).tokenized.ids)
    bad = cli("render", str(request), "--tokenizer-pipeline", "neither")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
