"""ctxlock.probes: the shipped corpus, a user's probe files read as hostile input, and `capabilities()` on real
templates.

- The shipped corpus loads, every probe parses as a chat request, and the probes the rules and capabilities look up
  by name are in it.
- A user's file adds probes and replaces shipped ones by name; `only` keeps some.
- A hostile probe file (not JSON, duplicate keys, wrong types, unknown keys, 1001 probes, a request ctxlock refuses,
  a file over the input cap; and hypothesis' JSON values in every field) is an `InputError` naming the file and the
  JSON path, never another exception.
- `capabilities()` on Qwen3, Gemma 2, Llama 3.1 and Mistral Nemo says what each template does with each part.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from conformance import vocab_for
from ctxlock.artifacts import load_template_file
from ctxlock.errors import InputError
from ctxlock.probes import (
    CAPABILITIES,
    EXERCISES,
    Corpus,
    Verdict,
    capabilities,
    load_corpus,
    read_probes,
    render_probes,
)
from ctxlock.probes._corpus import MAX_PROBES
from ctxlock.request import parse_request
from hypothesis_profiles import examples

OK = {"name": "mine", "request": {"messages": [{"role": "user", "content": "Hello"}]}}


def _write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data), "utf-8")
    return path


# ----------------------------------------------------------------------------------------------- the shipped corpus


def test_the_shipped_corpus_loads_and_every_probe_parses() -> None:
    corpus = load_corpus()
    assert len(corpus) >= 20 and corpus.sources == ("ctxlock",)
    assert len(set(corpus.names)) == len(corpus)
    for probe in corpus:
        assert probe.source == "ctxlock" and probe.description
        assert set(probe.exercises) <= EXERCISES
        parse_request(dict(probe.request))  # raises on a request ctxlock refuses
        assert probe.to_dict()["request"] == probe.request


def test_the_probes_named_by_the_rules_are_shipped() -> None:
    names = set(load_corpus().names)
    # capabilities() judges each capability on one probe; generation_prompt on these two
    named = {v.probe for v in capabilities(()).values()} | {"user", "user-no-generation-prompt"}
    # content-format renders content-parts; history-rewrite leaves out the conversations ordinary templates refuse
    named |= {"content-parts", "system-not-first", "consecutive-users", "assistant-first"}
    assert named <= names
    assert set(CAPABILITIES) == set(capabilities(()))


def test_every_shipped_probe_renders_through_a_lenient_template(qwen2: ctxlock.Model) -> None:
    """Qwen2.5's template raises on nothing: every shipped probe is a request it renders."""
    template = load_template_file(fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja")
    renders = render_probes(qwen2, load_corpus(), template)
    assert [(r.probe.name, r.error) for r in renders if not r.ok] == []
    assert all(r.ids for r in renders)


# --------------------------------------------------------------------------------------------- a user's probe file


def test_a_user_file_adds_and_overrides_by_name(tmp_path: Path) -> None:
    shipped = load_corpus()
    mine = {"name": "user", "description": "mine", "request": {"messages": [{"role": "user", "content": "Bonjour"}]}}
    path = _write(tmp_path / "probes.json", {"probes": [mine, OK]})
    corpus = load_corpus(path)
    assert corpus.sources == ("ctxlock", str(path))
    assert corpus.names == (*shipped.names, "mine")
    user = corpus.named("user")
    assert (user.source, user.description, user.request["messages"][0]["content"]) == (str(path), "mine", "Bonjour")
    assert corpus.names.index("user") == shipped.names.index("user")  # replaced in place
    # a list alone is a probe file too; files apply in order, the last one's probe wins
    second = _write(tmp_path / "second.json", [{**OK, "add_generation_prompt": False}])
    later = load_corpus([path, second])
    assert later.named("mine").add_generation_prompt is False and later.named("mine").source == str(second)


def test_only_keeps_the_probes_named(tmp_path: Path) -> None:
    corpus = load_corpus(_write(tmp_path / "p.json", [OK]), only=["mine", "system"])
    assert corpus.names == ("system", "mine")
    with pytest.raises(InputError, match="no probe named 'nope'") as info:
        load_corpus(only=["nope"])
    assert info.value.path == "--only"
    with pytest.raises(InputError, match="no probe named 'nope'"):
        Corpus(corpus.probes).named("nope")


HOSTILE: list[tuple[str, Any, str, str]] = [  # (case, file content, JSON path after the file name, message)
    ("not JSON", "{nope", "column 2", "invalid JSON"),
    ("not UTF-8", None, "$", "not UTF-8"),
    ("duplicate keys", '{"probes": [{"name": "a", "name": "b"}]}', "$.probes[0]", 'duplicate key "name"'),
    ("a scalar", "3", "$", "a probe file holds a list of probes"),
    ("probes not a list", {"probes": {"a": OK}}, "$.probes", "a probe file holds a list of probes"),
    ("a probe not an object", {"probes": [OK, "x"]}, "$.probes[1]", "a probe is a JSON object"),
    ("name not a string", {"probes": [{**OK, "name": 3}]}, "$.probes[0].name", "name must be"),
    ("name with a space", [{**OK, "name": "a b"}], "$[0].name", "name must be"),
    ("name too long", [{**OK, "name": "n" * 65}], "$[0].name", "name must be"),
    ("request a list", [{**OK, "request": []}], "$[0].request", "request must be a chat request object"),
    ("flag a string", [{**OK, "add_generation_prompt": "yes"}], "$[0].add_generation_prompt", "true or false"),
    ("flag a number", [{**OK, "continue_final_message": 1}], "$[0].continue_final_message", "true or false"),
    ("exercises unknown", [{**OK, "exercises": ["flying"]}], "$[0].exercises", "capability names"),
    ("exercises a string", [{**OK, "exercises": "tools"}], "$[0].exercises", "capability names"),
    ("description a number", [{**OK, "description": 1}], "$[0].description", "description must be a string"),
    ("unknown probe key", {"probes": [{**OK, "colour": 1}]}, "$.probes[0].colour", "unknown key 'colour'"),
    ("unknown file key", {"probes": [OK], "colour": 1}, "$.colour", "unknown key 'colour'"),
    ("a name twice", [OK, OK], "$[1].name", "probe name 'mine' given twice"),
    ("1001 probes", {"probes": [{**OK, "name": f"p{i}"} for i in range(MAX_PROBES + 1)]}, "$.probes", "1001 probes"),
    (
        "a role ctxlock refuses",
        [OK, {**OK, "name": "b", "request": {"messages": [{"role": "wizard", "content": "x"}]}}],
        "$[1].request.messages[0].role",
        'unknown role "wizard"',
    ),
    ("no messages", [{**OK, "request": {"messages": []}}], "$[0].request.messages", "messages is empty"),
    (
        "tools a string",
        [{**OK, "request": {**OK["request"], "tools": "x"}}],
        "$[0].request.tools",
        "expected an array of tools",
    ),
    (
        "kwargs a list",
        [{**OK, "request": {**OK["request"], "chat_template_kwargs": [1]}}],
        "$[0].request.chat_template_kwargs",
        "expected an object",
    ),
    ("NaN", '[{"name": "x", "request": {"messages": [], "temperature": NaN}}]', "$[0].request.temperature", "NaN"),
    ("too deep", "[" * 200 + "]" * 200, "$[0][0]*", "nested deeper"),  # the path where it goes too deep
]


@pytest.mark.parametrize(("case", "content", "where", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_probe_file_is_an_input_error_naming_file_and_path(
    tmp_path: Path, case: str, content: Any, where: str, message: str
) -> None:
    path = tmp_path / "probes.json"
    if content is None:
        path.write_bytes(b'{"probes": [{"name": "\xff"}]}')
    else:
        _write(path, content)
    with pytest.raises(InputError) as info:
        load_corpus(path)
    if where.endswith("*"):
        assert (info.value.path or "").startswith(f"{path} {where[:-1]}"), case
    else:
        assert info.value.path == f"{path} {where}", case
    assert message in info.value.message, info.value.message
    assert info.value.hint


def test_a_probe_file_over_the_input_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "big.json", [OK] * 10)
    monkeypatch.setenv("CTXLOCK_MAX_INPUT_BYTES", "200")
    with pytest.raises(InputError, match="over the 200-byte input limit") as info:
        read_probes(path)
    assert info.value.path == str(path) and "CTXLOCK_MAX_INPUT_BYTES" in (info.value.hint or "")


def test_a_missing_probe_file_and_a_directory(tmp_path: Path) -> None:
    for path in (tmp_path / "absent.json", tmp_path):
        with pytest.raises(InputError) as info:
            load_corpus(path)
        assert str(path) in (info.value.path or "")


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("probes")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
FIELDS = sorted({"name", "description", "exercises", "request", "add_generation_prompt", "continue_final_message"})


@settings(max_examples=examples(80), deadline=None)
@given(field=st.sampled_from([*FIELDS, "messages", "message", "(probe)", "(file)"]), value=JSON)
def test_any_json_in_any_field_reads_or_is_an_input_error(probe_dir: Path, field: str, value: Any) -> None:
    """One field of a valid probe file replaced by any JSON value: read, or an InputError naming the file's path."""
    probe: Any = json.loads(json.dumps(OK))
    if field == "(probe)":
        probe = value
    elif field == "messages":
        probe["request"]["messages"] = value
    elif field == "message":
        probe["request"]["messages"][0] = value
    else:
        probe[field] = value
    data = value if field == "(file)" else {"probes": [probe]}
    path = probe_dir / "fuzz.json"
    path.write_text(json.dumps(data), "utf-8")  # always JSON (a string value is a JSON string, not the file's text)
    try:
        probes = read_probes(path)
    except InputError as exc:
        # a JSON path, or for text that is not JSON at all (a string drawn for the whole file) its column
        assert (exc.path or "").startswith((f"{path} $", f"{path} column ")), exc.path
        assert exc.message and exc.hint is not None
    else:
        for p in probes:
            parse_request(dict(p.request))


# ----------------------------------------------------------------------------------------------------- capabilities


@pytest.fixture(scope="module")
def models() -> Iterator[dict[str, ctxlock.Model]]:
    """The model of each vocabulary the module uses, loaded once."""
    yield {vocab: ctxlock.load(str(fetched.gguf_path(vocab))) for vocab in ("qwen2", "llama-bpe")}


@pytest.fixture(scope="module")
def qwen2(models: dict[str, ctxlock.Model]) -> ctxlock.Model:
    return models["qwen2"]


def _capabilities(models: dict[str, ctxlock.Model], name: str, corpus: Corpus) -> dict[str, Verdict]:
    """capabilities() of a fixture template, rendered with its pairing's vocabulary."""
    template = load_template_file(fetched.templates_dir() / name)
    return capabilities(render_probes(models[vocab_for(name)], corpus, template))


@pytest.fixture(scope="module")
def verdicts(models: dict[str, ctxlock.Model]) -> dict[str, dict[str, Verdict]]:
    corpus = load_corpus()
    return {name: _capabilities(models, name, corpus) for name in (QWEN3, GEMMA2, LLAMA31, NEMO)}


QWEN3 = "Qwen-Qwen3-0.6B.jinja"
GEMMA2 = "google-gemma-2-2b-it.jinja"
LLAMA31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
NEMO = "mistralai-Mistral-Nemo-Instruct-2407.jinja"

R, D, X = "rendered", "dropped", "refused"
EXPECTED = {
    # Qwen3 writes reasoning in the turn after the last user message only, reads no name, no documents.
    QWEN3: dict(
        system=R, tools=R, tool_calls=R, tool_results=R, parallel_tool_calls=R, reasoning=R, reasoning_in_history=D,
        content_parts=R, name=D, documents=D, continue_final=R, generation_prompt=R,
    ),
    # Gemma 2 refuses a system turn and a tool turn (roles must alternate), and never writes tools.
    GEMMA2: dict(
        system=X, tools=D, tool_calls=X, tool_results=X, parallel_tool_calls=X, reasoning=D, reasoning_in_history=D,
        content_parts=R, name=D, documents=D, continue_final=R, generation_prompt=R,
    ),
    # Llama 3.1 refuses two tool calls in one turn, and has no reasoning.
    LLAMA31: dict(
        system=R, tools=R, tool_calls=R, tool_results=R, parallel_tool_calls=X, reasoning=D, reasoning_in_history=D,
        content_parts=R, name=D, documents=D, continue_final=R, generation_prompt=R,
    ),
    # Mistral Nemo has no generation prompt: add_generation_prompt changes nothing.
    NEMO: dict(
        system=R, tools=R, tool_calls=R, tool_results=R, parallel_tool_calls=R, reasoning=D, reasoning_in_history=D,
        content_parts=R, name=D, documents=D, continue_final=R, generation_prompt=D,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(EXPECTED))
def test_capabilities_match_what_the_template_does(verdicts: dict[str, dict[str, Verdict]], name: str) -> None:
    got = verdicts[name]
    assert {k: v.verdict for k, v in got.items()} == EXPECTED[name]
    assert list(got) == list(CAPABILITIES)


def test_a_refusal_names_the_raise_and_its_line(verdicts: dict[str, dict[str, Verdict]]) -> None:
    lines = {name: (fetched.templates_dir() / name).read_text("utf-8").splitlines() for name in (GEMMA2, LLAMA31)}
    system = verdicts[GEMMA2]["system"]
    assert (system.probe, system.detail) == ("system", "System role not supported")
    assert system.line is not None and "raise_exception('System role not supported')" in lines[GEMMA2][system.line - 1]
    parallel = verdicts[LLAMA31]["parallel_tool_calls"]
    assert parallel.detail == "This model only supports single tool-calls at once!"
    assert parallel.line is not None and parallel.detail in lines[LLAMA31][parallel.line - 1]
    assert parallel.to_dict() == {
        "verdict": "refused",
        "probe": "parallel-tool-calls",
        "detail": parallel.detail,
        "line": parallel.line,
    }
    dropped = verdicts[NEMO]["generation_prompt"]
    assert "add_generation_prompt changes nothing" in dropped.detail


def test_not_probed_and_error_verdicts(models: dict[str, ctxlock.Model]) -> None:
    few = _capabilities(models, QWEN3, load_corpus(only=["system"]))
    assert few["system"].verdict == "rendered"
    assert {v.verdict for k, v in few.items() if k != "system"} == {"not probed"}
    # Hermes 2 Pro's tool_use template fails every request without tools (it loops over `tools`): an error, not a
    # refusal (the template's own raise)
    hermes = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"
    got = _capabilities(models, hermes, load_corpus(only=["user", "user-no-generation-prompt", "tools"]))
    assert got["generation_prompt"].verdict == "error" and "not iterable" in got["generation_prompt"].detail
    assert got["tools"].verdict == "rendered"
