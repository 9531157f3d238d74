"""docs/template-checks.md's table is what `ctxlock lint` says over every fixture template today."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_table_is_the_linters_answer() -> None:
    spec = importlib.util.spec_from_file_location("lint_survey", ROOT / "scripts" / "lint_survey.py")
    assert spec is not None and spec.loader is not None
    survey = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(survey)
    page = survey.PAGE.read_text("utf-8")
    shown = page[page.index(survey.BEGIN) : page.index(survey.END) + len(survey.END)]
    assert shown == survey.block(), "run `python scripts/lint_survey.py --write` and review the change"
