"""The structure the architecture promises (docs/architecture.md), checked on the source as it is.

- the import-linter layer contract in pyproject.toml is kept (imports inside functions count);
- the import graph of src/ctxlock, function-level imports included, has no cycle;
- a ctxlock module is imported inside a function only in the CLI (start-up laziness), each with a reason comment;
- no module reads another module's or a library's private attributes (ruff SLF001);
- no module is over 700 lines and no function over 80, unless a `# size:` comment at its top says why.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "ctxlock"
BIN = Path(sys.executable).parent

_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
assert _spec is not None and _spec.loader is not None
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_layer_contract_is_kept() -> None:
    out = subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_import_graph_has_no_cycle() -> None:
    edges, _ = import_graph.graph()
    assert len(edges) > 40  # the graph covers the package, not an empty directory
    assert import_graph.cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert import_graph.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_function_level_imports_only_in_the_cli_with_a_reason() -> None:
    _, inner = import_graph.graph()
    bad = []
    for mod, line, target in inner:
        if not mod.startswith("ctxlock.cli"):
            bad.append(f"{mod}:{line} imports {target} inside a function")
            continue
        path = SRC.parent / (mod.replace(".", "/") + ".py")
        if not path.exists():
            path = SRC.parent / mod.replace(".", "/") / "__init__.py"
        lines = path.read_text("utf-8").splitlines()
        here, above = lines[line - 1], lines[line - 2] if line >= 2 else ""
        if "#" not in here and not above.strip().startswith("#"):
            bad.append(f"{mod}:{line} imports {target} inside a function with no reason comment")
    assert bad == []


def test_no_private_attribute_reads_across_modules() -> None:
    out = subprocess.run(
        [str(BIN / "ruff"), "check", "--select", "SLF001", "--output-format", "concise", str(SRC)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-4000:]


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text("utf-8"))
    lines = path.read_text("utf-8").splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length <= MAX_FUNCTION_LINES:
                continue
            body_start = node.body[0].lineno
            head = lines[node.lineno - 1 : body_start + 3]
            if not any("# size:" in h for h in head):
                found.append(f"{path.name}:{node.lineno} {node.name} is {length} lines")
    return found


def test_module_and_function_sizes() -> None:
    too_long = []
    for path in _sources():
        n = len(path.read_text("utf-8").splitlines())
        if n > MAX_MODULE_LINES and "# size:" not in path.read_text("utf-8")[:4000]:
            too_long.append(f"{path.relative_to(SRC.parent)} is {n} lines")
        too_long += _long_functions(path)
    assert too_long == []


def test_the_size_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n", "utf-8")
    assert len(_long_functions(tmp_path / "m.py")) == 1
    (tmp_path / "m.py").write_text(f"def f():\n    # size: a table, one line per entry\n{body}\n", "utf-8")
    assert _long_functions(tmp_path / "m.py") == []


_spec_doc = importlib.util.spec_from_file_location("layers_doc", ROOT / "scripts" / "layers_doc.py")
assert _spec_doc is not None and _spec_doc.loader is not None
layers_doc = importlib.util.module_from_spec(_spec_doc)
_spec_doc.loader.exec_module(layers_doc)

# The packages whose private modules only the edges may import.
EDGES = ("ctxlock.cli", "ctxlock.server", "ctxlock.__main__")


def test_the_architecture_page_shows_the_contract() -> None:
    page = layers_doc.page_block(layers_doc.PAGE.read_text("utf-8"))
    assert page is not None, "docs/architecture.md lost its generated layers block"
    assert page == layers_doc.block(), "run: python scripts/layers_doc.py --write"


def _private_imports(path: Path, module: str | None = None) -> list[str]:
    """`file:line module` for each import of another package's private module made in `path` (the module named
    `module`, by default the one its place under src/ names)."""
    if module is None:
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
    own = module.split(".")[1] if "." in module else ""
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ctxlock."):
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("ctxlock.")]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            private = any(p.startswith("_") and not p.startswith("__") for p in parts[1:])
            if private and parts[1] != own and (target in sys.modules or _is_module(target)):
                found.append(f"{path.name}:{node.lineno} {target}")
    return found


def _is_module(dotted: str) -> bool:
    base = SRC.parent / Path(*dotted.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def test_no_package_imports_another_packages_private_module() -> None:
    bad = []
    for path in _sources():
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        if not module.startswith(EDGES):
            bad += _private_imports(path)
    assert bad == []


def test_the_private_import_check_sees_one(tmp_path: Path) -> None:
    # An outside module importing the template package's private render module is caught; its own package is not.
    fake = tmp_path / "_probe.py"
    fake.write_text("from ctxlock.template._render import Rendered\nfrom ctxlock.accounting._layout import Layout\n")
    found = _private_imports(fake, "ctxlock.accounting._probe")
    assert [f.split(" ")[1] for f in found] == ["ctxlock.template._render"]


# Citations a reader can open: a docs page, a public URL, a reference's file. The project's internal numbering (the
# spec's "seed 000 §1.6", "issue 16") means nothing outside it. A public repository's issue ("vllm-project/vllm
# issue 53269") is fine: it names where to look.
INTERNAL_CITATION = re.compile(r"\bseed \d{3}\b|(?<!RFC \d{4} )§\s?\d|SEED-NOTES|\b[Ii]ssue \d+\b")
PUBLIC_ISSUE = re.compile(r"[\w.-]+/[\w.-]+ $")  # "owner/repo issue N": a public tracker


def internal_citations(root: Path) -> list[str]:
    """Every line under ROOT that cites the project's internal numbering, as `path:line: text`."""
    found = []
    for path in [root] if root.is_file() else sorted(root.rglob("*")):
        if path.suffix not in {".py", ".json", ".jinja", ".md"} or not path.is_file():
            continue
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            matches = INTERNAL_CITATION.finditer(line)
            if any(not (m.group()[0] in "Ii" and PUBLIC_ISSUE.search(line[: m.start()])) for m in matches):
                found.append(f"{path.relative_to(root.parent if root.is_file() else root)}:{n}: {line.strip()}")
    return found


def test_the_source_and_the_docs_cite_only_what_a_reader_can_open() -> None:
    assert internal_citations(SRC) == []
    assert internal_citations(ROOT / "docs") == []
    assert internal_citations(ROOT / "README.md") == []


def test_the_citation_scan_sees_internal_numbering(tmp_path: Path) -> None:
    lines = [
        "As seed 000 §1.6 fixes it.",
        "Fixed in issue 16.",
        "See SEED-NOTES.",
        "vllm-project/vllm issue 53269 has the case.",
        "A public file: docs/records.md.",
    ]
    (tmp_path / "m.py").write_text("".join(f"# {line}\n" for line in lines))
    assert [f.split(":")[1] for f in internal_citations(tmp_path)] == ["1", "2", "3"]
