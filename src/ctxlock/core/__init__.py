"""The foundation every stage uses: frozen (immutable, hashable) values, the leftmost-longest trie of control
tokens, fork safety for worker processes, and names exported on first use."""

from ctxlock.core._forking import die_with_parent, start_method
from ctxlock.core._frozen import FrozenDict, canonical_json, freeze, thaw
from ctxlock.core._lazy import lazy_exports
from ctxlock.core._trie import longest_first

__all__ = [
    "FrozenDict",
    "canonical_json",
    "die_with_parent",
    "freeze",
    "lazy_exports",
    "longest_first",
    "start_method",
    "thaw",
]
