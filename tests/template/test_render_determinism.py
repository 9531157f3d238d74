"""Issue 15 item 6: renders are reproducible, and the clock is timezone-aware.

Every global, filter and test the sandbox exposes is exercised by a probe template (the tables below must name
exactly the environment's own, so a new one cannot slip in untested). Each probe's outcome (the text, or the
typed error and its message) must be the same twice in one process and in another process with another hash
seed. The randomness a template can reach (the `random` filter, `lipsum`) draws from a generator seeded per
render (default 0, recorded with every draw); printing a value whose text is a memory address (a function, a
method, a generator) is refused as a `TemplateDeterminismError` naming the template line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock
from ctxlock.errors import CtxlockError
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate, render
from ctxlock.template.sandbox._env import new_environment
from hypothesis_profiles import examples

REQUEST = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello <b>world</b>, see https://example.org now"},
        {"role": "assistant", "content": "ok"},
    ]
}
FIXED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=9)))

# One probe per filter, using it on request text where it takes text; lazy results are listed.
FILTERS = {
    "abs": "{{ -3|abs }}",
    "attr": "{{ messages[0]|attr('role') }}",
    "batch": "{{ messages|map(attribute='role')|batch(2)|list }}",
    "capitalize": "{{ messages[1].content|capitalize }}",
    "center": "{{ messages[0].content|center(15) }}",
    "count": "{{ messages|count }}",
    "d": "{{ nothing|d('fallback') }}",
    "default": "{{ nothing|default(messages[0].role) }}",
    "dictsort": "{{ {'b': 1, 'a': 2, 'c': 0}|dictsort }}",
    "e": "{{ messages[1].content|e }}",
    "escape": "{{ messages[1].content|escape }}",
    "filesizeformat": "{{ 123456789|filesizeformat }}",
    "first": "{{ messages|first }}",
    "float": "{{ '1.5'|float }}",
    "forceescape": "{{ messages[1].content|forceescape }}",
    "format": "{{ '%s-%d'|format(messages[0].role, 3) }}",
    "groupby": "{{ messages|groupby('role')|list }}",
    "indent": "{{ 'a\nb'|indent(2, true) }}",
    "int": "{{ '42'|int + 1 }}",
    "items": "{{ {'a': 1, 'b': 2}|items|list }}",
    "join": "{{ messages|map(attribute='role')|join(', ') }}",
    "last": "{{ messages|last }}",
    "length": "{{ messages[1].content|length }}",
    "list": "{{ messages[0].content|list }}",
    "lower": "{{ messages[0].content|lower }}",
    "map": "{{ messages|map(attribute='content')|list }}",
    "max": "{{ [3, 1, 2]|max }}",
    "min": "{{ messages|map(attribute='role')|min }}",
    "pprint": "{{ messages|pprint }}",
    "random": "{{ range(90000)|random }} {{ messages|random }}",
    "reject": "{{ [1, 2, 3, 4]|reject('odd')|list }}",
    "rejectattr": "{{ messages|rejectattr('role', 'eq', 'user')|list }}",
    "replace": "{{ messages[1].content|replace('o', '0') }}",
    "reverse": "{{ messages[0].content|reverse }}",
    "round": "{{ 2.675|round(2) }} {{ 7.5|round(0, 'floor') }}",
    "safe": "{{ messages[1].content|safe }}",
    "select": "{{ [1, 2, 3, 4]|select('even')|list }}",
    "selectattr": "{{ messages|selectattr('role', 'eq', 'user')|list }}",
    "slice": "{{ [1, 2, 3, 4, 5]|slice(2)|list }}",
    "sort": "{{ messages|sort(attribute='role')|map(attribute='role')|list }}",
    "string": "{{ messages|string }}",
    "striptags": "{{ messages[1].content|striptags }}",
    "sum": "{{ [1, 2.5, 3]|sum }}",
    "title": "{{ messages[1].content|title }}",
    "tojson": "{{ messages|tojson }} {{ {'b': 1, 'a': [1.5, none]}|tojson(indent=2) }}",
    "trim": "{{ '  x  '|trim }}",
    "truncate": "{{ messages[1].content|truncate(12) }}",
    "unique": "{{ ['b', 'a', 'B', 'b']|unique|list }}",
    "upper": "{{ messages[1].content|upper }}",
    "urlencode": "{{ messages[1].content|urlencode }}",
    "urlize": "{{ messages[1].content|urlize }}",
    "wordcount": "{{ messages[1].content|wordcount }}",
    "wordwrap": "{{ messages[1].content|wordwrap(10) }}",
    "xmlattr": "{{ {'class': messages[0].role, 'id': 3}|xmlattr }}",
}

# Each global called as templates call it, and printed itself (a function's text is its memory address).
GLOBALS = {
    "cycler": ["{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}", "{{ cycler('a') }}"],
    "dict": ["{{ dict(a=1, b=[2]) }} {{ dict.fromkeys(['x', 'y'], 0) }}", "{{ dict }}"],
    "joiner": [
        "{% set j = joiner(', ') %}{% for m in messages %}{{ j() }}{{ m.role }}{% endfor %}",
        "{{ joiner() }}",
    ],
    "lipsum": ["{{ lipsum(2) }}|{{ lipsum(1, false, 5, 9) }}", "{{ lipsum }}"],
    "namespace": ["{% set ns = namespace(n=0) %}{% set ns.n = ns.n + 3 %}{{ ns.n }} {{ ns }}", "{{ namespace }}"],
    "raise_exception": ["{{ raise_exception('refused: ' ~ messages[0].role) }}", "{{ raise_exception }}"],
    "range": ["{{ range(2, 9, 3)|list }} {{ range(3) }}", "{{ range }}"],
    "strftime_now": ["{{ strftime_now('%Y-%m-%d %H:%M:%S %z%Z %A') }}", "{{ strftime_now }}"],
}

VALUES = "[0, 1, 2.5, -3, 'a', 'A', '', none, true, false, [1], {'k': 1}, messages[0].content, messages]"
TESTS = {name: f"{{{{ {VALUES}|select('{name}')|list }}}}" for name in ("boolean", "callable", "defined")}
TESTS |= {name: f"{{{{ {VALUES}|select('{name}')|list }}}}" for name in ("escaped", "false", "float", "integer")}
TESTS |= {name: f"{{{{ {VALUES}|select('{name}')|list }}}}" for name in ("iterable", "mapping", "none", "number")}
TESTS |= {name: f"{{{{ {VALUES}|select('{name}')|list }}}}" for name in ("sequence", "string", "true", "undefined")}
TESTS |= {name: f"{{{{ ['a', 'A', messages[0].content]|select('{name}')|list }}}}" for name in ("lower", "upper")}
TESTS |= {name: f"{{{{ [0, 1, 2, 3, 9]|select('{name}')|list }}}}" for name in ("even", "odd")}
TESTS |= {"divisibleby": "{{ [0, 1, 2, 3, 9]|select('divisibleby', 3)|list }}"}
TESTS |= {
    name: f"{{{{ [0, 1, 2, 3]|select('{name}', 2)|list }}}}"
    for name in ("!=", "<", "<=", "==", ">", ">=", "eq", "equalto", "ge", "greaterthan", "gt")
}
TESTS |= {name: f"{{{{ [0, 1, 2, 3]|select('{name}', 2)|list }}}}" for name in ("le", "lessthan", "lt", "ne")}
TESTS |= {
    "in": "{{ ['a', 'z', messages[0].role]|select('in', 'abc system')|list }}",
    "sameas": "{{ [none, false, 0]|select('sameas', false)|list }}",
    "filter": "{{ ['upper', 'nope', 'tojson']|select('filter')|list }}",
    "test": "{{ ['odd', 'nope', 'sameas']|select('test')|list }}",
}

# Lazy values and methods printed as they are: their text is an address in every process.
PRINTED = {
    "map_printed": "{{ messages|map(attribute='role') }}",
    "select_printed": "{{ [1, 2]|select('odd') }}",
    "method_printed": "line one\n{{ messages[0].content.upper }}",
    "method_in_list": "{{ [messages[0].content.upper] }}",
    "method_tilde": "{{ 'x' ~ joiner() }}",
    "method_string_filter": "{{ (dict|string)|length }}",
    "method_format": "{{ '%s'|format(cycler) }} {{ '{}'.format(dict) }}",
    "method_percent": "{{ 'a %s' % (range,) }} {{ 'a %s' % lipsum }}",
    "in_namespace": "{% set ns = namespace(f=joiner()) %}{{ ns }}",
}


# Sets a template builds (dict views minus a list, set methods): a set of strings iterates in PYTHONHASHSEED's order,
# so each is given one fixed order (sorted); the cross-process test below holds them to it.
D5 = "{'alpha': 1, 'beta': 2, 'gamma': 3, 'delta': 4, 'eps': 5}"
SETS = {
    "keys_minus_printed": f"{{{{ {D5}.keys() - [] }}}}",
    "keys_minus_joined": f"{{{{ ({D5}.keys() - ['x'])|join(',') }}}}",
    "keys_minus_first": f"{{{{ ({D5}.keys() - [])|first }}}}",
    "items_minus_list": f"{{{{ ({D5}.items() - [])|list }}}}",
    "set_method": f"{{{{ ({D5}.keys() - []).union(['zeta', 'omega']) }}}}",
    "request_keys": "{{ (messages[1].keys() - ['x'])|list }}{% for k in messages[0].keys() - [] %}{{ k }}{% endfor %}",
    "empty": f"{{{{ {D5}.keys() - {D5}.keys() }}}}",
}


def probes() -> dict[str, str]:
    out = {f"filter {k}": v for k, v in FILTERS.items()}
    for name, (called, printed) in GLOBALS.items():
        out[f"global {name}"] = called
        out[f"global {name} printed"] = printed
    out |= {f"test {k}": v for k, v in TESTS.items()}
    out |= {f"printed {k}": v for k, v in PRINTED.items()}
    out |= {f"set {k}": v for k, v in SETS.items()}
    return out


def test_a_set_the_template_builds_has_one_fixed_order() -> None:
    assert outcome(SETS["keys_minus_printed"])[1] == "{'alpha', 'beta', 'delta', 'eps', 'gamma'}"
    assert outcome(SETS["keys_minus_joined"])[1] == "alpha,beta,delta,eps,gamma"
    assert outcome(SETS["empty"])[1] == "set()"
    assert outcome(SETS["items_minus_list"])[1].startswith("[('alpha', 1), ('beta', 2)")


def outcome(source: str, *, seed: int | None = None, now: datetime = FIXED) -> list[Any]:
    """What one render gives: ["text", text, draws] or ["error", type, message, path]."""
    request = parse_request(REQUEST)
    options: dict[str, Any] = {"seed": seed} if seed is not None else {}
    try:
        r = render(request, ChatTemplate(source, id="probe"), now=now, add_generation_prompt=False, **options)
    except CtxlockError as exc:
        return ["error", type(exc).__name__, exc.message, exc.path]
    return ["text", r.text, [dict(d) for d in getattr(r, "draws", ())]]


def all_outcomes() -> dict[str, list[Any]]:
    return {name: outcome(source) for name, source in probes().items()}


def test_the_tables_cover_every_global_filter_and_test() -> None:
    env = new_environment()
    assert set(FILTERS) == set(env.filters)
    assert set(GLOBALS) == set(env.globals) | {"strftime_now"}  # strftime_now is given per render
    assert set(TESTS) == set(env.tests)


def test_every_probe_renders_the_same_twice_and_in_another_process() -> None:
    here = all_outcomes()
    assert here == all_outcomes()
    script = (
        "import json, sys; sys.path[:0] = sys.argv[1:]; import test_render_determinism as t; "
        "print(json.dumps(t.all_outcomes()))"
    )
    runs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "TZ": "America/New_York" if hash_seed == "1" else "UTC"}
        proc = subprocess.run(
            [sys.executable, "-c", script, str(Path(__file__).parent), str(Path(__file__).parents[1])],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=True,
        )
        runs.append(json.loads(proc.stdout))
    expected = json.loads(json.dumps(here))
    for other in runs:
        differ = sorted(k for k in expected if expected[k] != other.get(k))
        assert not differ, {k: (expected[k], other.get(k)) for k in differ}
    # Nothing prints an address: every probe of a callable or lazy value is a typed error, not a text.
    for name, got in here.items():
        assert not re.search(r"0x[0-9a-fA-F]{4,}", json.dumps(got)), (name, got)
    for name in PRINTED:
        assert here[f"printed {name}"][:2] == ["error", "TemplateDeterminismError"], here[f"printed {name}"]


def test_printed_functions_are_refused_with_the_template_line() -> None:
    got = outcome(PRINTED["method_printed"])
    assert got[1] == "TemplateDeterminismError" and got[3] == "probe line 2", got
    assert "memory address" in got[2] and "str.upper" in got[2]
    for name in ("dict", "joiner", "lipsum", "raise_exception", "strftime_now", "cycler"):
        assert outcome(GLOBALS[name][1])[:2] == ["error", "TemplateDeterminismError"], name
    # Values a template prints for real stay as they are (a range, a namespace of values, a class, a macro).
    shown = outcome("{% macro m() %}{% endmacro %}{{ range(2) }} {{ namespace(a=1) }} {{ joiner }} {{ m }}")
    assert shown[1] == "range(0, 2) <Namespace {'a': 1}> <class 'jinja2.utils.Joiner'> <Macro 'm'>"


def test_random_filter_is_seeded_and_logged() -> None:
    source = "{{ range(90000)|random }}\n{{ messages|map(attribute='role')|list|random }}"
    texts = {outcome(source)[1] for _ in range(5)}
    assert len(texts) == 1  # unseeded, five renders gave five texts
    first = outcome(source)
    assert first[2][0] == {"what": "random", "line": 1, "choices": 90000, "index": int(first[1].split()[0])}
    assert first[2][1]["line"] == 2 and first[2][1]["choices"] == 3
    seeds = {outcome(source, seed=s)[1] for s in range(20)}
    assert len(seeds) > 15  # the seed matters: it is a real draw, only a recorded one
    assert outcome(source, seed=7) == outcome(source, seed=7)


@settings(max_examples=examples(25), deadline=None)
@given(seed=st.integers(0, 2**64 - 1), n=st.integers(1, 4), lo=st.integers(1, 12), span=st.integers(0, 12))
def test_lipsum_is_a_function_of_its_seed(seed: int, n: int, lo: int, span: int) -> None:
    source = f"{{{{ lipsum({n}, false, {lo}, {lo + span}) }}}}"
    a, b = outcome(source, seed=seed), outcome(source, seed=seed)
    assert a == b and a[0] == "text"
    paragraphs = a[1].split("\n\n")
    assert len(paragraphs) == n
    for p in paragraphs:
        assert lo <= len(p.split()) <= lo + span and p[0].isupper() and p.endswith(".")
    assert a[2] == [{"what": "lipsum", "line": 1, "paragraphs": n}]


def test_seed_is_recorded_and_replayed(tmp_path: Path) -> None:
    from ctxlock.records import RunOptions
    from ctxlock.records._replay import replay, run_and_record, save
    from ctxlock.records._store import Store

    model = ctxlock.load("book")
    template = ChatTemplate("{{ messages[0].content }} {{ range(1000)|random }}", id="rand.jinja")
    raw = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    options = RunOptions(render_seed=1234, now=FIXED.isoformat())
    _, record, error = run_and_record(model, raw, options, template=template)
    assert error is None
    dyn = record.data["dynamic"]
    assert dyn["random"]["seed"] == 1234 and dyn["random"]["draws"][0]["choices"] == 1000
    assert "random_ids" not in dyn and record.data["format"] == "ctxlock.record/2"
    store = Store(tmp_path / "store")
    rid = save(store, model, record, template)
    result, again = replay(store_record(store, rid), store)
    assert result.identical, result
    assert again.data["rendered"]["text"] == record.data["rendered"]["text"]


def store_record(store: Any, rid: str) -> Any:
    from ctxlock.records import ExecutionRecord

    return ExecutionRecord.from_bytes(store.get_record(rid))


def test_format_1_records_still_read() -> None:
    from ctxlock.records import ExecutionRecord, RunOptions
    from ctxlock.records._replay import run_and_record

    model = ctxlock.load("book")
    _, record, _ = run_and_record(model, json.dumps(REQUEST).encode(), RunOptions())
    old = record.data
    old["format"] = "ctxlock.record/1"
    for key in ("model", "warnings"):
        old.pop(key)
    old["dynamic"].pop("random")
    old["dynamic"].pop("clock_zone")
    old["dynamic"]["random_ids"] = []
    parsed = ExecutionRecord.from_bytes(json.dumps(old).encode())
    assert parsed.data["format"] == "ctxlock.record/1"


# -- the clock -------------------------------------------------------------------------------------------------------


def test_default_clock_is_aware_and_recorded_with_its_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        model = ctxlock.load("book")
        r = model.render(REQUEST)
        now = datetime.fromisoformat(r.now)
        assert now.utcoffset() == timedelta(hours=9) and r.clock_zone == "JST"
        assert abs(now - datetime.now(UTC)) < timedelta(minutes=5)
        from ctxlock.records import RunOptions
        from ctxlock.records._replay import run_and_record

        _, record, _ = run_and_record(model, json.dumps(REQUEST).encode(), RunOptions())
        assert record.data["dynamic"]["now"].endswith("+09:00") and record.data["dynamic"]["clock_zone"] == "JST"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_strftime_now_gives_what_transformers_gives_for_the_instant(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import reference
    from conformance import FixedClock

    fmt = "{{ strftime_now('%Y-%m-%d %H:%M:%S|%z|%Z|%j') }}"
    # transformers formats a naive datetime.now(): on a machine in +09:00 at FIXED's instant, its wall time.
    import transformers.utils.chat_template_utils as ctu

    monkeypatch.setattr(ctu, "datetime", FixedClock)
    import conformance

    monkeypatch.setattr(conformance, "FIXED_NOW", FIXED.replace(tzinfo=None))
    want = reference.reference_render(fmt, [{"role": "user", "content": "x"}])
    assert want == "2026-01-02 03:04:05|||002"
    assert outcome(fmt)[1] == want
    # The same instant given in UTC renders the UTC wall time, as transformers on a UTC machine would.
    assert outcome(fmt, now=FIXED.astimezone(UTC))[1] == "2026-01-01 18:04:05|||001"
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        naive = outcome("{{ strftime_now('%H:%M') }}", now=datetime(2026, 1, 2, 3, 4))  # naive: local time
        assert naive[1] == "03:04"
        r = render(parse_request(REQUEST), ChatTemplate("x", id="p"), now=datetime(2026, 1, 2, 3, 4))
        assert r.now == "2026-01-02T03:04:00+09:00"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_cli_now_takes_an_offset(tmp_path: Path) -> None:
    from cli_runner import ctxlock as run_cli

    template = tmp_path / "clock.jinja"
    template.write_text("{{ strftime_now('%d %H:%M %z') }}", "utf-8")
    request = tmp_path / "r.json"
    request.write_text(json.dumps(REQUEST), "utf-8")
    proc = run_cli("render", str(request), "-m", "book", "-t", str(template), "--now", FIXED.isoformat(), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["text"] == "02 03:04 " and out["now"] == "2026-01-02T03:04:05+09:00"
    assert out["clock_zone"] == "UTC+09:00" and out["random"] == {"seed": 0, "draws": []}
    bad = run_cli("render", str(request), "-m", "book", "--render-seed", "-1")
    assert bad.returncode != 0 and "--render-seed" in bad.stderr and "Traceback" not in bad.stderr
