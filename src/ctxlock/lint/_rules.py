"""The lint rules that read the template and its probe renders: unread arguments, double BOS, history rewriting,
content format, reachable raises and nondeterminism. Each takes the `Lint` context and returns its findings; the
training-mask and portability rules are in their own modules. docs/template-checks.md lists every rule with the
public reports it comes from."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes

from ctxlock.errors import CtxlockError, TemplateLimitError
from ctxlock.lint import _tree as tree_of
from ctxlock.lint._findings import Finding, Rule, Severity
from ctxlock.pipeline import Pipeline
from ctxlock.probes import (
    PROBE_NOW,
    Corpus,
    Probe,
    ProbeRender,
    Verdict,
    capabilities,
    excerpt,
    render_probe,
    text_difference,
)
from ctxlock.template import ChatTemplate, Rendered, content_format


@dataclass(frozen=True)
class Lint:
    """What every rule reads: the model (its tokenizer and special tokens), the template and its syntax tree, the
    probe corpus and its renders, and the template arguments the user passes (`--var`)."""

    model: Pipeline
    template: ChatTemplate
    tree: nodes.Template
    corpus: Corpus
    renders: tuple[ProbeRender, ...]
    variables: Mapping[str, Any]
    # the probes of the rules' own renders that ran out of time (`render`)
    slow: list[str] = dataclasses.field(default_factory=list)

    def render(self, probe: Probe, *, variables: Mapping[str, Any] | None = None) -> ProbeRender:
        """A rule's own render of `probe` (a variant of a corpus probe). Each render has the sandbox's time limit;
        once `SLOW_RENDERS` renders (of the corpus and of the rules) have run out of it, a rule's further renders
        are refused with a TemplateLimitError, so the rule is listed as not run instead of costing that limit for
        every turn of every probe."""
        timed_out = sum(1 for r in self.renders if _timed_out(r)) + len(self.slow)
        if timed_out >= SLOW_RENDERS:
            raise TemplateLimitError(
                f"the template ran out of render time on {timed_out} probe render(s): the renders this rule adds "
                "were not run",
                path=f"probe {probe.name}",
                hint="a template this slow costs its time limit on every render",
            )
        r = render_probe(self.model, probe, self.template, variables=self.variables if variables is None else variables)
        if _timed_out(r):
            self.slow.append(probe.name)
        return r

    def by_name(self) -> dict[str, ProbeRender]:
        return {r.probe.name: r for r in self.renders}


SLOW_RENDERS = 2


def _timed_out(r: ProbeRender) -> bool:
    return r.error is not None and r.error.type == TemplateLimitError.__name__ and "took longer than" in r.error.message


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "unread-argument",
            "a template argument or request field the template never reads",
            "enable_thinking: false silently dropped (raullenchai/Rapid-MLX#387); thinking_mode vs enable_thinking "
            "(lablup/mlxcel#811); nobodywho-ooo/nobodywho#397",
        ),
        Rule(
            "double-bos",
            "the template writes the BOS and the tokenizer adds one",
            "huggingface/transformers#37686, sgl-project/sglang#888, unslothai/unsloth#10312, ggml-org/llama.cpp#15086",
        ),
        Rule(
            "history-rewrite",
            "the render of a longer conversation does not extend the render of its beginning",
            "breaks prompt caching and multi-turn RL (earlier reasoning dropped, a generation prompt that differs "
            "from the assistant turn's header)",
        ),
        Rule(
            "content-format",
            "whether the template reads content as a string or a list of parts",
            "vllm-project/vllm#53824 and #55567: string-vs-list content detected wrongly",
        ),
        Rule(
            "reachable-raise",
            "raise_exception reached by an ordinary request",
            "system not first, roles not alternating, a tool call without an id: a server answers 400 or 500",
        ),
        Rule(
            "render-error",
            "an ordinary request that fails to render with an error other than the template's own raise",
            "an undefined attribute or a type error on a request shape the template did not expect",
        ),
        Rule(
            "nondeterminism",
            "a render that reads the clock or draws random numbers",
            "two runs on different days (or seeds) give different ids; ggml-org/ik_llama.cpp#693 (strftime_now)",
        ),
        Rule(
            "training-mask",
            "no {% generation %} tags, or tags that disagree with ctxlock's provenance mask",
            "return_assistant_tokens_mask needs the tags; training and serving with different templates "
            "(princeton-nlp/SimPO#24, axolotl-ai-cloud/axolotl#1832)",
        ),
        Rule(
            "portability",
            "a construct another Jinja engine rejects or renders differently",
            "templates that work in Jinja2 but not in minijinja (TGI, mistral.rs) or @huggingface/jinja "
            "(transformers.js): huggingface/optimum-intel#1221, ggml-org/ik_llama.cpp#693",
        ),
    )
}

# Names people pass for a template argument that the template calls otherwise (the reports above).
_ALIASES = {
    "thinking_mode": ("enable_thinking", "thinking"),
    "thinking": ("enable_thinking",),
    "enable_thinking": ("thinking", "thinking_mode", "reasoning"),
    "enable_reasoning": ("enable_thinking", "reasoning"),
    "reasoning": ("enable_thinking", "reasoning_effort"),
    "reasoning_effort": ("enable_thinking", "reasoning"),
    "tools_in_user_message": ("tools",),
}


def _suggest(name: str, read: Sequence[str]) -> list[str]:
    near = [a for a in _ALIASES.get(name, ()) if a in read]
    for m in difflib.get_close_matches(name, list(read), n=3, cutoff=0.6):
        if m not in near:
            near.append(m)
    return near


def unread_arguments(lint: Lint) -> list[Finding]:
    """The arguments the user passes that the template never reads, or reads to no effect; request fields the
    probes show the template drops."""
    read = tree_of.arguments_read(lint.tree)
    out: list[Finding] = []
    for name, value in lint.variables.items():
        if name not in tree_of.variables_read(lint.tree):
            near = _suggest(name, list(read))
            takes = ", ".join(read) or "no argument"
            hint = f"did you mean {' or '.join(near)}?" if near else f"the template takes {takes}"
            out.append(
                Finding(
                    "unread-argument",
                    Severity.ERROR,
                    f"the template never reads {name!r}: passing {name}={json.dumps(value)} changes nothing",
                    hint=hint,
                    data={"argument": name, "suggestions": near},
                )
            )
        elif _no_effect(lint, name):
            out.append(
                Finding(
                    "unread-argument",
                    Severity.WARNING,
                    f"{name!r} is read (line {read.get(name, '?')}) but {name}={json.dumps(value)} changes no probe's "
                    "render",
                    line=read.get(name),
                    hint="check the value's type and spelling the template tests for (true/false, a string?)",
                    data={"argument": name},
                )
            )
    out += _dropped_fields(lint)
    return out


def _no_effect(lint: Lint, name: str) -> bool:
    if not any(r.ok for r in lint.renders):
        return False  # nothing renders with or without it: no effect to see (the rule is listed as not run)
    without = {k: v for k, v in lint.variables.items() if k != name}
    for r in lint.renders:
        other = lint.render(r.probe, variables=without)
        if r.ok != other.ok or r.text != other.text:
            return False
    return True


_FIELDS = {  # capability -> (request field, severity when dropped, the key the template would read)
    "tools": ("tools", Severity.WARNING, "tools"),
    "tool_calls": ("messages[].tool_calls", Severity.WARNING, "tool_calls"),
    "tool_results": ("tool messages' content", Severity.WARNING, "content"),
    "documents": ("documents", Severity.NOTE, "documents"),
    "name": ("messages[].name", Severity.NOTE, "name"),
    "reasoning": ("messages[].reasoning_content", Severity.NOTE, "reasoning_content"),
}


def _dropped_fields(lint: Lint) -> list[Finding]:
    caps = capabilities(lint.renders)
    out = []
    for cap, (field, severity, key) in _FIELDS.items():
        v: Verdict = caps[cap]
        if v.verdict != "dropped":
            continue
        lines = _field_reads(lint.tree, key)
        where = f"; it reads {key!r} at line {lines[0]} without writing it" if lines else ""
        out.append(
            Finding(
                "unread-argument",
                severity,
                f"{field} never reach the rendered text (probe {v.probe}){where}",
                line=lines[0] if lines else None,
                probe=v.probe,
                hint=f"a request's {field}: silently ignored by this template",
                data={"field": field, "capability": cap},
            )
        )
    return out


def _field_reads(tree: nodes.Template, key: str) -> list[int]:
    """Where the template reads a request field it drops: `tools` and `documents` as the variables they are, a
    message's key off a message (not `tool_call.name` for a message's `name`); a tool message's content is read as
    every message's content, so no line says where it is dropped."""
    if key in ("tools", "documents"):
        first = tree_of.variables_read(tree).get(key)
        return [] if first is None else [first]
    return [] if key == "content" else tree_of.message_key_reads(tree, key)


def double_bos(lint: Lint) -> list[Finding]:
    """The template writes the BOS token and the tokenizer adds one when encoding with special tokens."""
    bos = lint.model.special_tokens.get("bos_token")
    tok = lint.model.tokenizer
    bos_id = tok.token_to_id(bos) if bos else None
    first = next((r for r in lint.renders if r.rendered is not None and r.ids), None)
    if not bos or bos_id is None or first is None or first.rendered is None:
        return []
    if not first.rendered.text.startswith(bos):
        return []
    added = tok.encode("x", add_special_tokens=True)
    if bos_id not in added[:1]:
        return []
    lines = tree_of.literal_lines(lint.template.source, bos) + [n.lineno for n in _bos_names(lint.tree)]
    line = min(lines) if lines else None
    return [
        Finding(
            "double-bos",
            Severity.WARNING,
            f"the template writes the BOS {bos!r} and the tokenizer adds one with add_special_tokens=True: rendering "
            f"then encoding with the default gives ids [{bos_id}, {bos_id}, ...]",
            line=line,
            probe=first.probe.name,
            hint="encode the render with add_special_tokens=False (transformers' apply_chat_template does), or drop "
            "the template's BOS",
            data={"bos_token": bos, "bos_id": bos_id},
        )
    ]


def _bos_names(tree: nodes.Template) -> list[nodes.Name]:
    return [n for n in tree.find_all(nodes.Name) if n.name == "bos_token" and n.ctx == "load"]


def _cut(probe: Probe, k: int, gen: bool) -> Probe:
    request = {**probe.request, "messages": list(probe.request["messages"][:k])}
    p = probe.with_request(request, suffix=f"{k}")
    return Probe(p.name, p.request, gen, False, p.description, p.exercises, p.source)


def _rendered(lint: Lint, p: Probe) -> Rendered | None:
    r = lint.render(p)
    return r.rendered


def _paths_at(r: Rendered, start: int, end: int) -> list[str]:
    return sorted({s.path for s in r.request_spans if s.start < end and s.end > start})


HISTORY_CUTS = 16  # assistant turns checked at each end of a probe's conversation by history-rewrite


def history_rewrite(lint: Lint) -> list[Finding]:
    """For each multi-turn probe: the render cut before an assistant turn (with the generation prompt) must be a
    prefix of the render with it, and the render up to an assistant turn a prefix of the render with the next
    turn. One finding per kind, with the probes that show it. Each check renders the conversation twice, so a long
    one is checked at its first and last `HISTORY_CUTS` assistant turns, and a note says so."""
    out: list[Finding] = []
    kinds: dict[str, list[Finding]] = {}
    for probe in lint.corpus:
        msgs = probe.request.get("messages") or []
        if len(msgs) < 3 or probe.name.startswith(("system-not-first", "consecutive", "assistant-first")):
            continue
        cuts = [k for k in range(1, len(msgs)) if msgs[k].get("role") == "assistant"]
        if len(cuts) > 2 * HISTORY_CUTS:
            out.append(_cuts_note(probe, len(cuts)))
            cuts = cuts[:HISTORY_CUTS] + cuts[-HISTORY_CUTS:]
        for k in cuts:
            found = _prefix_check(lint, probe, k, "generation") or (
                _prefix_check(lint, probe, k + 1, "history") if k + 1 < len(msgs) else None
            )
            if found is not None:
                kinds.setdefault(found.data["kind"], []).append(found)
                break
    for group in kinds.values():
        first = group[0]
        names = [f.probe for f in group if f.probe]
        more = f" (and in {len(group) - 1} more probe(s): {', '.join(names[1:])})" if len(group) > 1 else ""
        out.append(
            Finding(
                first.rule,
                first.severity,
                first.message + more,
                first.line,
                first.probe,
                first.hint,
                {**first.data, "probes": names},
            )
        )
    return out


def _cuts_note(probe: Probe, n: int) -> Finding:
    return Finding(
        "history-rewrite",
        Severity.NOTE,
        f"probe {probe.name} has {n} assistant turns: history-rewrite checked the first {HISTORY_CUTS} and the last "
        f"{HISTORY_CUTS} (each check renders the conversation twice), not the {n - 2 * HISTORY_CUTS} between",
        probe=probe.name,
        hint="a probe of fewer turns is checked at every one",
        data={"kind": "partial", "assistant_turns": n, "checked": 2 * HISTORY_CUTS},
    )


def _prefix_check(lint: Lint, probe: Probe, k: int, kind: str) -> Finding | None:
    short = _rendered(lint, _cut(probe, k, kind == "generation"))
    long = _rendered(lint, _cut(probe, k + 1, False))
    if short is None or long is None or long.text.startswith(short.text):
        return None
    at = text_difference(short.text, long.text) or 0
    paths = _paths_at(short, at, len(short.text))
    if kind == "generation":
        message = (
            f"the generation prompt does not match how the assistant turn messages[{k}] is rendered: the prompt "
            f"writes {excerpt(short.text, at)!r}, the turn {excerpt(long.text, at)!r}"
        )
        hint = "a server that caches the prompt re-reads it; a model trained on the turn sees other text at inference"
    else:
        what = f" ({', '.join(paths)})" if paths else ""
        message = (
            f"adding messages[{k}] rewrites earlier turns at character {at}{what}: {excerpt(short.text, at)!r} "
            f"becomes {excerpt(long.text, at)!r}"
        )
        hint = "prefix caching misses from here on, and multi-turn RL sees different history than the model wrote"
    return Finding(
        "history-rewrite",
        Severity.WARNING,
        message,
        probe=probe.name,
        hint=hint,
        data={"kind": kind, "message_index": k, "offset": at, "paths": paths},
    )


_LIST_REPR = re.compile(r"\[\{['\"]type['\"]: ['\"]text['\"]")


def content_format_rule(lint: Lint) -> list[Finding]:
    """What the syntax tree says the template reads content as, confirmed by rendering a list of parts as sent."""
    detected = str(content_format(lint.template.source))
    lines = tree_of.output_lines(lint.tree, "content")
    probe = next((p for p in lint.corpus if p.name == "content-parts"), None)
    if probe is None:
        return []
    request = dict(probe.request)
    try:
        rendered = lint.model.render(
            request, chat_template=lint.template, content_format="openai", now=PROBE_NOW, seed=0
        )
    except CtxlockError as exc:
        writes_repr, failed = False, exc.message
    else:
        writes_repr, failed = bool(_LIST_REPR.search(rendered.text)), ""
    line = lines[0] if lines else None
    if detected == "openai" and (writes_repr or failed):
        what = "writes the list as Python text" if writes_repr else f"fails on it ({failed})"
        return [
            Finding(
                "content-format",
                Severity.WARNING,
                f"the syntax tree says the template reads content as a list of parts, but given one it {what}",
                line=line,
                probe=probe.name,
                hint="send content as a string, or render with content_format='string' (vLLM's flattening)",
                data={"detected": detected, "confirmed": False},
            )
        ]
    if detected == "string" and writes_repr:
        message = "the template reads content as a string: a list of parts sent as is (transformers) is written as "
        message += "Python text; ctxlock and vLLM join the text parts first"
        return [
            Finding(
                "content-format",
                Severity.NOTE,
                message,
                line=line,
                probe=probe.name,
                data={"detected": detected, "confirmed": True},
            )
        ]
    return [
        Finding(
            "content-format",
            Severity.NOTE,
            f"the template reads content as {'a list of parts' if detected == 'openai' else 'a string'}"
            + ("" if detected == "openai" else ", and handles a list of parts too"),
            line=line,
            probe=probe.name,
            data={"detected": detected, "confirmed": True},
        )
    ]


def reachable_raises(lint: Lint) -> list[Finding]:
    """The template's raises that ordinary probes reach (one finding per raise: its line and message, as two raises
    can share a line), other render errors, and the raises no probe reaches."""
    by_raise: dict[tuple[int, str], list[ProbeRender]] = {}
    errors: dict[tuple[int | None, str, str], list[ProbeRender]] = {}
    out: list[Finding] = []
    for r in lint.renders:
        if r.error is None:
            continue
        if r.error.raised and r.error.line is not None:
            by_raise.setdefault((r.error.line, r.error.message), []).append(r)
        else:
            errors.setdefault((r.error.line, r.error.type, r.error.message), []).append(r)
    for (line, kind, message), hits in errors.items():
        shapes = "; ".join(h.probe.description.rstrip(".") for h in hits[:3]) + (" …" if len(hits) > 3 else "")
        out.append(
            Finding(
                "render-error",
                Severity.WARNING,
                f"{len(hits)} ordinary request(s) fail with {kind}: {message} ({shapes})",
                line=line,
                probe=hits[0].probe.name,
                hint="the template does not handle these request shapes; probes: "
                + ", ".join(h.probe.name for h in hits),
                data={"probes": [h.probe.name for h in hits]},
            )
        )
    for (line, message), hits in sorted(by_raise.items()):
        names = ", ".join(h.probe.name for h in hits)
        shapes = "; ".join(h.probe.description.rstrip(".") for h in hits[:3])
        out.append(
            Finding(
                "reachable-raise",
                Severity.WARNING,
                f"raise_exception({message!r}) is reached by {len(hits)} ordinary request(s): {shapes}",
                line=line,
                probe=hits[0].probe.name,
                hint=f"probes: {names}",
                data={"probes": [h.probe.name for h in hits]},
            )
        )
    # A raise whose message is not a literal is taken as reached when a raise on its line is.
    lines = {line for line, _ in by_raise}
    unreached = [
        c
        for c in tree_of.calls(lint.tree, "raise_exception")
        if (c.line, c.message) not in by_raise and not (c.message == "" and c.line in lines)
    ]
    if unreached:
        out.append(
            Finding(
                "reachable-raise",
                Severity.NOTE,
                f"{len(unreached)} raise_exception call(s) no probe reaches, at line(s) "
                + ", ".join(str(c.line) for c in unreached),
                line=unreached[0].line,
                hint="add a probe (--probes FILE) for the request shape each one guards",
                data={"lines": [c.line for c in unreached]},
            )
        )
    return out


def nondeterminism(lint: Lint) -> list[Finding]:
    """Renders that read the clock (`strftime_now`) or draw from `random`/`lipsum`."""
    out: list[Finding] = []
    clock = [r for r in lint.renders if r.rendered is not None and r.rendered.clock_used]
    clock_lines = [c.line for c in tree_of.calls(lint.tree, "strftime_now")]
    if clock:
        out.append(
            Finding(
                "nondeterminism",
                Severity.WARNING,
                f"the render reads the clock (strftime_now) in {len(clock)} probe(s): the same request gives other "
                "ids on another day",
                line=clock_lines[0] if clock_lines else None,
                probe=clock[0].probe.name,
                hint="ctxlock records the clock it used (`now`) and `--now` pins it; transformers and vLLM read the "
                "machine's clock",
                data={"lines": clock_lines},
            )
        )
    draws = [(r, d) for r in lint.renders if r.rendered is not None for d in r.rendered.draws]
    if draws:
        r, d = draws[0]
        out.append(
            Finding(
                "nondeterminism",
                Severity.WARNING,
                f"the render draws random values ({d.get('what', 'random')}) in {len({x.probe.name for x, _ in draws})}"
                " probe(s): renders differ by seed",
                line=_int(d.get("line")),
                probe=r.probe.name,
                hint="ctxlock seeds it (seed 0 by default, recorded); transformers draws from Python's global random",
            )
        )
    return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) else None
