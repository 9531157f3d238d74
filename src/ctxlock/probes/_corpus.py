"""The probe corpus: the shipped `corpus.json` and a user's own probes (`--probes FILE`), read as hostile input.

A probe file is a JSON object `{"probes": [...]}` (or the list alone). Each probe is an object:

- `name`: unique, 1-64 characters of letters, digits, `.`, `_` and `-`;
- `request`: an OpenAI chat request (`messages`, and `tools`, `documents`, `chat_template_kwargs` when the probe
  needs them), checked with ctxlock's own request parser when the file is read, so a bad probe is named at once;
- `add_generation_prompt` (default true), `continue_final_message` (default false);
- `description` and `exercises` (the capabilities it exercises: `system`, `tools`, `tool_calls`, `tool_results`,
  `reasoning`, `content_parts`, `name`, `documents`, `multi_turn`, `order`, `continue_final`, `generation_prompt`).

A user's probe with the name of a shipped one replaces it; the others are added after the shipped ones."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ctxlock.errors import CtxlockError, InputError
from ctxlock.outside import loads_outside, read_input
from ctxlock.request import parse_request

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_KEYS = frozenset({"name", "description", "exercises", "request", "add_generation_prompt", "continue_final_message"})
EXERCISES = frozenset(
    {
        "system",
        "tools",
        "tool_calls",
        "tool_results",
        "reasoning",
        "content_parts",
        "name",
        "documents",
        "multi_turn",
        "order",
        "continue_final",
        "generation_prompt",
    }
)
MAX_PROBES = 1000
# Messages in one probe: every rule renders a probe, some once per turn (lint's history-rewrite), so a probe file of
# one endless conversation would hold a run for hours.
MAX_MESSAGES = 1000


@dataclass(frozen=True)
class Probe:
    """One conversation of the corpus, with the render options it is rendered with."""

    name: str
    request: Mapping[str, Any]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    description: str = ""
    exercises: tuple[str, ...] = ()
    source: str = "ctxlock"  # "ctxlock" (shipped) or the file it came from

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "exercises": list(self.exercises),
            "request": json.loads(json.dumps(self.request)),
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
            "source": self.source,
        }

    def with_request(self, request: Mapping[str, Any], *, suffix: str) -> Probe:
        """This probe with another request (a variant a rule builds), named `<name>+<suffix>`."""
        return Probe(
            f"{self.name}+{suffix}",
            request,
            self.add_generation_prompt,
            self.continue_final_message,
            self.description,
            self.exercises,
            self.source,
        )


@dataclass(frozen=True)
class Corpus:
    """The probes, in order, and where they came from."""

    probes: tuple[Probe, ...]
    sources: tuple[str, ...] = field(default=("ctxlock",))

    def __iter__(self) -> Iterator[Probe]:
        return iter(self.probes)

    def __len__(self) -> int:
        return len(self.probes)

    def named(self, name: str) -> Probe:
        for p in self.probes:
            if p.name == name:
                return p
        raise InputError(f"no probe named {name!r}", path="probes", hint=f"known: {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.probes)


def _probe(raw: Any, where: str, source: str) -> Probe:
    if not isinstance(raw, dict):
        raise InputError("a probe is a JSON object", path=where, hint='{"name": ..., "request": {"messages": [...]}}')
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise InputError(
            f"unknown key {unknown[0]!r}", path=f"{where}.{unknown[0]}", hint=f"a probe has {', '.join(sorted(_KEYS))}"
        )
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InputError(
            "name must be 1-64 letters, digits, '.', '_' or '-'", path=f"{where}.name", hint='e.g. "tool-call"'
        )
    request = raw.get("request")
    if not isinstance(request, dict):
        raise InputError("request must be a chat request object", path=f"{where}.request", hint='{"messages": [...]}')
    messages = request.get("messages")
    if isinstance(messages, list) and len(messages) > MAX_MESSAGES:
        raise InputError(
            f"{len(messages)} messages, more than {MAX_MESSAGES}",
            path=f"{where}.request.messages",
            hint="a probe is one conversation a server meets: shorten it, as each is rendered many times",
        )
    try:
        parse_request(request)
    except CtxlockError as exc:
        inner = f".{exc.path}" if exc.path and not exc.path.startswith("$") else (exc.path or "")[1:]
        raise InputError(exc.message, path=f"{where}.request{inner}", hint=exc.hint) from None
    flags = {}
    for key, default in (("add_generation_prompt", True), ("continue_final_message", False)):
        value = raw.get(key, default)
        if not isinstance(value, bool):
            raise InputError(f"{key} must be true or false", path=f"{where}.{key}", hint="a JSON boolean")
        flags[key] = value
    exercises = raw.get("exercises", [])
    if not isinstance(exercises, list) or not all(isinstance(e, str) and e in EXERCISES for e in exercises):
        raise InputError(
            "exercises must be a list of capability names", path=f"{where}.exercises", hint=", ".join(sorted(EXERCISES))
        )
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise InputError("description must be a string", path=f"{where}.description", hint="one sentence")
    return Probe(name, request, description=description, exercises=tuple(exercises), source=source, **flags)


def _probes(data: Any, where: str, source: str) -> list[Probe]:
    items = data.get("probes") if isinstance(data, dict) else data
    if isinstance(data, dict) and set(data) - {"probes", "version", "description"}:
        extra = sorted(set(data) - {"probes", "version", "description"})[0]
        raise InputError(f"unknown key {extra!r}", path=f"{where}.{extra}", hint='a probe file is {"probes": [...]}')
    base = f"{where}.probes" if isinstance(data, dict) else where
    if not isinstance(items, list):
        raise InputError("a probe file holds a list of probes", path=base, hint='{"probes": [{"name": ...}]}')
    if len(items) > MAX_PROBES:
        raise InputError(f"{len(items)} probes, more than {MAX_PROBES}", path=base, hint="split the file")
    out = [_probe(raw, f"{base}[{i}]", source) for i, raw in enumerate(items)]
    seen: set[str] = set()
    for i, p in enumerate(out):
        if p.name in seen:
            raise InputError(f"probe name {p.name!r} given twice", path=f"{base}[{i}].name", hint="names are unique")
        seen.add(p.name)
    return out


def _shipped() -> list[Probe]:
    text = resources.files("ctxlock.probes").joinpath("corpus.json").read_text("utf-8")
    return _probes(json.loads(text), "$", "ctxlock")


def read_probes(path: str | Path) -> list[Probe]:
    """The probes of a user's file (bounded read, strict JSON), each checked; errors name the file and JSON path."""
    label = str(path)
    raw = read_input(path, label=label)
    try:
        data = loads_outside(raw, f"{label} $", error=InputError)
    except InputError as exc:
        if exc.hint:
            raise
        # Text that is not JSON at all comes without a hint: say what the file should be.
        raise InputError(exc.message, path=exc.path, hint='a probe file is JSON: {"probes": [...]}') from None
    return _probes(data, f"{label} $", label)


def load_corpus(extra: str | Path | Sequence[str | Path] | None = None, *, only: Sequence[str] = ()) -> Corpus:
    """The shipped corpus, extended (or overridden by name) with the probes of `extra` files, in order; `only`
    keeps the probes of these names."""
    probes = _shipped()
    sources = ["ctxlock"]
    files = [] if extra is None else [extra] if isinstance(extra, str | Path) else list(extra)
    for f in files:
        sources.append(str(f))
        for p in read_probes(f):
            idx = next((i for i, q in enumerate(probes) if q.name == p.name), None)
            if idx is None:
                probes.append(p)
            else:
                probes[idx] = p
    if only:
        known = {p.name for p in probes}
        missing = [n for n in only if n not in known]
        if missing:
            raise InputError(f"no probe named {missing[0]!r}", path="--only", hint=f"known: {', '.join(sorted(known))}")
        probes = [p for p in probes if p.name in set(only)]
    return Corpus(tuple(probes), tuple(sources))
