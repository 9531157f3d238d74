"""The incremental decoder on real vocabularies, against each tokenizer's own full `decode`.

The invariant (src/ctxlock/decode.py): after pushing generated ids g_1..g_k behind prompt P, the pieces so far
plus what `finish()` returns equal `decode(P + g[:k])[len(decode(P)):]`, whenever that ends on a complete
character; the pieces so far are always a prefix of the final text; `finish()` raises `IncompleteDecodeError`
exactly where the full decode shows a broken character at the end.

Vocabularies: byte-level BPE (qwen2, llama-bpe), SentencePiece with byte fallback through HF decoders (phi-3,
llama-spm, gemma-4), Tekken (the embedded mistral-nemo), tiktoken ranks (qwen.tiktoken) and a SentencePiece
model read by the sentencepiece library (mistral-common's v3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import mistral_common
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers.pre_tokenizers import ByteLevel

import fetched
from cli_runner import invoke
from ctxlock.artifacts import load_artifacts
from ctxlock.cli import detok as detok_cli
from ctxlock.errors import DecodeError, IncompleteDecodeError
from ctxlock.generation._decode import IncrementalDecoder, byte_level_table, decode_stream
from ctxlock.tokenizer import Tokenizer
from ctxlock.tokenizer.backends._sentencepiece import SentencePieceTokenizer
from ctxlock.tokenizer.backends._tiktoken_file import TIKTOKEN_PRESETS, TiktokenTokenizer
from hypothesis_profiles import examples

GGUF_VOCABS = ("qwen2", "llama-bpe", "phi-3", "llama-spm", "gemma-4")
VOCABS = (*GGUF_VOCABS, "mistral-nemo", "qwen.tiktoken", "mistral-v3-spm")
MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"


@pytest.fixture(scope="module")
def toks() -> dict[str, Tokenizer]:
    out: dict[str, Tokenizer] = {n: load_artifacts(fetched.gguf_path(n)).tokenizer for n in GGUF_VOCABS}
    out["mistral-nemo"] = load_artifacts("mistral-nemo").tokenizer
    out["qwen.tiktoken"] = TiktokenTokenizer(
        fetched.qwen_tiktoken_path(), **TIKTOKEN_PRESETS["qwen"], id="qwen/qwen.tiktoken"
    )
    out["mistral-v3-spm"] = SentencePieceTokenizer(
        MISTRAL_DATA / "mistral_instruct_tokenizer_240323.model.v3", id="mistral-v3"
    )
    return out


# ------------------------------------------------------------------------------------------------- oracle


def check_stream(tok: Tokenizer, gen: Sequence[int], prompt: Sequence[int] = (), skip: bool = False) -> list[str]:
    """Push `gen` behind `prompt` and check the invariant at every step against the tokenizer's own decode."""

    def full(ids: Sequence[int]) -> str:
        return tok.decode(list(ids), skip_special_tokens=skip)

    base = full(prompt)
    final = full([*prompt, *gen])
    dec = IncrementalDecoder(tok, prompt, skip_special_tokens=skip)
    if not final.startswith(base):
        # Only HF ByteFallback does this: ids that make a byte run open at the end of the prompt invalid turn the
        # prompt's last characters into U+FFFD. There is no continuation text to give; the decoder says so.
        with pytest.raises(DecodeError, match="rewrote text"):
            for i in gen:
                dec.push(i)
            dec.finish(errors="replace")
        return []
    expected = final[len(base) :]
    pieces: list[str] = []
    for k, i in enumerate(gen):
        pieces.append(dec.push(i))
        emitted = "".join(pieces)
        assert expected.startswith(emitted), (k, emitted, expected)
        # What finish() would return here: the rest of decode(prompt + gen[:k+1]), or an error exactly when the
        # full decode ends in a broken character.
        here = full([*prompt, *gen[: k + 1]])
        try:
            rest = dec.copy().finish()
        except IncompleteDecodeError:
            assert here.endswith("\ufffd"), (k, here)
        else:
            assert emitted + rest == here[len(base) :], (k, emitted, rest, here)
    try:
        pieces.append(dec.finish())
    except IncompleteDecodeError:
        assert final.endswith("\ufffd")
        return pieces
    assert "".join(pieces) == expected
    return pieces


# -------------------------------------------------------------------------------------------- strategies

FRAGMENTS = [
    "👩\u200d👩\u200d👧\u200d👦",  # a ZWJ family: 7 code points, 25 bytes
    "🏳️\u200d🌈",
    "👍🏽",
    "e\u0301",  # combining acute
    "a\u0300\u0323",
    "中文",
    "日本語のテキスト",
    "한국어",
    "مرحبا",
    "Ελληνικά",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "ﬁ",
    "…",
    "ÿ",
    " ",
    "  ",
    "    ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "Hello",
    " world",
    "\u200b",
    "x",
]
# Random unicode, minus surrogates (not encodable) and U+FFFD (so that any U+FFFD in the output is a bug).
CHARS = st.characters(codec="utf-8", exclude_characters="\ufffd")
TEXTS = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(CHARS, min_size=1, max_size=6)), min_size=1, max_size=8
).map("".join)
PROPERTY = settings(
    max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.parametrize("vocab", VOCABS)
@PROPERTY
@given(text=TEXTS)
def test_pieces_rebuild_the_full_decode(toks: dict[str, Tokenizer], vocab: str, text: str) -> None:
    tok = toks[vocab]
    ids = tok.encode(text)
    pieces = check_stream(tok, ids)
    assert len(pieces) == len(ids) + 1
    assert "\ufffd" not in "".join(pieces)  # valid text never shows a replacement character


@pytest.mark.parametrize("vocab", VOCABS)
@PROPERTY
@given(data=st.data(), text=TEXTS)
def test_primed_with_prompt_ids(toks: dict[str, Tokenizer], vocab: str, data: st.DataObject, text: str) -> None:
    tok = toks[vocab]
    ids = tok.encode(text, add_special_tokens=True)
    k = data.draw(st.integers(0, len(ids)), label="split")
    prompt, gen = ids[:k], ids[k:]
    try:
        IncrementalDecoder(tok, prompt)
    except DecodeError as exc:
        # Only a prompt cut inside a character is refused, and the message says where.
        assert tok.decode(prompt).endswith("\ufffd")
        assert exc.path is not None and exc.path.startswith("prompt_ids[")
        return
    pieces = check_stream(tok, gen, prompt)
    assert "\ufffd" not in "".join(pieces)


def _pool(tok: Tokenizer) -> list[int]:
    # Rare characters split into partial-byte tokens in every byte-level and byte-fallback vocabulary.
    ids = tok.encode("a 中 👩\u200d👦 𝔘 é ÿ\n ▁ ok")
    specials = [t.id for t in tok.added_tokens][:4]
    return sorted(set(ids + specials))


@pytest.mark.parametrize("vocab", VOCABS)
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), skip=st.booleans(), primed=st.booleans())
def test_arbitrary_ids_and_special_tokens(
    toks: dict[str, Tokenizer], vocab: str, data: st.DataObject, skip: bool, primed: bool
) -> None:
    """Any id sequence (broken UTF-8, specials between the bytes of a character, both skip modes) decodes
    incrementally exactly as the tokenizer decodes it whole."""
    tok = toks[vocab]
    gen = data.draw(st.lists(st.sampled_from(_pool(tok)), max_size=24), label="ids")
    prompt = tok.encode("Hello there", add_special_tokens=True) if primed else []
    check_stream(tok, gen, prompt, skip)


# ---------------------------------------------------------------------------------------------- unit tests


def test_byte_level_table_is_tokenizers_alphabet() -> None:
    table = byte_level_table()
    assert sorted(table.values()) == list(range(256))
    assert set(table) == set(ByteLevel.alphabet())
    assert table["Ġ"] == 0x20 and table["Ċ"] == 0x0A and table["!"] == 0x21


def test_sentencepiece_leading_space_needs_the_prompt(toks: dict[str, Tokenizer]) -> None:
    phi3 = toks["phi-3"]
    hello, world = phi3.token_to_id("▁Hello"), phi3.token_to_id("▁world")
    assert phi3.decode([world]) == "world"  # the decoder strips the first piece's space
    assert decode_stream(phi3, [world]) == ["world", ""]
    assert decode_stream(phi3, [world], prompt_ids=[hello]) == [" world", ""]
    assert phi3.decode([hello, world]) == "Hello world"


def test_first_token_that_is_only_a_space(toks: dict[str, Tokenizer]) -> None:
    phi3 = toks["phi-3"]
    ids = phi3.encode(" Hello")  # [▁, ▁Hello]: the Strip decoder eats one of the two spaces
    assert [phi3.id_to_token(i) for i in ids] == ["▁", "▁Hello"]
    assert decode_stream(phi3, ids) == ["", " Hello", ""]


def test_truncated_emoji_in_a_byte_level_vocab(toks: dict[str, Tokenizer]) -> None:
    qwen = toks["qwen2"]
    ids = qwen.encode("ok 👩")  # ... " \xf0\x9f\x91" "\xa9"
    dec = IncrementalDecoder(qwen)
    assert [dec.push(i) for i in ids[:-1]] == ["ok", ""]
    with pytest.raises(IncompleteDecodeError) as info:
        dec.finish()
    err = info.value
    assert err.path == "ids[1]"
    assert "f0 9f 91" in err.message and "token 1" in err.message
    assert qwen.decode(ids[:-1]).endswith("\ufffd")


def test_truncated_character_in_a_byte_fallback_vocab(toks: dict[str, Tokenizer]) -> None:
    phi3 = toks["phi-3"]
    f0, x9f = phi3.token_to_id("<0xF0>"), phi3.token_to_id("<0x9F>")
    text = phi3.encode("ab")
    ids = [*text, f0, x9f]
    dec = IncrementalDecoder(phi3)
    assert "".join(dec.push(i) for i in ids) == "ab"
    with pytest.raises(IncompleteDecodeError, match=f"bytes f0 9f from token {len(text)} on") as info:
        dec.finish()
    assert info.value.path == f"ids[{len(text)}]"
    # The decoder stays open; errors="replace" then gives what the tokenizer's own decode gives.
    assert dec.finish(errors="replace") == phi3.decode(ids)[2:] == "\ufffd\ufffd"


def test_truncated_character_in_tekken_and_tiktoken(toks: dict[str, Tokenizer]) -> None:
    for vocab in ("mistral-nemo", "qwen.tiktoken"):
        tok = toks[vocab]
        ids = tok.encode("x 𝔘")
        for cut in range(1, len(ids)):
            dec = IncrementalDecoder(tok)
            for i in ids[:cut]:
                dec.push(i)
            if tok.decode(ids[:cut]).endswith("\ufffd"):
                with pytest.raises(IncompleteDecodeError, match="f0"):
                    dec.finish()
            else:
                dec.finish()


def test_byte_fallback_run_is_final_only_when_it_ends(toks: dict[str, Tokenizer]) -> None:
    """HF's ByteFallback decodes a run of byte tokens at once and turns all of it into U+FFFD if any byte is
    invalid, so "中" must not be emitted while the run can still grow."""
    phi3 = toks["phi-3"]
    e4, b8, ad, x80 = (phi3.token_to_id(f"<0x{b:02X}>") for b in (0xE4, 0xB8, 0xAD, 0x80))
    assert phi3.decode([e4, b8, ad]) == "中"
    assert phi3.decode([e4, b8, ad, x80]) == "\ufffd" * 4
    assert decode_stream(phi3, [e4, b8, ad]) == ["", "", "", "中"]
    assert decode_stream(phi3, [e4, b8, ad, x80]) == ["", "", "", "", "\ufffd" * 4]
    world = phi3.token_to_id("▁world")
    assert decode_stream(phi3, [e4, b8, ad, world]) == ["", "", "", "中 world", ""]


def test_bytes_across_a_skipped_special_token(toks: dict[str, Tokenizer]) -> None:
    # HF drops a skipped special token before its decoder runs, so the bytes on both sides join ...
    qwen = toks["qwen2"]
    table = {b: c for c, b in byte_level_table().items()}
    e4, b8, ad = (qwen.token_to_id(table[b]) for b in (0xE4, 0xB8, 0xAD))
    im_end = qwen.token_to_id("<|im_end|>")
    ids = [e4, im_end, b8, ad]
    assert decode_stream(qwen, ids, skip_special_tokens=True) == ["", "", "", "中", ""]
    # Shown, the special token ends the character: E4 is broken for good, and so is each lone continuation byte.
    assert decode_stream(qwen, ids) == ["", "\ufffd<|im_end|>", "\ufffd", "\ufffd", ""]
    # ... while Tekken decodes the runs between special tokens separately.
    nemo = toks["mistral-nemo"]
    zh = nemo.encode("中")
    assert nemo.decode([*zh[:1], 3, *zh[1:]], skip_special_tokens=True) == nemo.decode(zh[:1]) + nemo.decode(zh[1:])
    check_stream(nemo, [*zh[:1], 3, *zh[1:]], skip=True)


def test_special_tokens_follow_decode(toks: dict[str, Tokenizer]) -> None:
    qwen = toks["qwen2"]
    ids = [*qwen.encode("Hi"), qwen.token_to_id("<|im_end|>"), *qwen.encode(" there")]
    assert "".join(decode_stream(qwen, ids)) == "Hi<|im_end|> there"
    assert "".join(decode_stream(qwen, ids, skip_special_tokens=True)) == "Hi there"


def test_bad_ids_are_typed_errors(toks: dict[str, Tokenizer]) -> None:
    qwen = toks["qwen2"]
    dec = IncrementalDecoder(qwen)
    dec.push(9707)
    for bad, needle in ((qwen.vocab_size, "not in the vocabulary"), (-1, "not in the vocabulary"), ("7", "not an")):
        with pytest.raises(DecodeError, match=needle) as info:
            dec.push(bad)
        assert info.value.path == "ids[1]"
    with pytest.raises(DecodeError, match="bool"):
        dec.push(True)
    with pytest.raises(DecodeError) as info:
        IncrementalDecoder(qwen, [9707, 10**9])
    assert info.value.path == "prompt_ids[1]"


def test_prompt_cut_inside_a_character_is_refused(toks: dict[str, Tokenizer]) -> None:
    qwen = toks["qwen2"]
    ids = qwen.encode("ok 👩")
    with pytest.raises(DecodeError, match="f0 9f 91") as info:
        IncrementalDecoder(qwen, ids[:-1])
    assert info.value.path == "prompt_ids[1]"


def test_push_or_finish_after_finish(toks: dict[str, Tokenizer]) -> None:
    dec = IncrementalDecoder(toks["qwen2"])
    dec.finish()
    with pytest.raises(DecodeError, match="after finish"):
        dec.push(9707)
    with pytest.raises(DecodeError, match="twice"):
        dec.finish()


def test_copy_is_independent(toks: dict[str, Tokenizer]) -> None:
    qwen = toks["qwen2"]
    ids = qwen.encode("a 👩 b")
    dec = IncrementalDecoder(qwen)
    dec.push(ids[0])
    dec.push(ids[1])  # inside the emoji
    look = dec.copy()
    with pytest.raises(IncompleteDecodeError):
        look.finish()
    rest = "".join(dec.push(i) for i in ids[2:]) + dec.finish()
    assert "a" + rest == qwen.decode(ids)


def test_unsupported_decoder_is_rejected() -> None:
    bert = load_artifacts(fetched.gguf_path("bert-bge")).tokenizer
    with pytest.raises(DecodeError, match="WordPiece decoder with cleanup"):
        IncrementalDecoder(bert)


def test_work_per_token_is_bounded(toks: dict[str, Tokenizer], monkeypatch: pytest.MonkeyPatch) -> None:
    """O(1) amortized: the ids handed to the tokenizer's decode grow linearly with the stream, not quadratically."""
    for vocab in ("qwen2", "phi-3"):
        tok = toks[vocab]
        prompt = tok.encode("Story: ", add_special_tokens=True)
        ids = tok.encode("中文 and English, 👩\u200d👦 emoji, e\u0301 marks.\n" * 100)
        decoded = 0
        real = tok.decode

        def counting(ids_: Sequence[int], *, skip_special_tokens: bool = False, _real=real) -> str:
            nonlocal decoded
            decoded += len(ids_)
            return _real(ids_, skip_special_tokens=skip_special_tokens)

        monkeypatch.setattr(tok, "decode", counting)
        assert "".join(decode_stream(tok, ids, prompt_ids=prompt)) == real(prompt + ids)[len(real(prompt)) :]
        monkeypatch.undo()
        assert len(ids) > 1000
        assert decoded < 40 * len(ids), (vocab, decoded, len(ids))


# ------------------------------------------------------------------------------------------------------ CLI

QWEN2 = str(fetched.gguf_path("qwen2"))


def run(*args: str, stdin: str = "") -> tuple[int, str, BaseException | None]:
    result = invoke(detok_cli.register, "detok", *args, stdin=stdin)
    return result.exit_code, result.stdout, result.exception


def run_output(*args: str) -> tuple[int, str]:
    result = invoke(detok_cli.register, "detok", *args)
    return result.exit_code, result.output


def test_cli_jsonl_prints_the_pieces(toks: dict[str, Tokenizer]) -> None:
    qwen = toks["qwen2"]
    lines = [qwen.encode("Hello, world"), qwen.encode("ok 👩"), []]
    stdin = "\n".join(json.dumps(ids) for ids in lines) + "\n\n"
    code, out, exc = run("--model", QWEN2, "--jsonl", stdin=stdin)
    assert code == 0, exc
    got = [json.loads(line) for line in out.splitlines()]
    assert got == [decode_stream(qwen, ids) for ids in lines]
    assert got[1] == ["ok", "", " 👩", ""]  # one piece per id, then the finish piece
    assert got[2] == [""]


def test_cli_prompt_ids_and_skip_special_tokens(toks: dict[str, Tokenizer]) -> None:
    phi3 = toks["phi-3"]
    path = str(fetched.gguf_path("phi-3"))
    world, end = phi3.token_to_id("▁world"), phi3.token_to_id("<|end|>")  # <|end|> is special, </s> is not
    hello = phi3.token_to_id("▁Hello")
    code, out, _ = run("--model", path, "--ids", json.dumps([world, end]), "--prompt-ids", json.dumps([hello]))
    assert code == 0 and json.loads(out) == [" world", "<|end|>", ""]
    code, out, _ = run("--model", path, "--ids", json.dumps([world, end]), "--skip-special-tokens")
    assert code == 0 and json.loads(out) == ["world", "", ""]


def test_cli_stop_strings(toks: dict[str, Tokenizer]) -> None:
    qwen = toks["qwen2"]
    ids = qwen.encode("reasoning</think>answer")
    code, out, _ = run("--model", QWEN2, "--ids", json.dumps(ids), "--stop", "</think>", "--stop", "zzz")
    assert code == 0
    pieces = json.loads(out)
    assert len(pieces) == len(ids) + 1 and "".join(pieces) == "reasoning"


@pytest.mark.parametrize(
    ("stdin", "error", "path", "needle"),
    [
        ("[1, 2]\nnot json\n", DecodeError, "stdin line 2 column 1", "invalid JSON"),
        ("[1, 2]\n" + "[" * 200 + "]" * 200 + "\n", DecodeError, "stdin line 2 $" + "[0]" * 128, "nested deeper"),
        ("[1, 2]\n[" + "7" * 4_400 + "]\n", DecodeError, "stdin line 2 $", "4300 digits"),
        ("[1, 2]\n[NaN]\n", DecodeError, "stdin line 2 $[0]", "not a finite JSON number"),
        ('[1, 2]\n["\\ud800"]\n', DecodeError, "stdin line 2 $[0]", "lone surrogate"),
        ('[1, 2]\n{"a": [1], "a": [2]}\n', DecodeError, "stdin line 2 $", 'duplicate key "a"'),
        ('[1, 2]\n{"ids": [1]}\n', DecodeError, "stdin line 2", "expected a JSON array"),
        ("[1, 2.5]\n", DecodeError, "stdin line 1[1]", "not an integer"),
        ("[1, true]\n", DecodeError, "stdin line 1[1]", "not an integer"),
        ("[1, 99999999]\n", DecodeError, "stdin line 1[1]", "not in the vocabulary"),
        ("[9707]\n[9707, 61804]\n", IncompleteDecodeError, "stdin line 2, ids[1]", "f0 9f 91"),
    ],
)
def test_cli_bad_lines(
    toks: dict[str, Tokenizer], stdin: str, error: type[DecodeError], path: str, needle: str
) -> None:
    code, out, exc = run("--model", QWEN2, "--jsonl", stdin=stdin)
    assert code == 1
    assert type(exc) is error
    assert isinstance(exc, DecodeError) and exc.path == path and needle in exc.message
    # The lines before the bad one were printed (the command streams).
    good = stdin.splitlines()[: int(path.split()[2].split(",")[0].split("[")[0]) - 1]
    assert [json.loads(line) for line in out.splitlines()] == [
        decode_stream(toks["qwen2"], json.loads(line)) for line in good
    ]


def test_cli_usage_errors() -> None:
    code, output = run_output("--model", QWEN2)
    assert code == 2 and "exactly one of --jsonl or --ids" in output
    code, output = run_output("--model", QWEN2, "--jsonl", "--ids", "[1]")
    assert code == 2 and "exactly one of --jsonl or --ids" in output
    code, _, exc = run("--model", QWEN2, "--ids", "[1]", "--stop", "")
    assert isinstance(exc, DecodeError) and exc.path == "--stop[0]"
    code, _, exc = run("--model", QWEN2, "--ids", "[1]", "--prompt-ids", "[9707, 61804]")
    assert isinstance(exc, DecodeError) and exc.path == "--prompt-ids[1]"


def test_cli_as_a_user_runs_it() -> None:
    """A real process through ctxlock's entry point: JSON on stdout; a bad line exits 1 with one clear line."""
    script = (
        "from ctxlock.cli import app, main\n"
        "from ctxlock.cli import detok\n"
        "if 'detok' not in {c.name or c.callback.__name__ for c in app.registered_commands}:\n"
        "    detok.register(app)\n"
        "main()\n"
    )
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script, "detok", "--model", QWEN2, "--jsonl"],
        input=b"[9707, 11, 1879]\n[9707, 61804]\n",
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    stdout, stderr = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 1
    assert stdout.splitlines() == ['["Hello", ",", " world", ""]']
    assert "Traceback" not in stderr
    assert stderr.startswith("error: IncompleteDecodeError: stdin line 2, ids[1]: ")
    assert "bytes f0 9f 91 from token 1" in stderr
