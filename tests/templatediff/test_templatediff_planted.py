"""`diff-template` on differences planted in real templates (llama.cpp's fixtures, `fetched.template_paths()`),
rendered with the qwen2 vocabulary (its GGUF), and on pure reformattings that must render identically.

Each planted case states, from the corpus data and the edit alone, which probes must render differently and which
capabilities must change; the first diverging token is checked against HF `tokenizers` encoding the two rendered
texts on its own (the tokenizer.json transformers converts from the same GGUF), not against ctxlock's ids. The plants
are Qwen2.5's, and Qwen3's reasoning branch removed (its capability line checked in the command's view too)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer

import fetched
from cli_runner import run_main
from ctxlock.probes import Corpus, Probe, load_corpus
from ctxlock.templatediff import TemplateDiff, diff_templates, load_sides

QWEN = "Qwen-Qwen2.5-7B-Instruct.jinja"
QWEN3 = "Qwen-Qwen3-0.6B.jinja"
LLAMA_31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"


def template_path(name: str) -> Path:
    return next(p for p in fetched.template_paths() if p.name == name)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


@pytest.fixture(scope="module")
def hf() -> HFTokenizer:
    return HFTokenizer.from_file(str(fetched.hf_tokenizer_dir("qwen2") / "tokenizer.json"))


def run(tmp_path: Path, a_source: str, b_source: str, corpus: Corpus) -> TemplateDiff:
    (tmp_path / "a.jinja").write_text(a_source, "utf-8")
    (tmp_path / "b.jinja").write_text(b_source, "utf-8")
    a, b = load_sides(str(tmp_path / "a.jinja"), str(tmp_path / "b.jinja"), model=str(fetched.gguf_path("qwen2")))
    return diff_templates(a, b, corpus)


def first_difference(x: list[int], y: list[int]) -> int:
    return next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))


# -- what a probe holds, read from the corpus data -----------------------------------------------------------------


def _messages(p: Probe) -> list[dict[str, object]]:
    return list(p.request["messages"])


def opens_a_turn(p: Probe) -> bool:
    return p.add_generation_prompt and not p.continue_final_message


def system_first_without_tools(p: Probe) -> bool:
    return _messages(p)[0]["role"] == "system" and not p.request.get("tools")


def has_tool_calls(p: Probe) -> bool:
    return any(m.get("tool_calls") for m in _messages(p))


def has_tool_results(p: Probe) -> bool:
    return any(m["role"] == "tool" for m in _messages(p))


def nothing(p: Probe) -> bool:
    return False


def reasoning_after_the_last_user_turn(p: Probe) -> bool:
    """Qwen3 writes an assistant turn's reasoning only after the conversation's last user turn."""
    messages = _messages(p)
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return any(m.get("reasoning_content") for m in messages[last_user + 1 :])


@dataclass(frozen=True)
class Plant:
    """An edit of a template (Qwen2.5 unless said): `old` (found once) becomes `new`; the probes it must change; the
    capabilities that must change, with B's verdict."""

    name: str
    old: str
    new: str
    differs: Callable[[Probe], bool]
    changed: dict[str, str]
    template: str = QWEN


PLANTS = [
    # One more newline in the generation prompt: a whitespace change that changes ids (token 198 "\n" becomes 271
    # "\n\n"), in every probe that opens an assistant turn. The prompt is then no prefix of the assistant turns the
    # template writes for history, and the mask cross-check says so.
    Plant(
        "generation-prompt-newline",
        "{{- '<|im_start|>assistant\\n' }}",
        "{{- '<|im_start|>assistant\\n\\n' }}",
        opens_a_turn,
        {"mask": "provenance: disagree"},
    ),
    # The system branch of the no-tools case dropped: the default system prompt always, the user's never.
    Plant(
        "system-branch-dropped",
        "    {%- if messages[0]['role'] == 'system' %}\n"
        "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
        "    {%- else %}\n"
        "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "<|im_end|>\\n' }}\n"
        "    {%- endif %}\n{%- endif %}",
        "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "<|im_end|>\\n' }}\n{%- endif %}",
        system_first_without_tools,
        {"system": "dropped"},
    ),
    # The tool-call tags of an assistant turn renamed: the calls still reach the text, in another format.
    Plant(
        "tool-call-tags-renamed",
        '{{- \'\\n<tool_call>\\n{"name": "\' }}\n            {{- tool_call.name }}\n            '
        '{{- \'", "arguments": \' }}\n            {{- tool_call.arguments | tojson }}\n            '
        "{{- '}\\n</tool_call>' }}",
        '{{- \'\\n<function_call>\\n{"name": "\' }}\n            {{- tool_call.name }}\n            '
        '{{- \'", "arguments": \' }}\n            {{- tool_call.arguments | tojson }}\n            '
        "{{- '}\\n</function_call>' }}",
        has_tool_calls,
        {},
    ),
    # The JSON layout of the call changed: the arguments indented.
    Plant(
        "tool-call-json-indented",
        "{{- tool_call.arguments | tojson }}",
        "{{- tool_call.arguments | tojson(indent=2) }}",
        has_tool_calls,
        {},
    ),
    # The tool results' branch removed: a tool message writes nothing.
    Plant(
        "tool-results-dropped",
        '    {%- elif message.role == "tool" %}\n        {%- if (loop.index0 == 0)',
        '    {%- elif message.role == "tool" and false %}\n        {%- if (loop.index0 == 0)',
        has_tool_results,
        {"tool_results": "dropped"},
    ),
    # {% generation %} around the assistant's content: the same text, and the masks now come from the tags.
    Plant(
        "generation-tags",
        "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}",
        "        {{- '<|im_start|>' + message.role + '\\n' }}\n"
        "        {%- if message.role == 'assistant' %}{% generation %}{{- message.content + '<|im_end|>' }}"
        "{% endgeneration %}{%- else %}{{- message.content + '<|im_end|>' }}{%- endif %}\n"
        "        {{- '\\n' }}",
        nothing,
        {"mask": "generation: agree"},
    ),
    # The content read as a list of parts, their texts joined by newlines as ctxlock joins them for a string
    # template: the same text, and content parts (an image, say) now reach the template as a list.
    Plant(
        "content-parts-read-as-a-list",
        "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}",
        "        {{- '<|im_start|>' + message.role + '\\n' }}\n"
        "        {%- if message.content is string %}{{- message.content }}{%- else %}"
        "{%- for part in message.content %}{{- part.text }}{%- if not loop.last %}{{- '\\n' }}{%- endif %}"
        "{%- endfor %}{%- endif %}\n"
        "        {{- '<|im_end|>' + '\\n' }}",
        nothing,
        {"content_format": "openai"},
    ),
    # Qwen3's reasoning_content branch removed (reasoning read only from a <think> block inside content): the
    # request's reasoning no longer reaches the text, and its <think> block is written empty.
    Plant(
        "reasoning-branch-removed",
        "        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n"
        "            {%- set reasoning_content = message.reasoning_content %}\n"
        "        {%- else %}\n"
        "            {%- if '</think>' in message.content %}\n"
        "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
        "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n')"
        ".split('<think>')[-1].lstrip('\\n') %}\n"
        "            {%- endif %}\n"
        "        {%- endif %}\n",
        "        {%- if '</think>' in message.content %}\n"
        "            {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
        "            {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n')"
        ".split('<think>')[-1].lstrip('\\n') %}\n"
        "        {%- endif %}\n",
        reasoning_after_the_last_user_turn,
        {"reasoning": "dropped"},
        QWEN3,
    ),
]


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p.name)
def test_a_planted_difference_is_found_at_its_token(
    plant: Plant, tmp_path: Path, corpus: Corpus, hf: HFTokenizer
) -> None:
    source = template_path(plant.template).read_text("utf-8")
    assert source.count(plant.old) == 1, plant.name
    diff = run(tmp_path, source, source.replace(plant.old, plant.new), corpus)
    assert diff.ids_comparable
    assert not diff.identical
    expected = {p.name for p in corpus if plant.differs(p)}
    assert {p.probe.name for p in diff.differing} == expected
    for p in diff.differing:
        assert p.kind == "ids", p.probe.name
        assert p.a.text is not None and p.b.text is not None and p.a.ids is not None and p.divergence is not None
        ids_a = hf.encode(p.a.text, add_special_tokens=False).ids
        ids_b = hf.encode(p.b.text, add_special_tokens=False).ids
        assert ids_a == list(p.a.ids)  # the oracle encodes as ctxlock does...
        index = first_difference(ids_a, ids_b)  # ...and names the token where the two part, on its own
        d = p.divergence
        assert d.index == index, p.probe.name
        assert (d.a_id, d.b_id) == (ids_a[index], ids_b[index])
        assert (d.a_token, d.b_token) == (hf.id_to_token(ids_a[index]), hf.id_to_token(ids_b[index]))
        # The excerpts show both texts where the token starts: the same before it, apart after it.
        pair = p.excerpts()
        assert pair is not None and pair[0] != pair[1]
        assert p.a.text[: d.a_offset] == p.b.text[: d.a_offset]
        assert hf.decode(ids_a[:index], skip_special_tokens=False) == p.a.text[: d.a_offset]
    changed = {c.capability: c.b.verdict for c in diff.changed}
    assert changed == plant.changed
    for c in diff.changed:
        assert c.a.verdict != c.b.verdict
    # Nothing else about A and B moved: every probe not named renders the same ids.
    for p in diff.probes:
        if p.probe.name not in expected:
            assert p.kind == "same" and p.a.ids == p.b.ids


def test_the_capability_line_names_reasoning(tmp_path: Path) -> None:
    """The command's human view of the reasoning plant: the one probe, and reasoning on the capability line."""
    (plant,) = [p for p in PLANTS if p.name == "reasoning-branch-removed"]
    source = template_path(plant.template).read_text("utf-8")
    (tmp_path / "a.jinja").write_text(source, "utf-8")
    (tmp_path / "b.jinja").write_text(source.replace(plant.old, plant.new), "utf-8")
    argv = [
        "diff-template",
        str(tmp_path / "a.jinja"),
        str(tmp_path / "b.jinja"),
        "-m",
        str(fetched.gguf_path("qwen2")),
    ]
    code, out, err = run_main(argv)
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("differs ")] == ["reasoning-last"]
    at = lines.index("capabilities that changed (A → B)")
    assert lines[at + 1 : at + 3] == [f"  {'reasoning':<22} rendered → dropped", ""]
    assert lines[-1].endswith("; 1 capability changed")


def test_a_template_that_raises_is_an_error_against_a_render(tmp_path: Path, corpus: Corpus) -> None:
    source = template_path(QWEN).read_text("utf-8")
    old = "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    new = "        {{- raise_exception('System messages are not supported') }}"
    planted = source.replace(old, new)
    line = planted.split("\n").index(new) + 1
    diff = run(tmp_path, source, planted, corpus)
    assert {p.probe.name for p in diff.differing} == {p.name for p in corpus if system_first_without_tools(p)}
    for p in diff.differing:
        assert p.kind == "error" and p.a.ok and p.divergence is None and p.text_index is None
        assert p.b.error is not None and p.b.error.raised
        assert (p.b.error.message, p.b.error.line) == ("System messages are not supported", line)
        assert p.to_dict()["b"]["error"]["line"] == line
    (system,) = diff.changed
    assert (system.capability, system.a.verdict, system.b.verdict, system.b.line) == (
        "system",
        "rendered",
        "refused",
        line,
    )


# -- a pure reformatting: nothing to report ------------------------------------------------------------------------

_TAG_START = re.compile(r"^\s*\{[%{#]-")
_ONE_BLOCK = re.compile(r"^(\s*\{%-[^{}%]*?)\s*%\}$")


def reformat(source: str) -> str:
    """The template's Jinja rearranged without changing what it renders: every line that starts with a tag which
    strips the whitespace before it (`{%-`, `{{-`, `{#-`) re-indented by 2 instead of 4, a comment `{#- ... -#}` on a
    line of its own before each `{%- if`, and a lone `{%- ... %}` line followed by such a tag closed with `-%}`. All
    of it is whitespace that the next tag's `-` strips anyway."""
    lines = source.split("\n")
    out = []
    for i, line in enumerate(lines):
        following = next((x for x in lines[i + 1 :] if x.strip()), "")
        if _TAG_START.match(line):
            stripped = line.lstrip()
            depth = (len(line) - len(stripped)) // 4
            if stripped.startswith("{%- if"):
                out.append("  " * depth + "{#- reformatted: a comment, indentation and whitespace control -#}")
            line = "  " * depth + stripped
            block = _ONE_BLOCK.match(line)
            if block and _TAG_START.match(following) and not block.group(1).endswith("-"):
                line = block.group(1) + " -%}"
        out.append(line)
    return "\n".join(out)


REFORMATTED = [p.name for p in fetched.template_paths() if reformat(p.read_text("utf-8")) != p.read_text("utf-8")]


def test_the_reformatting_touches_nearly_every_fixture() -> None:
    assert len(REFORMATTED) >= 60


@pytest.mark.parametrize("name", REFORMATTED)
def test_a_pure_reformatting_reports_no_difference(name: str, tmp_path: Path, corpus: Corpus) -> None:
    source = template_path(name).read_text("utf-8")
    diff = run(tmp_path, source, reformat(source), corpus)
    assert diff.a.template is not None and diff.b.template is not None
    assert diff.a.template.sha256 != diff.b.template.sha256
    # Not vacuous: Qwen2.5 renders every probe; Llama 3.1 all but the parallel calls, which it refuses, on both
    # sides, from another line once reformatted (an error's line moves with the source and is not compared). Four
    # of the fixtures refuse every probe: the same errors on both sides is then what is compared.
    if name == QWEN:
        assert all(p.a.ok for p in diff.probes)
    if name == LLAMA_31:
        assert [p.probe.name for p in diff.probes if not p.a.ok] == ["parallel-tool-calls"]
        refused = next(p for p in diff.probes if not p.a.ok)
        assert refused.a.error is not None and refused.b.error is not None
        assert refused.a.error.raised and refused.a.error.line != refused.b.error.line
    assert diff.identical, ([p.to_dict() for p in diff.differing], [c.to_dict() for c in diff.changed])
