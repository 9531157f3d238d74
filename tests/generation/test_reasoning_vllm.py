"""vLLM's reasoning-parser cases for every family but Qwen3 (those are in test_reasoning.py), run over ids.

The cases are vLLM's (tests/reasoning/ in vllm-project/vllm): the model output, the reasoning and the content vLLM
expects, and whether vLLM fed it streaming. Each output is tokenized with the Qwen3 tokenizer of
tests/reasoning_vocab.py (it carries `<think>`, `<seed:think>`, `[THINK]`, Kimi's `<|tool_calls_section_begin|>` as
single tokens; gpt-oss uses ctxlock's own gpt-oss tokenizer) and fed whole, one id at a time and split in two at
every id: the split must be the same each time and equal to vLLM's, or to ctxlock's own answer where ctxlock
deliberately differs (each such case says why; docs/reasoning.md lists them).

vLLM's flags map to what ctxlock reads: `chat_template_kwargs` `thinking` / `enable_thinking` change the rendered
prompt (the template opens or closes the block), so a case with a flag passes `prompt=` (the real template's render)
or, where the cached templates do not have the model's own, `starts=`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

import ctxlock
import fetched
from ctxlock.artifacts import load_template_file
from ctxlock.errors import CtxlockError
from ctxlock.generation import (
    ReasoningDelta,
    ReasoningFormat,
    ReasoningResult,
    ReasoningSplitter,
    split_reasoning,
    start_from_prompt,
)
from ctxlock.request import parse_request
from ctxlock.template import render
from reasoning_vocab import qwen3_tokenizer

VLLM = "tests/reasoning/"


@dataclass(frozen=True)
class Prompt:
    """The rendered generation prompt of a cached template (tests/fetched.py), with these request fields."""

    template: str
    kwargs: tuple[tuple[str, Any], ...] = ()


Start = str | Prompt | None  # None: the family's own rule; "reasoning" / "content": starts=; Prompt: prompt=


@dataclass(frozen=True)
class Case:
    family: str | ReasoningFormat
    source: str  # the vLLM test file
    name: str  # vLLM's case id
    streaming: bool
    output: str
    reasoning: str | None  # what vLLM expects
    content: str | None
    start: Start = None
    ours: tuple[str | None, str | None] | None = None  # ctxlock's answer where it deliberately differs
    why: str = ""

    @property
    def id(self) -> str:
        stem = self.source.rsplit("/test_", 1)[-1].removesuffix("_reasoning_parser.py")
        return f"{stem}:{self.name}{'_streaming' if self.streaming else ''}"


# Why ctxlock's answer differs, where it does (docs/reasoning.md lists each).
EMPTY_BLOCK = (
    "vLLM's streaming sends no delta for an empty block, so its reasoning stays None; ctxlock reports the block it is"
    " in (opened by the template, or written by the model) as '' (vLLM's non-streaming agrees)"
)
LEADING_TEXT = (
    "vLLM's non-streaming drops the text before the model's own <think> when the template already opened one;"
    " ctxlock never drops text: it stays reasoning (as vLLM's streaming has it) and the inner tag is noted"
)
OPEN_TAG = (
    "vLLM's non-streaming glm45 parser makes an unclosed block, tag and all, the content; ctxlock never puts a tag"
    " in the content nor invents content for a response that ends inside reasoning (vLLM's streaming agrees)"
)
EMPTY_THINK = "the model wrote an empty block: ctxlock's reasoning is '' (entered, empty), as vLLM's kimi_k2 has it"
EMPTY_OUTPUT = (
    "no answer text is content None in ctxlock (vLLM's non-streaming mistral parser gives '', its streaming None)"
)
STRAY_CLOSE = "a tag is never answer text: a second closing tag is dropped, and noted (vLLM keeps it in the content)"
NESTED_OPEN = "a tag is never text: an opening tag inside reasoning is dropped, and noted (blocks do not nest)"
IDENTITY = (
    "thinking=False makes vLLM's parser an identity (tags and all are content); ctxlock starts in the content too,"
    " but reads the model's own <think> block by its token"
)


def cases(family: str | ReasoningFormat, source: str, rows: list[tuple[Any, ...]], **common: Any) -> list[Case]:
    """Rows of (name, streaming, output, reasoning, content[, extra fields as a dict])."""
    out = []
    for row in rows:
        name, streaming, output, reasoning, content, *extra = row
        out.append(
            Case(family, VLLM + source, name, streaming, output, reasoning, content, **common, **(extra or [{}])[0])
        )
    return out


RS, REST, REST2 = "This is a reasoning section", "This is the rest", "This is the rest\nThat"  # vLLM's pieces

# DeepSeek-R1: the template opened <think>, so the output holds only </think> (the family rule: starts in reasoning).
R1 = "test_deepseekr1_reasoning_parser.py"
R1_ROWS: list[tuple[Any, ...]] = [
    ("simple_reasoning", False, RS + "</think>" + REST, RS, REST),
    ("simple_reasoning", True, RS + "</think>" + REST, RS, REST),
    ("complete_reasoning", False, RS + "</think>", RS, None),
    ("complete_reasoning", True, RS + "</think>", RS, None),
    ("no_content_token", False, "This is content", "This is content", None),
    ("no_reasoning_token", True, RS, RS, None),
    ("multiple_lines", False, "This\nThat</think>" + REST2, "This\nThat", REST2),
    ("multiple_lines", True, "This\nThat</think>" + REST2, "This\nThat", REST2),
    ("shortest", True, "</think>" + REST, None, REST, {"ours": ("", REST), "why": EMPTY_BLOCK}),
    ("shortest", False, "</think>" + REST, "", REST),
    ("reasoning_with_think", False, "<think>" + RS + "</think>" + REST, RS, REST),
    ("reasoning_with_think", True, "<think>" + RS + "</think>" + REST, RS, REST),
    ("complete_reasoning_with_think", False, "<think>" + RS + "</think>", RS, None),
    ("complete_reasoning_with_think", True, "<think>" + RS + "</think>", RS, None),
    ("multiple_lines_with_think", False, "<think>This\nThat</think>" + REST2, "This\nThat", REST2),
    ("multiple_lines_with_think", True, "<think>This\nThat</think>" + REST2, "This\nThat", REST2),
    ("shortest_with_think", False, "</think>" + REST, "", REST),
    ("shortest_with_think", True, "</think>" + REST, None, REST, {"ours": ("", REST), "why": EMPTY_BLOCK}),
    ("think_no_end", False, "<think>" + RS, RS, None),
    ("think_no_end", True, "<think>" + RS, RS, None),
    ("empty", False, "", "", None),
    ("empty", True, "", None, None, {"ours": ("", None), "why": EMPTY_BLOCK}),
    (
        "new_line",
        False,
        "\n<think>" + RS + "</think>\n" + REST,
        RS,
        "\n" + REST,
        {"ours": ("\n" + RS, "\n" + REST), "why": LEADING_TEXT},
    ),
    ("new_line", True, "\n<think>" + RS + "</think>\n" + REST, "\n" + RS, "\n" + REST),
]

# GLM-4.5 / 4.6: the model writes <think> itself (the template's generation prompt says neither: starts in content).
GLM45 = "test_glm4_moe_reasoning_parser.py"
GLM45_ROWS: list[tuple[Any, ...]] = [
    ("with_think", False, "<think>" + RS + "</think>" + REST, RS, REST),
    ("with_think", True, "<think>" + RS + "</think>" + REST, RS, REST),
    ("without_think", False, REST, None, REST),
    ("without_think", True, REST, None, REST),
    ("complete_reasoning", False, "<think>" + RS + "</think>", RS, None),
    ("complete_reasoning", True, "<think>" + RS + "</think>", RS, None),
    (
        "multiline_reasoning",
        False,
        "<think>This is a reasoning\nsection</think>" + REST2,
        "This is a reasoning\nsection",
        REST2,
    ),
    (
        "multiline_reasoning",
        True,
        "<think>This is a reasoning\nsection</think>" + REST2,
        "This is a reasoning\nsection",
        REST2,
    ),
    # An earlier version of the file also has the empty block (vLLM's glm45 parser then reported no reasoning).
    ("empty_think_block", False, "<think></think>" + REST, None, REST, {"ours": ("", REST), "why": EMPTY_THINK}),
    ("empty_think_block", True, "<think></think>" + REST, None, REST, {"ours": ("", REST), "why": EMPTY_THINK}),
    ("empty_think_block_no_content", False, "<think></think>", None, None, {"ours": ("", None), "why": EMPTY_THINK}),
    ("empty_think_block_no_content", True, "<think></think>", None, None, {"ours": ("", None), "why": EMPTY_THINK}),
    (
        "only_open_tag",
        False,
        "<think>" + RS,
        None,
        "<think>" + RS,
        {"ours": (RS, None), "why": OPEN_TAG},
    ),
    ("only_open_tag", True, "<think>" + RS, RS, None),
]

# GLM-4.7: its template's generation prompt ends with <think> (GLM-4.7-Flash.jinja), so the output starts in reasoning.
GLM47 = "test_glm47_reasoning_parser.py"
GLM47_PROMPT = Prompt("GLM-4.7-Flash.jinja")
# vLLM's glm47 file has the R1 cases but the leading newline and the "_with_think" shortest pair.
GLM47_ROWS = [r for r in R1_ROWS if r[0] not in ("new_line", "shortest_with_think")]

# Seed-OSS: vLLM's base thinking parser with <seed:think>; it starts in reasoning (the family rule).
SEED = "test_seedoss_reasoning_parser.py"
SEED_ROWS: list[tuple[Any, ...]] = [
    (name, streaming, output, reasoning, content)
    for name, output, reasoning, content in [
        ("simple_reasoning", RS + "</seed:think>" + REST, RS, REST),
        ("complete_reasoning", RS + "</seed:think>", RS, None),
        ("no_content", "This is content", "This is content", None),
        ("multiple_lines", "This\nThat</seed:think>" + REST2, "This\nThat", REST2),
        ("with_start_token", "<seed:think>" + RS + "</seed:think>" + REST, RS, REST),
        ("only_end_token", "Some reasoning</seed:think>" + REST, "Some reasoning", REST),
        (
            "no_tokens",
            "This is just content without any reasoning tokens",
            "This is just content without any reasoning tokens",
            None,
        ),
    ]
    for streaming in (True, False)
] + [
    (
        "streaming_delta_processing",
        True,
        "Some reasoning content</seed:think>Final answer",
        "Some reasoning content",
        "Final answer",
    )
]

# vLLM's base thinking parser (test_base_thinking_reasoning_parser.py adds <test:think> tags to a tokenizer): here
# with Seed-OSS's tags, whose vLLM parser is that base parser, and a second family on [THINK] for its "alt" parser.
BASE = "test_base_thinking_reasoning_parser.py"
ALT = ReasoningFormat("alt", "[THINK]", "[/THINK]", "reasoning")
BASE_ROWS: list[tuple[Any, ...]] = [
    (
        "both_tokens",
        False,
        "<seed:think>This is reasoning</seed:think>This is content",
        "This is reasoning",
        "This is content",
    ),
    ("only_end_token", False, "This is reasoning</seed:think>This is content", "This is reasoning", "This is content"),
    ("no_end_token", False, "This is just content", "This is just content", None),
    ("empty_output", False, "", "", None),
    ("only_tokens", False, "<seed:think></seed:think>", "", None),
    (
        "simple_reasoning_extraction",
        True,
        "<seed:think>Some reasoning content</seed:think>Final answer",
        "Some reasoning content",
        "Final answer",
    ),
    (
        "simple_reasoning_extraction",
        False,
        "<seed:think>Some reasoning content</seed:think>Final answer",
        "Some reasoning content",
        "Final answer",
    ),
    (
        "incremental_deltas",
        True,
        "<seed:think>Some reasoning content</seed:think>Final answer",
        "Some reasoning content",
        "Final answer",
    ),
    ("with_start_token", True, "<seed:think>Some reasoning</seed:think>Answer", "Some reasoning", "Answer"),
    ("no_end_token", True, "<seed:think>Some reasoning without end", "Some reasoning without end", None),
    ("only_end_token", True, "<seed:think>Reasoning content</seed:think>Final", "Reasoning content", "Final"),
    ("different_token_implementations", False, "Reasoning1</seed:think>Content1", "Reasoning1", "Content1"),
    (
        "multiple_end_tokens",
        False,
        "First</seed:think>Middle</seed:think>Last",
        "First",
        "Middle</seed:think>Last",
        {"ours": ("First", "MiddleLast"), "why": STRAY_CLOSE},
    ),
    (
        "nested_tokens",
        False,
        "<seed:think>Outer<seed:think>Inner</seed:think>Content",
        "Outer<seed:think>Inner",
        "Content",
        {"ours": ("OuterInner", "Content"), "why": NESTED_OPEN},
    ),
    (
        "malformed_tokens",
        False,
        "<seed:thinking>Not a real token</seed:thinking>Content",
        "<seed:thinking>Not a real token</seed:thinking>Content",
        None,
    ),
]

# Kimi K2: thinks by default (an implicit start); <|tool_calls_section_begin|> ends the reasoning and is content.
KIMI = "test_kimi_k2_reasoning_parser.py"
KIMI_ROWS: list[tuple[Any, ...]] = [
    (
        "extract_reasoning_with_think_tags",
        False,
        "<think>step by step reasoning</think>final answer",
        "step by step reasoning",
        "final answer",
    ),
    ("extract_reasoning_empty_thinking", False, "<think></think>final answer", "", "final answer"),
    (
        "extract_reasoning_implicit_start",
        False,
        "implicit reasoning with no tags",
        "implicit reasoning with no tags",
        None,
    ),
    (
        "extract_reasoning_tool_section_ends_reasoning",
        False,
        "some reasoning<|tool_calls_section_begin|>tool call data",
        "some reasoning",
        "<|tool_calls_section_begin|>tool call data",
    ),
    ("reasoning_then_content", True, "<think>step one</think>answer", "step one", "answer"),
    (
        "tool_section_ends_reasoning",
        True,
        "<think>thinking<|tool_calls_section_begin|>",
        "thinking",
        "<|tool_calls_section_begin|>",
    ),
    # thinking=False selects vLLM's identity parser; the K2.5 template then prefills <think></think> (not among
    # the cached templates: Kimi-K2-Thinking.jinja ignores the flag), which is starts="content".
    ("parser_selection_thinking_disabled", False, "final answer", None, "final answer", {"start": "content"}),
]

# Magistral: [THINK] ... [/THINK], written by the model; without [THINK] the output is content (the family rule).
MISTRAL = "test_mistral_reasoning_parser.py"
MISTRAL_ROWS: list[tuple[Any, ...]] = [
    ("invalid_simple_reasoning", False, RS + "[/THINK]" + REST, None, RS + REST),
    ("invalid_simple_reasoning", True, RS + "[/THINK]" + REST, None, RS + REST),
    ("invalid_complete_reasoning", False, RS + "[/THINK]", None, RS),
    ("invalid_complete_reasoning", True, RS + "[/THINK]", None, RS),
    ("no_content", False, "[THINK]This is reasoning", "This is reasoning", None),
    ("no_reasoning", False, "This is content", None, "This is content"),
    ("no_reasoning_token", True, RS, None, RS),
    ("invalid_multiple_lines", False, "This\nThat[/THINK]" + REST2, None, "This\nThat" + REST2),
    ("invalid_multiple_lines", True, "This\nThat[/THINK]" + REST2, None, "This\nThat" + REST2),
    ("invalid_shortest", True, "[/THINK]" + REST, None, REST),
    ("invalid_shortest", False, "[/THINK]" + REST, None, REST),
    ("reasoning_with_think", False, "[THINK]" + RS + "[/THINK]" + REST, RS, REST),
    ("reasoning_with_think", True, "[THINK]" + RS + "[/THINK]" + REST, RS, REST),
    ("complete_reasoning_with_think", False, "[THINK]" + RS + "[/THINK]", RS, None),
    ("complete_reasoning_with_think", True, "[THINK]" + RS + "[/THINK]", RS, None),
    ("multiple_lines_with_think", False, "[THINK]This\nThat[/THINK]" + REST2, "This\nThat", REST2),
    ("multiple_lines_with_think", True, "[THINK]This\nThat[/THINK]" + REST2, "This\nThat", REST2),
    ("invalid_shortest_with_think", False, "[/THINK]" + REST, None, REST),
    ("invalid_shortest_with_think", True, "[/THINK]" + REST, None, REST),
    ("think_no_end", False, "[THINK]" + RS, RS, None),
    ("think_no_end", True, "[THINK]" + RS, RS, None),
    ("empty", False, "", None, "", {"ours": (None, None), "why": EMPTY_OUTPUT}),
    ("empty", True, "", None, None),
    ("new_line", False, "Before\n[THINK]" + RS + "[/THINK]\n" + REST, RS, "Before\n\n" + REST),
    ("new_line", True, "Before\n[THINK]" + RS + "[/THINK]\n" + REST, RS, "Before\n\n" + REST),
    (
        "streaming_reconstruction_extracts_reasoning",
        True,
        "[THINK]Let me think about this[/THINK]The answer is 42",
        "Let me think about this",
        "The answer is 42",
    ),
]

# DeepSeek-V3.1: `thinking` picks vLLM's R1 parser (True) or its identity parser (False, the default). The V3.1
# template renders that flag: `<think>` (starts in reasoning) or `</think>` (content) at the end of the prompt.
V3 = "test_deepseekv3_reasoning_parser.py"
V3_ON = Prompt("deepseek-ai-DeepSeek-V3.1.jinja", (("chat_template_kwargs", (("thinking", True),)),))
V3_OFF = Prompt("deepseek-ai-DeepSeek-V3.1.jinja")
V3_ROWS: list[tuple[Any, ...]] = [
    ("identity_reasoning_parser_basic", False, "This is some output", None, "This is some output", {"start": V3_OFF}),
    ("identity_reasoning_parser_basic", True, "Hello world", None, "Hello world", {"start": V3_OFF}),
    # count_reasoning_tokens: <think> 3 ids </think> 1 id; thinking=True counts 3 as reasoning, False none ("a b c"
    # is 3 ids of this vocabulary, "d" one).
    ("count_reasoning_tokens_thinking", False, "<think>a b c</think>d", "a b c", "d", {"start": V3_ON}),
    (
        "count_reasoning_tokens_no_thinking",
        False,
        "<think>a b c</think>d",
        None,
        "<think>a b c</think>d",
        {"start": V3_OFF, "ours": ("a b c", "d"), "why": IDENTITY},
    ),
]

CASES = [
    *cases("deepseek_r1", R1, R1_ROWS),
    *cases("deepseek_v3", V3, V3_ROWS),
    *cases("glm45", GLM45, GLM45_ROWS),
    *cases("glm45", GLM47, GLM47_ROWS, start=GLM47_PROMPT),
    *cases("kimi_k2", KIMI, KIMI_ROWS),
    *cases("seed_oss", SEED, SEED_ROWS),
    *cases("seed_oss", BASE, BASE_ROWS),
    *cases(
        ALT,
        BASE,
        [("different_token_implementations_alt", False, "Reasoning2[/THINK]Content2", "Reasoning2", "Content2")],
    ),
    *cases("mistral", MISTRAL, MISTRAL_ROWS),
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return qwen3_tokenizer(tmp_path_factory.getbasetemp())


@cache
def rendered(prompt: Prompt) -> str:
    tpl = load_template_file(fetched.templates_dir() / prompt.template)
    fields = {k: dict(v) if isinstance(v, tuple) else v for k, v in prompt.kwargs}
    body = {"messages": [{"role": "user", "content": "What is 2+2?"}], **fields}
    return render(parse_request(json.dumps(body).encode()), tpl, add_generation_prompt=True).text


def start_kwargs(start: Start) -> dict[str, Any]:
    if isinstance(start, Prompt):
        return {"prompt": rendered(start)}
    return {"starts": start} if start is not None else {}


def fed(tok: Any, fmt: Any, chunks: list[list[int]], **kw: Any) -> ReasoningResult:
    splitter = ReasoningSplitter(tok, fmt, **kw)
    events = [e for c in chunks for e in splitter.feed(c)]
    result = splitter.finish("stop")
    return ReasoningResult(**{**result.__dict__, "events": (*events, *result.events)})


def runs(events: tuple[Any, ...]) -> list[tuple[str, str]]:
    """The events as (kind, text), adjacent ones of a kind joined."""
    out: list[tuple[str, str]] = []
    for e in events:
        kind = "reasoning" if isinstance(e, ReasoningDelta) else "content"
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + e.text)
        else:
            out.append((kind, e.text))
    return out


def check_every_chunking(tok: Any, fmt: Any, ids: list[int], **kw: Any) -> ReasoningResult:
    """The whole split, checked equal under one id at a time and every split in two."""
    whole = split_reasoning(tok, ids, fmt, finish_reason="stop", **kw)
    for chunks in [[[i] for i in ids], *[[ids[:k], ids[k:]] for k in range(len(ids) + 1)]]:
        got = fed(tok, fmt, chunks, **kw)
        assert (got.reasoning, got.content, got.notes) == (whole.reasoning, whole.content, whole.notes), chunks
        assert runs(got.events) == runs(whole.events), chunks
    return whole


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_vllm_case_whole_one_id_at_a_time_and_at_every_split(tok: Any, case: Case) -> None:
    ids = tok.encode(case.output, parse_special=True)
    whole = check_every_chunking(tok, case.family, ids, **start_kwargs(case.start))
    expected = case.ours if case.ours is not None else (case.reasoning, case.content)
    assert (whole.reasoning, whole.content) == expected, whole.notes
    if case.ours is not None:
        assert case.ours != (case.reasoning, case.content) and case.why


def test_the_deliberate_differences_are_the_known_ones() -> None:
    """Every case where ctxlock's answer is not vLLM's has one of the reasons docs/reasoning.md lists."""
    reasons = {c.why for c in CASES if c.ours is not None}
    assert reasons == {
        EMPTY_BLOCK,
        LEADING_TEXT,
        OPEN_TAG,
        EMPTY_THINK,
        EMPTY_OUTPUT,
        STRAY_CLOSE,
        NESTED_OPEN,
        IDENTITY,
    }
    assert len(CASES) == 126 and sum(c.ours is not None for c in CASES) == 15


def test_dropped_tags_are_noted(tok: Any) -> None:
    stray = split_reasoning(
        tok, tok.encode("First</seed:think>Middle</seed:think>Last", parse_special=True), "seed_oss"
    )
    assert any("</seed:think> outside reasoning dropped" in n for n in stray.notes)
    nested = tok.encode("<seed:think>Outer<seed:think>Inner</seed:think>Content", parse_special=True)
    assert any("<seed:think> inside reasoning dropped" in n for n in split_reasoning(tok, nested, "seed_oss").notes)


# ------------------------------------------------------------------------------------------ flags and prompts

# vLLM's chat_template_kwargs, and where ctxlock starts the output for them: read from the rendered prompt.
FLAG_STARTS = [
    # deepseek_v3: thinking=True -> vLLM's R1 parser, False (the default) -> its identity parser.
    (
        "deepseek_v3",
        Prompt("deepseek-ai-DeepSeek-V3.1.jinja", (("chat_template_kwargs", (("thinking", True),)),)),
        "reasoning",
    ),
    ("deepseek_v3", Prompt("deepseek-ai-DeepSeek-V3.1.jinja"), "content"),
    (
        "deepseek_v3",
        Prompt("deepseek-ai-DeepSeek-V3.2.jinja", (("chat_template_kwargs", (("thinking", True),)),)),
        "reasoning",
    ),
    ("deepseek_v3", Prompt("deepseek-ai-DeepSeek-V3.2.jinja"), "content"),
    # glm45 / glm47: enable_thinking=False closes the block in the prompt.
    ("glm45", Prompt("GLM-4.7-Flash.jinja"), "reasoning"),
    ("glm45", Prompt("GLM-4.7-Flash.jinja", (("chat_template_kwargs", (("enable_thinking", False),)),)), "content"),
    ("glm45", Prompt("GLM-4.6.jinja", (("chat_template_kwargs", (("enable_thinking", False),)),)), "content"),
    # seed_oss: a thinking budget of 0 makes the template close the block itself.
    ("seed_oss", Prompt("ByteDance-Seed-OSS.jinja", (("chat_template_kwargs", (("thinking_budget", 0),)),)), "content"),
]


@pytest.mark.parametrize(("fmt", "prompt", "expected"), FLAG_STARTS, ids=lambda v: getattr(v, "template", str(v)))
def test_vllm_thinking_flags_are_the_rendered_prompt(fmt: str, prompt: Prompt, expected: str) -> None:
    assert start_from_prompt(fmt, rendered(prompt)) == expected


def test_kimi_thinking_default_and_off(tok: Any) -> None:
    """vLLM's kimi_k2 parser thinks unless thinking=False (then identity): ctxlock's family rule is reasoning, and
    starts="content" is the K2.5 template's prefilled empty block."""
    ids = tok.encode("an answer", parse_special=True)
    assert split_reasoning(tok, ids, "kimi_k2").reasoning == "an answer"
    assert split_reasoning(tok, ids, "kimi_k2", prompt="<think></think>").content == "an answer"


# GLM's is_reasoning_end over a whole prompt (test_glm4_moe_reasoning_parser.py, test_glm47_reasoning_parser.py):
# False (still reasoning) is a prompt whose last tag opens a block; True, one whose block closed.
GLM_PROMPT_HEAD = (
    "[gMASK]<sop><|system|>\nYou are a helpful assistant.<|user|>\nWhat is the capital of France?<|assistant|>\n"
)
GLM_PROMPTS = [
    ("still_reasoning", GLM_PROMPT_HEAD + "<think>The user is asking for the capital of", False),
    (
        "done_reasoning",
        GLM_PROMPT_HEAD
        + "<think>The user is asking for the capital of France.</think>\nThe capital of France is Paris.",
        True,
    ),
    (
        "multi_turn_still_reasoning",
        GLM_PROMPT_HEAD + "<think></think>\nThe capital of France is Paris.<|user|>\nWhat about Chile?<|assistant|>\n"
        "<think>The user is asking for the capital of",
        False,
    ),
    (
        "multi_turn_done_reasoning",
        GLM_PROMPT_HEAD + "<think></think>\nThe capital of France is Paris.<|user|>\nWhat about Chile?<|assistant|>\n"
        "<think>The user is asking for the capital of Chile.</think>\nThe capital of Chile is Santiago.",
        True,
    ),
]


@pytest.mark.parametrize(("name", "prompt", "reasoning_ended"), GLM_PROMPTS, ids=[p[0] for p in GLM_PROMPTS])
def test_glm_is_reasoning_end_over_a_prompt(tok: Any, name: str, prompt: str, reasoning_ended: bool) -> None:
    splitter = ReasoningSplitter(tok, "glm45", prompt=prompt)
    assert splitter.starts == ("content" if reasoning_ended else "reasoning")


# Mistral's is_reasoning_end over a prompt (test_mistral_reasoning_parser.py): a [THINK] block in the system prompt,
# a tool result or an earlier turn does not end this turn's reasoning (False), a continued answer does (True). Over
# the rendered prompt the first three leave the start to the family rule (content, the model writes [THINK] itself),
# and the continued answer's output is content.
MISTRAL_PROMPTS = [
    ("prompt_example_think_block", Prompt("mistralai-Ministral-3-14B-Reasoning-2512.jinja"), False),
    (
        "prompt_example_think_block_text",
        "[SYSTEM_PROMPT]You are a helpful assistant. For example:[THINK]example reasoning[/THINK]done[/SYSTEM_PROMPT]"
        "[INST]What is the capital of France?[/INST]",
        False,
    ),
    (
        "tool_result_think_block",
        "[INST]call a tool[/INST][TOOL_RESULTS][THINK]tool-side reasoning[/THINK]tool output[/TOOL_RESULTS]",
        False,
    ),
    (
        "prior_turn_reasoning_hidden",
        "[/INST][THINK]reasoning for the first turn[/THINK]first answer</s>[INST]second question[/INST]",
        False,
    ),
    ("continuation_true", "[/INST][THINK]current turn reasoning[/THINK]partial answer so far", True),
]


@pytest.mark.parametrize(("name", "prompt", "reasoning_ended"), MISTRAL_PROMPTS, ids=[p[0] for p in MISTRAL_PROMPTS])
def test_mistral_is_reasoning_end_over_a_prompt(tok: Any, name: str, prompt: Any, reasoning_ended: bool) -> None:
    text = rendered(prompt) if isinstance(prompt, Prompt) else prompt
    assert "[THINK]" in text and start_from_prompt("mistral", text) is None
    output = "more answer" if reasoning_ended else "[THINK]this turn[/THINK]the answer"
    r = split_reasoning(tok, tok.encode(output, parse_special=True), "mistral", prompt=text)
    assert r.starts == "content"
    assert (r.reasoning, r.content) == ((None, "more answer") if reasoning_ended else ("this turn", "the answer"))


# ------------------------------------------------------------------------------------------------- gpt-oss

# vLLM's gpt-oss cases (test_gptoss_reasoning_parser.py) assert only is_reasoning_end: whether the final channel's
# message has begun, so that what comes next is the answer. ctxlock's equivalent: the next text is content. The two
# user-message outputs the file defines are not among its parametrized cases. In suffix_only a second <|message|>
# inside the analysis message stays reasoning text, as openai-harmony's StreamableParser keeps it.
ANALYSIS = "<|end|><|start|>assistant<|channel|>analysis<|message|>This is reasoning"
FINAL = "<|end|><|start|>assistant<|channel|>final"
HARMONY_CASES = [
    ("basic_content", ANALYSIS + FINAL + "<|message|>" + REST, True, REST),
    ("basic_reasoning_only", ANALYSIS + "<|end|>", False, None),
    ("complex_content_incomplete_prefix_only", ANALYSIS + FINAL, False, None),
    ("complex_content_suffix_only", ANALYSIS + "<|message|>", False, None),
    ("complex_content_1_no_suffix", ANALYSIS + FINAL + "<|constrain|> JSON ", False, None),
    ("complex_content_1", ANALYSIS + FINAL + "<|constrain|> JSON <|message|>", True, None),
    ("complex_content_1_with_content", ANALYSIS + FINAL + "<|constrain|> JSON <|message|>" + REST, True, REST),
    ("complex_content_2", ANALYSIS + FINAL + "<|constrain|>ReplyAction <|message|>" + REST, True, REST),
]


@pytest.fixture(scope="module")
def gpt_oss() -> Any:
    return ctxlock.load("gpt-oss").tokenizer


def next_text_is_content(tok: Any, ids: list[int]) -> bool:
    try:
        return (split_reasoning(tok, [*ids, *tok.encode("X")], "harmony").content or "").endswith("X")
    except CtxlockError:  # text where a message must start: not content
        return False


@pytest.mark.parametrize(
    ("name", "output", "reasoning_ended", "content"), HARMONY_CASES, ids=[c[0] for c in HARMONY_CASES]
)
def test_vllm_gptoss_cases(gpt_oss: Any, name: str, output: str, reasoning_ended: bool, content: str | None) -> None:
    ids = gpt_oss.encode(output, parse_special=True)
    assert next_text_is_content(gpt_oss, ids) is reasoning_ended
    whole = check_every_chunking(gpt_oss, "harmony", ids)
    assert (whole.content, whole.reasoning_complete or name == "complex_content_suffix_only") == (content, True)
    assert whole.reasoning is not None and whole.reasoning.startswith("This is reasoning")
