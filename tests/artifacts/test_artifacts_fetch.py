"""The pinned real artifacts: manifest, parsing of llama.cpp's vectors, and corruption detection."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import fetched

REPO = Path(__file__).resolve().parents[2]
SEP = fetched.VOCAB_TEST_SEPARATOR

# llama.cpp's test vectors in llama-cpp-python 0.3.36: vocab -> number of cases.
EXPECTED_VECTOR_COUNTS = {
    "bert-bge": 46,
    "command-r": 46,
    "deepseek-coder": 46,
    "deepseek-llm": 46,
    "falcon": 46,
    "gemma-4": 46,
    "gpt-2": 46,
    "llama-bpe": 46,
    "llama-spm": 46,
    "mpt": 46,
    "phi-3": 46,
    "qwen2": 46,
    "qwen35": 50,
    "refact": 46,
    "starcoder": 46,
}
QWEN_TIKTOKEN_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"


# ------------------------------------------------------------------------------------------ manifest


def test_manifest_files_exist_and_verify() -> None:
    paths = fetched.ensure_all()
    for artifact in fetched.ARTIFACTS:
        root = paths[artifact.name]
        assert root == fetched.cache_dir() / artifact.name
        assert (root / fetched.MARKER).is_file()
        for rel in artifact.required:
            assert (root / rel).is_file(), rel
    assert fetched.check_all() == paths  # every file re-hashed against the marker and the pins


def test_llama_models_layout(llama_models_dir: Path) -> None:
    assert llama_models_dir == fetched.cache_dir() / "llama-cpp-python-0.3.36" / "models"
    assert fetched.gguf_path("qwen2") == llama_models_dir / "ggml-vocab-qwen2.gguf"
    assert fetched.gguf_path("qwen2").read_bytes()[:4] == b"GGUF"
    assert len(fetched.gguf_names()) == 19
    with pytest.raises(FileNotFoundError, match="no vocab 'no-such-vocab'"):
        fetched.gguf_path("no-such-vocab")


def test_templates(template_paths: list[Path]) -> None:
    assert len(template_paths) >= 60
    assert template_paths == sorted(template_paths)
    assert all(p.suffix == ".jinja" and p.parent == fetched.templates_dir() for p in template_paths)
    names = {p.stem for p in template_paths}
    assert {"Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "openai-gpt-oss-120b"} <= names
    for path in template_paths:
        assert "{%" in path.read_text(encoding="utf-8") or "{{" in path.read_text(encoding="utf-8"), path.name


def test_qwen_tiktoken() -> None:
    path = fetched.qwen_tiktoken_path()
    assert path == fetched.cache_dir() / "dashscope-2.0.2" / "qwen.tiktoken"
    assert fetched.sha256_file(path) == QWEN_TIKTOKEN_SHA256
    first = path.read_bytes().split(b"\n", 1)[0]
    token, rank = first.split(b" ")
    assert rank == b"0" and token  # base64 token, rank


def test_npm_artifacts() -> None:
    package = fetched.hf_jinja_dir()
    assert package == fetched.cache_dir() / "hf-jinja-0.5.13" / "package"
    meta = json.loads((package / "package.json").read_text(encoding="utf-8"))
    assert (meta["name"], meta["version"]) == ("@huggingface/jinja", "0.5.13")
    assert (package / meta["exports"]["."]["import"]).is_file()
    schema = json.loads(fetched.sarif_schema_path().read_text(encoding="utf-8"))
    assert schema["$schema"] == "http://json-schema.org/draft-04/schema#"
    assert schema["properties"]["version"]["enum"] == ["2.1.0"]


def test_npm_bytes_with_wrong_checksum_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fetched.CACHE_ENV, str(tmp_path / "cache"))

    def tampered_pack(artifact: fetched.Artifact, dest: Path) -> Path:
        saved = dest / artifact.filename
        saved.write_bytes(b"not the pinned tarball")
        return saved

    monkeypatch.setattr(fetched, "_npm_pack", tampered_pack)
    with pytest.raises(fetched.ChecksumError, match=r"checksum mismatch for huggingface-jinja-0\.5\.13\.tgz"):
        fetched.ensure(fetched.HF_JINJA)
    assert not (tmp_path / "cache" / "hf-jinja-0.5.13").exists()


# ----------------------------------------------------------------------------------- test vectors


def test_all_vocab_vectors_parse() -> None:
    assert fetched.vector_vocabs() == sorted(EXPECTED_VECTOR_COUNTS)
    counts = {vocab: len(fetched.vocab_vectors(vocab)) for vocab in fetched.vector_vocabs()}
    assert counts == EXPECTED_VECTOR_COUNTS
    assert sum(counts.values()) == 694


def test_qwen2_vectors_content() -> None:
    vectors = fetched.vocab_vectors("qwen2")
    assert vectors[0] == ("ied 4 ½ months", [1122, 220, 19, 220, 26062, 3951])
    assert vectors[2] == ("", [])  # an empty case is an empty line in .out
    assert vectors[3] == (" ", [220])
    assert all(isinstance(text, str) and all(isinstance(i, int) for i in ids) for text, ids in vectors)


def test_parse_vocab_vectors_separators() -> None:
    out = b" 1 2\n\n 3\n"
    # the generator's form: every case followed by the separator
    assert fetched.parse_vocab_vectors(f"a b{SEP}{SEP}c{SEP}".encode(), out) == [
        ("a b", [1, 2]),
        ("", []),
        ("c", [3]),
    ]
    # gemma-4's form: no separator after the last case
    assert fetched.parse_vocab_vectors(f"a b{SEP}{SEP}c".encode(), out) == [("a b", [1, 2]), ("", []), ("c", [3])]
    # a last case that is empty, and a case that is itself a newline; CR is content (no newline translation)
    assert fetched.parse_vocab_vectors(f"\n{SEP}x\r\n{SEP}{SEP}".encode(), b" 7\n 8 9\n\n") == [
        ("\n", [7]),
        ("x\r\n", [8, 9]),
        ("", []),
    ]
    with pytest.raises(ValueError, match="2 input cases but 3 output lines"):
        fetched.parse_vocab_vectors(f"a{SEP}b{SEP}".encode(), out)


# ----------------------------------------------------------------------------------- corruption


@pytest.fixture
def temp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$CTXLOCK_TEST_CACHE -> a cache with real copies (never links) of the fetched trees and the dashscope wheel."""
    real = fetched.ensure_all()
    wheel = fetched.cache_dir() / "downloads" / fetched.DASHSCOPE.filename  # verified when it was fetched
    if not wheel.is_file():
        wheel = fetched.archive_path(fetched.DASHSCOPE)
    cache = tmp_path / "cache"
    for artifact in fetched.ARTIFACTS:
        shutil.copytree(real[artifact.name], cache / artifact.name)
    (cache / "downloads").mkdir()
    shutil.copy(wheel, cache / "downloads" / wheel.name)
    monkeypatch.setenv(fetched.CACHE_ENV, str(cache))
    assert fetched.cache_dir() == cache
    return cache


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))  # same size: only the checksum can tell


def test_corrupted_file_is_detected(temp_cache: Path) -> None:
    assert fetched.check_all()
    victim = temp_cache / "llama-cpp-python-0.3.36" / "models" / "ggml-vocab-qwen2.gguf.inp"
    _flip_one_byte(victim)
    with pytest.raises(fetched.ChecksumError) as info:
        fetched.check(fetched.LLAMA_CPP_PYTHON)
    assert f"{victim} is corrupt: sha256" in str(info.value)
    assert fetched.check(fetched.DASHSCOPE)  # the other artifact is still fine


def test_missing_file_and_marker_are_detected(temp_cache: Path) -> None:
    root = temp_cache / "llama-cpp-python-0.3.36"
    template = root / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
    template.unlink()
    with pytest.raises(fetched.ChecksumError, match=f"{template} is missing"):
        fetched.check(fetched.LLAMA_CPP_PYTHON)
    (root / fetched.MARKER).unlink()
    with pytest.raises(fetched.ChecksumError, match="incomplete fetch"):
        fetched.check(fetched.LLAMA_CPP_PYTHON)


def test_tampered_marker_is_detected(temp_cache: Path) -> None:
    marker_path = temp_cache / "dashscope-2.0.2" / fetched.MARKER
    marker = json.loads(marker_path.read_text(encoding="utf-8"))
    marker["files"]["qwen.tiktoken"]["sha256"] = "0" * 64
    marker_path.write_text(json.dumps(marker), encoding="utf-8")
    with pytest.raises(fetched.ChecksumError, match="digest does not match the pinned one"):
        fetched.check(fetched.DASHSCOPE)


def test_cli_check_exit_status(temp_cache: Path) -> None:
    script = [sys.executable, str(REPO / "scripts" / "fetch_artifacts.py"), "--check"]
    env = {**os.environ, fetched.CACHE_ENV: str(temp_cache)}
    ok = subprocess.run(script, env=env, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    victim = temp_cache / "dashscope-2.0.2" / "qwen.tiktoken"
    _flip_one_byte(victim)
    bad = subprocess.run(script, env=env, capture_output=True, text=True, check=False)
    assert bad.returncode == 1
    assert f"{victim} is corrupt" in bad.stderr


def test_damaged_tree_is_rebuilt_from_the_verified_archive(temp_cache: Path) -> None:
    # temp_cache holds the verified wheel in downloads/, so the rebuild needs no network
    victim = temp_cache / "dashscope-2.0.2" / "qwen.tiktoken"
    _flip_one_byte(victim)
    assert fetched.ensure(fetched.DASHSCOPE) == victim.parent  # fast mode: presence and size only
    assert fetched.ensure(fetched.DASHSCOPE, verify=True) == victim.parent  # re-hash: rebuilt
    assert fetched.sha256_file(victim) == QWEN_TIKTOKEN_SHA256
    victim.write_bytes(b"truncated")
    fetched._ENSURED.clear()  # a new process would not remember the earlier success
    assert fetched.ensure(fetched.DASHSCOPE) == victim.parent  # size differs: rebuilt even in fast mode
    assert fetched.check(fetched.DASHSCOPE)


def test_registry_bytes_with_wrong_checksum_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fetched.CACHE_ENV, str(tmp_path / "cache"))

    def tampered_download(artifact: fetched.Artifact, dest: Path) -> Path:
        saved = dest / artifact.filename
        saved.write_bytes(b"not the pinned wheel")
        return saved

    monkeypatch.setattr(fetched, "_pip_download", tampered_download)
    with pytest.raises(fetched.ChecksumError) as info:
        fetched.ensure(fetched.DASHSCOPE)
    message = str(info.value)
    assert "checksum mismatch for dashscope-2.0.2-py3-none-any.whl" in message
    assert hashlib.sha256(b"not the pinned wheel").hexdigest() in message
    assert fetched.DASHSCOPE.sha256 in message
    assert not (tmp_path / "cache" / "dashscope-2.0.2").exists()  # nothing that looks complete
    assert not (tmp_path / "cache" / "downloads" / fetched.DASHSCOPE.filename).exists()


def test_pip_failure_is_an_error_with_pip_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An index on a closed loopback port: pip fails at once, and the error says what and why.
    monkeypatch.setenv(fetched.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no configured extra indexes or find-links
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(fetched.ArtifactError, match=r"could not be fetched from the package registry"):
        fetched.ensure(fetched.DASHSCOPE)
    assert not (tmp_path / "cache" / "dashscope-2.0.2").exists()


# --------------------------------------------------------------------- converted HF tokenizers, oracle


def _gguf_string(path: Path, key: str) -> str:
    """A string-valued GGUF metadata entry, read directly (gguf.GGUFReader takes ~10 s on a vocab file).

    Layout: key as (uint64 length, bytes), then uint32 value type (8 = string), then (uint64 length, bytes).
    """
    data = path.read_bytes()
    needle = struct.pack("<Q", len(key)) + key.encode()
    at = data.index(needle) + len(needle)
    (value_type,) = struct.unpack_from("<I", data, at)
    assert value_type == 8
    (length,) = struct.unpack_from("<Q", data, at + 4)
    return data[at + 12 : at + 12 + length].decode("utf-8")


@pytest.mark.reference
def test_hf_tokenizer_dir_qwen2() -> None:
    path = fetched.hf_tokenizer_dir("qwen2")  # ~15 s the first time on a machine, then cached
    sha = fetched.sha256_file(fetched.gguf_path("qwen2"))
    version = json.loads((path / fetched.MARKER).read_text(encoding="utf-8"))["transformers"]
    expected = f"qwen2-{sha[:12]}-{fetched._LAYOUT}"
    assert path == fetched.cache_dir() / "hf-from-gguf" / f"transformers-{version}" / expected
    assert sorted(p.name for p in path.iterdir()) == [
        fetched.MARKER,
        "chat_template.jinja",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    embedded = _gguf_string(fetched.gguf_path("qwen2"), "tokenizer.chat_template")
    assert embedded.startswith("{% for message in messages %}")
    assert (path / "chat_template.jinja").read_text(encoding="utf-8") == embedded  # written out verbatim
    assert fetched.hf_tokenizer_dir("qwen2") == path
    # tokenizer.json is the pipeline transformers runs: Qwen2Tokenizer adds NFC, which the GGUF conversion lacks
    assert json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))["normalizer"] == {"type": "NFC"}


@pytest.mark.reference
def test_reference_oracle_on_qwen2() -> None:
    import reference

    tokenizer_dir = fetched.hf_tokenizer_dir("qwen2")
    template = (fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    request = json.loads((REPO / "tests/data/conversations/01_seed_sky_zh.json").read_text(encoding="utf-8"))
    options = request.pop("_options")
    special = reference.reference_special_tokens(tokenizer_dir)
    assert special == {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    text = reference.reference_render(template, request["messages"], special_tokens=special, **options)
    assert text == (
        "<|im_start|>system\n你是一个简洁的科学助手。<|im_end|>\n"
        "<|im_start|>user\n请用一句话解释为什么天空通常呈蓝色。<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = reference.reference_ids(tokenizer_dir, template, request["messages"], **options)
    assert ids[:3] == [151644, 8948, 198] and ids[-3:] == [151644, 77091, 198] and len(ids) == 30
    assert ids == reference.reference_encode(tokenizer_dir, text)
    with pytest.raises(ValueError, match="not compatible"):
        reference.reference_render(template, request["messages"], add_generation_prompt=True, continue_final_message=1)


# --------------------------------------------------------------------------------- conversation corpus

CONVERSATIONS = sorted((REPO / "tests" / "data" / "conversations").glob("*.json"))


def test_conversation_corpus_is_well_formed() -> None:
    assert len(CONVERSATIONS) >= 14
    for path in CONVERSATIONS:
        raw = path.read_bytes()
        request = json.loads(raw.decode("utf-8"))
        options = request.pop("_options", {})
        assert set(options) <= {"add_generation_prompt", "continue_final_message"}, path.name
        assert not (options.get("add_generation_prompt") and options.get("continue_final_message")), path.name
        assert set(request) <= {"messages", "tools"} and request["messages"], path.name
        calls: dict[str, str] = {}
        for message in request["messages"]:
            for call in message.get("tool_calls") or []:
                calls[call["id"]] = call["function"]["name"]
            if message["role"] == "tool":
                assert calls.get(message["tool_call_id"]) == message["name"], (path.name, message)
        for marker in ("<|", "|>", "<s>", "</s>", "[INST]", "<start_of_turn>"):
            assert marker.encode() not in raw, (path.name, marker)
