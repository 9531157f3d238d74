"""A completion back into the assistant message: `parse_output`, `Model.parse_output`, `ctxlock parse` and the
round trip (the request rendered again with the parsed message reproduces the prompt and the output, or the report
names where the template rewrites it). The route is tested with the server (tests/server/test_serve.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
from cli_runner import run_main
from ctxlock.errors import CtxlockError, ReasoningError, ToolCallError
from ctxlock.generation import formats_for_template, parse_output
from hypothesis_profiles import examples
from reasoning_vocab import qwen3_model_dir

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
REQUEST = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> ctxlock.Model:
    return ctxlock.load(str(qwen3_model_dir(tmp_path_factory.mktemp("parse"))))


def test_formats_are_read_from_the_model_template_and_the_round_trip_reproduces(qwen3: ctxlock.Model) -> None:
    output = "<think>\nThe user wants Paris.\n</think>\n\nIt is sunny in Paris.<|im_end|>"
    ids = qwen3.tokenizer.encode(output, parse_special=True)
    for sent in (output, ids):
        p = qwen3.parse_output(sent, request=json.dumps(REQUEST).encode())
        assert (p.tool_format, p.reasoning_format) == ("hermes", "qwen3")
        assert (p.reasoning, p.content) == ("\nThe user wants Paris.\n", "\n\nIt is sunny in Paris.")
        assert any("end-of-turn token <|im_end|>" in n for n in p.notes)
        assert p.round_trip is not None and p.round_trip["reproduces"], p.round_trip
        assert p.round_trip["template_adds"] == "\n"
        if not isinstance(sent, str):
            assert p.round_trip["ids_reproduce"]


def test_a_call_after_reasoning_is_read_and_the_template_rewrite_is_named(qwen3: ctxlock.Model) -> None:
    """Qwen3 writes "</think>\n\n<tool_call>"; its template writes the same message back with one more newline
    before <tool_call> (the content "\n\n" is not empty, so it adds "\n"). The round trip says exactly that."""
    output = "<think>\nThe user wants Paris.\n</think>\n\n" + CALL + "<|im_end|>"
    ids = qwen3.tokenizer.encode(output, parse_special=True)
    for sent in (output, ids):
        p = qwen3.parse_output(sent, request=json.dumps(REQUEST).encode())
        assert [(c.name, c.arguments) for c in p.tool_calls] == [("get_weather", {"city": "Paris"})]
        assert p.finish_reason == "tool_calls" and p.content == "\n\n"
        rt = p.round_trip
        assert rt is not None and not rt["reproduces"]
        at = len("<think>\nThe user wants Paris.\n</think>\n\n")
        assert rt["first_difference"]["offset_in_output"] == at
        assert rt["first_difference"]["model_wrote"].startswith("<tool_call>")
        assert rt["first_difference"]["template_writes"].startswith("\n<tool_call>")


def test_the_round_trip_names_the_span_the_template_rewrites(qwen3: ctxlock.Model) -> None:
    """Qwen3's template writes the reasoning back with its leading newlines stripped: a model that opened with
    two is not reproduced, and the report says where."""
    output = "<think>\n\nHmm.\n</think>\n\nIt is sunny.<|im_end|>"
    p = qwen3.parse_output(output, request=json.dumps(REQUEST).encode())
    assert (p.reasoning, p.content) == ("\n\nHmm.\n", "\n\nIt is sunny.")
    rt = p.round_trip
    assert rt is not None and not rt["reproduces"]
    diff = rt["first_difference"]
    assert diff["offset_in_output"] == len("<think>\n")
    assert diff["model_wrote"].startswith("\nHmm.") and diff["template_writes"].startswith("Hmm.")


def test_a_response_cut_off_in_its_reasoning_has_no_content_and_no_call() -> None:
    out = "I should call get_weather</think>\n\n" + CALL
    p = parse_output(
        out[:20],
        tool_format="hermes",
        reasoning="deepseek_r1",
        tools=[WEATHER],
        finish_reason="length",
        starts="reasoning",
    )
    assert (p.content, p.tool_calls, p.reasoning_complete, p.finish_reason) == (None, (), False, "length")
    p = parse_output(
        out, tool_format="hermes", reasoning="deepseek_r1", tools=[WEATHER], finish_reason="length", starts="reasoning"
    )
    assert p.tool_calls == () and [type(e).__name__ for e in p.errors] == ["ToolCallTruncatedError"]
    assert p.to_anthropic()["stop_reason"] == "max_tokens"
    p = parse_output(out, tool_format="hermes", reasoning="deepseek_r1", tools=[WEATHER], starts="reasoning")
    assert p.to_anthropic() == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I should call get_weather"},
            {"type": "text", "text": "\n\n"},
            {"type": "tool_use", "id": "call00000", "name": "get_weather", "input": {"city": "Paris"}},
        ],
        "stop_reason": "tool_use",
    }


def test_llama_31s_end_of_message_token_ends_a_call() -> None:
    """Llama 3.1 (and functionary v3.1, its template) ends a turn that calls a tool with `<|eom_id|>`, one of its
    stop tokens: it ends the message, and is neither content nor part of the call."""
    out = '<function=get_weather>{"city": "Paris"}</function><|eom_id|>'
    p = parse_output(out, tool_format="functionary_v3_1", tools=[WEATHER])
    assert [(c.name, c.arguments) for c in p.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert p.content is None and "the end-of-turn token <|eom_id|>" in " ".join(p.notes)


def test_template_markers_name_the_formats() -> None:
    import fetched

    def of(name: str) -> tuple[Any, Any]:
        return formats_for_template((fetched.templates_dir() / name).read_text(encoding="utf-8"))[:2]

    assert of("Qwen-Qwen3-0.6B.jinja") == ("hermes", "qwen3")
    assert of("Qwen3-Coder.jinja")[0] == "qwen3_coder"
    assert of("openai-gpt-oss-120b.jinja") == ("harmony", "harmony")
    assert of("mistralai-Mistral-Nemo-Instruct-2407.jinja") == ("mistral", None)
    assert of("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")[1] == "deepseek_r1"
    assert of("MiniMax-M3.jinja")[1] == "minimax_m3" and of("MiniMax-M2.jinja")[1] == "qwen3"


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ToolCallError, match="unknown tool-call format 'x'"):
        parse_output("hi", tool_format="x")
    with pytest.raises(ToolCallError, match="provider's stream"):
        parse_output("hi", tool_format="openai")
    with pytest.raises(ReasoningError, match="need the model's tokenizer"):
        parse_output([1, 2])
    with pytest.raises(ReasoningError, match="unknown reasoning format"):
        parse_output("hi", reasoning="nope")


def test_the_command(qwen3: ctxlock.Model, tmp_path: Path) -> None:
    model_dir = str(qwen3.artifacts.source)
    (tmp_path / "req.json").write_text(json.dumps(REQUEST), encoding="utf-8")
    output = "<think>\nPlan.\n</think>\n\n" + CALL
    code, out, err = run_main(
        ["parse", "-", "-m", model_dir, "--request", str(tmp_path / "req.json")], stdin=output.encode()
    )
    report = json.loads(out)
    assert code == 0 and err == ""
    assert report["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert report["message"]["reasoning_content"] == "\nPlan.\n" and not report["round_trip"]["reproduces"]
    ids = json.dumps(qwen3.tokenizer.encode(output, parse_special=True))
    code, out, _ = run_main(
        ["parse", "-", "-m", model_dir, "--ids", "--finish-reason", "length", "--tools", str(tmp_path / "req.json")],
        stdin=ids.encode(),
    )
    assert code == 1 and json.loads(out)["errors"][0]["type"] == "ToolCallTruncatedError"
    code, out, err = run_main(["parse", "-", "-m", model_dir, "--ids"], stdin=b"[1, -4]")
    assert code != 0 and "not a token id" in err and "Traceback" not in err


MARKS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    '{"name": "get_weather", "arguments": {"city": "P"}}',
    "<|im_end|>",
    "{",
    '"',
    "\\",
]


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(st.sampled_from(MARKS) | st.text(max_size=8), max_size=10),
    finish=st.sampled_from(["stop", "length", None, "content_filter"]),
    as_ids=st.booleans(),
    reasoning=st.sampled_from([None, "qwen3"]),
)
def test_hostile_output_gives_a_message_or_a_typed_error_and_no_call_unless_it_ended_normally(
    qwen3: ctxlock.Model, parts: list[str], finish: Any, as_ids: bool, reasoning: Any
) -> None:
    text = "".join(parts)
    output: Any = qwen3.tokenizer.encode(text, parse_special=True) if as_ids else text
    try:
        p = qwen3.parse_output(output, tools=[WEATHER], tool_format="hermes", reasoning=reasoning, finish_reason=finish)
    except CtxlockError:
        return
    if finish not in ("stop",):
        assert p.tool_calls == ()
    if not p.reasoning_complete:
        assert p.content is None and p.tool_calls == ()
    for c in p.tool_calls:
        assert c.name == "get_weather" and c.arguments == {"city": "P"}


def test_a_harmony_message_after_a_finished_analysis_is_not_analysis() -> None:
    """The analysis ended at <|end|>; a message after it without <|start|> (not Harmony) is kept as content with a
    note, and the reasoning is complete (it used to be read as still inside the analysis, and the text dropped)."""
    out = "<|channel|>analysis<|message|>thinking chunk<|end|><|channel|>final<|message|>done text"
    p = parse_output(out, tool_format="harmony")
    assert (p.reasoning, p.content) == ("thinking chunk", "<|channel|>final<|message|>done text")
    assert p.reasoning_complete
    assert any("kept as text" in n for n in p.notes) and not any("incomplete" in n for n in p.notes)
    cut = parse_output(
        "<|channel|>final<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b", tool_format="harmony"
    )
    assert (cut.reasoning, cut.content, cut.reasoning_complete) == ("b", None, False)
