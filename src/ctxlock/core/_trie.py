"""One regex for a set of literal strings (control tokens, added tokens) that matches leftmost-longest, built as a trie.

The plain form, `a|ab|abc` sorted longest first, is what the field writes, and for a vocabulary with a thousand
control tokens (Tekken's `<SPECIAL_n>`) Python's `re` takes about 0.1 s to compile it and tries every alternative at
every start. The trie form factors the shared prefixes: `<SPECIAL_(?:1(?:0...)?|2...)>`. It matches the same spans:

- at a start, the branches of a trie node begin with different characters, so at most one can go on: the walk down
  the trie is the one way any alternative of the plain form could match;
- where a string ends at a node that has children, the node is `(?:children)?`, greedy: the engine goes deeper
  first and takes the end only if nothing longer matches, which is the plain form's longest-first order;
- leftmost: `search` and `finditer` try starts in order either way.

`tests/core/test_trie.py` checks this against the plain form on hypothesis token sets and texts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_END = None  # the key that marks "a string ends here" in a trie node (characters are str keys)


def longest_first_pattern(strings: Iterable[str]) -> str:
    """The regex source matching any of `strings` (empty ones ignored), leftmost-longest; "" for none."""
    root: dict[Any, Any] = {}
    for s in set(strings):
        if not s:
            continue
        node = root
        for ch in s:
            node = node.setdefault(ch, {})
        node[_END] = True
    return _emit(root) if root else ""


def _emit(node: dict[Any, Any]) -> str:
    leaves: list[str] = []  # children that only end: one character class
    branches: list[str] = []
    for ch in sorted(k for k in node if k is not _END):
        child = node[ch]
        if len(child) == 1 and _END in child:
            leaves.append(ch)
        else:
            branches.append(re.escape(ch) + _emit(child))
    if len(leaves) == 1:
        branches.append(re.escape(leaves[0]))
    elif leaves:
        branches.append("[" + "".join(_class_escape(c) for c in leaves) + "]")
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    if _END in node:
        # Greedy: deeper first, and the string that ends here only when nothing longer matches.
        return f"(?:{body})?"
    return body


def _class_escape(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[" else ch


def longest_first(strings: Iterable[str]) -> re.Pattern[str] | None:
    """`longest_first_pattern`, compiled; None for no strings."""
    pattern = longest_first_pattern(strings)
    return re.compile(pattern) if pattern else None


__all__ = ["longest_first", "longest_first_pattern"]
