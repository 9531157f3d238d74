"""A chat template's source as `--fix` edits it: jinja2's own lexer, each token placed back in the text, the pieces
that write output (`Unit`: literal text, a `{{ ... }}` expression and its `+`/`~` operands), and the edits that put
`{% generation %}` tags between them without changing what the template renders.

jinja2's lexer (https://jinja.palletsprojects.com/en/stable/templates/#whitespace-control) strips whitespace at
three places, which an inserted tag must not change: a `-` on a tag strips the whitespace next to it, `lstrip_blocks`
strips the spaces and tabs before a block tag at the start of a line, and `trim_blocks` removes the first newline
after a block tag. So a tag put right before an existing tag takes that tag's `-` (the text before it is stripped as
before), a tag put before text that starts with a newline ends with `+%}`, and one put after spaces that start a line
starts with `{%+`. Every edit is checked by rendering anyway (`ctxlock.lint._fix`)."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import jinja2

from ctxlock.template.sandbox import DEFAULT_LIMITS

_OPENERS = frozenset({"for", "if", "macro", "call", "filter", "set", "with", "block", "autoescape", "generation"})
_BUFFERED = frozenset({"macro", "call", "filter", "set", "generation"})  # their text is not output where it is written
_BLOCKERS = frozenset({"if", "else", "and", "or", "not", "in"})  # a name at depth 0 that keeps an expression whole
_SPLIT_OPS = frozenset({"+", "~"})
_NOT_SPLIT_OPS = frozenset({"-", "==", "!=", "<", ">", "<=", ">=", ","})
_GENERATION_TAG = re.compile(r"\{%[-+]?\s*(end)?generation\s*[-+]?%\}")


class SourceError(Exception):
    """The source cannot be edited token by token (a lexer error, or tokens that do not map back to the text)."""


@dataclass(frozen=True, slots=True)
class Tok:
    kind: str
    value: str
    start: int


@dataclass(frozen=True, slots=True)
class Element:
    """One piece of the source: literal text ("data": `start`..`end` is the text it writes, the whitespace stripped
    after it is the next element's `gap`), or a tag ("var", "block", "comment", "raw") from its opening delimiter
    to the end of its closing one (`close_end`) and the whitespace that closing delimiter consumed (`end`)."""

    kind: str
    start: int
    end: int
    close_end: int
    gap: int  # where the whitespace stripped before this element begins (== start when none)
    left: str  # "-", "+" or "" on the opening delimiter
    right: str  # "-", "+" or "" on the closing delimiter
    toks: tuple[Tok, ...]  # the tokens inside a tag, whitespace left out
    line: int

    @property
    def name(self) -> str:
        return self.toks[0].value if self.toks and self.toks[0].kind == "name" else ""


@dataclass(frozen=True, slots=True)
class Operand:
    start: int
    end: int
    const: str | None  # the value of a lone string literal, which can be cut


@dataclass(frozen=True, slots=True)
class Unit:
    """A piece that writes output where it stands: literal text ("data"), an expression ("var", its top-level
    `+`/`~` operands when it has two or more and nothing binds looser), or a block whose text is written as one
    ("opaque": a `{% filter %}` or `{% call %}` block, a `{% raw %}` block). `loops`: the enclosing `{% for X in ...
    %}` variables, innermost first (None for a loop over tuples)."""

    id: int
    kind: str
    element: int  # index in `Source.elements`
    line: int
    loops: tuple[str | None, ...]
    operands: tuple[Operand, ...] = ()


@dataclass(frozen=True, slots=True)
class Source:
    text: str
    elements: tuple[Element, ...]
    units: tuple[Unit, ...]

    def cell_text(self, unit: Unit, cell: tuple[int, int]) -> str:
        """The character of a cell (`cells`) of literal text or a string operand."""
        if unit.kind == "data":
            return self.text[self.elements[unit.element].start + cell[1]]
        const = unit.operands[cell[0]].const
        return const[cell[1]] if const else ""

    def excerpt(self, unit: Unit) -> str:
        e = self.elements[unit.element]
        text = " ".join(self.text[e.start : e.close_end].split())
        return text if len(text) <= 60 else text[:57] + "..."


# -- reading ------------------------------------------------------------------------------------------------------


def _lexer() -> jinja2.lexer.Lexer:
    # transformers' environment options that the lexer reads (its sandbox adds globals and extensions, not syntax).
    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True).lexer


def _tokens(text: str) -> list[Tok]:
    """jinja2's raw tokens, each with its offset in `text`; the text between them must be whitespace the lexer
    stripped."""
    out: list[Tok] = []
    at = 0
    try:
        stream = list(_lexer().tokeniter(text, None))
    except jinja2.TemplateSyntaxError as exc:
        raise SourceError(f"jinja2 cannot read the template: {exc.message} (line {exc.lineno})") from None
    for _, kind, value in stream:
        if not text.startswith(value, at):
            skip = at
            while skip < len(text) and text[skip] in " \t\n" and not text.startswith(value, skip):
                skip += 1
            if not text.startswith(value, skip):
                raise SourceError(f"a template token does not map back to the text near offset {at}")
            at = skip
        out.append(Tok(kind, value, at))
        at += len(value)
    if text[at:].strip(" \t\n"):
        raise SourceError("the end of the template does not map back to its tokens")
    return out


_CLOSERS = {"variable_begin": "variable_end", "block_begin": "block_end", "comment_begin": "comment_end"}


def _elements(text: str, toks: list[Tok]) -> list[Element]:
    out: list[Element] = []
    i, prev_end = 0, 0
    while i < len(toks):
        t = toks[i]
        line = text.count("\n", 0, t.start) + 1
        if t.kind == "data":
            out.append(
                Element("data", t.start, t.start + len(t.value), t.start + len(t.value), t.start, "", "", (), line)
            )
        elif t.kind == "raw_begin":
            j = i
            while toks[j].kind != "raw_end":
                j += 1
            end = toks[j].start + len(toks[j].value)
            out.append(Element("raw", t.start, end, end, prev_end, _ctl(t.value, 2), "", (), line))
            i = j
        elif t.kind in _CLOSERS:
            j = i + 1
            while toks[j].kind != _CLOSERS[t.kind]:
                j += 1
            close = toks[j]
            inner = tuple(x for x in toks[i + 1 : j] if x.kind != "whitespace")
            body = close.value.rstrip(" \t\n")
            kind = {"variable_begin": "var", "block_begin": "block", "comment_begin": "comment"}[t.kind]
            right = body[0] if body[:1] in ("-", "+") else ""
            ends = (close.start + len(body), close.start + len(close.value))
            out.append(Element(kind, t.start, ends[1], ends[0], prev_end, _ctl(t.value, 2), right, inner, line))
            i = j
        else:
            raise SourceError(f"an unexpected template token {t.kind!r} at line {line}")
        prev_end = out[-1].end
        i += 1
    return out


def _ctl(delimiter: str, size: int) -> str:
    return delimiter[size : size + 1] if delimiter[size : size + 1] in ("-", "+") else ""


def read_source(text: str) -> Source:
    """The template's elements and output units; a `SourceError` when they cannot be mapped exactly."""
    if len(text) > DEFAULT_LIMITS.max_source_chars:
        raise SourceError(f"the template has {len(text):,} characters, over ctxlock's limit")
    if "\r" in text:
        raise SourceError("the template has carriage returns, which jinja2 reads as newlines")
    elements = _elements(text, _tokens(text))
    return Source(text, tuple(elements), tuple(_units(text, elements)))


def _units(text: str, elements: list[Element]) -> list[Unit]:
    """The units written at the top level (not inside a macro, a `{% set %}` block, a call or filter block)."""
    stack: list[tuple[str, str | None]] = []
    units: list[Unit] = []
    for k, e in enumerate(elements):
        buffered = any(name in _BUFFERED for name, _ in stack)
        loops = tuple(var for name, var in reversed(stack) if name == "for")
        if e.kind == "block":
            name = e.name
            if not buffered and name in ("call", "filter"):
                units.append(Unit(len(units), "opaque", k, e.line, loops))
            if name in _OPENERS and not (name == "set" and _assigns(e)):
                stack.append((name, _loop_var(e) if name == "for" else None))
            elif name.startswith("end") and stack and stack[-1][0] == name[3:]:
                stack.pop()
            elif name.startswith("end") and name[3:] in _OPENERS:
                raise SourceError(f"an unbalanced {{% {name} %}} at line {e.line}")
            continue
        if buffered or e.kind == "comment" or (e.kind == "data" and e.end == e.start):
            continue
        if e.kind == "var":
            units.append(Unit(len(units), "var", k, e.line, loops, _operands(e)))
        else:
            units.append(Unit(len(units), "data" if e.kind == "data" else "opaque", k, e.line, loops))
    if stack:
        raise SourceError(f"a {{% {stack[-1][0]} %}} block is not closed")
    return units


def _assigns(e: Element) -> bool:
    """`{% set x = ... %}` (one statement), not the block form `{% set x %}...{% endset %}`."""
    return any(t.kind == "operator" and t.value == "=" for t in e.toks)


def _loop_var(e: Element) -> str | None:
    names = e.toks[1:3]
    if len(names) == 2 and names[0].kind == "name" and names[1].kind == "name" and names[1].value == "in":
        return names[0].value
    return None


def _operands(e: Element) -> tuple[Operand, ...]:
    """The top-level `+`/`~` operands of an expression; () when it has one, or an operator that binds looser."""
    depth, cuts = 0, []
    toks = e.toks
    for i, t in enumerate(toks):
        if t.kind == "operator" and t.value in "([{":
            depth += 1
        elif t.kind == "operator" and t.value in ")]}":
            depth -= 1
        elif depth == 0 and (
            (t.kind == "name" and t.value in _BLOCKERS) or (t.kind == "operator" and t.value in _NOT_SPLIT_OPS)
        ):
            return ()
        elif depth == 0 and t.kind == "operator" and t.value in _SPLIT_OPS:
            cuts.append(i)
    if not cuts and len(toks) == 1 and toks[0].kind == "string":  # `{{ '<|im_end|>\n' }}`: a string that can be cut
        return (Operand(toks[0].start, toks[0].start + len(toks[0].value), string_value(toks[0].value)),)
    if not cuts or cuts[0] == 0 or cuts[-1] == len(toks) - 1 or any(b - a == 1 for a, b in itertools.pairwise(cuts)):
        return ()
    out = []
    for a, b in zip([-1, *cuts], [*cuts, len(toks)], strict=True):
        part = toks[a + 1 : b]
        last = part[-1]
        const = string_value(part[0].value) if len(part) == 1 and part[0].kind == "string" else None
        out.append(Operand(part[0].start, last.start + len(last.value), const))
    return tuple(out)


def string_value(literal: str) -> str:
    """A jinja2 string literal's value, as jinja2's lexer decodes it."""
    return literal[1:-1].encode("ascii", "backslashreplace").decode("unicode-escape")


def string_literal(value: str) -> str:
    """A jinja2 string literal whose value is `value`."""
    quote = "'" if "'" not in value or '"' in value else '"'
    out = []
    for ch in value:
        if ch == "\\" or ch == quote:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    literal = quote + "".join(out) + quote
    if string_value(literal) != value:
        raise SourceError(f"cannot write {value!r} as a jinja2 string literal")
    return literal


def strip_generation_tags(text: str) -> str:
    """The source without its `{% generation %}` / `{% endgeneration %}` tags, each removed with the whitespace it
    stripped (the caller checks the render did not change)."""
    out, at = [], 0
    for e in read_source(text).elements:
        if e.kind == "block" and e.name in ("generation", "endgeneration"):
            out.append(text[at : e.gap])
            at = e.end
    out.append(text[at:])
    return "".join(out)


def has_generation_tags(text: str) -> bool:
    return bool(_GENERATION_TAG.search(text))


# -- edits --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Edit:
    """Replace `text[start:end]` (an insertion when equal) with `new`. `tag` is "open" or "close" for a lone
    `{% generation %}` / `{% endgeneration %}` inserted between units: a close and an open at the same place cancel."""

    start: int
    end: int
    new: str
    tag: str = ""


def apply_edits(text: str, edits: list[Edit]) -> str:
    """`text` with the edits made (insertions before a replacement that starts at the same place); a close followed
    by an open at the same place are both dropped, which joins two blocks."""
    ordered = sorted(enumerate(edits), key=lambda x: (x[1].start, x[1].end, x[0]))
    kept: list[Edit] = []
    for _, edit in ordered:
        last = kept[-1] if kept else None
        if last and last.tag == "close" and edit.tag == "open" and last.start == edit.start == edit.end:
            kept.pop()
            continue
        if last and edit.start < last.end:
            raise SourceError("two edits of the template overlap")
        kept.append(edit)
    out, at = [], 0
    for edit in kept:
        out.append(text[at : edit.start])
        out.append(edit.new)
        at = edit.end
    out.append(text[at:])
    return "".join(out)


def block_tag(word: str, left: str = "", right: str = "") -> str:
    return "{%" + left + " " + word + " " + right + "%}"


def _tag_end_before(src: Source, pos: int) -> int:
    """Where the text the lexer reads as one run before `pos` begins: the end of the last tag before it."""
    end = 0
    for e in src.elements:
        if e.kind != "data" and e.end <= pos:
            end = e.end
        elif e.start >= pos:
            break
    return end


def lstrip_guard(src: Source, pos: int) -> str:
    """ "+" when `lstrip_blocks` would strip text before a block tag put at `pos` (spaces that start its line)."""
    start = _tag_end_before(src, pos)
    run = src.text[start:pos]
    line_start = run.rfind("\n") + 1
    starts_line = start == 0 or src.text[start - 1] == "\n"
    tail = run[line_start:]
    return "+" if tail and not tail.strip(" \t") and (line_start > 0 or starts_line) else ""


def trim_guard(src: Source, pos: int) -> str:
    """ "+" when `trim_blocks` would remove a newline the template writes, right after a block tag put at `pos`."""
    if src.text[pos : pos + 1] != "\n":
        return ""
    written = any(e.kind == "data" and e.start <= pos < e.end for e in src.elements)
    return "+" if written else ""


def before_element(src: Source, k: int, word: str) -> tuple[int, str]:
    """A block tag right before element k (a tag), stripping what that element stripped before it."""
    e = src.elements[k]
    left = ("-" if e.left == "-" else lstrip_guard(src, e.start)) if e.kind == "var" else e.left
    return e.start, block_tag(word, left)


def tag_before_unit(src: Source, unit: Unit, word: str) -> Edit:
    e = src.elements[unit.element]
    if e.kind == "data":
        return Edit(e.start, e.start, block_tag(word, "", trim_guard(src, e.start)), "open")
    pos, tag = before_element(src, unit.element, word)
    return Edit(pos, pos, tag, "open")


def tag_after_unit(src: Source, unit: Unit, word: str) -> Edit:
    """A block tag after the unit's text: right after it when literal text follows, else right before the next tag
    (so the whitespace between them is stripped as it was), else at the end of the template."""
    k = unit.element
    e = src.elements[k]
    nxt = k + 1
    if e.kind != "data" and nxt < len(src.elements) and src.elements[nxt].kind == "data":
        return Edit(e.end, e.end, block_tag(word, "", trim_guard(src, e.end)), "close")
    if nxt < len(src.elements):
        pos, tag = before_element(src, nxt, word)
        return Edit(pos, pos, tag, "close")
    return Edit(e.end, e.end, block_tag(word, lstrip_guard(src, e.end)), "close")


def tag_inside_data(src: Source, unit: Unit, offset: int, word: str) -> Edit:
    pos = src.elements[unit.element].start + offset
    return Edit(pos, pos, block_tag(word, lstrip_guard(src, pos), trim_guard(src, pos)))


# -- a unit's text, cut where its trained cells begin and end ------------------------------------------------------


def cells(src: Source, unit: Unit) -> list[tuple[int, int]]:
    """The parts of a unit's text that are trained or not as a whole: (operand, character) for each character of
    literal text or of a string operand, (operand, -1) for any other operand; [(0, -1)] for a unit kept whole."""
    e = src.elements[unit.element]
    if unit.kind == "data":
        return [(0, c) for c in range(e.end - e.start)]
    if unit.kind == "opaque" or not unit.operands:
        return [(0, -1)]
    out: list[tuple[int, int]] = []
    for i, op in enumerate(unit.operands):
        out += [(i, c) for c in range(len(op.const))] if op.const is not None else [(i, -1)]
    return out


def _runs(status: list[int]) -> list[tuple[int, int, int]]:
    """(first cell, past the last, status) of each run of equal statuses."""
    out: list[tuple[int, int, int]] = []
    for i, s in enumerate(status):
        if out and out[-1][2] == s:
            out[-1] = (out[-1][0], i + 1, s)
        else:
            out.append((i, i + 1, s))
    return out


def _run_text(src: Source, unit: Unit, parts: list[tuple[int, int]]) -> str:
    """The expression that writes these cells of a unit (consecutive): its operands' own text, a string operand
    cut to the part the cells cover, joined by the operators between them."""
    e = src.elements[unit.element]
    if unit.kind == "data":
        return string_literal(src.text[e.start + parts[0][1] : e.start + parts[-1][1] + 1])
    if not unit.operands:
        return src.text[e.toks[0].start : e.toks[-1].start + len(e.toks[-1].value)]
    out: list[str] = []
    ops = unit.operands
    for i in sorted({p[0] for p in parts}):
        op = ops[i]
        chars = [c for j, c in parts if j == i and c >= 0]
        if out:
            out.append(src.text[ops[i - 1].end : op.start])
        if op.const is not None and chars and len(chars) < len(op.const):
            out.append(string_literal(op.const[chars[0] : chars[-1] + 1]))
        else:
            out.append(src.text[op.start : op.end])
    return "".join(out)


def branch(src: Source, unit: Unit, status: list[int]) -> str:
    """The unit's text as `{{ ... }}` expressions, each trained run inside a generation block."""
    parts = cells(src, unit)
    out = []
    for a, b, s in _runs(status):
        expr = "{{ " + _run_text(src, unit, parts[a:b]) + " }}"
        out.append(block_tag("generation") + expr + block_tag("endgeneration") if s else expr)
    return "".join(out)


def conditional(src: Source, unit: Unit, cond: str, when: list[int], otherwise: list[int]) -> Edit:
    """The unit replaced by `{% if cond %}` (cut as `when` says) `{% else %}` (as `otherwise` says) `{% endif %}`,
    stripping the whitespace around it as the unit did."""
    k = unit.element
    e = src.elements[k]
    body = block_tag(f"if {cond}") + branch(src, unit, when) + block_tag("else") + branch(src, unit, otherwise)
    if e.kind == "data":
        end = src.elements[k + 1].start if k + 1 < len(src.elements) else e.end
        return Edit(e.start, end, body + block_tag("endif"))
    left = "-" if e.left == "-" else lstrip_guard(src, e.start)
    right = "-" if e.right == "-" else trim_guard(src, e.close_end)
    return Edit(e.start, e.close_end, "{%" + left + body[2:] + block_tag("endif", "", right))


def cut(src: Source, unit: Unit, status: list[int]) -> list[Edit]:
    """The edits that put every trained run of the unit in a generation block, where it stands."""
    runs = _runs(status)
    if not any(s for _, _, s in runs):
        return []
    e = src.elements[unit.element]
    edits = []
    if runs[0][2]:
        edits.append(tag_before_unit(src, unit, "generation"))
    if runs[-1][2]:
        edits.append(tag_after_unit(src, unit, "endgeneration"))
    if len(runs) == 1:
        return edits
    if unit.kind == "data":
        offsets = [(a, "generation" if s else "endgeneration") for a, _, s in runs[1:]]
        return edits + [tag_inside_data(src, unit, o, w) for o, w in offsets]
    parts = cells(src, unit)
    pieces = []
    for n, (a, b, s) in enumerate(runs):
        if n:
            pieces.append(block_tag("generation" if s else "endgeneration"))
        left = ("{{" + e.left) if n == 0 else "{{"
        right = (e.right + "}}") if n == len(runs) - 1 else "}}"
        pieces.append(left + " " + _run_text(src, unit, parts[a:b]) + " " + right)
    return [*edits, Edit(e.start, e.close_end, "".join(pieces))]


def instrument(src: Source, marker: str) -> str:
    """The source with an expression before every unit that writes `marker[0]`, the unit's id, the value of
    `X.role == "assistant"` for each enclosing loop variable X, the length of each operand's text, `marker[1]`."""
    edits = []
    for u in src.units:
        e = src.elements[u.element]
        conds = " ~ ',' ~ ".join(f'({x}.role == "assistant")' if x else "'-'" for x in u.loops) or "''"
        lengths = " ~ ',' ~ ".join(f"(({src.text[o.start : o.end]})|string|length)" for o in u.operands) or "''"
        expr = (
            f"{string_literal(marker[0] + str(u.id) + ';')} ~ {conds} ~ ';' ~ {lengths} ~ {string_literal(marker[1])}"
        )
        if u.kind == "data":
            edits.append(Edit(e.start, e.start, "{{ " + expr + " }}"))
        elif u.kind == "var":
            edits.append(Edit(e.start, e.start, "{{" + ("-" if e.left == "-" else "") + " " + expr + " }}"))
        else:
            edits.append(
                Edit(e.start, e.start, block_tag("if true", e.left) + "{{ " + expr + " }}" + block_tag("endif"))
            )
    return apply_edits(src.text, edits)
