"""Capture ctxlock's observable behaviour into a directory of files, and compare two captures byte for byte.

    python scripts/behaviour_snapshot.py capture OUTDIR     one file per case + OUTDIR/index.json (name -> sha256)
    python scripts/behaviour_snapshot.py compare A B        exit 0 if every case is byte-identical, 1 otherwise

What it captures (docs/behaviour-snapshot.md): the conformance corpus (tests/data/conversations x llama.cpp's
templates, rendered text, ids and `render --json`), every CLI command's `--json` output over examples/ and the
test data (and a few bad inputs: exit status and the one-line message), the record formats (records, exports,
bundles, batch output) and the wire JSON of every route of `ctxlock serve`.

It drives ctxlock only through what survives a module move: `python -m ctxlock ...` as a subprocess, `ctxlock
serve` over HTTP on loopback, and top-level names of `import ctxlock`. The names being renamed are in SPELLINGS
below; each run picks the spelling the tree in use understands, by probing.

It captures the tree it sits in (it puts that tree's src/ first on the import path), working in one fixed
directory (WORK below): two captures must not run at the same time.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import inspect
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import conformance

REPO = Path(__file__).resolve().parents[1]

# Renamed interfaces: (new spelling, old spelling). Each is probed once; the first the tree accepts is used.
SPELLINGS: dict[str, tuple[str, str]] = {
    "cli_injection_flag": ("--injection", "--special-tokens"),  # ctxlock render/tokenize ... option
    "py_template_kw": ("chat_template", "template"),  # Model.render/encode keyword
    "py_assistant_mask_kw": ("return_assistant_tokens_mask", "return_assistant_mask"),  # Model.encode keyword
}

# A fixed working directory: every path the CLI and the server see is under it, so outputs do not depend on where
# the tree or the output directory is. It is emptied at the start of each capture.
WORK = Path("/tmp/ctxlock-behaviour-snapshot-work")
TOKEN = "snapshot-token"
FIXED_NOW = "2024-07-26T10:30:00+00:00"
CONVERSATIONS = REPO / "tests" / "data" / "conversations"
DATA = REPO / "tests" / "data"
EXAMPLES = REPO / "examples"
# Extra template variables some templates need (tests/conformance.py's TEMPLATE_KWARGS).
TEMPLATE_KWARGS: dict[str, dict[str, Any]] = {
    "fireworks-ai-llama-3-firefunction-v2.jinja": {"functions": "", "datetime": "2024-07-26 10:30"},
}


# ---------------------------------------------------------------------------------------------------------------
# Normalisation: ONLY what depends on the time of the run or on where files live. Never ids or digests.
# - Paths: the working directory, the tree's root, the test-artifact cache and $HOME are replaced by <WORK>,
#   <REPO>, <CACHE> and <HOME> (they differ between the "before" and the "after" tree).
# - Timestamps: the values of the keys that hold the wall-clock time of the run (created_at, created,
#   exported_at, started_at, finished_at, time, timestamp), when they are an ISO-8601 string or a Unix time, and
#   ISO-8601 instants of the capture's date (or the day before) in any other text (the human views, the HTML
#   pages), become <TIME>.
# - Durations measured by the run: the values of SECONDS_KEYS (elapsed, seconds, duration, latency, constrain's
#   timings), when they are not integers, become <SECONDS>; the timings of constrain's summary line on stderr
#   become <DURATION>. Configured limits (a deadline, a timeout) are kept. The same key names occur as tokens of
#   an embedded vocabulary ("time": 1678), whose integer ids are kept.
# - /metrics: only its "# HELP" / "# TYPE" lines (the series' values count requests and measure latencies).
# - Record ids of records made with the wall clock: a record id is the digest of the record, which holds the
#   render's clock (`now`). `render --record --now` fixes it, and those ids are kept verbatim; `fit --record`,
#   `compact-plan --record` and the server's `?record=1` take no clock, so their ids (and the 8- and 12-digit
#   prefixes the views print) become <CLOCK-RECORD-n>, numbered in the order the records were made.
# ---------------------------------------------------------------------------------------------------------------
TIME_KEYS = ("created_at", "created", "exported_at", "started_at", "finished_at", "time", "timestamp")
SECONDS_KEYS = (
    "elapsed",
    "elapsed_seconds",
    "seconds",
    "duration",
    "duration_seconds",
    "latency",
    "wall_seconds",
    "tokenizer_seconds",
    "compile_seconds",
    "(?:mask|sample)_[a-z0-9]+_ms",  # constrain's timings
)
# constrain's summary line on stderr: "compile 1.67 ms (vocabulary 0.99 s); mask median 0.062 ms, p99 5.315 ms"
TIMING_TEXT = re.compile(r"\b(compile|vocabulary|median|p99) [0-9.]+ (ms|s)\b")


def _path_pairs() -> list[tuple[str, str]]:
    cache = Path(os.environ.get("CTXLOCK_TEST_CACHE", Path.home() / ".cache" / "ctxlock-test"))
    pairs = [(str(WORK), "<WORK>"), (str(REPO), "<REPO>"), (str(cache), "<CACHE>"), (str(Path.home()), "<HOME>")]
    out = []
    for raw, tag in pairs:
        out.append((raw, tag))
        escaped = json.dumps(raw)[1:-1]
        if escaped != raw:
            out.append((escaped, tag))
    return out


def capture_days() -> set[str]:
    """Today and yesterday, in local time and in UTC: the dates an instant read during a capture can have."""
    now = time.time()
    stamps = (now, now - 86400)
    return {time.strftime("%Y-%m-%d", time.localtime(t)) for t in stamps} | {
        time.strftime("%Y-%m-%d", time.gmtime(t)) for t in stamps
    }


def normalise(data: bytes) -> bytes:
    text = data.decode("utf-8", errors="surrogateescape")
    for raw, tag in _path_pairs():
        text = text.replace(raw, tag)
    # Only values that have the shape of a clock reading or a measurement: the same key names occur as tokens of an
    # embedded vocabulary ("time": 1678), whose ids must stay.
    keys = "|".join(TIME_KEYS)
    text = re.sub(
        rf'("(?:{keys})"\s*:\s*)("[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}[T ][^"]*"|1[0-9]{{9}}(?:\.[0-9]+)?)',
        r'\1"<TIME>"',
        text,
    )
    keys = "|".join(SECONDS_KEYS)
    text = re.sub(
        rf'("(?:{keys})"\s*:\s*)(-?[0-9]+(?:\.[0-9]+)?[eE][+-]?[0-9]+|-?[0-9]+\.[0-9]+)', r'\1"<SECONDS>"', text
    )
    text = TIMING_TEXT.sub(r"\1 <DURATION> \2", text)
    for day in capture_days():
        text = re.sub(rf"{day}[T ][0-9:.]+(?:Z|[+-][0-9:]+)?", "<TIME>", text)
    return text.encode("utf-8", errors="surrogateescape")


# ---------------------------------------------------------------------------------------------------------------
# The snapshot directory.
# ---------------------------------------------------------------------------------------------------------------
class Snapshot:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.index: dict[str, str] = {}
        self.clock_ids: list[str] = []  # ids of records made with the wall clock, in the order they were made

    def clock_record(self, out: bytes) -> str:
        """The record id in a JSON output, remembered as clock-dependent ("" when there is none)."""
        try:
            rid = str(json.loads(out).get("record_id") or "")
        except (ValueError, AttributeError):
            return ""
        if rid and rid not in self.clock_ids:
            self.clock_ids.append(rid)
        return rid

    def label_clock_ids(self) -> None:
        """Rewrite every case that names a clock-dependent record id (see the normalisation notes above)."""
        if not self.clock_ids:
            return
        alternatives = "|".join(re.escape(rid[:8]) + "[0-9a-f]{0,56}" for rid in self.clock_ids)
        pattern = re.compile(f"(?<![0-9a-f])(?:{alternatives})(?![0-9a-f])".encode())
        labels = {rid[:8]: f"<CLOCK-RECORD-{i}>".encode() for i, rid in enumerate(self.clock_ids, 1)}
        for name in self.index:
            path = self.out / name
            data = path.read_bytes()
            new = pattern.sub(lambda m: labels[m.group(0)[:8].decode()], data)
            if new != data:
                path.write_bytes(new)
                self.index[name] = hashlib.sha256(new).hexdigest()

    def add(self, name: str, data: bytes | str, *, raw: bool = False) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8", errors="surrogateescape")
        if not raw:
            data = normalise(data)
        if name in self.index:
            raise SystemExit(f"duplicate case {name}")
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.index[name] = hashlib.sha256(data).hexdigest()

    def add_json(self, name: str, obj: Any) -> None:
        self.add(name, json.dumps(obj, ensure_ascii=False, indent=1, sort_keys=False, default=repr) + "\n")

    def finish(self) -> None:
        self.label_clock_ids()
        (self.out / "index.json").write_text(json.dumps(dict(sorted(self.index.items())), indent=1) + "\n", "utf-8")


# ---------------------------------------------------------------------------------------------------------------
# The CLI as a subprocess.
# ---------------------------------------------------------------------------------------------------------------
def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("CTXLOCK_") or k == "CTXLOCK_TEST_CACHE"}
    out.update(
        PYTHONPATH=str(REPO / "src"),
        CTXLOCK_DATA_DIR=str(WORK / "store"),
        CTXLOCK_CACHE_DIR=str(WORK / "cache"),  # a cold disk cache every run
        TZ="UTC",
        COLUMNS="120",
        NO_COLOR="1",
        PYTHONHASHSEED="0",
    )
    return out


def cli(args: list[str], stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
    proc = subprocess.run(
        [sys.executable, "-m", "ctxlock", *args],
        input=stdin,
        capture_output=True,
        cwd=WORK,
        env=env(),
        timeout=600,
    )
    return proc.returncode, proc.stdout, proc.stderr


def add_cli(snap: Snapshot, name: str, result: tuple[int, bytes, bytes]) -> None:
    """Two cases per CLI run: its stdout exactly, and its exit status with its stderr."""
    code, out, err = result
    snap.add(f"{name}.stdout", out)
    snap.add(f"{name}.status", b"exit %d\n" % code + err)


def run_cli_cases(snap: Snapshot, cases: list[tuple[str, list[str], bytes | None]], workers: int = 3) -> None:
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda c: cli(c[1], c[2]), cases))
    for (name, _, _), result in zip(cases, results, strict=True):
        add_cli(snap, name, result)


def probe_cli_flag(key: str, command: str) -> str:
    new, old = SPELLINGS[key]
    _, out, _ = cli([command, "--help"])
    return new if new in out.decode() else old


# ---------------------------------------------------------------------------------------------------------------
# Set-up: the inputs copied under WORK, so every path the outputs name is the same in both trees.
# ---------------------------------------------------------------------------------------------------------------
def fetched() -> Any:
    sys.path.insert(0, str(REPO / "tests"))
    import fetched as module  # the tests' artifact accessors (no ctxlock import)

    return module


def prepare() -> dict[str, Path]:
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    shutil.copytree(EXAMPLES, WORK / "examples")
    shutil.copytree(DATA, WORK / "data")
    art = fetched()
    paths = {
        "qwen_dir": Path(art.hf_tokenizer_dir("qwen2")),
        "llama_dir": Path(art.hf_tokenizer_dir("llama-bpe")),
        "templates": Path(next(iter(art.template_paths()))).parent,
        "gguf_qwen": Path(art.gguf_path("qwen2")),
        "gguf_llama": Path(art.gguf_path("llama-bpe")),
    }
    shutil.copytree(paths["templates"], WORK / "templates")
    qwen_t = paths["templates"] / "Qwen-Qwen2.5-7B-Instruct.jinja"
    shutil.copy(qwen_t, WORK / "qwen.jinja")
    (WORK / "bad.json").write_text('{"messages": [{"role": "user", "content": "hi"}', "utf-8")
    (WORK / "empty.json").write_text("{}", "utf-8")
    (WORK / "not-utf8.json").write_bytes(b'{"messages": [{"role": "user", "content": "\xff"}]}')
    (WORK / "ids.jsonl").write_text("[1, 22177, 1044, 2036]\n[1091, 1044]\n", "utf-8")
    (WORK / "texts.jsonl").write_text('"hello world"\n"[INST] x"\n', "utf-8")
    (WORK / "summary.txt").write_text("The user asked about greet; it returns a greeting.\n", "utf-8")
    rows = [json.loads(p.read_text("utf-8")) for p in sorted(CONVERSATIONS.glob("0[1-8]*.json"))]
    for r in rows:
        r.pop("_options", None)
    rows.append({"messages": "not a list"})
    (WORK / "batch.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    return paths


# ---------------------------------------------------------------------------------------------------------------
# Group 1: the conformance corpus.
# ---------------------------------------------------------------------------------------------------------------
def corpus() -> list[tuple[str, dict[str, Any], dict[str, bool]]]:
    """The conformance corpus as the suite reads it (tests/conformance.py): (name, request, options) per file."""
    return conformance.conversations()


vocab_for = conformance.vocab_for


def probe_kw(model: Any, method: str, key: str, value: Any) -> str:
    """The spelling of a keyword that `model.<method>` accepts: the new one unless it is refused by name."""
    new, old = SPELLINGS[key]
    fn = getattr(model, method)
    if new in inspect.signature(fn).parameters:
        return new
    if old in inspect.signature(fn).parameters:
        return old
    try:
        fn({"messages": [{"role": "user", "content": "probe"}]}, **{new: value})
        return new
    except Exception as exc:  # a refused keyword names itself
        if new in str(exc):
            return old
        raise


def outcome(fn: Callable[[], Any]) -> Any:
    """The value `fn` returns, or the error it raises (type and message), and the warnings it gives either way."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out: dict[str, Any] = {"ok": fn()}
        except Exception as exc:
            out = {"error": type(exc).__name__, "message": str(exc)}
    if caught:
        out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    return out


def conformance_case(model: Any, request: dict[str, Any], opts: dict[str, Any], mask: dict | None) -> dict:
    """One corpus case: the render's dict, the encoding's, and (given `mask`) the encoding with the assistant mask."""
    case = {
        "render": outcome(lambda: model.render(copy.deepcopy(request), **opts).to_dict()),
        "encode": outcome(lambda: model.encode(copy.deepcopy(request), **opts).to_dict()),
    }
    if mask is not None:
        case["encode_mask"] = outcome(lambda: model.encode(copy.deepcopy(request), **opts, **mask).to_dict())
    return case


def capture_conformance(snap: Snapshot, paths: dict[str, Path]) -> None:
    import ctxlock  # here, after capture() put this tree's src/ first on sys.path (compare never needs it)

    art = fetched()
    models: dict[str, Any] = {}
    kw: dict[str, str] = {}
    for template_path in sorted(paths["templates"].glob("*.jinja")):
        name = template_path.name
        vocab = vocab_for(name)
        if vocab not in models:
            models[vocab] = ctxlock.load(str(art.hf_tokenizer_dir(vocab)))
        model = models[vocab]
        if not kw:
            kw["template"] = probe_kw(model, "render", "py_template_kw", "default")
            kw["mask"] = probe_kw(model, "encode", "py_assistant_mask_kw", False)
        source = template_path.read_text("utf-8")
        template = ctxlock.ChatTemplate(source=source, id=name)
        for conv, request, options in corpus():
            for mode in ("parsed", "as-sent"):
                opts: dict[str, Any] = dict(options)
                opts[kw["template"]] = template
                opts["now"] = datetime(2024, 7, 26, 10, 30)  # tests/conformance.py's FIXED_NOW
                opts["tool_arguments"] = mode
                opts["content_format"] = "openai" if mode == "as-sent" else "auto"
                if name in TEMPLATE_KWARGS:
                    opts["chat_template_kwargs"] = TEMPLATE_KWARGS[name]
                mask = {kw["mask"]: True} if mode == "parsed" else None
                case = conformance_case(model, request, opts, mask)
                snap.add_json(f"conformance/{name}/{conv}.{mode}.json", case)
    # `render --json` over the whole corpus: the default model, and the Qwen directory with its template file.
    flag = probe_cli_flag("cli_injection_flag", "render")
    cases = []
    for conv, _, options in corpus():
        src = f"data/conversations/{conv}.json"
        extra = [] if options["add_generation_prompt"] else ["--no-generation-prompt"]
        extra += ["--continue-final-message"] if options["continue_final_message"] else []
        base = ["render", src, "--json", "--now", FIXED_NOW, *extra]
        cases.append((f"conformance-cli/nemo/{conv}", base, None))
        cases.append(
            (f"conformance-cli/qwen/{conv}", [*base, "-m", str(paths["qwen_dir"]), "-t", "./qwen.jinja"], None)
        )
        cases.append((f"conformance-cli/nemo-keep/{conv}", [*base, flag, "keep"], None))
    # ... and for every template, with its paired vocabulary, one conversation (the in-process cases cover all).
    for template_path in sorted(paths["templates"].glob("*.jinja")):
        model_dir = str(art.hf_tokenizer_dir(vocab_for(template_path.name)))
        for conv in ("07_tool_call_arguments_string",):  # system, user, assistant turns and a tool call
            args = ["render", f"data/conversations/{conv}.json", "--json", "--now", FIXED_NOW, "-m", model_dir]
            args += ["-t", f"./templates/{template_path.name}"]
            for var, value in TEMPLATE_KWARGS.get(template_path.name, {}).items():
                args += ["--var", f"{var}={json.dumps(value)}"]
            cases.append((f"conformance-cli/templates/{template_path.name}/{conv}", args, None))
    run_cli_cases(snap, cases)


# ---------------------------------------------------------------------------------------------------------------
# Group 2: every CLI command with --json over the examples, and errors.
# ---------------------------------------------------------------------------------------------------------------
def cli_cases(paths: dict[str, Path], flag: str) -> list[tuple[str, list[str], bytes | None]]:
    qwen = ["-m", str(paths["qwen_dir"]), "-t", "./qwen.jinja"]
    now = ["--now", FIXED_NOW]
    ex = "examples/"
    cases: list[tuple[str, list[str], bytes | None]] = [
        ("help/top", ["--help"], None),
        ("models", ["models", "--json"], None),
        ("inspect/nemo", ["inspect", "--json"], None),
        ("inspect/qwen", ["inspect", "--json", "-m", str(paths["qwen_dir"])], None),
        (
            "inspect/qwen-file-pipeline",
            ["inspect", "--json", "-m", str(paths["qwen_dir"]), "--tokenizer-pipeline", "file"],
            None,
        ),
        ("inspect/book", ["inspect", "--json", "-m", "book"], None),
        ("inspect/gguf-qwen2", ["inspect", "--json", "-m", str(paths["gguf_qwen"])], None),
        ("inspect/gguf-llama-bpe", ["inspect", "--json", "-m", str(paths["gguf_llama"])], None),
        ("tokenize/book", ["tokenize", "--json", "--text", "the sky is blue", "-m", "book"], None),
        (
            "tokenize/gguf-llama-bpe",
            ["tokenize", "--json", "--text", "Hello <|eot_id|> wörld", "-m", str(paths["gguf_llama"])],
            None,
        ),
        ("render/book", ["render", ex + "seed-sky-injection.json", "--json", *now, "-m", "book"], None),
        (
            "render/gguf-qwen2",
            ["render", ex + "tools-and-documents.json", "--json", *now, "-m", str(paths["gguf_qwen"])],
            None,
        ),
        ("count/book", ["count", ex + "long-chat.json", "--json", "-m", "book"], None),
        ("fit/gguf-qwen2", ["fit", ex + "long-chat.json", "--json", "-m", str(paths["gguf_qwen"])], None),
        (
            "clamp/gguf-qwen2",
            [
                "clamp",
                ex + "long-chat.json",
                "--json",
                "-m",
                str(paths["gguf_qwen"]),
                "--margin",
                "256",
                "--margin-fraction",
                "0.05",
            ],
            None,
        ),
        ("tokenize/text", ["tokenize", "--json", "--text", "Hello [INST] world é"], None),
        ("tokenize/parse-special", ["tokenize", "--json", "--text", "Hello [INST] world", "--parse-special"], None),
        ("tokenize/add-special", ["tokenize", "--json", "--text", "Hello", "--add-special-tokens"], None),
        ("tokenize/file", ["tokenize", "--json", "--file", ex + "greet-summary.txt"], None),
        ("tokenize/jsonl", ["tokenize", "--jsonl"], (WORK / "texts.jsonl").read_bytes()),
        (
            "tokenize/qwen",
            ["tokenize", "--json", "--text", "Hello <|im_start|> world", "-m", str(paths["qwen_dir"])],
            None,
        ),
        ("detok/ids", ["detok", "--json", "--ids", "[1, 22177, 1044, 2036]", "--stop", "ll"], None),
        ("detok/jsonl", ["detok", "--json", "--jsonl", "--max-tokens", "2"], (WORK / "ids.jsonl").read_bytes()),
        ("detok/skip", ["detok", "--json", "--ids", "[1, 22177, 2]", "--skip-special-tokens"], None),
        ("constrain/person", ["constrain", "--schema", "data/schemas/person.json", "-n", "3", "--seed", "7"], None),
        (
            "constrain/enum",
            ["constrain", "--schema", "data/schemas/status_enum.json", "-n", "3", "--temperature", "0"],
            None,
        ),
        (
            "usage/all",
            [
                "usage",
                "--json",
                *(
                    f"data/usage/{f}"
                    for f in (
                        "anthropic-message.json",
                        "anthropic-stream.jsonl",
                        "gemini.json",
                        "openai-chat.json",
                        "openai-responses.json",
                        "pi-events.jsonl",
                    )
                ),
            ],
            None,
        ),
        (
            "usage/priced",
            ["usage", "--json", "data/usage/openai-chat.json", "--prices", "data/usage/prices.json"],
            None,
        ),
        ("usage/example", ["usage", "--json", ex + "greet-summary-usage.json"], None),
        ("bad/render-bad-json", ["render", "bad.json", "--json"], None),
        ("bad/render-empty", ["render", "empty.json", "--json"], None),
        ("bad/render-not-utf8", ["render", "not-utf8.json", "--json"], None),
        ("bad/render-missing", ["render", "missing.json"], None),
        ("bad/render-raise", ["render", ex + "seed-sky-injection.json", flag, "raise", "--json"], None),
        ("bad/unknown-model", ["render", ex + "long-chat.json", "-m", "no-such-model"], None),
        ("bad/tokenize-no-text", ["tokenize", "--json"], b""),
        ("bad/detok-bad-ids", ["detok", "--ids", "[1, -5]"], None),
        ("bad/usage-missing", ["usage", "nothing.json"], None),
        ("bad/unknown-command", ["frobnicate"], None),
        ("bad/clamp-no-room", ["clamp", "--json", ex + "long-chat.json", "--context-window", "16"], None),
    ]
    for stream in sorted((DATA / "streams").iterdir()):
        fmt = stream.name.split("_")[0]
        fmt = {"hermes": "hermes", "qwen3": "qwen3_coder", "mistral": "mistral", "anthropic": "anthropic"}.get(
            fmt, "openai"
        )
        tools = "data/requests/anthropic_tools.json" if fmt == "anthropic" else "data/requests/openai_tools.json"
        finish = ["--finish-reason", "stop"] if fmt not in ("openai", "anthropic") else []
        args = ["toolcalls", "-f", fmt, "--tools", tools, *finish, f"data/streams/{stream.name}"]
        cases.append((f"toolcalls/{stream.stem}", args, None))
        cases.append((f"toolcalls-early/{stream.stem}", [*args, "--release", "early"], None))
    for stem in ("long-chat", "seed-sky-injection", "tools-and-documents"):  # the examples that are chat requests
        path = f"{ex}{stem}.json"
        cases += [
            (f"render/{stem}", ["render", path, "--json", *now], None),
            (f"render-text/{stem}", ["render", path, *now], None),
            (f"render-qwen/{stem}", ["render", path, "--json", *now, *qwen], None),
            (f"render-keep/{stem}", ["render", path, "--json", *now, flag, "keep"], None),
            (f"tokenize-file/{stem}", ["tokenize", "--json", "--file", path], None),
            (f"count/{stem}", ["count", path, "--json", "--marginal"], None),
            (f"count-text/{stem}", ["count", path, "--marginal"], None),
            (f"count-anthropic/{stem}", ["count", path, "--format", "anthropic"], None),
            (f"count-qwen/{stem}", ["count", path, "--json", *qwen], None),
            (f"fit/{stem}", ["fit", path, "--json", "--max-input-tokens", "625"], None),
            (f"fit-text/{stem}", ["fit", path, "--max-input-tokens", "625"], None),
            (f"fit-greedy/{stem}", ["fit", path, "--json", "--max-input-tokens", "625", "--history", "greedy"], None),
            (
                f"fit-window/{stem}",
                ["fit", path, "--json", "--context-window", "1000", "--reserve-output", "400"],
                None,
            ),
            (f"fit-qwen/{stem}", ["fit", path, "--json", "--max-input-tokens", "300", *qwen], None),
            (f"clamp/{stem}", ["clamp", path, "--json", "--context-window", "1200", "--max-tokens", "400"], None),
            (f"clamp-text/{stem}", ["clamp", path, "--context-window", "1000"], None),
            (
                f"clamp-qwen/{stem}",
                ["clamp", path, "--json", "--margin", "256", "--margin-fraction", "0.05", *qwen],
                None,
            ),
            (f"explain/{stem}", ["explain", "--json", "--find", "blue", "--request", path], None),
        ]
    compact = ["--context-window", "1200", "--reserve-tokens", "200", "--keep-recent-tokens", "300"]
    session = ex + "greet-session.json"
    cases += [
        ("compact-plan/long-chat", ["compact-plan", ex + "long-chat.json", "--json", *compact], None),
        ("compact-plan/long-chat-text", ["compact-plan", ex + "long-chat.json", *compact], None),
        (
            "compact-plan/long-chat-check",
            ["compact-plan", ex + "long-chat.json", "--json", *compact, "--check", "--summary-tokens", "200"],
            None,
        ),
        (
            "compact-plan/greet-session",
            [
                "compact-plan",
                session,
                "--json",
                "--context-window",
                "1000",
                "--reserve-tokens",
                "200",
                "--keep-recent-tokens",
                "400",
            ],
            None,
        ),
        (
            "explain/greet-truncated",
            [
                "explain",
                "--json",
                "--find",
                "greet v2",
                "--request",
                session,
                "--context-window",
                "1000",
                "--events",
                ex + "greet-answer-truncated.json",
            ],
            None,
        ),
        (
            "explain/greet-answer",
            ["explain", "--json", "--find", "greet v2", "--request", session, "--usage", ex + "greet-answer.json"],
            None,
        ),
        (
            "explain/greet-text",
            [
                "explain",
                "--find",
                "greet v2",
                "--request",
                session,
                "--context-window",
                "1000",
                "--events",
                ex + "greet-answer-truncated.json",
            ],
            None,
        ),
        (
            "usage/greet-answers",
            ["usage", "--json", ex + "greet-answer.json", ex + "greet-answer-truncated.json"],
            None,
        ),
        (
            "cache-report/openai",
            ["cache-report", "--json", "--provider", "openai", ex + "session-timestamp.jsonl"],
            None,
        ),
        (
            "cache-report/vllm-fix",
            ["cache-report", "--json", "--provider", "vllm", "--fix", ex + "session-timestamp.jsonl"],
            None,
        ),
        (
            "cache-report/anthropic",
            ["cache-report", "--json", "--provider", "anthropic", ex + "session-timestamp.jsonl"],
            None,
        ),
        ("cache-report/openai-text", ["cache-report", "--provider", "openai", ex + "session-timestamp.jsonl"], None),
    ]
    return cases


# ---------------------------------------------------------------------------------------------------------------
# Group 3: records, exports, bundles, batch output (sequential: the store's content is the sum of the steps).
# ---------------------------------------------------------------------------------------------------------------
def capture_records(snap: Snapshot, paths: dict[str, Path]) -> None:
    store = ["--store", "store"]
    now = ["--now", FIXED_NOW]

    def step(name: str, args: list[str], stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
        result = cli(args, stdin)
        add_cli(snap, f"records/{name}", result)
        return result

    ids: dict[str, str] = {}

    def record_id(out: bytes) -> str:
        try:
            return str(json.loads(out).get("record_id", ""))
        except ValueError:
            return ""

    for stem in ("long-chat", "seed-sky-injection", "tools-and-documents"):
        _, out, _ = step(
            f"render-record/{stem}", ["render", f"examples/{stem}.json", "--json", "--record", *now, *store]
        )
        ids[stem] = record_id(out)
    _, out, _ = step(
        "render-record/qwen",
        [
            "render",
            "examples/seed-sky-injection.json",
            "--json",
            "--record",
            *now,
            *store,
            "-m",
            str(paths["qwen_dir"]),
            "-t",
            "./qwen.jinja",
        ],
    )
    ids["qwen"] = record_id(out)
    _, out, _ = step(
        "fit-record", ["fit", "examples/long-chat.json", "--json", "--record", "--max-input-tokens", "625", *store]
    )
    ids["fit"] = snap.clock_record(out)
    _, out, _ = step(
        "compact-record",
        [
            "compact-plan",
            "examples/greet-session.json",
            "--context-window",
            "1000",
            "--reserve-tokens",
            "200",
            "--keep-recent-tokens",
            "400",
            "--summary-tokens",
            "40",
            "--summary",
            "examples/greet-summary.txt",
            "--summary-usage",
            "examples/greet-summary-usage.json",
            "--record",
            "--json",
            *store,
        ],
    )
    ids["compact"] = snap.clock_record(out)
    step("list", ["records", "list", "--json", *store])
    for key, rid in sorted(ids.items()):
        if not rid:
            continue
        step(f"show/{key}", ["records", "show", rid, *store])
        step(f"show-json/{key}", ["records", "show", rid, "--json", *store])
        step(f"replay/{key}", ["replay", rid, "--json", *store])
        step(f"view/{key}", ["view", rid, "-o", f"view-{key}.html", *store])
        view = WORK / f"view-{key}.html"
        if view.exists():
            snap.add(f"records/view/{key}.html", view.read_bytes())
    step("diff/greet-vs-qwen", ["diff", ids["seed-sky-injection"], ids["qwen"], "--json", *store])
    step("diff/same", ["diff", ids["seed-sky-injection"], ids["seed-sky-injection"], "--json", *store])
    step(
        "diff/rerun-qwen",
        ["diff", ids["seed-sky-injection"], "-m", str(paths["qwen_dir"]), "-t", "./qwen.jinja", "--json", *store],
    )
    step("view/pair", ["view", ids["seed-sky-injection"], ids["qwen"], "-o", "view-pair.html", *store])
    if (WORK / "view-pair.html").exists():
        snap.add("records/view/pair.html", (WORK / "view-pair.html").read_bytes())
    step("explain/record", ["explain", "--json", "--find", "blue", ids["long-chat"], *store])
    step("explain/history", ["explain", "--json", "--find", "blue", ids["fit"], "--history", ids["fit"], *store])
    step(
        "explain/compaction",
        ["explain", "--json", "--find", "src/greet.ts", ids["compact"], "--history", ids["compact"], *store],
    )
    step(
        "cache-report/records",
        ["cache-report", "--json", "--provider", "openai", "--records", ids["long-chat"], ids["fit"], *store],
    )
    _, out, _ = step("export/all", ["records", "export", *store])
    step(
        "export/bundle",
        ["records", "export", "--bundle", "-o", "bundle.json", ids["seed-sky-injection"], ids["qwen"], *store],
    )
    if (WORK / "bundle.json").exists():
        snap.add("records/bundle.json", (WORK / "bundle.json").read_bytes())
        step("import/bundle", ["records", "import", "bundle.json", "--store", "store2"])
        step("import/list", ["records", "list", "--json", "--store", "store2"])
    (WORK / "export.jsonl").write_bytes(out)
    step("import/jsonl", ["records", "import", "export.jsonl", "--store", "store3"])
    step("bad/show-unknown", ["records", "show", "abcdef012345", *store])
    step("bad/replay-unknown", ["replay", "abcdef012345", *store])
    # batch: its output directory, file by file (Parquet shards byte for byte, manifest, errors.jsonl).
    for name, args in (
        ("batch/plain", ["batch", "batch.jsonl", "batch-out", "--json", "--shard-rows", "3"]),
        ("batch/packed", ["batch", "batch.jsonl", "batch-packed", "--json", "--pack", "512", "--last-turn-only"]),
        ("batch/fit", ["batch", "batch.jsonl", "batch-fit", "--json", "--max-length", "200"]),
        ("batch/qwen", ["batch", "batch.jsonl", "batch-qwen", "--json", "-m", str(paths["qwen_dir"])]),
    ):
        step(name, args)
        out_dir = WORK / args[2]
        for f in sorted(out_dir.rglob("*")) if out_dir.exists() else []:
            if f.is_file():
                snap.add(f"records/{name}/{f.relative_to(out_dir)}", f.read_bytes(), raw=f.suffix == ".parquet")


# ---------------------------------------------------------------------------------------------------------------
# Group 4: the wire JSON of every route of `ctxlock serve`.
# ---------------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(paths: dict[str, Path]) -> Iterator[str]:
    import httpx  # only a capture needs an HTTP client (compare runs with the standard library alone)

    cfg = WORK / "serve.toml"
    cfg.write_text(
        f"""
[server]
store = "{WORK / "serve-store"}"
tokens = ["{TOKEN}"]
allow_named_templates = false

[limits]
max_body_bytes = 262144
render_deadline_seconds = 30.0

[models.nemo]
spec = "mistral-nemo"
max_model_len = 131072
budget = {{ max_input_tokens = 64 }}

[models.llama3]
spec = "{paths["llama_dir"]}"
template = "{WORK / "templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja"}"

[models.qwen]
spec = "{paths["qwen_dir"]}"
template = "{WORK / "qwen.jinja"}"
max_model_len = 32768
""",
        "utf-8",
    )
    port = free_port()
    log = open(WORK / "serve.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxlock", "serve", "--config", str(cfg), "--port", str(port)],
        cwd=WORK,
        env=env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited: {WORK / 'serve.log'}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start within 180 s")
            time.sleep(0.3)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


# Response headers that belong to the behaviour (the rest, e.g. date and server, belong to the moment).
KEPT_HEADERS = ("content-type", "www-authenticate", "retry-after", "allow", "x-ctxlock-model", "x-ctxlock-warning")


def wire(snap: Snapshot, c: Any, name: str, method: str, path: str, *, no_auth: bool = False, **kw: Any) -> Any:
    """One exchange, as two cases: NAME.status (status line and the kept headers) and NAME.body (the body's bytes).
    `no_auth` sends it without the client's Authorization header."""
    request = c.build_request(method, path, **kw)
    if no_auth:
        del request.headers["Authorization"]
    r = c.send(request)
    head = [f"HTTP {r.status_code}"] + [
        f"{k}: {v}"
        for k, v in sorted(r.headers.items())
        if k.lower() in KEPT_HEADERS or k.lower().startswith("x-ctxlock")
    ]
    snap.add(f"serve/{name}.status", "\n".join(head) + "\n")
    body = r.content
    if path == "/metrics":
        body = b"".join(line + b"\n" for line in body.splitlines() if line.startswith(b"#"))
    snap.add(f"serve/{name}.body", body)
    return r


# Request bodies of the peers' own suites (tests/test_serve_peers_*.py), which quote vLLM's, llama.cpp's and
# Anthropic's tests.
VLLM_CHAT = [
    {"role": "user", "content": "Hi there!"},
    {"role": "assistant", "content": "Nice to meet you!"},
    {"role": "user", "content": "Can I ask a question? vllm1"},
]
VLLM_TOOL_CHAT = [{"role": "user", "content": "What's the weather like in Paris today?"}]
VLLM_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
        },
    }
]
LLAMACPP_PARSE_SPECIAL = [
    ("llama3", "<|begin_of_text|>hi<|eot_id|>", True),
    ("llama3", "<|begin_of_text|>hi<|eot_id|>", False),
    ("llama3", "<|begin_of_text|>hi<|eot_id|>", None),
    ("qwen", "<|im_start|>user\nhi<|im_end|>", True),
    ("qwen", "<|im_start|>user\nhi<|im_end|>", None),
]
LIST_FILES = {
    "name": "list_files",
    "description": "List files",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}
ANTHROPIC_THINKING = [
    {"role": "user", "content": "Fix the bug"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I should check the project structure first."},
            {"type": "tool_use", "id": "call_1", "name": "list_files", "input": {"path": "."}},
        ],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "main.py"}]},
]
RESPONSES_BODY = {
    "instructions": "Be brief.",
    "input": [
        {"role": "user", "content": "Fix the bug"},
        {"type": "function_call", "call_id": "call_1", "name": "list_files", "arguments": '{"path": "."}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "main.py"},
    ],
    "tools": [{"type": "function", "name": "list_files", "description": "List files", "strict": True,
               "parameters": LIST_FILES["input_schema"]}],
    "tool_choice": "auto",
}  # fmt: skip


def peer_cases(w: Callable[..., Any]) -> None:
    for model in ("qwen", "llama3"):
        for k, (chat, tools) in enumerate(((VLLM_CHAT, None), (VLLM_TOOL_CHAT, VLLM_TOOLS))):
            for agp in (False, True):
                for special in (False, True):
                    for cont in (False, True):
                        if agp and cont:
                            continue
                        body: dict[str, Any] = {
                            "model": model,
                            "messages": [*chat, {"role": "assistant", "content": "Sure,"}] if cont else chat,
                            "add_generation_prompt": agp,
                            "continue_final_message": cont,
                            "add_special_tokens": special,
                        }
                        if tools:
                            body["tools"] = tools
                        name = f"vllm/{model}-chat{k}-agp{int(agp)}-special{int(special)}-cont{int(cont)}"
                        w(name, "POST", "/tokenize", json=body)
    for i, (model, content, parse) in enumerate(LLAMACPP_PARSE_SPECIAL):
        body = {"model": model, "content": content, **({} if parse is None else {"parse_special": parse})}
        w(f"llamacpp/parse-special-{i}", "POST", "/tokenize", json=body)
    w("llamacpp/apply-template-llama3", "POST", "/apply-template", json={"model": "llama3", "messages": VLLM_CHAT})
    for model in ("nemo", "qwen", "llama3"):
        w(
            f"anthropic/thinking-{model}",
            "POST",
            "/v1/messages/count_tokens",
            json={"model": model, "messages": ANTHROPIC_THINKING, "tools": [LIST_FILES], "system": "Be brief."},
        )
        w(
            f"responses/function-calls-{model}",
            "POST",
            "/v1/responses/input_tokens",
            json={"model": model, **RESPONSES_BODY},
        )
    w(
        "anthropic/x-api-key",
        "POST",
        "/v1/messages/count_tokens",
        json={"model": "nemo", "messages": VLLM_CHAT},
        headers={"x-api-key": TOKEN},
        no_auth=True,
    )
    w("bad/anthropic-wrong-key", "POST", "/v1/messages/count_tokens",
      json={"model": "nemo", "messages": VLLM_CHAT}, headers={"x-api-key": "wrong"}, no_auth=True)  # fmt: skip
    w("bad/no-auth-header", "GET", "/v1/models", no_auth=True)


def capture_serve(snap: Snapshot, paths: dict[str, Path]) -> None:
    import httpx  # only a capture needs an HTTP client (compare runs with the standard library alone)

    hi = {"messages": [{"role": "user", "content": "hi"}]}
    greet = json.loads((EXAMPLES / "tools-and-documents.json").read_text("utf-8"))
    session = (EXAMPLES / "session-timestamp.jsonl").read_bytes()
    anthropic = json.loads((DATA / "requests" / "anthropic_tools.json").read_text("utf-8"))
    with (
        server(paths) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as c,
    ):
        w = lambda *a, **k: wire(snap, c, *a, **k)  # noqa: E731
        w("openapi", "GET", "/openapi.json")
        w("healthz", "GET", "/healthz")
        w("models", "GET", "/v1/models")
        w("tokenizer_info", "GET", "/tokenizer_info")
        w("tokenizer_info-qwen", "GET", "/tokenizer_info?model=qwen")
        # llama.cpp's shapes
        w("tokenize/llamacpp", "POST", "/tokenize", json={"model": "nemo", "content": "hi é"})
        w(
            "tokenize/llamacpp-pieces",
            "POST",
            "/tokenize",
            json={"model": "nemo", "content": "hi é", "with_pieces": True},
        )
        w(
            "tokenize/llamacpp-qwen",
            "POST",
            "/tokenize",
            json={"model": "qwen", "content": "hi <|im_start|>", "add_special": True},
        )
        w("detokenize/nemo", "POST", "/detokenize", json={"model": "nemo", "tokens": [1, 22177]})
        w("detokenize/qwen", "POST", "/detokenize", json={"model": "qwen", "tokens": [14990, 1879]})
        w("apply-template/nemo", "POST", "/apply-template", json={"model": "nemo", **hi})
        w("apply-template/qwen", "POST", "/apply-template", json={"model": "qwen", **greet})
        # vLLM's shapes
        w("tokenize/vllm-prompt", "POST", "/tokenize", json={"model": "nemo", "prompt": "hi [INST]"})
        w(
            "tokenize/vllm-no-special",
            "POST",
            "/tokenize",
            json={"model": "nemo", "prompt": "hi", "add_special_tokens": False},
        )
        w("tokenize/vllm-chat", "POST", "/tokenize", json={"model": "qwen", **greet, "return_token_strs": True})
        # Anthropic count_tokens, OpenAI Responses input_tokens
        w("count_tokens/anthropic", "POST", "/v1/messages/count_tokens", json={"model": "nemo", **anthropic})
        w("count_tokens/anthropic-hi", "POST", "/v1/messages/count_tokens", json={"model": "qwen", **hi})
        w(
            "input_tokens/responses",
            "POST",
            "/v1/responses/input_tokens",
            json={"model": "nemo", "input": "hello there"},
        )
        w(
            "input_tokens/responses-list",
            "POST",
            "/v1/responses/input_tokens",
            json={"model": "qwen", "input": [{"role": "user", "content": "hello"}], "instructions": "be brief"},
        )
        # ctxlock's own
        w("render/nemo", "POST", "/v1/render?model=nemo", json=greet)
        w("render/qwen", "POST", "/v1/render?model=qwen", json=greet)
        r1 = w("render/record", "POST", "/v1/render?model=nemo&record=1", json=greet)
        r2 = w(
            "render/record-2",
            "POST",
            "/v1/render?model=nemo&record=1",
            json={"messages": [{"role": "user", "content": "hello"}]},
        )
        w("count/nemo", "POST", "/v1/count?model=nemo", json=greet)
        w("count/qwen", "POST", "/v1/count?model=qwen", json=greet)
        w("fit/nemo", "POST", "/v1/fit?model=nemo", content=(EXAMPLES / "long-chat.json").read_bytes())
        w("cache-report/openai", "POST", "/v1/cache-report?model=nemo&provider=openai&fix=1", content=session)
        w("cache-report/anthropic", "POST", "/v1/cache-report?model=nemo&provider=anthropic", content=session)
        w("records/list", "GET", "/v1/records")
        a = snap.clock_record(r1.content) or "x"
        b = snap.clock_record(r2.content) or "y"
        w("records/show", "GET", f"/v1/records/{a}")
        w("records/replay", "POST", f"/v1/records/{a}/replay")
        w("diff/records", "POST", "/v1/diff", json={"a": a, "b": b})
        w("view/record", "GET", f"/records/{a}/view")
        w("view/diff", "GET", f"/diff/{a}/{b}/view")
        peer_cases(w)
        w("metrics", "GET", "/metrics")
        # bad requests
        w("bad/no-token", "POST", "/v1/render?model=nemo", json=hi, headers={"Authorization": ""})
        w("bad/wrong-token", "GET", "/v1/models", headers={"Authorization": "Bearer nope"})
        w("bad/not-found", "GET", "/nope")
        w("bad/method", "GET", "/tokenize")
        w("bad/tokenize-json", "POST", "/tokenize", content=b'{"model": "nemo", "content": ')
        w("bad/tokenize-model", "POST", "/tokenize", json={"model": "nemo-nope", "prompt": "hi"})
        w("bad/tokenize-model-type", "POST", "/tokenize", json={"model": 7, "content": "hi"})
        w("bad/detokenize-ids", "POST", "/detokenize", json={"model": "nemo", "tokens": [-1]})
        w(
            "bad/apply-template-template",
            "POST",
            "/apply-template",
            json={**hi, "model": "nemo", "chat_template": "{{ messages }}"},
        )
        w("bad/anthropic-no-messages", "POST", "/v1/messages/count_tokens", json={"model": "nemo"})
        w("bad/responses-input", "POST", "/v1/responses/input_tokens", json={"model": "nemo", "input": 5})
        w("bad/render-empty", "POST", "/v1/render?model=nemo", content=b"{}")
        w("bad/render-model", "POST", "/v1/render?model=nope", json=hi)
        w("bad/count-body", "POST", "/v1/count?model=nemo", content=b"[1, 2]")
        w(
            "bad/fit-over-budget",
            "POST",
            "/v1/fit?model=nemo",
            json={"messages": [{"role": "user", "content": "word " * 200}]},
        )
        w("bad/cache-report-provider", "POST", "/v1/cache-report?model=nemo&provider=nobody", content=session)
        w("bad/record-unknown", "GET", "/v1/records/abcdef012345")
        w("bad/record-traversal", "GET", "/v1/records/..etc")
        w("bad/replay-unknown", "POST", "/v1/records/abcdef012345/replay")
        w("bad/diff-unknown", "POST", "/v1/diff", json={"a": "abcdef012345", "b": a})
        w("bad/view-unknown", "GET", "/records/abcdef012345/view")
        w("bad/too-large", "POST", "/v1/render?model=nemo", content=b"{" + b" " * 300000 + b"}")


# ---------------------------------------------------------------------------------------------------------------
# capture / compare
# ---------------------------------------------------------------------------------------------------------------
def capture(out: Path) -> int:
    start = time.monotonic()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO / "src"))
    paths = prepare()
    os.environ["CTXLOCK_CACHE_DIR"] = str(WORK / "cache-in-process")  # cold, like the subprocesses' (env())
    snap = Snapshot(out)
    flag = probe_cli_flag("cli_injection_flag", "render")
    print(f"capturing the tree at {REPO} into {out} (CLI injection flag: {flag})", flush=True)
    steps: list[tuple[str, Callable[[], None]]] = [
        ("cli", lambda: run_cli_cases(snap, [(f"cli/{n}", a, s) for n, a, s in cli_cases(paths, flag)])),
        ("records", lambda: capture_records(snap, paths)),
        ("serve", lambda: capture_serve(snap, paths)),
        ("conformance", lambda: capture_conformance(snap, paths)),
    ]
    for name, fn in steps:
        t = time.monotonic()
        before = len(snap.index)
        fn()
        print(f"{name}: {len(snap.index) - before} cases in {time.monotonic() - t:.1f} s", flush=True)
    snap.finish()
    print(f"captured {len(snap.index)} cases into {out} in {time.monotonic() - start:.1f} s")
    return 0


def first_difference(a: bytes, b: bytes) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    line = a[:n].count(b"\n") + 1
    la = a.splitlines()[line - 1 : line] or [b"<end>"]
    lb = b.splitlines()[line - 1 : line] or [b"<end>"]
    return (
        f"first difference at byte {n}, line {line} (sizes {len(a)} and {len(b)})\n"
        f"    A: {la[0][:200]!r}\n    B: {lb[0][:200]!r}"
    )


def compare(a: Path, b: Path) -> int:
    ia = json.loads((a / "index.json").read_text("utf-8"))
    ib = json.loads((b / "index.json").read_text("utf-8"))
    differing = 0
    for name in sorted(set(ia) | set(ib)):
        if name not in ib:
            print(f"{name}: only in {a}")
        elif name not in ia:
            print(f"{name}: only in {b}")
        elif ia[name] != ib[name]:
            print(f"{name}: {first_difference((a / name).read_bytes(), (b / name).read_bytes())}")
        else:
            continue
        differing += 1
    if differing:
        print(f"{differing} of {len(set(ia) | set(ib))} cases differ")
        return 1
    print(f"identical: {len(ia)} cases")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("capture", help="capture this tree's behaviour into OUTDIR")
    p.add_argument("outdir", type=Path)
    p = sub.add_parser("compare", help="compare two captures; exit 1 if any case differs")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    if args.command == "capture":
        return capture(args.outdir)
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
