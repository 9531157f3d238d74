"""Imports by need: `import ctxlock` is cheap, `import ctxlock.cli` (every command, `--help`) loads no pipeline stage,
and a text-only render or encode loads neither the image stage nor accounting, masks or the bill.

Each case runs in a fresh interpreter and lists what it imported. The lists of modules that must NOT be there are the
deterministic check; the CPU time of the imports (`time.process_time()` of the whole child, imports and work) is held
to a generous budget, several times what it takes on the 2-core test machine, so only a regression of that order
fails it (docs/benchmarks.md, "Cold start", has the measured figures).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ctxlock

SRC = str(Path(ctxlock.__file__).resolve().parents[1])
ROOT = Path(__file__).resolve().parents[2]

# What no text-only path needs: the image stage (Pillow, the families), counting, masks, bills, constrained decoding,
# and the reference libraries.
IMAGE_AND_EXTRAS = {
    "PIL",
    "ctxlock.multimodal._pipeline",
    "ctxlock.multimodal._media",
    "ctxlock.multimodal._expand",
    "ctxlock.accounting._layout",
    "ctxlock.training._masks",
    "ctxlock.economics._bill",
    "ctxlock.economics._usage",
    "ctxlock.economics._promptcache",
    "ctxlock.generation._constrain",
    "transformers",
    "torch",
}
# What `import ctxlock.cli` must not load: any pipeline stage's heavy dependencies.
PIPELINE = {
    "numpy",
    "jinja2",
    "tokenizers",
    "tiktoken",
    "fastokens",
    "ctxlock.artifacts",
    "ctxlock.tokenizer",
    "ctxlock.template",
    "ctxlock.model",
}


def _child(body: str) -> tuple[set[str], float]:
    """(top-level and ctxlock modules imported, CPU seconds) of a fresh interpreter running `body`."""
    code = (
        "import sys, time, json\n"
        f"{body}\n"
        "mods = sorted({m if m.startswith('ctxlock') else m.split('.')[0] for m in sys.modules})\n"
        "print(json.dumps({'modules': mods, 'cpu': time.process_time()}), file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stderr.strip().splitlines()[-1])
    return set(out["modules"]), float(out["cpu"])


def _absent(loaded: set[str], names: set[str]) -> list[str]:
    return sorted(m for m in loaded if m in names or any(m.startswith(n + ".") for n in names))


def test_import_ctxlock_loads_no_stage() -> None:
    loaded, cpu = _child("import ctxlock")
    assert _absent(loaded, PIPELINE | IMAGE_AND_EXTRAS | {"typer", "rich", "ctxlock.request"}) == []
    assert cpu < 0.5, f"import ctxlock took {cpu:.2f} s of CPU"


def test_import_ctxlock_cli_loads_no_stage() -> None:
    loaded, cpu = _child("import ctxlock.cli")
    assert _absent(loaded, PIPELINE | IMAGE_AND_EXTRAS) == []
    assert cpu < 1.5, f"import ctxlock.cli took {cpu:.2f} s of CPU"


def test_a_text_render_loads_no_image_stage() -> None:
    body = (
        "from ctxlock.cli import main\n"
        "try:\n"
        "    main(['render', 'examples/seed-sky-injection.json', '--json'])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
    )
    loaded, cpu = _child(body)
    assert "ctxlock.cli.render" in loaded and "ctxlock.tokenizer" in loaded
    others = {f"ctxlock.cli.{m}" for m in ("count", "bill", "cachereport", "batch", "lint", "serve")}
    # The render's record names the request parts the template never wrote (`accounting.unseen_parts`); --json
    # prints no human view, so rich (the rules and colours) is never imported.
    assert _absent(loaded, (IMAGE_AND_EXTRAS - {"ctxlock.accounting._layout"}) | others | {"rich"}) == []
    assert cpu < 6.0, f"ctxlock render took {cpu:.2f} s of CPU"


@pytest.mark.parametrize("entry", ["encode", "run"])
def test_model_encode_of_text_loads_no_image_stage(entry: str) -> None:
    body = (
        "import ctxlock\n"
        "model = ctxlock.load('book')\n"
        f"model.{entry}({{'messages': [{{'role': 'user', 'content': 'hi'}}]}})\n"
    )
    loaded, _ = _child(body)
    assert _absent(loaded, IMAGE_AND_EXTRAS) == []


def test_an_hf_directory_loads_no_other_kind_of_model() -> None:
    """Loading an HF directory and encoding a request imports neither the loaders of the other kinds of model (GGUF,
    ctxlock.json directories, the hub cache, `openai:`) nor the other tokenizer backends (SentencePiece, Tekken,
    tiktoken files, the book fixture)."""
    import fetched

    directory = fetched.hf_tokenizer_dir("qwen2")
    body = (
        "import ctxlock\n"
        f"model = ctxlock.load({str(directory)!r})\n"
        "model.encode({'messages': [{'role': 'user', 'content': 'hi'}]})\n"
    )
    loaded, _ = _child(body)
    assert "ctxlock.artifacts._hf_dir" in loaded and "ctxlock.tokenizer.backends._hf" in loaded
    others = {f"ctxlock.artifacts.{m}" for m in ("_gguf", "_gguf_load", "_manifest", "_registry", "_hub", "_openai")}
    others |= {f"ctxlock.tokenizer.backends.{m}" for m in ("_sentencepiece", "_tekken", "_tiktoken_file", "_book")}
    assert _absent(loaded, others | IMAGE_AND_EXTRAS) == []
