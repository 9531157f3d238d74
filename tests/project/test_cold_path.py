"""Issue 16 item 1: the cold path. What fastokens' probe check proves is kept on disk, keyed by the digest of the
exact `tokenizer.json` text, the fastokens and tiktoken releases and the check's version, so a later process admits
fastokens without probing again; a changed file, library or check, and a corrupt entry, never reuse a verdict.
The speed itself is measured by `benchmarks/bench_pipeline.py --fresh-process` (BENCHMARKS.md), not here."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import fetched
from ctxlock.tokenizer import _accel as accel
from ctxlock.tokenizer._accel import Accelerator, probe_texts
from ctxlock.tokenizer.backends._hf import HFTokenizer

TEXT = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nwhy 天空 is blue 😀 12345<|im_end|>\n"


pytestmark = pytest.mark.fast_path  # about the fast path itself: on even under CTXLOCK_FAST=0


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache made once for the module by one tokenizer over Qwen2's tokenizer.json that proved fastokens: its
    `fastbpe` entries (that check's verdict on tiktoken and the ranks, a cache of its own which no test here
    inspects) and its `fastokens` verdict. Each test's cache starts from the first, and the tests that need a
    verdict on disk before they begin copy the second, rather than running the probes again (seconds each)."""
    root = tmp_path_factory.mktemp("seed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CTXLOCK_CACHE_DIR", str(root))
        mp.setenv("CTXLOCK_FASTOKENS", "sync")
        mp.setenv("CTXLOCK_FAST", "1")  # as the tests' own `fast_path` marker has it (a module fixture comes first)
        acc = HFTokenizer(_qwen_json(), id="qwen2 (seed)").whole_text.accelerator
        assert acc.wait() and not acc.cached
    assert len(_entries(root)) == 1 and (root / "fastbpe").is_dir()
    return root


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: Path) -> Path:
    """An on-disk cache of its own, empty but for the fastbpe check's entries, and fastokens built in the calling
    thread (deterministic)."""
    shutil.copytree(seed / "fastbpe", tmp_path / "fastbpe")
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CTXLOCK_FASTOKENS", "sync")
    return tmp_path


@pytest.fixture
def proved(cache: Path, seed: Path) -> Path:
    """`cache` holding the verdict a tokenizer over Qwen2's tokenizer.json proved (the `seed`'s, as a test of its
    own would have written it: `test_a_verdict_is_proved_once_then_read_from_disk`)."""
    shutil.copytree(seed / "fastokens", cache / "fastokens")
    return cache


def _qwen_json() -> str:
    return fetched.hf_tokenizer_dir("qwen2").joinpath("tokenizer.json").read_text("utf-8")


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "fastokens").glob("*.json"))


def test_a_verdict_is_proved_once_then_read_from_disk(cache: Path) -> None:
    text = _qwen_json()
    first = HFTokenizer(text, id="qwen2 (first process)")
    acc = first.whole_text.accelerator
    assert acc.wait() and not acc.cached
    assert "probe texts" in acc.reason and "on-disk cache" not in acc.reason
    [entry] = _entries(cache)
    stored = json.loads(entry.read_text("utf-8"))
    assert stored["json_sha256"] == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert stored["state"] == "ready" and stored["check_version"] == accel.CHECK_VERSION
    assert stored["fastokens"] == accel.fastokens_version()

    # A later tokenizer over the same bytes (a later process, as far as the cache knows) takes the verdict.
    second = HFTokenizer(text, id="qwen2 (second process)")
    acc2 = second.whole_text.accelerator
    assert acc2.wait() and acc2.cached
    assert acc2.reason.startswith(acc.reason) and "verdict read from the on-disk cache" in acc2.reason
    assert second.whole_text_engine.startswith("fastokens (ready: ")
    # Exact either way: fastokens' ids (admitted from the cache) are `tokenizers`' ids.
    assert second.whole_text.engine == "fastokens"
    expected = second._tok.encode(TEXT, add_special_tokens=False).ids
    assert second.whole_text.encode(TEXT, cache=False).tolist() == expected
    assert acc2.encode(TEXT).tolist() == expected


def test_a_changed_file_never_reuses_a_verdict(proved: Path) -> None:
    cache = proved
    text = _qwen_json()
    assert accel.load_verdict(hashlib.sha256(text.encode("utf-8")).hexdigest()) is not None
    # The same vocabulary, other bytes (a re-serialized file): another digest, so the probes run again.
    data = json.loads(text)
    changed = json.dumps(data, ensure_ascii=True)
    assert changed != text
    acc = HFTokenizer(changed, id="qwen2 (re-serialized)").whole_text.accelerator
    assert acc.wait() and not acc.cached
    assert len(_entries(cache)) == 2


def test_another_fastokens_or_check_version_never_reuses_a_verdict(
    proved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = proved
    text = _qwen_json()
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert accel.load_verdict(digest) is not None
    monkeypatch.setattr(accel, "CHECK_VERSION", "accel-next")
    assert accel.load_verdict(digest) is None
    monkeypatch.undo()
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(cache))
    monkeypatch.setattr(accel, "fastokens_version", lambda: "99.0.0")
    assert accel.load_verdict(digest) is None
    # The key itself moves with each input.
    assert accel.verdict_key(digest) != accel.verdict_key("0" * 64)


def test_a_corrupt_or_foreign_entry_counts_as_absent(proved: Path) -> None:
    cache = proved
    text = _qwen_json()
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    [entry] = _entries(cache)
    assert accel.load_verdict(digest) is not None
    good = entry.read_text("utf-8")
    bad = ("{not json", "[]", json.dumps({**json.loads(good), "json_sha256": "0" * 64}))
    for content in bad:
        entry.write_text(content, "utf-8")
        assert accel.load_verdict(digest) is None  # what the tokenizer asks before it takes a verdict
    # A tokenizer over the last of them probes again and rewrites the entry (one full probe: each costs seconds).
    acc = HFTokenizer(text, id="qwen2 (again)").whole_text.accelerator
    assert acc.wait() and not acc.cached
    assert accel.load_verdict(digest) is not None


def test_a_refusal_is_kept_and_skips_the_build(cache: Path) -> None:
    # A real fastokens tokenizer of another vocabulary (Llama 3's), checked against Qwen2's exact path: refused.
    qwen = HFTokenizer(_qwen_json(), id="qwen2")
    fast = qwen._fast()
    llama_json = fetched.hf_tokenizer_dir("llama-bpe").joinpath("tokenizer.json").read_text("utf-8")
    key = hashlib.sha256(b"a tokenizer.json fastokens gets wrong").hexdigest()

    def build():
        import fastokens

        return fastokens.Tokenizer.from_json_str(llama_json)

    def probes():
        return probe_texts(fast.ranks, dict(fast.specials))

    acc = Accelerator(build, qwen.whole_text.reference_ids, probes, json_sha256=key)
    assert not acc.wait() and acc.state == "refused" and not acc.cached
    assert "differs from the exact path" in acc.reason

    def must_not_build():
        raise AssertionError("a cached refusal must not build fastokens again")

    again = Accelerator(must_not_build, qwen.whole_text.reference_ids, probes, json_sha256=key)
    assert not again.wait() and again.cached and again.state == "refused"
    assert again.reason.startswith(acc.reason)
    assert again.encode(TEXT) is None


def test_failures_that_are_not_facts_about_the_file_are_not_kept(cache: Path) -> None:
    key = hashlib.sha256(b"unloadable").hexdigest()

    def build():
        import fastokens

        return fastokens.Tokenizer.from_json_str("{not json")

    acc = Accelerator(build, lambda t: np.zeros(0, dtype=np.uint32), lambda: iter(["x"]), json_sha256=key)
    assert not acc.wait()
    assert accel.load_verdict(key) is None and _entries(cache) == []


def test_a_tokenizer_json_seen_before_builds_tokenizers_on_first_use(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ctxlock.errors import ArtifactFormatError

    monkeypatch.setenv("CTXLOCK_FASTOKENS", "0")  # (its probes would build `tokenizers` for their non-NFC texts)

    text = _qwen_json()
    first = HFTokenizer(text, id="qwen2")
    assert "_tok" in first.__dict__  # never seen: built at load, so a bad file fails there
    second = HFTokenizer(text, id="qwen2 (later)")
    assert "_tok" not in second.__dict__  # seen: load skips it, and so do the engine choice and whole-text encoding
    assert second.whole_text.encode(TEXT, cache=False).tolist() == first._tok.encode(TEXT).ids
    assert second.engine == "tiktoken" and "_tok" not in second.__dict__
    assert second.encode(TEXT, parse_special=True) == first._tok.encode(TEXT).ids  # built on first use
    with pytest.raises(ArtifactFormatError, match=r"not a valid tokenizer\.json"):
        HFTokenizer(json.dumps({"model": {"type": "BPE", "vocab": "not a map"}}), id="bad")


def test_vocab_size_and_token_to_id_from_the_json_equal_tokenizers() -> None:
    import tokenizers

    from ctxlock.artifacts import load_gguf

    checked = 0
    for name in fetched.gguf_names():
        # outside the model cache, so each vocabulary is let go before the next (together they were 1.6 GB)
        tok = load_gguf(fetched.gguf_path(name)).tokenizer
        if not isinstance(tok, HFTokenizer):
            continue
        ref = tokenizers.Tokenizer.from_str(tok._encode_json)
        assert tok.vocab_size == ref.get_vocab_size(with_added_tokens=True), name
        words = ["<|endoftext|>", "<unk>", "<s>", "</s>", "<pad>", "[PAD]", "hello", "Ġthe", "▁the", "the", "\x00"]
        for word in [*words, *(t.content for t in tok.added_tokens)]:
            assert tok.token_to_id(word) == ref.token_to_id(word), (name, word)
        checked += 1
    assert checked >= 10


def _described(tok: HFTokenizer) -> dict:
    return {k: v for k, v in tok.describe().items() if k != "id"}


def _heads(cache: Path) -> list[Path]:
    return sorted((cache / "tokenizer-json-head").glob("*.json"))


def test_a_tokenizer_json_seen_before_is_not_parsed_in_full_at_load(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first load keeps the file's head (all but the vocabulary and merges) keyed by its digest; a later load
    reads that instead of parsing 7 MB of JSON, and parses the rest only when something needs the vocabulary."""
    monkeypatch.setenv("CTXLOCK_FASTOKENS", "0")
    text = _qwen_json()
    first = HFTokenizer(text, id="qwen2")
    assert first.engine == "tiktoken"  # (the check's verdict and ranks go to their own cache)
    [head] = _heads(cache)
    assert head.name.startswith(hashlib.sha256(text.encode("utf-8")).hexdigest())
    assert "vocab" not in json.loads(head.read_text("utf-8"))["head"]["model"]
    assert head.stat().st_size < 100_000

    second = HFTokenizer(text, id="qwen2 (later)")
    assert "_data" not in second.__dict__ and "_tok" not in second.__dict__
    assert second.added_tokens == first.added_tokens
    assert second.engine == first.engine == "tiktoken"
    assert second.whole_text.encode(TEXT, cache=False).tolist() == first._tok.encode(TEXT).ids
    assert "_data" not in second.__dict__  # the engine's verdict and ranks came from the fastbpe cache
    assert _described(second) == _described(first)  # vocab_size included: kept with the head
    assert second.vocab_size == first._tok.get_vocab_size(with_added_tokens=True)
    assert "_data" not in second.__dict__
    # What needs the vocabulary parses it then, with the same answers.
    assert second.token_to_id("Ġthe") == first.token_to_id("Ġthe") == first._tok.token_to_id("Ġthe")
    assert second.vocab_size == first.vocab_size and "_data" in second.__dict__
    assert second.encode(TEXT, parse_special=False) == first.encode(TEXT, parse_special=False)


def test_a_corrupt_or_foreign_head_counts_as_absent(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXLOCK_FASTOKENS", "0")
    text = _qwen_json()
    reference = HFTokenizer(text, id="qwen2")
    [head] = _heads(cache)
    kept = head.read_text("utf-8")
    other = json.dumps({**json.loads(kept), "sha256": "0" * 64})
    for broken in ("", "{not json", "[]", json.dumps({"sha256": json.loads(kept)["sha256"]}), other):
        head.write_text(broken, "utf-8")
        tok = HFTokenizer(text, id="qwen2 (broken head)")
        assert "_data" in tok.__dict__, broken[:20]  # parsed in full, as the first time
        assert _described(tok) == _described(reference)
        assert tok.whole_text.encode(TEXT, cache=False).tolist() == reference._tok.encode(TEXT).ids
        assert head.read_text("utf-8") == kept  # and the head is written again


def test_a_tokenizer_json_with_truncation_keeps_no_head(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Such a file's encode JSON is a rewrite without the sections: it is parsed in full every time."""
    monkeypatch.setenv("CTXLOCK_FASTOKENS", "0")
    data = json.loads(_qwen_json())
    data["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
    text = json.dumps(data, ensure_ascii=False)
    first = HFTokenizer(text, id="qwen2 truncated")
    assert _heads(cache) == []
    second = HFTokenizer(text, id="qwen2 truncated (later)")
    assert "_data" in second.__dict__ and _described(second) == _described(first)
    assert second.describe()["truncation"]["max_length"] == 4
