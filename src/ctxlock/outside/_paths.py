"""JSON paths, as every request error names its location: `messages[3].tool_calls[0].function.arguments`.

`join_path` appends one key or index. While parsed JSON is being built, a path is kept as a linked pair
(`LinkedPath`) and rendered by `render_path` only when an error needs it.
"""

from __future__ import annotations

import json
from typing import Any


def join_path(path: str, key: str | int) -> str:
    """Append a key or index to a JSON path: `a.b`, `a[3]`, `a["not an identifier"]`; the root is `$`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if key.isidentifier() or (key[:1] == "$" and key[1:].isidentifier()):  # `$defs`, `$ref` read as names
        return key if path == "$" else f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


# A path under construction while building parsed JSON: a base string, or (parent, key). Rendered only on error,
# so building costs O(1) per node instead of one string per node.
LinkedPath = str | tuple[Any, str | int]


def render_path(path: LinkedPath) -> str:
    """The JSON path a `LinkedPath` stands for."""
    keys: list[str | int] = []
    while isinstance(path, tuple):
        path, key = path
        keys.append(key)
    out = path
    for key in reversed(keys):
        out = join_path(out, key)
    return out
