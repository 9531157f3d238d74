"""The special tokens and added tokens of an HF model directory, from its files in transformers 5.24's order.

This mirrors, step by step and with the same Python operations on the same `tokenizers.AddedToken` objects:

1. `PreTrainedTokenizerBase._from_pretrained` (transformers/tokenization_utils_base.py): tokenizer_config.json's
   keys are the init kwargs; `additional_special_tokens` becomes `extra_special_tokens` when that is empty;
   string `*_token` keys beyond the seven standard ones, and a dict `extra_special_tokens`, become model-specific
   tokens. If the config has `added_tokens_decoder`, that is the added-token list and nothing else is read.
   Otherwise special_tokens_map.json overrides the config key by key (a dict becomes `AddedToken(special=True)`,
   an `extra_special_tokens` list is merged), then added_tokens.json (special when its content is one of the
   named or extra tokens) and tokenizer.json's `added_tokens` fill the decoder. `{"__type": "AddedToken"}` dicts
   become AddedTokens, and a standard token whose content is in the decoder takes the decoder's AddedToken.
2. The class's `__init__` signature defaults (`ClassSpec.defaults`), then `TokenizersBackend.__init__`
   (transformers/tokenization_utils_tokenizers.py: a tokenizer.json's `padding` gives `pad_token` when no source
   named one) and `PreTrainedTokenizerBase.__init__` (`additional_special_tokens` -> `extra_special_tokens`, the
   named map in standard order, then the model-specific tokens).

Where transformers raises on a shape (a special token that is neither a string nor an AddedToken, an
`added_tokens_decoder` entry that is not a token, ...), this raises `ArtifactFormatError` naming the file and key.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxlock.errors import ArtifactFormatError

STANDARD = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_CONFIG = "tokenizer_config.json"
_MAP = "special_tokens_map.json"


@dataclass
class Specials:
    """What the class's `__init__` ends up with: `named` is `_special_tokens_map` (standard order, then the
    model-specific tokens; None values left out), `extras` is `_extra_special_tokens`, `decoder` is the
    `added_tokens_decoder` passed in."""

    named: dict[str, Any] = field(default_factory=dict)
    extras: list[Any] = field(default_factory=list)
    decoder: dict[int, Any] = field(default_factory=dict)


def _refuse(message: str, where: str) -> ArtifactFormatError:
    return ArtifactFormatError(
        f"{message} (transformers 5.24 refuses it too)",
        path=where,
        hint="write special tokens as strings or {content, lstrip, rstrip, normalized, single_word, special} objects",
    )


def _token(fields: Any, where: str, **extra: Any) -> Any:
    """`AddedToken(**fields, **extra)`, or the typed error transformers' TypeError becomes."""
    from tokenizers import AddedToken

    if not isinstance(fields, Mapping):
        raise _refuse("an added token must be an object", where)
    try:
        return AddedToken(**{str(k): v for k, v in fields.items()}, **extra)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _refuse(f"not an added token: {exc}", where) from None


def _convert(obj: Any, where: str) -> Any:
    """`PreTrainedTokenizerBase.convert_added_tokens(obj, save=False)`: `{"__type": "AddedToken", ...}` dicts,
    anywhere in lists and dicts, become AddedTokens."""
    if isinstance(obj, dict) and obj.get("__type") == "AddedToken":
        return _token({k: v for k, v in obj.items() if k != "__type"}, where)
    if isinstance(obj, (list, tuple)):
        return [_convert(o, where) for o in obj]
    if isinstance(obj, dict):
        return {k: _convert(v, f"{where}.{k}") for k, v in obj.items()}
    return obj


def _from_pretrained_kwargs(
    config: Mapping[str, Any],
    stm: Any,
    added_tokens_json: Mapping[str, Any] | None,
    file_added: Sequence[Any] | None,
) -> tuple[dict[str, Any], dict[int, Any]]:
    """The init kwargs and added_tokens_decoder `_from_pretrained` passes to the class (its special-token part)."""
    init = copy.deepcopy({k: v for k, v in config.items() if k not in ("tokenizer_class", "init_inputs")})
    if "additional_special_tokens" in init and not init.get("extra_special_tokens"):
        init["extra_special_tokens"] = init.pop("additional_special_tokens")
    specific = {k: init.pop(k) for k in list(init) if k not in STANDARD and k.endswith("_token") and _is_str(init[k])}
    if isinstance(init.get("extra_special_tokens"), dict):
        specific.update(init.pop("extra_special_tokens"))
    if specific:
        init["model_specific_special_tokens"] = specific
    decoder: dict[int, Any] = {}
    by_content: dict[str, Any] = {}
    if "added_tokens_decoder" in init:
        raw = init["added_tokens_decoder"]
        if not isinstance(raw, Mapping):
            raise _refuse("added_tokens_decoder must map token ids to added tokens", f"{_CONFIG}:added_tokens_decoder")
        for idx, value in raw.items():
            token = _token(value, f"{_CONFIG}:added_tokens_decoder.{idx}")
            try:
                decoder[int(idx)] = token
            except ValueError:
                raise _refuse("added_tokens_decoder is keyed by token id", f"{_CONFIG}:added_tokens_decoder") from None
            by_content[str(token)] = token
    else:
        if stm is not None:
            _merge_map(init, stm)
        if added_tokens_json is not None:
            _read_added_json(init, added_tokens_json, decoder, by_content)
        for i, t in enumerate(file_added or []) if file_added is not None else ():
            fields = dict(t)
            idx = fields.pop("id")
            decoder[idx] = _token(fields, f"tokenizer.json:added_tokens[{i}]")
            by_content[str(decoder[idx])] = decoder[idx]
    init = _convert(init, _CONFIG)
    for key in STANDARD:
        if key in init and by_content and init[key] is not None:
            init[key] = by_content.get(str(init[key]), init[key])
    return init, decoder


def _is_str(value: Any) -> bool:
    from tokenizers import AddedToken

    return isinstance(value, (str, AddedToken))


def _merge_map(init: dict[str, Any], stm: Any) -> None:
    """The legacy special_tokens_map.json step: each key overrides the config's."""
    if not isinstance(stm, Mapping):
        raise _refuse("special_tokens_map.json must hold a JSON object", _MAP)
    for key, value in copy.deepcopy(dict(stm)).items():
        if isinstance(value, dict) and key != "extra_special_tokens":
            value.pop("special", None)
            value = _token(value, f"{_MAP}:{key}", special=True)
        elif key == "extra_special_tokens" and isinstance(value, list):
            existing = _listed(init.get("extra_special_tokens") or [], f"{_CONFIG}:extra_special_tokens")
            for i, tok in enumerate(value):
                tok = _token(tok, f"{_MAP}:{key}[{i}]", special=True) if isinstance(tok, dict) else tok
                if tok not in existing:
                    existing.append(tok)
            value = existing
        init[key] = value
    if isinstance(init.get("extra_special_tokens"), dict):
        specific = init.setdefault("model_specific_special_tokens", {})
        if not isinstance(specific, dict):
            raise _refuse("model_specific_special_tokens must be an object", f"{_CONFIG}:model_specific_special_tokens")
        specific.update(init.pop("extra_special_tokens"))


def _listed(value: Any, where: str) -> list[Any]:
    """`list(value)`, as transformers calls it (a string gives its characters, a number is refused)."""
    try:
        return list(value)
    except TypeError:
        raise _refuse("extra_special_tokens must be a list", where) from None


def _read_added_json(
    init: Mapping[str, Any], added: Mapping[str, Any], decoder: dict[int, Any], by_content: dict[str, Any]
) -> None:
    """added_tokens.json: a token is special when its content is a named (standard) or extra special token."""
    specials = {str(init[k]) for k in STANDARD if init.get(k)}
    specials.update(str(t) for t in _listed(init.get("extra_special_tokens") or [], f"{_CONFIG}:extra_special_tokens"))
    for content, idx in added.items():
        special = content in specials
        fields = {"content": content, "rstrip": False, "lstrip": False, "normalized": not special, "special": special}
        decoder[idx] = _token(fields, f"added_tokens.json:{content}")
        by_content[content] = decoder[idx]


def _class_init(init: dict[str, Any], where: str) -> tuple[dict[str, Any], list[Any]]:
    """`PreTrainedTokenizerBase.__init__`'s special-token part: (named map, extra tokens)."""
    if "additional_special_tokens" in init and "extra_special_tokens" not in init:
        init["extra_special_tokens"] = init.pop("additional_special_tokens")
    named: dict[str, Any] = dict.fromkeys(STANDARD)
    extras: list[Any] = []
    explicit = init.pop("model_specific_special_tokens", None)
    if explicit is None:
        explicit = {}
    elif not isinstance(explicit, dict):
        raise _refuse("model-specific special tokens must be an object", f"{where}:extra_special_tokens")
    auto: dict[str, Any] = {}
    for key in list(init):
        if key in STANDARD:
            value = init.pop(key)
            if value is None:
                continue
            if not _is_str(value):
                raise _refuse(f"{key} must be a string or an AddedToken object", f"{where}:{key}")
            named[key] = value
        elif key == "extra_special_tokens":
            value = init.pop(key)
            if value is None:
                continue
            if isinstance(value, dict):
                for name, token in value.items():  # `_set_model_specific_special_tokens`, at once
                    if not _is_str(token):
                        raise _refuse(f"special token {name} must be a string or an AddedToken object", where)
                    named[name] = token
            elif isinstance(value, (list, tuple)):
                extras = list(value)
            else:
                raise _refuse("extra_special_tokens must be a list or an object", f"{where}:{key}")
        elif key.endswith("_token") and _is_str(init[key]):
            auto[key] = init.pop(key)
    for key, value in {**auto, **explicit}.items():
        if not _is_str(value):
            raise _refuse(f"special token {key} must be a string or an AddedToken object", f"{where}:{key}")
        named[key] = value
    return {k: v for k, v in named.items() if v is not None}, extras


def special_sources(
    config: Mapping[str, Any],
    *,
    special_tokens_map: Any = None,
    added_tokens_json: Mapping[str, Any] | None = None,
    file_data: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    appended: Sequence[str] = (),
) -> Specials:
    """The special tokens and added-token decoder transformers 5.24 builds for a directory: `special_tokens_map` is
    special_tokens_map.json's value (None: no such file), `file_data` tokenizer.json's (None: no such file),
    `defaults` the class's `__init__` defaults, `appended` the keyword tokens the class's `__init__` appends to
    its `additional_special_tokens` (CodeLlamaTokenizer's FIM tokens)."""
    file_added = None
    if file_data is not None:
        file_added = file_data.get("added_tokens")
        if not isinstance(file_added, list) and "added_tokens_decoder" not in config:
            raise _refuse("tokenizer.json has no added_tokens list", "tokenizer.json:added_tokens")
    init, decoder = _from_pretrained_kwargs(config, special_tokens_map, added_tokens_json, file_added)
    for key, value in (defaults or {}).items():
        init.setdefault(key, value)  # the class's keyword defaults
    # The class passes its keyword tokens on first (`super().__init__(unk_token=..., ..., **kwargs)`): that order
    # is the order of the model-specific tokens, and so of the ids new tokens get.
    init = {**{k: init[k] for k in defaults or {}}, **{k: v for k, v in init.items() if k not in (defaults or {})}}
    padding = (file_data or {}).get("padding")
    if isinstance(padding, Mapping) and isinstance(padding.get("pad_token"), str):
        # TokenizersBackend.__init__: the file's padding names the pad token when no source (nor the class's own
        # keyword, which `defaults` lists even when it is None) did.
        init.setdefault("pad_token", padding["pad_token"])
    if appended:
        # transformers/models/code_llama/tokenization_code_llama.py, `__init__`: `additional_special_tokens or []`,
        # then `+= [token]` for each FIM keyword token that is not None (a non-list fails there).
        extra = init.pop("additional_special_tokens", None) or []
        if not isinstance(extra, list):
            raise _refuse("additional_special_tokens must be a list", f"{_CONFIG}:additional_special_tokens")
        init["additional_special_tokens"] = extra + [init[k] for k in appended if init.get(k) is not None]
    named, extras = _class_init(init, _CONFIG)
    return Specials(named, extras, decoder)


__all__ = ["STANDARD", "Specials", "special_sources"]
