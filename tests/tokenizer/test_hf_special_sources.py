"""The special tokens of an HF directory come from transformers 5.24's own order of sources (docs/hf-directories.md).

A directory's special tokens can be named in tokenizer_config.json (with or without `added_tokens_decoder`,
`extra_special_tokens`, `additional_special_tokens`, each token a string or an AddedToken object),
special_tokens_map.json, added_tokens.json and tokenizer.json's `added_tokens` (and its `padding`). Hypothesis
writes directories from the combinations, over a small real byte-level BPE tokenizer.json made with `tokenizers`,
and `transformers.AutoTokenizer.from_pretrained` on the same directory is the reference for: the named special
tokens (the template variables), the added tokens (id, content, flags), the ids of a probe text with special tokens
parsed, and the ids of a probe render whose template writes every special-token variable. Where transformers
refuses a directory, ctxlock refuses it with `ArtifactFormatError`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from ctxlock.errors import ArtifactFormatError, RequestValidationError, TokenizerError
from hypothesis_profiles import examples

pytestmark = pytest.mark.reference

NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# In the base vocabulary ("hi" is a merge), among the file's added tokens, or new.
POOL = ("<|endoftext|>", "<a>", "<b>", "<|im_end|>", "<new>", "hi", "")
FLAGS = ("single_word", "lstrip", "rstrip", "normalized")
TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}"
    + "".join(f"{{% if {n} is defined %}}[{{{{ {n} }}}}]{{% endif %}}" for n in (*NAMES, "image_token"))
    + "{% endfor %}"
)
PROBE = "hi <a>x<b> <|im_end|>hi<new> the <|endoftext|> <b>"
CLASSES = (
    "PreTrainedTokenizerFast",
    "Qwen2Tokenizer",
    "Qwen3_5Tokenizer",
    "GPT2Tokenizer",
    "GPTNeoXTokenizer",
    "CohereTokenizer",
    "LlamaTokenizer",  # over a byte-level file AutoTokenizer loads the generic backend
    "CodeLlamaTokenizer",
    "GemmaTokenizer",
)


def _base_tokenizer() -> dict[str, Any]:
    """A real byte-level BPE tokenizer: the 256 byte symbols and a few merges ("hi", "Ġt", "Ġth")."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    byte_symbols = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = list(byte_symbols), 0
    for b in range(256):  # GPT-2's bytes_to_unicode
        if b not in byte_symbols:
            symbols.append(256 + extra)
            extra += 1
    vocab = {chr(c): i for i, c in enumerate(symbols)}
    merges = [("h", "i"), ("Ġ", "t"), ("Ġt", "h")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return json.loads(tok.to_str())


@pytest.fixture(scope="module")
def base_tokenizer() -> dict[str, Any]:
    return _base_tokenizer()


def _flags(draw: st.DrawFn) -> dict[str, bool]:
    return {k: draw(st.booleans()) for k in FLAGS}


@st.composite
def _config_token(draw: st.DrawFn, hostile: bool = False) -> Any:
    """A tokenizer_config.json special-token value: a string or a serialized AddedToken (when `hostile`, now and
    then without its `__type`, which transformers does not read as a token)."""
    content = draw(st.sampled_from(POOL))
    kind = draw(st.sampled_from(("str", "typed", "untyped") if hostile else ("str", "typed")))
    if kind == "str":
        return content
    token = {"content": content, **_flags(draw), "special": draw(st.booleans())}
    return token if kind == "untyped" else {"__type": "AddedToken", **token}


@st.composite
def _map_token(draw: st.DrawFn) -> Any:
    """A special_tokens_map.json value: a string or an AddedToken object as save_pretrained writes it."""
    content = draw(st.sampled_from(POOL))
    if draw(st.booleans()):
        return content
    return {"content": content, **_flags(draw), **({"special": False} if draw(st.booleans()) else {})}


def _added_list(draw: st.DrawFn, first_id: int) -> list[dict[str, Any]]:
    contents = draw(st.lists(st.sampled_from(POOL), unique=True, max_size=4))
    return [
        {"id": first_id + i, "content": c, **_flags(draw), "special": draw(st.booleans())}
        for i, c in enumerate(contents)
    ]


@st.composite
def directories(draw: st.DrawFn) -> dict[str, Any]:
    """The files of one directory, as JSON values (None: the file is absent). One in five is `hostile`: shapes
    transformers refuses may appear (a special token neither a string nor a typed AddedToken, a string
    `extra_special_tokens`, a special_tokens_map.json that is not an object, a tokenizer.json without
    `added_tokens`)."""
    hostile = draw(st.integers(0, 4)) == 0
    config: dict[str, Any] = {"tokenizer_class": draw(st.sampled_from(CLASSES))}
    for name in NAMES:
        choice = draw(st.sampled_from(("absent", "null", "token")))
        if choice != "absent":
            config[name] = None if choice == "null" else draw(_config_token(hostile))
    if draw(st.booleans()):
        config["image_token"] = draw(_config_token())  # a model's own named token
    if draw(st.booleans()):
        config["added_tokens_decoder"] = {str(t.pop("id")): t for t in _added_list(draw, 259)}
    for key in ("extra_special_tokens", "additional_special_tokens"):
        shape = draw(st.sampled_from(("absent", "list", "dict", "str") if hostile else ("absent", "list", "dict")))
        if shape == "str":
            config[key] = draw(st.sampled_from(POOL))
        elif shape == "list":
            config[key] = draw(st.lists(_config_token(hostile), max_size=3))
        elif shape == "dict":
            config[key] = {"image_token": draw(st.sampled_from((*POOL, None) if hostile else POOL))}
    stm: Any = None
    if hostile and draw(st.booleans()):
        stm = [draw(_map_token())]  # not an object
    elif draw(st.booleans()):
        stm = {name: draw(_map_token()) for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3))}
        for key in ("additional_special_tokens", "extra_special_tokens"):
            if draw(st.booleans()):
                stm[key] = draw(st.lists(_map_token(), max_size=3))
    added_json = None
    if draw(st.booleans()):
        added_json = {c: 259 + i for i, c in enumerate(draw(st.lists(st.sampled_from(POOL), unique=True, max_size=3)))}
    file_added = None if hostile and draw(st.booleans()) else _added_list(draw, 259)
    padding = draw(st.one_of(st.none(), st.sampled_from(POOL)))
    return {"config": config, "stm": stm, "added_json": added_json, "file_added": file_added, "padding": padding}


def _write(root: Path, shape: dict[str, Any], base: dict[str, Any]) -> None:
    data = dict(base)
    if shape["file_added"] is not None:
        data["added_tokens"] = shape["file_added"]
    else:
        del data["added_tokens"]
    if shape["padding"] is not None:
        data["padding"] = {
            "strategy": "BatchLongest",
            "direction": "Right",
            "pad_to_multiple_of": None,
            "pad_id": 0,
            "pad_type_id": 0,
            "pad_token": shape["padding"],
        }
    (root / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    (root / "tokenizer_config.json").write_text(json.dumps(shape["config"]), encoding="utf-8")
    (root / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    if shape["stm"] is not None:
        (root / "special_tokens_map.json").write_text(json.dumps(shape["stm"]), encoding="utf-8")
    if shape["added_json"] is not None:
        (root / "added_tokens.json").write_text(json.dumps(shape["added_json"]), encoding="utf-8")


def _attempt(step: Any) -> Any:
    """A step's value, or the exception's type when the step raises."""
    try:
        return step()
    except Exception as exc:  # the shapes transformers (or ctxlock) refuses
        return type(exc)


def _reference(root: Path) -> dict[str, Any] | type:
    import transformers
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()
    tok = _attempt(lambda: AutoTokenizer.from_pretrained(str(root), local_files_only=True))
    if isinstance(tok, type):
        return tok

    def render() -> list[int]:
        out = tok.apply_chat_template([{"role": "user", "content": "k q"}], tokenize=True, return_dict=False)
        return [int(i) for i in (out["input_ids"] if hasattr(out, "input_ids") or isinstance(out, dict) else out)]

    return {
        "special": dict(tok.special_tokens_map),
        "added": {i: _state(t) for i, t in tok.added_tokens_decoder.items()},
        "probe": _attempt(lambda: tok.encode(PROBE, add_special_tokens=False)),
        "render": _attempt(render),
    }


def _state(t: Any) -> tuple[Any, ...]:
    get = t.get if isinstance(t, dict) else lambda k, d=None: getattr(t, k, d)
    return (get("content"), *(bool(get(k, False)) for k in (*FLAGS, "special")))


def _ours(root: Path) -> dict[str, Any]:
    model = ctxlock.load(str(root))
    added = json.loads(model.tokenizer._json_text).get("added_tokens") or []
    return {
        "special": dict(model.artifacts.special_tokens),
        "added": {int(t["id"]): _state(t) for t in added},
        "probe": _attempt(lambda: model.tokenizer.encode(PROBE, parse_special=True)),
        "render": _attempt(lambda: list(model.run({"messages": [{"role": "user", "content": "k q"}]}).tokenized.ids)),
    }


def _check(root: Path) -> None:
    """ctxlock against AutoTokenizer on one directory. A directory transformers cannot load, ctxlock refuses with
    ArtifactFormatError; a text transformers cannot encode (a BPE model meeting a character it lacks, with an unk
    token its vocabulary lacks too), ctxlock refuses with TokenizerError."""
    expected = _reference(root)
    if isinstance(expected, type):
        with pytest.raises(ArtifactFormatError):
            _ours(root)
        return
    got = _ours(root)
    for key in ("probe", "render"):
        if isinstance(expected[key], type):
            assert got[key] is TokenizerError, (key, expected[key])
            got[key] = expected[key]
    assert got == expected


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=directories())
def test_special_tokens_follow_transformers_sources(shape: dict[str, Any], base_tokenizer: dict[str, Any]) -> None:
    root = Path(tempfile.mkdtemp(prefix="ctxlock-hf-special-"))
    try:
        _write(root, shape, base_tokenizer)
        _check(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_special_tokens_map_over_a_config_without_added_tokens_decoder(tmp_path: Path) -> None:
    """The reported case: the qwen2 HF conversion (tokenizer_config.json without `added_tokens_decoder`, eos
    `<|endoftext|>`) with a special_tokens_map.json naming eos `<|im_end|>` and an additional `<extra_sp>`.
    transformers 5.24 lets the map win: the template writes `<|im_end|>` (151645), and `<extra_sp>` is one added
    token, 151936 (the figures AutoTokenizer gives on this directory)."""
    root = tmp_path / "qwen2"
    shutil.copytree(fetched.hf_tokenizer_dir("qwen2"), root, ignore=shutil.ignore_patterns(".*"))
    assert "added_tokens_decoder" not in json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
    stm = {"additional_special_tokens": ["<extra_sp>"], "eos_token": "<|im_end|>"}
    (root / "special_tokens_map.json").write_text(json.dumps(stm), encoding="utf-8")
    (root / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}", encoding="utf-8"
    )
    model = ctxlock.load(str(root))
    assert model.artifacts.special_tokens["eos_token"] == "<|im_end|>"
    run = model.run({"messages": [{"role": "user", "content": "hi"}]}, add_generation_prompt=False)
    assert run.rendered.text == "hi<|im_end|>"
    assert list(run.tokenized.ids) == [6023, 151645]
    assert model.tokenizer.encode("<extra_sp>", parse_special=True) == [151936]


def test_a_request_cannot_set_a_named_special_token_of_the_model(tmp_path: Path) -> None:
    """A model-specific named token (`image_token` in tokenizer_config.json) is a template variable, as in
    transformers; a request's chat_template_kwargs may not replace it (its value would take the control token's
    place), as it may not replace eos_token."""
    root = tmp_path / "qwen2"
    shutil.copytree(fetched.hf_tokenizer_dir("qwen2"), root, ignore=shutil.ignore_patterns(".*"))
    config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
    (root / "tokenizer_config.json").write_text(json.dumps(config | {"image_token": "<|vision_pad|>"}), "utf-8")
    (root / "chat_template.jinja").write_text("{% for m in messages %}{{ image_token }}{{ m.content }}{% endfor %}")
    model = ctxlock.load(str(root))
    request = {"messages": [{"role": "user", "content": "hi"}]}
    assert list(model.run(request, add_generation_prompt=False).tokenized.ids[:1]) == [151936]  # <|vision_pad|>
    for key in ("image_token", "eos_token"):
        with pytest.raises(RequestValidationError, match="reserved") as info:
            model.encode({**request, "chat_template_kwargs": {key: ""}})
        assert info.value.path == f"chat_template_kwargs.{key}"
