"""Issue 15: slow-only HF directories holding a SentencePiece `tokenizer.model` (no tokenizer.json) load as
transformers builds them.

transformers 5.24 builds such a directory's fast tokenizer from the `.model` (`SentencePieceExtractor`: the pieces
in id order, merges generated from the vocabulary, control and user-defined pieces as added tokens), then the class's
`__init__` sets the rest. The `.model` files are the real SentencePiece models shipped in the pinned mistral-common
package; the reference is `AutoTokenizer.from_pretrained` on the same directory (it needs the `protobuf` package to
read a `.model`; without it transformers cannot load these directories at all). The backend it builds, plain
encodes and chat renders through `apply_chat_template(tokenize=True)` are compared. The classes ctxlock does not
build from a `.model` are refused, naming the class. On the base such a directory is refused whatever its class.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import google.protobuf  # noqa: F401  (transformers reads a .model through protobuf: the reference needs it)
import mistral_common
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
from ctxlock.artifacts import load_artifacts
from ctxlock.errors import ArtifactFormatError
from hf_dirs import NON_NFC, auto_tokenizer, reference_chat_ids
from hypothesis_profiles import examples

pytestmark = pytest.mark.reference

MISTRAL_DATA = Path(mistral_common.__file__).resolve().parent / "data"
V1, V3 = "tokenizer.model.v1", "mistral_instruct_tokenizer_240323.model.v3"  # v3: control + user-defined pieces
V7 = "mistral_instruct_tokenizer_241114.model.v7"

# A Llama-2-style template: BOS, [INST] ... [/INST] around user turns, EOS after assistant turns.
LLAMA2_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}"
)

# name -> (model file, tokenizer_config.json or None, config.json or None)
DIRS: dict[str, tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = {
    "llama-v1": (V1, {"tokenizer_class": "LlamaTokenizer"}, None),
    "llama-v1-legacy-bos": (V1, {"tokenizer_class": "LlamaTokenizer", "legacy": True, "add_bos_token": True}, None),
    "llama-v1-no-prefix": (V1, {"tokenizer_class": "LlamaTokenizerFast", "add_prefix_space": False}, None),
    "llama-v3-bos-eos": (
        V3,
        {"tokenizer_class": "LlamaTokenizer", "legacy": False, "add_bos_token": True, "add_eos_token": True},
        None,
    ),
    "llama-v1-added": (
        V1,
        {
            "tokenizer_class": "LlamaTokenizer",
            "add_bos_token": True,
            "additional_special_tokens": ["<extra_0>", "[INST]", "[/INST]"],
            "added_tokens_decoder": {
                "0": {"content": "<unk>", "special": True, "normalized": False},
                "1": {"content": "<s>", "special": True, "normalized": False},
                "2": {"content": "</s>", "special": True, "normalized": False},
                "32000": {"content": "<extra_0>", "special": True, "normalized": False},
                "32001": {"content": "[INST]", "special": True, "normalized": False},
                "32002": {"content": "[/INST]", "special": True, "normalized": False},
            },
        },
        None,
    ),
    # an empty additional_special_tokens still replaces the control pieces the extractor passes on
    "llama-v7-no-extras": (V7, {"tokenizer_class": "LlamaTokenizer", "additional_special_tokens": []}, None),
    "codellama-v1": (V1, {"tokenizer_class": "CodeLlamaTokenizer"}, None),
    "gemma-v3": (V3, {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True}, None),
    "model-type-gemma": (V1, None, {"model_type": "gemma"}),
    "model-type-idefics": (V1, None, {"model_type": "idefics"}),
}

TEXTS = [
    "Hello world",
    " leading space",
    "   three leading spaces",
    "multiple   spaces  between\twords",
    "line one\nline two\n\n\nafter blank lines\n",
    "\n starts with a newline",
    "中文测试，日本語のテキスト、한국어 텍스트",
    "emoji 🙂🚀👩‍👩‍👧 and flags 🇫🇷",
    "byte fallback: \x01\x7f \u0e01\u0e02 \U0001d11e \u2028 \ufeff",
    "▁already▁metaspace ▁",
    "[INST] control strings as text [/INST]</s><s>",
    "",
    " ",
    *NON_NFC,
]


def _write(root: Path, model: str, config: dict[str, Any] | None, model_config: dict[str, Any] | None) -> Path:
    root.mkdir(parents=True)
    shutil.copyfile(MISTRAL_DATA / model, root / "tokenizer.model")
    if config is not None:
        config = {"chat_template": LLAMA2_TEMPLATE, **config}
        (root / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    else:
        (root / "chat_template.jinja").write_text(LLAMA2_TEMPLATE, encoding="utf-8")
    if model_config is not None:
        (root / "config.json").write_text(json.dumps(model_config), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def spm_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-spm")
    return {name: _write(root / name, *spec) for name, spec in DIRS.items()}


@pytest.fixture(scope="module")
def loaded(spm_dirs: dict[str, Path]) -> dict[str, tuple[Any, Any]]:
    """name -> (ctxlock model, transformers tokenizer)"""
    return {name: (ctxlock.load(str(path)), auto_tokenizer(path)) for name, path in spm_dirs.items()}


@pytest.mark.parametrize("name", list(DIRS))
def test_spm_dir_builds_the_backend_transformers_builds(name: str, spm_dirs: dict[str, Path]) -> None:
    path = spm_dirs[name]
    assert not (path / "tokenizer.json").exists()
    ours = json.loads(load_artifacts(path).tokenizer._json_text)
    assert ours == json.loads(auto_tokenizer(path).backend_tokenizer.to_str())


@pytest.mark.parametrize("name", list(DIRS))
def test_spm_dir_encode_matches(name: str, loaded: dict[str, tuple[Any, Any]]) -> None:
    model, ref = loaded[name]
    for text in TEXTS:
        for specials in (False, True):
            # transformers' encode matches added tokens in the text: parse_special is its behaviour
            ours = model.tokenizer.encode(text, parse_special=True, add_special_tokens=specials)
            assert ours == ref.encode(text, add_special_tokens=specials), (text, specials)


_CHARS = st.one_of(
    st.characters(codec="utf-8", categories=("L", "M", "N", "P", "S", "Z", "Cc", "Cf")),
    st.sampled_from([" ", "  ", "\n", "\t", "▁", "e\u0301", "🙂", "中", "\x00", "<s>", "[INST]"]),
)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.lists(_CHARS, max_size=30).map("".join), name=st.sampled_from(list(DIRS)), specials=st.booleans())
def test_spm_dir_generated_text(text: str, name: str, specials: bool, loaded: dict[str, tuple[Any, Any]]) -> None:
    model, ref = loaded[name]
    ours = model.tokenizer.encode(text, parse_special=True, add_special_tokens=specials)
    assert ours == ref.encode(text, add_special_tokens=specials)


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "?"}]


@pytest.mark.parametrize("name", list(DIRS))
def test_spm_dir_chat_matches_apply_chat_template(name: str, loaded: dict[str, tuple[Any, Any]]) -> None:
    model, ref = loaded[name]
    for text in TEXTS:
        # Control-token strings in a message are text by default (see "Safety"); `keep` matches them, as
        # transformers does, so the comparison is with `keep`, and the default is checked to differ where it should.
        got = list(model.run({"messages": _chat(text)}, injection="keep").tokenized.ids)
        assert got == reference_chat_ids(ref, _chat(text)), text
    text = "[INST] control strings as text [/INST]</s><s>"
    as_text = list(model.run({"messages": _chat(text)}).tokenized.ids)
    assert as_text != reference_chat_ids(ref, _chat(text))
    eos = model.tokenizer.token_to_id(model.artifacts.special_tokens["eos_token"])
    assert as_text.count(eos) == 1  # the template's own, after "ok"; the message's "</s>" stays text


def test_spm_dir_record_says_where_the_tokenizer_came_from(spm_dirs: dict[str, Path]) -> None:
    path = spm_dirs["llama-v3-bos-eos"]
    art = load_artifacts(path)
    desc = art.describe()["tokenizer"]
    assert desc["tokenizer_class"] == "LlamaTokenizer" and desc["pipeline"] == "class"
    assert desc["file_sha256"] == hashlib.sha256((path / "tokenizer.model").read_bytes()).hexdigest()
    assert art.tokenizer.id.endswith("/tokenizer.model") and art.tokenizer.source == str(path / "tokenizer.model")
    assert {d["file"] for d in desc["class_disagreements"]} == {"(no tokenizer.json)"}
    assert any("tokenizer.model" in n and "SentencePieceExtractor" in n for n in desc["pipeline_notes"])
    assert desc["built_from"]["files"] == ["tokenizer.model"] and desc["built_from"]["class"] == "LlamaTokenizer"
    from ctxlock.records import RunOptions, build_record

    model = ctxlock.load(str(path))
    run = model.run({"messages": _chat("hi")})
    record = build_record(model=model, request_bytes=b"{}", options=RunOptions(), run=run).data["tokenizer"]
    assert record["built_from"] == desc["built_from"] and record["file_sha256"] == desc["file_sha256"]
    assert record["tokenizer_class"] == "LlamaTokenizer"


@pytest.mark.parametrize(
    ("config", "model_config", "cls"),
    [
        (None, None, "TokenizersBackend"),
        (None, {"model_type": "llama"}, "TokenizersBackend"),
        (None, {"model_type": "code_llama"}, "TokenizersBackend"),  # not a model type transformers' configs know
        ({"tokenizer_class": "PreTrainedTokenizerFast"}, None, "TokenizersBackend"),
        ({"tokenizer_class": "T5Tokenizer"}, None, "T5Tokenizer"),
        ({"tokenizer_class": "XLMRobertaTokenizer"}, None, "XLMRobertaTokenizer"),
        ({"tokenizer_class": "Qwen2Tokenizer"}, None, "Qwen2Tokenizer"),
        ({"tokenizer_class": "GPT2Tokenizer"}, None, "GPT2Tokenizer"),
    ],
)
def test_spm_dir_a_class_ctxlock_does_not_build_is_refused(
    config: dict[str, Any] | None, model_config: dict[str, Any] | None, cls: str, tmp_path: Path
) -> None:
    """transformers loads each of these from tokenizer.model its own way (checked): ctxlock refuses, naming it."""
    path = _write(tmp_path / "d", V1, config, model_config)
    assert type(auto_tokenizer(path)).__name__ == cls
    with pytest.raises(ArtifactFormatError, match=f"tokenizer class {cls} .*from tokenizer.model"):
        load_artifacts(path)
