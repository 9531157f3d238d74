"""`ctxlock probe` against a real `ctxlock serve` over loopback, in each peer shape it answers: vLLM's `/tokenize` chat
form and its `/v1/chat/completions/render` (a GenerateRequest, whose ids must be ctxlock's own render), llama.cpp's
`/apply-template` + `/tokenize`, and ctxlock's own `/v1/render`.

One server for the module serves the qwen2 GGUF vocabulary with llama.cpp's Qwen 2.5 template (`qwen`), the same
vocabulary with another revision of that template whose default system line has one more space (`qwenrev`: the
planted divergence), and the llama-bpe vocabulary with the Llama 3.3 template (`llama3`: a tokenizer that adds a BOS
the template writes too, so llama.cpp's BOS cut and `add_special` are on the path). The expected divergence of the
planted revision (which probes, the first diverging token, the first differing character) is computed independently,
with transformers' `apply_chat_template` on the HF tokenizer converted from the same GGUF."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from planted import QWEN, expected_divergences, revision

import fetched
from cli_runner import run_main
from ctxlock.artifacts import load_template_file
from ctxlock.liveprobe import ProbeReport, Verdict, probe_server, read_manifest
from ctxlock.model import Model, load
from ctxlock.probes import PROBE_NOW, load_corpus
from ctxlock.records import ExecutionRecord, Store
from serve_server import TOKEN, running

TEMPLATES = fetched.templates_dir()
LLAMA3 = TEMPLATES / "meta-llama-Llama-3.3-70B-Instruct.jinja"
SHAPES = ("ctxlock", "vllm", "llamacpp")
# A template that reads the clock (the month), as Llama 3.2's reads the date.
CLOCK = (
    "{{- strftime_now('%Y-%m') }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Routes that have no field for a request's documents (the probe is not sent there, and the result says so).
NO_DOCUMENTS = {"POST /tokenize (vLLM's chat form)", "POST /apply-template + POST /tokenize (llama.cpp's chat path)"}
# The routes `ctxlock probe` asks in each shape; ctxlock serve has them all.
ROUTES = {
    "ctxlock": ["POST /v1/render (ctxlock's own)"],
    "vllm": ["POST /tokenize (vLLM's chat form)", "POST /v1/chat/completions/render (vLLM)"],
    "llamacpp": ["POST /apply-template + POST /tokenize (llama.cpp's chat path)"],
}


def clock_template(root: Path) -> Path:
    path = root / "clock.jinja"
    path.write_text(CLOCK, "utf-8")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("probe-serve")
    cfg = root / "ctxlock.toml"
    cfg.write_text(
        f"""
[server]
tokens = ["{TOKEN}"]

[models.qwen]
spec = "{fetched.gguf_path("qwen2")}"
template = "{QWEN}"

[models.qwenrev]
spec = "{fetched.gguf_path("qwen2")}"
template = "{revision(root)}"

[models.llama3]
spec = "{fetched.gguf_path("llama-bpe")}"
template = "{LLAMA3}"

[models.clock]
spec = "{fetched.gguf_path("qwen2")}"
template = "{clock_template(root)}"
""",
        "utf-8",
    )
    with running(cfg) as url:
        yield url


@pytest.fixture(scope="module")
def qwen() -> Model:
    return load(str(fetched.gguf_path("qwen2")))


@pytest.fixture(scope="module")
def llama_bpe() -> Model:
    return load(str(fetched.gguf_path("llama-bpe")))


def probe(url: str, model: Model, template: Path, shape: str, served: str, **kw: Any) -> ProbeReport:
    kind = None if shape == "ctxlock" else shape  # ctxlock serve is detected as itself; the peer shapes are given
    return probe_server(
        url, model, template=load_template_file(template), kind=kind, served_model=served, token=TOKEN, **kw
    )


def probe_cli(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    """`ctxlock probe ARGS` in this process (exit status, stdout, stderr), the token from $CTXLOCK_PROBE_TOKEN: the
    command's reports and statuses; the real `python -m ctxlock probe` (its exit status and stderr as a user sees
    them) runs in tests/liveprobe/test_probe_llama_server.py and in docs/live-probe.md's examples."""
    for name, value in (("CTXLOCK_PROBE_TOKEN", TOKEN), ("NO_COLOR", "1"), ("COLUMNS", "200")):
        monkeypatch.setenv(name, value)
    return run_main(["probe", *args])


def verdicts(report: ProbeReport) -> dict[str, dict[str, str]]:
    """Each route's verdicts by probe."""
    out: dict[str, dict[str, str]] = {}
    for r in report.results:
        out.setdefault(r.route, {})[r.probe] = str(r.verdict)
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_every_probe_agrees_with_the_same_template_in_each_shape(server: str, qwen: Model, shape: str) -> None:
    report = probe(server, qwen, QWEN, shape, "qwen")
    assert report.server.kind == shape
    assert [(r.name, r.used) for r in report.routes] == [(name, True) for name in ROUTES[shape]]
    names = set(load_corpus().names)
    expected = {route: {n: "agree" for n in names} for route in ROUTES[shape]}
    for route in set(ROUTES[shape]) & NO_DOCUMENTS:
        expected[route]["documents"] = "not sent"
        (skipped,) = [r for r in report.results if r.route == route and r.verdict is Verdict.NOT_SENT]
        assert skipped.cause is not None and "documents" in skipped.cause.detail
    assert verdicts(report) == expected
    assert report.ok
    for r in report.results:  # the ids each route answered are ctxlock's own render, token for token
        assert r.verdict is Verdict.NOT_SENT or (r.server_ids == r.ctxlock_ids and r.ctxlock_ids), r.probe
    assert report.local is not None and report.local.template_sha256 == load_template_file(QWEN).sha256


@pytest.mark.parametrize("shape", SHAPES)
def test_a_tokenizer_that_adds_the_bos_the_template_writes(server: str, llama_bpe: Model, shape: str) -> None:
    # Llama 3.3 writes <|begin_of_text|> and llama-bpe adds it: llama.cpp's /apply-template cuts it and /tokenize
    # with add_special puts it back once; every probe agrees, and the one the template refuses is refused by both.
    report = probe(server, llama_bpe, LLAMA3, shape, "llama3")
    by_route = verdicts(report)
    assert list(by_route) == ROUTES[shape]
    for route, got in by_route.items():
        assert got.pop("parallel-tool-calls") == "both refuse"
        assert set(got.values()) == ({"agree", "not sent"} if route in NO_DOCUMENTS else {"agree"})
    first = next(r for r in report.results if r.verdict is Verdict.AGREE)
    assert first.ctxlock_ids is not None and first.ctxlock_ids[0] == 128000 and first.ctxlock_ids[1] != 128000


@pytest.fixture(scope="module")
def planted_divergences(qwen: Model) -> dict[str, tuple[int, int]]:
    return expected_divergences(qwen)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_planted_revision_is_named_at_the_right_token(
    server: str, qwen: Model, shape: str, planted_divergences: dict[str, tuple[int, int]]
) -> None:
    recorded: list[str] = []

    def recorder(p: Any, now: Any) -> str:
        assert now == PROBE_NOW  # the template does not read the clock: recorded at the corpus's time
        recorded.append(p.name)
        return f"record-of-{p.name}"

    report = probe(server, qwen, QWEN, shape, "qwenrev", recorder=recorder)
    assert not report.ok
    assert {r.route for r in report.results} == set(ROUTES[shape])
    for route in ROUTES[shape]:
        by_name = {r.probe: r for r in report.results if r.route == route}
        for name, (token, char) in planted_divergences.items():
            r = by_name[name]
            assert r.verdict is Verdict.DIVERGE, (route, name)
            assert r.divergence is not None and r.divergence.index == token, (route, name)
            assert r.cause is not None and r.cause.kind == "template" and r.cause.text is not None
            assert r.cause.text.offset == char, (route, name)  # the same character on each route's own text
            assert "helpful  assistant" in r.cause.text.server and "helpful assistant" in r.cause.text.ctxlock
            assert r.record_id == f"record-of-{name}"
        # The probes the revision does not touch (a system message, or tools: the other branch) still agree.
        agree = {p for p, r in by_name.items() if r.verdict is Verdict.AGREE}
        assert {"system", "tools", "multi-turn-system"} <= agree
    # one record per diverging probe, shared by the routes it diverged on
    assert sorted(recorded) == sorted({r.probe for r in report.divergences})


def test_the_record_of_a_divergence_replays_ctxlocks_side(
    server: str, qwen: Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    code, out, err = probe_cli(
        monkeypatch, server, "--model", str(fetched.gguf_path("qwen2")), "--template", str(QWEN),
        "--served-model", "qwenrev", "--only", "user", "--only", "system", "--store", str(store), "--json",
    )  # fmt: skip
    assert code == 0, err  # a divergence is a report, not a failure, without --fail-on-diff
    report = json.loads(out)
    assert report["counts"] == {"agree": 1, "both refuse": 0, "diverge": 1, "not sent": 0}
    (div,) = [r for r in report["results"] if r["verdict"] == "diverge"]
    assert div["probe"] == "user" and div["divergence"]["index"] == 17
    with Store(store) as s:
        rec = ExecutionRecord.from_bytes(s.get_record(div["record_id"]))
    assert rec.data["input_ids"] == div["ctxlock_ids"]
    assert rec.data["replay"]["template_sha256"] == load_template_file(QWEN).sha256


def test_fail_on_diff_is_a_ci_gate(server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = [server, "--model", str(fetched.gguf_path("qwen2")), "--template", str(QWEN), "--only", "user"]
    code, out, err = probe_cli(monkeypatch, *args, "--fail-on-diff")
    assert code == 0, err
    assert out.splitlines()[-1] == "result    1 of 1 agree, 0 diverge"
    code, out, err = probe_cli(monkeypatch, *args, "--served-model", "qwenrev", "--fail-on-diff", "--no-record")
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert "DIVERGE   user on POST /v1/render (ctxlock's own)" in lines
    assert any(line.startswith("          first diverging token: #17: ctxlock ") for line in lines)
    assert not any("record" in line for line in lines)  # --no-record


def test_the_tokenizer_is_named_when_the_texts_agree(server: str, llama_bpe: Model) -> None:
    # The same template with another vocabulary on ctxlock's side: the server's text is ctxlock's, the ids are not.
    report = probe(server, llama_bpe, QWEN, "llamacpp", "qwen", corpus=load_corpus(only=["user"]))
    (r,) = report.results
    assert r.verdict is Verdict.DIVERGE and r.cause is not None and r.cause.kind == "tokenizer"
    assert r.divergence is not None and r.divergence.index == 0


def test_a_manifest_against_what_the_server_serves(
    server: str, qwen: Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = load_template_file(QWEN).sha256
    # As ctxlock batch writes it: the model's templates by name, and the tokenizer's digest.
    batch = tmp_path / "manifest.json"
    batch.write_text(
        json.dumps(
            {"model": "qwen", "template_sha256": {"default": original}, "tokenizer_sha256": qwen.tokenizer.sha256}
        )
    )
    manifest = read_manifest(batch)
    same = probe_server(server, None, kind=None, served_model="qwen", token=TOKEN, manifest=manifest)
    assert same.ok and same.results == ()
    assert same.manifest is not None and [c.status for c in same.manifest.checks] == ["same", "same"]
    other = probe_server(server, None, served_model="qwenrev", token=TOKEN, manifest=manifest)
    assert other.manifest is not None and [c.status for c in other.manifest.checks] == ["differs", "same"]
    assert not other.ok
    # vLLM's shape: the template from GET /tokenizer_info; llama.cpp's: from GET /props, which ctxlock serve lacks.
    vllm = probe_server(server, None, kind="vllm", served_model="qwen", token=TOKEN, manifest=manifest)
    assert vllm.manifest is not None and vllm.manifest.checks[0].status == "same"
    assert vllm.manifest.checks[0].detail == "GET /tokenizer_info chat_template"
    llama = probe_server(server, None, kind="llamacpp", served_model="qwen", token=TOKEN, manifest=manifest)
    assert llama.manifest is not None and llama.manifest.checks[0].status == "not checked"
    assert llama.manifest.checks[0].detail == "the server answers no GET /props"
    args = [server, "--served-model", "qwenrev", "--manifest", str(batch), "--fail-on-diff"]
    code, out, _ = probe_cli(monkeypatch, *args)
    assert code == 1 and "template: differs" in out


@pytest.mark.parametrize("shape", ["ctxlock", "llamacpp"])
def test_a_template_that_reads_the_clock_is_compared_at_this_machines_time(
    server: str, qwen: Model, shape: str, tmp_path: Path
) -> None:
    # At the corpus's fixed time (January 2025) the month differs from the server's; at this machine's it does not.
    report = probe(server, qwen, clock_template(tmp_path), shape, "clock", corpus=load_corpus(only=["user", "system"]))
    assert [str(r.verdict) for r in report.results] == ["agree", "agree"]
    for r in report.results:
        assert r.now is not None and r.now[:7] != PROBE_NOW.isoformat()[:7]
        assert any(n.startswith("the template reads the clock: ctxlock's side is rendered at") for n in r.notes)
