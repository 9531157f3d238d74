"""Control tokens with `lstrip`/`rstrip` next to request whitespace (issue 14, item 4).

An HF added token with `lstrip`/`rstrip` takes the whitespace beside it into its match. In a chat, that whitespace
is often the request's: Phi-3's `<|user|>\\n` takes the spaces a message starts with, an lstrip token after a
message takes the ones it ends with. The token is still the template's, so a benign request must give the
reference ids, `encode()` must agree with `run()`, and `special_tokens="raise"` must accept it. The token's own
characters decide: when they come from the request, the token is still encoded as text.

The vocabularies are every `tokenizers`-backed test vocabulary with an lstrip/rstrip control token (the phi-3 GGUF
with rstrip, nomic-bert-moe's lstrip `<mask>`), and the phi-3 vocabulary with its flags turned into lstrip and
lstrip+rstrip, so that both sides are covered with a real chat template. The reference is transformers'
`apply_chat_template(tokenize=True)` over the same tokenizer.json and the same special-token variables.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
import vocabularies
from ctxlock.budget._counting import TokenCounter
from ctxlock.errors import ControlTokenError
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate, Span
from ctxlock.tokenizer import tokenize
from ctxlock.tokenizer.backends._hf import HFTokenizer
from hypothesis_profiles import examples

pytestmark = pytest.mark.reference

# Whitespace as Python sees it. `tokenizers` strips with Rust's `char::is_whitespace`, which leaves out
# U+001C..U+001F: those stay text next to an rstrip token.
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "\x0b", "\x0c", "\xa0", "\u3000", "\x85", "\u2028", "\x1c", "\x1f"]
RUST_WHITESPACE = "".join(chr(c) for c in range(0x110000) if chr(c).isspace() and chr(c) not in "\x1c\x1d\x1e\x1f")


def _strip_controls(tok: HFTokenizer) -> list[str]:
    return sorted(t.content for t in tok.added_tokens if t.control and (t.lstrip or t.rstrip))


def _with_flags(tok: HFTokenizer, *, lstrip: bool, rstrip: bool) -> HFTokenizer:
    """The same tokenizer.json with every stripping control token's flags replaced."""
    data = json.loads(tok._json_text)
    for t in data["added_tokens"]:
        if t.get("lstrip") or t.get("rstrip"):
            t["lstrip"], t["rstrip"] = lstrip, rstrip
    return HFTokenizer(json.dumps(data), id=f"{tok.id}+{'l' * lstrip}{'r' * rstrip}strip", source=tok.source)


def _core(text: str, m: Any, tok: HFTokenizer) -> tuple[int, int]:
    """Where the token's own characters are in its match: the one place its content occurs there (the content is
    not whitespace-only, and the match is that content with whitespace around it)."""
    content = tok.id_to_token(m.id)
    at = text.find(content, m.start, m.end)
    assert at >= 0 and (at == m.start or text[m.start : at].isspace()), (text[m.start : m.end], content)
    rest = text[at + len(content) : m.end]
    assert rest.isspace() or not rest
    return at, at + len(content)


def _probe_template(tokens: list[str]) -> str:
    """Each message between two stripping control tokens, cycling through them: every token is seen both right
    before request text (its rstrip side) and right after it (its lstrip side)."""
    pairs = " ".join(
        f"[{json.dumps(tokens[i])}, {json.dumps(tokens[(i + 1) % len(tokens)])}]," for i in range(len(tokens))
    )
    return (
        f"{{% set pairs = [{pairs}] %}}"
        "{% for m in messages %}{% set p = pairs[loop.index0 % pairs|length] %}"
        "{{ p[0] }}{{ m.content }}{{ p[1] }}{% endfor %}"
        "{% if add_generation_prompt %}{{ pairs[0][0] }}{% endif %}"
    )


@cache
def cases() -> dict[str, tuple[ctxlock.Model, tuple[str, ...]]]:
    """{vocabulary: (model, template sources)} for every vocabulary with an lstrip/rstrip control token."""
    found = {name: tok for name, tok in vocabularies.TOKENIZERS.items() if _strip_controls(tok)}
    phi3 = found["gguf:phi-3"]  # the vocabulary: its discovery must not silently stop
    found["gguf:phi-3+lstrip"] = _with_flags(phi3, lstrip=True, rstrip=False)
    found["gguf:phi-3+lstrip+rstrip"] = _with_flags(phi3, lstrip=True, rstrip=True)
    phi35 = (fetched.templates_dir() / "microsoft-Phi-3.5-mini-instruct.jinja").read_text("utf-8")
    out = {}
    for name, tok in found.items():
        source = fetched.gguf_path(name[len("gguf:") :].split("+")[0]) if name.startswith("gguf:") else None
        base = ctxlock.load(str(source) if source else str(fetched.hf_tokenizer_dir(name[len("hf:") :])))
        model = ctxlock.Model(dataclasses.replace(base.artifacts, tokenizer=tok))
        templates = [_probe_template(_strip_controls(tok))]
        if name.startswith("gguf:phi-3"):
            templates += [phi35, *(t.source for t in base.templates.templates)]
        out[name] = (model, tuple(templates))
    return out


CASE_NAMES = ["gguf:nomic-bert-moe", "gguf:phi-3", "gguf:phi-3+lstrip", "gguf:phi-3+lstrip+rstrip"]


def test_every_stripping_vocabulary_is_covered() -> None:
    assert sorted(cases()) == sorted(CASE_NAMES)


@cache
def _reference_tokenizer(name: str) -> Any:
    import tokenizers
    from transformers import TokenizersBackend

    model, _ = cases()[name]
    return TokenizersBackend(tokenizer_object=tokenizers.Tokenizer.from_str(model.tokenizer._json_text))


def reference_ids(name: str, template: str, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    model, _ = cases()[name]
    out = _reference_tokenizer(name).apply_chat_template(
        messages,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
        **model.special_tokens,
    )
    return list(out)


words = st.text(alphabet="abcxyzé.,!?-'()0", max_size=8)
spaces = st.lists(st.sampled_from(WHITESPACE), max_size=4).map("".join)
benign_content = st.tuples(spaces, words, spaces, words, spaces).map("".join)


def _conversation(contents: list[str], system: str | None) -> list[dict]:
    roles = ["user", "assistant"]
    messages = [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]
    return ([{"role": "system", "content": system}] if system is not None else []) + messages


conversations = st.builds(_conversation, st.lists(benign_content, min_size=1, max_size=3), st.none() | benign_content)


def _options(template: str, add_generation_prompt: bool) -> dict[str, Any]:
    return {"chat_template": ChatTemplate(template, id="strip-test"), "add_generation_prompt": add_generation_prompt}


@pytest.mark.parametrize("name", CASE_NAMES)
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), messages=conversations, add_generation_prompt=st.booleans())
def test_benign_whitespace_gives_the_reference_ids(
    name: str, data: st.DataObject, messages: list[dict], add_generation_prompt: bool
) -> None:
    """Request whitespace taken by a template's stripping token: the reference ids, on both paths and policies."""
    model, templates = cases()[name]
    template = data.draw(st.sampled_from(templates), label="template")
    expected = reference_ids(name, template, messages, add_generation_prompt)
    options = _options(template, add_generation_prompt)
    request = {"messages": messages}
    run = model.run(request, **options)
    assert list(run.tokenized.ids) == expected
    assert run.tokenized.neutralized == ()
    assert model.encode(request, **options).input_ids[0].tolist() == expected
    assert list(model.run(request, **options, injection="raise").tokenized.ids) == expected
    assert model.encode(request, **options, injection="raise").input_ids[0].tolist() == expected
    # The counting service (fit_context, plan_compaction) gives the same count.
    assert TokenCounter(model.tokenizer).rebase(model.render(parse_request(request), **options)) == len(expected)


def _token_in_whitespace(name: str) -> Any:
    model, _ = cases()[name]
    return st.tuples(spaces, st.sampled_from(_strip_controls(model.tokenizer)), spaces, words).map("".join)


@pytest.mark.parametrize("name", CASE_NAMES)
@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), add_generation_prompt=st.booleans())
def test_request_control_token_between_whitespace_stays_text(
    name: str, data: st.DataObject, add_generation_prompt: bool
) -> None:
    """A stripping token spelled by the request ("  <|user|>  "): still text, whatever whitespace surrounds it,
    and the template's own tokens stay control tokens."""
    model, templates = cases()[name]
    template = data.draw(st.sampled_from(templates), label="template")
    forged = data.draw(_token_in_whitespace(name), label="forged")
    messages = _conversation([data.draw(benign_content, label="before"), forged], None)
    options = _options(template, add_generation_prompt)
    request = {"messages": messages}
    run = model.run(request, **options)
    text, spans = run.rendered.text, run.rendered.request_spans
    assert run.rendered.provenance_exact
    assert run.tokenized.neutralized, "the request's control token was honoured"
    for m in run.tokenized.neutralized:  # each one's own characters are request text
        start, end = _core(text, m, model.tokenizer)
        assert any(s.start <= start and end <= s.end for s in spans)
    for m in run.tokenized.control:  # each honoured one's own characters are template text
        start, end = _core(text, m, model.tokenizer)
        assert not any(s.start < end and start < s.end for s in spans), text[m.start : m.end]
    control_ids = {t.id for t in model.tokenizer.added_tokens if t.control}
    assert sum(i in control_ids for i in run.tokenized.ids) == len(run.tokenized.control)
    assert model.encode(request, **options).input_ids[0].tolist() == list(run.tokenized.ids)
    if name.startswith("gguf:phi-3"):
        # Byte-fallback SentencePiece decodes text back: no request character went missing around the stripping
        # tokens (the whitespace Rust's rule takes is the only thing a neighbouring control token may consume).
        assert forged.strip(RUST_WHITESPACE) in model.tokenizer.decode(list(run.tokenized.ids))
    with pytest.raises(ControlTokenError) as exc:
        model.run(request, **options, injection="raise")
    assert exc.value.path == "messages[1].content"
    with pytest.raises(ControlTokenError):
        model.encode(request, **options, injection="raise")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_match_is_forged_exactly_when_its_own_characters_are_untrusted(name: str) -> None:
    """The rule itself, at every position of every stripping match of a benign chat: an untrusted character
    makes the match forged iff it is one of the token's own characters, and a zero-width break does iff it lies
    strictly inside them. (Both kinds of span: provenance gives characters, string markers give breaks.)"""
    model, templates = cases()[name]
    messages = _conversation([" \n hi \t", "\n ok  \n", "  \x1c bye \u3000"], "  sys \n")
    for template in templates:
        rendered = model.render({"messages": messages}, **_options(template, True))
        base = tokenize(dataclasses.replace(rendered, untrusted=()), model.tokenizer)
        cores = {m: _core(rendered.text, m, model.tokenizer) for m in base.control}
        stripping = [m for m, (start, end) in cores.items() if (start, end) != (m.start, m.end)]
        assert stripping, "no match took whitespace: the chat does not exercise the rule"
        for m in stripping:
            start, end = cores[m]
            for k in range(m.start, m.end + 1):
                spans = [(Span(k, k), start < k < end)]
                if k < m.end:
                    spans.append((Span(k, k + 1), start <= k < end))
                for span, forged in spans:
                    out = tokenize(dataclasses.replace(rendered, untrusted=(span,)), model.tokenizer)
                    assert (m in out.neutralized) is forged, (rendered.text[m.start : m.end], span)
                    assert (m in out.control) is not forged
