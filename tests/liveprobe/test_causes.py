"""A divergence's cause names a BOS (or the EOS the tokenizer adds) that one side's ids have and the other's lack,
before the rest of the cause. The case llama-server shows on Phi-3.5 (docs/live-probe.md, "Phi-3.5 tokens"): it
tokenizes the rendered prompt with the vocabulary's BOS added, and tokenizes the text after `<|user|>` otherwise, so
the ids part at token 0 although the texts are the same; the cause used to say "tokenizer" alone.

ctxlock's side is its real render of a probe; the server's side is built from it the way llama-server's differs (the
whole answer of a real llama-server is compared in test_llamacpp_survey.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import fetched
from ctxlock.artifacts import load_template_file
from ctxlock.liveprobe import Verdict
from ctxlock.liveprobe._compare import compare
from ctxlock.liveprobe._routes import ServerRender
from ctxlock.model import Model, load
from ctxlock.probes import ProbeRender, load_corpus, render_probe

PHI35 = fetched.templates_dir() / "microsoft-Phi-3.5-mini-instruct.jinja"


def user_render(model: Model, template: Path) -> ProbeRender:
    pr = render_probe(model, load_corpus(only=["user"]).named("user"), load_template_file(template))
    assert pr.ids is not None and pr.text is not None
    return pr


def same_text(pr: ProbeRender, _sr: ServerRender) -> tuple[str, str, str]:
    assert pr.text is not None
    return pr.text, pr.text, "the server's prompt"


def test_a_bos_one_side_adds_is_named_before_the_tokenizer() -> None:
    phi3 = load(str(fetched.gguf_path("phi-3")))
    pr = user_render(phi3, PHI35)
    assert pr.ids is not None and pr.ids[:2] == (32010, 1724)  # <|user|> ▁What: no ▁ \n between (rstrip)
    # The server's: its BOS first, and <|user|> ▁ \n What, the same text tokenized without the strip.
    server = (1, 32010, 29871, 13, 5618, *pr.ids[2:])
    result = compare(pr, ServerRender(server, pr.text), phi3, "route", same_text)
    assert result.verdict is Verdict.DIVERGE and result.cause is not None
    assert result.cause.kind == "tokenizer"
    assert result.cause.detail.startswith(
        "the server's ids start with a BOS, '<s>' (id 1), that ctxlock's lack; besides, the texts are the same"
    )
    # The other way round: ctxlock's side has the BOS, the server's not.
    mine = dataclasses.replace(pr, ids=server)
    result = compare(mine, ServerRender(pr.ids, pr.text), phi3, "route", same_text)
    assert result.cause is not None and result.cause.detail.startswith(
        "ctxlock's ids start with a BOS, '<s>' (id 1), that the server's lack; besides"
    )
    # Without the BOS the cause is the tokenizer's alone; with the BOS alone it is `special tokens`.
    result = compare(pr, ServerRender(server[1:], pr.text), phi3, "route", same_text)
    assert result.cause is not None and result.cause.detail.startswith("the texts are the same")
    result = compare(pr, ServerRender((1, *pr.ids), pr.text), phi3, "route", same_text)
    assert result.cause is not None and result.cause.kind == "special tokens"


def test_the_tokenizers_own_bos_and_eos_are_named(tmp_path: Path) -> None:
    # bert-bge's add_special_tokens puts [CLS] before a text and [SEP] after it.
    bert = load(str(fetched.gguf_path("bert-bge")))
    assert bert.tokenizer.encode("a", add_special_tokens=True) == [101, 1037, 102]
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", "utf-8")
    pr = user_render(bert, template)
    assert pr.ids is not None and pr.ids[0] != 101 and pr.ids[-1] != 102
    server = (101, *pr.ids[:-1], 1037, 102)  # both added, and the last token another one
    result = compare(pr, ServerRender(server, pr.text), bert, "route", same_text)
    assert result.cause is not None and result.cause.kind == "tokenizer"
    assert result.cause.detail.startswith(
        "the server's ids start with a BOS, '[CLS]' (id 101), that ctxlock's lack; the server's ids end with the "
        "EOS the tokenizer adds, '[SEP]' (id 102), that ctxlock's lack; besides, the texts are the same"
    )
