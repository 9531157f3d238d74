"""The import graph of src/ctxlock, counting imports made inside functions: print its cycles (exit 1 if any).

`python scripts/import_graph.py` lists each strongly connected component of more than one module, and each
function-level import of a ctxlock module with its line. `make test` runs it (tests/project/test_layers.py)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def graph() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    modules = {module_name(p): p for p in sorted((SRC / "ctxlock").rglob("*.py"))}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    inner: list[tuple[str, int, str]] = []
    for mod, path in modules.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text("utf-8"))
        funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        in_func = {id(x) for f in funcs for x in ast.walk(f)}
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base)
                    name = f"{prefix}.{node.module}" if node.module else prefix
                else:
                    name = node.module or ""
                # `from pkg import sub` imports the module pkg.sub; `from pkg import name` reads pkg itself
                targets = [f"{name}.{a.name}" if f"{name}.{a.name}" in modules else name for a in node.names]
            for t in targets:
                if not t.startswith("ctxlock"):
                    continue
                hit = t if t in modules else None
                if hit is None:
                    continue
                if hit != mod:
                    edges[mod].add(hit)
                    # importing a submodule runs its package's __init__ too (the root package aside: it only re-exports)
                    parent = hit.rpartition(".")[0]
                    while parent not in ("", "ctxlock") and parent in modules and not mod.startswith(parent + "."):
                        edges[mod].add(parent)
                        parent = parent.rpartition(".")[0]
                    if id(node) in in_func:
                        inner.append((mod, node.lineno, hit))
    return edges, inner


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def main() -> int:
    edges, inner = graph()
    found = cycles(edges)
    for comp in found:
        print(f"cycle of {len(comp)}: {' '.join(comp)}")
    for mod, line, target in inner:
        print(f"function-level import: {mod}:{line} -> {target}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
