"""Which tool-call format a chat template writes, read from what it renders (docs/tool-call-formats.md).

A template's source rarely holds its markers as plain text (many build them from pieces), so the format is read
from a render: a probe conversation in which the assistant answers with two tool calls is rendered, and the part
the assistant wrote (past the longest prefix shared with the prompt rendered with its generation prompt) is
classified by the markers of `WRITTEN`, most specific first. tests/generation/test_toolcalls_template_survey.py
holds the classification of every fixture template to a table.

`WRITTEN` names formats ctxlock does not parse too (vLLM's parser names): `tool_format_for_template` says which
format a template writes, and its note says when ctxlock cannot read it yet.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ctxlock.errors import CtxlockError
from ctxlock.generation.toolcalls import PARSERS
from ctxlock.request import ToolArguments, parse_request
from ctxlock.template import ChatTemplate, render

# (format, pattern over the assistant's rendered turn), most specific first. The name is the format's in ctxlock,
# else vLLM's parser name (vllm/tool_parsers/).
WRITTEN: tuple[tuple[str, str], ...] = (
    ("harmony", r"<\|channel\|>|<\|message\|>.*<\|call\|>"),
    ("muse_glimmer", r"<atem:function_calls>"),
    ("minimax_m2", r"<minimax:tool_call>"),
    ("minimax_m3", r"\]<\]minimax\[>\[<tool_call>"),
    ("minimax", r"<tool_calls>\s*\{"),
    ("apriel", r"<tool_calls>\s*\["),
    ("seed_oss", r"<seed:tool_call>"),
    ("deepseek_v32", r"<｜DSML｜function_calls>"),
    ("deepseek_v4", r"<｜DSML｜tool_calls>"),
    ("deepseek_v3", r"<｜tool▁call▁begin｜>function<｜tool▁sep｜>"),
    ("deepseek_v31", r"<｜tool▁call▁begin｜>"),
    ("kimi_k2", r"<\|tool_calls_section_begin\|>"),
    ("kimi_k3", r"<\|open\|>call tool="),
    ("hy_v3", r"<tool_call:opensource>"),
    ("glm45", r"<tool_call>[^<]*<arg_key>"),
    ("qwen3_coder", r"<tool_call>\s*<function="),
    ("hermes", r"<tool_call>\s*\{"),
    ("mistral", r"\[TOOL_CALLS\]"),
    ("functionary_v3_1", r"<function=[^>]*>\{"),
    ("functionary_v3_2", r">>>get_weather"),
    ("firefunction_v2", r"functools\["),
    ("lfm2", r"<\|tool_call_start\|>"),
    ("gemma4", r"<\|tool_call>call:"),
    ("apertus", r"<\|tools_prefix\|>"),
    ("cohere_command", r"ACTION\|>\["),
    ("command_r_plus", r"Action:\s*```json"),
    ("gigachat3", r"<\|function_call\|>|function call<\|role_sep\|>"),
    ("nemotron_json", r"<TOOLCALL>"),
    ("minicpm5", r'<function name="[^"]*"><param name='),
    ("solar_open", r"<\|tool_call:begin\|>"),
    ("llama3_json", r"<\|python_tag\|>|\{\"name\": \"[^\"]*\", \"parameters\""),
    ("pythonic", r"<\|python_start\|>"),
    ("granite", r"<\|tool_call\|>"),
)
NO_CALLS = "no tool calls rendered"

# The probe: two tools, and an assistant turn that calls both (Mistral's templates want 9-character ids).
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city."}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "What to look for."}},
                "required": ["query"],
            },
        },
    },
]
_CALLS = [
    {"id": "a1b2c3d4e", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "f5g6h7i8j", "type": "function", "function": {"name": "search_docs", "arguments": '{"query": "x"}'}},
]
_USER = {"role": "user", "content": "Weather in Paris, and search the docs?"}
_SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


def classify_written(text: str) -> str:
    """The format whose markers an assistant turn holds, else `NO_CALLS` (no call at all) or "unclassified"."""
    for name, pattern in WRITTEN:
        if re.search(pattern, text, re.DOTALL):
            return name
    return NO_CALLS if "get_weather" not in text else "unclassified"


def _render(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    prompt: bool,
    variables: dict[str, Any],
    arguments: ToolArguments = ToolArguments.PARSED,
    tools: bool = True,
) -> str:
    body = {"messages": messages, "tools": _TOOLS if tools else [], "chat_template_kwargs": variables}
    request = parse_request(json.dumps(body).encode(), tool_arguments=arguments)
    return render(request, template, add_generation_prompt=prompt, special_tokens=_SPECIAL).text


def assistant_turn(
    template: ChatTemplate,
    calls: list[dict[str, Any]],
    variables: dict[str, Any],
    content: str | None = "Looking it up.",
    arguments: ToolArguments = ToolArguments.PARSED,
    tools: bool = True,
) -> str:
    """What `template` writes for an assistant turn with `calls` (and `content`): the render past the prefix it
    shares with the prompt rendered with the generation prompt. `arguments`: how the calls' arguments reach the
    template (parsed, or as sent: functionary v3.2 concatenates them as a string); `tools`: whether the request
    declares the probe's tools."""
    turn = {"role": "assistant", "content": content, "tool_calls": calls}
    full = _render(template, [_USER, turn], False, variables, arguments, tools)
    prompt = _render(template, [_USER], True, variables, arguments, tools)
    k = 0
    while k < min(len(full), len(prompt)) and full[k] == prompt[k]:
        k += 1
    return full[k:]


def tool_format_for_template(
    template: ChatTemplate | str, variables: dict[str, Any] | None = None
) -> tuple[str | None, str]:
    """(the tool-call format ctxlock reads for what `template` writes, or None; a note saying what was found)."""
    if isinstance(template, str):
        template = ChatTemplate(source=template, id="template")
    # Some templates refuse text beside calls (Mistral's), some more than one call per turn (Llama 3.x): the probe
    # tries the turn with text and two calls first, then without text, then with one call; when none of those
    # renders with the arguments parsed, the same with the arguments as sent (functionary v3.2 concatenates them);
    # and when none renders with the probe's tools declared, the same without them, until one writes a call
    # (llama.cpp's deepseek-r1 template fails on any `tools`, and writes the calls only beside no text).
    written, first_error, bare = None, None, None
    probes = [
        (tools, arguments, content, calls)
        for tools in (True, False)
        for arguments in (ToolArguments.PARSED, ToolArguments.AS_SENT)
        for content, calls in (
            ("Looking it up.", _CALLS),
            (None, _CALLS),
            ("Looking it up.", _CALLS[:1]),
            (None, _CALLS[:1]),
        )
    ]
    for tools, arguments, content, calls in probes:
        try:
            written = assistant_turn(template, calls, variables or {}, content, arguments, tools)
        except CtxlockError as exc:
            first_error = first_error or exc
            continue
        if tools or classify_written(written) != NO_CALLS:
            break
        bare, written = (written if bare is None else bare), None
    written = written if written is not None else bare
    if written is None:
        # No probe renders (the sandbox refuses Kimi-K2-Instruct's `list.append`): the markers of the template's own
        # source say what its model writes, when they name a format.
        message = first_error.message if first_error is not None else "no probe rendered"
        found = classify_written(template.source)
        if found in (NO_CALLS, "unclassified"):
            return None, f"the template's tool-call format could not be read: a probe render failed ({message})"
        how = f"read from the template's source, as no probe render succeeded ({message})"
        if found in {f.value for f in PARSERS}:
            return found, f"the template writes {found} tool calls ({how})"
        return None, f"the template writes {found} tool calls, which ctxlock does not parse yet ({how})"
    found = classify_written(written)
    how = (
        "" if first_error is None or tools else f" (read without the probe's tools, which fail: {first_error.message})"
    )
    if found in {f.value for f in PARSERS}:
        return found, f"the template writes {found} tool calls{how}"
    if found in (NO_CALLS, "unclassified"):
        return None, f"the template writes no tool calls ctxlock recognizes ({found}){how}"
    return None, f"the template writes {found} tool calls, which ctxlock does not parse yet{how}"
