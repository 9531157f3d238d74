"""fastokens as whole-text encoding's native call (`ctxlock.tokenizer._accel`, issue 7): admitted for a vocabulary
only after its ids equal the exact path's on probe texts holding every UTF-8 token of the vocabulary; refused with a
reason otherwise; any failing call goes to tiktoken. The equivalence with `tokenizers` on llama.cpp's vectors and on
hypothesis texts, engine by engine, is in tests/tokenizer/test_prefix.py."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import ctxlock
import fetched
from ctxlock.template._render import ChatTemplate
from ctxlock.tokenizer import _accel as accel
from ctxlock.tokenizer._accel import Accelerator, probe_texts
from ctxlock.tokenizer.backends._hf import HFTokenizer
from vocabularies import TOKENIZERS, native_engine

MUST_BE_ADMITTED = ("gguf:qwen2", "gguf:llama-bpe", "gguf:gpt-2", "hf:qwen2", "hf:llama-bpe")


pytestmark = pytest.mark.fast_path  # about the fast path itself: on even under CTXLOCK_FAST=0


def _fresh(name: str = "qwen2") -> HFTokenizer:
    """A tokenizer of its own (not the shared ones), so that its accelerator starts from nothing."""
    text = fetched.hf_tokenizer_dir(name).joinpath("tokenizer.json").read_text("utf-8")
    return HFTokenizer(text, id=f"{name} (fresh)")


def test_admitted_on_the_vocabularies_that_must_take_it() -> None:
    toks = TOKENIZERS
    for key in MUST_BE_ADMITTED:
        whole = toks[key].whole_text
        assert whole.accelerator.wait(), f"{key}: {whole.accelerator.describe()}"
        assert whole.engine == "fastokens"
        assert toks[key].whole_text_engine.startswith("fastokens (ready: ")
        # The check ran on the whole vocabulary: hundreds of thousands of ids.
        checked = int(toks[key].whole_text_engine.split("(")[-1].split(" ids")[0].replace(",", ""))
        assert checked > 100_000


def test_the_probes_hold_every_utf8_token_and_every_added_token() -> None:
    tok = TOKENIZERS["hf:qwen2"]
    fast = tok._fast()
    probes = list(probe_texts(fast.ranks, dict(fast.specials)))
    joined = "\x00".join(probes)
    for raw in list(fast.ranks)[::97]:  # a sample of the vocabulary, spread over all ranks
        try:
            word = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert word in joined
    for special in fast.specials:
        assert special in joined


def test_a_fastokens_that_disagrees_is_refused_with_the_probe_and_token() -> None:
    # A real fastokens tokenizer, of another vocabulary (Llama 3's), checked against Qwen2's exact path.
    qwen = TOKENIZERS["hf:qwen2"]
    fast = qwen._fast()
    llama_json = fetched.hf_tokenizer_dir("llama-bpe").joinpath("tokenizer.json").read_text("utf-8")

    def build():
        import fastokens

        return fastokens.Tokenizer.from_json_str(llama_json)

    acc = Accelerator(build, qwen.whole_text.reference_ids, lambda: probe_texts(fast.ranks, dict(fast.specials)))
    assert not acc.wait()
    assert acc.state == "refused"
    assert "differs from the exact path on probe text 0 at token" in acc.reason
    assert acc.encode("hello") is None


def test_a_build_that_fails_is_refused_and_tiktoken_keeps_the_calls() -> None:
    qwen = TOKENIZERS["hf:qwen2"]

    def build():
        import fastokens

        return fastokens.Tokenizer.from_json_str("{not json")

    acc = Accelerator(build, qwen.whole_text.reference_ids, lambda: iter(["x"]))
    assert not acc.wait()
    assert acc.reason.startswith("fastokens could not load the tokenizer.json")


def test_a_call_that_raises_goes_to_tiktoken() -> None:
    tok = _fresh()
    whole = tok.whole_text
    assert whole.accelerator.wait()
    text = "<|im_start|>user\nhello 天空<|im_end|>\n"
    expected = tok._tok.encode(text, add_special_tokens=False).ids
    # A str fastokens cannot take (a lone surrogate) raises inside it: the call is counted and tiktoken answers.
    assert whole.accelerator.encode("a\ud800b") is None
    assert whole.accelerator.failures == 1
    assert whole.native(text).tolist() == expected


def test_daemon_thread_mode_builds_in_the_background(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXLOCK_FASTOKENS", "eager")
    tok = _fresh()
    whole = tok.whole_text
    text = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nwhy 天空 is blue 😀<|im_end|>\n"
    expected = tok._tok.encode(text, add_special_tokens=False).ids
    # Encoding does not wait: while fastokens is being built and checked, tiktoken makes the calls.
    assert whole.encode(text, cache=False).tolist() == expected
    deadline = time.monotonic() + 120
    while not whole.accelerator.ready and time.monotonic() < deadline:
        assert whole.accelerator.state in ("building", "ready")
        time.sleep(0.05)
    assert whole.engine == "fastokens", whole.accelerator.describe()
    assert whole.encode(text, cache=False).tolist() == expected


def test_default_mode_starts_the_build_only_once_the_work_done_without_it_pays_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 16 item 1: the build slows the first pass of a fresh process (it takes ~1.2 s of CPU and half the
    encoding thread's speed meanwhile), so by default it starts once tiktoken has encoded `start_after()` characters
    of whole text for the vocabulary, counted on what reaches the native call (a reused prefix is not counted)."""
    monkeypatch.setenv("CTXLOCK_FASTOKENS", "1")
    monkeypatch.setenv("CTXLOCK_FASTOKENS_AFTER", "2000")
    assert accel.start_after() == 2000
    tok = _fresh()
    whole = tok.whole_text
    text = "<|im_start|>user\nwhy 天空 is blue, in a few words? " * 20 + "<|im_end|>\n"
    expected = tok._tok.encode(text, add_special_tokens=False).ids
    assert whole.encode(text, cache=False).tolist() == expected
    acc = whole.accelerator
    assert acc.state == "not started" and 0 < acc.owed < 2000
    assert acc.describe() == f"not started: {acc.owed:,} of 2,000 characters encoded without it"
    while acc.owed < 2000:
        assert whole.encode(text, cache=False).tolist() == expected
    assert acc.state in ("building", "ready")
    assert acc.wait(120), acc.describe()
    assert whole.encode(text, cache=False).tolist() == expected and whole.engine == "fastokens"
    # The default threshold, and what a bad value falls back to.
    monkeypatch.setenv("CTXLOCK_FASTOKENS_AFTER", "lots")
    assert accel.start_after() == accel.START_AFTER_CHARS == 8_000_000
    monkeypatch.delenv("CTXLOCK_FASTOKENS_AFTER")
    assert accel.start_after() == 8_000_000


def test_ctxlock_fastokens_0_keeps_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXLOCK_FASTOKENS", "0")
    tok = _fresh()
    whole = tok.whole_text
    assert not whole.accelerator.wait() and whole.accelerator.state == "off"
    assert tok.whole_text_engine == "tiktoken (fastokens off: CTXLOCK_FASTOKENS=0)"
    text = "<|im_start|>user\nhi<|im_end|>\n"
    assert whole.encode(text).tolist() == tok._tok.encode(text, add_special_tokens=False).ids


def test_warm_up_and_describe_name_the_engines() -> None:
    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    engines = model.warm_up()
    assert engines["engine"] == "tiktoken"
    assert engines["whole_text_engine"].startswith("fastokens (ready: ")
    desc = model.tokenizer.describe()
    assert desc["whole_text_engine"] == engines["whole_text_engine"]
    # A tokenizer without whole-text encoding has nothing to warm beyond its engine.
    assert ctxlock.load().warm_up()["whole_text_engine"] == ""


def test_chat_requests_give_the_same_ids_with_either_engine() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import corpus

    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    source = (fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text("utf-8")
    template = ChatTemplate(source, id="qwen2.5")
    requests = corpus.single_shot(40, seed=11, scale=0.2) + corpus.conversation(8, seed=12, scale=0.2)
    rows = {}
    for engine in ("tiktoken", "fastokens"):
        ctxlock.clear_caches()
        with native_engine(model.tokenizer.whole_text, engine):
            rows[engine] = [model.encode(r, chat_template=template).input_ids[0] for r in requests]
    ctxlock.clear_caches()
    for a, b, r in zip(rows["tiktoken"], rows["fastokens"], requests, strict=True):
        assert np.array_equal(a, b)
        rendered = model.render(r, chat_template=template)
        assert a.tolist() == list(ctxlock.tokenizer.tokenize(rendered, model.tokenizer).ids)


def test_inspect_prints_the_native_engine() -> None:
    from typer.testing import CliRunner

    from ctxlock.cli import app

    result = CliRunner().invoke(app, ["inspect", "--model", str(fetched.hf_tokenizer_dir("qwen2")), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["tokenizer"]["whole_text_engine"].startswith("fastokens (ready: ")
    result = CliRunner().invoke(app, ["inspect", "--model", str(fetched.hf_tokenizer_dir("qwen2"))])
    assert result.exit_code == 0, result.output
    assert "native call fastokens (ready: " in " ".join(result.output.split())


def test_describing_a_tokenizer_does_not_start_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    # Records and `ctxlock render` describe the tokenizer; only an encode (or warm_up) pays for fastokens.
    monkeypatch.setenv("CTXLOCK_FASTOKENS", "1")
    tok = _fresh()
    desc = tok.describe()
    assert desc["whole_text"] and tok.whole_text.accelerator.state == "not started"
    assert desc["whole_text_engine"] == "tiktoken (fastokens not started)"
