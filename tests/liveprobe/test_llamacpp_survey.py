"""docs/live-probe.md's llama.cpp table: the whole table against the page's list of causes, and the rows of one
template for each cause against fresh llama-servers.

What a fresh survey costs with the suite's llama-server (tests/llama_server.py; measured on the 2-core test machine
while a suite ran): about 1 s per template (0.6 s to start a server on its tiny GGUF, then the 21 probes and the
stop) and 1 to 4.5 s per vocabulary (writing its tiny GGUF, loading it in ctxlock), so 2 minutes for all 70
templates and still about a minute for the 52 whose rows differ. Neither fits this file's budget (about 10 s more
than its former three-template sample), so the choice is:

- every row, from one pass over the page's table: one row per fixture template, its vocabulary the pairing's, its
  counts adding up (the probes that agree or both refuse, the divergences by cause and the one probe not sent,
  `documents`), a `why` on exactly the rows that diverge, naming only causes the page's list explains, and the list
  holding no cause no row names; `WHY` in scripts/llamacpp_survey.py (which `--write` refuses to run without) is the
  table's column;
- live, `SAMPLE`: one template for each cause of the list (and one that agrees throughout), nine servers on three
  vocabularies (about 9 s more than the three templates this file surveyed before), whose rows must be the page's
  character for character. Not live: the "added token" cause (the deepseek-llm vocabulary would cost another 4 s);
  its row is checked with the rest.

`python scripts/llamacpp_survey.py --write` regenerates the whole table."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import fetched
from conformance import vocab_for

ROOT = Path(__file__).resolve().parents[2]
# One template per cause of the page's list (the comment names what it shows), and Qwen 2.5, which agrees throughout.
SAMPLE = [
    "Qwen-Qwen2.5-7B-Instruct.jinja",  # every probe agrees
    "llama-cpp-rwkv-world.jinja",  # enable_thinking, no generation prompt, continuation
    "LFM2.5-8B-A1B.jinja",  # reasoning kept, content parts
    "openai-gpt-oss-120b.jinja",  # family handler (and `clock`)
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja",  # tools undefined, undefined in +
    "Kimi-K2-Instruct.jinja",  # engine
    "google-gemma-2-2b-it.jinja",  # system folded
    "meta-llama-Llama-3.1-8B-Instruct.jinja",  # date
    "microsoft-Phi-3.5-mini-instruct.jinja",  # Phi-3.5 tokens: a BOS the server adds, named first
]
NOT_LIVE = {"added token"}
PROBES = 21  # the corpus; `documents` is never sent to llama.cpp


@pytest.fixture(scope="module")
def survey() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llamacpp_survey", ROOT / "scripts" / "llamacpp_survey.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page_section(survey: ModuleType) -> tuple[str, dict[str, list[str]]]:
    """The explanations above the table, and the table's rows by template (their cells)."""
    page = survey.PAGE.read_text("utf-8")
    head = page.index("## llama.cpp's engine against jinja2, on the fixture templates")
    table = page[page.index(survey.BEGIN) : page.index(survey.END)]
    rows = {}
    for line in table.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows[cells[0].strip("`")] = cells
    return page[head : page.index(survey.BEGIN)], rows


def labels(cell: str) -> list[str]:
    return [x.strip() for x in cell.split(",") if x.strip()]


def test_every_row_of_the_table_and_its_causes(survey: ModuleType) -> None:
    explanations, rows = page_section(survey)
    assert sorted(rows) == sorted(p.name for p in fetched.template_paths()), "run scripts/llamacpp_survey.py --write"
    listed = re.findall(r"^- \*\*(.+?)\*\*:", explanations, re.MULTILINE)
    named: set[str] = set()
    for name, (_, vocab, agree, causes, probes, first, why) in rows.items():
        assert vocab == vocab_for(name), name
        m = re.fullmatch(r"(\d+) of (\d+)", agree)
        assert m is not None and int(m.group(2)) == PROBES, name
        counts = [int(c.rsplit(" ", 1)[1]) for c in labels(causes)]
        assert int(m.group(1)) + sum(counts) + 1 == PROBES, name  # + `documents`, not sent
        assert len(labels(probes)) == sum(counts), name
        assert bool(labels(why)) == bool(counts) == bool(first), name
        assert tuple(labels(why)) == survey.WHY.get(name, ()), f"{name}: WHY and the page differ: run --write"
        named.update(labels(why))
    assert set(listed) == named, "every cause a row names is explained above the table, and every one is used"
    assert len(listed) == len(set(listed))
    sampled = {x for t in SAMPLE for x in survey.WHY.get(t, ())}
    assert sampled | NOT_LIVE == named, "SAMPLE has a template for each cause but NOT_LIVE's"


@pytest.fixture(scope="module")
def live(survey: ModuleType, tiny_qwen2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    import ctxlock

    work = tmp_path_factory.mktemp("survey")
    ggufs = {"qwen2": tiny_qwen2_gguf}  # the session's, when this process has written it already
    models = {"qwen2": ctxlock.load(str(tiny_qwen2_gguf))}
    yield [survey.survey_one(name, work, models, ggufs) for name in SAMPLE]


def test_the_sample_rows_are_what_the_servers_answer(survey: ModuleType, live: list) -> None:
    _, rows = page_section(survey)
    for entry in live:
        assert entry["started"], entry
        got = [c.strip() for c in re.split(r"(?<!\\)\|", survey.row(entry))[1:-1]]
        assert rows[entry["template"]] == got, "run `python scripts/llamacpp_survey.py --write`"
    phi = next(e for e in live if e["template"].startswith("microsoft-Phi-3.5"))
    user = next(r for r in phi["results"] if r["probe"] == "user")
    assert user["cause"] == "tokenizer"
    assert user["detail"].startswith("the server's ids start with a BOS, '<s>' (id 1), that ctxlock's lack; besides")
