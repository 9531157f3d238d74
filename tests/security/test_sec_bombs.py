"""Hostile templates cannot exhaust the machine (issue 14, item 3).

A catalogue of template bombs (compile time, dead branches that jinja's optimizer would fold, padding and format
widths, concatenation, `join`, list and string multiplication, big integers, accumulation in loops, recursion,
huge sources, a GGUF file's metadata) and generated variants of each shape (sizes, and wrappers: macros, blocks,
filter blocks, loops, namespaces). Each bomb runs in a child process that measures its own wall time and peak RSS;
the bytecode cache is a temporary directory, checked afterwards. Bounds:
- every bomb that runs fails with TemplateLimitError within the time limit plus 10%;
- the peak RSS stays within 256 MB of the child's baseline (measured after loading the model, before any bomb);
- nothing over 1 MiB reaches the bytecode cache.
A dead branch never runs: it must cost nothing (compile and render within the bounds, output as written).
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import fetched

SECONDS = 2.0
MEMORY_MB = 256
CACHE_FILE_LIMIT = 1 << 20

# (name, template source). Every one either fails with TemplateLimitError or, marked "dead:", renders cheaply.
CATALOGUE: list[tuple[str, str]] = [
    ("dead:center-and-format", "{% if false %}{{ 'x'|center(300000000) }}{{ '%300000000d' % 1 }}{% endif %}ok"),
    ("dead:concat", "{% if false %}{{ ('x' ~ 'y')|center(10**9) }}{{ 'a' * 10**9 }}{% endif %}ok"),
    ("dead:format-method", "{% if false %}{{ '{:>1000000000}'.format(1) }}{{ 'x'.ljust(10**9) }}{% endif %}ok"),
    ("ljust", "{{ 'x'.ljust(10**9) }}"),
    ("rjust-center-zfill", "{{ 'x'.center(10**9) }}{{ 'x'.zfill(10**9) }}"),
    ("percent-width", "{{ '%1000000000d' % 1 }}"),
    ("percent-precision", "{{ '%.1000000000f' % 1.0 }}"),
    ("percent-star", "{{ '%*d' % (1000000000, 1) }}"),
    ("format-width", "{{ '{:>1000000000}'.format(1) }}"),
    ("format-nested-width", "{{ '{:>{}}'.format(1, 1000000000) }}"),
    ("format-filter", "{{ '%1000000000s'|format('x') }}"),
    ("center-filter", "{{ 'x'|center(1000000000) }}"),
    ("indent-filter", "{{ ('x\\n' * 1000000)|indent(1000) }}"),
    ("join-of-repeats", "{% set a = 'x' * 8000000 %}{{ ([a] * 200)|join|length }}"),
    ("join-method", "{% set a = 'x' * 8000000 %}{{ ''.join([a] * 200)|length }}"),
    ("tilde-chain", "{% set a = 'x' * 4000000 %}{{ (a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a)|length }}"),
    ("plus-chain", "{% set a = 'x' * 4000000 %}{{ (a + a + a + a + a + a + a + a + a + a)|length }}"),
    ("string-times", "{{ 'x' * 1000000000 }}"),
    ("list-times", "{{ ([0] * 1000000000)|length }}"),
    ("int-power", "{{ 2 ** 100000000 }}"),
    ("int-power-tower", "{{ 10 ** (10 ** 8) }}"),
    (
        "int-square-loop",
        "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
    ),
    (
        "string-doubling",
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
        "{{ ns.s|length }}",
    ),
    (
        "list-accumulation",
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + ['x' * 100000 ~ i] %}"
        "{% endfor %}{{ ns.l|length }}",
    ),
    (
        "slice-accumulation",
        "{% set big = 'x' * 8000000 %}{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
        "{% set ns.l = ns.l + [big[i:]] %}{% endfor %}{{ ns.l|length }}",
    ),
    ("urlencode-growth", "{{ ('\u4e00' * 8000000)|urlencode|length }}"),
    ("list-of-chars", "{{ ('x' * 8000000)|list|length }}"),
    ("replace-growth", "{{ ('x' * 7000000).replace('x', 'yyyy')|length }}"),
    ("expandtabs", "{{ ('\\t' * 1000000).expandtabs(1000)|length }}"),
    ("tojson-of-repeats", "{% set a = 'x' * 8000000 %}{{ ([a] * 100)|tojson|length }}"),
    ("string-of-repeats", "{% set a = 'x' * 8000000 %}{{ ([a] * 100)|string|length }}"),
    ("print-list-of-repeats", "{% set a = 'x' * 8000000 %}{{ [a] * 100 }}"),
    ("lipsum", "{{ lipsum(1000000) }}"),
    ("range", "{{ range(10 ** 9)|list|length }}"),
    ("recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
    ("busy-loop", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
    ("output", "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"),
    ("huge-source", "x" * 10_000_000),
    ("deep-nesting", "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}"),
    ("slow-compile", "{% if a %}{{ b }}{% endif %}" * 9000),
    ("slow-compile-long-lines", "{{ a ~ b ~ c ~ d ~ e ~ f ~ g ~ h }}" * 7000),
]

# Generated variants: a bomb expression in a wrapper, at a size drawn past the limits.
SHAPES = [
    "'x'.ljust({n})",
    "'x'|center({n})",
    "'%{n}d' % 1",
    "'{{:>{n}}}'.format(1)",
    "'x' * {n}",
    "([0] * {n})|length",
    "(['x' * 4000000] * ({n} // 1000000))|join|length",
]
WRAPPERS = [
    "{{{{ {e} }}}}",
    "{{% macro m() %}}{{{{ {e} }}}}{{% endmacro %}}{{{{ m() }}}}",
    "{{% set s %}}{{{{ {e} }}}}{{% endset %}}{{{{ s|length }}}}",
    "{{% filter upper %}}{{{{ {e} }}}}{{% endfilter %}}",
    "{{% for i in range(2) %}}{{{{ {e} }}}}{{% endfor %}}",
    "{{% set ns = namespace(v=0) %}}{{% set ns.v = {e} %}}{{{{ ns.v|string|length }}}}",
    "{{% if true %}}{{{{ [{e}]|first }}}}{{% endif %}}",
]


def _variants(count: int, seed: int = 14) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for k in range(count):
        n = rng.choice([10**8, 10**9, 3 * 10**9, 2**31, 10**10]) + rng.randrange(1000)
        shape, wrapper = rng.choice(SHAPES), rng.choice(WRAPPERS)
        out.append((f"variant-{k}", wrapper.format(e=shape.format(n=n))))
    return out


# Peak RSS is read from /proc/self/status (VmHWM, the high-water mark of this process's own memory since exec):
# getrusage's ru_maxrss would carry the parent's resident size over fork and exec, and pytest's process is large.
HWM = """
def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
"""

CHILD = (
    HWM
    + r"""
import json, sys, time
from ctxlock.errors import CtxlockError
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate, RenderLimits, render
import ctxlock

request = parse_request({"messages": [{"role": "user", "content": "hi"}]})
limits = RenderLimits(max_seconds=float(sys.argv[1]))
render(request, ChatTemplate("{{ messages[0].content }}", id="warm"), limits=limits)
baseline = hwm()
for line in sys.stdin:
    name, source = json.loads(line)
    t0 = time.monotonic()
    try:
        text = render(request, ChatTemplate(source, id=name), limits=limits).text
        outcome, detail = "ok", text[:40]
    except CtxlockError as exc:
        outcome, detail = type(exc).__name__, exc.message[:200]
    elapsed = time.monotonic() - t0
    print(json.dumps([name, outcome, detail, elapsed, (hwm() - baseline) / 1024]), flush=True)
"""
)


def _run(bombs: list[tuple[str, str]], cache: Path, *, seconds: float = SECONDS) -> list[list]:
    env = {**os.environ, "CTXLOCK_CACHE_DIR": str(cache)}
    stdin = "".join(json.dumps(b) + "\n" for b in bombs)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(seconds)],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60 + len(bombs) * seconds * 2,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


def _check_cache(cache: Path) -> None:
    big = [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size > CACHE_FILE_LIMIT]
    assert not big, big


def _check(results: list[list], *, seconds: float = SECONDS) -> None:
    problems = []
    for name, outcome, detail, elapsed, grown_mb in results:
        if name.startswith("dead:"):
            if outcome != "ok" or detail != "ok":
                problems.append(f"{name}: a dead branch must render as written, got {outcome} {detail}")
        elif outcome != "TemplateLimitError":
            problems.append(f"{name}: {outcome} {detail}")
        if elapsed > seconds * 1.1:
            problems.append(f"{name}: {elapsed:.2f} s (limit {seconds} s)")
        if grown_mb > MEMORY_MB:
            problems.append(f"{name}: peak RSS grew {grown_mb:.0f} MB")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("chunk", range(4))
def test_the_bomb_catalogue_is_bounded(tmp_path, chunk: int) -> None:
    # One child per quarter of the catalogue: a bomb's peak is measured against a baseline that earlier bombs in
    # the same child can only have raised (ru_maxrss is a peak), so a child runs few.
    bombs = CATALOGUE[chunk::4]
    results = _run(bombs, tmp_path)
    assert [r[0] for r in results] == [b[0] for b in bombs]
    _check(results)
    _check_cache(tmp_path)


def test_generated_bomb_variants_are_bounded(tmp_path) -> None:
    results = _run(_variants(60), tmp_path)
    assert len(results) == 60
    _check(results)
    _check_cache(tmp_path)


def _gguf_with_template(tmp_path: Path, source: str, name: str = "bomb.gguf") -> Path:
    """A real vocabulary-only GGUF with `tokenizer.chat_template` set to `source` (one key-value pair more)."""
    data = fetched.gguf_path("bert-bge").read_bytes()
    version, n_tensors, n_kv = struct.unpack("<IQQ", data[4:24])
    key, value = b"tokenizer.chat_template", source.encode()
    pair = struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, len(value)) + value
    path = tmp_path / name
    path.write_bytes(data[:4] + struct.pack("<IQQ", version, n_tensors, n_kv + 1) + pair + data[24:])
    return path


GGUF_CHILD = (
    HWM
    + r"""
import json, sys, time
baseline = None
import ctxlock
from ctxlock.errors import CtxlockError
ctxlock.load("book")
# The same vocabulary under a benign template, timed: what loading costs on this machine at this moment, beside the
# template's compile limit (a loaded machine stretches both).
t0 = time.monotonic()
ctxlock.load(sys.argv[2]).render({"messages": [{"role": "user", "content": "hi"}]})
plain = time.monotonic() - t0
baseline = hwm()
t0 = time.monotonic()
try:
    model = ctxlock.load(sys.argv[1])
    outcome = model.render({"messages": [{"role": "user", "content": "hi"}]}).text[:40]
except CtxlockError as exc:
    outcome = type(exc).__name__
elapsed = time.monotonic() - t0
print(json.dumps([outcome, elapsed, plain, (hwm() - baseline) / 1024]))
"""
)


@pytest.mark.parametrize(
    ("source", "expected", "inspect_rc"),
    [
        ("{% if false %}{{ 'x'|center(300000000) }}{{ '%300000000d' % 1 }}{% endif %}ok", "ok", 0),
        ("{{ 'x'.ljust(10**9) }}", "TemplateLimitError", 0),
        ("{% if a %}{{ b }}{% endif %}" * 9000, "TemplateLimitError", 1),
        ("x" * 10_000_000, "TemplateLimitError", 1),
    ],
    ids=["dead-branch", "ljust", "slow-compile", "huge-source"],
)
def test_a_gguf_chat_template_bomb_is_bounded_at_load_and_inspect(
    tmp_path, source: str, expected: str, inspect_rc: int
) -> None:
    # The template comes from the file's metadata: loading compiles it (default limits: 5 s), rendering runs it;
    # `inspect` compiles it without rendering (a bomb that only goes off at render time inspects fine).
    path = _gguf_with_template(tmp_path, source)
    plain_path = _gguf_with_template(tmp_path, "{{ messages[0].content }}", "plain.gguf")
    cache = tmp_path / "cache"
    env = {**os.environ, "CTXLOCK_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", GGUF_CHILD, str(path), str(plain_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    outcome, elapsed, plain, grown_mb = json.loads(out.stdout)
    assert outcome == expected
    # Bounded by the 5 s compile limit (10% slack) plus what loading the same vocabulary costs here and now.
    assert elapsed < 5.0 * 1.1 + plain and grown_mb < MEMORY_MB, (elapsed, plain, grown_mb)
    command = [sys.executable, "-m", "ctxlock", "inspect", "--model", str(path)]
    cli = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in cli.stderr
    assert cli.returncode == inspect_rc, cli.stderr
    _check_cache(cache)
