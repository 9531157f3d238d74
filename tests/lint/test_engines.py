"""`ctxlock.lint._engines`: a chat template rendered by jinja2 (ctxlock's sandbox, the reference), minijinja (the
engine of TGI and mistral.rs) and @huggingface/jinja (transformers.js), and each departure named with its line.

The real templates are llama.cpp's fixtures (`fetched.template_paths()`) with the conversations of
tests/lint/engine_matrix.py; the departures asserted here are ones those templates have with the pinned engines
(minijinja 3.1.0, @huggingface/jinja 0.5.13). The committed matrix (tests/data/lint/engine_matrix.json) is checked
against the rows these tests render.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import engine_matrix
import pytest

import fetched
from cli_runner import run_main
from ctxlock.errors import InputError, OptionError
from ctxlock.lint import _engines as engines

TIMEOUT_S = 10.0

# Templates all three engines render byte for byte alike with the three conversations.
AGREEING = (
    "meta-llama-Llama-3.1-8B-Instruct.jinja",  # minijinja differs on its tool JSON only (see below)
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "google-gemma-2-2b-it.jinja",  # refuses a system turn in all three (raise_exception): that agrees too
    "openai-gpt-oss-120b.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
)

# (template, conversation, engine, verdict, line, what the message or construct says)
DEPARTURES = (
    # minijinja's tojson takes no keyword arguments
    ("GLM-4.6.jinja", "tool_call", "minijinja", "rejects", 11, "tojson(ensure_ascii=False)"),
    ("openbmb-MiniCPM5-1B.jinja", "tool_call", "minijinja", "rejects", 6, "tojson(ensure_ascii=False)"),
    # minijinja's tojson escapes ' < > & for HTML (TGI's filter; mistral.rs replaces it)
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "tool_call", "minijinja", "differs", 11, "\\u0027"),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "tool_call", "minijinja", "differs", 60, "\\u0027"),
    # minijinja's indent drops the trailing newline of '{\n'|indent(4, first=true)
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "tool_call", "minijinja", "differs", 169, "{   "),
    # @huggingface/jinja: a for loop over an undefined variable, a list filter it lacks, integer dict keys,
    # str.format, |string of a mapping
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "user", "hf-jinja", "rejects", 38, "for tool in tools"),
    ("openbmb-MiniCPM5-1B.jinja", "tool_call", "hf-jinja", "rejects", 59, "| min"),
    ("ByteDance-Seed-OSS.jinja", "user", "hf-jinja", "rejects", 15, "{0: 0, 512: 128"),
    ("tencent-Hy3.jinja", "user", "hf-jinja", "rejects", 3, ".format(HYTK)"),
    ("unsloth-Apriel-1.5.jinja", "tool_call", "hf-jinja", "rejects", 11, "tool | string"),
    # jinja2 escapes the JSON it adds to a Markup string ('...'|safe + t|tojson); the others do not
    ("meetkai-functionary-medium-v3.1.jinja", "tool_call", "minijinja", "differs", 22, "&#34;"),
    ("meetkai-functionary-medium-v3.1.jinja", "tool_call", "hf-jinja", "differs", 22, "&#34;"),
    # jinja2's tojson cannot serialize the generator `map` returns; the others take it as a list
    ("llama-cpp-deepseek-r1.jinja", "tool_call", "minijinja", "accepts", 12, "generator is not JSON serializable"),
    ("llama-cpp-deepseek-r1.jinja", "tool_call", "hf-jinja", "accepts", 12, "generator is not JSON serializable"),
)

SAMPLE = sorted({*AGREEING, *(d[0] for d in DEPARTURES)})


@pytest.fixture(scope="module")
def hf_jinja() -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(engines.HF_JINJA_ENV, str(fetched.hf_jinja_dir()))
        yield fetched.hf_jinja_dir()


@pytest.fixture(scope="module")
def rows(hf_jinja: Path) -> dict[str, dict[str, Any]]:
    """The matrix rows of the sample templates: each template rendered once per engine with every conversation."""
    paths = {p.name: p for p in fetched.template_paths()}
    return {name: engine_matrix.template_row(paths[name]) for name in SAMPLE}


def test_the_engines_are_there_and_say_their_versions(hf_jinja: Path) -> None:
    versions = {e: engines.render_with(e, "x{{ 1 }}", {}, timeout_s=TIMEOUT_S) for e in engines.ENGINES}
    assert {e: (r.text, r.available, r.version) for e, r in versions.items()} == {
        "jinja2": ("x1", True, versions["jinja2"].version),
        "minijinja": ("x1", True, "3.1.0"),
        "hf-jinja": ("x1", True, "0.5.13"),
    }


def test_real_templates_render_alike_in_every_engine(rows: dict[str, dict[str, Any]], hf_jinja: Path) -> None:
    for name in AGREEING:
        for conversation, cell in rows[name].items():
            if conversation == "tool_call" and name in (AGREEING[0], AGREEING[1]):
                continue  # minijinja's tojson: DEPARTURES
            assert cell["minijinja"] is None and cell["hf-jinja"] is None, (name, conversation, cell)
        assert rows[name]["user"]["jinja2"]["renders"], name  # a text, not an agreement on failing
    # the same bytes, compared here rather than by `compare`
    (path,) = [p for p in fetched.template_paths() if p.name == "Qwen-Qwen2.5-7B-Instruct.jinja"]
    contexts = engine_matrix.contexts()
    texts = [
        [r.text for r in engines.render_many(e, path.read_text("utf-8"), contexts, timeout_s=TIMEOUT_S)]
        for e in engines.ENGINES
    ]
    assert texts[0][0] and texts[0][:2] == texts[1][:2] == texts[2][:2] and texts[0][2] == texts[2][2]


@pytest.mark.parametrize(("template", "conversation", "engine", "verdict", "line", "said"), DEPARTURES)
def test_a_real_departure_is_named_with_its_line(
    rows: dict[str, dict[str, Any]], template: str, conversation: str, engine: str, verdict: str, line: int, said: str
) -> None:
    cell = rows[template][conversation]
    assert cell["jinja2"]["renders"] is (verdict != "accepts"), cell  # accepts: jinja2 fails where the engine renders
    found = cell[engine]
    assert found is not None and (found["verdict"], found["line"]) == (verdict, line), found
    assert said in json.dumps(found, ensure_ascii=False).replace("\\\\", "\\").replace('\\"', '"'), found


def test_the_committed_matrix_holds_these_rows(rows: dict[str, dict[str, Any]]) -> None:
    """The committed matrix is what the engines render now: whole for the sample (SAMPLE, the 15 templates of
    AGREEING and DEPARTURES), and in jinja2's column for all 70.

    Why minijinja's and @huggingface/jinja's cells are checked on a sample only: each of those engines renders a
    template in a child process of its own (about 0.35 s a template for both, on a busy machine: some 19 s for the
    55 other rows), and the survey (tests/lint/test_survey.py) does not render these conversations, so it cannot
    check them for free: it lints the probe corpus, with each template's own vocabulary. Drift is caught anyway:
    the fixture templates are pinned (the llama-cpp-python sdist's tree sha256, tests/fetched.py) and their jinja2
    outcomes are checked below for every row, in-process (under a second); the engines are pinned (their versions
    asserted here); the sample holds every verdict each engine has in the matrix (asserted here: alike, rejects,
    differs, accepts), so a change in the children, their configuration or `compare` moves a sampled cell; and the
    survey renders all 70 templates with every engine, so what `ctxlock lint` reports on them (the docs table)
    cannot drift unseen. `python tests/lint/engine_matrix.py --write` rebuilds the whole file."""
    committed = json.loads(engine_matrix.MATRIX.read_text(encoding="utf-8"))
    assert committed["engines"]["minijinja"] == "3.1.0" and committed["engines"]["hf-jinja"] == "0.5.13"
    assert committed["engines"]["jinja2"] == engines.render_with("jinja2", "x", {}, timeout_s=TIMEOUT_S).version
    assert sorted(committed["templates"]) == [p.name for p in fetched.template_paths()]
    assert committed["conversations"] == {
        n: {**engine_matrix.SPECIAL, **c} for n, c in engine_matrix.CONVERSATIONS.items()
    }
    fix = "run python tests/lint/engine_matrix.py --write"
    others = [e for e in engines.ENGINES if e != "jinja2"]
    held = {(e, v) for e in others for v in committed["summary"][e]["verdicts"]}
    sampled = {(e, c[e]["verdict"]) for row in rows.values() for c in row.values() for e in others if c[e]}
    assert held <= sampled, f"add a template with {sorted(held - sampled)} to DEPARTURES"
    for name, row in rows.items():
        assert committed["templates"][name] == row, f"{name}: {fix}"
    for path in fetched.template_paths():  # jinja2's column: in-process, all 70 in under a second
        source = path.read_text("utf-8")
        now = engines.render_many("jinja2", source, engine_matrix.contexts(), timeout_s=TIMEOUT_S)
        shown = [committed["templates"][path.name][c]["jinja2"] for c in engine_matrix.CONVERSATIONS]
        assert shown == [engine_matrix.outcome(r) for r in now], f"{path.name}: {fix}"
    assert committed["summary"] == engine_matrix.summary(committed["templates"])


# Constructs of the templates, one at a time: what each engine does with them (the pinned versions).
VARIABLES = {
    "s": "abc,def",
    "l": [1, 2, 3],
    "d": {"b": 1, "c": "it's <x>"},
    "x": None,
    "f": 2.0,
    "u": "😀é",
}
CONSTRUCTS = (
    # (name, template, minijinja's verdict, hf-jinja's verdict); None: renders what jinja2 renders
    ("str methods", "{{ s.split(',')|join('+') }} {{ s.replace('a', 'b') }} {{ s.upper() }}", None, None),
    ("loop.previtem", "{% for v in l %}{% if not loop.first %}{{ loop.previtem }}{% endif %}{% endfor %}", None, None),
    (
        "namespace",
        "{% set ns = namespace(n=0) %}{% for v in l %}{% set ns.n = ns.n + v %}{% endfor %}{{ ns.n }}",
        None,
        None,
    ),
    ("slice [::-1]", "{{ l[::-1]|join(',') }}", None, None),
    ("dict.items()", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", None, None),
    ("raise_exception", "{{ raise_exception('no') }}", None, None),  # all three fail alike
    ("generation tag", "{% generation %}g{% endgeneration %}", None, None),
    ("tojson", "{{ d|tojson }}", "differs", None),
    ("printing a bool", "{{ s is string }}", None, "differs"),
    ("printing a float", "{{ f }}", None, "differs"),
    ("printing a dict", "{{ d }}", None, "differs"),
    ("strftime_now %A", "{{ strftime_now('%A %d') }}", None, "differs"),
    ("a code point past U+FFFF", "{{ u|length }}", None, "differs"),
    ("% formatting", "{{ '%s-%d' % (s, 3) }}", "rejects", "rejects"),
    ("str.format", "{{ '{}!'.format(s) }}", None, "rejects"),
    ("|length of undefined", "{{ missing|length }}", None, "rejects"),
)


@pytest.mark.parametrize(("name", "source", "minijinja", "hf"), CONSTRUCTS, ids=[c[0] for c in CONSTRUCTS])
def test_a_construct_one_engine_treats_otherwise(
    hf_jinja: Path, name: str, source: str, minijinja: str | None, hf: str | None
) -> None:
    template = f"first line\n{source}\n"
    reference = engines.render_with("jinja2", template, VARIABLES, timeout_s=TIMEOUT_S)
    for engine, expected in (("minijinja", minijinja), ("hf-jinja", hf)):
        departure = engines.compare(reference, engines.render_with(engine, template, VARIABLES, timeout_s=TIMEOUT_S))
        assert (departure.verdict if departure else None) == expected, (engine, departure)
        if departure is not None:
            assert departure.line == 2, departure  # the construct's line, as the engine or the reference says


# ------------------------------------------------------------------------------------------ unavailable engines


def test_minijinja_missing_is_said_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = engines.importlib.util.find_spec
    monkeypatch.setattr(
        engines.importlib.util, "find_spec", lambda n, *a: None if n == "minijinja" else find_spec(n, *a)
    )
    results = engines.render_many("minijinja", "x", [{}, {}], timeout_s=TIMEOUT_S)
    assert [(r.available, r.text, r.error) for r in results] == [(False, None, None)] * 2
    assert results[0].why_unavailable is not None and "pip install 'ctxlock[lint]'" in results[0].why_unavailable
    divergence = engines.compare(engines.render_with("jinja2", "x", {}, timeout_s=TIMEOUT_S), results[0])
    assert divergence is not None and divergence.verdict == "unavailable"


def test_hf_jinja_missing_is_said_with_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(engines.HF_JINJA_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # no node_modules here or above
    (result,) = engines.render_many("hf-jinja", "x", [{}], timeout_s=TIMEOUT_S)
    assert not result.available and result.why_unavailable is not None
    assert "npm install @huggingface/jinja@0.5.13" in result.why_unavailable
    # found in a node_modules above the working directory
    package = tmp_path / "node_modules" / "@huggingface" / "jinja"
    package.parent.mkdir(parents=True)
    package.symlink_to(fetched.hf_jinja_dir())
    (tmp_path / "deeper").mkdir()
    monkeypatch.chdir(tmp_path / "deeper")
    assert engines.hf_jinja_dir() == package
    assert engines.render_with("hf-jinja", "x", {}, timeout_s=TIMEOUT_S).text == "x"
    # a directory that is not the package
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "package.json").write_text('{"name": "left-pad", "version": "1.0.0"}', encoding="utf-8")
    monkeypatch.setenv(engines.HF_JINJA_ENV, str(tmp_path / "other"))
    (result,) = engines.render_many("hf-jinja", "x", [{}], timeout_s=TIMEOUT_S)
    assert not result.available and result.why_unavailable is not None and "left-pad" in result.why_unavailable
    # no node
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    (result,) = engines.render_many("hf-jinja", "x", [{}], timeout_s=TIMEOUT_S)
    assert not result.available and result.why_unavailable is not None and "node" in result.why_unavailable


def test_lint_names_the_missing_engine_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`ctxlock lint` without @huggingface/jinja: the not-run line names that engine and says minijinja was compared
    (its finding is there); without either engine, each line says no other engine was."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}\n{% endfor %}{{ {'c': \"it's <x>\"}|tojson }}\n")
    monkeypatch.delenv(engines.HF_JINJA_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # no node_modules here or above
    argv = ["lint", str(template), "--rule", "portability", "--fail-on", "never"]
    code, out, err = run_main(argv)
    assert (code, err) == (0, "")
    [line] = [line for line in out.splitlines() if "not run" in line]
    assert line.startswith(
        "  not run portability: only hf-jinja (@huggingface/jinja, transformers.js) was not compared with jinja2 "
        "(minijinja was): the @huggingface/jinja package was not found"
    ), line
    assert "npm install @huggingface/jinja@0.5.13" in line
    assert "minijinja (text-generation-inference, mistral.rs) renders different text" in out  # line 2's tojson
    find_spec = engines.importlib.util.find_spec
    monkeypatch.setattr(
        engines.importlib.util, "find_spec", lambda n, *a: None if n == "minijinja" else find_spec(n, *a)
    )
    code, out, _ = run_main(argv)
    lines = [line for line in out.splitlines() if "not run" in line]
    assert [line.split(" was not compared")[0] for line in lines] == [
        "  not run portability: minijinja (text-generation-inference, mistral.rs)",
        "  not run portability: hf-jinja (@huggingface/jinja, transformers.js)",
    ]
    assert all(", and no other engine was either: " in line for line in lines), lines
    assert code == 0 and "renders different text" not in out


# -------------------------------------------------------------------------------------------- hostile templates

HOSTILE = {
    "loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "doubling": "{% set ns = namespace(s='xxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s }}",
}


@pytest.mark.parametrize("engine", engines.ENGINES)
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_template_is_bounded(hf_jinja: Path, engine: engines.Engine, kind: str) -> None:
    # the render after the hostile one is answered: by the same engine, or by a new child after the first was ended
    source = "{% if not ok %}" + HOSTILE[kind] + "{% endif %}fine"
    hostile, fine = engines.render_many(engine, source, [{}, {"ok": True}], timeout_s=0.5)
    assert hostile.text is None and hostile.error and hostile.limited, hostile
    assert fine.text == "fine"
    divergence = engines.compare(engines.EngineResult("jinja2", text="fine"), hostile)
    assert divergence is not None and divergence.verdict == "limited"


def test_an_answer_over_the_line_cap_is_cut(hf_jinja: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "_MAX_LINE", 1000)
    source = "{% for i in range(n) %}y{% endfor %}{{ 'small' if not n }}"
    for engine in ("minijinja", "hf-jinja"):
        big, small = engines.render_many(engine, source, [{"n": 5000}, {"n": 0}], timeout_s=5)
        assert big.limited and big.error is not None and "more than 1,000 bytes" in big.error, big
        assert small.text == "small"  # a new child renders the rest


def test_variables_must_be_json(hf_jinja: Path) -> None:
    for bad in ({"f": float("nan")}, {"d": {1: "a"}}, {"t": ("a",)}, {"o": object()}):
        with pytest.raises(InputError, match=r"not (all )?JSON values"):
            engines.render_with("jinja2", "x", bad, timeout_s=1)
    with pytest.raises(OptionError, match="unknown engine"):
        engines.render_with("jinja3", "x", {}, timeout_s=1)  # type: ignore[arg-type]
    # a lone surrogate is a JSON string: every engine gets it (escaped on the way to a child); minijinja's strings
    # are Rust's, which cannot hold one
    texts = {e: engines.render_with(e, "[{{ s }}]", {"s": "a\ud800b"}, timeout_s=5).text for e in engines.ENGINES}
    assert texts == {"jinja2": "[a\ud800b]", "hf-jinja": "[a\ud800b]", "minijinja": "[a\ufffd\ufffd\ufffdb]"}


def test_locate_finds_a_construct_as_a_formatter_spells_it() -> None:
    source = "a\n{%- for tool in tools %}\n  {{ x|length }}\n{{ y | min }}\n{{ 'q'|f(1) }}\n"
    assert engines.locate(source, "for tool in tools") == 2
    assert engines.locate(source, "x | length") == 3
    assert engines.locate(source, '"q" | f(1)') == 5
    assert engines.locate(source, "z | min") == 4  # not there as such: its filter is
    assert engines.locate(source, "nowhere") is None
