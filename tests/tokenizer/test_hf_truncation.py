"""Issue 15 item 2: a tokenizer.json's `truncation` and `padding` sections are never applied to a chat render.

transformers switches both off in `apply_chat_template`; fine-tuned checkpoints often carry them. The directory is
the cached qwen2 vocabulary with `max_length: 4` truncation and fixed padding to 10, under the generic backend and
under Qwen2Tokenizer (which carries the sections into the backend it rebuilds). `inspect` shows the sections, and
`tokenize --truncate` applies the truncation only when asked, saying what it cut.
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
from cli_runner import run_main
from ctxlock.records import RunOptions, build_record
from hf_dirs import NON_NFC, auto_tokenizer, build_dir, reference_chat_ids
from hypothesis_profiles import examples

pytestmark = pytest.mark.reference

TRUNCATION = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
PADDING = {
    "strategy": {"Fixed": 10},
    "direction": "Right",
    "pad_to_multiple_of": None,
    "pad_id": 151643,
    "pad_type_id": 0,
    "pad_token": "<|endoftext|>",
}
MESSAGE = "one two three four five six seven eight"  # 8 tokens in this vocabulary


def _sections(data: dict[str, Any]) -> None:
    data["truncation"] = dict(TRUNCATION)
    data["padding"] = dict(PADDING)


@pytest.fixture(scope="module", params=["TokenizersBackend", "Qwen2Tokenizer"])
def truncating_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dir(tmp_path_factory.mktemp("trunc") / request.param, "qwen2", request.param, edit=_sections)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The command in this process (`cli_runner.run_main`: a traceback fails the test), 200 columns wide."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "200")  # no wrapping in the human view
        code, out, err = run_main(list(args))
    return subprocess.CompletedProcess(list(args), code, out, err)


@functools.cache
def _reference(path: Path) -> Any:
    """transformers' tokenizer of the directory, loaded once per directory (hypothesis calls a test many times)."""
    return auto_tokenizer(path)


def test_the_file_would_cut_and_pad(truncating_dir: Path) -> None:
    """The premise: the file's own pipeline truncates to 4 and pads to 10 (so ignoring it is a real choice)."""
    raw = tokenizers.Tokenizer.from_file(str(truncating_dir / "tokenizer.json")).encode(MESSAGE)
    assert len([i for i, m in zip(raw.ids, raw.attention_mask, strict=True) if m]) == 4 and len(raw.ids) == 10


def test_chat_render_is_neither_truncated_nor_padded(truncating_dir: Path) -> None:
    ref, model = _reference(truncating_dir), ctxlock.load(str(truncating_dir))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": MESSAGE}]
    expected = reference_chat_ids(ref, messages)
    got = model.encode({"messages": messages})
    assert list(model.run({"messages": messages}).tokenized.ids) == expected
    assert got.input_ids.tolist() == [expected] and got.attention_mask.tolist() == [[1] * len(expected)]
    assert len(model.tokenizer.encode(MESSAGE)) == 8  # plain encode: not truncated either


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(codec="utf-8"), max_size=30) | st.sampled_from(NON_NFC))
def test_generated_chats_match_apply_chat_template(truncating_dir: Path, text: str) -> None:
    ref, model = _reference(truncating_dir), ctxlock.load(str(truncating_dir))
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": MESSAGE}]
    assert list(model.run({"messages": messages}).tokenized.ids) == reference_chat_ids(ref, messages)


def test_inspect_and_record_show_the_sections(truncating_dir: Path) -> None:
    model = ctxlock.load(str(truncating_dir))
    desc = model.artifacts.describe()["tokenizer"]
    assert desc["truncation"] == TRUNCATION and desc["padding"] == PADDING
    out = _cli("inspect", "--model", str(truncating_dir))
    assert out.returncode == 0, out.stderr
    assert "truncation in tokenizer.json, not applied" in out.stdout
    assert "padding    in tokenizer.json, not applied" in out.stdout
    record = build_record(
        model=model,
        request_bytes=b"{}",
        options=RunOptions(),
        run=model.run({"messages": [{"role": "user", "content": MESSAGE}]}),
    )
    assert record.data["tokenizer"]["ignored_sections"] == {"truncation": TRUNCATION, "padding": PADDING}


def test_tokenize_truncates_only_when_asked(truncating_dir: Path) -> None:
    plain = json.loads(_cli("tokenize", "--model", str(truncating_dir), "--text", MESSAGE, "--json").stdout)
    assert plain["count"] == 8
    assert plain["truncation"]["applied"] is False and plain["truncation"]["section"] == TRUNCATION
    cut = json.loads(_cli("tokenize", "--model", str(truncating_dir), "--text", MESSAGE, "--truncate", "--json").stdout)
    reference = tokenizers.Tokenizer.from_file(str(truncating_dir / "tokenizer.json"))
    reference.no_padding()
    assert cut["ids"] == reference.encode(MESSAGE, add_special_tokens=False).ids == plain["ids"][:4]
    assert cut["truncation"] | {"section": None} == {
        "applied": True,
        "section": None,
        "max_length": 4,
        "direction": "right",
        "strategy": "longest_first",
        "stride": 0,
        "ids_before": 8,
        "ids_after": 4,
        "dropped": 4,
    }
    human = _cli("tokenize", "--model", str(truncating_dir), "--text", MESSAGE)
    assert "was not applied; --truncate applies it" in human.stdout


def test_truncate_without_a_section_is_a_clean_error() -> None:
    out = _cli("tokenize", "--model", "book", "--text", "x", "--truncate")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "no truncation section" in out.stderr + out.stdout
