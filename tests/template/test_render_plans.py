"""The render stage's per-row speed-ups (issue 21, `ctxlock batch` speed) give what the plain code gives.

- `template.render` takes what depends only on the template set, the options, the special tokens, the control
  tokens and whether the request has tools from a plan made once per such key (`_plan`); the reference path
  (`CTXLOCK_FAST=0`) makes the plan anew for every render. The `Rendered` values (every field, and the very template
  object given) and the errors (type, message, path, hint) must be equal on generated requests and options, over
  several real templates, with plans kept from one example to the next (so a plan made for other options is there).
- `template_inputs.template_message` builds a message with a role and a string content only directly: the same dict,
  strings and spans as `convert_message` (the general conversion) on generated messages of every shape and dialect.
- `LimitedEnvironment.getitem` answers a dict's or a list's item without the sandbox's fallback: what the plain
  override (the sandbox's getitem, then its checks; kept here) gives, on generated objects and keys.
- `render_limited(template_globals=...)` builds the jinja context from the template's globals as a dict: the text,
  spans, draws and generation spans, or the error with its template line, of `compiled.generate(**context)`.
- `Tainted.__radd__` shifts one span without a comprehension; `input_chars` counts a dict's and list's strings in
  place and a Python function as nothing: the general formulas and the plain walk.
- `strftime_now_of` takes the naive wall time at each call: what the one taken per render gave. `_alarm_free` reads
  SIGALRM's handler with `_signal.getsignal`: the verdict `signal.getsignal` gave, for every kind of handler.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import threading
from collections.abc import Mapping
from functools import cache
from typing import Any

import jinja2
import jinja2.sandbox
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_render_speedups import plain_input_chars

import ctxlock
import fetched
from ctxlock.errors import CtxlockError
from ctxlock.request import parse_request
from ctxlock.request._values import NO_ORIGINS
from ctxlock.settings import fast_path, reference_path
from ctxlock.template import _taint as taint
from ctxlock.template._inputs import convert_message, strftime_now_of, template_message
from ctxlock.template._options import RenderOptions
from ctxlock.template._render import ChatTemplate, TemplateSet, render
from ctxlock.template._taint import Tainted
from ctxlock.template.sandbox._env import (
    DEFAULT_LIMITS,
    compile_source,
    new_environment,
    render_limited,
    template_globals,
    template_line,
    where,
)
from ctxlock.template.sandbox._limits import _alarm_free, current_state, input_chars
from hypothesis_profiles import examples

pytestmark = pytest.mark.fast_path  # about the fast paths themselves: on even under CTXLOCK_FAST=0

NOW = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.timezone(dt.timedelta(hours=9)))


def _deep(value: Any) -> Any:
    """The value with every node's type, and every Tainted string's spans, beside it (== alone ignores both)."""
    if type(value) is Tainted:
        return ("Tainted", str.__str__(value), value.spans)
    if isinstance(value, Mapping):
        return (type(value).__name__, [(_deep(k), _deep(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_deep(v) for v in value])
    return (type(value).__name__, repr(value))


# ------------------------------------------------------------------------------------------------ requests

TEXTS = st.sampled_from(
    ["", "hi", "Why is the sky blue?", " padded ", "日本語 текст 🙂", "<|im_end|>", "a<|im_start|>b", "[INST]", "\n"]
)
ROLES = st.sampled_from(["user", "assistant", "system"])


@st.composite
def openai_messages(draw: Any) -> dict[str, Any]:
    role = draw(ROLES)
    m: dict[str, Any] = {"role": role}
    shape = draw(st.sampled_from(["text", "text", "parts", "name", "reasoning", "tool_calls", "tool"]))
    if shape == "parts":
        m["content"] = [{"type": "text", "text": draw(TEXTS)} for _ in range(draw(st.integers(1, 3)))]
    elif shape == "tool":
        m = {"role": "tool", "content": draw(TEXTS), "tool_call_id": "call_1"}
    elif shape == "tool_calls":
        m = {
            "role": "assistant",
            "content": draw(st.sampled_from([None, "", "calling"])),
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search", "arguments": json.dumps({"q": draw(TEXTS)})},
                }
            ],
        }
    else:
        m["content"] = draw(TEXTS)
        if shape == "name":
            m["name"] = "bob"
        elif shape == "reasoning" and role == "assistant":
            m["reasoning_content"] = draw(TEXTS)
    return m


@st.composite
def anthropic_requests(draw: Any) -> dict[str, Any]:
    msgs = []
    for k in range(draw(st.integers(1, 3))):
        role = "user" if k % 2 == 0 else "assistant"
        if draw(st.booleans()):
            msgs.append({"role": role, "content": draw(TEXTS) or "x"})
        else:
            msgs.append({"role": role, "content": [{"type": "text", "text": draw(TEXTS) or "x"}]})
    out: dict[str, Any] = {"model": "m", "max_tokens": 5, "messages": msgs}
    if draw(st.booleans()):
        out["system"] = draw(st.sampled_from(["be brief", [{"type": "text", "text": "be brief"}]]))
    return out


def _parsed(data: dict[str, Any], dialect: str | None = None) -> Any:
    try:
        return parse_request(data, dialect=dialect)
    except CtxlockError:
        return None


@settings(max_examples=examples(300), deadline=None)
@given(msgs=st.lists(openai_messages(), min_size=1, max_size=4), anthropic=anthropic_requests(), which=st.booleans())
def test_template_message_equals_the_general_conversion(msgs: list, anthropic: dict, which: bool) -> None:
    request = _parsed(anthropic, "anthropic") if which else _parsed({"messages": msgs})
    if request is None:
        return
    for m in request.messages:
        general = _deep(convert_message(m, m.source))
        assert _deep(template_message.__wrapped__(m, m.source)) == general
        # The memo is keyed on origins as its callers pass them: a one-block Anthropic system and a string system
        # are equal messages at other paths (`system[0].text`, `system`).
        key = None if m.origins is NO_ORIGINS else m.origins
        assert _deep(template_message(m, m.source, key)) == general


def test_a_plain_message_is_the_general_conversion() -> None:
    request = parse_request({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]})
    first, second = request.messages
    assert _deep(template_message.__wrapped__(first, first.source)) == (
        "dict",
        [
            (("str", "'role'"), ("str", "'user'")),
            (("str", "'content'"), ("Tainted", "hi", ((0, 2, "messages[0].content", ""),))),
        ],
    )
    assert _deep(template_message.__wrapped__(second, second.source)) == _deep(convert_message(second, second.source))


# ------------------------------------------------------------------------------------------------ renders


@cache
def _qwen2() -> Any:
    return ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))


@cache
def _template(name: str) -> ChatTemplate:
    return ChatTemplate((fetched.templates_dir() / name).read_text("utf-8"), id=name)


TEMPLATE_NAMES = [
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "openai-gpt-oss-120b.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
]
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]


@st.composite
def render_cases(draw: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    msgs = draw(st.lists(openai_messages(), min_size=1, max_size=4))
    data: dict[str, Any] = {"messages": msgs}
    if draw(st.integers(0, 4)) == 0:
        data["tools"] = TOOLS
    if draw(st.integers(0, 4)) == 0:
        data["chat_template_kwargs"] = {"enable_thinking": draw(st.booleans()), "custom": draw(TEXTS)}
    options: dict[str, Any] = {"now": NOW}
    options["add_generation_prompt"] = draw(st.sampled_from([None, True, False]))
    options["continue_final_message"] = draw(st.sampled_from([False, False, True]))
    options["seed"] = draw(st.sampled_from([None, 0, 7, -1]))
    options["content_format"] = draw(st.sampled_from(["auto", "auto", "string", "openai", "bogus"]))
    options["injection"] = draw(st.sampled_from(["text", "text", "keep", "raise"]))
    if draw(st.integers(0, 3)) == 0:
        options["chat_template_kwargs"] = {"enable_thinking": True, "tag": "x"}
    if draw(st.integers(0, 5)) == 0:
        options["tools"] = TOOLS
    templates = draw(st.sampled_from(["model", "set", *TEMPLATE_NAMES]))
    if templates == "set" and draw(st.booleans()):
        options["template"] = draw(st.sampled_from(["default", "tool_use", "nope"]))
    return data, options, templates


def _outcome(call: Any) -> Any:
    try:
        r = call()
    except CtxlockError as exc:
        return ("error", type(exc).__name__, exc.message, exc.path, exc.hint)
    except Exception as exc:  # TypeError / ValueError from bad option values: the same either way
        return ("raised", type(exc).__name__, str(exc))
    return ("ok", r, id(r.template))


def _both(call: Any) -> tuple[Any, Any, Any]:
    with fast_path():
        first, second = _outcome(call), _outcome(call)  # the second render takes the plan the first one made
    with reference_path():
        reference = _outcome(call)
    return first, second, reference


_SET = TemplateSet(
    (_template("Qwen-Qwen2.5-7B-Instruct.jinja"), _template("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")),
    ("default", "tool_use"),
)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=render_cases())
def test_renders_with_a_plan_equal_the_reference_path(case: tuple) -> None:
    data, options, which = case
    request = _parsed(data)
    event("parsed" if request is not None else "not parsed")
    if request is None:
        return
    qwen = _qwen2()
    special, control = qwen.artifacts.special_tokens, qwen.tokenizer.control_tokens
    try:
        opts = RenderOptions.from_kwargs(options)
    except CtxlockError:
        return
    if which == "model":
        call = lambda: qwen.render(request, opts)  # noqa: E731
    else:
        templates = _SET if which == "set" else _template(which)
        call = lambda: render(request, templates, opts, special_tokens=special, control_tokens=control)  # noqa: E731
    first, second, reference = _both(call)
    event(f"{reference[0]} {reference[1] if reference[0] != 'ok' else ''}")
    assert first == reference
    assert second == reference


def test_a_plan_is_kept_per_options_and_per_template_object() -> None:
    qwen = _qwen2()
    request = parse_request({"messages": [{"role": "user", "content": "hi"}]})
    source = _template("Qwen-Qwen2.5-7B-Instruct.jinja")
    twin = ChatTemplate(source.source, id=source.id)  # equal, another object
    with fast_path():
        a = qwen.render(request, chat_template=source, add_generation_prompt=True, now=NOW)
        b = qwen.render(request, chat_template=twin, add_generation_prompt=True, now=NOW)
        c = qwen.render(request, chat_template=twin, add_generation_prompt=False, now=NOW)
    assert a.template is source and b.template is twin and c.template is twin
    assert a == b and a.text.endswith("<|im_start|>assistant\n") and not c.text.endswith("assistant\n")
    assert c.variables["add_generation_prompt"] is False and a.variables["add_generation_prompt"] is True
    # The special tokens are part of the key: other values give other variables.
    with fast_path():
        d = render(request, twin, RenderOptions(now=NOW), special_tokens={"bos_token": "<B>"})
        e = render(request, twin, RenderOptions(now=NOW), special_tokens={"bos_token": "<C>"})
    assert d.variables["bos_token"] == "<B>" and e.variables["bos_token"] == "<C>"


def test_a_template_that_does_not_compile_fails_at_every_render_after_the_request_checks() -> None:
    bad = ChatTemplate("{% for m in messages %}{{ m['content'] }", id="bad")
    ok = parse_request({"messages": [{"role": "user", "content": "hi"}]})
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "a document"}}
    # A document for a template without `documents`: the request's DocumentError comes first, as before.
    with_doc = parse_request(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [doc]}]}, dialect="anthropic"
    )
    kinds = []
    for request in (ok, with_doc, ok):
        first, second, reference = _both(lambda r=request: render(r, bad, RenderOptions(now=NOW)))
        assert first == second == reference
        kinds.append(reference[1])
    assert kinds == ["TemplateSyntaxError", "DocumentError", "TemplateSyntaxError"]


# ------------------------------------------------------------------------------------------------ getitem


def _plain_getitem(env: Any, obj: Any, argument: Any) -> Any:
    """`LimitedEnvironment.getitem` as it was before the dict/list shortcut: the oracle."""
    out = jinja2.sandbox.SandboxedEnvironment.getitem(env, obj, argument)
    if (
        type(out) is jinja2.Undefined
        and isinstance(argument, str)
        and argument.startswith("_")
        and not isinstance(obj, (dict, list, tuple))
    ):
        return env.unsafe_undefined(obj, argument)
    if isinstance(argument, slice) and isinstance(out, (str, list, tuple)):
        current_state().charge(len(out), "a slice")
    return out


def _seen(call: Any, identity: bool = True) -> Any:
    """What a call gave: its error, its Undefined (kind, name, object, hint), or its value (and, with `identity`,
    which object)."""
    try:
        out = call()
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))
    if isinstance(out, jinja2.Undefined):
        return ("undefined", type(out).__name__, out._undefined_name, id(out._undefined_obj), out._undefined_hint)
    return ("value", id(out) if identity else None, _deep(out))


KEYS = st.one_of(
    st.sampled_from(["role", "content", "_private", "__class__", "items", "missing", ""]),
    st.sampled_from(["role", "_x"]).map(lambda s: Tainted(s, ((0, len(s), "p", ""),))),
    st.integers(-4, 4),
    st.builds(slice, st.sampled_from([None, 0, 1, -1]), st.sampled_from([None, 2, -1])),
    st.sampled_from([None, 1.0, True, (1,), "0"]),
    st.just([1]),  # unhashable
)
OBJECTS = st.one_of(
    st.dictionaries(st.sampled_from(["role", "content", "_private", 0, 1, True]), TEXTS, max_size=4),
    st.lists(TEXTS, max_size=4),
    st.lists(TEXTS, max_size=4).map(tuple),
    TEXTS,
    TEXTS.map(lambda s: Tainted(s, ((0, len(s), "p", ""),)) if s else s),
    st.just(jinja2.utils.Namespace(a=1)),
    st.none(),
)


def _stored(obj: Any, key: Any) -> bool:
    if isinstance(obj, dict):
        return isinstance(key, str | int) and key in obj
    if isinstance(obj, list | tuple):
        return isinstance(key, int) and not isinstance(key, bool) and -len(obj) <= key < len(obj)
    return False


@settings(max_examples=examples(500), deadline=None)
@given(obj=OBJECTS, key=KEYS)
def test_getitem_equals_the_plain_override(obj: Any, key: Any) -> None:
    env = new_environment()
    # Which object came back, for a stored item (a slice, or a string's character, is a new object every time).
    # Only a stored item: an attribute (`{}.items`) is a new bound method each time, whose id may or may not repeat.
    item = _stored(obj, key)
    assert _seen(lambda: env.getitem(obj, key), item) == _seen(lambda: _plain_getitem(env, obj, key), item)


# ------------------------------------------------------------------------------------------------ generate

SOURCES = [
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}",
    "{{ bos_token }}{% for m in messages %}{% generation %}{{ m.content | upper }}{% endgeneration %}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
    "{{ range(3) | list }}{{ dict(a=1) }}",
    "{{ messages | random }}{{ lipsum(1) | length }}",
    "{% macro f(x) %}[{{ x }}]{% endmacro %}{% for m in messages %}{{ f(m['content']) }}{% endfor %}",
    "{{ raise_exception('no ' ~ messages[0]['role']) }}",
    "{{ messages[0]['content'].__class__ }}",
    "line one\n{{ undefined_thing.attr.deeper }}",
    "{{ messages[9]['role'] }}",
    "{% for m in messages %}{{ m['content'][::-1] }}{{ loop.index }}{% endfor %}{{ strftime_now('%Y') }}",
    "{{ messages | tojson }}{{ (messages | map(attribute='content') | list)[0] }}",
    "{% block head %}[{{ messages[0]['role'] }}]{% endblock %}{{ self.head() }}{{ cycler('a', 'b').next() }}",
    "{% set j = joiner('|') %}{% for m in messages %}{{ j() }}{{ m['role'] }}{% endfor %}{{ bos_token is defined }}",
]


@settings(max_examples=examples(400), deadline=None)
@given(source=st.sampled_from(SOURCES), msgs=st.lists(openai_messages(), min_size=1, max_size=3))
def test_render_limited_with_the_globals_as_a_dict_equals_generate(source: str, msgs: list) -> None:
    request = _parsed({"messages": [m for m in msgs if isinstance(m.get("content"), str) and "tool" not in m]})
    if request is None or not request.messages:
        return
    compiled = compile_source(source, DEFAULT_LIMITS)
    messages = [template_message(m, m.source) for m in request.messages]
    context = {"bos_token": "<s>", "messages": messages, "strftime_now": lambda fmt: NOW.strftime(fmt)}
    checker = taint.Checker(lambda s: "<|im_end|>" in s, where)

    def run(names: Any) -> Any:
        draws: list = []
        gen: list = []
        try:
            text, spans = render_limited(
                compiled,
                dict(context),
                DEFAULT_LIMITS,
                checker,
                seed=3,
                draws=draws,
                generation=gen,
                template_globals=names,
            )
        except Exception as exc:
            return ("raised", type(exc).__name__, str(exc), template_line(exc.__traceback__))
        return ("ok", text, spans, draws, gen)

    assert template_globals(compiled) == dict(compiled.globals)
    got = run(template_globals(compiled))
    event(got[0])
    assert got == run(None)


# ------------------------------------------------------------------------------------------------ values

SPANS = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 3), st.sampled_from(["a", "b"]), st.sampled_from(["", "n"])),
    min_size=1,
    max_size=3,
)


@settings(max_examples=examples(300), deadline=None)
@given(prefix=st.text(max_size=5), body=st.text(min_size=1, max_size=8), raw=SPANS)
def test_a_plain_prefix_shifts_every_span(prefix: str, body: str, raw: list) -> None:
    spans = []
    pos = 0
    for gap, width, path, note in raw:
        start = min(pos + gap, len(body))
        end = min(start + width, len(body))
        spans.append((start, end, path, note))
        pos = end
    tainted = taint._tainted(body, tuple(spans))
    out = prefix + tainted
    n = len(prefix)
    assert type(out) is Tainted and str.__str__(out) == prefix + body
    assert out.spans == tuple((s + n, e + n, p, k) for s, e, p, k in spans)
    assert vars(out) == {"spans": out.spans}


def _function() -> None:
    return None


LEAVES = st.one_of(
    TEXTS,
    TEXTS.map(lambda s: Tainted(s, ((0, len(s), "p", ""),))),
    st.just(_function),
    st.just(lambda x: x),
    st.none(),
    st.integers(),
    st.booleans(),
)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.recursive(
        LEAVES,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=4).map(tuple),
            st.dictionaries(st.one_of(TEXTS, st.integers(), st.tuples(TEXTS)), children, max_size=4),
            st.frozensets(TEXTS, max_size=3),
        ),
        max_leaves=25,
    )
)
def test_input_chars_counts_functions_as_nothing(value: Any) -> None:
    assert input_chars(value) == plain_input_chars(value)


@settings(max_examples=examples(200), deadline=None)
@given(
    clock=st.datetimes(timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=-5, minutes=-30))])),
    formats=st.lists(st.sampled_from(["%Y-%m-%d", "%d %b %Y", "%H:%M:%S %z%Z", "%A", "%%", ""]), max_size=3),
)
def test_strftime_now_formats_the_wall_time_and_lists_the_formats(clock: dt.datetime, formats: list) -> None:
    strftime_now, calls = strftime_now_of(clock)
    wall = clock.replace(tzinfo=None)  # as it was: the naive wall time, made once per render
    assert [str(strftime_now(f)) for f in formats] == [wall.strftime(f) for f in formats]
    assert calls == formats


def test_the_alarm_check_reads_the_handler_as_signal_getsignal_does() -> None:
    def plain() -> bool:
        return (
            hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN)
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        )

    previous = signal.getsignal(signal.SIGALRM)
    seen = []
    try:
        for handler in (signal.SIG_DFL, signal.SIG_IGN, lambda *_: None, signal.SIG_DFL):
            signal.signal(signal.SIGALRM, handler)
            seen.append((_alarm_free(), plain()))
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert seen == [(True, True), (True, True), (False, False), (True, True)]
    worker: list = []
    thread = threading.Thread(target=lambda: worker.append((_alarm_free(), plain())))
    thread.start()
    thread.join()
    assert worker == [(False, False)]
