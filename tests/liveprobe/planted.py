"""The planted divergence of the live-probe tests: another revision of llama.cpp's Qwen 2.5 template (one more space
in its default system line, the branch without tools), and where it parts from the original for each probe of the
corpus, computed by transformers alone (`apply_chat_template` on the HF tokenizer converted from the qwen2 GGUF):
the first diverging token and the first differing character."""

from __future__ import annotations

from pathlib import Path

import fetched
from ctxlock.artifacts import load_template_file
from ctxlock.pipeline import Pipeline
from ctxlock.probes import load_corpus, render_probes
from reference import reference_ids, reference_render

QWEN = fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"
DEFAULT_LINE = "You are a helpful assistant.<|im_end|>"


def planted() -> str:
    """The other revision's source."""
    source = QWEN.read_text("utf-8")
    assert source.count(DEFAULT_LINE) == 1
    return source.replace(DEFAULT_LINE, DEFAULT_LINE.replace("helpful assistant", "helpful  assistant"))


def revision(root: Path) -> Path:
    """The other revision, written to `root`."""
    path = root / "qwen-rev.jinja"
    path.write_text(planted(), "utf-8")
    return path


def _first(a: list[int] | str, b: list[int] | str) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)


def expected_divergences(model: Pipeline) -> dict[str, tuple[int, int]]:
    """Probe name -> (first diverging token, first differing character) of the planted revision against the
    original, for every probe transformers renders exactly as ctxlock does with the original (on `model`'s
    vocabulary, the qwen2 one) and on which the two revisions part. Probes where they give the same ids are left
    out: those must agree."""
    hf = fetched.hf_tokenizer_dir("qwen2")
    original = QWEN.read_text("utf-8")
    out: dict[str, tuple[int, int]] = {}
    checked = 0
    for r in render_probes(model, load_corpus(), load_template_file(QWEN)):
        p, req = r.probe, dict(r.probe.request)
        if "documents" in req or r.ids is None:
            continue
        kw = {
            "tools": req.get("tools"),
            "add_generation_prompt": p.add_generation_prompt,
            "continue_final_message": p.continue_final_message,
        }
        try:
            a = reference_ids(hf, original, req["messages"], **kw)
        except Exception:  # transformers refuses some probes outright: they are not compared here
            continue
        if a != list(r.ids):
            continue
        checked += 1
        b = reference_ids(hf, planted(), req["messages"], **kw)
        if a != b:
            texts = (
                reference_render(original, req["messages"], **kw),
                reference_render(planted(), req["messages"], **kw),
            )
            out[p.name] = (_first(a, b), _first(*texts))
    assert checked >= 10 and 5 <= len(out) < checked, (checked, out)  # both outcomes, over most of the corpus
    return out
