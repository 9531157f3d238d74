"""What transformers 5 actually loads from an HF model directory: the tokenizer class and the pipeline it builds.

The reference for an HF directory is `AutoTokenizer.from_pretrained(dir)`, and that is not always `tokenizer.json`
as written. transformers 5 picks a tokenizer class (from `tokenizer_config.json`'s `tokenizer_class`, else
`config.json`'s `model_type`, with its own corrections), and many classes rebuild the backend in `__init__`: they
take only the vocabulary and merges from the file and set the model options, normalizer, pre-tokenizer and decoder
in code, whatever the file says (`Qwen2Tokenizer` always sets NFC; `LlamaTokenizer` always sets Metaspace and no
normalizer). The file's post-processor, truncation and padding are carried over. Then the added tokens are
assembled from `tokenizer_config.json`'s `added_tokens_decoder` (or, without it, `added_tokens.json` and the
file's own `added_tokens`), and every named special token that is not an added token yet becomes one.

`build_pipeline` does the same with the `tokenizers` library (the calls transformers makes), for the classes this
module models (`CLASSES`); it returns the `tokenizer.json` the reference runs, what the file and the class
disagree on, and which of them is used. `pipeline="file"` keeps the file's components as written (the added tokens
are still assembled, as every class does). A class this module does not model is reported as such, and the file's
components are used.

A directory with only a SentencePiece `tokenizer.model` is built as transformers' `SentencePieceExtractor` feeds the
class (`spm_bpe`: pieces in id order, merges from `generate_merges`, control and user-defined pieces as
`additional_special_tokens`), for the classes with `reads_spm`; any other class is refused.

The file's `truncation` and `padding` sections are kept in the pipeline's JSON as written; the HF backend
(`ctxlock.tokenizer.hf`) never applies them to an encode, as transformers' `apply_chat_template` does not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers

from ..errors import ArtifactFormatError

PIPELINES = ("class", "file")
PIPELINE_VERSION = "8"  # bump when what build_pipeline produces changes (the loader caches its result)
SPECIAL_TOKEN_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
COMPONENTS = ("model", "normalizer", "pre_tokenizer", "decoder", "post_processor")

# The classes that `tokenizer_class` or `model_type` name and that use the file as written (no `__init__` of
# their own in transformers 5.24): the file is the reference there.
GENERIC_CLASSES = frozenset(
    {"TokenizersBackend", "PreTrainedTokenizerFast", "PythonBackend", "FNetTokenizer", "ParakeetTokenizer"}
)
# The other tokenizer classes of transformers 5.24 with an `__init__` of their own (not modeled here). A name that
# is in none of these sets is unknown to transformers, which then loads the generic backend.
OTHER_CLASSES = frozenset(
    {
        "AlbertTokenizer", "BartTokenizer", "BarthezTokenizer", "BartphoTokenizer", "BertGenerationTokenizer",
        "BertJapaneseTokenizer", "BertTokenizer", "BertweetTokenizer", "BigBirdTokenizer", "BioGptTokenizer",
        "BlenderbotSmallTokenizer", "BlenderbotTokenizer", "ByT5Tokenizer", "CLIPTokenizer", "CTRLTokenizer",
        "CamembertTokenizer", "CanineTokenizer", "ClvpTokenizer", "CpmAntTokenizer", "CpmTokenizer",
        "DPRQuestionEncoderTokenizer", "DebertaTokenizer", "DebertaV2Tokenizer", "DiaTokenizer", "EsmTokenizer",
        "EsmcTokenizer", "FSMTTokenizer", "FlaubertTokenizer", "FunnelTokenizer", "GPTNeoXJapaneseTokenizer",
        "GPTSw3Tokenizer", "HerbertTokenizer", "LEDTokenizer", "LasrTokenizer", "LayoutLMv2Tokenizer",
        "LayoutLMv3Tokenizer", "LayoutXLMTokenizer", "LukeTokenizer", "LxmertTokenizer", "M2M100Tokenizer",
        "MBart50Tokenizer", "MBartTokenizer", "MLukeTokenizer", "MPNetTokenizer", "MarianTokenizer",
        "MarkupLMTokenizer", "MgpstrTokenizer", "MistralCommonBackend", "MobileBertTokenizer", "MvpTokenizer",
        "MyT5Tokenizer", "NllbTokenizer", "NougatTokenizer", "OpenAIGPTTokenizer", "PLBartTokenizer",
        "PegasusTokenizer", "PerceiverTokenizer", "PhobertTokenizer", "ProphetNetTokenizer", "RagTokenizer",
        "ReformerTokenizer", "RemBertTokenizer", "RoCBertTokenizer", "RoFormerTokenizer", "RobertaTokenizer",
        "SeamlessM4TTokenizer", "Siglip2Tokenizer", "SiglipTokenizer", "Speech2TextTokenizer", "SpeechT5Tokenizer",
        "SplinterTokenizer", "T5Tokenizer", "TapasTokenizer", "Tipsv2Tokenizer", "UdopTokenizer",
        "VideoPrismTokenizer", "VitsTokenizer", "Wav2Vec2CTCTokenizer", "Wav2Vec2PhonemeCTCTokenizer",
        "WhisperTokenizer", "XGLMTokenizer", "XLMRobertaTokenizer", "XLMTokenizer", "XLNetTokenizer",
    }
)  # fmt: skip
# Model types whose hub `tokenizer_class` transformers overrides with its registered class (its own list).
INCORRECT_HUB_CLASS = frozenset(
    {
        "arctic", "camembertv2-base", "chatlm", "cohere_asr", "ernie4_5", "ernie4_5_moe", "fuyu", "h2ovl_chat",
        "hyperclovax", "hyperclovax_vision_v2", "hyperclovax_vlm", "internlm2", "internlm3", "iquestcoder", "jamba",
        "llava", "llava_next", "minicpm3", "minicpmv", "minimax_m2", "modernbert", "modernbert-decoder", "molmo",
        "molmo2", "nemotron", "nvfp4", "opencua", "openvla", "paddleocr_vl", "phi3", "phi3_v", "phimoe", "qwen2",
        "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen4_exp", "siglip2", "smolvlm", "step3_vl", "vipllava",
    }
)  # fmt: skip


def _model_types(cls: str, *types: str) -> dict[str, str]:
    return dict.fromkeys(types, cls)


# transformers 5.24's `model_type` -> tokenizer class, for the classes modeled here and the generic ones (a
# `model_type` not listed maps to the generic backend, as it does in transformers when it has no entry).
MODEL_TYPE_CLASS: dict[str, str] = {
    **_model_types(
        "Qwen2Tokenizer",
        "qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_5_omni", "qwen2_audio", "qwen3", "qwen3_moe",
        "qwen3_next", "qwen3_vl", "qwen3_vl_moe", "qwen3_omni_moe", "qwen3_asr", "colqwen2", "internvl", "ovis2",
        "audioflamingo3", "hunyuan_vl", "cosmos3_omni", "dots3_note", "fun_asr_nano", "moss_transcribe_diarize",
        "qianfan_ocr",
    ),
    **_model_types("Qwen3_5Tokenizer", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen4_exp"),
    # "code_llama" is in transformers' tokenizer mapping but is no model type its configs know: a config.json
    # saying it loads the generic backend (checked), so it is not listed here.
    **_model_types("LlamaTokenizer", "idefics", "idefics2"),
    **_model_types(
        "GemmaTokenizer",
        "gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "recurrent_gemma", "shieldgemma2",
        "t5gemma", "diffusion_gemma", "zaya",
    ),
    **_model_types(
        "GPT2Tokenizer",
        "gpt2", "gpt_neo", "gptj", "codegen", "opt", "phi", "starcoder2", "dbrx", "emu3", "blip-2", "instructblip",
        "instructblipvideo", "jais2", "hyperclovax_vision_v2",
    ),
    **_model_types(
        "GPTNeoXTokenizer", "gpt_neox", "mpt", "olmo", "olmoe", "mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm"
    ),
    **_model_types("CohereTokenizer", "cohere", "cohere2", "aya_vision"),
    # Model types transformers maps to the generic backend, and the Mistral family (MistralCommonBackend, which
    # AutoTokenizer takes only with a tekken.json; with a tokenizer.json it loads the generic backend).
    **_model_types(
        "TokenizersBackend",
        "EvollaModel", "arctic", "aria", "beam", "bigbird_pegasus", "camembertv2-base", "canary", "chatlm",
        "cohere_asr", "ernie4_5", "ernie4_5_moe", "flex_olmo", "fuyu", "glm", "glm4", "glm4_moe", "glm4_moe_lite",
        "glm4v", "glm4v_moe", "glm_image", "glmasr", "got_ocr2", "gpt_bigcode", "gradium_phonon_tts", "granite",
        "granitemoe", "granitemoehybrid", "granitemoeshared", "h2ovl_chat", "hyperclovax", "hyperclovax_vlm",
        "internlm2", "internlm3", "iquestcoder", "jamba", "kimi_k25", "kimi_linear", "kosmos-2", "llava",
        "llava_next", "mimo_v2_flash", "minicpm3", "minicpm_ocr", "minicpmv", "minicpmv4_6", "minicpmv4_7",
        "minimax_m2", "modernbert", "modernbert-decoder", "molmo", "molmo2", "nemo_speechlm", "nemotron",
        "nvfp4", "nystromformer", "olmo2", "olmo3", "olmo_hybrid", "omniasr", "opencua", "openvla",
        "paddleocr_vl", "pegasus_x", "persimmon", "phi3", "phi3_v", "phimoe", "pix2struct", "pocket_tts",
        "smolvlm", "stablelm", "step3_vl", "umt5", "vipllava", "xlm-roberta-xl", "siglip2",
        "ministral", "ministral3", "mistral", "mistral3", "mistral_large4", "mixtral", "pixtral", "voxtral",
        "voxtral_realtime",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class ClassSpec:
    """What one transformers class sets in code: BPE options, components, default special tokens, extra steps."""

    name: str
    bpe: Mapping[str, Any]
    normalizer: Any  # a tokenizers normalizer, or None (the class sets none)
    pre_tokenizer: Any
    decoder: Any
    defaults: Mapping[str, str | None]  # special-token defaults of the class's __init__
    extra_defaults: tuple[str, ...] = ()  # additional special tokens the class always passes on
    post_processor: str = "file"  # "file": the file's; "plain": rebuilt without BOS/EOS; "bos": rebuilt with BOS
    readd_specials: bool = False  # Qwen2Tokenizer re-adds every special token as `AddedToken(t, special=True)`
    post_init: bool = False  # CohereTokenizer calls `_post_init`, which adds them with `add_special_tokens`
    reads_slow_bpe: bool = False  # its transformers files include vocab.json + merges.txt
    reads_spm: bool = False  # built from a SentencePiece tokenizer.model the way transformers does (modeled here)


_BYTE_BPE = {"dropout": None, "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False}
_QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_QWEN35_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _flag(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key)
    return default if value is None else bool(value)


def _qwen(name: str, split: str) -> Callable[[Mapping[str, Any]], ClassSpec]:
    def spec(config: Mapping[str, Any]) -> ClassSpec:
        prefix = _flag(config, "add_prefix_space", False)
        return ClassSpec(
            name=name,
            bpe={**_BYTE_BPE, "unk_token": None, "byte_fallback": False},
            normalizer=normalizers.NFC(),
            pre_tokenizer=pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                    pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=False),
                ]
            ),
            decoder=decoders.ByteLevel(),
            defaults={"unk_token": "<|endoftext|>", "bos_token": None, "eos_token": "<|endoftext|>"}
            | {"pad_token": "<|endoftext|>"},
            readd_specials=name == "Qwen2Tokenizer",
            reads_slow_bpe=name == "Qwen2Tokenizer",
        )

    return spec


def _metaspace_decoder(strip: bool) -> Any:
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    return decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1)] if strip else []))


def _llama(config: Mapping[str, Any]) -> ClassSpec:
    prefix = _flag(config, "add_prefix_space", True)
    legacy = _flag(config, "legacy", False)
    scheme = ("first" if not legacy else "always") if prefix else "never"
    return ClassSpec(
        name="LlamaTokenizer",
        bpe={"fuse_unk": True, "byte_fallback": True, "dropout": None},
        normalizer=None,
        pre_tokenizer=pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False),
        decoder=_metaspace_decoder(prefix),
        defaults={"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
        reads_spm=True,
    )


def _code_llama(config: Mapping[str, Any]) -> ClassSpec:
    prefix = _flag(config, "add_prefix_space", True)
    unk = config.get("unk_token", "<unk>")
    return ClassSpec(
        name="CodeLlamaTokenizer",
        bpe={"fuse_unk": True, "byte_fallback": True, "dropout": None, "unk_token": _content(unk) or "None"},
        normalizer=None,
        pre_tokenizer=pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first" if prefix else "never", split=False
        ),
        decoder=_metaspace_decoder(True),
        defaults={"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
        | {"prefix_token": "▁<PRE>", "middle_token": "▁<MID>", "suffix_token": "▁<SUF>", "eot_token": "▁<EOT>"}
        | {"fill_token": "<FILL_ME>"},
        extra_defaults=("prefix_token", "middle_token", "suffix_token", "eot_token", "fill_token"),
        post_processor="bos",  # it passes add_bos_token=True on, so the post-processor is rebuilt with BOS
        reads_spm=True,
    )


def _gemma(config: Mapping[str, Any]) -> ClassSpec:
    unk = config.get("unk_token", "<unk>")
    return ClassSpec(
        name="GemmaTokenizer",
        bpe={"fuse_unk": True, "unk_token": _content(unk) or "None", "dropout": None, "byte_fallback": True},
        normalizer=normalizers.Replace(" ", "▁"),
        pre_tokenizer=pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False),
        decoder=_metaspace_decoder(False),
        defaults={"unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
        | {"mask_token": "<mask>"},
        reads_spm=True,
    )


def _gpt2(config: Mapping[str, Any]) -> ClassSpec:
    return ClassSpec(
        name="GPT2Tokenizer",
        bpe=dict(_BYTE_BPE),
        normalizer=None,
        pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=_flag(config, "add_prefix_space", False)),
        decoder=decoders.ByteLevel(),
        defaults={"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
        reads_slow_bpe=True,
    )


def _gpt_neox(config: Mapping[str, Any]) -> ClassSpec:
    return ClassSpec(
        name="GPTNeoXTokenizer",
        bpe=dict(_BYTE_BPE),
        normalizer=normalizers.NFC(),
        pre_tokenizer=pre_tokenizers.ByteLevel(
            add_prefix_space=_flag(config, "add_prefix_space", False),
            trim_offsets=_flag(config, "trim_offsets", True),
        ),
        decoder=decoders.ByteLevel(),
        defaults={"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
        | {"pad_token": "<|padding|>"},
        post_processor="plain",
        reads_slow_bpe=True,
    )


def _cohere(config: Mapping[str, Any]) -> ClassSpec:
    prefix = _flag(config, "add_prefix_space", False)
    return ClassSpec(
        name="CohereTokenizer",
        bpe=dict(_BYTE_BPE),
        normalizer=normalizers.NFC(),
        pre_tokenizer=pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=prefix, trim_offsets=True),
            ]
        ),
        decoder=decoders.ByteLevel(add_prefix_space=prefix, trim_offsets=True),
        defaults={"unk_token": "<UNK>", "bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"}
        | {"pad_token": "<PAD>", "cls_token": "<CLS>", "sep_token": "<SEP>", "mask_token": "<MASK_TOKEN>"},
        post_init=True,
        reads_slow_bpe=True,
    )


CLASSES: dict[str, Callable[[Mapping[str, Any]], ClassSpec]] = {
    "Qwen2Tokenizer": _qwen("Qwen2Tokenizer", _QWEN2_SPLIT),
    "Qwen3_5Tokenizer": _qwen("Qwen3_5Tokenizer", _QWEN35_SPLIT),
    "LlamaTokenizer": _llama,
    "CodeLlamaTokenizer": _code_llama,
    "GemmaTokenizer": _gemma,
    "GPT2Tokenizer": _gpt2,
    "GPTNeoXTokenizer": _gpt_neox,
    "CohereTokenizer": _cohere,
}


@dataclass(frozen=True)
class Pipeline:
    """The tokenizer an HF directory gives, and how it was arrived at (for `inspect` and the record)."""

    json_text: str  # the tokenizer.json that is encoded with: no truncation, no padding
    tokenizer_class: str  # the class transformers loads
    class_source: str  # where that name came from
    used: str  # "class": the class's pipeline; "file": the file's components as written
    modeled: bool  # whether ctxlock follows this class (False: a class with its own __init__ it does not model)
    disagreements: tuple[dict[str, Any], ...] = ()  # {component, file, class, used}
    added_tokens: tuple[dict[str, Any], ...] = ()  # tokens added (or changed) beyond the file's own added_tokens
    notes: tuple[str, ...] = field(default=())
    changed: bool = True  # False: the file's own text is the pipeline
    # the named special tokens the class ends up with (bos_token -> "<s>", ...), class defaults included
    special_tokens: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "json_text": self.json_text,
            "tokenizer_class": self.tokenizer_class,
            "class_source": self.class_source,
            "used": self.used,
            "modeled": self.modeled,
            "disagreements": [dict(d) for d in self.disagreements],
            "added_tokens": [dict(t) for t in self.added_tokens],
            "notes": list(self.notes),
            "changed": self.changed,
            "special_tokens": [list(t) for t in self.special_tokens],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Pipeline:
        if not isinstance(d["json_text"], str) or d["used"] not in PIPELINES:
            raise ValueError("not a pipeline")
        return cls(
            json_text=d["json_text"],
            tokenizer_class=str(d["tokenizer_class"]),
            class_source=str(d["class_source"]),
            used=d["used"],
            modeled=bool(d["modeled"]),
            disagreements=tuple(dict(x) for x in d["disagreements"]),
            added_tokens=tuple(dict(x) for x in d["added_tokens"]),
            notes=tuple(str(x) for x in d["notes"]),
            changed=bool(d["changed"]),
            special_tokens=tuple((str(k), str(v)) for k, v in d["special_tokens"]),
        )

    def describe(self) -> dict[str, Any]:
        return {
            "tokenizer_class": self.tokenizer_class,
            "tokenizer_class_source": self.class_source,
            "pipeline": self.used,
            "class_modeled": self.modeled,
            "class_disagreements": [dict(d) for d in self.disagreements],
            "added_beyond_file": [dict(t) for t in self.added_tokens],
            "pipeline_notes": list(self.notes),
            # The notes that say the ids may differ from AutoTokenizer's (not how the tokenizer was built): renders
            # and records carry them as warnings.
            "pipeline_departures": [n for n in self.notes if n != SPM_NOTE],
        }


def _content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def resolve_class(config: Mapping[str, Any], model_config: Mapping[str, Any], file_text: str | None) -> tuple[str, str]:
    """(class name, where it came from), the way `AutoTokenizer.from_pretrained` chooses, for a directory without
    remote code: `tokenizer_config.json`'s `tokenizer_class` (else `config.json`'s), corrected by `model_type`
    where transformers corrects it; without either, `config.json`'s `model_type`."""
    model_type = model_config.get("model_type") if isinstance(model_config.get("model_type"), str) else None
    declared = config.get("tokenizer_class") if isinstance(config.get("tokenizer_class"), str) else None
    where = "tokenizer_config.json:tokenizer_class"
    if declared is None and isinstance(model_config.get("tokenizer_class"), str):
        declared, where = model_config["tokenizer_class"], "config.json:tokenizer_class"
    registered = MODEL_TYPE_CLASS.get(model_type or "")
    if declared is not None:
        base = declared.removesuffix("Fast")
        if (
            base == "LlamaTokenizer"
            and model_type not in INCORRECT_HUB_CLASS
            and file_text is not None
            and '"ByteLevel"' in file_text
        ):
            return "TokenizersBackend", f"{where} is {declared}, but tokenizer.json is ByteLevel (as transformers)"
        if registered is not None and registered != base:
            # transformers: a registered generic class wins; a specific one wins for the model types whose hub
            # class it knows to be wrong; otherwise the declared class is trusted (the generic one if it is generic)
            why = f"config.json:model_type {model_type!r} (transformers overrides {declared})"
            if registered in GENERIC_CLASSES:
                return "TokenizersBackend", why
            if model_type in INCORRECT_HUB_CLASS:
                return registered, why
        if base in GENERIC_CLASSES:
            return "TokenizersBackend", where
        if base not in CLASSES and base not in OTHER_CLASSES and base != "Qwen2TokenizerFast":
            return "TokenizersBackend", f"{where} is {declared}, a class transformers 5.24 does not have"
        return base, where
    if model_type is not None:
        return registered or "TokenizersBackend", f"config.json:model_type {model_type!r}"
    return "TokenizersBackend", "no tokenizer_class or model_type: the file as written"


def _added(value: Any) -> AddedToken | None:
    """An AddedToken from a config value: a string (special), or a {content, ...} object."""
    if isinstance(value, AddedToken):
        return value
    if isinstance(value, str):
        return None
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        flags = {k: bool(value[k]) for k in ("single_word", "lstrip", "rstrip", "normalized", "special") if k in value}
        return AddedToken(value["content"], **flags)
    return None


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
    out = json.loads(tokenizers.Tokenizer.from_str(json.dumps(tiny)).to_str())
    out["model"] = {k: v for k, v in out["model"].items() if k not in ("vocab", "merges")}
    return out


def _template_post_processor(bos: tuple[str, int] | None, eos: tuple[str, int] | None) -> dict[str, Any]:
    """The TemplateProcessing transformers' `update_post_processor` sets."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    single = f"{f'{bos[0]}:0 ' if bos else ''}$A:0{f' {eos[0]}:0' if eos else ''}"
    pair = f"{single}{f' {bos[0]}:1' if bos else ''} $B:1{f' {eos[0]}:1' if eos else ''}"
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[t for t in (bos, eos) if t is not None]
    )
    return json.loads(tok.to_str())["post_processor"]


SPM_NOTE = (
    "built from tokenizer.model as transformers 5.24 does for this class (SentencePieceExtractor): the vocabulary "
    "in piece-id order, BPE merges generated from the vocabulary alone (generate_merges: ranked by piece id, not by "
    "the SentencePiece scores), control and user-defined pieces added as tokens; the file's normalizer spec is not "
    "used"
)


def bare_bpe(vocab: Mapping[str, int], merges: Sequence[Sequence[str]]) -> dict[str, Any]:
    """tokenizer.json-shaped data holding only a BPE model (no normalizer, pre-tokenizer, post-processor, decoder or
    added tokens): what a class's `__init__` starts from before it sets its own components."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": None,
        "model": {"type": "BPE", "vocab": dict(vocab), "merges": [list(m) for m in merges]},
    }


def generate_merges(vocab: Mapping[str, int]) -> list[list[str]]:
    """The merges transformers' `generate_merges(vocab)` derives from a vocabulary: every split of a piece into two
    pieces of the vocabulary, ordered by the piece's id, then by the lengths of the two halves (a stable sort)."""
    merges: list[tuple[str, str, int]] = []
    for piece, rank in vocab.items():
        local = [
            (piece[:i], piece[i:], rank) for i in range(1, len(piece)) if piece[:i] in vocab and piece[i:] in vocab
        ]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])))
    return [[left, right] for left, right, _ in merges]


def spm_bpe(pieces: Sequence[tuple[str, int]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What transformers' `SentencePieceExtractor.extract` gives a BPE class from a tokenizer.model's pieces
    ((piece, type) in id order): the tokenizer.json-shaped vocabulary and merges, and the control (type 3, special)
    and user-defined (type 4, not special) pieces, which it passes on as `additional_special_tokens`."""
    vocab = {piece: i for i, (piece, _) in enumerate(pieces)}  # a repeated piece keeps its last id, as there
    data = bare_bpe(vocab, generate_merges(vocab))
    specials = [
        {"__type": "AddedToken", "content": piece, "normalized": False, "special": kind == 3}
        | {"single_word": False, "lstrip": False, "rstrip": False}
        for piece, kind in pieces
        if kind in (3, 4)
    ]
    return data, specials


def _class_components(spec: ClassSpec) -> dict[str, Any]:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={}, merges=[], **spec.bpe))
    tok.normalizer = spec.normalizer
    tok.pre_tokenizer = spec.pre_tokenizer
    tok.decoder = spec.decoder
    out = json.loads(tok.to_str())
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


def build_pipeline(
    file_data: Mapping[str, Any],
    *,
    config: Mapping[str, Any],
    model_config: Mapping[str, Any] | None = None,
    file_text: str | None = None,
    added_tokens_json: Mapping[str, Any] | None = None,
    special_tokens_map: Mapping[str, Any] | None = None,
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
    model_config = model_config or {}
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
    spm = spm_specials is not None and not has_tokenizer_file
    if spm and (spec is None or not spec.reads_spm):
        # transformers 5.24 builds every class from a tokenizer.model, each its own way (the generic backend
        # follows the model's normalizer spec and piece scores, T5/XLM-R their converters, byte-level classes
        # read the pieces as byte-level): ctxlock models the SentencePiece BPE classes only, and refuses the others.
        readers = sorted(n for n, make in CLASSES.items() if make({}).reads_spm)
        raise ArtifactFormatError(
            f"tokenizer class {cls} ({cls_source}) builds its tokenizer from tokenizer.model in a way ctxlock does "
            "not model",
            path=source,
            hint=f"export tokenizer.json with save_pretrained, or name a class ctxlock builds from tokenizer.model: "
            f"{', '.join(readers)}",
        )
    if spm:
        notes.append(SPM_NOTE)
        if "additional_special_tokens" not in config:  # the config's own list replaces the extractor's
            config = {**config, "additional_special_tokens": [dict(t) for t in spm_specials or []]}
    if not has_tokenizer_file and not spm and (spec is None or not spec.reads_slow_bpe):
        # transformers 5.24 builds a tokenizer from vocab.json + merges.txt only in the classes whose files name
        # them; the generic backend refuses such a directory, and Llama/Qwen3.5/Gemma load an empty vocabulary.
        readers = sorted(n for n, make in CLASSES.items() if make({}).reads_slow_bpe)
        raise ArtifactFormatError(
            f"tokenizer class {cls} ({cls_source}) does not read vocab.json + merges.txt in transformers 5.24",
            path=source,
            hint=f"export tokenizer.json with save_pretrained, or name a class that reads them: {', '.join(readers)}",
        )

    disagreements: list[dict[str, Any]] = []
    use_class = spec is not None and (pipeline == "class" or not has_tokenizer_file)
    if spec is not None:
        built = _class_components(spec)
        file_canon = _canonical(data) if has_tokenizer_file else {}
        for comp in ("model", "normalizer", "pre_tokenizer", "decoder"):
            theirs = built.get(comp)
            ours = file_canon.get(comp) if has_tokenizer_file else None
            if has_tokenizer_file and ours == theirs:
                continue
            disagreements.append(
                {
                    "component": comp,
                    "file": _shown(ours) if has_tokenizer_file else "(no tokenizer.json)",
                    "class": _shown(theirs),
                    "used": "class" if use_class else "file",
                    "differences": differences(_shown(ours), _shown(theirs)) if has_tokenizer_file else [],
                }
            )
        if use_class:
            merges = model.get("merges") or []
            data["model"] = {**built["model"], "vocab": model.get("vocab") or {}, "merges": merges}
            for comp in ("normalizer", "pre_tokenizer", "decoder"):
                data[comp] = built.get(comp)
            data["added_tokens"] = []  # the class starts from an empty added vocabulary
    if not has_tokenizer_file:
        data["added_tokens"] = []

    # -- the special-token map, as transformers' `_from_pretrained` and the class's __init__ assemble it
    values: dict[str, Any] = dict(spec.defaults if spec is not None else {})
    decoder_cfg = config.get("added_tokens_decoder")
    for key, value in config.items():
        # A model-specific `*_token` counts when it is a string or a serialized AddedToken (`"__type"`), as the
        # values transformers' `convert_added_tokens` turns into AddedTokens.
        typed = isinstance(value, Mapping) and value.get("__type") == "AddedToken" and _added(value) is not None
        if key in SPECIAL_TOKEN_ATTRIBUTES or (key.endswith("_token") and (isinstance(value, str) or typed)):
            values[key] = value
    if not isinstance(decoder_cfg, Mapping) and isinstance(special_tokens_map, Mapping):
        for key, value in special_tokens_map.items():
            if key in SPECIAL_TOKEN_ATTRIBUTES or key.endswith("_token"):
                values[key] = value
    extras: list[Any] = []
    for key in ("extra_special_tokens", "additional_special_tokens"):
        if isinstance(config.get(key), list):
            extras = list(config[key])
            break
        if isinstance(config.get(key), dict):
            values.update(config[key])
            break
    if spec is not None:
        extras = extras + [values[k] for k in spec.extra_defaults if values.get(k) is not None]

    # -- added_tokens_decoder: the config's, else added_tokens.json and the file's own added_tokens
    decoder: dict[int, AddedToken] = {}
    if isinstance(decoder_cfg, Mapping):
        for idx, value in decoder_cfg.items():
            token = _added(value)
            if token is None or not token.content:
                raise ArtifactFormatError(
                    "added_tokens_decoder holds {content, ...} objects", path=f"tokenizer_config.json:{idx}"
                )
            try:
                decoder[int(idx)] = token
            except ValueError:
                raise ArtifactFormatError(
                    "added_tokens_decoder is keyed by token id", path="tokenizer_config.json:added_tokens_decoder"
                ) from None
    else:
        if isinstance(added_tokens_json, Mapping):
            specials = {c for v in values.values() if (c := _content(v)) is not None} | {
                c for v in extras if (c := _content(v)) is not None
            }
            for content, idx in added_tokens_json.items():
                if not content:
                    continue
                special = content in specials
                decoder[int(idx)] = AddedToken(content, normalized=not special, special=special)
        if has_tokenizer_file:
            for t in file_data.get("added_tokens") or []:
                flags = {k: bool(t.get(k, False)) for k in _FLAG_KEYS}
                decoder[int(t["id"])] = AddedToken(t["content"], **flags)
    by_content = {str(t.content): t for t in decoder.values()}
    named: dict[str, AddedToken | str] = {}
    for key, value in values.items():
        token = _added(value) or (by_content.get(value) if isinstance(value, str) else None)
        chosen = token if token is not None else _content(value)
        _no_surrogate(chosen, f"tokenizer_config.json:{key}")
        if chosen is not None and (chosen if isinstance(chosen, str) else chosen.content):
            named[key] = chosen  # a None, empty or non-string value names no token (transformers skips it too)
    extras = [(_added(v) or by_content.get(_content(v) or "") or _content(v)) for v in extras]
    extras = [v for v in extras if v is not None and (v if isinstance(v, str) else v.content)]
    for v in extras:
        _no_surrogate(v, "tokenizer_config.json:extra_special_tokens")
    for idx, t in decoder.items():
        _no_surrogate(t, f"added_tokens_decoder.{idx}")

    file_added = [] if use_class or not has_tokenizer_file else list(file_data.get("added_tokens") or [])
    existing = {(str(t["content"]), *(bool(t.get(k, False)) for k in _FLAG_KEYS)) for t in file_added}
    to_add: list[Any] = [t for _, t in sorted(decoder.items()) if _state(t) not in existing]
    encoder = {str(t["content"]) for t in file_added} | {str(t.content) for t in to_add}
    for value in [*named.values(), *extras]:
        content = value if isinstance(value, str) else value.content
        if content not in encoder:
            to_add.append(value)
            encoder.add(content)
    named_contents = {v if isinstance(v, str) else v.content for v in named.values()}
    special_tokens = tuple((k, v if isinstance(v, str) else v.content) for k, v in named.items())
    final: list[AddedToken] = []
    for value in to_add:
        if isinstance(value, str):
            value = AddedToken(value, special=True)
        elif not value.special and value.content in named_contents:
            value = AddedToken(value.content, **_flags(value), special=True)
        final.append(value)

    # -- the post-processor: the file's, or rebuilt from add_bos_token/add_eos_token (which transformers reads
    # from tokenizer_config.json only when there is no tokenizer.json)
    rebuild = None
    if spec is not None and use_class and spec.post_processor != "file":
        rebuild = spec.post_processor
    elif data.get("post_processor") is None:
        rebuild = "config" if not has_tokenizer_file else "plain"
    if spec is not None and use_class and spec.post_processor != "file" and not has_tokenizer_file:
        rebuild = "config" if spec.post_processor == "plain" else "config-bos"

    changed = bool(use_class or final or rebuild or not has_tokenizer_file)
    if not changed:
        return Pipeline(
            json_text=file_text if file_text is not None else json.dumps(dict(file_data), ensure_ascii=False),
            tokenizer_class=cls,
            class_source=cls_source,
            used="file",
            modeled=modeled,
            disagreements=tuple(disagreements),
            notes=tuple(notes),
            changed=False,
            special_tokens=special_tokens,
        )

    tok = tokenizers.Tokenizer.from_str(json.dumps(data))
    before = {i: _state(t) for i, t in tok.get_added_tokens_decoder().items()}
    if final:
        tok.add_tokens(final)
    all_special = list(dict.fromkeys(v if isinstance(v, str) else v.content for v in [*named.values(), *extras]))
    if spec is not None and spec.readd_specials and use_class:
        tok.add_tokens([AddedToken(t, special=True) for t in all_special])
    if spec is not None and spec.post_init and use_class:
        tok.add_special_tokens(
            [v if isinstance(v, AddedToken) else AddedToken(v, special=True, normalized=False) for v in named.values()]
            + [v if isinstance(v, AddedToken) else AddedToken(v, special=True, normalized=False) for v in extras]
        )
    out = json.loads(tok.to_str())
    if rebuild is not None:

        def special(key: str, flag: str, default: bool) -> tuple[str, int] | None:
            value = named.get(key)
            content = value if isinstance(value, str) else value.content if value is not None else None
            wanted = default if rebuild.startswith("config") is False else _flag(config, flag, default)
            tid = tok.token_to_id(content) if content is not None else None
            return (content, tid) if wanted and content is not None and tid is not None else None

        bos = special("bos_token", "add_bos_token", rebuild in ("bos", "config-bos"))
        eos = special("eos_token", "add_eos_token", False)
        out["post_processor"] = _template_post_processor(bos, eos)
        if has_tokenizer_file and data.get("post_processor") is not None:
            theirs = _canonical(file_data).get("post_processor")
            if theirs != out["post_processor"]:
                disagreements.append(
                    {
                        "component": "post_processor",
                        "file": theirs,
                        "class": out["post_processor"],
                        "used": "class",
                        "differences": differences(theirs, out["post_processor"]),
                    }
                )

    if has_tokenizer_file and file_text is not None and out == file_data:
        # The class builds exactly the file (a directory transformers itself saved): the file is the pipeline.
        return Pipeline(
            json_text=file_text,
            tokenizer_class=cls,
            class_source=cls_source,
            used="class" if use_class else "file",
            modeled=modeled,
            disagreements=tuple(disagreements),
            notes=tuple(notes),
            changed=False,
            special_tokens=special_tokens,
        )
    file_ids = (
        {(int(t["id"]), str(t["content"])) for t in file_data.get("added_tokens") or []}
        if has_tokenizer_file
        else set()
    )
    added_beyond = [
        {"content": t.content, "id": i, "special": t.special}
        for i, t in sorted(tok.get_added_tokens_decoder().items())
        if (i, t.content) not in file_ids and before.get(i) != _state(t)
    ]
    return Pipeline(
        json_text=json.dumps(out, ensure_ascii=False),
        tokenizer_class=cls,
        class_source=cls_source,
        used="class" if use_class else "file",
        modeled=modeled,
        disagreements=tuple(disagreements),
        added_tokens=tuple(added_beyond),
        notes=tuple(notes),
        changed=True,
        special_tokens=special_tokens,
    )


_FLAG_KEYS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def _no_surrogate(value: AddedToken | str | None, where: str) -> None:
    content = value if isinstance(value, str) or value is None else value.content
    if content is not None and re.search("[\ud800-\udfff]", content):
        raise ArtifactFormatError(
            "a special token holds a lone surrogate, which is not a character",
            path=where,
            hint="escape characters outside the BMP as a surrogate pair",
        )


def _flags(token: AddedToken) -> dict[str, bool]:
    return {
        "single_word": token.single_word,
        "lstrip": token.lstrip,
        "rstrip": token.rstrip,
        "normalized": token.normalized,
    }
