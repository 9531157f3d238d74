"""`ctxlock probe URL`: a live server's render and tokenize routes asked for the probe corpus and compared with
ctxlock's exact render of the model files named (docs/live-probe.md); each divergence with its first diverging token,
its cause and a stored record of ctxlock's side; `--fail-on-diff` for CI, `--manifest` for a training set's digests."""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlock.cli.files import store_dir, template_file
from ctxlock.cli.output import guarded, print_json
from ctxlock.cli.render import (
    MODEL_HELP,
    JsonOpt,
    StoreOpt,
    TemplateOpt,
    TokenizerPipeline,
    TokenizerPipelineOpt,
    VarOpt,
    render_options,
)
from ctxlock.errors import InputError
from ctxlock.liveprobe import HttpLimits, Manifest, ProbeReport, probe_server, read_manifest
from ctxlock.model._model import Model, load
from ctxlock.probes import Probe, load_corpus
from ctxlock.records import RunOptions
from ctxlock.records._store import Store
from ctxlock.template import ChatTemplate


class Kind(StrEnum):
    """`--kind`: the server family, instead of detecting it."""

    VLLM = "vllm"
    LLAMACPP = "llamacpp"
    CTXLOCK = "ctxlock"


_DEFAULTS = HttpLimits()
ProbeModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="The model files to compare the server with (needed unless --manifest): " + MODEL_HELP,
    ),
]
UrlArg = Annotated[str, typer.Argument(help="The server's base URL, e.g. http://127.0.0.1:8000.")]
KindOpt = Annotated[
    Kind | None,
    typer.Option(
        "--kind", help="The server: vllm, llamacpp (llama-server) or ctxlock (ctxlock serve). Default: detected."
    ),
]
ServedModelOpt = Annotated[
    str | None,
    typer.Option(
        "--served-model",
        help="The model's name at the server (default: the one it serves, or its default; needed when it serves "
        "several).",
    ),
]
ProbesOpt = Annotated[
    list[Path],
    typer.Option("--probes", help="A probe file of your own (repeatable): added to the corpus, or replacing by name."),
]
OnlyOpt = Annotated[list[str], typer.Option("--only", help="Send only the probe of this name (repeatable).")]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="CTXLOCK_PROBE_TOKEN",
        show_envvar=True,
        help="The server's API key, sent as `Authorization: Bearer <token>` (never to another host).",
    ),
]
TimeoutOpt = Annotated[
    float,
    typer.Option("--timeout", min=0.001, help="Seconds one call may take: connecting and the whole answer."),
]
MaxBytesOpt = Annotated[
    int, typer.Option("--max-response-bytes", min=1, help="The most bytes one answer may have; read no further.")
]
ManifestOpt = Annotated[
    Path | None,
    typer.Option(
        "--manifest",
        help="A training set's manifest (ctxlock batch's manifest.json, or {template_sha256, tokenizer_sha256}): "
        "its digests against what the server serves. Without --model, only the digests are checked.",
    ),
]
FailOnDiffOpt = Annotated[
    bool,
    typer.Option("--fail-on-diff", help="Exit 1 when a probe diverges or a manifest digest differs (a CI gate)."),
]
NoRecordOpt = Annotated[
    bool, typer.Option("--no-record", help="Do not store a record of ctxlock's side of each diverging probe.")
]


class _Recorder:
    """Stores ctxlock's side of a diverging probe as an execution record (the store opened at the first one): the
    probe's request rendered as the corpus renders it (its options, seed 0), at the time the probe was compared at
    (the corpus's fixed clock, or this machine's for a template that reads the clock)."""

    def __init__(self, model: Model, template: ChatTemplate | None, variables: dict[str, Any], path: Path | None):
        self.model, self.template, self.variables, self.path = model, template, variables, path
        self.store: Store | None = None

    def __call__(self, probe: Probe, now: datetime) -> str:
        from ctxlock.records._replay import run_and_record, save  # start-up: only a divergence needs the replay module

        request = dict(probe.request)
        kwargs = {**(request.pop("chat_template_kwargs", None) or {}), **self.variables}
        options = RunOptions(
            add_generation_prompt=probe.add_generation_prompt,
            continue_final_message=probe.continue_final_message,
            chat_template_kwargs=kwargs or None,
            now=now.isoformat(),
            render_seed=0,
        )
        data = json.dumps(request, ensure_ascii=False).encode("utf-8")
        result, rec, _ = run_and_record(self.model, data, options, template=self.template)
        used = self.template or (result.rendered.template if result is not None else None)
        if used is None and self.model.templates is not None:
            used = self.model.templates.select(None)
        if self.store is None:
            self.store = Store(self.path)
        return save(self.store, self.model, rec, used)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def _template(m: Model, value: str | None) -> ChatTemplate | None:
    chosen = template_file(value)
    if isinstance(chosen, str):
        if m.templates is None:
            raise InputError(f"the model has no template named {chosen!r}: it has none", path="--template")
        return m.templates.select(chosen)
    return chosen


def _run(
    url: str,
    model: str | None,
    template: str | None,
    var: list[str],
    manifest_file: Path | None,
    record: bool,
    store: Path | None,
    pipeline: TokenizerPipeline,
    **kwargs: Any,
) -> ProbeReport:
    if model is None and manifest_file is None:
        raise InputError(
            "nothing to probe: give the model files to compare with",
            path="--model",
            hint="--model FILE.gguf or an HF directory (or --manifest FILE to check only its digests)",
        )
    manifest: Manifest | None = None if manifest_file is None else read_manifest(manifest_file)
    variables: dict[str, Any] = dict(render_options(None, var=var)[0].chat_template_kwargs or {})
    corpus = load_corpus(kwargs.pop("probes"), only=kwargs.pop("only"))
    path = store_dir(store) if record else None
    if model is None:
        return probe_server(url, None, corpus=corpus, manifest=manifest, **kwargs)
    m = load(model, tokenizer_pipeline=TokenizerPipeline(pipeline).value)
    chosen = _template(m, template)
    recorder = _Recorder(m, chosen, variables, path) if record else None
    try:
        return probe_server(
            url, m, template=chosen, corpus=corpus, variables=variables or None, manifest=manifest, recorder=recorder,
            **kwargs,
        )  # fmt: skip
    finally:
        if recorder is not None:
            recorder.close()


def probe(
    url: UrlArg,
    model: ProbeModelOpt = None,
    template: TemplateOpt = None,
    kind: KindOpt = None,
    served_model: ServedModelOpt = None,
    probes: ProbesOpt = [],  # noqa: B006 (typer reads the default)
    only: OnlyOpt = [],  # noqa: B006 (typer reads the default)
    var: VarOpt = [],  # noqa: B006 (typer reads the default)
    token: TokenOpt = None,
    timeout: TimeoutOpt = _DEFAULTS.timeout,
    max_response_bytes: MaxBytesOpt = _DEFAULTS.max_bytes,
    manifest: ManifestOpt = None,
    fail_on_diff: FailOnDiffOpt = False,
    no_record: NoRecordOpt = False,
    store: StoreOpt = None,
    tokenizer_pipeline: TokenizerPipelineOpt = TokenizerPipeline.CLASS,
    as_json: JsonOpt = False,
) -> None:
    """Ask a live server (vLLM, llama.cpp's llama-server, ctxlock serve) to render and tokenize the probe corpus, and
    compare each answer with ctxlock's exact render of --model's files (with --template), token for token.

    A divergence is reported with its first diverging token and its cause (template, tokenizer, special tokens,
    clock, a refusal), and ctxlock's side is stored as a record (--no-record: not). Exit 0 with the report;
    --fail-on-diff: exit 1 when anything diverges."""

    def go() -> ProbeReport:
        return _run(
            url,
            model,
            template,
            var,
            manifest,
            not no_record,
            store,
            tokenizer_pipeline,
            probes=probes,
            only=only,
            kind=None if kind is None else kind.value,
            served_model=served_model,
            token=token,
            limits=HttpLimits(timeout=timeout, max_bytes=max_response_bytes),
        )

    report = guarded(as_json, go)
    if as_json:
        print_json(report.to_dict())
    else:
        for line in report.lines():
            print(line)
    if fail_on_diff and not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("probe")(probe)
