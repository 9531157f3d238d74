"""The cache registry (`ctxlock.caches`): every in-process cache is registered, and `clear_caches()` empties each.

The static test reads the source of `src/ctxlock`: outside `caches.py`, no module may memoize with `functools`, keep
an LRU on `OrderedDict`, fill a module-level dict as a cache, or define a `*Cache`/`*LRU`/`*Memo` class, unless the
cache is registered (`caches.register`/`register_instance`, or built on `caches.LRU`). A module-level dict that is
filled at run time but is not a cache (a registry of backends, say) says so with a `# not a cache: <why>` comment on
its line. The runtime test fills the caches through the public pipeline and checks each registry entry's size.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ctxlock
import fetched
from ctxlock import caches
from ctxlock.budget._compaction import plan_compaction
from ctxlock.budget._fit import BudgetPolicy, fit_context
from ctxlock.template._render import ChatTemplate

SRC = Path(ctxlock.__file__).resolve().parent
_CACHE_CLASS = re.compile(r"(cache|lru|memo)$", re.IGNORECASE)
_EMPTY_MAPPINGS = {"dict", "OrderedDict", "defaultdict", "WeakValueDictionary", "WeakKeyDictionary"}
_FILLING = {"setdefault", "update", "__setitem__"}


def _name(node: ast.AST) -> str:
    """`f` for a Name, `a.b.f` for an attribute chain, "" otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return ""


def _registers(tree: ast.AST) -> str:
    """The source text of every call to a registry function in a module or class (what it registers)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func).split(".")[-1] in ("register", "register_instance"):
            out.append(ast.unparse(node))
    return "\n".join(out)


def _is_empty_mapping(value: ast.AST | None) -> bool:
    if isinstance(value, ast.Dict):
        return not value.keys
    if isinstance(value, ast.Call):
        return _name(value.func).split(".")[-1] in _EMPTY_MAPPINGS and not value.args and not value.keywords
    return False


def _filled_in_functions(tree: ast.Module, name: str) -> bool:
    """Whether a function writes into the module-level mapping `name` (item assignment or a filling method)."""
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Subscript) and _name(t.value) == name:
                        return True
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _FILLING
                and _name(node.func.value) == name
            ):
                return True
    return False


def cache_sites(path: Path, root: Path = SRC.parent) -> list[str]:
    """The unregistered caches of one module, as "path:line: what" (the path relative to `root`)."""
    source = path.read_text("utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    rel = path.relative_to(root).as_posix()
    registered = _registers(tree)
    # Classes whose module-level instance is registered (`RUNS = RunCache(...)`, then `register(... RUNS ...)`).
    instances = {
        _name(node.value.func).split(".")[-1]
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name) and re.search(rf"\b{re.escape(t.id)}\b", registered)
    }
    found: list[str] = []

    def site(node: ast.AST, what: str) -> None:
        found.append(f"{rel}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "functools":
            for alias in node.names:
                if alias.name in ("lru_cache", "cache"):
                    site(node, f"functools.{alias.name} imported")
        elif isinstance(node, ast.Attribute) and _name(node) in ("functools.lru_cache", "functools.cache"):
            site(node, f"{_name(node)}")
        elif isinstance(node, ast.ClassDef) and _CACHE_CLASS.search(node.name):
            # a base may be subscripted: `caches.LRU[Key, Value]`
            bases = {_name(b.value if isinstance(b, ast.Subscript) else b).split(".")[-1] for b in node.bases}
            if "LRU" not in bases and not _registers(node) and node.name not in instances:
                site(node, f"class {node.name} is not built on caches.LRU nor registered")
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Call)
                and _name(node.func).split(".")[-1] == "OrderedDict"
                and not _registers(cls)
                and cls.name not in instances
            ):
                site(node, f"an OrderedDict in class {cls.name}, which registers nothing (use caches.LRU)")
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        for t in targets:
            if not isinstance(t, ast.Name) or "not a cache:" in lines[node.lineno - 1]:
                continue
            called = isinstance(value, ast.Call) and _name(value.func).split(".")[-1] == "OrderedDict"
            if (called or (_is_empty_mapping(value) and _filled_in_functions(tree, t.id))) and t.id not in registered:
                site(node, f"module-level {t.id} is filled at run time and not registered")
    return found


def unregistered_caches() -> list[str]:
    return sorted(site for path in sorted(SRC.rglob("*.py")) if path.name != "caches.py" for site in cache_sites(path))


def test_the_scan_finds_each_kind_of_cache(tmp_path: Path) -> None:
    # The rules themselves, on a module holding one of each kind, and the registered forms they accept.
    probe = tmp_path / "probe.py"
    good = [
        'from .caches import LRU, memoize, register\n@memoize("x.y", 8)\ndef f(a): return a\n',
        'from . import caches\n_X = caches.LRU("x.z", max_items=4)\n',
        "_SEEN = {}\ndef f(k): _SEEN[k] = 1\nregister('x.seen', size=_SEEN.__len__, clear=_SEEN.clear)\n",
        "_BACKENDS = {}  # not a cache: formats registered at import\ndef add(k, v): _BACKENDS[k] = v\n",
        "TABLE = {'a': 1}\ndef f(k): return TABLE[k]\n",
        "class RunCache(LRU):\n    pass\n",
        "class RunCache:\n    def __init__(self): self.d = OrderedDict()\n"
        "RUNS = RunCache()\nregister('runs', size=RUNS.__len__, clear=RUNS.clear)\n",
        "from collections import OrderedDict\nclass W:\n    def __init__(self):\n"
        "        self.d = OrderedDict()\n        register_instance('w', self)\n",
    ]
    bad_sources = {
        "from functools import lru_cache\n@lru_cache(maxsize=2)\ndef f(a): return a\n": "functools.lru_cache",
        "import functools\n@functools.cache\ndef f(a): return a\n": "functools.cache",
        "from functools import cache\n@cache\ndef f(a): return a\n": "functools.cache",
        "from collections import OrderedDict\n_M = OrderedDict()\n": "module-level _M",
        "_MEMO: dict = {}\ndef f(k, v): _MEMO[k] = v\n": "module-level _MEMO",
        "_MEMO = dict()\ndef f(k, v): _MEMO.setdefault(k, v)\n": "module-level _MEMO",
        "class TextCache:\n    def __init__(self): self.d = {}\n": "class TextCache",
        "from collections import OrderedDict\nclass W:\n    def __init__(self): self.d = OrderedDict()\n": "class W",
    }
    for source in good:
        probe.write_text(source, "utf-8")
        assert cache_sites(probe, tmp_path) == [], source
    for source, what in bad_sources.items():
        probe.write_text(source, "utf-8")
        sites = cache_sites(probe, tmp_path)
        assert sites and all(what in s for s in sites), (source, sites)


def test_every_cache_is_in_the_registry() -> None:
    sites = unregistered_caches()
    assert sites == [], "caches outside the registry (ctxlock.caches):\n" + "\n".join(sites)


def _fill(book: ctxlock.Model, qwen: ctxlock.Model, template: ChatTemplate) -> None:
    """Render, encode, fit and plan on both models, so that the caches of every stage hold something."""
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]
    chat = {
        "messages": [
            {"role": "system", "content": "You are brief."},
            {"role": "user", "content": "Why is the sky blue?"},
            {"role": "assistant", "content": "Rayleigh scattering."},
            {"role": "user", "content": "And at sunset?"},
        ],
        "tools": tools,
    }
    book.encode({"messages": [{"role": "user", "content": "天空"}]})
    book.run({"messages": [{"role": "user", "content": "天空"}]})
    qwen.encode(chat, chat_template=template)
    qwen.run(chat, chat_template=template)
    qwen.encode_batch([chat, chat], chat_template=template)
    request = qwen.parse(chat)
    fit_context(request, qwen, BudgetPolicy(max_input_tokens=4096), chat_template=template)
    plan_compaction(chat, qwen, context_window=4096, keep_recent_tokens=10, chat_template=template)


def test_clear_caches_empties_every_registered_cache() -> None:
    book = ctxlock.load("book")
    qwen = ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))
    source = (fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text("utf-8")
    template = ChatTemplate(source, id="qwen2.5")

    _fill(book, qwen, template)
    info = caches.cache_info()
    filled = {name for name, c in info.items() if c.size}
    for name in ("template.message", "template.tools", "template.compiled", "template.role_markers"):
        assert name in filled, (name, info)
    assert len(filled) >= 5, info
    assert {c.scope for c in info.values()} <= {"request", "artifact"}

    # The request scope: request-derived values go, compiled templates and vocabularies stay.
    ctxlock.clear_caches("request")
    info = caches.cache_info()
    assert all(c.size == 0 for c in info.values() if c.scope == "request"), info
    kept = {name for name, c in info.items() if c.scope == "artifact" and c.size}
    assert {"template.compiled", "template.role_markers"} <= kept, info

    # Everything.
    _fill(book, qwen, template)
    assert any(c.size for c in caches.cache_info().values() if c.scope == "request")
    ctxlock.clear_caches()
    info = caches.cache_info()
    assert {name: c.size for name, c in info.items() if c.size} == {}

    # Results never depend on the caches: the same ids cold and warm.
    chat = {"messages": [{"role": "user", "content": "Why is the sky blue?"}]}
    cold = qwen.encode(chat, chat_template=template).input_ids.tolist()
    assert qwen.encode(chat, chat_template=template).input_ids.tolist() == cold


def test_every_on_disk_cache_directory_is_a_named_kind() -> None:
    """`ctxlock cache` lists, and `--clear` removes, the kinds of `settings.CACHE_KINDS`: every directory the source
    puts under `cache_root()` must be one of them (a static scan for `cache_root() / "NAME"`), or it would never be
    shown nor cleared."""
    from ctxlock.settings import CACHE_KINDS
    from ctxlock.tokenizer import TOKENIZER_CACHE_DIRS

    used = set()
    for path in SRC.rglob("*.py"):
        used |= set(re.findall(r'cache_root\(\)\s*/\s*"([^"]+)"', path.read_text("utf-8")))
    assert used, "the scan found no cache directory"
    assert used <= set(CACHE_KINDS), sorted(used - set(CACHE_KINDS))
    assert set(TOKENIZER_CACHE_DIRS) <= set(CACHE_KINDS)
