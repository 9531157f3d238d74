"""The sides of `diff-template`: what a spec is, which tokenizer a template file renders with, and the pairs of real
artifacts (an HF directory against the GGUF it was converted from, two GGUF files, two revisions of a hub repo),
with the ids compared token for token only when both sides tokenize with one tokenizer."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import fetched
from ctxlock.artifacts import DEFAULT_MODEL
from ctxlock.errors import ArtifactNotFoundError, InputError, TemplateNotFoundError, TemplateSyntaxError
from ctxlock.probes import load_corpus
from ctxlock.templatediff import diff_templates, load_sides, spec_kind

QWEN = "Qwen-Qwen2.5-7B-Instruct.jinja"


def template_path(name: str) -> Path:
    return next(p for p in fetched.template_paths() if p.name == name)


def test_what_a_spec_is(tmp_path: Path) -> None:
    (tmp_path / "t.j2").write_text("{{ messages }}", "utf-8")
    (tmp_path / "fake.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert spec_kind(str(template_path(QWEN))) == "template"
    assert spec_kind(str(tmp_path / "t.j2")) == "template"
    assert spec_kind(str(fetched.gguf_path("qwen2"))) == "model"
    assert spec_kind(str(tmp_path / "fake.gguf")) == "model"  # by its magic bytes, not its name
    assert spec_kind(str(fetched.hf_tokenizer_dir("qwen2"))) == "model"
    assert spec_kind("book") == "model" and spec_kind("Qwen/Qwen2.5-7B-Instruct@main") == "model"
    assert spec_kind(str(tmp_path / "missing.jinja")) == "template"
    assert spec_kind(str(fifo)) == "template"  # never opened: the template loader refuses it


def test_which_tokenizer_a_template_file_renders_with() -> None:
    qwen, gguf = str(template_path(QWEN)), str(fetched.gguf_path("qwen2"))
    a, b = load_sides(qwen, gguf)
    assert (a.kind, b.kind) == ("template", "model")
    assert a.model is b.model and a.tokenizer_from == "B's model" and b.tokenizer_from == "its own"
    a, b = load_sides(qwen, qwen)
    assert a.model.id == DEFAULT_MODEL and a.tokenizer_from == f"the embedded default {DEFAULT_MODEL}"
    a, b = load_sides(qwen, "book", model=gguf)
    assert a.model.id == "ggml-vocab-qwen2.gguf" and a.tokenizer_from == f"--model {gguf}"
    assert b.model.id == "book" and b.tokenizer_from == "its own"


def test_a_side_that_does_not_load_is_named(tmp_path: Path) -> None:
    qwen, gguf = str(template_path(QWEN)), str(fetched.gguf_path("qwen2"))
    with pytest.raises(ArtifactNotFoundError) as missing:
        load_sides(qwen, str(tmp_path / "nope.jinja"))
    assert missing.value.path == f"B {tmp_path / 'nope.jinja'}"
    (tmp_path / "bad.jinja").write_text("{% if %}\n", "utf-8")
    with pytest.raises(TemplateSyntaxError) as bad:
        load_sides(str(tmp_path / "bad.jinja"), gguf)
    assert bad.value.path == f"A {tmp_path / 'bad.jinja'} line 1"
    with pytest.raises(TemplateNotFoundError) as bare:
        load_sides(str(fetched.gguf_path("llama-bpe")), gguf)  # a vocab-only GGUF without a chat template
    assert bare.value.path == f"A {fetched.gguf_path('llama-bpe')}"
    with pytest.raises(InputError, match="both models") as both:
        load_sides("book", gguf, model=gguf)
    assert both.value.path == "--model"
    with pytest.raises(ArtifactNotFoundError) as nomodel:
        load_sides(qwen, qwen, model="no-such-model")
    assert nomodel.value.path is not None and nomodel.value.path.startswith("--model ")


def test_an_hf_directory_against_the_gguf_it_was_converted_from() -> None:
    corpus = load_corpus()
    hf_dir, gguf = fetched.hf_tokenizer_dir("qwen2"), fetched.gguf_path("qwen2")
    diff = diff_templates(*load_sides(str(hf_dir), str(gguf)), corpus)
    # tokenizer.json and the GGUF's vocabulary are other artifacts (other digests): the texts are compared.
    assert diff.a.model.tokenizer.sha256 != diff.b.model.tokenizer.sha256
    assert not diff.ids_comparable and diff.identical
    assert all(p.kind == "same" and p.divergence is None for p in diff.probes)
    out = diff.to_dict()
    assert out["ids_comparable"] is False and out["differences"] == 0
    assert out["a"]["templates"][0]["sha256"] == out["b"]["templates"][0]["sha256"]
    # The directory's template file, rendered with the GGUF's tokenizer: one tokenizer, ids compared.
    diff = diff_templates(*load_sides(str(hf_dir / "chat_template.jinja"), str(gguf)), corpus)
    assert diff.ids_comparable and diff.identical


def test_two_gguf_files_with_other_vocabularies() -> None:
    corpus = load_corpus()
    phi3, qwen2 = fetched.gguf_path("phi-3"), fetched.gguf_path("qwen2")
    diff = diff_templates(*load_sides(str(phi3), str(qwen2)), corpus)
    assert not diff.ids_comparable and not diff.identical
    out = diff.to_dict()
    for p, row in zip(diff.probes, out["results"], strict=True):
        if not p.differs:
            continue
        assert p.kind == "text" and p.divergence is None
        assert p.a.text is not None and p.b.text is not None
        assert p.text_index == next(i for i, (x, y) in enumerate(zip(p.a.text, p.b.text, strict=False)) if x != y)
        # Each side's ids are reported, each in its own vocabulary.
        assert row["a"]["ids"] == list(p.a.ids or ()) and row["b"]["ids"] == list(p.b.ids or ())
        assert row["a"]["ids"] and row["b"]["ids"] and row["divergence"] is None
    # phi-3's template writes neither the system turn nor the tool results; Qwen's ChatML writes both.
    changed = {c.capability: (c.a.verdict, c.b.verdict) for c in diff.changed}
    assert changed["system"] == ("dropped", "rendered")
    # The same template over two vocabularies: the texts are the same, so nothing differs.
    same = diff_templates(*load_sides(str(fetched.gguf_path("qwen35")), str(qwen2)), corpus)
    assert not same.ids_comparable and same.identical


def test_template_variables_reach_both_sides(tmp_path: Path) -> None:
    # Qwen3's template opens an empty think block when enable_thinking is false; B has lost that branch.
    source = template_path("Qwen-Qwen3-0.6B.jinja").read_text("utf-8")
    branch = (
        "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
        "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n"
    )
    assert source.count(branch) == 1
    (tmp_path / "b.jinja").write_text(source.replace(branch, ""), "utf-8")
    sides = load_sides(str(template_path("Qwen-Qwen3-0.6B.jinja")), str(tmp_path / "b.jinja"))
    corpus = load_corpus(only=["user", "user-no-generation-prompt"])
    assert diff_templates(*sides, corpus).identical
    diff = diff_templates(*sides, corpus, variables={"enable_thinking": False})
    assert [p.probe.name for p in diff.differing] == ["user"]
    assert diff.to_dict()["probes"]["variables"] == {"enable_thinking": False}


def _hub_model(cache: Path, repo: str, commit: str, ref: str, files: dict[str, bytes]) -> None:
    """A repo as huggingface_hub lays it out: blobs/<sha256>, snapshots/<commit>/<file> -> blob, refs/<ref>."""
    root = cache / f"models--{repo.replace('/', '--')}"
    for rel, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = root / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)


def test_two_revisions_of_a_hub_repo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    src = fetched.hf_tokenizer_dir("qwen2")
    qwen = template_path(QWEN).read_text("utf-8")
    tools_first = qwen.replace("{%- if tools %}", "{%- if tools and false %}", 1)  # v2 forgets the tools' prompt
    base = {n: (src / n).read_bytes() for n in ("tokenizer.json", "tokenizer_config.json")}
    for commit, ref, template in (("a" * 40, "v1", qwen), ("b" * 40, "v2", tools_first)):
        _hub_model(tmp_path / "hub", "Qwen/diff-test", commit, ref, {**base, "chat_template.jinja": template.encode()})
    diff = diff_templates(*load_sides("Qwen/diff-test@v1", "Qwen/diff-test@v2"), load_corpus())
    assert diff.ids_comparable
    assert {p.probe.name for p in diff.differing} == {p.name for p in load_corpus() if p.request.get("tools")}
    assert {c.capability: c.b.verdict for c in diff.changed} == {"tools": "dropped"}
