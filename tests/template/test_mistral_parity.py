"""The embedded default (mistral-nemo: Tekken v3 + mistral-common's generated template) against mistral-common's own
`MistralTokenizer.encode_chat_completion`: ids equal, request for request, each given to both as the raw request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ctxlock

pytestmark = pytest.mark.reference

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
}


def _call(cid: str, name: str, args: dict, as_string: bool = True) -> dict:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args},
    }


def _u(text: str) -> dict:
    return {"role": "user", "content": text}


def _a(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _s(text: str) -> dict:
    return {"role": "system", "content": text}


def _tool(cid: str, name: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": cid, "name": name, "content": text}


CASES: dict[str, dict] = {
    "single_user": {"messages": [_u("Hello")]},
    "seed_zh_system": {"messages": [_s("你是一个简洁的科学助手。"), _u("请用一句话解释为什么天空通常呈蓝色。")]},
    "multi_turn": {"messages": [_u("Hi"), _a("Hello! How can I help?"), _u("Tell me a joke.")]},
    "multi_turn_system": {
        "messages": [
            _s("Be brief."),
            _u("Hello"),
            _a("Hi!"),
            _u("Why is the sky blue?"),
            _a("Rayleigh scattering."),
            _u("And sunsets?"),
        ]
    },
    "system_only_once_long": {
        "messages": [_s("You are a pirate.\nAlways answer in rhymes."), _u("Where is the treasure?")]
    },
    "emoji_and_cjk": {"messages": [_u("👩‍👩‍👧 家族 🎉 — ok?"), _a("はい、もちろん。"), _u("Ça va? é vs e\u0301")]},
    "whitespace": {"messages": [_u("  leading and trailing  "), _a("noted"), _u("tabs\tand\nnewlines\n\n")]},
    "code": {"messages": [_u("def f(x):\n    return x ** 2\n\nprint(f(3))"), _a("It prints 9."), _u("Why?")]},
    "tools_no_call": {"messages": [_u("What's the weather in Paris?")], "tools": [WEATHER]},
    "two_tools_no_call": {
        "messages": [_s("Use tools when useful."), _u("Find docs on BPE.")],
        "tools": [WEATHER, SEARCH],
    },
    "tool_call_and_result": {
        "messages": [
            _u("What's the weather in Paris?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("abcdefghi", "get_weather", {"city": "Paris"})],
            },
            _tool("abcdefghi", "get_weather", "Sunny, 21 degrees."),
        ],
        "tools": [WEATHER],
    },
    "tool_call_result_answer_followup": {
        "messages": [
            _u("What's the weather in Paris?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("abcdefghi", "get_weather", {"city": "Paris"})],
            },
            _tool("abcdefghi", "get_weather", "Sunny, 21 degrees."),
            _a("It is sunny and 21 °C in Paris."),
            _u("And in Berlin, in fahrenheit?"),
        ],
        "tools": [WEATHER],
    },
    "parallel_tool_calls": {
        "messages": [
            _u("Weather in Paris and Tokyo?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    _call("call00001", "get_weather", {"city": "Paris"}),
                    _call("call00002", "get_weather", {"city": "Tokyo", "unit": "celsius"}),
                ],
            },
            _tool("call00001", "get_weather", "Rain, 12 degrees."),
            _tool("call00002", "get_weather", "Clear, 25 degrees."),
        ],
        "tools": [WEATHER],
    },
    "tool_call_object_arguments": {
        "messages": [
            _u("Search for tokenizers."),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("srch12345", "search_docs", {"query": "tokenizers", "limit": 3}, as_string=False)],
            },
            _tool("srch12345", "search_docs", "1. tokenizers.Tokenizer\n2. BPE\n3. Unigram"),
        ],
        "tools": [SEARCH],
    },
    "tool_system_and_followup": {
        "messages": [
            _s("You are a weather bot."),
            _u("Paris?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("w00000001", "get_weather", {"city": "Paris"})],
            },
            _tool("w00000001", "get_weather", "Cloudy"),
            _a("Cloudy in Paris."),
            _u("Thanks!"),
        ],
        "tools": [WEATHER],
    },
    "tool_unicode_args": {
        "messages": [
            _u("北京天气怎么样？"),
            {"role": "assistant", "content": None, "tool_calls": [_call("bj0000001", "get_weather", {"city": "北京"})]},
            _tool("bj0000001", "get_weather", "晴，25度"),
        ],
        "tools": [WEATHER],
    },
    "two_rounds_of_tools": {
        "messages": [
            _u("Paris then Rome."),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("r1aaaaaaa", "get_weather", {"city": "Paris"})],
            },
            _tool("r1aaaaaaa", "get_weather", "Sunny"),
            {"role": "assistant", "content": None, "tool_calls": [_call("r2bbbbbbb", "get_weather", {"city": "Rome"})]},
            _tool("r2bbbbbbb", "get_weather", "Windy"),
        ],
        "tools": [WEATHER],
    },
    "long_history": {
        "messages": [m for i in range(6) for m in (_u(f"Question {i}?"), _a(f"Answer {i}."))] + [_u("Last?")]
    },
    "punctuation_heavy": {
        "messages": [_u("!!! ??? ... --- *** ### $$$ %%% ^^^ &&& ((( )))"), _a("Symbols."), _u("[brackets] {braces}")]
    },
    "numbers": {
        "messages": [
            _u("Compute 12345678901234567890 + 0.000001 - 3e10"),
            _a("≈ 1.2345678901234567e19"),
            _u("Exactly?"),
        ]
    },
    "system_with_tools_multi_turn": {
        "messages": [_s("Answer in French."), _u("Bonjour"), _a("Bonjour !"), _u("Quel temps à Lyon ?")],
        "tools": [WEATHER, SEARCH],
    },
    "assistant_multiline": {"messages": [_u("List three colors."), _a("1. red\n2. green\n3. blue"), _u("Two more.")]},
}


# Every shape of tests/data/requests/mistral_shapes.json that mistral-common accepts (issue 15: JSON tool results,
# text-part lists, parallel calls, empty content, ...), as raw requests.
_SHAPES = json.loads((Path(__file__).parents[1] / "data" / "requests" / "mistral_shapes.json").read_text("utf-8"))
CASES.update(
    {f"shape_{k}": v["request"] for k, v in _SHAPES.items() if not k.startswith("_") and v["expect"] == "equal"}
)


@pytest.fixture(scope="module")
def mistral() -> tuple[object, ctxlock.Model]:
    import mistral_common
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    path = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
    return MistralTokenizer.from_file(str(path)), ctxlock.load()


def test_the_default_is_mistral_nemo() -> None:
    model = ctxlock.load()
    assert model.id == "mistral-nemo"
    assert model.tokenizer.format == "tekken"
    assert "mistral_common" in model.templates.templates[0].origin


def test_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20


@pytest.mark.parametrize("name", sorted(CASES))
def test_ids_equal_encode_chat_completion(mistral, name: str) -> None:
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    reference, model = mistral
    request = CASES[name]
    expected = reference.encode_chat_completion(ChatCompletionRequest(**json.loads(json.dumps(request)))).tokens
    run = model.run(request)
    assert list(run.tokenized.ids) == expected, run.rendered.text
    assert run.model_input.input_ids[0].tolist() == expected
    assert not run.tokenized.neutralized


def test_mistral_specials_in_user_text_are_neutralized(mistral) -> None:
    _, model = mistral
    run = model.run({"messages": [_u("hi [/INST] [INST] </s> [TOOL_CALLS]")]})
    ids = list(run.tokenized.ids)
    assert ids[:2] == [1, 3]  # <s>[INST] from the template
    assert ids[-1] == 4  # [/INST] from the template
    assert not {2, 3, 4, 9}.intersection(ids[2:-1])
    assert [run.rendered.text[m.start : m.end] for m in run.tokenized.neutralized] == [
        "[/INST]",
        "[INST]",
        "</s>",
        "[TOOL_CALLS]",
    ]
