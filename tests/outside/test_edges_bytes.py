"""Issue 15 item 5: byte fidelity at the edges.

- `tokenize --file` encodes the file's bytes (CRLF stays CRLF), and every way text enters `tokenize` (a file,
  an argv string, a --jsonl line, a lone surrogate escape) obeys the UTF-8 policy requests get: `strict` is one
  error line naming the input and the byte, `replace` is U+FFFD with the replaced offsets reported.
- `--jsonl` lines end at LF only: U+2028, U+0085 and a lone CR inside a JSON line are part of it.
- A CRLF `chat_template.jinja` renders as transformers renders it (its loader reads the file with universal
  newlines), while the record keeps the digest of the file's bytes and `inspect` says the file is CRLF.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock as cl
import fetched
from cli_runner import assert_clean_error, ctxlock
from ctxlock.errors import InputError
from hypothesis_profiles import examples

QWEN_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "line one\r\nline two"},
    {"role": "assistant", "content": "ok"},
    {"role": "user", "content": "again"},
]


def _run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ctxlock", *args], input=stdin, capture_output=True, timeout=120, check=False
    )


# -- tokenize: files and argv -----------------------------------------------------------------------------------------


def test_tokenize_file_keeps_crlf_like_text(tmp_path: Path) -> None:
    f = tmp_path / "crlf.txt"
    f.write_bytes(b"a\r\nb\r\n")
    by_file = json.loads(ctxlock("tokenize", "--file", str(f), "--json").stdout)["ids"]
    by_text = json.loads(ctxlock("tokenize", "--text", "a\r\nb\r\n", "--json").stdout)["ids"]
    lf = json.loads(ctxlock("tokenize", "--text", "a\nb\n", "--json").stdout)["ids"]
    assert by_file == by_text == cl.load().tokenizer.encode("a\r\nb\r\n")
    assert by_file != lf


def test_tokenize_file_invalid_utf8_follows_the_request_policy(tmp_path: Path) -> None:
    f = tmp_path / "bad.txt"
    f.write_bytes(b"caf\xc3 ok \xff")
    strict = ctxlock("tokenize", "--file", str(f))
    assert_clean_error(strict, f"--file {f}", "byte 3", "--utf8 replace")
    replaced = ctxlock("tokenize", "--file", str(f), "--utf8", "replace", "--json")
    assert replaced.returncode == 0, replaced.stderr
    out = json.loads(replaced.stdout)
    assert out["ids"] == cl.load().tokenizer.encode("caf\ufffd ok \ufffd")
    assert out["replaced_bytes"] == [3, 8] and out["utf8_policy"] == "replace"
    human = ctxlock("tokenize", "--file", str(f), "--utf8", "replace")
    assert "2 invalid byte(s) read as U+FFFD, at byte offsets 3, 8" in human.stdout


def test_tokenize_text_argv_bytes_are_not_silently_replaced() -> None:
    # An argv byte that is not UTF-8 reaches Python as a lone surrogate (PEP 383); base encoded it silently.
    strict = _run("tokenize", "--text", b"a\xffb".decode("utf-8", "surrogateescape"))
    assert strict.returncode != 0 and b"Traceback" not in strict.stderr
    assert b"--text" in strict.stderr and b"byte 1" in strict.stderr
    ok = _run("tokenize", "--json", "--utf8", "replace", "--text", b"a\xffb".decode("utf-8", "surrogateescape"))
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["ids"] == cl.load().tokenizer.encode("a\ufffdb") and out["replaced_bytes"] == [1]


def test_tokenize_unknown_utf8_policy_is_one_line() -> None:
    assert_clean_error(ctxlock("tokenize", "--text", "x", "--utf8", "latin1"), "--utf8", "strict or replace")


# -- tokenize --jsonl -------------------------------------------------------------------------------------------------


def test_jsonl_lines_end_at_lf_only() -> None:
    # Every separator str.splitlines splits on, written raw inside a JSON string (json.dumps with
    # ensure_ascii=False leaves them as they are): each line is still one JSON string.
    texts = ["a\u2028b", "c\u0085d", "g\u2029h", "i\x1cj\x1dk\x1el", "m\x0bn\x0co"]
    stdin = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts).encode("utf-8")
    assert len(stdin.decode("utf-8").splitlines()) > len(texts)
    proc = _run("tokenize", "--jsonl", stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(x) for x in proc.stdout.decode().split("\n") if x]
    tok = cl.load().tokenizer
    assert got == [tok.encode(t) for t in texts]


def test_jsonl_lone_surrogate_and_bad_bytes_follow_the_policy() -> None:
    strict = _run("tokenize", "--jsonl", stdin=b'"ok"\n"a\\ud800b"\n')
    assert strict.returncode != 0 and b"Traceback" not in strict.stderr
    assert b"stdin line 2" in strict.stderr and b"lone surrogate" in strict.stderr
    bad = _run("tokenize", "--jsonl", stdin=b'"a\xffb"\n')
    assert bad.returncode != 0 and b"stdin line 1" in bad.stderr and b"byte 2" in bad.stderr
    ok = _run("tokenize", "--jsonl", "--utf8", "replace", stdin=b'"a\\ud800b"\n"a\xffb"\n')
    assert ok.returncode == 0, ok.stderr
    tok = cl.load().tokenizer
    assert [json.loads(x) for x in ok.stdout.decode().splitlines()] == [tok.encode("a\ufffdb")] * 2
    assert b"stdin line 2: utf8=replace: 1 invalid byte(s)" in ok.stderr


def _bad_offsets(data: bytes) -> list[int]:
    """The offsets of the bytes Python's "replace" handler replaces, found one decode error at a time."""
    out, pos = [], 0
    while True:
        try:
            data[pos:].decode("utf-8")
            return out
        except UnicodeDecodeError as exc:
            out.extend(range(pos + exc.start, pos + exc.end))
            pos += exc.end


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=40))
def test_decode_with_policy_matches_python_replace(data: bytes) -> None:
    from ctxlock.cli.files import decode_with_policy

    text, replaced = decode_with_policy(data, label="x", utf8="replace")
    assert text == data.decode("utf-8", "replace")
    assert list(replaced) == _bad_offsets(data)
    if replaced:
        with pytest.raises(InputError, match=f"at byte {replaced[0]}"):
            decode_with_policy(data, label="x", utf8="strict")
    else:
        assert decode_with_policy(data, label="x", utf8="strict") == (text, ())


# -- templates with CRLF line endings ---------------------------------------------------------------------------------


def _crlf_model(tmp_path: Path) -> tuple[Path, bytes]:
    src = fetched.hf_tokenizer_dir("qwen2")
    model = tmp_path / "qwen-crlf"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, model / name)
    lf = (fetched.templates_dir() / QWEN_TEMPLATE).read_bytes().replace(b"\r\n", b"\n")
    crlf = lf.replace(b"\n", b"\r\n")
    (model / "chat_template.jinja").write_bytes(crlf)
    return model, crlf


def test_crlf_template_file_renders_as_transformers(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    model_dir, crlf = _crlf_model(tmp_path)
    reference = AutoTokenizer.from_pretrained(str(model_dir))
    want = reference.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    want_ids = reference.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True, return_dict=False)
    if isinstance(want_ids, dict):
        want_ids = want_ids["input_ids"]
    model = cl.load(str(model_dir))
    run = model.run({"messages": CHAT})
    assert run.rendered.text == want
    assert list(run.tokenized.ids) == list(want_ids)
    t = run.rendered.template
    # The template's digest is that of the source transformers holds (its chat_template string, read as LF), so a
    # CRLF copy of a template and the template itself have one id; the file's own bytes have theirs.
    assert t.sha256 == hashlib.sha256(reference.chat_template.encode("utf-8")).hexdigest()
    assert t.line_endings == "crlf" and t.file_sha256 == hashlib.sha256(crlf).hexdigest()
    assert t.sha256 == hashlib.sha256(crlf.replace(b"\r\n", b"\n")).hexdigest() != t.file_sha256


def test_crlf_template_is_recorded_and_shown(tmp_path: Path) -> None:
    model_dir, crlf = _crlf_model(tmp_path)
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"messages": CHAT}), "utf-8")
    store = tmp_path / "store"
    out = ctxlock("render", str(req), "--model", str(model_dir), "--record", "--store", str(store), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["template"]["file_sha256"] == hashlib.sha256(crlf).hexdigest()
    assert data["template"]["line_endings"] == "crlf"
    from ctxlock.records import ExecutionRecord
    from ctxlock.records._store import Store

    record = ExecutionRecord.from_bytes(Store(store).get_record(data["record_id"]))
    assert record.data["template"]["file_sha256"] == hashlib.sha256(crlf).hexdigest()
    assert record.data["template"]["line_endings"] == "crlf"
    shown = ctxlock("inspect", "--model", str(model_dir))
    assert shown.returncode == 0, shown.stderr
    assert "CRLF line endings in the file" in shown.stdout and hashlib.sha256(crlf).hexdigest() in shown.stdout
    lf_template = tmp_path / "lf.jinja"
    lf_template.write_bytes(crlf.replace(b"\r\n", b"\n"))
    crlf_file = str(model_dir / "chat_template.jinja")
    via_flag = json.loads(ctxlock("render", str(req), "-m", str(model_dir), "-t", crlf_file, "--json").stdout)
    via_lf = json.loads(ctxlock("render", str(req), "-m", str(model_dir), "-t", str(lf_template), "--json").stdout)
    assert via_flag["text"] == via_lf["text"] and via_flag["input_ids"] == via_lf["input_ids"]
    assert via_flag["template"]["sha256"] == via_lf["template"]["sha256"]
    assert via_flag["template"]["line_endings"] == "crlf" and via_lf["template"]["line_endings"] == "lf"
