"""Red-team cases for `ctxlock lint`: hostile templates, probe files and output paths, each held to the promise
that nothing is silent (a check that could not run says so) and every failure is one typed line."""

from __future__ import annotations

import pytest

import fetched
from ctxlock.lint import lint
from ctxlock.model import Model, load
from ctxlock.template import ChatTemplate


@pytest.fixture(scope="module")
def qwen2() -> Model:
    return load(str(fetched.gguf_path("qwen2")))


def test_a_template_that_raises_on_every_probe_lists_the_render_rules_as_not_run(qwen2: Model) -> None:
    # Before the fix every rule that reads renders found nothing and said nothing: a silent pass.
    source = "{% if flag %}a{% endif %}{{ raise_exception('no') }}"
    report = lint(qwen2, ChatTemplate(source, id="raises"), variables={"flag": True, "x": 1}, engines=())
    not_run = {s.rule for s in report.skipped}
    assert {"double-bos", "history-rewrite", "nondeterminism", "training-mask", "unread-argument"} <= not_run
    assert all("none of the 21 probes renders" in s.reason for s in report.skipped if s.rule != "portability")
    # a --var never read is still found (from the syntax tree); `flag` is not claimed to have no effect
    messages = [f.message for f in report.findings if f.rule == "unread-argument"]
    assert messages == ["the template never reads 'x': passing x=1 changes nothing"]
