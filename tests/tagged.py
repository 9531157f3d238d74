# ruff: noqa: E501  (the stock templates' own lines, matched exactly)
"""Tagged versions of stock templates: `{% generation %}` blocks added to the fetched templates, as TRL tags its
training templates, for the parity test against transformers' `return_assistant_tokens_mask`.

Each tagging is a list of exact replacements applied to the stock template (each must match once, so a changed
stock template fails loudly). A block opens after the assistant header and closes after the end-of-turn token; the
newline the template writes after that token stays outside. Every tagged template renders the same text as its stock
template (tests/training/test_masks.py checks it over the conformance corpus).
"""

from __future__ import annotations

import fetched
from ctxlock.template._render import ChatTemplate

_QWEN25 = [
    (
        """    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}""",
        """    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" and not message.tool_calls %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
            {{- message.content + '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if message.content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {{- '<tool_call>\\n{"name": "' }}""",
    ),
    (
        """            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}""",
        """            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}""",
    ),
]

_QWEN3 = [
    (
        """        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}""",
        """        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- content }}
        {%- endif %}""",
    ),
    (
        """                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}""",
        """                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}""",
    ),
]

_LLAMA31 = [
    (
        """    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}""",
        """    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
        {%- if message.role == 'assistant' %}
            {%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}
        {%- else %}
            {{- message['content'] | trim + '<|eot_id|>' }}
        {%- endif %}""",
    ),
    (
        """        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}""",
        """        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {%- generation %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}""",
    ),
    (
        """        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' """,
        """        {%- else  %}
            {{- '{"name": "' """,
    ),
    (
        """            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}""",
        """            {{- "<|eot_id|>" }}
        {%- endif %}
        {%- endgeneration %}
    {%- elif message.role == "tool" or message.role == "ipython" %}""",
    ),
]

_PHI35 = [
    (
        """{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}""",
        """{% elif message['role'] == 'assistant' %}{{'<|assistant|>
'}}{% generation %}{{message['content'] + '<|end|>'}}{% endgeneration %}{{'
'}}""",
    ),
]

TAGGINGS: dict[str, list[tuple[str, str]]] = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": _QWEN25,
    "Qwen-Qwen3-0.6B.jinja": _QWEN3,
    "meta-llama-Llama-3.1-8B-Instruct.jinja": _LLAMA31,
    "microsoft-Phi-3.5-mini-instruct.jinja": _PHI35,
}


def stock_source(name: str) -> str:
    return (fetched.templates_dir() / name).read_text("utf-8")


def tagged_source(name: str) -> str:
    source = stock_source(name)
    for old, new in TAGGINGS[name]:
        assert source.count(old) == 1, f"{name}: the stock template changed; re-tag it"
        source = source.replace(old, new)
    return source


def tagged_template(name: str) -> ChatTemplate:
    return ChatTemplate(tagged_source(name), id=name.replace(".jinja", ".generation.jinja"))
