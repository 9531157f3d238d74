"""What transformers 5 actually loads from an HF model directory: the tokenizer class and the pipeline it builds.

The reference for an HF directory is `AutoTokenizer.from_pretrained(dir)`, and that is not always `tokenizer.json`
as written. transformers 5 picks a tokenizer class (from `tokenizer_config.json`'s `tokenizer_class`, else
`config.json`'s `model_type`, with its own corrections), and many classes rebuild the backend in `__init__`: they
take only the vocabulary and merges from the file and set the model options, normalizer, pre-tokenizer and decoder
in code, whatever the file says (`Qwen2Tokenizer` always sets NFC; `LlamaTokenizer` always sets Metaspace and no
normalizer). The file's post-processor, truncation and padding are carried over. Then the added tokens are
assembled from `tokenizer_config.json`'s `added_tokens_decoder` (or, without it, `added_tokens.json` and the
file's own `added_tokens`), and every named special token that is not an added token yet becomes one.

`hf_pipeline.build_pipeline` does the same with the `tokenizers` library (the calls transformers makes), for the
classes this module models (`CLASSES`); it returns the `tokenizer.json` the reference runs, what the file and the
class disagree on, and which of them is used. `pipeline="file"` keeps the file's components as written (the added tokens
are still assembled, as every class does). A class this module does not model is reported as such, and the file's
components are used.

A directory with only a SentencePiece `tokenizer.model` is built as transformers' `SentencePieceExtractor` feeds the
class (`spm_bpe`: pieces in id order, merges from `generate_merges`, control and user-defined pieces as
`additional_special_tokens`), for the classes with `reads_spm`; any other class is refused.

The file's `truncation` and `padding` sections are kept in the pipeline's JSON as written; the HF backend
(`ctxlock.tokenizer.backends`) never applies them to an encode, as transformers' `apply_chat_template` does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PIPELINES = ("class", "file")
PIPELINE_VERSION = "9"  # bump when what build_pipeline produces changes (the loader caches its result)
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


def flag(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key)
    return default if value is None else bool(value)


def _qwen(name: str, split: str) -> Callable[[Mapping[str, Any]], ClassSpec]:
    def spec(config: Mapping[str, Any]) -> ClassSpec:
        from tokenizers import Regex, decoders, normalizers, pre_tokenizers  # heavy: on first use

        prefix = flag(config, "add_prefix_space", False)
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
    from tokenizers import decoders  # heavy: on first use

    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    return decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1)] if strip else []))


def _llama(config: Mapping[str, Any]) -> ClassSpec:
    from tokenizers import pre_tokenizers  # heavy: on first use

    prefix = flag(config, "add_prefix_space", True)
    legacy = flag(config, "legacy", False)
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
    from tokenizers import pre_tokenizers  # heavy: on first use

    prefix = flag(config, "add_prefix_space", True)
    unk = config.get("unk_token", "<unk>")
    return ClassSpec(
        name="CodeLlamaTokenizer",
        bpe={"fuse_unk": True, "byte_fallback": True, "dropout": None, "unk_token": content(unk) or "None"},
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
    from tokenizers import normalizers, pre_tokenizers  # heavy: on first use

    unk = config.get("unk_token", "<unk>")
    return ClassSpec(
        name="GemmaTokenizer",
        bpe={"fuse_unk": True, "unk_token": content(unk) or "None", "dropout": None, "byte_fallback": True},
        normalizer=normalizers.Replace(" ", "▁"),
        pre_tokenizer=pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False),
        decoder=_metaspace_decoder(False),
        defaults={"unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
        | {"mask_token": "<mask>"},
        reads_spm=True,
    )


def _gpt2(config: Mapping[str, Any]) -> ClassSpec:
    from tokenizers import decoders, pre_tokenizers  # heavy: on first use

    return ClassSpec(
        name="GPT2Tokenizer",
        bpe=dict(_BYTE_BPE),
        normalizer=None,
        pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=flag(config, "add_prefix_space", False)),
        decoder=decoders.ByteLevel(),
        defaults={"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
        | {"pad_token": None},  # passed on explicitly: a tokenizer.json's padding does not name it
        reads_slow_bpe=True,
    )


def _gpt_neox(config: Mapping[str, Any]) -> ClassSpec:
    from tokenizers import decoders, normalizers, pre_tokenizers  # heavy: on first use

    return ClassSpec(
        name="GPTNeoXTokenizer",
        bpe=dict(_BYTE_BPE),
        normalizer=normalizers.NFC(),
        pre_tokenizer=pre_tokenizers.ByteLevel(
            add_prefix_space=flag(config, "add_prefix_space", False),
            trim_offsets=flag(config, "trim_offsets", True),
        ),
        decoder=decoders.ByteLevel(),
        defaults={"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
        | {"pad_token": "<|padding|>"},
        post_processor="plain",
        reads_slow_bpe=True,
    )


def _cohere(config: Mapping[str, Any]) -> ClassSpec:
    from tokenizers import decoders, normalizers, pre_tokenizers  # heavy: on first use

    prefix = flag(config, "add_prefix_space", False)
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
        decoder=decoders.ByteLevel(add_prefix_space=prefix, trim_offsets=True),  # type: ignore[call-arg]  # (stub)
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


def content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        text: str = value["content"]
        return text
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
