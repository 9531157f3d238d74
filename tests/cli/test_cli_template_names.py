"""`--template` takes a name of the model's template set as Python's `chat_template=` does (README, "--template"): a
value with no '/' and no '.' is a name (`default`, `tool_use`, `extra` for additional_chat_templates/extra.jinja),
anything else a file (`./extra` for a file named so). Every command with `--template` follows the one rule."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fetched
from cli_runner import invoke
from ctxlock.cli import budget, cachereport, clamp, compaction, count, explain, records, render
from ctxlock.model._model import load

DEFAULT = "{% for m in messages %}D:{{ m.content }}\n{% endfor %}"
EXTRA = "{% for m in messages %}EXTRA:{{ m.content }}\n{% endfor %}"
TOOL_USE = "{% for m in messages %}TOOLS:{{ m.content }}\n{% endfor %}"
FILE = "{% for m in messages %}FILE:{{ m.content }}\n{% endfor %}"
REQUEST = {"messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("names")
    model = root / "model"
    shutil.copytree(fetched.hf_tokenizer_dir("qwen2"), model)
    config = json.loads((model / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (model / "chat_template.jinja").write_text(DEFAULT, encoding="utf-8")
    (model / "additional_chat_templates").mkdir()
    (model / "additional_chat_templates" / "extra.jinja").write_text(EXTRA, encoding="utf-8")
    (model / "additional_chat_templates" / "tool_use.jinja").write_text(TOOL_USE, encoding="utf-8")
    request = root / "request.json"
    request.write_text(json.dumps(REQUEST), encoding="utf-8")
    return model, request


def test_render_and_count_take_a_name_as_python_does(setup: tuple[Path, Path], tmp_path: Path, monkeypatch) -> None:
    model, request = setup
    python = load(str(model)).render(REQUEST, chat_template="extra").text
    assert python.startswith("EXTRA:hello")
    for name, marker in (("extra", "EXTRA:hello"), ("tool_use", "TOOLS:hello"), ("default", "D:hello")):
        out = invoke(render.register, "render", "-m", str(model), "-t", name, str(request), "--json")
        assert out.exit_code == 0, out.output
        assert json.loads(out.output)["text"].startswith(marker), (name, out.output[:200])
        counted = invoke(count.register, "count", "-m", str(model), "-t", name, str(request), "--json")
        assert counted.exit_code == 0, counted.output
    # the same count as Python's chat_template="extra"
    extra_count = json.loads(
        invoke(count.register, "count", "-m", str(model), "-t", "extra", str(request), "--json").output
    )
    assert extra_count["total"] == len(load(str(model)).encode(REQUEST, chat_template="extra")["input_ids"][0])
    # the provider shape names the template it was counted with; an empty --template is refused in one line
    shaped = invoke(count.register, "count", "-m", str(model), "-t", "extra", str(request), "--format", "anthropic")
    assert shaped.exit_code == 0, shaped.output
    assert json.loads(shaped.output)["counted_by"]["template"] == "the model's 'extra'"
    empty = invoke(count.register, "count", "-m", str(model), "-t", "", str(request))
    assert empty.exit_code == 1 and "--template: the value is empty" in str(empty.exception), empty.exception
    # a file: any value with '/' or '.'; ./NAME for a file whose name has neither
    monkeypatch.chdir(tmp_path)
    Path("extra").write_text(FILE, encoding="utf-8")
    Path("t.jinja").write_text(FILE, encoding="utf-8")
    for value, marker in (("./extra", "FILE:hello"), ("t.jinja", "FILE:hello"), ("extra", "EXTRA:hello")):
        out = invoke(render.register, "render", "-m", str(model), "-t", value, str(request), "--json")
        assert out.exit_code == 0, out.output
        assert json.loads(out.output)["text"].startswith(marker), (value, out.output[:200])


COMMANDS = [
    (render.register, "render", []),
    (count.register, "count", []),
    (budget.register, "fit", ["--max-input-tokens", "100"]),
    (compaction.register, "compact-plan", ["--context-window", "1000"]),
    (clamp.register, "clamp", ["--max-tokens", "10", "--context-window", "1000"]),
    (explain.register, "explain", ["--find", "hello", "--request"]),
]


def _said(out) -> str:
    """What a command printed, and the typed error it ended with (the entry point prints it as one line)."""
    return out.output + ("" if out.exception is None else repr(out.exception))


def test_every_command_reads_a_name_as_a_name(setup: tuple[Path, Path], tmp_path: Path) -> None:
    """An unknown name is the model's TemplateNotFoundError listing the names it has (not a missing file), and a
    known one runs, on every command with --template."""
    model, request = setup
    for register, command, extra in COMMANDS:
        args = [*extra, str(request)]
        bad = invoke(register, command, "-m", str(model), "-t", "nosuch", *args)
        assert bad.exit_code != 0 and "TemplateNotFoundError" in _said(bad), (command, _said(bad))
        assert "extra" in _said(bad) and "tool_use" in _said(bad), (command, _said(bad))
        good = invoke(register, command, "-m", str(model), "-t", "extra", *args)
        assert good.exit_code in (0, 1) and "TemplateNotFoundError" not in _said(good), (command, _said(good))
    session = tmp_path / "session.jsonl"
    session.write_text(json.dumps(REQUEST) + "\n" + json.dumps(REQUEST) + "\n", encoding="utf-8")
    bad = invoke(
        cachereport.register, "cache-report", "--provider", "vllm", "-m", str(model), "-t", "nosuch", str(session)
    )
    assert "TemplateNotFoundError" in _said(bad), bad.output
    good = invoke(
        cachereport.register, "cache-report", "--provider", "vllm", "-m", str(model), "-t", "extra", str(session)
    )
    assert good.exit_code == 0, _said(good)
    # diff re-runs a record under a template of the model's set by name
    store = tmp_path / "store"
    rendered = invoke(
        render.register, "render", "-m", str(model), str(request), "--record", "--store", str(store), "--json"
    )
    assert rendered.exit_code == 0, rendered.output
    record_id = json.loads(rendered.output)["record_id"]
    out = invoke(records.register, "diff", record_id, "-t", "extra", "--store", str(store), "--json")
    assert "TemplateNotFoundError" in _said(out) and "--model" in _said(out), _said(out)  # the record has one
    out = invoke(records.register, "diff", record_id, "-m", str(model), "-t", "extra", "--store", str(store), "--json")
    assert "TemplateNotFoundError" not in _said(out) and "model/extra" in out.output, _said(out)[:400]
