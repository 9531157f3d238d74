"""`ctxlock probe`: a live server's render and tokenize endpoints (vLLM's, llama.cpp's, ctxlock's own) asked for the
probe corpus and compared with ctxlock's exact render of the model files the user names, to the first diverging
token.

`probe_server(url, model)` returns a `ProbeReport`: the server (its kind, and how that was found), the routes asked
and the ones it lacks, and one `ProbeResult` per probe and route (agree, both refuse, diverge, not sent), a
divergence with its first diverging token and its `Cause` (template, tokenizer, special tokens, clock, a refusal).
`read_manifest` and the `manifest=` argument check a training set's template and tokenizer digests against what the
server serves. Guide: docs/live-probe.md."""

from ctxlock.liveprobe._compare import Cause, ProbeResult, TextDifference, Verdict
from ctxlock.liveprobe._http import HttpLimits
from ctxlock.liveprobe._manifest import DigestCheck, Manifest, ManifestCheck, read_manifest
from ctxlock.liveprobe._probe import Recorder, probe_server
from ctxlock.liveprobe._report import LocalSide, ProbeReport, RouteUse
from ctxlock.liveprobe._servers import ServerInfo, ServerKind

__all__ = [
    "Cause",
    "DigestCheck",
    "HttpLimits",
    "LocalSide",
    "Manifest",
    "ManifestCheck",
    "ProbeReport",
    "ProbeResult",
    "Recorder",
    "RouteUse",
    "ServerInfo",
    "ServerKind",
    "TextDifference",
    "Verdict",
    "probe_server",
    "read_manifest",
]
