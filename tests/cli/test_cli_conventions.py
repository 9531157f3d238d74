"""Issue 16, items 7-11: the command line as a user meets it.

- large requests render: the template limits grow with the input, and the CLI can raise them (recorded);
- the human view writes the rendered text exactly and elides huge id lists; `--json` writes arrays on one line;
- every bad input, at every file a command reads, is one line on stderr with the convention's exit status;
- errors name their input, hints name commands, usage errors are one line with status 2;
- detok says why the text ended, inspect shows what add_special_tokens adds, --model help is the same everywhere,
  the README's diff layer order is the code's, and `make demo`'s packaging is quiet.

The bad-input test runs `ctxlock.cli.main` in this process (the entry point the `ctxlock` script calls), so an
exception that escapes it is the traceback a user would see; the output tests run real subprocesses (a pipe)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import fetched
from cli_runner import run_main
from ctxlock.artifacts import load_artifacts
from ctxlock.errors import TemplateLimitError
from ctxlock.model._model import Model
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate, RenderLimits, render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "seed-sky-injection.json"
BOOK_SEED = {"messages": [{"role": "system", "content": "简洁回答"}, {"role": "user", "content": "天空为什么是蓝色？"}]}


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """`ctxlock ARGS` in a subprocess whose stdout is a pipe (as `ctxlock render x | less` has it)."""
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("COLUMNS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "ctxlock", *args], input=stdin, capture_output=True, env=env, timeout=300, check=False
    )
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


# -- item 7: large requests ---------------------------------------------------------------------------------------


def _chat(content_chars: int, turns: int = 4) -> bytes:
    word = "rayleigh scattering 天空 "
    content = (word * (content_chars // len(word) + 1))[:content_chars]
    roles = ["user", "assistant"] * turns
    return json.dumps({"messages": [{"role": r, "content": content} for r in roles[:turns]]}).encode()


def test_limits_bound_what_the_template_adds_not_the_input() -> None:
    # A fixed allowance of 1,000 output characters, and a request of 40,000: the standard shape of template (each
    # message once) renders, because the bound is 1,000 + 4 x the input; on main the input itself was bounded.
    limits = RenderLimits(max_output_chars=1_000)
    req = parse_request(_chat(10_000))
    faithful = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", id="faithful")
    assert len(render(req, faithful, limits=limits).text) > 40_000
    # A template that repeats its input past the per-input share is still stopped: the hostile guarantee holds,
    # scaled to the input instead of removed.
    blowup = ChatTemplate(
        "{% for i in range(50) %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfor %}", id="blowup"
    )
    with pytest.raises(TemplateLimitError, match="output exceeded"):
        render(req, blowup, limits=limits)
    # One string built from the input alone is bounded the same way.
    repeat = ChatTemplate("{{ messages[0].content * 100 }}", id="repeat")
    with pytest.raises(TemplateLimitError):
        render(req, repeat, limits=limits)
    # And a tiny input gets no more than the fixed allowance.
    tiny = parse_request(_chat(10, turns=1))
    with pytest.raises(TemplateLimitError):
        render(tiny, ChatTemplate("{{ 'x' * 5000 }}", id="x"), limits=limits)


def test_scaled_limits_are_plain_numbers() -> None:
    base = RenderLimits()
    scaled = base.scaled(1_000_000)
    assert scaled.max_output_chars == base.max_output_chars + 4_000_000
    assert scaled.max_seconds == base.max_seconds + 5.0
    assert scaled.created_budget == base.created_budget + 16_000_000
    assert scaled.scaled(1_000_000) == scaled  # the per-input shares are spent once
    assert RenderLimits.from_dict(base.to_dict()) == base


def test_a_request_over_the_old_fixed_output_limit_renders_on_the_standard_qwen_template() -> None:
    # 4 messages of 2.1M characters: 8.4M characters of input, over main's fixed 8M output limit, which blamed the
    # GGUF's standard Qwen2 template as possibly hostile.
    model = Model(load_artifacts(str(fetched.gguf_path("qwen2"))))
    rendered = model.render(_chat(2_100_000))
    assert len(rendered.text) > 8_400_000
    assert rendered.text.startswith("<|im_start|>")


def test_cli_limits_options_are_applied_and_recorded(tmp_path: Path) -> None:
    request = tmp_path / "chat.json"
    request.write_bytes(json.dumps(BOOK_SEED, ensure_ascii=False).encode())
    template = tmp_path / "twice.jinja"
    template.write_text("{% for i in range(3) %}{{ messages[1].content }}{% endfor %}x" * 40, "utf-8")
    # A fixed allowance too small for what this template adds: the error says how to raise it.
    proc = cli("render", "-m", "book", "-t", str(template), "--max-render-chars", "100", str(request))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "TemplateLimitError" in proc.stderr and "--max-render-chars" in proc.stderr
    store = tmp_path / "store"
    ok = cli(
        "render", "-m", "book", "-t", str(template), "--max-render-chars", "5000", "--template-timeout", "7.5",
        "--record", "--store", str(store), "--json", str(request),
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    rid = json.loads(ok.stdout)["record_id"]
    shown = cli("records", "show", rid, "--store", str(store))
    limits = json.loads(shown.stdout)["options"]["limits"]
    assert limits["max_output_chars"] == 5000 and limits["max_seconds"] == 7.5
    # Replay renders under the recorded limits (with the defaults it would also pass; this one must not fail).
    assert cli("replay", rid, "--store", str(store)).returncode == 0


# -- item 8: output -----------------------------------------------------------------------------------------------


def test_the_human_view_in_a_pipe_is_the_exact_rendered_text(tmp_path: Path) -> None:
    long_line = "没有空格的很长一行" * 30 + " then [/INST] words " * 20 + "tab\there\r\ncrlf"
    req = {"messages": [{"role": "user", "content": long_line}, {"role": "assistant", "content": "ok"}]}
    req["messages"].append({"role": "user", "content": "again"})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(req, ensure_ascii=False), "utf-8")
    text = json.loads(cli("render", str(path), "--json").stdout)["text"]
    human = cli("render", str(path))
    assert human.returncode == 0, human.stderr
    assert text + "\n" in human.stdout  # not wrapped at 80 columns, nothing dropped (\r, \t kept)
    assert "[/INST]" in human.stdout and "[/I\nNST]" not in human.stdout


def test_the_human_view_elides_the_middle_of_a_huge_id_list(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(_chat(6_000, turns=3))
    full = json.loads(cli("render", str(path), "--json").stdout)
    ids = full["input_ids"]
    assert len(ids) > 3_000
    human = cli("render", str(path)).stdout
    line = next(x for x in human.splitlines() if x.startswith("[") and "ids not shown" in x)
    head, _, tail = line.partition(", … ")
    assert json.loads(head + "]") == ids[:500]
    assert json.loads("[" + tail.partition(" …, ")[2]) == ids[-500:]
    assert f"{len(ids) - 1000:,} ids not shown (--json prints all)" in line
    assert len(human) < len(full["text"]) + 10_000  # the text, and not the 3,000+ ids again


def test_json_writes_every_id_array_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(_chat(3_000, turns=2))
    out = cli("render", str(path), "--json").stdout
    doc = json.loads(out)
    for key in ("input_ids", "attention_mask", "position_ids"):
        (line,) = (x for x in out.splitlines() if x.startswith(f'  "{key}": ['))
        assert json.loads(line.strip().removeprefix(f'"{key}": ').rstrip(",")) == doc[key]
    assert out.count("\n") < 100  # main wrote one line per id: thousands
    tokenize = cli("tokenize", "--text", "a b c d e f", "--json").stdout
    assert re.search(r'^  "ids": \[[0-9, ]+\],$', tokenize, re.M)


# -- items 9 and 10: bad inputs, one line each -------------------------------------------------------------------


def _bad_inputs(root: Path) -> dict[str, Path]:
    root.mkdir()
    (root / "dir").mkdir()
    (root / "garbage.bin").write_bytes(bytes(range(256)) * 4 + b"\x00\xff\xfe PNG\r\n\x1a")
    (root / "empty.json").write_bytes(b"")
    (root / "blank.json").write_bytes(b"  \n\t\n")
    (root / "truncated.json").write_bytes(b'{"messages": [{"role": "user", "content": "hi"}')
    (root / "not-json.json").write_text("this is not json", "utf-8")
    os.mkfifo(root / "fifo")
    os.symlink(root / "loop", root / "loop")
    kinds = {name: root / name for name in ("dir", "garbage.bin", "empty.json", "blank.json", "fifo", "loop")}
    kinds |= {"missing": root / "missing.json", "truncated": root / "truncated.json", "text": root / "not-json.json"}
    if os.geteuid() != 0:  # root reads any file: an unreadable file exists only for other users
        (root / "unreadable.json").write_text("{}", "utf-8")
        (root / "unreadable.json").chmod(0)
        kinds["unreadable"] = root / "unreadable.json"
    return kinds


# (argv with {} where the bad path goes, kinds that are valid there and so not an error)
TEXT_IS_VALID = frozenset({"empty.json", "blank.json", "truncated", "text"})  # any UTF-8 text is a template or text
SLOTS: list[tuple[tuple[str, ...], frozenset[str]]] = [
    (("render", "-m", "book", "{}"), frozenset()),
    (
        ("render", "-m", "book", "--template", "{}", str(EXAMPLE)),
        frozenset({"empty.json", "blank.json", "truncated", "text"}),
    ),
    (("render", "-m", "book", "--sampling", "{}", str(EXAMPLE)), frozenset()),
    (("render", "-m", "{}", str(EXAMPLE)), frozenset()),
    (("tokenize", "-m", "book", "--file", "{}"), TEXT_IS_VALID),
    (("inspect", "-m", "{}"), frozenset()),
    (("fit", "-m", "book", "--max-input-tokens", "100", "{}"), frozenset()),
    (("fit", "-m", "book", "--policy", "{}", str(EXAMPLE)), frozenset()),
    (("compact-plan", "-m", "book", "--context-window", "100", "{}"), frozenset()),
    (("toolcalls", "-f", "openai", "{}"), frozenset({"empty.json", "blank.json"})),
    (("toolcalls", "-f", "hermes", "--tools", "{}", "-"), frozenset()),
    (("constrain", "-m", "book", "--schema", "{}"), frozenset()),
    (("records", "show", "{}"), frozenset()),
    (("records", "import", "{}"), frozenset({"empty.json", "blank.json"})),
    (("replay", "{}"), frozenset()),
    (("diff", "{}", "{}"), frozenset()),
]


def _cases() -> Iterator[tuple[str, tuple[str, ...], frozenset[str]]]:
    for argv, valid in SLOTS:
        yield " ".join(a for a in argv if a != str(EXAMPLE)), argv, valid


@pytest.mark.parametrize(("name", "argv", "valid"), list(_cases()), ids=[c[0] for c in _cases()])
def test_every_bad_input_is_one_line_naming_it(tmp_path: Path, name: str, argv: tuple[str, ...], valid) -> None:
    kinds = _bad_inputs(tmp_path / "bad")
    store = tmp_path / "store"
    checked = 0
    for kind, path in kinds.items():
        if kind in valid:
            continue
        args = [a.replace("{}", str(path)) for a in argv]
        if args[0] in ("records", "replay", "diff"):
            args += ["--store", str(store)]
        code, _, err = run_main(args)
        lines = err.splitlines()
        where = f"{name} with {kind} {path}"
        assert code == 1, f"{where}: exit {code}, stderr {err!r}"
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{where}: {err!r}"
        # The line names the input: the path as given, its file name, or the option it was passed to.
        assert str(path) in lines[0] or path.name in lines[0], f"{where}: {lines[0]}"
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize(
    ("stdin", "needle"),
    [
        (b"", "RequestJSONError: stdin: is empty"),
        (b" \n", "RequestJSONError: stdin: holds only whitespace"),
        (b'{"messages": [', "RequestJSONError: stdin line 1 column 15 (byte 14): invalid JSON"),
        (b'{"messages":[{"role":"user","content":"ab\xffcd"}]}', "stdin byte 41: invalid UTF-8"),
    ],
    ids=["empty", "blank", "truncated", "bad-utf8"],
)
def test_stdin_errors_name_stdin(stdin: bytes, needle: str) -> None:
    for command in (["render", "-m", "book", "-"], ["fit", "-m", "book", "--max-input-tokens", "50", "-"]):
        code, out, err = run_main(command, stdin)
        assert code == 1 and err.count("\n") == 1 and needle in err, err
    code, out, err = run_main(["render", "-m", "book", "--json", "-"], stdin)
    assert json.loads(out)["error"]["path"].startswith("stdin")


def test_request_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "messages": [,]\n}', "utf-8")
    code, _, err = run_main(["render", "-m", "book", str(bad)])
    assert code == 1 and f"RequestJSONError: REQUEST {bad} line 2 column 16 (byte 17): invalid JSON" in err
    # The hint names the option, not the Python keyword.
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('{"messages":[{"role":"user","content":"café"}]}'.encode("latin-1"))
    code, _, err = run_main(["render", "-m", "book", str(latin1)])
    assert code == 1 and f"REQUEST {latin1} byte 42" in err and "pass --utf8 replace" in err
    assert "utf8='replace'" not in err


def test_a_template_syntax_error_names_the_file(tmp_path: Path) -> None:
    template = tmp_path / "broken.jinja"
    template.write_text("hello\n{% if x %}\n{{ messages[0].content\n", "utf-8")
    code, _, err = run_main(["render", "-m", "book", "-t", str(template), str(EXAMPLE)])
    assert code == 1 and f"TemplateSyntaxError: {template} line 3: " in err, err


def test_hints_name_commands_not_python_functions(tmp_path: Path) -> None:
    code, _, err = run_main(["records", "show", "abcdef012345", "--store", str(tmp_path / "store")])
    assert code == 1 and "`ctxlock records list`" in err, err
    assert not re.search(r"\(`?list_records`?\)? shows", err)


def test_reserved_template_variables_say_what_is_true() -> None:
    code, _, err = run_main(["render", "-m", "book", "--var", "return_assistant_tokens_mask=true", str(EXAMPLE)])
    assert code == 2 and err.count("\n") == 1
    assert "set by ctxlock itself" not in err
    assert "return_assistant_tokens_mask is an argument of transformers' apply_chat_template" in err
    assert "encode(..., return_assistant_tokens_mask=True)" in err and "ctxlock inspect" in err
    code, _, err = run_main(["render", "-m", "book", "--var", "add_generation_prompt=false", str(EXAMPLE)])
    assert code == 2 and "--no-generation-prompt" in err
    code, _, err = run_main(["render", "-m", "book", "--var", "bos_token='\"x\"'", str(EXAMPLE)])
    assert code == 2 and "model's special tokens" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["render", "--bogus"],
        ["render", "-m", "book", "--injection", "maybe", str(EXAMPLE)],
        ["render", "a.json", "b.json"],
        ["diff"],
        ["tokenize", "-m", "book"],
        ["detok", "-m", "book"],
        ["render", "-m", "book", "--now", "yesterday", str(EXAMPLE)],
        ["records"],
        ["no-such-command"],
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_usage_errors_are_one_line_and_exit_2(argv: list[str]) -> None:
    code, _, err = run_main(argv)
    assert code == 2, err
    (line,) = err.splitlines()
    assert line.startswith("error: usage: ") and re.search(r"\(see `ctxlock( [a-z-]+)? --help`\)$", line), line
    code, out, err = run_main([*argv, "--json"])
    assert code == 2 and err.count("\n") == 1
    assert json.loads(out)["error"]["type"] == "UsageError"


def test_the_readme_documents_the_exit_statuses_the_code_uses() -> None:
    from ctxlock import cli as cli_module

    readme = (ROOT / "docs" / "render.md").read_text("utf-8")
    section = readme.split("### Errors and exit statuses", 1)[1].split("\n## ", 1)[0]
    for status, what in (
        (cli_module.EXIT_ERROR, "error: <Type>: <where>: <message> (<hint>)"),
        (cli_module.EXIT_USAGE, "error: usage: <message> (see `ctxlock COMMAND --help`)"),
    ):
        assert f"| {status} |" in section and what in section
    assert "exit status 1" not in readme.split("## The command line", 1)[1].split("### Errors and exit", 1)[0]


# -- item 11: smaller items --------------------------------------------------------------------------------------


def test_detok_says_which_stop_matched_and_the_finish_reason() -> None:
    code, out, err = run_main(["detok", "-m", "book", "--ids", "[7, 3, 4]", "--stop", "简洁"])
    assert code == 0 and json.loads(out) == ["", "", "", ""]
    assert err == "--ids: stop string '简洁' matched at character 0: finish_reason stop\n"
    code, out, err = run_main(["detok", "-m", "book", "--ids", "[7, 8]", "--stop", "nope", "--json"])
    assert json.loads(out) == {
        "pieces": ["简洁回答", "天空", ""],
        "text": "简洁回答天空",
        "finish_reason": None,
        "stop": None,
    }
    code, out, err = run_main(["detok", "-m", "book", "--ids", "[7, 8]", "--stop", "天", "--json"])
    assert json.loads(out)["stop"] == {"string": "天", "offset": 4} and json.loads(out)["finish_reason"] == "stop"
    code, out, err = run_main(["detok", "-m", "book", "--ids", "[7, 8]", "--stop", "x", "--max-tokens", "2"])
    assert err == "--ids: no stop string matched; the ids reached --max-tokens: finish_reason length\n"


def test_inspect_shows_what_add_special_tokens_adds() -> None:
    code, out, _ = run_main(["inspect", "-m", "mistral-nemo", "--json"])
    assert code == 0 and json.loads(out)["add_special_tokens"] == {"bos": [[1, "<s>"]], "eos": []}
    code, out, _ = run_main(["inspect", "-m", "mistral-nemo"])
    assert "add_special_tokens (tokenize --add-special-tokens) adds: BOS '<s>' (1) before the text, EOS nothing" in out
    code, out, _ = run_main(["inspect", "-m", str(fetched.gguf_path("qwen2")), "--json"])
    assert json.loads(out)["add_special_tokens"] == {"bos": [], "eos": []}


@pytest.mark.parametrize(
    "command", ["render", "tokenize", "inspect", "fit", "compact-plan", "detok", "constrain", "diff"]
)
def test_every_model_option_names_gguf_files_and_hub_revisions(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The help's words, not its layout, are checked: in this process (run_main), as `cli` would show them (no color,
    # no COLUMNS), without a child Python per command.
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, err = run_main([command, "--help"])
    assert code == 0, err
    flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split())
    assert ".gguf file" in flat and "org/name@revision" in flat, flat


def test_the_readme_diff_layer_order_is_the_code_and_help_order() -> None:
    from ctxlock.records import LAYERS

    readme = (ROOT / "docs" / "records.md").read_text("utf-8")
    match = re.search(r"The layers are checked in pipeline order,\s*\*\*([a-z_ →\n]+)\*\*", readme)
    assert match is not None
    assert tuple(match.group(1).split()[::2]) == LAYERS
    help_text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", cli("diff", "--help").stdout).split())
    listed = re.search(r"diverge \(([a-z_, ]+)\)", help_text)
    assert listed is not None and tuple(listed.group(1).split(", ")) == LAYERS


def test_make_demo_packaging_is_quiet() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    assert project["project"]["license"] == "Apache-2.0"  # SPDX: no setuptools deprecation block
    assert "setuptools>=77" in project["build-system"]["requires"]
    makefile = (ROOT / "Makefile").read_text("utf-8")
    recipe = makefile.split("$(VENV)/.installed: pyproject.toml", 1)[1].split("\n\n", 1)[0]
    assert "> $(VENV)/install.log 2>&1" in recipe and "cat $(VENV)/install.log" in recipe
    assert all(line.startswith("\t@") for line in recipe.splitlines()[1:] if line.startswith("\t") and line[1] != "\t")
    demo = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "\t@$(VENV)/bin/ctxlock render examples/seed-sky-injection.json" in demo
