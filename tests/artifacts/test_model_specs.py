"""Every way a user names a model, end to end: GGUF files, tiktoken ranks files, SentencePiece models, the HF hub
cache, and what `ctxlock inspect` says about each. Includes the seed's real vector and "Qwen three ways"."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ctxlock
import fetched
import reference
from ctxlock.errors import ArtifactNotFoundError
from ctxlock.template._render import ChatTemplate

QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ctxlock-cache"))


def _qwen_template() -> ChatTemplate:
    return ChatTemplate((fetched.templates_dir() / QWEN25).read_text("utf-8"), id=QWEN25)


def _tiktoken_model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "qwen-tiktoken"
    d.mkdir(exist_ok=True)
    shutil.copyfile(fetched.qwen_tiktoken_path(), d / "qwen.tiktoken")
    manifest = {
        "description": "Qwen ranks from dashscope",
        "tokenizer": {"format": "tiktoken", "file": "qwen.tiktoken", "preset": "qwen"},
        "template": "chat_template.jinja",
        "special_tokens": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    }
    (d / "ctxlock.json").write_text(json.dumps(manifest), "utf-8")
    (d / "chat_template.jinja").write_text(_qwen_template().source, "utf-8")
    return d


def test_seed_002_real_vector_qwen2_gguf_with_qwen25_template() -> None:
    """Seed 002 §1: `你好，介绍一下你自己` with the generation prompt, Qwen2 vocabulary, Qwen2.5 template."""
    messages = [{"role": "user", "content": "你好，介绍一下你自己"}]
    template = _qwen_template()
    expected = reference.reference_ids(
        fetched.hf_tokenizer_dir("qwen2"), template.source, messages, add_generation_prompt=True
    )
    model = ctxlock.load(str(fetched.gguf_path("qwen2")))
    ours = model.encode({"messages": messages}, chat_template=template).input_ids[0].tolist()
    assert ours == expected
    assert ours[:3] == [151644, 8948, 198]  # <|im_start|>system\n: the template's default system turn


def _mixed_requests(n: int) -> list[dict]:
    rng = random.Random(20261130)
    pieces = [
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "天空为什么是蓝色？",
        "请用一句话解释。",
        "def f(x):\n    return x ** 2\n",
        "for (int i = 0; i < n; ++i) { sum += a[i]; }",
        "SELECT * FROM t WHERE id=42;",
        "😀🎉",
        "👩‍💻 and 👨‍👩‍👧‍👦",
        "🏳️‍🌈",
        "   ",
        "\t\t",
        "\n\n\n",
        "  leading",
        "trailing  ",
        "a  b   c    d",
        "3.14159",
        "1234567890",
        "Ça va? é vs e\u0301",
        "Ünïcödé",
        "нещо на Български",
        "こんにちは",
        "안녕하세요",
        "\r\n",
        "'s 're 've",
        "!!!???",
        "<b>bold</b>",
        "x" * 40,
        "  \n  \n",
        "tab\there",
    ]
    requests = []
    for _ in range(n):
        turns = []
        if rng.random() < 0.5:
            turns.append({"role": "system", "content": "".join(rng.choice(pieces) for _ in range(rng.randint(1, 3)))})
        for t in range(rng.randint(1, 4)):
            role = "user" if t % 2 == 0 else "assistant"
            turns.append({"role": role, "content": "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))})
        if turns[-1]["role"] != "user":
            turns.append({"role": "user", "content": rng.choice(pieces)})
        requests.append({"messages": turns})
    return requests


def test_qwen_three_ways(tmp_path: Path) -> None:
    """qwen.tiktoken (dashscope) through tiktoken, ggml-vocab-qwen2.gguf through the GGUF loader, and the
    transformers-converted tokenizer.json: identical ids on 300 mixed chat requests."""
    template = _qwen_template()
    via_tiktoken = ctxlock.load(str(_tiktoken_model_dir(tmp_path)))
    via_gguf = ctxlock.load(str(fetched.gguf_path("qwen2")))
    via_hf = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    assert (via_tiktoken.tokenizer.format, via_gguf.tokenizer.format, via_hf.tokenizer.format) == (
        "tiktoken",
        "gguf",
        "hf-tokenizers",
    )
    requests = _mixed_requests(300)
    for i, request in enumerate(requests):
        a = via_tiktoken.encode(request, chat_template=template).input_ids[0].tolist()
        b = via_gguf.encode(request, chat_template=template).input_ids[0].tolist()
        c = via_hf.encode(request, chat_template=template).input_ids[0].tolist()
        assert a == b == c, f"request {i}: {json.dumps(request, ensure_ascii=False)[:200]}"


def test_mistral_sentencepiece_models_through_manifests(tmp_path: Path) -> None:
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    texts = ["Hello world", "  two  spaces ", "天空为什么是蓝色？", "emoji 🦙 and e\u0301", "\n\ttabs\n", "𠀋 rare"]
    for resource in (
        "data/tokenizer.model.v1",
        "data/mistral_instruct_tokenizer_240323.model.v3",
        "data/mistral_instruct_tokenizer_241114.model.v7",
    ):
        d = tmp_path / resource.split("/")[-1]
        d.mkdir()
        spec = {"format": "sentencepiece", "package": "mistral_common", "resource": resource}
        (d / "ctxlock.json").write_text(json.dumps({"tokenizer": spec}), "utf-8")
        model = ctxlock.load(str(d))
        import mistral_common

        path = Path(mistral_common.__file__).parent / resource
        ref = MistralTokenizer.from_file(str(path)).instruct_tokenizer.tokenizer
        for text in texts:
            assert model.tokenizer.encode(text) == ref.encode(text, bos=False, eos=False), (resource, text)


def _fake_hub(tmp_path: Path, repo: str) -> Path:
    """A real HF hub cache layout: blobs named by content, snapshot files as relative symlinks, refs/main."""
    src = fetched.hf_tokenizer_dir("qwen2")
    root = tmp_path / "hub" / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        data = (src / name).read_bytes()
        blob = root / "blobs" / fetched.sha256_file(src / name)
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    return tmp_path / "hub"


def test_hub_cache_model_loads_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = _fake_hub(tmp_path, "Qwen/Qwen2.5-7B-Instruct")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    model = ctxlock.load("Qwen/Qwen2.5-7B-Instruct")
    assert model.id == "Qwen/Qwen2.5-7B-Instruct"
    direct = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    req = {"messages": [{"role": "user", "content": "你好，介绍一下你自己"}]}
    assert model.encode(req) == direct.encode(req)
    with pytest.raises(ArtifactNotFoundError) as info:
        ctxlock.load("Qwen/Not-Downloaded")
    assert "not in the local" in info.value.message and str(hub) in (info.value.message + (info.value.path or ""))


def _inspect(model: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "ctxlock", "inspect", "--model", model, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_inspect_reports_every_format(tmp_path: Path) -> None:
    gguf = _inspect(str(fetched.gguf_path("qwen2")))
    assert gguf["tokenizer"]["format"] == "gguf"
    assert gguf["tokenizer"]["sha256"] == fetched.sha256_file(fetched.gguf_path("qwen2"))
    assert (gguf["tokenizer"]["gguf_model"], gguf["tokenizer"]["gguf_pre"]) == ("gpt2", "qwen2")
    assert gguf["tokenizer"]["model"] == "BPE" and gguf["tokenizer"]["normalizer"] == "NFC"
    assert gguf["special_tokens"]["eos_token"] == {"content": "<|endoftext|>", "id": 151643}
    assert gguf["templates"][0]["origin"].endswith(":tokenizer.chat_template")
    assert len(gguf["templates"][0]["sha256"]) == 64
    assert "add_bos" in gguf["tokenizer"]

    spm = _inspect(str(fetched.gguf_path("llama-spm")))
    assert spm["tokenizer"]["gguf_model"] == "llama" and spm["tokenizer"]["add_bos"] is True
    assert spm["templates"] == []

    tik = _inspect(str(_tiktoken_model_dir(tmp_path)))
    assert tik["tokenizer"]["format"] == "tiktoken"

    hf = _inspect(str(fetched.hf_tokenizer_dir("qwen2")))
    assert hf["tokenizer"]["format"] == "hf-tokenizers" and hf["tokenizer"]["pre_tokenizer"] == "Sequence"

    default = _inspect("mistral-nemo")
    assert default["tokenizer"]["format"] == "tekken"
