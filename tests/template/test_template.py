"""Template stage: HF semantics, limits, the sandbox, provenance."""

from __future__ import annotations

from datetime import datetime

import pytest

from ctxlock.errors import (
    ControlTokenError,
    TemplateError,
    TemplateLimitError,
    TemplateNotFoundError,
    TemplateRaisedError,
    TemplateRuntimeError,
    TemplateSecurityError,
    TemplateSyntaxError,
)
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate, RenderLimits, TemplateSet, render
from ctxlock.template.sandbox import _env as sandbox

REQ = parse_request({"messages": [{"role": "user", "content": 'héllo <b>&</b> "q"'}]})


def _render(source: str, req=REQ, **kw) -> str:
    return render(req, ChatTemplate(source, id="t"), **kw).text


def test_tojson_does_not_escape_html_or_unicode() -> None:
    out = _render("{{ messages[0].content | tojson }}")
    assert out == '"héllo <b>&</b> \\"q\\""'


def test_tojson_options_match_json_dumps() -> None:
    out = _render("{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2, sort_keys=True) }}")
    assert out == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}'


def test_trim_and_lstrip_blocks() -> None:
    src = "{% for m in messages %}\n    {% if true %}\n[{{ m.role }}]\n    {% endif %}\n{% endfor %}\n"
    assert _render(src) == "[user]\n"


def test_loopcontrols() -> None:
    assert _render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "012"


def test_raise_exception_keeps_the_message_and_names_the_line() -> None:
    with pytest.raises(TemplateRaisedError) as info:
        _render("ok\n{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}")
    assert info.value.message == "Conversation roles must alternate user/assistant/user/assistant/..."
    assert info.value.path == "t line 2"


def test_strftime_now_reads_the_injected_clock() -> None:
    rendered = render(REQ, ChatTemplate("Today is {{ strftime_now('%d %b %Y') }}.", id="t"), now=datetime(2024, 7, 26))
    assert rendered.text == "Today is 26 Jul 2024."
    assert rendered.clock_used is True
    # A naive clock is local time: recorded with the local offset (issue 15 item 6), the wall time unchanged.
    local = datetime(2024, 7, 26).astimezone().isoformat()
    assert rendered.now == local and datetime.fromisoformat(rendered.now).utcoffset() is not None
    plain = render(REQ, ChatTemplate("x", id="t"), now=datetime(2024, 7, 26))
    assert plain.clock_used is False and plain.now == local


def test_special_token_variables_and_kwargs() -> None:
    out = _render(
        "{{ bos_token }}{{ enable_thinking }}{{ add_generation_prompt }}",
        special_tokens={"bos_token": "<s>"},
        chat_template_kwargs={"enable_thinking": False},
    )
    assert out == "<s>FalseTrue"


def test_request_kwargs_do_not_override_the_caller() -> None:
    req = parse_request({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"mode": "req"}})
    assert _render("{{ mode }}", req) == "req"
    assert _render("{{ mode }}", req, chat_template_kwargs={"mode": "caller"}) == "caller"


def test_none_valued_keys_are_absent_like_transformers() -> None:
    req = parse_request({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    assert _render("{% for m in messages %}{{ m.tool_calls is defined }}{% endfor %}", req) == "FalseFalse"


def test_reasoning_is_aliased_as_thinking() -> None:
    req = parse_request(
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a", "reasoning_content": "r"},
            ]
        }
    )
    out = _render("{% for m in messages %}{{ m.thinking }}|{{ m.reasoning_content }};{% endfor %}", req)
    assert out == "|;r|r;"


def test_generation_tag_renders_its_body() -> None:
    assert _render("{% generation %}body{% endgeneration %}") == "body"


def test_namespace_refuses_underscore_names() -> None:
    with pytest.raises(TemplateSecurityError):
        _render("{% set ns = namespace(_x=1) %}{{ ns._x }}")


def test_dict_templates_select_like_transformers() -> None:
    default = ChatTemplate("default", id="m/default")
    tool_use = ChatTemplate("tool_use", id="m/tool_use")
    both = TemplateSet((default, tool_use), ("default", "tool_use"))
    assert render(REQ, both).text == "default"
    tool_req = parse_request(
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]}
    )
    assert render(tool_req, both).text == "tool_use"
    assert render(tool_req, both, template_name="default").text == "default"
    with pytest.raises(TemplateNotFoundError):
        render(REQ, both, template_name="nope")
    with pytest.raises(TemplateNotFoundError):
        render(REQ, TemplateSet((tool_use,), ("tool_use",)))


def test_continue_final_message_cuts_after_the_content() -> None:
    req = parse_request(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is"}]}
    )
    src = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    out = render(req, ChatTemplate(src, id="t"), continue_final_message=True, add_generation_prompt=False).text
    assert out == "<user>q</user><assistant>The answer is"
    with pytest.raises(TemplateError):
        render(req, ChatTemplate(src, id="t"), continue_final_message=True, add_generation_prompt=True)


def test_syntax_error_names_the_line() -> None:
    with pytest.raises(TemplateSyntaxError) as info:
        _render("line one\n{% if %}")
    assert info.value.path == "t line 2"  # the template's name (its file path, for a file), then the line


def test_undefined_attribute_is_a_typed_runtime_error() -> None:
    with pytest.raises(TemplateRuntimeError) as info:
        _render("{{ messages[0].nope.deeper }}")
    assert "nope" in info.value.message


# -- limits ---------------------------------------------------------------------------------------------------------

SMALL = RenderLimits(max_seconds=0.5, max_output_chars=100_000)


def test_nested_loop_bomb_hits_the_time_limit() -> None:
    bomb = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    with pytest.raises(TemplateLimitError):
        _render(bomb, limits=SMALL)


def test_silent_loop_bomb_hits_the_time_limit() -> None:
    bomb = "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i * j %}{% endfor %}{% endfor %}"
    with pytest.raises(TemplateLimitError) as info:
        _render(bomb, limits=SMALL)
    assert "longer than" in info.value.message


def test_the_issue_example_fails_under_default_limits() -> None:
    bomb = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    with pytest.raises(TemplateLimitError) as info:
        _render(bomb)
    assert "output exceeded" in info.value.message or "longer than" in info.value.message


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'x' * 1000000000 }}",
        "{{ [1] * 1000000000 }}",
        "{{ 10 ** 10000000 }}",
    ],
)
def test_builders_in_c_are_bounded(source: str) -> None:
    with pytest.raises(TemplateLimitError):
        _render(source, limits=SMALL)


def test_unbounded_recursion_is_a_limit_error() -> None:
    with pytest.raises(TemplateLimitError):
        _render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")


def test_range_over_sandbox_max_is_refused() -> None:
    with pytest.raises(TemplateLimitError) as info:
        _render("{% for i in range(10000000) %}{% endfor %}")
    assert "MAX_RANGE" in info.value.message


# -- sandbox escapes: the jinja2 CVE-2024-56326 and CVE-2025-27516 classes, and classic attribute walks -------------


@pytest.mark.parametrize(
    "payload",
    [
        # CVE-2025-27516: reaching str.format through the |attr filter
        "{{ ('{0.__class__.__mro__}' | attr('format'))(1) }}",
        # CVE-2024-56326: keeping a reference to str.format and calling it later
        "{% set f = '{0.__class__.__init__.__globals__}'.format %}{{ f(1) }}",
        "{{ ['{0.__class__}'] | map(attribute='format') | map('attr', '__call__') | list }}",
        "{{ '{0.__class__.__base__.__subclasses__}'.format(1) }}",
        # attribute walks to Python internals
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ raise_exception.__globals__ }}",
        # the immutable sandbox refuses mutation of the request data
        "{{ messages.append(1) }}",
        "{{ messages[0].update({'role': 'system'}) }}",
    ],
)
def test_sandbox_escape_payloads_are_refused_or_inert(payload: str) -> None:
    # The sandbox either refuses the operation or hands back an inert Undefined; Python internals never leak.
    try:
        out = _render(payload)
    except (TemplateSecurityError, TemplateRuntimeError) as exc:
        assert not isinstance(exc, TemplateLimitError)
        out = str(exc)
    for leak in ("uid=", "<class", "<function", "<module", "__builtins__"):
        assert leak not in out


def test_format_payloads_raise_security_error_specifically() -> None:
    for payload in (
        "{{ ('{0.__class__.__mro__}' | attr('format'))(1) }}",
        "{% set f = '{0.__class__.__init__.__globals__}'.format %}{{ f(1) }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.append(1) }}",
    ):
        with pytest.raises(TemplateSecurityError):
            _render(payload)


# -- provenance ------------------------------------------------------------------------------------------------------


def test_provenance_names_each_request_string() -> None:
    req = parse_request({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hello"}]})
    src = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    r = render(req, ChatTemplate(src, id="t"))
    assert r.text == "<system>S<user>hello"
    assert r.provenance_exact
    assert [(s.start, s.end, s.path) for s in r.request_spans] == [
        (8, 9, "messages[0].content"),
        (15, 20, "messages[1].content"),
    ]


def test_provenance_follows_strings_the_template_reshapes() -> None:
    # Provenance is kept per character through the operations templates apply to message text.
    req = parse_request({"messages": [{"role": "user", "content": "  padded  "}]})
    r = render(req, ChatTemplate("[{{ messages[0].content | trim }}]", id="t"))
    assert r.text == "[padded]"
    assert r.provenance_exact
    assert [(s.start, s.end, s.path) for s in r.request_spans] == [(1, 7, "messages[0].content")]


def test_provenance_is_marked_inexact_when_an_operation_mixes_request_text_with_a_control_token() -> None:
    # `center` cannot be mapped per character, and its input holds the template's own control token as well as
    # request text: which characters of the result are whose is unknown, and the render says so.
    req = parse_request({"messages": [{"role": "user", "content": "hi"}]})
    t = ChatTemplate("{{ ('<|a|>' ~ messages[0].content) | center(12) }}", id="t")
    r = render(req, t, control_tokens=["<|a|>"], policy="keep")
    assert r.text == "  <|a|>hi   "
    assert r.provenance_exact is False
    # Without `keep`, a control token that came out of such an operation is refused: it cannot be proven trusted.
    with pytest.raises(ControlTokenError, match="center"):
        render(req, t, control_tokens=["<|a|>"])


def test_time_limit_off_the_main_thread_stops_the_bomb() -> None:
    # Worker threads cannot take SIGALRM; the watchdog thread (or the tracer, CTXLOCK_FAST=0) stops the same bomb.
    import concurrent.futures

    bomb = "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i * j %}{% endfor %}{% endfor %}"
    with concurrent.futures.ThreadPoolExecutor(1) as pool, pytest.raises(TemplateLimitError) as info:
        pool.submit(_render, bomb, limits=SMALL).result()
    assert "longer than" in info.value.message


def test_time_limit_leaves_the_host_signal_state_alone() -> None:
    import signal

    before = signal.getsignal(signal.SIGALRM)
    _render("{{ messages[0].content }}")
    bomb = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    with pytest.raises(TemplateLimitError):
        _render(bomb, limits=SMALL)
    assert signal.getsignal(signal.SIGALRM) == before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_host_owned_alarm_is_not_taken_over() -> None:
    import signal

    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        bomb = "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i * j %}{% endfor %}{% endfor %}"
        with pytest.raises(TemplateLimitError):
            _render(bomb, limits=SMALL)
        assert signal.getsignal(signal.SIGALRM) is not None and not fired
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_compiled_templates_are_kept_on_disk(tmp_path, monkeypatch) -> None:
    # The second process (here: the in-process cache cleared) loads the compiled module instead of compiling.
    from ctxlock.template import _render as tmod

    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path))
    source = "{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}{% endfor %}{# bytecode test #}"
    request = parse_request({"messages": [{"role": "user", "content": "hi"}]})
    tmod._compile.cache_clear()
    first = render(request, ChatTemplate(source, id="t")).text
    files = list(tmp_path.glob("jinja/*/*.cache"))
    assert len(files) == 1
    tmod._compile.cache_clear()
    compiled = []
    monkeypatch.setattr(sandbox.LimitedEnvironment, "compile", lambda *a, **k: compiled.append(1))
    assert render(request, ChatTemplate(source, id="t")).text == first == "<user>HI"
    assert not compiled  # loaded, not compiled
    files[0].write_bytes(b"garbage")  # a corrupt entry is compiled anew
    tmod._compile.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path))
    assert render(request, ChatTemplate(source, id="t")).text == first
    tmod._compile.cache_clear()


def test_each_template_has_its_own_compiled_entry(tmp_path, monkeypatch) -> None:
    # Two templates used in turn (two models in one process, or one after the other): each is compiled once, and
    # neither overwrites the other's entry on disk.
    from ctxlock.template import _render as tmod

    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path))
    request = parse_request({"messages": [{"role": "user", "content": "hi"}]})
    sources = [
        "{% for m in messages %}[{{ m.content }}]{% endfor %}",
        "{% for m in messages %}({{ m.role }}){% endfor %}",
    ]
    tmod._compile.cache_clear()
    texts = [render(request, ChatTemplate(s, id=f"t{i}")).text for i, s in enumerate(sources)]
    assert len(list(tmp_path.glob("jinja/*/*.cache"))) == 2
    compiled = []
    original = sandbox.LimitedEnvironment.compile
    monkeypatch.setattr(sandbox.LimitedEnvironment, "compile", lambda *a, **k: compiled.append(1) or original(*a, **k))
    for _ in range(2):
        tmod._compile.cache_clear()
        assert [render(request, ChatTemplate(s, id=f"t{i}")).text for i, s in enumerate(sources)] == texts
    assert not compiled
    tmod._compile.cache_clear()
