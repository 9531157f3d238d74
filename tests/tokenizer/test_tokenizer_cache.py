"""The fast engine's on-disk entry (`fastbpe.cached_check`: the verdict and tiktoken's rank table, keyed by the
tokenizer.json's sha256, the plain added tokens, the check's version and ctxlock's version) is checked when read:
generated corruptions of each of its files (truncations, flipped bytes, other JSON, another entry's files) are
detected, the check runs again, and the entry is written back whole. `clear_disk_cache` removes it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ctxlock.tokenizer import TOKENIZER_CACHE_DIRS, clear_disk_cache
from ctxlock.tokenizer._fastbpe import BYTE_CHARS, cached_check, check

pytestmark = pytest.mark.fast_path  # about the fast path itself: on even under CTXLOCK_FAST=0


def _vocabulary(extra: tuple[str, ...]) -> dict:
    """A small byte-level BPE tokenizer.json: the 256 bytes, then merges making each of `extra` from two tokens."""
    vocab = {c: i for i, c in enumerate(BYTE_CHARS)}
    merges = []
    for token in extra:
        merges.append([token[:-1], token[-1]] if token[:-1] in vocab else [token[0], token[1:]])
        vocab[token] = len(vocab)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "BPE", "vocab": vocab, "merges": merges},
    }


DATA = _vocabulary(("he", "hel", "hell", "hello", "ĠĠ", "wo", "wor"))
TEXT = json.dumps(DATA)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path))
    return tmp_path


def _files(cache: Path) -> dict[str, Path]:
    entry = [p for p in (cache / "fastbpe").iterdir() if not p.name.startswith(("nfc-", ".tmp"))]
    out = {}
    for p in entry:
        kind = "meta" if p.suffix == ".json" else "ranks" if p.suffix == ".ranks" else "marshal"
        out[kind] = p
    assert set(out) == {"meta", "ranks", "marshal"}
    return out


def _corruptions(blob: bytes, rng: random.Random) -> list[bytes]:
    """Generated damage to one file: empty, truncated at random places, one flipped bit at random places, garbage."""
    out = [b"", blob[: len(blob) // 2], blob + b"\x00", bytes(rng.randrange(256) for _ in range(64))]
    for _ in range(4):
        out.append(blob[: rng.randrange(len(blob))])
        i = rng.randrange(len(blob))
        out.append(blob[:i] + bytes([blob[i] ^ (1 << rng.randrange(8))]) + blob[i + 1 :])
    return out


def test_a_fresh_entry_is_the_check_itself(cache: Path) -> None:
    verdict, ranks = cached_check(TEXT, lambda: DATA, [])
    assert verdict.ok and (verdict, ranks) == check(DATA, [])
    again = cached_check(TEXT, lambda: pytest.fail("read from the cache: no parse"), [])
    assert again == (verdict, ranks)


@pytest.mark.parametrize("kind", ["meta", "ranks", "marshal"])
def test_generated_corruptions_are_detected_and_rebuilt(cache: Path, kind: str) -> None:
    expected = check(DATA, [])
    cached_check(TEXT, lambda: DATA, [])
    good = {k: p.read_bytes() for k, p in _files(cache).items()}
    rng = random.Random(f"ctxlock-cache-{kind}")
    for damaged in _corruptions(good[kind], rng):
        path = _files(cache)[kind]
        path.write_bytes(damaged)
        if kind == "ranks":  # the packed form is read only when the marshal dump is not usable
            _files(cache)["marshal"].write_bytes(b"")
        assert cached_check(TEXT, lambda: DATA, []) == expected
        # Read back, the entry gives the same answer without the check (rebuilt whole, or its good parts kept).
        assert cached_check(TEXT, lambda: pytest.fail("entry not rebuilt"), []) == expected


def test_hostile_metadata_fields_are_refused(cache: Path) -> None:
    expected = check(DATA, [])
    cached_check(TEXT, lambda: DATA, [])
    meta_path = _files(cache)["meta"]
    meta = json.loads(meta_path.read_text("utf-8"))
    bad = [
        {**meta, "ok": "yes"},
        {**meta, "pattern": 5},
        {**meta, "normalizer": "NFKC"},
        {**meta, "key": "0" * 64},
        {**meta, "check_version": "fastbpe-0"},
        {k: v for k, v in meta.items() if k != "ranks_sha256"},
        [meta],
    ]
    for value in bad:
        meta_path.write_text(json.dumps(value), "utf-8")
        assert cached_check(TEXT, lambda: DATA, []) == expected
        assert json.loads(meta_path.read_text("utf-8")) == meta


def test_another_entrys_files_are_refused(cache: Path) -> None:
    """A rank table renamed from another vocabulary's entry is not this one's (the key is in its digest)."""
    other = _vocabulary(("ab", "abc"))
    cached_check(json.dumps(other), lambda: other, [])
    foreign = {k: p.read_bytes() for k, p in _files(cache).items()}
    for p in _files(cache).values():
        p.unlink()
    expected = cached_check(TEXT, lambda: DATA, [])
    mine = _files(cache)
    mine["marshal"].write_bytes(foreign["marshal"])
    assert cached_check(TEXT, lambda: DATA, []) == expected
    assert cached_check(TEXT, lambda: pytest.fail("entry not rebuilt"), [])[1] == expected[1]


def test_clear_disk_cache_removes_the_entries(cache: Path) -> None:
    cached_check(TEXT, lambda: DATA, [])
    removed = clear_disk_cache()
    assert str(cache / "fastbpe") in removed
    assert not any((cache / d).exists() for d in TOKENIZER_CACHE_DIRS)
    calls = []
    cached_check(TEXT, lambda: calls.append(1) or DATA, [])
    assert calls == [1]  # built again
