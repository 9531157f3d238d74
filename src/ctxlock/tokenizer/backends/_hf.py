"""HF `tokenizers` backend: a `tokenizer.json`, used as the reference uses it.

`encode(parse_special=True)` is exactly `Tokenizer.encode(text, add_special_tokens=False)`, which is what
transformers' `apply_chat_template(tokenize=True)` does with a rendered chat. For text that must not become a
control token, a second `tokenizers.Tokenizer` is built from the same JSON without the control added tokens, so
the normalizer, pre-tokenizer and model are the reference's own. HF splits added tokens out *before* it
normalizes, so the runs between them are independent, with one exception: Metaspace's `prepend_scheme: first`
adds the dummy prefix only to a run at offset 0. A run elsewhere is encoded with a variant whose scheme is
`never`.

`encode_text` (and `encode_text_batch`) has two engines: `tokenizers` (the plain variant above) and `tiktoken`, taken
only when `fastbpe.check` proves rank-based BPE gives the same ids for this vocabulary (byte-level BPE whose merges
are consistent with the token ids: Qwen2, Llama 3, GPT-2). The choice is made on first use (from an on-disk cache
after the first time), `engine` and `engine_reason` say which and why, and `CTXLOCK_FAST=0` forces `tokenizers`.
`encode` and `encode_matched` always use `tokenizers`: they are the reference.

A `tokenizer.json` may carry `truncation` and `padding` sections. transformers switches both off in
`apply_chat_template`, and so does this backend for every encode: the sections are reported (`describe`), and
`encode_truncated` applies the truncation only when a caller asks (`ctxlock tokenize --truncate`).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxlock.core import longest_first
from ctxlock.errors import ArtifactFormatError, CtxlockError, TokenizerError
from ctxlock.outside import SYNTAX_ERROR, loads_outside
from ctxlock.settings import cache_root, fast_enabled
from ctxlock.tokenizer._accel import Accelerator, probe_texts
from ctxlock.tokenizer._base import AddedToken, ControlMatch, ManifestFiles, PieceView, TokenBytes, TokenizerBase
from ctxlock.tokenizer._fastbpe import FastEncoder, cached_check
from ctxlock.tokenizer._prefix import WholeText, prefix_cache_bytes, split_runs, whole_text_refusal
from ctxlock.tokenizer.backends._hf_bytes import hf_decode_pieces, hf_token_bytes
from ctxlock.tokenizer.backends._hf_normalizer import normalizer_alone

if TYPE_CHECKING:
    import tokenizers  # imported on first use: `import ctxlock` does not load it


def _set_prepend_never(node: Any) -> bool:
    changed = False
    if isinstance(node, dict):
        if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first":
            node["prepend_scheme"] = "never"
            changed = True
        for v in node.values():
            changed |= _set_prepend_never(v)
    elif isinstance(node, list):
        for v in node:
            changed |= _set_prepend_never(v)
    return changed


def _loaded_marker(sha256: str) -> Path:
    import tokenizers

    return cache_root() / "tokenizers-loaded" / f"{sha256}-{tokenizers.__version__}"


def _loaded_before(sha256: str) -> bool:
    """Whether `tokenizers` (this release) has built a pipeline from a JSON text with this sha256 before."""
    try:
        return _loaded_marker(sha256).is_file()
    except OSError:
        return False


_HEAD_VERSION = 2


def _head_path(sha256: str) -> Path:
    return cache_root() / "tokenizer-json-head" / f"{sha256}-{_HEAD_VERSION}.json"


def _head_of(data: dict[str, Any]) -> dict[str, Any]:
    """Everything of a parsed tokenizer.json but the model's vocabulary and merges (about 4 KB of a 7 MB file)."""
    model = data.get("model")
    if isinstance(model, dict):
        model = {k: v for k, v in model.items() if k not in ("vocab", "merges")}
    return {**data, "model": model}


def _map_vocab_size(data: dict[str, Any]) -> int | None:
    """`tokenizers`' get_vocab_size(with_added_tokens=True) is the size of get_vocab(True): the model's tokens and
    the added tokens' contents, as one map. Read from the JSON when the vocabulary is a token -> id map, else None."""
    model = data.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") in ("BPE", "WordPiece", "WordLevel") and isinstance(vocab, dict):
        return len(vocab.keys() | {t["content"] for t in data.get("added_tokens", [])})
    return None


def _load_head(sha256: str) -> tuple[dict[str, Any], int | None] | None:
    """The head (`_head_of`) and `_map_vocab_size` that an earlier process kept for a JSON text with this sha256,
    or None: absent, unreadable or corrupt (all the same: the text is parsed in full)."""
    try:
        stored = json.loads(_head_path(sha256).read_text("utf-8"))
        if isinstance(stored, dict) and stored.get("sha256") == sha256 and isinstance(stored.get("head"), dict):
            head, size = stored["head"], stored.get("map_vocab_size", "absent")
            if head.get("truncation") is None and head.get("padding") is None and (size is None or type(size) is int):
                return head, size
    except (OSError, ValueError):
        pass
    return None


def _store_head(sha256: str, head: dict[str, Any], map_vocab_size: int | None) -> None:
    """Keep the head for later processes; a write that fails is not an error (they parse the text in full)."""
    path = _head_path(sha256)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"sha256": sha256, "head": head, "map_vocab_size": map_vocab_size}, fh, ensure_ascii=False)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except (OSError, TypeError, ValueError):
        pass


def _remember_loaded(sha256: str) -> None:
    """An empty marker file; one that cannot be written is not an error (the next load builds eagerly again)."""
    path = _loaded_marker(sha256)
    try:
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    except OSError:
        pass


@contextlib.contextmanager
def _typed(tokenizer_id: str) -> Iterator[None]:
    """`tokenizers` raises a bare Exception when it cannot encode a text (a BPE model meeting a character it lacks,
    whose unk token is not in its vocabulary either: transformers fails the same way); it becomes TokenizerError."""
    try:
        yield
    except CtxlockError:
        raise
    except Exception as exc:
        raise TokenizerError(
            f"the tokenizer cannot encode this text: {exc}",
            path=tokenizer_id,
            hint="transformers fails on it too; give the tokenizer an unk token its vocabulary holds",
        ) from None


class HFTokenizer(TokenizerBase):
    format = "hf-tokenizers"

    def __init__(
        self,
        json_text: str,
        *,
        id: str,
        source: str = "",
        sha256: str | None = None,
        description: dict[str, Any] | None = None,
        text_sha256: str | None = None,
    ) -> None:
        """`sha256`/`description` describe the source artifact when the JSON was converted from another format (a
        GGUF file, `artifacts.gguf_load.GGUFTokenizer`): the digest is then the source file's, not the JSON's.
        `text_sha256`: the sha256 of `json_text`'s UTF-8 when the caller already has it (the file's bytes' digest:
        encoding and hashing a 7 MB text again costs a fresh process about 20 ms)."""
        self.id = id
        self.source = source
        self._json_text = json_text
        text_sha256 = text_sha256 or hashlib.sha256(json_text.encode("utf-8")).hexdigest()
        self.sha256 = sha256 or text_sha256
        self._description = dict(description or {})
        # A text parsed by an earlier process (same sha256) left its head on disk: everything but the vocabulary
        # and the merges, which are parsed on first use (`_data`); a render and the whole-text path need neither.
        head = _load_head(text_sha256)
        if head is not None:
            self._head, self._map_vocab_size = head
            self._truncation = self._padding = None  # a head is kept only for texts without these sections
            self._encode_json = json_text
        else:
            try:
                data = self._parse(json_text)
                self._truncation = data.get("truncation")
                self._padding = data.get("padding")
                if self._truncation is not None or self._padding is not None:
                    # Never applied to an encode (transformers turns both off for a chat): the pipeline runs without.
                    data = {**data, "truncation": None, "padding": None}
                    self._encode_json = json.dumps(data, ensure_ascii=False)
                else:
                    self._encode_json = json_text
                self._data = data
                self._head = _head_of(data)
                self._map_vocab_size = _map_vocab_size(data)
            except Exception as exc:
                raise self._invalid(exc) from None
            if self._encode_json is json_text:
                _store_head(text_sha256, self._head, self._map_vocab_size)
        self._encode_sha256 = (
            text_sha256
            if self._encode_json is json_text
            else hashlib.sha256(self._encode_json.encode("utf-8")).hexdigest()
        )
        if not _loaded_before(self._encode_sha256):
            # Never seen: build the `tokenizers` pipeline now, so a file it rejects fails at load, naming the file.
            # Seen (an earlier process built it from these very bytes), it is built on first use: the whole-text
            # path, `render` and the engine choice do not need it.
            _ = self._tok
        self._added = tuple(
            AddedToken(
                content=t["content"],
                id=int(t["id"]),
                special=bool(t.get("special", False)),
                lstrip=bool(t.get("lstrip", False)),
                rstrip=bool(t.get("rstrip", False)),
                single_word=bool(t.get("single_word", False)),
                normalized=bool(t.get("normalized", False)),
            )
            for t in self._head.get("added_tokens", [])
        )
        self._by_id = {t.id: t for t in self._added}
        self._control_ids = frozenset(t.id for t in self._added if t.control)
        self._control_tokens = frozenset(t.content for t in self._added if t.control)
        self._engine_lock = threading.Lock()
        self._engine_choice: tuple[str, str, Any] | None = None
        self._whole_choice: tuple[WholeText | None, str] = (None, "not decided")
        self._whole_fast: Any = None  # the FastEncoder the whole-text encoder is still to be built on (`_whole`)

    def _invalid(self, exc: Exception) -> ArtifactFormatError:
        if isinstance(exc, ArtifactFormatError):  # the strict reader's error, naming the JSON path
            message, path = exc.message.removeprefix(SYNTAX_ERROR), exc.path
        else:
            message, path = str(exc), self.source or self.id
        return ArtifactFormatError(
            f"not a valid tokenizer.json: {message}", path=path, hint="re-export it with tokenizers/transformers"
        )

    def _parse(self, text: str) -> dict[str, Any]:
        """tokenizer.json through the strict reader under the artifact bounds (docs/outside-json.md): a duplicate
        key keeps its last value, as tokenizers' serde_json maps read it."""
        data = loads_outside(text, f"{self.source or self.id} $", error=ArtifactFormatError, last_key_wins=True)
        if not isinstance(data, dict):
            raise ArtifactFormatError("not a JSON object", path=self.source or self.id)
        return data

    @cached_property
    def _data(self) -> dict[str, Any]:
        """The parsed tokenizer.json (truncation and padding off), parsed here on first use when `__init__` read
        its head from the cache: the same bytes an earlier process parsed."""
        try:
            return self._parse(self._encode_json)
        except Exception as exc:
            raise self._invalid(exc) from None

    @cached_property
    def _tok(self) -> tokenizers.Tokenizer:
        """The reference pipeline (`tokenizers`), built from the JSON on first use (see `__init__`)."""
        import tokenizers

        try:
            tok = tokenizers.Tokenizer.from_str(self._encode_json)
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise self._invalid(exc) from None
        except BaseException as exc:
            # A Rust panic inside tokenizers (a vocab entry that breaks its own invariants) surfaces as pyo3's
            # PanicException, which derives from BaseException: it is the file's fault too. Interrupts still pass.
            if type(exc).__name__ != "PanicException":
                raise
            raise self._invalid(Exception(f"tokenizers panicked reading it: {exc}")) from None
        _remember_loaded(self._encode_sha256)
        return tok

    # -- plain-text variants, built on first use
    @cached_property
    def _plain(self) -> tuple[tokenizers.Tokenizer, tokenizers.Tokenizer]:
        # A shallow copy: only the added tokens and the pre-tokenizer change (deep-copying a 150k vocab takes seconds).
        import tokenizers

        data = dict(self._data)
        data["added_tokens"] = [t for t in data.get("added_tokens", []) if int(t["id"]) not in self._control_ids]
        first = tokenizers.Tokenizer.from_str(json.dumps(data))
        rest = first
        data["pre_tokenizer"] = copy.deepcopy(data.get("pre_tokenizer"))
        if _set_prepend_never(data["pre_tokenizer"]):
            rest = tokenizers.Tokenizer.from_str(json.dumps(data))
        return first, rest

    # -- the encode_text engine, chosen on first use
    def _choose_engine(self) -> tuple[str, str, Any]:
        """("tiktoken" | "tokenizers", reason, FastEncoder | None), decided once per tokenizer."""
        choice = self._engine_choice
        if choice is not None:
            return choice
        with self._engine_lock:
            if self._engine_choice is None:
                plain_added = [t for t in self._head.get("added_tokens", []) if int(t["id"]) not in self._control_ids]
                # The full parse (`_data`) only when the check's verdict is not on disk.
                verdict, ranks = cached_check(
                    self._encode_json, lambda: self._data, plain_added, json_sha256=self._encode_sha256
                )
                if not verdict.ok:
                    self._engine_choice = ("tokenizers", verdict.reason, None)
                    self._whole_choice = (None, f"encode_text uses tokenizers ({verdict.reason})")
                else:
                    # The normalizer alone (the fast engine needs nothing else of `tokenizers`), built when a text
                    # that is not NFC-inert first needs it.
                    normalize = None
                    if self._head.get("normalizer") is not None:
                        section = self._head["normalizer"]
                        built: list[Callable[[str], str] | None] = []

                        def normalize(text: str) -> str:
                            if not built:
                                built.append(normalizer_alone(section))
                            fn = built[0]
                            return text if fn is None else fn(text)

                    refusal = whole_text_refusal(self._added)
                    fast = FastEncoder(
                        verdict,
                        ranks,
                        added=[(t["content"], int(t["id"]), bool(t.get("normalized", False))) for t in plain_added],
                        normalize=normalize,
                        name=f"ctxlock-{self.sha256[:12]}",
                        specials=None if refusal else {t.content: t.id for t in self._added},
                    )
                    self._engine_choice = ("tiktoken", verdict.reason, fast)
                    # Taken or refused now; built on first use (`_whole`): `tokenize` (`ctxlock render`) never needs
                    # it, and its length table over the vocabulary is work a short process should not pay for.
                    self._whole_choice = (None, refusal or "")
                    self._whole_fast = None if refusal else fast
            return self._engine_choice

    def _build_whole(self, fast: Any) -> WholeText:
        ids = np.fromiter(fast.ranks.values(), dtype=np.int64, count=len(fast.ranks))
        lengths = np.zeros(max([int(ids.max()), *(t.id for t in self._added)]) + 1, dtype=np.int64)
        lengths[ids] = np.fromiter(map(len, fast.ranks), dtype=np.int64, count=len(fast.ranks))
        for t in self._added:
            lengths[t.id] = len(t.content.encode("utf-8"))
        fallback = None
        if self._split_regex is not None:

            def fallback(text: str) -> tuple[list[int], list[int], list[int]]:
                return split_runs(
                    text, self.split_controls(text) or [], lambda run: self.encode_text(run, at_start=False)
                )

        specials = dict(fast.specials)
        json_text = self._encode_json

        def build() -> Any:
            import fastokens

            return fastokens.Tokenizer.from_json_str(json_text)

        whole = WholeText(
            fast.core,
            specials,
            lengths,
            max_bytes=prefix_cache_bytes(),
            inert=fast.inert if fast.verdict.normalizer else None,
            fallback=fallback,
        )
        # The verdict on disk is keyed by the digest of the very text fastokens loads (not the source's digest: a
        # GGUF's, or a tokenizer.json whose truncation/padding sections were dropped).
        json_sha256 = self._encode_sha256
        whole.accelerator = Accelerator(
            build, whole.reference_ids, lambda: probe_texts(fast.ranks, specials), json_sha256=json_sha256
        )
        return whole

    def _whole(self) -> WholeText | None:
        """The whole-text encoder `_choose_engine` admitted, built on first use (None when refused)."""
        self._choose_engine()
        if self._whole_fast is not None:
            with self._engine_lock:
                fast = self._whole_fast
                if fast is not None:
                    self._whole_choice = (self._build_whole(fast), "")
                    self._whole_fast = None
        return self._whole_choice[0]

    @property
    def whole_text(self) -> WholeText | None:
        """The whole-text encoder (`prefix.WholeText`: one tiktoken call per rendered text, prefix reuse across
        texts), or None when it is not provably equal to `tokenizers` here (`whole_text_reason` says why) or fast
        paths are off."""
        if not fast_enabled():
            return None
        return self._whole()

    @property
    def whole_text_reason(self) -> str:
        """Why whole-text encoding is refused ("" when it is taken)."""
        if not fast_enabled():
            return "CTXLOCK_FAST=0"
        self._choose_engine()
        return self._whole_choice[1]

    @property
    def whole_text_engine(self) -> str:
        """What makes whole-text encoding's native call: "fastokens" once it is built and has agreed with tiktoken
        on the vocabulary (`accel`), "tiktoken" until then or when it is refused, with the accelerator's state;
        "" when whole-text encoding is refused."""
        whole = self.whole_text
        if whole is None:
            return ""
        acc = whole.accelerator
        if acc is None:
            return whole.engine
        return f"fastokens ({acc.describe()})" if whole.accelerated else f"{whole.engine} (fastokens {acc.describe()})"

    def _fast(self) -> Any:
        return self._choose_engine()[2] if fast_enabled() else None

    @property
    def engine(self) -> str:
        """How `encode_text` encodes: "tiktoken" (proved equivalent) or "tokenizers" (the reference itself)."""
        return self._choose_engine()[0] if fast_enabled() else "tokenizers"

    @property
    def engine_reason(self) -> str:
        """Why `engine` was chosen: the check that refused tiktoken, or what made it equivalent."""
        return self._choose_engine()[1] if fast_enabled() else "CTXLOCK_FAST=0"

    @property
    def vocab_size(self) -> int:
        # Read from the JSON (or its head on disk) when the vocabulary is a token -> id map (`_map_vocab_size`).
        if self._map_vocab_size is not None:
            return self._map_vocab_size
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def added_tokens(self) -> tuple[AddedToken, ...]:
        return self._added

    @property
    def control_tokens(self) -> frozenset[str]:
        return self._control_tokens

    def encode(self, text: str, *, parse_special: bool = False, add_special_tokens: bool = False) -> list[int]:
        with _typed(self.id):
            if parse_special:
                return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
            # Special-token strings are text here; the post-processor (BOS/EOS) is the reference's own.
            return self._plain[0].encode(text, add_special_tokens=add_special_tokens).ids

    @property
    def truncation(self) -> dict[str, Any] | None:
        """tokenizer.json's `truncation` section (never applied unless asked: `encode_truncated`)."""
        return copy.deepcopy(self._truncation)

    @property
    def padding(self) -> dict[str, Any] | None:
        """tokenizer.json's `padding` section (never applied: ids are not padded)."""
        return copy.deepcopy(self._padding)

    def encode_truncated(
        self, text: str, *, parse_special: bool = False, add_special_tokens: bool = False
    ) -> tuple[list[int], dict[str, Any]]:
        """`encode`, then the file's truncation applied as `tokenizers` applies it (room kept for the post-processor's
        tokens, `direction`, `stride`), and what it did: {max_length, direction, strategy, stride, ids_before,
        ids_after, dropped}. Padding is never applied. Raises ValueError when the file has no truncation section."""
        if self._truncation is None:
            raise ValueError("tokenizer.json has no truncation section")
        import tokenizers

        full = self.encode(text, parse_special=parse_special, add_special_tokens=add_special_tokens)
        base = self._tok if parse_special else self._plain[0]
        variant = tokenizers.Tokenizer.from_str(base.to_str())
        t = self._truncation
        # The file spells them as serde does (LongestFirst, Right); the Python API takes snake case.
        strategy = re.sub(r"(?<!^)(?=[A-Z])", "_", str(t.get("strategy", "LongestFirst"))).lower()
        direction = str(t.get("direction", "Right")).lower()
        variant.enable_truncation(
            int(t["max_length"]), stride=int(t.get("stride", 0)), strategy=strategy, direction=direction
        )
        ids = variant.encode(text, add_special_tokens=add_special_tokens).ids
        info = {
            "max_length": int(t["max_length"]),
            "direction": direction,
            "strategy": strategy,
            "stride": int(t.get("stride", 0)),
            "ids_before": len(full),
            "ids_after": len(ids),
            "dropped": len(full) - len(ids),
        }
        return ids, info

    def encode_text(self, text: str, *, at_start: bool) -> list[int]:
        fast = self._fast()
        if fast is not None:
            ids: list[int] | None = fast.encode(text)
            if ids is not None:
                return ids
        first, rest = self._plain
        with _typed(self.id):
            return (first if at_start else rest).encode(text, add_special_tokens=False).ids

    def encode_text_batch(self, texts: Sequence[str], at_start_flags: Sequence[bool]) -> list[list[int]]:
        """`encode_text` over many runs, in parallel: tiktoken threads (the GIL is released while it encodes) or
        `tokenizers`' own `encode_batch`."""
        if len(texts) != len(at_start_flags):
            raise ValueError(f"{len(texts)} texts but {len(at_start_flags)} at_start flags")
        out: list[list[int] | None] = [None] * len(texts)
        fast = self._fast()
        if fast is not None:
            out = fast.encode_batch(texts)
        first, rest = self._plain if any(o is None for o in out) else (None, None)
        for variant, flag in ((first, True), (rest, False)):
            todo = [i for i, o in enumerate(out) if o is None and bool(at_start_flags[i]) is flag]
            if variant is not None and todo:
                with _typed(self.id):
                    encoded = variant.encode_batch([texts[i] for i in todo], add_special_tokens=False)
                for i, enc in zip(todo, encoded, strict=True):
                    out[i] = enc.ids
        return out  # type: ignore[return-value]

    @cached_property
    def _split_regex(self) -> re.Pattern[str] | None:
        """A regex that finds exactly the control tokens `tokenizers` extracts, or None when that cannot be shown.

        `tokenizers` extracts all added tokens from the raw text, leftmost-longest, before it normalizes; the
        runs between them are then normalized, pre-tokenized and encoded on their own, which is what
        `encode_text` does. A longest-first alternation of the control tokens finds the same control matches
        when (1) every control token is matched on raw text as it is (no `normalized`, `lstrip`, `rstrip`,
        `single_word`), and (2) no other added token can overlap a control token in any text (neither contains
        the other, and no end of one is a start of the other), so the non-control tokens, which `encode_text`
        extracts inside each run, never change which control tokens match."""
        controls = [t for t in self._added if t.id in self._control_ids]
        if not controls or any(t.normalized or t.lstrip or t.rstrip or t.single_word for t in controls):
            return None
        if len({t.content for t in controls}) != len(controls):
            return None  # one string, two ids: leave the choice to `tokenizers`
        others = [t.content for t in self._added if t.id not in self._control_ids]
        for c in (t.content for t in controls):
            for o in others:
                if c in o or o in c:
                    return None
                if any(c.endswith(o[:k]) or o.endswith(c[:k]) for k in range(1, min(len(c), len(o)))):
                    return None
        return longest_first(t.content for t in controls)

    def split_controls(self, text: str) -> list[ControlMatch] | None:
        """The control tokens `tokenizers` would extract from `text`, or None when this vocabulary's added tokens
        do not allow the split to be done apart from `tokenizers` (then `encode_matched` does it)."""
        regex = self._split_regex
        if regex is None:
            return None
        ids = self._control_by_content
        return [ControlMatch(m.start(), m.end(), ids[m.group(0)]) for m in regex.finditer(text)]

    @cached_property
    def _control_by_content(self) -> dict[str, int]:
        return {t.content: t.id for t in self._added if t.id in self._control_ids}

    def encode_matched(self, text: str) -> tuple[list[int], list[ControlMatch]]:
        with _typed(self.id):
            enc = self._tok.encode(text, add_special_tokens=False)
        out: list[ControlMatch] = []
        for tid, (start, end) in zip(enc.ids, enc.offsets, strict=True):
            if tid not in self._control_ids:
                continue
            tok = self._by_id[tid]
            # The offsets are the whole split `tokenizers` made, with the whitespace an lstrip/rstrip token took
            # (Rust's `char::is_whitespace`, not Python's `isspace`: "\x1c" stays text). Within it the token's own
            # characters are where its content occurs: the content is not whitespace-only, so that place is
            # unique. A normalized token may not be spelled literally in the raw text: its whole split is its core.
            if tok.lstrip or tok.rstrip:
                at = text.find(tok.content, start, end)
                if at >= 0:
                    out.append(ControlMatch(start, end, tid, at - start, end - at - len(tok.content)))
                    continue
            out.append(ControlMatch(start, end, tid))
        return enc.ids, out

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        # What `tokenizers` does: the added tokens first, then the model's vocabulary; read from the JSON when the
        # model's vocabulary is a token -> id map, so that a load (the pad token's id) does not build the pipeline.
        added = self._by_content.get(token)
        if added is not None:
            return added
        model = self._data.get("model") or {}
        vocab = model.get("vocab")
        if model.get("type") in ("BPE", "WordPiece", "WordLevel") and isinstance(vocab, dict):
            found = vocab.get(token)
            return found if isinstance(found, int) else None
        return self._tok.token_to_id(token)

    @cached_property
    def _by_content(self) -> dict[str, int]:
        return {t.content: t.id for t in self._added}

    def id_to_token(self, id: int) -> str | None:
        return self._tok.id_to_token(id)

    def token_bytes(self) -> TokenBytes:
        return hf_token_bytes(self._data, self.source or self.id, self._added, self.vocab_size, self.id_to_token)

    def decode_pieces(self, *, skip_special_tokens: bool) -> PieceView:
        where = f"{self.id}: decoder"
        return hf_decode_pieces(
            self._data.get("decoder"), where, self._added, self.id_to_token, skip=skip_special_tokens
        )

    @classmethod
    def from_manifest(cls, spec: Mapping[str, Any], files: ManifestFiles, model_id: str) -> HFTokenizer:
        """`{"format": "hf-tokenizers", "file": "tokenizer.json"}`."""
        path, text = files.text()
        return cls(text, id=f"{model_id}/{path.name}", source=str(path))

    def replay_spec(self) -> tuple[dict[str, Any], dict[str, Path | bytes]]:
        return {"format": "hf-tokenizers", "file": "tokenizer.json"}, {"tokenizer.json": self._json_text.encode()}

    def describe(self) -> dict[str, Any]:
        model = self._head.get("model") or {}
        return {
            "format": self.format,
            "id": self.id,
            "sha256": self.sha256,
            "model": model.get("type"),
            "normalizer": (self._head.get("normalizer") or {}).get("type"),
            "pre_tokenizer": (self._head.get("pre_tokenizer") or {}).get("type"),
            "post_processor": (self._head.get("post_processor") or {}).get("type"),
            "vocab_size": self.vocab_size,
            "engine": self.engine,
            "engine_reason": self.engine_reason,
            "whole_text": self.whole_text is not None,
            "whole_text_reason": self.whole_text_reason
            or "every added token is matched on raw text and none is a prefix of another",
            "whole_text_engine": self.whole_text_engine,
            # The file's truncation/padding sections: shown, never applied to a render or an encode.
            "truncation": self._truncation,
            "padding": self._padding,
            **self._description,
        }

    def pipeline(self) -> dict[str, Any]:
        """The normalizer and pre-tokenizer the `tokenizers` engine was built with, as their JSON (null when there
        is none): their identity, which records keep so that `diff` can name one that differs."""
        tok = self._tok
        components = {"normalizer": tok.normalizer, "pre_tokenizer": tok.pre_tokenizer}
        return {k: None if c is None else json.loads(c.__getstate__()) for k, c in components.items()}
