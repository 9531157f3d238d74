"""Template conformance against transformers' apply_chat_template, over llama.cpp's ~70 real templates.

transformers is given the RAW request, as a client sends it (never ctxlock's canonical form, which would hide any
normalization ctxlock makes). For every template and every conversation of the corpus, in both tool-argument modes:

- `tool_arguments="as-sent"`: ctxlock's rendered text is byte-identical to transformers' on the raw request;
- the default (`"parsed"`): identical too, except that string `arguments` are rendered as the object they hold
  (README, "Differences from the references"): the text is then transformers' on the raw request with exactly those
  strings parsed, and on every conversation without string arguments it is transformers' on the raw request.
  The `"as-sent"` mode also passes `content_format="openai"` (content-part lists as sent, transformers); the default
  mode keeps `content_format="auto"`, so a template whose content format is "string" gets each all-text list joined
  with "\n": transformers' render of the request with those lists joined, and a `ContentFormatError` for an image
  part (never a silent drop).

Where transformers raises, ctxlock raises a typed TemplateError with transformers' own message. Then, for every
template with its paired vocabulary, the ids equal `apply_chat_template(tokenize=True)` on the raw request (as-sent)
for every conversation the template accepts.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import ctxlock
import fetched
import reference
from conformance import (
    FIXED_NOW,
    TEMPLATE_KWARGS,
    FixedClock,
    conversations,
    has_content_parts,
    only_text_parts,
    string_argument_paths,
    vocab_for,
    with_joined_content,
    with_parsed_arguments,
)
from ctxlock.errors import ContentFormatError, CtxlockError, TemplateError
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate, content_format, render

pytestmark = pytest.mark.reference

TEMPLATES = fetched.template_paths()
CORPUS = conversations()
MODES = ("parsed", "as-sent")


@dataclass
class Renders:
    """One template's render comparison over the corpus, in both modes."""

    counts: Counter = field(default_factory=Counter)  # "identical" renders, "same error"s
    failures: list[str] = field(default_factory=list)
    # Conversations where the parsed default renders differently from transformers on the raw request: the
    # documented difference, seen only where arguments are strings.
    differences: list[str] = field(default_factory=list)
    # Conversations where the default joined content-part lists (a "string" content-format template).
    joined: list[str] = field(default_factory=list)


# Each template is compared once per session, by whichever test asks first (its own test or the summary): the
# summary is computed over every template, whatever ran before it, in whatever order.
RENDERS: dict[str, Renders] = {}
IDS: dict[str, tuple[int, str | None]] = {}  # template -> (conversations compared, the first difference or None)


@pytest.fixture(autouse=True, scope="module")
def fixed_reference_clock() -> Any:
    import transformers.utils.chat_template_utils as ctu

    saved = ctu.datetime
    ctu.datetime = FixedClock
    yield
    ctu.datetime = saved


def _reference(template: str, messages: list[dict], tools: Any, options: dict, special: dict) -> tuple[str, Any]:
    try:
        return "ok", reference.reference_render(template, messages, tools=tools, special_tokens=special, **options)
    except Exception as exc:
        return "error", exc


def _ours(request: Any, template: ChatTemplate, options: dict, model: ctxlock.Model) -> tuple[str, Any]:
    try:
        rendered = render(
            request,
            template,
            special_tokens=model.special_tokens,
            control_tokens=model.tokenizer.control_tokens,
            now=FIXED_NOW,
            **options,
        )
        return "ok", rendered
    except CtxlockError as exc:
        return "error", exc


def _model(vocab: str) -> ctxlock.Model:
    return ctxlock.load(str(fetched.hf_tokenizer_dir(vocab)))


def _raw(data: dict[str, Any]) -> tuple[list[dict], Any]:
    """The messages and tools exactly as the client sent them (copies: the reference may not touch the corpus)."""
    raw = copy.deepcopy(data)
    return raw["messages"], raw.get("tools")


def renders(path: Path) -> Renders:
    """`path`'s renders against transformers over the corpus, in both modes (computed once per session)."""
    if path.name in RENDERS:
        return RENDERS[path.name]
    source = path.read_text("utf-8")
    template = ChatTemplate(source, id=path.name)
    model = _model(vocab_for(path.name))
    special = reference.reference_special_tokens(fetched.hf_tokenizer_dir(vocab_for(path.name)))
    assert model.special_tokens == special  # the template sees the same variables as in transformers
    out = Renders()
    joins = content_format(source) == "string"
    extra = TEMPLATE_KWARGS.get(path.name, {})
    for name, data, options in CORPUS:
        raw_kind, raw_ref = _reference(source, *_raw(data), {**options, **extra}, special)
        strings = string_argument_paths(data)
        for mode in MODES:
            request = parse_request(data, tool_arguments=mode)
            fmt = "openai" if mode == "as-sent" else "auto"
            flattens = mode == "parsed" and joins and has_content_parts(data)
            if mode == "parsed" and (strings or flattens):
                # The documented differences: transformers on the raw request with the string arguments parsed,
                # and content-part lists joined for a template that reads content as a string.
                shaped = with_parsed_arguments(data)
                if flattens and only_text_parts(data):
                    shaped = with_joined_content(shaped)
                ref_kind, ref = _reference(source, *_raw(shaped), {**options, **extra}, special)
            else:
                ref_kind, ref = raw_kind, raw_ref
            opts = {**options, "chat_template_kwargs": extra or None, "content_format": fmt}
            our_kind, ours = _ours(request, template, opts, model)
            where = f"{name} [{mode}]"
            if flattens and not only_text_parts(data):
                # An image part in a template that reads content as a string: a typed error naming the part.
                if isinstance(ours, ContentFormatError) and ours.path.startswith("messages["):
                    out.counts["same error"] += 1
                else:
                    out.failures.append(f"{where}: an image part should be a ContentFormatError, got {ours!r:.200}")
                continue
            if ref_kind == "ok" and our_kind == "ok":
                if ours.text == ref:
                    out.counts["identical"] += 1
                    if flattens:
                        assert ours.flattened and ours.content_format == "string"
                        out.joined.append(name)
                    if mode == "parsed" and strings and raw_kind == "ok" and ours.text != raw_ref:
                        out.differences.append(name)
                else:
                    out.failures.append(f"{where}: text differs\n  ours {ours.text!r:.300}\n  ref  {ref!r:.300}")
            elif ref_kind == "error" and our_kind == "error":
                if isinstance(ours, TemplateError) and ours.message == str(ref):
                    out.counts["same error"] += 1
                else:
                    out.failures.append(f"{where}: errors differ\n  ours {type(ours).__name__}: {ours}\n  ref  {ref!r}")
            elif ref_kind == "ok":
                out.failures.append(f"{where}: transformers renders, ctxlock raised {type(ours).__name__}: {ours}")
            else:
                out.failures.append(f"{where}: transformers raised {ref!r:.200}, ctxlock rendered")
    RENDERS[path.name] = out
    return out


def ids_compared(path: Path) -> tuple[int, str | None]:
    """How many conversations `path` accepts whose ids were compared with `tokenize=True`, and the first difference
    (None when every one is equal); computed once per session."""
    if path.name in IDS:
        return IDS[path.name]
    source = path.read_text("utf-8")
    vocab = vocab_for(path.name)
    tok_dir = fetched.hf_tokenizer_dir(vocab)
    model = _model(vocab)
    template = ChatTemplate(source, id=path.name)
    compared, difference = 0, None
    for name, data, options in CORPUS:
        request = parse_request(data, tool_arguments="as-sent")
        messages, tools = _raw(data)
        extra = TEMPLATE_KWARGS.get(path.name, {})
        try:
            expected = reference.reference_ids(tok_dir, source, messages, tools=tools, **options, **extra)
        except Exception:
            continue
        kwargs = {"now": FIXED_NOW, "chat_template_kwargs": extra or None, "content_format": "openai", **options}
        ours = model.encode(request, chat_template=template, **kwargs).input_ids[0].tolist()
        if ours != expected:
            difference = f"{name} with {vocab}: first difference at {_first_diff(ours, expected)}"
            break
        compared += 1
    IDS[path.name] = (compared, difference)
    return IDS[path.name]


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_template_renders_like_transformers(path: Path) -> None:
    failures = renders(path).failures
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_template_ids_equal_transformers(path: Path) -> None:
    """Ids for every conversation the template accepts, with its paired vocabulary, against tokenize=True."""
    compared, difference = ids_compared(path)
    assert difference is None, difference
    assert compared > 0, f"{path.name} rendered no conversation at all"


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_zz_conformance_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Print the counts (the closing note quotes them), computed here over every template whatever ran before;
    require ≥ 55 fully conformant templates."""
    results = {p.name: renders(p) for p in TEMPLATES}
    ids = {p.name: ids_compared(p) for p in TEMPLATES}
    full = [n for n, r in results.items() if sum(r.counts.values()) == len(CORPUS) * len(MODES)]
    total: Counter = Counter()
    for r in results.values():
        total.update(r.counts)
    equal = {n: compared for n, (compared, difference) in ids.items() if difference is None}
    differences = sum(len(r.differences) for r in results.values())
    joined = {n: len(r.joined) for n, r in results.items() if r.joined}
    with capsys.disabled():
        print(
            f"\nconformance: {len(full)}/{len(TEMPLATES)} templates conform on all {len(CORPUS)} conversations; "
            f"{total['identical']} identical renders, {total['same error']} identical errors; "
            f"ids identical on {sum(equal.values())} (template, conversation) pairs over "
            f"{len(equal)} templates; the parsed default differs from transformers on the raw request in "
            f"{differences} (template, conversation) pairs, all with string arguments; content-part lists were "
            f"joined (string content format) in {sum(joined.values())} pairs over {len(joined)} templates, "
            "each equal to transformers on the joined request"
        )
    assert len(full) >= 55
