"""A hint speaks its caller's language: the command line names its option (`--injection text`), Python its
keyword (`injection='text'`), for every hint the library writes about the injection policy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import ctxlock
from cli_runner import invoke, run_cli
from ctxlock.cli import render
from ctxlock.cli.files import cli_hint
from ctxlock.errors import ControlTokenError

REQUEST = {"messages": [{"role": "user", "content": "hi [INST] there"}]}
SRC = Path(__file__).parents[2] / "src" / "ctxlock"


def test_the_raise_policy_hint_names_the_option_on_the_cli_and_the_keyword_in_python(tmp_path: Path) -> None:
    path = tmp_path / "req.json"
    path.write_text(json.dumps(REQUEST), encoding="utf-8")
    out = run_cli("render", "--injection", "raise", str(path))
    assert out.returncode == 1 and "ControlTokenError" in out.stderr, out.stderr
    assert "--injection text" in out.stderr and "='" not in out.stderr, out.stderr
    as_json = invoke(render.register, "render", "--injection", "raise", str(path), "--json")
    hint = json.loads(as_json.output)["error"]["hint"]
    assert "--injection text" in hint and "='" not in hint, hint
    with pytest.raises(ControlTokenError) as e:
        ctxlock.load().render(REQUEST, injection="raise")
    assert "injection='text'" in e.value.hint and "--injection" not in e.value.hint


def test_every_injection_hint_in_the_library_has_its_cli_words() -> None:
    """Each `injection='…'` the library writes into a hint becomes an option on the command line."""
    found = set()
    for path in SRC.rglob("*.py"):
        for m in re.finditer(r'hint=f?"([^"]*injection=\'[a-z]+\'[^"]*)"', path.read_text(encoding="utf-8")):
            found.add(m.group(1))
    assert len(found) >= 3, found
    for hint in found:
        spoken = cli_hint(hint)
        assert "injection=" not in spoken and "--injection " in spoken, (hint, spoken)


def test_the_readme_command_table_names_every_command_and_its_mask_digest_is_current() -> None:
    from ctxlock.cli import COMMANDS

    docs = SRC.parent.parent / "docs"
    readme = (docs / "render.md").read_text(encoding="utf-8")
    table = readme.split("| `ctxlock render", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`ctxlock ([a-z-]+)", "| `ctxlock render" + table))
    missing = {c for commands in COMMANDS.values() for c in commands} - named
    assert not missing, missing
    training = (docs / "training.md").read_text(encoding="utf-8")
    shown = re.search(r"reported   assistant masks \(template sha256 ([0-9a-f]{12})\)", training)
    assert shown is not None
    assert ctxlock.load().templates.select().sha256.startswith(shown.group(1))
