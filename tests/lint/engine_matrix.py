"""The portability matrix: every real chat template of the fixtures (`fetched.template_paths()`, llama.cpp's 70)
rendered with a few fixed conversations by jinja2 (the reference), minijinja and @huggingface/jinja
(`ctxlock.lint._engines`), and how each engine departs from the reference.

    python tests/lint/engine_matrix.py            print the summary
    python tests/lint/engine_matrix.py --write    also write tests/data/lint/engine_matrix.json

The JSON records, template by template, where each engine departs from jinja2 on these conversations (the docs
table comes from `ctxlock lint` itself, scripts/lint_survey.py); tests/lint/test_engines.py checks that the
committed file is what the engines render now (whole for a sample, jinja2's column for every template).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if __name__ == "__main__":  # run as a script: tests/ (fetched) and src/ on the path, as pytest has them
    sys.path[:0] = [str(HERE.parent), str(HERE.parents[1] / "src")]

import fetched  # noqa: E402
from ctxlock.lint import _engines as engines  # noqa: E402

MATRIX = HERE.parent / "data" / "lint" / "engine_matrix.json"
TIMEOUT_S = 10.0
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city (in degrees Celsius).",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
        },
    },
}

# The conversations: a plain user turn; a system turn and a finished exchange before the next user turn; a tool
# call and its result, with the tools given. Tool-call arguments are a mapping, as transformers passes them.
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "user": {"messages": [{"role": "user", "content": "Hello, who are you?"}], "add_generation_prompt": True},
    "system_multi_turn": {
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3 + 3?"},
        ],
        "add_generation_prompt": True,
    },
    "tool_call": {
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temperature_c": 21}'},
        ],
        "tools": [WEATHER_TOOL],
        "add_generation_prompt": True,
    },
}


def contexts() -> list[dict[str, Any]]:
    return [{**SPECIAL, **c} for c in CONVERSATIONS.values()]


def outcome(result: engines.EngineResult) -> dict[str, Any]:
    if result.text is not None:
        return {"renders": True, "chars": len(result.text)}
    return {"renders": False, "error": result.error, "line": result.line, "limited": result.limited}


def _divergence(d: engines.Divergence | None) -> dict[str, Any] | None:
    if d is None:
        return None
    out: dict[str, Any] = {"verdict": d.verdict, "line": d.line, "message": d.message}
    if d.construct:
        out["construct"] = d.construct
    if d.verdict == "differs":
        out |= {"offset": d.offset, "reference": d.reference, "got": d.got}
    return out


def template_row(path: Path) -> dict[str, Any]:
    source = path.read_text(encoding="utf-8")
    runs = {e: engines.render_many(e, source, contexts(), timeout_s=TIMEOUT_S) for e in engines.ENGINES}
    row: dict[str, Any] = {}
    for k, name in enumerate(CONVERSATIONS):
        ref = runs["jinja2"][k]
        row[name] = {"jinja2": outcome(ref)} | {
            e: _divergence(engines.compare(ref, runs[e][k])) for e in engines.ENGINES if e != "jinja2"
        }
    return row


def build() -> dict[str, Any]:
    versions = {}
    for e in engines.ENGINES:
        probe = engines.render_with(e, "x", {}, timeout_s=TIMEOUT_S)
        if not probe.available:
            raise SystemExit(f"{e} is not available: {probe.why_unavailable}")
        versions[e] = probe.version
    templates = {p.name: template_row(p) for p in fetched.template_paths()}
    return {
        "engines": versions,
        "clock": engines.CLOCK.isoformat(),
        "conversations": {name: {**SPECIAL, **c} for name, c in CONVERSATIONS.items()},
        "templates": templates,
        "summary": summary(templates),
    }


def summary(templates: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for e in engines.ENGINES[1:]:
        differing = sorted(name for name, row in templates.items() if any(row[c][e] for c in row))
        cells = [row[c][e] for row in templates.values() for c in row if row[c][e]]
        verdicts = Counter(cell["verdict"] for cell in cells)
        # what the engine says when it fails where jinja2 renders, and how often (template x conversation)
        errors = Counter(
            cell["message"].split(" renders: ", 1)[-1].split(" (at `")[0]
            for cell in cells
            if cell["verdict"] == "rejects"
        )
        out[e] = {
            "templates_differing": len(differing),
            "of": len(templates),
            "verdicts": dict(verdicts),
            "rejects_with": dict(errors.most_common()),
            "templates": differing,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"write {MATRIX.relative_to(HERE.parents[1])}")
    args = parser.parse_args(argv)
    os.environ.setdefault(engines.HF_JINJA_ENV, str(fetched.hf_jinja_dir()))
    matrix = build()
    print(json.dumps(matrix["summary"], indent=1))
    if args.write:
        MATRIX.parent.mkdir(parents=True, exist_ok=True)
        MATRIX.write_text(json.dumps(matrix, indent=1, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
