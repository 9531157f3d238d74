"""The canonical JSON of a request (`Request.to_json()`) written piece by piece: a fast path, behind one function.

`Request.to_json()` calls `request_json(request, message_type)` when the fast paths are on; the reference path is
`canonical_json` (`frozen`) of the whole `{"messages", "tools", "documents", "chat_template_kwargs"}` dict, built
from `template_messages()` and the others. That text is the stdlib encoder's (sorted keys, no spaces, UTF-8 kept,
no NaN), and the encoder writes a list or a dict as its items' texts joined by `,` inside brackets, each item's text
depending only on the item. So the same text comes out of joining the items' texts, and each item's text can come
from anywhere that writes it the same way:

- a message of `message_type` itself (not a subclass, which might write its own `to_template`) whose `content`,
  `role` and optional `name`, `tool_call_id` and `reasoning_content` are plain `str`s and that holds no tool calls:
  its keys in sorted order, each string through `json.encoder.encode_basestring`, the very function the encoder
  calls for a string when `ensure_ascii` is off (the C one, or the Python one when the C module is missing, and
  then the encoder is the Python one, which calls it too). This skips building the message's dict, copying it
  again (`thaw`), and sorting its keys;
- every other message, and tools, documents and chat_template_kwargs: `canonical_json` of what the reference
  writes there (`to_template()`, `template_tools()`, ...), with the empty kwargs written `{}` and an absent
  tools or documents `null`, as the encoder writes them.

`request_json` returns None when anything raises (a value the encoder refuses: NaN, a non-JSON type): the
reference path then meets the same value and raises its own error. tests/test_parse_speedups.py proves the texts
equal on generated requests of every shape.
"""

from __future__ import annotations

from json.encoder import encode_basestring
from typing import Any

from ctxlock.frozen import FrozenDict, canonical_json


def request_json(request: Any, message_type: type) -> str | None:
    """`request.to_json()`'s reference text, written piece by piece (module docstring), or None where the
    reference path must write it."""
    try:
        messages = ",".join([_message_json(m, message_type) for m in request.messages])
        kwargs = request.chat_template_kwargs
        kwargs_json = "{}" if type(kwargs) is FrozenDict and not kwargs else canonical_json(kwargs)
        tools = request.template_tools()
        documents = request.template_documents()
        return (
            '{"chat_template_kwargs":'
            + kwargs_json
            + ',"documents":'
            + ("null" if documents is None else canonical_json(documents))
            + ',"messages":['
            + messages
            + '],"tools":'
            + ("null" if tools is None else canonical_json(tools))
            + "}"
        )
    except Exception:  # the reference path meets it again and raises its own error
        return None


def _message_json(m: Any, message_type: type) -> str:
    """The canonical text of `m.to_template()`."""
    if type(m) is message_type and m.tool_calls is None:
        content, role = m.content, m.role
        if type(content) is str and type(role) is str:
            name, tool_call_id, reasoning = m.name, m.tool_call_id, m.reasoning_content
            if name is None and tool_call_id is None and reasoning is None:
                return '{"content":' + encode_basestring(content) + ',"role":' + encode_basestring(role) + "}"
            if (
                (name is None or type(name) is str)
                and (tool_call_id is None or type(tool_call_id) is str)
                and (reasoning is None or type(reasoning) is str)
            ):
                # Sorted: content, name, reasoning_content, role, tool_call_id (tool_calls is None: not written).
                out = '{"content":' + encode_basestring(content)
                if name is not None:
                    out += ',"name":' + encode_basestring(name)
                if reasoning is not None:
                    out += ',"reasoning_content":' + encode_basestring(reasoning)
                out += ',"role":' + encode_basestring(role)
                if tool_call_id is not None:
                    out += ',"tool_call_id":' + encode_basestring(tool_call_id)
                return out + "}"
    return canonical_json(m.to_template())
