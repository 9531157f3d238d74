"""ctxlock.lint's rules on real templates: for every rule (but portability, tests/lint/test_engines.py's), a template
of llama.cpp's 70 that triggers it and one that does not, each linted with the vocabulary it pairs with
(tests/conformance.py `vocab_for`). A finding is checked for its rule, severity and probe, and its template line
against the template file: the construct the finding is about must be on that line. Synthetic templates cover the
edges: a template that does not compile, a rule that raises, rules asked for by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import ctxlock
import fetched
import tagged
from conformance import vocab_for
from ctxlock.artifacts import load_template_file
from ctxlock.errors import InputError, TemplateError
from ctxlock.lint import RULES, Finding, Report, Severity, Skipped, lint
from ctxlock.model import Model
from ctxlock.probes import load_corpus
from ctxlock.template import ChatTemplate

QWEN3 = "Qwen-Qwen3-0.6B.jinja"
QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
QWEN35 = "Qwen3.5-4B.jinja"
GEMMA2 = "google-gemma-2-2b-it.jinja"
LLAMA31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
LLAMA32 = "meta-llama-Llama-3.2-3B-Instruct.jinja"
HERMES2 = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"
KIMI_K2_THINKING = "Kimi-K2-Thinking.jinja"
GPT_OSS = "openai-gpt-oss-120b.jinja"
LFM25 = "LFM2.5-8B-A1B.jinja"
LAGUNA = "poolside-Laguna-XS-2.1.jinja"
GRANITE33 = "ibm-granite-granite-3.3-2B-Instruct.jinja"
TAGGED_QWEN25 = "tagged:" + QWEN25  # tests/tagged.py: Qwen2.5 with {% generation %} tags that agree with provenance

Linter = Callable[..., Report]


class Models:
    """One model per vocabulary, loaded on first use."""

    def __init__(self) -> None:
        self._loaded: dict[str, Model] = {}

    def __getitem__(self, vocab: str) -> Model:
        if vocab not in self._loaded:
            self._loaded[vocab] = ctxlock.load(str(fetched.gguf_path(vocab)))
        return self._loaded[vocab]


def _template(name: str) -> ChatTemplate:
    if name.startswith("tagged:"):
        return tagged.tagged_template(name.removeprefix("tagged:"))
    return load_template_file(fetched.templates_dir() / name)


def _lines(name: str) -> list[str]:
    if name.startswith("tagged:"):
        return tagged.tagged_source(name.removeprefix("tagged:")).splitlines()
    return (fetched.templates_dir() / name).read_text("utf-8").splitlines()


@pytest.fixture(scope="module")
def models() -> Models:
    return Models()


@pytest.fixture(scope="module")
def linted(models: Models) -> Iterator[Linter]:
    """`linted(name, **variables)`: the lint report of a fixture template with its vocabulary, shared by the module."""
    cache: dict[tuple[str, str], Report] = {}

    def run(name: str, **variables: Any) -> Report:
        key = (name, repr(sorted(variables.items())))
        if key not in cache:
            model = models[vocab_for(name.removeprefix("tagged:"))]
            cache[key] = lint(model, _template(name), variables=variables or None)
        return cache[key]

    yield run
    cache.clear()


@dataclass(frozen=True)
class Case:
    """A finding a template must (positive) or must not (negative) give: the rule, the template (and the template
    arguments passed), a text of the message that picks the finding; for a positive, its severity, probe, and the
    text on its template line (None: a finding about the template as a whole, without a line)."""

    rule: str
    template: str
    message: str = ""
    severity: Severity | None = None
    probe: str | None = None
    construct: str | None = None
    variables: dict[str, Any] = field(default_factory=dict)
    why: str = ""

    @property
    def id(self) -> str:
        args = ",".join(f"{k}={v!r}" for k, v in self.variables.items())
        return f"{self.rule}:{self.template.removesuffix('.jinja')}{'[' + args + ']' if args else ''}:{self.why}"


POSITIVE = [
    Case(
        "unread-argument",
        QWEN3,
        "never reads 'thinking_mode'",
        Severity.ERROR,
        variables={"thinking_mode": True},
        why="a near miss of enable_thinking",
    ),
    Case(
        "unread-argument",
        QWEN3,
        "'enable_thinking' is read",
        Severity.WARNING,
        construct="enable_thinking is false",
        variables={"enable_thinking": "false"},
        why="read, but the string 'false' is not false",
    ),
    Case(
        "unread-argument",
        GPT_OSS,
        "never reads 'reasoning'",
        Severity.ERROR,
        variables={"reasoning": "high"},
        why="a near miss of reasoning_effort, read with a default",
    ),
    Case("unread-argument", GEMMA2, "tools never reach", Severity.WARNING, probe="tools", why="tools dropped"),
    Case(
        "unread-argument",
        KIMI_K2_THINKING,
        "messages[].reasoning_content never reach",
        Severity.NOTE,
        probe="reasoning-last",
        construct="message.get('reasoning_content'",
        why="a message field read, never written",
    ),
    Case(
        "unread-argument",
        QWEN25,
        "documents never reach",
        Severity.NOTE,
        probe="documents",
        why="documents dropped: the template never reads them",
    ),
    Case(
        "unread-argument",
        QWEN25,
        "messages[].name never reach",
        Severity.NOTE,
        probe="named",
        why="a user's name dropped",
    ),
    Case("double-bos", LLAMA31, "'<|begin_of_text|>'", Severity.WARNING, probe="user", construct="bos_token"),
    Case(
        "history-rewrite",
        QWEN3,
        "adding messages[2] rewrites earlier turns",
        Severity.WARNING,
        probe="multi-turn",
        why="the last turn's think block is dropped from history",
    ),
    Case(
        "content-format",
        LLAMA31,
        "written as Python text",
        Severity.NOTE,
        probe="content-parts",
        construct="message['content']",
    ),
    Case(
        "reachable-raise",
        GEMMA2,
        "'System role not supported'",
        Severity.WARNING,
        probe="system",
        construct="raise_exception('System role not supported')",
    ),
    Case(
        "reachable-raise",
        GEMMA2,
        "'Conversation roles must alternate",
        Severity.WARNING,
        probe="tool-call",
        construct="raise_exception('Conversation roles must alternate",
        why="a second raise on the same line",
    ),
    Case(
        "reachable-raise",
        LLAMA31,
        "'This model only supports single tool-calls at once!'",
        Severity.WARNING,
        probe="parallel-tool-calls",
        construct='raise_exception("This model only supports single tool-calls at once!")',
    ),
    Case(
        "reachable-raise",
        LLAMA31,
        "no probe reaches",
        Severity.NOTE,
        construct='raise_exception("Cannot put tools in the first user message',
        why="a raise no probe reaches",
    ),
    Case(
        "render-error",
        HERMES2,
        "'NoneType' object is not iterable",
        Severity.WARNING,
        probe="user",
        construct="for tool in tools",
        why="the tool_use template without tools",
    ),
    Case("nondeterminism", LLAMA32, "reads the clock", Severity.WARNING, probe="user", construct="strftime_now("),
    Case(
        "training-mask",
        LFM25,
        "tags train 9 tokens of probe multi-turn-system",
        Severity.WARNING,
        probe="multi-turn-system",
        construct="generation",
    ),
    Case(
        "training-mask",
        LAGUNA,
        "of probe reasoning-last",
        Severity.WARNING,
        probe="reasoning-last",
        construct="generation",
    ),
    Case("training-mask", QWEN25, "no {% generation %} tags", Severity.NOTE, why="untagged"),
    Case(
        "portability",
        "GLM-4.6.jinja",
        "minijinja (text-generation-inference, mistral.rs) fails where jinja2 renders",
        Severity.WARNING,
        probe="tools",
        construct="tojson(ensure_ascii=False)",
        why="minijinja's tojson takes no ensure_ascii",
    ),
    Case(
        "portability",
        HERMES2,
        "hf-jinja (@huggingface/jinja, transformers.js) fails where jinja2 renders",
        Severity.WARNING,
        probe="tools",
        construct="param_fields.description|trim",
        why="@huggingface/jinja refuses to trim an undefined value, jinja2 trims it to ''",
    ),
]

NEGATIVE = [
    Case("unread-argument", QWEN3, "'enable_thinking'", variables={"enable_thinking": False}, why="read, with effect"),
    Case(
        "unread-argument",
        GPT_OSS,
        "'reasoning_effort'",
        variables={"reasoning_effort": "high"},
        why="read when defined, else set: the caller's",
    ),
    Case(
        "unread-argument",
        LLAMA31,
        "'tools_in_user_message'",
        variables={"tools_in_user_message": False},
        why="read when defined, else set: the caller's",
    ),
    Case("unread-argument", QWEN25, "tools never reach", why="tools rendered"),
    Case("unread-argument", QWEN3, "it reads 'name'", why="tool_call.name is not a message's name"),
    Case("unread-argument", GRANITE33, "documents never reach", why="documents written"),
    Case("unread-argument", KIMI_K2_THINKING, "messages[].name never reach", why="a message's name written"),
    Case("double-bos", QWEN25, why="no BOS written"),
    Case("double-bos", GEMMA2, why="the BOS written, and the qwen2 tokenizer adds none"),
    Case("history-rewrite", QWEN25),
    Case("content-format", QWEN35, "Python text", why="reads a list of parts"),
    Case("content-format", QWEN25, "Python text", why="a string, and a list of parts joined"),
    Case("reachable-raise", QWEN25, why="no raise in the template"),
    Case("portability", QWEN25, why="jinja2, minijinja and @huggingface/jinja render every probe alike"),
    Case("render-error", QWEN25),
    Case("nondeterminism", QWEN25),
    Case("training-mask", TAGGED_QWEN25, why="tags that agree"),
]


def test_every_rule_has_a_positive_and_a_negative_case() -> None:
    ours = set(RULES)
    assert {c.rule for c in POSITIVE} == ours
    assert {c.rule for c in NEGATIVE} == ours


def _positive(rule: str, template: str) -> Case:
    return next(c for c in POSITIVE if c.rule == rule and c.template == template)


def _only(report: Report, case: Case) -> Finding:
    hits = [f for f in report.findings if f.rule == case.rule and case.message in f.message]
    assert len(hits) == 1, [f.to_dict() for f in report.findings if f.rule == case.rule]
    return hits[0]


@pytest.mark.parametrize("case", POSITIVE, ids=lambda c: c.id)
def test_positive(linted: Linter, case: Case) -> None:
    report = linted(case.template, **case.variables)
    finding = _only(report, case)
    assert finding.severity is case.severity
    assert finding.probe == case.probe
    if case.construct is None:
        assert finding.line is None
    else:
        assert finding.line is not None, finding
        assert case.construct in _lines(case.template)[finding.line - 1], (finding.line, finding.message)
    assert report.skipped == ()


@pytest.mark.parametrize("case", NEGATIVE, ids=lambda c: c.id)
def test_negative(linted: Linter, case: Case) -> None:
    report = linted(case.template, **case.variables)
    hits = [f.to_dict() for f in report.findings if f.rule == case.rule and case.message in f.message]
    assert hits == []
    assert report.skipped == ()


# ------------------------------------------------------------------------------------------ the details of a finding


def test_near_miss_suggestion(linted: Linter) -> None:
    finding = _only(linted(QWEN3, thinking_mode=True), _positive("unread-argument", QWEN3))
    assert finding.data == {"argument": "thinking_mode", "suggestions": ["enable_thinking"]}
    assert finding.hint == "did you mean enable_thinking?"
    # The argument the template does read, with its line, is in the report's notes.
    line = next(i for i, text in enumerate(_lines(QWEN3), 1) if "enable_thinking" in text)
    assert linted(QWEN3, thinking_mode=True).notes == (f"the template takes: enable_thinking (line {line})",)
    # an argument read with a default ({% if not x is defined %}{% set x = ... %}) is the template's argument too
    gpt_oss = _only(linted(GPT_OSS, reasoning="high"), _positive("unread-argument", GPT_OSS))
    assert gpt_oss.data["suggestions"] == ["reasoning_effort"]
    assert "reasoning_effort (line " in linted(GPT_OSS, reasoning="high").notes[0]


def test_the_negative_raise_case_has_no_raise() -> None:
    assert "raise_exception" not in "\n".join(_lines(QWEN25))


def test_gemma2_raises_are_one_finding_each(linted: Linter) -> None:
    """Two raises on one line: each is its own finding, with the probes that reach it."""
    raises = [f for f in linted(GEMMA2).findings if f.rule == "reachable-raise"]
    assert [(f.line, f.data["probes"]) for f in raises] == [
        (1, ["tool-call", "tool-call-openai-id", "parallel-tool-calls", "consecutive-users", "assistant-first"]),
        (1, ["system", "multi-turn-system"]),
    ]


def test_history_rewrite_shows_the_think_block(linted: Linter) -> None:
    finding = _only(linted(QWEN3), _positive("history-rewrite", QWEN3))
    assert "<think>\\n\\n</think>" in finding.message  # the excerpt, as repr
    assert finding.data["kind"] == "history" and finding.data["paths"] == ["messages[1].content"]
    assert "reasoning" in finding.data["probes"]


def test_double_bos_names_the_ids(linted: Linter, models: Models) -> None:
    finding = _only(linted(LLAMA31), _positive("double-bos", LLAMA31))
    bos_id = models["llama-bpe"].tokenizer.token_to_id("<|begin_of_text|>")
    assert finding.data == {"bos_token": "<|begin_of_text|>", "bos_id": bos_id}


def test_the_bos_negative_writes_the_bos_and_the_positive_tokenizer_adds_one(models: Models) -> None:
    """Gemma 2's template writes the BOS (line 1), rendered with the qwen2 tokenizer, whose post-processor adds
    none; Llama 3.1's writes it too, and its tokenizer adds one: the one difference between the two cases."""
    request = {"messages": [{"role": "user", "content": "Hi"}]}
    for name, adds in ((GEMMA2, False), (LLAMA31, True)):
        model = models[vocab_for(name)]
        bos = model.special_tokens["bos_token"]
        assert model.render(request, chat_template=_template(name)).text.startswith(bos), name
        with_special = model.tokenizer.encode("x", add_special_tokens=True)
        assert (with_special[:1] == [model.tokenizer.token_to_id(bos)]) is adds, (name, with_special)
        assert (with_special == model.tokenizer.encode("x", add_special_tokens=False)) is not adds, name
    assert _lines(GEMMA2)[0].startswith("{{ bos_token }}")


def test_the_field_negatives_write_the_field(models: Models) -> None:
    """Granite 3.3 writes the documents' text, Kimi K2 Thinking the user's name: the negatives are not vacuous."""
    corpus = {p.name: p for p in load_corpus()}
    for name, probe, text in (
        (GRANITE33, "documents", "The Eiffel Tower is in Paris."),
        (KIMI_K2_THINKING, "named", "alice"),
    ):
        model = models[vocab_for(name)]
        rendered = model.render(dict(corpus[probe].request), chat_template=_template(name))
        assert text in rendered.text, (name, rendered.text)


def test_training_mask_untagged_note_and_tagged_data(linted: Linter) -> None:
    note = _only(linted(QWEN25), _positive("training-mask", QWEN25))
    assert note.data == {"tagged": False}
    tags = [f for f in linted(LFM25).findings if f.rule == "training-mask"]
    assert {f.probe for f in tags} == {"multi-turn-system", "reasoning-last"}
    assert all(f.data["tagged"] and f.data["tokens_differ"] > 0 for f in tags)


def test_findings_are_in_line_order(linted: Linter) -> None:
    report = linted(LLAMA31)
    keys = [(f.line or 0, -f.severity) for f in report.findings]
    assert keys == sorted(keys)
    assert report.worst() is Severity.WARNING
    assert report.counts() == {
        "error": 0,
        "warning": sum(f.severity is Severity.WARNING for f in report.findings),
        "note": sum(f.severity is Severity.NOTE for f in report.findings),
    }


# ------------------------------------------------------------------------------------------------ synthetic edges

CLEAN = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_template_that_does_not_compile_is_one_syntax_finding(models: Models) -> None:
    report = lint(models["qwen2"], ChatTemplate("hello\n{% if %}\n", id="broken.jinja"))
    assert [(f.rule, f.severity, f.line) for f in report.findings] == [("syntax", Severity.ERROR, 2)]
    assert report.findings[0].hint == "the chat template does not compile"
    assert report.skipped == () and report.worst() is Severity.ERROR


def test_a_rule_that_raises_is_skipped_with_why(models: Models) -> None:
    def boom(_: Any) -> list[Finding]:
        raise TemplateError("it went wrong", path="boom")

    report = lint(models["qwen2"], ChatTemplate(CLEAN, id="clean"), rules=["boom", "double-bos"], extra={"boom": boom})
    assert report.skipped == (Skipped("boom", "TemplateError: boom: it went wrong"),)
    assert report.findings == ()


def test_rules_by_name(models: Models, monkeypatch: pytest.MonkeyPatch) -> None:
    model, template = models["qwen2"], ChatTemplate(CLEAN, id="clean")
    with pytest.raises(InputError, match="no rule 'no-such-rule'"):
        lint(model, template, rules=["no-such-rule"])
    # render-error is found by reachable-raise's check; asking for one keeps only its findings.
    hermes = lint(models["llama-bpe"], _template(HERMES2), rules=["render-error"])
    assert {f.rule for f in hermes.findings} == {"render-error"}
    # A rule that cannot run is said so, never a silent pass: portability with no engine to compare.
    assert lint(model, template, rules=["portability"], engines=()).skipped == (
        Skipped("portability", "no engine chosen to compare with jinja2"),
    )


def test_content_format_detected_as_parts_but_written_as_text(models: Models) -> None:
    """The syntax tree says the template reads parts (it loops over content), but it writes the list itself."""
    source = "{% for m in messages %}{{ m['content'] }}\n{% for part in m['content'] %}{% endfor %}{% endfor %}"
    report = lint(models["qwen2"], ChatTemplate(source, id="loop-and-print"), rules=["content-format"])
    [finding] = report.findings
    assert (finding.severity, finding.line, finding.probe) == (Severity.WARNING, 1, "content-parts")
    assert finding.data == {"detected": "openai", "confirmed": False}


def test_random_draws_are_nondeterminism(models: Models) -> None:
    source = CLEAN + "\n{{ ['a', 'b'] | random }}"
    report = lint(models["qwen2"], ChatTemplate(source, id="draws"), rules=["nondeterminism"])
    [finding] = report.findings
    assert finding.severity is Severity.WARNING and finding.line is not None
    assert "| random" in source.splitlines()[finding.line - 1]
    assert "draws random values" in finding.message
