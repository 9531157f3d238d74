"""`build_pipeline`: the tokenizer.json transformers 5 runs for an HF model directory, built with the `tokenizers`
library the way the tokenizer class does it (`hf_classes` has the classes, how transformers picks one, and
`Pipeline`, what this returns).

The steps, in transformers' order: pick the class and its spec; refuse a directory without tokenizer.json that the
class does not build as modeled; assemble the special tokens and the added tokens from the directory's files in
transformers' order of sources (`hf_special`); compare the class's components with the file's and take the
class's; add the tokens; rebuild the post-processor where the class does. `tokenizers` is imported on first use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxlock.errors import ArtifactFormatError
from ctxlock.tokenizer.backends._hf_classes import (
    CLASSES,
    GENERIC_CLASSES,
    PIPELINES,
    SPM_NOTE,
    ClassSpec,
    Pipeline,
    resolve_class,
)
from ctxlock.tokenizer.backends._hf_classes import flag as _flag
from ctxlock.tokenizer.backends._hf_special import special_sources

if TYPE_CHECKING:
    from tokenizers import AddedToken


def _state(token: AddedToken) -> tuple[Any, ...]:
    return (token.content, token.single_word, token.lstrip, token.rstrip, token.normalized, token.special)


def _canonical(data: Mapping[str, Any]) -> dict[str, Any]:
    """The file's components as `tokenizers` reads them back (defaults filled in), on a one-token vocabulary."""
    model = {k: v for k, v in (data.get("model") or {}).items() if k not in ("vocab", "merges")}
    if model.get("type") == "BPE":
        model.update(vocab={}, merges=[])
    elif model.get("type") == "Unigram":
        model.update(vocab=[["<unk>", 0.0]], unk_id=0)
    elif model.get("type") in ("WordPiece", "WordLevel"):
        model.update(vocab={str(model.get("unk_token", "[UNK]")): 0})
    tiny = {**dict(data), "model": model, "added_tokens": [], "truncation": None, "padding": None}
    import tokenizers

    out: dict[str, Any] = json.loads(tokenizers.Tokenizer.from_str(json.dumps(tiny)).to_str())
    out["model"] = {k: v for k, v in out["model"].items() if k not in ("vocab", "merges")}
    return out


def _template_post_processor(bos: tuple[str, int] | None, eos: tuple[str, int] | None) -> dict[str, Any]:
    """The TemplateProcessing transformers' `update_post_processor` sets."""
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    single = f"{f'{bos[0]}:0 ' if bos else ''}$A:0{f' {eos[0]}:0' if eos else ''}"
    pair = f"{single}{f' {bos[0]}:1' if bos else ''} $B:1{f' {eos[0]}:1' if eos else ''}"
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[t for t in (bos, eos) if t is not None]
    )
    processor: dict[str, Any] = json.loads(tok.to_str())["post_processor"]
    return processor


def _class_components(spec: ClassSpec) -> dict[str, Any]:
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={}, merges=[], **spec.bpe))
    tok.normalizer = spec.normalizer
    tok.pre_tokenizer = spec.pre_tokenizer
    tok.decoder = spec.decoder
    out: dict[str, Any] = json.loads(tok.to_str())
    out["model"] = {k: v for k, v in out["model"].items() if k not in ("vocab", "merges")}
    return out


def differences(a: Any, b: Any, at: str = "") -> list[str]:
    """Where two component JSONs differ, one line per leaf: `path: file X, class Y`."""
    if isinstance(a, dict) and isinstance(b, dict) and a.get("type") == b.get("type"):
        out: list[str] = []
        for k in [*a, *(k for k in b if k not in a)]:
            out += differences(a.get(k), b.get(k), f"{at}.{k}" if at else k)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b, strict=True)) for line in differences(x, y, f"{at}[{i}]")]
    if a == b:
        return []
    return [f"{at or '(whole)'}: file {json.dumps(a, ensure_ascii=False)}, class {json.dumps(b, ensure_ascii=False)}"]


def _shown(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in ("vocab", "merges")}
    return value


def _no_surrogate(value: AddedToken | str | None, where: str) -> None:
    content = value if isinstance(value, str) or value is None else value.content
    if content is not None and re.search("[\ud800-\udfff]", content):
        raise ArtifactFormatError(
            "a special token holds a lone surrogate, which is not a character",
            path=where,
            hint="escape characters outside the BMP as a surrogate pair",
        )


@dataclass
class _Build:
    """What `build_pipeline` has worked out so far, step by step."""

    file_data: Mapping[str, Any]
    config: Mapping[str, Any]
    file_text: str | None
    has_tokenizer_file: bool
    cls: str
    cls_source: str
    spec: ClassSpec | None
    modeled: bool
    notes: list[str]
    data: dict[str, Any]
    disagreements: list[dict[str, Any]] = field(default_factory=list)
    use_class: bool = False
    named: dict[str, AddedToken | str] = field(default_factory=dict)
    extras: list[Any] = field(default_factory=list)
    special_tokens: tuple[tuple[str, str], ...] = ()

    def pipeline(self, json_text: str, *, changed: bool, added: tuple[dict[str, Any], ...] = ()) -> Pipeline:
        return Pipeline(
            json_text=json_text,
            tokenizer_class=self.cls,
            class_source=self.cls_source,
            used="class" if self.use_class else "file",
            modeled=self.modeled,
            disagreements=tuple(self.disagreements),
            added_tokens=added,
            notes=tuple(self.notes),
            changed=changed,
            special_tokens=self.special_tokens,
        )


def build_pipeline(
    file_data: Mapping[str, Any],
    *,
    config: Mapping[str, Any],
    model_config: Mapping[str, Any] | None = None,
    file_text: str | None = None,
    added_tokens_json: Mapping[str, Any] | None = None,
    special_tokens_map: Any = None,
    has_tokenizer_file: bool = True,
    pipeline: str = "class",
    source: str = "tokenizer.json",
    spm_specials: Sequence[Mapping[str, Any]] | None = None,
) -> Pipeline:
    """The tokenizer transformers builds for a directory holding `file_data` (a tokenizer.json, or one assembled
    from slow files) and these configs; `pipeline="file"` keeps the file's components as written.

    `spm_specials` (with `has_tokenizer_file=False`) says `file_data` came from a SentencePiece tokenizer.model
    (`spm_bpe`): they are its control and user-defined pieces, which transformers' extractor passes to the class as
    `additional_special_tokens` in place of the config's."""
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline must be one of {PIPELINES}, not {pipeline!r}")
    b = _choose_class(file_data, config, model_config or {}, file_text, has_tokenizer_file)
    _check_sources(b, spm_specials, source)
    decoder = _special_values(b, special_tokens_map, added_tokens_json)
    _apply_class(b, pipeline)
    final = _tokens_to_add(b, decoder)
    rebuild = _rebuild_kind(b)
    if not (b.use_class or final or rebuild or not has_tokenizer_file):
        text = file_text if file_text is not None else json.dumps(dict(file_data), ensure_ascii=False)
        return b.pipeline(text, changed=False)  # the file as written: no class component, nothing added
    return _built(b, final, rebuild)


def _choose_class(
    file_data: Mapping[str, Any],
    config: Mapping[str, Any],
    model_config: Mapping[str, Any],
    file_text: str | None,
    has_tokenizer_file: bool,
) -> _Build:
    cls, cls_source = resolve_class(config, model_config, file_text if has_tokenizer_file else None)
    make = CLASSES.get(cls)
    modeled = make is not None or cls in GENERIC_CLASSES
    notes: list[str] = []
    if not modeled:
        notes.append(
            f"transformers' {cls} builds its own pipeline, which ctxlock does not model: the file's components are "
            "used as written and may differ from AutoTokenizer"
        )
    data = dict(file_data)
    spec = make(config) if make is not None else None
    model = data.get("model") or {}
    if spec is not None and model.get("type") != "BPE":
        notes.append(f"{cls} builds a BPE model and tokenizer.json holds {model.get('type')}: the file is used")
        spec = None
    return _Build(file_data, config, file_text, has_tokenizer_file, cls, cls_source, spec, modeled, notes, data)


def _check_sources(b: _Build, spm_specials: Sequence[Mapping[str, Any]] | None, source: str) -> None:
    """Refuse a directory without tokenizer.json that the class does not build the way ctxlock models; for one with
    only a tokenizer.model, the extractor's pieces become the additional special tokens."""
    spm = spm_specials is not None and not b.has_tokenizer_file
    if spm and (b.spec is None or not b.spec.reads_spm):
        # transformers 5.24 builds every class from a tokenizer.model, each its own way (the generic backend
        # follows the model's normalizer spec and piece scores, T5/XLM-R their converters, byte-level classes
        # read the pieces as byte-level): ctxlock models the SentencePiece BPE classes only, and refuses the others.
        readers = sorted(n for n, make in CLASSES.items() if make({}).reads_spm)
        raise ArtifactFormatError(
            f"tokenizer class {b.cls} ({b.cls_source}) builds its tokenizer from tokenizer.model in a way ctxlock "
            "does not model",
            path=source,
            hint=f"export tokenizer.json with save_pretrained, or name a class ctxlock builds from tokenizer.model: "
            f"{', '.join(readers)}",
        )
    if spm:
        b.notes.append(SPM_NOTE)
        if "additional_special_tokens" not in b.config:  # the config's own list replaces the extractor's
            b.config = {**b.config, "additional_special_tokens": [dict(t) for t in spm_specials or []]}
    if not b.has_tokenizer_file and not spm and (b.spec is None or not b.spec.reads_slow_bpe):
        # transformers 5.24 builds a tokenizer from vocab.json + merges.txt only in the classes whose files name
        # them; the generic backend refuses such a directory, and Llama/Qwen3.5/Gemma load an empty vocabulary.
        readers = sorted(n for n, make in CLASSES.items() if make({}).reads_slow_bpe)
        raise ArtifactFormatError(
            f"tokenizer class {b.cls} ({b.cls_source}) does not read vocab.json + merges.txt in transformers 5.24",
            path=source,
            hint=f"export tokenizer.json with save_pretrained, or name a class that reads them: {', '.join(readers)}",
        )


def _apply_class(b: _Build, pipeline: str) -> None:
    """Compare the class's components with the file's (`disagreements`), and take the class's where it is used."""
    spec, has_file, data = b.spec, b.has_tokenizer_file, b.data
    b.use_class = spec is not None and (pipeline == "class" or not has_file)
    if spec is not None:
        model = data.get("model") or {}
        built = _class_components(spec)
        file_canon = _canonical(data) if has_file else {}
        for comp in ("model", "normalizer", "pre_tokenizer", "decoder"):
            theirs = built.get(comp)
            ours = file_canon.get(comp) if has_file else None
            if has_file and ours == theirs:
                continue
            b.disagreements.append(
                {
                    "component": comp,
                    "file": _shown(ours) if has_file else "(no tokenizer.json)",
                    "class": _shown(theirs),
                    "used": "class" if b.use_class else "file",
                    "differences": differences(_shown(ours), _shown(theirs)) if has_file else [],
                }
            )
        if b.use_class:
            merges = model.get("merges") or []
            data["model"] = {**built["model"], "vocab": model.get("vocab") or {}, "merges": merges}
            for comp in ("normalizer", "pre_tokenizer", "decoder"):
                data[comp] = built.get(comp)
            data["added_tokens"] = []  # the class starts from an empty added vocabulary
    if not has_file:
        data["added_tokens"] = []


def _special_values(
    b: _Build, special_tokens_map: Any, added_tokens_json: Mapping[str, Any] | None
) -> dict[int, AddedToken]:
    """The special tokens and the added-token decoder, from the directory's files in transformers' order
    (`hf_special.special_sources`)."""
    spec = b.spec
    found = special_sources(
        b.config,
        special_tokens_map=special_tokens_map,
        added_tokens_json=added_tokens_json,
        file_data=b.file_data if b.has_tokenizer_file else None,
        defaults=spec.defaults if spec is not None else None,
        appended=spec.extra_defaults if spec is not None else (),
    )
    for key, value in found.named.items():
        _no_surrogate(value, f"tokenizer_config.json:{key}")
    from tokenizers import AddedToken

    for value in found.extras:
        if not isinstance(value, (str, AddedToken)):  # transformers' add_tokens refuses the list
            raise ArtifactFormatError(
                "extra_special_tokens holds strings or {content, ...} objects (transformers 5.24 refuses it too)",
                path="tokenizer_config.json:extra_special_tokens",
            )
        _no_surrogate(value, "tokenizer_config.json:extra_special_tokens")
    for idx, t in found.decoder.items():
        _no_surrogate(t, f"added_tokens_decoder.{idx}")
    b.named, b.extras = found.named, found.extras
    if spec is not None:
        # The class builds its BPE model with the unk token its __init__ receives, whichever file named it
        # (GemmaTokenizer, CodeLlamaTokenizer: `unk_token=str(unk_token)`).
        unk = found.named.get("unk_token")
        b.spec = CLASSES[b.cls]({**b.config, "unk_token": None if unk is None else str(unk)})
    b.special_tokens = tuple((k, str(v)) for k, v in b.named.items())
    return found.decoder


def _tokens_to_add(b: _Build, decoder: dict[int, AddedToken]) -> list[AddedToken]:
    """The added tokens `TokenizersBackend.__init__` (transformers/tokenization_utils_tokenizers.py) passes to
    `add_tokens`: the decoder's, in id order (its check against the tokens already held compares ids with tokens,
    so it never skips one; `tokenizers` skips a token it already holds as is), then each named and extra special
    token whose content is neither held nor queued; a string becomes `AddedToken(special=True)`, a queued token
    named as a special token is made special."""
    from tokenizers import AddedToken

    file_added = [] if b.use_class or not b.has_tokenizer_file else list(b.file_data.get("added_tokens") or [])
    to_add: list[Any] = [t for _, t in sorted(decoder.items())]
    encoder = [str(t["content"]) for t in file_added] + [str(t) for t in to_add]
    for value in [*b.named.values(), *b.extras]:
        if str(value) not in encoder and value not in to_add:
            to_add.append(value)
    named_contents = [str(t) for t in b.named.values() if t]
    final: list[AddedToken] = []
    for value in to_add:
        if isinstance(value, str):
            value = AddedToken(value, special=True)
        elif not value.special and str(value) in named_contents:
            value.special = True  # as transformers does, on the very object
        final.append(value)
    return final


def _rebuild_kind(b: _Build) -> str | None:
    """Whether the post-processor is rebuilt, and how: the file's, or rebuilt from add_bos_token/add_eos_token
    (which transformers reads from tokenizer_config.json only when there is no tokenizer.json)."""
    spec, has_file = b.spec, b.has_tokenizer_file
    rebuild = None
    if spec is not None and b.use_class and spec.post_processor != "file":
        rebuild = spec.post_processor
    elif b.data.get("post_processor") is None:
        rebuild = "config" if not has_file else "plain"
    if spec is not None and b.use_class and spec.post_processor != "file" and not has_file:
        rebuild = "config" if spec.post_processor == "plain" else "config-bos"
    return rebuild


def _built(b: _Build, final: list[AddedToken], rebuild: str | None) -> Pipeline:
    """Run the class's steps on a `tokenizers` pipeline and read back the tokenizer.json it gives."""
    import tokenizers
    from tokenizers import AddedToken

    tok = tokenizers.Tokenizer.from_str(json.dumps(b.data))
    before = {i: _state(t) for i, t in tok.get_added_tokens_decoder().items()}
    if final:
        tok.add_tokens(final)
    named, extras, spec = b.named, b.extras, b.spec
    all_special = list(dict.fromkeys(v if isinstance(v, str) else v.content for v in [*named.values(), *extras]))
    if spec is not None and spec.readd_specials and b.use_class:
        tok.add_tokens([AddedToken(t, special=True) for t in all_special])
    if spec is not None and spec.post_init and b.use_class:
        tok.add_special_tokens(
            [v if isinstance(v, AddedToken) else AddedToken(v, special=True, normalized=False) for v in named.values()]
            + [v if isinstance(v, AddedToken) else AddedToken(v, special=True, normalized=False) for v in extras]
        )
    out = json.loads(tok.to_str())
    if rebuild is not None:
        _rebuild_post_processor(b, tok, out, rebuild)
    has_file, file_data = b.has_tokenizer_file, b.file_data
    if has_file and b.file_text is not None and out == file_data:
        # The class builds exactly the file (a directory transformers itself saved): the file is the pipeline.
        return b.pipeline(b.file_text, changed=False)
    file_ids = {(int(t["id"]), str(t["content"])) for t in file_data.get("added_tokens") or []} if has_file else set()
    added_beyond = [
        {"content": t.content, "id": i, "special": t.special}
        for i, t in sorted(tok.get_added_tokens_decoder().items())
        if (i, t.content) not in file_ids and before.get(i) != _state(t)
    ]
    return b.pipeline(json.dumps(out, ensure_ascii=False), changed=True, added=tuple(added_beyond))


def _unk_loop(b: _Build, tok: Any) -> None:
    """`update_post_processor` looks up `bos_token_id` and `eos_token_id`; a token the vocabulary lacks falls back
    to `unk_token_id`, which looks up the unk token the same way: when that is missing too, transformers 5.24
    recurses until RecursionError and the directory does not load (transformers/tokenization_utils_tokenizers.py,
    `_convert_token_to_id_with_added_voc`). Refused here with the reason."""
    present = {k: tok.token_to_id(str(v)) is not None for k, v in b.named.items() if k in ("bos_token", "eos_token")}
    unk = b.named.get("unk_token")
    if unk is not None and tok.token_to_id(str(unk)) is None and not all(present.values()):
        missing = ", ".join(f"{k} {str(b.named[k])!r}" for k, ok in present.items() if not ok)
        raise ArtifactFormatError(
            f"unk_token {str(unk)!r} is not in the vocabulary, and neither is {missing}: transformers 5.24 fails to "
            "load this directory (its id lookup falls back to the unk token's forever)",
            path="tokenizer_config.json:unk_token",
            hint="name an unk_token the vocabulary holds (or none), and special tokens that are not empty",
        )


def _rebuild_post_processor(b: _Build, tok: Any, out: dict[str, Any], rebuild: str) -> None:
    """The TemplateProcessing transformers' `update_post_processor` sets, into `out`; a disagreement with the
    file's own post-processor is recorded."""

    def special(key: str, flag: str, default: bool) -> tuple[str, int] | None:
        value = b.named.get(key)
        content = value if isinstance(value, str) else value.content if value is not None else None
        wanted = default if rebuild.startswith("config") is False else _flag(b.config, flag, default)
        if not wanted or content is None:
            return None
        tid = tok.token_to_id(content)
        if tid is None and b.named.get("unk_token") is not None:
            tid = tok.token_to_id(str(b.named["unk_token"]))  # `convert_tokens_to_ids` falls back to the unk id
        if tid is None:
            raise ArtifactFormatError(
                f"{key} {content!r} has no id (not in the vocabulary, and no unk token): transformers 5.24 cannot "
                f"build the post-processor that adds it and fails to load this directory",
                path=f"tokenizer_config.json:{key}",
                hint=f"name a {key} the vocabulary holds, or set {flag} to false",
            )
        return (content, tid)

    _unk_loop(b, tok)
    bos = special("bos_token", "add_bos_token", rebuild in ("bos", "config-bos"))
    eos = special("eos_token", "add_eos_token", False)
    out["post_processor"] = _template_post_processor(bos, eos)
    if b.has_tokenizer_file and b.data.get("post_processor") is not None:
        theirs = _canonical(b.file_data).get("post_processor")
        if theirs != out["post_processor"]:
            b.disagreements.append(
                {
                    "component": "post_processor",
                    "file": theirs,
                    "class": out["post_processor"],
                    "used": "class",
                    "differences": differences(theirs, out["post_processor"]),
                }
            )


__all__ = ["build_pipeline", "differences"]
