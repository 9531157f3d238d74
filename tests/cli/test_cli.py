"""The CLI as a user runs it: a real subprocess, real exit codes, no tracebacks."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from cli_runner import assert_clean_error, ctxlock

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "seed-sky-injection.json"
BOOK_SEED = {"messages": [{"role": "system", "content": "简洁回答"}, {"role": "user", "content": "天空为什么是蓝色？"}]}


# -- happy paths -------------------------------------------------------------------------------------------------------


def test_render_json_has_the_promised_fields() -> None:
    proc = ctxlock("render", "--model", "book", "--json", "-", stdin=json.dumps(BOOK_SEED, ensure_ascii=False))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["input_ids"] == [1, 2, 7, 3, 4, 8, 9, 10, 11, 12, 5, 6]
    assert out["attention_mask"] == [1] * 12
    assert out["position_ids"] == list(range(12))
    assert out["text"] == "<bos><system>简洁回答</system><user>天空为什么是蓝色？</user><assistant>"
    assert set(out["template"]) >= {"id", "sha256"} and len(out["template"]["sha256"]) == 64
    assert set(out["tokenizer"]) >= {"id", "sha256"} and len(out["tokenizer"]["sha256"]) == 64
    assert out["special_tokens"] == "text"


def test_render_human_view_of_the_demo() -> None:
    proc = ctxlock("render", str(EXAMPLE))
    assert proc.returncode == 0, proc.stderr
    assert "mistral-nemo" in proc.stdout
    assert "injection neutralized" in proc.stdout
    assert "'[/INST]' from messages[3].content was encoded as plain text" in proc.stdout
    assert "digests" in proc.stdout and "tokens" in proc.stdout


def test_render_flags() -> None:
    proc = ctxlock("render", "--model", "book", "--json", "--no-generation-prompt", "-", stdin=json.dumps(BOOK_SEED))
    assert json.loads(proc.stdout)["input_ids"] == [1, 2, 7, 3, 4, 8, 9, 10, 11, 12, 5]
    keep = ctxlock(
        "render",
        "--model",
        "book",
        "--json",
        "--injection",
        "keep",
        "-",
        stdin=json.dumps({"messages": [{"role": "user", "content": "<system>"}]}),
    )
    assert json.loads(keep.stdout)["input_ids"] == [1, 4, 2, 5, 6]


def test_render_with_template_file_var_and_now(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{{ strftime_now('%Y-%m-%d') }}|{{ flavour }}|{{ messages[0].content }}", "utf-8")
    proc = ctxlock(
        "render",
        "--model",
        "book",
        "--template",
        str(template),
        "--var",
        'flavour="蓝色"',
        "--now",
        "2024-07-26T10:00:00",
        "--json",
        "-",
        stdin=json.dumps({"messages": [{"role": "user", "content": "是"}]}),
    )
    out = json.loads(proc.stdout)
    assert out["text"] == "2024-07-26|蓝色|是"
    # A --now without an offset is local time, recorded with the local offset (issue 15 item 6).
    assert out["now"] == datetime(2024, 7, 26, 10).astimezone().isoformat() and out["clock_used"] is True
    assert out["template"]["id"] == "t.jinja"


def test_render_anthropic_dialect() -> None:
    req = {
        "system": "简洁回答",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "天空为什么是蓝色？"}]}],
    }
    proc = ctxlock("render", "--model", "book", "--json", "--dialect", "anthropic", "-", stdin=json.dumps(req))
    assert proc.returncode == 0, proc.stderr


def test_tokenize_jsonl_and_flags() -> None:
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in ["天空", "<system>是", ""]) + "\n"
    proc = ctxlock("tokenize", "--model", "book", "--jsonl", stdin=lines)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x) for x in proc.stdout.splitlines()] == [[8], [13] * 8 + [10], []]
    special = ctxlock(
        "tokenize", "--model", "book", "--jsonl", "--parse-special", "--add-special-tokens", stdin='"<system>是"\n'
    )
    assert json.loads(special.stdout) == [1, 2, 10]
    text = ctxlock("tokenize", "--model", "book", "--text", "天空", "--json")
    assert json.loads(text.stdout)["ids"] == [8]


def test_tokenize_default_model_is_tekken() -> None:
    proc = ctxlock("tokenize", "--text", "Hello [INST]", "--json")
    out = json.loads(proc.stdout)
    assert 3 not in out["ids"]  # "[INST]" in text stays text by default
    proc = ctxlock("tokenize", "--text", "Hello [INST]", "--json", "--parse-special")
    assert json.loads(proc.stdout)["ids"][-1] == 3


def test_inspect_and_models() -> None:
    proc = ctxlock("inspect", "--json")
    info = json.loads(proc.stdout)
    assert info["id"] == "mistral-nemo"
    assert info["tokenizer"]["format"] == "tekken" and info["tokenizer"]["vocab_size"] == 131072
    assert info["special_tokens"]["bos_token"] == {"content": "<s>", "id": 1}
    assert info["templates"][0]["features"]["tools"] is True
    human = ctxlock("inspect", "--model", "book")
    assert "book" in human.stdout and "<system>" not in human.stderr
    models = json.loads(ctxlock("models", "--json").stdout)
    assert {m["name"] for m in models} >= {"book", "mistral-nemo"}
    assert [m["name"] for m in models if m["default"]] == ["mistral-nemo"]


# -- bad input: typed error, names the cause and location, no traceback, non-zero exit --------------------------------


def test_invalid_utf8_names_the_byte_offset() -> None:
    proc = ctxlock("render", "--model", "book", "-", stdin=b'{"messages":[{"role":"user","content":"ab\xffcd"}]}')
    assert_clean_error(proc, "RequestEncodingError", "byte 41")


def test_invalid_utf8_json_error_object() -> None:
    proc = ctxlock("render", "--model", "book", "--json", "-", stdin=b'{"messages":[{"role":"user","content":"\xc3"}]}')
    assert proc.returncode != 0
    err = json.loads(proc.stdout)["error"]
    assert err["type"] == "RequestEncodingError" and err["path"] == "stdin byte 39"


def test_replace_policy_is_reported() -> None:
    proc = ctxlock(
        "render",
        "--model",
        "book",
        "--json",
        "--utf8",
        "replace",
        "-",
        stdin=b'{"messages":[{"role":"user","content":"ab\xffcd"}]}',
    )
    out = json.loads(proc.stdout)
    assert out["request"]["utf8_policy"] == "replace" and out["request"]["replaced_bytes"] == [41]
    assert "\ufffd" in out["text"]


@pytest.mark.parametrize(
    ("body", "kind", "where"),
    [
        ('{"messages":[{"role":"user","content":"a","role":"user"}]}', "RequestJSONError", "messages[0]"),
        ('{"messages":[{"role":"wizard","content":"a"}]}', "RequestValidationError", "messages[0].role"),
        (
            '{"messages":[{"role":"user","content":"a"},{"role":"tool","tool_call_id":"nope","content":"r"}]}',
            "RequestValidationError",
            "messages[1].tool_call_id",
        ),
        (
            '{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1",'
            '"type":"function","function":{"name":"f","arguments":"{not json"}}]}]}',
            "RequestValidationError",
            "messages[1].tool_calls[0].function.arguments",
        ),
    ],
    ids=["duplicate-key", "unknown-role", "tool-result-without-call", "invalid-tool-arguments"],
)
def test_request_errors_name_the_json_path(body: str, kind: str, where: str) -> None:
    proc = ctxlock("render", "--model", "book", "-", stdin=body)
    assert_clean_error(proc, kind, where)
    as_json = ctxlock("render", "--model", "book", "--json", "-", stdin=body)
    err = json.loads(as_json.stdout)["error"]
    assert err["type"] == kind and err["path"].startswith(where)


def test_missing_template(tmp_path: Path) -> None:
    proc = ctxlock(
        "render", "--model", "book", "--template", str(tmp_path / "missing.jinja"), "-", stdin=json.dumps(BOOK_SEED)
    )
    assert_clean_error(proc, "ArtifactNotFoundError", "missing.jinja")


def test_model_without_a_template(tmp_path: Path) -> None:
    model_dir = _book_dir(tmp_path, template=None)
    proc = ctxlock("render", "--model", str(model_dir), "-", stdin=json.dumps(BOOK_SEED))
    assert_clean_error(proc, "TemplateNotFoundError", "--template")


def _book_dir(tmp_path: Path, template: str | None) -> Path:
    from ctxlock.artifacts import BUILTIN_DIR

    manifest = json.loads((BUILTIN_DIR / "book" / "ctxlock.json").read_text("utf-8"))
    if template is None:
        manifest.pop("template")
    else:
        manifest["template"] = template
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "ctxlock.json").write_text(json.dumps(manifest, ensure_ascii=False), "utf-8")
    return model_dir


def test_template_escaping_its_model_directory(tmp_path: Path) -> None:
    (tmp_path / "outside.jinja").write_text("{{ messages }}", "utf-8")
    model_dir = _book_dir(tmp_path, template="../outside.jinja")
    proc = ctxlock("render", "--model", str(model_dir), "-", stdin=json.dumps(BOOK_SEED))
    assert_clean_error(proc, "PathTraversalError", "outside the model directory", "ctxlock.json:template")


def test_hf_dir_symlink_escape_and_tokenizer_file_escape(tmp_path: Path) -> None:
    (tmp_path / "secret.jinja").write_text("{{ messages }}", "utf-8")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "chat_template.jinja").symlink_to(tmp_path / "secret.jinja")
    (hf / "tokenizer.json").write_text("{}", "utf-8")
    proc = ctxlock("inspect", "--model", str(hf))
    assert_clean_error(proc, "PathTraversalError")
    hf2 = tmp_path / "hf2"
    hf2.mkdir()
    (hf2 / "tokenizer_config.json").write_text(json.dumps({"tokenizer_file": "../../etc/passwd"}), "utf-8")
    proc = ctxlock("inspect", "--model", str(hf2))
    assert_clean_error(proc, "PathTraversalError", "tokenizer_file")


def test_template_over_the_limits(tmp_path: Path) -> None:
    model_dir = _book_dir(tmp_path, template="bomb.jinja")
    (model_dir / "bomb.jinja").write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "utf-8"
    )
    proc = ctxlock("render", "--model", str(model_dir), "-", stdin=json.dumps(BOOK_SEED))
    assert_clean_error(proc, "TemplateLimitError")


def test_template_syntax_error_names_the_line(tmp_path: Path) -> None:
    model_dir = _book_dir(tmp_path, template="broken.jinja")
    (model_dir / "broken.jinja").write_text("fine\n{% for %}", "utf-8")
    proc = ctxlock("render", "--model", str(model_dir), "-", stdin=json.dumps(BOOK_SEED))
    assert_clean_error(proc, "TemplateSyntaxError", "line 2")


def test_raise_policy_names_the_path() -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "hi [INST] there"}]})
    proc = ctxlock("render", "--injection", "raise", "-", stdin=body)
    assert_clean_error(proc, "ControlTokenError", "messages[0].content")


def test_usage_errors_are_not_tracebacks() -> None:
    proc = ctxlock("render", "--model", "book", "--var", "not-a-pair", "-", stdin=json.dumps(BOOK_SEED))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    proc = ctxlock("tokenize", "--model", "book")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
