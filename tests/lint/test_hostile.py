"""Red-team cases for `ctxlock lint`: hostile templates, probe files and output paths, each held to the promise
that nothing is silent (a check that could not run says so) and every failure is one typed line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fetched
from cli_runner import run_main
from ctxlock.errors import CtxlockError, InputError
from ctxlock.lint import RULES, Finding, Report, Severity, lint, tag_generation, to_sarif
from ctxlock.lint import _lint as lint_module
from ctxlock.lint._engines import render_many
from ctxlock.lint._rules import HISTORY_CUTS
from ctxlock.model import Model, load
from ctxlock.probes import Corpus, Probe, ProbeError, ProbeRender, load_corpus, render_probes
from ctxlock.probes._corpus import MAX_MESSAGES
from ctxlock.probes._render import MAX_RENDER_CHARS
from ctxlock.template import ChatTemplate
from hypothesis_profiles import examples

QWEN25_SOURCE = fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"
PLAIN_LOOP = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"


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


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "q25.jinja"
    shutil.copy(QWEN25_SOURCE, path)
    return path


def test_fix_and_sarif_to_a_fifo_or_an_unwritable_file_are_one_error_line(qwen25: Path) -> None:
    # Before the fix, --fix FIFO waited for ever in open() (a FIFO opens when a reader comes), and a write the file
    # refused (/proc's files, a full disk) was a traceback.
    fifo = qwen25.parent / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that a regression fails rather than hangs
    base = [str(qwen25), "-m", str(fetched.gguf_path("qwen2")), "--engine", "none", "--rule", "double-bos"]
    for args, said in (
        (["--fix", str(fifo)], f"--fix {fifo}: is a FIFO (named pipe), not a file (pass a file path in an existing "),
        (["--sarif", str(fifo)], f"--sarif {fifo}: is a FIFO (named pipe), not a file (pass a file path in an exis"),
        (["--fix", "/dev/full"], "--fix /dev/full: cannot write: No space left on device (free space on its disk or "),
    ):
        code, _, err = run_main(["lint", *base, *args])
        assert code == 2 and "Traceback" not in err  # an error, not a finding
        (line,) = err.strip().splitlines()
        assert line.startswith(f"error: InputError: {said}"), line
    os.close(reader)


def _turns(n: int) -> dict[str, Any]:
    return {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": f"t{i}"} for i in range(n)]}


def test_a_probe_file_of_one_endless_conversation_is_refused_when_read(tmp_path: Path) -> None:
    # Before the fix a 100,001-message probe (2.6 MB, under every size cap) held lint for hours: history-rewrite
    # renders the conversation twice per assistant turn (2,001 messages took 30 s).
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"probes": [{"name": "long", "request": _turns(MAX_MESSAGES + 1)}]}), "utf-8")
    with pytest.raises(InputError) as exc:
        load_corpus(path)
    assert exc.value.path == f"{path} $.probes[0].request.messages"
    assert exc.value.message == f"{MAX_MESSAGES + 1} messages, more than {MAX_MESSAGES}"


def test_history_rewrite_checks_a_long_conversation_at_its_ends_and_says_so(qwen2: Model) -> None:
    corpus = Corpus((Probe("long", _turns(2 * (2 * HISTORY_CUTS + 3))),))
    report = lint(
        qwen2, ChatTemplate(QWEN25_SOURCE.read_text("utf-8"), id="q25"), corpus=corpus, rules=["history-rewrite"]
    )
    assert [(f.rule, f.severity, f.data["kind"]) for f in report.findings] == [
        ("history-rewrite", Severity.NOTE, "partial")
    ]
    assert report.findings[0].message == (
        f"probe long has {2 * HISTORY_CUTS + 3} assistant turns: history-rewrite checked the first {HISTORY_CUTS} "
        f"and the last {HISTORY_CUTS} (each check renders the conversation twice), not the 3 between"
    )


def test_a_template_writing_megabytes_for_every_probe_is_a_limit_error_not_tokenized(qwen2: Model) -> None:
    # Before the fix each probe's 7 MB render was tokenized (3 s) and kept: lint of the 21 probes took 58 s and 2 GB.
    source = "{% for m in messages %}{{ m.content }}{% endfor %}{{ 'x' * 3000000 }}"
    report = lint(qwen2, ChatTemplate(source, id="megabytes"), rules=["render-error"], engines=())
    (finding,) = report.findings
    assert finding.rule == "render-error" and finding.message.startswith(
        "20 ordinary request(s) fail with TemplateLimitError: the render is longer than a probe may render to "
        "(1,000,000 characters beyond twice its request's)"
    )
    # (continue-final fails before, as for any template that does not end with the message); a probe's own long
    # content is not held against the template
    long = Probe("long", {"messages": [{"role": "user", "content": "y" * (MAX_RENDER_CHARS + 10)}]})
    (render,) = render_probes(qwen2, [long], ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", id="t"))
    assert render.ok and len(render.ids or ()) > 0


def test_sarif_locates_odd_paths_in_the_repository_and_a_link_at_its_own_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    (repo / "sub dir").mkdir(parents=True)
    outside.mkdir()
    for path in (repo / "sub dir" / "é ü%20#?.jinja", repo / "a:b.jinja", outside / "o.jinja"):
        path.write_text("x", "utf-8")
    (repo / "link.jinja").symlink_to(outside / "o.jinja")
    monkeypatch.chdir(repo)
    origins = ["sub dir/é ü%20#?.jinja", "sub dir/../a:b.jinja", "../outside/o.jinja", "link.jinja"]
    finding = Finding("reachable-raise", Severity.WARNING, "raised", line=1)
    reports = [Report(o, "0" * 64, o, "m", (finding,)) for o in origins]
    results = to_sarif(reports, list(RULES.values()), "0")["runs"][0]["results"]
    uris = [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results]
    # Before the fix the link was located at its target outside the repository (a file: URI code scanning cannot map).
    assert uris == [
        "sub%20dir/%C3%A9%20%C3%BC%2520%23%3F.jinja",
        "a%3Ab.jinja",
        (outside / "o.jinja").resolve().as_uri(),
        "link.jinja",
    ]


@pytest.mark.parametrize(
    ("block", "line"),
    [
        ("{% generation %}{% if loop.last %}{% break %}{% endif %}{{ m.content }}{% endgeneration %}", 3),
        ("{% macro f() %}{% continue %}{% endmacro %}{{ f() }}", 3),
        ("{% call raise_exception('x') %}{% break %}{% endcall %}", 3),
    ],
    ids=["generation", "macro", "call"],
)
def test_a_loop_control_python_refuses_is_a_syntax_error_not_a_traceback(qwen2: Model, block: str, line: int) -> None:
    # jinja parses these, then generates a module Python's compile refuses ("'break' outside loop"): before the fix a
    # SyntaxError traceback out of lint, --fix, render and diff-template, and lint's syntax rule passed the template.
    source = "{% for m in messages %}\n<|{{ m.role }}|>\n" + block + "\n{% endfor %}"
    report = lint(qwen2, ChatTemplate(source, id="loop-control"), engines=())
    assert [(f.rule, f.severity, f.line) for f in report.findings] == [("syntax", Severity.ERROR, line)]
    assert "loop: a macro, call block or {% generation %} block is a function of its own" in (
        report.findings[0].message
    )


def test_fix_refuses_a_block_written_as_a_whole_whose_turns_each_have_a_cut(qwen2: Model) -> None:
    # Found by generating templates: each side of the loop's role test had a cut, the block cannot be written twice,
    # and the search for the side without one raised StopIteration (a traceback out of --fix).
    source = "{% for m in messages %}{% filter upper %}{{ m }}{% endfilter %}{% endfor %}"
    corpus = load_corpus(only=["user", "multi-turn", "tool-call", "continue-final", "reasoning-last"])
    result = tag_generation(qwen2, ChatTemplate(source, id="filter"), corpus.probes)
    assert not result.applies
    assert result.reason == "trained text is written by the block at line 1 as a whole: {% filter upper %}"


def test_minijinja_renders_after_an_oversized_one_are_bounded_the_same_way() -> None:
    # 100 MB of output per render: before the fix the worker kept the first text while rendering the second, which
    # then failed its allocation (a panic pyo3 raises as no Exception): the process died with a traceback, and the
    # result was that traceback's lines.
    source = "{% for i in range(99999) %}{{ 'abcdefghij' * 100 }}{% endfor %}"
    results = render_many("minijinja", source, [{}, {"a": 1}, {"b": 2}], timeout_s=5.0)
    assert [(r.limited, r.error) for r in results] == [(True, "output over 1000000 characters")] * 3


def test_fix_tags_a_template_that_writes_nothing_for_some_rows(qwen2: Model) -> None:
    # Found by generating templates: a row where no piece of the template writes anything (a conversation without
    # tool calls, for a template that writes only them) failed a strict zip in --fix (a ValueError traceback).
    source = (
        "{% for m in messages %}{% for t in m.tool_calls or [] %}{{ t.function.name }}"
        "{{ t.function.arguments|tojson }}{% endfor %}{% endfor %}"
    )
    result = tag_generation(qwen2, ChatTemplate(source, id="calls-only"), load_corpus().probes)
    assert result.applies and result.source is not None and "{% generation %}" in result.source


_ATOMS = (
    "{{ m.content }}", "{{ m }}", "{{ bos_token }}", "{% break %}", "{% continue %}", "{{ raise_exception('x') }}",
    "{{ strftime_now('%Y') }}", "{{ [1, 2]|random }}", "{{ m.content|tojson }}", "{{ 'x' * 999 }}", "{{ 1 / 0 }}",
    "{{ m.content[::-1] }}", "{{ loop.index }}", "{% set ns.x = ns.x + 1 %}", "{{ undefined_thing.attr }}", "\n",
    "{{ m.reasoning_content }}", "{% if loop.first %}{{ bos_token }}{% endif %}", "{{ '<|' + m.role + '|>' }}",
    "{% for t in m.tool_calls or [] %}{{ t.function.name }}{{ t.function.arguments|tojson }}{% endfor %}",
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}"
    "{% endif %}",
    "{% if add_generation_prompt %}<|assistant|>{% endif %}", "{% raw %}{% generation %}{% endraw %}",
)  # fmt: skip
_BLOCKS = (
    "{% for m in messages %}B{% endfor %}", "{% if messages %}B{% else %}B{% endif %}",
    "{% set x %}B{% endset %}{{ x }}",
    "{% generation %}B{% endgeneration %}", "{% macro f(m) %}B{% endmacro %}{{ f(messages[0]) }}",
    "{% filter upper %}B{% endfilter %}", "{% call raise_exception('c') %}B{% endcall %}",
    "{%- for m in messages -%}{%- if m.role == 'assistant' -%}{% generation %}B{% endgeneration %}{%- else -%}B"
    "{%- endif -%}{%- endfor -%}",
)  # fmt: skip
_TEMPLATES = st.recursive(
    st.sampled_from(_ATOMS),
    lambda inner: st.one_of(
        st.builds(lambda block, body: block.replace("B", body), st.sampled_from(_BLOCKS), inner),
        st.lists(inner, min_size=1, max_size=3).map("".join),
    ),
    max_leaves=8,
).map(lambda body: "{% set ns = namespace(x=0) %}" + body)


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=_TEMPLATES)
def test_generated_templates_lint_and_fix_with_typed_errors_only(qwen2: Model, source: str) -> None:
    # Templates built from the constructs that broke --fix and the compile (loop controls in blocks, rows a template
    # writes nothing for, blocks written as a whole): lint and --fix answer, or raise a CtxlockError, never another.
    template = ChatTemplate(source, id="generated")
    try:
        lint(qwen2, template, engines=()).to_dict()
        tag_generation(qwen2, template, load_corpus().probes).to_dict()
    except CtxlockError:
        pass


@pytest.mark.parametrize(
    ("source", "tagged"),
    [
        ("{{ '{% generation %}' }}" + PLAIN_LOOP, False),
        ("{% raw %}{% generation %}{% endraw %}" + PLAIN_LOOP, False),
        (PLAIN_LOOP.replace("{{ m.content }}", "{%+ generation -%}{{ m.content }}{%- endgeneration %}"), True),
    ],
    ids=["in-a-string", "in-raw", "whitespace-control"],
)
def test_training_mask_reads_generation_tags_off_the_syntax_tree(qwen2: Model, source: str, tagged: bool) -> None:
    # Before the fix a regex over the source took the tag's text in a string or a raw block for a tag (then "the
    # masks could not be compared" on every training probe), and missed `{%+ generation %}` ("no tags").
    report = lint(qwen2, ChatTemplate(source, id="tags"), rules=["training-mask"], engines=())
    untagged = [f for f in report.findings if f.data.get("tagged") is False]
    assert bool(untagged) is not tagged
    assert all("could not be compared" not in f.message for f in report.findings)


def test_a_bound_jinja2_meets_is_named_with_each_engine_it_was_compared_with(qwen2: Model) -> None:
    # Before the fix the two notes (one per engine) read the same, word for word.
    source = PLAIN_LOOP + "{{ 'y' * 999999 }}"
    report = lint(qwen2, ChatTemplate(source, id="big"), corpus=load_corpus(only=["user"]), rules=["portability"])
    messages = sorted(f.message for f in report.findings)
    assert [m.split(" with ", 1)[1] for m in messages] == [
        "hf-jinja (@huggingface/jinja, transformers.js) (1 probe(s))",
        "minijinja (text-generation-inference, mistral.rs) (1 probe(s))",
    ]
    assert all(m.startswith("jinja2 went over ctxlock's bounds (limit: ") for m in messages)


def test_a_rule_stops_re_rendering_a_template_that_runs_out_of_time(
    qwen2: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each render of a slow template costs the sandbox's time limit (5 s), and history-rewrite renders a probe twice
    # per assistant turn: before the fix lint of such a template took 281 s on the shipped corpus (111 s after). Here
    # the corpus's renders ran out of time (as recorded), so the rule's own renders are refused: it is not run.
    corpus = load_corpus(only=["multi-turn", "multi-turn-system"])
    late = ProbeError("TemplateLimitError", "the template took longer than 5 s", "slow", None)
    monkeypatch.setattr(
        lint_module, "render_probes", lambda *a, **k: tuple(ProbeRender(p, None, None, late) for p in corpus)
    )
    report = lint(qwen2, ChatTemplate(PLAIN_LOOP, id="slow"), corpus=corpus, rules=["history-rewrite"], engines=())
    assert [(s.rule, s.reason.split(": ", 2)[-1]) for s in report.skipped] == [
        (
            "history-rewrite",
            "the template ran out of render time on 2 probe render(s): the renders this rule adds were not run "
            "(a template this slow costs its time limit on every render)",
        )
    ]
