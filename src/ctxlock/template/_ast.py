"""What a chat template reads, from its syntax tree (never by rendering it).

`reads_parts(tree)` says whether a template reads a message's content as a list of parts; `template.content_format`
parses the source (bounded, like a compile) and caches the answer per source. `parse_tree(template)` gives the tree
itself, parsed the same bounded way, to the tools that read templates (`ctxlock lint`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jinja2
import jinja2.nodes

from ctxlock.errors import TemplateLimitError, TemplateSyntaxError
from ctxlock.template._values import ChatTemplate
from ctxlock.template.sandbox._env import DEFAULT_LIMITS, Limit, new_environment, time_limit

# The keys of a content part: reading one of them from a part means the template reads parts.
PART_KEYS = frozenset({"type", "text", "image", "image_url", "input_audio", "video", "file", "thinking"})


def _base(node: Any) -> Any:
    """The expression a value comes from, through filters, tests and slices (`x|selectattr(...)`, `x[1:]`)."""
    while True:
        wrapped = isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)) and node.node is not None
        if not (wrapped or (isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice))):
            return node
        node = node.node


def _is_name(node: Any, names: set[str]) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.name in names


def _key(node: Any) -> Any:
    """The constant key of `x.key` or `x['key']`, else None."""
    if isinstance(node, jinja2.nodes.Getattr):
        return node.attr
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const):
        return node.arg.value
    return None


class _Names:
    """The names a template binds to the message list (`lists`), to one message (`items`) and to a message's
    content (`contents`): aliases, loop variables and macro parameters, grown to a fixpoint."""

    def __init__(self, tree: jinja2.nodes.Template) -> None:
        name_of = jinja2.nodes.Name
        self.assigns = [
            (a.target.name, a.node) for a in tree.find_all(jinja2.nodes.Assign) if isinstance(a.target, name_of)
        ]
        self.loops = list(tree.find_all(jinja2.nodes.For))
        self.macros = {m.name: [a.name for a in m.args] for m in tree.find_all(jinja2.nodes.Macro)}
        self.calls = [
            c for c in tree.find_all(jinja2.nodes.Call) if isinstance(c.node, name_of) and c.node.name in self.macros
        ]
        self.lists: set[str] = {"messages"}
        self.items: set[str] = set()
        self.contents: set[str] = set()
        self._grow()

    def is_item(self, node: Any) -> bool:
        """A message: a loop variable over the list, or the list indexed."""
        node = _base(node)
        if _is_name(node, self.items):
            return True
        return (
            isinstance(node, jinja2.nodes.Getitem)
            and not isinstance(node.arg, jinja2.nodes.Slice)
            and _is_name(_base(node.node), self.lists)
        )

    def is_content(self, node: Any) -> bool:
        node = _base(node)
        if isinstance(node, (jinja2.nodes.Or, jinja2.nodes.And)):
            return self.is_content(node.left) or self.is_content(node.right)
        if isinstance(node, jinja2.nodes.CondExpr):
            return self.is_content(node.expr1) or (node.expr2 is not None and self.is_content(node.expr2))
        if _is_name(node, self.contents):
            return True
        if (  # m.get('content'), m.get('content', '')
            isinstance(node, jinja2.nodes.Call)
            and isinstance(node.node, jinja2.nodes.Getattr)
            and node.node.attr == "get"
            and node.args
            and isinstance(node.args[0], jinja2.nodes.Const)
            and node.args[0].value == "content"
        ):
            return self.is_item(node.node.node)
        return _key(node) == "content" and self.is_item(node.node)

    def _size(self) -> int:
        return len(self.lists) + len(self.items) + len(self.contents)

    def _grow(self) -> None:
        size = -1
        while size != self._size():  # aliases of aliases: a fixpoint
            size = self._size()
            for name, value in self.assigns:
                if _is_name(_base(value), self.lists):
                    self.lists.add(name)
                elif self.is_content(value):
                    self.contents.add(name)
                elif self.is_item(value):
                    self.items.add(name)
            for loop in self.loops:
                if isinstance(loop.target, jinja2.nodes.Name) and _is_name(_base(loop.iter), self.lists):
                    self.items.add(loop.target.name)
            for call in self.calls:
                self._bind_parameters(call)

    def _bind_parameters(self, call: Any) -> None:
        params = self.macros[call.node.name]
        passed = list(zip(params, call.args, strict=False))
        passed += [(k.key, k.value) for k in call.kwargs if k.key in params]
        for param, value in passed:
            if self.is_content(value):
                self.contents.add(param)
            elif self.is_item(value):
                self.items.add(param)


def reads_parts(tree: jinja2.nodes.Template) -> bool:
    """Whether the template reads content parts: it loops over a message's content. A message is a loop variable over
    `messages` (or an alias, a slice, a filtered list) or `messages[i]`; content is `m.content`, `m['content']`,
    `m.get('content')`, a variable set from one, or a macro parameter some call passes one to."""
    names = _Names(tree)
    if any(names.is_content(loop.iter) for loop in names.loops):
        return True
    return _reads_a_part(tree, names.is_content)


def _reads_a_part(tree: jinja2.nodes.Template, is_content: Callable[[Any], bool]) -> bool:
    # Parts read without a loop: a part taken by index (`content[0].text`, `content[0]['text']`, `content|first`) or
    # the parts mapped or filtered by a part's key (`content|map(attribute='text')`, `content|selectattr('type',
    # ...)`); a joined string would give such a template one character, or nothing, in place of the text.
    for attr in tree.find_all(jinja2.nodes.Getattr):
        if attr.attr in PART_KEYS and _part_of_content(attr.node, is_content):
            return True
    for item in tree.find_all(jinja2.nodes.Getitem):
        key = item.arg.value if isinstance(item.arg, jinja2.nodes.Const) else None
        if key in PART_KEYS and _part_of_content(item.node, is_content):
            return True
    for filt in tree.find_all(jinja2.nodes.Filter):
        by_key = filt.name in ("map", "selectattr", "rejectattr", "groupby", "sort", "unique") and any(
            isinstance(a, jinja2.nodes.Const) and a.value in PART_KEYS
            for a in [*filt.args, *(k.value for k in filt.kwargs)]
        )
        if by_key and filt.node is not None and is_content(filt.node):
            return True
    return False


def _part_of_content(node: Any, is_content: Callable[[Any], bool]) -> bool:
    """Whether `node` is one part of a message's content: `content[i]` (not a slice) or `content|first|last`."""
    if isinstance(node, jinja2.nodes.Getitem) and not isinstance(node.arg, jinja2.nodes.Slice):
        return bool(is_content(node.node))
    if isinstance(node, jinja2.nodes.Filter) and node.name in ("first", "last") and node.node is not None:
        return bool(is_content(node.node))
    return False


__all__ = ["PART_KEYS", "reads_parts"]


def parse_tree(template: ChatTemplate) -> jinja2.nodes.Template:
    """The template's Jinja syntax tree, parsed in the sandbox's environment (its `{% generation %}` tag included)
    within the compile limits, for the tools that read a template without rendering it (`ctxlock lint`). A source
    that does not parse is a `TemplateSyntaxError` naming the template's line; one over the limits a
    `TemplateLimitError`."""
    where = template.origin or template.id
    if len(template.source) > DEFAULT_LIMITS.max_source_chars:
        raise TemplateLimitError(
            f"the template is {len(template.source):,} characters, over {DEFAULT_LIMITS.max_source_chars:,}",
            path=where,
            hint="it may be hostile",
        )
    try:
        with time_limit(DEFAULT_LIMITS.max_seconds, every_frame=True):
            return new_environment().parse(template.source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise TemplateSyntaxError(
            exc.message or str(exc), path=f"{where} line {exc.lineno}", hint="the chat template does not compile"
        ) from None
    except (Limit, RecursionError, MemoryError):
        raise TemplateLimitError(
            "the template is over the compile limits", path=where, hint="it may be hostile"
        ) from None
