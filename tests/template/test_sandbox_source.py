"""`ctxlock.template.sandbox.render_source`: a template source rendered with plain variables, every failure as a
value with its template line, and the line that printed each piece of the text."""

from __future__ import annotations

from datetime import UTC, datetime

from ctxlock.template.sandbox import RenderLimits, SourceRender, render_source

NOW = datetime(2026, 1, 2, 3, 4, 5)

SOURCE = """{%- for m in messages %}
<{{ m.role }}>
{{- m.content }}
{% endfor %}
{{- strftime_now('%d %B %Y') }}"""


def test_text_and_the_line_that_printed_each_piece() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    (r,) = render_source(SOURCE, [{"messages": messages}], now=NOW)
    assert r == SourceRender(r.text, printed=r.printed)  # no error, no line
    assert r.text == "<user>hi\n<assistant>yo\n02 January 2026"
    assert r.line_at(r.text.index("user")) == 2  # printed by `{{ m.role }}`
    assert r.line_at(r.text.index("hi")) == 3
    # literal text is jinja's: it starts where its token does, after the tag of line 1 (the newline trim_blocks took)
    assert r.line_at(r.text.index("<user>")) == 1
    assert r.line_at(r.text.index("02")) == 5
    assert r.line_at(10**6) == 5  # past the end: the last piece
    assert render_source("", [{}], now=NOW)[0].line_at(0) is None  # nothing printed


def test_the_clock_is_the_wall_time_given() -> None:
    aware = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    (r,) = render_source("{{ strftime_now('%H:%M %z') }}", [{}], now=aware)
    assert r.text == "03:04 "  # a naive wall time, as transformers formats datetime.now()


def test_failures_are_values_with_their_line() -> None:
    source = "a\n{% if x %}\n{{ raise_exception('no ' ~ x) }}\n{% endif %}\n{{ y.z }}"
    ok, raised, undefined = render_source(source, [{"y": {"z": 1}}, {"x": 1}, {}], now=NOW)
    assert ok.text == "a\n1" and ok.error is None
    assert (raised.text, raised.error, raised.line) == (None, "raise_exception: no 1", 3)
    assert undefined.text is None and undefined.error is not None
    assert undefined.error.startswith("UndefinedError:") and undefined.line == 5


def test_a_syntax_error_fails_every_render() -> None:
    renders = render_source("ok\n{{ 1 + }}", [{}, {"a": 1}], now=NOW)
    assert [r.line for r in renders] == [2, 2]
    assert all(r.text is None and r.error and r.error.startswith("TemplateSyntaxError:") for r in renders)


def test_the_limits_bound_a_hostile_template() -> None:
    limits = RenderLimits(max_seconds=2.0, max_output_chars=10_000, output_per_input_char=0.0)
    flood, loop = render_source(
        "{% for i in range(n) %}{{ 'x' * 1000 }}{% endfor %}",
        [{"n": 100}, {"n": 10**12}],
        now=NOW,
        limits=limits,
    )
    assert flood.error is not None and flood.error.startswith("limit:")
    assert loop.error is not None and loop.error.startswith("limit:")
    (unsafe,) = render_source("{{ ''.__class__.__mro__ }}", [{}], now=NOW)
    assert unsafe.error is not None and unsafe.error.startswith("SecurityError:")
