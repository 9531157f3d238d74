"""Stop strings: the emitted text is the whole text cut at the first stop, however the stream is chunked.

The oracle is plain `str.find` on the whole text: the smallest start over all stops, the longest stop among those
that start there. The matcher must agree for every chunking (random splits, and the pieces real tokenizers
produce), never emit any part of a stop, and hold back only what could still begin a stop.
"""

from __future__ import annotations

import itertools
import json

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import fetched
from ctxlock.artifacts import load_artifacts
from ctxlock.cli import detok as detok_cli
from ctxlock.errors import DecodeError, IncompleteDecodeError
from ctxlock.generation._decode import Detokenized, Detokenizer, StopMatch, StopMatcher, decode_stream, stream_text
from ctxlock.tokenizer import Tokenizer
from hypothesis_profiles import examples


def oracle(text: str, stops: list[str]) -> tuple[str, StopMatch | None]:
    found = [(text.find(s), -len(s), s) for s in stops if text.find(s) >= 0]
    if not found:
        return text, None
    start, _, stop = min(found)
    return text[:start], StopMatch(stop, start)


def run_chunks(chunks: list[str], stops: list[str]) -> tuple[str, StopMatch | None, list[str]]:
    m = StopMatcher(stops)
    out = [m.push(c) for c in chunks]
    out.append(m.finish())
    return "".join(out), m.matched, out


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


# A small alphabet makes overlapping and nested stops, and near misses, frequent.
SMALL = st.text(st.sampled_from("ab</>k \n中👩"), max_size=30)
STOPS = st.lists(st.text(st.sampled_from("ab</>k中"), min_size=1, max_size=4), min_size=1, max_size=4)


@settings(max_examples=examples(400), deadline=None)
@given(text=SMALL, stops=STOPS, cuts=st.lists(st.integers(0, 40), max_size=12))
def test_random_chunking_matches_the_oracle(text: str, stops: list[str], cuts: list[int]) -> None:
    expected, match = oracle(text, stops)
    emitted, matched, pieces = run_chunks(split(text, cuts), stops)
    assert emitted == expected
    assert matched == match
    # Never a part of the stop: the emitted text is a prefix of the text before the cut, piece by piece.
    assert all(expected.startswith("".join(pieces[: k + 1])) for k in range(len(pieces)))


@settings(max_examples=examples(200), deadline=None)
@given(text=SMALL, stops=STOPS)
def test_one_character_at_a_time_and_all_at_once_agree(text: str, stops: list[str]) -> None:
    assert run_chunks(list(text), stops)[:2] == run_chunks([text], stops)[:2] == oracle(text, stops)


@settings(max_examples=examples(200), deadline=None)
@given(text=SMALL, stops=STOPS, cuts=st.lists(st.integers(0, 40), max_size=12))
def test_held_back_is_exactly_the_longest_suffix_that_begins_a_stop(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    m = StopMatcher(stops)
    pending = ""
    for chunk in split(text, cuts):
        pending += chunk
        pending = pending[len(m.push(chunk)) :]
        if m.matched is not None:
            return
        assert pending == m.held
        # The longest suffix that is a proper prefix of a stop (a complete stop would have matched or is waiting
        # for a longer stop that starts at the same place, which is again a proper prefix).
        longest = max(
            (k for k in range(len(pending) + 1) if any(s.startswith(pending[len(pending) - k :]) for s in stops)),
            default=0,
        )
        assert len(m.held) == longest


# ------------------------------------------------------------------------------------- real token pieces


@pytest.fixture(scope="module")
def toks() -> dict[str, Tokenizer]:
    out = {n: load_artifacts(fetched.gguf_path(n)).tokenizer for n in ("qwen2", "phi-3")}
    out["mistral-nemo"] = load_artifacts("mistral-nemo").tokenizer
    return out


REAL_TEXT = st.lists(
    st.sampled_from(
        [
            "<think>",
            "</think>",
            "</",
            "think",
            ">",
            "<",
            " ",
            "\n\n",
            "###",
            "##",
            "Answer:",
            "中文",
            "👩\u200d👦",
            "ab",
            "a",
        ]
    ),
    max_size=16,
).map("".join)
REAL_STOPS = st.lists(
    st.sampled_from(["</think>", "\n\n", "###", "Answer:", "中", "👦", "a</", "</think>\n\n", "think"]),
    min_size=1,
    max_size=3,
)


@pytest.mark.parametrize("vocab", ["qwen2", "phi-3", "mistral-nemo"])
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=REAL_TEXT, stops=REAL_STOPS)
def test_real_tokenizer_pieces_match_the_oracle(
    toks: dict[str, Tokenizer], vocab: str, text: str, stops: list[str]
) -> None:
    tok = toks[vocab]
    ids = tok.encode(text)
    full = tok.decode(ids)
    expected, match = oracle(full, stops)
    # The token pieces as chunks ...
    emitted, matched, _ = run_chunks(decode_stream(tok, ids), stops)
    assert (emitted, matched) == (expected, match)
    # ... and ids straight through the Detokenizer.
    result = stream_text(tok, ids, stop=stops)
    assert (result.text, result.stop) == (expected, match)
    assert result.finish_reason == ("stop" if match else None)
    assert len(result.pieces) == len(ids) + 1


# ------------------------------------------------------------------------------------------------ units


def test_think_tag_split_across_tokens() -> None:
    """vLLM #45636: a holdback by character count split `</think>`. Holding back by prefix never does."""
    m = StopMatcher(["</think>"])
    assert m.push("reason") == "reason"
    assert m.push("ing</") == "ing" and m.held == "</"
    assert m.push("think") == "" and m.held == "</think"
    assert m.push(">answer") == ""
    assert m.matched == StopMatch("</think>", 9)
    assert m.push("more") == "" and m.finish() == ""


def test_holdback_is_a_prefix_match_not_a_character_count() -> None:
    m = StopMatcher(["</think>"])
    assert m.push("x </thi") == "x " and m.held == "</thi"
    assert m.push("s is not it") == "</this is not it" and m.held == ""
    assert m.push("a <") == "a " and m.held == "<"  # "<" could begin the stop ...
    assert m.push(" b") == "< b"  # ... "< " cannot, so it goes out at once
    assert m.push("(") == "("  # nothing is held back for text that cannot begin a stop
    assert m.finish() == "" and m.matched is None


def test_overlapping_stops() -> None:
    assert run_chunks(["a", "b", "c"], ["ab", "bc"])[:2] == ("", StopMatch("ab", 0))
    assert run_chunks(["xb", "c"], ["ab", "bc"])[:2] == ("x", StopMatch("bc", 1))
    # "aab": the stop "ab" at 1 must wait while "aab" at 0 can still complete.
    m = StopMatcher(["aab", "ab"])
    assert [m.push(c) for c in "aa"] == ["", ""]
    assert m.push("b") == "" and m.matched == StopMatch("aab", 0)
    assert run_chunks(["xa", "ab"], ["aab", "ab"])[:2] == ("x", StopMatch("aab", 1))
    assert run_chunks(["a", "a", "c", "ab"], ["aab", "ab"])[:2] == ("aac", StopMatch("ab", 3))


def test_a_later_stop_that_starts_earlier_wins() -> None:
    # "bc" completes first, but "abcd" started earlier: wait, then cut at the earlier start.
    m = StopMatcher(["abcd", "bc"])
    assert m.push("xabc") == "x" and m.matched is None
    assert m.push("d") == "" and m.matched == StopMatch("abcd", 1)
    m = StopMatcher(["abcd", "bc"])
    assert m.push("xabc") == "x"
    assert m.push("X") == "a" and m.matched == StopMatch("bc", 2)


def test_stops_that_are_prefixes_of_each_other() -> None:
    assert run_chunks(["ab", "c"], ["ab", "abc"])[:2] == ("", StopMatch("abc", 0))
    assert run_chunks(["ab", "d"], ["ab", "abc"])[:2] == ("", StopMatch("ab", 0))
    # The end of the stream confirms the shorter one.
    m = StopMatcher(["abc", "ab"])
    assert m.push("xab") == "x" and m.matched is None
    assert m.finish() == "" and m.matched == StopMatch("ab", 1)


def test_stop_spanning_many_tokens(toks: dict[str, Tokenizer]) -> None:
    tok = toks["qwen2"]
    stop = "and they lived happily ever after"
    ids = tok.encode(f"The end: {stop}. Epilogue follows.")
    pieces = decode_stream(tok, ids)
    assert sum(1 for p in pieces if p and p in stop) >= 5  # the stop really spans many tokens
    result = stream_text(tok, ids, stop=[stop])
    assert result == Detokenized(result.pieces, "The end: ", "stop", StopMatch(stop, 9))
    assert "".join(result.pieces) == "The end: "
    assert all(p == "" for p in result.pieces[4:])


def test_finish_flushes_the_held_text() -> None:
    m = StopMatcher(["<|end|>"])
    assert m.push("bye <|en") == "bye "
    assert m.finish() == "<|en" and m.matched is None


def test_duplicate_and_no_stops() -> None:
    assert run_chunks(["a", "b"], [])[:2] == ("ab", None)
    assert StopMatcher(["x", "x"]).stops == ("x",)


def test_invalid_stop_strings() -> None:
    with pytest.raises(DecodeError, match="must not be empty") as info:
        StopMatcher(["ok", ""])
    assert info.value.path == "stop[1]"
    with pytest.raises(DecodeError, match="not one string"):
        StopMatcher("</s>")  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match="must be a string"):
        StopMatcher([1])  # type: ignore[list-item]
    m = StopMatcher(["x"])
    m.finish()
    with pytest.raises(DecodeError, match="after finish"):
        m.push("a")


def test_detokenizer_reports_the_stop(toks: dict[str, Tokenizer]) -> None:
    tok = toks["mistral-nemo"]
    det = Detokenizer(tok, stop=["\n\n"])
    ids = tok.encode("First paragraph.\n\nSecond.")
    text = "".join(det.push(i) for i in ids) + det.finish()
    assert text == "First paragraph."
    assert det.finish_reason == "stop" and det.matched == StopMatch("\n\n", 16)
    plain = stream_text(tok, ids)
    assert plain.finish_reason is None and plain.stop is None and plain.text == tok.decode(ids)


def test_unfinished_character_after_a_stop_is_not_an_error(toks: dict[str, Tokenizer]) -> None:
    tok = toks["qwen2"]
    ids = tok.encode("done. 👩")[:-1]  # ends inside the emoji
    with pytest.raises(IncompleteDecodeError):
        stream_text(tok, ids)
    assert stream_text(tok, ids, stop=["."]).text == "done"
    # A stop confirmed only by the end of the stream ("ab" waits while "ab 👩" could follow), before the broken
    # character: the stop wins, no error.
    ids = [*tok.encode("xab"), tok.encode(" 👩")[0]]
    result = stream_text(tok, ids, stop=["ab", "ab 👩"])
    assert (result.text, result.stop) == ("x", StopMatch("ab", 1))


def test_cli_stop(toks: dict[str, Tokenizer]) -> None:
    app = typer.Typer(pretty_exceptions_enable=False)
    detok_cli.register(app)
    app.command("noop")(lambda: None)
    tok = toks["qwen2"]
    lines = [tok.encode("one</think>two"), tok.encode("no stop here <"), tok.encode("a\n\nb")]
    stdin = "".join(json.dumps(ids) + "\n" for ids in lines)
    model = str(fetched.gguf_path("qwen2"))
    result = CliRunner().invoke(
        app, ["detok", "-m", model, "--jsonl", "--stop", "</think>", "--stop", "\n\n"], input=stdin
    )
    assert result.exit_code == 0, result.exception
    got = ["".join(json.loads(line)) for line in result.stdout.splitlines()]
    assert got == ["one", "no stop here <", "a"]
