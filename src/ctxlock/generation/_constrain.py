"""Constrained decoding: a per-step mask of the token ids that keep the output inside a JSON Schema (docs/way-back.md).

`JsonSchemaMask(tokenizer, schema)` compiles the schema with llguidance over *ctxlock's own* tokenizer: the
vocabulary is handed to llguidance as `id -> bytes` (`Tokenizer.token_bytes()`), with the control tokens marked
special, so the mask is exact for whichever backend produced the ids (HF / GGUF, SentencePiece, Tekken, tiktoken)
and a control token can never appear inside JSON text. Only the EOS id is allowed, once the grammar accepts.

What is strict here, and why:
- llguidance's `lenient` option (ignore unimplemented keywords) is always off, and a schema that carries its own
  llguidance options (`x-guidance`) is refused: a keyword the engine cannot enforce is an `UnsupportedSchemaError`
  naming its JSON path and llguidance's message, never a silently weaker constraint. Grammar warnings are errors.
- The schema must itself be a valid JSON Schema (checked with `jsonschema` against its meta-schema first).
- A token outside the mask is a `ConstraintError` naming the id and the step, and the matcher is left as it was
  (llguidance puts a matcher that consumed a bad token into a permanent error state; this never lets it).

Whitespace: `compact` (the default) allows exactly one spelling, `{"a":1,"b":[2,3]}`: it is canonical, so the
same choices give the same bytes, and it spends no tokens on layout. `flexible` is llguidance's and vLLM's
default: any JSON whitespace between tokens (a model trained on pretty-printed JSON may need it).

Known departures from JSON Schema that llguidance documents: properties are generated in the order the schema
lists them, and `pattern`s are always anchored. Both make the accepted language smaller, never larger: every
output the mask allows validates.

Converting a vocabulary is the expensive part (a trie over 150K tokens, about a second), so it is cached per
tokenizer (its id and content digest, and the EOS id); `MaskStats` reports it apart from the schema's compile time.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctxlock import caches
from ctxlock.errors import ConstraintError, UnsupportedSchemaError
from ctxlock.outside import SYNTAX_ERROR, loads_outside
from ctxlock.request import join_path
from ctxlock.tokenizer import TokenBytes, Tokenizer

__all__ = ["GuidanceVocab", "JsonSchemaMask", "MaskStats", "default_eos_id", "guidance_vocab"]

WHITESPACE_MODES = ("compact", "flexible")
_SPECIAL_MARKER = b"\xff"  # llguidance's TokTrie::SPECIAL_TOKEN_MARKER: never valid UTF-8, so never JSON text
_VOCAB_CACHE_SIZE = 4


# ----------------------------------------------------------------------------------------------- vocabulary


@dataclass(frozen=True)
class GuidanceVocab:
    """A tokenizer as llguidance sees it: the LLTokenizer (token trie), the bytes it was built from, the EOS id."""

    ll_tokenizer: Any  # llguidance.LLTokenizer
    token_bytes: TokenBytes
    eos_id: int
    seconds: float  # time it took to build, once (token bytes + llguidance's trie)

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)


class _Encoder:
    """What llguidance's TokenizerWrapper calls to tokenize text (forced bytes, fast-forward tokens): ctxlock's own
    encoder in plain-text mode, as long as its tokens spell exactly the given bytes.

    llguidance relies on that: a SentencePiece-style dummy prefix (`{` -> `▁{`, bytes ` {`) makes its mask and its
    matcher disagree, and can crash it. Where ctxlock's encoding is not byte-exact, the text is tokenized greedily
    over the same vocabulary by llguidance itself (exact bytes, though not necessarily the canonical ids)."""

    def __init__(self, tokenizer: Tokenizer, pieces: list[bytes], vocab: TokenBytes, eos_id: int) -> None:
        self.tokens = pieces
        self.eos_token_id = eos_id
        self.bos_token_id = None
        self.special_token_ids = sorted(vocab.special)
        # The GuidanceVocab that owns the LLTokenizer, once built. Weak: the LLTokenizer (native, invisible to
        # Python's garbage collector) holds this encoder, so a strong reference back would make a cycle that is
        # never freed, the whole vocabulary with it, each time the cache lets one go.
        self.owner: weakref.ref[GuidanceVocab] | None = None
        self._tokenizer = tokenizer
        self._vocab = vocab

    def __call__(self, text: bytes | str) -> list[int]:
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        decoded = data.decode("utf-8", errors="replace")
        ids = self._tokenizer.encode_text(decoded, at_start=False)
        owner = self.owner() if self.owner is not None else None
        if self._vocab.join(ids) == data or owner is None:
            return ids
        return list(owner.ll_tokenizer.greedy_tokenize(decoded))


_vocab_lock = threading.Lock()  # one conversion at a time: a second caller waits and takes the cached one
_vocabs: caches.LRU[tuple[Any, ...], GuidanceVocab] = caches.LRU(
    "constrain.vocabs", max_items=_VOCAB_CACHE_SIZE, scope="artifact"
)


def guidance_vocab(tokenizer: Tokenizer, eos_id: int) -> tuple[GuidanceVocab, bool]:
    """The llguidance form of `tokenizer` with `eos_id` as its stop token, and whether it came from the cache."""
    import llguidance

    key = (tokenizer.format, tokenizer.id, tokenizer.sha256, tokenizer.vocab_size, eos_id)
    with _vocab_lock:
        hit = _vocabs.get(key)
        if hit is not None:
            return hit, True
        t0 = time.perf_counter()
        vocab = tokenizer.token_bytes()
        if not 0 <= eos_id < len(vocab):
            raise ConstraintError(
                f"the EOS id {eos_id} is outside the vocabulary (0..{len(vocab) - 1})",
                path=tokenizer.id,
                hint="pass the id of the model's end-of-sequence token",
            )
        if not vocab.pieces[eos_id] and eos_id not in vocab.special:
            raise ConstraintError(f"the EOS id {eos_id} is an empty, unused token", path=tokenizer.id)
        pieces = [_SPECIAL_MARKER + p if i in vocab.special else p for i, p in enumerate(vocab.pieces)]
        if eos_id not in vocab.special:
            # The stop token must not double as text (`</s>` spelled out inside a JSON string).
            pieces[eos_id] = _SPECIAL_MARKER + pieces[eos_id]
        encoder = _Encoder(tokenizer, pieces, vocab, eos_id)
        if eos_id not in vocab.special:
            encoder.special_token_ids = sorted({*vocab.special, eos_id})
        ll_tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(encoder))
        built = GuidanceVocab(ll_tokenizer, vocab, eos_id, time.perf_counter() - t0)
        encoder.owner = weakref.ref(built)
        _vocabs.put(key, built)
        return built, False


def default_eos_id(tokenizer: Tokenizer, special_tokens: Mapping[str, str] | None = None) -> int:
    """The end-of-sequence id: the model's `eos_token` when its special-token table is given, else the backend's
    own (SentencePiece's `eos_id`, Tekken's `</s>`). Anything else must be passed explicitly."""
    if special_tokens and isinstance(special_tokens.get("eos_token"), str):
        found = tokenizer.token_to_id(special_tokens["eos_token"])
        if found is not None:
            return found
    eos = tokenizer.eos_id
    if isinstance(eos, int) and eos >= 0:
        return eos
    raise ConstraintError(
        "cannot tell this tokenizer's end-of-sequence id",
        path=tokenizer.id,
        hint="pass eos_id= (for example tokenizer.token_to_id('<|im_end|>')), or --eos on the command line",
    )


# ----------------------------------------------------------------------------------------------- schema paths

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = (
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)


def _subschemas(node: Any, path: str = "$") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in a schema, with its path; property *names* are never mistaken for keywords."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key in _SCHEMA_MAPS:
        value = node.get(key)
        if isinstance(value, dict):
            for name, sub in value.items():
                yield from _subschemas(sub, join_path(join_path(path, key), name))
    for key in _SCHEMA_LISTS:
        value = node.get(key)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _subschemas(sub, join_path(join_path(path, key), i))
    for key in _SCHEMA_ONE:
        value = node.get(key)
        if isinstance(value, dict):
            yield from _subschemas(value, join_path(path, key))
        elif key == "items" and isinstance(value, list):  # draft 4-7 tuple form
            for i, sub in enumerate(value):
                yield from _subschemas(sub, join_path(join_path(path, key), i))


def _locate(schema: Any, message: str) -> str | None:
    """Best effort: the JSON path(s) in `schema` that llguidance's `message` is about."""
    nodes = list(_subschemas(schema))
    m = re.search(r"Unimplemented keys: (\[[^\]]*\])", message)
    if m:
        try:
            keys = set(json.loads(m.group(1)))
        except ValueError:
            keys = set()
        found = [join_path(p, k) for p, node in nodes for k in node if k in keys]
        if found:
            return ", ".join(found[:5])
    # A keyword whose string value the message quotes: a pattern, a format, a $ref, a type name.
    for p, node in nodes:
        for k, v in node.items():
            quoted = isinstance(v, str) and len(v) > 1 and (v in message or v.lstrip("#") in message)
            if quoted and k in ("pattern", "format", "$ref", "type"):
                return join_path(p, k)
    # Keywords the message names (e.g. "minItems (3) is greater than maxItems (1)"): the node naming most of them.
    best, best_score = None, 0
    for p, node in nodes:
        score = sum(1 for k in node if isinstance(k, str) and re.search(rf"\b{re.escape(k)}\b", message))
        if score > best_score:
            best, best_score = p, score
    return best


def _schema_error_path(error: Any) -> str:
    path = "$"
    for key in error.absolute_path:
        path = join_path(path, key)
    return path


# ----------------------------------------------------------------------------------------------- the mask


@dataclass(frozen=True)
class MaskStats:
    """Where the time goes. Mask times cover computing one step's allowed set (llguidance + unpacking)."""

    tokenizer_seconds: float  # building the llguidance vocabulary (once per tokenizer; see tokenizer_cached)
    tokenizer_cached: bool  # this mask reused a vocabulary built earlier in the process
    compile_seconds: float  # JSON Schema -> llguidance grammar -> matcher
    mask_calls: int
    mask_median_seconds: float
    mask_p99_seconds: float
    mask_max_seconds: float
    mask_total_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokenizer_seconds": self.tokenizer_seconds,
            "tokenizer_cached": self.tokenizer_cached,
            "compile_seconds": self.compile_seconds,
            "mask_calls": self.mask_calls,
            "mask_median_seconds": self.mask_median_seconds,
            "mask_p99_seconds": self.mask_p99_seconds,
            "mask_max_seconds": self.mask_max_seconds,
            "mask_total_seconds": self.mask_total_seconds,
        }


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


def _load_schema(schema: Any, source: str | None) -> Any:
    where = source or "schema"
    if isinstance(schema, bytes | bytearray):
        try:
            schema = bytes(schema).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConstraintError(f"the schema is not UTF-8: {exc}", path=where) from None
    if isinstance(schema, str):
        try:
            schema = loads_outside(schema, f"{where} $", error=ConstraintError)
        except ConstraintError as exc:
            message = f"the schema is not valid JSON: {exc.message.removeprefix(SYNTAX_ERROR)}"
            raise ConstraintError(message, path=exc.path, hint=exc.hint or "pass the schema as JSON") from None
    if not isinstance(schema, dict | bool):
        raise ConstraintError(
            f"a JSON Schema is an object or a boolean, got {type(schema).__name__}",
            path=where,
            hint='pass a schema such as {"type": "object", "properties": {...}}',
        )
    return schema


def _check_schema(schema: Any, prefix: str) -> None:
    """A valid JSON Schema that accepts something and carries no llguidance options of its own."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConstraintError(
            f"not a valid JSON Schema: {exc.message}",
            path=prefix + _schema_error_path(exc),
            hint="fix the schema so that it validates against its meta-schema",
        ) from None
    if schema is False:
        raise UnsupportedSchemaError(
            "the schema `false` accepts no value, so nothing can be generated", path=prefix + "$"
        )
    if isinstance(schema, dict) and "x-guidance" in schema:
        raise ConstraintError(
            "the schema carries llguidance options (x-guidance); ctxlock sets them itself",
            path=prefix + '$["x-guidance"]',
            hint="remove x-guidance and pass whitespace='compact' or 'flexible'; lenient mode is never allowed",
        )


class JsonSchemaMask:
    """The allowed token ids at each step of generating JSON that validates against `schema`.

    Use: `allowed = m.mask()` (a read-only bool array over the vocabulary), sample a token from the allowed
    ones, `m.consume(token)`; stop when the token is EOS (`m.eos_id`) or `m.is_stopped()`.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        schema: Mapping[str, Any] | bool | str | bytes,
        *,
        eos_id: int | None = None,
        special_tokens: Mapping[str, str] | None = None,
        whitespace: str = "compact",
        source: str | None = None,
    ) -> None:
        """`special_tokens` (a model's table: `eos_token`, ...) picks the EOS id when `eos_id` is not given.
        `source` names the schema in error paths (`schemas/x.json:properties.tags.uniqueItems`)."""
        from llguidance.numpy import allocate_token_bitmask

        if whitespace not in WHITESPACE_MODES:
            raise ConstraintError(
                f"unknown whitespace mode {whitespace!r}", path="whitespace", hint=f"use one of {WHITESPACE_MODES}"
            )
        self.tokenizer = tokenizer
        self.source = source
        self.whitespace = whitespace
        self.schema = _load_schema(schema, source)
        self.schema_sha256 = hashlib.sha256(
            json.dumps(self.schema, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        ).hexdigest()
        prefix = f"{source}:" if source else ""
        _check_schema(self.schema, prefix)
        eos = default_eos_id(tokenizer, special_tokens) if eos_id is None else eos_id
        if isinstance(eos, bool) or not isinstance(eos, int | np.integer):
            raise ConstraintError(f"eos_id must be an integer, got {eos!r}", path="eos_id")
        self.vocab, self.tokenizer_cached = guidance_vocab(tokenizer, int(eos))
        self.eos_id = self.vocab.eos_id
        self.vocab_size = self.vocab.vocab_size
        t0 = time.perf_counter()
        self._matcher, self.grammar = self._compile(prefix)
        self.compile_seconds = time.perf_counter() - t0
        self._bitmask = allocate_token_bitmask(1, self.vocab_size)
        self._allowed: np.ndarray | None = None
        self._ids: list[int] = []
        self._mask_seconds: list[float] = []

    def _compile(self, prefix: str) -> tuple[Any, Any]:
        """llguidance's matcher and grammar for the schema, or an `UnsupportedSchemaError` naming the keyword."""
        import llguidance

        # lenient off: an unimplemented keyword is an error, never a silently weaker grammar. Passed as overrides,
        # the last of llguidance's layers (defaults -> the schema's x-guidance, refused above -> overrides).
        options: dict[str, Any] = {"lenient": False, "whitespace_flexible": self.whitespace == "flexible"}
        if self.whitespace == "compact":
            options.update(item_separator=",", key_separator=":")
        try:
            body = {} if self.schema is True else self.schema  # `true` accepts any JSON value, as `{}` does
            grammar = llguidance.LLMatcher.grammar_from_json_schema(body, overrides=options)
        except ValueError as exc:
            raise UnsupportedSchemaError(
                f"llguidance cannot read the schema: {exc}", path=prefix + "$", hint="pass a JSON Schema object"
            ) from None
        matcher = llguidance.LLMatcher(self.vocab.ll_tokenizer, grammar, log_level=0)
        problem = matcher.get_error() if matcher.is_error() else ""
        warnings = [] if problem else list(matcher.get_grammar_warnings())
        if problem or warnings:
            message = problem or "; ".join(warnings)
            where = _locate(self.schema, message)
            raise UnsupportedSchemaError(
                f"llguidance cannot enforce this schema: {message}",
                path=prefix + (where or "$"),
                hint="remove or restate that keyword (enum, pattern, anyOf, min/max bounds are supported); "
                "ctxlock never ignores a keyword it cannot enforce",
            )
        return matcher, grammar

    # -- state

    @property
    def steps(self) -> int:
        """How many tokens have been consumed (rollback and reset go back)."""
        return len(self._ids)

    @property
    def consumed(self) -> tuple[int, ...]:
        return tuple(self._ids)

    def text_bytes(self) -> bytes:
        """The bytes of the consumed tokens, as the grammar saw them."""
        return self.vocab.token_bytes.join(self._ids)

    def is_complete(self) -> bool:
        """The output so far is a complete JSON value the schema accepts: EOS is allowed here."""
        return bool(self._matcher.is_accepting())

    def is_stopped(self) -> bool:
        """No token but EOS can follow (the value is closed), or EOS was consumed."""
        return bool(self._matcher.is_stopped())

    # -- masks

    def bitmask(self) -> np.ndarray:
        """This step's mask in llguidance's layout: int32 words, bit i of word i // 32 for id i (a copy)."""
        self.mask()
        return self._bitmask[0].copy()

    def mask(self) -> np.ndarray:
        """A read-only bool array over the vocabulary: True where the id may come next."""
        if self._allowed is not None:
            return self._allowed
        from llguidance.numpy import fill_next_token_bitmask

        t0 = time.perf_counter()
        fill_next_token_bitmask(self._matcher, self._bitmask)
        words = self._bitmask[0].astype("<i4", copy=False).view(np.uint8)
        allowed = np.unpackbits(words, count=self.vocab_size, bitorder="little").view(np.bool_)
        self._mask_seconds.append(time.perf_counter() - t0)
        if self._matcher.is_error():
            raise ConstraintError(f"llguidance failed at step {self.steps}: {self._matcher.get_error()}")
        allowed.flags.writeable = False
        self._allowed = allowed
        return allowed

    def allowed_ids(self) -> np.ndarray:
        """The allowed ids, ascending."""
        return np.flatnonzero(self.mask())

    # -- transitions

    def consume(self, token_id: int) -> None:
        """Advance by one token; a token outside this step's mask is a ConstraintError and changes nothing."""
        if isinstance(token_id, bool) or not isinstance(token_id, int | np.integer):
            raise ConstraintError(f"a token id is an integer, got {token_id!r}", path=f"step {self.steps}")
        tid = int(token_id)
        if not 0 <= tid < self.vocab_size:
            raise ConstraintError(
                f"token id {tid} is outside the vocabulary (0..{self.vocab_size - 1})", path=f"step {self.steps}"
            )
        if not self.mask()[tid]:
            piece = self.vocab.token_bytes.pieces[tid]
            done = self.is_stopped()
            raise ConstraintError(
                f"token {tid} ({piece!r}) is not allowed at step {self.steps}: the schema's grammar rejects it"
                + (" (the value is complete)" if done else ""),
                path=f"step {self.steps}",
                hint=f"only EOS ({self.eos_id}) may follow" if done else "sample from mask() / allowed_ids()",
            )
        if not self._matcher.consume_token(tid):
            raise ConstraintError(
                f"llguidance rejected token {tid} at step {self.steps}: {self._matcher.get_error()}",
                path=f"step {self.steps}",
            )
        self._ids.append(tid)
        self._allowed = None

    def rollback(self, n: int) -> None:
        """Undo the last `n` consumed tokens: the next mask is exactly the one computed `n` steps ago."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.steps:
            raise ConstraintError(
                f"cannot roll back {n!r} tokens after {self.steps} steps", hint=f"pass 0..{self.steps}"
            )
        if n and not self._matcher.rollback(n):
            raise ConstraintError(f"llguidance could not roll back {n} tokens: {self._matcher.get_error()}")
        del self._ids[len(self._ids) - n :]
        self._allowed = None

    def reset(self) -> None:
        """Back to the start of the value (timings are kept)."""
        if not self._matcher.reset():
            raise ConstraintError(f"llguidance could not reset: {self._matcher.get_error()}")
        self._ids.clear()
        self._allowed = None

    # -- timings

    @property
    def tokenizer_seconds(self) -> float:
        return self.vocab.seconds

    @property
    def mask_seconds(self) -> tuple[float, ...]:
        """The time of every mask computed so far, in order."""
        return tuple(self._mask_seconds)

    def stats(self) -> MaskStats:
        times = self._mask_seconds
        return MaskStats(
            tokenizer_seconds=self.vocab.seconds,
            tokenizer_cached=self.tokenizer_cached,
            compile_seconds=self.compile_seconds,
            mask_calls=len(times),
            mask_median_seconds=statistics.median(times) if times else 0.0,
            mask_p99_seconds=_percentile(times, 99),
            mask_max_seconds=max(times, default=0.0),
            mask_total_seconds=sum(times),
        )
