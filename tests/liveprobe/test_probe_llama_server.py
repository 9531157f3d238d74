"""`ctxlock probe` against a real llama.cpp `llama-server` (tests/llama_server.py: built from the llama.cpp sources
the pinned llama-cpp-python sdist vendors), on a tiny model GGUF around the real qwen2 vocabulary with llama.cpp's
Qwen 2.5 template embedded: the model file the probe names on ctxlock's side is the very file the server loaded.

- Detected as llama.cpp from its own `/v1/models` (`owned_by: "llamacpp"`), its build from `/props`.
- On the probes where the two engines agree (plain conversations; the server runs with `--no-prefill-assistant`, so
  a conversation ending with an assistant message is not continued), every answer is ctxlock's, token for token;
  every other probe that parts is named with a cause, never silently.
- The planted divergence: ctxlock's side renders another revision of the template (`--template`), the server the
  one in the GGUF; each probe it touches is named at the token and the character transformers computes
  (tests/liveprobe/planted.py).
- `--manifest`: the template digest from `/props` is the GGUF's template's; llama.cpp answers no tokenizer digest,
  and the report says so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from planted import QWEN, expected_divergences, revision

import llama_server
from cli_runner import run_cli
from ctxlock.artifacts import load_template_file
from ctxlock.liveprobe import Verdict, probe_server, read_manifest
from ctxlock.model import Model, load
from ctxlock.probes import load_corpus

# Plain conversations both engines render alike (llama.cpp's Jinja engine and prefill rule aside): they must agree.
AGREE = {
    "user",
    "user-no-generation-prompt",
    "system",
    "multi-turn",
    "multi-turn-system",
    "consecutive-users",
    "system-not-first",
    "assistant-first",
    "empty-assistant",
    "named",
    "unicode",
}
CAUSES = {"template", "tokenizer", "special tokens", "clock", "server refused", "ctxlock refused"}


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("probe-llama-server") / "tiny-qwen2.gguf"
    return llama_server.tiny_gguf("qwen2", path, chat_template=QWEN.read_text("utf-8"))


@pytest.fixture(scope="module")
def server(gguf: Path) -> Iterator[str]:
    with llama_server.LlamaServer(gguf, args=["--no-prefill-assistant"]) as url:
        yield url


@pytest.fixture(scope="module")
def model(gguf: Path) -> Model:
    return load(str(gguf))


def test_probe_agrees_with_llama_server_where_the_engines_agree(server: str, model: Model) -> None:
    report = probe_server(server, model)  # the GGUF's own template on both sides; the kind is detected
    assert report.server.kind == "llamacpp" and report.server.detected.startswith("GET /v1/models: owned_by 'llamacpp'")
    assert report.server.version  # /props build_info
    assert report.local is not None and report.local.template_sha256 == load_template_file(QWEN).sha256
    got = {r.probe: r for r in report.results}
    assert got["documents"].verdict is Verdict.NOT_SENT
    disagree = {n: r for n, r in got.items() if n in AGREE and r.verdict is not Verdict.AGREE}
    assert disagree == {}, "\n".join(report.lines())
    for r in report.divergences:  # whatever else parts is named, with a cause
        assert r.divergence is not None and r.cause is not None and r.cause.kind in CAUSES, r


def test_probe_names_the_planted_divergence_at_the_right_token(server: str, model: Model, tmp_path: Path) -> None:
    expected = {n: v for n, v in expected_divergences(model).items() if n in AGREE}
    assert len(expected) >= 5
    report = probe_server(
        server, model, template=load_template_file(revision(tmp_path)), corpus=load_corpus(only=sorted(AGREE))
    )
    by_name = {r.probe: r for r in report.results}
    for name, (token, char) in expected.items():
        r = by_name[name]
        assert r.verdict is Verdict.DIVERGE, name
        assert r.divergence is not None and r.divergence.index == token, name
        assert r.cause is not None and r.cause.kind == "template" and r.cause.text is not None
        assert r.cause.text.offset == char
        assert "helpful  assistant" in r.cause.text.ctxlock and "helpful assistant" in r.cause.text.server
    assert {r.probe for r in report.divergences} == set(expected)  # the probes the revision does not touch agree


def test_the_cli_gate_and_the_manifest(server: str, model: Model, gguf: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps(
            {
                "template_sha256": {"default": load_template_file(QWEN).sha256},
                "tokenizer_sha256": model.tokenizer.sha256,
            }
        )
    )
    checked = probe_server(server, None, manifest=read_manifest(manifest))
    assert checked.manifest is not None
    template, tokenizer = checked.manifest.checks
    assert template.status == "same" and template.detail.startswith("GET /props chat_template"), template
    assert tokenizer.status == "not checked" and "answers no tokenizer digest" in tokenizer.detail
    common = ["probe", server, "--model", str(gguf), "--only", "user", "--no-record", "--fail-on-diff"]
    same = run_cli(*common, "--manifest", str(manifest))
    assert same.returncode == 0, same.stdout + same.stderr
    planted_ = run_cli(*common, "--template", str(revision(tmp_path)), "--json")
    assert planted_.returncode == 1
    (result,) = json.loads(planted_.stdout)["results"]
    assert result["verdict"] == "diverge" and result["cause"]["kind"] == "template"
