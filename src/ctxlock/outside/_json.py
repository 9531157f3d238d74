"""The strict JSON reader: bytes -> text under a UTF-8 policy, text -> JSON with every check at its path.

- `decode_bytes` decodes UTF-8 strictly (an error names the first bad byte) or replaces bad bytes with U+FFFD
  and records every replaced byte offset; `byte_offset` maps a character position back to its byte.
- `loads_strict` is the stdlib parser with duplicate keys, NaN/Infinity, numbers that overflow, lone surrogates
  and nesting deeper than MAX_JSON_DEPTH rejected, each naming its JSON path.
- `loads_outside` is `loads_strict` for one JSON value from outside that is not a request (a usage file's line, a
  price table, a session): bytes in, every failure raised as the caller's error class, naming where it was read.
- `to_plain` turns a caller's Mapping into plain JSON values under the same depth rule, refusing cycles and
  non-JSON types.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from enum import StrEnum
from typing import Any

from ctxlock.errors import CtxlockError, RequestEncodingError, RequestJSONError, RequestValidationError
from ctxlock.outside._paths import LinkedPath, render_path
from ctxlock.settings import fast_enabled


class Utf8Policy(StrEnum):
    """What to do with bytes that are not valid UTF-8."""

    STRICT = "strict"  # reject, naming the offset of the first bad byte
    REPLACE = "replace"  # substitute U+FFFD and record every replaced byte offset


MAX_JSON_DEPTH = 128  # the deepest nesting any JSON ctxlock reads from outside may have
SYNTAX_ERROR = "invalid JSON: "  # how `loads_outside`'s error for text that is not JSON at all begins

# Offsets replaced by the `ctxlock.replace` codec error handler during the current decode. A ContextVar keeps
# concurrent parses (threads, asyncio tasks) apart; the handler is the only global, and it is named for ctxlock.
_REPLACED_RUNS: ContextVar[list[tuple[int, int]] | None] = ContextVar("ctxlock_replaced_runs", default=None)


def _replace_and_record(exc: UnicodeError) -> tuple[str, int]:
    runs = _REPLACED_RUNS.get()
    if not isinstance(exc, UnicodeDecodeError) or runs is None:
        raise exc
    # Called with the same (start, end) ranges as the builtin "replace" handler, so the text is identical to
    # bytes.decode("utf-8", "replace") and the recorded offsets are exactly the bytes behind each U+FFFD.
    runs.append((exc.start, exc.end))
    return "\ufffd", exc.end


codecs.register_error("ctxlock.replace", _replace_and_record)


def decode_bytes(data: bytes, policy: Utf8Policy) -> tuple[str, list[tuple[int, int]]]:
    """Decode UTF-8 under the policy; return the text and the replaced byte ranges."""
    if policy is Utf8Policy.STRICT:
        try:
            return data.decode("utf-8"), []
        except UnicodeDecodeError as exc:
            bad = data[exc.start : exc.end]
            raise RequestEncodingError(
                f"invalid UTF-8: byte{'s' if len(bad) > 1 else ''} {bad.hex(' ')} ({exc.reason})",
                path=f"byte {exc.start}",
                hint="send the request encoded as UTF-8, or parse with utf8='replace' to substitute U+FFFD",
            ) from None
    runs: list[tuple[int, int]] = []
    token = _REPLACED_RUNS.set(runs)
    try:
        text = data.decode("utf-8", "ctxlock.replace")
    finally:
        _REPLACED_RUNS.reset(token)
    return text, runs


def byte_offset(data: bytes, runs: list[tuple[int, int]], text: str, pos: int) -> int:
    """The byte offset in `data` of character `pos` of `text` (its decoding, with replaced runs)."""
    char = byte = 0
    for start, end in runs:
        # Between replaced runs the bytes decoded strictly, one U+FFFD stands for each run.
        seg_chars = len(data[byte:start].decode("utf-8"))
        if pos < char + seg_chars:
            break
        char += seg_chars
        if pos == char:
            return start
        char, byte = char + 1, end
    return byte + len(text[char:pos].encode("utf-8"))


class _Pairs(list[tuple[str, Any]]):
    """What object_pairs_hook returns: an object's pairs, before the top-down pass checks duplicates.

    The hook runs bottom-up and cannot know where it is; `_build` walks down afterwards and knows the path.
    """

    __slots__ = ()


class _BadNumber:
    """A parsed NaN, Infinity, or a number that overflows to infinity, reported by `_build` with its path."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _parse_float(literal: str) -> float | _BadNumber:
    value = float(literal)
    return value if math.isfinite(value) else _BadNumber(literal)


def _finite(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A caller's float parser whose non-finite float results are reported with their path, as `_parse_float`'s
    are (a Decimal of a JSON number literal is always finite)."""

    def parse_finite(literal: str) -> Any:
        try:
            value = parse(literal)
        except (ArithmeticError, ValueError):  # Decimal("1e99999999999999999999"): an exponent past its context
            return _BadNumber(literal)
        return _BadNumber(literal) if isinstance(value, float) and not math.isfinite(value) else value

    return parse_finite


_SURROGATE = re.compile("[\ud800-\udfff]")
# A \u escape of D800-DFFF (JSON's `u` is lower case; its hex digits are either case).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_SURROGATE_ESCAPE_BYTES = re.compile(_SURROGATE_ESCAPE.pattern.encode())  # the same, in UTF-8 (all ASCII)


def _may_hold_surrogate(text: str) -> bool:
    """Whether a string parsed from `text` can hold a lone surrogate: only from a `\\u` escape of one, or from one in
    the text itself (the one thing UTF-8 cannot encode). About 2 us for a 1.5 kB request, where searching each
    string costs about 1 us a string."""
    if _SURROGATE_ESCAPE.search(text) is not None:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_depth(path: LinkedPath, depth: int) -> None:
    """Refuse a container at nesting `depth` >= MAX_JSON_DEPTH (the root is at depth 0), naming its path."""
    if depth >= MAX_JSON_DEPTH:
        raise RequestJSONError(
            f"JSON nested deeper than {MAX_JSON_DEPTH} levels",
            path=render_path(path),
            hint="flatten the structure",
        )


class _Builder:
    """Top-down pass over parsed JSON: duplicate keys, non-finite numbers, lone surrogates, depth, with paths."""

    def __init__(
        self, policy: Utf8Policy, strings: bool = True, last_key_wins: bool = False, nonfinite: bool = False
    ) -> None:
        self.policy = policy
        self.nonfinite = nonfinite  # True: NaN, Infinity and overflowing numbers are floats, as json.loads reads them
        self.strings = strings  # False: no string can hold a lone surrogate (`loads_strict` proved it)
        self.last_key_wins = last_key_wins  # True: a duplicate key keeps its first place and its last value

    def build(self, value: Any, path: LinkedPath, depth: int = 0) -> Any:
        if isinstance(value, _Pairs):
            check_depth(path, depth)
            out: dict[str, Any] = {}
            for key, item in value:
                if self.strings:
                    key = self._string(key, path)
                if key in out and not self.last_key_wins:
                    raise RequestJSONError(
                        f"duplicate key {json.dumps(key, ensure_ascii=False)}",
                        path=render_path(path),
                        hint="each key may appear once per object; JSON parsers disagree on which duplicate wins",
                    )
                out[key] = self.build(item, (path, key), depth + 1)
            return out
        if isinstance(value, list):
            check_depth(path, depth)
            return [self.build(item, (path, i), depth + 1) for i, item in enumerate(value)]
        if isinstance(value, str):
            return self._string(value, path) if self.strings else value
        if isinstance(value, _BadNumber):
            if self.nonfinite:
                return float(value.literal)
            raise RequestJSONError(
                f"{value.literal} is not a finite JSON number",
                path=render_path(path),
                hint="JSON has no NaN or Infinity; send a finite number, a string or null",
            )
        return value

    def _string(self, value: str, path: LinkedPath) -> str:
        # JSON escapes can spell a lone surrogate (\ud800) that is not a Unicode scalar value and cannot be encoded
        # as UTF-8 later; it is an encoding error like a bad byte, and REPLACE substitutes U+FFFD for it likewise.
        match = _SURROGATE.search(value)
        if match is None:
            return value
        if self.policy is Utf8Policy.REPLACE:
            return _SURROGATE.sub("\ufffd", value)
        raise RequestEncodingError(
            f"string holds a lone surrogate \\u{ord(match.group()):04x} at character {match.start()}",
            path=render_path(path),
            hint="escape characters outside the BMP as a surrogate pair, or parse with utf8='replace'",
        )


class _Refused(Exception):
    """Raised by the one-pass reader's hooks (`_loads_fast`): the reference reader must read this text."""


def _fast_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # a duplicate key
        raise _Refused
    return obj


def _fast_constant(literal: str) -> Any:
    raise _Refused  # NaN, Infinity, -Infinity


def _fast_float(literal: str) -> float:
    value = float(literal)
    if math.isfinite(value):
        return value
    raise _Refused  # a number that overflows to infinity


# One decoder for every call (json.loads builds one per call when given hooks), as json.loads keeps one for calls
# without hooks. `_loads_fast` calls its scanner as `decoder.decode` does: JSON whitespace, one value, whitespace.
_FAST_SCAN = json.JSONDecoder(
    object_pairs_hook=_fast_pairs, parse_constant=_fast_constant, parse_float=_fast_float
).scan_once  # type: ignore[attr-defined]  # (the C scanner json.decoder sets; not in typeshed)
# The same without the pairs hook, for files whose reference reader lets the last duplicate key win (json.load,
# serde_json's maps): the C scanner builds the dicts itself, as json.loads does (a multi-MB tokenizer.json reads
# in about json.loads' time).
_FAST_SCAN_LAST_KEY = json.JSONDecoder(parse_constant=_fast_constant, parse_float=_fast_float).scan_once  # type: ignore[attr-defined]
_WHITESPACE = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"{[")  # what translate deletes to leave `{` and `[`


def _within_depth(value: Any, depth: int) -> bool:
    """Whether no container in `value` (a container at `depth`) sits at MAX_JSON_DEPTH or deeper."""
    if depth >= MAX_JSON_DEPTH:
        return False
    for item in value.values() if type(value) is dict else value:
        if (type(item) is dict or type(item) is list) and not _within_depth(item, depth + 1):
            return False
    return True


def _loads_fast(text: str, source: bytes | None, last_key_wins: bool = False, allowance: int = 0) -> Any:
    """`loads_strict`'s value read in one pass of the stdlib's C scanner, or `_Refused` where the reference reader
    must read the text (it then gives its value, or its error with its path): a duplicate key, a NaN or infinite
    number (the hooks refuse them as the scanner meets them), a string that may hold a lone surrogate
    (`_may_hold_surrogate`), nesting at MAX_JSON_DEPTH, a leading U+FEFF (json.loads' own error), or any other
    exception. What is left is the value the reference reader builds: the same dicts (keys in order), lists and
    scalars.

    `source`, the UTF-8 bytes the text was decoded from (under either policy; a leading BOM may be cut from the
    text), answers for it where bytes are quicker to search than a text of wide characters: the text then holds no
    lone surrogate character (UTF-8 cannot hold one, and the decoder refuses or replaces its bytes), and it has the
    bytes' ASCII characters, backslashes and brackets, in the same places (a byte below 0x80 is a character of its
    own in UTF-8, and no replaced run holds one)."""
    if text[:1] == "\ufeff":
        return _Refused
    if _may_hold_surrogate(text) if source is None else _SURROGATE_ESCAPE_BYTES.search(source) is not None:
        return _Refused
    try:
        scan = _FAST_SCAN_LAST_KEY if last_key_wins else _FAST_SCAN
        value, end = scan(text, _WHITESPACE(text, 0).end())
    except Exception:  # whatever it is (syntax, recursion, a refusal), the reference reader meets it and says so
        return _Refused
    if _WHITESPACE(text, end).end() != len(text):  # extra data
        return _Refused
    # A container at depth d has d containers around it: no more brackets than MAX_JSON_DEPTH in the whole text
    # (strings included) prove the depth without a walk.
    if type(value) is dict or type(value) is list:
        # (on the bytes, one pass that leaves the brackets, where two counts read them twice)
        brackets = text.count("{") + text.count("[") if source is None else len(source.translate(None, _NOT_BRACKETS))
        if brackets > MAX_JSON_DEPTH + allowance and not _within_depth(value, -allowance):
            return _Refused
    return value


def loads_strict(
    text: str,
    path: str,
    policy: Utf8Policy,
    *,
    source: bytes | None = None,
    parse_float: Callable[[str], Any] | None = None,
    last_key_wins: bool = False,
    nonfinite: bool = False,
    depth_allowance: int = 0,
) -> Any:
    """json.loads with duplicate keys, NaN/Infinity and lone surrogates rejected. Raises JSONDecodeError as is.

    `last_key_wins`: a duplicate key is not refused but read as json.loads reads it (first place, last value), for
    model files whose reference readers accept them (docs/outside-json.md). `nonfinite`: NaN, Infinity and numbers
    that overflow are floats, as json.loads reads them (for JSON a reference reads with json.loads inside a request).
    `depth_allowance`: levels allowed past MAX_JSON_DEPTH, for a file that holds a request a few levels down (a
    record).

    `source`: the UTF-8 bytes `text` was decoded from (`decode_bytes`, a leading BOM maybe cut from the text), which
    the fast path searches instead of the text. `parse_float`: what a JSON number with a fraction or exponent
    becomes (`decimal.Decimal` for a price table; a non-finite result is refused). Fast path: the one-pass reader
    (`_loads_fast`) when it can vouch for the text (floats as floats only)."""
    if fast_enabled() and parse_float is None and not nonfinite:
        value = _loads_fast(text, source, last_key_wins, depth_allowance)
        if value is not _Refused:
            return value
    floats = _parse_float if parse_float is None else _finite(parse_float)
    try:
        raw = json.loads(text, object_pairs_hook=_Pairs, parse_constant=_BadNumber, parse_float=floats)
    except RecursionError:
        raise RequestJSONError(
            f"JSON nested deeper than {MAX_JSON_DEPTH} levels", path=path, hint="flatten the structure"
        ) from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # e.g. an integer longer than sys.get_int_max_str_digits()
        raise RequestJSONError(f"invalid JSON value: {exc}", path=path, hint="send numbers that fit") from None
    # Fast path: one search of the whole text instead of one per string, when it shows no string can hold a lone
    # surrogate (`_may_hold_surrogate`); the reference (`CTXLOCK_FAST=0`) searches every string.
    strings = not fast_enabled() or _may_hold_surrogate(text)
    return _Builder(policy, strings, last_key_wins, nonfinite).build(raw, path, -depth_allowance)


def loads_outside(
    raw: bytes | str,
    where: str,
    *,
    error: type[CtxlockError],
    at: int = 0,
    parse_float: Callable[[str], Any] | None = None,
    last_key_wins: bool = False,
    nonfinite: bool = False,
    depth_allowance: int = 0,
    utf8: Utf8Policy = Utf8Policy.STRICT,
) -> Any:
    """One JSON value from outside, through the strict reader: UTF-8 (the first bad byte named, `at` being where
    `raw` starts in its file), depth, duplicate keys, NaN, integers too long to read and lone surrogates refused as
    `error`, naming `where` (a base path such as `usage.jsonl:3 $`) and the JSON path inside. `raw` may be text
    already decoded from UTF-8. `last_key_wins`, `nonfinite`, `depth_allowance`: see `loads_strict`; `utf8`: what a
    string's lone surrogate escape is (REPLACE: U+FFFD, as the caller's --utf8 policy says). A syntax error's
    message starts with SYNTAX_ERROR."""
    try:
        text = raw if isinstance(raw, str) else raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"not UTF-8 ({exc.reason} at byte {at + exc.start})", path=where, hint="save it as UTF-8") from None
    source = None if isinstance(raw, str) else raw
    try:
        return loads_strict(
            text,
            where,
            utf8,
            source=source,
            parse_float=parse_float,
            last_key_wins=last_key_wins,
            nonfinite=nonfinite,
            depth_allowance=depth_allowance,
        )
    except json.JSONDecodeError as exc:
        at_line = where.removesuffix(" $") + (f" line {exc.lineno}" if exc.lineno > 1 else "")
        raise error(f"{SYNTAX_ERROR}{exc.msg}", path=f"{at_line} column {exc.colno}") from None
    except CtxlockError as exc:  # the request's hint (parse with utf8='replace') is no option here
        hint = (exc.hint or "").replace(", or parse with utf8='replace'", "") or None
        raise error(exc.message, path=exc.path, hint=hint) from None


def to_plain(value: Any, path: LinkedPath, depth: int = 0, open_: set[int] | None = None) -> Any:
    """A Mapping given by a caller -> plain JSON values, rejecting what JSON cannot hold (with its path).

    Nesting is checked by the rule bytes are (`_Builder`): a container at depth MAX_JSON_DEPTH is refused with the
    same error, before Python's recursion limit is near. A container inside itself (`d["x"] = d`) is refused as a
    cycle, naming the path where it comes round; `open_` holds the ids of the containers being converted."""
    if isinstance(value, Mapping | list | tuple):
        open_ = set() if open_ is None else open_
        if id(value) in open_:
            raise RequestValidationError(
                "this value contains itself (a reference cycle)",
                path=render_path(path),
                hint="JSON is a tree: pass a copy instead of a reference to an enclosing object or list",
            )
        check_depth(path, depth)
        open_.add(id(value))  # an error ends the whole conversion, so only success needs to take it out again
        out: Any
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise RequestValidationError(
                        f"key {key!r} is not a string", path=render_path(path), hint="JSON object keys are strings"
                    )
                out[key] = to_plain(item, (path, key), depth + 1, open_)
        else:
            out = [to_plain(item, (path, i), depth + 1, open_) for i, item in enumerate(value)]
        open_.discard(id(value))
        return out
    if value is None or isinstance(value, str | int | float):  # bool is an int
        return value
    raise RequestValidationError(
        f"{type(value).__name__} is not a JSON value", path=render_path(path), hint="send JSON types only"
    )
