"""JSON-Schema token masks (llguidance over ctxlock's own tokenizers) and `ctxlock constrain`.

References:
- per-token bytes: llguidance's own reader of HF tokenizer.json files (transformers' conversion of the GGUF
  vocabularies, so independent of ctxlock's converter), mistral-common's `Tekkenizer.id_to_byte_piece`, the tiktoken
  ranks file itself, and every backend's own `decode`;
- masks: a brute-force scan of the real vocabulary for small grammars (an enum: the allowed first tokens are
  exactly the non-special tokens whose bytes are a prefix of some allowed output);
- outputs: `jsonschema` validates every completed sample, for 12 schemas x 200 seeded samples on Tekken (131K).
"""

from __future__ import annotations

import base64
import gc
import json
import random
import time
import weakref
from pathlib import Path

import jsonschema
import llguidance
import mistral_common
import numpy as np
import pytest
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

import fetched
from cli_runner import invoke
from ctxlock.artifacts import load_artifacts
from ctxlock.caches import clear_caches
from ctxlock.cli import constrain as constrain_cmds
from ctxlock.errors import ConstraintError, UnsupportedSchemaError
from ctxlock.generation._constrain import JsonSchemaMask, default_eos_id, guidance_vocab
from ctxlock.generation._sampler import DEFAULT_ORDER
from ctxlock.tokenizer._token_bytes import TokenBytes, byte_level_decoder_table, token_bytes
from ctxlock.tokenizer.backends._sentencepiece import SentencePieceTokenizer
from ctxlock.tokenizer.backends._tiktoken_file import TIKTOKEN_PRESETS, TiktokenTokenizer

SCHEMAS = sorted((Path(__file__).resolve().parents[1] / "data" / "schemas").glob("*.json"))
MISTRAL_DATA = Path(mistral_common.__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def nemo():
    return load_artifacts("mistral-nemo")


@pytest.fixture(scope="module")
def tekken(nemo):
    return nemo.tokenizer


@pytest.fixture(scope="module")
def qwen2():
    return load_artifacts(fetched.gguf_path("qwen2"))


def _mask(tokenizer, schema, **kw) -> JsonSchemaMask:
    return JsonSchemaMask(tokenizer, schema, **kw)


# ------------------------------------------------------------------------------------------- token bytes


def test_byte_level_table_is_gpt2s() -> None:
    table = byte_level_decoder_table()
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 0x20 and table["Ċ"] == 0x0A and table["!"] == 0x21 and table["ÿ"] == 0xFF
    assert table[chr(0x100)] == 0x00 and table[chr(0x143)] == 0xAD


@pytest.mark.parametrize("vocab", ["qwen2", "phi-3"])
def test_hf_token_bytes_match_llguidances_own_reader(vocab: str) -> None:
    """ctxlock's bytes for a tokenizer.json equal what llguidance reads from the same file itself."""
    directory = fetched.hf_tokenizer_dir(vocab)
    tok = load_artifacts(str(directory)).tokenizer
    mine = token_bytes(tok)
    ref = llguidance.LLTokenizer(str(directory / "tokenizer.json"))
    assert len(mine) == tok.vocab_size
    assert mine.scheme == {"qwen2": "byte-level", "phi-3": "metaspace"}[vocab]
    compared = 0
    for i in range(len(mine)):
        if ref.is_special_token(i):
            # llguidance marks control tokens special, and a token whose bytes start with 0xFF (its marker byte).
            assert i in mine.special or mine.pieces[i].startswith(b"\xff"), i
            continue
        assert ref.decode_bytes([i]) == mine.pieces[i], (i, tok.id_to_token(i))
        compared += 1
    assert compared > len(mine) - 300
    control = {t.id for t in tok.added_tokens if t.control}
    assert mine.special == control


def test_tekken_token_bytes_match_mistral_common(tekken) -> None:
    mine = token_bytes(tekken)
    ref = Tekkenizer.from_file(str(MISTRAL_DATA / "tekken_240911.json"))
    assert len(mine) == ref.n_words == 131072
    assert mine.special == frozenset(range(ref.num_special_tokens))
    for i in range(ref.n_words):
        assert mine.pieces[i] == ref.id_to_byte_piece(i, SpecialTokenPolicy.KEEP), i


def test_tiktoken_token_bytes_are_the_ranks_file() -> None:
    path = fetched.qwen_tiktoken_path()
    tok = TiktokenTokenizer(path, **TIKTOKEN_PRESETS["qwen"], id="qwen.tiktoken")
    mine = token_bytes(tok)
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            b64, rank = line.split()
            ranks[int(rank)] = base64.b64decode(b64)
    for rank, piece in ranks.items():
        assert mine.pieces[rank] == piece
    specials = TIKTOKEN_PRESETS["qwen"]["special_tokens"]
    assert mine.special == frozenset(specials.values())
    assert all(mine.pieces[i] == s.encode() for s, i in specials.items())


def test_sentencepiece_byte_fallback_pieces() -> None:
    tok = SentencePieceTokenizer(MISTRAL_DATA / "tokenizer.model.v1", id="v1")
    mine = token_bytes(tok)
    for b in (0x00, 0x0A, 0x7B, 0xE4, 0xFF):
        assert mine.pieces[tok.token_to_id(f"<0x{b:02X}>")] == bytes([b])
    assert mine.pieces[tok.token_to_id("▁the")] == b" the"
    assert {tok.bos_id, tok.eos_id, tok.unk_id} <= mine.special


def _decode_cases():
    return [
        ("tekken", lambda: load_artifacts("mistral-nemo").tokenizer),
        ("qwen2-gguf", lambda: load_artifacts(fetched.gguf_path("qwen2")).tokenizer),
        ("llama-spm-gguf", lambda: load_artifacts(fetched.gguf_path("llama-spm")).tokenizer),
        ("gemma-4-gguf", lambda: load_artifacts(fetched.gguf_path("gemma-4")).tokenizer),
        (
            "sentencepiece-v3",
            lambda: SentencePieceTokenizer(MISTRAL_DATA / "mistral_instruct_tokenizer_240323.model.v3", id="v3"),
        ),
        (
            "tiktoken-qwen",
            lambda: TiktokenTokenizer(fetched.qwen_tiktoken_path(), **TIKTOKEN_PRESETS["qwen"], id="q"),
        ),
    ]


@pytest.mark.parametrize(("name", "make"), _decode_cases(), ids=[n for n, _ in _decode_cases()])
def test_token_bytes_agree_with_decode(name, make) -> None:
    """For ids whose bytes are valid UTF-8, joining the bytes of a random id sequence gives `decode`'s text
    (SentencePiece-style decoders drop the dummy-prefix space at the start; that is the only difference)."""
    tok = make()
    tb = token_bytes(tok)
    text_ids = []
    for i, piece in enumerate(tb.pieces):
        if i in tb.special or not piece:
            continue
        try:
            piece.decode("utf-8")
        except UnicodeDecodeError:
            continue
        text_ids.append(i)
    assert len(text_ids) > 0.9 * len(tb) - 1000
    strip_space = tb.scheme in ("metaspace", "sentencepiece")
    rng = random.Random(6)
    for _ in range(400):
        ids = [rng.choice(text_ids) for _ in range(rng.randint(1, 16))]
        mine = tb.join(ids).decode("utf-8")
        ref = tok.decode(ids)
        if strip_space:
            mine, ref = mine.removeprefix(" "), ref.removeprefix(" ")
        assert mine == ref, ids


def test_wordpiece_vocabularies_are_refused() -> None:
    tok = load_artifacts(fetched.gguf_path("bert-bge")).tokenizer
    with pytest.raises(ConstraintError, match="WordPiece"):
        token_bytes(tok)


def test_token_bytes_join_skips_control_tokens(tekken) -> None:
    tb = token_bytes(tekken)
    assert isinstance(tb, TokenBytes)
    ids = tekken.encode_text('{"a":1}', at_start=True)
    assert tb.join([1, *ids, 2]) == b'{"a":1}'


# ------------------------------------------------------------------------------------------- the mask


def test_enum_mask_is_exactly_the_prefix_tokens(tekken) -> None:
    """Brute force over the real 131K vocabulary, at every step of '"green"': the allowed tokens are the
    non-special tokens that extend the bytes so far to a prefix of some allowed output, plus EOS exactly when
    the bytes so far are a whole output; nothing else (no control token)."""
    outputs = [b'"red"', b'"green"', b'"greenish"', b'"blue"', b"42"]
    m = _mask(tekken, {"enum": ["red", "green", "greenish", "blue", 42]}, eos_id=2)
    tb = m.vocab.token_bytes
    text = [(i, p) for i, p in enumerate(tb.pieces) if p and i not in tb.special]
    sizes = []
    for tid in [*tekken.encode_text('"green"', at_start=True), 2]:
        done = m.text_bytes()
        expected = [i for i, p in text if any(o.startswith(done + p) for o in outputs)]
        expected = sorted(expected + ([2] if done in outputs else []))
        assert m.allowed_ids().tolist() == expected, done
        sizes.append(len(expected))
        m.consume(tid)
    assert m.text_bytes() == b'"green"' and m.is_stopped()
    assert max(sizes) >= 5  # '"' then 'red', 'green', 'gre', 'blue', 'b', ...


def test_control_tokens_never_allowed_inside_json_text(tekken) -> None:
    m = _mask(tekken, {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}, eos_id=2)
    for tid in tekken.encode_text('{"s":"', at_start=True):
        m.consume(tid)
    allowed = m.mask()
    assert allowed.sum() > 100_000  # inside a free string nearly every token is text
    assert not allowed[:1000].any()  # Tekken's 1000 control ids, EOS included
    assert not m.is_complete()


def test_mask_is_read_only_and_bitmask_layout(tekken) -> None:
    m = _mask(tekken, {"type": "integer"}, eos_id=2)
    allowed = m.mask()
    with pytest.raises(ValueError):
        allowed[0] = True
    words = m.bitmask()
    assert words.dtype == np.int32 and words.size == (m.vocab_size + 31) // 32
    unpacked = [(int(words[i // 32]) >> (i % 32)) & 1 for i in range(m.vocab_size)]
    assert np.array_equal(np.array(unpacked, dtype=bool), allowed)


def test_consume_disallowed_token_names_id_and_step_and_changes_nothing(tekken) -> None:
    m = _mask(tekken, {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}, eos_id=2)
    ids = tekken.encode_text('{"n":', at_start=True)
    for tid in ids:
        m.consume(tid)
    before = m.mask().copy()
    letter = tekken.encode_text("x", at_start=True)[0]
    with pytest.raises(ConstraintError) as err:
        m.consume(letter)
    assert f"token {letter}" in err.value.message and f"step {len(ids)}" in err.value.message
    assert err.value.path == f"step {len(ids)}"
    with pytest.raises(ConstraintError, match="outside the vocabulary"):
        m.consume(m.vocab_size)
    with pytest.raises(ConstraintError):
        m.consume(2)  # EOS before the value is complete
    assert np.array_equal(m.mask(), before) and m.steps == len(ids)
    for tid in tekken.encode_text("7}", at_start=True):
        m.consume(tid)  # the matcher still works
    assert m.is_stopped()
    with pytest.raises(ConstraintError, match="the value is complete"):
        m.consume(letter)


def test_rollback_restores_the_exact_mask(tekken) -> None:
    schema = json.loads((SCHEMAS[0].parent / "orders.json").read_text())
    m = _mask(tekken, schema, eos_id=2)
    text = '{"orders":[{"id":12,"lines":[{"sku":"ab","qty":3},{"sku":"xyz","qty":9}]},{"id":7,"lines":[]}]}'
    ids = tekken.encode_text(text, at_start=True)
    masks = []
    for tid in ids:
        masks.append(m.bitmask())
        m.consume(tid)
    assert m.is_stopped()
    final = m.bitmask()
    for n in (1, 5, len(ids) // 2, len(ids)):
        m.rollback(n)
        assert m.steps == len(ids) - n
        assert np.array_equal(m.bitmask(), masks[len(ids) - n]), n
        for tid in ids[len(ids) - n :]:
            m.consume(tid)
        assert np.array_equal(m.bitmask(), final)
    m.reset()
    assert m.steps == 0 and np.array_equal(m.bitmask(), masks[0])
    with pytest.raises(ConstraintError, match="cannot roll back"):
        m.rollback(1)


def test_eos_is_allowed_exactly_when_complete(tekken) -> None:
    m = _mask(tekken, {"type": "integer", "minimum": 0, "maximum": 500}, eos_id=2)
    assert not m.mask()[2] and not m.is_complete()
    for tid in tekken.encode_text("12", at_start=True):
        m.consume(tid)
    assert m.is_complete() and m.mask()[2] and not m.is_stopped()  # "123" could follow
    m.consume(2)
    assert m.is_stopped()


@pytest.mark.parametrize(
    ("schema", "path", "needle"),
    [
        (
            {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
            "properties.tags.uniqueItems",
            "uniqueItems",
        ),
        ({"type": "array", "items": {"not": {"type": "string"}}}, "items.not", "not"),
        ({"type": "array", "contains": {"type": "integer"}}, "contains", "contains"),
        ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if", "if"),
        (
            {"type": "object", "properties": {"id": {"type": "string", "pattern": "^(?=a)ab$"}}},
            "properties.id.pattern",
            "look-around",
        ),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired", "dependentRequired"),
        ({"type": "string", "format": "x-unknown"}, "format", "x-unknown"),
        ({"type": "array", "minItems": 3, "maxItems": 1}, "$", "Unsatisfiable"),
    ],
)
def test_unsupported_schema_features_are_rejected(tekken, schema, path, needle) -> None:
    with pytest.raises(UnsupportedSchemaError) as err:
        _mask(tekken, schema, eos_id=2, source="s.json")
    assert err.value.path.startswith("s.json:")
    assert path in err.value.path.split(":", 1)[1].split(", ")
    assert needle in err.value.message
    assert "llguidance" in err.value.message and err.value.hint


def test_lenient_mode_cannot_be_switched_on_by_the_schema(tekken) -> None:
    """llguidance's `lenient` would drop `uniqueItems` silently; a schema's own x-guidance options are refused."""
    schema = {"type": "array", "uniqueItems": True, "x-guidance": {"lenient": True}}
    lenient = llguidance.LLMatcher(
        guidance_vocab(tekken, 2)[0].ll_tokenizer, llguidance.LLMatcher.grammar_from_json_schema(schema)
    )
    assert not lenient.is_error()  # what ctxlock refuses to do
    with pytest.raises(ConstraintError, match="x-guidance") as err:
        _mask(tekken, schema, eos_id=2)
    assert err.value.path == '$["x-guidance"]'
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):
        _mask(tekken, {"type": "array", "uniqueItems": True}, eos_id=2)


def test_boolean_schemas(tekken) -> None:
    anything = _mask(tekken, True, eos_id=2)
    for tid in tekken.encode_text('[1,{"a":null}]', at_start=True):
        anything.consume(tid)
    assert anything.is_stopped()
    with pytest.raises(UnsupportedSchemaError, match="accepts no value"):
        _mask(tekken, False, eos_id=2)


def test_invalid_schemas_are_constraint_errors(tekken) -> None:
    with pytest.raises(ConstraintError, match="not a valid JSON Schema") as err:
        _mask(tekken, {"type": "object", "properties": {"a": {"type": "strng"}}}, eos_id=2, source="x.json")
    assert err.value.path == "x.json:properties.a.type"
    with pytest.raises(ConstraintError, match="not valid JSON"):
        _mask(tekken, "{not json", eos_id=2)
    with pytest.raises(ConstraintError, match="object or a boolean"):
        _mask(tekken, [1, 2], eos_id=2)
    with pytest.raises(ConstraintError, match="whitespace"):
        _mask(tekken, {"type": "integer"}, eos_id=2, whitespace="pretty")


def test_eos_resolution(tekken, nemo, qwen2) -> None:
    assert default_eos_id(tekken) == 2
    assert default_eos_id(tekken, nemo.special_tokens) == 2
    assert default_eos_id(qwen2.tokenizer, qwen2.special_tokens) == qwen2.tokenizer.token_to_id("<|endoftext|>")
    with pytest.raises(ConstraintError, match="end-of-sequence"):
        default_eos_id(qwen2.tokenizer)
    with pytest.raises(ConstraintError, match="outside the vocabulary"):
        _mask(tekken, {"type": "integer"}, eos_id=10**9)


def test_whitespace_modes(tekken) -> None:
    compact = _mask(tekken, {"type": "object"}, eos_id=2)
    flexible = _mask(tekken, {"type": "object"}, eos_id=2, whitespace="flexible")
    brace = tekken.encode_text("{", at_start=True)
    for m in (compact, flexible):
        for tid in brace:
            m.consume(tid)
    newline = tekken.encode_text("\n", at_start=True)[0]
    assert not compact.mask()[newline] and flexible.mask()[newline]


@pytest.mark.parametrize("vocab", ["llama-spm", "qwen2"])
def test_llguidance_tokenizes_to_exact_bytes(vocab) -> None:
    """llguidance tokenizes forced text through ctxlock's encoder; a SentencePiece dummy prefix would add a space
    (`{` -> `▁{`) and make llguidance's mask and matcher disagree, so those runs fall back to exact greedy ids."""
    arts = load_artifacts(fetched.gguf_path(vocab))
    ll = guidance_vocab(arts.tokenizer, default_eos_id(arts.tokenizer, arts.special_tokens))[0].ll_tokenizer
    for text in ['{"name":"get_weather"', "42", '"a b"', "é{}"]:
        ids = ll.tokenize_str(text)
        assert ll.decode_bytes(ids) == text.encode("utf-8"), (vocab, text)
        if vocab == "qwen2":  # byte-level BPE is byte-exact already: the canonical ids
            assert ids == arts.tokenizer.encode_text(text, at_start=False)


def test_a_vocabulary_the_cache_lets_go_is_freed() -> None:
    # llguidance's native LLTokenizer holds ctxlock's encoder; the encoder must not hold it back, or the pair (and
    # the whole vocabulary) outlives the cache. Five vocabularies through a cache of four: every one is freed.
    probes = []
    for name in ("gpt-2", "llama-bpe", "starcoder", "falcon", "refact"):
        tokenizer = load_artifacts(fetched.gguf_path(name)).tokenizer
        probes.append(weakref.ref(tokenizer))
        mask = _mask(tokenizer, {"type": "integer"}, eos_id=0)  # any non-empty id will do
        mask.consume(tokenizer.encode_text("1", at_start=False)[0])
        del mask, tokenizer
    clear_caches()
    gc.collect()
    assert [p() for p in probes] == [None] * len(probes)


def test_vocabulary_conversion_is_cached_and_timed(tekken) -> None:
    first = _mask(tekken, {"type": "integer"}, eos_id=2)
    second = _mask(tekken, {"type": "boolean"}, eos_id=2)
    assert second.tokenizer_cached and second.vocab is first.vocab
    for tid in tekken.encode_text("true", at_start=True):
        second.consume(tid)
    stats = second.stats()
    assert stats.tokenizer_cached and stats.tokenizer_seconds > 0 and stats.compile_seconds > 0
    assert stats.mask_calls == len(second.mask_seconds) >= 1
    assert 0 < stats.mask_median_seconds <= stats.mask_p99_seconds <= stats.mask_max_seconds
    assert set(stats.to_dict()) >= {"tokenizer_seconds", "compile_seconds", "mask_median_seconds", "mask_p99_seconds"}


# ------------------------------------------------------------------------------------------- the CLI


def _run(*args: str) -> tuple[list[dict], dict, object]:
    result = invoke(constrain_cmds.register, "constrain", *args)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    samples = [line for line in lines if "summary" not in line]
    summary = next((line["summary"] for line in lines if "summary" in line), None)
    return samples, summary, result


def test_two_hundred_samples_per_schema_all_validate(tekken) -> None:
    """12 schemas x 200 seeded samples on the embedded Tekken vocabulary (131K): every completed output validates,
    at least half complete within 128 tokens, and nothing cut at --max-tokens is called valid."""
    assert len(SCHEMAS) >= 10
    t0 = time.perf_counter()
    report = {}
    for path in SCHEMAS:
        schema = json.loads(path.read_text())
        validator = jsonschema.Draft202012Validator(
            schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
        samples, summary, result = _run(
            "--schema", str(path), "--samples", "200", "--seed", "11", "--max-tokens", "128"
        )
        assert result.exit_code == 0, (path.name, result.output[-2000:], result.exception)
        assert len(samples) == 200 and [s["index"] for s in samples] == list(range(200))
        stops = [s for s in samples if s["finish_reason"] == "stop"]
        for s in samples:
            if s["finish_reason"] == "stop":
                assert s["valid"] and s["complete"], (path.name, s)
                validator.validate(json.loads(s["text"]))  # independently of the CLI's own check
            else:
                assert s["finish_reason"] == "length" and s["tokens"] == 128
                assert not s["valid"] and not s["complete"]
        assert len(stops) >= 100, (path.name, len(stops))
        assert summary["finish_reason"]["stop"] == len(stops) and summary["valid"] == len(stops)
        assert summary["sampler"]["order"] == list(DEFAULT_ORDER) and len(summary["sampler"]["digest"]) == 64
        report[path.stem] = (len(stops), summary["tokens"]["median"], summary["timings"]["mask_p99_ms"])
    elapsed = time.perf_counter() - t0
    print(f"\n12x200 samples in {elapsed:.1f} s: {report}")


def test_length_cut_samples_are_incomplete_never_valid(tmp_path) -> None:
    schema = tmp_path / "free_string.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}))
    samples, summary, result = _run("--schema", str(schema), "--samples", "30", "--seed", "3", "--max-tokens", "6")
    assert result.exit_code == 0, result.output
    assert summary["finish_reason"]["length"] >= 25  # a free string under random logits rarely closes in 6 tokens
    for s in samples:
        if s["finish_reason"] == "length":
            assert s["tokens"] == 6 and s["valid"] is False and s["complete"] is False
            with pytest.raises(ValueError):
                json.loads(s["text"])


def test_cli_is_deterministic_and_reports_the_sampler(tmp_path) -> None:
    args = ("--schema", str(SCHEMAS[0]), "--samples", "8", "--seed", "5", "--top-k", "50", "--top-p", "0.9")
    a, summary_a, _ = _run(*args)
    b, summary_b, _ = _run(*args)
    assert a == b and summary_a["sampler"] == summary_b["sampler"]
    assert summary_a["sampler"]["top_k"] == 50 and summary_a["sampler"]["top_p"] == 0.9
    _, summary_c, _ = _run(*args, "--order", "repetition_penalty,temperature,min_p,top_k,top_p")
    assert summary_c["sampler"]["order"] == ["repetition_penalty", "temperature", "min_p", "top_k", "top_p"]
    assert summary_c["sampler"]["digest"] != summary_a["sampler"]["digest"]
    timings = summary_a["timings"]
    assert {"compile_seconds", "mask_median_ms", "mask_p99_ms", "tokenizer_seconds"} <= set(timings)
    d, _, _ = _run("--schema", str(SCHEMAS[0]), "--samples", "8", "--seed", "6")
    assert [s["text"] for s in d] != [s["text"] for s in a]


def test_cli_rejects_unsupported_schema_and_bad_sampler_options(tmp_path) -> None:
    schema = tmp_path / "unique.json"
    schema.write_text(json.dumps({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}))
    _, _, result = _run("--schema", str(schema))
    assert isinstance(result.exception, UnsupportedSchemaError)
    assert result.exception.path == f"{schema}:uniqueItems"
    _, _, result = _run("--schema", str(SCHEMAS[0]), "--top-p", "0")
    assert result.exit_code == 2 and "top_p" in result.output
    _, _, result = _run("--schema", str(SCHEMAS[0]), "--order", "temperature,top_p", "--top-k", "5")
    assert result.exit_code == 2 and "top_k" in result.output


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("qwen2 gguf (byte-level BPE, 151K)", lambda: str(fetched.gguf_path("qwen2"))),
        ("llama-spm gguf (SentencePiece BPE, byte fallback)", lambda: str(fetched.gguf_path("llama-spm"))),
        ("gemma-4 gguf (262K)", lambda: str(fetched.gguf_path("gemma-4"))),
    ],
    ids=["qwen2", "llama-spm", "gemma-4"],
)
def test_other_vocabularies_give_valid_json(name, model) -> None:
    for path in (SCHEMAS[0].parent / "tool_call.json", SCHEMAS[0].parent / "orders.json"):
        _, summary, result = _run("--model", model(), "--schema", str(path), "--samples", "25", "--seed", "2")
        assert result.exit_code == 0, (name, result.output[-1500:], result.exception)
        assert summary["finish_reason"]["stop"] >= 20 and summary["valid"] == summary["finish_reason"]["stop"]
