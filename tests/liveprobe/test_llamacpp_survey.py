"""docs/live-probe.md's llama.cpp table: its rows for a sample of fixture templates, against fresh llama-servers.

The whole table (70 servers, about 3 minutes) is `scripts/llamacpp_survey.py --write`; the sample is the families
whose rows show each kind of answer: agreement (Qwen2.5), a message llama.cpp rewrites (Gemma 2's system turn), a
template variable llama.cpp sets (Llama 3.1's date_string)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = [
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "google-gemma-2-2b-it.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
]


@pytest.fixture(scope="module")
def survey():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("llamacpp_survey", ROOT / "scripts" / "llamacpp_survey.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sample_rows_are_what_the_servers_answer(survey) -> None:  # type: ignore[no-untyped-def]
    page = survey.PAGE.read_text("utf-8")
    table = page[page.index(survey.BEGIN) : page.index(survey.END)]
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines() if line.startswith("| `")}
    assert len(rows) == 70, "run `python scripts/llamacpp_survey.py --write`"
    for entry in survey.survey(SAMPLE):
        assert rows[entry["template"]] == survey.row(entry), "run `python scripts/llamacpp_survey.py --write`"
