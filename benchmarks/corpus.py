"""Synthetic chat corpora for the speed benchmarks: deterministic, mixed, and unique per request.

Messages mix English prose, Chinese, code, numbers, emoji and JSON tool calls, with sizes from a few words to a few
thousand, so that no single tokenizer path dominates. Words are drawn from a large generated vocabulary (not a
short list), so requests do not repeat each other's text and a run cache gets no free hits across requests.
"""

from __future__ import annotations

import random

_SYLLABLES = "ka lo mi ne ru sa ti vo an el is ot ur str pre con tion ment ing ed er ly".split()  # noqa: SIM905
_CJK = "天空为什么是蓝色光的散射瑞利大气分子波长短更强烈太阳白色我们看到的颜色取决于"
_CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }\n",
    "SELECT id, name FROM users WHERE age > 30;\n",
    "    if err != nil {\n        return err\n    }\n",
    "const xs = [1, 2, 3].map((x) => x ** 2);\n",
]
_EMOJI = ["😀", "🚀", "👩‍👩‍👧‍👦", "🇯🇵", "✨"]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))


def text(rng: random.Random, n_words: int) -> str:
    out: list[str] = []
    while len(out) < n_words:
        r = rng.random()
        if r < 0.70:
            w = _word(rng)
            out.append(w.capitalize() if rng.random() < 0.1 else w)
        elif r < 0.80:
            out.append("".join(rng.choice(_CJK) for _ in range(rng.randint(2, 12))))
        elif r < 0.86:
            out.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
        elif r < 0.90:
            out.append(rng.choice(_CODE))
        elif r < 0.92:
            out.append(rng.choice(_EMOJI))
        else:
            out.append(rng.choice([",", ".", "?", "!", "\n\n", " -", ":"]))
    return " ".join(out)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    },
]


def request(rng: random.Random, n_turns: int, *, tools: bool, call_ids: list[int], scale: float = 1.0) -> dict:
    def words(choices: list[int]) -> str:
        return text(rng, max(1, int(rng.choice(choices) * scale)))

    msgs: list[dict] = []
    if rng.random() < 0.7:
        msgs.append({"role": "system", "content": words([20, 80, 300])})
    for _ in range(n_turns):
        msgs.append({"role": "user", "content": words([10, 40, 150, 600])})
        if tools and rng.random() < 0.3:
            cid = f"call{call_ids[0]:06d}"
            call_ids[0] += 1
            args = {"q": text(rng, 5)}
            call = {"id": cid, "type": "function", "function": {"name": "search", "arguments": args}}
            msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": cid, "content": words([50, 300, 1200])})
        msgs.append({"role": "assistant", "content": words([30, 120, 500, 1500])})
    msgs.append({"role": "user", "content": words([10, 40, 150])})
    out: dict = {"messages": msgs}
    if tools:
        out["tools"] = TOOLS
    return out


def single_shot(n: int = 300, seed: int = 11, scale: float = 0.25) -> list[dict]:
    """`n` independent requests: 1-6 turns, a third with tools (about 2,400 tokens each at the default scale)."""
    rng = random.Random(seed)
    ids = [0]
    return [request(rng, rng.randint(1, 6), tools=rng.random() < 0.33, call_ids=ids, scale=scale) for _ in range(n)]


def conversation(turns: int, seed: int, scale: float = 0.25) -> list[dict]:
    """One chat replayed turn by turn: request k holds the whole history up to the k-th user message."""
    rng = random.Random(seed)
    ids = [0]
    full = request(rng, turns - 1, tools=seed % 2 == 0, call_ids=ids, scale=scale)
    msgs = full["messages"]
    out = []
    for k, m in enumerate(msgs):
        if m["role"] == "user":
            req = {"messages": msgs[: k + 1]}
            if "tools" in full:
                req["tools"] = full["tools"]
            out.append(req)
    return out
