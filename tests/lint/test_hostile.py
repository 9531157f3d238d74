"""Red-team cases for `ctxlock lint`: hostile templates, probe files and output paths, each held to the promise
that nothing is silent (a check that could not run says so) and every failure is one typed line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import fetched
from cli_runner import run_main
from ctxlock.lint import lint
from ctxlock.model import Model, load
from ctxlock.template import ChatTemplate


@pytest.fixture(scope="module")
def qwen2() -> Model:
    return load(str(fetched.gguf_path("qwen2")))


def test_a_template_that_raises_on_every_probe_lists_the_render_rules_as_not_run(qwen2: Model) -> None:
    # Before the fix every rule that reads renders found nothing and said nothing: a silent pass.
    source = "{% if flag %}a{% endif %}{{ raise_exception('no') }}"
    report = lint(qwen2, ChatTemplate(source, id="raises"), variables={"flag": True, "x": 1}, engines=())
    not_run = {s.rule for s in report.skipped}
    assert {"double-bos", "history-rewrite", "nondeterminism", "training-mask", "unread-argument"} <= not_run
    assert all("none of the 21 probes renders" in s.reason for s in report.skipped if s.rule != "portability")
    # a --var never read is still found (from the syntax tree); `flag` is not claimed to have no effect
    messages = [f.message for f in report.findings if f.rule == "unread-argument"]
    assert messages == ["the template never reads 'x': passing x=1 changes nothing"]


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "q25.jinja"
    shutil.copy(fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja", path)
    return path


def test_fix_and_sarif_to_a_fifo_or_an_unwritable_file_are_one_error_line(qwen25: Path) -> None:
    # Before the fix, --fix FIFO waited for ever in open() (a FIFO opens when a reader comes), and a write the file
    # refused (/proc's files, a full disk) was a traceback.
    fifo = qwen25.parent / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that a regression fails rather than hangs
    base = [str(qwen25), "-m", str(fetched.gguf_path("qwen2")), "--engine", "none", "--rule", "double-bos"]
    for args, said in (
        (["--fix", str(fifo)], f"error: InputError: --fix {fifo}: is a FIFO (named pipe), not a file"),
        (["--sarif", str(fifo)], f"error: InputError: --sarif {fifo}: is a FIFO (named pipe), not a file"),
        (["--fix", "/dev/full"], "error: InputError: --fix /dev/full: cannot write: No space left on device"),
    ):
        code, _, err = run_main(["lint", *base, *args])
        assert code == 1 and "Traceback" not in err
        hint = "file path in an existing directory" if "FIFO" in said else "file you can write"
        assert err.strip().splitlines() == [f"{said} (pass a {hint})"]
    os.close(reader)
