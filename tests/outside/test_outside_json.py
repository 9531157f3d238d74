"""Outside JSON is read by the strict reader (`ctxlock.outside`), and `ctxlock usage` reads a file in bounded memory.

- Generated hostile files (nesting past the depth limit, integers past Python's 4,300 digits, lone surrogates,
  invalid UTF-8, duplicate keys, NaN; each at a random place among valid lines) give `usage` and `cache-report`
  (whose session reader the server's /v1/cache-report shares) a typed error naming the file and line: never a
  traceback, in process and in a child process.
- `ctxlock usage` on a generated 10 MB JSONL file grows its peak RSS by at most 4 times the file over the same
  command on a tiny file, measured in child processes (`os.wait4`).
- An ast walk of `src/` finds every `json.loads` / `json.load` call; each one is the strict reader itself or listed
  below with why it may read without it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cli_runner import invoke, run_cli
from ctxlock.cli import usage as usage_cmds
from ctxlock.economics._session import read_session
from ctxlock.economics._usage import PriceTable, read_usage
from ctxlock.errors import CtxlockError, PriceError, UsageError
from hypothesis_profiles import examples

SRC = Path(__file__).resolve().parents[2] / "src"

GOOD = [
    {"input_tokens": 12, "output_tokens": 5, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 40},
    {"model": "gpt-4o", "usage": {"prompt_tokens": 2000, "completion_tokens": 30}},
]


def _deep(depth: int, kinds: str) -> str:
    opens = "".join("[" if kinds[i % len(kinds)] == "a" else '{"k": ' for i in range(depth))
    closes = "".join("]" if kinds[i % len(kinds)] == "a" else "}" for i in reversed(range(depth)))
    return opens + "0" + closes


def _surrogate(code: int, in_value: bool) -> bytes:
    escape = f"\\u{code:04x}"  # a JSON escape of a lone surrogate, in a value or in a key
    where = f'"model": "a{escape}b"' if in_value else f'"{escape}": 2'
    return ('{"input_tokens": 1, "output_tokens": 1, ' + where + "}").encode()


HOSTILE = st.one_of(
    st.builds(lambda d, k: _deep(d, k).encode(), st.integers(129, 20_000), st.sampled_from(["a", "o", "ao", "oaa"])),
    st.builds(
        lambda n, key: (
            json.dumps({"input_tokens": 1, "output_tokens": 1, key: 0}).replace("0}", "9" * n + "}").encode()
        ),
        st.integers(4_301, 12_000),
        st.sampled_from(["x", "cache_read_input_tokens", "output_tokens_extra"]),
    ),
    st.builds(_surrogate, st.integers(0xD800, 0xDFFF), st.booleans()),
    st.builds(
        lambda bad: b'{"input_tokens": 1, "output_tokens": 1, "model": "a' + bad + b'"}',
        st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf4\x90\x80\x80", b"\x80"]),
    ),
    st.just(b'{"input_tokens": 1, "input_tokens": 2, "output_tokens": 1}'),
    st.sampled_from([b'{"input_tokens": NaN, "output_tokens": 1}', b'{"input_tokens": 1e999, "output_tokens": 1}']),
)


def _file(before: int, bad: bytes, after: int) -> bytes:
    lines = [json.dumps(GOOD[i % 2]).encode() for i in range(before)] + [bad]
    return b"\n".join(lines + [json.dumps(GOOD[i % 2]).encode() for i in range(after)]) + b"\n"


@settings(max_examples=examples(150), deadline=None)
@given(bad=HOSTILE, before=st.integers(0, 3), after=st.integers(0, 2))
def test_hostile_usage_and_session_lines_are_typed_errors(tmp_path_factory: Any, bad: bytes, before: int, after: int):
    data = _file(before, bad, after)
    try:
        read_usage(data, "u.jsonl")
    except CtxlockError as exc:
        assert isinstance(exc, UsageError) and str(exc.path).startswith("u.jsonl")
    else:
        raise AssertionError("a hostile line was read")
    path = tmp_path_factory.mktemp("u") / "u.jsonl"
    path.write_bytes(data)
    for args in ([], ["--json"]):
        out = invoke(usage_cmds.register, "usage", str(path), *args)
        assert out.exit_code == 1 and not isinstance(out.exception, UnicodeError) and "Traceback" not in out.output
    if before == 0 or len(data) > 1 << 20:
        return  # a session line is a request: the same line, read by cache-report's (and the server's) reader
    try:
        read_session(data.decode("utf-8", "surrogateescape").replace("\udcff", "\ufffd"), "s.jsonl")
    except CtxlockError as exc:
        assert str(exc.path).startswith("s.jsonl")
    except UnicodeError:
        raise AssertionError("a session line crashed the reader") from None


def test_hostile_files_in_a_child_process(tmp_path: Path) -> None:
    """The real commands, in child processes: one line on stderr, exit 1, no traceback (a lone surrogate in the
    model name crashed `usage` printing it)."""
    cases = {
        "deep": _deep(5_000, "ao").encode(),
        "digits": b'{"input_tokens": ' + b"7" * 5_000 + b', "output_tokens": 1}',
        "surrogate": b'{"input_tokens": 1, "output_tokens": 1, "model": "\\ud800"}',
        "utf8": b'{"input_tokens": 1, "output_tokens": 1, "model": "\xed\xa0\x80"}',
    }
    for name, bad in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(_file(1, bad, 1))
        proc = run_cli("usage", str(path))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (name, proc.stderr)
        assert proc.stderr.startswith(f"error: UsageError: {path}:2") and proc.stderr.count("\n") == 1
    session = tmp_path / "session.jsonl"
    request = {"messages": [{"role": "user", "content": "hi"}]}
    for bad in (cases["deep"], cases["digits"].replace(b"input_tokens", b"n")):
        session.write_bytes(json.dumps(request).encode() + b"\n" + bad + b"\n")
        proc = run_cli("cache-report", str(session), "--provider", "openai")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"SESSION {session}:2" in proc.stderr


def _peak_rss(path: Path) -> int:
    """The peak RSS (bytes) of `ctxlock usage PATH --json` in a child process."""
    child = subprocess.Popen(
        [sys.executable, "-m", "ctxlock", "usage", str(path), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, rusage = os.wait4(child.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, child.stderr.read() if child.stderr else b""
    if child.stderr:
        child.stderr.close()
    return rusage.ru_maxrss * 1024  # kilobytes on Linux


def test_usage_memory_is_bounded_by_its_input(tmp_path: Path) -> None:
    """Peak RSS over the same command on a tiny file: at most 4 times the input (it was about 54 times)."""
    lines, size, i = [], 0, 0
    while size < 10_000_000:
        i += 1
        if i % 3 == 0:
            obj: dict[str, Any] = {"id": f"chatcmpl-{i}", "model": "gpt-4o", "choices": [{"index": 0, "message": {
                "role": "assistant", "content": "ok " * (5 + i % 40)}}], "usage": {"prompt_tokens": 2000 + i % 500,
                "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 1024}}}  # fmt: skip
        elif i % 3 == 1:
            obj = {"id": f"msg_{i}", "type": "message", "model": "claude-sonnet-4-5", "content": [{"type": "text",
                   "text": "fine " * (5 + i % 40)}], "usage": GOOD[0]}  # fmt: skip
        else:
            obj = {"input_tokens": 5 + i % 100, "output_tokens": 7}
        line = json.dumps(obj) + "\n"
        lines.append(line)
        size += len(line)
    big, tiny = tmp_path / "big.jsonl", tmp_path / "tiny.jsonl"
    big.write_text("".join(lines))
    tiny.write_text("".join(lines[:3]))
    growth = _peak_rss(big) - _peak_rss(tiny)
    assert growth <= 4 * big.stat().st_size, f"grew {growth / 1e6:.0f} MB for {big.stat().st_size / 1e6:.0f} MB"


# -- every json.loads in src/ -------------------------------------------------------------------------------------

# The strict reader itself, and loads of what ctxlock wrote itself (or a library built in memory): nothing from
# outside reaches them.
OWN_OUTPUT = {
    "ctxlock/outside/_json.py::loads_strict": "the strict reader itself",
    "ctxlock/accounting/_layout.py::_raw": "json.dumps of the caller's Mapping read back: a deep copy",
    "ctxlock/training/_masks.py::cross_check": "Request.to_json(): ctxlock's canonical JSON",
    "ctxlock/training/_masks.py::_tools": "Request.to_json(): ctxlock's canonical JSON",
    "ctxlock/records/_build.py::_add_run": "Request.to_json(): ctxlock's canonical JSON",
    "ctxlock/generation/toolcalls/_schemas.py::_checked_validator": (
        "json.dumps(schema, sort_keys=True), a cache key, read back"
    ),
    "ctxlock/tokenizer/backends/_hf.py::HFTokenizer.pipeline": "tokenizers' own serialization of its components",
    "ctxlock/tokenizer/backends/_hf_pipeline.py::_canonical": "tokenizers' to_str() of a tokenizer built in memory",
    "ctxlock/tokenizer/backends/_hf_pipeline.py::_template_post_processor": "tokenizers' to_str()",
    "ctxlock/tokenizer/backends/_hf_pipeline.py::_class_components": "tokenizers' to_str()",
    "ctxlock/tokenizer/backends/_hf_pipeline.py::_built": "tokenizers' to_str()",
    "ctxlock/artifacts/__init__.py::builtin_models": "the manifests packaged with ctxlock",
    "ctxlock/outside/_diskcache.py::load": "ctxlock's own cache file (ctxlock wrote it)",
    "ctxlock/tokenizer/_accel.py::load_verdict": "ctxlock's own cache file (ctxlock wrote it)",
    "ctxlock/tokenizer/_fastbpe.py::cached_check": "ctxlock's own cache file (ctxlock wrote it)",
    "ctxlock/tokenizer/_fastbpe.py::nfc_inert_spans": "ctxlock's own cache file (ctxlock wrote it)",
    "ctxlock/tokenizer/backends/_hf.py::_load_head": "ctxlock's own cache file (ctxlock wrote it)",
    "ctxlock/generation/_constrain.py::_locate": "a JSON string literal inside the validator's own error message",
    "ctxlock/server/app.py::fit.work": "the body the strict reader accepted a line before (options.parse)",
    "ctxlock/cli/budget.py::fit.go": "the request the strict reader accepted a line before",
    "ctxlock/cli/constrain.py::check_output": "its own strict hooks (duplicate keys, NaN) on model output",
    "ctxlock/generation/toolcalls/_jsontext.py::loads_object": (
        "its own strict RFC 8259 reader of model output (jsontext)"
    ),
    "ctxlock/records/_format.py::ExecutionRecord.data": "a record body whose sha256 the store checked",
    "ctxlock/probes/_corpus.py::_shipped": "the probe corpus packaged with ctxlock",
    "ctxlock/probes/_corpus.py::Probe.to_dict": "json.dumps of a probe's request read back: a deep copy",
    "ctxlock/lint/_engines.py::_plain": "json.dumps of the caller's variables read back: the engines' common data",
    "ctxlock/lint/_engines.py::_Session._take": (
        "one answer line of ctxlock's own engine runner (json.dumps / JSON.stringify), under a size cap"
    ),
    "ctxlock/lint/_minijinja_worker.py::main": "one job line the parent process wrote with json.dumps",
    "ctxlock/trajectory/_build.py::Trajectory.__post_init__": "the parsed request's own to_json(), read back",
    "ctxlock/trajectory/_build.py::Trajectory.add": "the parsed request's own to_json(), read back",
}


def _json_loads_calls() -> dict[str, int]:
    """`path::function` -> how many json.loads / json.load calls it makes, for every module in src/ctxlock."""
    found: dict[str, int] = {}
    for path in sorted((SRC / "ctxlock").rglob("*.py")):
        where = path.relative_to(SRC).as_posix()

        def walk(node: ast.AST, scope: tuple[str, ...], where: str = where) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    walk(child, (*scope, child.name))
                    continue
                fn = child.func if isinstance(child, ast.Call) else None
                if (
                    isinstance(fn, ast.Attribute)
                    and fn.attr in ("loads", "load")
                    and isinstance(fn.value, ast.Name)
                    and fn.value.id == "json"
                ):
                    key = f"{where}::{'.'.join(scope) or '<module>'}"
                    found[key] = found.get(key, 0) + 1
                walk(child, scope)

        walk(ast.parse(path.read_text("utf-8")), ())
    return found


def test_every_json_loads_is_the_strict_reader_or_listed() -> None:
    calls = _json_loads_calls()
    unlisted = sorted(set(calls) - set(OWN_OUTPUT))
    assert unlisted == [], f"json.loads of outside input: read it with ctxlock.outside._json.loads_outside: {unlisted}"
    stale = sorted(set(OWN_OUTPUT) - set(calls))
    assert stale == [], f"listed but no longer calling json.loads (take them off the list): {stale}"
    # The readers of this change: usage, cache-report (CLI and server) and price tables.
    for reader in (
        "economics/_usage.py",
        "economics/_session.py",
        "cli/cachereport.py",
        "cli/usage.py",
        "economics/_promptcache.py",
    ):
        assert not [k for k in calls if k.startswith(f"ctxlock/{reader}::")], reader


def test_hostile_price_tables_are_price_errors() -> None:
    """A price table is outside JSON too: read strictly, its floats as Decimal (a duplicate model entry is refused
    with its key: LiteLLM's own file has had them, BerriAI/litellm#23578, and which one applies is ambiguous)."""
    entry = '{"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06}'
    ok = PriceTable.parse(('{"m": ' + entry + "}").encode(), "p.json")
    assert ok.lookup("m").per_token["input"] == Decimal("0.000001")
    for bad, message in (
        (_deep(3_000, "ao").encode(), "nested deeper than 128"),
        (b'{"m": {"input_cost_per_token": ' + b"1" * 5_000 + b"}}", "4300 digits"),
        (('{"m": ' + entry + ', "m": ' + entry + "}").encode(), 'duplicate key "m"'),
        (b'{"m": {"input_cost_per_token": 1e99999999999999999999}}', "not a finite JSON number"),
        (b'{"m": {"input_cost_per_token": 1, "note": "\\udc00"}}', "lone surrogate"),
        (b'{"m": {"input_cost_per_token": 1, "note": "\xc3"}}', "not UTF-8"),
    ):
        try:
            PriceTable.parse(bad, "p.json")
        except PriceError as exc:
            assert message in exc.message and str(exc.path).startswith("p.json"), (message, exc)
        else:
            raise AssertionError(message)


# -- every converted reader class, one hostile document of each kind -------------------------------------------

HOSTILE_DOCS = {
    "deep": '{"a": ' + "[" * 200 + "]" * 200 + "}",
    "digits": '{"a": ' + "7" * 5_000 + "}",
    "surrogate": '{"a": "\\ud800"}',
    "nan": '{"a": NaN}',
    "duplicate": '{"a": 1, "a": 2}',
}
NEEDLES = {
    "deep": "nested deeper than 128",
    "digits": "4300 digits",
    "surrogate": "lone surrogate",
    "nan": "not a finite JSON number",
    "duplicate": 'duplicate key "a"',
}


def _readers(tmp: Path) -> dict[str, tuple[type[CtxlockError], Any, bool]]:
    """reader -> (its error, a function of the document's bytes, whether a duplicate key keeps its last value as its
    reference reads it: model files, docs/outside-json.md)."""
    import io

    from ctxlock import load
    from ctxlock.artifacts._common import read_json
    from ctxlock.errors import ArtifactFormatError, BundleError, ConstraintError, RecordFormatError
    from ctxlock.generation._constrain import JsonSchemaMask
    from ctxlock.records import ExecutionRecord
    from ctxlock.records._bundle import MAGIC, import_bundle
    from ctxlock.records._store import Store
    from ctxlock.tokenizer.backends._hf import HFTokenizer
    from ctxlock.tokenizer.backends._tekken import TekkenTokenizer

    tokenizer = load().tokenizer

    def in_file(name: str, read: Any) -> Any:
        def go(raw: bytes) -> Any:
            path = tmp / name
            path.write_bytes(raw)
            return read(path)

        return go

    return {
        "record": (RecordFormatError, lambda raw: ExecutionRecord.from_bytes(raw, source="r.json"), False),
        "bundle header": (
            BundleError,
            lambda raw: import_bundle(Store(tmp / "store"), io.BytesIO(MAGIC + raw + b"\n"), label="b.bundle"),
            False,
        ),
        "schema": (ConstraintError, lambda raw: JsonSchemaMask(tokenizer, raw.decode(), source="s.json"), False),
        "model JSON": (ArtifactFormatError, in_file("tokenizer_config.json", read_json), True),
        "tokenizer.json": (ArtifactFormatError, lambda raw: HFTokenizer(raw.decode(), id="t", source="t.json"), True),
        "tekken.json": (ArtifactFormatError, in_file("tekken.json", lambda p: TekkenTokenizer(p, id="t")), True),
    }


def test_hostile_json_in_every_reader_class(tmp_path: Path) -> None:
    """Records, bundle headers, schemas, model JSON, tokenizer.json and tekken.json: each hostile document is the
    reader's typed error naming the input (and the JSON path where there is one). A duplicate key in a model file is
    read as transformers' json.load and tokenizers' serde_json maps read it (the last value), so that no file the
    references load is refused: the reader then fails later, on the missing sections, not on the key."""
    for reader, (error, read, last_key_wins) in _readers(tmp_path).items():
        for kind, doc in HOSTILE_DOCS.items():
            try:
                read(doc.encode())
            except CtxlockError as exc:
                assert isinstance(exc, error), (reader, kind, exc)
                text = f"{exc.message} {exc.path}"
                if kind == "duplicate" and last_key_wins:
                    assert "duplicate" not in text, (reader, exc)
                    continue
                assert NEEDLES[kind] in exc.message and exc.path and exc.hint, (reader, kind, exc)
                if kind in ("deep", "surrogate", "nan"):
                    assert "$" in str(exc.path) or reader == "bundle header", (reader, kind, exc.path)
            else:
                assert kind == "duplicate" and last_key_wins and reader == "model JSON", (reader, kind)
    from ctxlock.artifacts._common import read_json

    (tmp_path / "dup.json").write_text('{"a": 1, "b": [], "a": 2}')
    assert read_json(tmp_path / "dup.json") == json.loads('{"a": 1, "b": [], "a": 2}') == {"a": 2, "b": []}
    from ctxlock.errors import ArtifactFormatError
    from ctxlock.tokenizer.backends._tekken import TekkenTokenizer

    try:  # a Tekken file is read as any model file: a regular file under the artifact cap (a device was read whole)
        TekkenTokenizer(Path("/dev/zero"), id="t")
    except ArtifactFormatError as exc:
        assert "not a regular file" in exc.message and exc.path == "/dev/zero"
    else:
        raise AssertionError("/dev/zero was read as a Tekken file")


def test_a_duplicate_vocabulary_key_reads_as_tokenizers_reads_it() -> None:
    """A real tokenizer.json whose vocabulary repeats a token with another token's id: tokenizers (serde_json into
    a HashMap) keeps the last id, and so does ctxlock (not a refusal of a file the reference loads)."""
    import tokenizers

    from ctxlock.tokenizer.backends._hf import HFTokenizer
    from fetched import hf_tokenizer_dir

    data = json.loads((hf_tokenizer_dir("llama-spm") / "tokenizer.json").read_text("utf-8"))
    vocab = data["model"].pop("vocab")
    world = vocab["\u2581world"]
    again = f', "\\u2581the": {world}}}'  # "▁the" once more, with the id of "▁world"
    text = json.dumps(data).replace('"model": {', '"model": {"vocab": ' + json.dumps(vocab)[:-1] + again + ", ", 1)
    probe = "Hello the world, hello again"
    expected = tokenizers.Tokenizer.from_str(text).encode(probe, add_special_tokens=False).ids
    assert expected[1] == world  # the last value won in the reference
    assert list(HFTokenizer(text, id="dup", source="dup.json").encode(probe)) == expected
