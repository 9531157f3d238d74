"""docs/template-checks.md's table is what `ctxlock lint` says over every fixture template today.

The survey (scripts/lint_survey.py's `block()`: `ctxlock lint` on each fixture template) runs once for the module.
One test compares the block around the rows (the totals, the header, which rows and in what order), one test per
template compares its row: together, the whole block. A failure names the rows that changed; and a file of 71
tests is scheduled by `--dist loadfile` (which hands out the files with the most tests first) among the large files,
where a single test of about 15 s was among the last, its time at the end of one worker idle time for the other.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import fetched

ROOT = Path(__file__).resolve().parents[2]
FIX = "run `python scripts/lint_survey.py --write` and review the change"
Split = tuple[list[str], dict[str, str]]


def _split(block: str) -> Split:
    """The block's lines other than the rows (a row's place kept as its template's name), and the rows by name."""
    around: list[str] = []
    rows: dict[str, str] = {}
    for line in block.splitlines():
        if line.startswith("| `"):
            name = line.split("`")[1]
            rows[name] = line
            around.append(f"<row {name}>")
        else:
            around.append(line)
    return around, rows


@pytest.fixture(scope="module")
def survey() -> tuple[Split, Split]:
    """(the page's block, the linter's block now), each split by `_split`."""
    spec = importlib.util.spec_from_file_location("lint_survey", ROOT / "scripts" / "lint_survey.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = module.PAGE.read_text("utf-8")
    shown = page[page.index(module.BEGIN) : page.index(module.END) + len(module.END)]
    return _split(shown), _split(module.block())


def test_the_docs_table_is_the_linters_answer(survey: tuple[Split, Split]) -> None:
    (shown, _), (generated, _) = survey
    assert shown == generated, FIX


@pytest.mark.parametrize("name", sorted(p.name for p in fetched.template_paths()))
def test_the_row_of_each_template(survey: tuple[Split, Split], name: str) -> None:
    (_, shown), (_, generated) = survey
    assert shown.get(name) == generated[name], FIX
