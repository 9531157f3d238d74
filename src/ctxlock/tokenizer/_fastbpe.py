r"""A tiktoken fast path for byte-level BPE `tokenizer.json` files, taken only when it provably gives the same ids.

`tokenizers` runs BPE from a *merge list*: among adjacent symbol pairs that are in the list, merge the one with the
lowest merge index (leftmost on a tie). tiktoken runs it from *ranks*: among adjacent pieces whose concatenation is
a token, merge the one whose concatenation has the lowest rank (leftmost on a tie), after first looking the whole
pre-token up. The two agree on Qwen2, Llama 3 or GPT-2 vocabularies, and tiktoken is several times faster, but they
need not agree on an arbitrary vocabulary. `check()` decides, from the JSON alone, whether they do, and says why
not when they don't; `FastEncoder` is the tiktoken side. `HFTokenizer.encode_text` uses it when the verdict is yes.

Conditions checked (a refusal names the first one that fails):

1. Model: `BPE`, no `dropout`, `byte_fallback` false, no `continuing_subword_prefix` / `end_of_word_suffix`;
   every byte that can occur in UTF-8 has its GPT-2 byte character in the vocabulary (so a pre-token's initial
   symbols are exactly its UTF-8 bytes; GPT-NeoX lacks 0xC0, 0xC1 and 0xF5-0xFF, which never occur); token ids
   distinct. Ranks are HF ids of vocabulary strings made only of byte characters: the bytes and the merge results,
   plus, with `ignore_merges`, every other such string ("orphans").
2. Merges. For every multi-byte rank t, in rank order, run rank BPE on t's bytes without the whole-piece lookup
   and stop at two pieces. If it gets there, the two pieces (a, b) must be one of the HF merges that make t (t's
   canonical merge; t may not be an orphan), and canonical merges' indices must increase with the rank of what
   they make. If it never gets to two pieces, rank BPE never builds t: t stays a rank only with `ignore_merges`.
   This is the recover check of minbpe's `recover_merges` / transformers' `TikTokenConverter`, extended past
   rank(t): Llama 3's '.:.:' (rank 100421) stops at ['.', ':.', ':'] below its rank and is built later, from
   ('.:.', ':'), once the higher-ranked '.:.' exists; HF has that merge too (Llama 3 lists 280K merges for its
   128K tokens, every split of a token into two tokens), so the two agree on it.
3. Pre-tokenizer: `Sequence[Split(Regex R, Isolated, invert false), ByteLevel(add_prefix_space false, use_regex
   false)]` or `ByteLevel(add_prefix_space false, use_regex true)` (R is then GPT-2's pattern, `GPT2_PATTERN`). R
   cannot match the empty string (its minimum width, from Python's regex parser, is positive) and compiles in
   tiktoken's engine. Split *keeps* the text between matches as pieces while tiktoken drops it, so tiktoken runs
   `(?:R)|(?:(?!(?:R))(?s:.))+`: R where R matches, else the run of characters up to the next place R matches.
   `Sequence[Digits, ByteLevel]` (StarCoder, Command R) is refused: folding it into one regex needs Rust's
   `char::is_numeric` and the regex engines' `\p{N}` to agree, and on newer characters (U+11DE1) they do not.
4. Normalizer: none or NFC. Added tokens left in the plain variant (the non-control ones, e.g. whitespace runs):
   no `lstrip`, `rstrip` or `single_word`. No `truncation` or `padding` in the JSON.

Why 1-2 make the BPE results equal on every pre-token w (T = tiktoken without its whole-piece lookup, H = HF):

* Locality. In T, take a stretch u of the input whose ends are piece boundaries at some step. Every merge so far
  inside u was the lowest-ranked (then leftmost) pair of the whole input, hence of u; so the merges inside u are a
  prefix of T run on u alone.
* Lemma: in every state of T, adjacent pieces (x, y) whose concatenation is a rank t are t's canonical merge. By
  locality, (x, y) is a two-piece state of T run on t's bytes; that run is deterministic and loses one piece per
  step, so it has at most one two-piece state, which 2 requires to be a canonical merge, and an orphan or a
  token 2 found unbuildable has none. So such tokens are never built by merging, and a dropped one is never
  missed.
* Induction on steps: while T and H are in the same state, T's candidates (adjacent pairs whose concatenation is a
  rank) are canonical merges by the lemma, all in H's merge list; H's candidates (adjacent pairs in its list)
  concatenate to merge results, which are ranks unless unbuildable, and those are never adjacent (lemma). So the
  candidate sets are equal, and the orders agree: canonical merge index increases with the result's rank, and
  pairs of equal rank make the same token, so they are the same canonical pair, which both break leftmost. So the
  next states are equal too. (H's heap keeps stale entries and drops one unless the pair now at its position makes
  the same token; by the lemma that is then the same pair, so the stale check is exact here.)
* Whole pieces. tiktoken first looks the whole pre-token up in the ranks. Without `ignore_merges`, the ranks hold
  bytes and buildable merge results, and T on such a token's bytes ends in it, as H then does. With
  `ignore_merges`, HF looks the whole pre-token up in its vocabulary first, which among byte-character strings is
  exactly the ranks. Vocabulary strings with other characters can never be a pre-token nor a merge of two
  reachable symbols, so leaving them out changes nothing.

Around the BPE: `tokenizers` splits the added tokens out of the raw text first (leftmost-longest; `normalized`
ones after normalizing each remaining piece, matched against their normalized content), normalizes each remaining
piece, pre-tokenizes it with R and maps bytes to characters; `FastEncoder` does the same steps in the same order.
NFC is skipped when every character of a piece is NFC-inert by Python's Unicode data (assigned, combining class 0,
stable under NFC, never the second character of a composition): such text is NFC under any Unicode version, by
Unicode's normalization stability policy. Any other piece is normalized by `tokenizers`' own NFC, because its tables
(an older Unicode version) differ from Python's on a few newer characters (U+11938). The post-processor and decoder
play no part: `encode_text` is `add_special_tokens=False`, where post-processors add nothing and ByteLevel's only
touches offsets. Text with lone surrogates (not UTF-8) is handed back to the caller, which uses `tokenizers`.

What is not proved but tested: the split regex runs on Oniguruma in `tokenizers` and on fancy-regex in tiktoken.
Both are backtracking engines with leftmost-first alternation, greedy quantifiers and the same Unicode classes for
the constructs these patterns use; `tests/tokenizer/test_fastbpe.py` compares the two paths on every code point in
several contexts, on llama.cpp's test vectors and on random text.

The verdict, with the ranks, is cached on disk (the ctxlock cache directory, `fastbpe/`) keyed by the sha256 of the
JSON, of the set of added tokens left out, and `CHECK_VERSION`, so a warm load skips the checks (cold, they take
1-3 s on a 150K vocabulary).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import marshal
import os
import re
import sys
import tempfile
import unicodedata
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctxlock import caches
from ctxlock.core import longest_first
from ctxlock.settings import cache_root

CHECK_VERSION = "fastbpe-2"

# tokenizers' ByteLevel pre-tokenizer with use_regex=true (GPT-2's pattern, case-sensitive contractions).
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

_NORMALIZERS = (None, "NFC")


def _byte_chars() -> list[str]:
    """GPT-2's `bytes_to_unicode`: byte b is the character `_byte_chars()[b]`."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return [chr(chars[b]) for b in range(256)]


BYTE_CHARS = _byte_chars()
# str.translate table: a byte character becomes the Latin-1 character of its byte; any other character below
# U+0144 becomes U+0100, so `.encode("latin-1")` fails on every string that is not made of byte characters.
_TO_BYTES = {cp: 0x100 for cp in range(0x144)} | {ord(c): b for b, c in enumerate(BYTE_CHARS)}


def token_bytes(token: str) -> bytes | None:
    """The bytes a byte-level token string stands for, or None if it has a character outside the 256."""
    try:
        return token.translate(_TO_BYTES).encode("latin-1")
    except UnicodeEncodeError:
        return None


class Refusal(Exception):
    """The fast path is not provably equivalent; `str(exc)` says why."""


def _show(b: bytes) -> str:
    return repr("".join(BYTE_CHARS[x] for x in b))


# ------------------------------------------------------------------------------------------------ the checks


def split_in_two(ranks: Mapping[bytes, int], piece: bytes) -> list[bytes]:
    """tiktoken's merge loop on `piece` without the whole-piece lookup, stopped when two pieces are left: merge the
    lowest-ranked pair (leftmost on a tie) whose concatenation has a rank, while there are more than two pieces.
    When `piece` has a rank and two pieces are returned, they are the pair rank BPE builds it from."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    get = ranks.get
    while len(parts) > 2:
        best = None
        at = -1
        for i in range(len(parts) - 1):
            r = get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best = r
                at = i
        if best is None:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


# Bytes that never occur in UTF-8: a vocabulary may lack them (GPT-NeoX does), since str input never has them.
_NOT_UTF8 = frozenset([0xC0, 0xC1, *range(0xF5, 0x100)])


def _check_model(model: Mapping[str, Any]) -> dict[bytes, int]:
    """Conditions 1-2; the ranks for tiktoken (HF ids) when they hold."""
    kind = model.get("type")
    if kind != "BPE":
        raise Refusal(f"model {kind} is not BPE")
    if model.get("dropout") not in (None, 0, 0.0):
        raise Refusal(f"BPE dropout {model['dropout']} is random")
    if model.get("byte_fallback"):
        raise Refusal("BPE byte_fallback is on (not byte-level)")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise Refusal(f"BPE {key} {model[key]!r} is set")
    vocab: Mapping[str, int] = model.get("vocab") or {}
    ignore_merges = bool(model.get("ignore_merges", False))

    for byte, ch in enumerate(BYTE_CHARS):
        if ch not in vocab and byte not in _NOT_UTF8:
            raise Refusal(f"byte 0x{byte:02x} ({ch!r}) has no token: the vocabulary is not byte-level")

    # Merges as tokenizers maps them: pair -> index; a repeated pair keeps its last index.
    merge_index: dict[tuple[str, str], int] = {}
    for i, m in enumerate(model.get("merges") or []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        merge_index[(a, b)] = i
    results: set[str] = {a + b for a, b in merge_index}

    # Candidate ranks: every byte-character string of the vocabulary (with ignore_merges), else bytes and merge
    # results. A merge result that rank BPE cannot build is dropped below when ignore_merges is off.
    ranks: dict[bytes, int] = {}
    owner: dict[int, str] = {}
    for s, i in vocab.items():
        if len(s) > 1 and s not in results and not ignore_merges:
            continue  # an orphan comes only from the whole-word lookup, which is off
        raw = token_bytes(s)
        if raw is None:
            continue  # a character outside the 256: never a pre-token, never built from byte symbols
        if i in owner:
            raise Refusal(f"tokens {owner[i]!r} and {s!r} share id {i}")
        owner[i] = s
        ranks[raw] = int(i)

    # 2, 3. Every multi-byte rank, in rank order: where rank BPE on its bytes gets to two pieces, they are one of its
    # HF merges (its canonical merge), and canonical merges come in rank order; where it never does, rank BPE never
    # builds the token, which is then a rank only with ignore_merges (whole-word lookup).
    unbuildable: list[bytes] = []
    last_index, last_rank, last_token = -1, -1, ""
    for rank, raw in sorted(((r, raw) for raw, r in ranks.items() if len(raw) > 1)):
        s = owner[rank]
        parts = split_in_two(ranks, raw)
        if len(parts) > 2:
            unbuildable.append(raw)
            continue
        pair = ("".join(BYTE_CHARS[x] for x in parts[0]), "".join(BYTE_CHARS[x] for x in parts[1]))
        if s not in results:
            raise Refusal(
                f"token {s!r} (rank {rank}) has no merge, yet rank BPE on its bytes builds it from {pair!r} "
                "(ignore_merges)"
            )
        index = merge_index.get(pair)
        if index is None:
            raise Refusal(
                f"token {s!r} (rank {rank}): rank BPE on its bytes builds it from ({pair[0]!r}, {pair[1]!r}), which "
                "is not one of its merges"
            )
        if index <= last_index:
            raise Refusal(
                f"merge {index} {pair!r} makes token {s!r} of rank {rank} but a later merge ({last_index}) made "
                f"{last_token!r} of the lower rank {last_rank}: merge order and rank order differ"
            )
        last_index, last_rank, last_token = index, rank, s
    if not ignore_merges:
        for raw in unbuildable:
            del ranks[raw]
    return ranks


def _regex_min_width(pattern: str) -> int:
    """The pattern's minimum match width by Python's regex parser (Unicode classes stand in as \\w: width 1)."""
    import re._parser as sre_parse  # type: ignore[import-not-found]  # Python >= 3.11; typeshed has no re._parser

    def sub(m: re.Match[str]) -> str:
        t = m.group(0)
        if t[1] in "pP":
            return "\\w"
        return {"\\z": "\\Z", "\\h": "[ \\t]"}.get(t, t)

    translated = re.sub(r"\\[pP]\{[^}]*\}|\\[pP][A-Za-z]|\\.", sub, pattern, flags=re.S)
    return int(sre_parse.parse(translated).getwidth()[0])


def _check_pre_tokenizer(pre: Mapping[str, Any] | None) -> str:
    """Condition 3: the single split regex R that the pre-tokenizer applies."""
    if pre is None:
        raise Refusal("no pre-tokenizer (not byte-level)")
    kind = pre.get("type")
    if kind == "ByteLevel":
        if pre.get("add_prefix_space"):
            raise Refusal("pre-tokenizer ByteLevel has add_prefix_space")
        if not pre.get("use_regex", True):
            raise Refusal("pre-tokenizer ByteLevel without use_regex and without a Split: the whole text is one piece")
        return GPT2_PATTERN
    if kind != "Sequence":
        raise Refusal(f"pre-tokenizer {kind} is not byte-level")
    stages = list(pre.get("pretokenizers") or [])
    names = ", ".join(str(s.get("type")) for s in stages)
    if [s.get("type") for s in stages] == ["Digits", "ByteLevel"]:
        # Folding Digits into GPT-2's regex would need Rust's `char::is_numeric` and the regex engine's \p{N} to
        # agree, and they do not: their Unicode versions differ (U+11DE1 is numeric to one and unassigned to the other).
        raise Refusal(
            "pre-tokenizer Sequence[Digits, ByteLevel] cannot be one regex: Digits' is_numeric and the regex "
            "engines' \\p{N} disagree on newer characters (U+11DE1)"
        )
    if len(stages) != 2 or stages[0].get("type") != "Split" or stages[1].get("type") != "ByteLevel":
        raise Refusal(f"pre-tokenizer Sequence[{names}] is not Sequence[Split, ByteLevel]")
    split, level = stages
    if level.get("add_prefix_space"):
        raise Refusal("pre-tokenizer ByteLevel has add_prefix_space")
    if level.get("use_regex", True):
        raise Refusal("pre-tokenizer Sequence[Split, ByteLevel(use_regex=true)] splits twice")
    if split.get("behavior") != "Isolated":
        raise Refusal(f"pre-tokenizer Split has behavior {split.get('behavior')}, not Isolated")
    if split.get("invert"):
        raise Refusal("pre-tokenizer Split is inverted")
    pattern = (split.get("pattern") or {}).get("Regex")
    if not isinstance(pattern, str) or not pattern:
        raise Refusal(f"pre-tokenizer Split pattern {split.get('pattern')!r} is not a regex")
    return pattern


def tiktoken_pattern(split_regex: str) -> str:
    """R, then the gap up to R's next match as one piece (Split keeps unmatched text; tiktoken would drop it)."""
    return f"(?:{split_regex})|(?:(?!(?:{split_regex}))(?s:.))+"


def _check_regex(split_regex: str) -> str:
    try:
        width = _regex_min_width(split_regex)
    except Exception as exc:  # any parse failure: we cannot reason about it
        raise Refusal(f"split regex cannot be analysed ({exc})") from None
    if width <= 0:
        raise Refusal("split regex can match the empty string")
    pattern = tiktoken_pattern(split_regex)
    import tiktoken  # imported on first use: `import ctxlock` does not load it

    try:
        tiktoken.Encoding(name="ctxlock-regex-check", pat_str=pattern, mergeable_ranks={b"a": 0}, special_tokens={})
    except Exception as exc:  # tiktoken raises ValueError for a bad regex
        raise Refusal(f"split regex is not accepted by tiktoken: {exc}") from None
    return pattern


def _check_added(plain_added: Sequence[Mapping[str, Any]]) -> None:
    for t in plain_added:
        for flag in ("lstrip", "rstrip", "single_word"):
            if t.get(flag):
                raise Refusal(f"added token {t['content']!r} has {flag}")


def _describe_node(node: Mapping[str, Any]) -> str:
    kind = str(node.get("type"))
    inner = node.get("normalizers") or node.get("pretokenizers")
    if isinstance(inner, list):
        kind += "[" + ", ".join(_describe_node(n) for n in inner if isinstance(n, Mapping)) + "]"
    return kind


@dataclass(frozen=True)
class Verdict:
    """Whether the fast path is taken, why, and what it needs besides the ranks."""

    ok: bool
    reason: str
    pattern: str = ""  # what tiktoken runs
    normalizer: str | None = None


def check(data: Mapping[str, Any], plain_added: Sequence[Mapping[str, Any]]) -> tuple[Verdict, dict[bytes, int]]:
    """Decide for a parsed tokenizer.json whose added tokens, in the plain variant, are `plain_added`."""
    try:
        for key in ("truncation", "padding"):
            if data.get(key):
                raise Refusal(f"the tokenizer.json sets {key}")
        normalizer = data.get("normalizer")
        norm = None if normalizer is None else normalizer.get("type")
        if normalizer is not None and norm not in _NORMALIZERS:  # no normalizer (None) is supported
            raise Refusal(f"normalizer {_describe_node(normalizer)} is not supported")
        _check_added(plain_added)
        pattern = _check_regex(_check_pre_tokenizer(data.get("pre_tokenizer")))
        ranks = _check_model(data.get("model") or {})
    except Refusal as exc:
        return Verdict(False, str(exc)), {}
    why = "byte-level BPE whose merges are rank-consistent (recover check)"
    if (data.get("model") or {}).get("ignore_merges"):
        why += ", ignore_merges"
    return Verdict(True, why, pattern, norm), ranks


# ------------------------------------------------------------------------------------------------ disk cache


def _ctxlock_version() -> str:
    # Entries are keyed by ctxlock's version too: a release that changes what an entry means never reads an old one.
    # Read from the root package, which Python imported before this module (importing it here would draw an edge
    # from the tokenizer to every package the root names).
    version: str = sys.modules["ctxlock"].__version__
    return version


def _cache_paths(key: str) -> tuple[Path, Path]:

    base = cache_root() / "fastbpe" / f"{key}-{CHECK_VERSION}"
    return base.with_suffix(".json"), base.with_suffix(".ranks")


def _pack(ranks: Mapping[bytes, int]) -> bytes:
    items = sorted(ranks.items(), key=lambda kv: kv[1])
    ids = array("I", [i for _, i in items])
    lengths = array("I", [len(b) for b, _ in items])
    head = array("I", [len(items)])
    return head.tobytes() + ids.tobytes() + lengths.tobytes() + b"".join(b for b, _ in items)


def _unpack(blob: bytes) -> dict[bytes, int]:
    n = array("I", blob[:4])[0]
    ids = array("I", blob[4 : 4 + 4 * n])
    lengths = array("I", blob[4 + 4 * n : 4 + 8 * n])
    pos = 4 + 8 * n
    ranks: dict[bytes, int] = {}
    for i, length in zip(ids, lengths, strict=True):
        ranks[blob[pos : pos + length]] = i
        pos += length
    if pos != len(blob):
        raise ValueError("trailing bytes")
    return ranks


# The ranks again, as a `marshal` dump: its C loader builds the dict about twice as fast as `_unpack`. Its own file,
# keyed by the marshal format and the Python release, and self-checked (a digest of the dump in its header), so a
# process of another release, or one that predates this file, never misreads or invalidates it; corrupt = absent.
_MARSHAL_MAGIC = b"ctxlock-ranks-marshal\n"


def _marshal_path(ranks_path: Path) -> Path:
    return ranks_path.with_name(
        f"{ranks_path.stem}.marshal{marshal.version}-py{sys.version_info[0]}{sys.version_info[1]}"
    )


def _marshal_digest(key: str, payload: bytes) -> bytes:
    # The entry's key is hashed in: a dump is valid only under the name it was written for (a dump copied or renamed
    # from another vocabulary's entry is refused).
    return hashlib.sha256(key.encode("ascii") + b"\0" + payload).digest()


def _dump_marshal(ranks: Mapping[bytes, int], key: str) -> bytes:
    payload = marshal.dumps(dict(ranks))
    return _MARSHAL_MAGIC + _marshal_digest(key, payload) + payload


def _load_marshal(blob: bytes, key: str) -> dict[bytes, int] | None:
    head = len(_MARSHAL_MAGIC)
    payload = blob[head + 32 :]
    if blob[:head] != _MARSHAL_MAGIC or _marshal_digest(key, payload) != blob[head : head + 32]:
        return None
    ranks = marshal.loads(payload)
    return ranks if type(ranks) is dict else None


def _verdict_of(meta: Any, key: str) -> Verdict:
    """The verdict an entry's metadata holds, every field of its type and the entry's own key; ValueError else."""
    if not isinstance(meta, dict) or meta.get("key") != key or meta.get("check_version") != CHECK_VERSION:
        raise ValueError("not this entry's metadata")
    ok, reason, pattern, normalizer = meta.get("ok"), meta.get("reason"), meta.get("pattern"), meta.get("normalizer")
    if type(ok) is not bool or type(reason) is not str or type(pattern) is not str or normalizer not in _NORMALIZERS:
        raise ValueError("a field of the wrong type")
    if ok and (not pattern or not isinstance(meta.get("ranks_sha256"), str)):
        raise ValueError("a verdict without its pattern or ranks digest")
    return Verdict(ok, reason, pattern, normalizer)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached_check(
    json_text: str,
    data: Callable[[], Mapping[str, Any]],
    plain_added: Sequence[Mapping[str, Any]],
    *,
    json_sha256: str | None = None,
) -> tuple[Verdict, dict[bytes, int]]:
    """`check`, through the on-disk cache. `data()`: the parsed `json_text`, called only on a miss. A corrupt or
    unreadable entry counts as absent; a failed write is ignored."""
    # `json_sha256`: the text's digest when the caller has it (hashing 7 MB again is not free).
    h = hashlib.sha256((json_sha256 or hashlib.sha256(json_text.encode("utf-8")).hexdigest()).encode("ascii"))
    h.update(json.dumps(sorted(int(t["id"]) for t in plain_added)).encode())
    h.update(f"\0ctxlock {_ctxlock_version()}".encode())
    key = h.hexdigest()
    meta_path, ranks_path = _cache_paths(key)
    try:
        meta = json.loads(meta_path.read_text("utf-8"))
        verdict = _verdict_of(meta, key)
        if not verdict.ok:
            return verdict, {}
        try:
            fast = _load_marshal(_marshal_path(ranks_path).read_bytes(), key)
        except (OSError, ValueError, EOFError, TypeError):
            fast = None
        if fast is not None:
            return verdict, fast
        blob = ranks_path.read_bytes()
        if hashlib.sha256(blob).hexdigest() == meta["ranks_sha256"]:
            ranks = _unpack(blob)
            with contextlib.suppress(OSError):
                _write_atomic(_marshal_path(ranks_path), _dump_marshal(ranks, key))
            return verdict, ranks
    except (OSError, ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError):
        pass
    verdict, ranks = check(data(), plain_added)
    try:
        meta_path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"key": key, "check_version": CHECK_VERSION, **verdict.__dict__}
        if verdict.ok:
            blob = _pack(ranks)
            meta["ranks_sha256"] = hashlib.sha256(blob).hexdigest()
            _write_atomic(ranks_path, blob)
            _write_atomic(_marshal_path(ranks_path), _dump_marshal(ranks, key))
        _write_atomic(meta_path, json.dumps(meta, ensure_ascii=False).encode("utf-8"))
    except OSError:
        pass
    return verdict, ranks


# ------------------------------------------------------------------------------------------------ NFC


def nfc_inert_spans() -> list[list[int]]:
    """The NFC-inert code points by Python's Unicode data (see the module docstring), as sorted inclusive
    [first, last] runs. Computed in about 0.2 s and cached on disk per Unicode version."""
    path = cache_root() / "fastbpe" / f"nfc-inert-{unicodedata.unidata_version}-{CHECK_VERSION}.json"
    try:
        cached: list[list[int]] = json.loads(path.read_text("utf-8"))
        return cached
    except (OSError, ValueError):
        pass
    spans = _inert_spans()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, json.dumps(spans).encode())
    except OSError:
        pass
    return spans


@caches.memoize("tokenizer.nfc_inert_table", 1, scope="artifact")
def _inert_table() -> np.ndarray:
    """One read-only bool per code point (1.1 MB), True where it is NFC-inert: built once per process."""
    table = np.zeros(0x110000, dtype=np.bool_)
    for first, last in nfc_inert_spans():
        table[first : last + 1] = True
    table.flags.writeable = False
    return table


def nfc_inert(text: str) -> bool:
    """Whether every character of `text` is NFC-inert (the empty text is). A lone surrogate is not: it is looked
    up by its code point (`surrogatepass`), which no span holds. One table lookup per character, in numpy: about
    a quarter of the time of the regex search over a 2,500-character class it replaces (tests/tokenizer/test_fastbpe.py
    proves the two agree)."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    return b"\x00" not in _inert_table().take(codes).tobytes()  # a C search: `.all()` goes through Python


def _inert_spans() -> list[list[int]]:
    # Only planes 0-3 and 14 hold assigned characters other than private use; the rest is treated as not inert.
    candidates = [*range(0x40000), *range(0xE0000, 0xE1000)]
    seconds: set[int] = set()
    for cp in candidates:
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<"):
            parts = d.split()
            if len(parts) == 2:
                seconds.add(int(parts[1], 16))
    spans: list[list[int]] = []
    for cp in candidates:
        c = chr(cp)
        if (
            0xD800 <= cp < 0xE000
            or cp in seconds
            or 0x1160 <= cp <= 0x11FF  # Hangul medial vowels and final consonants compose algorithmically
            or 0xD7B0 <= cp <= 0xD7FF
            or unicodedata.category(c) == "Cn"
            or unicodedata.combining(c)
            or unicodedata.normalize("NFC", c) != c
        ):
            continue
        if spans and spans[-1][1] == cp - 1:
            spans[-1][1] = cp
        else:
            spans.append([cp, cp])
    return spans


# ------------------------------------------------------------------------------------------------ the encoder

_SURROGATE = re.compile("[\ud800-\udfff]")  # not UTF-8: a text holding one is left to `tokenizers`


class FastEncoder:
    """tiktoken over a checked vocabulary, with the added-token split and the normalizer of the plain variant."""

    def __init__(
        self,
        verdict: Verdict,
        ranks: dict[bytes, int],
        *,
        added: Iterable[tuple[str, int, bool]],
        normalize: Callable[[str], str] | None,
        name: str,
        specials: Mapping[str, int] | None = None,
    ) -> None:
        """`added`: (content, id, normalized) of the added tokens left in the plain variant; `normalize`: the
        tokenizer's own normalizer (`tokenizers` `normalize_str`), required when `verdict.normalizer` is set.
        `specials`: tiktoken special tokens for whole-text encoding (`prefix.WholeText`); `encode` never uses them."""
        if not verdict.ok:
            raise ValueError(verdict.reason)
        self.verdict = verdict
        self.ranks = ranks
        self.specials = dict(specials or {})
        import tiktoken

        self._enc = tiktoken.Encoding(
            name=name, pat_str=verdict.pattern, mergeable_ranks=ranks, special_tokens=self.specials
        )
        self.core = self._enc  # the tiktoken Encoding, with `specials` as its special tokens (`prefix.WholeText`)
        self._ordinary = self._enc.encode_ordinary
        self._normalize = normalize if verdict.normalizer else None
        raw = [(c, i) for c, i, n in added if not n]
        norm = [(self._normalize(c) if self._normalize else c, i) for c, i, n in added if n]
        self._raw_ids = dict(raw)
        self._norm_ids = dict(norm)
        # Leftmost-longest, as tokenizers' Aho-Corasick matcher for added tokens.
        self._raw_re = longest_first(self._raw_ids)
        self._norm_re = longest_first(self._norm_ids)

    def inert(self, text: str) -> bool:
        """Whether the normalizer leaves `text` as it is (no normalizer, ASCII, or only NFC-inert characters)."""
        return self._normalize is None or text.isascii() or nfc_inert(text)

    def _bpe(self, text: str, out: list[int]) -> None:
        if not self.inert(text):
            text = self._normalize(text)  # type: ignore[misc]
        if self._norm_re is None:
            out += self._ordinary(text)
            return
        pos = 0
        for m in self._norm_re.finditer(text):
            if m.start() > pos:
                out += self._ordinary(text[pos : m.start()])
            out.append(self._norm_ids[m.group(0)])
            pos = m.end()
        if pos < len(text):
            out += self._ordinary(text[pos:])

    def encode(self, text: str) -> list[int] | None:
        """The plain variant's ids for `text`, or None when the text is not UTF-8 (lone surrogates): the caller then
        uses `tokenizers`."""
        if not text.isascii() and _SURROGATE.search(text) is not None:
            # tiktoken's `encode_ordinary` would replace a lone surrogate with U+FFFD: `tokenizers` decides instead.
            return None
        out: list[int] = []
        try:
            if self._raw_re is None:
                if text:
                    self._bpe(text, out)
                return out
            pos = 0
            for m in self._raw_re.finditer(text):
                if m.start() > pos:
                    self._bpe(text[pos : m.start()], out)
                out.append(self._raw_ids[m.group(0)])
                pos = m.end()
            if pos < len(text):
                self._bpe(text[pos:], out)
        except UnicodeEncodeError:
            return None
        return out

    def encode_batch(self, texts: Sequence[str], *, num_threads: int | None = None) -> list[list[int] | None]:
        """`encode` over many texts on a thread pool, one contiguous chunk per thread (tiktoken releases the GIL while
        it encodes; one task per short run would cost more in scheduling than it saves)."""
        threads = min(num_threads or os.cpu_count() or 1, max(1, sum(map(len, texts)) // _CHARS_PER_THREAD))
        if threads <= 1 or len(texts) < 2:
            return [self.encode(t) for t in texts]
        step = -(-len(texts) // threads)
        chunks = [texts[i : i + step] for i in range(0, len(texts), step)]
        with ThreadPoolExecutor(len(chunks)) as pool:
            parts = pool.map(lambda chunk: [self.encode(t) for t in chunk], chunks)
            return [ids for part in parts for ids in part]


_CHARS_PER_THREAD = 200_000  # below this a second thread costs more than it saves


__all__ = [
    "BYTE_CHARS",
    "CHECK_VERSION",
    "GPT2_PATTERN",
    "FastEncoder",
    "Refusal",
    "Verdict",
    "cached_check",
    "check",
    "tiktoken_pattern",
    "token_bytes",
]
