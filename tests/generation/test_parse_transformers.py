"""`parse_output` against transformers' own response parser (`transformers.utils.chat_parsing.parse_response`,
transformers 5.24), for each response template of transformers' tests/utils/test_chat_parsing.py whose format
ctxlock reads: gpt-oss (harmony), SmolLM3 (`<think>` + hermes), Qwen3 (`<think>` + qwen3_coder, and the
schema-typed variant of its calls the same file tests) and ERNIE-4.5 (a template-opened `<think>` + hermes).

The templates are transformers' data, copied as written; so are the model outputs of its test cases and the message
dicts its tests expect. Two kinds of case: those outputs, and generated ones (reasoning, content and 0-3 calls in
each template's own format).

The comparison. transformers' `text` content parser strips the whitespace around a field (`content_args.strip`,
on by default) and a message leaves out a field that is empty; ctxlock keeps every character the model wrote, as the
round trip needs (docs/parse.md). So ctxlock's message is put in transformers' shape (`as_transformers`): reasoning
as `thinking` and content, each stripped and left out when empty; the calls as `{"type": "function", "function":
{"name", "arguments"}}` with the arguments as a dict. Nothing else is normalized. That the strip is the only change
is asserted on its own: ctxlock's text, stripped, is transformers' field, and (generated cases) unstripped it is
exactly what the model wrote.

Where the two differ beyond that, the case asserts both answers and says why; docs/parse.md "Parity with
transformers' parse_response" lists every such difference.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxlock.errors import ToolCallTruncatedError
from ctxlock.generation import ParsedMessage, parse_output
from hypothesis_profiles import examples

chat_parsing = pytest.importorskip("transformers.utils.chat_parsing")
parse_response = chat_parsing.parse_response

pytestmark = pytest.mark.reference

# ------------------------------------------------------------------------------------------------ the templates
# transformers' tests/utils/test_chat_parsing.py (huggingface/transformers): gpt_oss_template, smollm_template,
# qwen3_template, ernie_template, and _XML_STRING_ARGS_TEMPLATE (qwen3's calls without a value parser, so the
# declared tools type the arguments).

_TO_FUNCTION = {"type": "function", "function": "{content}"}
_NAMED = {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}
_QWEN3_CALL_OPEN = r"<tool_call>\s*<function=(?P<name>\w+)>"
_QWEN3_PARAMETER = r"<parameter=(?P<key>\w+)>\s*(?P<value>.*?)\s*</parameter>"

TEMPLATES: dict[str, dict[str, Any]] = {
    "gpt-oss": {
        "defaults": {"role": "assistant"},
        "start_anchor": "<|start|>assistant",
        "fields": {
            "thinking": {"open": "<|channel|>analysis<|message|>", "close": "<|end|>", "content": "text"},
            "content": {"open": "<|channel|>final<|message|>", "close": "<|end|>", "content": "text"},
            "tool_calls": {
                "open_pattern": r"<\|channel\|>commentary to=functions\.(?P<name>\w+).*?<\|message\|>",
                "close": "<|call|>",
                "repeats": True,
                "content": "json",
                "transform": _NAMED,
            },
        },
    },
    "smollm": {
        "defaults": {"role": "assistant"},
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "thinking": {"open": "<think>", "close": "</think>", "content": "text"},
            "tool_calls": {
                "open": "<tool_call>",
                "close": "</tool_call>",
                "repeats": True,
                "content": "json",
                "transform": _TO_FUNCTION,
            },
            "content": {"close": "<|im_end|>", "content": "text"},
        },
    },
    "qwen3": {
        "defaults": {"role": "assistant"},
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "thinking": {"open": "<think>", "close": "</think>", "content": "text"},
            "tool_calls": {
                "open_pattern": _QWEN3_CALL_OPEN,
                "close": "</tool_call>",
                "repeats": True,
                "content": "xml-inline",
                "content_args": {
                    "tag_pattern": _QWEN3_PARAMETER,
                    "value_parser": {"name": "json", "args": {"allow_non_json": True}},
                },
                "transform": _NAMED,
            },
        },
    },
    "qwen3-string-args": {
        "defaults": {"role": "assistant"},
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "tool_calls": {
                "open_pattern": _QWEN3_CALL_OPEN,
                "close": "</tool_call>",
                "repeats": True,
                "content": "xml-inline",
                "content_args": {"tag_pattern": _QWEN3_PARAMETER},
                "transform": _NAMED,
            },
        },
    },
    "ernie": {
        "defaults": {"role": "assistant"},
        "start_anchor": "Assistant:",
        "fields": {
            "thinking": {"open_pattern": r"(?:^|<think>\s*)", "close": "</think>", "content": "text"},
            "content": {"open": "<response>\n", "close_pattern": r"\n?</response>", "content": "text"},
            "tool_calls": {
                "open": "<tool_call>",
                "close": "</tool_call>",
                "repeats": True,
                "content": "json",
                "transform": _TO_FUNCTION,
            },
        },
    },
}
# Same calls, duplicates merged into a list (transformers' test_merge_duplicates_arguments_are_cast_element_wise).
TEMPLATES["qwen3-merge-duplicates"] = copy.deepcopy(TEMPLATES["qwen3-string-args"])
TEMPLATES["qwen3-merge-duplicates"]["fields"]["tool_calls"]["content_args"]["merge_duplicates"] = True


def ctxlock_formats(template: str) -> dict[str, Any]:
    """How each template's model writes, in ctxlock's words. SmolLM3 writes `<think>` itself (its template never
    opens a block the model continues), so its output starts in the content. ERNIE's template opens `<think>` in
    the prompt (transformers' template opens `thinking` at the start of the output), so its output starts inside
    reasoning, with the `<think>`/`</think>` tags of the deepseek_r1 family."""
    if template == "gpt-oss":
        return {"tool_format": "harmony"}
    if template == "smollm":
        return {"tool_format": "hermes", "reasoning": "qwen3", "starts": "content"}
    if template == "ernie":
        return {"tool_format": "hermes", "reasoning": "deepseek_r1", "starts": "reasoning"}
    return {"tool_format": "qwen3_coder", "reasoning": "qwen3"}


def ours(template: str, output: str, prefix: str, tools: list[dict[str, Any]], **kw: Any) -> ParsedMessage:
    """ctxlock's parse. transformers' `prefix` is the prompt: ctxlock reads from it whether the output starts
    inside reasoning (`prompt=`); `prefix=""` says the output is the whole message (`starts="content"`)."""
    formats = ctxlock_formats(template)
    if "starts" not in formats and template != "gpt-oss":
        formats.update({"prompt": prefix} if prefix else {"starts": "content"})
    return parse_output(output, tools=tools, **formats, **kw)


def as_transformers(p: ParsedMessage) -> dict[str, Any]:
    """ctxlock's message in transformers' shape, normalized as transformers' text fields are: stripped, and left
    out when empty. The calls are the ones ctxlock releases (a refused call is in `p.errors`, not here)."""
    message: dict[str, Any] = {"role": p.to_openai()["role"]}
    if p.reasoning is not None and p.reasoning.strip():
        message["thinking"] = p.reasoning.strip()
    if p.content is not None and p.content.strip():
        message["content"] = p.content.strip()
    if p.tool_calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in p.tool_calls
        ]
    return message


def tool(name: str, **properties: Any) -> dict[str, Any]:
    """A tool whose schema is as loose as the case allows: an object, with only the types a string-writing format
    (qwen3_coder) needs to turn a parameter's text back into a value."""
    parameters: dict[str, Any] = {"type": "object"}
    if properties:
        parameters["properties"] = properties
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def call(name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


LOOSE = [tool(n) for n in ("get_current_weather", "get_current_temperature", "greet_user", "get_weather", "fn", "foo")]
WEATHER_TYPED = [tool("get_weather", locations={"type": "array"}, temp_units={"type": "string"})]
ALARM = [tool("set_alarm", hour={"type": "integer"}, enabled={"type": "boolean"}, label={"type": "string"})]

# ----------------------------------------------------------------------------------- transformers' own cases


@dataclass(frozen=True)
class Case:
    """One model output of transformers' tests. `transformers`: the message its test expects (or, for outputs its
    tests only stream, what 5.24 returns), asserted first so the data stays transformers' own. `ours`: ctxlock's
    answer where it deliberately differs (None: the two are equal after the normalization), with `why`; `refused`:
    a fragment of the error of each call ctxlock refuses; `finish_reason`: how the response ended (transformers
    takes none)."""

    id: str
    template: str
    output: str
    transformers: dict[str, Any]
    prefix: str = ""
    tools: list[dict[str, Any]] = field(default_factory=lambda: LOOSE)
    ours: dict[str, Any] | None = None
    why: str = ""
    refused: tuple[str, ...] = ()
    finish_reason: str = "stop"


A = {"role": "assistant"}
GPT_OSS_THINKING = (
    'We need to respond in riddles. The user asks: "What is the weather like in SF?" We need to get the location of '
    "the user? The user explicitly asks about SF (San Francisco). So we need to get the current weather in San "
    'Francisco, CA. We need to call get_current_weather function. The developer instruction says "Always respond in '
    'riddles". So the final answer should be in a riddle form. But we need to call function to get weather data. So '
    'we should call get_current_weather with location "San Francisco, CA". Possibly specify format "celsius" '
    "(default). Let's do that.\n\nWe will call function get_current_weather."
)
SMOLLM_THINKING = (
    'Okay, the user said, "Hello! How are you?" I need to respond appropriately. Since this is the first message, I '
    "should greet them back and ask how I can assist. I should keep it friendly and open-ended. Let me make sure the "
    "response is welcoming and encourages them to share what they need help with. I'll avoid any technical jargon "
    "and keep it simple. Let me check for any typos and ensure the tone is positive."
)
SMOLLM_GREETING = (
    "Hello! I'm doing well, thanks for asking. How can I assist you today? Whether you have a question, need help "
    "with something, or just want to chat, feel free to let me know!"
)
GRAVITY = (
    'Okay, the user asked, "Hey! Can you tell me about gravity?" Let me start by breaking down what they might be '
    "looking for. They probably want a basic understanding of gravity, maybe for a school project or just personal "
    "curiosity. I should explain what gravity is, how it works, and maybe some examples."
)
ERNIE_TOOL_THINKING = (
    "The user is asking about the weather in Paris today. Let me check the available tools. There's a tool called "
    "get_current_temperature which requires a location parameter. Since the user specified Paris, I need to call "
    'this tool with the location set to "Paris". I should make sure the argument is correctly formatted as a '
    "string. No other tools are available, so this is the right one to use. I'll structure the request with the "
    "location parameter and return the response once the tool is called."
)
ERNIE_GREETING_THINKING = (
    'The user just greeted me with "Hi! How are you?" I need to respond in a friendly and helpful manner. Let me '
    "start by acknowledging their greeting. I should ask them how they're doing to engage in conversation.\n\n"
    "First, I'll say hello back and then ask how they're feeling. It's important to show genuine interest. Maybe "
    "mention that I'm here to help with anything they need. Keep the tone warm and positive. Let me make sure the "
    "response is concise but friendly. Alright, that should work."
)
ERNIE_GREETING = (
    "Hello! I'm doing well, thank you for asking. How about you? Is there something specific you'd like help with "
    "today? I'm here to assist you with any questions or problems you have!"
)
QWEN_PROMPT = "<|im_start|>system\nA<|im_end|>\n<|im_start|>user\nB<|im_end|>\n<|im_start|>assistant\n<think>\n"
SET_ALARM_CALL = (
    "<tool_call>\n<function=set_alarm>\n<parameter=hour>\n7\n</parameter>\n<parameter=enabled>\ntrue\n</parameter>\n"
    "<parameter=label>\nwake up\n</parameter>\n</function>\n</tool_call>"
)
LABEL_150 = "<tool_call>\n<function=set_alarm>\n<parameter=label>\n1.50\n</parameter>\n</tool_call>"
QWEN3_WEATHER = (
    "<tool_call>\n<function=get_weather>\n<parameter=locations>\n"
    '[{"country": "France", "city": "Paris"}]\n</parameter>\n'
    "<parameter=temp_units>\ncelsius\n</parameter>\n</function>\n</tool_call>"
)
QWEN3_WEATHER_ARGS = {"locations": [{"country": "France", "city": "Paris"}], "temp_units": "celsius"}
# get_json_schema of transformers' set_alarm(hour: int, enabled: bool, label: str | None = None)
ALARM_FROM_CALLABLE = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "description": "Set an alarm.",
        "parameters": {
            "type": "object",
            "properties": {
                "hour": {"type": "integer"},
                "enabled": {"type": "boolean"},
                "label": {"type": "string", "nullable": True},
            },
            "required": ["hour", "enabled"],
        },
    },
}

GPT_OSS = [
    Case(
        "test_gpt_oss_with_tool_call",
        "gpt-oss",
        "<|channel|>analysis<|message|>" + GPT_OSS_THINKING + "<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_current_weather <|constrain|>json<|message|>{\n  "location": "San Francisco, CA"\n}',
        {
            **A,
            "thinking": GPT_OSS_THINKING,
            "tool_calls": [call("get_current_weather", {"location": "San Francisco, CA"})],
        },
    ),
    Case(
        "test_gpt_oss_no_tool_call",
        "gpt-oss",
        "<|channel|>analysis<|message|>User asks a simple math question: 2+2 = 4. Provide answer."
        "<|end|><|start|>assistant<|channel|>final<|message|>2",
        {**A, "content": "2", "thinking": "User asks a simple math question: 2+2 = 4. Provide answer."},
    ),
    Case(
        "_STREAMING_FIXTURES gpt_oss_tool",
        "gpt-oss",
        "<|channel|>analysis<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_current_weather <|constrain|>json<|message|>{"location": "San Francisco, CA"}<|call|>',
        {
            **A,
            "thinking": "Let me check.",
            "tool_calls": [call("get_current_weather", {"location": "San Francisco, CA"})],
        },
    ),
    Case(
        "test_history_bleed_is_guarded_by_prefix_not_by_response_anchor",
        "gpt-oss",
        "<|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>final<|message|>answer",
        {**A, "thinking": "thinking", "content": "answer"},
    ),
    Case(
        "_STREAMING_FIXTURES gpt_oss",
        "gpt-oss",
        "<|channel|>analysis<|message|>thinking chunk<|end|><|channel|>final<|message|>done text",
        {**A, "thinking": "thinking chunk", "content": "done text"},
        ours={**A, "thinking": "thinking chunk", "content": "<|channel|>final<|message|>done text"},
        why="not Harmony: a message starts with <|start|>; the unread message is kept as content, never dropped",
    ),
]

SMOLLM = [
    Case(
        "test_smollm_thinking_and_tool_call",
        "smollm",
        "<think>\n"
        + SMOLLM_THINKING
        + '\n</think>\n\n<tool_call>{"name": "greet_user", "arguments": {"greeting": '
        + json.dumps(SMOLLM_GREETING)
        + "}}</tool_call>",
        {**A, "thinking": SMOLLM_THINKING, "tool_calls": [call("greet_user", {"greeting": SMOLLM_GREETING})]},
    ),
    Case(
        "test_smollm_tool_call_no_thinking",
        "smollm",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        {**A, "tool_calls": [call("get_weather", {"city": "Paris"})]},
    ),
    Case(
        "test_smollm_thinking_no_tool_call",
        "smollm",
        "<think>\n" + GRAVITY + "</think>\nSome content about gravity goes here but I'm cutting it off to make this "
        "shorter!",
        {
            **A,
            "content": "Some content about gravity goes here but I'm cutting it off to make this shorter!",
            "thinking": GRAVITY,
        },
    ),
    Case(
        "_STREAMING_FIXTURES smollm",
        "smollm",
        '<think>thinking</think>\n<tool_call>{"name": "fn", "arguments": {"x": 1}}</tool_call>',
        {**A, "thinking": "thinking", "tool_calls": [call("fn", {"x": 1})]},
    ),
    Case("test_empty_input_streams_cleanly", "smollm", "", A),
    Case("test_feed_after_finalize_raises", "smollm", "<think>x</think>", {**A, "thinking": "x"}),
    Case(
        "test_prefix_lands_inside_implicit_region",
        "smollm",
        "the answer<|im_end|>",
        {**A, "content": "Sure, here is the answer"},
        prefix="<|im_start|>assistant\nSure, here is ",
        ours={**A, "content": "the answer"},
        why="the prefill is the caller's own text, in the prompt; ctxlock's message is what the model wrote",
    ),
    Case(
        "test_round_trip_equivalence_prefix_streaming_vs_oneshot smollm",
        "smollm",
        '<think>thinking</think>\n<tool_call>{"name": "fn", "arguments": {"x": 1}}</tool_call>',
        {**A, "thinking": "<think>thinking", "tool_calls": [call("fn", {"x": 1})]},
        prefix=QWEN_PROMPT,
        ours={**A, "thinking": "thinking", "tool_calls": [call("fn", {"x": 1})]},
        why="SmolLM3's output starts in the content, so <think> opens the block (transformers: text inside one)",
    ),
]

QWEN3 = [
    Case(
        "test_qwen3_tool_calls",
        "qwen3",
        QWEN3_WEATHER,
        {**A, "tool_calls": [call("get_weather", QWEN3_WEATHER_ARGS)]},
        tools=WEATHER_TYPED,
    ),
    Case(
        "test_qwen3_tool_calls, the schema not typing `locations`",
        "qwen3",
        QWEN3_WEATHER,
        {**A, "tool_calls": [call("get_weather", QWEN3_WEATHER_ARGS)]},
        ours={
            **A,
            "tool_calls": [
                call("get_weather", {**QWEN3_WEATHER_ARGS, "locations": json.dumps(QWEN3_WEATHER_ARGS["locations"])})
            ],
        },
        why="a parameter is converted by its declared type; one the schema does not type stays text",
    ),
    Case(
        "_STREAMING_FIXTURES qwen3",
        "qwen3",
        "<think>short thought</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>",
        {**A, "thinking": "short thought", "tool_calls": [call("get_weather", {"city": "Paris"})]},
    ),
    Case(
        "test_prefix_lands_inside_explicit_region",
        "qwen3",
        "Let me think...</think>",
        {**A, "thinking": "Let me think..."},
        prefix="<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n",
    ),
    Case(
        "test_prefix_truncated_to_last_anchor",
        "qwen3",
        "done</think>",
        {**A, "thinking": "done"},
        prefix="<|im_start|>system\nA<|im_end|>\n<|im_start|>user\nB<|im_end|>\n<|im_start|>assistant\nEarlier reply"
        "<|im_end|>\n<|im_start|>user\nFollowup<|im_end|>\n<|im_start|>assistant\n<think>\n",
    ),
    Case("test_prefix_anchor_not_found_falls_back", "qwen3", "hi</think>", {**A, "thinking": "hi"}, prefix="<think>\n"),
    Case(
        "test_batched_parse_response_with_prefix A",
        "qwen3",
        "thinking A</think>answer A",
        {**A, "thinking": "thinking A"},
        prefix="<|im_start|>assistant\n<think>\n",
        ours={**A, "thinking": "thinking A", "content": "answer A"},
        why="transformers' qwen3 template declares no content field, so the answer is dropped",
    ),
    Case(
        "test_prefix_partial_pattern_at_boundary",
        "qwen3",
        "nk>real body</think>",
        {**A, "thinking": "real body"},
        prefix="<|im_start|>assistant\n<thi",
        ours={**A, "thinking": "nk>real body"},
        why="a tag is read in the output, never joined from the prompt's tail (a prompt cannot end inside a token)",
    ),
    Case(
        "test_round_trip_equivalence_prefix_streaming_vs_oneshot qwen3",
        "qwen3",
        "<think>short thought</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>",
        {**A, "thinking": "<think>short thought", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        prefix=QWEN_PROMPT,
        ours={**A, "thinking": "short thought", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        why="a <think> first in a block the template opened is the block's own tag, not reasoning text",
    ),
    Case(
        "test_qwen3_tools_coerces_strings_left_by_value_parser",
        "qwen3",
        SET_ALARM_CALL.replace("\n7\n", "\n007\n"),
        {**A, "tool_calls": [call("set_alarm", {"hour": 7, "enabled": True, "label": "wake up"})]},
        tools=ALARM,
        ours=A,
        why="007 is not a JSON integer: the arguments do not validate, and the call is refused",
        refused=("'007' is not of type 'integer'",),
    ),
    Case(
        "test_coercion_never_reworks_already_typed_values",
        "qwen3",
        LABEL_150,
        {**A, "tool_calls": [call("set_alarm", {"label": 1.5})]},
        tools=ALARM,
        ours={**A, "tool_calls": [call("set_alarm", {"label": "1.50"})]},
        why="the schema says string: the text stays a string (transformers decodes any JSON-looking value first)",
    ),
]

QWEN3_STRING_ARGS = [
    Case(
        "test_parse_response_tools_coerces_xml_inline_string_args",
        "qwen3-string-args",
        SET_ALARM_CALL,
        {**A, "tool_calls": [call("set_alarm", {"hour": 7, "enabled": True, "label": "wake up"})]},
        tools=ALARM,
    ),
    Case(
        "test_coercion_never_reworks_already_typed_values (no value parser)",
        "qwen3-string-args",
        LABEL_150,
        {**A, "tool_calls": [call("set_alarm", {"label": "1.50"})]},
        tools=ALARM,
    ),
    Case(
        "test_union_with_container_still_keeps_scalar_text",
        "qwen3-string-args",
        LABEL_150,
        {**A, "tool_calls": [call("set_alarm", {"label": "1.50"})]},
        tools=[tool("set_alarm", label={"anyOf": [{"type": "string"}, {"type": "object"}]})],
    ),
    Case(
        "test_union_with_container_still_keeps_scalar_text (object)",
        "qwen3-string-args",
        LABEL_150.replace("1.50", '{"a": 1}'),
        {**A, "tool_calls": [call("set_alarm", {"label": {"a": 1}})]},
        tools=[tool("set_alarm", label={"anyOf": [{"type": "string"}, {"type": "object"}]})],
    ),
    Case(
        "test_callable_tools_are_converted_to_schemas",
        "qwen3-string-args",
        SET_ALARM_CALL.replace("wake up", "null"),
        {**A, "tool_calls": [call("set_alarm", {"hour": 7, "enabled": True, "label": None})]},
        tools=[ALARM_FROM_CALLABLE],
        ours={**A, "tool_calls": [call("set_alarm", {"hour": 7, "enabled": True, "label": "null"})]},
        why='`nullable` is OpenAPI, not JSON Schema: a "string" parameter keeps the text null',
    ),
    Case(
        "test_merge_duplicates_arguments_are_cast_element_wise",
        "qwen3-merge-duplicates",
        "<tool_call>\n<function=set_alarm>\n<parameter=hour>\n7\n</parameter>\n<parameter=hour>\n9\n</parameter>\n"
        "</function>\n</tool_call>",
        {**A, "tool_calls": [call("set_alarm", {"hour": [7, 9]})]},
        tools=ALARM,
        ours=A,
        why="a declared parameter repeated after its own close is read as text of the first value (as vLLM's"
        " qwen3 parsers read literal tags in a value), so hour is not an integer and the call is refused",
        refused=("is not of type 'integer'",),
    ),
]

ERNIE = [
    Case(
        "test_ernie_with_tools",
        "ernie",
        ERNIE_TOOL_THINKING + '\n</think>\n\n<tool_call>\n{"name": "get_current_temperature", "arguments": '
        '{"location": "Paris"}}\n</tool_call>\n</s>',
        {
            **A,
            "thinking": ERNIE_TOOL_THINKING,
            "tool_calls": [call("get_current_temperature", {"location": "Paris"})],
        },
    ),
    Case(
        "test_ernie_no_tools",
        "ernie",
        ERNIE_GREETING_THINKING + "\n</think>\n\n<response>\n" + ERNIE_GREETING + "\n</response>\n</s>",
        {**A, "content": ERNIE_GREETING, "thinking": ERNIE_GREETING_THINKING},
        ours={**A, "content": "<response>\n" + ERNIE_GREETING + "\n</response>", "thinking": ERNIE_GREETING_THINKING},
        why="ctxlock has no ERNIE format: the <response> wrapper stays in the content",
    ),
    Case(
        "_STREAMING_FIXTURES ernie",
        "ernie",
        '<think>some deliberation here</think>\n\n<tool_call>\n{"name": "get_current_temperature", "arguments": '
        '{"location": "Paris"}}\n</tool_call>\n</s>',
        {
            **A,
            "thinking": "<think>some deliberation here",
            "tool_calls": [call("get_current_temperature", {"location": "Paris"})],
        },
        ours={
            **A,
            "thinking": "some deliberation here",
            "tool_calls": [call("get_current_temperature", {"location": "Paris"})],
        },
        why="transformers' open pattern (?:^|<think>\\s*) takes its empty branch first, so the tag lands in thinking",
    ),
]

CASES = GPT_OSS + SMOLLM + QWEN3 + QWEN3_STRING_ARGS + ERNIE

# Beyond transformers' tests: what each parser does with text around calls, a stop token, a preamble, a call it
# must not run, and a response cut off. `transformers` is what 5.24 returns.
NOT_RUN = "was not executed"
EDGES = [
    Case(
        "text before and after a call",
        "smollm",
        'Hello <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call> world',
        {**A, "content": "world", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        ours={**A, "content": "Hello  world", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        why="ctxlock keeps all the text; transformers' content field keeps the last run only",
    ),
    Case(
        "two reasoning blocks",
        "smollm",
        "<think>a</think>b<think>c</think>d",
        {**A, "thinking": "c", "content": "d"},
        ours={**A, "thinking": "ac", "content": "bd"},
        why="ctxlock keeps every block; transformers' thinking field keeps the last",
    ),
    Case(
        "a final message ending with its stop token",
        "gpt-oss",
        "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>"
        "It is sunny.<|return|>",
        {**A, "thinking": "Simple.", "content": "It is sunny.<|return|>"},
        ours={**A, "thinking": "Simple.", "content": "It is sunny."},
        why="<|return|> ends the message; transformers' template closes content at <|end|> only",
    ),
    Case(
        "a commentary preamble before a call",
        "gpt-oss",
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        {**A, "tool_calls": [call("get_weather", {"city": "Paris"})]},
        ours={**A, "content": "Let me check.", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        why="a preamble is text for the user (openai-harmony); transformers' template has no field for it",
    ),
    Case(
        "a call to a tool that was not declared",
        "smollm",
        '<tool_call>{"name": "book_flight", "arguments": {"to": "Paris"}}</tool_call>',
        {**A, "tool_calls": [call("book_flight", {"to": "Paris"})]},
        ours=A,
        why="a call to an undeclared tool is refused",
        refused=("unknown tool 'book_flight'",),
    ),
    Case(
        "arguments that are not an object",
        "smollm",
        '<tool_call>{"name": "get_weather", "arguments": ["Paris"]}</tool_call>',
        {**A, "tool_calls": [call("get_weather", ["Paris"])]},
        ours=A,
        why="arguments must be a JSON object",
        refused=("must be a JSON object",),
    ),
    Case(
        "cut off inside the reasoning",
        "smollm",
        "<think>The user wants",
        {**A, "thinking": "The user wants"},
        finish_reason="length",
        ours={**A, "thinking": "The user wants"},
        why="equal fields, but ctxlock says the reasoning is incomplete (reasoning_complete False, finish length)",
    ),
    Case(
        "cut off inside a second call",
        "qwen3",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRo",
        {**A, "tool_calls": [call("get_weather", {"city": "Paris"}), call("get_weather", {})]},
        finish_reason="length",
        ours=A,
        why="no call from a cut-off response is released (transformers returns the half call with no arguments)",
        refused=(NOT_RUN, "truncated"),
    ),
]


@pytest.mark.parametrize("case", CASES + EDGES, ids=[f"{c.template}: {c.id}" for c in CASES + EDGES])
def test_transformers_case(case: Case) -> None:
    theirs = parse_response(case.output, TEMPLATES[case.template], prefix=case.prefix, tools=case.tools)
    assert theirs == case.transformers
    p = ours(case.template, case.output, case.prefix, case.tools, finish_reason=case.finish_reason)
    mine = as_transformers(p)
    if case.ours is not None:
        assert case.why and mine == case.ours
        assert mine != theirs or not p.reasoning_complete
        assert len(p.errors) == len(case.refused)
        assert all(fragment in str(e) for fragment, e in zip(case.refused, p.errors, strict=True))
        return
    assert mine == theirs and p.errors == ()
    # The strip is the only change: ctxlock's own text, stripped, is transformers' field, and is the model's.
    assert (p.reasoning or "").strip() == theirs.get("thinking", "")
    assert (p.content or "").strip() == theirs.get("content", "")
    assert p.reasoning is None or p.reasoning in case.output
    assert p.finish_reason == ("tool_calls" if p.tool_calls else "stop")


# ------------------------------------------------------------------------------------------------ generated
# Text without "<" (so no tag or marker appears by chance), with the whitespace transformers strips and ctxlock keeps.
_CHARS = "abcxyzXYZ0159 .,:;!?'\"()[]{}/\\-_#\n\t éß中文😀"
TEXT = st.text(alphabet=_CHARS, max_size=24)
KEYS = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)
SCALARS = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False)
JSON = st.recursive(
    SCALARS | TEXT, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(KEYS, kids, max_size=3), max_leaves=6
)
NAMES = ("get_weather", "search_web", "run_code")
GENERATED_TOOLS = [tool(n) for n in NAMES]


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# A qwen3_coder parameter as the model writes it: strings as they are, everything else as JSON; with the type the
# tool declares for it. Strings are those transformers' qwen3 template keeps as text too (not JSON, no edge spaces).
PARAMETERS = st.one_of(
    st.tuples(st.just("string"), TEXT.filter(lambda s: s.strip() == s != "" and not _is_json(s))),
    st.tuples(st.just("integer"), st.integers(-(10**9), 10**9)),
    st.tuples(st.just("number"), st.floats(allow_nan=False, allow_infinity=False)),
    st.tuples(st.just("boolean"), st.booleans()),
    st.tuples(st.just("array"), st.lists(JSON, max_size=3)),
    st.tuples(st.just("object"), st.dictionaries(KEYS, JSON, max_size=3)),
)


@dataclass(frozen=True)
class Generated:
    """An output built from its parts: the reasoning and the text outside calls, exactly as written, and the calls.
    `pieces`: the runs of text outside any region (before the first call, between calls), in order."""

    output: str
    reasoning: str | None
    pieces: tuple[str, ...]
    calls: tuple[tuple[str, dict[str, Any]], ...]
    tools: list[dict[str, Any]]


def _hermes(name: str, arguments: dict[str, Any], pad: str, ascii_only: bool) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=ascii_only)
    return f"<tool_call>{pad}{body}{pad}</tool_call>"


def _coder(name: str, arguments: dict[str, tuple[str, Any]]) -> str:
    params = "".join(
        f"<parameter={k}>\n{v if kind == 'string' else json.dumps(v)}\n</parameter>\n"
        for k, (kind, v) in arguments.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


@st.composite
def think_outputs(draw: st.DrawFn, template: str) -> Generated:
    """SmolLM3 / Qwen3: [<think>r</think>] text, then 0-3 calls (hermes JSON or qwen3_coder XML), then maybe
    <|im_end|>."""
    reasoning = draw(st.none() | TEXT)
    text = (draw(st.sampled_from(["", "\n", "\n\n"])) if reasoning is not None else "") + draw(TEXT)
    count = draw(st.integers(0, 3))
    sep = draw(st.sampled_from(["", "\n"]))
    calls: list[tuple[str, dict[str, Any]]] = []
    written: list[str] = []
    tools: list[dict[str, Any]] = []
    for i in range(count):
        if template == "smollm":
            name, arguments = draw(st.sampled_from(NAMES)), draw(st.dictionaries(KEYS, JSON, max_size=3))
            written.append(_hermes(name, arguments, "", draw(st.booleans())))
        else:
            name, typed = f"tool_{i}", draw(st.dictionaries(KEYS, PARAMETERS, max_size=3))
            arguments = {k: v for k, (_, v) in typed.items()}
            tools.append(tool(name, **{k: {"type": kind} for k, (kind, _) in typed.items()}))
            written.append(_coder(name, typed))
        calls.append((name, arguments))
    think = "" if reasoning is None else f"<think>{reasoning}</think>"
    end = draw(st.sampled_from(["", "<|im_end|>"]))
    return Generated(
        think + text + sep.join(written) + end,
        reasoning,
        (text, *[sep] * max(count - 1, 0)),
        tuple(calls),
        tools if template == "qwen3" else GENERATED_TOOLS,
    )


@st.composite
def ernie_outputs(draw: st.DrawFn) -> Generated:
    """ERNIE: the reasoning (the template opened <think>), then 1-3 calls, one a line, then </s>."""
    reasoning = draw(TEXT) + "\n"
    calls = tuple((draw(st.sampled_from(NAMES)), draw(st.dictionaries(KEYS, JSON, max_size=3))) for _ in range(3))
    calls = calls[: draw(st.integers(1, 3))]
    written = [_hermes(name, arguments, "\n", draw(st.booleans())) for name, arguments in calls]
    output = reasoning + "</think>\n\n" + "\n".join(written) + "\n</s>"
    return Generated(output, reasoning, ("\n\n", *["\n"] * (len(calls) - 1), "\n"), calls, GENERATED_TOOLS)


@st.composite
def harmony_outputs(draw: st.DrawFn) -> Generated:
    """gpt-oss: [an analysis message], then a final message or 1-3 calls (the last one's <|call|> may be left out:
    it is a stop token, which servers often do not stream)."""
    reasoning = draw(st.none() | TEXT)
    messages = [] if reasoning is None else [f"<|channel|>analysis<|message|>{reasoning}<|end|>"]
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    pieces: tuple[str, ...] = ()
    if draw(st.booleans()):
        text = draw(TEXT)
        messages.append(f"<|channel|>final<|message|>{text}")
        pieces = (text,)
    else:
        calls = tuple((draw(st.sampled_from(NAMES)), draw(st.dictionaries(KEYS, JSON, max_size=3))) for _ in range(3))
        calls = calls[: draw(st.integers(1, 3))]
        for name, arguments in calls:
            body = json.dumps(arguments, ensure_ascii=draw(st.booleans()))
            messages.append(f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{body}<|call|>")
        if draw(st.booleans()):
            messages[-1] = messages[-1].removesuffix("<|call|>")
    output = "<|start|>assistant".join(messages)
    return Generated(output, reasoning, pieces, calls, GENERATED_TOOLS)


def _last_piece(pieces: tuple[str, ...]) -> str:
    """transformers' content: its content field is not repeated, so each run of text outside the other fields
    replaces the one before; the last run that is not empty wins, stripped."""
    return next((p for p in reversed(pieces) if p), "").strip()


def _compare(template: str, g: Generated) -> None:
    theirs = parse_response(g.output, TEMPLATES[template], prefix="", tools=g.tools)
    p = ours(template, g.output, "", g.tools)
    mine = as_transformers(p)
    # ctxlock keeps exactly what the model wrote: the reasoning, and all the text outside calls, in order.
    assert (p.reasoning or "") == (g.reasoning or "")
    assert (p.content or "") == "".join(g.pieces)
    assert [(c.name, c.arguments) for c in p.tool_calls] == list(g.calls) and p.errors == ()
    # Equal to transformers' after the normalization, field by field.
    assert mine["role"] == theirs["role"] == "assistant"
    assert mine.get("thinking") == theirs.get("thinking")
    assert mine.get("tool_calls") == theirs.get("tool_calls")
    if template in ("qwen3", "ernie"):
        # Neither template has a content field outside <response>: transformers drops the text (listed in docs).
        assert "content" not in theirs
        assert template == "qwen3" or "content" not in mine
    elif sum(1 for piece in g.pieces if piece) <= 1:
        assert mine.get("content") == theirs.get("content")
    else:  # text both before and between calls: transformers keeps the last run only (listed in docs)
        assert theirs.get("content", "") == _last_piece(g.pieces)


SETTINGS = settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(g=think_outputs("smollm"))
def test_generated_smollm(g: Generated) -> None:
    _compare("smollm", g)


@SETTINGS
@given(g=think_outputs("qwen3"))
def test_generated_qwen3(g: Generated) -> None:
    _compare("qwen3", g)


@SETTINGS
@given(g=ernie_outputs())
def test_generated_ernie(g: Generated) -> None:
    _compare("ernie", g)


@SETTINGS
@given(g=harmony_outputs())
def test_generated_gpt_oss(g: Generated) -> None:
    _compare("gpt-oss", g)


@pytest.mark.parametrize(
    ("template", "output", "finish_reason", "refused", "thinking"),
    [
        ("smollm", '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa', "length", "truncated", None),
        (
            "smollm",
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}</tool_call>',
            "stop",
            "not valid JSON",
            None,
        ),
        (
            "gpt-oss",
            "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa',
            "length",
            "truncated",
            "Need the weather.",
        ),
    ],
    ids=["hermes cut off", "hermes malformed", "harmony cut off"],
)
def test_where_transformers_raises_ctxlock_answers(
    template: str, output: str, finish_reason: str, refused: str, thinking: str | None
) -> None:
    """A call body that is not JSON (cut off, or malformed) makes transformers' parse raise, and the whole message
    is lost; ctxlock gives the message, and the call as an error that can go back to the model."""
    with pytest.raises(ValueError, match="could not parse region as JSON"):
        parse_response(output, TEMPLATES[template], prefix="", tools=LOOSE)
    p = ours(template, output, "", LOOSE, finish_reason=finish_reason)
    assert p.tool_calls == () and len(p.errors) == 1 and refused in str(p.errors[0])
    assert p.reasoning == thinking and p.finish_reason == finish_reason
    if finish_reason == "length":
        assert isinstance(p.errors[0], ToolCallTruncatedError)
