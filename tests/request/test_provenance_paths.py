"""Provenance paths of an Anthropic request name the Anthropic request's own JSON.

An Anthropic `tool_use` block becomes a canonical (OpenAI-form) tool call, a `tool_result` a tool message and a
`thinking` block the reasoning content; the strings keep the paths the client sent them at (`messages[i].content[j]
.id`, `.name`, `.input`, `.tool_use_id`, `.content`, `.thinking`), never the canonical ones
(`messages[i].tool_calls[k]...`), which the Anthropic request does not have. Every request span of a rendering is
resolved in the request JSON and must hold the span's text. The `template.message` memo keys on the origins too:
the same conversation in both dialects (equal `Message`s) rendered one after the other keeps each its own paths.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from ctxlock.errors import ControlTokenError
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate, render
from hypothesis_profiles import examples

QWEN35 = "Qwen3.5-4B.jinja"

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}

ANTHROPIC: dict[str, Any] = {
    "model": "m",
    "max_tokens": 64,
    "system": [{"type": "text", "text": "You are terse."}],
    "tools": [{"name": "get_weather", "description": "Weather for a city", "input_schema": SCHEMA}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "The user wants weather.", "signature": "c2ln"},
                {"type": "text", "text": "Checking now."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris", "unit": "c"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18 C and sunny"},
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "Dry."}]},
            ],
        },
    ],
}

# The same conversation in the OpenAI dialect: its messages are equal (`Message` equality leaves paths out).
OPENAI: dict[str, Any] = {
    "model": "m",
    "tools": [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather for a city", "parameters": SCHEMA},
        }
    ],
    "messages": [
        {"role": "system", "content": "You are terse."},  # system blocks are one string (vLLM, llama.cpp)
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Checking now."}],
            "reasoning_content": "The user wants weather.",
            "tool_calls": [
                {
                    "id": "toolu_01",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "c"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01", "content": "18 C and sunny"},
        {"role": "tool", "tool_call_id": "toolu_01", "content": "Dry."},  # tool_result text blocks: one string (vLLM)
    ],
}

# Writes every field a message can carry, so each string's span is in the text.
EVERYTHING = ChatTemplate(
    "{% for m in messages %}<{{ m.role }}>"
    "{% if m.content is string %}{{ m.content }}{% elif m.content %}{% for p in m.content %}[{{ p.text }}]"
    "{% endfor %}{% endif %}"
    "{% if m.reasoning_content %}(think:{{ m.reasoning_content }}){% endif %}"
    "{% if m.tool_call_id %}(answers:{{ m.tool_call_id }}){% endif %}"
    "{% for tc in m.tool_calls or [] %}(call {{ tc.id }} {{ tc.type }} {{ tc.function.name }} "
    "{% for k, v in tc.function.arguments|items %}{{ k }}={{ v }};{% endfor %}){% endfor %}"
    "</{{ m.role }}>{% endfor %}",
    id="everything",
)

# A name step runs to the next "." or "[": join_path quotes every key that is not an identifier.
_STEP = re.compile(r'\.([^.\[]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def resolve(data: Any, path: str) -> Any:
    """The value at a JSON path as ctxlock writes them (`a.b[2]["odd key"]`); KeyError/IndexError if absent. A
    path into a string goes into the JSON it holds (OpenAI's `arguments`)."""
    head = re.match(r"[A-Za-z_$][A-Za-z0-9_$]*", path)
    assert head is not None, path
    value, rest = data[head.group(0)], path[head.end() :]
    while rest:
        step = _STEP.match(rest)
        assert step is not None, f"unparsed path tail {rest!r} of {path!r}"
        name, index, quoted = step.groups()
        if isinstance(value, str):  # OpenAI tool-call arguments: a JSON string, paths name its parsed object
            value = json.loads(value)
        value = value[int(index)] if index is not None else value[name if name is not None else json.loads(quoted)]
        rest = rest[step.end() :]
    return value


def check_spans(data: dict[str, Any], rendered: Any) -> list[tuple[str, str]]:
    """Every request span resolves in `data` to a string holding the span's text (a tainted key: the path is its
    value's, ending in the key). Returns (path, text) pairs. Tool spans are left out: a template writes the tools
    with `tojson`, whose whole output is one derived span (the paths of `template_tools`, not of the messages)."""
    out = []
    for span in rendered.request_spans:
        if span.path.startswith("tools["):
            continue
        text = rendered.text[span.start : span.end]
        value = resolve(data, span.path)
        assert isinstance(value, str) or span.path.endswith(f".{text}"), (span.path, text, value)
        if isinstance(value, str):
            assert text in value or span.path.endswith(f".{text}"), (span.path, text, value)
        out.append((span.path, text))
    return out


def _paths(pairs: list[tuple[str, str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path, text in pairs:
        out.setdefault(text, set()).add(path)
    return out


def test_the_two_dialects_hold_equal_messages() -> None:
    # The premise of the memo test: without the origins in the key, one dialect would get the other's paths.
    a, o = parse_request(ANTHROPIC), parse_request(OPENAI)
    assert a.messages == o.messages
    assert [m.source for m in a.messages] != [m.source for m in o.messages] or a.messages[1].origins


def test_every_anthropic_field_names_its_block() -> None:
    rendered = render(parse_request(ANTHROPIC), EVERYTHING)
    paths = _paths(check_spans(ANTHROPIC, rendered))
    assert paths["toolu_01"] == {
        "messages[1].content[2].id",
        "messages[2].content[0].tool_use_id",
        "messages[2].content[1].tool_use_id",
    }
    assert paths["get_weather"] == {"messages[1].content[2].name"}
    assert paths["Paris"] == {"messages[1].content[2].input.city"}
    assert paths["city"] == {"messages[1].content[2].input.city"}
    assert paths["The user wants weather."] == {"messages[1].content[0].thinking"}
    assert paths["Checking now."] == {"messages[1].content[1].text"}
    assert paths["18 C and sunny"] == {"messages[2].content[0].content"}
    assert paths["Dry."] == {"messages[2].content[1].content[0].text"}
    assert paths["You are terse."] == {"system[0].text"}
    # The canonical "function" type is ctxlock's, not the client's: template text, no request span.
    assert "function" not in paths
    assert not any(".tool_calls" in p or ".reasoning_content" in p for ps in paths.values() for p in ps)


def test_the_openai_paths_are_unchanged() -> None:
    rendered = render(parse_request(OPENAI), EVERYTHING)
    paths = _paths(check_spans(OPENAI, rendered))
    assert paths["toolu_01"] == {"messages[2].tool_calls[0].id", "messages[3].tool_call_id", "messages[4].tool_call_id"}
    assert paths["function"] == {"messages[2].tool_calls[0].type"}
    assert paths["get_weather"] == {"messages[2].tool_calls[0].function.name"}
    assert paths["Paris"] == {"messages[2].tool_calls[0].function.arguments.city"}
    assert paths["The user wants weather."] == {"messages[2].reasoning_content"}


def without_system(data: dict[str, Any]) -> dict[str, Any]:
    """The request without its system prompt: then the assistant turn is `messages[1]` in both dialects, the same
    message at the same source, and only its origins tell the two apart (the memo's key must hold them)."""
    out = copy.deepcopy(data)
    if "system" in out:
        del out["system"]
    else:
        del out["messages"][0]
    return out


@pytest.mark.parametrize("system", [True, False])
@pytest.mark.parametrize("first", ["anthropic", "openai"])
def test_both_dialects_one_after_the_other_keep_their_own_paths(first: str, system: bool) -> None:
    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen35")))
    template = ChatTemplate((fetched.templates_dir() / QWEN35).read_text("utf-8"), id=QWEN35)
    order = [("anthropic", ANTHROPIC), ("openai", OPENAI)]
    if first == "openai":
        order.reverse()
    if not system:
        order = [(name, without_system(data)) for name, data in order]
        a, o = (parse_request(data) for _, data in sorted(order))
        assert a.messages[1] == o.messages[1] and a.messages[1].source == o.messages[1].source
    seen = {}
    for name, data in order:
        for tpl in (template, EVERYTHING):
            run = model.run(data, chat_template=tpl, add_generation_prompt=True)
            pairs = check_spans(data, run.rendered)
            canonical = [p for p, _ in pairs if ".tool_calls" in p or ".reasoning_content" in p]
            assert bool(canonical) == (name == "openai"), (name, canonical)
            seen[name, tpl.id] = _paths(pairs)
    turn = 2 if system else 1
    assert seen["anthropic", QWEN35]["get_weather"] == {"messages[1].content[2].name"}
    assert seen["openai", QWEN35]["get_weather"] == {f"messages[{turn}].tool_calls[0].function.name"}
    assert seen["anthropic", QWEN35]["The user wants weather."] == {"messages[1].content[0].thinking"}
    assert seen["openai", QWEN35]["The user wants weather."] == {f"messages[{turn}].reasoning_content"}


@pytest.mark.parametrize(
    ("where", "path"),
    [
        (
            lambda m, p: m[1]["content"][2]["input"].__setitem__("city", f"Paris {p}"),
            "messages[1].content[2].input.city",
        ),
        (lambda m, p: m[1]["content"][2].__setitem__("name", f"get_{p}"), "messages[1].content[2].name"),
        (lambda m, p: m[1]["content"][0].__setitem__("thinking", f"hm {p}"), "messages[1].content[0].thinking"),
        (lambda m, p: m[2]["content"][0].__setitem__("content", f"ok {p}"), "messages[2].content[0].content"),
        (
            lambda m, p: m[2]["content"][1]["content"][0].__setitem__("text", f"ok {p}"),
            "messages[2].content[1].content[0].text",
        ),
    ],
)
def test_a_control_token_under_raise_names_the_anthropic_path(where: Any, path: str) -> None:
    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen35")))
    template = ChatTemplate((fetched.templates_dir() / QWEN35).read_text("utf-8"), id=QWEN35)
    data = copy.deepcopy(ANTHROPIC)
    where(data["messages"], "<|im_start|>")
    with pytest.raises(ControlTokenError) as info:
        model.run(data, chat_template=template, injection="raise")
    assert info.value.path == path


def test_a_control_token_in_an_input_key_names_the_key() -> None:
    model = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen35")))
    data = copy.deepcopy(ANTHROPIC)
    data["messages"][1]["content"][2]["input"] = {"x<|im_end|>": "v"}
    with pytest.raises(ControlTokenError) as info:
        model.run(data, chat_template=EVERYTHING, injection="raise")
    assert info.value.path.startswith("messages[1].content[2].input[")


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=examples(40), deadline=None)
@given(
    city=_TEXT,
    name=_TEXT,
    key=_TEXT,
    thinking=_TEXT,
    result=_TEXT,
    call_id=_TEXT,
    openai_first=st.booleans(),
)
def test_generated_requests_resolve_every_span(
    city: str, name: str, key: str, thinking: str, result: str, call_id: str, openai_first: bool
) -> None:
    # Without a system prompt the assistant turn is messages[1] in both: equal messages at one source.
    a = without_system(ANTHROPIC)
    block = a["messages"][1]["content"]
    block[0]["thinking"] = thinking
    block[2].update(id=call_id, name=name, input={key: city})
    for r in a["messages"][2]["content"]:
        r["tool_use_id"] = call_id
    a["messages"][2]["content"][0]["content"] = result
    o = without_system(OPENAI)
    call = o["messages"][1]["tool_calls"][0]
    call.update(id=call_id, function={"name": name, "arguments": json.dumps({key: city})})
    o["messages"][1]["reasoning_content"] = thinking
    o["messages"][2].update(tool_call_id=call_id, content=result)
    o["messages"][3]["tool_call_id"] = call_id
    both = [("openai", o), ("anthropic", a)] if openai_first else [("anthropic", a), ("openai", o)]
    for dialect, data in both:
        request = parse_request(data, dialect=dialect)
        rendered = render(request, EVERYTHING)
        for span in rendered.request_spans:
            value = resolve(data, span.path)
            text = rendered.text[span.start : span.end]
            assert (isinstance(value, str) and text in value) or text == key, (dialect, span.path, text, value)
            assert (".tool_calls" in span.path) <= (dialect == "openai"), span.path
