"""ctxlock.accounting: every token of input_ids attributed to one request part, exactly; marginal costs; unseen parts.

The conformance corpus runs over all ~70 real templates with their paired vocabularies: the parts sum to the total,
the total is len(input_ids), and the bytes are laid exactly. Marginal costs are checked against two full encodes."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import ctxlock
import fetched
from conformance import FIXED_NOW, TEMPLATE_KWARGS, conversations, vocab_for
from ctxlock.accounting._layout import GENERATION_PROMPT, TEMPLATE, assign_owners, count, count_format, part_of, without
from ctxlock.cli import app
from ctxlock.errors import CtxlockError
from ctxlock.settings import reference_path
from ctxlock.template._render import ChatTemplate

TEMPLATES = fetched.template_paths()
CORPUS = conversations()

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city, with temperature units.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


@functools.cache  # let go after the module (tests/conftest.py)
def _model(vocab: str) -> ctxlock.Model:
    return ctxlock.load(str(fetched.hf_tokenizer_dir(vocab)))


def _qwen() -> tuple[ctxlock.Model, ChatTemplate]:
    source = (fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text("utf-8")
    return _model("qwen2"), ChatTemplate(source, id="Qwen-Qwen2.5-7B-Instruct.jinja")


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_parts_sum_to_len_input_ids_on_every_template(path: Path) -> None:
    vocab = vocab_for(path.name)
    model = _model(vocab)
    template = ChatTemplate(path.read_text("utf-8"), id=path.name)
    counted = 0
    for name, data, options in CORPUS:
        extra = TEMPLATE_KWARGS.get(path.name, {})
        kwargs: dict[str, Any] = {"now": FIXED_NOW, "chat_template_kwargs": extra or None, **options}
        try:
            ids = model.encode(data, chat_template=template, **kwargs)["input_ids"][0].tolist()
        except CtxlockError:
            continue  # the template refuses this conversation (test_conformance checks that transformers does too)
        counts = count(model, data, chat_template=template, **kwargs)
        with reference_path():  # the run-by-run lay and the second render without the generation prompt
            assert count(model, data, chat_template=template, **kwargs) == counts, name
        assert counts.total == len(ids), name
        assert sum(p.tokens for p in counts.parts) == counts.total, name
        assert all(p.tokens >= 0 for p in counts.parts)
        assert counts.exact_bytes, f"{name}: token bytes not laid exactly ({counts.notes})"
        counted += 1
    assert counted > 0


@pytest.mark.parametrize(
    "name",
    ["Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja", "deepseek-ai-DeepSeek-V3.1.jinja"],
)
def test_one_pass_equals_the_run_by_run_reference(name: str) -> None:
    """The one-pass lay (`_walk`) and the reference replay of every run give the same counts."""
    path = fetched.templates_dir() / name
    model = _model(vocab_for(name))
    template = ChatTemplate(path.read_text("utf-8"), id=name)
    compared = 0
    for _, data, options in CORPUS:
        kwargs: dict[str, Any] = {"now": FIXED_NOW, **options}
        try:
            fast = count(model, data, chat_template=template, **kwargs)
        except CtxlockError:
            continue
        with reference_path():
            ref = count(model, data, chat_template=template, **kwargs)
        assert fast == ref
        compared += 1
    assert compared > 5


def test_a_message_tokens_decode_to_its_content() -> None:
    model, template = _qwen()
    req = {"messages": [{"role": "user", "content": "Why is the sky blue on a clear afternoon?"}]}
    run = model.run(req, chat_template=template)
    counts = count(model, req, chat_template=template)
    # "<|im_start|>system ... <|im_end|>\n<|im_start|>user\n" is the template's; the question is messages[0].
    assert counts.tokens("messages[0]") == len(model.tokenizer.encode("Why is the sky blue on a clear afternoon?"))
    assert counts.tokens(GENERATION_PROMPT) == len(
        model.tokenizer.encode("<|im_start|>assistant\n", parse_special=True)
    )
    assert counts.tokens(TEMPLATE) == len(run.tokenized.ids) - counts.tokens("messages[0]") - counts.tokens(
        GENERATION_PROMPT
    )


def test_one_tool_definition_costs_hundreds_of_tokens_by_both_methods() -> None:
    """Seed 001's shape: a request of a few tokens grows by hundreds with one tool definition."""
    model, template = _qwen()
    bare = {"messages": [{"role": "user", "content": "Hi"}]}
    with_tool = {**bare, "tools": [WEATHER_TOOL]}
    counts = model.count(with_tool, chat_template=template, marginal=True)
    (tool,) = [p for p in counts.parts if p.part == "tools[0]"]
    direct = len(model.encode(with_tool, chat_template=template)["input_ids"][0]) - len(
        model.encode(bare, chat_template=template)["input_ids"][0]
    )
    assert tool.marginal == direct
    assert tool.marginal >= 150 and tool.tokens >= 80
    # the marginal is more than the tool's own tokens: the template adds its tool instructions with the first tool
    assert tool.marginal > tool.tokens


def test_every_marginal_is_the_difference_of_two_full_encodes() -> None:
    model, template = _qwen()
    req = {
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": "Let me check."},
            {"role": "user", "content": "and in Rome?"},
        ],
        "tools": [WEATHER_TOOL],
    }
    counts = count(model, req, chat_template=template, marginal=True)
    total = len(model.encode(req, chat_template=template)["input_ids"][0])
    for p in counts.parts:
        if p.part == TEMPLATE:
            assert p.marginal is None and p.marginal_note
            continue
        if p.part == GENERATION_PROMPT:
            smaller = model.encode(req, chat_template=template, add_generation_prompt=False)
        else:
            smaller = model.encode(without(req, p.part), chat_template=template)
        assert p.marginal == total - len(smaller["input_ids"][0]), p.part


def test_a_part_whose_removal_breaks_the_request_has_no_marginal_and_says_why() -> None:
    model, template = _qwen()
    req = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "22C"},
        ],
        "tools": [WEATHER_TOOL],
    }
    counts = count(model, req, chat_template=template, marginal=True)
    (call,) = [p for p in counts.parts if p.part == "messages[1]"]
    assert call.marginal is None and "c1" in (call.marginal_note or "")
    assert counts.tokens("messages[1]") > 0  # the tool call's name and arguments are the message's


def test_anthropic_system_is_its_own_part() -> None:
    model, template = _qwen()
    req = {
        "model": "x",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "Answer in French."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]}],
    }
    counts = count(model, req, chat_template=template, marginal=True)
    names = [p.part for p in counts.parts]
    assert names == [TEMPLATE, "system", "messages[0]", GENERATION_PROMPT]
    assert counts.tokens("system") == len(model.tokenizer.encode("Answer in French."))


def test_unseen_parts_are_named() -> None:
    model, template = _qwen()
    req = {
        "messages": [{"role": "user", "content": "Summarize the notes.", "name": "alice"}],
        "documents": [{"title": "notes", "text": "The meeting moved to Tuesday."}],
    }
    counts = count(model, req, chat_template=template)
    # Qwen2.5's template writes neither documents nor a message's name.
    assert counts.unseen == ("messages[0].name", "documents[0]")
    assert "documents[0]" not in [p.part for p in counts.parts]
    # a template that writes documents sees them
    rag = ChatTemplate(
        "{% for d in documents %}[{{ d.title }}] {{ d.text }}\n{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
        id="rag",
    )
    counts = count(model, req, chat_template=rag)
    assert counts.unseen == ("messages[0].name",)
    assert counts.tokens("documents[0]") > 0


def test_sentencepiece_dummy_prefix_is_laid_exactly() -> None:
    model = ctxlock.load(str(fetched.gguf_path("llama-spm")))
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}", id="llama-2-style"
    )
    req = {"messages": [{"role": "user", "content": "Hello world, how are you?"}]}
    counts = count(model, req, chat_template=template)
    assert counts.exact_bytes and sum(p.tokens for p in counts.parts) == counts.total


def test_default_model_and_book() -> None:
    for spec in (None, "book"):
        model = ctxlock.load(spec)
        req = {
            "messages": [{"role": "system", "content": "简洁回答"}, {"role": "user", "content": "天空为什么是蓝色？"}]
        }
        counts = count(model, req)
        assert counts.total == len(model.encode(req)["input_ids"][0])
        assert counts.exact_bytes and counts.tokens("messages[1]") > 0
    # the book fixture (seed 000 §1.6): <s><|system|>简洁回答<|end|><|user|>天空为什么是蓝色？<|end|><|assistant|>
    counts = count(ctxlock.load("book"), req)
    assert [(p.part, p.tokens) for p in counts.parts] == [
        (TEMPLATE, 5),
        ("messages[0]", 1),
        ("messages[1]", 5),
        (GENERATION_PROMPT, 1),
    ]


def test_assign_owners_majority_and_ties() -> None:
    owner = np.array([0, 0, 1, 1, 1, 2, 2, 0], dtype=np.int32)
    starts = np.array([0, 1, 3, 4, 6, 7])
    ends = np.array([1, 4, 4, 6, 7, 8])
    # [0,1) all 0; [1,4) 0,1,1 -> 1; [3,4) 1; [4,6) 1,2 tie -> 1 (first met); [6,7) 2; [7,8) 0
    assert assign_owners(owner, starts, ends).tolist() == [0, 1, 1, 1, 2, 0]


def test_part_of_paths() -> None:
    assert part_of("messages[3].content[0].text") == "messages[3]"
    assert part_of("tools[0].function.parameters.properties.city.type") == "tools[0]"
    assert part_of("system[0].text") == "system"
    assert part_of("documents[2].text") == "documents[2]"


def test_count_formats() -> None:
    counts = count(ctxlock.load("book"), {"messages": [{"role": "user", "content": "天空"}]})
    assert count_format(counts, "anthropic") == {"input_tokens": counts.total}
    assert count_format(counts, "openai") == {"object": "response.input_tokens", "input_tokens": counts.total}
    with pytest.raises(CtxlockError):
        count_format(counts, "gemini")


def test_cli_count(tmp_path: Path) -> None:
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"messages": [{"role": "user", "content": "天空为什么是蓝色？"}]}, ensure_ascii=False))
    n = len(ctxlock.load("book").encode(req.read_bytes())["input_ids"][0])
    runner = CliRunner()
    # The provider's shape holds the model's count, labelled as the model's (never bare: the provider's own count
    # is not known; docs/closed-providers.md).
    book = ctxlock.load("book")
    by = {"model": book.id, "tokenizer": book.tokenizer.id, "template": "the model's own"}
    for provider, name, head in (
        ("anthropic", "Anthropic", {}),
        ("openai", "OpenAI", {"object": "response.input_tokens"}),
    ):
        out = runner.invoke(app, ["count", str(req), "--model", "book", "--format", provider])
        assert out.exit_code == 0, out.output
        assert json.loads(out.output) == head | {
            "input_tokens": n,
            "exact": False,
            "counted_by": by,
            "note": f"{book.id}'s input under its own template and tokenizer, not {name}'s count (its tokenizer "
            "is not public)",
        }
    out = runner.invoke(app, ["count", str(req), "--model", "book", "--json", "--marginal"])
    data = json.loads(out.output)
    assert data["total"] == n and sum(p["tokens"] for p in data["parts"]) == n
    assert {p["part"] for p in data["parts"]} == {TEMPLATE, "messages[0]", GENERATION_PROMPT}
    assert [p["marginal"] for p in data["parts"] if p["part"] == GENERATION_PROMPT] == [1]
    out = runner.invoke(app, ["count", str(req), "--model", "book"])
    assert out.exit_code == 0 and "messages[0]" in out.output and f"{n} tokens" in out.output
    out = runner.invoke(app, ["count", str(req), "--model", "book", "--format", "gemini"])
    assert out.exit_code != 0 and json.loads(out.output)["error"]["path"] == "--format"


def test_render_and_fit_name_unseen_parts(tmp_path: Path) -> None:
    """The default model's template ignores `documents`: render (human view and --json) and fit (--json) say so,
    and a record keeps it among its warnings."""
    req = tmp_path / "req.json"
    req.write_text(
        json.dumps(
            {
                "messages": [{"role": "user", "content": "What do my notes say?"}],
                "documents": [{"title": "notes", "text": "The meeting moved to Tuesday."}],
            }
        )
    )
    runner = CliRunner()
    out = runner.invoke(app, ["render", str(req)])
    assert out.exit_code == 0, out.output
    assert "the template wrote no byte of documents[0]: the model never sees it" in out.output
    data = json.loads(runner.invoke(app, ["render", str(req), "--json"]).output)
    assert {"kind": "unseen", "path": "documents[0]"}.items() <= next(
        w for w in data["warnings"] if w["kind"] == "unseen"
    ).items()
    fit = json.loads(runner.invoke(app, ["fit", str(req), "--max-input-tokens", "4000", "--json"]).output)
    assert fit["unseen"] == ["documents[0]"]
    store = tmp_path / "store"
    out = runner.invoke(app, ["render", str(req), "--record", "--store", str(store), "--json"])
    rid = json.loads(out.output)["record_id"]
    shown = json.loads(runner.invoke(app, ["records", "show", rid, "--store", str(store)]).output)
    assert any(w.get("kind") == "unseen" and w.get("path") == "documents[0]" for w in shown["warnings"])
