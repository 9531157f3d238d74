"""ctxlock.lint._fix: `ctxlock lint --fix` for the training-mask rule (`tag_generation`).

- Every fixture template (70, each with its vocabulary as tests/conformance.py pairs them): where the fix applies,
  the tagged template renders the original's text on every probe and, on every training row (a probe with an
  assistant turn, without the generation prompt; its tool-calling turn also with content), ctxlock's generation
  mask (transformers' rule) is the original's provenance mask, checked here apart from the library's own check;
  where it does not, the reason is of the kind REFUSED records.
- transformers: on every template the fix applies to (35), `apply_chat_template(...,
  return_assistant_tokens_mask=True)` on the tagged template gives ctxlock's ids and its provenance mask of the
  original template on every training row (466), or both refuse the row (answers cached on disk,
  tests/reference.py: a warm run costs about 0.1 s a template once the vocabularies are loaded).
- The source edits (hypothesis): random templates of literal text, expressions, `if`/`for` blocks and comments with
  every whitespace control, their pieces cut anywhere: transformers renders the same text, and its generation
  blocks cover exactly the cut parts.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
import reference
from conformance import TEMPLATE_KWARGS, vocab_for
from ctxlock.errors import CtxlockError, MaskError
from ctxlock.lint import _fixsource as fs
from ctxlock.lint._fix import ProbeCheck, TagResult, tag_generation
from ctxlock.probes import PROBE_NOW, Probe, load_corpus
from ctxlock.template import ChatTemplate
from ctxlock.training import MaskOptions, assistant_mask
from hypothesis_profiles import examples

TEMPLATES = {p.name: p for p in fetched.template_paths()}
CORPUS = tuple(load_corpus())
# transformers' test for a tagged template (utils/chat_template_utils.py, `render_jinja_template`).
HF_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")

# Why the fix does not apply, by kind (the reason's first words). With the test vocabularies most of these are a
# token that holds the end of a header and the start of a body ("><" where "<tool_call>" is plain text).
KINDS = {
    "inside": "an assistant turn's trained text begins or ends inside a template expression",
    "token": "the token ",
    "moves": "the template text at line ",
    "check": "the tagged template fails on probe ",
    "refuses": "the template refuses every training probe",
}
REFUSED = {
    "Apertus-8B-Instruct.jinja": "inside",
    "Bielik-11B-v3.0-Instruct.jinja": "check",
    "Cohere2MoE.jinja": "moves",
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "refuses",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "moves",
    "GLM-4.6.jinja": "moves",
    "GLM-4.7-Flash.jinja": "token",
    "GigaChat3-10B-A1.8B.jinja": "inside",
    "GigaChat3.1-10B-A1.8B.jinja": "inside",
    "Kimi-K3.jinja": "inside",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "token",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "inside",
    "NVIDIA-Nemotron-Nano-v2.jinja": "moves",
    "Qwen3.5-4B.jinja": "moves",
    "Reka-Edge.jinja": "inside",
    "Spark2.5.jinja": "token",
    "StepFun3.5-Flash.jinja": "moves",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": "token",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "moves",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "inside",
    "google-gemma-4-31B-it.jinja": "moves",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "token",
    "ibm-granite-granite-4.0.jinja": "token",
    "ibm-granite-granite-4.1.jinja": "token",
    "llama-cpp-rwkv-world.jinja": "moves",
    "meetkai-functionary-medium-v3.1.jinja": "inside",
    "meetkai-functionary-medium-v3.2.jinja": "moves",
    "microsoft-Phi-3.5-mini-instruct.jinja": "check",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "token",
    "muse-glimmer.jinja": "moves",
    "openai-gpt-oss-120b.jinja": "moves",
    "tencent-Hy3.jinja": "inside",
    "unsloth-Apriel-1.5.jinja": "token",
    "unsloth-mistral-Devstral-Small-2507.jinja": "token",
    "upstage-Solar-Open-100B.jinja": "moves",
}


@cache
def _model(vocab: str) -> ctxlock.Model:
    return ctxlock.load(str(fetched.gguf_path(vocab)))


@cache
def _hf_dir(vocab: str) -> Path:
    return fetched.hf_tokenizer_dir(vocab)


@cache
def _hf_model(vocab: str) -> ctxlock.Model:
    return ctxlock.load(str(_hf_dir(vocab)))


@cache
def _template(name: str) -> ChatTemplate:
    return ChatTemplate(TEMPLATES[name].read_text("utf-8"), id=name)


@cache
def _result(name: str) -> TagResult:
    return tag_generation(_model(vocab_for(name)), _template(name), CORPUS, variables=TEMPLATE_KWARGS.get(name))


def _rows() -> list[Probe]:
    """Every probe as it is, as a training row (no generation prompt) when it has an assistant turn, and as one
    whose tool-calling turn has content too: the rows `tag_generation` checks, in its order."""
    out = []
    for p in CORPUS:
        out.append(p)
        messages = p.request["messages"]
        if any(m["role"] == "assistant" for m in messages) and (p.add_generation_prompt or p.continue_final_message):
            out.append(_training(p, "training", messages))
        if any(m["role"] == "assistant" and m.get("tool_calls") and not m.get("content") for m in messages):
            said = [{**m, "content": "Let me check."} if m.get("tool_calls") else m for m in messages]
            out.append(_training(p, "content", said))
    return out


def _training(probe: Probe, suffix: str, messages: list[Any]) -> Probe:
    return dataclasses.replace(
        probe,
        name=f"{probe.name}+{suffix}",
        request={**probe.request, "messages": messages},
        add_generation_prompt=False,
        continue_final_message=False,
    )


def _options(name: str, template: ChatTemplate, probe: Probe) -> dict[str, Any]:
    return {
        "chat_template": template,
        "add_generation_prompt": probe.add_generation_prompt,
        "continue_final_message": probe.continue_final_message,
        "chat_template_kwargs": TEMPLATE_KWARGS.get(name),
        "now": PROBE_NOW,
        "seed": 0,
    }


def _mask(model: ctxlock.Model, probe: Probe, source: str, **options: Any) -> list[int] | str:
    try:
        return assistant_mask(model, dict(probe.request), MaskOptions(source=source), **options)[1].mask.tolist()
    except CtxlockError as exc:
        return type(exc).__name__


# -- every fixture template ---------------------------------------------------------------------------------------


def test_the_count_and_the_reasons_are_the_ones_recorded() -> None:
    """35 of the 70 fixture templates get a tagged template; the other 35 are REFUSED, each with its reason."""
    assert len(TEMPLATES) == 70
    applied = sorted(n for n in TEMPLATES if _result(n).applies)
    assert len(applied) == 35 and not set(applied) & set(REFUSED), applied
    assert sorted(set(TEMPLATES) - set(applied)) == sorted(REFUSED)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_tagged_template_renders_the_text_and_trains_the_provenance_tokens(name: str) -> None:
    result = _result(name)
    if not result.applies:
        assert result.source is None and result.reason.startswith(KINDS[REFUSED[name]]), result.reason
        return
    assert result.reason == "" and result.source and HF_TAG.search(result.source)
    assert all(c.render_identical and c.mask_equal for c in result.checked)
    assert [c.probe for c in result.checked] == [p.name for p in _rows()]
    model, tagged = _model(vocab_for(name)), ChatTemplate(result.source, id="tagged")
    masked = 0
    for probe in _rows():
        ours, theirs = (_render(model, name, t, probe) for t in (_template(name), tagged))
        assert ours == theirs, probe.name
        if _is_training(probe):
            provenance = _mask(model, probe, "provenance", **_options(name, _template(name), probe))
            generation = _mask(model, probe, "generation", **_options(name, tagged, probe))
            assert generation == provenance, probe.name
            masked += isinstance(provenance, list)
    assert masked >= 3, f"{name}: only {masked} training rows with a mask"


def _is_training(probe: Probe) -> bool:
    shaped = not probe.add_generation_prompt and not probe.continue_final_message
    return shaped and any(m["role"] == "assistant" for m in probe.request["messages"])


def _render(model: ctxlock.Model, name: str, template: ChatTemplate, probe: Probe) -> str:
    try:
        return model.render(dict(probe.request), **_options(name, template, probe)).text
    except CtxlockError as exc:
        return type(exc).__name__


def test_a_refusal_says_why_and_gives_no_template() -> None:
    """A template the probes all fail on, and a piece that writes a header and its turn's text at once (a macro)."""
    model = _model("qwen2")
    refuses = ChatTemplate("{{ raise_exception('no') }}", id="refuses")
    result = tag_generation(model, refuses, CORPUS)
    assert not result.applies and result.source is None and result.checked == ()
    assert result.reason.startswith(KINDS["refuses"])
    whole = ChatTemplate(
        "{% macro turn(m) %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endmacro %}"
        "{% for m in messages %}{{ turn(m) }}{% endfor %}",
        id="macro",
    )
    result = tag_generation(model, whole, CORPUS)
    assert not result.applies and "line 3" in result.reason and "{{ turn(m) }}" in result.reason
    assert result.reason.startswith(KINDS["inside"])


def test_a_template_with_its_own_tags_is_tagged_anew() -> None:
    """The template's own blocks (here around the header too: they disagree with provenance) are removed (with the
    newline `{% endgeneration %}` trimmed) and the blocks put where provenance says."""
    source = (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}<|im_start|>assistant\n"
        "{{ m.content }}<|im_end|>{% endgeneration %}\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    result = tag_generation(_model("qwen2"), ChatTemplate(source, id="own tags"), CORPUS)
    assert result.applies, result.reason
    assert result.source == source.replace(
        "{% generation %}<|im_start|>assistant\n", "<|im_start|>assistant\n{% generation %}"
    ).replace("{% endgeneration %}\n", "{% endgeneration %}")


# -- transformers ---------------------------------------------------------------------------------------------------


APPLIED = sorted(set(TEMPLATES) - set(REFUSED))  # the 35 `--fix` writes a tagged template for (counted above)


def _transformers(name: str, source: str, probe: Probe) -> dict[str, list[int]] | str:
    """transformers' ids and assistant mask for a training row of the tagged template, or the name of what it
    raises when it refuses the conversation (answers and refusals cached on disk, tests/reference.py)."""
    try:
        return reference.reference_assistant_mask(
            _hf_dir(vocab_for(name)),
            source,
            copy.deepcopy(probe.request["messages"]),
            tools=copy.deepcopy(probe.request.get("tools")),
            now=PROBE_NOW,
            **TEMPLATE_KWARGS.get(name, {}),
        )
    except reference.ReferenceRefusal as exc:
        return exc.kind


@pytest.mark.reference
@pytest.mark.parametrize("name", APPLIED)
def test_transformers_masks_the_tagged_template_as_ctxlock(name: str) -> None:
    """Every training row: transformers' `return_assistant_tokens_mask` on the tagged template is ctxlock's ids and
    provenance mask of the original; or both refuse the conversation (a tool call without an id, ...); or the row has
    nothing to train on (an empty assistant turn): transformers masks no token, ctxlock refuses the row (a
    `MaskError`, never a zero mask) and renders the same ids."""
    result = _result(name)
    assert result.applies and result.source, result.reason
    model = _hf_model(vocab_for(name))  # the tokenizer transformers loads (a GGUF's BOS may be another id there)
    compared = refused = 0
    for probe in filter(_is_training, _rows()):
        expected = _transformers(name, result.source, probe)
        options = _options(name, _template(name), probe)
        try:
            lay, mask = assistant_mask(model, dict(probe.request), MaskOptions(source="provenance"), **options)
        except MaskError:  # nothing to train on (an empty assistant turn): ctxlock's error row, transformers' zeros
            assert isinstance(expected, dict) and not any(expected["assistant_masks"]), probe.name
            ids = model.tokenize(model.render(dict(probe.request), **options)).ids
            assert list(ids) == expected["input_ids"], probe.name
            refused += 1
            continue
        except CtxlockError as exc:
            assert isinstance(expected, str), (probe.name, f"ctxlock refuses: {exc}")
            refused += 1
            continue
        assert isinstance(expected, dict), (probe.name, f"transformers refuses: {expected}")
        assert lay.ids.tolist() == expected["input_ids"], probe.name
        assert mask.mask.tolist() == expected["assistant_masks"], probe.name
        compared += 1
    assert compared >= 5, f"{name}: only {compared} rows compared ({refused} refused)"


# -- the source edits -----------------------------------------------------------------------------------------------

_EXPRESSIONS = ("'x\\n'", "v", "'a' + v + 'b\\n'", "v ~ ' c' ~ '\\n'", "'<e>\\n'", "''")
_IN_LOOP = ("m.content", "'<s>' + m.role + '\\n' + m.content + '<e>\\n'")
_CONTEXT = {"v": "V", "ms": [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A\n"}]}


@st.composite
def _template_text(draw: st.DrawFn, depth: int = 2, in_loop: bool = False) -> str:
    ctl = st.sampled_from(["", "-", "+"])
    out = []
    for _ in range(draw(st.integers(1, 4))):
        kinds = ["data", "var", "var", "comment", "set", "if", "for"] if depth else ["data", "var", "set"]
        kind = draw(st.sampled_from(kinds))
        left, right = draw(ctl), draw(ctl)
        if kind == "data":
            out.append(draw(st.text(alphabet="ab \n\t", min_size=1, max_size=6)))
        elif kind == "var":
            expr = draw(st.sampled_from(_EXPRESSIONS + (_IN_LOOP if in_loop else ())))
            out.append("{{" + left.replace("+", "") + " " + expr + " " + right.replace("+", "") + "}}")
        elif kind == "comment":
            out.append("{#" + left + " c " + right + "#}")
        elif kind == "set":
            out.append(fs.block_tag("set z = 1", left, right))
        elif kind == "if":
            body = draw(_template_text(depth - 1, in_loop))
            other = draw(st.one_of(st.just(""), _template_text(depth - 1, in_loop)))
            otherwise = fs.block_tag("else", draw(ctl), draw(ctl)) + other if other else ""
            test = draw(st.sampled_from(["v", "not v"]))
            out.append(
                fs.block_tag(f"if {test}", left, right) + body + otherwise + fs.block_tag("endif", draw(ctl), draw(ctl))
            )
        elif not in_loop:
            body = draw(_template_text(depth - 1, True))
            out.append(fs.block_tag("for m in ms", left, right) + body + fs.block_tag("endfor", draw(ctl), draw(ctl)))
    return "".join(out)


def _spans(source: str) -> tuple[str, list[tuple[int, int]]]:
    """transformers' render and generation spans (`_render_with_assistant_indices`, what apply_chat_template uses)."""
    import transformers.utils.chat_template_utils as ctu

    compiled = ctu._compile_jinja_template(source)
    text, spans = ctu._render_with_assistant_indices(compiled, [], None, None, False, **_CONTEXT)
    return text, spans


def _places(src: fs.Source, text: str) -> list[tuple[fs.Unit, str, int, int, list[int]]]:
    """The instrumented render's places: unit, its loop's `m.role == "assistant"`, start, end, operand sizes."""
    marks = list(re.finditer("\ue000([^\ue001]*)\ue001", text))
    out, removed = [], 0
    for k, m in enumerate(marks):
        uid, conds, sizes = m.group(1).split(";")
        start = m.start() - removed
        removed += len(m.group(0))
        end = (marks[k + 1].start() if k + 1 < len(marks) else len(text)) - removed
        out.append((src.units[int(uid)], conds, start, end, [int(n) for n in sizes.split(",")] if sizes else []))
    return out


def _chars(src: fs.Source, unit: fs.Unit, start: int, sizes: list[int], status: list[int], end: int) -> set[int]:
    """The characters of one place whose cell is cut as trained."""
    parts = fs.cells(src, unit)
    if len(parts) == end - start and (unit.kind == "data" or len(unit.operands) == 1):
        return {start + k for k in range(end - start) if status[k]}
    if len(parts) == 1:
        return set(range(start, end)) if status[0] else set()
    out, at, cell = set(), start, 0
    for op, n in zip(unit.operands, sizes, strict=True):
        if op.const is not None:
            out |= {at + k for k in range(n) if status[cell + k]}
            cell += n
        else:
            out |= set(range(at, at + n)) if status[cell] else set()
            cell += 1
        at += n
    return out


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_cuts_keep_the_render_and_cover_exactly_the_cut_cells(data: st.DataObject) -> None:
    source = data.draw(_template_text()) + data.draw(st.sampled_from(["", "\n"]))
    try:
        text, _ = _spans(source)
    except Exception:  # an empty loop body or another template jinja2 refuses: not a case
        return
    src = fs.read_source(source)
    plans: dict[int, tuple[list[int], list[int]]] = {}
    edits = []
    for unit in src.units:
        n = len(fs.cells(src, unit))
        when = data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
        if unit.loops and data.draw(st.booleans()):
            otherwise = data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
            edits.append(fs.conditional(src, unit, 'm.role == "assistant"', when, otherwise))
        else:
            otherwise = when
            edits += fs.cut(src, unit, when)
        plans[unit.id] = (when, otherwise)
    tagged = fs.apply_edits(source, edits)
    tagged_text, spans = _spans(tagged)
    assert tagged_text == text, (source, tagged)
    expected: set[int] = set()
    for unit, conds, start, end, sizes in _places(src, _spans(fs.instrument(src, "\ue000\ue001"))[0]):
        status = plans[unit.id][0 if conds in ("", "True") else 1]
        expected |= _chars(src, unit, start, sizes, status, end)
    assert {c for s, e in spans for c in range(s, e)} == expected, (source, tagged)


@settings(max_examples=examples(200), deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=20))
def test_a_string_literal_reads_back_as_its_value(value: str) -> None:
    assert fs.string_value(fs.string_literal(value)) == value


def test_probe_checks_unpack_as_four_fields() -> None:
    name, rendered, masked, detail = ProbeCheck("p", True, False, "why")
    assert (name, rendered, masked, detail) == ("p", True, False, "why")
