"""Tool-call arguments sent as a JSON string (issue 15, item 4).

By default ctxlock renders the object the string holds (as vLLM does); `tool_arguments="as-sent"` renders the string
byte for byte (as transformers does). The option is a parse option, recorded in the record, replayed, and a flag of
`ctxlock render`. The README lists the difference.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
import reference
from conformance import FIXED_NOW, conversations, string_argument_paths, with_parsed_arguments
from ctxlock.core._frozen import FrozenDict
from ctxlock.errors import RequestValidationError
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate
from hypothesis_profiles import examples

pytestmark = pytest.mark.reference

ROOT = Path(__file__).parents[2]
CORPUS = {name: (data, options) for name, data, options in conversations()}
QWEN = "Qwen-Qwen2.5-7B-Instruct.jinja"
ARGS = '{"value": 42.195,  "from_unit":"km", "to_unit": "mi"}'  # spacing no serializer writes


def _request(arguments: Any) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "Convert."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c7Tn4RbQz", "type": "function", "function": {"name": "convert", "arguments": arguments}}
                ],
            },
            {"role": "tool", "tool_call_id": "c7Tn4RbQz", "content": "26.2188"},
        ]
    }


@pytest.fixture(scope="module")
def qwen() -> tuple[ctxlock.Model, ChatTemplate, str, Path]:
    source = (fetched.templates_dir() / QWEN).read_text("utf-8")
    tok_dir = fetched.hf_tokenizer_dir("qwen2")
    return ctxlock.load(str(tok_dir)), ChatTemplate(source, id=QWEN), source, tok_dir


def test_the_default_parses_and_as_sent_keeps_the_string() -> None:
    parsed = parse_request(_request(ARGS))
    kept = parse_request(_request(ARGS), tool_arguments="as-sent")
    assert parsed.messages[1].tool_calls[0].arguments == FrozenDict(
        {"value": 42.195, "from_unit": "km", "to_unit": "mi"}
    )
    assert kept.messages[1].tool_calls[0].arguments == ARGS
    assert kept.template_messages()[1]["tool_calls"][0]["function"]["arguments"] == ARGS
    assert parsed != kept  # the template sees different values
    # An object sent as an object is the same object in both modes.
    as_object = _request({"value": 1})
    assert parse_request(as_object) == parse_request(as_object, tool_arguments="as-sent")


@pytest.mark.parametrize("mode", ["parsed", "as-sent"])
@pytest.mark.parametrize(
    ("arguments", "message"),
    [("{", "not valid JSON"), ("", "not valid JSON"), ("[1]", "must decode to a JSON object"), ("7", "object")],
)
def test_both_modes_require_a_json_object(mode: str, arguments: str, message: str) -> None:
    with pytest.raises(RequestValidationError) as err:
        parse_request(_request(arguments), tool_arguments=mode)
    assert err.value.path == "messages[1].tool_calls[0].function.arguments"
    assert message in err.value.message


def test_an_unknown_mode_is_a_typed_error() -> None:
    with pytest.raises(RequestValidationError) as err:
        parse_request(_request(ARGS), tool_arguments="raw")
    assert err.value.path == "tool_arguments"
    assert "as-sent" in err.value.hint


@pytest.mark.parametrize("name", ["07_tool_call_arguments_string", "18_openai_wire_tool_call"])
def test_qwen25_ids_parsed_differ_and_as_sent_equal_transformers(qwen, name: str) -> None:
    model, template, source, tok_dir = qwen
    data, options = CORPUS[name]
    assert string_argument_paths(data)
    raw = copy.deepcopy(data)
    expected = reference.reference_ids(tok_dir, source, raw["messages"], tools=raw.get("tools"), **options)
    kept = model.run(data, chat_template=template, now=FIXED_NOW, tool_arguments="as-sent", **options)
    parsed = model.run(data, chat_template=template, now=FIXED_NOW, **options)
    assert list(kept.tokenized.ids) == expected
    assert list(parsed.tokenized.ids) != expected
    assert len(parsed.tokenized.ids) == len(expected) - 2  # 327 vs 329 (07), 302 vs 304 (18): the README's figures
    # The default is exactly transformers on the raw request with the strings parsed: the documented difference.
    parsed_raw = with_parsed_arguments(data)
    assert list(parsed.tokenized.ids) == reference.reference_ids(
        tok_dir, source, parsed_raw["messages"], tools=parsed_raw.get("tools"), **options
    )


@settings(max_examples=examples(40), deadline=None)
@given(
    value=st.dictionaries(
        st.text(max_size=5), st.integers() | st.text(max_size=6) | st.booleans() | st.none(), max_size=3
    ),
    indent=st.sampled_from([None, 0, 2]),
    separators=st.sampled_from([None, (",", ":"), (" ,", " : ")]),
)
def test_as_sent_renders_the_string_as_transformers_does(value: dict, indent: Any, separators: Any) -> None:
    source = (fetched.templates_dir() / QWEN).read_text("utf-8")
    arguments = json.dumps(value, ensure_ascii=False, indent=indent, separators=separators)
    data = _request(arguments)
    raw = copy.deepcopy(data)
    expected = reference.reference_render(source, raw["messages"], add_generation_prompt=True)
    request = parse_request(data, tool_arguments="as-sent")
    ours = ctxlock.load("book").render(request, chat_template=ChatTemplate(source, id=QWEN), now=FIXED_NOW)
    assert ours.text == expected
    assert json.dumps(arguments, ensure_ascii=False) in ours.text


def test_the_option_is_recorded_and_replayed(qwen, tmp_path) -> None:
    from ctxlock.records import RunOptions
    from ctxlock.records._replay import replay, run_and_record, save
    from ctxlock.records._store import Store

    model, template, _, _ = qwen
    data, options = CORPUS["07_tool_call_arguments_string"]
    raw = json.dumps(data).encode()
    store = Store(tmp_path)
    ids = {}
    for mode in ("parsed", "as-sent"):
        run_options = RunOptions(now=FIXED_NOW.isoformat(), tool_arguments=mode, **options)
        run, record, error = run_and_record(model, raw, run_options, template=template)
        assert error is None
        assert record.data["options"]["tool_arguments"] == mode
        save(store, model, record, template)
        diff, again = replay(record, store)
        assert diff.identical, diff
        assert again.data["options"]["tool_arguments"] == mode
        ids[mode] = list(run.tokenized.ids)
    assert ids["parsed"] != ids["as-sent"]
    # A record written before the option existed has no key: it replays as the default.
    assert RunOptions.from_dict({"utf8": "strict"}).tool_arguments == "parsed"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(Path(ctxlock.__file__).parent.parent), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    return subprocess.run(
        [sys.executable, "-m", "ctxlock", *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def test_cli_render_tool_arguments_flag() -> None:
    path = str(ROOT / "tests" / "data" / "conversations" / "07_tool_call_arguments_string.json")
    sent = json.loads(Path(path).read_text("utf-8"))["messages"][1]["tool_calls"][0]["function"]["arguments"]
    kept = _cli("render", path, "--model", "book", "--template", str(fetched.templates_dir() / QWEN), "--json")
    assert kept.returncode == 0, kept.stderr
    # Qwen2.5 writes `arguments|tojson`: the parsed object as an object, the string kept as sent as a JSON string.
    assert json.dumps(sent) not in json.loads(kept.stdout)["text"]
    assert f'"arguments": {sent}' in json.loads(kept.stdout)["text"]
    out = _cli(
        "render", path, "--model", "book", "--template", str(fetched.templates_dir() / QWEN), "--json",
        "--tool-arguments", "as-sent",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f'"arguments": {json.dumps(sent)}' in json.loads(out.stdout)["text"]
    bad = _cli("render", path, "--model", "book", "--tool-arguments", "raw")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "--tool-arguments" in _cli("render", "--help").stdout


def test_the_readme_lists_the_difference_and_its_option() -> None:
    text = (ROOT / "docs" / "differences.md").read_text("utf-8")
    section = text.split("## Differences from the references", 1)[1].split("\n## ", 1)[0]
    assert "as-sent" in section and "--tool-arguments" in section and "vLLM" in section
    assert "327" in section and "329" in section
