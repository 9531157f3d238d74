"""The GGUF metadata reader: agrees with the gguf package on real files, and turns malformed files into typed
errors that name the file and field, quickly, without allocating what a corrupt header declares."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fetched
from ctxlock.artifacts import load_gguf as _load_gguf
from ctxlock.artifacts._gguf import read_metadata, read_vocab
from ctxlock.errors import ArtifactFormatError, CtxlockError
from hypothesis_profiles import examples

SMALL = "bert-bge"  # 0.6 MB: small enough to mutate thousands of times


# gguf's GGUFReader builds a Python object per array item: 10-30 s on the big vocabularies, so the differential
# check runs on the files under 2.5 MB (11 of 19, every tokenizer model type but gemma4 and t5 among them).
PACKAGE_CHECKED = [n for n in fetched.gguf_names() if fetched.gguf_path(n).stat().st_size < 2_500_000]


@pytest.mark.parametrize("name", PACKAGE_CHECKED)
def test_metadata_equals_the_gguf_package(name: str) -> None:
    import gguf

    path = fetched.gguf_path(name)
    ours = read_metadata(path)
    reader = gguf.GGUFReader(path)
    assert set(ours.values) == {k for k in reader.fields if not k.startswith("GGUF.")}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = ours.values[key]
        if field.types[0] == gguf.GGUFValueType.ARRAY and field.types[-1] != gguf.GGUFValueType.STRING:
            expected = np.array([field.parts[i][0] for i in field.data])
            assert np.array_equal(np.asarray(value), expected), key
        elif field.types[0] == gguf.GGUFValueType.ARRAY:
            if len(field.data) < 5000:  # the package's contents() is slow on the big vocabularies
                assert value == field.contents(), key
            else:
                assert len(value) == len(field.data), key
        else:
            assert value == field.contents(), key


def test_vocab_facts() -> None:
    vocab = read_vocab(fetched.gguf_path("qwen2"))
    assert (vocab.model, vocab.pre, len(vocab.tokens)) == ("gpt2", "qwen2", 151936)
    assert vocab.special_ids["eos"] == 151643 and vocab.tokens[151643] == "<|endoftext|>"
    assert vocab.chat_templates["default"].startswith("{% for message in messages %}")
    assert len(vocab.sha256) == 64


def _write(tmp_path: Path, data: bytes, name: str = "x.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _header(n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv)


def _key(name: str) -> bytes:
    raw = name.encode()
    return struct.pack("<Q", len(raw)) + raw


def test_wrong_magic(tmp_path: Path) -> None:
    with pytest.raises(ArtifactFormatError) as info:
        read_metadata(_write(tmp_path, b"GGML" + bytes(40)))
    assert info.value.path.endswith(":magic")


def test_too_short(tmp_path: Path) -> None:
    with pytest.raises(ArtifactFormatError) as info:
        read_metadata(_write(tmp_path, b"GGUF"))
    assert "shorter than a GGUF header" in info.value.message


def test_truncated_real_file_names_the_key(tmp_path: Path) -> None:
    data = fetched.gguf_path(SMALL).read_bytes()
    with pytest.raises(ArtifactFormatError) as info:
        read_vocab(_write(tmp_path, data[: len(data) // 3]))
    assert "tokenizer.ggml.tokens" in info.value.path
    assert "byte" in info.value.message


def test_huge_declared_array_is_not_allocated(tmp_path: Path) -> None:
    # 2**61 uint32 items (8 EiB): refused from the length check, before any allocation.
    body = _key("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 4, 1 << 61)
    with pytest.raises(ArtifactFormatError) as info:
        read_metadata(_write(tmp_path, _header(1) + body))
    assert "declares 2,305,843,009,213,693,952 items" in info.value.message
    body = _key("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 1 << 62)
    with pytest.raises(ArtifactFormatError) as info:
        read_metadata(_write(tmp_path, _header(1) + body))
    assert info.value.path.endswith("tokenizer.ggml.tokens")


def test_huge_string_length(tmp_path: Path) -> None:
    body = _key("general.name") + struct.pack("<IQ", 8, 1 << 50)
    with pytest.raises(ArtifactFormatError) as info:
        read_metadata(_write(tmp_path, _header(1) + body))
    assert info.value.path.endswith("general.name")


def test_huge_key_count(tmp_path: Path) -> None:
    with pytest.raises(ArtifactFormatError) as info:
        read_metadata(_write(tmp_path, _header(1 << 40)))
    assert "metadata keys" in info.value.message


def test_unknown_value_type(tmp_path: Path) -> None:
    with pytest.raises(ArtifactFormatError) as info:
        read_metadata(_write(tmp_path, _header(1) + _key("general.name") + struct.pack("<I", 77)))
    assert "unknown value type 77" in info.value.message


def _strings(key: str, items: list[str]) -> bytes:
    out = _key(key) + struct.pack("<IIQ", 9, 8, len(items))
    for s in items:
        out += _key(s)
    return out


def _string(key: str, value: str) -> bytes:
    return _key(key) + struct.pack("<I", 8) + _key(value)


def test_merges_referencing_unknown_tokens(tmp_path: Path) -> None:
    body = (
        _string("tokenizer.ggml.model", "gpt2")
        + _strings("tokenizer.ggml.tokens", ["a", "b", "ab"])
        + _strings("tokenizer.ggml.merges", ["a b", "a zz"])
    )
    with pytest.raises(ArtifactFormatError) as info:
        read_vocab(_write(tmp_path, _header(3) + body))
    assert info.value.path.endswith("tokenizer.ggml.merges[1]")
    assert "'a zz'" in info.value.message


def test_special_id_out_of_range(tmp_path: Path) -> None:
    body = (
        _string("tokenizer.ggml.model", "gpt2")
        + _strings("tokenizer.ggml.tokens", ["a"])
        + _key("tokenizer.ggml.bos_token_id")
        + struct.pack("<II", 4, 99)
    )
    with pytest.raises(ArtifactFormatError) as info:
        read_vocab(_write(tmp_path, _header(3) + body))
    assert info.value.path.endswith("tokenizer.ggml.bos_token_id")


def test_no_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(ArtifactFormatError) as info:
        read_vocab(_write(tmp_path, _header(1) + _string("general.name", "weights only")))
    assert "carries no tokenizer" in info.value.message


@pytest.fixture(scope="module")
def small_gguf() -> bytes:
    return fetched.gguf_path(SMALL).read_bytes()


@settings(
    max_examples=examples(120),
    deadline=5000,  # the time bound per case: a corrupt file must fail fast, not hang
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzz_mutated_real_gguf_gives_only_typed_errors(small_gguf: bytes, tmp_path: Path, data) -> None:
    buf = bytearray(small_gguf)
    # Mutate the header region most of the time (that is where the lengths and types are), anywhere sometimes.
    region = data.draw(st.sampled_from([4096, 65536, len(buf)]))
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, min(region, len(buf)) - 1))
        kind = data.draw(st.sampled_from(["byte", "u64", "cut"]))
        if kind == "byte":
            buf[at] = data.draw(st.integers(0, 255))
        elif kind == "u64" and at + 8 <= len(buf):
            buf[at : at + 8] = struct.pack("<Q", data.draw(st.sampled_from([0, 1, 1 << 31, 1 << 62, (1 << 64) - 1])))
        else:
            del buf[at:]
            break
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(buf))
    previous = os.environ.get("CTXLOCK_CACHE_DIR")
    try:
        # The whole load: header, vocabulary checks, conversion, the tokenizers pipeline, one encode.
        os.environ["CTXLOCK_CACHE_DIR"] = str(tmp_path / "cache")
        _load_gguf(path).tokenizer.encode("Hello world")
    except CtxlockError as exc:
        assert exc.path and str(path) in exc.path
    finally:
        if previous is None:
            os.environ.pop("CTXLOCK_CACHE_DIR", None)
        else:
            os.environ["CTXLOCK_CACHE_DIR"] = previous
