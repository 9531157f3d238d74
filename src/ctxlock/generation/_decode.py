"""Output side: token ids -> text, one id at a time, and stop strings.

`IncrementalDecoder` turns generated ids into text pieces that are final: a piece never holds a U+FFFD that stands
for an unfinished UTF-8 sequence, and no later id can change it. `StopMatcher` cuts that text at the first stop
string without ever emitting part of one. `Detokenizer` chains the two; `stream_text` runs it over a list of ids.

What "exact" means here. Let `D(ids) = tokenizer.decode(ids, skip_special_tokens=s)` and `P` the prompt ids. After
pushing `g_1 .. g_k`, the pieces pushed so far, followed by what `finish()` would return, equal

    D(P + [g_1 .. g_k])[len(D(P)):]

whenever `P + [g_1 .. g_k]` ends on a complete character (otherwise `finish()` raises `IncompleteDecodeError`).
With no prompt that is `D(ids)` itself. The prompt matters for SentencePiece vocabularies: their decoders drop the
leading space of the first piece, so `D([▁world])` is "world" while the continuation of "Hello" is " world".
At every step the pieces so far are a prefix of that text.

How (the technique of vLLM's `detokenize_incrementally` and of tokenizers' `DecodeStream`): the decoder keeps a
short window of ids that starts at a character boundary, decodes the window with the tokenizer's own `decode`,
and emits what the window's text adds to the text it already emitted for the window's first ids. The decoders
supported here are local (a token's text depends on itself and on whether it comes first), so that difference is
the same as in a full decode, and each step costs O(window), independent of the length of the stream.

Where vLLM and `DecodeStream` guess that text is unfinished when it ends with U+FFFD (which stalls on a real
U+FFFD and cannot tell a truncated character at the end from an invalid byte), this decoder knows each id's bytes
(tiktoken ranks, the GPT-2 byte table of HF `ByteLevel`, SentencePiece `<0xNN>` byte pieces) and follows the
UTF-8 state exactly. Text is emitted when:
- no UTF-8 sequence is open (the bytes so far end on a character boundary, or are invalid for good: those
  become U+FFFD in the full decode too);
- for HF `ByteFallback` decoders, no run of byte tokens is open: HF decodes a whole run at once and turns every
  byte of it into U+FFFD if any part is invalid, so even a complete character in a run can still change until a
  non-byte token ends the run. (If a prompt ends inside such a run and the generated ids make it invalid, the full
  decode rewrites the prompt's own text: there is no continuation to give, and `DecodeError` says so.)

Special tokens follow the tokenizer's `decode`: with `skip_special_tokens=False` (the default, as in
`Tokenizer.decode` and HF `DecodeStream`; vLLM's default is True) they are emitted as their text. Backends also
differ in how bytes meet across a special token, and the decoder follows each: HF tokenizers and tiktoken files
join the bytes on both sides of a skipped special token, Tekken and SentencePiece decode the runs between
control tokens separately.

Supported backends: HF tokenizers (including GGUF vocabularies) with ByteLevel, SentencePiece-style (Metaspace, or
Replace "▁" + ByteFallback + Fuse + Strip) or plain WordPiece decoders; tiktoken ranks files; Tekken; SentencePiece
models; the book tokenizer. Decoders whose output for a token depends on the tokens after it (WordPiece with
`cleanup`, CTC, BPEDecoder suffixes, a trailing Strip) are rejected with `DecodeError` rather than decoded wrong.
"""

from __future__ import annotations

import codecs
import copy
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ctxlock.errors import DecodeError, IncompleteDecodeError
from ctxlock.tokenizer import Piece, Tokenizer
from ctxlock.tokenizer import byte_level_decoder_table as byte_level_table

FinishReason = Literal["stop"]

# ----------------------------------------------------------------------------------------- each id's bytes

# Each backend says what one id adds (`Tokenizer.decode_pieces`, a `Piece` per id: its bytes, whether the decoder
# sees it, whether it is a ByteFallback byte token, whether the backend decodes either side of it separately).
_Piece = Piece


class _Vocab:
    """Each id's bytes, looked up once. `lookup` returns None for an id that is not in the vocabulary."""

    def __init__(self, size: int, lookup: Callable[[int], _Piece | None], *, groups_bytes: bool = False) -> None:
        self.size = size
        self.groups_bytes = groups_bytes
        self._lookup = lookup
        self._cache: dict[int, _Piece] = {}

    def piece(self, value: Any, path: str) -> tuple[int, _Piece]:
        if isinstance(value, bool):
            raise DecodeError(f"token id {value!r} is a bool, not an integer", path=path, hint="pass integer ids")
        try:
            i = operator.index(value)
        except TypeError:
            raise DecodeError(f"token id {value!r} is not an integer", path=path, hint="pass integer ids") from None
        hit = self._cache.get(i)
        if hit is not None:
            return i, hit
        found = self._lookup(i) if 0 <= i < self.size else None
        if found is None:
            raise DecodeError(
                f"token id {i} is not in the vocabulary",
                path=path,
                hint=f"ids of this tokenizer are in [0, {self.size}) (was it generated with another tokenizer?)",
            )
        self._cache[i] = found
        return i, found


def _vocab_for(tokenizer: Tokenizer, skip: bool) -> _Vocab:
    view = tokenizer.decode_pieces(skip_special_tokens=skip)
    return _Vocab(tokenizer.vocab_size, view.lookup, groups_bytes=view.groups_bytes)


# ----------------------------------------------------------------------------------------------- decoder


class IncrementalDecoder:
    """Token ids -> final text pieces, one id at a time. See the module docstring for the exact contract.

    `push(id)` returns the text that id completes (often "", for example in the middle of a character);
    `finish()` returns the rest, or raises `IncompleteDecodeError` if the ids end inside a character.
    `prompt_ids` primes the decoder so the first generated token decodes as it does after the prompt; they must
    end on a character boundary.
    """

    SLIDE_AT = 24  # the window start moves forward once this many ids have been read

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = False
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._vocab = _vocab_for(tokenizer, skip_special_tokens)
        self._window: list[int] = []  # ids from the window start (a character boundary) to the newest
        self._read = 0  # window ids whose text has been emitted
        self._last_read = 0  # the previous value of _read: the next window start
        self._prefix = ""  # decode(window[:read])
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # only its state is used
        self._open: list[tuple[int, bytes]] = []  # (index, bytes) of the ids that hold an open UTF-8 sequence
        self._run_open = False  # a ByteFallback run of byte tokens is open
        self._count = 0
        self._finished = False
        if prompt_ids:
            self._prime(prompt_ids)

    # -- public

    @property
    def count(self) -> int:
        """How many generated ids have been pushed."""
        return self._count

    def push(self, token_id: int) -> str:
        if self._finished:
            raise DecodeError("push() after finish()", hint="start a new IncrementalDecoder for a new stream")
        index = self._count
        i, piece = self._vocab.piece(token_id, f"ids[{index}]")
        self._count += 1
        self._window.append(i)
        if not self._feed(piece, index):
            return ""
        if not piece[1] and self._read == len(self._window) - 1:
            # A skipped special token adds no text; the next visible token's decode covers it.
            return ""
        return self._emit()

    def finish(self, *, errors: Literal["strict", "replace"] = "strict") -> str:
        """The text still held back. With `errors="strict"` an unfinished UTF-8 sequence at the end raises
        `IncompleteDecodeError` (and the decoder stays open, so `finish(errors="replace")` can follow); with
        `errors="replace"` it decodes as the tokenizer's own decode does (U+FFFD)."""
        if self._finished:
            raise DecodeError("finish() called twice", hint="start a new IncrementalDecoder for a new stream")
        dangling = self._utf8.getstate()[0]
        if dangling and errors == "strict":
            start = self._open_start(len(dangling))
            raise IncompleteDecodeError(
                f"the ids end inside a multi-byte character: bytes {dangling.hex(' ')} from token {start} on are "
                "not a complete UTF-8 sequence",
                path=f"ids[{start}]",
                hint="the stream was cut mid-character (for example by max_tokens); drop those ids, or call "
                "finish(errors='replace') to get U+FFFD as tokenizer.decode does",
            )
        self._finished = True
        if self._read == len(self._window):
            return ""
        return self._emit()

    def __copy__(self) -> IncrementalDecoder:
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new._window = list(self._window)
        new._open = list(self._open)
        new._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        new._utf8.setstate(self._utf8.getstate())
        return new

    def copy(self) -> IncrementalDecoder:
        """An independent decoder in the same state (to look ahead with `finish()` without ending this one)."""
        return copy.copy(self)

    # -- internals

    def _feed(self, piece: _Piece, index: int) -> bool:
        """Advance the UTF-8 state by one id; whether the text up to it is final."""
        data, visible, byte_token, breaks = piece
        if breaks:
            self._utf8.reset()
            self._open.clear()
        if data:
            self._utf8.decode(data)
            held = self._utf8.getstate()[0]
            if not held:
                self._open.clear()
            elif len(held) <= len(data):
                self._open = [(index, data)]
            else:
                self._open.append((index, data))
        if visible:
            self._run_open = byte_token
        return not self._utf8.getstate()[0] and not self._run_open

    def _open_start(self, n: int) -> int:
        """The index of the id where the last `n` open bytes begin."""
        for index, data in reversed(self._open):
            if len(data) >= n:
                return index
            n -= len(data)
        return self._open[0][0] if self._open else max(self._count - 1, 0)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _emit(self) -> str:
        text = self._decode(self._window)
        if not text.startswith(self._prefix):
            raise DecodeError(
                f"the tokenizer's decode rewrote text that was already final: {self._prefix!r} became "
                f"{text[: len(self._prefix) + 8]!r}",
                path=f"ids[{self._count - 1}]",
                hint="an invalid byte run changed earlier text; decode this sequence whole with tokenizer.decode",
            )
        out = text[len(self._prefix) :]
        self._last_read, self._read, self._prefix = self._read, len(self._window), text
        if self._read > self.SLIDE_AT:
            self._slide()
        return out

    def _slide(self) -> None:
        # The new start is the previous read point: a character boundary (and a closed byte run) by construction.
        # Its text must not be empty, so that a decoder that trims the start of the text (SentencePiece's leading
        # space, Strip) trims the same characters from the window as from the full sequence.
        start = self._last_read
        if start == 0:
            return
        prefix = self._decode(self._window[start : self._read])
        if not prefix:
            return
        del self._window[:start]
        self._read -= start
        self._last_read = 0
        self._prefix = prefix

    def _prime(self, prompt_ids: Sequence[int]) -> None:
        prompt = [self._vocab.piece(v, f"prompt_ids[{k}]") for k, v in enumerate(prompt_ids)]
        n = len(prompt)
        start = max(0, n - 8)
        while start > 0 and not self._clean_start(prompt, start):
            start -= 1
        prefix = self._decode([i for i, _ in prompt[start:]])
        if start > 0 and not prefix:
            start = 0
            prefix = self._decode([i for i, _ in prompt])
        for k in range(start, n):
            self._feed(prompt[k][1], k)
        dangling = self._utf8.getstate()[0]
        if dangling:
            at = self._open_start(len(dangling))
            raise DecodeError(
                f"prompt_ids end inside a multi-byte character: bytes {dangling.hex(' ')} from prompt_ids[{at}] on",
                path=f"prompt_ids[{at}]",
                hint="prime with ids that end on a character boundary and push the rest as generated ids",
            )
        self._open.clear()
        self._window = [i for i, _ in prompt[start:]]
        self._read = len(self._window)
        self._prefix = prefix

    def _clean_start(self, prompt: list[tuple[int, _Piece]], start: int) -> bool:
        """Whether decoding from `start` decodes the following ids as the whole prompt does: no UTF-8 sequence
        and no byte run continues across `start`."""
        for _, (data, _visible, _byte, breaks) in prompt[start:]:
            if breaks:
                break
            if data:
                if 0x80 <= data[0] < 0xC0:
                    return False
                break
        if self._vocab.groups_bytes:
            for _, (_data, visible, byte_token, _breaks) in reversed(prompt[:start]):
                if visible:
                    return not byte_token
        return True


def decode_stream(
    tokenizer: Tokenizer, ids: Iterable[int], prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = False
) -> list[str]:
    """The pieces an `IncrementalDecoder` emits for `ids`, one per id, followed by the `finish()` piece."""
    dec = IncrementalDecoder(tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens)
    pieces = [dec.push(i) for i in ids]
    pieces.append(dec.finish())
    return pieces


# ------------------------------------------------------------------------------------------ stop strings


@dataclass(frozen=True)
class StopMatch:
    """The stop string that ended the text, and the character offset where it starts in the text (= the length
    of the text emitted before it)."""

    stop: str
    offset: int


class StopMatcher:
    """Cut a text stream at the first stop string, emitting nothing of the stop.

    `push(text)` returns what is safe to emit: everything except the longest suffix of the pending text that is
    a proper prefix of some stop string (a prefix match, not vLLM's `max(len(stop)) - 1` characters: "a <" holds
    back "<" for "</think>", "a (" holds back nothing). The result does not depend on how the stream is chunked,
    and equals the oracle on the whole text: cut at the smallest `text.find(stop)` over all stops; when several
    stops start there (stops that are prefixes of each other), the longest wins, so a match of "ab" waits while
    "abc" could still follow. After a match `matched` is set and every further push returns "".

    Each push scans only the held-back tail (shorter than the longest stop) plus the new text.
    """

    def __init__(self, stop_strings: Iterable[str]) -> None:
        if isinstance(stop_strings, str):
            raise DecodeError(
                "stop_strings must be a list of strings, not one string",
                path="stop",
                hint=f"pass [{stop_strings!r}]",
            )
        stops: list[str] = []
        for n, s in enumerate(stop_strings):
            if not isinstance(s, str):
                raise DecodeError(f"a stop string must be a string, got {s!r}", path=f"stop[{n}]")
            if not s:
                raise DecodeError(
                    "a stop string must not be empty", path=f"stop[{n}]", hint="an empty stop would match at once"
                )
            if s not in stops:
                stops.append(s)
        self.stops: tuple[str, ...] = tuple(stops)
        self._prefixes = frozenset(s[:k] for s in stops for k in range(1, len(s)))
        self._longest = max((len(s) for s in stops), default=0)
        self._held = ""
        self._emitted = 0
        self._matched: StopMatch | None = None
        self._finished = False

    @property
    def matched(self) -> StopMatch | None:
        return self._matched

    @property
    def held(self) -> str:
        """The text held back, waiting to see whether a stop string follows."""
        return self._held

    def push(self, text: str) -> str:
        if self._finished:
            raise DecodeError("push() after finish()", hint="start a new StopMatcher for a new stream")
        if self._matched is not None or not text:
            return ""
        if not self.stops:
            self._emitted += len(text)
            return text
        return self._scan(self._held + text, final=False)

    def finish(self) -> str:
        """Flush the held-back text (cut at a stop that the end of the stream confirms)."""
        if self._finished:
            raise DecodeError("finish() called twice", hint="start a new StopMatcher for a new stream")
        self._finished = True
        if self._matched is not None or not self._held:
            return ""
        return self._scan(self._held, final=True)

    def _scan(self, buf: str, *, final: bool) -> str:
        best: tuple[int, int, str] | None = None  # (start, -length, stop)
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (best is None or (i, -len(s)) < best[:2]):
                best = (i, -len(s), s)
        # The earliest start from which a stop could still complete: the longest suffix that is a proper prefix.
        open_at = len(buf)
        if not final:
            for j in range(max(0, len(buf) - self._longest + 1), len(buf)):
                if buf[j:] in self._prefixes:
                    open_at = j
                    break
        if best is not None and best[0] < open_at:
            self._matched = StopMatch(best[2], self._emitted + best[0])
            self._held = ""
            self._emitted += best[0]
            return buf[: best[0]]
        self._held = buf[open_at:]
        self._emitted += open_at
        return buf[:open_at]


# -------------------------------------------------------------------------------------- ids -> stopped text


@dataclass(frozen=True)
class Detokenized:
    """What `stream_text` produced: the pieces (one per id, then the finish piece), their concatenation, and why
    the text ended (`"stop"` with the matched stop string, or None when the ids simply ran out)."""

    pieces: tuple[str, ...]
    text: str
    finish_reason: FinishReason | None
    stop: StopMatch | None


class Detokenizer:
    """An `IncrementalDecoder` feeding a `StopMatcher`: ids in, final text cut at the first stop string out.

    After a stop matches, further ids are not decoded (the text after a stop is discarded, so an unfinished
    character there is not an error).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] = (),
        *,
        stop: Iterable[str] = (),
        skip_special_tokens: bool = False,
    ) -> None:
        self.decoder = IncrementalDecoder(tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens)
        self.stop = StopMatcher(stop)

    @property
    def matched(self) -> StopMatch | None:
        return self.stop.matched

    @property
    def finish_reason(self) -> FinishReason | None:
        return "stop" if self.stop.matched is not None else None

    def push(self, token_id: int) -> str:
        if self.stop.matched is not None:
            return ""
        return self.stop.push(self.decoder.push(token_id))

    def finish(self, *, errors: Literal["strict", "replace"] = "strict") -> str:
        if self.stop.matched is not None:
            return ""
        try:
            tail = self.decoder.finish(errors=errors)
        except IncompleteDecodeError:
            # A stop that the end of the stream confirms lies before the unfinished character: no error.
            out = self.stop.finish()
            if self.stop.matched is None:
                raise
            return out
        return self.stop.push(tail) + self.stop.finish()


def stream_text(
    tokenizer: Tokenizer,
    ids: Iterable[int],
    prompt_ids: Sequence[int] = (),
    *,
    stop: Iterable[str] = (),
    skip_special_tokens: bool = False,
) -> Detokenized:
    """Detokenize `ids` as a stream would: pieces per id, cut at the first stop string."""
    det = Detokenizer(tokenizer, prompt_ids, stop=stop, skip_special_tokens=skip_special_tokens)
    pieces = [det.push(i) for i in ids]
    pieces.append(det.finish())
    return Detokenized(tuple(pieces), "".join(pieces), det.finish_reason, det.matched)


__all__ = [
    "Detokenized",
    "Detokenizer",
    "FinishReason",
    "IncrementalDecoder",
    "StopMatch",
    "StopMatcher",
    "byte_level_table",
    "decode_stream",
    "stream_text",
]
