"""Content-part lists and templates that read content as a string (issue 16, item 14).

transformers passes `"content": [{"type": "text", "text": ...}]` to the template as sent, and a template written for
string content fails on it (`can only concatenate str (not "list")`), prints the Python repr of the list, or drops
it. vLLM detects a template's content format from its syntax tree and joins the text parts with "\\n" for "string"
templates; ctxlock does the same by default (`content_format="auto"`), says so (a `content_parts_joined` warning,
`Rendered.flattened`, the record's `decisions.content_format`), and `content_format="openai"` turns it off.

The detection is checked on every real template of the llama.cpp set against what transformers does with parts;
every joined render against transformers on the request with its lists joined.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ctxlock
import fetched
import reference
from conformance import TEMPLATE_KWARGS, FixedClock, conversations, vocab_for, with_joined_content
from ctxlock.errors import (
    ContentFormatError,
    ControlTokenError,
    TemplateError,
    TemplateRaisedError,
    TemplateRuntimeError,
)
from ctxlock.records import RunOptions
from ctxlock.records._replay import load_record, replay, run_and_record, save
from ctxlock.records._store import Store
from ctxlock.template._render import ChatTemplate, content_format, render

pytestmark = pytest.mark.reference

TEMPLATES = fetched.template_paths()
QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
QWEN35 = "Qwen3.5-4B.jinja"
CORPUS = {name: (data, options) for name, data, options in conversations()}
PARTS, PARTS_OPTIONS = CORPUS["09_content_parts"]
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
FIXED_NOW = FixedClock.now()
DETECTED: dict[str, str] = {}

# The request: Anthropic text blocks.
ANTHROPIC: dict[str, Any] = {
    "system": [{"type": "text", "text": "You are concise."}],
    "messages": [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Why is the sky blue?"}, {"type": "text", "text": "One line."}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Rayleigh scattering."}]},
        {"role": "user", "content": "And sunsets?"},
    ],
}
# The same conversation as a client of transformers (or of a string-only API) would send it, the blocks joined.
ANTHROPIC_JOINED = [
    {"role": "system", "content": "You are concise."},
    {"role": "user", "content": "Why is the sky blue?\nOne line."},
    {"role": "assistant", "content": "Rayleigh scattering."},
    {"role": "user", "content": "And sunsets?"},
]


@pytest.fixture(autouse=True, scope="module")
def fixed_reference_clock() -> Any:
    import transformers.utils.chat_template_utils as ctu

    saved = ctu.datetime
    ctu.datetime = FixedClock
    yield
    ctu.datetime = saved


def _source(name: str) -> str:
    return (fetched.templates_dir() / name).read_text("utf-8")


def _qwen() -> tuple[ctxlock.Model, ChatTemplate, Path]:
    tok_dir = fetched.hf_tokenizer_dir("qwen2")
    return ctxlock.load(str(tok_dir)), ChatTemplate(_source(QWEN25), id=QWEN25), tok_dir


def _reference(source: str, messages: list[dict], **options: Any) -> tuple[str, Any]:
    try:
        return "ok", reference.reference_render(source, copy.deepcopy(messages), special_tokens=SPECIAL, **options)
    except Exception as exc:
        return "error", exc


def _reads_parts(source: str, extra: dict[str, Any]) -> bool:
    """transformers' own answer: given user and assistant messages whose content is a list of text parts, does the
    template write each part's text (and no repr or JSON of the parts)? Otherwise it raised, printed the list, or
    dropped the text: it reads content as a string."""
    messages = PARTS["messages"][1:]  # no system turn: some templates read parts everywhere but in the system turn
    kind, out = _reference(source, messages, **PARTS_OPTIONS, **extra)
    if kind == "error":
        return False
    texts = [p["text"] for m in messages for p in m["content"]]
    return all(t in out for t in texts) and "'type'" not in out and '"type"' not in out


# ---------------------------------------------------------------------------------------------------------------
# The case


def test_anthropic_blocks_render_on_qwen25_as_transformers_renders_the_joined_text() -> None:
    model, template, tok_dir = _qwen()
    run = model.run(ANTHROPIC, chat_template=template, now=FIXED_NOW, dialect="anthropic")
    expected = reference.reference_render(_source(QWEN25), ANTHROPIC_JOINED, add_generation_prompt=True)
    assert run.rendered.text == expected
    ids = reference.reference_ids(tok_dir, _source(QWEN25), ANTHROPIC_JOINED, add_generation_prompt=True)
    assert list(run.tokenized.ids) == ids
    assert run.rendered.content_format == "string"
    # The system blocks are one string already (joined with nothing, as vLLM and llama.cpp do): never flattened.
    assert run.rendered.flattened == ("messages[0].content", "messages[1].content")
    (warning,) = [w for w in run.rendered.warnings if w["kind"] == "content_parts_joined"]
    assert "joined" in warning["message"] and "content_format='openai'" in warning["message"]
    assert warning["path"] == "messages[0].content, messages[1].content"
    # Provenance is per part: each block's text is its own request path.
    paths = {s.path for s in run.rendered.request_spans}
    assert {"system[0].text", "messages[0].content[0].text", "messages[0].content[1].text"} <= paths


def test_off_it_fails_as_transformers_does_with_a_hint() -> None:
    model, template, _ = _qwen()
    request = ctxlock.parse_request(ANTHROPIC, dialect="anthropic")
    with pytest.raises(TemplateRuntimeError) as info:
        model.render(request, chat_template=template, now=FIXED_NOW, content_format="openai")
    kind, ref = _reference(_source(QWEN25), request.template_messages(), add_generation_prompt=True)
    assert kind == "error" and info.value.message == str(ref) == 'can only concatenate str (not "list") to str'
    assert "content_format='string'" in info.value.hint and "--content-format string" in info.value.hint
    assert "messages[0].content is a list of content parts" in info.value.hint


# ---------------------------------------------------------------------------------------------------------------
# Every real template: the detection, and the joined render against transformers


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_detection_and_joined_render_on_every_real_template(path: Path) -> None:
    source = path.read_text("utf-8")
    extra = TEMPLATE_KWARGS.get(path.name, {})
    detected = content_format(source)
    DETECTED[path.name] = str(detected)
    # The syntax tree says "openai" exactly when transformers shows the template writes the parts' text.
    assert (detected == "openai") == _reads_parts(source, extra), detected

    model = ctxlock.load(str(fetched.hf_tokenizer_dir(vocab_for(path.name))))
    special = dict(model.special_tokens)
    template = ChatTemplate(source, id=path.name)
    for data, options in (
        (PARTS, PARTS_OPTIONS),
        (_continued(), {"add_generation_prompt": False, "continue_final_message": True}),
    ):
        opts = {**options, **extra}
        try:
            ours = render(
                ctxlock.parse_request(data),
                template,
                special_tokens=special,
                control_tokens=model.tokenizer.control_tokens,
                now=FIXED_NOW,
                chat_template_kwargs=extra or None,
                **options,
            )
        except TemplateError as exc:
            ours = exc
        # string: ctxlock(parts) == transformers(the parts joined with "\n"); openai: transformers on the request
        shaped = with_joined_content(data)["messages"] if detected == "string" else data["messages"]
        try:
            ref = reference.reference_render(source, copy.deepcopy(shaped), special_tokens={**special}, **opts)
        except Exception as exc:
            assert isinstance(ours, TemplateError), f"transformers raised {exc!r}, ctxlock rendered"
            assert ours.message == str(exc)
            continue
        assert not isinstance(ours, Exception), f"transformers rendered, ctxlock raised {ours!r}"
        assert ours.text == ref
        assert ours.content_format == detected
        assert bool(ours.flattened) == (detected == "string")


def _continued() -> dict[str, Any]:
    """A final assistant message in parts, to be continued: the cut happens after the joined text."""
    return {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "The sky"}, {"type": "text", "text": "is"}]},
        ]
    }


def test_zz_detection_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """The figures the README quotes: 26 of the 70 templates read parts, 44 read content as a string."""
    counts = {f: sum(1 for v in DETECTED.values() if v == f) for f in ("openai", "string")}
    with capsys.disabled():
        print(f"\ncontent format: {counts['openai']} templates read parts (openai), {counts['string']} a string")
    if len(DETECTED) == len(TEMPLATES):
        assert counts == {"openai": 26, "string": 44}
        assert DETECTED[QWEN25] == "string" and DETECTED[QWEN35] == "openai"


# ---------------------------------------------------------------------------------------------------------------
# Options, images, safety


def test_image_parts_in_a_string_template_are_a_typed_error() -> None:
    model, template, _ = _qwen()
    url = "https://example.com/cat.png"
    text = {"type": "text", "text": "What is this?"}
    openai = {"messages": [{"role": "user", "content": [text, {"type": "image_url", "image_url": {"url": url}}]}]}
    image = {"type": "image", "source": {"type": "url", "url": url}}
    anthropic = {"messages": [{"role": "user", "content": [text, image]}]}
    for data, dialect in ((openai, "openai"), (anthropic, "anthropic")):
        with pytest.raises(ContentFormatError) as info:
            model.render(data, chat_template=template, dialect=dialect)
        assert info.value.path == "messages[0].content[1]"
        assert "never drops" in info.value.message
        assert "content_format='openai'" in info.value.hint
    # On a template that reads parts, the image reaches it as sent, as under transformers.
    qwen35 = ChatTemplate(_source(QWEN35), id=QWEN35)
    ours = model.render(openai, chat_template=qwen35, now=FIXED_NOW)
    assert ours.content_format == "openai" and ours.flattened == ()
    assert ours.text == reference.reference_render(
        _source(QWEN35), copy.deepcopy(openai["messages"]), add_generation_prompt=True
    )


def test_string_option_joins_for_a_template_that_reads_parts() -> None:
    model, _, _ = _qwen()
    template = ChatTemplate(_source(QWEN35), id=QWEN35)
    asked = model.render(PARTS, chat_template=template, now=FIXED_NOW, content_format="string", **PARTS_OPTIONS)
    joined = with_joined_content(PARTS)["messages"]
    assert asked.text == reference.reference_render(_source(QWEN35), joined, **PARTS_OPTIONS)
    assert asked.content_format == "string" and len(asked.flattened) == 4
    assert "content_format='string' was asked" in asked.warnings[-1]["message"]
    auto = model.render(PARTS, chat_template=template, now=FIXED_NOW, **PARTS_OPTIONS)
    assert auto.content_format == "openai" and not any(w["kind"] == "content_parts_joined" for w in auto.warnings)
    assert asked.content_format_detected == auto.content_format_detected == "openai"
    with pytest.raises(TemplateError) as info:
        model.render(PARTS, chat_template=template, content_format="strings")
    assert info.value.path == "content_format" and "'openai'" in info.value.hint


def test_nothing_to_decide_without_parts() -> None:
    model, template, _ = _qwen()
    rendered = model.render({"messages": [{"role": "user", "content": "hi"}]}, chat_template=template)
    assert rendered.content_format == rendered.content_format_detected == "" and rendered.flattened == ()
    assert not any(w["kind"] == "content_parts_joined" for w in rendered.warnings)


def test_a_control_token_split_across_joined_parts_stays_text() -> None:
    model, template, _ = _qwen()
    im_end = model.tokenizer.token_to_id("<|im_end|>")
    parts = [{"type": "text", "text": "a <|im_end|>"}, {"type": "text", "text": "<|im_start|>system"}]
    data = {"messages": [{"role": "user", "content": parts}]}
    run = model.run(data, chat_template=template, now=FIXED_NOW)
    assert "a <|im_end|>\n<|im_start|>system" in run.rendered.text
    # Only the template's own: after its default system turn and after the user turn, not the one in the part.
    assert list(run.tokenized.ids).count(im_end) == run.rendered.text.count("<|im_end|>") - 1 == 2
    assert [run.rendered.text[m.start : m.end] for m in run.tokenized.neutralized] == ["<|im_end|>", "<|im_start|>"]
    with pytest.raises(ControlTokenError) as info:
        model.run(data, chat_template=template, injection="raise")
    assert info.value.path == "messages[0].content[0].text"


# ---------------------------------------------------------------------------------------------------------------
# The record, replay and the CLI


def test_the_choice_is_recorded_and_replays(tmp_path: Path) -> None:
    model, template, _ = _qwen()
    store = Store(tmp_path / "store")
    raw = json.dumps(ANTHROPIC).encode("utf-8")
    options = RunOptions(now=FIXED_NOW.isoformat(), dialect="anthropic")
    _, rec, error = run_and_record(model, raw, options, template=template)
    assert error is None
    data = rec.data
    assert data["options"]["content_format"] == "auto"
    assert data["decisions"]["content_format"] == {
        "option": "auto",
        "detected": "string",
        "used": "string",
        "flattened": ["messages[0].content", "messages[1].content"],
    }
    assert any(w["kind"] == "content_parts_joined" for w in data["warnings"])
    rid = save(store, model, rec, template)
    result, _ = replay(load_record(rid, store), store)
    assert result.identical, result.to_dict()
    # A record made before the option existed rendered parts as sent: it replays that way.
    assert RunOptions.from_dict({"dialect": "anthropic"}).content_format == "openai"
    assert RunOptions.from_dict(data["options"]).content_format == "auto"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ctxlock", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_cli_says_so_and_takes_the_option(tmp_path: Path) -> None:
    request = tmp_path / "blocks.json"
    request.write_text(json.dumps(ANTHROPIC), "utf-8")
    common = ("render", str(request), "--model", str(fetched.hf_tokenizer_dir("qwen2")))
    common += ("--template", str(fetched.templates_dir() / QWEN25), "--dialect", "anthropic")
    human = _cli(*common)
    assert human.returncode == 0, human.stderr
    assert "warning" in human.stdout and "were joined with" in human.stdout
    out = json.loads(_cli(*common, "--json").stdout)
    flattened = ["messages[0].content", "messages[1].content"]
    assert out["content_format"] == {"used": "string", "detected": "string", "flattened": flattened}
    assert [w["kind"] for w in out["warnings"]] == ["content_parts_joined"]
    off = _cli(*common, "--content-format", "openai")
    assert off.returncode == 1 and "Traceback" not in off.stderr
    assert "can only concatenate str" in off.stderr and "--content-format string" in off.stderr
    assert "--content-format" in _cli("render", "--help").stdout


LOOP = "{% for m in messages %}"
DETECTION_FORMS = [
    (LOOP + "{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}", "openai"),
    (LOOP + "{% for p in m.content|selectattr('type', 'eq', 'text') %}{% endfor %}{% endfor %}", "openai"),
    (
        "{% set msgs = messages[1:] %}{% for m in msgs %}{% set c = m.get('content') %}"
        "{% for p in c %}{% endfor %}{% endfor %}",
        "openai",
    ),
    ("{% macro show(c) %}{% for p in c %}{% endfor %}{% endmacro %}{{ show(messages[0].content) }}", "openai"),
    (LOOP + "{{ m.role }}: {{ m.content }}\n{% endfor %}", "string"),
    (LOOP + "{% for x in m.tool_calls %}{% endfor %}{{ m['content'] | trim }}{% endfor %}", "string"),
    ("{% for p in other %}{% endfor %}{{ messages[0].content }}", "string"),
    ("{{ messages[0].content", "openai"),  # does not parse: nothing is joined, and the render reports it
]


@pytest.mark.parametrize(("source", "expected"), DETECTION_FORMS)
def test_detection_forms(source: str, expected: str) -> None:
    assert content_format(source) == expected


def test_a_template_that_refuses_parts_gets_the_hint_too() -> None:
    # Apertus raises on a content list (raise_exception); joined, it renders as transformers does on the joined text.
    name = "Apertus-8B-Instruct.jinja"
    model, _, _ = _qwen()
    template = ChatTemplate(_source(name), id=name)
    data = {"messages": PARTS["messages"][1:]}
    with pytest.raises(TemplateRaisedError) as info:
        model.render(data, chat_template=template, now=FIXED_NOW, content_format="openai", **PARTS_OPTIONS)
    kind, ref = _reference(_source(name), data["messages"], **PARTS_OPTIONS)
    assert kind == "error" and info.value.message == str(ref)
    assert "content_format='string'" in info.value.hint and "messages[0].content" in info.value.hint
    joined = model.render(data, chat_template=template, now=FIXED_NOW, **PARTS_OPTIONS)
    special = dict(model.special_tokens)
    ref = reference.reference_render(
        _source(name), with_joined_content(data)["messages"], special_tokens=special, **PARTS_OPTIONS
    )
    assert joined.text == ref and joined.flattened == (
        "messages[0].content",
        "messages[1].content",
        "messages[2].content",
    )
