"""Server-sent events, read incrementally: the framing of the `anthropic` wire format's raw stream."""

from __future__ import annotations

import codecs
import re
from typing import Any

from ctxlock.errors import ToolCallError

_EOL = re.compile(r"\r\n|\r|\n")


class SSEReader:
    """Server-sent events as the HTML standard parses them, fed in pieces split anywhere (str, or bytes in UTF-8).

    Lines end at CRLF, LF or CR; `event:` names the event, `data:` lines are joined with LF, `:` starts a comment,
    a blank line dispatches. An event without its blank line when the stream ends is discarded, as the standard
    says (and reported in `leftover`)."""

    def __init__(self, max_size: int = 1 << 62) -> None:
        self.max_size = max_size  # cap on the pending line and on one event's data (characters)
        self.partial: list[str] = []  # the current line, not yet ended
        self.partial_size = 0
        self.data_size = 0
        self.events = 0  # events dispatched
        self.skip_lf = False  # the last piece ended in CR: a LF at the start of the next one belongs to it
        self.started = False
        self.event = ""
        self.data: list[str] = []
        self.decoder: Any = None
        self.fed = 0  # characters (or bytes) fed, for error paths

    def feed(self, piece: str | bytes | bytearray) -> list[tuple[str, str]]:
        if isinstance(piece, bytes | bytearray):
            if self.decoder is None:
                self.decoder = codecs.getincrementaldecoder("utf-8")("strict")
            try:
                text = self.decoder.decode(bytes(piece))
            except UnicodeDecodeError as exc:
                raise ToolCallError(
                    f"the stream is not valid UTF-8: {exc.reason}",
                    path=f"stream byte {self.fed + exc.start}",
                    hint="feed the response body as the server sent it (SSE is UTF-8)",
                ) from None
        else:
            text = piece
        self.fed += len(piece)
        out: list[tuple[str, str]] = []
        i = 0
        if text and self.skip_lf:
            self.skip_lf = False
            if text[0] == "\n":
                i = 1
        if not self.started and text:
            self.started = True
            if text[0] == "\ufeff":  # a byte-order mark at the start of the stream is not part of it
                i = max(i, 1)
        for m in _EOL.finditer(text, i):
            self._check(self.partial_size + m.start() - i, "line")
            line = "".join(self.partial) + text[i : m.start()] if self.partial else text[i : m.start()]
            self.partial, self.partial_size = [], 0
            self._line(line, out)
            i = m.end()
            if m.end() == len(text) and m.group() == "\r":
                self.skip_lf = True
        if i < len(text):
            self._check(self.partial_size + len(text) - i, "line")
            self.partial.append(text[i:])
            self.partial_size += len(text) - i
        return out

    def _check(self, size: int, what: str) -> None:
        if size > self.max_size:
            self.partial, self.partial_size, self.data, self.data_size = [], 0, [], 0
            raise ToolCallError(
                f"an SSE {what} longer than max_event_size={self.max_size} characters",
                path=f"events[{self.events}] (stream char {self.fed})",
                hint="the stream is not a sane SSE body (a missing newline?); raise max_event_size if it is real",
            )

    def _line(self, line: str, out: list[tuple[str, str]]) -> None:
        if not line:
            if self.data:
                out.append((self.event or "message", "\n".join(self.data)))
                self.events += 1
            self.event, self.data, self.data_size = "", [], 0
            return
        if line[0] == ":":
            return  # a comment (servers send them as keep-alives)
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self.event = value
        elif name == "data":
            self._check(self.data_size + len(value) + 1, "event's data")
            self.data.append(value)
            self.data_size += len(value) + 1
        # id, retry and unknown fields do not matter here

    @property
    def leftover(self) -> bool:
        return bool(self.partial or self.data or self.event)
