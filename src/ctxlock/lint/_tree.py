"""Reading a template's syntax tree for the lint rules: the variables it reads (with their first line), the keys it
reads off values (`message.name`, `message['reasoning_content']`), the calls it makes (`raise_exception`,
`strftime_now`) and where it writes a value out."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from jinja2 import meta, nodes

from ctxlock.request import RESERVED_TEMPLATE_KWARGS

# The names every chat template gets from the caller (transformers' apply_chat_template, its Jinja globals, Jinja's
# builtins): not the template's own arguments. The literals are names jinja2's parser reads as names.
STANDARD_NAMES = RESERVED_TEMPLATE_KWARGS | {"True", "False", "None"}


@dataclass(frozen=True)
class Call:
    """A call of a global function in the template: its name, line, and its first argument when a literal."""

    name: str
    line: int
    message: str = ""


def _names(tree: nodes.Template, name: str) -> Iterator[nodes.Name]:
    for node in tree.find_all(nodes.Name):
        if node.name == name and node.ctx == "load":
            yield node


def _evaluation_order(node: nodes.Node) -> Iterator[nodes.Node]:
    """The nodes in the order a render meets them: an assignment's value before its target, a loop's iterable
    before its target (`find_all` gives a `set`'s target first)."""
    yield node
    children: list[nodes.Node]
    if isinstance(node, nodes.Assign):
        children = [node.node, node.target]
    elif isinstance(node, nodes.AssignBlock):
        children = [*node.body, *([node.filter] if node.filter else []), node.target]
    elif isinstance(node, nodes.For):
        children = [node.iter, node.target, *([node.test] if node.test else []), *node.body, *node.else_]
    else:
        children = list(node.iter_child_nodes())
    for child in children:
        yield from _evaluation_order(child)


def variables_read(tree: nodes.Template) -> dict[str, int]:
    """The caller-given names the template reads, each with its first line: jinja2's undeclared variables (which
    include any name a branch or a loop may leave unset) whose first use is a read. `{% if not x is defined %}{% set
    x = 1 %}{% endif %}` reads the caller's `x` (Llama 3.1's tools_in_user_message, gpt-oss's reasoning_effort); a
    name set before it is read is the template's own (`{% set content = ... %}` in a loop)."""
    first: dict[str, str] = {}
    for node in _evaluation_order(tree):
        if isinstance(node, nodes.Name):
            first.setdefault(node.name, node.ctx)
        elif isinstance(node, nodes.Macro):
            first.setdefault(node.name, "store")
    out: dict[str, int] = {}
    for name in sorted(meta.find_undeclared_variables(tree)):
        if first.get(name) == "load":
            out[name] = min(n.lineno for n in _names(tree, name))
    return out


def arguments_read(tree: nodes.Template) -> dict[str, int]:
    """The variables read that are not the standard ones: the template's own arguments (`enable_thinking`, ...)."""
    return {k: v for k, v in variables_read(tree).items() if k not in STANDARD_NAMES}


def _reads_key(node: nodes.Node, key: str) -> bool:
    if isinstance(node, nodes.Getattr):
        return node.attr == key
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == key
    if isinstance(node, nodes.Call):
        fn, args = node.node, node.args
        return (
            isinstance(fn, nodes.Getattr)
            and fn.attr == "get"
            and bool(args)
            and isinstance(args[0], nodes.Const)
            and args[0].value == key
        )
    if isinstance(node, nodes.Compare):
        return (
            isinstance(node.expr, nodes.Const)
            and node.expr.value == key
            and any(op.op in ("in", "notin") for op in node.ops)
        )
    return False


def key_reads(tree: nodes.Template, key: str) -> list[int]:
    """Lines that read `key` off a value: `x.key`, `x['key']`, `x.get('key')`, `'key' in x`."""
    found = tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Call, nodes.Compare))
    return sorted({node.lineno for node in found if _reads_key(node, key)})


def _is_conversation(node: nodes.Node, lists: set[str]) -> bool:
    """`messages`, a name set to it, a slice of it or a filter of it (`messages[1:]`, `messages|reverse`)."""
    if isinstance(node, nodes.Name):
        return node.name in lists
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _is_conversation(node.node, lists)
    if isinstance(node, nodes.Filter) and node.node is not None:
        return _is_conversation(node.node, lists)
    return False


def _message_bases(tree: nodes.Template) -> tuple[set[str], set[str]]:
    """The names holding the conversation (`messages`, `loop_messages`) and the names holding one message of it (a
    `for` target over the conversation, `set first = messages[0]`)."""
    lists = {"messages"}
    assigns = [(a.target.name, a.node) for a in tree.find_all(nodes.Assign) if isinstance(a.target, nodes.Name)]
    grown = True
    while grown:
        new = {name for name, value in assigns if name not in lists and _is_conversation(value, lists)}
        lists |= new
        grown = bool(new)
    one = {
        loop.target.name
        for loop in tree.find_all(nodes.For)
        if isinstance(loop.target, nodes.Name) and _is_conversation(loop.iter, lists)
    }
    one |= {name for name, value in assigns if _is_message(value, lists, set())}
    return lists, one


def _is_message(node: nodes.Node, lists: set[str], names: set[str]) -> bool:
    if isinstance(node, nodes.Name):
        return node.name in names
    return (
        isinstance(node, nodes.Getitem) and not isinstance(node.arg, nodes.Slice) and _is_conversation(node.node, lists)
    )


def _read_base(node: nodes.Node) -> nodes.Node | None:
    """The value a key is read off: `x` of `x.key`, `x['key']`, `x.get('key')`, `'key' in x`."""
    if isinstance(node, nodes.Getattr | nodes.Getitem):
        return node.node
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
        return node.node.node
    if isinstance(node, nodes.Compare) and node.ops:
        return node.ops[0].expr
    return None


def message_key_reads(tree: nodes.Template, key: str) -> list[int]:
    """Lines that read `key` off a message of the conversation (`message.name` in `{% for message in messages %}`,
    `messages[0]['name']`), not off another value (`tool_call.name`)."""
    lists, names = _message_bases(tree)
    found = tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Call, nodes.Compare))
    lines = set()
    for node in found:
        base = _read_base(node) if _reads_key(node, key) else None
        if base is not None and _is_message(base, lists, names):
            lines.add(node.lineno)
    return sorted(lines)


def calls(tree: nodes.Template, name: str) -> list[Call]:
    """Every call of the global `name` (`raise_exception`, `strftime_now`), in line order."""
    out = []
    for node in tree.find_all(nodes.Call):
        if isinstance(node.node, nodes.Name) and node.node.name == name:
            first = node.args[0] if node.args else None
            message = str(first.value) if isinstance(first, nodes.Const) else ""
            out.append(Call(name, node.lineno, message))
    return sorted(out, key=lambda c: c.line)


def filter_lines(tree: nodes.Template, names: frozenset[str]) -> list[int]:
    """Lines that apply one of the filters `names` (`random`, `shuffle`)."""
    return sorted({n.lineno for n in tree.find_all(nodes.Filter) if n.name in names})


def output_lines(tree: nodes.Template, key: str) -> list[int]:
    """Lines of `{{ ... }}` expressions that read `key` (where a message's content is written out)."""
    out = set()
    for output in tree.find_all(nodes.Output):
        for child in output.nodes:
            if isinstance(child, nodes.TemplateData):
                continue
            for node in (child, *child.find_all((nodes.Getattr, nodes.Getitem))):  # find_all skips `child` itself
                if (isinstance(node, nodes.Getattr) and node.attr == key) or (
                    isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == key
                ):
                    out.add(child.lineno)
    return sorted(out)


def literal_lines(source: str, text: str) -> list[int]:
    """1-based lines of the template source where the literal `text` appears."""
    return [i for i, line in enumerate(source.splitlines(), 1) if text and text in line]
