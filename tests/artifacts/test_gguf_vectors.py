"""llama.cpp's own tokenizer test vectors, through ctxlock's native GGUF loader and the CLI a user runs:
`ctxlock tokenize --model ggml-vocab-X.gguf --jsonl` must print exactly the ids of `ggml-vocab-X.gguf.out`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import ctxlock
import fetched
from cli_runner import run_main

# Each vocabulary's vectors run once per session, for whichever test asks first: the summary then covers every
# vocabulary whatever ran before it (or whether anything did).
RESULTS: dict[str, tuple[int, int, list[tuple[str, list[int], list[int]]]]] = {}


def run_vectors(vocab: str, cache: Path) -> tuple[int, int, list[tuple[str, list[int], list[int]]]]:
    """(cases passed, cases, the failures as (text, expected, got)) of `vocab`'s vectors through the CLI.

    The command runs in this process (`ctxlock.cli.main`, what `python -m ctxlock` calls; a child process each cost
    about a second more for nothing tested here), with its own empty conversion cache and ctxlock's caches emptied
    first, so the vocabulary is converted from the GGUF file afresh, as in a process of its own."""
    if vocab in RESULTS:
        return RESULTS[vocab]
    cases = fetched.vocab_vectors(vocab)
    stdin = "".join(json.dumps(text, ensure_ascii=False) + "\n" for text, _ in cases)
    saved = os.environ.get("CTXLOCK_CACHE_DIR")
    os.environ["CTXLOCK_CACHE_DIR"] = str(cache)
    try:
        ctxlock.clear_caches()
        code, out, err = run_main(
            ["tokenize", "--model", str(fetched.gguf_path(vocab)), "--jsonl"], stdin=stdin.encode("utf-8")
        )
    finally:
        if saved is None:
            del os.environ["CTXLOCK_CACHE_DIR"]
        else:
            os.environ["CTXLOCK_CACHE_DIR"] = saved
        ctxlock.clear_caches()  # the vocabulary converted into `cache` is not kept past it
    assert code == 0, err
    assert cache.is_dir()  # converted afresh, into its own cache
    got = [json.loads(line) for line in out.splitlines()]
    # --jsonl skips blank input lines only; every case here is a JSON string, so one output line per case.
    assert len(got) == len(cases)
    failures = [(text, want, ids) for (text, want), ids in zip(cases, got, strict=True) if ids != want]
    RESULTS[vocab] = (len(cases) - len(failures), len(cases), failures)
    return RESULTS[vocab]


@pytest.mark.parametrize("vocab", fetched.vector_vocabs())
def test_every_vector_through_the_cli(vocab: str, tmp_path: Path) -> None:
    passed, total, failures = run_vectors(vocab, tmp_path / "cache")
    assert not failures, f"{len(failures)}/{total} cases differ; first: {failures[:3]!r}"
    assert passed == total > 0


def test_zz_vector_summary(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Every vector file llama.cpp ships passes, case for case: the counts are computed here over every vocabulary
    (running those no test has run yet), printed, and asserted."""
    vocabs = fetched.vector_vocabs()
    on_disk = sorted(
        p.name[len("ggml-vocab-") : -len(".gguf.inp")] for p in fetched.llama_models_dir().glob("ggml-vocab-*.gguf.inp")
    )
    assert sorted(vocabs) == on_disk  # every .gguf.inp file is a vocabulary under test
    counts = {v: run_vectors(v, tmp_path / "cache")[:2] for v in vocabs}
    total = sum(n for _, n in counts.values())
    ok = sum(p for p, _ in counts.values())
    with capsys.disabled():
        rows = ", ".join(f"{v} {p}/{n}" for v, (p, n) in sorted(counts.items()))
        print(f"\nllama.cpp vectors through ctxlock: {ok}/{total} ({rows})")
    assert total == sum(len(fetched.vocab_vectors(v)) for v in vocabs) > 0  # every vector found was run
    assert [v for v, (p, n) in counts.items() if p != n] == []  # every vector file passes
    assert ok == total


def test_conversion_cache_is_reused_and_never_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxlock.artifacts import _gguf_load as gguf_module
    from ctxlock.artifacts import load_artifacts

    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path / "cache"))
    src = fetched.gguf_path("gpt-2").read_bytes()
    path = tmp_path / "model.gguf"
    path.write_bytes(src)
    first = load_artifacts(path)
    assert list((tmp_path / "cache" / "converted" / "gguf").glob("*.json"))

    calls: list[str] = []
    real = gguf_module.conversion
    monkeypatch.setattr(gguf_module, "conversion", lambda v: calls.append(v.path) or real(v))
    # Same bytes under another name: served from the conversion cache, no conversion.
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(src)
    again = load_artifacts(copy)
    assert calls == []
    assert again.tokenizer.sha256 == first.tokenizer.sha256
    assert again.tokenizer.encode("Hello world") == first.tokenizer.encode("Hello world")

    # Change one token's text in place (same length; a token no merge builds): new digest, converted again.
    i = src.index(b"<|endoftext|>")
    changed = src[:i] + b"<|endoftexu|>" + src[i + 13 :]
    copy.write_bytes(changed)
    os.utime(copy, ns=(1, 1))  # even with the mtime set back, the digest decides
    fresh = load_artifacts(copy)
    assert calls == [str(copy.resolve())]
    assert fresh.tokenizer.sha256 != first.tokenizer.sha256
    assert fresh.tokenizer.id_to_token(50256) == "<|endoftexu|>"
    assert first.tokenizer.id_to_token(50256) == "<|endoftext|>"


def test_gguf_model_renders_with_its_embedded_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path / "cache"))
    model = ctxlock.load(str(fetched.gguf_path("qwen2")))
    assert model.templates is not None and model.templates.names == ("default",)
    assert model.templates.templates[0].origin.endswith(":tokenizer.chat_template")
    assert model.special_tokens == {
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
    }
    run = model.run({"messages": [{"role": "user", "content": "hi <|im_end|>"}]})
    assert run.rendered.text.startswith("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n")
    assert [run.rendered.text[m.start : m.end] for m in run.tokenized.neutralized] == ["<|im_end|>"]
    assert model.tokenizer.format == "gguf" and model.tokenizer.describe()["gguf_pre"] == "qwen2"
