"""The canonical JSON of a request (`Request.to_json()`) written piece by piece, as UTF-8: a fast path, behind one
function.

`Request.to_json()` and `Request.json_sha256()` call `request_json_bytes(request, message_type)` when the fast paths
are on; the reference path is `canonical_json` (`frozen`) of the whole `{"messages", "tools", "documents",
"chat_template_kwargs"}` dict, built from `template_messages()` and the others (and, for the digest, that text
encoded as UTF-8). That text is the stdlib encoder's (sorted keys, no spaces, UTF-8 kept, no NaN), and the encoder
writes a list or a dict as its items' texts joined by `,` inside brackets, each item's text depending only on the
item. So the same text comes out of joining the items' texts, and each item's text can come from anywhere that writes
it the same way:

- a message of `message_type` itself (not a subclass, which might write its own `to_template`) whose `content`,
  `role` and optional `name`, `tool_call_id` and `reasoning_content` are plain `str`s and that holds no tool calls:
  its keys in sorted order, each string by `_quoted`. This skips building the message's dict, copying it again
  (`thaw`), sorting its keys, and encoding the whole text once more;
- every other message, and tools, documents and chat_template_kwargs: `canonical_json` of what the reference
  writes there (`to_template()`, `template_tools()`, ...), with the empty kwargs written `{}` and an absent
  tools or documents `null`, as the encoder writes them.

The strings are escaped as the encoder escapes them when `ensure_ascii` is off (`json.encoder.encode_basestring`:
`"` and `\\` with a backslash, and U+0000-U+001F: `\\n`, `\\r`, `\\t`, `\\b`, `\\f` by name, the others as `\\u00xx`
in lower-case hex; every other character as it is), but on the UTF-8 bytes: a byte below 0x80 is an ASCII character
in UTF-8 (never part of a longer sequence), so those characters are the bytes to replace, and every other byte is
kept. `bytes.replace` and `bytes.translate` run at memory speed where the encoder reads the text a character at a
time. In two steps: `_quoted(s)` escapes `"` and `\\` (and adds the quotes); `_controls_escaped` escapes the control
characters of the whole text at once, since nothing else in it holds one as a byte (the text between the strings is
`{"content":` and the like, and `canonical_json` escapes them itself).

`request_json_bytes` returns None when anything raises (a value the encoder refuses: NaN, a non-JSON type; a lone
surrogate, which UTF-8 cannot hold): the reference path then meets the same value and gives its own text or error.
tests/request/test_parse_speedups.py proves the texts equal on generated requests of every shape, and the escaping equal
to the encoder's on every code point.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from ctxlock.core import FrozenDict, canonical_json

_CONTROLS = bytes(c for c in range(0x20) if c != 0x0A)  # the control characters other than \n (replaced first)
_CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f]")
_CONTROL_ESCAPES = {bytes([c]): f"\\u{c:04x}".encode() for c in _CONTROLS} | {
    b"\b": b"\\b",
    b"\t": b"\\t",
    b"\f": b"\\f",
    b"\r": b"\\r",
}


def _control_escape(match: re.Match[bytes]) -> bytes:
    return _CONTROL_ESCAPES[match.group()]


def _quoted(s: str) -> bytes:
    """`s` as UTF-8 in quotes, `"` and `\\` escaped (the backslash first); a lone surrogate raises."""
    return b'"' + s.encode("utf-8").replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'


def _controls_escaped(data: bytes) -> bytes:
    """`data` with its control characters escaped: `_quoted(s)` made `encode_basestring(s).encode("utf-8")`."""
    data = data.replace(b"\n", b"\\n")
    if len(data.translate(None, _CONTROLS)) != len(data):
        data = _CONTROL.sub(_control_escape, data)
    return data


class _Message(Protocol):
    """What this module reads of a message of `message_type`: `ctxlock.request.Message` (whose module imports this
    one, so it is described here rather than imported)."""

    @property
    def role(self) -> str: ...
    @property
    def content(self) -> str | tuple[FrozenDict, ...] | None: ...
    @property
    def name(self) -> str | None: ...
    @property
    def tool_calls(self) -> tuple[Any, ...] | None: ...
    @property
    def tool_call_id(self) -> str | None: ...
    @property
    def reasoning_content(self) -> str | None: ...


# The roles a parsed message can have, written once.
_ROLES = {role: _quoted(role) for role in ("system", "developer", "user", "assistant", "tool")}


def request_json_bytes(request: Any, message_type: type[_Message]) -> bytes | None:
    """`request.to_json().encode("utf-8")` of the reference path, written piece by piece (module docstring), or
    None where the reference path must write it."""
    try:
        messages = b",".join([_message_json(m, message_type) for m in request.messages])
        kwargs = request.chat_template_kwargs
        tools = request.template_tools()
        documents = request.template_documents()
        return _controls_escaped(
            b"".join(
                (
                    b'{"chat_template_kwargs":',
                    b"{}" if type(kwargs) is FrozenDict and not kwargs else canonical_json(kwargs).encode("utf-8"),
                    b',"documents":',
                    b"null" if documents is None else canonical_json(documents).encode("utf-8"),
                    b',"messages":[',
                    messages,
                    b'],"tools":',
                    b"null" if tools is None else canonical_json(tools).encode("utf-8"),
                    b"}",
                )
            )
        )
    except Exception:  # the reference path meets it again and gives its own text or error
        return None


def _message_json(m: Any, message_type: type[_Message]) -> bytes:
    """The canonical text of `m.to_template()`, as UTF-8."""
    if type(m) is message_type and m.tool_calls is None:
        content, role = m.content, m.role
        if type(content) is str and type(role) is str:
            name, tool_call_id, reasoning = m.name, m.tool_call_id, m.reasoning_content
            if name is None and tool_call_id is None and reasoning is None:
                return b'{"content":' + _quoted(content) + b',"role":' + (_ROLES.get(role) or _quoted(role)) + b"}"
            if (
                (name is None or type(name) is str)
                and (tool_call_id is None or type(tool_call_id) is str)
                and (reasoning is None or type(reasoning) is str)
            ):
                # Sorted: content, name, reasoning_content, role, tool_call_id (tool_calls is None: not written).
                out = b'{"content":' + _quoted(content)
                if name is not None:
                    out += b',"name":' + _quoted(name)
                if reasoning is not None:
                    out += b',"reasoning_content":' + _quoted(reasoning)
                out += b',"role":' + _quoted(role)
                if tool_call_id is not None:
                    out += b',"tool_call_id":' + _quoted(tool_call_id)
                return out + b"}"
    return canonical_json(m.to_template()).encode("utf-8")
