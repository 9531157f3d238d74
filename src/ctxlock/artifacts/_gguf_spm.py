"""`tokenizers` pipelines (tokenizer.json dicts) for the GGUF vocabularies that are not byte-level BPE.

llama.cpp's tokenizer test vectors were produced by each model's original HF tokenizer, so the target is that
original tokenizer.json pipeline, rebuilt from the GGUF metadata alone:

- ``llama`` (SentencePiece BPE with scores and byte fallback: llama-spm, phi-3, baichuan): a BPE model whose
  merges are derived from the piece scores, as transformers' ``LlamaConverter`` / ``SentencePieceExtractor`` derive
  them from a SentencePiece model: every split of a normal piece into two normal pieces is a merge, ranked by the
  merged piece's score (highest first). The normalizer is the legacy Llama one, ``Prepend("▁")`` then
  ``Replace(" ", "▁")``, which HF applies to each run of text between added tokens. No pre-tokenizer.
- ``bert`` (WordPiece: bert-bge): ``BertNormalizer`` + ``BertPreTokenizer`` + ``WordPiece`` (``##``), after undoing
  llama.cpp's "phantom space" spelling of the vocabulary (``▁word`` / ``suffix`` for ``word`` / ``##suffix``).
- ``t5`` (Unigram: nomic-bert-moe): ``Unigram`` over the scores, SentencePiece's normalizer spec (precompiled
  charsmap, extra-whitespace removal) and ``Metaspace``.
- ``gemma4``: BPE over the GGUF merges with byte fallback; spaces become ``▁`` in the normalizer and the text is
  not pre-split (llama.cpp's gemma4 pre-tokenizer: escape whitespace, split only at newline runs, BPE on raw
  UTF-8, which is what the HF pipeline computes). ``add_space_prefix`` is False: no dummy prefix.

Token types become added tokens as SentencePiece conversions do: CONTROL -> special, USER_DEFINED -> not special
(both ``normalized: false``, except a user-defined piece spelled with ``▁``, which can only match normalized text),
and the unk token -> special. Other UNKNOWN and UNUSED tokens (padding rows such as ``[PAD32011]``) keep their
ids in the model vocabulary but no text can produce them. lstrip/rstrip follow llama.cpp's per-model attributes
(which mirror the original files). Ids are always the GGUF ids.

Pure functions, no I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from ctxlock.artifacts._gguf import GGUFVocab
from ctxlock.artifacts._gguf_constants import Keys, TokenType
from ctxlock.errors import ArtifactFormatError

__all__ = [
    "gemma4_tokenizer_json",
    "spm_tokenizer_json",
    "unigram_tokenizer_json",
    "wordpiece_tokenizer_json",
]

SPIECE_UNDERLINE = "▁"
_SUPPORTED = "supported here: llama (SentencePiece BPE), bert (WordPiece), t5 (Unigram), gemma4"
# A Unigram score no segmentation prefers over known pieces, or over unknown characters (min score - 10).
_NEVER = -1e9


# ----------------------------------------------------------------------------------------------- helpers


def _fail(vocab: GGUFVocab, message: str, *, key: str | None = None, hint: str | None = None) -> NoReturn:
    raise ArtifactFormatError(message, path=f"{vocab.path}:{key or Keys.Tokenizer.MODEL}", hint=hint)


def _expect_model(vocab: GGUFVocab, model: str, function: str) -> None:
    if vocab.model != model:
        _fail(
            vocab,
            f"{function} converts tokenizer model {model!r}, not {vocab.model!r}",
            hint=_SUPPORTED
            if vocab.model not in ("llama", "bert", "t5", "gemma4")
            else "ctxlock.artifacts._gguf_load.tokenizer_json picks the builder for each model",
        )


def _types(vocab: GGUFVocab) -> np.ndarray:
    if vocab.token_types is None:
        return np.full(len(vocab.tokens), int(TokenType.NORMAL), dtype=np.int32)
    return np.asarray(vocab.token_types, dtype=np.int32)


def _ids_of(types: np.ndarray, *kinds: int) -> list[int]:
    return np.nonzero(np.isin(types, kinds))[0].tolist()


def _scores(vocab: GGUFVocab) -> np.ndarray:
    if vocab.scores is None:
        _fail(
            vocab,
            f"tokenizer model {vocab.model!r} needs tokenizer.ggml.scores, and this file has none",
            key=Keys.Tokenizer.SCORES,
            hint="re-convert the model with llama.cpp's convert_hf_to_gguf.py",
        )
    scores = np.asarray(vocab.scores, dtype=np.float64)
    if not np.all(np.isfinite(scores)):
        _fail(vocab, "scores hold NaN or infinite values", key=Keys.Tokenizer.SCORES)
    return scores


def _vocab_dict(vocab: GGUFVocab, pieces: Sequence[str]) -> dict[str, int]:
    ids: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        if piece in ids:
            _fail(
                vocab,
                f"ids {ids[piece]} and {i} are both the piece {piece!r}; a tokenizer maps each piece to one id",
                key=Keys.Tokenizer.LIST,
            )
        ids[piece] = i
    return ids


def _unk_id(vocab: GGUFVocab, types: np.ndarray) -> int | None:
    unk = vocab.special_ids.get("unk")
    if unk is None:
        unknown = _ids_of(types, int(TokenType.UNKNOWN))
        unk = unknown[0] if len(unknown) == 1 else None
    return unk


def _byte_fallback(vocab: GGUFVocab, types: np.ndarray) -> bool:
    """True when the vocabulary has the 256 byte pieces ``<0x00>`` .. ``<0xFF>``; raises if it has only some."""
    byte_ids = _ids_of(types, int(TokenType.BYTE))
    if not byte_ids:
        return False
    found = {vocab.tokens[i] for i in byte_ids}
    expected = {f"<0x{b:02X}>" for b in range(256)}
    if found != expected or len(byte_ids) != 256:
        _fail(
            vocab,
            f"the {len(byte_ids)} BYTE tokens are not exactly <0x00>..<0xFF> "
            f"(unexpected {sorted(found - expected)[:3]}, missing {sorted(expected - found)[:3]})",
            key=Keys.Tokenizer.TOKEN_TYPE,
            hint="byte fallback needs all 256 byte pieces",
        )
    return True


def _strip_flags(vocab: GGUFVocab, types: np.ndarray) -> dict[int, tuple[bool, bool]]:
    """(lstrip, rstrip) of added tokens, as llama.cpp sets them by model (llama-vocab.cpp, load()).

    llama.cpp keys the Phi-3 rule on general.name ("phi-3" / "phi3"); GGUFVocab carries the architecture, and
    architecture ``phi3`` with a SentencePiece vocabulary is Phi-3 (Phi-4 uses a byte-level BPE vocabulary).
    """
    flags: dict[int, tuple[bool, bool]] = {}
    ids = {t: i for i, t in enumerate(vocab.tokens) if types[i] != int(TokenType.NORMAL)}
    arch = vocab.architecture or ""
    pre = vocab.pre or ""
    if arch in ("nomic-bert-moe", "jina-bert-v3") or pre in ("jina-v2-de", "jina-v2-es", "jina-v2-code"):
        if "<mask>" in ids:
            flags[ids["<mask>"]] = (True, False)
    elif arch == "phi3" or "phi-3" in arch:
        for i in _ids_of(types, int(TokenType.CONTROL), int(TokenType.USER_DEFINED), int(TokenType.UNKNOWN)):
            flags[i] = (False, True)
        for token in ("<unk>", "<s>", "<|endoftext|>"):
            if token in ids:
                flags[ids[token]] = (False, False)
    elif arch == "modern-bert" and "[MASK]" in ids:
        flags[ids["[MASK]"]] = (True, False)
    return flags


def _added_tokens(
    vocab: GGUFVocab,
    types: np.ndarray,
    pieces: Sequence[str],
    *,
    extra_special: Iterable[int] = (),
) -> list[dict[str, Any]]:
    """CONTROL, the unk token and ``extra_special`` -> special added tokens; USER_DEFINED -> non-special ones."""
    special = set(_ids_of(types, int(TokenType.CONTROL))) | set(extra_special)
    unk = _unk_id(vocab, types)
    if unk is not None:
        special.add(unk)
    user = set(_ids_of(types, int(TokenType.USER_DEFINED))) - special
    strip = _strip_flags(vocab, types)
    out = []
    for i in sorted(special | user):
        lstrip, rstrip = strip.get(i, (False, False))
        out.append(
            {
                "id": i,
                "content": pieces[i],
                "single_word": False,
                "lstrip": lstrip,
                "rstrip": rstrip,
                # SentencePiece escapes spaces before matching pieces: "▁▁" can only be found in normalized text
                "normalized": i not in special and SPIECE_UNDERLINE in pieces[i],
                "special": i in special,
            }
        )
    return out


def _template(pieces: Sequence[str], single: Sequence[int | str], pair: Sequence[int | str]) -> dict[str, Any]:
    """TemplateProcessing from id / "A" / "B" lists; type id 1 starts at "B"."""

    def items(spec: Sequence[int | str]) -> list[dict[str, Any]]:
        out, type_id = [], 0
        for item in spec:
            if item == "B":
                type_id = 1
            if isinstance(item, str):
                out.append({"Sequence": {"id": item, "type_id": type_id}})
            else:
                out.append({"SpecialToken": {"id": pieces[item], "type_id": type_id}})
        return out

    used = {i for i in [*single, *pair] if isinstance(i, int)}
    return {
        "type": "TemplateProcessing",
        "single": items(single),
        "pair": items(pair),
        "special_tokens": {pieces[i]: {"id": pieces[i], "ids": [i], "tokens": [pieces[i]]} for i in sorted(used)},
    }


def _bos_eos_template(vocab: GGUFVocab, *, add_bos: bool, add_eos: bool) -> dict[str, Any] | None:
    """``bos? $A eos?`` and ``bos? $A eos? bos? $B eos?`` (LlamaTokenizerFast's post-processor)."""
    bos = [vocab.special_ids["bos"]] if add_bos and "bos" in vocab.special_ids else []
    eos = [vocab.special_ids["eos"]] if add_eos and "eos" in vocab.special_ids else []
    if not bos and not eos:
        return None
    single = [*bos, "A", *eos]
    return _template(vocab.tokens, single, [*single, *bos, "B", *eos])


def _flag(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def _replace(pattern: str, content: str, *, regex: bool = False) -> dict[str, Any]:
    return {"type": "Replace", "pattern": {"Regex" if regex else "String": pattern}, "content": content}


# SentencePiece's remove_extra_whitespaces: leading, trailing and repeated U+0020 only (after the charsmap).
_REMOVE_EXTRA_WHITESPACES = [_replace(r"\A +| +\z", "", regex=True), _replace(" {2,}", " ", regex=True)]
_STRIP_DUMMY_PREFIX = {"type": "Strip", "content": " ", "start": 1, "stop": 0}


def _sequence(kind: str, items: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    return {"type": "Sequence", kind: list(items)} if items else None


def _tokenizer(
    *,
    added_tokens: list[dict[str, Any]],
    normalizer: dict[str, Any] | None,
    pre_tokenizer: dict[str, Any] | None,
    post_processor: dict[str, Any] | None,
    decoder: dict[str, Any] | None,
    model: dict[str, Any],
) -> dict[str, Any]:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": decoder,
        "model": model,
    }


def _bpe_model(
    ids: Mapping[str, int], merges: list[str] | list[list[str]], *, unk: str | None, byte_fallback: bool
) -> dict[str, Any]:
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": unk,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": True,
        "byte_fallback": byte_fallback,
        "ignore_merges": False,
        "vocab": dict(ids),
        "merges": merges,
    }


def _spm_decoder(*, byte_fallback: bool, dummy_prefix: bool) -> dict[str, Any]:
    decoders: list[dict[str, Any]] = [_replace(SPIECE_UNDERLINE, " ")]
    if byte_fallback:
        decoders.append({"type": "ByteFallback"})
    decoders.append({"type": "Fuse"})
    if dummy_prefix:
        decoders.append(_STRIP_DUMMY_PREFIX)
    return {"type": "Sequence", "decoders": decoders}


# ------------------------------------------------------------------------------------- llama (SPM BPE)


def _spm_merges(tokens: Sequence[str], scores: np.ndarray, types: np.ndarray) -> list[list[str]]:
    """BPE merges equivalent to SentencePiece's score-driven BPE.

    Every split of a normal piece into two normal pieces is a merge (control, user-defined, byte and unused
    pieces are never merged into or from). Merges are ranked by the merged piece's score, highest first; ties
    go to the lower id of the merged piece, then to the lower ids of the two halves, which is the order of
    transformers' ``generate_merges`` (a stable sort by score over the vocabulary in id order, the splits of one
    piece sorted by the ids of their halves).
    """
    index = {tokens[i]: i for i in _ids_of(types, int(TokenType.NORMAL))}
    ranked: list[tuple[float, int, int, int]] = []
    for piece, i in index.items():
        for cut in range(1, len(piece)):
            left = index.get(piece[:cut])
            if left is None:
                continue
            right = index.get(piece[cut:])
            if right is not None:
                ranked.append((-scores[i], i, left, right))
    ranked.sort()
    return [[tokens[left], tokens[right]] for _, _, left, right in ranked]


def _spm_normalizer(add_prefix: bool, *, remove_extra: bool) -> dict[str, Any] | None:
    """SentencePiece's text handling as HF normalizers: optional whitespace collapsing, the dummy prefix, and
    spaces escaped to ▁ (legacy Llama style: applied to each run between added tokens)."""
    normalizers: list[dict[str, Any]] = list(_REMOVE_EXTRA_WHITESPACES) if remove_extra else []
    if add_prefix:
        normalizers.append({"type": "Prepend", "prepend": SPIECE_UNDERLINE})
    normalizers.append(_replace(" ", SPIECE_UNDERLINE))
    return _sequence("normalizers", normalizers)


def spm_tokenizer_json(vocab: GGUFVocab) -> dict[str, Any]:
    """Model ``llama``: SentencePiece BPE (scores, byte fallback) as an HF BPE pipeline, Llama legacy style."""
    _expect_model(vocab, "llama", "spm_tokenizer_json")
    types = _types(vocab)
    scores = _scores(vocab)
    ids = _vocab_dict(vocab, vocab.tokens)
    byte_fallback = _byte_fallback(vocab, types)
    unk_id = _unk_id(vocab, types)
    add_prefix = _flag(vocab.add_space_prefix, True)  # llama.cpp's default for SPM vocabularies

    return _tokenizer(
        added_tokens=_added_tokens(vocab, types, vocab.tokens),
        normalizer=_spm_normalizer(add_prefix, remove_extra=_flag(vocab.remove_extra_whitespaces, False)),
        pre_tokenizer=None,
        post_processor=_bos_eos_template(
            vocab, add_bos=_flag(vocab.add_bos, True), add_eos=_flag(vocab.add_eos, False)
        ),
        decoder=_spm_decoder(byte_fallback=byte_fallback, dummy_prefix=add_prefix),
        model=_bpe_model(
            ids,
            _spm_merges(vocab.tokens, scores, types),
            unk=vocab.tokens[unk_id] if unk_id is not None else None,
            byte_fallback=byte_fallback,
        ),
    )


# --------------------------------------------------------------------------------------- bert (WordPiece)


def _wordpiece_pieces(vocab: GGUFVocab, types: np.ndarray) -> list[str]:
    """Undo llama.cpp's "phantom space" spelling: ``▁word`` -> ``word``, ``suffix`` -> ``##suffix``.

    convert_hf_to_gguf.py keeps CONTROL tokens as they are, writes word-initial pieces with a leading ``▁`` and
    continuation pieces without their ``##``.
    """
    pieces = []
    for token, kind in zip(vocab.tokens, types.tolist(), strict=True):
        if kind == int(TokenType.CONTROL):
            pieces.append(token)
        elif token.startswith(SPIECE_UNDERLINE):
            pieces.append(token[1:])
        else:
            pieces.append("##" + token)
    return pieces


def wordpiece_tokenizer_json(vocab: GGUFVocab) -> dict[str, Any]:
    """Model ``bert``: BertNormalizer + BertPreTokenizer + WordPiece (``##`` continuation), as BERT's files have it."""
    _expect_model(vocab, "bert", "wordpiece_tokenizer_json")
    types = _types(vocab)
    pieces = _wordpiece_pieces(vocab, types)
    ids = _vocab_dict(vocab, pieces)
    unk_id = _unk_id(vocab, types)
    if unk_id is None:
        unk_id = ids.get("[UNK]")
    if unk_id is None:
        _fail(vocab, "a WordPiece vocabulary needs an unknown token, and this one has none", key=Keys.Tokenizer.UNK_ID)
    # llama.cpp's WPM tokenizer always lowercases and strips accents. The original HF tokenizer does so when its
    # vocabulary is uncased (bert-base-uncased, bge): an uncased vocabulary has no piece that lowercasing changes.
    lowercase = all(pieces[i] == pieces[i].lower() for i in _ids_of(types, int(TokenType.NORMAL)))

    cls_id = vocab.special_ids.get("cls", vocab.special_ids.get("bos"))
    sep_id = vocab.special_ids.get("sep", vocab.special_ids.get("eos"))
    post = None
    if cls_id is not None and sep_id is not None and _flag(vocab.add_bos, True):
        post = _template(pieces, [cls_id, "A", sep_id], [cls_id, "A", sep_id, "B", sep_id])
    return _tokenizer(
        added_tokens=_added_tokens(vocab, types, pieces, extra_special=vocab.special_ids.values()),
        normalizer={
            "type": "BertNormalizer",
            "clean_text": True,
            "handle_chinese_chars": True,
            "strip_accents": None,  # follows lowercase
            "lowercase": lowercase,
        },
        pre_tokenizer={"type": "BertPreTokenizer"},
        post_processor=post,
        decoder={"type": "WordPiece", "prefix": "##", "cleanup": True},
        model={
            "type": "WordPiece",
            "unk_token": pieces[unk_id],
            "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": ids,
        },
    )


# ------------------------------------------------------------------------------------------ t5 (Unigram)


def unigram_tokenizer_json(vocab: GGUFVocab) -> dict[str, Any]:
    """Model ``t5``: SentencePiece Unigram with its normalizer spec (precompiled charsmap) and Metaspace."""
    _expect_model(vocab, "t5", "unigram_tokenizer_json")
    types = _types(vocab)
    scores = _scores(vocab)
    _vocab_dict(vocab, vocab.tokens)
    byte_fallback = _byte_fallback(vocab, types)
    unk_id = _unk_id(vocab, types)
    if unk_id is None:
        _fail(vocab, "a Unigram vocabulary needs an unknown token, and this one has none", key=Keys.Tokenizer.UNK_ID)
    # Control, unused and padding pieces keep their ids but no segmentation of text may use them (SentencePiece
    # never emits them for text; a control piece that text could produce would forge a control token).
    never = set(_ids_of(types, int(TokenType.CONTROL), int(TokenType.UNUSED), int(TokenType.UNKNOWN))) - {unk_id}
    pieces = [[token, _NEVER if i in never else float(scores[i])] for i, token in enumerate(vocab.tokens)]
    add_prefix = _flag(vocab.add_space_prefix, True)

    normalizers: list[dict[str, Any]] = []
    if vocab.precompiled_charsmap:
        charsmap = base64.b64encode(vocab.precompiled_charsmap).decode("ascii")
        normalizers.append({"type": "Precompiled", "precompiled_charsmap": charsmap})
    if _flag(vocab.remove_extra_whitespaces, False):
        normalizers += _REMOVE_EXTRA_WHITESPACES
    prepend_scheme = "always" if add_prefix else "never"
    if byte_fallback:
        decoder = _spm_decoder(byte_fallback=True, dummy_prefix=add_prefix)
    else:
        decoder = {
            "type": "Metaspace",
            "replacement": SPIECE_UNDERLINE,
            "prepend_scheme": prepend_scheme,
            "split": True,
        }
    return _tokenizer(
        added_tokens=_added_tokens(vocab, types, vocab.tokens),
        normalizer=_sequence("normalizers", normalizers),
        pre_tokenizer={
            "type": "Metaspace",
            "replacement": SPIECE_UNDERLINE,
            "prepend_scheme": prepend_scheme,
            "split": True,
        },
        post_processor=_xlmr_template(vocab, add_bos=_flag(vocab.add_bos, False), add_eos=_flag(vocab.add_eos, False)),
        decoder=decoder,
        model={"type": "Unigram", "unk_id": unk_id, "vocab": pieces, "byte_fallback": byte_fallback},
    )


def _xlmr_template(vocab: GGUFVocab, *, add_bos: bool, add_eos: bool) -> dict[str, Any] | None:
    """``<s> $A </s>`` / ``<s> $A </s> </s> $B </s>`` (XLM-R, T5 without the bos) per the GGUF flags."""
    bos = [vocab.special_ids["bos"]] if add_bos and "bos" in vocab.special_ids else []
    eos_id = vocab.special_ids.get("sep", vocab.special_ids.get("eos"))
    eos = [eos_id] if add_eos and eos_id is not None else []
    if not bos and not eos:
        return None
    single = [*bos, "A", *eos]
    return _template(vocab.tokens, single, [*single, *(eos if bos else []), "B", *eos])


# ------------------------------------------------------------------------------------------------ gemma4


def _gguf_merges(vocab: GGUFVocab, ids: Mapping[str, int]) -> list[str] | list[list[str]]:
    """The GGUF merges, checked against the vocabulary, in a form tokenizers reads unambiguously.

    llama.cpp splits "left right" at the first space after the first character. When no token holds a space that
    is the only split, and the strings are passed through as they are (tokenizers' "a b" form, which is cheaper
    than a pair per merge for 515k merges); otherwise they become [left, right] pairs.
    """
    if not vocab.merges:
        _fail(
            vocab,
            f"tokenizer model {vocab.model!r} needs tokenizer.ggml.merges, and this file has none",
            key=Keys.Tokenizer.MERGES,
        )
    spaced = any(" " in token for token in ids)
    pairs: list[list[str]] = []
    for n, merge in enumerate(vocab.merges):
        cut = merge.find(" ", 1)
        left, right = (merge[:cut], merge[cut + 1 :]) if cut > 0 else ("", "")
        if left not in ids or right not in ids or left + right not in ids:
            _fail(
                vocab,
                f"merge {merge!r} references a token that is not in the vocabulary",
                key=f"{Keys.Tokenizer.MERGES}[{n}]",
                hint="the merges do not belong to this vocabulary",
            )
        if spaced:
            pairs.append([left, right])
    return pairs if spaced else list(vocab.merges)


def gemma4_tokenizer_json(vocab: GGUFVocab) -> dict[str, Any]:
    """Model ``gemma4``: BPE over the GGUF merges with byte fallback, spaces as ``▁``, no dummy prefix."""
    _expect_model(vocab, "gemma4", "gemma4_tokenizer_json")
    types = _types(vocab)
    ids = _vocab_dict(vocab, vocab.tokens)
    byte_fallback = _byte_fallback(vocab, types)
    merges = _gguf_merges(vocab, ids)
    unk_id = _unk_id(vocab, types)
    add_prefix = _flag(vocab.add_space_prefix, False)
    return _tokenizer(
        added_tokens=_added_tokens(vocab, types, vocab.tokens),
        normalizer=_spm_normalizer(add_prefix, remove_extra=False),
        pre_tokenizer=None,
        # llama.cpp forces add_bos on for gemma4
        post_processor=_bos_eos_template(vocab, add_bos=True, add_eos=_flag(vocab.add_eos, False)),
        decoder=_spm_decoder(byte_fallback=byte_fallback, dummy_prefix=add_prefix),
        model=_bpe_model(
            ids, merges, unk=vocab.tokens[unk_id] if unk_id is not None else None, byte_fallback=byte_fallback
        ),
    )
